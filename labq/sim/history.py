"""What if the lab had run otherwise: its own finished jobs as a workload, and what really happened to them.

``labq sim --from-history`` replays the jobs the lab ran (each one's submit time, size, class and the work
it measured) through the scheduler with another policy, and puts what really happened beside it as one
more report (``REAL``), computed the same way (``labq.sim.report``): queueing delay, JCT, utilisation,
preemptions. The work a job measured is the time its attempts ran, less the work its requeues lost (redone
later): a replay that runs it uninterrupted needs that much. Pure: the jobs come decoded, time is passed in.

Left out, and said so in the notes: jobs that never started (cancelled while they waited: no work to
replay), and a job's reservation (the replay books none: its jobs wait in the common queue).
"""

from __future__ import annotations

from collections.abc import Iterable

from labq.models.job import Job, StopReason
from labq.sim.model import JobOutcome, SimResult, TraceJob, Workload

REAL = "real"  #: the name of what really happened, beside the policies' names


def workload_from_history(jobs: Iterable[Job], since: float, until: float) -> tuple[Workload, SimResult, list[str]]:
    """The finished ``jobs`` submitted in [since, until) as a workload (virtual time 0 is ``since``), what really
    happened to them as a ``SimResult`` on their own GPUs (``gpus`` left 0: the caller knows the lab's), and
    notes on what was left out."""
    chosen = sorted((j for j in jobs if j.state.finished and since <= j.submitted_at < until),
                    key=lambda j: (j.submitted_at, j.id))
    trace, outcomes, runs, busy = [], [], [], 0.0
    never, booked = 0, 0
    for job in chosen:
        attempts = _runs(job)
        if not attempts:
            never += 1
            continue
        booked += job.spec.reservation is not None
        gpus = job.spec.gpus
        lost = sum(a.work_lost_s for a in job.history if a.started_at is not None)
        work = max(0.0, sum(end - start for start, end in attempts) - lost)
        traced = TraceJob(id=len(trace) + 1, submit=job.submitted_at - since, duration=work, gpus=gpus,
                          user=job.spec.user, priority=job.spec.priority, preemptible=job.spec.preemptible,
                          time_limit_s=job.spec.time_limit_s, queue=job.spec.queue)
        trace.append(traced)
        preempted = sum(1 for a in job.history if a.stop_reason is StopReason.PREEMPTED)
        end = job.ended_at if job.ended_at is not None else attempts[-1][1]
        outcomes.append(JobOutcome(traced, attempts[0][0] - since, end - since, preempted, lost * gpus))
        for start, stop in attempts:
            runs.append((traced.id, start - since, stop - since, gpus))
            busy += (stop - start) * gpus
    notes = []
    if never:
        notes.append(f"{never} jobs that never started (cancelled while they waited) are left out")
    if booked:
        notes.append(f"{booked} jobs ran in reservations: the replay books none, so they wait in the common queue")
    workload = Workload(jobs=tuple(trace), epoch=since, source="the lab's history")
    real = SimResult(policy=REAL, cluster="", gpus=0, outcomes=tuple(outcomes), busy_gpu_s=busy, epoch=since,
                     runs=tuple(runs))
    return workload, real, notes


def _runs(job: Job) -> list[tuple[float, float]]:
    """(start, end) of each attempt that started, oldest first: the history's, then the last one's own."""
    spans = [(a.started_at, a.ended_at) for a in job.history if a.started_at is not None and a.ended_at is not None]
    last = job.history[-1] if job.history else None
    if job.started_at is not None and (last is None or last.number != job.attempt):
        spans.append((job.started_at, job.ended_at if job.ended_at is not None else job.started_at))
    return spans
