"""Snapshots of the main screens at 80x24, against a canned lab (``data/lab.json``) and a fixed clock; the
queue's footer and GPU strip at 80 and 120 columns, with GPU use as real agents report it (``labs.busy_gpus``);
the reservations screen with bookings that overlap at 80 and 120 columns (``labs.overlapping_bookings``).

The canned leader is a real HTTP server on loopback; its event stream stays quiet, so what the
screens show depends only on the file. ``--snapshot-update`` rewrites ``__snapshots__/`` after a
deliberate change: look at the SVGs before committing them.
"""

from __future__ import annotations

import json
import time

import pytest
from textual.widgets import Input

from labq.tui.reservations import ReservationsScreen
from tests.tui.labs import DATA, SIZE, CannedLeader, booked_canned_leader, busy_gpus, until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """The job detail shows clock times: read them in UTC, whatever the machine's zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def screen_after(snap_compare, canned_leader):
    """``screen_after(*keys)``: whether the screen after those keys matches its snapshot."""

    async def loaded(pilot) -> None:
        app = pilot.app
        await until(pilot, lambda: app.connected and len(app.screen.table.shown) == 6
                    and "/v1/events" in canned_leader.requests, "the canned queue, and the event stream open",
                    lambda: (app.status, canned_leader.requests))

    def compare(*keys: str) -> bool:
        async def run_before(pilot) -> None:
            await loaded(pilot)
            await pilot.press(*keys)
            for box in pilot.app.screen.query(Input):
                box.cursor_blink = False  # shown, steady: a blinking cursor makes the picture depend on timing

        return snap_compare(canned_leader.app(), terminal_size=SIZE, run_before=run_before)

    return compare


def test_queue(screen_after):
    """The home screen: six jobs (running, queued with reasons, held), the banner and the footer."""
    assert screen_after()


def test_queue_filtered(screen_after):
    """``/`` then ``!state:run`` and Enter: the three waiting jobs; the banner says 3 of 6."""
    assert screen_after("slash", *"!state:run", "enter")


def test_job_detail(screen_after):
    """Enter on job 3, preempted once: its spec, attempt 2 after the first one, its placement."""
    assert screen_after("down", "down", "enter")


def test_help(screen_after):
    """``?`` on the queue: its keys, the app's keys, and the filter and sort words."""
    assert screen_after("question_mark")


def test_submit_form(screen_after):
    """``s``: the empty submit form with its hints."""
    assert screen_after("s")


def test_submit_form_scrolls_to_its_last_field(screen_after):
    """At 80x24 the form is taller than the screen: Tab to the folder field scrolls it into view."""
    assert screen_after("s", *["tab"] * 5)


@pytest.fixture
def queue_screen(snap_compare):
    """``queue_screen(size, busy=False, readonly=False)``: whether the queue of the canned lab (its GPUs busy as
    ``labs.busy_gpus`` says, if ``busy``) matches its snapshot at ``size``."""
    leaders = []

    def compare(size: tuple[int, int], busy: bool = False, readonly: bool = False) -> bool:
        state = json.loads((DATA / "lab.json").read_text())
        leader = CannedLeader(busy_gpus(state) if busy else state)
        leaders.append(leader)

        async def run_before(pilot) -> None:
            app = pilot.app
            await until(pilot, lambda: app.connected and len(app.screen.table.shown) == 6
                        and "/v1/events" in leader.requests, "the canned queue, and the event stream open",
                        lambda: (app.status, leader.requests))

        return snap_compare(leader.app(readonly=readonly), terminal_size=size, run_before=run_before)

    try:
        yield compare
    finally:
        for leader in leaders:
            leader.close()


def test_queue_at_120_columns(queue_screen):
    """At 120x36 the footer shows more of the queue's keys, each whole, then ``? help`` and ``q quit``."""
    assert queue_screen((120, 36))


def test_queue_read_only(queue_screen):
    """``--readonly``: the footer offers no action that changes a job; the banner says READ-ONLY."""
    assert queue_screen(SIZE, readonly=True)


def test_gpu_strip_at_80_columns(queue_screen):
    """The strip over the queue: a cell per GPU with its memory and use as bars with percentages (``-`` where not
    measured) and who holds it; the 8-GPU node wraps into two even lines, the lost node says so."""
    assert queue_screen(SIZE, busy=True)


def test_gpu_strip_at_120_columns(queue_screen):
    """At 120x36 each node's GPUs fit on a line or two, with room for the job beside its user."""
    assert queue_screen((120, 36), busy=True)


@pytest.fixture
def booked_screen(snap_compare):
    """``booked_screen(size)``: whether ``R`` on the canned lab with overlapping bookings matches its snapshot."""
    leader = booked_canned_leader()

    async def run_before(pilot) -> None:
        app = pilot.app
        await until(pilot, lambda: app.connected and len(app.reservations) == 5
                    and "/v1/events" in leader.requests, "the canned lab, and the event stream open",
                    lambda: (app.status, leader.requests))
        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, ReservationsScreen)
                    and app.screen.cursor_reservation() is not None, "the reservations listed")

    try:
        yield lambda size: snap_compare(leader.app(), terminal_size=size, run_before=run_before)
    finally:
        leader.close()


def test_reservations_with_overlapping_bookings_at_80_columns(booked_screen):
    """``R``: the bookings that overlap on ws1 in two lanes, the back-to-back pair both whole, the bars too short
    for their names keyed, and the key under the legend naming them in full."""
    assert booked_screen(SIZE)


def test_reservations_with_overlapping_bookings_at_120_columns(booked_screen):
    """``R`` at 120x36: the same lanes, room for more of the names, so fewer keys."""
    assert booked_screen((120, 36))
