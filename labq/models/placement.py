"""Where a job runs: one GPU set on each of its nodes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeAllocation:
    node: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    #: the set's interconnect score (see ``Topology.set_score``)
    score: int = 0


@dataclass(frozen=True)
class Placement:
    allocations: tuple[NodeAllocation, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(a.node for a in self.allocations)

    @property
    def gpu_count(self) -> int:
        return sum(len(a.gpu_indices) for a in self.allocations)

    @property
    def score(self) -> int:
        return sum(a.score for a in self.allocations)

    def gpus_on(self, node: str) -> tuple[int, ...]:
        for a in self.allocations:
            if a.node == node:
                return a.gpu_indices
        return ()
