"""A job that can neither start nor preempt: why it waits, and the GPUs it holds so others backfill around it.

A waiting job near the top of the queue holds the GPUs it gets soonest as running jobs
end by their time limits (as many jobs as the policy's hold depth, and as many again
for jobs that have aged), so a lower job starts on them only if it ends before they are
due: it backfills without delaying the job ahead. The reason a job waits names what
stands in its way: GPUs held for a job ahead, a reservation, or too few suitable GPUs.
A plain job's reason is the verdict of every job of its shape and priority while
nothing changes.
"""

from __future__ import annotations

from math import inf

from labq.models.decisions import PendingReason
from labq.models.job import Job
from labq.models.node import Node
from labq.models.priority import priority_name
from labq.scheduler.gates import Gates
from labq.scheduler.host import HostNeed
from labq.scheduler.lab_view import Hold
from labq.scheduler.memo import BY_GPUS, UNKNOWN
from labq.scheduler.placement import best_set
from labq.scheduler.policy import served_priority
from labq.scheduler.starting import Starting
from labq.scheduler.verdicts import gpu_list, span


class Backfill(Starting, Gates):
    """Saying why a job waits, and holding GPUs for it as they free."""

    def _blocked(self, job: Job, shape: tuple, seen: int, also: str = "") -> None:
        reason, detail, waiting_for = self._why_blocked(job, shape)
        detail += also
        aging = self.policy.aging_s
        rank = job.priority if aging is None else served_priority(job, self.now, aging)
        if rank != job.priority:  # aged: `labq why` says so, in words that hold for every aged job of its shape
            detail += (f"; it has waited over {span(aging)} (the aging wait), so it is served as {rank}, before "
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
            spec = job.spec
            verdict = (reason, detail, waiting_for, None)
            if not self.host_mattered:
                # it waits as it would by GPUs alone: so does every job of its GPU shape, whatever it asks of CPUs
                self.memo.settled[spec.resource_shape, BY_GPUS, None, shape[2], rank] = verdict
            else:
                self.memo.settled[spec.resource_shape, spec.cpus, spec.memory_mib, shape[2], rank] = verdict
        self._wait(job, reason, detail, waiting_for)

    def _why_blocked(self, job: Job, shape: tuple) -> tuple[PendingReason, str, int | None]:
        spec = job.spec
        for node, choice in self._best_nodes(job, shape, holds=False) or ():
            holders = [h for h in self.holds[node.name]
                       if h.mask & choice.mask and h.job_id != job.id and h.binds(self._end_of(job))]
            if holders:
                ahead = min(holders, key=lambda h: (-h.priority, h.job_id))
                return (PendingReason.PRIORITY,
                        f"GPUs {gpu_list(choice.mask & ahead.mask)} on {node.name} are held for job "
                        f"{ahead.job_id} ({priority_name(ahead.priority)}), which is ahead in the queue",
                        ahead.job_id)
        if self.reservation_list and self._best_nodes(job, shape, reservations=False) is not None:
            end = self._end_of(job)
            names = [f"{r.name}, " + (f"starts in {span(r.start - self.now)}" if r.start > self.now
                                      else f"until {span(r.end - self.now)} from now")
                     for r in sorted(self.reservation_list, key=lambda r: (r.start, r.name))
                     if r.name != spec.reservation and r.overlaps(self.now, end)]
            hint = ("a time limit (--time) that ends before the reservation lets it run" if spec.preemptible
                    else "a preemptible job may borrow reserved GPUs until they are needed")
            return (PendingReason.RESERVATION,
                    f"the free GPUs are reserved ({'; '.join(names)}) before this job would end; {hint}", None)
        if self.host_mattered:  # some node was passed over for want of CPUs or memory: perhaps for this job
            short = self._host_short(job, shape)
            if short is not None:
                return PendingReason.RESOURCES, short, None
        most, where = 0, ""
        if self.most_free:  # else no node has a free GPU for any job
            # reserved GPUs are lent only while none of the reservation's jobs waits: a table for each such state
            counts = self._on_each_node("free", job, shape[:3],
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

    def _host_short(self, job: Job, shape: tuple) -> str | None:
        """What a job waits for when enough nodes have GPUs free for it but too few of those the CPUs or memory it
        needs there: ``needs 16 CPUs; ws1 has 8 free``, of the node of those with the most free. None otherwise."""
        spec = job.spec
        sets = self._on_each_node("set", job, shape[:3], lambda n: self._best_set_on(job, n), ())  # by GPUs alone
        fitting = [self.nodes[name] for name, choice in sets.items() if choice is not None]
        if len(fitting) < spec.nodes:
            return None  # too few GPUs, whatever the CPUs
        short = []
        for node in fitting:
            need = self._need(job, node)
            if need is not None and not self._host_room(node.name, need):
                free = self.free_cpus.get(node.name)
                short.append((-(free or 0).bit_count(), -self.free_memory.get(node.name, 0), node.name, need))
        if not short or len(fitting) - len(short) >= spec.nodes:
            return None
        _, _, name, need = min(short)
        return self._short(self.nodes[name], need, spec.nodes)

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
        spec = job.spec  # what it needs of the node's CPUs and memory follows from its GPUs there and what it asks
        key = ("soonest", blocked, spec.gpus_per_node, spec.cpus, spec.memory_mib)
        option = known.get(key, UNKNOWN)
        if option is UNKNOWN:
            need = self._need(job, node) if self.sized else None
            option = known[key] = self._soonest_set(node, blocked, spec.gpus_per_node, need)
        return option

    def _soonest_set(self, node: Node, blocked: int, k: int, need: HostNeed | None = None) -> tuple | None:
        """The first ``k``-GPU set outside ``blocked`` that ``node`` frees, with the CPUs and memory of ``need``:
        shared by jobs of any time limit."""
        for when, have, cpus, memory in self._freeing(node, blocked):
            if have.bit_count() < k:
                continue
            if need is None or (cpus is None or cpus.bit_count() >= need.count) and (
                    memory is None or need.memory_mib is None or memory >= need.memory_mib):
                choice = best_set(node.topology, have, k)  # it finds a set exactly when k GPUs are there
                return (when, -choice.score, choice.loss, node.name, choice.mask)
            self.host_mattered = True  # the GPUs are there before the CPUs or memory
        return None

    def _freeing(self, node: Node, blocked: int) -> list[tuple[float, int, int | None, int | None]]:
        """The GPUs of ``node`` outside ``blocked`` that are free now, then as each running job ends, and its free
        CPUs (a mask) and memory then (None where it does not report them).

        Steps of (when, GPUs, CPUs, memory), soonest first. They depend on the job only through the GPUs it
        must keep off, so jobs of every size and time limit share them until the node changes.
        """
        known = self.memo.on_node(node.name)
        key = ("freeing", blocked)
        steps = known.get(key)
        if steps is None:
            name = node.name
            have = self.free[name] & ~blocked
            cpus, memory = self.free_cpus.get(name), self.free_memory.get(name)
            sized = cpus is not None or memory is not None
            when = self.now
            steps = [(when, have, cpus, memory)]
            for entry in sorted(self.on_gpus[name], key=lambda e: (e.end, e.job.id)):
                if entry.mask & ~blocked or sized and (entry.cpus or entry.memory_mib):
                    have |= entry.mask & ~blocked
                    if cpus is not None:
                        cpus |= entry.cpus
                    if memory is not None:
                        memory += entry.memory_mib
                    when = max(when, entry.end)
                    steps.append((when, have, cpus, memory))
            known[key] = steps
        return steps
