"""``fifo`` and ``sjf``: plain reference policies, so that results compare with other simulators.

Strict order: by submit time (``fifo``) or by known duration, then submit time (``sjf``). The
first job that cannot start blocks every job behind it: no backfill, no preemption. A job of up
to one node's GPUs goes to the fullest node that still fits it (best fit, fewest GPUs left free);
a wider job takes whole free nodes, largest first, plus the remainder on the fullest node that
fits it. GPUs are counted per node; the interconnect plays no part.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from labq.models.node import Node
from labq.sim.model import TraceJob


@dataclass
class _Slot:
    name: str
    size: int
    free: int


class ReferenceQueue:
    def __init__(self, nodes: list[Node], *, shortest_first: bool) -> None:
        self.nodes = [_Slot(n.name, n.gpu_count, n.gpu_count) for n in nodes]
        self.shortest_first = shortest_first
        self.total = sum(n.size for n in self.nodes)
        self.free = self.total
        self.queue: list[tuple[float, float, int, TraceJob]] = []
        self.held: dict[int, list[tuple[_Slot, int]]] = {}

    def never_fits(self, job: TraceJob) -> str | None:
        if job.gpus > self.total:
            return f"asks for {job.gpus} GPUs; the cluster has {self.total}"
        return None

    def add(self, job: TraceJob) -> None:
        key = (job.duration, job.submit) if self.shortest_first else (job.submit, 0.0)
        heapq.heappush(self.queue, (*key, job.id, job))

    def starts(self) -> list[int]:
        """Starts jobs from the head of the queue while the head fits; returns their ids in order."""
        started = []
        while self.queue:
            job = self.queue[0][3]
            taken = self._place(job.gpus)
            if taken is None:
                break
            heapq.heappop(self.queue)
            self.held[job.id] = taken
            self.free -= job.gpus
            started.append(job.id)
        return started

    def release(self, job_id: int) -> None:
        for slot, count in self.held.pop(job_id):
            slot.free += count
            self.free += count

    def _place(self, gpus: int) -> list[tuple[_Slot, int]] | None:
        if gpus > self.free:
            return None
        if gpus == 0:
            return []
        fits = [s for s in self.nodes if s.free >= gpus]
        if fits and gpus <= max(s.size for s in self.nodes):
            best = min(fits, key=lambda s: s.free)  # the fullest that fits; the first such in node order
            best.free -= gpus
            return [(best, gpus)]
        taken, left = [], gpus
        for slot in sorted((s for s in self.nodes if s.free == s.size), key=lambda s: -s.size):
            if left < slot.size:
                break
            taken.append((slot, slot.size))
            left -= slot.size
        if left:
            rest = [s for s in self.nodes if s.free >= left and all(s is not x for x, _ in taken)]
            if not rest:
                return None
            taken.append((min(rest, key=lambda s: s.free), left))
        for slot, count in taken:
            slot.free -= count
        return taken
