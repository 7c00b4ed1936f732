"""``R``: the coming days per node with the reservations as bars, the list of reservations, booking and cancelling.

The booking form asks the leader as the user types (a dry run, after a short pause) and shows its answer
in place: where it would be pinned and whom it displaces, or why not and what would work instead. Times
are read and shown in the user's time zone. Names and the leader's answers are shown escaped
(``escape_controls``), as text, never as markup.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import tzinfo
from typing import ClassVar

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.screen import ModalScreen, Screen
from textual.timer import Timer
from textual.events import Key
from textual.widgets import Button, DataTable, Input, Label, Static

from labq.protocol.bookings import reserve_request
from labq.protocol.errors import ApiError
from labq.render.reservations import answer_text, reservations_table
from labq.terminal_text import escape_controls
from labq.tui.common import ActionDone, KeyFooter
from labq.tui.dialogs import Confirm
from labq.tui.timeline import LEGEND, Timeline, draw_timeline
from labq.when import EXAMPLES, local_zone, parse_for, parse_when

DEFAULT_DAYS, MIN_DAYS, MAX_DAYS = 3, 1, 14
DEBOUNCE_S = 0.3  #: the pause in typing after which the form asks the leader
CLOCK_TICK_S = 60.0  #: the timeline starts at now: move it along
#: the screen's rows that are not the timeline: banner, margin, the list's header and 3 rows, status, footer
ROWS_BESIDE_TIMELINE = 8
READONLY = "read-only (started with --readonly): booking and cancelling are off"


class ReservationsScreen(Screen):
    DEFAULT_CSS = """
    ReservationsScreen #timeline {
        height: auto;
        padding: 0 1;
    }
    ReservationsScreen #reservations {
        height: 1fr;
        margin-top: 1;
    }
    """
    BINDINGS: ClassVar[list[Binding]] = [Binding("escape", "app.pop_screen", "back"), Binding("b", "book", "book"),
                Binding("c", "cancel", "cancel"), Binding("plus,equals_sign", "wider", "+day"),
                Binding("minus", "narrower", "-day")]
    #: (title, help, method) for the command palette
    COMMANDS_LIST = (("Book GPUs", "a form that asks the leader as you type", "action_book"),
                     ("Cancel reservation", "the one under the cursor; asks first", "action_cancel"),
                     ("Widen the timeline", f"one more day, up to {MAX_DAYS}", "action_wider"),
                     ("Narrow the timeline", f"one day less, down to {MIN_DAYS}", "action_narrower"))

    days = reactive(DEFAULT_DAYS, init=False)

    def __init__(self) -> None:
        super().__init__()
        self.tz = local_zone()

    def compose(self) -> ComposeResult:
        yield Static("", id="banner")
        yield Static("", id="timeline")
        yield DataTable(id="reservations", cursor_type="row")
        yield Static("", id="status")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.watch(self.app, "reservations_version", lambda _: self.redraw())
        self.watch(self.app, "nodes_version", lambda _: self.redraw_timeline())
        self.watch(self.app, "jobs_version", lambda _: self.redraw_timeline())
        self.watch(self.app, "connected", lambda _: self.call_after_refresh(self.redraw_timeline))  # after app.status
        self.set_interval(CLOCK_TICK_S, self.redraw)
        self.query_one(DataTable).focus()

    def on_resize(self) -> None:
        self.redraw_timeline()

    def watch_days(self) -> None:
        self.redraw_timeline()

    # -- drawing --------------------------------------------------------------------------------

    def redraw(self) -> None:
        self.redraw_timeline()
        self.redraw_list()

    def redraw_timeline(self) -> None:
        app = self.app
        mode = " | READ-ONLY" if app.readonly else ""
        banner = self.query_one("#banner", Static)
        banner.set_class(not app.connected, "down")
        banner.update(Text(f" reservations | the next {self.days} day{'s' * (self.days != 1)} (+/- to change){mode}"
                           if app.connected else f" {app.status or 'connecting to the leader...'}"))
        width = max(20, (self.size.width or app.size.width) - 2)
        drawn = draw_timeline(app.nodes, app.reservations, app.jobs.values(), app.clock(), self.days, width,
                              tz=self.tz)
        key_rows = (self.size.height or app.size.height) - len(drawn.lines) - 1 - ROWS_BESIDE_TIMELINE
        self.query_one("#timeline", Static).update(timeline_text(drawn, width, key_rows))

    def redraw_list(self) -> None:
        listing = self.query_one(DataTable)
        current = self.cursor_reservation()
        reservations = sorted(self.app.reservations, key=lambda r: (r["start"], r["name"]))
        lines = reservations_table(reservations, self.app.clock(), self.tz).splitlines()
        listing.clear(columns=True)
        listing.add_column(Text(lines[0], style="bold"), key="reservation")
        for r, line in zip(reservations, lines[1:]):
            listing.add_row(Text(line), key=r["name"])
        names = [r["name"] for r in reservations]
        if current in names:
            listing.move_cursor(row=names.index(current))

    def cursor_reservation(self) -> str | None:
        listing = self.query_one(DataTable)
        if not listing.row_count:
            return None
        return listing.coordinate_to_cell_key(listing.cursor_coordinate).row_key.value

    def show_status(self, text: str, error: bool = False) -> None:
        status = self.query_one("#status", Static)
        status.update(Text(escape_controls(text.splitlines()[0]) if text else ""))
        status.set_class(error, "error")

    # -- keys -----------------------------------------------------------------------------------

    def action_wider(self) -> None:
        self.days = min(MAX_DAYS, self.days + 1)

    def action_narrower(self) -> None:
        self.days = max(MIN_DAYS, self.days - 1)

    def action_book(self) -> None:
        self.app.push_screen(BookingForm(self.tz))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Read-only: cancelling is not offered (booking is: its form answers dry runs)."""
        return not (self.app.readonly and action == "cancel")

    def on_key(self, event: Key) -> None:
        if self.app.readonly and event.key == "c":  # not offered: say why nothing happens
            event.stop()
            event.prevent_default()
            self.show_status(READONLY, error=True)

    def action_cancel(self) -> None:
        if self.app.readonly:
            self.app.notify(READONLY, severity="warning")
            self.show_status(READONLY, error=True)
            return
        name = self.cursor_reservation()
        if name is None:
            self.show_status("no reservation to cancel", error=True)
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.show_status(f"cancelling {escape_controls(name)}...")
                self.cancel_reservation(name)

        self.app.push_screen(Confirm(f"Cancel reservation {name}? Its GPUs go back to everyone."), answer)

    @work(thread=True, group="reservation-cancel")
    def cancel_reservation(self, name: str) -> None:
        try:
            self.app.client_factory().cancel_reservation(name)
            self.app.post_message(ActionDone(f"cancelled reservation {name}"))
        except ApiError as err:
            self.app.post_message(ActionDone(f"cancel {name}: {err}", error=True))


def timeline_text(drawn: Timeline, width: int, key_rows: int) -> Text:
    """The timeline's lines (bars and job ends colored), its legend, then at most ``key_rows`` lines of its key.

    A key longer than that ends in a line saying how much more there is (fewer days make the bars longer).
    """
    text = Text("\n".join(drawn.lines))
    starts = [0]
    for line in drawn.lines:
        starts.append(starts[-1] + len(line) + 1)
    text.stylize("bold", 0, len(drawn.lines[0]))
    for row, first, end in drawn.bars:
        text.stylize("bold cyan", starts[row] + first, starts[row] + end)
    for row, column in drawn.job_ends:
        text.stylize("bold yellow", starts[row] + column, starts[row] + column + 1)
    if len(drawn.lines) == 1:
        text.append("\nno nodes yet")
    text.append("\n" + LEGEND[:width], style="dim")
    key, more = list(drawn.key), ""
    if len(key) > max(1, key_rows):
        shown = max(0, key_rows - 1)
        more = f"... {len(key) - shown} more lines of the key: - shows fewer days, with longer bars"[:width]
        key = key[:shown]
    for line in key:  # a bar's key in its color; a long entry's next lines begin with spaces
        text.append("\n")
        text.append(line[0], style="bold cyan" if line[0] != " " else "")
        text.append(line[1:])
    if more:
        text.append("\n" + more, style="dim")
    return text


def booking_body(values: Mapping[str, str], now: float, tz: tzinfo) -> dict | None:
    """The ``POST /v1/reservations`` body for the form's fields; None while a needed field is empty.

    ValueError says which field is wrong. Times are read as ``labq reserve`` reads them (``labq.when``).
    """
    gpus, start, duration = (values.get(key, "").strip() for key in ("gpus", "start", "duration"))
    if not (gpus and start and duration):
        return None
    if not gpus.isdigit() or int(gpus) < 1:
        raise ValueError("GPUs: a whole number, 1 or more")
    try:
        begin = parse_when(start, now, tz)
    except ValueError as err:
        raise ValueError(f"start: {err}") from None
    try:
        end = begin + parse_for(duration)
    except ValueError as err:
        raise ValueError(f"duration: {err}") from None
    users = [u.strip() for u in values.get("users", "").split(",") if u.strip()]
    return reserve_request(int(gpus), begin, end, name=values.get("name", "").strip() or None, users=users)


class BookingForm(ModalScreen[str | None]):
    """GPUs, start, duration, name, users: a dry run answers as the user types; Enter or Book books it.

    Dismissed with the name of the reservation it booked, or None.
    """

    DEFAULT_CSS = """
    BookingForm .booking {
        width: 76;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        border: thick $accent;
        background: $surface;
        padding: 0 1;
    }
    BookingForm .fields {
        grid-size: 2;
        grid-columns: 10 1fr;
        grid-rows: 1;
        grid-gutter: 0 1;
        height: auto;
        margin-top: 1;
    }
    BookingForm #answer-box {
        height: auto;
        max-height: 10;
        margin-top: 1;
    }
    BookingForm #booking-note {
        height: auto;
    }
    BookingForm .buttons {
        height: auto;
        align: right middle;
        margin-top: 1;
    }
    BookingForm .buttons Button {
        margin-left: 2;
    }
    """
    BINDINGS: ClassVar[list[Binding]] = [Binding("escape", "close", "close")]
    FIELDS = (("gpus", "GPUs", "1"), ("start", "start", "fri 09:00, in 2h, tomorrow 9am"),
              ("duration", "for", "48h, 90m, 2d"), ("name", "name", "optional: paper-deadline"),
              ("users", "users", "optional, who else may use it: alice,bob"))
    HINT = f"say how many GPUs, when and for how long; the leader answers as you type. Start: {EXAMPLES}"

    @dataclass
    class Answered(Message):
        """The leader's answer to a dry run (``real`` false) or to a booking."""

        seq: int
        real: bool
        answer: dict | None
        error: str = ""

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, BookingForm.Answered) and not (self.real or message.real)

    def __init__(self, tz: tzinfo | None = None, values: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.tz = tz or local_zone()
        self.values = dict(values or {"gpus": "1"})
        self._seq = 0  #: the latest question; older answers are dropped
        self._timer: Timer | None = None
        self.booked: str | None = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="booking"):
            title = "book GPUs (Enter books, Esc closes)"
            yield Label(title + (" | READ-ONLY: dry runs only" if self.app.readonly else ""), classes="question")
            with Grid(classes="fields"):
                for key, label, hint in self.FIELDS:
                    yield Label(label)
                    yield Input(self.values.get(key, ""), placeholder=hint, id=f"b-{key}", compact=True)
            with VerticalScroll(id="answer-box"):
                yield Static(Text(self.HINT, style="dim"), id="answer")
            yield Static("", id="booking-note")
            with Horizontal(classes="buttons"):
                yield Button("Book", variant="primary", id="book", compact=True)
                yield Button("Close", id="close", compact=True)

    def on_mount(self) -> None:
        first = self.query_one(f"#b-{self.FIELDS[0][0]}", Input)  # the GPU count: typing a number lands there
        first.focus()
        first.select_all()  # and replaces the default

    def fields(self) -> dict[str, str]:
        return {key: self.query_one(f"#b-{key}", Input).value for key, _, _ in self.FIELDS}

    def show_answer(self, text: str, style: str = "") -> None:
        """``text``'s line breaks are the caller's: one from a user comes escaped (``escape_controls``)."""
        self.query_one("#answer", Static).update(Text(escape_controls(text, keep="\n"), style=style))

    def note(self, text: str, style: str = "") -> None:
        self.query_one("#booking-note", Static).update(Text(escape_controls(text), style=style))

    # -- asking as the user types ---------------------------------------------------------------

    @on(Input.Changed)
    def typed(self) -> None:
        if self.booked:
            self.booked = None
            self.query_one("#book", Button).label = "Book"
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_timer(DEBOUNCE_S, self.ask)

    def ask(self) -> None:
        """Check the fields here, then ask the leader for a dry run."""
        self._timer = None
        try:
            body = booking_body(self.fields(), self.app.clock(), self.tz)
        except ValueError as err:
            self._seq += 1  # an answer on its way is for other fields
            self.show_answer(escape_controls(err), "red")
            return
        if body is None:
            self._seq += 1
            self.show_answer(self.HINT, "dim")
            return
        self._seq += 1
        self.note("asking the leader...", "dim")
        self.dry_run({**body, "dry_run": True}, self._seq)

    @work(thread=True, exclusive=True, group="booking-dry-run")
    def dry_run(self, body: dict, seq: int) -> None:
        self.post_message(self._answer(body, seq, real=False))

    @work(thread=True, exclusive=True, group="booking")
    def book_for_real(self, body: dict, seq: int) -> None:
        self.post_message(self._answer(body, seq, real=True))

    def _answer(self, body: dict, seq: int, real: bool) -> BookingForm.Answered:
        try:
            return self.Answered(seq, real, self.app.client_factory().reserve(body))
        except ApiError as err:
            return self.Answered(seq, real, None, str(err))

    @on(Answered)
    def answered(self, message: Answered) -> None:
        if not message.real and message.seq != self._seq:
            return  # the fields changed since
        self.note("")
        if message.answer is None:
            self.show_answer(f"the leader says: {escape_controls(message.error)}", "red")
            return
        answer = message.answer
        text = answer_text(answer, self.app.clock(), self.tz)
        if not answer["accepted"]:
            self.show_answer(text, "yellow")
        elif answer["booked"]:
            self.booked = answer["reservation"]["name"]
            self.show_answer(text, "bold green")
            self.query_one("#book", Button).label = "Done"
            self.app.notify(text.splitlines()[0], markup=False)
        else:
            self.show_answer(text, "green")

    # -- booking --------------------------------------------------------------------------------

    @on(Input.Submitted)
    @on(Button.Pressed, "#book")
    def book(self) -> None:
        if self.booked:
            self.dismiss(self.booked)
            return
        if self.app.readonly:
            self.app.notify(READONLY, severity="warning")
            self.note(READONLY + "; the answer above is a dry run", "red")
            return
        try:
            body = booking_body(self.fields(), self.app.clock(), self.tz)
        except ValueError as err:
            self.show_answer(escape_controls(err), "red")
            return
        if body is None:
            self.note("say how many GPUs, the start and how long first", "red")
            return
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self._seq += 1
        self.note("booking...", "dim")
        self.book_for_real(body, self._seq)

    @on(Button.Pressed, "#close")
    def action_close(self) -> None:
        self.dismiss(self.booked)
