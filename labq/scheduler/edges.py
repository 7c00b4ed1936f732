"""When the passing of time alone may change what a pass decides.

A pass is a function of the lab's state and the time. Between changes to the state (a submit, an
end, a node, a booking), only a few moments change its answer: a running job reaches its minimum
runtime and may be preempted, a waiting job reaches the aging wait or its queue's maximum wait, a
preempted job may borrow again, a reservation drains, starts or ends. ``next_edge`` says the
earliest of them, so that the leader passes then instead of every second.
"""

from __future__ import annotations

from collections.abc import Iterable
from math import inf

from labq.models.job import Job, JobState, StopReason
from labq.models.reservation import Reservation
from labq.scheduler.policy import Policy, waiting_since


def next_edge(jobs: Iterable[Job], reservations: Iterable[Reservation], policy: Policy, now: float) -> float | None:
    """The first moment after ``now`` at which a pass over the same state could decide otherwise; None: none.
    One loop over the queue, keeping only the earliest edge to come (a pass of a long queue pays for it)."""
    jobs = list(jobs)
    first = inf
    waits = {q.name: q.max_wait_s for q in policy.queues if q.max_wait_s is not None}
    aging, runtime = policy.aging_s, policy.min_runtime_s
    preemption, queues = policy.preemption, bool(policy.queues)
    running, queued = JobState.RUNNING, JobState.QUEUED
    for job in jobs:
        state = job.state
        if state is running:
            if preemption and job.spec.preemptible and job.started_at is not None:
                edge = job.started_at + runtime
                if now < edge < first:
                    first = edge
            continue
        if state is not queued:
            continue
        since = waiting_since(job)
        if aging is not None and now < since + aging < first:
            first = since + aging
        if waits:
            wait = waits.get(job.spec.queue)
            if wait is not None and now < since + wait < first:
                first = since + wait
        if queues and job.history and job.history[-1].stop_reason is StopReason.PREEMPTED:
            edge = job.history[-1].ended_at + runtime  # it may borrow again
            if now < edge < first:
                first = edge
    reservations = list(reservations)
    if reservations:  # a drain starts a job's grace before the start; lending stops then too
        graces = {job.spec.grace_s for job in jobs if job.state in (running, queued)}
        for r in reservations:
            for edge in [r.start - grace for grace in graces] + [r.start, r.end]:
                if now < edge < first:
                    first = edge
    return None if first == inf else first
