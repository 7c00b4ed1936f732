"""The lab as the leader holds it, and the one way it changes: ``apply``.

Two locks guard everything here (``labq.leader.locks``): each service takes
``lock`` around a change (what it reads, decides and commits) and ``view``
alone around a look; a change steps out of ``view`` to write its commit, and
lets go of both before waiting for the disk, so looks never wait for one and the
next change is decided meanwhile. ``apply`` writes new versions of jobs (and any
records, and the outbox records of the notices they cause: ``notify``) to the
store first, and only then takes them in, accounts finished work for fair share,
tells the agents whose orders changed, wakes long polls and publishes the jobs'
events. Nothing that leaves the leader comes of a change before it is on disk:
the change answers once it is (``LabLock``), and so do an agent's orders and a
notice (``on_disk``). Looks may show a change written and not yet synced, which
a crash of the leader keeps; a sync that fails after the leader took its change
in stops every change until a restart, which reads what is on disk.

Time is injected: ``clock`` is the wall clock that jobs, leases and timers are
stamped with; ``monotonic`` times long polls. Tests step both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from labq.leader.config import LeaderConfig
from labq.leader.events import EventHub
from labq.leader.finished import FinishedStates
from labq.leader.locks import LabLock
from labq.models import transitions as t
from labq.models.decisions import Pending
from labq.models.job import Job, JobState
from labq.models.node import Node, NodeHealth
from labq.models.notify import Notice
from labq.models.reservation import Reservation
from labq.protocol import errors
from labq.protocol.agents import SyncReply
from labq.protocol.codec import decode_job, decode_node, encode_job, encode_node
from labq.scheduler import Policy, decay_usage

log = logging.getLogger("labq.leader")
MEASURE_GAP_S = 300.0  #: the longest stretch one GPU measurement stands for
#: how often the running jobs' GPU measurements so far are saved with them: a restart loses at most this much of them
MEASURE_SAVE_S = 900.0
#: how soon a pass takes in a change that no pass needs at once (``defer``): a submit that can only wait, a waiting
#: job cancelled or held. A stream of them costs a pass a second, not one each
QUIET_PASS_S = 1.0
#: On a queue so long that a pass takes a while, a stream of submits that can only wait is taken in by passes
#: that take at most this share of the leader's time: they come ``pass / QUIET_SUBMIT_SHARE`` apart (a pass of
#: 30,000 queued jobs takes half a second of wall time under a stream of submits), but never more than
#: ``QUIET_SUBMIT_MAX_S``, within which such a submit's reason to wait is shown.
QUIET_SUBMIT_SHARE = 0.2
QUIET_SUBMIT_MAX_S = 5.0
from labq.store import Change, CommitFailed, InvalidChange, PutJob, PutRecord, Staged, Store


class Notifier(Protocol):
    """What ``apply`` asks of the notifications (``labq.leader.notify.Notify``), the lock held: the notices a
    commit of jobs causes, their outbox records (committed with the jobs), and their hand-over once written; the
    reservations' timers ask which starts and ends are new."""

    def notices_for(self, changes: list[tuple[Job | None, Job]]) -> list[Notice]: ...

    def records(self, notices: list[Notice], now: float) -> list[Change]: ...

    def committed(self, notices: list[Notice], records: list[Change]) -> None: ...

    def reservation_moments(self, reservations: list[Reservation], now: float
                            ) -> tuple[list[Reservation], list[Notice]]: ...


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
    #: it reports how it maps the lab's users to local accounts (an agent of an older labq does not)
    reports_accounts: bool = False
    #: the SHA-256 of the certificate the lab's CA signed for it (a TLS lab): it joins again and syncs with it
    cert_sha256: str | None = None

    def record(self) -> dict:
        return {"node": encode_node(replace(self.node, health=NodeHealth.UP)), "token_sha256": self.token_sha256,
                "logs_url": self.logs_url, "logs_token": self.logs_token, "cert_sha256": self.cert_sha256}


class LabState:
    def __init__(self, config: LeaderConfig, store: Store, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config, self.store, self.clock, self.monotonic = config, store, clock, monotonic
        self.lock = LabLock()  #: ``with lock:`` makes a change: what it reads, decides and commits
        self.lock.newest = lambda: self.store.newest()
        self.lock.settle = self._settle
        self.view = self.lock.view  #: ``with view:`` looks (never waits for a commit)
        self.changed = self.lock.condition  #: notified (``view`` held) when what agents or long polls wait on changes
        self.events = EventHub()
        self.stopping = threading.Event()
        self.woken = threading.Event()  #: something changed: the scheduler should pass soon
        #: something changed that no pass needs at once (``defer``): a pass must take it in by then (monotonic)
        self.pass_by: float | None = None
        #: how soon a pass takes in a submit that can only wait: ``QUIET_PASS_S``, or more on a long queue (the
        #: scheduler sets it after each pass by how long the pass took)
        self.quiet_submit_s = QUIET_PASS_S
        loaded = store.load()
        now = clock()
        self.records = loaded.records  #: as loaded; the services keep their own parts
        self.jobs: dict[int, Job] = {i: decode_job(doc) for i, doc in loaded.jobs.items()}
        #: the jobs that hold GPUs, kept by ``apply``: the timers look at these every second, not at the queue
        self.on_gpus: dict[int, Job] = {i: j for i, j in self.jobs.items() if j.state.holds_gpus}
        #: the jobs that wait on more than GPUs, kept by ``apply``: another job (``--after``) or a reservation.
        #: A pass's bookkeeping of dependencies and bookings looks at these, not at the whole queue
        self.waiting_on: dict[int, Job] = {i: j for i, j in self.jobs.items() if _waits_on(j)}
        #: each array's unfinished tasks (job ids) by array id, kept by ``add`` and ``apply``
        self.arrays: dict[int, set[int]] = {}
        #: each user's unfinished jobs (ids), kept by ``add`` and ``apply``: a listing of one person's jobs (``labq
        #: ls``) looks at theirs alone, not at every job of the queue
        self.by_user: dict[str, set[int]] = {}
        for job in self.jobs.values():
            if job.spec.array_id is not None:
                self.arrays.setdefault(job.spec.array_id, set()).add(job.id)
            self.by_user.setdefault(job.user, set()).add(job.id)
        self.next_job_id = loaded.next_job_id
        self.users: dict[str, dict] = dict(loaded.records.get("users", {}))
        self.agents = {name: AgentSession(name, decode_node(rec["node"]), rec["token_sha256"], rec.get("logs_url"),
                                          rec.get("logs_token"), last_seen=now, cert_sha256=rec.get("cert_sha256"))
                       for name, rec in loaded.records.get("agents", {}).items()}
        self.usage: dict[str, float] = {user: rec["gpu_hours"] for user, rec in loaded.records.get("usage", {}).items()}
        self.usage_at = now
        self.pending: dict[int, Pending] = {}
        #: finished jobs' states, for dependencies (``labq.leader.finished``: the archive's, read once when needed)
        self.finished = FinishedStates()
        #: agents advertising over mDNS, by node name (a hint; admission is by join token)
        self.seen_over_mdns: dict[str, dict] = {}
        #: what each job's GPUs did since its version was last taken in (``measure``): [GPU-s, busy, MiB x s]
        self.gpu_measure: dict[int, list[float]] = {}
        #: each running job that shares its GPU: the GPU memory its agent last saw it use, and the most (MiB)
        self.gpu_mem: dict[int, tuple[int | None, int]] = {}
        #: each starting job that its node handed to another scheduler (Slurm), which has not started it: why
        self.waiting_there: dict[int, str] = {}
        self._measured_at: dict[str, float] = {}  #: each node's last measurement
        self._measures_saved_at = now  #: when the running jobs' measurements were last saved with them
        #: called with the (old version or None, new version) of each job one change took in, the view held: the
        #: metrics count what changed, ``labq usage`` keeps the jobs that finish, the audit trail tells the steps
        self.watchers: list[Callable[[list[tuple[Job | None, Job]]], None]] = []
        #: whom a change notifies, and how (``labq.leader.notify``); None: a lab that tells nobody
        self.notify: Notifier | None = None

    def add(self, jobs: list[Job]) -> None:
        """Take in jobs just submitted and committed together (the view is held): one job, or an array's tasks,
        which are one user's and wait on the same jobs and reservation."""
        for job in jobs:
            self.jobs[job.id] = job
        self.by_user.setdefault(jobs[0].user, set()).update(job.id for job in jobs)
        if _waits_on(jobs[0]):
            self.waiting_on.update((job.id, job) for job in jobs)
        array_id = jobs[0].spec.array_id
        if array_id is not None:
            self.arrays.setdefault(array_id, set()).update(job.id for job in jobs)
        self._tell_watchers([(None, job) for job in jobs])

    def _tell_watchers(self, versions: list[tuple[Job | None, Job]]) -> None:
        for watch in self.watchers:
            try:
                watch(versions)
            except Exception:  # noqa: BLE001 - what watches the lab never stops a change that is made already
                log.exception("a watcher of jobs %s failed", ", ".join(str(new.id) for _, new in versions[:10]))

    def wake(self) -> None:
        self.woken.set()

    def defer(self, within_s: float) -> None:
        """A change that a pass must take in, but not at once: within ``within_s``, with whatever else came
        meanwhile (the view is held)."""
        due = self.monotonic() + within_s
        if self.pass_by is None or due < self.pass_by:
            self.pass_by = due

    def commit(self, changes: list[Change]) -> None:
        """Write ``changes`` to the store (the lock is held, and the view let go while the disk works), or raise the
        API's error saying it did not happen. The change takes them in at once, so that the next one is decided
        meanwhile, and answers once they are on disk (``LabLock.settle``)."""
        try:
            with self.lock.outside_view():
                staged = self.store.stage(changes)
        except CommitFailed as err:
            raise errors.unavailable(f"the change was not saved, so it did not happen: {err}") from None
        except InvalidChange as err:
            raise errors.ApiError(500, "internal", f"the leader made an invalid change: {err}") from None
        self.lock.staged(staged)

    def _settle(self, staged: list[Staged], newest: Staged | None) -> None:
        """A change ends (no lock held): wait until what it wrote (``staged``) and what it read (``newest``: the last
        commit written then) are on disk. A commit lost on the way that a change had taken in leaves the lab in
        memory ahead of the disk: the store refuses changes from then on, and a restart reads what is on disk."""
        for commit in [*staged, *([newest] if newest is not None else [])]:
            try:
                commit.wait()
            except CommitFailed as err:
                if commit is not newest:
                    log.error("a change the leader had taken in was lost on its way to disk; the leader refuses "
                              "changes until it restarts: %s", err)
                    raise errors.unavailable(
                        f"the change was lost on its way to disk: {err}\nThe leader refuses changes until it is "
                        f"restarted, and then reads what is on disk") from None
                if commit.taken_in:  # what this change read may come of it
                    raise errors.unavailable(
                        f"a change the leader had taken in was lost on its way to disk ({err.args[0]}): nothing "
                        f"it decides goes out until the leader restarts, which reads what is on disk") from None
                # else a submit's, taken in by nobody: nothing this change read came of it

    def on_disk(self) -> None:
        """Wait (no lock held) until what was read of the lab so far is on disk: before something leaves the leader
        (an agent's orders, a notice) that a change not yet on disk may have made."""
        newest = self.store.newest()
        if newest is not None:
            self._settle([], newest)

    def apply(self, jobs: Iterable[Job], records: Iterable[Change] = (), *, wake: bool = True) -> None:
        """Commit new versions of ``jobs`` and ``records``, then take them in (the lock is held); ``wake``: the
        scheduler passes again (a pass's own decisions need no pass after them)."""
        now = self.clock()
        jobs = [self._measured(job) if not job.state.holds_gpus else job for job in jobs]
        spent = self._spent(jobs, now)
        changes: list[Change] = [PutJob(encode_job(j)) for j in jobs]
        changes += [PutRecord("usage", user, {"gpu_hours": hours, "at": now}) for user, hours in spent.items()]
        notices = self.notify.notices_for([(self.jobs.get(j.id), j) for j in jobs]) if self.notify else []
        outbox = self.notify.records(notices, now) if notices else []  # in the jobs' commit: a crash loses neither
        self.commit(changes + list(records) + outbox)
        self.usage.update(spent)
        touched = set()
        versions: list[tuple[Job | None, Job]] = []
        for job in jobs:
            old = self.jobs.get(job.id)
            versions.append((old, job))
            for j in (old, job):
                if j is not None and j.placement is not None:
                    touched.update(j.placement.nodes)
            if job.state.finished:
                self.jobs.pop(job.id, None)
                self.pending.pop(job.id, None)
                mine = self.by_user.get(job.user)
                if mine is not None:
                    mine.discard(job.id)
                    if not mine:
                        del self.by_user[job.user]
                self.finished[job.id] = job.state
                if job.spec.array_id is not None and job.spec.array_id in self.arrays:
                    tasks = self.arrays[job.spec.array_id]
                    tasks.discard(job.id)
                    if not tasks:
                        del self.arrays[job.spec.array_id]
            else:
                self.jobs[job.id] = job
                self.by_user.setdefault(job.user, set()).add(job.id)
            if job.state.holds_gpus:
                self.on_gpus[job.id] = job
            else:
                self.on_gpus.pop(job.id, None)
                self.gpu_mem.pop(job.id, None)
            if job.state is not JobState.STARTING:
                self.waiting_there.pop(job.id, None)
            if _waits_on(job) and not job.state.finished:
                self.waiting_on[job.id] = job
            else:
                self.waiting_on.pop(job.id, None)
        self._tell_watchers(versions)
        for name in touched:
            if name in self.agents:
                self.agents[name].version += 1
        self.changed.notify_all()
        self.publish_jobs(jobs)
        if notices:
            self.notify.committed(notices, outbox)
        if jobs and wake:
            if all(_only_leaves_the_queue(old, new) for old, new in versions) and not self._awaited(jobs):
                self.defer(QUIET_PASS_S)  # no GPU freed, no job that may start: its reasons can wait a moment
            else:
                self.wake()

    def _awaited(self, jobs: list[Job]) -> bool:
        """Whether a job that waits on others (``--after``) waits on one of ``jobs`` (the view is held)."""
        if not self.waiting_on:
            return False
        ids = {job.id for job in jobs}
        return any(not ids.isdisjoint(j.spec.depends_on) for j in self.waiting_on.values())

    def measure(self, node: str, usage: dict[int, dict], now: float) -> None:
        """An agent's measurement of its GPUs (utilisation, free memory) at ``now``: what they did since its
        last one is the doing of the jobs on them (the lock is held). A gap over ``MEASURE_GAP_S`` (an agent
        that was away) counts as that long at most."""
        last = self._measured_at.get(node)
        self._measured_at[node] = now
        if last is None or now <= last:
            return
        seconds = min(now - last, MEASURE_GAP_S)
        session = self.agents.get(node)
        memory = {g.index: g.memory_mib for g in session.node.gpus} if session else {}
        for job in self.on_gpus.values():
            for allocation in job.placement.allocations if job.placement is not None else ():
                if allocation.node != node:
                    continue
                for index in allocation.gpu_indices:
                    sample = usage.get(index) or {}
                    busy, free = sample.get("utilization_pct"), sample.get("memory_free_mib")
                    if busy is None or free is None or index not in memory:
                        continue
                    acc = self.gpu_measure.setdefault(job.id, [0.0, 0.0, 0.0])
                    acc[0] += seconds
                    acc[1] += busy / 100.0 * seconds
                    acc[2] += max(0, memory[index] - free) * seconds

    def save_measures(self, now: float) -> None:
        """Every ``MEASURE_SAVE_S``, commit the running jobs with what their GPUs did so far (the lock is held), so
        that a leader's restart does not lose it; on a failed commit it stays in memory, for the next try."""
        if now - self._measures_saved_at < MEASURE_SAVE_S:
            return
        self._measures_saved_at = now
        measured = [self.with_measure(job) for job in self.on_gpus.values() if job.id in self.gpu_measure]
        if measured:
            try:
                self.apply(measured, wake=False)
            except errors.ApiError as err:
                log.warning("the running jobs' GPU measurements were not saved (they are kept for the next try): %s",
                            err.message)
                return
            for job in measured:  # in the jobs now; no measurement came meanwhile (they come with changes)
                self.gpu_measure.pop(job.id, None)

    def _measured(self, job: Job) -> Job:
        """``job`` leaving its GPUs, with what they did since it was last taken in."""
        acc = self.gpu_measure.pop(job.id, None)
        return self.with_measure(job, acc) if acc else job

    def with_measure(self, job: Job, acc: list[float] | None = None) -> Job:
        """``job`` with what its GPUs did so far added (``acc``, else its running total, kept)."""
        acc = acc if acc is not None else self.gpu_measure.get(job.id)
        if not acc:
            return job
        return replace(job, measured_gpu_s=job.measured_gpu_s + acc[0], busy_gpu_s=job.busy_gpu_s + acc[1],
                       memory_mib_gpu_s=job.memory_mib_gpu_s + acc[2])

    def decay_usage(self, now: float) -> None:
        """Fair share's GPU-hours, decayed to ``now`` (the lock is held)."""
        self.usage = decay_usage(self.usage, now - self.usage_at, self.config.fair_share_half_life_s)
        self.usage_at = now

    def _spent(self, jobs: list[Job], now: float) -> dict[str, float]:
        """Each user's decayed GPU-hours after the finished or requeued attempts among ``jobs``: what they had,
        decayed to ``now``, and then the new attempts' hours (added undecayed: they were spent just now)."""
        spent: dict[str, float] = {}
        if any(job.state.finished or job.history for job in jobs):
            self.decay_usage(now)
        for job in jobs:
            old = self.jobs.get(job.id)
            if job.state.finished:
                hours = t.gpu_hours(job, now)
            elif old is not None and job.attempt > old.attempt and job.history:  # a requeued attempt's use
                hours = t.attempt_gpu_hours(job.history[-1], job.spec.gpus)
            else:
                continue
            spent[job.user] = spent.get(job.user, self.usage.get(job.user, 0.0)) + hours
        return spent

    def publish_jobs(self, jobs: Iterable[Job]) -> None:
        """Each job's new version as a ``job`` event, for the streams (``labq ls --watch``, the TUI); of more than
        the hub keeps (a big array's tasks), the last it keeps, the others counted."""
        jobs = list(jobs)
        keep = self.events.keep
        self.events.publish_all("job", map(_job_event, jobs[-keep:]), skipped=max(0, len(jobs) - keep))

    def nodes(self) -> list[Node]:
        return [s.node for s in self.agents.values()]

    def policy(self) -> Policy:
        """The scheduler's knobs, as the config has them now."""
        return self.config.policy()


def _only_leaves_the_queue(old: Job | None, new: Job) -> bool:
    """A waiting job that ended or was held (cancelled, held back): it held no GPU, so no job loses or gains one
    at once. GPUs the last pass kept for it (a preemptor's, the top job's) go to the next job at the pass within
    ``QUIET_PASS_S``, a second at most, as a waiting submit's reason does."""
    return (old is not None and old.state in (JobState.QUEUED, JobState.HELD)
            and (new.state.finished or new.state is JobState.HELD))


def _waits_on(job: Job) -> bool:
    return bool(job.spec.depends_on) or job.spec.reservation is not None


def _job_event(job: Job) -> dict:
    event = {"job_id": job.id, "state": job.state.value, "user": job.user, "attempt": job.attempt}
    if job.preempted_for is not None:
        event["preempted_for"] = job.preempted_for
    if job.drained_for is not None:
        event["drained_for"] = job.drained_for
    if job.note:
        event["note"] = job.note
    return event
