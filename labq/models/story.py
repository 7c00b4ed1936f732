"""What a job's new version says happened to it, in the lab's words: the steps of its story that the lab took
on its own (placed, started, asked to make room, requeued, ended), for the event log (``labq events``).

What people did (a submit, a cancel, a hold) is in the log already as their requests; the end it brings (a
cancel's ``cancelled``) is the lab's step and is told here. Pure: the old and new versions in, a step out."""

from __future__ import annotations

from dataclasses import dataclass

from labq.models.job import Job, JobState


@dataclass(frozen=True)
class Step:
    action: str  #: ``placed``, ``started``, ``preempting``, ``requeued``, or how it ended (``succeeded``, ...)
    detail: str = ""  #: where, for whom, why: in a few words


def step_of(old: Job | None, new: Job) -> Step | None:
    """The step from ``old`` to ``new``; None when nothing of the story changed (or it is a new submit)."""
    if old is None or old.state is new.state and old.attempt == new.attempt:
        return None
    state = new.state
    if state.finished:
        return None if old.state.finished else Step(state.value, _ended(new))
    if state is JobState.STARTING:
        return Step("placed", _where(new))
    if state is JobState.RUNNING and old.state is not JobState.RUNNING:
        return Step("started", f"attempt {new.attempt} on {_where(new)}")
    if state is JobState.PREEMPTING:
        why = (f"for job {new.preempted_for}" if new.preempted_for is not None else
               f"for reservation {new.drained_for}" if new.drained_for else "")
        return Step("preempting", why)
    if state is JobState.QUEUED and new.attempt > old.attempt and new.history:
        last = new.history[-1]
        lost = f", {last.work_lost_s:.0f} s of work lost" if last.work_lost_s else ""
        return Step("requeued", f"attempt {last.number} {last.ended.value}{lost}")
    return None


def _where(job: Job) -> str:
    if job.placement is None:
        return ""
    return " + ".join(f"{a.node} GPUs {','.join(map(str, a.gpu_indices))}" for a in job.placement.allocations)


def _ended(job: Job) -> str:
    if job.exit_code is not None and job.state is JobState.FAILED:
        return f"exit {job.exit_code}"
    return job.note.splitlines()[-1][:200] if job.note else ""
