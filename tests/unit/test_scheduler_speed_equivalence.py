"""The scheduler's shortcuts change no decision: random labs against recorded decisions, and invariants.

The pass memoizes per node, per job shape and per queue position to stay fast on
long queues; a shortcut that goes stale would change what starts, what is
preempted or why a job waits. ``data/schedule_golden.json`` holds a digest of
the whole ``Decisions`` of ~300 seeded random labs (small and large, with
reservations, quotas, preemptions in flight, holds, pinned and constrained
jobs), recorded with the straightforward scheduler before it was optimized.
Every later version must reproduce them exactly.

A deliberate change to what the scheduler decides (or to a pending reason's
wording) changes the digests; rewrite them, after checking the change is meant,
with::

    .venv/bin/python -m tests.unit.test_scheduler_speed_equivalence --write
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from labq.models.transitions import placed, preempting, running
from labq.models import Job, JobSpec, JobState, Node, NodeAllocation, Placement, PriorityClass
from labq.models.decisions import Decisions
from labq.models.job import Attempt, AttemptEnd, StopReason
from labq.models.node import NodeHealth
from labq.models.reservation import Reservation
from labq.scheduler import Policy, schedule
from labq.scheduler.placement import best_set, indices_to_mask
from tests.conftest import NOW, make_node

GOLDEN = Path(__file__).parent / "data" / "schedule_golden.json"
STATES = 300
#: GPUs the sim: inventories carry; the pass compares model names case-insensitively by substring
MODELS = ["V100", "A100", "3090", "A6000", "a5000", "H100"]
PRIORITIES = [int(p) for p in PriorityClass] + [150, 250]


# -- random labs ------------------------------------------------------------------------------

def _nodes(rng: random.Random, count: int, inventories: list[str]) -> list[Node]:
    nodes = []
    for i in rng.sample(range(count * 3), count):  # names not in index order
        inv = rng.choice(inventories)
        size = make_node("x", inv).gpu_count
        busy = frozenset(rng.sample(range(size), min(size - 1, rng.choice([0] * 8 + [1, 2]))))
        health = rng.choices(list(NodeHealth), [20, 1, 1, 1])[0]
        nodes.append(make_node(f"n{i}", inv, unmanaged_busy=busy, health=health))
    return nodes


def _running_job(rng: random.Random, job_id: int, allocs: list[tuple[Node, int]]) -> Job:
    limit = rng.choice([None, None, 1800.0, 3600.0, 4 * 3600.0, 24 * 3600.0])
    started = NOW - rng.choice([20.0, 200.0, 600.0, 2000.0, 5000.0, 7200.0, 90000.0])
    history = ()
    if rng.random() < 0.1:
        history = tuple(Attempt(n + 1, None, NOW - 50000 + n, NOW - 40000 + n * 100, AttemptEnd.PREEMPTED,
                                stop_reason=StopReason.PREEMPTED) for n in range(rng.randint(1, 3)))
    spec = JobSpec(user=rng.choice("abcde"), command=("train",), gpus=sum(m.bit_count() for _, m in allocs),
                   nodes=len(allocs), priority=rng.choice(PRIORITIES), preemptible=rng.random() < 0.8,
                   time_limit_s=limit, grace_s=rng.choice([0.0, 60.0, 300.0]))
    placement = Placement(tuple(
        NodeAllocation(node.name, tuple(i for i in range(node.gpu_count) if m >> i & 1),
                       tuple(node.gpus[i].uuid for i in range(node.gpu_count) if m >> i & 1))
        for node, m in allocs))
    state = rng.choices([JobState.RUNNING, JobState.STARTING, JobState.PREEMPTING], [12, 1, 1])[0]
    checkpoint = started + rng.uniform(0, NOW - started) if rng.random() < 0.3 else None
    return Job(job_id, spec, submitted_at=started - 100, state=state, placement=placement, started_at=started,
               last_checkpoint_at=checkpoint, history=history, attempt=len(history) + 1)


def _running(rng: random.Random, nodes: list[Node], first_id: int, fill: float) -> list[Job]:
    """Jobs on disjoint GPUs, mostly one node each, some spread over two nodes of the same size."""
    free = {n.name: ((1 << n.gpu_count) - 1) & ~indices_to_mask(n.unmanaged_busy) for n in nodes}
    jobs: list[Job] = []
    for node in nodes:
        while free[node.name] and rng.random() < fill:
            k = rng.choice([1, 1, 1, 1, 2, 2, 4, 8])
            choice = best_set(node.topology, free[node.name], k)
            if choice is None:
                break
            allocs = [(node, choice.mask)]
            if rng.random() < 0.05:
                other = rng.choice(nodes)
                second = best_set(other.topology, free[other.name], k) if other is not node else None
                if second is not None:
                    allocs.append((other, second.mask))
            for n, m in allocs:
                free[n.name] &= ~m
            jobs.append(_running_job(rng, first_id + len(jobs), allocs))
    return jobs


def _reservations(rng: random.Random, nodes: list[Node]) -> list[Reservation]:
    out = []
    for r in range(rng.choice([0, 0, 0, 1, 2, 3])):
        node = rng.choice(nodes)
        count = rng.randint(1, node.gpu_count)
        start = NOW + rng.choice([-7200.0, -60.0, 30.0, 200.0, 3600.0, 86400.0])
        pinned = rng.random() < 0.9
        out.append(Reservation(
            f"r{r}", owner=rng.choice("abcde"), gpus=count, start=start, end=start + rng.choice([3600.0, 86400.0]),
            users=frozenset(rng.sample("abcde", rng.randint(0, 2))),
            node=node.name if pinned else None,
            gpu_indices=tuple(sorted(rng.sample(range(node.gpu_count), count))) if pinned else (),
        ))
    return out


def _queued(rng: random.Random, count: int, first_id: int, nodes: list[Node], others: list[int],
            reservations: list[Reservation], classes: list[int]) -> list[Job]:
    jobs = []
    for i in range(count):
        job_id = first_id + i
        gpus = rng.choice([1, 1, 1, 1, 2, 2, 4, 8, 16])
        spread = 2 if gpus in (2, 4, 8, 16) and rng.random() < 0.1 else 1
        extra = {}
        if rng.random() < 0.08:
            extra["gpu_model"] = rng.choice(MODELS)
        if rng.random() < 0.05:
            extra["min_gpu_memory_mib"] = rng.choice([16 * 1024, 40 * 1024, 100 * 1024])
        if rng.random() < 0.05:
            extra["node"] = rng.choice(nodes).name if rng.random() < 0.9 else "nowhere"
        if reservations and rng.random() < 0.15:
            extra["reservation"] = rng.choice(reservations).name if rng.random() < 0.9 else "gone"
        if rng.random() < 0.05 and (others or jobs):
            extra["depends_on"] = tuple(rng.sample(others + [j.id for j in jobs] + [999999], rng.randint(1, 2)))
        spec = JobSpec(user=rng.choice("abcde"), command=("train",), gpus=gpus, nodes=spread,
                       priority=rng.choice(classes), preemptible=rng.random() < 0.85,
                       time_limit_s=rng.choice([None, None, 600.0, 3600.0, 8 * 3600.0]),
                       grace_s=rng.choice([60.0, 60.0, 0.0, 600.0]), **extra)
        state = JobState.HELD if rng.random() < 0.03 else JobState.QUEUED
        submitted = NOW - rng.choice([0, 10, 100, 5000]) - rng.random() * 3
        jobs.append(Job(job_id, spec, submitted_at=submitted, state=state))
    return jobs


def _policy(rng: random.Random, quotas: bool) -> Policy:
    return Policy(
        max_gpus_per_user=rng.choice([None, None, None, 4, 16]) if quotas else None,
        user_gpu_quota={"a": rng.choice([2, 8])} if quotas and rng.random() < 0.15 else {},
        preemption=rng.random() < 0.85,
        min_runtime_s=rng.choice([0.0, 300.0, 1000.0]),
        hold_depth=rng.choice([0, 2, 16, 16, 16]),
        may_preempt=({400: frozenset({100, 200}), 300: frozenset({100})} if rng.random() < 0.2 else None),
        max_preemptions_per_day=rng.choice([None, None, 1, 2]),
    )


def random_lab(seed: int) -> tuple[list[Job], list[Node], dict]:
    """One consistent lab: nodes, running work, a queue, reservations, usage, a policy."""
    rng = random.Random(seed)
    big = seed % 25 == 0
    if big:  # a Philly-like virtual cluster: many identical nodes, a long queue of one or two classes
        nodes = _nodes(rng, rng.choice([32, 64]), ["sim:dgx1"] * 6 + ["sim:dgx-a100"])
        classes = rng.choice([[200], [200], [300, 200, 100]])
        running_jobs = _running(rng, nodes, 1, 0.97)
        queue_len = rng.choice([50, 300, 600])
    else:
        inventories = rng.choice([
            ["sim:dgx1", "sim:dgx-a100", "sim:pcie-2socket", "sim:ws-4x3090", "sim:flat:2", "sim:flat:3"],
            ["sim:dgx1"],
            ["sim:ws-4x3090", "sim:flat:1", "sim:flat:2"],
            ["sim:dgx2", "sim:dgx1", "sim:flat:20"],
        ])
        nodes = _nodes(rng, rng.choice([1, 2, 3, 4, 6, 10, 16]), inventories)
        classes = rng.choice([PRIORITIES, [200], [100, 300], [200, 400]])
        running_jobs = _running(rng, nodes, 1, rng.choice([0.3, 0.7, 0.95]))
        queue_len = rng.choice([0, 3, 10, 30, 80])
    reservations = _reservations(rng, nodes)
    queued = _queued(rng, queue_len, len(running_jobs) + 1, nodes, [j.id for j in running_jobs], reservations,
                     classes)
    waiting = [j.id for j in queued if j.state is JobState.QUEUED]
    jobs = []
    for job in running_jobs:
        if job.state is JobState.PREEMPTING:
            target = rng.random()
            if target < 0.6 and waiting:
                job = job.evolve(preempted_for=rng.choice(waiting))
            elif target < 0.8 and reservations:
                job = job.evolve(drained_for=rng.choice(reservations).name)
        if reservations and job.state is JobState.RUNNING and rng.random() < 0.05:
            job = job.evolve(spec=replace(job.spec, reservation=rng.choice(reservations).name))
        jobs.append(job)
    jobs += queued
    finished = {100000 + i: rng.choice([JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED])
                for i in range(rng.randint(0, 3))}
    for job in queued:
        if rng.random() < 0.02:
            jobs.remove(job)  # a queued job others depend on has succeeded meanwhile
            finished[job.id] = JobState.SUCCEEDED
    usage = {u: rng.choice([0.0, 1.5, 10.0, 80.0]) for u in "abcde"} if rng.random() < 0.5 else None
    policy = _policy(rng, quotas=not big or rng.random() < 0.3)  # a long queue behind a quota is another test
    kwargs = {"now": NOW, "reservations": reservations, "usage": usage, "policy": policy, "finished": finished}
    return jobs, nodes, kwargs


def next_step(jobs: list[Job], decisions: Decisions, rng: random.Random) -> list[Job]:
    """The lab after the leader applies the decisions and some jobs end: for passes on states a pass produced."""
    by_id = {j.id: j for j in jobs}
    for start in decisions.starts:
        by_id[start.job_id] = running(placed(by_id[start.job_id], start.placement), NOW - 1000)
    for p in decisions.preemptions:
        by_id[p.job_id] = preempting(by_id[p.job_id], p.for_job, p.reservation)
    for job in list(by_id.values()):
        if job.state.holds_gpus and rng.random() < 0.15:
            del by_id[job.id]  # ended; its GPUs are free
    return list(by_id.values())


# -- digests ----------------------------------------------------------------------------------

def _num(value: float | None) -> str | None:
    return None if value is None else f"{value:.6f}"


def canonical(d: Decisions) -> list:
    """The whole decisions, in their order, as JSON-able data (floats rounded to microseconds)."""
    return [
        [[s.job_id, [[a.node, list(a.gpu_indices), list(a.gpu_uuids), a.score] for a in s.placement.allocations]]
         for s in d.starts],
        [[p.job_id, p.for_job, p.node, list(p.gpu_indices), _num(p.work_at_risk_s), p.reservation]
         for p in d.preemptions],
        [[p.job_id, p.reason.value, p.detail, p.waiting_for, _num(p.estimated_start)] for p in d.pending],
    ]


def digest(d: Decisions) -> list:
    """Counts to read, and a hash of everything."""
    text = json.dumps(canonical(d), separators=(",", ":"))
    return [len(d.starts), len(d.preemptions), len(d.pending), hashlib.sha256(text.encode()).hexdigest()[:20]]


def lab_digests(seed: int) -> list[list]:
    """The decisions of a lab's pass, and, for every fifth lab, of two more passes on the states that follow."""
    jobs, nodes, kwargs = random_lab(seed)
    out = []
    steps = 3 if seed % 5 == 1 else 1
    rng = random.Random(seed + 1)
    for step in range(steps):
        d = schedule(jobs, nodes, **kwargs)
        out.append(digest(d))
        if step + 1 < steps:
            jobs = next_step(jobs, d, rng)
    return out


def all_digests() -> dict[str, list]:
    return {str(seed): lab_digests(seed) for seed in range(STATES)}


# -- tests ------------------------------------------------------------------------------------

def test_decisions_equal_the_recorded_ones():
    golden = json.loads(GOLDEN.read_text())["labs"]
    assert len(golden) == STATES
    mismatched = [seed for seed, recorded in golden.items() if lab_digests(int(seed)) != recorded]
    assert not mismatched, f"decisions changed for seeds {mismatched[:20]} (of {len(mismatched)})"


@pytest.mark.parametrize("seed", range(0, STATES, 7))
def test_input_order_does_not_matter(seed):
    jobs, nodes, kwargs = random_lab(seed)
    first = schedule(jobs, nodes, **kwargs)
    rng = random.Random(seed)
    rng.shuffle(jobs)
    rng.shuffle(nodes)
    kwargs["reservations"] = kwargs["reservations"][::-1]
    again = schedule(jobs, nodes, **kwargs)
    assert again.starts == first.starts
    assert again.pending == first.pending
    by_victim = sorted(first.preemptions, key=lambda p: p.job_id)
    assert sorted(again.preemptions, key=lambda p: p.job_id) == by_victim


@pytest.mark.parametrize("seed", range(3, STATES, 11))
def test_starts_use_free_suitable_gpus_once(seed):
    jobs, nodes, kwargs = random_lab(seed)
    d = schedule(jobs, nodes, **kwargs)
    by_name = {n.name: n for n in nodes}
    taken = {(n.name, g) for n in nodes for g in n.unmanaged_busy}
    for job in jobs:
        if job.state.holds_gpus:
            taken |= {(a.node, g) for a in job.placement.allocations for g in a.gpu_indices}
    specs = {j.id: j.spec for j in jobs}
    waiting = {j.id for j in jobs if j.state in (JobState.QUEUED, JobState.HELD)}
    assert sorted([s.job_id for s in d.starts] + [p.job_id for p in d.pending]) == sorted(waiting)
    for start in d.starts:
        spec = specs[start.job_id]
        assert len({a.node for a in start.placement.allocations}) == spec.nodes
        for a in start.placement.allocations:
            node = by_name[a.node]
            assert node.schedulable and len(a.gpu_indices) == spec.gpus_per_node
            for g in a.gpu_indices:
                gpu = node.gpus[g]
                assert gpu.memory_mib >= spec.min_gpu_memory_mib
                assert spec.gpu_model is None or spec.gpu_model.lower() in gpu.model.lower()
                assert (a.node, g) not in taken, f"GPU {g} on {a.node} handed out twice"
                taken.add((a.node, g))
    victims = [p.job_id for p in d.preemptions]
    assert len(victims) == len(set(victims))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {sys.argv[0]} --write   (records the current scheduler's decisions in {GOLDEN})")
    GOLDEN.parent.mkdir(exist_ok=True)
    labs = ",\n".join(f"{json.dumps(seed)}: {json.dumps(d, separators=(',', ':'))}"
                       for seed, d in all_digests().items())
    GOLDEN.write_text('{"about": "[starts, preemptions, pending, hash] of schedule() on random_lab(seed), per pass; '
                      'see tests/unit/test_scheduler_speed_equivalence.py",\n"labs": {\n' + labs + "\n}}\n")
    print(f"wrote {GOLDEN}")
