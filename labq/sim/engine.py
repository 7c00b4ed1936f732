"""The simulation: a virtual clock that jumps from event to event, and a policy that starts jobs.

Events are arrivals, ends, the exits of preempted jobs and the edges of reservations. After the
events of one instant, the policy runs:

- ``labq``: the leader's own scheduling pass (``labq.scheduler.schedule``) on the lab's state,
  and its decisions applied with the leader's transitions. A preempted job gets its signal,
  stops ``stop_s`` later (within its grace), and goes back to the queue; it keeps the work up to
  its last periodic checkpoint (every ``checkpoint_every_s``) and redoes the rest.
- ``fifo`` / ``sjf``: the plain reference policies (see ``labq.sim.reference``).

A pass that cannot change anything is skipped: nothing happened since the last one, or no job
waits, or no waiting job fits the free GPUs and none may preempt. Such a pass would decide
nothing new; skipping it is what makes months of a busy cluster take seconds.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from math import ceil, inf

from labq.models import transitions as t
from labq.models.job import Job, JobSpec, JobState
from labq.models.node import Node
from labq.models.queues import QueueSpec
from labq.models.reservation import Reservation
from labq.scheduler import Policy, decay_usage, schedule, why_never_fits
from labq.scheduler.booking import book
from labq.sim.model import JobOutcome, Sample, SimResult, TraceJob, TraceReservation, Workload
from labq.sim.reference import ReferenceQueue

POLICIES = ("labq", "fifo", "sjf")
HALF_LIFE_S = 7 * 86400.0  #: fair share's half-life, the leader's default


@dataclass(frozen=True)
class SimOptions:
    checkpoint_every_s: float = 1800.0  #: a job saves this often; 0: it saves on the signal and loses nothing
    grace_s: float = 60.0  #: the checkpoint grace every job gets
    stop_s: float = 10.0  #: how long a job takes to stop after its signal (at most its grace)
    min_runtime_s: float = 300.0  #: the admin's minimum runtime before a preemption
    retry_s: float = 60.0  #: while a job could preempt but may not yet, look again this often
    aging_s: float | None = None  #: the admin's aging (``labq.scheduler.policy.served_priority``); None: none
    #: the lab's queues (teams; ``labq.models.queues``): a job's is its trace job's ``queue``
    queues: tuple[QueueSpec, ...] = ()
    reclaim_grace_s: float | None = None  #: only jobs with at most this grace borrow; None: any
    #: the rest of a lab's scheduling settings (quotas, hold depth, preemption rules: ``LeaderConfig.policy``);
    #: the fields above win over its own
    settings: Policy | None = None

    @classmethod
    def of(cls, policy: Policy, **more) -> SimOptions:
        """Options that run labq's policy with a lab's scheduling settings (its ``LeaderConfig.policy()``)."""
        return cls(min_runtime_s=policy.min_runtime_s, aging_s=policy.aging_s, queues=policy.queues,
                   reclaim_grace_s=policy.reclaim_grace_s, settings=policy, **more)


class _Clock:
    """The event heap: (time, order, kind, data); equal times keep the order they were added in."""

    def __init__(self) -> None:
        self.heap: list = []
        self.seq = 0

    def at(self, when: float, kind: str, *data) -> None:
        heapq.heappush(self.heap, (when, self.seq, kind, data))
        self.seq += 1

    def next_time(self) -> float:
        return self.heap[0][0] if self.heap else inf

    def pop_until(self, now: float) -> Iterable[tuple[str, tuple]]:
        while self.heap and self.heap[0][0] <= now:
            _, _, kind, data = heapq.heappop(self.heap)
            yield kind, data


def simulate(workload: Workload, nodes: list[Node], policy: str, *, cluster: str = "",
             options: SimOptions = SimOptions(), progress: Callable[[float, int, int], None] | None = None,
             meta: dict | None = None) -> SimResult:
    """Replays ``workload`` on ``nodes`` under ``policy``; jobs that can never fit are skipped and listed."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: choose one of {', '.join(POLICIES)}")
    if not nodes:
        raise ValueError("the cluster has no nodes")
    sim = _Simulation(workload, nodes, policy, options, progress)
    began = time.perf_counter()
    sim.run()
    meta = dict(meta or {})
    waiting = sim.why_waiting()
    if waiting:
        meta["never_started"] = waiting
    if sim.refused:
        meta["refused_reservations"] = [f"{r.name}: {'; '.join(why)}" for r, why in sim.refused]
    return SimResult(policy, cluster, sum(n.gpu_count for n in nodes), tuple(sim.outcomes()), tuple(sim.skipped),
                     tuple(sim.samples), sim.busy_gpu_s, time.perf_counter() - began, sim.passes, workload.epoch, meta,
                     tuple(sim.runs))


def job_spec(job: TraceJob, node_size: int, grace_s: float) -> JobSpec:
    """The spec labq's scheduler sees: a job wider than a node is spread evenly over as few nodes as take it."""
    spread = 1
    if job.gpus > node_size:
        spread = next(n for n in range(ceil(job.gpus / node_size), job.gpus + 1)
                      if job.gpus % n == 0 and job.gpus // n <= node_size)
    return JobSpec(user=job.user, command=("sim",), gpus=job.gpus, nodes=spread, priority=job.priority,
                   preemptible=job.preemptible, time_limit_s=job.time_limit_s, grace_s=grace_s,
                   reservation=job.reservation, queue=job.queue, cpus=job.cpus, memory_mib=job.memory_mib)


class _Simulation:
    def __init__(self, workload: Workload, nodes: list[Node], policy: str, options: SimOptions,
                 progress: Callable[[float, int, int], None] | None) -> None:
        self.workload, self.nodes, self.policy, self.options = workload, nodes, policy, options
        self.progress = progress
        self.total_gpus = sum(n.gpu_count for n in nodes)
        self.node_size = max(n.gpu_count for n in nodes)
        self.clock = _Clock()
        self.trace: dict[int, TraceJob] = {}
        self.jobs: dict[int, Job] = {}  #: labq: the unfinished jobs the leader would hold
        self.left: dict[int, float] = {}  #: work left as of the current attempt's start
        self.first_start: dict[int, float] = {}
        self.ended: dict[int, float] = {}
        self.preempted: dict[int, int] = {}
        self.lost: dict[int, float] = {}  #: GPU-seconds redone
        self.started: dict[int, float] = {}  #: when the current attempt started
        self.refused: list[tuple[TraceReservation, tuple[str, ...]]] = []  #: bookings the lab could not take
        self.skipped: list[tuple[TraceJob, str]] = []
        self.samples: list[Sample] = []
        self.busy_gpu_s = 0.0
        self.runs: list[tuple[int, float, float, int]] = []  #: (job id, start, end, GPUs) of each attempt that ended
        self.passes = 0
        self.queued = self.running = self.busy = 0
        self.dirty = False
        self.retry_at = inf
        self.clock_now = 0.0
        self.usage: dict[str, float] = {}
        self.usage_at = 0.0
        #: per user, the GPUs of running attempts and the sum of GPUs x start: what they used by ``now``
        #: is (gpus x now - that sum) / 3600, without a walk over the running jobs at every pass
        self.running_by_user: dict[str, tuple[int, float]] = {}
        self.reservations: list[Reservation] = []
        self.reference = ReferenceQueue(nodes, shortest_first=policy == "sjf") if policy != "labq" else None
        self._never: dict[tuple, str | None] = {}

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> None:
        for job in self.workload.jobs:
            self.clock.at(job.submit, "arrive", job)
        for r in self.workload.reservations:
            self.clock.at(r.booked, "book", r)
        done_events, report_at = 0, 5000
        while self.clock.heap or self.retry_at < inf:
            now = min(self.clock.next_time(), self.retry_at)
            if now == self.retry_at:
                self.retry_at, self.dirty = inf, True
            self.clock_now = now
            for kind, data in self.clock.pop_until(now):
                getattr(self, f"_on_{kind}")(now, *data)
                done_events += 1
            self._step(now)
            if self.samples and self.samples[-1].t == now:
                self.samples[-1] = Sample(now, self.queued, self.running, self.busy)
            else:
                self.samples.append(Sample(now, self.queued, self.running, self.busy))
            if self.progress is not None and done_events >= report_at:
                report_at = done_events + 5000
                self.progress(now, len(self.ended), len(self.trace))
            if not self.clock.heap and self.queued and self.retry_at == inf and self.busy == 0:
                break  # nothing runs and nothing will arrive: what waits now waits for ever

    def _policy(self) -> Policy:
        o = self.options
        return replace(o.settings or Policy(), min_runtime_s=o.min_runtime_s, aging_s=o.aging_s, queues=o.queues,
                       reclaim_grace_s=o.reclaim_grace_s)

    def why_waiting(self) -> dict[str, int]:
        """For jobs still waiting when nothing more can happen: the scheduler's reasons, counted."""
        if self.reference is not None:
            return {"blocked behind a job that cannot start": self.queued} if self.queued else {}
        if not self.queued:
            return {}
        end = max([self.clock_now, *(r.end for r in self.reservations)])
        decisions = schedule(list(self.jobs.values()), self.nodes, now=end, reservations=self.reservations,
                             usage={}, policy=self._policy())
        reasons: dict[str, int] = {}
        for p in decisions.pending:
            key = p.reason.value if p.reason.value != "Resources" else f"Resources ({p.detail.split(';')[0]})"
            reasons[key] = reasons.get(key, 0) + 1
        return reasons

    def outcomes(self) -> list[JobOutcome]:
        return [JobOutcome(job, self.first_start.get(i), self.ended.get(i), self.preempted.get(i, 0),
                           self.lost.get(i, 0.0)) for i, job in self.trace.items()]

    # -- events --------------------------------------------------------------------------------

    def _on_arrive(self, now: float, job: TraceJob) -> None:
        never = self._never_fits(job) or self._not_bookable(job, now)
        if never is not None:
            self.skipped.append((job, never))
            return
        self.trace[job.id] = job
        self.left[job.id] = job.duration
        self.queued += 1
        self.dirty = True
        if self.reference is not None:
            self.reference.add(job)
        else:
            self.jobs[job.id] = Job(job.id, job_spec(job, self.node_size, self.options.grace_s), submitted_at=now)

    def _on_end(self, now: float, job_id: int, attempt: int) -> None:
        if self.reference is not None:
            self.reference.release(job_id)
            gpus = self.trace[job_id].gpus
        else:
            job = self.jobs.get(job_id)
            if job is None or job.attempt != attempt or job.state is not JobState.RUNNING:
                return  # preempted meanwhile: its exit ends the attempt
            del self.jobs[job_id]
            gpus = job.spec.gpus
            self._count_usage(job, now)
        self.busy_gpu_s += gpus * (now - self.started[job_id])
        self.runs.append((job_id, self.started[job_id], now, gpus))
        self.ended[job_id] = now
        self.running -= 1
        self.busy -= gpus
        self.dirty = True

    def _on_exit(self, now: float, job_id: int, attempt: int) -> None:
        job = self.jobs[job_id]
        self.busy_gpu_s += job.spec.gpus * (now - self.started[job_id])
        self.runs.append((job_id, self.started[job_id], now, job.spec.gpus))
        self._count_usage(job, now)
        self.jobs[job_id] = t.exited(job, 0, now)  # requeued as the next attempt
        self.running -= 1
        self.busy -= job.spec.gpus
        self.queued += 1
        self.dirty = True

    def _on_book(self, now: float, wanted: TraceReservation) -> None:
        """Booked with the leader's own booking code; a refused booking is noted and left out."""
        request = Reservation(wanted.name, wanted.user, wanted.gpus, wanted.start, wanted.end,
                              users=frozenset(wanted.users), created_at=now)
        answer = book(request, self.nodes, self.reservations, list(self.jobs.values()), now=now, exempt=True)
        if not answer.accepted:
            self.refused.append((wanted, answer.reasons))
            return
        self.reservations.append(answer.reservation)
        for edge in (wanted.start - self.options.grace_s, wanted.start, wanted.end):
            if edge >= now:
                self.clock.at(edge, "edge")

    def _on_edge(self, now: float) -> None:
        """A reservation drains, starts or ends; at its end, the jobs still waiting in it leave it."""
        self.dirty = True
        for job in t.out_of_reservations(self.jobs.values(), {r.name: r for r in self.reservations}, now):
            if job.state is JobState.CANCELLED:  # submitted with --after-reservation cancel
                del self.jobs[job.id]
                self.queued -= 1
                self.skipped.append((self.trace.pop(job.id), job.note))
            else:
                self.jobs[job.id] = job

    # -- deciding ------------------------------------------------------------------------------

    def _step(self, now: float) -> None:
        if not self.dirty:
            return
        self.dirty = False
        if self.reference is not None:
            for job_id in self.reference.starts():
                self._start(now, job_id)
            return
        if not self._reservation_near(now) and not (self.queued and self._worth_a_pass()):
            return
        self.passes += 1
        usage = self._usage_now(now)
        reservations = [r for r in self.reservations if r.end > now]
        decisions = schedule(list(self.jobs.values()), self.nodes, now=now, reservations=reservations, usage=usage,
                             policy=self._policy())
        for p in decisions.preemptions:
            self._preempt(now, p.job_id, p.for_job, p.reservation)
        for s in decisions.starts:
            job = self.jobs[s.job_id] = t.running(t.placed(self.jobs[s.job_id], s.placement), now)
            gpus, starts = self.running_by_user.get(job.user, (0, 0.0))
            self.running_by_user[job.user] = (gpus + job.spec.gpus, starts + job.spec.gpus * now)
            self._start(now, s.job_id)
        if self.queued and not decisions.starts and not decisions.preemptions:
            self._retry_when_preemptible(now)

    def _reservation_near(self, now: float) -> bool:
        """A reservation drains, lends and reclaims GPUs on its own clock: from one grace before its start."""
        return any(r.start - self.options.grace_s - 1 <= now < r.end for r in self.reservations)

    def _worth_a_pass(self) -> bool:
        """Whether a pass could decide anything: a waiting job fits the free GPUs, or may preempt."""
        free = self.total_gpus - self.busy
        waiting = [j for j in self.jobs.values() if j.state is JobState.QUEUED]
        if any(j.spec.gpus <= free for j in waiting):
            return True
        if self.options.queues:  # a queue below its guarantee reclaims borrowed work of any priority
            return any(j.state is JobState.RUNNING and j.spec.preemptible for j in self.jobs.values())
        top = max(j.priority for j in waiting)
        return any(j.state is JobState.RUNNING and j.spec.preemptible and j.priority < top
                   for j in self.jobs.values())

    def _retry_when_preemptible(self, now: float) -> None:
        """Jobs wait that could preempt once a victim has run its minimum: look again then."""
        waiting = [j.priority for j in self.jobs.values() if j.state is JobState.QUEUED]
        top = max(waiting)
        soon = [j.started_at + self.options.min_runtime_s for j in self.jobs.values()
                if j.state is JobState.RUNNING and j.spec.preemptible and j.priority < top
                and j.started_at + self.options.min_runtime_s > now]
        if self.options.queues:  # a reclaimed job borrows again, an overdue job preempts: at their times
            soon += self._queue_times(now)
        if soon:
            self.retry_at = min(self.retry_at, max(min(soon), now + 1.0))

    def _queue_times(self, now: float) -> list[float]:
        from labq.scheduler.policy import waiting_since

        o, times = self.options, []
        waits = {q.name: q.max_wait_s for q in o.queues if q.max_wait_s is not None}
        for j in self.jobs.values():
            if j.state is not JobState.QUEUED:
                continue
            if j.history and j.history[-1].ended_at + o.min_runtime_s > now:
                times.append(j.history[-1].ended_at + o.min_runtime_s)
            wait = waits.get(j.spec.queue)
            if wait is not None and waiting_since(j) + wait > now:
                times.append(waiting_since(j) + wait)
        return times

    def _start(self, now: float, job_id: int) -> None:
        job = self.trace[job_id]
        self.first_start.setdefault(job_id, now)
        self.started[job_id] = now
        self.queued -= 1
        self.running += 1
        self.busy += job.gpus
        work = self.left[job_id]
        limit = job.time_limit_s
        attempt = self.jobs[job_id].attempt if self.reference is None else 1
        self.clock.at(now + (min(work, limit) if limit else work), "end", job_id, attempt)

    def _preempt(self, now: float, job_id: int, for_job: int | None, reservation: str | None) -> None:
        """The checkpoint contract: the signal now, the exit ``stop_s`` later (within the grace); the
        work since the last periodic checkpoint is lost."""
        job = self.jobs[job_id]
        self.jobs[job_id] = t.preempting(job, for_job, reservation)
        done = min(now - job.started_at, self.left[job_id])
        every = self.options.checkpoint_every_s
        saved = done if every <= 0 else (done // every) * every
        self.left[job_id] -= saved
        self.lost[job_id] = self.lost.get(job_id, 0.0) + (done - saved) * job.spec.gpus
        self.preempted[job_id] = self.preempted.get(job_id, 0) + 1
        self.clock.at(now + min(self.options.stop_s, job.spec.grace_s), "exit", job_id, job.attempt)

    # -- bookkeeping ---------------------------------------------------------------------------

    def _never_fits(self, job: TraceJob) -> str | None:
        if self.reference is not None:
            return self.reference.never_fits(job)
        key = (job.gpus,)
        if key not in self._never:
            why = why_never_fits(job_spec(job, self.node_size, self.options.grace_s), self.nodes)
            self._never[key] = None if why is None else f"asks for {job.gpus} GPUs: {why}"
        return self._never[key]

    def _not_bookable(self, job: TraceJob, now: float) -> str | None:
        """Why the leader would refuse a job into its reservation at submit: not booked, or over."""
        if job.reservation is None or self.reference is not None:  # plain FIFO and SJF know no bookings
            return None
        r = next((r for r in self.reservations if r.name == job.reservation), None)
        if r is None:
            refused = next((why for wanted, why in self.refused if wanted.name == job.reservation), None)
            return (f"its reservation {job.reservation!r} was refused: {'; '.join(refused)}" if refused
                    else f"there is no reservation {job.reservation!r}")
        return None if r.live(now) else f"its reservation {job.reservation!r} ended before it was submitted"

    def _count_usage(self, job: Job, now: float) -> None:
        """An attempt ended: its GPU-hours join the user's decayed usage."""
        self.usage = decay_usage(self.usage, now - self.usage_at, HALF_LIFE_S)
        self.usage_at = now
        self.usage[job.user] = self.usage.get(job.user, 0.0) + t.gpu_hours(job, now)
        gpus, starts = self.running_by_user[job.user]
        self.running_by_user[job.user] = (gpus - job.spec.gpus, starts - job.spec.gpus * job.started_at)

    def _usage_now(self, now: float) -> dict[str, float]:
        """As the leader computes it: finished work decayed, plus what running attempts used so far."""
        usage = decay_usage(self.usage, now - self.usage_at, HALF_LIFE_S)
        for user, (gpus, starts) in self.running_by_user.items():
            if gpus:
                usage[user] = usage.get(user, 0.0) + max(0.0, gpus * now - starts) / 3600.0
        return usage
