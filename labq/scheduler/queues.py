"""The lab's queues as one scheduling pass sees them: guarantees, what each holds, what may be lent.

Each queue is guaranteed a number of GPUs (``QueueSpec.guarantee``). A pass serves the
jobs of queues below their guarantee first. GPUs idle beyond what queues below their
guarantee still want are lent: a preemptible job (with a grace within the lab's reclaim
bound) may take its queue over its guarantee with them. When a queue that lent wants
its GPUs back, a job of it that stays within its guarantee may preempt borrowed work of
any priority (a *reclaim*), never taking the lender of that work below its own guarantee.

Counts, not GPU sets: a guarantee is a number of GPUs anywhere in the lab, so a queue
gets its share wherever its jobs fit best. ``QueueBook`` keeps the counts of one pass
and answers the questions the pass asks (``labq.scheduler.guarantees``); it changes as the
pass starts and preempts jobs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from labq.models.decisions import PendingReason
from labq.models.job import Job, StopReason
from labq.models.node import Node
from labq.models.queues import QueueSpec

#: the queue of jobs outside every queue: no guarantee, so everything they hold is borrowed
OUTSIDE = ""


@dataclass
class QueueBook:
    specs: dict[str, QueueSpec]
    guarantee: dict[str, int]
    #: GPUs each queue's jobs hold on nodes that are up, less those of jobs on their way out (preempted, cancelled,
    #: at their time limit)
    use: dict[str, int] = field(default_factory=dict)
    #: queues with a job waiting for GPUs within its guarantee: their idle guarantee is lent to no one
    wanted: set[str] = field(default_factory=set)
    #: preemptors whose victims are checkpointing: job id -> the victims' GPUs, which count for its queue
    promised: dict[int, int] = field(default_factory=dict)
    #: per queue, the most GPUs its jobs hold on one node: a surplus beyond it changes no preemption plan
    on_one_node: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        #: some queue has a maximum wait
        self.waits_bounded = any(q.max_wait_s is not None for q in self.specs.values())

    @classmethod
    def of(cls, queues: Iterable[QueueSpec], lab_gpus: int) -> QueueBook | None:
        specs = {q.name: q for q in queues}
        if not specs:
            return None
        guarantee = {name: q.guarantee(lab_gpus) for name, q in specs.items()}
        guarantee[OUTSIDE] = 0
        return cls(specs, guarantee, {name: 0 for name in guarantee})

    # -- counts -------------------------------------------------------------------------

    def queue_of(self, job: Job) -> str:
        """Its queue; a job of a queue the admin removed is outside every queue."""
        name = job.spec.queue
        return name if name in self.specs else OUTSIDE

    def take(self, job: Job, gpus: int) -> None:
        """A job starts (what was promised to it is counted already)."""
        self.use[self.queue_of(job)] += gpus - self.promised.pop(job.id, 0)

    def promise(self, job: Job, gpus: int) -> None:
        """Victims are checkpointing for ``job``: the ``gpus`` they free count for its queue from now on (the
        free GPUs that complete its set stay free, held for it)."""
        before = self.promised.get(job.id, 0)
        self.promised[job.id] = min(job.spec.gpus, before + gpus)  # a victim may free more than the job takes
        self.use[self.queue_of(job)] += self.promised[job.id] - before

    def before(self, job: Job) -> int:
        """What ``job``'s queue holds besides ``job`` itself (a promise to it is not counted twice)."""
        return self.use[self.queue_of(job)] - self.promised.get(job.id, 0)

    def surplus_key(self) -> tuple[int, ...]:
        """Each queue's surplus as far as a plan on one node can tell it apart: from 0 to what it holds there."""
        return tuple(max(0, min(self.use[q] - self.guarantee[q], self.on_one_node.get(q, 0))) for q in self.use)

    def surplus(self, q: str) -> int:
        """GPUs the queue holds beyond its guarantee: the most that may be taken from it by another queue."""
        return self.use[q] - self.guarantee[q]

    def leave(self, job: Job, gpus: int) -> None:
        """A job is being preempted: its GPUs no longer count for its queue."""
        q = self.queue_of(job)
        self.use[q] -= gpus

    def under(self, q: str) -> bool:
        """The queue holds less than its guarantee: its jobs are served first."""
        return self.use[q] < self.guarantee[q]

    def idle_guarantee(self, q: str) -> int:
        return max(0, self.guarantee[q] - self.use[q])

    def kept_from(self, q: str) -> int:
        """Free GPUs a job of ``q`` may not take: other queues' idle guarantee that they want or do not lend."""
        kept = 0
        for other, spec in self.specs.items():
            if other != q and (other in self.wanted or not spec.lends):
                kept += self.idle_guarantee(other)
        return kept

    def reclaimable(self, victim: Job) -> bool:
        """Preempting ``victim`` leaves its queue at or above its guarantee: what it holds is borrowed."""
        q = self.queue_of(victim)
        return self.use[q] - victim.spec.gpus >= self.guarantee[q]

    def overdue(self, job: Job, waited_s: float) -> bool:
        """The job has waited past its queue's maximum wait."""
        spec = self.specs.get(self.queue_of(job))
        return spec is not None and spec.max_wait_s is not None and waited_s >= spec.max_wait_s

    def share(self, q: str) -> float:
        """How much of its guarantee a queue holds: queues that hold less borrow first."""
        g = self.guarantee[q]
        return self.use[q] / g if g else float(self.use[q] + 1) * 1e6

    # -- rules --------------------------------------------------------------------------

    def gate(self, job: Job) -> tuple[PendingReason, str] | None:
        """Why ``job`` may not start now whatever the GPUs, unless its own queue's jobs make room: its queue's
        cap, or its guarantee in a queue that does not borrow."""
        q = self.queue_of(job)
        gpus = job.spec.gpus
        use = self.before(job)
        spec = self.specs.get(q)
        if spec is None:
            return None
        if spec.cap is not None and use + gpus > spec.cap:
            return (PendingReason.QUEUE, f"queue {q} is at its cap of {spec.cap} GPUs (holds {use}); "
                                         f"this job needs {gpus}")
        if use + gpus > self.guarantee[q] and not spec.borrows:
            return (PendingReason.QUEUE, f"queue {q} holds {use} of its guarantee of {self.guarantee[q]} GPUs "
                                         f"and does not borrow beyond it; this job needs {gpus}")
        return None

    def loan_problem(self, job: Job, now: float, min_runtime_s: float, reclaim_grace_s: float | None,
                     preemption: bool) -> str | None:
        """Why ``job``, which would take its queue beyond its guarantee, may not borrow: for ``labq why``."""
        q = self.queue_of(job)
        why = borrow_problem(job, now, min_runtime_s, reclaim_grace_s, preemption)
        if why is None:
            return None
        holds = (f"queue {q} holds {self.before(job)} of its guarantee of {self.guarantee[q]} GPUs" if q
                 else "a job outside every queue has no guarantee")
        return f"{holds}; {why}"

    def may_borrow(self, job: Job, now: float, min_runtime_s: float, reclaim_grace_s: float | None,
                   preemption: bool) -> bool:
        spec = self.specs.get(self.queue_of(job))
        return (spec is None or spec.borrows) and \
            borrow_problem(job, now, min_runtime_s, reclaim_grace_s, preemption) is None

    def no_loan(self, job: Job, gpus: int, free: int) -> str:
        """Why the free GPUs are not lent to ``job``: for ``labq why``."""
        q = self.queue_of(job)
        keepers = sorted(other for other, spec in self.specs.items()
                         if other != q and self.idle_guarantee(other) and (other in self.wanted or not spec.lends))
        why = "; ".join(f"queue {o} {'wants' if o in self.wanted else 'does not lend'} its idle guarantee of "
                        f"{self.idle_guarantee(o)}" for o in keepers)
        label = f"queue {q} holds {self.before(job)} of its guarantee of {self.guarantee[q]} GPUs" if q else \
            "a job outside every queue borrows all it holds"
        return (f"{label}; of {free} free GPUs, {max(0, free - self.kept_from(q))} may be used and this job needs "
                f"{gpus} ({why})")


def borrow_problem(job: Job, now: float, min_runtime_s: float, reclaim_grace_s: float | None,
                   preemption: bool) -> str | None:
    """Why ``job`` may not borrow another queue's GPUs, if so. Borrowed GPUs must come back on demand, within
    the lab's bound, and a job just reclaimed does not borrow again before its minimum runtime would pass."""
    spec = job.spec
    if not preemption:
        return "with preemption off, nothing borrows beyond its guarantee"
    if not spec.preemptible:
        return "only preemptible jobs borrow beyond it"
    if reclaim_grace_s is not None and spec.grace_s > reclaim_grace_s:
        return (f"its grace of {spec.grace_s:g}s is longer than the lab's reclaim bound of {reclaim_grace_s:g}s, "
                "so it may not borrow (a shorter --grace lets it)")
    last = job.history[-1] if job.history else None
    if last is not None and last.stop_reason is StopReason.PREEMPTED and now - last.ended_at < min_runtime_s:
        return (f"it was preempted {now - last.ended_at:.0f}s ago and borrows again after the minimum runtime "
                f"({min_runtime_s:g}s), so that it is not reclaimed again at once")
    return None


@dataclass(frozen=True)
class QueueStanding:
    """One queue as ``labq queues`` shows it."""

    name: str  #: ``OUTSIDE`` ("") for the jobs outside every queue
    guarantee: int  #: GPUs, in the lab as it is up now
    use: int  #: GPUs its jobs hold
    borrowed: int  #: of those, beyond its guarantee
    lent: int  #: of its idle guarantee, GPUs other queues' jobs use
    waiting_jobs: int
    waiting_gpus: int


def standing(queues: Iterable[QueueSpec], jobs: Iterable[Job], lab_gpus: int, up: frozenset[str]) -> list[QueueStanding]:
    """Each queue's guarantee, use, borrowed and lent GPUs and waiting work, in a lab of ``lab_gpus`` GPUs on the
    nodes ``up``. Guarantees are counts, so what is lent is shared out over the idle guarantees it came from:
    borrowed GPUs come first from GPUs no queue is guaranteed."""
    book = QueueBook.of(queues, lab_gpus)
    if book is None:
        return []
    waiting: dict[str, list[int]] = {q: [0, 0] for q in book.use}
    for job in jobs:
        q = book.queue_of(job)
        if job.state.holds_gpus and job.placement is not None:
            book.take(job, sum(len(a.gpu_indices) for a in job.placement.allocations if a.node in up))
        elif not job.state.finished and job.placement is None:
            waiting[q][0] += 1
            waiting[q][1] += job.spec.gpus
    borrowed = {q: max(0, book.use[q] - book.guarantee[q]) for q in book.use}
    unguaranteed = max(0, lab_gpus - sum(book.guarantee.values()))
    from_lenders = max(0, sum(borrowed.values()) - unguaranteed)
    idle = {q: book.idle_guarantee(q) for q in book.specs}
    all_idle = sum(idle.values())
    lent = _shared_out(min(from_lenders, all_idle), idle)
    names = [*book.specs, *([OUTSIDE] if book.use[OUTSIDE] or waiting[OUTSIDE][0] else [])]
    return [QueueStanding(q, book.guarantee[q], book.use[q], borrowed[q], lent.get(q, 0), *waiting[q]) for q in names]


def _shared_out(total: int, weights: dict[str, int]) -> dict[str, int]:
    """``total`` shared out in proportion to ``weights``, whole numbers that add up to it (largest remainders)."""
    whole = sum(weights.values())
    if not whole:
        return {q: 0 for q in weights}
    share = {q: total * w // whole for q, w in weights.items()}
    rest = sorted(weights, key=lambda q: (-(total * weights[q] % whole), q))
    for q in rest[: total - sum(share.values())]:
        share[q] += 1
    return share


def lab_gpus(nodes: Iterable[Node]) -> int:
    """The GPUs labq may schedule on ``nodes`` that take work: what percentage guarantees are shares of."""
    return sum(n.gpu_count - len(n.unmanaged_busy) for n in nodes if n.schedulable)


def why_never_in_queue(spec, queues: Iterable[QueueSpec], lab_gpus: int, reclaim_grace_s: float | None,
                       preemption: bool) -> str | None:
    """Why a job of ``spec`` could never start in its queue in a lab of ``lab_gpus`` GPUs, if so: it is bigger
    than its queue's cap, or than its guarantee while it may not borrow. None: it can (given GPUs)."""
    specs = {q.name: q for q in queues}
    if not specs:
        return None
    q = specs.get(spec.queue)
    guarantee = q.guarantee(lab_gpus) if q is not None else 0
    label = f"queue {q.name}" if q is not None else "a job outside every queue"
    if q is not None and q.cap is not None and spec.gpus > q.cap:
        return f"it needs {spec.gpus} GPUs and queue {q.name}'s cap is {q.cap}"
    if spec.gpus <= guarantee:
        return None
    beyond = f"it needs {spec.gpus} GPUs and {label} is guaranteed {guarantee}, so it would borrow"
    if q is not None and not q.borrows:
        return f"{beyond}, and queue {q.name} does not borrow"
    if not preemption:
        return f"{beyond}, and with preemption off nothing borrows"
    if not spec.preemptible:
        return f"{beyond}, and only preemptible jobs borrow"
    if reclaim_grace_s is not None and spec.grace_s > reclaim_grace_s:
        return f"{beyond}, and only jobs with a grace of at most {reclaim_grace_s:g}s borrow"
    return None
