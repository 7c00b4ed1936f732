"""The admin's scheduling knobs, and the order in which the queue is served."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import inf
from operator import attrgetter
from collections.abc import Iterable, Mapping

from labq.models.job import Job
from labq.models.priority import PriorityClass, class_of
from labq.models.queues import QueueSpec

DAY_S = 86400.0


@dataclass(frozen=True)
class Policy:
    #: GPUs one user may hold at once (None: no limit); per-user overrides win
    max_gpus_per_user: int | None = None
    user_gpu_quota: Mapping[str, int] = field(default_factory=dict)
    #: let higher-priority jobs preempt lower, preemptible ones
    preemption: bool = True
    #: a job runs at least this long before it can be preempted
    min_runtime_s: float = 300.0
    #: how many blocked jobs get GPUs held for them (and an estimated start);
    #: lower jobs may use held GPUs only if their time limit ends first
    hold_depth: int = 16
    #: which classes (by value: 100, 200, ...) may preempt which; None: every class all lower ones
    may_preempt: Mapping[int, frozenset[int]] | None = None
    #: a job preempted this often in the last 24 hours is not preempted again (None: no cap)
    max_preemptions_per_day: int | None = None
    #: a job that has waited this long is served before every low and normal job that has waited less
    #: (``served_priority``); None: no aging
    aging_s: float | None = None
    #: the lab's queues (teams) and their guarantees; empty: one lab, no queues
    queues: tuple[QueueSpec, ...] = ()
    #: only jobs whose grace is at most this borrow another queue's GPUs, so that a reclaim ends within it
    reclaim_grace_s: float | None = None
    #: a job's CPU cores and memory (MiB) per GPU where its spec says none (``[jobs] cpus_per_gpu``,
    #: ``mem_per_gpu``); None: its node's share per GPU (``labq.scheduler.host``)
    cpus_per_gpu: float | None = None
    mem_per_gpu_mib: int | None = None

    def can_preempt(self, preemptor: int, victim: int) -> bool:
        """Whether a job of priority ``preemptor`` may preempt one of ``victim`` (strictly lower, and the rules)."""
        if victim >= preemptor:
            return False
        if self.may_preempt is None:
            return True
        return class_of(victim) in self.may_preempt.get(class_of(preemptor), ())

    def preempted_enough(self, job: Job, now: float) -> bool:
        """The job reached the cap on preemptions per day."""
        cap = self.max_preemptions_per_day
        return cap is not None and job.preemptions_since(now - DAY_S) >= cap

    def quota_for(self, user: str) -> int | None:
        return self.user_gpu_quota.get(user, self.max_gpus_per_user)


#: aging never lifts a job to high or above: high and urgent stay the admins' classes' intent
AGING_CAP = int(PriorityClass.HIGH) - 1


def waiting_since(job: Job) -> float:
    """When the job last joined the queue: its submit, or the end of its last attempt (a requeue)."""
    return job.history[-1].ended_at if job.history else job.submitted_at


def served_priority(job: Job, now: float, aging_s: float | None) -> int:
    """The priority the queue serves a waiting job at: its own until it has waited ``aging_s``, then
    ``AGING_CAP``, just below ``high`` (``order_queue`` serves the aged oldest first). So once a ``low`` or
    ``normal`` job has waited the aging wait, it goes before every ``low`` and ``normal`` job that has waited
    less, never before ``high`` or ``urgent`` work; fair share orders the jobs that have not aged; and only
    the order changes: what a job may preempt stays its own priority's. Whole numbers, so that jobs of one
    shape and one served priority still share one verdict in a pass (``labq.scheduler.memo``)."""
    priority = job.spec.priority
    if aging_s is None or priority >= AGING_CAP:
        return priority
    return AGING_CAP if now - waiting_since(job) >= aging_s else priority


def order_queue(jobs: Iterable[Job], usage: Mapping[str, float], now: float = 0.0,
                aging_s: float | None = None, ranks: Mapping[int, int] | None = None) -> list[Job]:
    """Priority first (as served: ``served_priority``, with ``aging_s``), then fair share (less decayed
    GPU-hours first), then submit time; the jobs that have aged, oldest first (since they last joined the queue).
    ``ranks``: each job's served priority by id, when the caller has it already (a pass needs it again).

    Stable sorts on scalar keys from the last criterion to the first, and
    priorities (a handful of distinct values) by bucketing: a pass over a long
    queue spends a quarter of the time that sorting (priority, usage, submitted,
    id) tuples takes.
    """
    queue = sorted(jobs, key=attrgetter("id"))
    queue.sort(key=attrgetter("submitted_at"))
    if usage:
        queue.sort(key=lambda j: usage.get(j.spec.user, 0.0))
    by_priority: dict[int, list[Job]] = {}
    for job in queue:
        rank = (job.spec.priority if aging_s is None else ranks[job.id] if ranks is not None
                else served_priority(job, now, aging_s))
        by_priority.setdefault(rank, []).append(job)
    if aging_s is not None and AGING_CAP in by_priority:  # the aged: oldest first
        by_priority[AGING_CAP].sort(key=waiting_since)
    return [job for priority in sorted(by_priority, reverse=True) for job in by_priority[priority]]


def decay_usage(usage: Mapping[str, float], elapsed_s: float, half_life_s: float) -> dict[str, float]:
    """Fair-share usage after ``elapsed_s`` of exponential decay."""
    if half_life_s <= 0 or half_life_s == inf:
        return dict(usage)
    factor = 0.5 ** (elapsed_s / half_life_s)
    return {user: hours * factor for user, hours in usage.items()}
