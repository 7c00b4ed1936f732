"""The TUI shows names from an old database escaped and as text: no raw control character reaches the
terminal, no row splits, and ``[red]`` in a name or an error shows as ``[red]``.

The lab is ``tests/cli/hostile_lab.py``'s: a real leader whose store holds such names. What the screen
shows is read from the screen's compositor, the lines Textual writes to the terminal.
"""

from __future__ import annotations

import pytest
from textual.widgets import Input

from labq.credentials import load_credentials
from labq.terminal_text import escape_controls
from labq.tui.detail import JobDetailScreen
from labq.tui.dialogs import Ask, Confirm
from labq.tui.logs import shown_output
from labq.tui.nodes import NodesScreen
from labq.tui.reservations import ReservationsScreen
from tests.cli.hostile_lab import (
    GPU_MODEL, NAME, NODE, RESERVATION, USER, USER_TOKEN, make_hostile, raw_controls,
)
from tests.tui.labs import TuiLab, drive, point_at, until

pytestmark = pytest.mark.timeout(180)


class HostileLab(TuiLab):
    def start(self) -> HostileLab:
        self.start_leader()
        self.token = load_credentials(self.home / ".config/labq/credentials")["token"]
        self.admin_user = self.client().whoami()["user"]
        self._bob = None
        self.jobs = make_hostile(self)
        return self


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    lab = HostileLab(tmp_path_factory.mktemp("hostile"))
    try:
        yield lab.start()
    finally:
        lab.close()


def screen_text(app) -> str:
    """The screen's lines as the terminal gets them, checked to carry no raw control character."""
    lines = [strip.text for strip in app.screen._compositor.render_strips()]
    text = "\n".join(lines)
    assert raw_controls(text) == [], text
    return text


async def on_screen(pilot, kind: type):
    await until(pilot, lambda: isinstance(pilot.app.screen, kind), kind.__name__, lambda: pilot.app.screen)
    await pilot.pause(0.2)  # its first redraw
    return pilot.app.screen


def test_queue_and_job_details_show_names_escaped_and_markup_as_text(hostile):
    jobs = hostile.jobs
    app = hostile.app(USER_TOKEN)  # the user's own name is in the banner

    async def scenario(pilot):
        await until(pilot, lambda: {jobs.running, jobs.waiting} <= set(pilot.app.screen.table.shown),
                    "the jobs in the table", lambda: app.rows)
        assert app.rows[jobs.running].cells[1:3] == (escape_controls(USER), escape_controls(NAME))
        assert escape_controls(NODE) in app.rows[jobs.running].cells[6]
        assert escape_controls(USER) in app.rows[jobs.waiting].cells[8]  # its reason quotes the user
        text = screen_text(app)
        assert f"labq | {escape_controls(USER)} | 2 jobs" in text
        assert len([line for line in text.splitlines() if line.lstrip().startswith((f"{jobs.running} ",
                                                                                     f"{jobs.waiting} "))]) == 2

        await point_at(pilot, jobs.running)
        await pilot.press("enter")
        await on_screen(pilot, JobDetailScreen)
        text = screen_text(app)
        assert f"job {jobs.running} ({escape_controls(NAME)}): running" in text  # [red] as text
        assert "[red]boom[/red]" in text

    drive(app, scenario)


def test_an_error_echoing_markup_is_shown_as_text(hostile):
    app = hostile.app()

    async def scenario(pilot):
        await point_at(pilot, hostile.jobs.running)
        await pilot.press("p")
        await on_screen(pilot, Ask)
        pilot.app.screen.query_one(Input).value = "[bold]boom\x1b[2J"
        await pilot.press("enter")
        await until(pilot, lambda: any("unknown priority" in n for n in app.notices), "the leader's answer",
                    lambda: app.notices)
        await until(pilot, lambda: "[bold]boom" in screen_text(app), "the answer on screen",
                    lambda: screen_text(app))
        assert "\\x1b[2J" in screen_text(app)  # repr escaped it; a toast and the status line show it so

    drive(app, scenario)


def test_nodes_and_reservations_screens_show_names_escaped(hostile):
    app = hostile.app()

    async def scenario(pilot):
        await pilot.press("n")
        await on_screen(pilot, NodesScreen)
        await until(pilot, lambda: escape_controls(NODE) in screen_text(app), "the node on screen",
                    lambda: screen_text(app))
        assert escape_controls(GPU_MODEL.removeprefix("NVIDIA ")) in screen_text(app)

        await pilot.press("escape", "R")
        screen = await on_screen(pilot, ReservationsScreen)
        await until(pilot, lambda: screen.cursor_reservation() == RESERVATION, "the reservation listed",
                    lambda: screen_text(app))
        lines = screen_text(app).splitlines()
        assert any(line.startswith(f" {escape_controls(RESERVATION)}  ") for line in lines)  # the list
        timeline = [line for line in lines if line.startswith(f" {escape_controls(NODE)[:12]} ")]  # the node column
        assert len(timeline) == 1 and f"[1:{escape_controls(RESERVATION)[:16]}" in timeline[0], lines  # its bar
        assert any(line.startswith(f" 1  {escape_controls(RESERVATION)}  ") for line in lines), lines  # its key

        await pilot.press("c")
        await on_screen(pilot, Confirm)
        assert f"Cancel reservation {escape_controls(RESERVATION)}?" in screen_text(app)  # [bold] as text
        await pilot.press("n")

    drive(app, scenario)


@pytest.mark.parametrize(("output", "shown"), [
    ("epoch 1\n", "epoch 1\n"),
    ("\x1b[32mINFO\x1b[0m loss 0.3\n", "INFO loss 0.3\n"),  # colors dropped
    (" 10%|█\r 20%|██\r\n", " 10%|█\n 20%|██\n"),  # a progress bar, a redraw a line
    ("col\tcol\n", "col\tcol\n"),
    ("\x1b[2J\x1b]0;title\x07\x08\u202e", "\\x1b[2J\\x1b]0;title\\x07\\x08\\u202e"),
])
def test_job_output_in_the_log_screen_is_text(output, shown):
    assert shown_output(output) == shown
