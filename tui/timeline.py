"""The reservations screen's timeline as text: the coming days per node, bookings as bars, job ends as marks.

Pure: nodes, reservations and jobs are the API's dicts; the clock (``now``) and the time zone come in
as arguments, so a test pins both. The window is ``[now, now + days)`` spread over the columns right
of the node names; a column is ``days * 86400 / columns`` seconds.

    UTC  now 09:00      |Sat 21                 |Sun 22                 |Mon 23
    ws1  ...*.[roo]..[a===][after==]...[1:ber]..|.......................|.........
         ......[in===]..|....[paper==================]..................|.........
    ws2  <nightly=][2:e]|.......................|.......................|.........

    1  bert-sweep  ws1:0,1  Sat 21 15:00–21:00
    2  eval-run  ws2:0  Fri 20 19:30–23:00

``[name===]`` is a reservation; ``<`` and ``>`` say it began before the window or goes on after it;
``*`` is where a running job's time limit ends; ``|`` is midnight in the user's zone. Node and
reservation names are drawn escaped (``escape_controls``): one character a cell, none a control.

**Lanes.** Bookings on one node whose times overlap (each pins its own GPUs of the node, so both are
valid) never share a line: they go to lanes, extra lines under the node's line, packed first-fit in
start order, so there are no more lanes than bars sharing one column. A node with no overlaps keeps
one line. Lanes by overlap rather than a line per GPU:
a booking usually pins several GPUs and would be drawn once per GPU, and an 8-GPU node would take
eight lines when nothing overlaps at all; which GPUs a booking holds is in the list below the
timeline and in the key.

**Back to back.** A booking that starts in the column where the one before it in its lane ends
takes that column (its ``[``) and the earlier bar ends a column early, so both ends show:
``[a===][b===]``. When that would leave the earlier bar no column, the later one goes to another lane.

**Short bars.** A bar too short for its name shows a key and as much of the name as fits,
``[1:pap]``, or the key alone (``[1]``, ``1]``, ``1`` for a bar of a column). A colon is never in a
name, so ``1:`` reads as a key. ``Timeline.key`` names each keyed booking in full, with its GPUs and
times: ``1  paper-deadline  ws1:0,1  Sat 21 09:00–Sun 22 17:00``. Keys run ``1``-``9``, ``a``-``z``,
``A``-``Z``; past those, bars share the key ``+`` (the key still lists every one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, time, timedelta, tzinfo

from labq.terminal_text import escape_controls

DAY_S = 86400.0
FREE, MIDNIGHT, FILL, JOB_END = ".", "|", "=", "*"
LABEL_MIN, LABEL_MAX = 4, 12  #: the node-name column's width, in characters
RUNNING = frozenset({"starting", "running", "preempting"})
KEYS = "123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"  #: for bars too short for their names
MORE_KEYS = "+"  #: the key of every short bar past the last of ``KEYS``
KEY_GAP = "  "  #: between a key line's fields
_DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")

LEGEND = "[name] reservation  < > goes on past the edge  * job time limit  | midnight"


@dataclass(frozen=True)
class Bar:
    """Where one reservation is drawn: columns ``first`` to ``last`` (both in) of its lane."""

    reservation: Mapping
    first: int
    last: int
    clipped_left: bool = False  #: it began before the window
    clipped_right: bool = False  #: it goes on after the window

    @property
    def room(self) -> int:
        """The cells between the bar's two ends, for its name."""
        return self.last - self.first - 1


@dataclass(frozen=True)
class Timeline:
    """The timeline drawn: what the screen shows, and where to color it."""

    lines: tuple[str, ...]  #: the header, then a line per lane of each node: each exactly ``width`` characters
    key: tuple[str, ...]  #: the keyed bookings in full, a line each (a long one wraps): each ``width`` characters
    bars: tuple[tuple[int, int, int], ...]  #: (line, first, end) of each bar: ``lines[line][first:end]``
    job_ends: tuple[tuple[int, int], ...]  #: (line, column) of each ``*`` in ``lines``


def timeline_lines(nodes: Sequence[Mapping], reservations: Iterable[Mapping], jobs: Iterable[Mapping], now: float,
                   days: float, width: int, tz: tzinfo | None = None) -> list[str]:
    """``draw_timeline``'s lines: the header, then a line per lane of each node."""
    return list(draw_timeline(nodes, reservations, jobs, now, days, width, tz).lines)


def draw_timeline(nodes: Sequence[Mapping], reservations: Iterable[Mapping], jobs: Iterable[Mapping], now: float,
                  days: float, width: int, tz: tzinfo | None = None) -> Timeline:
    """A header with the day boundaries, then a line per lane of each node, and the key of the short bars.

    ``tz`` (default UTC) places the midnights. Nodes come in the order given; a reservation pinned to
    a node that is not among them (it went away) gets lines of its own after them, so no booking is
    hidden. Reservations outside the window are left out; one that crosses an edge is clipped there.
    """
    zone = tz or UTC
    reservations, jobs = list(reservations), list(jobs)
    names = [n["name"] for n in nodes]
    names += sorted({r["node"] for r in reservations if r.get("node")} - set(names))
    label = min(LABEL_MAX, max([LABEL_MIN, *(len(escape_controls(n)) for n in names)]))
    columns = max(1, width - label - 1)
    span = max(days, 1e-9) * DAY_S

    def column(t: float) -> float:
        return (t - now) / span * columns

    midnights = [(t, math.floor(column(t))) for t in _midnights(now, now + span, zone)]
    lines = [_fit(datetime.fromtimestamp(now, zone).tzname() or "", label) + " "
             + _header(midnights, columns, now, zone)]
    keyed: list[tuple[str, Mapping]] = []
    bars, job_ends = [], []
    for name in names:
        on_node = sorted((r for r in reservations if r.get("node") == name), key=lambda r: (r["start"], r["end"]))
        lanes = pack_lanes([b for r in on_node if (b := _place(r, column(r["start"]), column(r["end"]), columns))])
        rows = [_lane_cells(columns, midnights) for _ in lanes or [()]]
        for bar, row in sorted(((bar, row) for row, lane in enumerate(lanes) for bar in lane),
                               key=lambda placed: (placed[0].first, placed[1])):  # keys left to right
            _draw_bar(rows[row], bar, _bar_text(bar, keyed))
            bars.append((len(lines) + row, label + 1 + bar.first, label + 2 + bar.last))
        for end in _job_ends(jobs, name):
            if (row := _mark_job_end(rows, math.floor(column(end)))) is not None:
                job_ends.append((len(lines) + row, label + 1 + math.floor(column(end))))
        titles = [escape_controls(name)] + [""] * (len(rows) - 1)
        lines += [_fit(title, label) + " " + "".join(cells) for title, cells in zip(titles, rows)]
    key = [line for k, r in keyed for line in _wrap(_key_text(k, r, zone), width, len(k) + len(KEY_GAP))]
    return Timeline(tuple(line[:width] for line in lines), tuple(key),
                    tuple(b for b in bars if b[1] < width), tuple(e for e in job_ends if e[1] < width))


def pack_lanes(bars: Sequence[Bar]) -> list[list[Bar]]:
    """``bars`` (in start order) in as few lanes as keep each bar whole: first fit, each lane in start order.

    A bar goes after a lane's last bar when it begins in a later column; or in the same column when the
    two only touch in time (the one ends as the other begins) and the earlier bar can give up its
    last column, so both their ends show.
    """
    lanes: list[list[Bar]] = []
    for bar in bars:
        for lane in lanes:
            before = lane[-1]
            if before.last < bar.first:
                lane.append(bar)
                break
            touching = before.reservation["end"] <= bar.reservation["start"]
            if touching and before.last == bar.first and before.last > before.first:
                lane[-1] = replace(before, last=before.last - 1)
                lane.append(bar)
                break
        else:
            lanes.append([bar])
    return lanes


def _place(reservation: Mapping, start: float, end: float, columns: int) -> Bar | None:
    """The bar over the columns the window ``[start, end)`` (in columns) touches, or None outside the window."""
    if end <= 0 or start >= columns:
        return None
    first, last = max(0, math.floor(start)), min(columns - 1, math.ceil(end) - 1)
    return Bar(reservation, first, max(first, last), start < 0, end > columns + 1e-9)


def _bar_text(bar: Bar, keyed: list[tuple[str, Mapping]]) -> str:
    """What the bar says: the whole name where it fits; else a new key (added to ``keyed``) and what fits."""
    name = escape_controls(bar.reservation["name"])
    if len(name) <= bar.room:
        return name
    key = KEYS[len(keyed)] if len(keyed) < len(KEYS) else MORE_KEYS
    keyed.append((key, bar.reservation))
    if bar.room >= len(key) + 2:
        return f"{key}:{name[:bar.room - len(key) - 1]}"
    return key


def _draw_bar(cells: list[str], bar: Bar, text: str) -> None:
    """``[text===]`` over the bar's columns; ``<``/``>`` where it is clipped; a text with no room between
    the ends (a bar of one or two columns) takes the first column."""
    first, last = bar.first, bar.last
    cells[first:last + 1] = FILL * (last - first + 1)
    cells[first] = "<" if bar.clipped_left else "["
    if last > first:
        cells[last] = ">" if bar.clipped_right else "]"
    if len(text) > bar.room:
        shown = text[:last - first + 1]
        cells[first:first + len(shown)] = shown
    else:
        cells[first + 1:first + 1 + len(text)] = text


def _lane_cells(columns: int, midnights: list[tuple[float, int]]) -> list[str]:
    cells = [FREE] * columns
    for _, c in midnights:
        cells[c] = MIDNIGHT
    return cells


def _mark_job_end(rows: list[list[str]], column: int) -> int | None:
    """``*`` at ``column`` in the first lane with a free, midnight or fill cell there; which lane, or None."""
    for i, cells in enumerate(rows):
        if 0 <= column < len(cells) and cells[column] in (FREE, MIDNIGHT, FILL):
            cells[column] = JOB_END
            return i
    return None


def _key_text(key: str, reservation: Mapping, zone: tzinfo) -> str:
    """``1  paper-deadline  ws1:0,1  Sat 21 09:00–Sun 22 17:00``."""
    gpus = ",".join(str(i) for i in reservation.get("gpu_indices") or ()) or "-"
    where = f"{escape_controls(reservation.get('node') or '-')}:{gpus}"
    start, end = (datetime.fromtimestamp(reservation[k], zone) for k in ("start", "end"))
    until = f"{end:%H:%M}" if end.date() == start.date() else _day_and_time(end)
    return KEY_GAP.join((key, escape_controls(reservation["name"]), where, f"{_day_and_time(start)}–{until}"))


def _day_and_time(t: datetime) -> str:
    return f"{_DAY_NAMES[t.weekday()]} {t.day} {t:%H:%M}"


def _wrap(text: str, width: int, indent: int) -> list[str]:
    """``text`` in lines of exactly ``width`` characters, the ones after the first indented by ``indent``."""
    width = max(1, width)
    indent = indent if indent < width else 0
    lines, rest = [text[:width]], text[width:]
    while rest:
        lines.append(" " * indent + rest[:width - indent])
        rest = rest[width - indent:]
    return [line.ljust(width) for line in lines]


def _fit(text: str, width: int) -> str:
    return text[:width].ljust(width)


def _midnights(start: float, end: float, zone: tzinfo) -> list[float]:
    """The instants of midnight in ``zone`` strictly after ``start`` and before ``end`` (calendar days, DST-safe)."""
    day = datetime.fromtimestamp(start, zone).date()
    out = []
    while True:
        day += timedelta(days=1)
        t = datetime.combine(day, time(0), tzinfo=zone).timestamp()
        if t >= end:
            return out
        if t > start:
            out.append(t)


def _header(midnights: list[tuple[float, int]], columns: int, now: float, zone: tzinfo) -> str:
    """``now 09:00   |Sun 22   |Mon 23``: each day's name after its boundary, as much of it as fits."""
    cells = [" "] * columns
    first = midnights[0][1] if midnights else columns
    _write(cells, 0, first, ("now " + datetime.fromtimestamp(now, zone).strftime("%H:%M"), "now"))
    for k, (t, c) in enumerate(midnights):
        cells[c] = MIDNIGHT
        day = datetime.fromtimestamp(t, zone)
        until = midnights[k + 1][1] if k + 1 < len(midnights) else columns
        _write(cells, c + 1, until, (f"{_DAY_NAMES[day.weekday()]} {day.day}", _DAY_NAMES[day.weekday()],
                                     str(day.day)))
    return "".join(cells)


def _write(cells: list[str], start: int, end: int, candidates: tuple[str, ...]) -> None:
    """The first candidate that fits in ``cells[start:end]``, or nothing."""
    for text in candidates:
        if len(text) <= end - start:
            cells[start:start + len(text)] = text
            return


def _job_ends(jobs: list[Mapping], node: str) -> list[float]:
    """When the running jobs on ``node`` reach their time limits (started_at + time_limit_s)."""
    ends = []
    for job in jobs:
        limit, started = job.get("spec", {}).get("time_limit_s"), job.get("started_at")
        if job.get("state") not in RUNNING or not limit or not started:
            continue
        if any(a.get("node") == node for a in (job.get("placement") or {}).get("allocations") or ()):
            ends.append(started + limit)
    return ends
