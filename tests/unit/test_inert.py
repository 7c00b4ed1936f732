"""``waits_whatever_the_order``: a submit that can neither start nor preempt needs no pass of its own. The
promise checked on many random labs: where it says so, a pass with the job decides exactly what a pass without
it decides, and the job waits."""

from __future__ import annotations

import random

import pytest

from labq.models import Job, JobSpec, NodeHealth
from labq.models.queues import QueueSpec
from labq.scheduler import Policy, schedule
from labq.scheduler.inert import waits_whatever_the_order
from tests.conftest import NOW, JobFactory, make_node

LOW, NORMAL, HIGH = 100, 200, 300


@pytest.fixture
def ws():
    return make_node("ws1", "sim:ws-4x3090")


def test_a_full_lab_of_equal_jobs_makes_a_submit_wait_whatever_the_order(ws, jobs):
    holding = [jobs.running(ws, (0, 1)), jobs.running(ws, (2, 3))]
    assert waits_whatever_the_order(jobs.queued(1), [ws], holding, Policy())


def test_a_free_gpu_or_a_job_it_may_preempt_means_a_pass(ws, jobs):
    assert not waits_whatever_the_order(jobs.queued(1), [ws], [jobs.running(ws, (0, 1, 2))], Policy())
    low = [jobs.running(ws, (0, 1), priority=LOW), jobs.running(ws, (2, 3))]
    assert not waits_whatever_the_order(jobs.queued(1), [ws], low, Policy())
    assert waits_whatever_the_order(jobs.queued(1), [ws], low, Policy(preemption=False))
    kept = [jobs.running(ws, (0, 1), priority=LOW, preemptible=False), jobs.running(ws, (2, 3))]
    assert waits_whatever_the_order(jobs.queued(1), [ws], kept, Policy())
    assert not waits_whatever_the_order(jobs.queued(1, priority=HIGH), [ws], [jobs.running(ws, (0, 1, 2, 3))],
                                        Policy())


def test_queues_reservations_and_dependencies_always_mean_a_pass(ws, jobs):
    holding = [jobs.running(ws, (0, 1, 2, 3))]
    teams = Policy(queues=(QueueSpec("vision", 2, ("alice",)),))
    assert not waits_whatever_the_order(jobs.queued(1), [ws], holding, teams)
    assert not waits_whatever_the_order(jobs.queued(1, reservation="r1"), [ws], holding, Policy())
    assert not waits_whatever_the_order(jobs.queued(1, depends_on=(1,)), [ws], holding, Policy())


def test_the_gpus_of_a_node_that_is_down_count_for_nothing(jobs):
    up, down = make_node("ws1", "sim:ws-4x3090"), make_node("ws2", "sim:ws-4x3090", health=NodeHealth.LOST)
    holding = [jobs.running(up, (0, 1, 2, 3))]
    assert waits_whatever_the_order(jobs.queued(1), [up, down], holding, Policy())


def random_lab(rng: random.Random):
    nodes = [make_node(f"ws{i}", rng.choice(["sim:ws-4x3090", "sim:flat:2"])) for i in range(rng.randint(1, 3))]
    factory, holding = JobFactory(), []
    for node in nodes:
        free = list(range(node.gpu_count))
        while free and rng.random() < 0.93:
            take = free[:rng.choice([1, 1, 2, 4])]
            free = free[len(take):]
            holding.append(factory.running(node, tuple(take), priority=rng.choice([LOW, NORMAL, NORMAL, HIGH]),
                                           preemptible=rng.random() < 0.7, user=rng.choice(["ada", "bob"]),
                                           started_at=NOW - rng.choice([60, 3600])))
    queued = [factory.queued(rng.choice([1, 2, 4]), priority=rng.choice([LOW, NORMAL, HIGH]),
                             user=rng.choice(["ada", "bob", "cy"]), submitted_at=NOW - rng.uniform(10, 5000))
              for _ in range(rng.randint(0, 12))]
    new = factory.queued(rng.choice([1, 2, 4]), priority=rng.choice([LOW, NORMAL, HIGH]),
                         user=rng.choice(["ada", "bob", "cy"]), submitted_at=NOW)
    return nodes, holding, queued, new


def test_where_it_says_a_job_waits_a_pass_with_it_decides_as_one_without_it():
    rng = random.Random(19)
    said = 0
    for _ in range(600):
        nodes, holding, queued, new = random_lab(rng)
        policy = Policy(hold_depth=rng.choice([0, 16]), aging_s=rng.choice([None, 3600.0]))
        if not waits_whatever_the_order(new, nodes, holding, policy):
            continue
        said += 1
        without = schedule(holding + queued, nodes, now=NOW, policy=policy)
        with_it = schedule(holding + queued + [new], nodes, now=NOW, policy=policy)
        assert with_it.starts == without.starts and with_it.preemptions == without.preemptions
        assert [p for p in with_it.pending if p.job_id != new.id] == list(without.pending)
        assert [p.job_id for p in with_it.pending if p.job_id == new.id] == [new.id]
    assert said >= 100, f"only {said} labs where a submit waits whatever the order: the check saw too few"
