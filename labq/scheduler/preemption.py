"""Choosing whom to preempt so that a higher-priority job fits.

Only strictly lower-priority, preemptible jobs that have run their minimum time
are candidates. On each node the cheapest sufficient victim set is found by a
small exhaustive search; cost compares, in order:

1. GPUs evicted (never evict more than needed: one 1-GPU victim beats one 8-GPU victim),
2. the highest victim priority (take from the lowest class first),
3. work lost since the victims' last checkpoints,
4. the number of victims,
5. the interconnect score of the GPU set the preemptor gets (higher is better).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from labq.models.job import Job
from labq.models.topology import Topology
from labq.scheduler.placement import SetChoice, best_set


@dataclass(frozen=True)
class Victim:
    job: Job
    freeable: int  #: GPUs on this node its eviction would give the preemptor
    work_at_risk_s: float


@dataclass(frozen=True)
class NodePlan:
    node: str
    victims: tuple[Victim, ...]
    target: SetChoice

    @cached_property
    def cost(self) -> tuple:
        """Computed once: the victim search and the choice among nodes compare plans by it many times."""
        evicted = sum(v.job.spec.gpus for v in self.victims)
        top = max((v.job.priority for v in self.victims), default=-1)
        lost = sum(v.work_at_risk_s for v in self.victims)
        return (evicted, top, lost, len(self.victims), -self.target.score, self.target.loss, self.node)


def plan_on_node(node: str, topology: Topology, available: int, k: int, candidates: list[Victim],
                 limits: Mapping[int, tuple[str, int]] | None = None) -> NodePlan | None:
    """Cheapest victim set on one node that, with ``available``, gives ``k`` GPUs.

    ``limits`` bounds what may be taken from groups of victims (a queue's borrowed GPUs): victim job id ->
    (its group, the most GPUs the plan may take from that group)."""
    direct = best_set(topology, available, k)
    if direct is not None:
        return NodePlan(node, (), direct)
    useful = [v for v in candidates if v.freeable & ~available]
    reach = available
    for v in useful:
        reach |= v.freeable
    if reach.bit_count() < k:
        return None
    useful.sort(key=lambda v: (v.job.spec.gpus, v.job.priority, v.work_at_risk_s, v.job.id))
    best: NodePlan | None = None
    chosen: list[Victim] = []
    taken: dict[str, int] = {}

    def search(start: int, have: int, evicted: int) -> None:
        nonlocal best
        if best is not None and evicted > best.cost[0]:
            return
        if have.bit_count() >= k:
            target = best_set(topology, have, k)
            plan = NodePlan(node, tuple(chosen), target)
            if best is None or plan.cost < best.cost:
                best = plan
            return
        for i in range(start, len(useful)):
            v = useful[i]
            if not v.freeable & ~have:
                continue
            group = limits.get(v.job.id) if limits else None
            if group is not None:
                if taken.get(group[0], 0) + v.job.spec.gpus > group[1]:
                    continue
                taken[group[0]] = taken.get(group[0], 0) + v.job.spec.gpus
            chosen.append(v)
            search(i + 1, have | v.freeable, evicted + v.job.spec.gpus)
            chosen.pop()
            if group is not None:
                taken[group[0]] -= v.job.spec.gpus

    search(0, available, 0)
    return best
