"""The pass's shortcuts change no decision when nodes report CPUs and memory and jobs ask for them.

Jobs of one shape share what the pass works out, and jobs that differ only in the CPUs or memory they ask share a
verdict while those decided nothing (``LabView.host_mattered``). Random labs of the recorded-decisions test, with
their nodes reporting CPUs, NUMA nodes and memory, running jobs holding some, and queued jobs asking for some or
none, decide exactly as the same labs where no two jobs share a shape (each job's grace a hair apart), so nothing
is shared; and no pass gives a CPU twice or a node's memory past its size.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from labq.models import Job, NodeAllocation, Placement
from labq.models.job import JobState
from labq.scheduler import Policy, schedule
from labq.scheduler.host import choose_cpus, need_on
from labq.scheduler.placement import mask_to_indices
from labq.topologies import parse_sim_spec
from tests.unit.test_scheduler_speed_equivalence import random_lab

GIB = 1024


def sized_lab(seed: int):
    jobs, nodes, kwargs = random_lab(seed)
    rng = random.Random(f"host-{seed}")
    by_inventory = {}
    for node in nodes:
        inv = next(name for name in ("dgx1", "dgx-a100", "dgx2", "pcie-2socket", "ws-4x3090")
                   if node.gpus[0].uuid.endswith(f"-{name}-0")) if "flat" not in node.gpus[0].uuid else None
        sim = parse_sim_spec(f"sim:{inv}" if inv else f"sim:flat:{node.gpu_count}")
        by_inventory[node.name] = replace(node, gpus=sim.gpus(node.name), cpus=sim.cpus,
                                          memory_mib=sim.host_memory_mib)
    nodes = [by_inventory[n.name] for n in nodes]
    policy = kwargs["policy"]
    if rng.random() < 0.3:
        kwargs["policy"] = replace(policy, cpus_per_gpu=rng.choice([2.0, 6.0, 40.0]),
                                   mem_per_gpu_mib=rng.choice([16 * GIB, 200 * GIB]))
    free = {n.name: n.cpu_mask for n in nodes}
    left = {n.name: n.memory_mib for n in nodes}
    out = []
    for job in jobs:
        spec = job.spec
        if rng.random() < 0.5:
            per_gpu = rng.choice([1, 4, 10, 30])
            spec = replace(spec, cpus=rng.choice([None, float(per_gpu * spec.gpus_per_node), 2.5]),
                           memory_mib=rng.choice([None, None, spec.gpus_per_node * rng.choice([8, 64, 300]) * GIB]))
        job = job.evolve(spec=spec)
        if job.placement is not None and job.state.holds_gpus and rng.random() < 0.8:
            allocations = []
            for a in job.placement.allocations:
                node = by_inventory[a.node]
                need = need_on(spec, node, Policy())
                chosen = choose_cpus(node, sum(1 << i for i in a.gpu_indices), need.count, free[a.node])
                if chosen is None:
                    allocations.append(a)
                    continue
                free[a.node] &= ~chosen[0]
                memory = need.memory_mib if need.memory_mib <= left[a.node] else None
                left[a.node] -= memory or 0
                allocations.append(NodeAllocation(a.node, a.gpu_indices, a.gpu_uuids, a.score,
                                                  mask_to_indices(chosen[0]), need.cores, memory, chosen[1]))
            job = job.evolve(placement=Placement(tuple(allocations)))
        out.append(job)
    return out, nodes, kwargs


def apart(jobs: list[Job]) -> list[Job]:
    """The same jobs, no two of one shape: each grace a hair from the next (no decision depends on a nanosecond)."""
    return [j.evolve(spec=replace(j.spec, grace_s=j.spec.grace_s + i * 1e-9)) if j.state is JobState.QUEUED else j
            for i, j in enumerate(jobs)]


def seen(decisions) -> tuple:
    return (decisions.starts, decisions.preemptions,
            [(p.job_id, p.reason, p.detail, p.waiting_for, None if p.estimated_start is None
              else round(p.estimated_start, 3)) for p in decisions.pending])


@pytest.mark.parametrize("seed", range(0, 300, 3))
def test_shared_verdicts_decide_as_jobs_of_their_own_shapes(seed):
    jobs, nodes, kwargs = sized_lab(seed)
    decisions = schedule(jobs, nodes, **kwargs)
    assert seen(decisions) == seen(schedule(apart(jobs), nodes, **kwargs))
    cpus = {n.name: 0 for n in nodes}
    memory = {n.name: 0 for n in nodes}
    size = {n.name: n.memory_mib for n in nodes}
    placed = [j.placement for j in jobs if j.placement is not None and j.state.holds_gpus]
    for placement in placed + [s.placement for s in decisions.starts]:
        for a in placement.allocations:
            if a.node in cpus:
                assert not cpus[a.node] & a.cpu_mask, f"a CPU of {a.node} given twice"
                cpus[a.node] |= a.cpu_mask
                memory[a.node] += a.memory_mib or 0
    assert all(memory[name] <= size[name] for name in memory)
