"""What people may do to a queued or running job, as pure rules: a job and a wish in, the next job out.

Pure: no I/O, no clock (``now`` is passed in). A wish the rules refuse raises
``ActionRefused`` whose ``kind`` says how the API answers it (``conflict``,
``forbidden`` or ``bad_request``); the leader's job service checks who may act
on which job and commits the result.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from labq.models import transitions as t
from labq.models.job import Job, JobState
from labq.models.priority import MAX_PRIORITY, MIN_PRIORITY, priority_name


class ActionRefused(Exception):
    """The rules say no: ``kind`` is "conflict", "forbidden" or "bad_request"; ``field`` the request's field."""

    def __init__(self, kind: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.kind, self.message, self.field = kind, message, field


@dataclass(frozen=True)
class Wish:
    """One action on one job, as asked: ``action`` and the values it needs."""

    action: str
    priority: int | None = None  #: prio, edit: the new priority
    gpus: int | None = None
    time_limit_s: float | None = None  #: edit: 0 removes the limit
    priority_by: int | None = None  #: prio: a change to the priority (``labq prio 6 +10``), not a value
    name: str | None = None  #: edit: the new name ("" removes it)


@dataclass(frozen=True)
class Rules:
    """The lab's settings the action rules depend on."""

    user_max_priority: int  #: the acting user's ceiling: the lab's, raised by the admin's class grants
    max_time_limit_s: float | None = None


def acted(job: Job, wish: Wish, now: float, *, admin: bool, rules: Rules, top_priority: int = 0) -> Job:
    """The job after ``wish``; ``top_priority`` is the highest priority among the other queued jobs."""
    act = _ACTIONS.get(wish.action, _prioritised)
    return act(job, wish, now, admin, rules, top_priority)


def _cancelled(job: Job, wish: Wish, now: float, admin: bool, rules: Rules, top: int) -> Job:
    if job.state in (JobState.QUEUED, JobState.HELD):
        return t.cancelled(job, now)
    if job.stop_requested == "cancel":
        raise ActionRefused("conflict", f"job {job.id} is already being cancelled")
    return job.evolve(stop_requested="cancel")


def _held(job: Job, wish: Wish, now: float, admin: bool, rules: Rules, top: int) -> Job:
    if job.state is not JobState.QUEUED:
        raise ActionRefused("conflict", f"only a queued job can be held; job {job.id} is {job.state.value}")
    return job.evolve(state=JobState.HELD)


def _released(job: Job, wish: Wish, now: float, admin: bool, rules: Rules, top: int) -> Job:
    if job.state is not JobState.HELD:
        raise ActionRefused("conflict", f"job {job.id} is {job.state.value}, not held")
    return job.evolve(state=JobState.QUEUED)


def _preempted(job: Job, wish: Wish, now: float, admin: bool, rules: Rules, top: int) -> Job:
    if not admin:
        raise ActionRefused("forbidden", "only admins may preempt a job by hand")
    if job.state is not JobState.RUNNING:
        raise ActionRefused("conflict", f"only a running job can be preempted; job {job.id} is {job.state.value}")
    return t.preempting(job, None)


def _edited(job: Job, wish: Wish, now: float, admin: bool, rules: Rules, top: int) -> Job:
    """GPUs and the time limit while the job waits; its name and priority while it is unfinished."""
    if job.state.finished:
        raise ActionRefused("conflict", f"job {job.id} has ended ({job.state.value}); `labq restart {job.id}` "
                            "submits it again")
    if job.state not in (JobState.QUEUED, JobState.HELD) and (wish.gpus is not None or wish.time_limit_s is not None):
        raise ActionRefused("conflict", f"only a queued or held job can be edited; job {job.id} is {job.state.value} "
                            "(its name and priority can change while it runs)")
    spec, changes = job.spec, {}
    if wish.gpus is not None:
        if spec.gpus_per_node * spec.nodes != spec.gpus or wish.gpus % spec.nodes:
            raise ActionRefused("bad_request", f"{wish.gpus} GPUs cannot be split over {spec.nodes} nodes", "gpus")
        changes["gpus"] = wish.gpus
    if wish.time_limit_s is not None:
        limit = wish.time_limit_s or None
        if rules.max_time_limit_s and (limit is None or limit > rules.max_time_limit_s):
            raise ActionRefused("bad_request", f"jobs here need a time limit of at most {rules.max_time_limit_s:g} s",
                                "time_limit_s")
        changes["time_limit_s"] = limit
        if limit is None and spec.requeue_on_timeout:
            changes["requeue_on_timeout"] = False
    if wish.name is not None:
        changes["name"] = wish.name
    if wish.priority is not None:
        job = _prioritised(job, wish, now, admin, rules, top)
    return job.evolve(spec=replace(job.spec, **changes))


def _topped(job: Job, wish: Wish, now: float, admin: bool, rules: Rules, top: int) -> Job:
    if not admin:
        raise ActionRefused("forbidden", "only admins may move a job to the top of the queue")
    if job.state not in (JobState.QUEUED, JobState.HELD):
        raise ActionRefused("conflict", f"only a queued job can move to the top; job {job.id} is {job.state.value}")
    return job.evolve(spec=replace(job.spec, priority=min(MAX_PRIORITY, top + 1)))


def _prioritised(job: Job, wish: Wish, now: float, admin: bool, rules: Rules, top: int) -> Job:
    """A new priority, or the current one changed by ``priority_by`` (``+10``, ``-50``)."""
    target = wish.priority
    if wish.priority_by is not None:
        target = job.priority + wish.priority_by
        if not MIN_PRIORITY <= target <= MAX_PRIORITY:
            raise ActionRefused("bad_request", f"job {job.id}'s priority {job.priority} {wish.priority_by:+d} is "
                                f"{target}, outside {MIN_PRIORITY}-{MAX_PRIORITY}", "by")
    assert target is not None
    if target > rules.user_max_priority and target > job.priority and not admin:
        raise ActionRefused("forbidden", f"priority {priority_name(target)} is for admins and those they grant "
                            f"it (scheduling.class_grants); the highest for you is "
                            f"{priority_name(rules.user_max_priority)}")
    return job.evolve(spec=replace(job.spec, priority=target))


_ACTIONS = {"cancel": _cancelled, "hold": _held, "release": _released, "preempt": _preempted, "edit": _edited,
            "top": _topped}


def timeout_grace(job: Job) -> float:
    """How long before its time limit a job gets its checkpoint signal: its grace, at most half the limit."""
    limit = job.spec.time_limit_s
    return job.spec.grace_s if limit is None else min(job.spec.grace_s, limit / 2)
