"""The log screen as a lab uses it: it follows a job's output until the user scrolls up or searches, and
stays where the user put it while more output arrives; ``End``, ``G``, ``F`` or ``f`` follow again; ``[``
and ``]`` show the other attempts of a preempted job; ``?`` lists each key once, with what it does there.

Against a real lab (a leader and a simulated agent running real jobs); snapshots against the canned lab
with a leader that serves job 3's two logs; and ``labq tui`` in tmux.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import time

import pytest
from textual.widgets import Static

from labq.transport import Request, Response
from labq.tui.help import HelpScreen
from labq.tui.logs import JobLog, LogsScreen
from labq.tui.queue import QueueScreen
from tests.tui.labs import DATA, SIZE, CannedLeader, point_at, type_text, until
from tests.tui.test_tmux import LABQ, TMUX, Terminal

pytestmark = pytest.mark.timeout(120)

#: a job that prints a numbered line every 20 ms, until it is cancelled
CHATTY = ("sh", "-c", 'i=0; while :; do i=$((i+1)); echo "line $i"; sleep 0.02; done')


def drive(app, scenario) -> None:
    """Runs ``scenario(pilot)`` against the app at 120x36, once its queue is loaded and following."""

    async def main() -> None:
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: app.connected and app.feed_watch.subscribed.is_set(),
                        "the app to load the queue and follow the event stream", lambda: app.status)
            await scenario(pilot)

    asyncio.run(main())


def shown(screen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


async def open_logs(pilot, job_id: int, lines: int = 1) -> LogsScreen:
    """``l`` on ``job_id`` in the queue; the log screen, once it shows at least ``lines`` lines."""
    await until(pilot, lambda: isinstance(pilot.app.screen, QueueScreen), "the queue", lambda: pilot.app.screen)
    await point_at(pilot, job_id)
    await pilot.press("l")
    await until(pilot, lambda: isinstance(pilot.app.screen, LogsScreen), "the log screen", lambda: pilot.app.screen)
    logs = pilot.app.screen
    await until(pilot, lambda: len(logs.lines) >= lines, f"{lines} lines of output", lambda: logs.lines[-3:])
    return logs


async def more_output(pilot, logs: LogsScreen, lines: int = 25) -> None:
    """Waits until ``lines`` more lines of the job's output have reached the screen."""
    count = len(logs.lines)
    await until(pilot, lambda: len(logs.lines) >= count + lines, f"{lines} more lines of output",
                lambda: (count, len(logs.lines)))


def at_end(log: JobLog) -> bool:
    return log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y


# -- following, and not --------------------------------------------------------------------------------

def test_scrolling_up_stops_following_and_end_or_F_follows_again(lab):
    job = lab.submit(*CHATTY, name="chatty")
    lab.wait_state(job, "running")
    app = lab.app()

    async def scenario(pilot):
        logs = await open_logs(pilot, job, lines=100)
        log = logs.query_one(JobLog)
        await until(pilot, lambda: at_end(log), "the view at the end of the output", lambda: log.scroll_y)
        assert shown(logs, "#where") == "attempt 1 · following"

        for key in ("pageup", "home"):
            await pilot.press(key)
            where = log.scroll_y
            assert where < log.max_scroll_y and not log.following, key
            await more_output(pilot, logs)
            assert log.scroll_y == where, f"after {key}, more output moved the view"
            assert shown(logs, "#where") == "attempt 1 · paused: End follows"
        assert log.scroll_y == 0  # home: the first line

        for key in ("end", "F"):
            await pilot.press(key)
            assert log.following and at_end(log), key
            assert shown(logs, "#where") == "attempt 1 · following"
            await more_output(pilot, logs)
            assert at_end(log), f"after {key}, the view did not follow the new output"
            await pilot.press("pageup")
            assert not log.following

    drive(app, scenario)


def test_g_goes_to_the_top_and_G_to_the_end(lab):
    job = lab.submit(*CHATTY, name="chatty")
    lab.wait_state(job, "running")
    app = lab.app()

    async def scenario(pilot):
        logs = await open_logs(pilot, job, lines=100)
        log = logs.query_one(JobLog)
        await pilot.press("g")
        assert log.scroll_y == 0 and not log.following
        await more_output(pilot, logs)
        assert log.scroll_y == 0
        await pilot.press("G")
        assert log.following and at_end(log)
        await more_output(pilot, logs)
        assert at_end(log)

    drive(app, scenario)


def test_f_turns_following_off_and_on_and_the_footer_says_which(lab):
    job = lab.submit(*CHATTY, name="chatty")
    lab.wait_state(job, "running")
    app = lab.app()

    async def scenario(pilot):
        logs = await open_logs(pilot, job, lines=100)
        log = logs.query_one(JobLog)
        assert logs.active_bindings["f"].binding.description == "follow: on"
        await pilot.press("f")
        assert not log.following and logs.active_bindings["f"].binding.description == "follow: off"
        assert shown(logs, "#where") == "attempt 1 · paused: End follows"
        where = log.scroll_y
        await more_output(pilot, logs)
        assert log.scroll_y == where < log.max_scroll_y  # stayed, though it was at the end
        await pilot.press("f")
        assert log.following and at_end(log) and logs.active_bindings["f"].binding.description == "follow: on"
        await more_output(pilot, logs)
        assert at_end(log)

    drive(app, scenario)


def test_search_keeps_the_line_found_in_view_while_output_arrives(lab):
    job = lab.submit(*CHATTY, name="chatty")
    lab.wait_state(job, "running")
    app = lab.app()

    async def scenario(pilot):
        logs = await open_logs(pilot, job, lines=200)
        log = logs.query_one(JobLog)
        await pilot.press("slash")
        await type_text(pilot, "line 150")
        await pilot.press("enter")
        assert shown(logs, "#banner") == f" log of job {job}: line 150: line 150"
        assert not log.following and log.scroll_y == 149  # the line found, at the top of the view
        await more_output(pilot, logs, 50)
        assert log.scroll_y == 149, "more output pulled the view away from the line found"
        for key in ("n", "N"):  # line 1500, if it came already, else line 150 again
            await pilot.press(key)
            assert logs.lines[round(log.scroll_y)].startswith("line 150") and not log.following

    drive(app, scenario)


# -- attempts --------------------------------------------------------------------------------------------

def test_brackets_show_the_attempts_of_a_job_preempted_once(lab):
    job = lab.submit("sh", "-c", 'echo "this is attempt $LABQ_ATTEMPT"; sleep 300', name="twice")
    lab.wait_state(job, "running")
    lab.wait(lambda: "attempt 1" in lab.labq("logs", str(job)).stdout, "the first attempt to print")
    lab.client().action(job, "preempt")
    lab.wait(lambda: lab.job(job)["attempt"] == 2 and lab.job(job)["state"] == "running", "the job to run again")
    app = lab.app()

    async def scenario(pilot):
        logs = await open_logs(pilot, job)
        await until(pilot, lambda: logs.lines == ["this is attempt 2"], "the second attempt's output",
                    lambda: logs.lines)
        assert shown(logs, "#where") == "attempt 2 of 2 · following"
        await pilot.press("right_square_bracket")  # no later attempt: nothing changes
        assert logs.attempt == 2

        await pilot.press("left_square_bracket")
        await until(pilot, lambda: logs.lines == ["this is attempt 1"], "the first attempt's output",
                    lambda: logs.lines)
        await until(pilot, lambda: logs.ended, "the first attempt's log to end")
        assert shown(logs, "#where") == "attempt 1 of 2 · ended"
        assert logs.query_one(JobLog).lines == ["this is attempt 1", ""]  # attempt 2's line is gone

        await pilot.press("right_square_bracket")
        await until(pilot, lambda: logs.lines == ["this is attempt 2"], "the second attempt's output again",
                    lambda: logs.lines)
        assert shown(logs, "#where") == "attempt 2 of 2 · following"

    drive(app, scenario)


# -- help ------------------------------------------------------------------------------------------------

def listed(help_text: str) -> dict[str, str]:
    """key -> what the help says it does; fails if a key is listed twice."""
    keys: dict[str, str] = {}
    for line in help_text.splitlines()[1:]:
        if not line.strip():
            break
        found = re.fullmatch(r"  (.+?) {2,}(\S.*)", line)
        assert found, line
        for key in found.group(1).split(", "):
            assert key not in keys, f"{key!r} listed as both {keys[key]!r} and {found.group(2)!r}:\n{help_text}"
            keys[key] = found.group(2)
    return keys


async def help_of(pilot) -> str:
    await pilot.press("question_mark")
    await until(pilot, lambda: isinstance(pilot.app.screen, HelpScreen), "the help")
    text = str(pilot.app.screen.query_one(Static).render())
    await pilot.press("escape")
    await until(pilot, lambda: not isinstance(pilot.app.screen, HelpScreen), "the help to close")
    return text


def test_help_lists_each_key_once_with_what_it_does_on_that_screen(lab):
    job = lab.submit("sh", "-c", 'echo "this is attempt $LABQ_ATTEMPT"; sleep 300', name="twice")
    lab.wait_state(job, "running")
    lab.client().action(job, "preempt")
    lab.wait(lambda: lab.job(job)["attempt"] == 2 and lab.job(job)["state"] == "running", "the job to run again")
    app = lab.app()

    async def scenario(pilot):
        await until(pilot, lambda: isinstance(pilot.app.screen, QueueScreen), "the queue")
        assert listed(await help_of(pilot))  # esc, say, once: the queue's (it goes nowhere "back")

        logs = await open_logs(pilot, job)
        keys = listed(await help_of(pilot))
        assert keys["n"] == "next match" and "nodes" not in keys.values()  # the log's n, not the app's
        for key, what in [("/", "search"), ("N", "previous match"), ("esc", "back"), ("g", "top, and stop following"),
                          ("home", "top, and stop following"), ("G", "bottom, and follow"),
                          ("end", "bottom, and follow"), ("F", "bottom, and follow"), ("f", "follow: on"),
                          ("[", "prev attempt"), ("pgup", "page up"), ("q", "quit")]:
            assert keys.get(key) == what, (key, keys)
        assert "]" not in keys  # attempt 2 is the last: ] does nothing here
        await pilot.press("pageup", "left_square_bracket")
        await until(pilot, lambda: logs.attempt == 1, "attempt 1")
        keys = listed(await help_of(pilot))
        assert keys["f"] == "follow: on" and keys["]"] == "next attempt" and "[" not in keys

        await pilot.press("escape", "n")  # the nodes screen
        await until(pilot, lambda: type(pilot.app.screen).__name__ == "NodesScreen", "the nodes")
        assert listed(await help_of(pilot))["esc"] == "back"  # once

    drive(app, scenario)


# -- snapshots, against the canned lab ---------------------------------------------------------------------

#: what job 3 (llama-ft, preempted once) printed in each attempt
CANNED_LOGS = {1: "".join(f"epoch 0 step {s:>4} loss {4 - s / 100:.4f}\n" for s in range(0, 120, 10)),
               2: "resuming from checkpoint: none, starting over\n"
               + "".join(f"epoch {s // 100} step {s:>4} loss {4 - s / 400:.4f}\n" for s in range(0, 400, 10))}


class CannedLogs(CannedLeader):
    """The canned lab, whose job 3 has a log per attempt: the first ended, the second still runs."""

    def __call__(self, request: Request) -> Response:
        found = re.fullmatch(r"/v1/jobs/3/logs", request.path)
        if found is None:
            return super().__call__(request)
        attempt = int(request.query.get("attempt", ["2"])[0])
        offset = int(request.query.get("offset", ["0"])[0])
        data = CANNED_LOGS[attempt].encode()[offset:]
        return Response(200, {"Content-Type": "text/plain", "X-Labq-Offset": str(offset + len(data)),
                              "X-Labq-Done": "1" if attempt == 1 else "0"}, data)


@pytest.fixture
def log_screen_after(snap_compare):
    """``log_screen_after(*keys)``: whether job 3's log screen, after those keys, matches its snapshot."""
    leader = CannedLogs(json.loads((DATA / "lab.json").read_text()))

    def compare(*keys: str) -> bool:
        async def run_before(pilot) -> None:
            app = pilot.app
            await until(pilot, lambda: app.connected and len(app.screen.table.shown) == 6,
                        "the canned queue", lambda: app.status)
            await pilot.press("down", "down", "l")
            await until(pilot, lambda: isinstance(app.screen, LogsScreen) and len(app.screen.lines) == 41,
                        "job 3's log", lambda: app.screen)
            await pilot.press(*keys)

        return snap_compare(leader.app(), terminal_size=SIZE, run_before=run_before)

    try:
        yield compare
    finally:
        leader.close()


def test_log_screen_following(log_screen_after):
    """``l`` on job 3: its attempt 2 of 2 at the end, following; the footer's f says on, ] is dimmed."""
    assert log_screen_after()


def test_log_screen_paused(log_screen_after):
    """PageUp: the view went up a page and stopped following; the header says how to follow again."""
    assert log_screen_after("pageup")


def test_log_screen_help(log_screen_after):
    """``?`` on the log screen: each key once, n is next match."""
    assert log_screen_after("question_mark")


# -- in a real terminal ----------------------------------------------------------------------------------

def numbers(screen: str) -> list[int]:
    """The numbers of the ``line N`` lines shown."""
    return [int(n) for n in re.findall(r"^line (\d+)\b", screen, re.M)]


def settled(term: Terminal) -> str:
    """The screen, once it has stayed the same for 0.3 s."""
    shown = term.screen()
    deadline = time.monotonic() + 10
    while True:
        time.sleep(0.3)
        again = term.screen()
        if again == shown:
            return shown
        assert time.monotonic() < deadline, f"the screen kept changing:\n{again}"
        shown = again


def test_following_stops_on_page_up_and_F_resumes_in_a_real_terminal(lab):
    assert TMUX is not None and LABQ.exists(), "./install.sh installs tmux and the labq command"
    job = lab.submit(*CHATTY, name="chatty")
    lab.wait_state(job, "running")
    env = lab.env()
    term = Terminal("logs", env)
    passed = {k: env[k] for k in ("HOME", "XDG_CONFIG_HOME")}
    try:
        term.start(shlex.join(["env", *(f"{k}={v}" for k, v in passed.items()), str(LABQ), "tui"]))
        term.wait_for(lambda s: "chatty" in s, "the queue with the job")
        term.keys("l")
        # a log longer than two screens, so that the page PageUp shows is full: a view that is not
        # full rightly shows new lines below the last one, as less does
        term.wait_for(lambda s: "following" in s and len(numbers(s)) > 10 and numbers(s)[0] > 2 * len(numbers(s)),
                      "the log, following, two screens long")
        term.keys("PPage")
        term.wait_for(lambda s: "paused: End follows" in s, "PageUp to stop following")
        paused = settled(term)  # the page scrolls up in steps
        grown = numbers(paused)[-1] + 100  # about two seconds of the job's output: several reads of the TUI
        lab.wait(lambda: numbers(lab.labq("logs", "-n", "1", str(job)).stdout)[-1] >= grown,
                 "the job to write well past the paused view")
        assert numbers(term.screen()) == numbers(paused), "more output moved the view"
        term.keys("F")
        shown = term.wait_for(lambda s: "following" in s and numbers(s) and numbers(s)[-1] > numbers(paused)[-1] + 50,
                              "F to follow the end again")
        assert numbers(shown) == sorted(numbers(shown))
    finally:
        term.close()
