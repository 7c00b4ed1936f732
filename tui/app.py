"""``labq tui``: the app, its state, and the app factory shared by the command and the tests.

The app keeps what the leader said (jobs, pending reasons, nodes, reservations) and bumps a
reactive version when a part changes; screens watch those versions and redraw. All network I/O
runs in thread workers that end by posting a message: the feed (``labq.tui.feed``) and one worker
per action.

The app's clock ticks (``now``, every ``TICK_S``): ages and lease ages are read from it as they are
drawn, so they move with no event, and a finished job leaves the queue ``keep_finished_s`` after it
ended (``labq tui --keep-finished``).

What came from users (names, the leader's error messages that echo them) is shown escaped
(``labq.terminal_text.escape_controls``) and as ``rich.text.Text`` or with ``markup=False``, never
as markup: a job named ``[red]x`` shows ``[red]x``.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable

from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.reactive import reactive

from labq.client import Client
from labq.protocol.errors import ApiError
from labq.terminal_text import escape_controls
from labq.tui.common import ActionDone
from labq.tui.feed import (
    FINISHED, Connection, JobEvent, JobsChanged, LabLoaded, LeaderFeed, NodesChanged, Notice, ReservationsChanged,
)
from labq.tui.query import Row, make_row

EVENTS_KEPT = 50  #: per job, for the detail screen
TICK_S = 1.0  #: how often the clock moves the ages on screen
KEEP_FINISHED_S = 60.0  #: how long a finished job stays in the queue view, by default


class LabqApp(App):
    TITLE = "labq"
    CSS_PATH = "labq.tcss"
    BINDINGS = [Binding("q", "quit", "quit"), Binding("question_mark", "help", "help"),
                Binding("n", "nodes", "nodes"), Binding("R", "reservations", "reservations")]

    jobs_version = reactive(0)
    nodes_version = reactive(0)
    reservations_version = reactive(0)
    connected = reactive(False)
    now = reactive(0.0)  #: the clock, read every TICK_S: screens that show ages watch it

    def __init__(self, client_factory: Callable[[], Client], *, readonly: bool = False,
                 clock: Callable[[], float] = time.time, keep_finished_s: float = KEEP_FINISHED_S) -> None:
        super().__init__()
        self.client_factory = client_factory
        self.readonly = readonly
        self.clock = clock  #: a fixed clock makes snapshots repeatable
        self.keep_finished_s = keep_finished_s
        self.set_reactive(LabqApp.now, clock())
        self.jobs: dict[int, dict] = {}
        self.pending: dict[int, dict] = {}
        self.rows: dict[int, Row] = {}
        self.changed_rows: list[Row] = []
        self.removed_ids: list[int] = []  #: finished jobs that left the queue view at the last version
        self.finished_at: dict[int, float] = {}  #: when the app saw each finished job end
        self.nodes: list[dict] = []
        self.reservations: list[dict] = []
        self.me: dict = {}
        self.job_events: dict[int, deque] = {}
        self.status = "connecting to the leader..."
        self.loaded_at: float | None = None  #: when the first full load was drawn (for the benchmark)
        self._feed: LeaderFeed | None = None

    # -- start and stop ---------------------------------------------------------------------

    def on_mount(self) -> None:
        from labq.tui.queue import QueueScreen

        self.push_screen(QueueScreen())
        self.follow_leader()
        self.set_interval(TICK_S, self.tick)

    def tick(self) -> None:
        self.now = self.clock()
        self._forget_finished()

    def _forget_finished(self) -> None:
        """Finished jobs leave the queue view ``keep_finished_s`` after they ended."""
        gone = [i for i, at in self.finished_at.items() if self.now - at >= self.keep_finished_s]
        if not gone:
            return
        for job_id in gone:
            for kept in (self.jobs, self.rows, self.pending, self.finished_at, self.job_events):
                kept.pop(job_id, None)
        self.changed_rows, self.removed_ids = [], gone
        self.jobs_version += 1

    @work(thread=True, exclusive=True, group="feed")
    def follow_leader(self) -> None:
        self._feed = LeaderFeed(self.client_factory(), self.post_message)
        self._feed.run()

    def on_unmount(self) -> None:
        if self._feed is not None:
            self._feed.close()

    @property
    def admin(self) -> bool:
        return bool(self.me.get("admin"))

    # -- what the leader says ---------------------------------------------------------------

    @on(LabLoaded)
    def loaded(self, message: LabLoaded) -> None:
        now = self.clock()
        self.me = message.whoami
        self.jobs = {j["id"]: j for j in message.jobs}
        self.pending = dict(message.pending)
        self.rows = {i: make_row(j, self.pending.get(i), now) for i, j in self.jobs.items()}
        self.finished_at = {i: row.until or now for i, row in self.rows.items() if row.finished}
        self.changed_rows, self.removed_ids = [], []
        self.nodes, self.reservations = message.nodes, message.reservations
        self.jobs_version += 1
        self.nodes_version += 1
        self.reservations_version += 1

    @on(JobsChanged)
    def jobs_changed(self, message: JobsChanged) -> None:
        now = self.clock()
        changed = []
        for job in message.jobs:
            if job["id"] in self.finished_at and job.get("state") not in FINISHED:
                continue  # fetched before it ended: the end the app has seen is the newer news
            self.jobs[job["id"]] = job
            if job.get("state") in FINISHED:  # fetched from the history: it ended before its event was read
                self.finished_at.setdefault(job["id"], job.get("ended_at") or now)
            if job["id"] in message.pending:
                self.pending[job["id"]] = message.pending[job["id"]]
            else:
                self.pending.pop(job["id"], None)
            changed.append(job["id"])
        for job_id, state in message.finished.items():
            job = self.jobs.get(job_id)
            if job is None or (job_id in self.finished_at and (state == "finished" or job["state"] in FINISHED)):
                continue  # an end already shown; only a job's real final state replaces "it ended somehow"
            if state != "finished":
                job["state"] = state
            job["ended_at"] = job.get("ended_at") or now  # not fetched again: the leader keeps finished jobs in its history
            self.finished_at.setdefault(job_id, now)
            self.pending.pop(job_id, None)
            changed.append(job_id)
        rows = [make_row(self.jobs[i], self.pending.get(i), now) for i in changed]
        for row in rows:
            self.rows[row.job_id] = row
        self.changed_rows, self.removed_ids = rows, []
        self.jobs_version += 1

    @on(Notice)
    def notice(self, message: Notice) -> None:
        """A notice for you: the bell, and the line (escaped: a job's name is its owner's text) for a while."""
        self.bell()
        self.notify(escape_controls(message.text), title="labq", timeout=30, markup=False)

    @on(JobEvent)
    def job_event(self, message: JobEvent) -> None:
        self.job_events.setdefault(message.job_id, deque(maxlen=EVENTS_KEPT)).append((message.at, message.data))

    @on(NodesChanged)
    def nodes_changed(self, message: NodesChanged) -> None:
        self.nodes = message.nodes
        self.nodes_version += 1

    @on(ReservationsChanged)
    def reservations_changed(self, message: ReservationsChanged) -> None:
        self.reservations = message.reservations
        self.reservations_version += 1

    @on(Connection)
    def connection(self, message: Connection) -> None:
        self.status = "" if message.up else f"leader unreachable, reconnecting: {escape_controls(message.detail)}"
        self.connected = message.up  # after the status: watchers of connected read it

    # -- acting on jobs -------------------------------------------------------------------------

    def act(self, ids: list[int], action: str, admin_only: bool = False, **fields) -> None:
        """Run an action on jobs in a worker; the answer comes back as ``ActionDone``."""
        if self.readonly:
            self.notify("read-only: started with --readonly", severity="warning")
            return
        if admin_only and not self.admin:
            self.notify(f"{action} is for admins", severity="warning")
            return
        if ids:
            self._act(ids, action, fields)

    @work(thread=True, group="actions")
    def _act(self, ids: list[int], action: str, fields: dict) -> None:
        client = self.client_factory()
        done, failed = [], []
        for job_id in ids:
            try:
                job = client.action(job_id, action, **fields)
                done.append(f"job {job_id} " + (f"stopping ({job['stop_requested']})" if job.get("stop_requested")
                                                else job["state"]))
            except ApiError as err:
                failed.append(f"job {job_id}: {err}")
        text = f"{action}: " + ", ".join(done) if done else ""
        self.post_message(ActionDone("; ".join(filter(None, [text, *failed])), error=bool(failed)))

    @work(thread=True, group="actions")
    def submit_job(self, body: dict) -> None:
        if self.readonly:  # the form is not offered; a last guard
            return
        try:
            job = self.client_factory().submit(body)
            self.post_message(ActionDone(f"submitted job {job['id']}"))
        except ApiError as err:
            self.post_message(ActionDone(f"submit refused: {err}", error=True))

    @on(ActionDone)
    def action_done(self, message: ActionDone) -> None:
        text = escape_controls(message.text)  # the leader's errors echo names
        self.status = text
        self.notify(text, severity="error" if message.error else "information", markup=False)
        self.jobs_version += 0  # screens show self.status on their next redraw
        screen = self.screen
        if hasattr(screen, "show_status"):
            screen.show_status(text, message.error)

    # -- screens -------------------------------------------------------------------------------

    def action_help(self) -> None:
        from labq.tui.help import HelpScreen

        self.push_screen(HelpScreen(self.screen))

    def action_nodes(self) -> None:
        from labq.tui.nodes import NodesScreen

        if not isinstance(self.screen, NodesScreen):
            self.push_screen(NodesScreen())

    def action_reservations(self) -> None:
        from labq.tui.reservations import ReservationsScreen

        if not isinstance(self.screen, ReservationsScreen):
            self.push_screen(ReservationsScreen())

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        for name, help_text, callback in getattr(screen, "COMMANDS_LIST", ()):
            if screen.check_action(callback.removeprefix("action_"), ()) is not False:  # read-only hides actions
                yield SystemCommand(name, help_text, getattr(screen, callback))
        yield SystemCommand("Nodes", "GPUs per node, who uses them, the link matrix", self.action_nodes)
        yield SystemCommand("Reservations", "the coming days per node; book GPUs", self.action_reservations)


    def deliver_screenshot(self, filename: str | None = None, path: str | None = None,
                           time_format: str | None = None) -> str | None:
        """Saves the screen as SVG: in ``path``, else in the Downloads folder, else (none there, as on many
        servers) in the current folder; says where, or why it could not."""
        downloads = _downloads_folder()
        folders = [path] if path else [f for f in (downloads, _current_folder()) if f is not None]
        why = [] if path or downloads else ["no Downloads folder"]
        for folder in folders:
            try:
                saved = self.save_screenshot(filename, folder, time_format)
            except OSError as err:
                why.append(f"cannot write in {folder}: {err.strerror or err}")
                continue
            self.notify(f"screenshot saved to {saved}" + (f" ({why[0]})" if why else ""), title="Screenshot",
                        markup=False)
            return saved
        self.notify("screenshot not saved: " + "; ".join(why or ["no folder to save it in"]), title="Screenshot",
                    severity="error", markup=False)
        return None


def _downloads_folder() -> str | None:
    from platformdirs import user_downloads_path  # what Textual saves in

    folder = user_downloads_path()
    return str(folder) if folder.is_dir() else None


def _current_folder() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # it was removed under us
        return None


def make_app(leader: str | None = None, *, readonly: bool = False,
             client_factory: Callable[[], Client] | None = None, clock: Callable[[], float] = time.time,
             keep_finished_s: float = KEEP_FINISHED_S) -> LabqApp:
    """The app for ``labq tui`` and for the tests: the client comes from the usual credentials."""
    if client_factory is None:
        Client.from_environment(leader=leader)  # fail now, with the CLI's message, if there are no credentials

        def client_factory() -> Client:
            return Client.from_environment(leader=leader)

    return LabqApp(client_factory, readonly=readonly, clock=clock, keep_finished_s=keep_finished_s)
