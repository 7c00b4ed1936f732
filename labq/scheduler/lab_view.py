"""The lab as one scheduling pass sees it, and what a job may use of it.

A pass starts from the lab's state: which jobs are on which GPUs (and which of
them may be preempted), which GPUs are free, held for a job ahead in the queue,
or reserved. ``LabView`` builds that picture and answers the questions the
rules of the pass (``labq.scheduler.cycle`` and its parts) ask of it: the GPUs a
job may use on a node, those holds and reservations keep from it, the nodes it
may run on. What the pass has worked out from it is kept in a ``NodeMemo``, by
job shape and node, until a change makes it stale.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from math import inf

from labq.models.job import Job, JobState
from labq.models.node import Node
from labq.models.reservation import Reservation
from labq.models.sharing import need_mib
from labq.scheduler.fit import eligible_mask, gpu_matches
from labq.scheduler.host import HostNeed, need_on, needs_known
from labq.scheduler.memo import NodeMemo
from labq.scheduler.placement import best_set, indices_to_mask
from labq.scheduler.policy import Policy, order_queue
from labq.scheduler.queues import QueueBook, lab_gpus

_QUEUED, _HELD, _RUNNING, _PREEMPTING = JobState.QUEUED, JobState.HELD, JobState.RUNNING, JobState.PREEMPTING
_ON_GPUS = frozenset(state for state in JobState if state.holds_gpus)


@dataclass(frozen=True)
class Hold:
    job_id: int
    priority: int
    mask: int
    #: when the GPUs are due to the holder; None when no time limit tells
    due: float | None

    def binds(self, job_end: float) -> bool:
        """Whether a job ending at ``job_end`` must keep off these GPUs."""
        return self.due is None or job_end > self.due


@dataclass(slots=True)
class OnGpus:
    """A job occupying GPUs on one node, as the pass sees it."""

    job: Job
    mask: int
    end: float  #: expected end by time limit; inf when unknown
    candidate: bool  #: may be preempted in this pass
    cpus: int = 0  #: the CPUs it holds on this node (a mask), where the node reports its CPUs
    memory_mib: int = 0  #: the memory it holds on this node, where the node reports its memory


@dataclass
class LabView:
    """Who is on which GPUs, what is free, held and reserved: the state a pass starts from and changes."""

    jobs: list[Job]
    node_list: list[Node]
    reservation_list: list[Reservation]
    usage: Mapping[str, float]
    policy: Policy
    now: float
    finished: Mapping[int, JobState]

    def __post_init__(self) -> None:
        self.nodes = {n.name: n for n in sorted(self.node_list, key=lambda n: n.name)}
        self.up = [n for n in self.nodes.values() if n.schedulable and n.gpus]
        self.free = {n.name: ((1 << n.gpu_count) - 1) & ~indices_to_mask(n.unmanaged_busy) for n in self.nodes.values()}
        self.on_gpus: dict[str, list[OnGpus]] = {name: [] for name in self.nodes}
        self.in_use: dict[str, int] = {}
        self.holds: dict[str, list[Hold]] = {name: [] for name in self.nodes}
        #: jobs on their way out of their GPUs whatever the pass decides: preempted, or stopping (cancelled, at their
        #: time limit); no job takes them as victims, and they count for no queue
        self.victims: set[int] = set()
        self.inflight: dict[int, list[tuple[str, int, int]]] = {}  # preemptor -> (node, mask, victim)
        self.reservations = {r.name: r for r in self.reservation_list}
        self.reservations_on: dict[str, list[Reservation]] = {}
        for r in self.reservation_list:
            self.reservations_on.setdefault(r.node, []).append(r)
        #: GPUs reservations keep from jobs, by question: forgotten when ``wanted`` grows
        self._reserved_memo: dict = {}
        #: active reservations with jobs of their own still waiting: their GPUs are lent to no one
        self.wanted: set[str] = set()
        #: what the pass has worked out, kept until a start, preemption or hold makes it stale
        self.memo: NodeMemo[Node] = NodeMemo(self.nodes)
        self.holds_made = 0
        self.aged_holds = 0  #: holds for jobs that have aged: a budget of their own
        self._quotas = self.policy.max_gpus_per_user is not None or bool(self.policy.user_gpu_quota)
        #: no job of this priority or lower finds a victim on any node (candidates only drop out in a pass)
        self.lowest_victim: float = inf
        #: the lab's queues (teams): None in a lab without them
        self.lab_gpus = lab_gpus(self.up)
        self.book = QueueBook.of(self.policy.queues, self.lab_gpus)
        self._up_names = frozenset(n.name for n in self.up)
        self.queued: list[Job] = []
        self.held: list[Job] = []
        #: by array id, how many of its tasks hold GPUs (``%N`` caps it); only arrays that have a cap
        self.array_on_gpus: dict[int, int] = {}
        #: by node: the GPUs jobs have to themselves (never shared), and per shared GPU the memory its sharing
        #: jobs are placed by and how many there are (``labq.models.sharing``)
        self.whole: dict[str, int] = dict.fromkeys(self.nodes, 0)
        self.declared: dict[str, dict[int, int]] = {}
        self.sharers: dict[str, dict[int, int]] = {}
        #: by node that reports them, its free CPUs (a mask) and free memory (MiB) (``labq.scheduler.host``); a lab
        #: whose nodes report none (agents of an older labq) is placed by GPUs alone, and ``sized`` is False
        self.free_cpus: dict[str, int] = {}
        self.free_memory: dict[str, int] = {}
        for node in self.nodes.values():
            if node.cpus:
                self.free_cpus[node.name] = node.cpu_mask
            if node.memory_mib is not None:
                self.free_memory[node.name] = node.memory_mib
        self.sized = bool(self.free_cpus or self.free_memory)
        #: the fewest CPUs and the least memory a node that says has: a job asking no more fits each of them
        self.fewest_cpus = min((len(n.cpus) for n in self.up if n.cpus), default=inf)
        self.least_memory = min((n.memory_mib for n in self.up if n.memory_mib is not None), default=inf)
        #: by node that reports either, what jobs of each shape need there under this policy (kept across passes)
        self.needs: dict[str, dict] = {}
        if self.sized:
            defaults = (self.policy.cpus_per_gpu, self.policy.mem_per_gpu_mib)
            self.needs = {name: needs_known(self.nodes[name], defaults)
                          for name in self.free_cpus.keys() | self.free_memory.keys()}
        #: the CPUs or memory of some node changed a decision of this pass (a node passed over for want of them, a
        #: preemption plan dropped, a set chosen or a hold made otherwise than by GPUs alone): until then every
        #: job waits as it would by GPUs alone, and jobs that differ only in what they ask of those share verdicts
        self.host_mattered = False
        for job in self.jobs:
            state = job.state
            if state is _QUEUED:
                self.queued.append(job)
            elif state is _HELD:
                self.held.append(job)
            elif state in _ON_GPUS and job.placement is not None:
                self._occupy(job)
                if job.spec.array_cap is not None:
                    self.array_on_gpus[job.spec.array_id] = self.array_on_gpus.get(job.spec.array_id, 0) + 1
        if self.sharers:
            self._alone_on_shared_gpus()
        self.most_free = self._count_most_free()
        if self.book is not None:
            self._count_on_one_node()
        #: some node that is up keeps some jobs off: a user it has no account for, or a problem of its own
        self.barring = any(n.problems or any(a.problem for a in n.accounts) for n in self.up)
        self._barred: dict[tuple, frozenset[str]] = {}
        if self.inflight:
            queued = {j.id: j for j in self.queued}
            self.inflight = {i: where for i, where in self.inflight.items() if i in queued}
            for preemptor in order_queue((queued[i] for i in self.inflight), self.usage, self.now,
                                         self.policy.aging_s):
                self._hold_inflight_target(preemptor)
        #: by node, (GPUs, job) for each job on its way out that no waiting job was promised: a job stopping for its
        #: own reasons, or a victim whose preemptor no longer waits (it started elsewhere, was cancelled or held).
        #: Those GPUs come back whatever a pass decides, so a job that needs GPUs counts on them before it preempts
        self.leaving: dict[str, list[tuple[int, Job]]] = {name: [] for name in self.nodes}
        self.leaving_mask: dict[str, int] = dict.fromkeys(self.nodes, 0)
        if self.victims:
            promised = {victim for where in self.inflight.values() for _, _, victim in where}
            for name, entries in self.on_gpus.items():
                # not the GPUs a job that stays has taken already (one handed over early: ``Node.hands_over``)
                kept = 0
                for e in entries:
                    if e.job.id not in self.victims:
                        kept |= e.mask
                for e in entries:
                    if e.job.id in self.victims and e.job.id not in promised and e.mask & ~kept:
                        self.leaving[name].append((e.mask & ~kept, e.job))
                        self.leaving_mask[name] |= e.mask & ~kept

    def _occupy(self, job: Job) -> None:
        """Enter a job that holds GPUs: its GPUs are taken, and it may be a victim or a preemption in flight."""
        spec = job.spec
        self.in_use[spec.user] = self.in_use.get(spec.user, 0) + spec.gpus
        preempting = job.state is _PREEMPTING
        leaving = preempting or job.stop_requested is not None
        if leaving:
            self.victims.add(job.id)
        end = job.expected_end() or inf
        candidate = self._preemptible(job)
        book = self.book
        for alloc in job.placement.allocations:
            name = alloc.node
            if name not in self.nodes:
                continue
            mask = indices_to_mask(alloc.gpu_indices)
            if book is not None and not leaving and name in self._up_names:
                book.take(job, len(alloc.gpu_indices))  # a job on its way out no longer counts for its queue
            self.free[name] &= ~mask
            self._take(job, name, mask)
            entry = OnGpus(job, mask, end, candidate)
            if self.sized:
                self._hold_host(entry, name, alloc)
            self.on_gpus[name].append(entry)
            if candidate and spec.priority < self.lowest_victim:
                self.lowest_victim = spec.priority
            if preempting and job.preempted_for is not None:
                self.inflight.setdefault(job.preempted_for, []).append((name, mask, job.id))

    def _hold_host(self, entry: OnGpus, node: str, alloc) -> None:
        """The CPUs and memory ``alloc`` holds on ``node`` are not free (as far as the node reports them)."""
        if alloc.cpu_set and node in self.free_cpus:
            entry.cpus = alloc.cpu_mask
            self.free_cpus[node] &= ~entry.cpus
        if alloc.memory_mib and node in self.free_memory:
            entry.memory_mib = alloc.memory_mib
            self.free_memory[node] -= alloc.memory_mib

    def _need(self, job: Job, node: Node) -> HostNeed | None:
        """What ``job`` needs of ``node``'s CPUs and memory; None where the node reports neither."""
        known = self.needs.get(node.name)
        if known is None:
            return None
        spec = job.spec
        if spec.share_mib is not None:  # by the part of the GPU it shares: the first that suits it
            gpu = next((g for g in node.gpus if gpu_matches(spec, g.model, g.memory_mib)), node.gpus[0])
            return need_on(spec, node, self.policy, min(1.0, need_mib(job) / max(1, gpu.memory_mib)))
        key = (spec.resource_shape, spec.cpus, spec.memory_mib)
        need = known.get(key)
        if need is None:
            need = known[key] = need_on(spec, node, self.policy)
        return need

    def _host_room(self, name: str, need: HostNeed, cpus: int = 0, memory_mib: int = 0) -> bool:
        """Whether ``name``'s free CPUs and memory, with ``cpus`` (a mask) and ``memory_mib`` more, hold ``need``."""
        free = self.free_cpus.get(name)
        memory = self.free_memory.get(name)
        return ((free is None or (free | cpus).bit_count() >= need.count)
                and (memory is None or need.memory_mib is None or memory + memory_mib >= need.memory_mib))

    def _take(self, job: Job, node: str, mask: int) -> None:
        """``job`` is on GPUs ``mask`` of ``node``: to itself, or sharing one by memory."""
        if job.spec.share_mib is None:
            self.whole[node] |= mask
            return
        declared = self.declared.setdefault(node, {})
        sharers = self.sharers.setdefault(node, {})
        for gpu in range(mask.bit_length()):
            if mask >> gpu & 1:
                declared[gpu] = declared.get(gpu, 0) + need_mib(job)
                sharers[gpu] = sharers.get(gpu, 0) + 1

    def _alone_on_shared_gpus(self) -> None:
        """A sharing job is a preemption candidate only alone on its GPU: preempting one of several frees nothing."""
        for name, counts in self.sharers.items():
            crowded = indices_to_mask(gpu for gpu, n in counts.items() if n > 1)
            if crowded:
                for entry in self.on_gpus[name]:
                    if entry.candidate and entry.mask & crowded:
                        entry.candidate = False

    def joinable(self, job: Job, node: Node) -> int:
        """GPUs of ``node`` a sharing job may join: used by sharing jobs or outside labq, by no job to itself, of
        the model it asks for, and kept from it by no hold or reservation."""
        spec = job.spec
        if spec.node is not None and spec.node != node.name:
            return 0
        taken = ((1 << node.gpu_count) - 1) & ~self.free[node.name] & ~self.whole[node.name]
        mask = 0
        for gpu in range(taken.bit_length()):
            if taken >> gpu & 1 and gpu_matches(spec, node.gpus[gpu].model, node.gpus[gpu].memory_mib):
                mask |= 1 << gpu
        if not mask:
            return 0
        end = self._end_of(job)
        mask &= ~self._held_against(job, node.name, end)
        if self.reservation_list:
            mask &= ~self._reserved_against(job, node.name, end)
        return mask

    @cached_property
    def states(self) -> dict[int, JobState]:
        """Every job's state, for dependencies: built only when a job has some."""
        return {**self.finished, **{j.id: j.state for j in self.jobs}}

    def _hold_inflight_target(self, job: Job) -> None:
        """Keep what an earlier pass promised a preemptor: its victims' GPUs and the free ones that complete its set."""
        for name in sorted({where for where, _, _ in self.inflight[job.id]}):
            node = self.nodes[name]
            freeing = 0
            for where, mask, _ in self.inflight[job.id]:
                if where == name:
                    freeing |= mask
            usable = self._available(job, node) if node.schedulable and name not in self.barred_nodes(job) else 0
            # not the GPUs freed for another job whose victims are done: they are that job's to start on
            usable &= ~self._freed_for_others(job.id, name)
            target = best_set(node.topology, usable | freeing, job.spec.gpus_per_node)
            self.holds[name].append(Hold(job.id, job.priority, target.mask if target else freeing, None))
        if self.book is not None:  # so its queue reclaims no more for it
            self.book.promise(job, sum(mask.bit_count() for _, mask, _ in self.inflight[job.id]))

    @cached_property
    def _freed(self) -> dict[tuple[str, int], int]:
        """(node, job) -> GPUs on that node that victims have freed for a job that still waits to start."""
        waiting = {j.id for j in self.queued}
        freed: dict[tuple[str, int], int] = {}
        for j in self.queued:
            last = j.history[-1] if j.history else None
            if last is not None and last.preempted_for in waiting and last.placement is not None:
                for a in last.placement.allocations:
                    key = (a.node, last.preempted_for)
                    freed[key] = freed.get(key, 0) | indices_to_mask(a.gpu_indices)
        return freed

    def _freed_for_others(self, job_id: int, node: str) -> int:
        """GPUs free on ``node`` that victims freed for another job than ``job_id``, which still waits."""
        mask = 0
        for (where, for_job), gpus in self._freed.items():
            if where == node and for_job != job_id:
                mask |= gpus
        return mask & self.free.get(node, 0)

    def _count_on_one_node(self) -> None:
        """The most GPUs each queue's jobs hold on one node (``QueueBook.surplus_key``)."""
        book, most = self.book, self.book.on_one_node
        for name, entries in self.on_gpus.items():
            here: dict[str, int] = {}
            for e in entries:
                q = book.queue_of(e.job)
                here[q] = here.get(q, 0) + e.mask.bit_count()
            for q, n in here.items():
                most[q] = max(most.get(q, 0), n)

    def _count_most_free(self) -> int:
        """The most free GPUs on one node that is up: no job needing more per node fits anywhere.

        GPUs only get taken during a pass, so this bound stays true until the next start recounts it.
        """
        return max((self.free[n.name].bit_count() for n in self.up), default=0)

    def _preemptible(self, job: Job) -> bool:
        return (
            self.policy.preemption
            and job.state is _RUNNING
            and job.stop_requested is None
            and job.spec.preemptible
            and job.started_at is not None
            and self.now - job.started_at >= self.policy.min_runtime_s
            and not self.policy.preempted_enough(job, self.now)
        )

    # -- what a job may use ---------------------------------------------------------

    def _end_of(self, job: Job) -> float:
        limit = job.spec.time_limit_s
        return self.now + limit if limit is not None else inf

    def _candidate_nodes(self, job: Job, *, barred: bool = True) -> list[Node]:
        """The nodes that are up where ``job`` may run; with ``barred=False`` also those that cannot start
        its user's jobs now (``barred_nodes``)."""
        spec = job.spec
        if spec.reservation is not None:
            pinned = self.reservations[spec.reservation].node
            nodes = [n for n in self.up if n.name == pinned]
        elif spec.node is not None:
            nodes = [n for n in self.up if n.name == spec.node]
        else:
            nodes = self.up
        kept_off = self.barred_nodes(job) if barred else frozenset()
        return [n for n in nodes if n.name not in kept_off] if kept_off else nodes

    def barred_nodes(self, job: Job) -> frozenset[str]:
        """The nodes that are up but cannot start ``job`` now: no account for its user there, or a problem
        of the node's own that concerns it (its runtime, its image). Empty for most jobs.

        Jobs of the same shape share verdicts only when the same nodes keep them off, so a job of a
        user without an account on a node never takes the verdict of another user's job, or gives it.
        """
        if not self.barring:
            return frozenset()
        spec = job.spec
        key = (spec.user, spec.runtime.value, spec.image)
        barred = self._barred.get(key)
        if barred is None:
            barred = self._barred[key] = frozenset(n.name for n in self.up if n.refuses(*key) is not None)
        return barred

    def _eligible_on(self, job: Job, node: Node) -> int:
        spec = job.spec
        key = ("eligible", node.name, spec.node, spec.min_gpu_memory_mib, spec.gpu_model)
        lasting = self.memo.lasting
        mask = lasting.get(key)
        if mask is None:
            mask = lasting[key] = eligible_mask(spec, node)
        return mask

    def _held_against(self, job: Job, node: str, end: float) -> int:
        mask = 0
        for hold in self.holds[node]:
            if hold.job_id != job.id and hold.binds(end):
                mask |= hold.mask
        return mask

    def _reserved_against(self, job: Job, node: str, end: float, *, borrow: bool = True) -> int:
        """GPUs on ``node`` that reservations keep from this job over its run.

        A job that names a reservation keeps to its GPUs. Other jobs keep off reserved
        GPUs unless they end before the start, or (with ``borrow``) they are preemptible:
        those borrow idle reserved GPUs (before the start only when they get some time
        before the signal that frees the GPUs, and never while a job of the reservation
        waits), and give them back when the reservation needs them. Borrowing is for
        free GPUs only: no job preempts, or holds GPUs, to borrow.
        """
        spec = job.spec
        lends = borrow and spec.preemptible and self.policy.preemption
        key = (node, spec.reservation, lends, spec.grace_s, end)
        mask = self._reserved_memo.get(key)
        if mask is not None:
            return mask
        mask = 0
        own = spec.reservation
        for r in self.reservations_on.get(node, ()):
            if r.name == own:
                mask |= ((1 << self.nodes[node].gpu_count) - 1) & ~indices_to_mask(r.gpu_indices)
            elif r.overlaps(self.now, end) and not (lends and r.name not in self.wanted and (
                    self.now >= r.start or self.now < r.start - spec.grace_s)):
                mask |= indices_to_mask(r.gpu_indices)
        self._reserved_memo[key] = mask
        return mask

    def _available(self, job: Job, node: Node, *, holds: bool = True, reservations: bool = True) -> int:
        end = self._end_of(job)
        mask = self.free[node.name] & self._eligible_on(job, node)
        if holds:
            mask &= ~self._held_against(job, node.name, end)
        if reservations and self.reservation_list:
            mask &= ~self._reserved_against(job, node.name, end)
        return mask

    @staticmethod
    def _borrower(entry: OnGpus, r: Reservation) -> bool:
        """A job on a reservation's GPUs that is not one of its own: it gives them back on demand."""
        job = entry.job
        return (job.state is JobState.RUNNING and job.spec.preemptible and job.spec.reservation != r.name
                and bool(entry.mask & indices_to_mask(r.gpu_indices)))

    # -- what the pass has worked out -----------------------------------------------

    def _shape(self, job: Job) -> tuple:
        """Everything a job's placement depends on besides its priority and the state of the nodes."""
        personal = job.id if job.id in self.inflight else None
        spec = job.spec
        if not self.sized:  # no node says what CPUs or memory it has: they place nothing
            return (spec.resource_shape, personal, self.barred_nodes(job))
        return (spec.resource_shape, personal, self.barred_nodes(job), spec.cpus, spec.memory_mib)

    def _on_each_node(self, kind: str, job: Job, shape: tuple, compute, *extra) -> dict[str, object]:
        """``compute(node)`` for each of the job's nodes, by node name; remembered per node until it changes.

        One table per question and job shape: after a start, a preemption or a hold, a pass over
        a long queue recomputes the answer on the one or two nodes that changed, not on every node.
        """
        return self.memo.each_node((kind, shape, *extra), lambda: self._candidate_nodes(job), compute)

    def _changed(self, nodes: Iterable[str]) -> None:
        """A start, preemption or hold changed ``nodes``: what the memo knows of them is stale."""
        self.memo.changed(nodes)
