"""Properties that hold for any lab state: checked on random clusters, running work and queues."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from labq.models import JobState, PriorityClass
from labq.scheduler import Policy, schedule
from labq.scheduler.placement import best_set, indices_to_mask
from tests.conftest import NOW, JobFactory, make_node

INVENTORIES = ["sim:dgx1", "sim:dgx-a100", "sim:pcie-2socket", "sim:ws-4x3090", "sim:flat:2", "sim:flat:3"]
PRIORITIES = [int(p) for p in PriorityClass] + [150, 250]


@st.composite
def labs(draw):
    """A random but consistent lab: nodes (some of them handing their jobs to a scheduler of their own, as a
    Slurm node does), jobs on disjoint GPUs, a queue, a policy."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    factory = JobFactory()
    nodes = []
    for i in range(rng.randint(1, 4)):
        hands_over = rng.random() < 0.3
        nodes.append(make_node(f"n{i}", rng.choice(INVENTORIES),
                               unmanaged_busy=frozenset(rng.sample(range(2), rng.choice([0, 0, 0, 1]))),
                               hands_over=hands_over, shares=not hands_over))
    jobs = []
    for node in nodes:
        free = ((1 << node.gpu_count) - 1) & ~indices_to_mask(node.unmanaged_busy)
        while free and rng.random() < 0.7:
            k = rng.choice([1, 1, 2, 4])
            choice = best_set(node.topology, free, k)
            if choice is None:
                break
            free &= ~choice.mask
            state = rng.choice([JobState.RUNNING] * 6 + [JobState.STARTING, JobState.PREEMPTING])
            jobs.append(factory.running(
                node, choice.gpus, user=rng.choice("abc"), priority=rng.choice(PRIORITIES),
                started_at=NOW - rng.choice([30, 600, 7200]), state=state,
                preemptible=rng.random() < 0.8, time_limit_s=rng.choice([None, 3600, 4 * 3600]),
            ))
    for _ in range(rng.randint(0, 25)):
        gpus = rng.choice([1, 1, 2, 4, 8, 16])
        nodes_wanted = 2 if gpus in (4, 8) and rng.random() < 0.15 else 1
        jobs.append(factory.queued(
            gpus, nodes=nodes_wanted, user=rng.choice("abcd"), priority=rng.choice(PRIORITIES),
            submitted_at=NOW - rng.randint(0, 10_000), time_limit_s=rng.choice([None, 1800, 3600 * 8]),
            state=JobState.HELD if rng.random() < 0.05 else JobState.QUEUED,
        ))
    # a preempting job may point at a queued preemptor
    queued = [j for j in jobs if j.state is JobState.QUEUED]
    jobs = [j.evolve(preempted_for=rng.choice(queued).id) if j.state is JobState.PREEMPTING and queued else j
            for j in jobs]
    policy = Policy(max_gpus_per_user=rng.choice([None, None, 8]), min_runtime_s=rng.choice([0, 300]),
                    hold_depth=rng.choice([0, 4, 16]))
    return nodes, jobs, policy


@settings(max_examples=150, deadline=None)
@given(labs())
def test_no_gpu_is_double_booked_and_gangs_are_whole(lab):
    """No GPU is given to two jobs; on a node that hands its jobs over (Slurm), whose own scheduler starts a job only
    once its GPUs are free, a job may be given the GPUs of jobs on their way out (preempted, in this pass or
    before, or stopping), and of no other."""
    nodes, jobs, policy = lab
    by_name = {n.name: n for n in nodes}
    d = schedule(jobs, nodes, now=NOW, policy=policy)
    leaving = {p.job_id for p in d.preemptions}
    taken = {(n.name, g) for n in nodes for g in n.unmanaged_busy}
    for job in jobs:
        if job.state.holds_gpus:
            gpus = {(a.node, g) for a in job.placement.allocations for g in a.gpu_indices}
            if job.id in leaving or job.state is JobState.PREEMPTING or job.stop_requested is not None:
                gpus = {(n, g) for n, g in gpus if not by_name[n].hands_over}
            taken |= gpus
    specs = {j.id: j.spec for j in jobs}
    for start in d.starts:
        spec = specs[start.job_id]
        allocs = start.placement.allocations
        assert len(allocs) == spec.nodes and len({a.node for a in allocs}) == spec.nodes
        for a in allocs:
            assert len(a.gpu_indices) == spec.gpus_per_node  # all or nothing
            assert by_name[a.node].schedulable
            for g in a.gpu_indices:
                assert (a.node, g) not in taken, f"GPU {g} on {a.node} handed out twice"
                taken.add((a.node, g))


@settings(max_examples=150, deadline=None)
@given(labs())
def test_nothing_of_equal_or_higher_priority_is_preempted(lab):
    nodes, jobs, policy = lab
    d = schedule(jobs, nodes, now=NOW, policy=policy)
    by_id = {j.id: j for j in jobs}
    victims = [p.job_id for p in d.preemptions]
    assert len(victims) == len(set(victims))
    for p in d.preemptions:
        victim, preemptor = by_id[p.job_id], by_id[p.for_job]
        assert victim.priority < preemptor.priority
        assert victim.state is JobState.RUNNING and victim.spec.preemptible
        assert NOW - victim.started_at >= policy.min_runtime_s
        started = d.started(preemptor.id)
        # it waits for its victims, unless every node it goes to holds it until they are gone (Slurm)
        assert started is None or all(n.hands_over for n in nodes if n.name in started.placement.nodes)


@settings(max_examples=100, deadline=None)
@given(labs(), st.randoms(use_true_random=False))
def test_equal_input_gives_equal_decisions_whatever_the_order(lab, rnd):
    nodes, jobs, policy = lab
    first = schedule(jobs, nodes, now=NOW, policy=policy)
    assert schedule(jobs, nodes, now=NOW, policy=policy) == first
    shuffled_jobs, shuffled_nodes = list(jobs), list(nodes)
    rnd.shuffle(shuffled_jobs)
    rnd.shuffle(shuffled_nodes)
    again = schedule(shuffled_jobs, shuffled_nodes, now=NOW, policy=policy)
    assert sorted(again.starts, key=lambda s: s.job_id) == sorted(first.starts, key=lambda s: s.job_id)
    assert sorted(again.pending, key=lambda p: p.job_id) == sorted(first.pending, key=lambda p: p.job_id)
    assert sorted(again.preemptions, key=lambda p: p.job_id) == sorted(first.preemptions, key=lambda p: p.job_id)


@settings(max_examples=150, deadline=None)
@given(labs())
def test_every_waiting_job_gets_one_verdict_with_a_reason(lab):
    nodes, jobs, policy = lab
    d = schedule(jobs, nodes, now=NOW, policy=policy)
    waiting = sorted(j.id for j in jobs if j.state in (JobState.QUEUED, JobState.HELD))
    verdicts = sorted([s.job_id for s in d.starts] + [p.job_id for p in d.pending])
    assert verdicts == waiting
    assert all(p.detail for p in d.pending)
