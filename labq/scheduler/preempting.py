"""Preemption in a pass: whom a job that cannot start preempts, on which nodes, and what it then waits for.

On each node the cheapest set of victims is ``plan_on_node``'s (``labq.scheduler.preemption``);
this part says who may be a victim there (lower priority, past its minimum run; in a lab
with queues, its own queue's jobs or other queues' borrowed work; a reservation's
borrowers for the reservation's jobs), picks the cheapest nodes, and records the
preemptions. The preemptor holds the GPUs being freed and waits while its victims
checkpoint, or, on nodes whose own scheduler starts jobs (Slurm), starts on them at
once. GPUs that jobs on their way out give back anyway are counted on before anyone is
preempted. Before a reservation starts, borrowers on its GPUs are preempted in time.
"""

from __future__ import annotations

from labq.models.decisions import PendingReason, Preempt
from labq.models.job import Job, JobState
from labq.models.node import Node
from labq.models.placement import Placement
from labq.scheduler.lab_view import Hold, OnGpus
from labq.scheduler.memo import UNKNOWN
from labq.scheduler.placement import indices_to_mask, mask_to_indices
from labq.scheduler.preemption import NodePlan, Victim, plan_on_node
from labq.scheduler.starting import Starting
from labq.scheduler.verdicts import gpu_list

#: what a job that stops for its own reasons (``Job.stop_requested``) is doing, for ``labq why``
_STOPPING = {"cancel": "is being cancelled", "timeout": "is stopping at its time limit"}


class Preempting(Starting):
    """Making room for a job by preempting others, and holding the GPUs they free for it."""

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
        # by GPUs alone, one table for the jobs of a GPU shape; then only where the CPUs and memory will be there too
        plans = self._on_each_node("plan", job, shape[:3], lambda n: self._plan_on(job, n, mode), job.priority, mode)
        plans = [plan for plan in plans.values() if plan is not None]
        if self.sized:
            plans = [plan for plan in plans if self._with_host(job, self.nodes[plan.node], plan) is not None]
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
        where = " and ".join(f"GPUs {gpu_list(p.target.mask)} on {p.node}" for p in plans)
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
        self._start(job, Placement(tuple(self._allocation(self.nodes[p.node], p.target.mask, p.target.score, job,
                                                          self._freed_host(job, p)[0])
                                         for p in plans)))

    def _freed_host(self, job: Job, plan: NodePlan) -> tuple[int, int]:
        """The CPUs (a mask) and memory that come back on ``plan``'s node once its victims, the victims already
        leaving for ``job`` and the jobs on their way out anyway have left."""
        name = plan.node
        leaving = {v.job.id for v in plan.victims} | {j.id for _, j in self.leaving[name]}
        leaving.update(victim for where, _, victim in self.inflight.get(job.id, ()) if where == name)
        cpus = memory = 0
        for entry in self.on_gpus[name]:
            if entry.job.id in leaving:
                cpus |= entry.cpus
                memory += entry.memory_mib
        return cpus, memory

    def _with_host(self, job: Job, node: Node, plan: NodePlan | None) -> NodePlan | None:
        """``plan``, if the CPUs and memory free on its node once it is done hold what ``job`` needs there: no job
        is preempted for GPUs it could not start on for want of CPUs or memory."""
        if plan is None or not self.sized:
            return plan
        need = self._need(job, node)
        if need is None or self._host_room(node.name, need) or self._host_room(node.name, need,
                                                                               *self._freed_host(job, plan)):
            return plan
        self.host_mattered = True
        return None

    def _no_plan_for_any_queue(self, job: Job, shape: tuple, mode: tuple) -> bool:
        """No plan would make room for ``job`` even if every queue's rules let it take what the priority rules
        and the queues' surpluses allow: then none does for its own queue either. One answer for the jobs of
        every queue, where the plans themselves are per queue (a job takes its own queue's work)."""
        wide = (mode[2], mode[3])  # its overdue priority, and the queues' surpluses
        key = ("preempt-any", shape, job.priority, wide)
        current = self.memo.current
        answer = current.get(key)
        if answer is None:
            plans = self._on_each_node("plan-any", job, shape[:3], lambda n: self._plan_any_on(job, n, wide),
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
        plan = known.get(key, UNKNOWN)
        if plan is UNKNOWN:
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
        plan = known.get(key, UNKNOWN)
        if plan is UNKNOWN:
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
