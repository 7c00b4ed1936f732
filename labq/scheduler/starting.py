"""Where a job starts: the best GPU set on each of its nodes, or a share of one GPU, and what a start takes.

Each node's best free set (``labq.scheduler.placement``) is kept per job shape and
asked again only on the nodes a start, preemption or hold changed; the best nodes win,
as many as the job needs. A job that shares a GPU by memory joins one that sharing jobs
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
from labq.scheduler.lab_view import OnGpus
from labq.scheduler.placement import SetChoice, best_set, indices_to_mask, mask_to_indices
from labq.scheduler.sharing import join, no_room, open_one


class Starting(Guarantees):
    """Placing a job on free GPUs, and starting it there."""

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
