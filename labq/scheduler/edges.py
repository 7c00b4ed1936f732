"""When the passing of time alone may change what a pass decides.

A pass is a function of the lab's state and the time. Between changes to the state (a submit, an
end, a node, a booking), only a few moments change its answer: a running job reaches its minimum
runtime and may be preempted, a waiting job reaches the aging wait or its queue's maximum wait, a
preempted job may borrow again, a reservation drains, starts or ends. ``next_edge`` says the
earliest of them, so that the leader passes then instead of every second.
"""

from __future__ import annotations

from collections.abc import Iterable

from labq.models.job import Job, JobState, StopReason
from labq.models.reservation import Reservation
from labq.scheduler.policy import Policy, waiting_since


def next_edge(jobs: Iterable[Job], reservations: Iterable[Reservation], policy: Policy, now: float) -> float | None:
    """The first moment after ``now`` at which a pass over the same state could decide otherwise; None: none."""
    jobs = list(jobs)
    edges: list[float] = []
    waits = {q.name: q.max_wait_s for q in policy.queues if q.max_wait_s is not None}
    for job in jobs:
        state = job.state
        if state is JobState.RUNNING:
            if policy.preemption and job.spec.preemptible and job.started_at is not None:
                edges.append(job.started_at + policy.min_runtime_s)
            continue
        if state is not JobState.QUEUED:
            continue
        since = waiting_since(job)
        if policy.aging_s is not None:
            edges.append(since + policy.aging_s)
        wait = waits.get(job.spec.queue)
        if wait is not None:
            edges.append(since + wait)
        last = job.history[-1] if job.history else None
        if policy.queues and last is not None and last.stop_reason is StopReason.PREEMPTED:
            edges.append(last.ended_at + policy.min_runtime_s)  # it may borrow again
    graces = {job.spec.grace_s for job in jobs if job.state in (JobState.RUNNING, JobState.QUEUED)}
    for r in reservations:  # a drain starts a job's grace before the start; lending stops then too
        edges += [r.start - grace for grace in graces]
        edges += (r.start, r.end)
    later = [e for e in edges if e > now]
    return min(later, default=None)
