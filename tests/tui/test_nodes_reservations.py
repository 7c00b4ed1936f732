"""The nodes and reservations screens against a real leader and a simulated agent; the timeline as a pure function."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from textual.widgets import DataTable, Input, Static

from labq.client import Client
from labq.credentials import load_credentials
from labq.tui.app import make_app
from labq.tui.dialogs import Confirm
from labq.tui.nodes import NodesScreen
from labq.tui.reservations import BookingForm, ReservationsScreen
from labq.tui.timeline import timeline_lines
from tests.e2e.conftest import Lab, stop_processes

pytestmark = pytest.mark.timeout(120)

H = 3600.0
NOW = datetime(2026, 11, 20, 9, 0, tzinfo=UTC).timestamp()  #: a Friday, 09:00 UTC


# -- the timeline, pure ---------------------------------------------------------------------------

def booking(name: str, start_h: float, end_h: float, node: str = "ws1") -> dict:
    return {"name": name, "node": node, "start": NOW + start_h * H, "end": NOW + end_h * H}


def running(node: str, started_h: float, limit_h: float | None, state: str = "running") -> dict:
    return {"id": 1, "state": state, "started_at": NOW + started_h * H,
            "spec": {"time_limit_s": limit_h * H if limit_h else None},
            "placement": {"allocations": [{"node": node, "gpu_indices": [0]}]}}


NODES = [{"name": "ws1"}, {"name": "ws2"}]
#: 3 days over 72 columns (77 - the 4-wide name column - a space): one column an hour, column c is NOW + c h
ONE_H = {"now": NOW, "days": 3, "width": 77, "tz": UTC}


def bar(lines: list[str], node: int) -> str:
    """The cells of a node's line, without its name column."""
    return lines[1 + node][5:]


def test_a_reservation_is_a_labelled_bar_over_its_hours():
    lines = timeline_lines(NODES, [booking("paper", 24, 48)], [], **ONE_H)
    cells = bar(lines, 0)
    assert cells[24] == "[" and cells[47] == "]" and cells[25:30] == "paper"
    assert set(cells[30:47]) == {"="} and cells[48] != "="
    assert "[" not in bar(lines, 1)  # on ws1 only


def test_day_boundaries_are_midnights_in_the_users_zone():
    lines = timeline_lines(NODES, [], [], **ONE_H)
    header = lines[0][5:]
    assert [i for i, c in enumerate(header) if c == "|"] == [15, 39, 63]  # 00:00 UTC Sat, Sun, Mon
    assert header.startswith("now 09:00") and header[16:22] == "Sat 21" and "Sun 22" in header
    assert lines[0].startswith("UTC")
    berlin = timeline_lines(NODES, [], [], NOW, 3, 77, tz=ZoneInfo("Europe/Berlin"))
    assert berlin[0][5:].index("|") == 14 and berlin[0].startswith("CET")  # midnight in Berlin is 23:00 UTC


def test_bars_are_clipped_at_the_window_edges():
    lines = timeline_lines(NODES, [booking("early", -5, 4), booking("late", 60, 100, "ws2")], [], **ONE_H)
    early, late = bar(lines, 0), bar(lines, 1)
    assert early[:4] == "<1=]"  # 00:00-04:00 of the window: 4 columns, too few for "early": its key
    assert late[60] == "[" and late.endswith(">") and late[61:65] == "late"


def test_a_reservation_spanning_the_whole_window():
    exactly = timeline_lines(NODES, [booking("all", 0, 72)], [], **ONE_H)
    beyond = timeline_lines(NODES, [booking("longer", -24, 200)], [], **ONE_H)
    assert bar(exactly, 0) == "[all" + "=" * 67 + "]"
    assert bar(beyond, 0) == "<longer" + "=" * 64 + ">"


def test_reservations_outside_the_window_and_none_leave_free_days():
    outside = [booking("past", -30, -2), booking("later", 80, 90)]
    for reservations in ([], outside):
        lines = timeline_lines(NODES, reservations, [], **ONE_H)
        assert len(lines) == 3
        assert set(bar(lines, 0)) == set(bar(lines, 1)) == {".", "|"}
    assert timeline_lines([], [], [], **ONE_H)[1:] == []


def test_eighty_columns_every_line_fits():
    reservations = [booking("paper-deadline-final", 30, 50), booking("x", -1, 2, "ws2")]
    for days in (1, 3, 7, 14):
        lines = timeline_lines(NODES, reservations, [running("ws1", -1, 5)], NOW, days, 80, tz=UTC)
        assert [len(line) for line in lines] == [80, 80, 80]
    lines = timeline_lines(NODES, reservations, [], NOW, 14, 80, tz=UTC)
    assert lines[0].count("|") == 14  # a boundary a day; short day names where long ones do not fit
    assert "[1:pa" in bar(lines, 0)  # too short for the whole name: its key and what fits


def test_running_jobs_show_where_their_time_limits_end():
    jobs = [running("ws1", -1, 5), running("ws2", -2, None), running("ws2", -1, 200),
            running("ws2", 0, 3, state="queued")]
    lines = timeline_lines(NODES, [], jobs, **ONE_H)
    assert bar(lines, 0).index("*") == 4 and bar(lines, 0).count("*") == 1
    assert "*" not in bar(lines, 1)  # no limit, after the window, not running


def test_a_node_that_went_away_keeps_its_reservations_visible():
    lines = timeline_lines(NODES, [booking("gone", 2, 3, "ws9"), booking("tiny", 5, 5.5)], [], **ONE_H)
    assert [line[:4] for line in lines[1:]] == ["ws1 ", "ws2 ", "ws9 "]
    assert bar(lines, 2)[2] == "2" and bar(lines, 0)[5] == "1"  # an hour or less: one column, its key


# -- the screens, with a real leader and a simulated agent ----------------------------------------

@pytest.fixture
def lab(tmp_path):
    made = Lab(tmp_path)
    try:
        made.start_leader()
        made.start_agent("ws1", "sim:ws-4x3090")
        yield made
    finally:
        made.close()


def tui(lab: Lab, readonly: bool = False):
    token = load_credentials(lab.home / ".config" / "labq" / "credentials")["token"]
    return make_app(readonly=readonly, client_factory=lambda: Client(lab.url, token))


def drive(lab: Lab, app, scenario) -> None:
    """Run ``scenario(pilot)`` on an 80x24 screen once the first load is drawn."""

    async def main() -> None:
        try:
            async with app.run_test(size=(80, 24)) as pilot:
                await until(pilot, lambda: app.connected and app.nodes, "the first load")
                await scenario(pilot)
        finally:
            stop_processes(lab.procs)  # the feed's thread reads the event stream until the leader goes

    asyncio.run(main())


async def until(pilot, condition, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        await pilot.pause(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def text(screen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


def listed(screen) -> list[str]:
    return [key.value for key in screen.query_one(DataTable).rows]


async def type_into(pilot, field: str, value: str) -> None:
    box = pilot.app.screen.query_one(f"#b-{field}", Input)
    box.focus()
    box.value = ""
    await pilot.press(*value)


def test_nodes_screen_shows_the_job_on_its_gpus_and_switches_nodes(lab):
    lab.start_agent("ws2", "sim:flat:2")
    job_id = lab.submit("sleep", "300", gpus=2, node="ws1", name="bert")
    job = lab.wait_state(job_id, "running")
    mine = set(job["placement"]["allocations"][0]["gpu_indices"])
    user = job["spec"]["user"]
    app = tui(lab)

    async def scenario(pilot) -> None:
        await until(pilot, lambda: app.rows.get(job_id) and app.jobs[job_id]["state"] == "running"
                    and any(n.get("gpus_in_use") for n in app.nodes), "the job on its GPUs")
        await pilot.press("n")
        screen = app.screen
        assert isinstance(screen, NodesScreen)
        await pilot.pause()
        names = [n["name"] for n in app.nodes]
        if names.index("ws1"):
            await pilot.press("right_square_bracket")
        grid = text(screen, "#gpu-grid").splitlines()
        assert grid[0].split()[:2] == ["GPU", "MODEL"] and len(grid) == 5
        for line in grid[1:]:
            index = int(line.split()[0])
            assert (f"job {job_id} {user} bert" in line) == (index in mine), line
            assert ("free" in line) == (index not in mine), line
            assert "GeForce RTX 3090" in line and "/24 GiB" in line
        head = text(screen, "#node-head")
        assert head.startswith("ws1  ") and "lease age" in head and "4x GeForce RTX 3090" in head
        assert "NV4" in text(screen, "#link-matrix")
        assert "1/2:  ws1 " in text(screen, "#banner") and " ws2 " in text(screen, "#banner")  # with their health

        await pilot.press("right_square_bracket")
        assert text(screen, "#node-head").startswith("ws2")
        assert all(line.endswith("free") for line in text(screen, "#gpu-grid").splitlines()[1:])
        await pilot.press("left")
        assert text(screen, "#node-head").startswith("ws1")
        await pilot.press("escape")
        assert not isinstance(app.screen, NodesScreen)

    drive(lab, app, scenario)


def test_reservations_screen_draws_a_booked_reservation_on_the_timeline(lab):
    lab.labq("reserve", "--gpus", "2", "--start", "in 20h", "--for", "30h", "--name", "paper")
    app = tui(lab)

    async def scenario(pilot) -> None:
        await pilot.press("R")
        screen = app.screen
        assert isinstance(screen, ReservationsScreen)
        await until(pilot, lambda: listed(screen) == ["paper"], "the reservation in the list")
        ws1 = next(line for line in text(screen, "#timeline").splitlines() if line.startswith("ws1"))
        assert "[paper" in ws1 and len(ws1) <= 78
        assert "the next 3 days" in text(screen, "#banner")
        await pilot.press("plus", "plus")
        assert screen.days == 5 and "the next 5 days" in text(screen, "#banner")
        await pilot.press(*["minus"] * 6)
        assert screen.days == 1
        ws1 = next(line for line in text(screen, "#timeline").splitlines() if line.startswith("ws1"))
        assert "paper" in ws1 and "]" not in ws1  # 20 h ahead, 30 h long: past the end of one day

    drive(lab, app, scenario)


def test_the_booking_form_answers_while_typing_and_books_for_real(lab):
    app = tui(lab)

    async def scenario(pilot) -> None:
        await pilot.press("R", "b")
        form = app.screen
        assert isinstance(form, BookingForm)
        await type_into(pilot, "gpus", "2")
        await type_into(pilot, "start", "in 3h")
        await type_into(pilot, "duration", "4h")
        await until(pilot, lambda: "would book (dry run)" in text(form, "#answer"), "the dry run's answer")
        assert "2 GPU(s) on ws1" in text(form, "#answer")
        assert lab.api("reservations") == []  # a dry run books nothing
        await type_into(pilot, "name", "deadline")
        await until(pilot, lambda: "would book (dry run) deadline" in text(form, "#answer"), "the new answer")
        await pilot.press("enter")
        await until(pilot, lambda: "booked deadline" in text(form, "#answer"), "the booking's answer")
        booked = lab.api("reservations")
        assert [(r["name"], r["gpus"]) for r in booked] == [("deadline", 2)]
        assert abs(booked[0]["end"] - booked[0]["start"] - 4 * H) < 1
        await pilot.press("enter")  # Done
        screen = app.screen
        assert isinstance(screen, ReservationsScreen)
        await until(pilot, lambda: listed(screen) == ["deadline"], "the new reservation in the list")
        timeline = text(screen, "#timeline")
        assert "[1:d" in timeline  # 4 h of 3 days: 5 columns, too few for the name: its key and what fits
        assert "\n1  deadline  ws1:" in timeline  # and the key, under the legend, names it

    drive(lab, app, scenario)


def test_the_booking_form_starts_in_its_first_field_so_typing_a_gpu_count_lands_there(lab):
    app = tui(lab)

    async def scenario(pilot) -> None:
        await pilot.press("R", "b")
        form = app.screen
        assert isinstance(form, BookingForm)
        await pilot.press("3")  # typed at once, over the default 1
        assert form.query_one("#b-gpus", Input).value == "3"
        assert form.query_one("#b-start", Input).value == ""

    drive(lab, app, scenario)


def test_a_refused_booking_shows_the_reasons_and_the_alternatives_and_errors_show_in_place(lab):
    app = tui(lab)

    async def scenario(pilot) -> None:
        await pilot.press("R", "b")
        form = app.screen
        await type_into(pilot, "start", "whenever")
        await type_into(pilot, "duration", "2h")
        await until(pilot, lambda: "can't read 'whenever'" in text(form, "#answer"), "the local error")
        await type_into(pilot, "start", "tomorrow 10:00")
        await type_into(pilot, "gpus", "6")  # ws1 has 4
        await until(pilot, lambda: "cannot book it" in text(form, "#answer"), "the refusal")
        answer = text(form, "#answer")
        assert "no node has 6 GPUs" in answer and "what would work" in answer and "4 GPU(s) on ws1" in answer
        await pilot.press("enter")
        await until(pilot, lambda: "cannot book it" in text(form, "#answer") and "booking" not in
                    text(form, "#booking-note"), "the refusal of the real booking")
        await type_into(pilot, "gpus", "1")
        await type_into(pilot, "name", "no spaces")
        await until(pilot, lambda: text(form, "#answer").startswith("the leader says:"), "the leader's error")
        assert lab.api("reservations") == []

    drive(lab, app, scenario)


def test_cancel_asks_first_then_removes_the_reservation(lab):
    lab.labq("reserve", "--gpus", "1", "--start", "in 2h", "--for", "1h", "--name", "paper")
    app = tui(lab)

    async def scenario(pilot) -> None:
        await pilot.press("R")
        screen = app.screen
        await until(pilot, lambda: listed(screen) == ["paper"], "the reservation in the list")
        await pilot.press("c")
        assert isinstance(app.screen, Confirm)
        await pilot.press("n")
        assert app.screen is screen and [r["name"] for r in lab.api("reservations")] == ["paper"]
        await pilot.press("c", "y")
        await until(pilot, lambda: listed(screen) == [], "the reservation to leave the list")
        assert lab.api("reservations") == []
        assert "cancelled reservation paper" in text(screen, "#status")
        assert "paper" not in text(screen, "#timeline")

    drive(lab, app, scenario)


def test_read_only_refuses_booking_and_cancelling_but_answers_dry_runs(lab):
    lab.labq("reserve", "--gpus", "1", "--start", "in 2h", "--for", "1h", "--name", "paper")
    app = tui(lab, readonly=True)

    async def scenario(pilot) -> None:
        await pilot.press("R")
        screen = app.screen
        await until(pilot, lambda: listed(screen) == ["paper"], "the reservation in the list")
        await pilot.press("c")
        assert app.screen is screen and "read-only" in text(screen, "#status")
        await pilot.press("b")
        form = app.screen
        await type_into(pilot, "start", "in 5h")
        await type_into(pilot, "duration", "1h")
        await until(pilot, lambda: "would book (dry run)" in text(form, "#answer"), "the dry run's answer")
        await pilot.press("enter")
        assert "read-only" in text(form, "#booking-note")
        await pilot.pause(0.5)
        assert [r["name"] for r in lab.api("reservations")] == ["paper"]

    drive(lab, app, scenario)
