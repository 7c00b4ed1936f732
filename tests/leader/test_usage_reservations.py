"""``labq usage``'s reservations: each booking's GPU-hours booked in the window (up to a cancel) beside the
GPU-hours the jobs in it used there, checked against numbers worked out by hand; and a booking the leader
forgets a week after it is over stays in the ledger, so a month's report still knows it."""

from __future__ import annotations

import pytest

from labq.leader.auth import Principal
from labq.leader.config import LeaderConfig
from labq.leader.core import Leader
from labq.leader.state import AgentSession
from labq.models import JobState
from labq.models import transitions as t
from labq.models.usage import Booking, JobUse, Run, reserved_rows
from labq.protocol.bookings import parse_reserve
from labq.protocol.requests import parse_submit
from labq.protocol.usage import UsageQuery, encode_usage
from labq.store import MemoryStore
from tests.conftest import FakeClock, make_node

H = 3600.0
T0 = 1_790_000_000.0
ALICE = Principal("user", "alice")
ROOT = Principal("user", "root", admin=True)


def use(job_id: int, reservation: str | None, *runs: tuple[float, float, int]) -> JobUse:
    return JobUse(job_id, "alice", "normal", 0.0, None, None,
                  tuple(Run(s, e, g, False, 0.0, ()) for s, e, g in runs), True, reservation)


def test_booked_and_used_are_counted_inside_the_window_and_a_name_used_twice_is_two_bookings():
    paper = Booking("paper", "alice", "ws1", 2, 10 * H, 20 * H)
    again = Booking("paper", "alice", "ws1", 1, 40 * H, 44 * H)  # the name booked again, later
    called_off = Booking("demo", "bob", "ws2", 4, 12 * H, 30 * H, cancelled_at=15 * H)
    outside = Booking("old", "bob", None, 8, 0.0, 5 * H)
    uses = [use(1, "paper", (11 * H, 18 * H, 2)),  # 6 of its 7 hours in the window: 12 GPU-h
            use(2, "paper", (41 * H, 43 * H, 1)),  # the second booking's: after the window
            use(3, None, (12 * H, 20 * H, 2)),  # in no booking
            use(4, "demo", (13 * H, 14 * H, 4))]  # 4 GPU-h in the cancelled one
    rows = reserved_rows([again, outside, called_off, paper], uses, 12 * H, 30 * H)
    assert [(r.name, r.owner, r.booked_gpu_hours, r.used_gpu_hours) for r in rows] == [
        ("paper", "alice", 16.0, 12.0),  # booked 12h..20h of 10h..20h: 2 GPUs x 8 h
        ("demo", "bob", 12.0, 4.0)]  # booked 12h..15h (the cancel): 4 GPUs x 3 h


@pytest.fixture
def lab(tmp_path):
    clock = FakeClock(T0)
    leader = Leader(LeaderConfig(data_dir=tmp_path, reservation_at_end="keep"), MemoryStore(), clock=clock)
    node = make_node("ws1", "sim:ws-4x3090")
    leader.state.agents["ws1"] = AgentSession("ws1", node, "x", None, None, last_seen=clock.now)
    yield leader, clock
    leader.stop()


def test_a_forgotten_booking_is_still_in_a_report_of_its_month(lab):
    leader, clock = lab
    answer, booked, _ = leader.bookings.reserve(ALICE, parse_reserve(
        {"name": "paper", "gpus": 2, "start": T0 + H, "end": T0 + 5 * H}))
    assert booked, answer.reasons
    clock.now = T0 + H
    job = leader.queue.submit(ALICE, parse_submit({"command": ["train"], "gpus": 2, "reservation": "paper",
                                                   "workdir": "/tmp"}))
    leader.scheduling.schedule_pass()
    with leader.state.lock:
        placed = leader.state.jobs[job.id]
        assert placed.state is JobState.STARTING
        leader.state.apply([t.running(placed, T0 + H)])
    clock.now = T0 + 3 * H
    with leader.state.lock:
        leader.state.apply([t.exited(leader.state.jobs[job.id], 0, clock.now)])
    clock.now = T0 + 5 * H + 8 * 86400  # a week after the booking ended: the leader forgets it
    for session in leader.state.agents.values():
        session.last_seen = clock.now
    leader.scheduling.tick()
    assert "paper" not in leader.bookings.by_name
    assert [b.name for b in leader.bookings.ledger.values()] == ["paper"]
    answer = encode_usage(leader.accounting.usage(ROOT, UsageQuery(T0, clock.now, None)))
    assert answer["reservations"] == [{"name": "paper", "owner": "alice", "node": "ws1", "start": T0 + H,
                                       "end": T0 + 5 * H, "booked_gpu_hours": 8.0, "used_gpu_hours": 4.0}]
    mine = encode_usage(leader.accounting.usage(ALICE, UsageQuery(T0, clock.now, "alice")))
    assert [r["name"] for r in mine["reservations"]] == ["paper"]
    bob = encode_usage(leader.accounting.usage(Principal("user", "bob"), UsageQuery(T0, clock.now, "bob")))
    assert bob["reservations"] == []
