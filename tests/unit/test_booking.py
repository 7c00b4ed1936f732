"""Booking answers as tables: what gets pinned, what is displaced, why a booking is refused, what would work."""

from __future__ import annotations

import pytest

from labq.models import NodeHealth, Reservation
from labq.scheduler.booking import BookingLimits, book, booked_hours, repin, week_of
from tests.conftest import NOW, make_node
from datetime import UTC

H = 3600.0
FREE = BookingLimits(max_gpu_hours_per_week=None, max_lead_s=None, max_duration_s=None)


def ask(gpus: int, start: float = NOW + 24 * H, hours: float = 2, *, name: str = "paper", owner: str = "alice",
        **kw) -> Reservation:
    return Reservation(name, owner, gpus, start, start + hours * H, **kw)


def pinned(r: Reservation, node: str, gpus: tuple[int, ...]) -> Reservation:
    return Reservation(r.name, r.owner, len(gpus), r.start, r.end, node=node, gpu_indices=gpus)


def test_an_empty_lab_pins_the_best_connected_set():
    ws = make_node("ws", "sim:ws-4x3090")
    answer = book(ask(2), [ws], [], [], now=NOW, limits=FREE)
    assert answer.accepted and answer.reasons == ()
    r = answer.reservation
    assert (r.node, r.gpu_indices, r.score, r.created_at) == ("ws", (0, 1), 4002, NOW)  # an NVLink pair


@pytest.mark.parametrize(("start_h", "hours", "accepted"), [
    (22, 2, True),  # ends exactly when the other starts: windows that touch do not overlap
    (26, 1, True),  # starts exactly when the other ends
    (23, 2, False), (25, 2, False), (24, 1, False), (20, 10, False),
])
def test_two_bookings_never_hold_a_gpu_at_the_same_time(start_h, hours, accepted):
    ws = make_node("ws", "sim:ws-4x3090")
    first = book(ask(4), [ws], [], [], now=NOW, limits=FREE).reservation  # 24 h to 26 h from now
    answer = book(ask(1, NOW + start_h * H, hours, name="other"), [ws], [first], [], now=NOW, limits=FREE)
    assert answer.accepted is accepted
    if not accepted:
        assert answer.reasons == ("capacity: overlapping bookings: paper",)
        assert answer.alternatives, "a refusal offers something that works"
        for alt in answer.alternatives:  # each alternative is really free
            again = book(ask(alt.gpus, alt.start, (alt.end - alt.start) / H, name="alt"), [ws], [first], [],
                         now=NOW, limits=FREE)
            assert again.accepted, alt


def test_the_nearest_windows_and_a_smaller_set_are_offered():
    ws = make_node("ws", "sim:ws-4x3090")
    taken = pinned(ask(1, NOW + 10 * H, 4, name="gpu3"), "ws", (3,))
    answer = book(ask(4, NOW + 11 * H, 2), [ws], [taken], [], now=NOW, limits=FREE)
    assert not answer.accepted
    windows = [round((a.start - NOW) / H, 1) for a in answer.alternatives if a.gpus == 4]  # whole minutes
    assert sorted(windows) == [8, 14]  # 3 h earlier (ending as gpu3 starts) and 3 h later (as it ends)
    smaller = [a for a in answer.alternatives if a.gpus < 4]
    assert [(a.gpus, a.start, a.gpu_indices) for a in smaller] == [(3, NOW + 11 * H, (0, 1, 2))]


def test_running_jobs_are_displaced_only_when_they_would_still_run(jobs):
    ws = make_node("ws", "sim:ws-4x3090")
    start = NOW + 2 * H
    endless = jobs.running(ws, (0,), started_at=NOW - H, grace_s=120)  # preemptible, no limit
    done_by_then = jobs.running(ws, (1,), started_at=NOW - H, time_limit_s=2 * H)  # ends at NOW + 1 h
    other = pinned(ask(2, start, name="other"), "ws", (2, 3))  # the idle pair is booked: 0,1 is all there is
    answer = book(ask(2, start), [ws], [other], [endless, done_by_then], now=NOW, limits=FREE)
    assert answer.reservation.gpu_indices == (0, 1)
    assert [(d.job_id, d.signal_at) for d in answer.displaced] == [(endless.id, start - 120)]
    # 1 GPU x (work since its start an hour ago, to its signal 2 min before the start, + its 2 min grace)
    assert [(d.gpus, d.gpu_seconds_lost) for d in answer.displaced] == [(1, 3 * H)]


def test_jobs_that_cannot_be_preempted_keep_their_gpus(jobs):
    ws = make_node("ws", "sim:ws-4x3090")
    protected = jobs.running(ws, (0,), preemptible=False)
    answer = book(ask(2), [ws], [], [protected], now=NOW, limits=FREE)
    assert answer.reservation.gpu_indices == (2, 3)  # the other NVLink pair
    refused = book(ask(4), [ws], [], [protected], now=NOW, limits=FREE)
    assert refused.reasons == (f"capacity: jobs that cannot be preempted and may still run then: {protected.id}",)
    assert [a.gpus for a in refused.alternatives] == [3]


def test_filters_and_nodes_that_are_not_up():
    a100 = make_node("big", "sim:dgx-a100")
    ws = make_node("ws", "sim:ws-4x3090")
    assert book(ask(2, gpu_model="a100"), [ws, a100], [], [], now=NOW, limits=FREE).reservation.node == "big"
    assert book(ask(2, min_gpu_memory_mib=30 * 1024), [ws, a100], [], [], now=NOW,
                limits=FREE).reservation.node == "big"
    assert book(ask(2, node="ws"), [ws, a100], [], [], now=NOW, limits=FREE).reservation.node == "ws"
    lost = make_node("big", "sim:dgx-a100", health=NodeHealth.LOST)
    refused = book(ask(2, gpu_model="a100"), [ws, lost], [], [], now=NOW, limits=FREE)
    assert refused.reasons == ("capacity: no node has 2 suitable GPUs (the most is 0)",)
    assert book(ask(8), [ws], [], [], now=NOW, limits=FREE).reasons == (
        "capacity: no node has 8 GPUs (the most is 4)",)
    assert "there is no node 'ws9'" in book(ask(1, node="ws9"), [ws], [], [], now=NOW).reasons[0]
    lost_ws = make_node("ws", "sim:ws-4x3090", health=NodeHealth.LOST)
    assert book(ask(1), [lost_ws, lost], [], [], now=NOW, limits=FREE).reasons == (
        "capacity: no node that is up (ws is lost, big is lost)",)
    assert book(ask(1, node="ws"), [lost_ws, lost], [], [], now=NOW, limits=FREE).reasons == (
        "capacity: no node that is up (ws is lost)",)


def test_limits_refuse_with_alternatives_inside_them_and_admins_are_exempt():
    ws = make_node("ws", "sim:ws-4x3090")
    limits = BookingLimits(max_gpu_hours_per_week=10, max_lead_s=7 * 24 * H, max_duration_s=48 * H)
    start = week_of(NOW) + 7 * 24 * H - 6 * H  # Sunday 18:00 UTC, the end of a booking week
    mine = pinned(ask(2, start - 10 * H, 4, name="earlier"), "ws", (2, 3))  # 8 GPU-hours that week
    now = start - 24 * H
    assert booked_hours("alice", week_of(start), [mine], now) == 8
    answer = book(ask(2, start, 2), [ws], [mine], [], now=now, limits=limits)
    assert answer.reasons == ("quota: alice may book 10 GPU-hours a week and has 8 booked that week; this one is 4",)
    # Monday, when the quota renews; or one GPU, which fits the 2 GPU-hours left
    assert [(a.gpus, a.start) for a in answer.alternatives] == [(2, start + 6 * H), (1, start)]
    assert book(ask(2, start, 1), [ws], [mine], [], now=now, limits=limits).accepted  # exactly the 10
    assert book(ask(2, start, 2, owner="bob"), [ws], [mine], [], now=now, limits=limits).accepted
    assert book(ask(2, start, 2), [ws], [mine], [], now=now, limits=limits, exempt=True).accepted
    limits = BookingLimits(max_gpu_hours_per_week=None, max_lead_s=7 * 24 * H, max_duration_s=48 * H)
    too_long = book(ask(1, now + H, 72), [ws], [], [], now=now, limits=limits)
    assert too_long.reasons == ("a booking may last at most 2 days; this one is 3 days",)
    assert {a.end - a.start for a in too_long.alternatives} == {48 * H}
    too_far = book(ask(1, now + 10 * 24 * H, 1), [ws], [], [], now=now, limits=limits)
    assert too_far.reasons == ("a booking may start at most 7 days ahead; this one starts in 10 days",)


def test_a_name_in_use_is_refused():
    ws = make_node("ws", "sim:ws-4x3090")
    first = book(ask(1), [ws], [], [], now=NOW, limits=FREE).reservation
    assert "exists" in book(ask(1, NOW + 100 * H), [ws], [first], [], now=NOW).reasons[0]


def test_a_reservation_whose_node_is_lost_is_repinned_elsewhere(jobs):
    ws1, ws2 = make_node("ws1", "sim:ws-4x3090"), make_node("ws2", "sim:ws-4x3090")
    r = book(ask(2), [ws1, ws2], [], [], now=NOW, limits=FREE).reservation
    gone = make_node(r.node, "sim:ws-4x3090", health=NodeHealth.LOST)
    other = ws2 if r.node == "ws1" else ws1
    moved = repin(r, [gone, other], [r], [], now=NOW, why="lost")
    assert moved.node == other.name and moved.gpu_indices == (0, 1)
    assert moved.note == f"re-pinned from {r.node} (lost) to {other.name}"
    busy = jobs.running(other, (0, 1, 2), preemptible=False)
    assert repin(r, [gone, other], [r], [busy], now=NOW, why="lost") is None


@pytest.mark.parametrize(("iso", "monday"), [
    ("2026-11-23T00:00:00", "2026-11-23"), ("2026-11-29T23:59:59", "2026-11-23"), ("2026-11-30T00:00:00", "2026-11-30"),
    ("1970-01-01T00:00:00", "1969-12-29"),
])
def test_booking_weeks_start_on_monday_utc(iso, monday):
    from datetime import datetime

    t = datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp()
    assert datetime.fromtimestamp(week_of(t), UTC).date().isoformat() == monday
