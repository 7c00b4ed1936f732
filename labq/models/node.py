"""Workstations and their GPUs, as the leader knows them."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from labq.models.topology import Topology


@dataclass(frozen=True)
class Gpu:
    index: int  #: the node-local index, as NVML numbers it
    uuid: str  #: ``GPU-…`` from NVML, or ``SIM-…`` for a simulated GPU
    model: str  #: e.g. ``NVIDIA A100-SXM4-80GB``
    memory_mib: int  #: total memory


class NodeHealth(str, Enum):
    UP = "up"  #: takes new jobs
    DRAINING = "draining"  #: keeps its running jobs, takes no new ones
    DOWN = "down"  #: taken out by an admin
    LOST = "lost"  #: missed its lease; its jobs may still be running


@dataclass(frozen=True)
class Node:
    name: str
    gpus: tuple[Gpu, ...]
    topology: Topology
    health: NodeHealth = NodeHealth.UP
    #: GPU indices busy with processes labq did not start (someone's notebook)
    unmanaged_busy: frozenset[int] = frozenset()
    #: simulated GPUs are handed to jobs by index, real ones by UUID
    simulated: bool = False
    labels: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if [g.index for g in self.gpus] != list(range(len(self.gpus))):
            raise ValueError(f"node {self.name}: GPUs must be indexed 0..{len(self.gpus) - 1} in order")
        if self.topology.size != len(self.gpus):
            raise ValueError(
                f"node {self.name}: topology describes {self.topology.size} GPUs but the node has {len(self.gpus)}"
            )

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def schedulable(self) -> bool:
        return self.health is NodeHealth.UP
