"""The job queue's API: submit, look, and act on jobs. Scheduling itself is ``labq.leader.scheduling``."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import replace
from operator import attrgetter
from typing import NamedTuple

from labq.leader.auth import Principal
from labq.leader.bookings import Bookings
from labq.leader.config import LeaderConfig
from labq.leader import finished as finished_jobs
from labq.leader.scheduling import finished_states
from labq.leader.state import LabState
from labq.leader.users import admin_only, user_only
from labq.models.actions import ActionRefused, Rules, Wish, acted
from labq.models.arrays import task_jobs, task_specs
from labq.models.decisions import Pending
from labq.models.job import Job, JobSpec, JobState, Runtime
from labq.models.priority import priority_name
from labq.models.transitions import cancelled_by_someone, dependency_failure
from labq.protocol import errors
from labq.protocol.codec import decode_job, encode_job, hide_env
from labq.protocol.requests import ActionRequest, SubmitRequest
from labq.scheduler import why_never_fits, why_no_node_runs_user
from labq.scheduler.inert import waits_whatever_the_order
from labq.scheduler.queues import lab_gpus, why_never_in_queue
from labq.store import CommitFailed, Ended, PutJob, PutRecord, PutTasks, collector_paused

#: what ``labq cancel|hold|release|prio 12`` may do to a whole array
ARRAY_ACTIONS = ("cancel", "hold", "release", "prio")
CLEANED = "cleaned"  #: the store's table of ``labq clean`` marks: user -> {"up_to": time}
_REFUSALS = {"conflict": errors.conflict, "forbidden": errors.forbidden, "bad_request": errors.bad_request}
_BY_ID = attrgetter("id")


class Listing(NamedTuple):
    """What ``Queue.visible`` found: the jobs to send, and what goes with them."""

    jobs: list[Job]  #: the jobs asked for (a page of them)
    live: dict[int, Job]  #: every unfinished job as it is now
    total: int  #: how many jobs match the filters, on every page alike
    next: int | None  #: the ``after`` of the next page; None at the end (and for a listing that is not paged)


class Queue:
    def __init__(self, state: LabState, bookings: Bookings) -> None:
        self.state, self.bookings = state, bookings
        #: per user, the time up to which ``labq clean`` hides their finished jobs from listings
        self.cleaned: dict[str, float] = {user: rec["up_to"] for user, rec in state.records.get(CLEANED, {}).items()}

    def submit(self, who: Principal, request: SubmitRequest) -> Job:
        user_only(who)
        return self._enqueue(who, request.spec_for(who.name, default_grace_s=self.state.config.default_grace_s,
                                            default_export=self.state.config.export))[0]

    def submit_sweep(self, who: Principal, request: SubmitRequest) -> tuple[int, list[Job]]:
        """An array or grid (``request.sweep``): its id and its tasks, one job each, checked once (they have one
        shape) and committed in one commit."""
        user_only(who)
        sweep, size = request.sweep, len(request.sweep.tasks)

        def tasks(array_id: int, spec: JobSpec, now: float) -> list[Job]:  # an id of its own, no job's: 12.0...
            return task_jobs(array_id + 1, task_specs(spec, array_id, sweep.tasks, sweep.cap, size), now)

        with collector_paused():  # its tasks are many objects made and none freed: collections would only walk them
            jobs = self._enqueue(who, request.spec_for(who.name, default_grace_s=self.state.config.default_grace_s,
                                            default_export=self.state.config.export),
                                 tasks=(1 + size, tasks))
        return jobs[0].spec.array_id, jobs

    def restart(self, who: Principal, job_id: int) -> Job:
        """A finished job submitted again as a new job with the same spec (``labq restart``)."""
        user_only(who)
        old, _ = self.job(who, job_id)
        if not old.state.finished:
            raise errors.conflict(f"job {job_id} is {old.state.value}; restart submits a finished job again "
                                  f"(`labq cancel {job_id}` first to start it over)")
        if old.user != who.name:
            raise errors.forbidden(f"job {job_id} belongs to {old.user}; a restart runs as its submitter, so only "
                                   "they may restart it")
        return self._enqueue(who, old.spec, note=f"restart of job {job_id}")[0]

    def _enqueue(self, who: Principal, spec: JobSpec, note: str = "",
                 tasks: tuple[int, Callable[[int, JobSpec, float], list[Job]]] | None = None) -> list[Job]:
        """Checked, then committed outside the lab's locks, so that concurrent submits share the store's group commit.
        A new job changes no version that is there: a submit only looks (the view), it waits for no change. One job
        (``note``: a restart's); or ``tasks``: (how many ids to take, what makes an array's jobs from the first id)."""
        state = self.state
        _check_spec(spec, who, state.config)
        spec = _with_tasks(_in_queue(spec, who, state.config, restart=bool(note)), state)
        ids, make = tasks or (1, lambda first, spec, now: [Job(first, spec, submitted_at=now, note=note)])
        with state.view:
            self._check_lab(spec)
            first, now = state.next_job_id, state.clock()
            state.next_job_id += ids
        jobs = make(first, spec, now)
        try:
            first = encode_job(jobs[0])  # an array's other tasks differ from it in a few fields: told so
            state.store.commit([PutTasks(first, [(j.id, j.spec.command, j.spec.env, j.spec.array_index)
                                                 for j in jobs[1:]]) if tasks else PutJob(first)])
        except CommitFailed as err:
            what = "array" if tasks else "job"
            raise errors.unavailable(f"the {what} was not saved, so it was not submitted: {err}") from None
        with state.view:
            state.add(jobs)
            # on a lab whose GPUs are all held by jobs this one may not preempt, a pass would only find its
            # reason to wait: it waits for the next pass (a second at most, more on a long queue:
            # ``LabState.quiet_submit_s``), and a stream of such submits costs one pass, not one each (an
            # array's tasks have one shape: the first says it for all)
            quiet = waits_whatever_the_order(jobs[0], state.nodes(), state.on_gpus.values(), state.policy())
            if quiet:
                state.defer(state.quiet_submit_s)
        state.publish_jobs(jobs)
        if not quiet:
            state.wake()
        return jobs

    def is_array(self, array_id: int) -> bool:
        """Whether ``array_id`` is an array with unfinished tasks."""
        with self.state.view:
            return array_id in self.state.arrays

    def task(self, who: Principal, array_id: int, index: int) -> int:
        """The job id of task ``array_id.index`` (``12.3``): the unfinished one, else the last that ended."""
        user_only(who)
        state = self.state
        with state.view:
            for job_id in state.arrays.get(array_id, ()):
                if state.jobs[job_id].spec.array_index == index:
                    return job_id
        ended = [doc["id"] for doc in state.store.array_history([array_id]) if _task_of(doc) == (array_id, index)]
        if not ended:
            raise errors.not_found(f"there is no task {array_id}.{index}")
        return max(ended)

    def array(self, who: Principal, array_id: int) -> list[Job] | None:
        """The tasks of array ``array_id``, the last job of each index, by index; None: no array has that id."""
        user_only(who)
        state = self.state
        with state.view:
            live = [state.jobs[i] for i in state.arrays.get(array_id, ())]
        ended = [decode_job(doc) for doc in state.store.array_history([array_id])]
        by_index: dict[int, Job] = {}
        for job in sorted(ended + live, key=_BY_ID):  # a task restarted: its last job
            by_index[job.spec.array_index] = job
        return [by_index[i] for i in sorted(by_index)] or None

    def act_on_array(self, who: Principal, array_id: int, request: ActionRequest) -> list[Job]:
        """``request`` for each unfinished task of array ``array_id`` it applies to (``labq cancel 12``: all of
        them; ``hold 12``: the queued ones): the tasks it changed, in one commit; 409 when it changed none."""
        user_only(who)
        if request.action not in ARRAY_ACTIONS:
            raise errors.bad_request(f"an array takes {', '.join(ARRAY_ACTIONS)}; {request.action} one task at a "
                                     f"time ({array_id}.INDEX)", "action")
        state = self.state
        with state.lock:
            tasks = sorted((state.jobs[i] for i in state.arrays.get(array_id, ())), key=_BY_ID)
            if not tasks:
                raise errors.not_found(f"array {array_id} has no unfinished task")
            if tasks[0].user != who.name and not who.admin:
                raise errors.forbidden(f"array {array_id} belongs to {tasks[0].user}; only they or an admin may "
                                       "change it")
            wish, rules, top = self._reading(who, request, {t.id for t in tasks}, tasks[0].priority)
            changed, refused = [], None
            for task in tasks:
                try:
                    new = acted(task, wish, state.clock(), admin=who.admin, top_priority=top, rules=rules)
                except ActionRefused as err:
                    refused = refused or err
                    continue
                changed.append(_by_whom(new, who, request))
            if not changed:
                assert refused is not None
                raise _REFUSALS[refused.kind](f"no task of array {array_id} could be changed so: {refused.message}",
                                              *([refused.field] if refused.field else []))
            state.apply(changed)
        return changed

    def history_window(self, who: Principal, since: float, until: float) -> list[dict]:
        """The lab's finished jobs submitted in [since, until), encoded, their environments' values hidden (what a
        replay needs: ``labq sim --from-history``). Admins only: it is everyone's work."""
        admin_only(who, "replay the lab's history")
        docs = self.state.store.history(since=since)  # ended since then: every job submitted since then
        return [hide_env(doc) for doc in docs if since <= doc["submitted_at"] < until]

    def _check_lab(self, spec: JobSpec) -> None:
        """What a submit must find in the lab as it is now (the view is held): one check a line."""
        state = self.state
        if spec.reservation is not None:
            self.bookings.check_submit(spec, state.clock())
        nodes = state.nodes()
        never = why_never_fits(spec, nodes) if nodes else None
        if never is not None:
            raise errors.unprocessable(f"this job can never run here: {never}")
        nobody = why_no_node_runs_user(spec.user, nodes)
        if nobody is not None:
            raise errors.unprocessable(f"this job can never run here: {nobody}")
        config = state.config
        if config.queues and nodes:
            lab = lab_gpus(nodes)
            grace = config.reclaim_grace_s if config.reclaim_grace_s is not None else config.max_grace_s
            outside = why_never_in_queue(spec, config.queues, lab, grace, config.preemption)
            if outside is not None:
                raise errors.unprocessable(f"this job can never run here: {outside}", "queue")
        _check_dependencies(spec, state)

    def visible(self, who: Principal, *, user: str | None, states: tuple[str, ...], everyone: bool,
                history: bool, limit: int | None, ids: tuple[int, ...] = (),
                finished: bool = False, after: int | None = None) -> Listing:
        """The jobs ``who`` asked for and the unfinished jobs as they are now. Sorted by id, the last ``limit``;
        ``after``: a page instead, the first ``limit`` with ids above ``after``; ``finished``: only finished jobs,
        by when they ended, the ``limit`` that ended last. Finished jobs that their users cleaned away (``labq
        clean``) are left out. The filters are applied first; only the jobs returned are worth more than a look."""
        user_only(who)
        if finished and after is not None:
            raise errors.bad_request("after pages through jobs by id; finished=1 lists them by when they ended (the "
                                     "limit that ended last): leave out after", "after")
        owner = user if user is not None else None if everyone else who.name
        with self.state.view:
            live = dict(self.state.jobs)
            # the unfinished jobs asked for, by id: one person's from the lab's index of them (``labq ls`` on a
            # long queue looks at theirs alone)
            unfinished = [] if finished else [i for i in ids if i in live] if ids else list(
                self.state.by_user.get(owner, ()) if owner is not None else live)
        if not ids:
            unfinished.sort()  # ids as numbers, not jobs by a key; outside the view
        if not (ids or history or finished or states):  # paged by the ids alone: only the page's jobs are looked at
            page, after_page = _page(unfinished, after, limit)
            return Listing([live[i] for i in page], live, len(unfinished), after_page)
        jobs: list[Job | Ended] = [live[i] for i in unfinished]
        if owner is not None and ids:  # ``spec.user`` and members, not properties
            jobs = [j for j in jobs if j.spec.user == owner]
        if history or finished:  # the archive's jobs by their heads: only the page's are read whole
            ended = self.state.store.ended(owner)
            # a job archived since ``live`` was taken is listed once, as it ended (the archive's is its last version)
            gone = {e.id for e in ended}
            wanted = set(ids)
            jobs = [j for j in jobs if j.id not in gone]
            jobs += [e for e in ended if (not wanted or e.id in wanted) and not self._cleaned(e)]
        if states:
            jobs = [j for j in jobs if (j.state if type(j) is Ended else j.state.value) in states]
        if ids or history or finished:
            jobs.sort(key=(lambda j: (j.ended_at or 0.0, j.id)) if finished else _BY_ID)
        while True:
            page, after_page = _page(jobs, after, limit, _BY_ID)
            docs = self.state.store.archived([j.id for j in page if type(j) is Ended])
            # an archived job whose line is damaged past its head is not read whole (history skips it): nor listed
            unread = {j.id for j in page if type(j) is Ended and j.id not in docs}
            if not unread:
                break
            jobs = [j for j in jobs if j.id not in unread]
        return Listing([decode_job(docs[j.id]) if type(j) is Ended else j for j in page], live, len(jobs), after_page)

    def _cleaned(self, job: Job | Ended) -> bool:
        mark = self.cleaned.get(job.user)
        return mark is not None and job.ended_at is not None and job.ended_at <= mark

    def clean(self, who: Principal) -> tuple[float, int]:
        """``labq clean``: hide the caller's finished jobs from listings from now on (the archive keeps them, and
        ``labq show ID`` still finds them). The time marked, and how many jobs it hid."""
        user_only(who)
        state = self.state
        with state.lock:
            now = state.clock()
            state.commit([PutRecord(CLEANED, who.name, {"up_to": now})])
            before, self.cleaned[who.name] = self.cleaned.get(who.name), now
        hidden = sum(1 for ended in state.store.ended(who.name)
                     if (before is None or (ended.ended_at or 0.0) > before) and (ended.ended_at or 0.0) <= now)
        return now, hidden

    def pending_of(self, ids) -> dict[int, Pending]:
        with self.state.view:
            return {i: self.state.pending[i] for i in ids if i in self.state.pending}

    def job(self, who: Principal, job_id: int) -> tuple[Job, Pending | None]:
        user_only(who)
        with self.state.view:
            job = self.state.jobs.get(job_id)
            if job is not None:
                return job, self.state.pending.get(job_id)
        doc = self.state.store.archived([job_id]).get(job_id) if 1 <= job_id < self.state.next_job_id else None
        if doc is None:
            raise errors.not_found(f"there is no job {job_id}")
        return decode_job(doc), None

    def act(self, who: Principal, job_id: int, request: ActionRequest) -> Job:
        user_only(who)
        state = self.state
        with state.lock:
            job = state.jobs.get(job_id)
            if job is None:
                raise errors.not_found(f"there is no unfinished job {job_id}")
            if job.user != who.name and not who.admin:
                raise errors.forbidden(f"job {job_id} belongs to {job.user}; only they or an admin may change it")
            wish, rules, top = self._reading(who, request, {job.id}, job.priority)
            try:
                new = acted(job, wish, state.clock(), admin=who.admin, top_priority=top, rules=rules)
            except ActionRefused as refused:
                raise _REFUSALS[refused.kind](refused.message, *([refused.field] if refused.field else [])) from None
            if request.action == "edit":
                never = why_never_fits(new.spec, state.nodes()) if state.agents else None
                if never is not None:
                    raise errors.unprocessable(f"the job could never run so: {never}")
            new = _by_whom(new, who, request)
            state.apply([new])
        return new

    def _reading(self, who: Principal, request: ActionRequest, acted_on: set[int], priority: int
                 ) -> tuple[Wish, Rules, int]:
        """An action as the rules read it (the lock is held): the wish, the rules for ``who``, and the highest
        priority among the queued jobs it does not act on. Only ``top`` reads that, and finding it reads every
        job of the queue: another action does not (a cancel on a queue of 30,000 jobs took 37 ms of the lock)."""
        state, config = self.state, self.state.config
        top = priority - 1
        if request.action == "top":
            top = max((j.priority for j in state.jobs.values() if j.state is JobState.QUEUED
                       and j.id not in acted_on), default=top)
        wish = Wish(request.action, request.priority, request.gpus, request.time_limit_s, request.by, request.name)
        return wish, Rules(config.max_priority_for(who.name), config.max_time_limit_s), top


def _page(ordered: list, after: int | None, limit: int | None, key: Callable | None = None) -> tuple[list, int | None]:
    """Of ``ordered`` (ids, or jobs by ``key``), the last ``limit`` (every one with no limit); with ``after``, the
    first ``limit`` past it instead, and the ``after`` of the next page (None: this is the last)."""
    if after is None:
        return ordered[-limit:] if limit else ordered, None
    start = bisect_right(ordered, after, key=key)
    page = ordered[start:start + limit] if limit else ordered[start:]
    more = bool(page) and start + len(page) < len(ordered)
    return page, (key(page[-1]) if key else page[-1]) if more else None


def _check_spec(spec: JobSpec, who: Principal, config: LeaderConfig) -> None:
    """What the lab's settings allow a submit, before anything is taken."""
    ceiling = config.max_priority_for(who.name)
    if spec.priority > ceiling and not who.admin:
        raise errors.forbidden(f"priority {priority_name(spec.priority)} is for admins and those they grant it "
                               f"(scheduling.class_grants); the highest for {who.name} is {priority_name(ceiling)}")
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


def _in_queue(spec: JobSpec, who: Principal, config: LeaderConfig, restart: bool) -> JobSpec:
    """The spec with the queue it is served in (``LeaderConfig.queue_for``); a restart keeps its queue while
    its user may still use it, else goes where a new submit would."""
    try:
        try:
            queue = config.queue_for(spec.user, spec.queue, admin=who.admin)
        except (LookupError, ValueError, PermissionError):
            if not restart:
                raise
            queue = config.queue_for(spec.user, None, admin=who.admin)
    except PermissionError as err:
        raise errors.forbidden(str(err)) from None
    except LookupError as err:
        raise errors.unprocessable(str(err), "queue") from None
    except ValueError as err:
        raise errors.bad_request(str(err), "queue") from None
    return spec if queue == spec.queue else replace(spec, queue=queue)


def _with_tasks(spec: JobSpec, state: LabState) -> JobSpec:
    """``spec`` waiting for every task of each array its ``depends_on`` names (``--after 12``: the whole array),
    those that ended included (the archive is read, outside the lab's locks, only for an id that is no job: an
    array's, or none at all)."""
    if not spec.depends_on:
        return spec
    try:  # the archive, read outside the locks once a leader's life if need be
        finished_jobs.ensure(state, spec.depends_on)
    except OSError as err:
        raise errors.unavailable(f"the jobs this one waits for could not be looked up: the archive of finished jobs "
                                 f"could not be read ({err}); nothing was submitted") from None
    with state.view:
        known = finished_states(state, spec.depends_on)
        tasks = {dep: set(state.arrays.get(dep, ())) for dep in spec.depends_on
                 if dep not in state.jobs and dep not in known}
        arrays = {dep for dep in tasks if dep < state.next_job_id}  # an id never handed out is no array's either
    if not arrays:
        return spec
    for doc in state.store.array_history(arrays):
        tasks[_task_of(doc)[0]].add(doc["id"])
    deps: list[int] = []
    for dep in spec.depends_on:  # no such array: the dependency check says there is no such job
        deps.extend(sorted(tasks[dep]) or [dep] if dep in tasks else [dep])
    return spec if deps == list(spec.depends_on) else replace(spec, depends_on=tuple(dict.fromkeys(deps)))


def _check_dependencies(spec: JobSpec, state: LabState) -> None:
    """A job that waits for jobs that do not exist, or (``--after``) for one that did not succeed, could never
    start: refused now rather than queued to be cancelled (the view is held)."""
    if not spec.depends_on:
        return
    finished = finished_states(state, spec.depends_on)
    for dep in spec.depends_on:
        live = state.jobs.get(dep)
        why = dependency_failure(spec.after_any, dep, live.state if live is not None else finished.get(dep))
        if why is not None:
            raise errors.unprocessable(f"this job could never start: {why}", "depends_on")


def _by_whom(job: Job, who: Principal, request: ActionRequest) -> Job:
    """``job`` after ``request``, saying who cancelled it when that was not its owner (its owner hears of it)."""
    return cancelled_by_someone(job, who.name) if request.action == "cancel" and who.name != job.user else job


def _task_of(doc: dict) -> tuple[int | None, int | None]:
    """(array id, index) of an encoded job; (None, None) for a job of its own."""
    array = doc["spec"].get("array")
    return (array["id"], array["index"]) if array else (None, None)


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
