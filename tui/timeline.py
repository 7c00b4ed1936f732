"""The reservations screen's timeline as text: the coming days per node, bookings as bars, job ends as marks.

Pure: nodes, reservations and jobs are the API's dicts; the clock (``now``) and the time zone come in
as arguments, so a test pins both. The window is ``[now, now + days)`` spread over the columns right
of the node names; a column is ``days * 86400 / columns`` seconds.

    UTC  now 09:00      |Sat 21                 |Sun 22                 |Mon 23
    ws1  ....*..........|..............[paper=============].............|........
    ws2  <night=====]...|.......................|.......................|........

``[name===]`` is a reservation; ``<`` and ``>`` say it began before the window or goes on after it;
``*`` is where a running job's time limit ends; ``|`` is midnight in the user's zone. Node and
reservation names are drawn escaped (``escape_controls``): one character a cell, none a control.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, time, timedelta, tzinfo

from labq.terminal_text import escape_controls

DAY_S = 86400.0
FREE, MIDNIGHT, FILL, JOB_END = ".", "|", "=", "*"
LABEL_MIN, LABEL_MAX = 4, 12  #: the node-name column's width, in characters
RUNNING = frozenset({"starting", "running", "preempting"})
_DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")

LEGEND = "[name] reservation  < > goes on past the edge  * job time limit  | midnight"


def timeline_lines(nodes: Sequence[Mapping], reservations: Iterable[Mapping], jobs: Iterable[Mapping], now: float,
                   days: float, width: int, tz: tzinfo | None = None) -> list[str]:
    """A header with the day boundaries, then one line per node, each exactly ``width`` characters.

    ``tz`` (default UTC) places the midnights. Nodes come in the order given; a reservation pinned to
    a node that is not among them (it went away) gets a line of its own after them, so no booking is
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
    for name in names:
        cells = [FREE] * columns
        for _, c in midnights:
            cells[c] = MIDNIGHT
        for r in sorted((r for r in reservations if r.get("node") == name), key=lambda r: r["start"]):
            _bar(cells, escape_controls(r["name"]), column(r["start"]), column(r["end"]))
        for end in _job_ends(jobs, name):
            c = math.floor(column(end))
            if 0 <= c < columns and cells[c] in (FREE, MIDNIGHT, FILL):
                cells[c] = JOB_END
        lines.append(_fit(escape_controls(name), label) + " " + "".join(cells))
    return [line[:width] for line in lines]


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


def _bar(cells: list[str], name: str, start: float, end: float) -> None:
    """``[name===]`` over the columns the window ``[start, end)`` touches; ``<``/``>`` where it is clipped."""
    columns = len(cells)
    if end <= 0 or start >= columns:
        return
    first, last = max(0, math.floor(start)), min(columns - 1, math.ceil(end) - 1)
    last = max(first, last)
    clipped_left, clipped_right = start < 0, end > columns + 1e-9
    if first == last and not (clipped_left or clipped_right):
        cells[first] = "#"
        return
    cells[first:last + 1] = FILL * (last - first + 1)
    cells[first] = "<" if clipped_left else "["
    if last > first or clipped_right:
        cells[last] = ">" if clipped_right else "]"
    inside = name[:max(0, last - first - 1)]
    cells[first + 1:first + 1 + len(inside)] = inside


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
