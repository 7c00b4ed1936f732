"""The home screen: the shared queue, live, with keys for every action on the selected or tagged jobs."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.events import Key
from textual.screen import Screen
from textual.widgets import Input, Static
from textual.widgets.input import Selection

from labq.terminal_text import escape_controls
from labq.tui.common import KeyFooter
from labq.tui.dialogs import Ask, Confirm, SubmitForm
from labq.tui.job_table import JobTable
from labq.tui.nodes import gpu_strip
from labq.tui.query import COLUMNS, SORT_KEYS, SORT_LETTERS

SORT_HELP = "sort by: " + " ".join(f"{k}={COLUMNS[i].split()[0].lower()}" for k, i in SORT_KEYS.items()) + \
    " (capital: reverse)"
#: the actions that change jobs: hidden, and refused before any question, in a read-only TUI
CHANGES = frozenset({"cancel", "hold", "release", "priority", "priority_up", "priority_down", "set_priority", "top",
                     "edit", "preempt", "submit", "resubmit"})
READONLY = "read-only (started with --readonly): no actions"


class QueueScreen(Screen):
    BINDINGS = [
        Binding("slash", "filter", "filter"), Binding("o", "sort", "sort"), Binding("enter", "detail", "detail"),
        Binding("l", "logs", "logs"), Binding("s", "submit", "submit"), Binding("c", "cancel", "cancel"),
        Binding("h", "hold", "hold"), Binding("r", "release", "release"), Binding("plus", "priority(1)", "prio+"),
        Binding("minus", "priority(-1)", "prio-"), Binding("p", "set_priority", "prio", show=False),
        Binding("t", "top", "top", show=False), Binding("e", "edit", "edit", show=False),
        Binding("P", "preempt", "preempt", show=False), Binding("a", "resubmit", "again (resubmit)", show=False),
        Binding("escape", "clear", "clear", show=False),
        *(Binding(letter, f"sort_column({column})", f"sort by {COLUMNS[column].split()[0].lower()}", show=False)
          for letter, column in SORT_LETTERS.items()),
    ]
    #: (title, help, method) for the command palette
    COMMANDS_LIST = (
        ("Filter jobs", "user:NAME state:STATE node:NODE or text; ! negates", "action_filter"),
        ("Cancel selected jobs", "asks first", "action_cancel"), ("Hold selected jobs", "", "action_hold"),
        ("Release selected jobs", "", "action_release"), ("Priority up", "", "action_priority_up"),
        ("Priority down", "", "action_priority_down"), ("Set priority", "low/normal/high/urgent or 0-1000",
                                                        "action_set_priority"),
        ("Move to top (admin)", "ahead of every queued job", "action_top"),
        ("Edit GPUs or time limit", "queued jobs", "action_edit"), ("Preempt (admin)", "checkpoint and requeue",
                                                                     "action_preempt"),
        ("Submit a job", "a form", "action_submit"), ("Resubmit", "the job under the cursor, again",
                                                      "action_resubmit"),
        ("Job details", "spec, attempts, placement, events", "action_detail"), ("Logs", "follow the output",
                                                                               "action_logs"),
    )

    def __init__(self) -> None:
        super().__init__()
        self._sorting = False
        self._tags_counted = 0  #: the tag count the banner shows

    def compose(self) -> ComposeResult:
        yield Static("", id="banner")
        yield Static("", id="gpu-strip")
        yield JobTable(id="jobs")
        # not select_on_focus: the box's Focus event can come after letters typed with the / (a paste, a slow
        # link), and selecting then would let the next letter replace them; ``action_filter`` selects at once
        yield Input(placeholder="filter: user:alice state:running node:ws1 text, !word negates; Enter keeps, Esc "
                    "clears", id="filter", select_on_focus=False)
        yield Static("", id="status")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one("#filter").display = False
        self.table.clock = self.app.clock
        self.watch(self.app, "jobs_version", self._jobs_changed)
        self.watch(self.app, "nodes_version", lambda _: self._strip())
        self.watch(self.app, "connected", self._connection)
        self.watch(self.app, "now", lambda _: self.table.tick())
        self.table.focus()

    def on_resize(self) -> None:
        self._strip()

    @property
    def table(self) -> JobTable:
        return self.query_one(JobTable)

    def _jobs_changed(self, version: int) -> None:
        app = self.app
        if app.removed_ids:
            self.table.drop_rows(app.removed_ids)
        elif app.changed_rows and len(app.changed_rows) < len(app.rows):
            self.table.put_rows(app.changed_rows)
        else:
            self.table.set_rows(app.rows)
        app.changed_rows, app.removed_ids = [], []
        self._title()
        self._strip()

    def _strip(self) -> None:
        """The GPU strip: who holds each GPU, its memory and use; a quarter of the screen at most."""
        strip, app = self.query_one("#gpu-strip", Static), self.app
        width, height = self.size.width or app.size.width, self.size.height or app.size.height
        strip.update(gpu_strip(app.nodes, app.jobs, width, max(2, height // 4)) if app.nodes or app.connected
                     else "")

    @on(JobTable.CursorMoved)
    def _tags_changed(self) -> None:
        """Space tags and moves the cursor: redraw the banner's tag count when it changed."""
        if len(self.table.tagged) != self._tags_counted:
            self._title()

    def _connection(self, up: bool) -> None:
        banner = self.query_one("#banner", Static)
        banner.set_class(not up, "down")
        self._title()

    def _title(self) -> None:
        app = self.app
        banner = self.query_one("#banner", Static)
        self._tags_counted = len(self.table.tagged)
        if not app.connected:
            banner.update(Text(f" {app.status or 'connecting to the leader...'}"))
            return
        table = self.table
        who = escape_controls(app.me.get("user", "?")) + (" (admin)" if app.admin else "")
        counts = {}
        for row in app.rows.values():
            counts[row.state] = counts.get(row.state, 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        shown = f"{len(table.shown)} of {len(app.rows)}" if table.filter_text else f"{len(app.rows)}"
        mode = " | READ-ONLY" if app.readonly else ""
        banner.update(Text(f" labq | {who}{mode} | {shown} jobs: {summary or 'none'}"
                           + (f" | filter: {escape_controls(table.filter_text)}" if table.filter_text else "")
                           + (f" | {len(table.tagged)} tagged" if table.tagged else "")))

    def show_status(self, text: str, error: bool = False) -> None:
        status = self.query_one("#status", Static)
        status.update(Text(escape_controls(text)))
        status.set_class(error, "error")

    # -- filter and sort ------------------------------------------------------------------------

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.value = self.table.filter_text
        box.selection = Selection(0, len(box.value))  # what is typed next replaces the filter, as a new one
        self.set_focus(box)  # at once: keys typed right after / (a paste, a slow link) go to the box

    @on(Input.Changed, "#filter")
    def filter_typed(self, event: Input.Changed) -> None:
        try:
            self.table.set_filter(event.value)
            self.show_status("")
        except ValueError as err:
            self.show_status(str(err), error=True)
        self._title()

    @on(Input.Submitted, "#filter")
    def filter_done(self) -> None:
        self.query_one("#filter").display = False
        self.table.focus()

    def action_clear(self) -> None:
        box = self.query_one("#filter", Input)
        if box.display or self.table.filter_text:
            box.value = ""
            box.display = False
            self.table.set_filter("")
        self.table.clear_tags()
        self.table.focus()
        self._title()

    def action_sort(self) -> None:
        self._sorting = True
        self.show_status(SORT_HELP)

    def action_sort_column(self, column: int) -> None:
        """A capital letter sorts by its column at once; pressed again, it reverses the order."""
        table = self.table
        reverse = not table.sort_reverse if table.sort_column == column else False
        table.sort_by(column, reverse)
        letter = next(k for k, c in SORT_LETTERS.items() if c == column)
        self.show_status(f"sorted by {COLUMNS[column].lower()}{', reversed' if reverse else ''} ({letter} again: "
                         "reverse)")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Read-only: the actions that change jobs are not offered (the footer, the help and the palette
        leave them out)."""
        return not (self.app.readonly and action in CHANGES)

    def on_key(self, event: Key) -> None:
        # Keys that arrive together (a paste, a slow link) are all on their way to the table before the
        # focus moves: open the filter here, not as an app binding, and give the box the letters after
        # the /, so that typing "/hold" filters and never holds a job.
        box = self.query_one("#filter", Input)
        if event.key == "slash" and self.focused is self.table:
            event.stop()
            self.action_filter()
            return
        if self.focused is box and event.is_printable:  # on its way to the table before the focus moved
            event.stop()
            event.prevent_default()
            if box.selection.is_empty:  # as the box itself takes a letter
                box.insert_text_at_cursor(event.character)
            else:
                box.replace(event.character, *box.selection)
            return
        if self._sorting and event.character:
            event.stop()
            event.prevent_default()
            self._sort_by_letter(event.character)
        elif self.app.readonly and self._changes(event.key):
            event.stop()
            event.prevent_default()
            self.show_status(READONLY, error=True)  # a word in place of the question it would have asked

    def _sort_by_letter(self, letter: str) -> None:
        self._sorting = False
        column = SORT_KEYS.get(letter.lower())
        if column is None:
            self.show_status(f"no column for {letter!r}; {SORT_HELP}", error=True)
            return
        self.table.sort_by(column, letter.isupper())
        self.show_status(f"sorted by {COLUMNS[column].lower()}{', reversed' if letter.isupper() else ''}")

    def _changes(self, key: str) -> bool:
        """Whether ``key`` is bound here to an action that changes jobs."""
        return any(b.action.split("(")[0] in CHANGES for b in self.BINDINGS if key in b.key.split(","))

    # -- actions --------------------------------------------------------------------------------

    def _ids(self) -> list[int]:
        ids = self.table.selected()
        if not ids:
            self.show_status("no job selected", error=True)
        return ids

    def action_cancel(self) -> None:
        ids = self._ids()
        if not ids:
            return
        listed = ", ".join(map(str, ids[:8])) + ("..." if len(ids) > 8 else "")
        which = f"job {ids[0]}" if len(ids) == 1 else f"{len(ids)} jobs ({listed})"

        def answer(yes: bool | None) -> None:
            if yes:
                self._act(ids, "cancel")

        self.app.push_screen(Confirm(f"Cancel {which}?"), answer)

    def _act(self, ids: list[int], action: str, **fields) -> None:
        """Acts on the jobs; the tags, used, are cleared."""
        self.app.act(ids, action, **fields)
        self.table.clear_tags()

    def action_hold(self) -> None:
        self._act(self._ids(), "hold")

    def action_release(self) -> None:
        self._act(self._ids(), "release")

    def action_priority(self, step: int) -> None:
        from labq.models.priority import PriorityClass

        classes = sorted(int(c) for c in PriorityClass)
        for job_id in self._ids():
            current = self.app.jobs[job_id]["spec"].get("priority", 200)
            if step > 0:
                target = next((c for c in classes if c > current), None)
            else:
                target = next((c for c in reversed(classes) if c < current), None)
            if target is None:
                self.show_status(f"job {job_id} is already at the {'top' if step > 0 else 'bottom'} class",
                                 error=True)
                continue
            self.app.act([job_id], "prio", priority=target)
        self.table.clear_tags()

    def action_priority_up(self) -> None:
        self.action_priority(1)

    def action_priority_down(self) -> None:
        self.action_priority(-1)

    def action_set_priority(self) -> None:
        ids = self._ids()
        if not ids:
            return

        def answer(value: str | None) -> None:
            if value:
                self._act(ids, "prio", priority=int(value) if value.strip().isdigit() else value.strip())

        self.app.push_screen(Ask("priority: low, normal, high, urgent or 0-1000", placeholder="high"), answer)

    def action_top(self) -> None:
        self._act(self._ids(), "top", admin_only=True)

    def action_preempt(self) -> None:
        ids = self._ids()
        if not ids or not self.app.admin:
            self._act(ids, "preempt", admin_only=True)
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self._act(ids, "preempt", admin_only=True)

        self.app.push_screen(Confirm(f"Preempt {len(ids)} job(s)? They checkpoint and go back to the queue."),
                             answer)

    def action_edit(self) -> None:
        ids = self._ids()
        if not ids:
            return
        spec = self.app.jobs[ids[0]]["spec"]
        limit = spec.get("time_limit_s")
        now = f"gpus={spec.get('gpus', 1)} time={int(limit)}s" if limit else f"gpus={spec.get('gpus', 1)} time=none"

        def answer(value: str | None) -> None:
            if not value:
                return
            try:
                fields = _edit_fields(value)
            except ValueError as err:
                self.show_status(str(err), error=True)
                return
            self._act(ids, "edit", **fields)

        self.app.push_screen(Ask("edit (queued jobs): gpus=N time=DURATION (time=none removes the limit)", now),
                             answer)

    def action_submit(self, values: dict | None = None) -> None:
        def answer(body: dict | None) -> None:
            if body:
                self.app.submit_job(body)

        self.app.push_screen(SubmitForm(values), answer)

    def action_resubmit(self) -> None:
        import shlex

        job_id = self.table.cursor_job()
        if job_id is None:
            return
        spec = self.app.jobs[job_id]["spec"]
        limit = spec.get("time_limit_s")
        self.action_submit({"command": shlex.join(spec.get("command") or []), "gpus": str(spec.get("gpus", 1)),
                            "class": str(spec.get("priority", 200)), "time": f"{int(limit)}s" if limit else "",
                            "name": spec.get("name") or "", "workdir": spec.get("workdir") or ""})

    def action_detail(self) -> None:
        from labq.tui.detail import JobDetailScreen

        job_id = self.table.cursor_job()
        if job_id is not None:
            self.app.push_screen(JobDetailScreen(job_id))

    def action_logs(self) -> None:
        from labq.tui.logs import LogsScreen

        job_id = self.table.cursor_job()
        if job_id is not None:
            self.app.push_screen(LogsScreen(job_id))


def _edit_fields(text: str) -> dict:
    """``gpus=4 time=6h`` -> {"gpus": 4, "time_limit_s": 21600}; ``time=none`` -> 0 (no limit)."""
    from labq.units import parse_duration

    fields: dict = {}
    for word in text.split():
        key, eq, value = word.partition("=")
        if not eq or key not in ("gpus", "time"):
            raise ValueError(f"{word!r}: use gpus=N and/or time=DURATION")
        if key == "gpus":
            if not value.isdigit() or int(value) < 1:
                raise ValueError("gpus: a whole number, 1 or more")
            fields["gpus"] = int(value)
        else:
            fields["time_limit_s"] = 0 if value in ("none", "0") else parse_duration(value, bare_seconds=True)
    if not fields:
        raise ValueError("nothing to change: gpus=N and/or time=DURATION")
    return fields
