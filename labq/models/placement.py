"""Where a job runs: one GPU set on each of its nodes, and there the CPUs and memory it holds."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from labq.models.node import cpu_mask


@dataclass(frozen=True)
class NodeAllocation:
    node: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    #: the set's interconnect score (see ``Topology.set_score``)
    score: int = 0
    #: the CPUs it holds there, to itself (``ceil(cpus)`` of them); (): none placed (the node did not report its)
    cpu_set: tuple[int, ...] = ()
    #: the cores of CPU time it may use there (its quota: ``--cpus``, or the lab's default); None: not placed
    cpus: float | None = None
    #: the memory it holds there (MiB), past which the kernel stops it; None: not placed
    memory_mib: int | None = None
    #: how many of ``cpu_set`` lie outside its GPUs' NUMA nodes (none were free there)
    far_cpus: int = 0

    @cached_property
    def cpu_mask(self) -> int:
        """``cpu_set`` as a bit mask: a pass takes it from the node's free CPUs for every running job."""
        return cpu_mask(self.cpu_set)


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

    def on(self, node: str) -> NodeAllocation | None:
        """Its allocation on ``node``; None where it has none."""
        for a in self.allocations:
            if a.node == node:
                return a
        return None
