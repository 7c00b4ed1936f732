"""Booking by need: the earliest and the latest window that finish by a deadline, as tables and against
a minute-by-minute scan of every start with the booking code itself."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from labq.models import Reservation
from labq.scheduler.booking import BookingLimits, book, week_of
from labq.models.reservation import DeadlineWindows, Window
from labq.scheduler.deadline import windows_by
from tests.conftest import JobFactory, make_node

NOW = 999_960.0  #: a whole minute: the windows' starts are whole minutes, which people can type back
H = 3600.0
FREE = BookingLimits(max_gpu_hours_per_week=None, max_lead_s=None, max_duration_s=None)


def need(gpus: int, *, owner: str = "alice", node: str | None = None) -> Reservation:
    return Reservation("want", owner, gpus, NOW, NOW + 1, node=node)  # the window is the search's


def taken(name: str, gpus: tuple[int, ...], start_h: float, end_h: float, owner: str = "bob") -> Reservation:
    return Reservation(name, owner, len(gpus), NOW + start_h * H, NOW + end_h * H, node="ws", gpu_indices=gpus)


def hours(w: DeadlineWindows) -> tuple:
    return tuple(None if x is None else ((x.start - NOW) / H, (x.end - NOW) / H) for x in (w.earliest, w.latest))


@pytest.mark.parametrize(("gpus", "length_h", "by_h", "expected"), [
    (4, 5, 30, ((0, 5), (25, 30))),  # before the other booking, or after it up to the deadline
    (4, 12, 30, (None, None)),  # 12 h fit neither before 10 h nor between 20 h and 30 h
    (4, 12, 40, ((20, 32), (28, 40))),
    (4, 10, 30, ((0, 10), (20, 30))),  # touching windows do not overlap, at both ends
    (2, 12, 30, ((0, 12), (18, 30))),  # two GPUs the other booking leaves free
    (4, 31, 30, (None, None)),  # longer than the time left
])
def test_the_earliest_and_latest_windows_around_another_booking(gpus, length_h, by_h, expected):
    ws = make_node("ws", "sim:ws-4x3090")
    other = taken("other", (0, 1), 10, 20) if gpus == 2 else taken("other", (0, 1, 2, 3), 10, 20)
    got = windows_by(need(gpus), length_h * H, NOW + by_h * H, [ws], [other], [], now=NOW, limits=FREE)
    assert hours(got) == expected


def test_a_job_that_cannot_be_preempted_delays_the_earliest_start_and_a_preemptible_one_does_not():
    ws, jobs = make_node("ws", "sim:ws-4x3090"), JobFactory()
    stays = jobs.running(ws, (0, 1), started_at=NOW - H, preemptible=False, time_limit_s=3.5 * H)  # until 2.5 h
    moves = jobs.running(ws, (2, 3), started_at=NOW - H)  # preemptible, no limit
    got = windows_by(need(4), 2 * H, NOW + 8 * H, [ws], [], [stays, moves], now=NOW, limits=FREE)
    assert hours(got) == ((2.5, 4.5), (6, 8))
    no_limit = jobs.running(ws, (0, 1), started_at=NOW - H, preemptible=False)  # may run for ever
    assert windows_by(need(4), 2 * H, NOW + 8 * H, [ws], [], [no_limit], now=NOW, limits=FREE) == \
        DeadlineWindows(None, None)


def test_the_admins_limits_bound_both_ends():
    ws = make_node("ws", "sim:ws-4x3090")
    lead = BookingLimits(max_gpu_hours_per_week=None, max_lead_s=24 * H, max_duration_s=None)
    got = windows_by(need(1), H, NOW + 72 * H, [ws], [], [], now=NOW, limits=lead)
    assert hours(got) == ((0, 1), (24, 25))  # the latest start is as far ahead as one may book
    assert hours(windows_by(need(1), H, NOW + 72 * H, [ws], [], [], now=NOW, limits=lead, exempt=True)) == (
        (0, 1), (71, 72))  # admins are exempt
    monday = week_of(NOW) + 7 * 86400
    spent = Reservation("spent", "alice", 4, NOW + H, NOW + 23 * H, node="ws", gpu_indices=(0, 1, 2, 3))
    quota = BookingLimits(max_gpu_hours_per_week=100, max_lead_s=None, max_duration_s=None)
    by = monday + 48 * H
    got = windows_by(need(4), 5 * H, by, [ws], [spent], [], now=NOW, limits=quota)  # 88 booked this week: 20 more
    assert got.earliest == Window(monday, monday + 5 * H)  # is over the quota until the week renews
    assert got.latest == Window(by - 5 * H, by)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_the_windows_are_the_first_and_last_minute_a_booking_is_accepted(data):
    """Against a scan of every whole-minute start with ``book`` itself, on small random labs."""
    ws = make_node("ws", "sim:ws-4x3090")
    jobs, others = JobFactory(), []
    for i in range(data.draw(st.integers(0, 3))):
        gpus = tuple(sorted(data.draw(st.sets(st.integers(0, 3), min_size=1, max_size=4))))
        start = data.draw(st.integers(0, 300)) * 60
        others.append(Reservation(f"b{i}", "bob", len(gpus), NOW + start, NOW + start + data.draw(
            st.integers(1, 240)) * 60, node="ws", gpu_indices=gpus))
    running = []
    for gpu in range(4):
        if data.draw(st.booleans()):
            limit = data.draw(st.sampled_from([None, 1800.0, 5400.0, 9000.0]))
            running.append(jobs.running(ws, (gpu,), started_at=NOW - 900, preemptible=data.draw(st.booleans()),
                                        time_limit_s=limit))
    gpus = data.draw(st.integers(1, 4))
    length = data.draw(st.integers(1, 180)) * 60
    by = NOW + data.draw(st.integers(1, 360)) * 60
    got = windows_by(need(gpus), length, by, [ws], others, running, now=NOW, limits=FREE)
    fits = [s for s in range(int(NOW), int(by - length) + 1, 60)
            if book(Reservation("want", "alice", gpus, s, s + length), [ws], others, running, now=NOW,
                    limits=FREE).accepted]
    expected = DeadlineWindows(Window(fits[0], fits[0] + length), Window(fits[-1], fits[-1] + length)) if fits \
        else DeadlineWindows(None, None)
    assert got == expected
