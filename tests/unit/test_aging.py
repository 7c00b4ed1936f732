"""Nothing starves: a job that has waited the aging wait is served before every low and normal job that has
waited less, oldest first (``labq.scheduler.policy.served_priority``), never before high or urgent; and a low
job behind an endless stream of normal work starts within the aging bound, on the simulator's virtual clock."""

from __future__ import annotations

import pytest

from labq.models.job import Attempt, AttemptEnd
from labq.scheduler.policy import AGING_CAP, Policy, order_queue, served_priority
from labq.sim.engine import SimOptions, simulate
from labq.sim.model import TraceJob, Workload
from tests.conftest import NOW, make_node

HOUR = 3600.0
DAY = 24 * HOUR


@pytest.mark.parametrize("priority, waited, aging, served", [
    (100, 10 * HOUR, None, 100),  # no aging: as submitted
    (100, DAY - 1, DAY, 100),  # not past the aging wait yet
    (100, DAY, DAY, AGING_CAP),  # aged: just below high, whatever its class
    (200, DAY, DAY, AGING_CAP),
    (250, 30 * DAY, DAY, AGING_CAP),
    (100, 30 * DAY, DAY, AGING_CAP),
    (300, 30 * DAY, DAY, 300),  # high and urgent never age
    (400, 30 * DAY, DAY, 400),
    (299, 30 * DAY, DAY, 299),
])
def test_a_job_that_has_waited_the_aging_wait_is_served_just_below_high(jobs, priority, waited, aging, served):
    job = jobs.queued(priority=priority, submitted_at=NOW - waited)
    assert served_priority(job, NOW, aging) == served


def test_a_requeued_job_ages_from_its_return_to_the_queue_not_from_its_submit(jobs):
    job = jobs.queued(priority=100, submitted_at=NOW - 10 * DAY)
    back = job.evolve(attempt=2, history=(Attempt(1, None, NOW - 10 * DAY, NOW - HOUR, AttemptEnd.PREEMPTED),))
    assert served_priority(job, NOW, DAY) == AGING_CAP and served_priority(back, NOW, DAY) == 100


def test_the_aged_go_first_oldest_first_and_fair_share_still_orders_the_young(jobs):
    old_low = jobs.queued(priority=100, user="cy", submitted_at=NOW - 3 * DAY)
    older_normal = jobs.queued(priority=200, user="cy", submitted_at=NOW - 4 * DAY)
    aged_low = jobs.queued(priority=100, user="ann", submitted_at=NOW - 2 * DAY)
    normal = jobs.queued(priority=200, user="bob", submitted_at=NOW - HOUR)
    heavy = jobs.queued(priority=200, user="cy", submitted_at=NOW - 2 * HOUR)
    high = jobs.queued(priority=300, user="cy", submitted_at=NOW - 60)
    usage = {"cy": 9.0}  # cy has used the most: fair share puts cy last among equals, but not among the aged
    everyone = [normal, heavy, old_low, high, aged_low, older_normal]
    assert order_queue(everyone, usage, NOW, DAY) == [high, older_normal, old_low, aged_low, normal, heavy]
    assert order_queue(everyone, usage) == [high, normal, older_normal, heavy, aged_low, old_low]  # no aging


def stream(low_at: float) -> Workload:
    """One 4-GPU node's worth of normal work arriving faster than it runs, for four days, and one low job."""
    normal = [TraceJob(i + 1, submit=i * 0.5 * HOUR, duration=HOUR, gpus=4, user="busy") for i in range(192)]
    low = TraceJob(len(normal) + 1, submit=low_at, duration=HOUR, gpus=4, user="patient", priority=100)
    return Workload(tuple(sorted([*normal, low], key=lambda j: j.submit)))


@pytest.mark.parametrize("aging_h", [6.0, 12.0])
def test_a_low_job_behind_an_endless_normal_stream_starts_within_the_aging_bound(aging_h):
    node = [make_node("ws1", "sim:ws-4x3090")]
    low_at = 2 * HOUR
    never = simulate(stream(low_at), node, "labq", options=SimOptions())
    low = next(o for o in never.outcomes if o.job.priority == 100)
    assert low.start is None or low.start > 90 * HOUR  # without aging it waits out the whole stream
    aged = simulate(stream(low_at), node, "labq", options=SimOptions(aging_s=aging_h * HOUR))
    low = next(o for o in aged.outcomes if o.job.priority == 100)
    # the bound: once it has waited the aging wait it goes before every job that has waited less, so only
    # the normal jobs submitted before it still waiting then run first (one at a time, an hour each), and
    # the one running when it is first in line
    ahead = sum(1 for o in aged.outcomes if o.job.priority == 200 and o.job.submit <= low_at)
    assert low.start is not None and low.start <= low_at + aging_h * HOUR + (ahead + 1) * HOUR, (low.start / HOUR,
                                                                                                  ahead)
    assert low.start >= low_at + aging_h * HOUR  # not before the aging wait: until then the stream goes first


def test_while_no_job_has_waited_the_aging_wait_every_decision_is_as_without_aging():
    node = [make_node("ws1", "sim:ws-4x3090")]
    plain = simulate(stream(2 * HOUR), node, "labq", options=SimOptions())
    late = simulate(stream(2 * HOUR), node, "labq", options=SimOptions(aging_s=1000 * DAY))
    assert [(o.job.id, o.start, o.end) for o in late.outcomes] == [(o.job.id, o.start, o.end) for o in plain.outcomes]
    assert Policy().aging_s is None  # the pure core's default (the golden tests); the leader's is 24 h


def test_why_a_job_waits_says_that_it_has_aged(jobs):
    from labq.scheduler import schedule

    node = make_node("ws1", "sim:ws-4x3090")
    running = jobs.running(node, (0, 1, 2, 3), user="busy")
    low = jobs.queued(gpus=4, priority=100, user="patient", submitted_at=NOW - 2.5 * DAY)
    decisions = schedule([running, low], [node], now=NOW, policy=Policy(aging_s=DAY))
    why = next(p for p in decisions.pending if p.job_id == low.id)
    assert why.detail.endswith("; it has waited over 24h 00m (the aging wait), so it is served as 299, before every "
                               "low and normal job that has waited less"), why.detail
    plain = schedule([running, low], [node], now=NOW, policy=Policy())
    assert "aging" not in next(p for p in plain.pending if p.job_id == low.id).detail
