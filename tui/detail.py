"""Enter on a job: its spec, attempts, placement drawn on its node's link matrix, and its events.

Everything here is ``rich.text.Text`` of escaped strings (``escape_controls``): nothing from a user
is read as markup or reaches the terminal raw.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from labq.render.job_detail import show_text
from labq.terminal_text import escape_controls
from labq.tui.common import KeyFooter


class JobDetailScreen(Screen):
    BINDINGS = [Binding("escape", "app.pop_screen", "back"), Binding("l", "logs", "logs")]

    def __init__(self, job_id: int) -> None:
        super().__init__()
        self.job_id = job_id

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id="spec")
            yield Static(id="topology")
            yield Static(id="events")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.watch(self.app, "jobs_version", lambda _: self.redraw())
        self.watch(self.app, "nodes_version", lambda _: self.redraw())
        self.watch(self.app, "now", lambda _: self.redraw())  # the job's age

    def redraw(self) -> None:
        app = self.app
        job = app.jobs.get(self.job_id)
        if job is None:
            self.query_one("#spec", Static).update(f"job {self.job_id} is not in the queue any more")
            return
        now = self.app.clock()
        self.query_one("#spec", Static).update(Text(show_text(job, app.pending.get(self.job_id), now)))
        self.query_one("#topology", Static).update(self._placement(job))
        events = app.job_events.get(self.job_id, ())
        lines = ["events seen since the TUI started:"] + [
            f"  {time.strftime('%H:%M:%S', time.localtime(at))}  "
            + escape_controls(", ".join(f"{k}={v}" for k, v in data.items() if k != "job_id")) for at, data in events]
        self.query_one("#events", Static).update(Text("\n".join(lines) if events else "no events seen yet"))

    def _placement(self, job: dict) -> Text:
        """The link matrix of each node the job is on, with its GPUs' rows highlighted."""
        from labq.tui.nodes import link_matrix

        out = Text()
        nodes = {n["name"]: n for n in self.app.nodes}
        for alloc in (job.get("placement") or {}).get("allocations") or ():
            node = nodes.get(alloc["node"])
            if node is None:
                continue
            mine = set(alloc["gpu_indices"])
            out.append(f"\n{escape_controls(alloc['node'])}: GPUs {','.join(map(str, sorted(mine)))} "
                       f"(score {alloc.get('score', 0)})\n", style="bold")
            matrix = link_matrix(node.get("topology"))
            offset = 0
            for line in matrix.plain.split("\n"):
                if line.startswith("GPU") and line[3:].split(" ", 1)[0].isdigit() and int(line[3:].split()[0]) in mine:
                    matrix.stylize("bold reverse", offset, offset + len(line))
                offset += len(line) + 1
            out.append_text(matrix)
            out.append("\n")
        return out

    def action_logs(self) -> None:
        from labq.tui.logs import LogsScreen

        self.app.push_screen(LogsScreen(self.job_id))
