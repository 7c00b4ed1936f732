"""The queue screen driven with keys against a real leader and a simulated agent (``sim:ws-4x3090``).

Each test starts the app on the module's lab, emptied before it (``lab``); the test that kills the
leader has a lab of its own. What a key did is checked twice: in the app (its rows follow the leader's
event stream) and at the leader (``lab.job``). Waits are bounded loops of ``pilot.pause``.
"""

from __future__ import annotations

import re

import pytest
from textual.events import Key
from textual.widgets import Input, Static

from labq.tui.detail import JobDetailScreen
from labq.tui.dialogs import Ask, Confirm, SubmitForm
from labq.tui.help import HelpScreen
from labq.tui.logs import LogsScreen
from labq.tui.queue import QueueScreen
from tests.tui.labs import drive, point_at, type_text, until

pytestmark = pytest.mark.timeout(120)


def text(screen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


def blocker(lab) -> int:
    """A job on all four GPUs that nothing preempts, so that the jobs after it wait in the queue."""
    job = lab.submit("sleep", "300", gpus=4, name="blocker", no_preempt=True)
    lab.wait_state(job, "running")
    return job


async def on_queue(pilot) -> QueueScreen:
    await until(pilot, lambda: isinstance(pilot.app.screen, QueueScreen), "the queue screen",
                lambda: pilot.app.screen)
    return pilot.app.screen


async def answer(pilot, value: str) -> None:
    """Replaces the text of an ``Ask`` dialog's input and presses Enter."""
    await until(pilot, lambda: isinstance(pilot.app.screen, Ask), "the question", lambda: pilot.app.screen)
    await pilot.press("end", "home", "ctrl+k")
    await type_text(pilot, value)
    await pilot.press("enter")


# -- the live queue -------------------------------------------------------------------------------------

def test_queue_fills_from_the_leader_and_follows_its_events(lab):
    first = lab.submit("sleep", "300", gpus=2, name="first")
    lab.wait_state(first, "running")
    app = lab.app()

    async def scenario(pilot):
        screen = await on_queue(pilot)
        assert screen.table.shown == [first]
        row = app.rows[first]
        assert (row.state, row.user, row.cells[2], row.cells[5]) == ("running", lab.admin_user, "first", "2")
        assert row.cells[6].startswith("ws1:")
        assert f"{lab.admin_user} (admin) | 1 jobs: 1 running" in text(screen, "#banner")

        # submitted by someone else: it appears, and then changes, with no reload of the queue
        second = lab.submit("sleep", "300", gpus=4, name="second")
        await until(pilot, lambda: second in screen.table.shown, "the new job in the table", lambda: app.rows)
        assert app.rows[second].state == "queued"
        await until(pilot, lambda: "needs 4" in app.rows[second].cells[8], "its pending reason",
                    lambda: app.rows[second])  # the scheduler's next pass says why, in an event of its own
        lab.labq("cancel", str(first))
        await until(pilot, lambda: (app.rows[first].state, app.rows[second].state) == ("cancelled", "running"),
                    "the first job to end and the second to start", lambda: app.rows)
        assert app.feed_watch.full_loads == 1
        assert {"running", "queued"} <= {data.get("state") for _, data in app.job_events[second]}
        assert "1 cancelled, 1 running" in text(screen, "#banner")

    drive(app, scenario)


def test_filter_by_user_state_node_text_and_negation(lab):
    block = blocker(lab)
    mine = lab.submit("python", "train.py", name="bert")
    bobs = lab.submit("python", "eval.py", name="gamma", token=lab.bob)
    lab.labq("hold", str(bobs), token=lab.bob)
    app = lab.app()
    cases = [
        ("user:bob", [bobs]), ("state:r", [block]), ("node:ws1", [block]), ("GAMMA", [bobs]),
        ("!bert", [block, bobs]), ("!user:bob state:q", [mine]),
    ]  # each key is a redraw, and a Pilot key press waits for the app to go idle: few, short words

    async def scenario(pilot):
        screen = await on_queue(pilot)
        table = screen.table
        await until(pilot, lambda: len(table.shown) == 3 and app.rows[bobs].state == "held", "three jobs",
                    lambda: app.rows)
        for words, expected in cases:
            await pilot.press("escape", "slash")
            await type_text(pilot, words)
            await pilot.press("enter")
            await until(pilot, lambda words=words: table.filter_text == words and app.focused is table,
                        f"the filter {words!r}", lambda: table.filter_text)
            assert table.shown == expected, words
            assert f"{len(expected)} of 3 jobs" in text(screen, "#banner") and f"filter: {words}" in text(
                screen, "#banner")
        # an unknown field says so; Esc clears the filter
        await pilot.press("escape", "slash")
        await type_text(pilot, "xy:z")
        await until(pilot, lambda: "unknown filter xy:" in text(screen, "#status"), "the error")
        assert screen.query_one("#status").has_class("error")
        await pilot.press("escape")
        assert not screen.query_one("#filter").display and table.filter_text == "" and len(table.shown) == 3
        assert "filter" not in text(screen, "#banner")

        # keys that arrive together (a paste, a slow link): the letters after / filter, none acts on a job
        await point_at(pilot, mine)
        for key, character in [("slash", "/"), *((c, c) for c in "hold")]:
            app.post_message(Key(key, character))
        await until(pilot, lambda: table.filter_text == "hold", "the filter typed ahead", lambda: table.filter_text)
        assert isinstance(app.screen, QueueScreen) and app.notices == [] and app.rows[mine].state == "queued"

    drive(app, scenario)


def test_sort_by_a_column_and_reverse_with_a_capital(lab):
    block = blocker(lab)
    zeta = lab.submit("true", gpus=2, name="zeta")
    alpha = lab.submit("true", gpus=3, name="alpha")
    mid = lab.submit("true", gpus=1, name="mid")
    app = lab.app()
    orders = [("n", [alpha, block, mid, zeta], "sorted by name"),
              ("N", [zeta, mid, block, alpha], "sorted by name, reversed"),
              ("g", [mid, zeta, alpha, block], "sorted by gpus"), ("G", [block, alpha, zeta, mid], None),
              ("s", [zeta, alpha, mid, block], "sorted by state"),  # queued before running
              ("I", [mid, alpha, zeta, block], None), ("i", [block, zeta, alpha, mid], "sorted by id")]

    async def scenario(pilot):
        screen = await on_queue(pilot)
        table = screen.table
        await until(pilot, lambda: len(table.shown) == 4, "four jobs", lambda: app.rows)
        for letter, expected, status in orders:
            await pilot.press("o", letter)
            assert table.shown == expected, letter
            assert table.sort_reverse == letter.isupper()
            if status:
                assert text(screen, "#status") == status
        await pilot.press("o", "z")
        assert "no column for 'z'" in text(screen, "#status") and table.shown == [block, zeta, alpha, mid]
        await pilot.press("j")  # after a wrong letter, keys are keys again
        assert table.cursor_job() == zeta

    drive(app, scenario)


# -- actions on the selected or tagged jobs ------------------------------------------------------------------

def test_tag_jobs_then_hold_the_tagged_ones(lab):
    blocker(lab)
    first, second, third = (lab.submit("true", name=f"q{i}") for i in range(3))
    app = lab.app()

    async def scenario(pilot):
        screen = await on_queue(pilot)
        table = screen.table
        await point_at(pilot, first)
        await pilot.press("space")  # tags and steps down
        assert table.tagged == {first} and table.cursor_job() == second
        await pilot.press("down", "space")
        assert table.tagged == {first, third}
        await until(pilot, lambda: "2 tagged" in text(screen, "#banner"), "the banner to count the tags")
        await pilot.press("h")
        await until(pilot, lambda: [app.rows[j].state for j in (first, second, third)] == ["held", "queued", "held"],
                    "the tagged jobs to be held", lambda: app.rows)
        assert [lab.job(j)["state"] for j in (first, second, third)] == ["held", "queued", "held"]
        await until(pilot, lambda: text(screen, "#status") == f"hold: job {first} held, job {third} held",
                    "the answer", lambda: text(screen, "#status"))
        await pilot.press("escape")
        assert table.tagged == set() and "tagged" not in text(screen, "#banner")

    drive(app, scenario)


def test_cancel_asks_first(lab):
    block = blocker(lab)
    waiting = lab.submit("true", name="doomed")
    app = lab.app()

    async def scenario(pilot):
        screen = await on_queue(pilot)
        await point_at(pilot, waiting)
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, Confirm), "the question")
        assert app.screen.question == f"Cancel job {waiting}?"
        await pilot.press("n")
        await on_queue(pilot)
        assert lab.job(waiting)["state"] == "queued"

        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, Confirm), "the question")  # "y" goes to it, not the table
        await pilot.press("y")
        await until(pilot, lambda: app.rows[waiting].state == "cancelled", "the job to be cancelled", lambda: app.rows)
        assert lab.job(waiting)["state"] == "cancelled"
        assert text(screen, "#status") == f"cancel: job {waiting} cancelled"

        # a running job is asked to stop, and ends
        await point_at(pilot, block)
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, Confirm), "the question")
        assert app.screen.question == f"Cancel job {block}?"
        await pilot.press("y")
        await until(pilot, lambda: app.rows[block].state == "cancelled", "the running job to end", lambda: app.rows)
        assert lab.job(block)["state"] == "cancelled"

    drive(app, scenario)


def test_hold_and_release(lab):
    blocker(lab)
    job = lab.submit("true", name="pausable")
    app = lab.app()

    async def scenario(pilot):
        screen = await on_queue(pilot)
        await point_at(pilot, job)
        await pilot.press("h")
        await until(pilot, lambda: app.rows[job].state == "held", "the job to be held", lambda: app.rows)
        assert lab.job(job)["state"] == "held"
        await pilot.press("h")  # the leader refuses: the answer says why, in red
        await until(pilot, lambda: "only a queued job can be held" in text(screen, "#status"), "the refusal",
                    lambda: text(screen, "#status"))
        assert screen.query_one("#status").has_class("error")
        await pilot.press("r")
        await until(pilot, lambda: app.rows[job].state == "queued", "the job to be released", lambda: app.rows)
        assert lab.job(job)["state"] == "queued"

    drive(app, scenario)


def test_priority_up_down_and_set(lab):
    blocker(lab)
    job = lab.submit("true", name="urgent-ish")
    app = lab.app()

    def priority() -> int:
        return app.jobs[job]["spec"]["priority"]

    async def scenario(pilot):
        screen = await on_queue(pilot)
        await point_at(pilot, job)
        for key, expected in [("plus", 300), ("plus", 400), ("minus", 300), ("minus", 200), ("minus", 100)]:
            await pilot.press(key)
            await until(pilot, lambda expected=expected: priority() == expected, f"priority {expected}", priority)
        assert lab.job(job)["spec"]["priority"] == 100 and app.rows[job].klass == "low"
        await pilot.press("minus")
        assert text(screen, "#status") == f"job {job} is already at the bottom class"

        await pilot.press("p")
        await answer(pilot, "urgent")
        await until(pilot, lambda: priority() == 400, "priority urgent", priority)
        await pilot.press("p")
        await answer(pilot, "250")
        await until(pilot, lambda: priority() == 250, "priority 250", priority)
        assert lab.job(job)["spec"]["priority"] == 250 and app.rows[job].cells[4] == "250"

    drive(app, scenario)


def test_edit_gpus_and_time_limit_of_a_queued_job(lab):
    block = blocker(lab)
    job = lab.submit("true", name="resized")
    app = lab.app()

    async def scenario(pilot):
        screen = await on_queue(pilot)
        await point_at(pilot, job)
        await pilot.press("e")
        await until(pilot, lambda: isinstance(app.screen, Ask), "the question")
        assert app.screen.query_one(Input).value == "gpus=1 time=none"
        await answer(pilot, "gpus=2 time=2h")
        await until(pilot, lambda: app.jobs[job]["spec"]["gpus"] == 2, "2 GPUs", lambda: app.jobs[job]["spec"])
        spec = lab.job(job)["spec"]
        assert (spec["gpus"], spec["time_limit_s"]) == (2, 7200)
        assert app.rows[job].cells[5] == "2"

        await pilot.press("e")
        await answer(pilot, "gpus=0")
        await until(pilot, lambda: "gpus: a whole number" in text(screen, "#status"), "the form's refusal")

        await point_at(pilot, block)  # running: the leader refuses
        await pilot.press("e")
        await answer(pilot, "gpus=1")
        await until(pilot, lambda: "only a queued or held job can be edited" in text(screen, "#status"),
                    "the leader's refusal", lambda: text(screen, "#status"))
        assert lab.job(block)["spec"]["gpus"] == 4

    drive(app, scenario)


def test_move_to_top_as_admin(lab):
    blocker(lab)
    jobs = [lab.submit("true", name=f"q{i}") for i in range(3)]
    app = lab.app()

    async def scenario(pilot):
        await on_queue(pilot)
        await point_at(pilot, jobs[-1])
        await pilot.press("t")
        await until(pilot, lambda: app.jobs[jobs[-1]]["spec"]["priority"] > 200, "the job to move up",
                    lambda: app.jobs[jobs[-1]]["spec"])
        assert lab.job(jobs[-1])["spec"]["priority"] > max(lab.job(j)["spec"]["priority"] for j in jobs[:-1])

    drive(app, scenario)


def test_top_and_preempt_are_refused_to_a_user(lab):
    running = lab.submit("sleep", "300", gpus=4, name="big", no_preempt=True)
    lab.wait_state(running, "running")
    waiting = lab.submit("true", name="mine", token=lab.bob)
    app = lab.app(lab.bob)

    async def scenario(pilot):
        screen = await on_queue(pilot)
        assert "bob |" in text(screen, "#banner") and "admin" not in text(screen, "#banner")
        await point_at(pilot, waiting)
        await pilot.press("t")
        await point_at(pilot, running)
        await pilot.press("P")  # refused before any question
        assert isinstance(app.screen, QueueScreen)
        assert app.notices == ["top is for admins", "preempt is for admins"]
        assert lab.job(waiting)["spec"]["priority"] == 200
        job = lab.job(running)
        assert (job["state"], job["attempt"]) == ("running", 1)

    drive(app, scenario)


def test_preempt_as_admin_requeues_the_job(lab):
    job = lab.submit("sleep", "300", name="victim")
    lab.wait_state(job, "running")
    app = lab.app()

    async def scenario(pilot):
        await on_queue(pilot)
        await point_at(pilot, job)
        await pilot.press("P")
        await until(pilot, lambda: isinstance(app.screen, Confirm), "the question")
        await pilot.press("y")

        def seen() -> list:
            return [(data.get("state"), data.get("attempt")) for _, data in app.job_events.get(job, ())]

        await until(pilot, lambda: ("queued", 2) in seen(), "the job back in the queue as attempt 2", seen)
        assert ("preempting", 1) in seen()
        done = lab.job(job)
        assert (done["attempt"], done["preemptions"], done["attempts"][0]["stop_reason"]) == (2, 1, "preempted")
        assert done["state"] in ("queued", "starting", "running"), (done, lab.agent_log())  # the GPUs are free

    drive(app, scenario)


# -- submit ------------------------------------------------------------------------------------------------

def test_submit_from_the_form(lab):
    app = lab.app()

    async def scenario(pilot):
        screen = await on_queue(pilot)
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, SubmitForm), "the form")
        await pilot.press("enter")  # nothing typed: the form says what is missing
        assert "command: say what to run" in text(app.screen, "#form-error")
        # a job that lasts: one that ends before the app fetches it never shows in the queue
        for value in ["sh -c 'sleep 300'", "2", "high", "1h", "formed"]:
            await type_text(pilot, value)
            await pilot.press("tab")
        await type_text(pilot, "/tmp")
        await pilot.press("enter")  # Enter in a field submits
        await on_queue(pilot)
        await until(pilot, lambda: text(screen, "#status").startswith("submitted job"), "the answer",
                    lambda: text(screen, "#status"))
        job_id = int(re.search(r"submitted job (\d+)", text(screen, "#status")).group(1))
        await until(pilot, lambda: job_id in app.rows, "the new job in the table")
        spec = lab.job(job_id)["spec"]
        assert spec["command"] == ["sh", "-c", "sleep 300"]
        assert (spec["gpus"], spec["priority"], spec["time_limit_s"], spec["name"], spec["workdir"]) == (
            2, 300, 3600, "formed", "/tmp")
        assert spec["user"] == lab.admin_user

    drive(app, scenario)


def test_resubmit_fills_the_form_from_a_job(lab):
    first = lab.submit("sleep", "300", name="again", time="1h")
    lab.wait_state(first, "running")
    app = lab.app()

    async def scenario(pilot):
        screen = await on_queue(pilot)
        await point_at(pilot, first)
        await pilot.press("a")  # again
        await until(pilot, lambda: isinstance(app.screen, SubmitForm), "the form")
        values = {key: app.screen.query_one(f"#f-{key}", Input).value for key, _, _ in SubmitForm.FIELDS}
        assert values == {"command": "sleep 300", "gpus": "1", "class": "200", "time": "3600s", "name": "again",
                          "workdir": lab.job(first)["spec"]["workdir"]}
        await pilot.press("enter")
        await until(pilot, lambda: text(screen, "#status").startswith("submitted job"), "the answer",
                    lambda: text(screen, "#status"))
        again = int(text(screen, "#status").split()[-1])
        assert again != first
        spec = lab.job(again)["spec"]
        assert (spec["command"], spec["name"], spec["time_limit_s"]) == (["sleep", "300"], "again", 3600)

    drive(app, scenario)


# -- other screens -----------------------------------------------------------------------------------------

def test_enter_shows_the_spec_and_the_attempts(lab):
    job = lab.submit("sleep", "300", name="twice")
    lab.wait_state(job, "running")
    urgent = lab.submit("sleep", "300", gpus=4, name="deadline", **{"class": "urgent"})  # preempts it
    lab.wait_state(urgent, "running")
    assert lab.job(job)["attempt"] == 2
    app = lab.app()

    async def scenario(pilot):
        await on_queue(pilot)
        await point_at(pilot, job)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, JobDetailScreen), "the detail screen")
        detail = app.screen
        await until(pilot, lambda: "attempts" in text(detail, "#spec") and "pending" in text(detail, "#spec"),
                    "the spec with its attempts and why it waits", lambda: text(detail, "#spec"))
        spec = text(detail, "#spec")
        assert spec.startswith(f"job {job} (twice): queued, attempt 2")
        assert "command     sleep 300" in spec and "preemptions 1" in spec and "pending     Resources" in spec
        attempts = spec.split("  attempts\n")[1].splitlines()
        assert attempts[0].split()[:3] == ["#", "NODE:GPUS", "STARTED"]
        assert attempts[1].split()[0] == "1" and f"preempted for job {urgent}" in attempts[1]
        assert attempts[-1].split()[:2] == ["2", "-"] and "queued" in attempts[-1]

        # a running job's detail draws its place on the node's link matrix
        await pilot.press("escape")
        await on_queue(pilot)
        await point_at(pilot, urgent)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen.job_id == urgent,
                    "the running job's detail")
        await until(pilot, lambda: "ws1: GPUs 0,1,2,3" in text(app.screen, "#topology"), "its placement",
                    lambda: text(app.screen, "#topology"))
        await pilot.press("escape")
        await on_queue(pilot)

    drive(app, scenario)


def test_logs_of_a_job_that_printed(lab):
    job = lab.submit("sh", "-c", "echo hello from the job; echo second line; sleep 300", name="talker")
    lab.wait(lambda: "second line" in lab.labq("logs", str(job)).stdout, "the job to print")
    app = lab.app()

    async def scenario(pilot):
        await on_queue(pilot)
        await point_at(pilot, job)
        await pilot.press("l")
        await until(pilot, lambda: isinstance(app.screen, LogsScreen), "the logs screen")
        logs = app.screen
        await until(pilot, lambda: logs.lines[:2] == ["hello from the job", "second line"], "the log lines",
                    lambda: logs.lines)
        assert text(logs, "#banner") == f" log of job {job}"
        await pilot.press("slash")
        await type_text(pilot, "SECOND")
        await pilot.press("enter")
        assert text(logs, "#banner") == f" log of job {job}: line 2: second line"
        await pilot.press("escape")
        await on_queue(pilot)

    drive(app, scenario)


def test_help_lists_the_keys(lab):
    app = lab.app()

    async def scenario(pilot):
        await on_queue(pilot)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
        shown = str(app.screen.query_one(Static).render())
        assert shown.startswith("keys on this screen (queue):")
        for key, what in [("/", "filter"), ("c", "cancel"), ("P", "preempt"), ("q", "quit"), ("n", "nodes"),
                          ("space", "tag"), ("↑, k", "up")]:  # keys as the footer writes them, the table's too
            assert re.search(rf"^  {re.escape(key)} +{what}$", shown, re.M), (key, shown)
        assert "sort (o then a letter)" in shown and "a leading ! negates" in shown
        await pilot.press("escape")
        await on_queue(pilot)

    drive(app, scenario)


# -- the leader goes away and comes back ---------------------------------------------------------------

def test_a_lost_leader_shows_a_banner_and_the_app_reconnects(own_lab):
    lab = own_lab
    job = lab.submit("sleep", "300", name="survivor")
    lab.wait_state(job, "running")
    app = lab.app()

    async def scenario(pilot):
        screen = await on_queue(pilot)
        banner = screen.query_one("#banner", Static)
        assert not banner.has_class("down")
        lab.kill(lab.leader)
        await until(pilot, lambda: banner.has_class("down"), "the banner to turn red", lambda: app.status)
        assert "leader unreachable, reconnecting" in text(screen, "#banner") and not app.connected
        app.feed_watch.subscribed.clear()

        lab.start_leader()  # the same port and data
        await until(pilot, lambda: not banner.has_class("down") and app.feed_watch.subscribed.is_set(),
                    "the app to reconnect by itself", lambda: app.status, timeout=40)
        assert f"{lab.admin_user} (admin)" in text(screen, "#banner")
        assert app.rows[job].state == "running"
        later = lab.submit("sleep", "300", name="after-the-restart")  # followed again: it appears, and runs
        await until(pilot, lambda: later in app.rows and app.rows[later].state == "running", "the new job",
                    lambda: app.rows)

    drive(app, scenario)


def test_letters_typed_with_the_slash_are_kept_whenever_the_box_takes_the_focus(canned_leader):
    """A paste or a slow link: "/" and the letters after it reach the table before the focus moves, and the box's
    own Focus event may come after they were put in it; none of them is lost, and what is typed on follows them
    (the box once selected them all on focus, so the next letter replaced them: "state:run" became "ate")."""
    import asyncio

    from textual import events

    from tests.tui.labs import SIZE

    app = canned_leader.app()

    async def scenario() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.connected, "the canned queue")
            table, box = app.screen.table, app.screen.query_one("#filter")
            for key, char in (("slash", "/"), ("s", "s"), ("t", "t")):
                table.post_message(events.Key(key, char))  # queued to the table, as a burst is
            await pilot.pause(0.2)
            await pilot.press("a", "t", "e")
            assert box.value == "state" and table.filter_text == "state"
            await pilot.press("enter", "slash", "r")  # opened again: a new letter replaces the kept filter
            assert box.value == "r"

    asyncio.run(scenario())
