"""The job queue's API: submit, look, and act on jobs. Scheduling itself is ``labq.leader.scheduling``."""

from __future__ import annotations

from labq.leader.auth import Principal
from labq.leader.bookings import Bookings
from labq.leader.config import LeaderConfig
from labq.leader.state import LabState
from labq.leader.users import user_only
from labq.models.actions import ActionRefused, Rules, Wish, acted
from labq.models.decisions import Pending
from labq.models.job import Job, JobSpec, JobState, Runtime
from labq.models.priority import priority_name
from labq.protocol import errors
from labq.protocol.codec import decode_job, encode_job
from labq.protocol.requests import ActionRequest, SubmitRequest
from labq.scheduler import why_never_fits
from labq.store import CommitFailed, PutJob

_REFUSALS = {"conflict": errors.conflict, "forbidden": errors.forbidden, "bad_request": errors.bad_request}


class Queue:
    def __init__(self, state: LabState, bookings: Bookings) -> None:
        self.state, self.bookings = state, bookings

    def submit(self, who: Principal, request: SubmitRequest) -> Job:
        """Checked, then committed outside the lock, so that concurrent submits share the store's group commit."""
        user_only(who)
        config, state = self.state.config, self.state
        spec = request.spec_for(who.name, default_grace_s=config.default_grace_s)
        _check_spec(spec, who, config)
        with state.lock:
            if spec.reservation is not None:
                self.bookings.check_submit(spec, state.clock())
            nodes = state.nodes()
            never = why_never_fits(spec, nodes) if nodes else None
            if never is not None:
                raise errors.unprocessable(f"this job can never run here: {never}")
            job = Job(state.next_job_id, spec, submitted_at=state.clock())
            state.next_job_id += 1
        try:
            state.store.commit([PutJob(encode_job(job))])
        except CommitFailed as err:
            raise errors.unavailable(f"the job was not saved, so it was not submitted: {err}") from None
        with state.lock:
            state.jobs[job.id] = job
        state.publish_job(job)
        state.wake()
        return job

    def visible(self, who: Principal, *, user: str | None, states: tuple[str, ...], everyone: bool,
                history: bool, limit: int | None, ids: tuple[int, ...] = ()) -> tuple[list[Job], dict[int, Job]]:
        """The jobs ``who`` asked for, sorted by id, and the unfinished jobs as they are now."""
        user_only(who)
        with self.state.lock:
            live = dict(self.state.jobs)
        jobs = [live[i] for i in ids if i in live] if ids else list(live.values())
        if history:
            jobs += [decode_job(doc) for doc in self.state.store.history()]
        if user is not None:
            jobs = [j for j in jobs if j.user == user]
        elif not everyone:
            jobs = [j for j in jobs if j.user == who.name]
        if states:
            jobs = [j for j in jobs if j.state.value in states]
        jobs.sort(key=lambda j: j.id)
        return (jobs[-limit:] if limit else jobs), live

    def pending_of(self, ids) -> dict[int, Pending]:
        with self.state.lock:
            return {i: self.state.pending[i] for i in ids if i in self.state.pending}

    def job(self, who: Principal, job_id: int) -> tuple[Job, Pending | None]:
        user_only(who)
        with self.state.lock:
            job = self.state.jobs.get(job_id)
            if job is not None:
                return job, self.state.pending.get(job_id)
        for doc in self.state.store.history():
            if doc["id"] == job_id:
                return decode_job(doc), None
        raise errors.not_found(f"there is no job {job_id}")

    def act(self, who: Principal, job_id: int, request: ActionRequest) -> Job:
        user_only(who)
        state, config = self.state, self.state.config
        with state.lock:
            job = state.jobs.get(job_id)
            if job is None:
                raise errors.not_found(f"there is no unfinished job {job_id}")
            if job.user != who.name and not who.admin:
                raise errors.forbidden(f"job {job_id} belongs to {job.user}; only they or an admin may change it")
            top = max((j.priority for j in state.jobs.values() if j.state is JobState.QUEUED and j.id != job.id),
                      default=job.priority - 1)
            wish = Wish(request.action, request.priority, request.gpus, request.time_limit_s)
            try:
                new = acted(job, wish, state.clock(), admin=who.admin, top_priority=top,
                            rules=Rules(config.user_max_priority, config.max_time_limit_s))
            except ActionRefused as refused:
                raise _REFUSALS[refused.kind](refused.message, *([refused.field] if refused.field else [])) from None
            if request.action == "edit":
                never = why_never_fits(new.spec, state.nodes()) if state.agents else None
                if never is not None:
                    raise errors.unprocessable(f"the job could never run so: {never}")
            state.apply([new])
        return new


def _check_spec(spec: JobSpec, who: Principal, config: LeaderConfig) -> None:
    """What the lab's settings allow a submit, before anything is taken."""
    if spec.priority > config.user_max_priority and not who.admin:
        raise errors.forbidden(f"priority {priority_name(spec.priority)} is for admins; the highest for users "
                               f"is {priority_name(config.user_max_priority)}")
    if not spec.preemptible and not who.admin and not listed(who.name, config.non_preemptible_users):
        raise errors.forbidden("only admins, and users the admin lists in scheduling.non_preemptible_users, "
                               "may submit jobs that cannot be preempted (--no-preempt); make the job "
                               "checkpoint instead (README: Checkpoint and resume)")
    if spec.grace_s > config.max_grace_s:
        raise errors.bad_request(f"grace is at most {config.max_grace_s:g} s here", "grace_s")
    limit = config.max_time_limit_s
    if limit and (spec.time_limit_s is None or spec.time_limit_s > limit):
        raise errors.bad_request(f"jobs here need a time limit of at most {limit:g} s (--time)", "time_limit_s")
    if spec.runtime is Runtime.DOCKER:
        _check_container(spec, config)


def listed(user: str, names: tuple[str, ...]) -> bool:
    return "*" in names or user in names


def _check_container(spec: JobSpec, config: LeaderConfig) -> None:
    """The leader's look at a container job; the agent looks again on its own machine before launching."""
    from labq.isolation import IsolationError, check_env, check_image, check_mounts

    try:
        check_image(spec.image, config.allowed_images)
        check_env(dict(spec.env))
        if spec.mounts:
            if not config.allowed_mount_roots:
                raise IsolationError("this lab allows no bind mounts (jobs.allowed_mount_roots is empty)")
            check_mounts(spec.mounts, config.allowed_mount_roots)
    except IsolationError as err:
        raise errors.forbidden(f"this container job is not allowed here: {err}") from None
