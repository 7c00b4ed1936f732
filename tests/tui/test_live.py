"""The TUI stays live against a real leader and a simulated agent (``sim:ws-4x3090``): the nodes screen and the
GPU strip follow who holds each GPU, ages and lease ages move with the clock with no event, and finished jobs
leave the queue view after ``--keep-finished``.
"""

from __future__ import annotations

import re
import time

import pytest
from textual.widgets import Static

from labq.cli import _parser
from labq.cli.errors import CliError
from labq.cli.tui import app_for
from labq.tui.app import KEEP_FINISHED_S
from labq.tui.feed import JobsChanged, LeaderFeed
from labq.tui.nodes import NodesScreen
from tests.tui.labs import drive, until

pytestmark = pytest.mark.timeout(120)


def text(screen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


def table_line(table, job_id: int) -> str:
    """The table's line for ``job_id`` as it is drawn now."""
    y = 1 + table.shown.index(job_id) - table.scroll_offset.y
    return "".join(segment.text for segment in table.render_line(y))


def blocker_and_next(lab) -> tuple[int, int]:
    """A job on all four GPUs that nothing preempts, and one queued behind it for the same four."""
    first = lab.submit("sleep", "300", gpus=4, name="first", no_preempt=True)
    lab.wait_state(first, "running")
    after = lab.submit("sleep", "300", gpus=4, name="after")
    return first, after


def test_the_nodes_screen_shows_the_new_occupant_of_the_gpus_after_a_cancel(lab):
    first, after = blocker_and_next(lab)
    app = lab.app()

    def holders() -> set[str]:
        """The job named on each GPU row of the grid."""
        rows = text(app.screen, "#gpu-grid").splitlines()[1:]
        return {m.group(0) if (m := re.search(r"job \d+", row)) else "free" for row in rows}

    async def scenario(pilot):
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, NodesScreen) and holders() == {f"job {first}"},
                    "the first job on every GPU", lambda: text(app.screen, "#gpu-grid"))
        lab.labq("cancel", str(first))
        await until(pilot, lambda: lab.job(after)["state"] == "running", "the leader to start the next job",
                    lambda: lab.job(after)["state"], timeout=30)
        started = time.monotonic()
        await until(pilot, lambda: holders() == {f"job {after}"}, "the nodes screen to show the new occupant",
                    lambda: text(app.screen, "#gpu-grid"), timeout=2)
        assert time.monotonic() - started < 2

    drive(app, scenario)


def test_the_lease_age_counts_from_the_last_report_and_ticks(lab):
    app = lab.app()  # the lab's lease is 2 s: the agent reports at least every second

    def age() -> int:
        found = re.search(r"lease age (\d+)s", text(app.screen, "#node-head"))
        assert found, text(app.screen, "#node-head")
        return int(found.group(1))

    async def scenario(pilot):
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, NodesScreen) and "lease age" in text(app.screen,
                                                                                                 "#node-head"),
                    "the node's lease age")
        seen = []
        for _ in range(16):  # 8 s: past four leases
            seen.append(age())
            await pilot.pause(0.5)
        assert max(seen) <= 4, seen  # heard from every second: its age restarts, it does not only grow
        assert len(set(seen)) > 1, seen  # and it moves between reports

    drive(app, scenario)


def test_the_time_column_moves_with_the_clock_without_any_event(lab):
    job = lab.submit("sleep", "300", name="ticking")
    lab.wait_state(job, "running")
    app = lab.app()

    async def scenario(pilot):
        table = app.screen.table
        await until(pilot, lambda: job in table.shown, "the job in the table")
        row, events, before = app.rows[job], len(app.job_events.get(job, ())), table_line(table, job)
        await until(pilot, lambda: table_line(table, job) != before, "the time to move",
                    lambda: table_line(table, job), timeout=3)
        assert app.rows[job] is row and len(app.job_events.get(job, ())) == events  # no news about the job
        assert before.split()[:4] == table_line(table, job).split()[:4]  # its id, user, name, state

    drive(app, scenario)


def test_a_finished_job_leaves_the_queue_view_after_the_keep_time(lab):
    staying = lab.submit("sleep", "300", name="staying")
    lab.wait_state(staying, "running")
    app = lab.app(keep_finished_s=2)

    async def scenario(pilot):
        table = app.screen.table
        await until(pilot, lambda: staying in table.shown, "the running job")
        done = lab.submit("sleep", "1", name="quick")  # long enough to be fetched before it ends
        await until(pilot, lambda: done in app.rows and app.rows[done].state == "succeeded", "the job to end",
                    lambda: app.rows.get(done))
        ended = app.finished_at[done]  # when the app saw it end, on its clock
        times = set()
        while done in table.shown:  # every tick redraws it: its time stays where the job ended
            times.add(table_line(table, done).split()[-1])
            assert time.time() - ended < 6, "the finished job is still shown"
            await pilot.pause(0.2)
        assert time.time() - ended >= 2 and len(times) == 1, times
        assert done not in app.rows and done not in app.jobs
        assert table.shown == [staying] and "1 jobs: 1 running" in text(app.screen, "#banner")

    drive(app, scenario)


def test_a_job_that_ends_between_its_event_and_its_fetch_shows_its_final_state(lab):
    """The feed fetches the jobs an event named; one that ended after that event (its end committed, its own event
    not read yet) is not in the queue any more, and the leader's history says how it ended: never "running"."""
    _, waiting = blocker_and_next(lab)
    posted = []
    feed = LeaderFeed(lab.client(), posted.append)
    feed._take({"event": "job", "data": {"job_id": waiting, "pending": True}})  # as the stream says it
    lab.labq("cancel", str(waiting))
    feed._flush()
    changed = [m for m in posted if isinstance(m, JobsChanged)]
    assert [[(j["id"], j["state"]) for j in m.jobs] for m in changed] == [[(waiting, "cancelled")]], changed
    assert changed[0].finished == {}


def test_the_event_stream_is_open_when_events_returns(lab):
    """A view opens the stream, then loads: an event published after ``events()`` returned is in the stream, so a job
    submitted between the load and the first read is never missed (the feed would show it only after a restart)."""
    client = lab.client()
    stream = client.events()
    job = lab.submit("sleep", "300", name="after-open")
    first = next(e for e in stream if e["event"] == "job")
    stream.close()
    assert (first["data"]["job_id"], first["data"]["state"]) == (job, "queued"), first


def test_a_later_final_state_replaces_an_end_seen_without_one(lab):
    """A job the leader no longer knows at all is shown as ended with its last state; its final state, when its event
    comes, replaces that, and a stale fetch of it as running never brings it back."""
    job = lab.submit("sleep", "300", name="ends")
    lab.wait_state(job, "running")
    app = lab.app()

    async def scenario(pilot):
        await until(pilot, lambda: job in app.rows, "the running job")
        running = dict(app.jobs[job])
        app.post_message(JobsChanged([], {}, {job: "finished"}))
        await until(pilot, lambda: job in app.finished_at, "the end without a state", lambda: app.rows[job])
        app.post_message(JobsChanged([], {}, {job: "cancelled"}))
        await until(pilot, lambda: app.rows[job].state == "cancelled", "the final state", lambda: app.rows[job])
        app.post_message(JobsChanged([running], {}, {}))
        app.post_message(JobsChanged([], {}, {job: "finished"}))
        await pilot.pause(0.3)
        assert app.rows[job].state == "cancelled" and app.rows[job].finished

    drive(app, scenario)


def test_keep_finished_is_an_option_of_labq_tui(lab, monkeypatch):
    for name, value in lab.env().items():
        monkeypatch.setenv(name, value)  # the lab's credentials, as `labq tui` reads them
    parse = _parser().parse_args
    assert app_for(parse(["tui"])).keep_finished_s == KEEP_FINISHED_S == 60
    assert app_for(parse(["tui", "--keep-finished", "10m"])).keep_finished_s == 600
    assert app_for(parse(["tui", "--keep-finished", "0"])).keep_finished_s == 0
    with pytest.raises(CliError, match="--keep-finished: 'soon' is not a duration"):
        app_for(parse(["tui", "--keep-finished", "soon"]))


# -- the GPU strip over the queue ------------------------------------------------------------------------------

def test_the_gpu_strip_follows_who_holds_each_gpu(lab):
    first, after = blocker_and_next(lab)
    app = lab.app()

    def strip() -> str:
        return text(app.screen, "#gpu-strip")

    def holders() -> list[str]:
        """Who holds GPUs 0-3 of ws1, as the strip names them."""
        line = strip().splitlines()[0]
        return re.findall(r"\b[0-3] +(?:\d+|-) +(?:\d+|-) (\S+)", line.removeprefix("ws1"))

    async def scenario(pilot):
        me = lab.admin_user[:5]  # 80 columns leave 5 letters for a name
        await until(pilot, lambda: strip().startswith("ws1 ") and len(holders()) == 4, "the strip", strip)
        assert all(h.startswith(me[:4]) for h in holders()), strip()
        assert all(len(line) <= 80 for line in strip().splitlines())
        lab.labq("hold", str(after))
        lab.labq("cancel", str(first))
        await until(pilot, lambda: holders() == ["free"] * 4, "the GPUs free on the strip", strip, timeout=5)
        lab.labq("release", str(after))
        await until(pilot, lambda: all(h.startswith(me[:4]) for h in holders()), "the next job on the strip",
                    strip, timeout=10)

    drive(app, scenario)


def test_a_notice_for_you_rings_the_bell_and_shows_its_line(lab):
    """``labq submit --notify end``: when the job succeeds, the TUI of its owner rings and shows the notice."""
    app = lab.app()
    bells: list[float] = []
    app.bell = lambda: bells.append(time.time())

    async def scenario(pilot) -> None:
        job = lab.submit("true", notify="end", name="noticed")
        await until(pilot, lambda: any(f"job {job} (noticed) succeeded" in n for n in app.notices),
                    "the notice of the job's end", lambda: app.notices)
        assert len(bells) == 1

    drive(app, scenario)
