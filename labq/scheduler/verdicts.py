"""What a scheduling pass has decided so far, and the words it gives its reasons in.

The rules of a pass (``labq.scheduler.cycle`` and the parts it is made of) record each
decision here as they reach it: a job starts, a job is preempted for another, or a job
waits with a reason and a detail that ``labq why`` shows as they are. The details speak
of GPUs by index and of time spans as people read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labq.models.decisions import Pending, PendingReason, Preempt, Start
from labq.models.job import Job
from labq.scheduler.lab_view import LabView
from labq.scheduler.placement import mask_to_indices


@dataclass
class Verdicts(LabView):
    """The lab as a pass sees it, and what the pass has decided so far: the base of every part of the pass."""

    starts: list[Start] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    #: each queued job's served priority (``served_priority``, with aging), worked out once a pass
    ranks: dict[int, int] = field(default_factory=dict)

    def _wait(self, job: Job, reason: PendingReason, detail: str, waiting_for: int | None = None,
              estimated_start: float | None = None) -> None:
        self.pending.append(Pending(job.id, reason, detail, waiting_for, estimated_start))


def gpu_list(mask: int) -> str:
    """GPUs ``mask`` as a reason names them: their indices, ``0,1,3``."""
    return ",".join(map(str, mask_to_indices(mask)))


def span(seconds: float) -> str:
    """A time span as a reason says it: ``5m``, ``3h 07m``, ``2d 4h``."""
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{max(minutes, 1)}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    return f"{hours // 24}d {hours % 24}h"
