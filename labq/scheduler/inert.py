"""Whether a pass for a job just submitted could decide anything but why it waits."""

from __future__ import annotations

from collections.abc import Iterable

from labq.models.job import Job
from labq.models.node import Node
from labq.scheduler.policy import Policy


def waits_whatever_the_order(job: Job, nodes: Iterable[Node], holding: Iterable[Job], policy: Policy) -> bool:
    """True when ``job`` can neither start nor preempt on the lab as it is, wherever it stands in the queue:
    every GPU of every node that is up is held (``holding``: the jobs on GPUs), and none of the jobs holding
    them is one it may preempt. A pass that takes it in can only find its reason to wait, and it changes no
    other job's fate (it takes no GPU), so such a submit need not bring a pass of its own: the next one takes
    it in (``labq.leader.scheduling``). Never for a lab with queues (a queue reclaims its lent GPUs whatever
    the priorities), nor for a job with a reservation or dependencies (their own rules decide)."""
    spec = job.spec
    if policy.queues or spec.reservation is not None or spec.depends_on:
        return False
    holding = list(holding)
    if policy.preemption and any(j.spec.preemptible and policy.can_preempt(job.priority, j.priority)
                                 for j in holding):
        return False
    up = {n.name: n.gpu_count for n in nodes if n.schedulable}
    held = 0
    for other in holding:
        for allocation in other.placement.allocations if other.placement is not None else ():
            if allocation.node in up:
                held += len(allocation.gpu_indices)
    return held >= sum(up.values())
