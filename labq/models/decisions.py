"""What one scheduling pass decides: start these, preempt those, and why the rest wait."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from labq.models.placement import Placement


class PendingReason(str, Enum):
    PRIORITY = "Priority"  #: free GPUs exist but are held for a job ahead (named)
    RESOURCES = "Resources"  #: not enough suitable GPUs free
    QUOTA = "Quota"  #: the user's GPU quota is used up
    RESERVATION = "Reservation"  #: kept out by, or waiting for, a reservation
    DEPENDENCY = "Dependency"  #: waits for other jobs to succeed
    HELD = "Held"  #: held by its user or an admin
    PREEMPTING = "Preempting"  #: lower jobs are checkpointing to make room for it
    USER = "User"  #: no node that could run it has an account for its user
    QUEUE = "Queue"  #: its queue is at its cap, or at its guarantee and does not borrow
    BORROWED = "Borrowed"  #: beyond its queue's guarantee, and the lab may not lend it the GPUs
    ARRAY_LIMIT = "ArrayTaskLimit"  #: its array has as many tasks on GPUs as its ``%N`` allows


@dataclass(frozen=True)
class Start:
    job_id: int
    placement: Placement


@dataclass(frozen=True)
class Preempt:
    job_id: int  #: the victim
    for_job: int | None  #: the job it makes room for; None when it frees a reservation's GPUs
    node: str
    gpu_indices: tuple[int, ...]
    work_at_risk_s: float  #: work since the victim's last checkpoint
    reservation: str | None = None  #: the reservation whose GPUs it must free by its start


class Pending(NamedTuple):
    """Why a job waits. A NamedTuple rather than a dataclass: a pass over a long
    queue makes one per waiting job, and this is four times cheaper to build."""

    job_id: int
    reason: PendingReason
    detail: str  #: a sentence for ``labq why``
    waiting_for: int | None = None  #: the job ahead (Priority), the job it waits on (Dependency)
    estimated_start: float | None = None

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.detail}"


@dataclass(frozen=True)
class Decisions:
    starts: tuple[Start, ...] = ()
    preemptions: tuple[Preempt, ...] = ()
    pending: tuple[Pending, ...] = ()

    def pending_for(self, job_id: int) -> Pending | None:
        for p in self.pending:
            if p.job_id == job_id:
                return p
        return None

    def started(self, job_id: int) -> Start | None:
        for s in self.starts:
            if s.job_id == job_id:
                return s
        return None
