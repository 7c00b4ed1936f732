"""Where a job starts: the best GPU set on each of its nodes, or a share of one GPU, and what a start takes.

Each node's best free set (``labq.scheduler.placement``) is kept per job shape and
asked again only on the nodes a start, preemption or hold changed; the best nodes win,
as many as the job needs. On a node that reports its CPUs and memory, a job needs
its share of those free too, and gets CPUs near its GPUs (``labq.scheduler.host``). A job that shares a GPU by memory joins one that sharing jobs
use, or opens a free one (``labq.scheduler.sharing``). A start takes its GPUs from the
lab as the rest of the pass sees it: from the free GPUs, for its user's quota, its
array's cap and its queue.
"""

from __future__ import annotations

from labq.models.decisions import PendingReason, Start
from labq.models.job import Job
from labq.models.node import Node
from labq.models.placement import NodeAllocation, Placement
from labq.models.sharing import need_mib
from labq.scheduler.guarantees import Guarantees
from labq.scheduler.host import HostNeed, best_near_set, choose_cpus, lacks_near, short_text
from labq.scheduler.lab_view import OnGpus
from labq.scheduler.placement import SetChoice, best_set, indices_to_mask, mask_to_indices
from labq.scheduler.sharing import join, no_room, open_one


class Starting(Guarantees):
    """Placing a job on free GPUs, and starting it there."""

    def _best_nodes(self, job: Job, shape: tuple, **available) -> list[tuple[Node, SetChoice]] | None:
        """The best GPU set on each of the job's nodes, best nodes first; None if too few fit. On nodes that report
        their CPUs and memory, only those with what the job needs there free (``_near_host``)."""
        spec = job.spec
        if self.most_free < spec.gpus_per_node:
            return None  # no node has that many free GPUs, whatever else keeps the job off them
        flags = tuple(sorted(available.items()))
        key = ("place", shape, flags)
        current = self.memo.current
        if key in current:
            return current[key]
        # by GPUs alone, one table for the jobs of a GPU shape whatever they ask of CPUs and memory
        choices = self._on_each_node("set", job, shape[:3], lambda n: self._best_set_on(job, n, **available), flags)
        options = [(self.nodes[name], choice) for name, choice in choices.items() if choice is not None]
        if self.sized:
            options = [(node, near) for node, choice in options
                       if (near := self._near_host(job, node, choice, available)) is not None]
        options.sort(key=lambda o: (-o[1].score, o[1].loss, o[0].name))
        result = options[: spec.nodes] if len(options) >= spec.nodes else None
        current[key] = result
        return result

    def _best_set_on(self, job: Job, node: Node, **available) -> SetChoice | None:
        """The best GPU set for ``job`` on ``node`` by GPUs alone; a node without enough free GPUs is passed over at
        once."""
        k = job.spec.gpus_per_node
        if self.free[node.name].bit_count() < k:
            return None
        return best_set(node.topology, self._available(job, node, **available), k)

    def _near_host(self, job: Job, node: Node, choice: SetChoice, available: dict) -> SetChoice | None:
        """``choice`` on ``node`` if the CPUs and memory ``job`` needs there are free, else None; where a GPU of it
        has a NUMA node without free CPUs for the job, the best set of GPUs whose NUMA nodes have them, if any
        (``labq.scheduler.host.best_near_set``)."""
        need = self._need(job, node)
        if need is None:
            return choice
        if not self._host_room(node.name, need):
            self.host_mattered = True
            return None
        free_cpus = self.free_cpus.get(node.name)
        k = job.spec.gpus_per_node
        if free_cpus is None or not lacks_near(node, choice.mask, free_cpus, need, k):
            return choice
        near, other = best_near_set(node, self._available(job, node, **available), k, need, free_cpus)
        if other:
            self.host_mattered = True  # another set than by GPUs alone
        return near

    def _place(self, job: Job, shape: tuple) -> Placement | None:
        chosen = self._best_nodes(job, shape)
        if chosen is None:
            return None
        return Placement(tuple(self._allocation(node, c.mask, c.score, job) for node, c in chosen))

    def _share(self, job: Job, problem: tuple | None) -> None:
        """Start a job that shares a GPU by memory where it fits (``labq.scheduler.sharing``), or let it wait: it
        preempts nobody and holds nothing, since freeing a whole GPU for part of one would waste the rest."""
        need = need_mib(job)
        best = short = None
        for node in self._candidate_nodes(job):
            if not node.shares:
                continue
            choice = join(node, self.joinable(job, node), self.declared.get(node.name, {}), need)
            if choice is None and self.free[node.name]:
                choice = open_one(node, self._available(job, node), need)
            if choice is not None and self.sized:  # a GPU with room, on a node without the CPUs or memory for it
                host = self._need(job, node)
                if host is not None and not self._host_room(node.name, host):
                    self.host_mattered = True
                    short = short or self._short(node, host)
                    continue
            if choice is not None and (best is None or choice.rank < best.rank):
                best = choice
        if best is not None and (self.book is None or self._queue_allows(job, int(best.opens), 0)):
            self._start(job, Placement((self._allocation(self.nodes[best.node], 1 << best.gpu, best.score, job),)))
            return
        if problem is not None:
            self._wait(job, *problem)
            return
        if short is not None:
            self._wait(job, PendingReason.RESOURCES, short)
            return
        biggest = max((g.memory_mib for n in self.up for g in n.gpus), default=0)
        self._wait(job, PendingReason.RESOURCES, no_room(need, biggest))

    def _short(self, node: Node, need: HostNeed, nodes: int = 1) -> str | None:
        """What ``node`` lacks of CPUs and memory for ``need`` now, as a reason says it."""
        return short_text(need, self.free_cpus.get(node.name), self.free_memory.get(node.name), node.name, nodes)

    def _allocation(self, node: Node, mask: int, score: int, job: Job | None = None, cpus: int = 0) -> NodeAllocation:
        """GPUs ``mask`` of ``node``, and for ``job`` the CPUs and memory it needs there, where the node reports
        them: its CPUs near those GPUs where free (``labq.scheduler.host``), from the free ones and ``cpus``."""
        indices = mask_to_indices(mask)
        uuids = tuple(node.gpus[i].uuid for i in indices)
        need = self._need(job, node) if job is not None and self.sized else None
        if need is None:
            return NodeAllocation(node.name, indices, uuids, score)
        cpu_set, far = (), 0
        free = self.free_cpus.get(node.name)
        if free is not None:
            chosen = choose_cpus(node, mask, need.count, free | cpus)
            if chosen is not None:
                cpu_set, far = mask_to_indices(chosen[0]), chosen[1]
        return NodeAllocation(node.name, indices, uuids, score, cpu_set, need.cores, need.memory_mib, far)

    def _start(self, job: Job, placement: Placement) -> None:
        for alloc in placement.allocations:
            mask = indices_to_mask(alloc.gpu_indices)
            self.free[alloc.node] &= ~mask
            self._take(job, alloc.node, mask)
            entry = OnGpus(job, mask, self._end_of(job), False)
            if self.sized:
                self._hold_host(entry, alloc.node, alloc)
            self.on_gpus[alloc.node].append(entry)
        self.in_use[job.user] = self.in_use.get(job.user, 0) + job.spec.gpus
        if job.spec.array_cap is not None:
            self.array_on_gpus[job.spec.array_id] = self.array_on_gpus.get(job.spec.array_id, 0) + 1
        if self.book is not None:
            self.book.take(job, job.spec.gpus)
        self.most_free = self._count_most_free()
        self.starts.append(Start(job.id, placement))
        self._changed(placement.nodes)
