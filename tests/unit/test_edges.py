"""When time alone may change a pass's decisions (``labq.scheduler.edges.next_edge``): the moments the leader
passes at besides changes."""

from __future__ import annotations

from labq.models.job import Attempt, AttemptEnd, StopReason
from labq.models.queues import QueueSpec
from labq.models.reservation import Reservation
from labq.scheduler.edges import next_edge
from labq.scheduler.policy import Policy
from tests.conftest import NOW, make_node


def test_a_running_preemptible_job_reaching_its_minimum_runtime_is_an_edge_and_a_firm_one_is_not(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    soft = jobs.running(node, (0,), started_at=NOW - 100)
    firm = jobs.running(node, (1,), started_at=NOW - 200, preemptible=False)
    assert next_edge([soft, firm], [], Policy(min_runtime_s=300), NOW) == NOW + 200
    assert next_edge([firm], [], Policy(min_runtime_s=300), NOW) is None
    assert next_edge([soft], [], Policy(min_runtime_s=300, preemption=False), NOW) is None
    assert next_edge([jobs.running(node, (2,), started_at=NOW - 400)], [], Policy(min_runtime_s=300), NOW) is None


def test_aging_a_maximum_wait_and_borrowing_again_are_edges_of_a_waiting_job(jobs):
    waiting = jobs.queued(submitted_at=NOW - 1000, queue="nlp")
    assert next_edge([waiting], [], Policy(aging_s=3600), NOW) == NOW + 2600
    queues = (QueueSpec("nlp", guarantee_gpus=1, max_wait_s=1800),)
    assert next_edge([waiting], [], Policy(queues=queues), NOW) == NOW + 800
    back = waiting.evolve(attempt=2, history=(Attempt(1, None, NOW - 900, NOW - 100, AttemptEnd.CHECKPOINTED,
                                                      stop_reason=StopReason.PREEMPTED),))
    assert next_edge([back], [], Policy(queues=(QueueSpec("nlp", guarantee_gpus=1),), min_runtime_s=300),
                     NOW) == NOW + 200  # it may borrow again
    assert next_edge([back], [], Policy(min_runtime_s=300), NOW) is None  # no queues: nothing to borrow


def test_a_reservation_drains_a_grace_before_its_start_starts_and_ends(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    r = Reservation("paper", "ann", 2, NOW + 1000, NOW + 5000, node="ws", gpu_indices=(0, 1))
    job = jobs.running(node, (0,), started_at=NOW - 4000, grace_s=120)
    assert next_edge([job], [r], Policy(), NOW) == NOW + 1000 - 120
    assert next_edge([job], [r], Policy(), NOW + 900) == NOW + 1000
    assert next_edge([job], [r], Policy(), NOW + 1000) == NOW + 5000
    assert next_edge([job], [r], Policy(), NOW + 5000) is None
