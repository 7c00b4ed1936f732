"""A booking's end, or its cancellation, is a state change: its waiting jobs leave it, it stays listed.

The leader runs on a fake clock the tests move, with a memory store; every case
ends by checking that no pending reason names a reservation the leader does not
hold (``labq why`` must never send a user looking for a booking that is gone).
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from labq.leader.auth import Principal
from labq.leader.bookings import KEEP_OVER_S
from labq.leader.config import LeaderConfig
from labq.leader.core import Leader
from labq.leader.state import AgentSession
from labq.models import JobState, Node, NodeHealth
from labq.protocol.bookings import parse_reserve
from labq.protocol.errors import ApiError
from labq.protocol.requests import parse_action, parse_submit
from labq.store import MemoryStore
from labq.topologies import parse_sim_spec
from tests.conftest import FakeClock

ALICE = Principal("user", "alice")
T0 = 100_000.0


@pytest.fixture
def lab(tmp_path):
    clock = FakeClock(T0)
    leader = Leader(LeaderConfig(data_dir=tmp_path), MemoryStore(), clock=clock)
    for name in ("ws1", "ws2"):
        inv = parse_sim_spec("sim:ws-4x3090")
        leader.state.agents[name] = AgentSession(name, Node(name, inv.gpus(name), inv.topology, simulated=True), "x",
                                                 None, None, last_seen=clock.now)
    yield leader, clock
    leader.stop()


def book(leader: Leader, name: str, gpus: int, start: float, end: float, **extra) -> None:
    answer, booked, _ = leader.bookings.reserve(ALICE, parse_reserve({"name": name, "gpus": gpus, "start": start,
                                                                   "end": end, **extra}))
    assert booked, answer.reasons


def submit(leader: Leader, **fields) -> int:
    return leader.queue.submit(ALICE, parse_submit({"command": ["train"], **fields})).id


def step(leader: Leader, clock: FakeClock, to: float) -> None:
    clock.now = to
    for session in leader.state.agents.values():
        session.last_seen = to  # the agents are alive; which nodes are up is the test's choice
    leader.scheduling.tick()
    leader.scheduling.schedule_pass()
    named = {m for p in leader.state.pending.values() for m in re.findall(r"reservation '([^']+)'", p.detail)}
    assert named <= leader.bookings.by_name.keys(), f"a pending reason names a reservation that is gone: {named}"


def test_jobs_waiting_at_a_bookings_end_are_queued_normally_or_cancelled_as_their_submitter_chose(lab):
    leader, clock = lab
    book(leader, "quick", 1, T0 + 120, T0 + 720)
    gate = submit(leader, gpus=1, node="ws2")  # a dependency that stays unfinished past the end
    step(leader, clock, T0 + 1)
    keep = submit(leader, reservation="quick", depends_on=[gate])
    drop = submit(leader, reservation="quick", depends_on=[gate], after_reservation="cancel")
    step(leader, clock, T0 + 300)
    assert "waits for job" in leader.state.pending[keep].detail

    step(leader, clock, T0 + 720)
    jobs = leader.state.jobs
    assert drop not in jobs and leader.state.finished[drop] is JobState.CANCELLED
    assert jobs[keep].state is JobState.QUEUED and jobs[keep].spec.reservation is None
    assert jobs[keep].note == "reservation 'quick' ended; released to the normal queue"
    assert "reservation" not in leader.state.pending[keep].detail  # it waits for its dependency, like any job
    archived = {doc["id"]: doc for doc in leader.state.store.history()}
    assert archived[drop]["note"] == ("cancelled: reservation 'quick' ended before it started "
                                      "(--after-reservation cancel)")
    assert leader.bookings.by_name["quick"].state(clock.now) == "ended"


def test_a_booking_cancelled_while_its_jobs_wait_releases_them_in_the_same_commit(lab):
    leader, clock = lab
    book(leader, "later", 4, T0 + 3600, T0 + 7200, node="ws1")
    job = submit(leader, gpus=4, reservation="later")
    step(leader, clock, T0 + 5)
    assert leader.state.pending[job].detail == "reservation 'later' starts in 59m"

    r = leader.bookings.cancel(ALICE, "later")
    assert r.cancelled_at == T0 + 5 and leader.state.jobs[job].spec.reservation is None
    assert leader.state.jobs[job].note == "reservation 'later' was cancelled; released to the normal queue"
    step(leader, clock, T0 + 6)
    assert leader.state.jobs[job].state is JobState.STARTING  # four GPUs of ws1 or ws2 were free all along
    assert [x.name for x in leader.bookings.view(ALICE)] == []
    assert [(x.name, x.state(clock.now)) for x in leader.bookings.view(ALICE, everything=True)] == [
        ("later", "cancelled")]
    with pytest.raises(ApiError, match="already cancelled"):
        leader.bookings.cancel(ALICE, "later")
    with pytest.raises(ApiError, match="reservation 'later' is cancelled"):
        submit(leader, reservation="later")


def test_back_to_back_bookings_of_one_user_keep_their_jobs_apart(lab):
    leader, clock = lab
    book(leader, "day1", 4, T0 + 60, T0 + 660, node="ws1")
    book(leader, "day2", 4, T0 + 660, T0 + 1260, node="ws1")  # touching windows do not overlap
    held = submit(leader, gpus=4, reservation="day1")
    leader.queue.act(ALICE, held, parse_action({"action": "hold"}))
    next_day = submit(leader, gpus=4, reservation="day2")
    step(leader, clock, T0 + 100)
    assert leader.state.pending[next_day].detail == "reservation 'day2' starts in 9m"

    step(leader, clock, T0 + 660)
    jobs = leader.state.jobs
    assert jobs[held].state is JobState.HELD and jobs[held].spec.reservation is None  # not moved into day2
    assert jobs[next_day].state is JobState.STARTING and jobs[next_day].spec.reservation == "day2"
    assert {a.node for a in jobs[next_day].placement.allocations} == {"ws1"}


def test_a_booking_whose_node_went_down_is_repinned_and_its_jobs_follow_it(lab):
    leader, clock = lab
    book(leader, "paper", 2, T0 + 600, T0 + 1200, node="ws1")
    job = submit(leader, gpus=2, reservation="paper")
    session = leader.state.agents["ws1"]
    session.node = replace(session.node, health=NodeHealth.DOWN)
    step(leader, clock, T0 + 10)
    r = leader.bookings.by_name["paper"]
    assert r.node == "ws2" and "re-pinned from ws1 (down) to ws2" in r.note
    step(leader, clock, T0 + 600)
    assert leader.state.jobs[job].state is JobState.STARTING
    assert leader.state.jobs[job].placement.allocations[0].node == "ws2"


def test_an_ended_booking_is_listed_for_a_week_then_forgotten_and_refuses_new_jobs_meanwhile(lab):
    leader, clock = lab
    book(leader, "short", 1, T0, T0 + 60)
    step(leader, clock, T0 + 61)
    with pytest.raises(ApiError, match="reservation 'short' is ended"):
        submit(leader, reservation="short")
    step(leader, clock, T0 + 60 + KEEP_OVER_S - 1)
    assert [r.name for r in leader.bookings.view(ALICE, everything=True)] == ["short"]
    step(leader, clock, T0 + 60 + KEEP_OVER_S)
    assert leader.bookings.view(ALICE, everything=True) == []
    book(leader, "short", 1, clock.now, clock.now + 60)  # the name is free again


def test_a_pin_moves_to_a_gpu_that_freed_up_before_any_job_is_signalled_for_it(lab):
    from labq.models import transitions as t

    leader, clock = lab
    leader.state.agents["ws2"].node = replace(leader.state.agents["ws2"].node, health=NodeHealth.DOWN)
    ids = [submit(leader, gpus=1) for _ in range(4)]  # one on each GPU of ws1, none with a time limit
    step(leader, clock, T0 + 1)
    with leader.state.lock:
        leader.state.apply([t.running(leader.state.jobs[i], T0 + 1) for i in ids])
    answer, booked, _ = leader.bookings.reserve(ALICE, parse_reserve({"name": "soon", "gpus": 1,
                                                                      "start": T0 + 3600, "end": T0 + 7200}))
    [victim] = answer.displaced
    pinned = answer.reservation.gpu_indices
    gone = next(i for i in ids if i != victim.job_id)
    freed = leader.state.jobs[gone].placement.allocations[0].gpu_indices
    with leader.state.lock:
        leader.state.apply([t.exited(leader.state.jobs[gone], 0, T0 + 60)])
    seq = leader.state.events.seq

    step(leader, clock, T0 + 61)
    r = leader.bookings.by_name["soon"]
    assert r.gpu_indices == freed != pinned and r.note.endswith("displaces nothing")
    assert [e.data["state"] for e in leader.state.events.after(seq, 0) if e.kind == "reservation"] == ["moved"]
    step(leader, clock, T0 + 3600 - 30)  # a grace before the start: nothing is drained for it
    assert leader.state.jobs[victim.job_id].state is JobState.RUNNING
