"""GPUs booked for a window of time, for a user or a group."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reservation:
    name: str
    owner: str
    gpus: int
    start: float
    end: float  #: exclusive: [start, end)
    users: frozenset[str] = frozenset()  #: who may run in it, besides the owner
    group: str | None = None
    node: str | None = None  #: the node it is pinned to, once booked
    gpu_indices: tuple[int, ...] = ()  #: the GPUs it pins on that node
    gpu_model: str | None = None
    min_gpu_memory_mib: int = 0

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValueError(f"reservation {self.name}: end must be after start")

    def admits(self, user: str) -> bool:
        return user == self.owner or user in self.users

    def active(self, now: float) -> bool:
        return self.start <= now < self.end

    def overlaps(self, start: float, end: float) -> bool:
        return self.start < end and start < self.end
