"""The lab's queues: the teams that share it, each with a guaranteed share of its GPUs.

A queue has members (users, or ``@groups``), a guarantee (GPUs, or a percentage of the
lab's GPUs), an optional cap, and whether it lends its idle guarantee to other queues
and borrows theirs. Jobs name their queue at submit; the scheduler serves queues below
their guarantee first, lends idle GPUs to queues that want more, and reclaims them by
checkpoint when their queue needs them (``labq.scheduler.queues``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class QueueSpec:
    name: str
    #: user names and ``@group`` names
    members: tuple[str, ...] = ()
    #: guaranteed GPUs; or, with ``guarantee_percent``, a share of the lab's GPUs up
    guarantee_gpus: int = 0
    guarantee_percent: float | None = None
    #: the most GPUs its jobs may hold at once, borrowed included; None: no cap
    cap: int | None = None
    #: its idle guarantee may be used by other queues' preemptible jobs, until it needs it
    lends: bool = True
    #: its preemptible jobs may use other queues' idle GPUs beyond its guarantee
    borrows: bool = True
    #: a job of it that has waited this long may preempt what stands in its way; None: no bound
    max_wait_s: float | None = None

    def guarantee(self, lab_gpus: int) -> int:
        """Its guarantee in GPUs in a lab of ``lab_gpus`` GPUs up."""
        if self.guarantee_percent is not None:
            return int(lab_gpus * self.guarantee_percent / 100.0)
        return self.guarantee_gpus

    def admits(self, user: str, groups: Mapping[str, tuple[str, ...]]) -> bool:
        """Whether ``user`` is a member, by name or by one of its ``@groups``."""
        return any(m == "*" or m == user or (m.startswith("@") and user in groups.get(m[1:], ()))
                   for m in self.members)

    @property
    def guarantee_text(self) -> str:
        if self.guarantee_percent is not None:
            return f"{self.guarantee_percent:g}%"
        return f"{self.guarantee_gpus} GPU{'s' if self.guarantee_gpus != 1 else ''}"


def queues_of(user: str, queues: tuple[QueueSpec, ...], groups: Mapping[str, tuple[str, ...]]) -> list[str]:
    """The queues ``user`` is a member of, by name."""
    return [q.name for q in queues if q.admits(user, groups)]
