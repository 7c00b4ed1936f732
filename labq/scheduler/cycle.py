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
pass sees it is ``LabView``'s (labq.scheduler.lab_view), so this module holds
the rules. Bounds that only tighten during a pass (the most free GPUs on one
node, the lowest priority that may be preempted) answer whole questions at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import inf
from collections.abc import Iterable, Mapping

from labq.models.decisions import Decisions, Pending, PendingReason, Preempt, Start
from labq.models.job import Job, JobState
from labq.models.node import Node
from labq.models.placement import NodeAllocation, Placement
from labq.models.priority import priority_name
from labq.models.reservation import Reservation
from labq.scheduler.fit import why_kept_off, why_never_fits
from labq.scheduler.lab_view import Hold, LabView, OnGpus
from labq.scheduler.placement import SetChoice, best_set, indices_to_mask, mask_to_indices
from labq.scheduler.policy import Policy, order_queue, served_priority, waiting_since
from labq.scheduler.preemption import NodePlan, Victim, plan_on_node
from labq.scheduler.queues import OUTSIDE
from labq.scheduler.sharing import join, no_room, open_one
from labq.models.sharing import need_mib

#: what a job within its queue's guarantee waits for when it waits for GPUs: its queue's idle guarantee is not lent
_WANTING = frozenset({PendingReason.RESOURCES, PendingReason.PRIORITY, PendingReason.PREEMPTING,
                      PendingReason.BORROWED})


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


@dataclass
class _Pass(LabView):
    """The rules of one pass: serve the queue in order, and say what each job does or why it waits."""

    starts: list[Start] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    #: each queued job's served priority (``served_priority``, with aging), worked out once a pass
    ranks: dict[int, int] = field(default_factory=dict)

    # -- the pass -------------------------------------------------------------------

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
            verdict = settled.get((spec.resource_shape, barred_nodes(job) if barring else no_node, rank))
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

    def _note_wanted(self, job: Job, q: str) -> None:
        """A job within its queue's guarantee that waits for GPUs: its queue's idle guarantee is lent to no one."""
        book = self.book
        if (q and q not in book.wanted and self.pending and self.pending[-1].job_id == job.id
                and self.pending[-1].reason in _WANTING and book.before(job) + job.spec.gpus <= book.guarantee[q]):
            book.wanted.add(q)
            self.memo.settled.clear()  # verdicts of borrowers counted on those GPUs

    def _capped(self, array_id: int, cap: int) -> tuple:
        """Why a task of an array at its cap waits: the rest of a ``Pending``, one for all its tasks."""
        why = self.memo.lasting.get(("capped", array_id))
        if why is None:
            why = self.memo.lasting[("capped", array_id)] = (
                PendingReason.ARRAY_LIMIT, f"{cap} of array {array_id}'s tasks are on GPUs, as many as its %{cap} "
                "allows", None, None)
        return why

    def _serve(self, job: Job) -> None:
        spec = job.spec
        if spec.array_cap is not None and self.array_on_gpus.get(spec.array_id, 0) >= spec.array_cap:
            self.pending.append(Pending(job.id, *self._capped(spec.array_id, spec.array_cap)))  # (reservations first)
            return
        if spec.depends_on and not self._dependencies_met(job):
            return
        if spec.reservation is not None and not self._reservation_open(job):
            return
        lasting = self.memo.lasting
        barred = self.barred_nodes(job)
        key = ("never", spec.resource_shape, barred, spec.user if barred else None)
        never = lasting.get(key, _UNKNOWN)
        if never is _UNKNOWN:
            never = lasting[key] = self._never_runs(job, barred)
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

    # -- queues -----------------------------------------------------------------------

    def _free_total(self) -> int:
        current = self.memo.current
        total = current.get("free total")
        if total is None:
            total = current["free total"] = sum(self.free[n.name].bit_count() for n in self.up)
        return total

    def _would_borrow(self, job: Job) -> bool:
        """Starting now would take its queue beyond its guarantee: it borrows idle GPUs, and holds none (GPUs kept
        idle for a loan would be idle GPUs no one may use)."""
        book = self.book
        if book is None:
            return False
        q = book.queue_of(job)
        return (book.before(job) + job.spec.gpus > book.guarantee[q]
                and book.guarantee[q] < self.lab_gpus)

    def _loan_problem(self, job: Job) -> str | None:
        """Why ``job`` may not go beyond its queue's guarantee, when starting would take it there, in a lab where
        there is anything to borrow (a queue guaranteed the whole lab borrows nothing)."""
        book, p = self.book, self.policy
        q = book.queue_of(job)
        if book.before(job) + job.spec.gpus <= book.guarantee[q] or book.guarantee[q] >= self.lab_gpus:
            return None
        return book.loan_problem(job, self.now, p.min_runtime_s, p.reclaim_grace_s, p.preemption)

    def _queue_allows(self, job: Job, free_used: int, own_freed: int) -> bool:
        """Whether its queue lets ``job`` start taking ``free_used`` free GPUs, its own queue's jobs giving back
        ``own_freed``: within its cap, beyond its guarantee only as a loan it may take, and no free GPU that is
        another queue's idle guarantee which that queue wants or does not lend."""
        book, spec = self.book, job.spec
        q = book.queue_of(job)
        net = book.before(job) - own_freed + spec.gpus
        queue = book.specs.get(q)
        if queue is not None and queue.cap is not None and net > queue.cap:
            return False
        if net > book.guarantee[q] and not book.may_borrow(job, self.now, self.policy.min_runtime_s,
                                                          self.policy.reclaim_grace_s, self.policy.preemption):
            return False
        return free_used <= max(0, self._free_total() - book.kept_from(q))

    def _may_make_room(self, job: Job) -> bool:
        """Whether preemption might make room for ``job`` within its queue's rules (its own queue's lower jobs,
        or, once it waited past its queue's maximum wait, what stands in its way)."""
        return self.policy.preemption and (job.priority > self.lowest_victim or self._overdue(job))

    def _overdue(self, job: Job) -> bool:
        book = self.book
        return book is not None and book.waits_bounded and book.overdue(job, self.now - waiting_since(job))

    def _queue_mode(self, job: Job) -> tuple:
        """What a job's preemption plan depends on in a lab with queues: its queue, whether it reclaims (it stays
        within its guarantee), its priority if overdue, and what each queue may give up (its surplus over its
        guarantee, as far as it can matter: no more than its jobs hold on one node)."""
        book = self.book
        q = book.queue_of(job)
        key = book.surplus_key()
        # it reclaims if it stays within its guarantee and another queue holds GPUs beyond its own
        reclaims = book.before(job) + job.spec.gpus <= book.guarantee[q] and any(key)
        # past its queue's maximum wait, it preempts preemptible jobs of its served priority too, not only lower ones
        # (any below high would pass the classes' intent, and in a busy lab each overdue start would make the
        # next overdue job of its victims)
        aging = self.policy.aging_s
        overdue = ((job.spec.priority if aging is None else served_priority(job, self.now, aging))
                   if self._overdue(job) else None)
        return (q, reclaims, overdue, key)

    def _wait(self, job: Job, reason: PendingReason, detail: str, waiting_for: int | None = None,
              estimated_start: float | None = None) -> None:
        self.pending.append(Pending(job.id, reason, detail, waiting_for, estimated_start))

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

    def _drain_reservations(self) -> None:
        """A grace before a reservation starts, jobs on its GPUs that would still run then are preempted."""
        for r in self.reservation_list:
            if r.node not in self.nodes or not r.start > self.now:
                continue
            reserved = indices_to_mask(r.gpu_indices)
            for entry in self.on_gpus[r.node]:
                job = entry.job
                if (not entry.mask & reserved or job.spec.reservation == r.name or job.id in self.victims
                        or job.state is not JobState.RUNNING or not job.spec.preemptible
                        or entry.end <= r.start or self.now < r.start - job.spec.grace_s):
                    continue
                self.victims.add(job.id)
                if self.book is not None:
                    self.book.leave(job, job.spec.gpus)
                entry.candidate = False
                self.preemptions.append(Preempt(job.id, None, r.node, mask_to_indices(entry.mask),
                                                job.work_at_risk(self.now), r.name))
                self._changed([r.node])

    def _shape(self, job: Job) -> tuple:
        """Everything a job's placement depends on besides its priority and the state of the nodes."""
        personal = job.id if job.id in self.inflight else None
        return (job.spec.resource_shape, personal, self.barred_nodes(job))

    def _never_runs(self, job: Job, barred: frozenset[str]) -> tuple[PendingReason, str] | None:
        """Why ``job`` can never start on the nodes that are up, if so: it fits none of them, or it would
        fit only nodes that cannot start its user's jobs (``barred``)."""
        spec = job.spec
        nodes = self._candidate_nodes(job)
        why = why_never_fits(spec, nodes)
        if barred and (why is not None or not nodes):
            everywhere = self._candidate_nodes(job, barred=False)
            kept_off = [n for n in everywhere if n.name in barred]
            if kept_off and why_never_fits(spec, everywhere) is None:
                return why_kept_off(spec.user, spec.runtime.value, spec.image, kept_off)
        return None if why is None else (PendingReason.RESOURCES, f"no node that is up can run it: {why}")

    def _on_each_node(self, kind: str, job: Job, shape: tuple, compute, *extra) -> dict[str, object]:
        """``compute(node)`` for each of the job's nodes, by node name; remembered per node until it changes.

        One table per question and job shape: after a start, a preemption or a hold, a pass over
        a long queue recomputes the answer on the one or two nodes that changed, not on every node.
        """
        return self.memo.each_node((kind, shape, *extra), lambda: self._candidate_nodes(job), compute)

    # -- placing ----------------------------------------------------------------------

    def _best_nodes(self, job: Job, shape: tuple, **available) -> list[tuple[Node, SetChoice]] | None:
        """The best GPU set on each of the job's nodes, best nodes first; None if too few fit."""
        spec = job.spec
        if self.most_free < spec.gpus_per_node:
            return None  # no node has that many free GPUs, whatever else keeps the job off them
        flags = tuple(sorted(available.items()))
        key = ("place", shape, flags)
        current = self.memo.current
        if key in current:
            return current[key]
        choices = self._on_each_node("set", job, shape, lambda n: self._best_set_on(job, n, **available), flags)
        options = [(self.nodes[name], choice) for name, choice in choices.items() if choice is not None]
        options.sort(key=lambda o: (-o[1].score, o[1].loss, o[0].name))
        result = options[: spec.nodes] if len(options) >= spec.nodes else None
        current[key] = result
        return result

    def _best_set_on(self, job: Job, node: Node, **available) -> SetChoice | None:
        """The best GPU set for ``job`` on ``node``; a node without enough free GPUs is passed over at once."""
        k = job.spec.gpus_per_node
        if self.free[node.name].bit_count() < k:
            return None
        return best_set(node.topology, self._available(job, node, **available), k)

    def _place(self, job: Job, shape: tuple) -> Placement | None:
        chosen = self._best_nodes(job, shape)
        if chosen is None:
            return None
        return Placement(tuple(self._allocation(node, c.mask, c.score) for node, c in chosen))

    def _share(self, job: Job, problem: tuple | None) -> None:
        """Start a job that shares a GPU by memory where it fits (``labq.scheduler.sharing``), or let it wait: it
        preempts nobody and holds nothing, since freeing a whole GPU for part of one would waste the rest."""
        need = need_mib(job)
        best = None
        for node in self._candidate_nodes(job):
            if not node.shares:
                continue
            choice = join(node, self.joinable(job, node), self.declared.get(node.name, {}), need)
            if choice is None and self.free[node.name]:
                choice = open_one(node, self._available(job, node), need)
            if choice is not None and (best is None or choice.rank < best.rank):
                best = choice
        if best is not None and (self.book is None or self._queue_allows(job, int(best.opens), 0)):
            self._start(job, Placement((self._allocation(self.nodes[best.node], 1 << best.gpu, best.score),)))
            return
        if problem is not None:
            self._wait(job, *problem)
            return
        biggest = max((g.memory_mib for n in self.up for g in n.gpus), default=0)
        self._wait(job, PendingReason.RESOURCES, no_room(need, biggest))

    @staticmethod
    def _allocation(node: Node, mask: int, score: int) -> NodeAllocation:
        indices = mask_to_indices(mask)
        return NodeAllocation(node.name, indices, tuple(node.gpus[i].uuid for i in indices), score)

    def _start(self, job: Job, placement: Placement) -> None:
        for alloc in placement.allocations:
            mask = indices_to_mask(alloc.gpu_indices)
            self.free[alloc.node] &= ~mask
            self._take(job, alloc.node, mask)
            self.on_gpus[alloc.node].append(OnGpus(job, mask, self._end_of(job), False))
        self.in_use[job.user] = self.in_use.get(job.user, 0) + job.spec.gpus
        if job.spec.array_cap is not None:
            self.array_on_gpus[job.spec.array_id] = self.array_on_gpus.get(job.spec.array_id, 0) + 1
        if self.book is not None:
            self.book.take(job, job.spec.gpus)
        self.most_free = self._count_most_free()
        self.starts.append(Start(job.id, placement))
        self._changed(placement.nodes)

    # -- preempting -------------------------------------------------------------------

    def _preempt_for(self, job: Job, shape: tuple) -> bool:
        """Plan preemption for ``job`` (or keep waiting on one in flight); True if it now waits for that."""
        if not self.policy.preemption and job.id not in self.inflight:
            return False
        book = self.book
        mode = () if book is None else self._queue_mode(job)
        if (job.priority <= self.lowest_victim and job.id not in self.inflight and job.spec.reservation is None
                and not (mode and (mode[1] or mode[2] is not None))):
            return False  # no victim anywhere, no reservation or guarantee to reclaim: no node has a plan
        key = ("preempt", shape, job.priority, mode)
        if self.memo.current.get(key) is False:
            return False
        if mode and job.id not in self.inflight and job.spec.reservation is None and self._no_plan_for_any_queue(
                job, shape, mode):
            return False
        plans = self._on_each_node("plan", job, shape, lambda n: self._plan_on(job, n, mode), job.priority, mode)
        plans = [plan for plan in plans.values() if plan is not None]
        plans.sort(key=lambda p: p.cost)
        if len(plans) < job.spec.nodes or (book is not None and not self._plans_allowed(job, plans[: job.spec.nodes])):
            if job.id not in self.inflight:
                self.memo.current[key] = False
            return False
        plans = plans[: job.spec.nodes]
        early = all(self.nodes[p.node].hands_over for p in plans)
        grace = 0.0
        fresh: set[int] = set()
        touched = {p.node for p in plans}
        for plan in plans:
            for v in plan.victims:
                if v.job.id in self.victims:
                    continue
                self.victims.add(v.job.id)
                if book is not None:
                    book.leave(v.job, v.job.spec.gpus)
                for entry in self.on_gpus[plan.node]:
                    if entry.job.id == v.job.id:
                        entry.candidate = False
                grace = max(grace, v.job.spec.grace_s)
                fresh.add(v.job.id)
                touched.update(v.job.placement.nodes)
                self.preemptions.append(Preempt(v.job.id, job.id, plan.node, mask_to_indices(v.freeable),
                                                v.work_at_risk_s))
            if not early:
                self.holds[plan.node].append(Hold(job.id, job.priority, plan.target.mask, None))
        if early:
            self._hand_over(job, plans)
            self._changed(touched & self.nodes.keys())  # a victim's other nodes too: it is no candidate there now
            return True
        # the GPUs of jobs on their way out that no one was promised (``leaving``) are this job's from now on
        gone = {j.id: j for p in plans for mask, j in self.leaving[p.node] if mask & p.target.mask}
        if book is not None:
            book.promise(job, sum(v.freeable.bit_count() for p in plans for v in p.victims if v.job.id in fresh)
                         + sum((mask & p.target.mask).bit_count() for p in plans for mask, _ in self.leaving[p.node]))
        self.holds_made += 1
        self._changed(touched & self.nodes.keys())
        waiting = sorted(fresh | {victim for _, _, victim in self.inflight.get(job.id, [])}
                         | {i for i, j in gone.items() if j.state is JobState.PREEMPTING})
        stopping = sorted(i for i, j in gone.items() if j.state is not JobState.PREEMPTING)
        where = " and ".join(f"GPUs {_gpu_list(p.target.mask)} on {p.node}" for p in plans)
        said = [f"job {i} {_STOPPING.get(gone[i].stop_requested, 'is stopping')}" for i in stopping]
        if waiting or not said:
            said.insert(0, f"job{'s' if len(waiting) > 1 else ''} {', '.join(map(str, waiting))} "
                           f"{'are' if len(waiting) > 1 else 'is'} checkpointing")
        # waiting only for jobs that stop for their own reasons, it waits for GPUs like any job, on those GPUs
        self._wait(job, PendingReason.PREEMPTING if waiting else PendingReason.RESOURCES,
                   f"{'; '.join(said)}; then it runs on {where}", (waiting or stopping or [None])[0],
                   self.now + grace if fresh else None)
        return True

    def _hand_over(self, job: Job, plans: list[NodePlan]) -> None:
        """Start ``job`` now on GPUs its victims are still leaving, on nodes that hand jobs to a scheduler of their
        own (``Node.hands_over``: Slurm), which keeps it waiting until they are free and starts it the moment they
        are, where labq would otherwise hand it over only once it had heard they ended."""
        for plan in plans:
            mask = plan.target.mask
            self.leaving_mask[plan.node] &= ~mask
            self.leaving[plan.node] = [(m & ~mask, j) for m, j in self.leaving[plan.node] if m & ~mask]
        self._start(job, Placement(tuple(self._allocation(self.nodes[p.node], p.target.mask, p.target.score)
                                         for p in plans)))

    def _no_plan_for_any_queue(self, job: Job, shape: tuple, mode: tuple) -> bool:
        """No plan would make room for ``job`` even if every queue's rules let it take what the priority rules
        and the queues' surpluses allow: then none does for its own queue either. One answer for the jobs of
        every queue, where the plans themselves are per queue (a job takes its own queue's work)."""
        wide = (mode[2], mode[3])  # its overdue priority, and the queues' surpluses
        key = ("preempt-any", shape, job.priority, wide)
        current = self.memo.current
        answer = current.get(key)
        if answer is None:
            plans = self._on_each_node("plan-any", job, shape, lambda n: self._plan_any_on(job, n, wide),
                                       job.priority, wide)
            answer = current[key] = sum(plan is not None for plan in plans.values()) < job.spec.nodes
        return answer

    def _plan_any_on(self, job: Job, node: Node, wide: tuple) -> NodePlan | None:
        """The cheapest plan on ``node`` with every victim any queue's job of this priority might take."""
        end = self._end_of(job)
        blocked = self._held_against(job, node.name, end) | ~self._eligible_on(job, node)
        if self.reservation_list:
            blocked |= self._reserved_against(job, node.name, end, borrow=False)
        known = self.memo.on_node(node.name)
        key = ("plan-any", blocked, job.spec.gpus_per_node, job.priority, wide)
        plan = known.get(key, _UNKNOWN)
        if plan is _UNKNOWN:
            overdue, book, can = wide[0], self.book, self.policy.can_preempt
            candidates = [
                Victim(e.job, e.mask & ~blocked, e.job.work_at_risk(self.now))
                for e in self.on_gpus[node.name]
                if e.job.id not in self.victims and e.mask & ~blocked and (
                    (e.candidate and (can(job.priority, e.job.priority)
                                      or (overdue is not None and e.job.priority <= overdue)))
                    or (e.job.state is JobState.RUNNING and e.job.spec.preemptible and book.reclaimable(e.job)))]
            available = (self.free[node.name] | self.leaving_mask[node.name]) & ~blocked
            plan = known[key] = (None if not candidates and not available else
                                 plan_on_node(node.name, node.topology, available,
                                              job.spec.gpus_per_node, candidates))
        return plan

    def _plans_allowed(self, job: Job, plans: list[NodePlan]) -> bool:
        """Whether its queue lets ``job`` start as ``plans`` would have it (``_queue_allows``)."""
        book = self.book
        q = book.queue_of(job)
        free_used = sum((p.target.mask & self.free[p.node]).bit_count() for p in plans)
        taken: dict[str, int] = {}
        for v in {v.job.id: v for p in plans for v in p.victims if v.job.id not in self.victims}.values():
            vq = book.queue_of(v.job)
            taken[vq] = taken.get(vq, 0) + v.job.spec.gpus
        if any(n > book.surplus(vq) for vq, n in taken.items() if vq != q):
            return False  # together the plans would take another queue below its guarantee
        return self._queue_allows(job, free_used, taken.get(q, 0))

    def _plan_on(self, job: Job, node: Node, mode: tuple = ()) -> NodePlan | None:
        """The cheapest preemption on ``node`` that gives ``job`` its GPUs, or None.

        Jobs with no preemption in flight and no reservation of their own get the same plan
        when they ask as many GPUs at one priority and must keep off the same GPUs, whatever
        their time limits: one plan serves them all until the node changes.
        """
        end = self._end_of(job)
        blocked = self._held_against(job, node.name, end) | ~self._eligible_on(job, node)
        if self.reservation_list:
            blocked |= self._reserved_against(job, node.name, end, borrow=False)
        if job.id in self.inflight or job.spec.reservation:
            return self._plan_against(job, node, blocked, mode)
        known = self.memo.on_node(node.name)
        key = ("plan", blocked, job.spec.gpus_per_node, job.priority, mode)
        plan = known.get(key, _UNKNOWN)
        if plan is _UNKNOWN:
            plan = known[key] = self._plan_against(job, node, blocked, mode)
        return plan

    def _plan_against(self, job: Job, node: Node, blocked: int, mode: tuple = ()) -> NodePlan | None:
        available = self.free[node.name] & ~blocked
        for where, mask, _ in self.inflight.get(job.id, []):
            if where == node.name:
                available |= mask & ~blocked
        # GPUs that come back whatever happens: counted on after the free ones, before any victim (a job whose
        # preemption is in flight keeps to what it was promised)
        leaving = 0 if job.id in self.inflight else self.leaving_mask[node.name] & ~blocked
        if available.bit_count() < job.spec.gpus_per_node:
            available |= leaving
        else:
            leaving = 0
        may = self.policy.can_preempt
        own = self.reservations.get(job.spec.reservation) if job.spec.reservation else None
        reclaim = indices_to_mask(own.gpu_indices) if own is not None and own.node == node.name else 0
        candidates = [
            Victim(e.job, e.mask & ~blocked, e.job.work_at_risk(self.now))
            for e in self.on_gpus[node.name]
            if e.job.id not in self.victims and e.mask & ~blocked and (
                (e.candidate and (self._may_take(job, e.job, mode) if mode else may(job.priority, e.job.priority)))
                or (reclaim and self._borrower(e, own)) or (mode and self._reclaims(e, mode)))
        ]
        if not candidates and job.id not in self.inflight and not leaving:
            return None
        if not mode:
            return plan_on_node(node.name, node.topology, available, job.spec.gpus_per_node, candidates)
        # another queue gives up at most what it holds beyond its guarantee; a reclaim takes back what was lent
        # before its own queue's lower jobs are preempted
        book, q = self.book, mode[0]
        limits = {v.job.id: (vq, book.surplus(vq)) for v in candidates if (vq := book.queue_of(v.job)) != q}
        if mode[1] and limits:
            plan = plan_on_node(node.name, node.topology, available, job.spec.gpus_per_node,
                                [v for v in candidates if v.job.id in limits], limits)
            if plan is not None:
                return plan
        return plan_on_node(node.name, node.topology, available, job.spec.gpus_per_node, candidates, limits)

    def _may_take(self, job: Job, victim: Job, mode: tuple) -> bool:
        """Whom ``job`` may preempt by priority in a lab with queues: its own queue's lower jobs, other queues'
        only where they hold borrowed GPUs; once past its queue's maximum wait, jobs of its served priority too."""
        q, _, overdue, _ = mode
        book = self.book
        return ((self.policy.can_preempt(job.priority, victim.priority)
                 or (overdue is not None and victim.priority <= overdue))
                and (book.queue_of(victim) == q or book.reclaimable(victim)))

    def _reclaims(self, entry: OnGpus, mode: tuple) -> bool:
        """A reclaim: a job staying within its queue's guarantee may preempt another queue's borrowed work,
        whatever its priority and however short it has run."""
        q, reclaims, _, _ = mode
        victim = entry.job
        return (reclaims and victim.state is JobState.RUNNING and victim.spec.preemptible
                and self.book.queue_of(victim) != q and self.book.reclaimable(victim))

    # -- waiting ----------------------------------------------------------------------

    def _blocked(self, job: Job, shape: tuple, seen: int, also: str = "") -> None:
        reason, detail, waiting_for = self._why_blocked(job, shape)
        detail += also
        aging = self.policy.aging_s
        rank = job.priority if aging is None else served_priority(job, self.now, aging)
        if rank != job.priority:  # aged: `labq why` says so, in words that hold for every aged job of its shape
            detail += (f"; it has waited over {_span(aging)} (the aging wait), so it is served as {rank}, before "
                       "every low and normal job that has waited less")
        # nothing starves: aged jobs hold GPUs, loan or not, and as many again as the hold depth lets others
        aged = rank != job.priority
        if (reason in (PendingReason.RESOURCES, PendingReason.PRIORITY)
                and (self.aged_holds < self.policy.hold_depth if aged
                     else self.holds_made < self.policy.hold_depth and not self._would_borrow(job))):
            if aged:
                self.aged_holds += 1
            estimate = self._hold_future(job)
            if estimate is not None or self.memo.version != seen:
                self._wait(job, reason, detail, waiting_for, estimate)
                return
        if self._plain(job) and self.memo.version == seen:
            if self.book is not None:
                q = self.book.queue_of(job)
                rank = (rank, q, self.book.under(q))
            self.memo.settled[job.spec.resource_shape, shape[2], rank] = (reason, detail, waiting_for, None)
        self._wait(job, reason, detail, waiting_for)

    def _why_blocked(self, job: Job, shape: tuple) -> tuple[PendingReason, str, int | None]:
        spec = job.spec
        for node, choice in self._best_nodes(job, shape, holds=False) or ():
            holders = [h for h in self.holds[node.name]
                       if h.mask & choice.mask and h.job_id != job.id and h.binds(self._end_of(job))]
            if holders:
                ahead = min(holders, key=lambda h: (-h.priority, h.job_id))
                return (PendingReason.PRIORITY,
                        f"GPUs {_gpu_list(choice.mask & ahead.mask)} on {node.name} are held for job "
                        f"{ahead.job_id} ({priority_name(ahead.priority)}), which is ahead in the queue",
                        ahead.job_id)
        if self.reservation_list and self._best_nodes(job, shape, reservations=False) is not None:
            end = self._end_of(job)
            names = [f"{r.name}, " + (f"starts in {_span(r.start - self.now)}" if r.start > self.now
                                      else f"until {_span(r.end - self.now)} from now")
                     for r in sorted(self.reservation_list, key=lambda r: (r.start, r.name))
                     if r.name != spec.reservation and r.overlaps(self.now, end)]
            hint = ("a time limit (--time) that ends before the reservation lets it run" if spec.preemptible
                    else "a preemptible job may borrow reserved GPUs until they are needed")
            return (PendingReason.RESERVATION,
                    f"the free GPUs are reserved ({'; '.join(names)}) before this job would end; {hint}", None)
        most, where = 0, ""
        if self.most_free:  # else no node has a free GPU for any job
            # reserved GPUs are lent only while none of the reservation's jobs waits: a table for each such state
            counts = self._on_each_node("free", job, shape,
                                        lambda n: self._available(job, n).bit_count() if self.free[n.name] else 0,
                                        len(self.wanted))
            most, where = max(((count, name) for name, count in counts.items()), default=(0, ""))
        place = "one node" if spec.nodes == 1 else f"each of {spec.nodes} nodes"
        have = f"at most {most} free together, on {where}" if most else "none is free"
        outside = sorted((-len(n.unmanaged_busy), n.name) for n in self.up
                         if n.unmanaged_busy and spec.node in (None, n.name))
        if outside and not most:  # programs labq did not start, or a node its other scheduler took back (Slurm)
            have += "; busy outside labq: " + ", ".join(f"{-count} on {name}" for count, name in outside[:3])
        return PendingReason.RESOURCES, f"needs {spec.gpus_per_node} suitable GPUs on {place}; {have}", None

    def _hold_future(self, job: Job) -> float | None:
        """Hold the GPUs ``job`` gets soonest as running jobs end; return when, if known."""
        spec = job.spec
        shape = self._shape(job)
        options = self._on_each_node("future", job, shape, lambda n: self._soonest_on(job, n))
        options = [option for option in options.values() if option is not None]
        if len(options) < spec.nodes:
            return None
        options.sort()
        chosen = options[: spec.nodes]
        due = max(o[0] for o in chosen)
        for _, _, _, name, mask in chosen:
            self.holds[name].append(Hold(job.id, job.priority, mask, None if due == inf else due))
        self.holds_made += 1
        self._changed(name for *_, name, _ in chosen)
        return None if due == inf else due

    def _soonest_on(self, job: Job, node: Node) -> tuple | None:
        """The GPU set ``job`` gets soonest on ``node`` as its running jobs end: (when, -score, loss, node, mask)."""
        name = node.name
        blocked = ~self._eligible_on(job, node)
        if self.holds[name] or self.reservation_list:
            end = self._end_of(job)
            blocked |= self._held_against(job, name, end)
            if self.reservation_list:
                blocked |= self._reserved_against(job, name, end, borrow=False)
        known = self.memo.on_node(name)
        key = ("soonest", blocked, job.spec.gpus_per_node)
        option = known.get(key, _UNKNOWN)
        if option is _UNKNOWN:
            option = known[key] = self._soonest_set(node, blocked, job.spec.gpus_per_node)
        return option

    def _soonest_set(self, node: Node, blocked: int, k: int) -> tuple | None:
        """The first ``k``-GPU set outside ``blocked`` that ``node`` frees: shared by jobs of any time limit."""
        for when, have in self._freeing(node, blocked):
            if have.bit_count() >= k:  # best_set finds a set exactly when k GPUs are there
                choice = best_set(node.topology, have, k)
                return (when, -choice.score, choice.loss, node.name, choice.mask)
        return None

    def _freeing(self, node: Node, blocked: int) -> list[tuple[float, int]]:
        """The GPUs of ``node`` outside ``blocked`` that are free now, then as each running job ends.

        Steps of (when, GPUs), soonest first. They depend on the job only through the GPUs it
        must keep off, so jobs of every size and time limit share them until the node changes.
        """
        known = self.memo.on_node(node.name)
        key = ("freeing", blocked)
        steps = known.get(key)
        if steps is None:
            have = self.free[node.name] & ~blocked
            when = self.now
            steps = [(when, have)]
            for entry in sorted(self.on_gpus[node.name], key=lambda e: (e.end, e.job.id)):
                if entry.mask & ~blocked:
                    have |= entry.mask & ~blocked
                    when = max(when, entry.end)
                    steps.append((when, have))
            known[key] = steps
        return steps

    # -- gates before placement -------------------------------------------------------

    def _plain(self, job: Job) -> bool:
        """Nothing personal decides this job's fate: no reservation, no preemption in flight, no quota."""
        if job.spec.reservation is not None or job.id in self.inflight:
            return False
        if self.book is not None and (job.history or self._overdue(job)):
            return False  # a job preempted lately borrows later; an overdue one preempts more
        if self._quotas:
            quota = self.policy.quota_for(job.user)
            return quota is None or self.in_use.get(job.user, 0) + job.spec.gpus <= quota
        return True

    def _within_quota(self, job: Job) -> bool:
        quota = self.policy.quota_for(job.user)
        used = self.in_use.get(job.user, 0)
        if quota is None or used + job.spec.gpus <= quota:
            return True
        self._wait(job, PendingReason.QUOTA,
                   f"{job.user} holds {used} of a quota of {quota} GPUs; this job needs {job.spec.gpus}")
        return False

    def _dependencies_met(self, job: Job) -> bool:
        """``--after``: each job in depends_on has succeeded; ``--after-any``: each has ended, however."""
        any_end = job.spec.after_any
        for dep in job.spec.depends_on:
            state = self.states.get(dep)
            if state is JobState.SUCCEEDED or (any_end and state is not None and state.finished):
                continue
            if state is None:
                detail = f"depends on job {dep}, which does not exist; it can never start"
            elif state.finished:
                detail = f"depends on job {dep}, which ended {state.value}; it can never start"
            else:
                detail = f"waits for job {dep} ({state.value}) to {'end' if any_end else 'succeed'}"
            self._wait(job, PendingReason.DEPENDENCY, detail, dep)
            return False
        return True

    def _reservation_open(self, job: Job) -> bool:
        name = job.spec.reservation
        r = self.reservations.get(name)
        if r is None:
            detail = f"reservation {name!r} does not exist"
        elif not r.admits(job.user):
            detail = f"{job.user} may not use reservation {name!r} (booked by {r.owner})"
        elif self.now >= r.end:
            detail = f"reservation {name!r} has ended"
        elif r.node is None or not r.gpu_indices:
            detail = f"reservation {name!r} has no GPUs pinned yet"
        elif self.now < r.start:
            self._wait(job, PendingReason.RESERVATION, f"reservation {name!r} starts in {_span(r.start - self.now)}",
                       estimated_start=r.start)
            return False
        else:
            return True
        self._wait(job, PendingReason.RESERVATION, detail)
        return False


_UNKNOWN = object()

#: what a job that stops for its own reasons (``Job.stop_requested``) is doing, for ``labq why``
_STOPPING = {"cancel": "is being cancelled", "timeout": "is stopping at its time limit"}


def _gpu_list(mask: int) -> str:
    return ",".join(map(str, mask_to_indices(mask)))


def _span(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{max(minutes, 1)}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    return f"{hours // 24}d {hours % 24}h"
