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

from labq.models.job import Job
from labq.models.usage import job_use
from labq.sim.model import JobOutcome, SimResult, TraceJob, Workload

REAL = "real"  #: the name of what really happened, beside the policies' names


def workload_from_history(jobs: Iterable[Job], since: float, until: float) -> tuple[Workload, SimResult, list[str]]:
    """The finished ``jobs`` submitted in [since, until) as a workload (virtual time 0 is ``since``), what really
    happened to them as a ``SimResult`` on their own GPUs (``gpus`` left 0: the caller knows the lab's), and
    notes on what was left out."""
    chosen = sorted((j for j in jobs if j.state.finished and since <= j.submitted_at < until),
                    key=lambda j: (j.submitted_at, j.id))
    trace, outcomes, spans, busy = [], [], [], 0.0
    never, booked = 0, 0
    for job in chosen:
        runs = job_use(job, until).runs  # its attempts that started, as ``labq usage`` counts them
        if not runs:
            never += 1
            continue
        booked += job.spec.reservation is not None
        gpus = job.spec.gpus
        lost = sum(run.work_lost_s for run in runs)
        work = max(0.0, sum(run.ended_at - run.started_at for run in runs) - lost)
        traced = TraceJob(id=len(trace) + 1, submit=job.submitted_at - since, duration=work, gpus=gpus,
                          user=job.spec.user, priority=job.spec.priority, preemptible=job.spec.preemptible,
                          time_limit_s=job.spec.time_limit_s, queue=job.spec.queue)
        trace.append(traced)
        end = job.ended_at if job.ended_at is not None else runs[-1].ended_at
        outcomes.append(JobOutcome(traced, runs[0].started_at - since, end - since,
                                   sum(run.preempted for run in runs), lost * gpus))
        for run in runs:
            spans.append((traced.id, run.started_at - since, run.ended_at - since, gpus))
            busy += (run.ended_at - run.started_at) * gpus
    notes = []
    if never:
        notes.append(f"{never} jobs that never started (cancelled while they waited) are left out")
    if booked:
        notes.append(f"{booked} jobs ran in reservations: the replay books none, so they wait in the common queue")
    workload = Workload(jobs=tuple(trace), epoch=since, source="the lab's history")
    real = SimResult(policy=REAL, cluster="", gpus=0, outcomes=tuple(outcomes), busy_gpu_s=busy, epoch=since,
                     runs=tuple(spans))
    return workload, real, notes
