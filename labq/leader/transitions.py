"""How a job's life moves on: pure functions from a job and a time to the next job."""

from __future__ import annotations

from labq.models.job import Job, JobState
from labq.models.placement import Placement


def placed(job: Job, placement: Placement) -> Job:
    return job.evolve(state=JobState.STARTING, placement=placement, started_at=None, stop_requested=None)


def running(job: Job, started_at: float) -> Job:
    return job.evolve(state=JobState.RUNNING, started_at=started_at)


def exited(job: Job, exit_code: int | None, ended_at: float) -> Job:
    """The agent saw the attempt end: requeue it if it was preempted, else it is finished."""
    if job.state is JobState.PREEMPTING and job.stop_requested != "cancel":
        return requeued(job, ended_at, preempted=True)
    if job.stop_requested == "cancel":
        state = JobState.CANCELLED
    elif job.stop_requested == "timeout":
        state = JobState.TIMEOUT
    else:
        state = JobState.SUCCEEDED if exit_code == 0 else JobState.FAILED
    return job.evolve(state=state, exit_code=exit_code, ended_at=ended_at, stop_requested=None, preempted_for=None)


def requeued(job: Job, now: float, *, preempted: bool) -> Job:
    """Back in the queue as the same job: next attempt, same class and submit time."""
    lost = job.work_at_risk(now) if preempted or job.started_at is not None else 0.0
    return job.evolve(state=JobState.QUEUED, attempt=job.attempt + 1, placement=None, started_at=None,
                      stop_requested=None, preempted_for=None, preemptions=job.preemptions + int(preempted),
                      work_lost_s=job.work_lost_s + lost)


def preempting(job: Job, for_job: int) -> Job:
    return job.evolve(state=JobState.PREEMPTING, preempted_for=for_job)


def cancelled(job: Job, now: float) -> Job:
    return job.evolve(state=JobState.CANCELLED, ended_at=now)


def gpu_hours(job: Job, now: float) -> float:
    """GPU-hours the job's current attempt has used, for fair share."""
    if job.started_at is None:
        return 0.0
    end = job.ended_at if job.ended_at is not None else now
    return max(0.0, end - job.started_at) * job.spec.gpus / 3600.0
