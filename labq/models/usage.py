"""Who used the lab's GPUs over a window of time (``labq usage``, like Slurm's sreport): GPU-hours, outcomes,
queue waits and work lost, per user, priority class, node and GPU model. Pure: the jobs, the nodes' GPUs and
``now`` come in as arguments.

What counts, and when:

- **GPU-hours** are allocated, not measured: each attempt holds its placement's GPUs from its start to its end
  (a running attempt: to ``now``), and only the part inside the window counts (``held_gpu_hours``), so an
  attempt that straddles two windows is split between them, never counted twice. A job's earlier attempts are
  its ``history``; its current one is the job's own ``started_at`` and ``placement`` while it is not in the
  history yet (a running job, or one cancelled on a node that went silent).
- **Jobs run**: jobs that held GPUs inside the window. **Failed** (failed or stopped at its time limit) and
  **cancelled**: jobs that ended so inside it. **Preempted**: jobs with an attempt stopped for a preemption
  inside it. Each is counted once per row, however many attempts it had.
- **Queue wait**: from submit to the job's first start, for jobs whose first start is inside the window; the
  mean, and the 90th percentile by nearest rank (the smallest wait that at least 90% of the jobs waited no
  longer than).
- **Work lost**: what requeued attempts (preemptions, lost nodes) had done since their last checkpoint
  (``Attempt.work_lost_s``, whose sum is ``Job.work_lost_s``) times their GPUs, in the window where the
  attempt ended.
- **Share**: a row's GPU-hours over the lab's capacity, the GPUs of the nodes the leader knows times the
  window's hours; unknown (None) when it knows no node.

The user and class rows take a whole job; the node and model rows take the part of each attempt that ran on
that node or those GPUs, and a job's wait and end go to the nodes (models) of its first and last attempt. A job
cancelled before it ever ran has no node, so it counts in the user, class and total rows only.

A report reads every job of the window, and years of them are a few hundred thousand: so a job is first reduced
to what the report needs of it (``JobUse``, a few tuples: ``job_use``), which a leader can keep for the jobs
that have finished instead of reading its archive again for every report, and the tally over them does no more
than a few additions a job.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from labq.models.job import Job, JobState, StopReason
from labq.models.node import Node
from labq.models.priority import class_of
from labq.models.transitions import held_gpu_hours

NO_GROUP = "(none)"  #: the group row of the users in no group
UNKNOWN_MODEL = "unknown"  #: the model of a GPU on a node the leader does not know (any more)
FAILED, CANCELLED = "failed", "cancelled"  #: the ends a report counts (``JobUse.outcome``)
_OUTCOMES = {JobState.FAILED: FAILED, JobState.TIMEOUT: FAILED, JobState.CANCELLED: CANCELLED}


class Grouping(str, Enum):
    """What a report's rows are: ``labq usage --by``."""

    USER = "user"  #: the job's submitter
    GROUP = "group"  #: each of the submitter's groups (``[groups]``; ``NO_GROUP`` for none)
    CLASS = "class"  #: the priority class its priority falls in (``class_of``: 250 is normal)
    NODE = "node"  #: the node an attempt ran on
    MODEL = "model"  #: the model of the GPUs an attempt held


@dataclass(frozen=True)
class UsageRow:
    """One user's (class's, node's, model's) use of the lab over the window, or the whole lab's."""

    name: str  #: the user, class, node or GPU model; ``"total"`` for the lab
    gpu_hours: float  #: GPU-hours allocated inside the window
    share: float | None  #: of the lab's capacity over the window (0.25: a quarter); None: capacity unknown
    jobs_run: int  #: jobs that held GPUs inside the window
    failed: int  #: jobs that ended failed or at their time limit inside the window
    preempted: int  #: jobs with an attempt preempted inside the window
    cancelled: int  #: jobs cancelled inside the window
    mean_wait_s: float | None  #: mean queue wait of the jobs that first started inside the window; None: none did
    p90_wait_s: float | None  #: their 90th percentile (nearest rank)
    lost_gpu_hours: float  #: work lost to requeues inside the window, in GPU-hours
    #: the GPUs' mean utilisation (0..1) and memory used (GiB) while allocated, as their agents measured it,
    #: over the GPU-hours of the jobs that were measured; None: none was (no NVML, simulated GPUs)
    utilization: float | None = None
    memory_gib: float | None = None
    measured_gpu_hours: float = 0.0  #: the GPU-hours those figures are over


@dataclass(frozen=True)
class UsageReport:
    since: float
    until: float  #: at most ``now``: the future has no use yet
    user: str | None  #: the one user whose jobs it counts; None: everyone's
    gpus: int  #: the GPUs the leader knows (0: none, so capacity is unknown)
    capacity_gpu_hours: float | None  #: ``gpus`` x the window's hours
    rows: Mapping[Grouping, tuple[UsageRow, ...]]  #: per grouping, the most GPU-hours first
    total: UsageRow
    #: each booking that overlaps the window: its GPU-hours booked and used there, by start
    reserved: tuple[ReservedRow, ...] = ()

    @property
    def hours(self) -> float:
        return (self.until - self.since) / 3600.0


class Booking(NamedTuple):
    """A reservation as a report needs it: who booked how many GPUs for when (until it was cancelled)."""

    name: str
    owner: str
    node: str | None
    gpus: int
    start: float
    end: float  #: exclusive
    cancelled_at: float | None = None


@dataclass(frozen=True)
class ReservedRow:
    """One booking's use inside the window: booked is its GPUs x its hours there (up to a cancel), used the
    GPU-hours of the jobs that ran in it there."""

    name: str
    owner: str
    node: str | None
    start: float
    end: float
    booked_gpu_hours: float
    used_gpu_hours: float


def reserved_rows(bookings: Iterable[Booking], uses: Iterable[JobUse], since: float, until: float
                  ) -> tuple[ReservedRow, ...]:
    """The bookings that overlap ``[since, until)``, by start: booked and used GPU-hours inside it. A job's runs
    count for the booking of its name whose time they started in (a name is used again once a booking is over)."""
    chosen = sorted((b for b in bookings if b.start < until and min(b.end, b.cancelled_at or b.end) > since),
                    key=lambda b: (b.start, b.name))
    used = {b: 0.0 for b in chosen}
    by_name: dict[str, list[Booking]] = {}
    for b in chosen:
        by_name.setdefault(b.name, []).append(b)
    for use in uses:
        for booking in by_name.get(use.reservation, ()) if use.reservation else ():
            for run in use.runs:
                if booking.start <= run.started_at < booking.end:
                    used[booking] += held_gpu_hours(run.started_at, run.ended_at, run.gpus, since, until)
    return tuple(ReservedRow(b.name, b.owner, b.node, b.start, b.end,
                             held_gpu_hours(b.start, min(b.end, b.cancelled_at or b.end), b.gpus, since, until),
                             used[b]) for b in chosen)


class Run(NamedTuple):
    """One attempt that started, as a report needs it."""

    started_at: float
    ended_at: float  #: a running attempt's is the ``now`` it was looked at
    gpus: int
    preempted: bool  #: stopped for a preemption
    work_lost_s: float  #: ``Attempt.work_lost_s``
    allocations: tuple[tuple[str, tuple[int, ...]], ...]  #: (node, GPU indices) of its placement


class JobUse(NamedTuple):
    """What a report needs of one job: who, which class, when submitted and ended, how, and its runs."""

    id: int
    user: str
    klass: str  #: its priority class's name
    submitted_at: float
    ended_at: float | None  #: None while unfinished
    outcome: str | None  #: ``FAILED`` or ``CANCELLED`` once it ended so, else None
    runs: tuple[Run, ...]  #: the attempts that started, oldest first
    ended_in_last_run: bool  #: it ended in its last run (not waiting again after a requeue, or never placed)
    reservation: str | None = None  #: the booking it ran in
    utilization: float | None = None  #: its GPUs' mean utilisation while it held them (0..1); None: not measured
    memory_gib: float | None = None  #: their mean memory used, GiB


def job_use(job: Job, now: float) -> JobUse:
    """``job`` as a report needs it. Its earlier attempts are its ``history``; its current one is the job's own
    ``started_at`` and ``placement`` while it is not in the history yet, ending at ``now`` while it runs."""
    runs = [_run(a.started_at, a.ended_at, a.placement, job.spec.gpus, a.stop_reason is StopReason.PREEMPTED,
                 a.work_lost_s) for a in job.history if a.started_at is not None]
    last = job.history[-1] if job.history else None
    current = last is None or last.number != job.attempt
    if job.started_at is not None and current:
        runs.append(_run(job.started_at, job.ended_at if job.ended_at is not None else now, job.placement,
                         job.spec.gpus, False, 0.0))
    ended_in_last_run = job.started_at is not None or (not current and last.started_at is not None)
    return JobUse(job.id, sys.intern(job.spec.user), sys.intern(class_of(job.spec.priority).name.lower()),
                  job.submitted_at, job.ended_at if job.state.finished else None, _OUTCOMES.get(job.state),
                  tuple(runs), ended_in_last_run, job.spec.reservation, *measured(job.measured_gpu_s, job.busy_gpu_s,
                                                                                   job.memory_mib_gpu_s))


def measured(gpu_s: float, busy_gpu_s: float, memory_mib_gpu_s: float) -> tuple[float | None, float | None]:
    """A job's mean utilisation and memory used (GiB) from its ``Job.measured_gpu_s``...; (None, None) unmeasured."""
    if not gpu_s:
        return None, None
    return busy_gpu_s / gpu_s, memory_mib_gpu_s / gpu_s / 1024.0


def _run(started_at: float, ended_at: float, placement, gpus: int, preempted: bool, work_lost_s: float) -> Run:
    allocations = shared(tuple((a.node, a.gpu_indices) for a in placement.allocations)) if placement else ()
    return Run(started_at, ended_at, placement.gpu_count if placement is not None else gpus, preempted,
               work_lost_s or 0.0, allocations)


_SHARED: dict[tuple, tuple] = {}


def shared(allocations: tuple[tuple[str, tuple[int, ...]], ...]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """One object for every run on the same GPUs: a leader keeps the runs of years of finished jobs, and a lab's
    GPU sets are few (a node's subsets at most), so this saves a third of what it keeps."""
    found = _SHARED.get(allocations)
    if found is None:
        found = _SHARED[allocations] = tuple((sys.intern(node), indices) for node, indices in allocations)
    return found


def node_gpu_models(nodes: Iterable[Node]) -> dict[str, tuple[str, ...]]:
    """Each node's GPU models by index: what a report needs of the nodes."""
    return {node.name: tuple(gpu.model for gpu in node.gpus) for node in nodes}


def usage_report(finished: Iterable[Job], live: Iterable[Job], since: float, until: float,
                 gpus: Mapping[str, Sequence[str]], now: float, user: str | None = None) -> UsageReport:
    """The report over ``[since, min(until, now))`` of ``finished`` jobs (from the archive) and ``live`` ones
    (the leader's unfinished jobs); a job in both counts as its finished version (it ended between the two
    looks). ``gpus``: node -> its GPUs' models by index (``node_gpu_models``). ``user`` only labels the report:
    the caller passes that user's jobs alone."""
    jobs = {job.id: job for job in live}
    jobs.update((job.id, job) for job in finished)
    return report(map(job_use, jobs.values(), [now] * len(jobs)), since, until, gpus, now, user)


def report(uses: Iterable[JobUse], since: float, until: float, gpus: Mapping[str, Sequence[str]], now: float,
           user: str | None = None, bookings: Iterable[Booking] = (),
           groups: Mapping[str, Sequence[str]] | None = None) -> UsageReport:
    """``usage_report`` of jobs already reduced (``job_use``), each job once; with the ``bookings`` (the
    user's own, for a user's report), each one's GPU-hours booked and used in the window."""
    until = min(until, now)
    if not since < until:
        raise ValueError("the window is empty: its start must be before its end and before now")
    tally = _Tally(since, until, gpus, groups or {})
    uses = list(uses)
    for use in uses:
        tally.take(use)
    lab_gpus = sum(len(models) for models in gpus.values())
    capacity = lab_gpus * (until - since) / 3600.0 if lab_gpus else None
    rows = {g: tuple(sorted((c.row(name, capacity) for name, c in tally.groups[g].items()),
                            key=lambda r: (-r.gpu_hours, r.name)))
            for g in Grouping}
    return UsageReport(since, until, user, lab_gpus, capacity, rows, tally.total.row("total", capacity),
                       reserved_rows(bookings, uses, since, until))


def nearest_rank(ordered: Sequence[float], percent: int) -> float | None:
    """The ``percent`` percentile of sorted values by nearest rank: the value at rank ceil(percent x n / 100)
    (integers, so that 90% of 10 is rank 9 exactly); None for no values."""
    if not ordered:
        return None
    rank = -(-percent * len(ordered) // 100)
    return ordered[min(len(ordered), max(1, rank)) - 1]


class _Counts:
    """What one row adds up, as the jobs come one at a time: a job counts once in a row however many of its
    runs do, so each count remembers the last job it counted."""

    __slots__ = ("gpu_hours", "lost_gpu_hours", "waits", "run", "run_by", "preempted", "preempted_by",
                 "failed", "cancelled", "measured", "busy", "memory")

    def __init__(self) -> None:
        self.gpu_hours = self.lost_gpu_hours = 0.0
        self.measured = self.busy = self.memory = 0.0  #: measured GPU-hours; x utilisation; x GiB
        self.waits: list[float] = []
        self.run = self.preempted = self.failed = self.cancelled = 0
        self.run_by = self.preempted_by = -1  #: the job last counted

    def row(self, name: str, capacity: float | None) -> UsageRow:
        waits = sorted(self.waits)
        measured = self.measured
        return UsageRow(name, self.gpu_hours, self.gpu_hours / capacity if capacity else None, self.run,
                        self.failed, self.preempted, self.cancelled,
                        sum(waits) / len(waits) if waits else None, nearest_rank(waits, 90), self.lost_gpu_hours,
                        self.busy / measured if measured else None, self.memory / measured if measured else None,
                        measured)


class _Tally:
    """The rows of every grouping and the total, filled one job at a time."""

    def __init__(self, since: float, until: float, gpus: Mapping[str, Sequence[str]],
                 groups: Mapping[str, Sequence[str]]) -> None:
        self.since, self.until, self.gpus = since, until, gpus
        self.groups_of = groups  #: user -> the groups they are in
        self.groups: dict[Grouping, dict[str, _Counts]] = {g: {} for g in Grouping}
        self.total = _Counts()
        self._where: dict[tuple[str, tuple[int, ...]], list[tuple[_Counts, int]]] = {}

    def _counts(self, grouping: Grouping, name: str) -> _Counts:
        group = self.groups[grouping]
        counts = group.get(name)
        if counts is None:
            counts = group[name] = _Counts()
        return counts

    def where(self, allocations: tuple[tuple[str, tuple[int, ...]], ...]) -> list[tuple[_Counts, int]]:
        """The node and model rows of a run's GPUs, each with how many of them are theirs."""
        found = []
        for allocation in allocations:
            rows = self._where.get(allocation)
            if rows is None:
                node, indices = allocation
                models = self.gpus.get(node, ())
                by_model: dict[str, int] = {}
                for index in indices:
                    model = models[index] if 0 <= index < len(models) else UNKNOWN_MODEL
                    by_model[model] = by_model.get(model, 0) + 1
                rows = self._where[allocation] = [(self._counts(Grouping.NODE, node), len(indices))] + [
                    (self._counts(Grouping.MODEL, model), n) for model, n in by_model.items()]
            found += rows
        return found

    def take(self, use: JobUse) -> None:
        """Add what the job did inside the window to its rows; a job that did nothing there makes no row."""
        since, until, runs = self.since, self.until, use.runs
        counted = [r for r in runs if r.started_at < until and r.ended_at >= since]
        waited = bool(runs) and since <= runs[0].started_at < until
        ended = use.outcome is not None and since <= use.ended_at < until
        if not counted and not waited and not ended:
            return
        whole = [self._counts(Grouping.USER, use.user), self._counts(Grouping.CLASS, use.klass), self.total]
        whole += [self._counts(Grouping.GROUP, group) for group in self.groups_of.get(use.user) or (NO_GROUP,)]
        job = use.id
        for run in counted:
            per_gpu = held_gpu_hours(run.started_at, run.ended_at, 1, since, until)
            ended_inside = run.ended_at < until
            lost = run.work_lost_s / 3600.0 if ended_inside else 0.0
            ran = per_gpu > 0.0 or run.started_at >= since
            preempted = run.preempted and ended_inside
            for counts, n in [(c, run.gpus) for c in whole] + self.where(run.allocations):
                counts.gpu_hours += per_gpu * n
                counts.lost_gpu_hours += lost * n
                if use.utilization is not None:  # the job's means, over its GPU-hours in the window
                    counts.measured += per_gpu * n
                    counts.busy += per_gpu * n * use.utilization
                    counts.memory += per_gpu * n * use.memory_gib
                if ran and counts.run_by != job:
                    counts.run_by = job
                    counts.run += 1
                if preempted and counts.preempted_by != job:
                    counts.preempted_by = job
                    counts.preempted += 1
        if waited:
            wait = runs[0].started_at - use.submitted_at
            for counts in whole + [c for c, _ in self.where(runs[0].allocations)]:
                counts.waits.append(wait)
        if ended:
            last = self.where(runs[-1].allocations) if runs and use.ended_in_last_run else []
            for counts in whole + [c for c, _ in last]:
                if use.outcome == FAILED:
                    counts.failed += 1
                else:
                    counts.cancelled += 1
