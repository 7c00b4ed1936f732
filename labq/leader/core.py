"""The leader: the lab's queue in memory, every change on disk before it counts.

One lock guards the state. A submit takes it only to hand out an id and to
add the stored job, and commits in between, so concurrent submits share the
store's group commit. Everything else (actions, agent reports, scheduling
passes, timers) commits while holding the lock: those are few, and they must
not interleave.

Scheduling runs in its own thread whenever something changed, and once a
second for the timers (leases, time limits).
"""

from __future__ import annotations

import getpass
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from labq.models import transitions as t
from labq.leader.auth import JOIN_TOKEN_FILE, Principal, new_token, same_hash, write_secret
from labq.leader.bookings import Bookings
from labq.leader.config import LeaderConfig
from labq.leader.events import EventHub
from labq.models.decisions import Pending
from labq.models.job import Job, JobState, Runtime
from labq.models.node import Node, NodeHealth
from labq.models.priority import MAX_PRIORITY, priority_name
from labq.protocol import errors
from labq.protocol.agents import AttemptReport, Registration, RunOrder, StopOrder, SyncReply, SyncReport
from labq.protocol.codec import decode_job, decode_node, encode_job, encode_node
from labq.protocol.identity import token_hash
from labq.protocol.requests import ActionRequest, SubmitRequest, UserRequest
from labq.scheduler import Policy, decay_usage, schedule, why_never_fits
from labq.store import Change, CommitFailed, DeleteRecord, InvalidChange, PutJob, PutRecord, Store
from labq.workers import Supervisor

log = logging.getLogger("labq.leader")


@dataclass
class AgentSession:
    name: str
    node: Node
    token_sha256: str
    logs_url: str | None
    logs_token: str | None
    last_seen: float
    version: int = 0  #: bumps whenever what this agent should do changes
    delivered: SyncReply | None = None  #: the orders last sent
    gpu_usage: dict[int, dict] | None = None  #: as the agent last measured it
    address: str | None = None  #: where its registration came from

    def record(self) -> dict:
        return {"node": encode_node(replace(self.node, health=NodeHealth.UP)), "token_sha256": self.token_sha256,
                "logs_url": self.logs_url, "logs_token": self.logs_token}


class Leader:
    def __init__(self, config: LeaderConfig, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.events = EventHub()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self.epoch = secrets.token_hex(6)  #: this process: agents order its sync replies by (epoch, seq)
        self._replies = 0
        self.workers = Supervisor()
        state = store.load()
        now = clock()
        self.jobs: dict[int, Job] = {i: decode_job(doc) for i, doc in state.jobs.items()}
        self.next_job_id = state.next_job_id
        self.users: dict[str, dict] = dict(state.records.get("users", {}))
        self.agents = {name: AgentSession(name, decode_node(rec["node"]), rec["token_sha256"], rec.get("logs_url"),
                                          rec.get("logs_token"), last_seen=now)
                       for name, rec in state.records.get("agents", {}).items()}
        self.usage = {user: rec["gpu_hours"] for user, rec in state.records.get("usage", {}).items()}
        self.usage_at = now
        self.bookings = Bookings(self, state.records.get("reservations", {}))
        self.pending: dict[int, Pending] = {}
        self.finished: dict[int, JobState] = {}
        self._history_loaded = False
        join = state.records.get("cluster", {}).get("join")
        self.join_hash = join["token_sha256"] if join else self._new_join_token()
        #: agents advertising over mDNS, by node name (a hint; admission is by join token)
        self.seen_over_mdns: dict[str, dict] = {}

    # -- identity ----------------------------------------------------------------------

    def _new_join_token(self) -> str:
        token = new_token("join")
        write_secret(self.config.data_dir / JOIN_TOKEN_FILE, token)
        digest = token_hash(token)
        self.store.commit([PutRecord("cluster", "join", {"token_sha256": digest})])
        return digest

    def authenticate(self, token: str | None) -> Principal:
        if not token:
            raise errors.unauthorized("this request needs a token (Authorization: Bearer ...); "
                                      "`labq admin user add NAME` makes one")
        digest = token_hash(token)
        with self.lock:
            for name, user in self.users.items():
                if same_hash(user["token_sha256"], digest):
                    return Principal("user", name, user.get("admin", False))
            for name, session in self.agents.items():
                if same_hash(session.token_sha256, digest):
                    return Principal("agent", name)
            if same_hash(self.join_hash, digest):
                return Principal("join", "join")
        raise errors.unauthorized("unknown token: ask an admin for a new one (`labq admin user add NAME`)")

    def ensure_admin(self, name: str | None = None) -> tuple[str, str] | None:
        """On a fresh lab, make the person starting the leader its first admin: (name, token)."""
        with self.lock:
            if self.users:
                return None
            name = name or getpass.getuser()
            return name, self._set_user(name, admin=True)

    def _set_user(self, name: str, admin: bool) -> str:
        token = new_token("user")
        record = {"admin": admin, "token_sha256": token_hash(token), "created_at": self.clock()}
        self._commit([PutRecord("users", name, record)])
        self.users[name] = record
        return token

    def add_user(self, who: Principal, request: UserRequest) -> tuple[dict, str]:
        _admin_only(who, "add users")
        with self.lock:
            token = self._set_user(request.name, request.admin)
            return {"name": request.name, "admin": request.admin}, token

    def remove_user(self, who: Principal, name: str) -> dict:
        _admin_only(who, "remove users")
        with self.lock:
            if name not in self.users:
                raise errors.not_found(f"there is no user {name!r}")
            if name == who.name:
                raise errors.conflict("you cannot remove yourself; ask another admin")
            self._commit([DeleteRecord("users", name)])
            user = self.users.pop(name)
            return {"name": name, "admin": user.get("admin", False)}

    def list_users(self, who: Principal) -> list[dict]:
        _admin_only(who, "list users")
        with self.lock:
            return [{"name": n, "admin": u.get("admin", False)} for n, u in sorted(self.users.items())]

    # -- jobs ----------------------------------------------------------------------------

    def submit(self, who: Principal, request: SubmitRequest) -> Job:
        _user_only(who)
        spec = request.spec_for(who.name, default_grace_s=self.config.default_grace_s)
        if spec.priority > self.config.user_max_priority and not who.admin:
            raise errors.forbidden(f"priority {priority_name(spec.priority)} is for admins; the highest for users "
                                   f"is {priority_name(self.config.user_max_priority)}")
        if not spec.preemptible and not who.admin and not _listed(who.name, self.config.non_preemptible_users):
            raise errors.forbidden("only admins, and users the admin lists in scheduling.non_preemptible_users, "
                                   "may submit jobs that cannot be preempted (--no-preempt); make the job "
                                   "checkpoint instead (README: Checkpoint and resume)")
        if spec.grace_s > self.config.max_grace_s:
            raise errors.bad_request(f"grace is at most {self.config.max_grace_s:g} s here", "grace_s")
        limit = self.config.max_time_limit_s
        if limit and (spec.time_limit_s is None or spec.time_limit_s > limit):
            raise errors.bad_request(f"jobs here need a time limit of at most {limit:g} s (--time)", "time_limit_s")
        if spec.runtime is Runtime.DOCKER:
            _check_container(spec, self.config)
        with self.lock:
            if spec.reservation is not None:
                self.bookings.check_submit(spec.user, spec.reservation)
            nodes = [s.node for s in self.agents.values()]
            never = why_never_fits(spec, nodes) if nodes else None
            if never is not None:
                raise errors.unprocessable(f"this job can never run here: {never}")
            job = Job(self.next_job_id, spec, submitted_at=self.clock())
            self.next_job_id += 1
        try:
            self.store.commit([PutJob(encode_job(job))])
        except CommitFailed as err:
            raise errors.unavailable(f"the job was not saved, so it was not submitted: {err}") from None
        with self.lock:
            self.jobs[job.id] = job
        self._job_event(job)
        self.wake()
        return job

    def visible_jobs(self, who: Principal, *, user: str | None, states: tuple[str, ...], everyone: bool,
                     history: bool, limit: int | None, ids: tuple[int, ...] = ()) -> list[Job]:
        _user_only(who)
        with self.lock:
            jobs = [self.jobs[i] for i in ids if i in self.jobs] if ids else list(self.jobs.values())
        if history:
            jobs += [decode_job(doc) for doc in self.store.history()]
        if user is not None:
            jobs = [j for j in jobs if j.user == user]
        elif not everyone:
            jobs = [j for j in jobs if j.user == who.name]
        if states:
            jobs = [j for j in jobs if j.state.value in states]
        jobs.sort(key=lambda j: j.id)
        return jobs[-limit:] if limit else jobs

    def pending_of(self, ids) -> dict[int, Pending]:
        with self.lock:
            return {i: self.pending[i] for i in ids if i in self.pending}

    def job(self, who: Principal, job_id: int) -> tuple[Job, Pending | None]:
        _user_only(who)
        with self.lock:
            job = self.jobs.get(job_id)
            if job is not None:
                return job, self.pending.get(job_id)
        for doc in self.store.history():
            if doc["id"] == job_id:
                return decode_job(doc), None
        raise errors.not_found(f"there is no job {job_id}")

    def act(self, who: Principal, job_id: int, request: ActionRequest) -> Job:
        _user_only(who)
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                raise errors.not_found(f"there is no unfinished job {job_id}")
            if job.user != who.name and not who.admin:
                raise errors.forbidden(f"job {job_id} belongs to {job.user}; only they or an admin may change it")
            now = self.clock()
            top = max((j.priority for j in self.jobs.values() if j.state is JobState.QUEUED and j.id != job.id),
                      default=job.priority - 1)
            new = _acted(job, request, now, who, self.config, top)
            if request.action == "edit":
                never = why_never_fits(new.spec, [s.node for s in self.agents.values()]) if self.agents else None
                if never is not None:
                    raise errors.unprocessable(f"the job could never run so: {never}")
            self._save([new])
        self._job_event(new)
        self.wake()
        return new

    # -- nodes and agents ----------------------------------------------------------------

    def register(self, who: Principal, registration: Registration, address: str | None = None) -> str:
        if who.kind != "join":
            raise errors.forbidden("agents register with the cluster's join token")
        node = registration.node
        token = new_token("agent")
        with self.lock:
            old = self.agents.get(node.name)
            logs_url = registration.logs_url
            if logs_url and address and "//0.0.0.0:" in logs_url:  # listening everywhere: use where it came from
                logs_url = logs_url.replace("//0.0.0.0:", f"//{address}:")
            session = AgentSession(node.name, node, token_hash(token), logs_url,
                                   new_token("logs"), last_seen=self.clock())
            session.address = address
            if old is not None:
                session.version = old.version + 1
            self._commit([PutRecord("agents", node.name, session.record())])
            self.agents[node.name] = session
            self.changed.notify_all()
        self.events.publish("node", {"node": node.name, "health": "up"})
        self.wake()
        return token

    def logs_token(self, agent: str) -> str | None:
        with self.lock:
            session = self.agents.get(agent)
            return session.logs_token if session else None

    def nodes_view(self, who: Principal) -> list[dict]:
        _user_only(who)
        with self.lock:
            in_use: dict[str, dict[int, int]] = {}
            for job in self.jobs.values():
                if job.state.holds_gpus and job.placement:
                    for a in job.placement.allocations:
                        for g in a.gpu_indices:
                            in_use.setdefault(a.node, {})[g] = job.id
            return [{**encode_node(s.node), "gpus_in_use": in_use.get(name, {}), "last_seen": s.last_seen,
                     "gpu_usage": {str(i): u for i, u in (s.gpu_usage or {}).items()},
                     "found": "mDNS" if name in self.seen_over_mdns else "join token",
                     "address": s.address}
                    for name, s in sorted(self.agents.items())]

    def unadmitted(self) -> list[dict]:
        """Agents advertising this lab over mDNS that have not joined (no or a wrong join token)."""
        with self.lock:
            return [dict(seen, node=name) for name, seen in sorted(self.seen_over_mdns.items())
                    if name not in self.agents]

    def sync(self, who: Principal, agent: str, report: SyncReport) -> SyncReply:
        if who.kind != "agent" or who.name != agent:
            raise errors.forbidden(f"only agent {agent} may sync as {agent}")
        # an agent is heard only when it reports, so a poll never outlasts half its lease
        deadline = time.monotonic() + min(report.wait_s, self.config.lease_s / 2)
        with self.lock:
            session = self.agents[agent]
            changed = self._take_report(session, report)
            seen = session.version
            if not changed and not self._news_for(session, report):
                while session.version == seen and not self._stopping.is_set():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self.changed.wait(left)  # waiting is not hearing: last_seen stays at the report
            session.delivered = self._orders_for(session)
            self._replies += 1
            return replace(session.delivered, seq=self._replies, epoch=self.epoch)

    def _take_report(self, session: AgentSession, report: SyncReport) -> bool:
        """Learn from an agent's report; True if anything changed."""
        now = self.clock()
        session.last_seen = now
        changed = False
        if session.node.health is not NodeHealth.UP:
            session.node = replace(session.node, health=NodeHealth.UP)
            self.events.publish("node", {"node": session.name, "health": "up"})
            changed = True
        if report.gpu_usage is not None:
            session.gpu_usage = report.gpu_usage
        if report.unmanaged_busy is not None and report.unmanaged_busy != session.node.unmanaged_busy:
            session.node = replace(session.node, unmanaged_busy=report.unmanaged_busy)
            changed = True
        updates = []
        for a in report.attempts:
            job = self._expected(session.name, a)
            if job is None:
                continue
            if a.running:
                new = t.running(job, a.started_at or now) if job.state is JobState.STARTING else job
                new = t.checkpointed(new, a.checkpoint_at)
                if new is not job:
                    updates.append(new)
                continue
            # it may have ended before any report saw it running
            started = job if job.started_at is not None else t.running(job, a.started_at or now)
            if a.fenced:  # stopped on its node while the agent could not reach us
                updates.append(t.lost(started, a.ended_at or now, checkpoint_at=a.checkpoint_at))
            else:
                updates.append(t.exited(started, a.exit_code, a.ended_at or now, escalated=a.escalated,
                                        checkpoint_at=a.checkpoint_at))
        if updates:
            self._save(updates)
            for job in updates:
                self._job_event(job)
            changed = True
        if changed:
            self.wake()
        return changed

    def _expected(self, agent: str, a: AttemptReport) -> Job | None:
        job = self.jobs.get(a.job_id)
        if job is None or job.attempt != a.attempt or not job.state.holds_gpus or job.placement is None:
            return None
        return job if agent in job.placement.nodes else None

    def _news_for(self, session: AgentSession, report: SyncReport) -> bool:
        """Whether the agent should hear at once: it runs other than it should, or its orders changed."""
        orders = self._orders_for(session)
        reported = {(a.job_id, a.attempt) for a in report.attempts if a.running}
        wanted = {(r.job_id, r.attempt) for r in orders.run}
        return reported != wanted or orders != session.delivered

    def _orders_for(self, session: AgentSession) -> SyncReply:
        run, stop = [], []
        for job in self.jobs.values():
            if not job.state.holds_gpus or job.placement is None or session.name not in job.placement.nodes:
                continue
            run.append(self._run_order(job, session))
            if job.stop_requested == "timeout":
                stop.append(StopOrder(job.id, job.attempt, job.spec.checkpoint_signal, _timeout_grace(job), "timeout"))
            elif job.state is JobState.PREEMPTING:
                stop.append(StopOrder(job.id, job.attempt, job.spec.checkpoint_signal, job.spec.grace_s, "preempted"))
            elif job.stop_requested:
                stop.append(StopOrder(job.id, job.attempt, "SIGTERM", min(job.spec.grace_s, 30.0), job.stop_requested))
        return SyncReply(tuple(run), tuple(stop), self.config.lease_s, self.config.fence_after_s)

    def _run_order(self, job: Job, session: AgentSession) -> RunOrder:
        indices = job.placement.gpus_on(session.name)
        node = session.node
        uuids = tuple(node.gpus[i].uuid for i in indices)
        visible = ",".join(map(str, indices)) if node.simulated else ",".join(uuids)
        env = dict(job.spec.env)
        env.update({"LABQ_JOB_ID": str(job.id), "LABQ_ATTEMPT": str(job.attempt),
                    "LABQ_RESUMED": "1" if job.attempt > 1 else "0", "LABQ_PREEMPT_SIGNAL": job.spec.checkpoint_signal,
                    "CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible})
        spec = job.spec
        root = self.config.checkpoint_root
        return RunOrder(job.id, job.attempt, job.user, spec.command, env, spec.workdir, indices, uuids,
                        spec.grace_s, spec.checkpoint_signal, spec.runtime.value, spec.image,
                        tuple((m.source, m.target, m.read_only) for m in spec.mounts), spec.shm_size_mib,
                        node.simulated, f"{root.rstrip('/')}/{job.id}" if root else None)

    # -- scheduling and timers -----------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        self.workers.spawn("labq-scheduler", self._loop)

    def check(self) -> list[str]:
        """For the process's main thread: restart the scheduler thread if it died (``WorkerFailed`` if it keeps
        dying)."""
        return self.workers.check()

    def stop(self) -> None:
        self._stopping.set()
        self.workers.stopping = True
        self._wake.set()
        with self.lock:
            self.changed.notify_all()
        self.events.close()
        self.workers.join(timeout=10)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self.tick()
                self.schedule_pass()
            except Exception:  # a bad pass must not stop the lab; it is logged and retried
                log.exception("scheduling pass failed")

    def schedule_pass(self) -> None:
        with self.lock:
            now = self.clock()
            self._decay_usage(now)
            nodes = [s.node for s in self.agents.values()]
            policy = Policy(max_gpus_per_user=self.config.max_gpus_per_user,
                            user_gpu_quota=self.config.user_gpu_quota, preemption=self.config.preemption,
                            min_runtime_s=self.config.min_runtime_s, hold_depth=self.config.hold_depth,
                            may_preempt=self.config.may_preempt,
                            max_preemptions_per_day=self.config.max_preemptions_per_day)
            usage = dict(self.usage)  # finished work, decayed; plus what running attempts have used so far
            for job in self.jobs.values():
                if job.started_at is not None:
                    usage[job.user] = usage.get(job.user, 0.0) + t.gpu_hours(job, now)
            decisions = schedule(list(self.jobs.values()), nodes, now=now, usage=usage, policy=policy,
                                 finished=self._finished_for_dependencies(),
                                 reservations=self.bookings.current(now))
            updates = [t.placed(self.jobs[s.job_id], s.placement) for s in decisions.starts]
            updates += [t.preempting(self.jobs[p.job_id], p.for_job, p.reservation) for p in decisions.preemptions]
            changed_pending = {p.job_id for p in decisions.pending
                               if self.pending.get(p.job_id, (None,))[1:3] != p[1:3]}
            self.pending = {p.job_id: p for p in decisions.pending}
            if updates:
                self._save(updates)
        for job in updates:
            self._job_event(job)
        for job_id in changed_pending:
            self.events.publish("job", {"job_id": job_id, "pending": True})

    def _finished_for_dependencies(self) -> dict[int, JobState]:
        wanted = {d for j in self.jobs.values() for d in j.spec.depends_on if d not in self.jobs}
        if wanted - self.finished.keys() and not self._history_loaded:
            self._history_loaded = True
            for doc in self.store.history():
                self.finished[doc["id"]] = JobState(doc["state"])
        return self.finished

    def tick(self) -> None:
        """Timers: agents that went silent, and jobs past their time limit."""
        with self.lock:
            now = self.clock()
            updates = []
            for session in self.agents.values():
                silent = now - session.last_seen
                if silent > self.config.lease_s and session.node.health is NodeHealth.UP:
                    session.node = replace(session.node, health=NodeHealth.LOST)
                    self.events.publish("node", {"node": session.name, "health": "lost"})
                    self.wake()
                if self.config.auto_requeue and silent > self.config.requeue_after_s:
                    for job in self.jobs.values():
                        if job.state.holds_gpus and job.placement and session.name in job.placement.nodes:
                            updates.append(t.lost(job, now) if job.stop_requested != "cancel"
                                           else t.cancelled(job, now))
            updates += self.bookings.tick(now)
            for job in self.jobs.values():  # the checkpoint signal a grace before the limit, stopped at it
                end = job.expected_end()
                if (job.state in (JobState.RUNNING, JobState.PREEMPTING) and end is not None
                        and now >= end - _timeout_grace(job) and not job.stop_requested
                        and all(u.id != job.id for u in updates)):
                    updates.append(job.evolve(stop_requested="timeout"))
            if updates:
                self._save(updates)
        for job in updates:
            self._job_event(job)

    def _decay_usage(self, now: float) -> None:
        self.usage = decay_usage(self.usage, now - self.usage_at, self.config.fair_share_half_life_s)
        self.usage_at = now

    # -- persistence ---------------------------------------------------------------------

    def _save(self, jobs: list[Job]) -> None:
        """Commit new versions of jobs, then take them in (the lock is held)."""
        now = self.clock()
        changes: list[Change] = [PutJob(encode_job(j)) for j in jobs]
        finished_users = {}
        for job in jobs:
            old = self.jobs.get(job.id)
            if job.state.finished:
                hours = t.gpu_hours(job, now)
            elif old is not None and job.attempt > old.attempt and job.history:  # a requeued attempt's use
                hours = t.attempt_gpu_hours(job.history[-1], job.spec.gpus)
            else:
                continue
            finished_users[job.user] = finished_users.get(job.user, self.usage.get(job.user, 0.0)) + hours
        for user, hours in finished_users.items():
            changes.append(PutRecord("usage", user, {"gpu_hours": hours, "at": now}))
        self._commit(changes)
        self.usage.update(finished_users)
        touched = set()
        for job in jobs:
            old = self.jobs.get(job.id)
            for j in (old, job):
                if j is not None and j.placement is not None:
                    touched.update(j.placement.nodes)
            if job.state.finished:
                self.jobs.pop(job.id, None)
                self.pending.pop(job.id, None)
                self.finished[job.id] = job.state
            else:
                self.jobs[job.id] = job
        for name in touched:
            if name in self.agents:
                self.agents[name].version += 1
        self.changed.notify_all()

    def _commit(self, changes: list[Change]) -> None:
        try:
            self.store.commit(changes)
        except CommitFailed as err:
            raise errors.unavailable(f"the change was not saved, so it did not happen: {err}") from None
        except InvalidChange as err:
            raise errors.ApiError(500, "internal", f"the leader made an invalid change: {err}") from None

    def _job_event(self, job: Job) -> None:
        event = {"job_id": job.id, "state": job.state.value, "user": job.user, "attempt": job.attempt}
        if job.preempted_for is not None:
            event["preempted_for"] = job.preempted_for
        if job.drained_for is not None:
            event["drained_for"] = job.drained_for
        self.events.publish("job", event)


def _acted(job: Job, request: ActionRequest, now: float, who: Principal, config: LeaderConfig,
           top_priority: int = 0) -> Job:
    state = job.state
    if request.action == "cancel":
        if state in (JobState.QUEUED, JobState.HELD):
            return t.cancelled(job, now)
        if job.stop_requested == "cancel":
            raise errors.conflict(f"job {job.id} is already being cancelled")
        return job.evolve(stop_requested="cancel")
    if request.action == "hold":
        if state is not JobState.QUEUED:
            raise errors.conflict(f"only a queued job can be held; job {job.id} is {state.value}")
        return job.evolve(state=JobState.HELD)
    if request.action == "release":
        if state is not JobState.HELD:
            raise errors.conflict(f"job {job.id} is {state.value}, not held")
        return job.evolve(state=JobState.QUEUED)
    if request.action == "preempt":
        if not who.admin:
            raise errors.forbidden("only admins may preempt a job by hand")
        if state is not JobState.RUNNING:
            raise errors.conflict(f"only a running job can be preempted; job {job.id} is {state.value}")
        return t.preempting(job, None)
    if request.action == "edit":
        if state not in (JobState.QUEUED, JobState.HELD):
            raise errors.conflict(f"only a queued or held job can be edited; job {job.id} is {state.value}")
        changes = {}
        if request.gpus is not None:
            if job.spec.gpus_per_node * job.spec.nodes != job.spec.gpus or request.gpus % job.spec.nodes:
                raise errors.bad_request(f"{request.gpus} GPUs cannot be split over {job.spec.nodes} nodes", "gpus")
            changes["gpus"] = request.gpus
        if request.time_limit_s is not None:
            limit = request.time_limit_s or None
            if config.max_time_limit_s and (limit is None or limit > config.max_time_limit_s):
                raise errors.bad_request(f"jobs here need a time limit of at most {config.max_time_limit_s:g} s",
                                         "time_limit_s")
            changes["time_limit_s"] = limit
            if limit is None and job.spec.requeue_on_timeout:
                changes["requeue_on_timeout"] = False
        return job.evolve(spec=replace(job.spec, **changes))
    if request.action == "top":
        if not who.admin:
            raise errors.forbidden("only admins may move a job to the top of the queue")
        if state not in (JobState.QUEUED, JobState.HELD):
            raise errors.conflict(f"only a queued job can move to the top; job {job.id} is {state.value}")
        return job.evolve(spec=replace(job.spec, priority=min(MAX_PRIORITY, top_priority + 1)))
    assert request.priority is not None
    if request.priority > config.user_max_priority and not who.admin:
        raise errors.forbidden(f"priority {priority_name(request.priority)} is for admins; the highest for users is "
                               f"{priority_name(config.user_max_priority)}")
    return job.evolve(spec=replace(job.spec, priority=request.priority))


def _timeout_grace(job: Job) -> float:
    """How long before its time limit a job gets its checkpoint signal: its grace, at most half the limit."""
    limit = job.spec.time_limit_s
    return job.spec.grace_s if limit is None else min(job.spec.grace_s, limit / 2)


def _listed(user: str, names: tuple[str, ...]) -> bool:
    return "*" in names or user in names


def _check_container(spec, config: LeaderConfig) -> None:
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


def _user_only(who: Principal) -> None:
    if who.kind != "user":
        raise errors.forbidden("this needs a user's token")


def _admin_only(who: Principal, what: str) -> None:
    _user_only(who)
    if not who.admin:
        raise errors.forbidden(f"only admins may {what}")
