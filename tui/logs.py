"""``l``: a job's log, followed live from whichever node runs it; ``/`` searches, ``n`` finds the next.

``labq logs`` hands a job's output to the terminal as it is; here the screen is the TUI's, so the
output is shown as text (``shown_output``): colors dropped, a carriage return taken as a line break,
every other control character escaped. The lines searched are the lines shown.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Input, Log, Static
from textual.worker import get_current_worker

from labq.protocol.errors import ApiError
from labq.terminal_text import escape_controls

POLL_S = 0.5
_SGR = re.compile(r"\x1b\[[0-9;:]*m")  #: a color or style sequence


def shown_output(chunk: str) -> str:
    """A job's output as this screen shows it: no colors (the log has none), a progress bar's ``\\r``
    redraws one a line, every control character but line breaks and tabs escaped."""
    return escape_controls(_SGR.sub("", chunk).replace("\r\n", "\n").replace("\r", "\n"), keep="\n\t")


@dataclass
class LogChunk(Message):
    text: str
    done: bool
    error: str = ""


class LogsScreen(Screen):
    BINDINGS = [Binding("escape", "back", "back"), Binding("slash", "search", "search"),
                Binding("n", "next", "next match")]

    def __init__(self, job_id: int, attempt: int | None = None) -> None:
        super().__init__()
        self.job_id, self.attempt = job_id, attempt
        self.lines: list[str] = []
        self.needle = ""
        self.found = -1
        self._partial = ""

    def compose(self) -> ComposeResult:
        yield Static(Text(f" log of job {self.job_id}" + (f", attempt {self.attempt}" if self.attempt else "")),
                     id="banner")
        yield Log(id="log", highlight=False)
        yield Input(placeholder="search; Enter finds, n the next", id="search")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#search").display = False
        self.follow()

    @work(thread=True, exclusive=True, group="logs")
    def follow(self) -> None:
        """Reads the log from its end of last time, until the attempt ends or the screen goes."""
        client = self.app.client_factory()
        me = get_current_worker()
        offset = 0
        while not me.is_cancelled:
            try:
                data, offset, done = client.logs(self.job_id, self.attempt, offset)
            except ApiError as err:
                self.post_message(LogChunk("", True, str(err)))
                return
            if data or done:
                self.post_message(LogChunk(shown_output(data.decode(errors="replace")), done))
            if done:
                return
            time.sleep(POLL_S)

    @on(LogChunk)
    def chunk(self, message: LogChunk) -> None:
        log = self.query_one(Log)
        if message.text:
            log.write(message.text)
            parts = (self._partial + message.text).split("\n")
            self._partial = parts.pop()  # a line the next chunk finishes
            self.lines += parts
        if message.error:
            log.write_line(f"labq: {escape_controls(message.error)}")
        elif message.done:
            self.query_one("#banner", Static).update(Text(f" log of job {self.job_id}: ended"))

    def action_back(self) -> None:
        box = self.query_one("#search", Input)
        if box.display:
            box.display = False
            self.query_one(Log).focus()
            return
        self.workers.cancel_group(self, "logs")
        self.app.pop_screen()

    def action_search(self) -> None:
        box = self.query_one("#search", Input)
        box.display = True
        box.focus()

    @on(Input.Submitted, "#search")
    def search(self, event: Input.Submitted) -> None:
        self.needle, self.found = event.value, -1
        self.query_one("#search").display = False
        self.query_one(Log).focus()
        self.action_next()

    def action_next(self) -> None:
        if not self.needle:
            return
        for i in list(range(self.found + 1, len(self.lines))) + list(range(0, self.found + 1)):
            if self.needle.lower() in self.lines[i].lower():
                self.found = i
                log = self.query_one(Log)
                log.scroll_to(y=i, animate=False)
                self.query_one("#banner", Static).update(
                    Text(f" log of job {self.job_id}: line {i + 1}: {self.lines[i][:120]}"))
                return
        self.query_one("#banner", Static).update(
            Text(f" log of job {self.job_id}: {escape_controls(repr(self.needle))} not found"))
