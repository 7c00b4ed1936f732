"""``l``: a job's log, read from whichever node ran the attempt shown; ``/`` searches, ``n`` finds the next.

The view follows the output's end, as ``less +F`` does, until the user scrolls up (a key, the wheel, a
search); ``End``, ``G`` or ``F`` go back to the end and follow again, ``f`` turns following on and off
(the footer says which). ``[`` and ``]`` step through the job's attempts: a job preempted once has two
logs. The header says which attempt is shown and whether the view follows it.

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
from textual.containers import Horizontal
from textual.message import Message
from textual.reactive import reactive
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


def attempts_with_output(job: dict | None) -> list[int]:
    """The attempts of ``job`` that have a log, oldest first: those that ran before this one, and the
    current one once it has a placement (a job requeued by a preemption has none until it starts again)."""
    if job is None:
        return []
    ran = [a["attempt"] for a in job.get("attempts", ()) if a.get("placement")]
    if job.get("placement") and job.get("attempt") not in ran:
        ran.append(job["attempt"])
    return ran


@dataclass
class LogChunk(Message):
    """Output read from the leader. ``reading`` tells which reader sent it: a chunk a replaced reader
    sent before it stopped (another attempt chosen meanwhile) is dropped."""

    reading: int
    text: str
    done: bool
    error: str = ""


class JobLog(Log):
    """The output, following its end until the user scrolls up or turns following off."""

    BINDINGS = [
        Binding("f", "set_follow(False)", "follow: on"), Binding("f", "set_follow(True)", "follow: off"),
        Binding("end,G,F", "follow", "bottom, and follow", show=False),
        Binding("home,g", "top", "top, and stop following", show=False),
        Binding("up,k", "scroll_up", "up", show=False), Binding("down,j", "scroll_down", "down", show=False),
        Binding("pageup", "page_up", "page up", show=False), Binding("pagedown", "page_down", "page down", show=False),
        Binding("left", "scroll_left", "left", show=False), Binding("right", "scroll_right", "right", show=False),
    ]

    following: reactive[bool] = reactive(True)

    def watch_following(self, following: bool) -> None:
        self.auto_scroll = following
        if following:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        self.refresh_bindings()  # the footer's f says on or off

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if new_value < old_value and new_value < self.max_scroll_y:
            self.following = False  # the user went up (at the end, a taller window only clamps the position)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "set_follow":
            return parameters[0] != self.following  # one f in the footer: the one that changes the mode
        return True

    def action_set_follow(self, on: bool) -> None:
        self.following = on

    def action_follow(self) -> None:
        self.following = True

    def action_top(self) -> None:
        self.following = False
        self.scroll_home(animate=False, x_axis=False)

    # A key that goes up stops following before it scrolls: output arriving during an animated scroll
    # would otherwise pull the view back to the end before the scroll had moved it (watch_scroll_y).
    def action_scroll_up(self) -> None:
        self.following = False
        super().action_scroll_up()

    def action_page_up(self) -> None:
        self.following = False
        super().action_page_up()


ATTEMPTS = Binding.Group("attempt")  #: one place in the footer for [ and ]


class LogsScreen(Screen):
    BINDINGS = [Binding("escape", "back", "back"), Binding("slash", "search", "search"),
                Binding("n", "next(1)", "next match", show=False),
                Binding("N", "next(-1)", "previous match", show=False),
                Binding("left_square_bracket", "attempt(-1)", "prev attempt", group=ATTEMPTS),
                Binding("right_square_bracket", "attempt(1)", "next attempt", group=ATTEMPTS)]
    DEFAULT_CSS = """
    LogsScreen #header { height: 1; background: $primary-background; }
    LogsScreen #banner { width: 1fr; }
    LogsScreen #where { width: auto; padding: 0 1; }
    """

    #: the attempt shown; 0: the leader's current one (a job this screen does not know)
    attempt: reactive[int] = reactive(0, always_update=True, init=False)

    def __init__(self, job_id: int, attempt: int | None = None) -> None:
        super().__init__()
        self.job_id, self.asked = job_id, attempt
        self.lines: list[str] = []
        self.needle = ""
        self.found = -1
        self.ended = ""  #: "ended" once the attempt's log has no more to come, "error" if it cannot be read
        self._partial = ""
        self._reading = 0

    def compose(self) -> ComposeResult:
        with Horizontal(id="header"):
            yield Static(Text(f" log of job {self.job_id}"), id="banner")
            yield Static("", id="where")
        yield JobLog(id="log", highlight=False)
        yield Input(placeholder="search; Enter finds, n the next, N the one before", id="search")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#search").display = False
        self.watch(self.query_one(JobLog), "following", lambda _: self.show_where())
        self.watch(self.app, "jobs_version", lambda _: self.job_changed(), init=False)
        self.attempt = self.asked or (self.attempts or [0])[-1]

    @property
    def attempts(self) -> list[int]:
        return attempts_with_output(self.app.jobs.get(self.job_id))

    # -- reading --------------------------------------------------------------------------------------

    def watch_attempt(self, attempt: int) -> None:
        """Starts over on another attempt: an empty view that follows it, a new reader."""
        self._reading += 1
        self.lines, self._partial, self.found, self.ended = [], "", -1, ""
        log = self.query_one(JobLog)
        log.clear()
        log.following = True
        self.show_where()
        self.refresh_bindings()
        self.read(attempt or None, self._reading)

    @work(thread=True, exclusive=True, group="logs")
    def read(self, attempt: int | None, reading: int) -> None:
        """Reads the attempt's log from its end of last time, until the attempt ends or the screen goes."""
        client = self.app.client_factory()
        me = get_current_worker()
        offset = 0
        while not me.is_cancelled:
            try:
                data, offset, done = client.logs(self.job_id, attempt, offset)
            except ApiError as err:
                self.post_message(LogChunk(reading, "", True, str(err)))
                return
            if data or done:
                self.post_message(LogChunk(reading, shown_output(data.decode(errors="replace")), done))
            if done:
                return
            time.sleep(POLL_S)

    @on(LogChunk)
    def chunk(self, message: LogChunk) -> None:
        if message.reading != self._reading:
            return
        log = self.query_one(JobLog)
        if message.text:
            log.write(message.text)
            parts = (self._partial + message.text).split("\n")
            self._partial = parts.pop()  # a line the next chunk finishes
            self.lines += parts
        if message.error:
            log.write_line(f"labq: {escape_controls(message.error)}")
        if message.done:
            self.ended = "error" if message.error else "ended"
        self.show_where()

    # -- the header, and the attempts -----------------------------------------------------------------

    def job_changed(self) -> None:
        self.show_where()
        self.refresh_bindings()  # a new attempt makes ] work

    def show_where(self) -> None:
        """``attempt 1 of 2 · ended``, ``attempt 2 of 2 · following``, ``... · paused: End follows``."""
        attempts, attempt = self.attempts, self.attempt
        if not attempt:
            which = "current attempt"
        else:
            which = f"attempt {attempt}" + (f" of {max(attempts)}" if attempts and max(attempts) > 1 else "")
        state = self.ended or ("following" if self.query_one(JobLog).following else "paused: End follows")
        self.query_one("#where", Static).update(Text(f"{which} · {state}"))

    def other_attempt(self, step: int) -> int | None:
        """The attempt ``step`` away from the one shown, among those with a log; None past either end."""
        attempts = self.attempts
        if self.attempt not in attempts:
            return None
        index = attempts.index(self.attempt) + step
        return attempts[index] if 0 <= index < len(attempts) else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "attempt":
            return None if self.other_attempt(int(parameters[0])) is None else True  # shown dimmed
        return True

    def action_attempt(self, step: int) -> None:
        other = self.other_attempt(step)
        if other is not None:
            self.attempt = other

    # -- leaving, and searching -----------------------------------------------------------------------

    def action_back(self) -> None:
        box = self.query_one("#search", Input)
        if box.display:
            box.display = False
            self.query_one(JobLog).focus()
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
        self.query_one(JobLog).focus()
        self.action_next(1)

    def action_next(self, step: int) -> None:
        """Shows the next line (``step`` 1) or the one before (-1) that has the needle, at the top of the
        view; the view stops following so that it stays there."""
        if not self.needle:
            return
        count = len(self.lines)
        start = self.found if self.found >= 0 else (-1 if step > 0 else count)
        for i in ((start + step * k) % count for k in range(1, count + 1)) if count else ():
            if self.needle.lower() in self.lines[i].lower():
                self.found = i
                log = self.query_one(JobLog)
                log.following = False
                log.scroll_to(y=i, animate=False, immediate=True)
                self.query_one("#banner", Static).update(
                    Text(f" log of job {self.job_id}: line {i + 1}: {self.lines[i][:120]}"))
                return
        self.query_one("#banner", Static).update(
            Text(f" log of job {self.job_id}: {escape_controls(repr(self.needle))} not found"))
