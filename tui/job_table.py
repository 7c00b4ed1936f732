"""The queue table: renders only the lines on screen, so 10,000 jobs scroll, sort and filter at once.

The rows live in a dict by job id; the view is a list of ids (filtered, sorted). A change to one
job replaces its row and, when it could move it, recomputes the view: a list comprehension and a
sort over plain tuples, a few milliseconds for 10,000 rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from labq.render.jobs import index_ranges
from labq.tui.query import COLUMNS, REASON, TIME, Row, fold, parse_filter, view

WIDTHS = (6, 9, 18, 10, 7, 4, 12, 7, 70)  #: the widths from 140 columns up
NARROW = (5, 6, 10, 10, 6, 4, 8, 7)  #: the least the columns before the reason shrink to
MIN_REASON = 16


def widths_for(columns: int) -> tuple[int, ...]:
    """The column widths for a table ``columns`` wide: the reason takes what is left, after the name,
    the user and the placement have given up room (down to ``NARROW``), so that it shows at 80 columns."""
    fixed = list(WIDTHS[:-1])
    room = columns - (len(WIDTHS) - 1) - sum(fixed)  # what the reason would get, a space between columns
    for i in (2, 1, 6, 0, 4):  # name, user, node:gpus, id, class: the first to give
        if room >= MIN_REASON:
            break
        give = min(fixed[i] - NARROW[i], MIN_REASON - room)
        fixed[i] -= give
        room += give
    return (*fixed, max(MIN_REASON, min(WIDTHS[-1], room)))
STATE_STYLES = {"running": Style(color="green"), "starting": Style(color="green"), "queued": Style(color="yellow"),
                "held": Style(color="magenta"), "preempting": Style(color="magenta", bold=True),
                "succeeded": Style(color="green", dim=True), "failed": Style(color="red"),
                "cancelled": Style(dim=True), "timeout": Style(color="red", dim=True)}
HEADER = Style(bold=True, reverse=True)
CURSOR = Style(reverse=True)
TAGGED = Style(bold=True, color="cyan")


class JobTable(ScrollView, can_focus=True):
    BINDINGS = [
        Binding("up,k", "move(-1)", "up", show=False), Binding("down,j", "move(1)", "down", show=False),
        Binding("pageup", "move(-20)", show=False), Binding("pagedown", "move(20)", show=False),
        Binding("home,g", "move(-1000000)", show=False), Binding("end,G", "move(1000000)", show=False),
        Binding("space", "tag", "tag"),
        Binding("x", "expand", "expand array", show=False),
    ]

    class CursorMoved(Message):
        def __init__(self, job_id: int | None) -> None:
            super().__init__()
            self.job_id = job_id

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, JobTable.CursorMoved)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rows: dict[int, Row] = {}
        self.shown: list[int] = []
        #: rows that stand for several waiting tasks of an array (``fold``): the first task's id -> all of them
        self.folded: dict[int, list[int]] = {}
        self.expanded: set[int] = set()  #: arrays shown task by task (``x``)
        self.tagged: set[int] = set()
        self.cursor = 0
        self.filter_text = ""
        self._predicate = parse_filter("")
        self.sort_column, self.sort_reverse = 0, False
        self.widths = WIDTHS
        self.clock: Callable[[], float] = time.time  #: the times shown are read from it as lines are drawn

    # -- the model ---------------------------------------------------------------------

    def set_rows(self, rows: Mapping[int, Row]) -> None:
        self.rows = dict(rows)
        self._untag_gone()
        self._refilter()

    def put_rows(self, rows: list[Row]) -> None:
        for row in rows:
            self.rows[row.job_id] = row
        self._untag_gone()
        self._refilter()

    def drop_rows(self, ids: Iterable[int]) -> None:
        for job_id in ids:
            self.rows.pop(job_id, None)
        self._untag_gone()
        self._refilter()

    def _untag_gone(self) -> None:
        """A tag never names a job that left the table or ended: no action can reach it any more."""
        self.tagged = {i for i in self.tagged if i in self.rows and not self.rows[i].finished}

    def clear_tags(self) -> None:
        if self.tagged:
            self.tagged = set()
            self.refresh()
            self.post_message(self.CursorMoved(self.cursor_job()))

    def tick(self) -> None:
        """The clock moved: redraw the times on screen (and re-sort, when sorted by time)."""
        if self.sort_column == TIME:
            self._refilter()
        else:
            self.refresh()

    def set_filter(self, text: str) -> None:
        """Raises ValueError for an unknown ``field:``; the view stays as it was."""
        self._predicate = parse_filter(text)
        self.filter_text = text
        self._refilter()

    def sort_by(self, column: int, reverse: bool) -> None:
        self.sort_column, self.sort_reverse = column, reverse
        self._refilter()

    def cursor_job(self) -> int | None:
        return self.shown[self.cursor] if self.shown else None

    def selected(self) -> list[int]:
        """The tagged jobs, or else the one under the cursor (every task a folded row stands for)."""
        if self.tagged:
            return sorted(self.tagged)
        job = self.cursor_job()
        return list(self.folded.get(job, [job])) if job is not None else []

    def _refilter(self) -> None:
        current = self.cursor_job()
        self.shown, self.folded = fold(view(self.rows, self._predicate, self.sort_column, self.sort_reverse,
                                            self.clock()), self.rows, self.expanded)
        if current is not None and current in self.rows:
            try:
                self.cursor = self.shown.index(current)
            except ValueError:
                self.cursor = min(self.cursor, max(0, len(self.shown) - 1))
        else:
            self.cursor = min(self.cursor, max(0, len(self.shown) - 1))
        self.virtual_size = Size(sum(self.widths) + len(self.widths) - 1, len(self.shown) + 1)
        self.refresh()
        self.post_message(self.CursorMoved(self.cursor_job()))

    def on_resize(self) -> None:
        widths = widths_for(self.size.width)
        if widths != self.widths:
            self.widths = widths
            self.virtual_size = Size(sum(widths) + len(widths) - 1, len(self.shown) + 1)
            self.refresh()

    # -- keys ---------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Tags pick the jobs an action acts on: a read-only TUI has none to offer."""
        return not (action == "tag" and getattr(self.app, "readonly", False))

    def action_move(self, delta: int) -> None:
        if not self.shown:
            return
        self.cursor = max(0, min(len(self.shown) - 1, self.cursor + delta))
        top = self.scroll_offset.y
        height = max(1, self.size.height - 1)
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + height:
            self.scroll_to(y=self.cursor - height + 1, animate=False)
        self.refresh()
        self.post_message(self.CursorMoved(self.cursor_job()))

    def action_tag(self) -> None:
        job = self.cursor_job()
        if job is None:
            return
        members = set(self.folded.get(job, [job]))
        self.tagged = self.tagged - members if job in self.tagged else self.tagged | members
        self.action_move(1)

    def action_expand(self) -> None:
        """Show the array under the cursor task by task, or fold its waiting tasks again."""
        job = self.cursor_job()
        row = self.rows.get(job) if job is not None else None
        if row is None or row.array is None:
            return
        self.expanded ^= {row.array[0]}
        self._refilter()

    # -- drawing ------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        if y == 0:
            arrow = "v" if self.sort_reverse else "^"
            names = [f"{c}{arrow if i == self.sort_column else ''}" for i, c in enumerate(COLUMNS)]
            header = Strip([Segment(_line(names, self.widths), HEADER)])
            return header.crop(scroll_x, scroll_x + width).extend_cell_length(width, HEADER)
        index = scroll_y + y - 1
        if index >= len(self.shown):
            return Strip.blank(width)
        job_id = self.shown[index]
        row = self.rows[job_id]
        cells = list(row.cells_at(self.clock()))
        members = self.folded.get(job_id)
        if members is not None:  # a folded row: 12.*, and which tasks it stands for (the ID column is narrow)
            cells[0] = f"{row.array[0]}.*"
            indices = index_ranges([self.rows[i].array[1] for i in members])
            cells[REASON] = f"({len(members)} tasks: {indices}; x shows each) {cells[REASON]}"
        if job_id in self.tagged:
            cells[0] = "*" + cells[0]
        base = CURSOR if index == self.cursor else Style()
        segments = []
        for i, (text, w) in enumerate(zip(cells, self.widths)):
            style = base
            if i == 3:
                style = base + STATE_STYLES.get(text, Style())
            elif job_id in self.tagged:
                style = base + TAGGED
            segments.append(Segment(_cell(text, w) + " ", style))
        return Strip(segments).crop(scroll_x, scroll_x + width).extend_cell_length(width, base)


def _cell(text: str, width: int) -> str:
    return text[: width - 1] + "…" if len(text) > width else text.ljust(width)


def _line(cells: list[str], widths: tuple[int, ...]) -> str:
    return " ".join(_cell(c, w) for c, w in zip(cells, widths))
