"""The queue screen's keys as a new lab member meets them, against a real leader and a simulated agent: tags that
end with their action, ``--readonly`` that offers no action, sorting with one capital letter, the submit form's
folder, the footer at 80 and 120 columns, and the screenshot.
"""

from __future__ import annotations

import os
import re

import pytest
from textual.command import CommandPalette
from textual.widgets import Static
from textual.widgets._footer import FooterKey

from labq.tui.common import KeyFooter
from labq.tui.dialogs import Ask, Confirm, SubmitForm
from labq.tui.queue import CHANGES, QueueScreen
from tests.tui.labs import drive, point_at, type_text, until

pytestmark = pytest.mark.timeout(120)


def text(screen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


def blocker(lab) -> int:
    job = lab.submit("sleep", "300", gpus=4, name="blocker", no_preempt=True)
    lab.wait_state(job, "running")
    return job


def footer(screen) -> list[str]:
    """The footer's keys as shown: ``key description``."""
    return [f"{key.key_display} {key.description}" for key in screen.query(FooterKey)]


# -- tags ------------------------------------------------------------------------------------------------------

def test_tags_are_cleared_after_an_action_and_never_name_a_finished_job(lab):
    blocker(lab)
    first, second, third, fourth = (lab.submit("true", name=f"q{i}") for i in range(4))
    app = lab.app()

    async def scenario(pilot):
        screen = app.screen
        table = screen.table
        await point_at(pilot, first)
        await pilot.press("space", "space")  # tags first and second
        assert table.tagged == {first, second}
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, Confirm), "the question")
        assert app.screen.question == f"Cancel 2 jobs ({first}, {second})?"
        await pilot.press("y")
        await until(pilot, lambda: [app.rows[j].state for j in (first, second)] == ["cancelled"] * 2,
                    "the tagged jobs cancelled", lambda: app.rows)
        assert table.tagged == set() and "tagged" not in text(screen, "#banner")

        # + acts on the job under the cursor, not on the cancelled ones
        await point_at(pilot, third)
        await pilot.press("plus")
        await until(pilot, lambda: app.jobs[third]["spec"]["priority"] == 300, "job 3 one class up",
                    lambda: app.jobs[third]["spec"])
        await until(pilot, lambda: text(screen, "#status").startswith("prio:"), "the answer")
        assert text(screen, "#status") == f"prio: job {third} queued"

        # a tagged job that ends elsewhere loses its tag
        await point_at(pilot, fourth)
        await pilot.press("space")
        assert table.tagged == {fourth}
        lab.labq("cancel", str(fourth))
        await until(pilot, lambda: app.rows[fourth].state == "cancelled", "the job cancelled by the CLI")
        assert table.tagged == set()
        await point_at(pilot, third)
        await pilot.press("e")  # edits the job under the cursor: none is tagged
        await until(pilot, lambda: isinstance(app.screen, Ask), "the question")
        await pilot.press("end", "home", "ctrl+k")
        await type_text(pilot, "gpus=2")
        await pilot.press("enter")
        await until(pilot, lambda: app.jobs[third]["spec"]["gpus"] == 2, "job 3 on 2 GPUs")
        assert lab.job(fourth)["spec"]["gpus"] == 1

    drive(app, scenario)


# -- read-only -------------------------------------------------------------------------------------------------

def test_readonly_shows_no_action_keys_and_never_asks(lab):
    job = lab.submit("sleep", "300", name="untouchable")
    lab.wait_state(job, "running")
    app = lab.app(readonly=True)

    async def scenario(pilot):
        screen = app.screen
        assert "READ-ONLY" in text(screen, "#banner")
        shown = footer(screen)
        assert shown[-2:] == ["? help", "q quit"] and "/ filter" in shown and "⏎ detail" in shown
        assert not {"cancel", "hold", "release", "submit", "tag", "prio+", "prio-"} & {s.split()[-1] for s in shown}
        assert not CHANGES & {b.binding.action.split("(")[0] for b in screen.active_bindings.values()}
        palette = [c.title for c in app.get_system_commands(screen)]
        assert "Job details" in palette and not {"Cancel selected jobs", "Submit a job", "Resubmit"} & set(palette)

        await point_at(pilot, job)
        for key in ("c", "h", "plus", "minus", "p", "e", "t", "P", "s", "a", "r", "space"):
            await pilot.press(key)
            assert isinstance(app.screen, QueueScreen), key  # no question, no form
        assert text(screen, "#status") == "read-only (started with --readonly): no actions"
        assert app.notices == [] and screen.table.tagged == set()
        await pilot.pause(0.3)
        done = lab.job(job)
        assert (done["state"], done["spec"]["priority"]) == ("running", 200)
        assert len(lab.client().queue()[0]) == 1  # nothing was submitted

    drive(app, scenario)


# -- sorting ---------------------------------------------------------------------------------------------------

def test_a_capital_letter_sorts_by_its_column_and_again_reverses(lab):
    block = blocker(lab)
    zeta = lab.submit("true", gpus=2, name="zeta")
    alpha = lab.submit("true", gpus=3, name="alpha")
    mid = lab.submit("true", gpus=1, name="mid", **{"class": "low"})
    app = lab.app()
    orders = [("N", [alpha, block, mid, zeta], "sorted by name (N again: reverse)"),
              ("N", [zeta, mid, block, alpha], "sorted by name, reversed (N again: reverse)"),
              ("S", [zeta, alpha, mid, block], "sorted by state (S again: reverse)"),  # queued before running
              ("S", [block, zeta, alpha, mid], "sorted by state, reversed (S again: reverse)"),
              ("D", [mid, zeta, alpha, block], "sorted by gpus (D again: reverse)"),
              ("C", [block, zeta, alpha, mid], "sorted by class (C again: reverse)"),  # highest first
              ("I", [block, zeta, alpha, mid], "sorted by id (I again: reverse)")]

    async def scenario(pilot):
        screen = app.screen
        table = screen.table
        await until(pilot, lambda: len(table.shown) == 4, "four jobs", lambda: app.rows)
        for letter, expected, status in orders:
            await pilot.press(letter)
            assert (table.shown, text(screen, "#status")) == (expected, status), letter
        assert isinstance(app.screen, QueueScreen)  # S sorts: it opens no form
        await pilot.press("T")  # by time: the blocker has run longest, the others waited as long as they exist
        assert table.sort_column == 7 and not table.sort_reverse
        await pilot.press("o", "n")  # o and a letter still sort
        assert table.shown == [alpha, block, mid, zeta] and text(screen, "#status") == "sorted by name"

    drive(app, scenario)


# -- submitting --------------------------------------------------------------------------------------------------

def test_a_job_submitted_with_the_folder_left_blank_runs_in_the_current_folder(lab):
    app = lab.app()

    async def scenario(pilot):
        screen = app.screen
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, SubmitForm), "the form")
        await type_text(pilot, "sleep 300")
        await pilot.press("enter")
        await until(pilot, lambda: text(screen, "#status").startswith("submitted job"), "the answer",
                    lambda: text(screen, "#status"))
        job_id = int(re.search(r"submitted job (\d+)", text(screen, "#status")).group(1))
        assert lab.job(job_id)["spec"]["workdir"] == os.getcwd()

        await pilot.press("s")  # a folder relative to here, as `labq submit --workdir` takes it
        await until(pilot, lambda: isinstance(app.screen, SubmitForm), "the form")
        await type_text(pilot, "sleep 300")
        app.screen.query_one("#f-workdir").value = "tests/tui"
        await pilot.press("enter")
        await until(pilot, lambda: text(screen, "#status").startswith("submitted job")
                    and f"job {job_id}" not in text(screen, "#status"), "the second answer")
        second = int(re.search(r"submitted job (\d+)", text(screen, "#status")).group(1))
        assert lab.job(second)["spec"]["workdir"] == os.path.join(os.getcwd(), "tests", "tui")

    drive(app, scenario)


# -- the footer -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("columns", [80, 120])
def test_the_footer_shows_whole_keys_and_always_help_and_quit(lab, columns):
    app = lab.app()

    def laid_out() -> bool:
        keys = app.screen.query(FooterKey)
        return app.screen.query_one(KeyFooter).laid_out_for == columns and bool(keys) and all(
            k.region.width == len(s) for k, s in zip(keys, footer(app.screen)))

    async def scenario(pilot):
        await pilot.resize_terminal(columns, 24)
        await until(pilot, lambda: footer(app.screen)[-2:] == ["? help", "q quit"] and laid_out(),
                    "the footer laid out again, each key whole", lambda: footer(app.screen))
        shown = footer(app.screen)
        assert shown[:4] == ["space tag", "/ filter", "o sort", "⏎ detail"]
        assert sum(len(s) + 1 for s in shown) <= columns  # each whole, a space after each
        assert max(k.region.right for k in app.screen.query(FooterKey)) <= columns
        if columns == 120:
            assert {"c cancel", "h hold", "r release", "n nodes"} <= set(shown)

    drive(app, scenario)


# -- the screenshot ---------------------------------------------------------------------------------------------

def test_the_screenshot_is_saved_in_the_current_folder_when_there_is_no_downloads_folder(lab, tmp_path, monkeypatch):
    home, here = tmp_path / "home", tmp_path / "here"
    home.mkdir()
    here.mkdir()
    monkeypatch.setenv("HOME", str(home))  # a server's home: no ~/Downloads
    monkeypatch.delenv("XDG_DOWNLOAD_DIR", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.chdir(here)
    app = lab.app()

    async def scenario(pilot):
        await pilot.press("ctrl+p")
        await until(pilot, lambda: isinstance(app.screen, CommandPalette), "the command palette")
        await type_text(pilot, "screenshot")
        await pilot.pause(0.5)  # the palette searches
        await pilot.press("enter")
        await until(pilot, lambda: any("screenshot" in n for n in app.notices), "the answer", lambda: app.notices)
        saved = list(here.glob("*.svg"))
        assert len(saved) == 1 and "<svg" in saved[0].read_text()
        assert app.notices[-1] == f"screenshot saved to {saved[0]} (no Downloads folder)"
        assert not (home / "Downloads").exists()

        missing = tmp_path / "gone"
        app.action_screenshot(None, str(missing))  # a folder that is not there: it says why
        await until(pilot, lambda: "not saved" in app.notices[-1], "the refusal", lambda: app.notices)
        assert app.notices[-1] == f"screenshot not saved: cannot write in {missing}: No such file or directory"

    drive(app, scenario)


def test_the_screenshot_goes_to_downloads_when_there_is_one(lab, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "Downloads").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_DOWNLOAD_DIR", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    app = lab.app()

    async def scenario(pilot):
        app.action_screenshot()
        await until(pilot, lambda: any("screenshot" in n for n in app.notices), "the answer", lambda: app.notices)
        saved = list((home / "Downloads").glob("*.svg"))
        assert len(saved) == 1 and app.notices[-1] == f"screenshot saved to {saved[0]}"

    drive(app, scenario)


# -- arrays ----------------------------------------------------------------------------------------------------

def test_an_arrays_waiting_tasks_are_one_row_that_x_expands_and_c_cancels_whole(lab):
    first = lab.submit("sleep", "300", array="0-4%1", name="sweep")  # task 0 runs; 1-4 wait for the cap
    lab.wait_state(first, "running")
    aid = lab.job(first)["spec"]["array"]["id"]
    app = lab.app()

    async def scenario(pilot):
        screen = app.screen
        table = screen.table
        await until(pilot, lambda: len(table.folded) == 1, "the waiting tasks folded", lambda: table.shown)
        (lead, members), = table.folded.items()
        assert len(members) == 4 and table.shown.count(lead) == 1 and not set(members[1:]) & set(table.shown)
        line = "".join(segment.text for segment in table.render_line(1 + table.shown.index(lead)))
        assert line.startswith(f"{aid}.* ") and "(4 tasks: 1-4;" in line  # 80 columns: the rest is cut
        await point_at(pilot, lead)
        await pilot.press("x")  # each task its own row
        assert table.folded == {} and set(members) <= set(table.shown)
        await pilot.press("x")  # folded again
        assert len(table.folded) == 1
        await point_at(pilot, lead)
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, Confirm), "the question")
        assert app.screen.question.startswith("Cancel 4 jobs")
        await pilot.press("y")
        await until(pilot, lambda: all(app.rows[j].state == "cancelled" for j in members), "the 4 tasks cancelled",
                    lambda: {j: app.rows[j].state for j in members})
        assert app.rows[first].state == "running"  # the running task was not folded in: not cancelled

    drive(app, scenario)
