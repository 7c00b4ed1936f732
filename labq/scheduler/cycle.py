"""One scheduling pass: a pure function of the lab's state and the time.

The queue is served in order (priority, fair share, submit time). Each queued
job in turn either starts on the best GPU set that is free for it, or preempts
cheaper lower-priority work and holds the GPUs being freed, or waits with a
reason. GPUs that jobs on their way out give back whatever a pass decides
(cancelled, at their time limit, or preempted for a job that no longer waits)
are counted on before anything is preempted: the first job that needs them
holds them and waits for them. A waiting job near the top of the queue holds
the GPUs it will get when running jobs end (by their time limits), so lower
jobs backfill around it only where they cannot delay it.

A pass must stay fast on a long queue (the simulator runs one per event). Most
jobs take the verdict of an earlier job of the same shape and priority while
nothing has changed. What the pass works out per node (the best free set, a
preemption plan, the set that frees soonest) is kept per job shape and
recomputed only on the nodes a start, preemption or hold changed: that
bookkeeping is ``NodeMemo``'s (labq.scheduler.memo), and the lab's state as the
pass sees it is ``LabView``'s (labq.scheduler.lab_view). Bounds that only
tighten during a pass (the most free GPUs on one node, the lowest priority that
may be preempted) answer whole questions at once.

This module serves the queue; the rules each job meets are parts of the pass,
each a class over ``LabView`` that builds on the parts it asks:

* ``Verdicts`` (labq.scheduler.verdicts): the decisions so far, and their words;
* ``Guarantees`` (labq.scheduler.guarantees): what a lab's queues allow a job;
* ``Gates`` (labq.scheduler.gates): what keeps a job waiting before any GPU is
  looked at (dependencies, reservation, quota, array cap, a lab it never fits);
* ``Starting`` (labq.scheduler.starting): the best GPUs for a job, and a start;
* ``Preempting`` (labq.scheduler.preempting): whom a job preempts, and where;
* ``Backfill`` (labq.scheduler.backfill): why a job waits, and the GPUs it holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from labq.models.decisions import Decisions, Pending, PendingReason
from labq.models.job import Job, JobState
from labq.models.node import Node
from labq.models.reservation import Reservation
from labq.scheduler.backfill import Backfill
from labq.scheduler.memo import BY_GPUS, UNKNOWN
from labq.scheduler.policy import Policy, order_queue, served_priority
from labq.scheduler.preempting import Preempting
from labq.scheduler.queues import OUTSIDE


def schedule(
    jobs: Iterable[Job],
    nodes: Iterable[Node],
    *,
    now: float,
    reservations: Iterable[Reservation] = (),
    usage: Mapping[str, float] | None = None,
    policy: Policy | None = None,
    finished: Mapping[int, JobState] | None = None,
) -> Decisions:
    """Decide what starts, what is preempted, and why everything else waits.

    ``jobs`` are the lab's unfinished jobs; ``finished`` gives the end state of
    finished jobs that others depend on; ``usage`` is each user's decayed
    GPU-hours for fair share. Equal input gives equal decisions.
    """
    return _Pass(list(jobs), list(nodes), list(reservations), usage or {}, policy or Policy(), now,
                 finished or {}).run()


class _Pass(Backfill, Preempting):
    """The rules of one pass: serve the queue in order, and say what each job does or why it waits."""

    def run(self) -> Decisions:
        aging, now = self.policy.aging_s, self.now
        if aging is not None:
            self.ranks = {job.id: served_priority(job, now, aging) for job in self.queued}
        queue = order_queue(self.queued, self.usage, now, aging, self.ranks)
        if self.reservation_list:
            self._drain_reservations()
            queue = self._serve_reservations_first(queue)
        if self.book is None:
            self._serve_in_order(queue)
        else:
            self._serve_queues(queue)
        for job in sorted(self.held, key=lambda j: j.id):
            self._wait(job, PendingReason.HELD, f"held; `labq release {job.id}` puts it back in the queue")
        return Decisions(tuple(self.starts), tuple(self.preemptions), tuple(self.pending))

    def _serve_in_order(self, queue: list[Job], first: bool = False) -> list[tuple[int, float, Job]]:
        """Serve ``queue`` in order. With ``first`` (a lab with queues), only the jobs of queues below
        their guarantee; the others are returned, in order, for later, as (served priority, their queue's
        share of its guarantee, job)."""
        aging, book = self.policy.aging_s, self.book
        settled, pending, inflight, ranks = self.memo.settled, self.pending, self.inflight, self.ranks
        personal = self._quotas or book is not None
        make_pending = tuple.__new__  # skips NamedTuple's Python-level __new__
        barring, barred_nodes, no_node = self.barring, self.barred_nodes, frozenset()
        sized, fewest_cpus, least_memory = self.sized, self.fewest_cpus, self.least_memory
        if book is not None:
            specs, use, guarantee = book.specs, book.use, book.guarantee
        later = []
        at_cap, capped = self.array_on_gpus, self._capped
        for job in queue:
            cap = job.spec.array_cap
            if cap is not None and at_cap.get(job.spec.array_id, 0) >= cap:  # a task its array's %N holds back
                pending.append(make_pending(Pending, (job.id, *capped(job.spec.array_id, cap))))
                continue
            # The fast path: most of a long queue waits for the same reasons as a job
            # of the same shape and priority before it, while nothing has changed. Only
            # jobs that can fit the lab and name no reservation settle a verdict (_blocked),
            # and only for jobs that the same nodes keep off (their users' accounts, see barred_nodes).
            spec = job.spec
            rank = spec.priority if aging is None else ranks[job.id]
            if book is not None:
                q = spec.queue if spec.queue in specs else OUTSIDE  # QueueBook.queue_of, inlined: once a queued job
                under = use[q] < guarantee[q]
                if first and not under:
                    later.append((rank, q, job))
                    continue
                rank = (rank, q, under)  # jobs of one queue, in one standing, share verdicts
            barred = barred_nodes(job) if barring else no_node
            # what a job of its GPU shape waits for by GPUs alone (``Backfill._blocked``), whatever it asks of CPUs
            # and memory, unless it can never run for those; else what jobs that ask as much wait for
            verdict = settled.get((spec.resource_shape, BY_GPUS, None, barred, rank))
            if sized:
                if verdict is not None and not ((spec.cpus is None or spec.cpus <= fewest_cpus) and (
                        spec.memory_mib is None or spec.memory_mib <= least_memory)) and self._never(
                        job, barred) is not None:
                    verdict = None
                if verdict is None:
                    verdict = settled.get((spec.resource_shape, spec.cpus, spec.memory_mib, barred, rank))
            if (verdict is not None and not spec.depends_on and job.id not in inflight
                    and (not personal or self._plain(job))):
                pending.append(make_pending(Pending, (job.id, *verdict)))
                continue
            self._serve(job)
            if first:
                self._note_wanted(job, q)
        return later

    def _serve_queues(self, queue: list[Job]) -> None:
        """Queues below their guarantee first; then the rest, higher priority first and, within a priority,
        the queues that hold least of their guarantee first (each in the queue's order)."""
        book = self.book
        later = self._serve_in_order(queue, first=True)
        share = {q: book.share(q) for q in book.use}
        later.sort(key=lambda entry: (-entry[0], share[entry[1]]))
        self._serve_in_order([job for _, _, job in later])

    def _serve_reservations_first(self, queue: list[Job]) -> list[Job]:
        """Jobs in reservations use only their reservation's GPUs, so serving them first takes nothing
        from anyone but borrowers; those that still wait keep their reservation's GPUs from being lent."""
        rest = []
        for job in queue:
            if job.spec.reservation is None:
                rest.append(job)
                continue
            self._serve(job)
            r = self.reservations.get(job.spec.reservation)
            if r is not None and r.active(self.now) and self.pending and self.pending[-1].job_id == job.id:
                self.wanted.add(r.name)
                self._reserved_memo.clear()
        return rest

    def _never(self, job: Job, barred: frozenset[str]) -> tuple | None:
        """Why ``job`` can never start on the nodes that are up (``Gates._never_runs``), once per shape a pass."""
        spec = job.spec
        cpus, memory = spec.cpus, spec.memory_mib
        if (cpus is None or cpus <= self.fewest_cpus) and (memory is None or memory <= self.least_memory):
            cpus = memory = None  # it fits every node that says what it has: it never runs where its GPU shape never does
        key = ("never", spec.resource_shape, cpus, memory, barred, spec.user if barred else None)
        lasting = self.memo.lasting
        never = lasting.get(key, UNKNOWN)
        if never is UNKNOWN:
            never = lasting[key] = self._never_runs(job, barred)
        return never

    def _serve(self, job: Job) -> None:
        spec = job.spec
        if spec.array_cap is not None and self.array_on_gpus.get(spec.array_id, 0) >= spec.array_cap:
            self.pending.append(Pending(job.id, *self._capped(spec.array_id, spec.array_cap)))  # (reservations first)
            return
        if spec.depends_on and not self._dependencies_met(job):
            return
        if spec.reservation is not None and not self._reservation_open(job):
            return
        never = self._never(job, self.barred_nodes(job))
        if never is not None:
            self._wait(job, *never)
            return
        if self._quotas and not self._within_quota(job):
            return
        book = self.book
        problem = None
        if book is not None:
            problem = book.gate(job)
            if problem is not None and not self._may_make_room(job):
                self._wait(job, *problem)
                return
        if spec.share_mib is not None:
            self._share(job, problem)
            return
        shape = self._shape(job)
        seen = self.memo.version
        placement = self._place(job, shape)
        if placement is not None and (book is None or self._queue_allows(job, job.spec.gpus, 0)):
            self._start(job, placement)
            return
        if self._preempt_for(job, shape):
            return
        if book is None:
            self._blocked(job, shape, seen)
            return
        loan = self._loan_problem(job)
        if problem is None and placement is not None:  # GPUs are free, but not for it
            problem = PendingReason.BORROWED, loan or book.no_loan(job, job.spec.gpus, self._free_total())
        if problem is not None:
            self._wait(job, *problem)
            return
        self._blocked(job, shape, seen, f"; {loan}" if loan else "")
