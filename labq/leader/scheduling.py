"""The scheduler thread: the timers once a second, and a pass only when something changed, an edge of time
is due (``labq.scheduler.edges``) or a minute has gone by. A change that no pass needs at once (a submit that
can neither start nor preempt: ``LabState.defer``) is taken in by a pass within a second, with the others.

A pass hands the pure scheduler (``labq.scheduler.schedule``) the lab as it is
and applies its decisions; the timers mark silent nodes lost after their lease,
requeue a lost node's jobs after ``requeue_after``, move reservations along, and
signal jobs a grace before their time limit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import replace

from labq.leader import finished as finished_jobs
from labq.leader.bookings import Bookings
from labq.leader.finished import FinishedStates, missing
from labq.leader.state import QUIET_PASS_S, QUIET_SUBMIT_MAX_S, QUIET_SUBMIT_SHARE, LabState
from labq.models import transitions as t
from labq.models.actions import timeout_grace
from labq.models.job import Job, JobState
from labq.models.node import Node, NodeHealth
from labq.leader.auth import Principal
from labq.leader.users import user_only
from labq.scheduler import schedule
from labq.scheduler.edges import next_edge
from labq.scheduler.queues import lab_gpus, standing

log = logging.getLogger("labq.leader")


class Scheduling:
    def __init__(self, state: LabState, bookings: Bookings) -> None:
        self.state, self.bookings = state, bookings
        self.passes = 0
        self.failures = 0  #: turns that failed in a row
        self.last_pass: float | None = None  #: when the last pass ran; None: it must run
        self.next_edge: float | None = None  #: when time alone may change its decisions next
        self.pass_seconds = 0.0  #: how long the last pass took (wall, not the lab's clock)
        #: told each pass's duration in seconds (the metrics' histogram)
        self.timed: Callable[[float], None] = lambda seconds: None

    #: with nothing changed and no edge due, a pass anyway this often (fair share decays, texts age)
    HEARTBEAT_S = 60.0
    #: the longest a turn waits after a pass, for the changes to gather (see ``step``)
    COALESCE_MAX_S = 1.0

    def loop(self) -> None:
        """The scheduler thread's body: a turn whenever something changes, at least once a second; after a
        failure, a longer pause each time (``step``). It never ends but with the leader."""
        state = self.state
        pause = 0.0
        while not state.stopping.is_set():
            if pause:
                state.stopping.wait(pause)
                woken = False
            else:
                due = state.pass_by  # a deferred change's pass, if it is due before the next second
                woken = state.woken.wait(timeout=1.0 if due is None else min(1.0, max(0.0, due - state.monotonic())))
            if state.stopping.is_set():
                return
            pause = self.step(woken)

    def step(self, woken: bool) -> float:
        """One ``turn`` that never raises: how long to pause before the next. After a pass, as long as the pass
        took (at most ``COALESCE_MAX_S``); after a failure, longer each time (2 s,
        doubling to 30 s while it keeps failing), the error logged. A change meanwhile is not lost: the turn
        after a failure always passes."""
        try:
            passed = self.turn(woken)
        except Exception:  # noqa: BLE001 - a bad turn (the store, a bug) must not stop the lab, nor spin on it
            self.failures += 1
            self.last_pass = None
            self.state.woken.clear()  # else a wake set before the failure would make the next wait return at once
            log.exception("scheduling pass failed (%d in a row)", self.failures)
            return min(30.0, 2.0 ** self.failures)
        self.failures = 0
        # passes coalesce under load: after a pass, changes gather for as long as it took (a long queue's
        # passes take a whole core otherwise, from the API that brings the changes)
        return min(self.COALESCE_MAX_S, self.pass_seconds) if passed else 0.0

    def turn(self, woken: bool) -> bool:
        """The timers, then a pass if something changed (``woken``, or the timers changed something), an edge
        of time is due (``labq.scheduler.edges``) or the heartbeat; True if it passed. Changes that come in
        while a pass runs wake the next turn, so passes coalesce under load."""
        state = self.state
        self.tick()
        now = state.clock()
        if not (woken or state.woken.is_set() or self.last_pass is None
                or (self.next_edge is not None and now >= self.next_edge) or now - self.last_pass >= self.HEARTBEAT_S
                or (state.pass_by is not None and state.monotonic() >= state.pass_by)):
            return False
        state.woken.clear()
        self.schedule_pass()
        return True

    def schedule_pass(self) -> None:
        """One pass. Its inputs are taken under the lock, the pass itself runs outside it (the API goes on
        meanwhile), and its decisions are taken in under the lock where the lab did not change under them: a
        decision about a job or a node that changed meanwhile is dropped, and the next pass decides again."""
        state = self.state
        try:  # what waiting jobs wait for, read from the archive outside the locks if need be
            finished_jobs.ensure(state)
            readable = True
        except OSError as err:
            log.warning("the archive of finished jobs could not be read (%s): jobs that wait for jobs that ended "
                        "before the leader started go on waiting; trying again at the next pass", err)
            readable = False
        with state.lock:
            now = state.clock()
            state.pass_by = None  # this pass takes in every change so far
            released = self.bookings.release(now)  # so no job waits for a booking that is over
            if released:
                state.apply(released, wake=False)
            finished = finished_states(state, read=readable)
            # nor for a job that cannot succeed (once what it waits for is known: a job not known may be archived)
            never = (t.out_of_dependencies(state.waiting_on.values(), finished, now, live=state.jobs)
                     if not missing(state) else [])
            if never:
                state.apply(never, wake=False)
            state.decay_usage(now)
            jobs, nodes, policy = list(state.jobs.values()), state.nodes(), state.policy()
            reservations, used = self.bookings.current(now), dict(state.usage)
            finished = {d: finished[d] for j in state.waiting_on.values() for d in j.spec.depends_on if d in finished}
        began = state.monotonic()
        decisions = schedule(jobs, nodes, now=now, usage=self._usage(now, jobs, used), policy=policy,
                             finished=finished, reservations=reservations)
        edge = next_edge(jobs, reservations, policy, now)
        pending = {p.job_id: p for p in decisions.pending}
        before = state.pending  # only this thread replaces it
        changed_pending = {i for i, p in pending.items() if before.get(i, (None,))[1:3] != p[1:3]}
        seen, nodes_seen = {j.id: j for j in jobs}, {n.name: n for n in nodes}
        self.pass_seconds = state.monotonic() - began
        self.timed(self.pass_seconds)
        with state.lock:
            self.passes += 1
            self.last_pass, self.next_edge = now, edge
            state.quiet_submit_s = min(QUIET_SUBMIT_MAX_S, max(QUIET_PASS_S, self.pass_seconds / QUIET_SUBMIT_SHARE))
            unchanged = _Unchanged(seen, nodes_seen, state)
            starts = [s for s in decisions.starts if unchanged.job(s.job_id) and unchanged.nodes(s.placement.nodes)]
            preemptions = [p for p in decisions.preemptions if unchanged.job(p.job_id)
                           and (p.for_job is None or unchanged.job(p.for_job)) and unchanged.nodes((p.node,))]
            if len(starts) < len(decisions.starts) or len(preemptions) < len(decisions.preemptions):
                state.wake()  # the lab changed under this pass: the next one decides what it dropped
            updates = [t.placed(state.jobs[s.job_id], s.placement) for s in starts]
            updates += [t.preempting(state.jobs[p.job_id], p.for_job, p.reservation) for p in preemptions]
            for job_id in pending.keys() - state.jobs.keys():  # ended meanwhile
                del pending[job_id]
            state.pending = pending
            if updates:
                state.apply(updates, wake=False)  # what it decided needs no pass after it
        for job_id in changed_pending:
            state.events.publish("job", {"job_id": job_id, "pending": True})

    def _usage(self, now: float, jobs: Iterable[Job] | None = None, finished: dict[str, float] | None = None
               ) -> dict[str, float]:
        """Finished work, decayed; plus what running attempts have used so far (of ``jobs`` and ``finished``,
        taken under the lock, when given: then it needs no lock)."""
        usage = dict(self.state.usage if finished is None else finished)
        for job in self.state.jobs.values() if jobs is None else jobs:
            if job.started_at is not None:
                usage[job.user] = usage.get(job.user, 0.0) + t.gpu_hours(job, now)
        return usage

    def queues(self, who: Principal) -> list[dict]:
        """Each queue's guarantee, use, borrowed and lent GPUs, waiting work, and its members' fair-share
        standing (decayed GPU-hours, least first: whom the queue serves next), for ``labq queues``."""
        user_only(who)
        state, config = self.state, self.state.config
        with state.lock:
            now = state.clock()
            state.decay_usage(now)
            usage = self._usage(now)
            jobs = list(state.jobs.values())
            up = [n for n in state.nodes() if n.schedulable and n.gpus]
        lab = lab_gpus(up)
        specs = {q.name: q for q in config.queues}
        rows = []
        for s in standing(config.queues, jobs, lab, frozenset(n.name for n in up)):
            q = specs.get(s.name)
            members = set()
            for m in q.members if q is not None else ():
                members.update(config.groups.get(m[1:], ()) if m.startswith("@") else () if m == "*" else (m,))
            holds: dict[str, int] = {}
            waits: dict[str, int] = {}
            for job in jobs:
                if (job.spec.queue if job.spec.queue in specs else "") != s.name:
                    continue
                members.add(job.user)
                if job.state.holds_gpus:
                    holds[job.user] = holds.get(job.user, 0) + job.spec.gpus
                elif not job.state.finished:
                    waits[job.user] = waits.get(job.user, 0) + 1
            rows.append({
                "name": s.name or None, "guarantee": s.guarantee, "use": s.use, "borrowed": s.borrowed, "lent": s.lent,
                "waiting_jobs": s.waiting_jobs, "waiting_gpus": s.waiting_gpus,
                **({"guarantee_asked": q.guarantee_text, "members": list(q.members), "cap": q.cap, "lends": q.lends,
                    "borrows": q.borrows, "max_wait_s": q.max_wait_s, "default": q.name == config.default_queue}
                   if q is not None else {"members": [], "cap": None, "lends": False, "borrows": True,
                                          "max_wait_s": None, "default": False}),
                "fair_share": [{"user": u, "gpu_hours": round(usage.get(u, 0.0), 3), "holds": holds.get(u, 0),
                                "waiting": waits.get(u, 0)}
                               for u in sorted(members, key=lambda u: (usage.get(u, 0.0), u))],
            })
        return rows

    def tick(self) -> None:
        """Timers: agents that went silent, reservations, and jobs past their time limit."""
        state = self.state
        with state.lock:
            now = state.clock()
            updates = self._silent_nodes(now)
            updates += self.bookings.tick(now)
            updates += [job.evolve(stop_requested="timeout") for job in state.on_gpus.values()
                        if _time_is_up(job, now) and all(u.id != job.id for u in updates)]
            if updates:
                state.apply(updates)
            state.save_measures(now)

    def _silent_nodes(self, now: float) -> list[Job]:
        """Mark nodes lost after their lease; the jobs of nodes silent past requeue_after, requeued."""
        state, config, updates = self.state, self.state.config, []
        for session in state.agents.values():
            silent = now - session.last_seen
            if silent > config.lease_s and session.node.health is NodeHealth.UP:
                session.node = replace(session.node, health=NodeHealth.LOST)
                state.events.publish("node", {"node": session.name, "health": "lost"})
                state.wake()
            if config.auto_requeue and silent > config.requeue_after_s:
                for job in state.on_gpus.values():
                    if job.placement and session.name in job.placement.nodes:
                        updates.append(t.lost(job, now) if job.stop_requested != "cancel" else t.cancelled(job, now))
        return updates



class _Unchanged:
    """Which of a pass's inputs are as they are now (the lock is held): jobs and nodes are replaced, never
    changed in place, so the same object is the same version."""

    def __init__(self, jobs: dict[int, Job], nodes: dict[str, Node], state: LabState) -> None:
        self._jobs, self._nodes, self._state = jobs, nodes, state
        self._now = {n.name: n for n in state.nodes()}

    def job(self, job_id: int) -> bool:
        return self._state.jobs.get(job_id) is self._jobs.get(job_id)

    def nodes(self, names) -> bool:
        return all(self._now.get(name) is self._nodes.get(name) for name in names)


def finished_states(state: LabState, wanted: Iterable[int] = (), *, read: bool = True) -> FinishedStates:
    """The end states of finished jobs, enough for the dependencies of every unfinished job and for ``wanted``
    (the view is held). Callers read the archive outside the lab's locks first, when it is needed
    (``labq.leader.finished.ensure``); for one that did not, it is read here, holding them, unless not ``read``
    (that read failed: what is known). Once it was read, a job that is neither unfinished nor here does not
    exist."""
    known = state.finished
    if read and missing(state, wanted):
        log.warning("the archive is read for a finished job's state while the lab's view is held")
        known.take(known.read(state.store.ends()))
    return known


def _time_is_up(job: Job, now: float) -> bool:
    """The checkpoint signal a grace before the time limit, then stopped at it."""
    end = job.expected_end()
    return (job.state in (JobState.RUNNING, JobState.PREEMPTING) and end is not None
            and now >= end - timeout_grace(job) and not job.stop_requested)
