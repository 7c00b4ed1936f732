"""How a job's life moves on: pure functions from a job and a time to the next job.

When an attempt ends, it goes into the job's history with how it ended and the
work it lost, and the job is either finished or back in the queue as the same
job (next attempt, same class and submit time).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace

from labq.models.job import (CANCELLED_BY_LAB, FAILED_NOTE, AfterReservation, Attempt, AttemptEnd, Job, JobState,
                             SignalSource, StopReason)
from labq.models.placement import Placement
from labq.models.reservation import Reservation

_FINAL_STATE = {StopReason.CANCELLED: JobState.CANCELLED, StopReason.TIMEOUT: JobState.TIMEOUT}
#: how an attempt asked to stop ended when it did not save (exit 0) within its grace
_STOPPED_ENDS = {StopReason.PREEMPTED: AttemptEnd.PREEMPTED, StopReason.TIMEOUT: AttemptEnd.TIMEOUT,
                 StopReason.OVER_MEMORY: AttemptEnd.OVER_MEMORY}
_REQUEUED = frozenset({StopReason.PREEMPTED, StopReason.OVER_MEMORY})  #: stops that send a job back to the queue


def placed(job: Job, placement: Placement) -> Job:
    return job.evolve(state=JobState.STARTING, placement=placement, started_at=None, stop_requested=None)


def running(job: Job, started_at: float) -> Job:
    return job.evolve(state=JobState.RUNNING, started_at=started_at)


def checkpointed(job: Job, at: float | None) -> Job:
    """The attempt reported a finished checkpoint at ``at`` (the marker's time); older news changes nothing."""
    if at is None or job.started_at is None or at < job.started_at:
        return job
    if job.last_checkpoint_at is not None and at <= job.last_checkpoint_at:
        return job
    return job.evolve(last_checkpoint_at=at)


def declared(job: Job, signal: str | None, source: SignalSource | None) -> Job:
    """Its image or the job itself declared the signal it checkpoints on; it holds for later attempts too.

    A signal given at submit wins (the submitter said so), then the job's own word over its image's label;
    from one source, the latest counts."""
    if signal is None or source is None or job.spec.checkpoint_signal is not None:
        return job
    if job.learned_from is SignalSource.JOB and source is SignalSource.IMAGE:
        return job
    if (job.learned_signal, job.learned_from) == (signal, source):
        return job
    return job.evolve(learned_signal=signal, learned_from=source)


def stop_reason(job: Job) -> StopReason | None:
    """Why labq asked the running attempt to stop, if it did (a cancel wins over a preemption)."""
    if job.stop_requested is not None:
        return StopReason(job.stop_requested)
    return StopReason.PREEMPTED if job.state is JobState.PREEMPTING else None


def exited(job: Job, exit_code: int | None, ended_at: float, *, escalated: bool = False,
           checkpoint_at: float | None = None, why: str | None = None) -> Job:
    """The agent saw the attempt end; ``escalated``: it was still running when its grace ran out; ``why``: what
    its node knows of why it ended (it could not start, the kernel killed it for memory), for its note."""
    job = checkpointed(job, checkpoint_at)
    if why:
        job = job.evolve(note=_noted(job, f"{FAILED_NOTE}{why}"))
    reason = stop_reason(job)
    if reason is None:
        end = AttemptEnd.SUCCEEDED if exit_code == 0 else AttemptEnd.FAILED
    elif reason is StopReason.CANCELLED:
        end = AttemptEnd.CANCELLED
    elif escalated:
        end = AttemptEnd.KILLED
    elif exit_code == 0:
        end = AttemptEnd.CHECKPOINTED
    else:
        end = _STOPPED_ENDS[reason]
    if reason in _REQUEUED or (reason is StopReason.TIMEOUT and job.spec.requeue_on_timeout):
        return _requeue(job, _attempt(job, ended_at, end, exit_code, reason))
    if reason is None:
        state = JobState.SUCCEEDED if exit_code == 0 else JobState.FAILED
    else:
        state = _FINAL_STATE[reason]
    done = _attempt(job, ended_at, end, exit_code, reason, requeued=False)
    return job.evolve(state=state, exit_code=exit_code, ended_at=ended_at, stop_requested=None, preempted_for=None,
                      drained_for=None, history=(*job.history, done))


def out_of_memory(job: Job, peak_mib: int | None) -> str:
    """Why an attempt the kernel killed for want of memory ended, in its user's words."""
    used = f"used {_gib(peak_mib)}" if peak_mib else "ran out"
    asked = f" of --mem {_gib(job.spec.memory_mib)}" if job.spec.memory_mib else " of the memory it was given"
    return f"out of memory (the kernel killed it): {used}{asked}; ask for more with --mem"


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib} MiB"


def lost(job: Job, now: float, *, checkpoint_at: float | None = None) -> Job:
    """Its node went silent past requeue_after, or fenced it: back to the queue."""
    job = checkpointed(job, checkpoint_at)
    return _requeue(job, _attempt(job, now, AttemptEnd.LOST, None, StopReason.LOST))


def over_memory(job: Job, peak_mib: int, line: str) -> Job:
    """A running job that shares its GPU used ``peak_mib`` of GPU memory, past its declaration and the margin: it
    is asked to stop through its checkpoint contract, and will run with that much from then on (``line``: why,
    for its note). A stop asked already (a cancel, a preemption) stays the one asked."""
    peak = max(peak_mib, job.gpu_mem_peak_mib or 0)
    if job.state is not JobState.RUNNING or job.stop_requested is not None:
        return job.evolve(gpu_mem_peak_mib=peak) if peak != job.gpu_mem_peak_mib else job
    return job.evolve(stop_requested=StopReason.OVER_MEMORY.value, gpu_mem_peak_mib=peak, note=_noted(job, line))


def preempting(job: Job, for_job: int | None, reservation: str | None = None) -> Job:
    return job.evolve(state=JobState.PREEMPTING, preempted_for=for_job, drained_for=reservation)


def cancelled(job: Job, now: float) -> Job:
    return job.evolve(state=JobState.CANCELLED, ended_at=now)


def out_of_reservations(jobs: Iterable[Job], reservations: Mapping[str, Reservation], now: float) -> list[Job]:
    """The unfinished jobs whose reservation is over (ended, cancelled, or not there at all), moved on.

    Nothing waits for a booking that no longer holds GPUs: a job that has not started yet is
    released to the normal queue, or cancelled if its submitter chose ``--after-reservation cancel``;
    a job already on GPUs runs on as an ordinary job. Either way its ``note`` says what happened.
    """
    moved = []
    for job in jobs:
        name = job.spec.reservation
        if name is None or job.state.finished:
            continue
        r = reservations.get(name)
        if r is not None and r.live(now):
            continue
        why = "does not exist" if r is None else ("was cancelled" if r.cancelled_at is not None else "ended")
        moved.append(leave_reservation(job, f"reservation {name!r} {why}", now))
    return moved


def cancelled_by_someone(job: Job, who: str) -> Job:
    """``job`` once ``who``, not its owner, cancelled it (or asked it to stop for that): its note says who, and its
    owner hears of it (``--notify fail``)."""
    return job.evolve(cancelled_by=who, note=_noted(job, f"cancelled by {who}"))


def leave_reservation(job: Job, why: str, now: float) -> Job:
    """``job`` out of its reservation because ``why`` (``reservation 'paper' ended``)."""
    waiting = job.state in (JobState.QUEUED, JobState.HELD)
    if waiting and job.spec.after_reservation is AfterReservation.CANCEL:
        return job.evolve(state=JobState.CANCELLED, ended_at=now, cancelled_by=CANCELLED_BY_LAB,
                          note=_noted(job, f"cancelled: {why} before it started (--after-reservation cancel)"))
    what = "released to the normal queue" if waiting else "runs on outside it"
    return job.evolve(spec=replace(job.spec, reservation=None), note=_noted(job, f"{why}; {what}"))


def dependency_failure(spec_after_any: bool, dep: int, state: JobState | None) -> str | None:
    """Why a job that waits for job ``dep`` (in ``state``; None: there is no such job) can never start, or None.

    ``--after`` needs each job to succeed; ``--after-any`` only that it ends."""
    if state is None:
        return f"job {dep} does not exist"
    if state.finished and state is not JobState.SUCCEEDED and not spec_after_any:
        return f"job {dep} ended {state.value} (--after waits for success; --after-any for any end)"
    return None


def out_of_dependencies(jobs: Iterable[Job], finished: Mapping[int, JobState], now: float,
                        live: Mapping[int, Job] | None = None) -> list[Job]:
    """The waiting jobs whose dependencies can never be met, cancelled with the reason in their ``note``.

    ``jobs`` are the unfinished jobs, or with ``live`` (every unfinished job by id) only those that may
    wait for others. Slurm's DependencyNeverSatisfied, but ended rather than stuck; a chain (c after b
    after a) goes in one call, since each job cancelled here is a dependency that ended too."""
    jobs = list(jobs)
    waiting = [j for j in jobs if j.spec.depends_on and j.state in (JobState.QUEUED, JobState.HELD)]
    if not waiting:
        return []
    live = {j.id: j for j in jobs} if live is None else live
    ended: dict[int, JobState] = {}  #: cancelled here

    def state_of(dep: int) -> JobState | None:
        if dep in ended:
            return ended[dep]
        job = live.get(dep)
        return job.state if job is not None else finished.get(dep)

    cancelled: dict[int, Job] = {}
    while True:
        more = {}
        for job in waiting:
            if job.id in cancelled:
                continue
            why = next(filter(None, (dependency_failure(job.spec.after_any, d, state_of(d))
                                     for d in job.spec.depends_on)), None)
            if why is not None:
                more[job.id] = job.evolve(state=JobState.CANCELLED, ended_at=now, cancelled_by=CANCELLED_BY_LAB,
                                          note=_noted(job, f"cancelled: it can never start: {why}"))
        if not more:
            return list(cancelled.values())
        cancelled.update(more)
        ended.update((i, JobState.CANCELLED) for i in more)


def _noted(job: Job, line: str) -> str:
    return f"{job.note}; {line}" if job.note else line


def work_lost(job: Job, ended_at: float, end: AttemptEnd) -> float:
    """Seconds of the attempt a resume cannot get back: since its last reported checkpoint.

    With no checkpoint reported, an attempt that exited 0 within its grace saved as
    it left (the contract); any other lost everything since it started.
    """
    if job.started_at is None:
        return 0.0
    if job.last_checkpoint_at is not None:
        return max(0.0, ended_at - job.last_checkpoint_at)
    if end is AttemptEnd.CHECKPOINTED:
        return 0.0
    return max(0.0, ended_at - job.started_at)


def gpu_hours(job: Job, now: float) -> float:
    """GPU-hours the job's current attempt has used, for fair share."""
    if job.started_at is None:
        return 0.0
    return held_gpu_hours(job.started_at, job.ended_at if job.ended_at is not None else now, job.spec.gpus)


def attempt_gpu_hours(attempt: Attempt, gpus: int) -> float:
    if attempt.started_at is None:
        return 0.0
    return held_gpu_hours(attempt.started_at, attempt.ended_at, gpus)


def held_gpu_hours(started_at: float, ended_at: float, gpus: int, since: float = -math.inf,
                   until: float = math.inf) -> float:
    """GPU-hours of ``gpus`` GPUs held from ``started_at`` to ``ended_at``; with ``since``/``until``, only the
    part within them. The one definition of an attempt's use: fair share counts it whole, ``labq usage``
    (``labq.models.usage``) clips it to a report's window, so an attempt that straddles two windows is
    counted once, split between them."""
    return max(0.0, min(ended_at, until) - max(started_at, since)) * gpus / 3600.0


def _attempt(job: Job, ended_at: float, end: AttemptEnd, exit_code: int | None, reason: StopReason | None,
             *, requeued: bool = True) -> Attempt:
    return Attempt(job.attempt, job.placement, job.started_at, ended_at, end, exit_code, reason,
                   job.preempted_for if reason is StopReason.PREEMPTED else None, job.last_checkpoint_at,
                   work_lost(job, ended_at, end) if requeued else 0.0,
                   job.drained_for if reason is StopReason.PREEMPTED else None)


def _requeue(job: Job, done: Attempt) -> Job:
    preempted = done.stop_reason is StopReason.PREEMPTED
    return job.evolve(state=JobState.QUEUED, attempt=job.attempt + 1, placement=None, started_at=None,
                      stop_requested=None, preempted_for=None, drained_for=None, last_checkpoint_at=None,
                      preemptions=job.preemptions + int(preempted), work_lost_s=job.work_lost_s + done.work_lost_s,
                      history=(*job.history, done))
