"""The queue table's rows, filter and sort, as pure functions of the jobs the leader sent.

A filter is words: ``user:alice``, ``state:running``, ``node:ws1``, ``class:high`` or free text
(matched against the whole row); a word with a leading ``!`` must not match. All words must hold.

A row's texts are escaped (``escape_controls``): a name with a newline or an escape sequence shows
as ``\\n`` or ``\\x1b`` on its one line, and a filter matches what is shown.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from labq.models.priority import priority_name
from labq.render.jobs import fold_alike, job_note, job_ref, placement_text, wait_alike
from labq.render.tables import format_duration
from labq.terminal_text import escape_controls

COLUMNS = ("ID", "USER", "NAME", "STATE", "CLASS", "GPUS", "NODE:GPUS", "TIME", "REASON / EST. START")
#: the letter that sorts by each column, after ``o``
SORT_KEYS = {"i": 0, "u": 1, "n": 2, "s": 3, "c": 4, "g": 5, "p": 6, "t": 7, "r": 8}
#: the capital letter that sorts by each column at once, pressed again reverses (k9s); G, P and R are keys already
SORT_LETTERS = {"I": 0, "U": 1, "N": 2, "S": 3, "C": 4, "D": 5, "O": 6, "T": 7, "W": 8}
TIME, REASON = 7, 8  #: the columns that change as the clock moves
FINISHED = frozenset({"succeeded", "failed", "cancelled", "timeout"})
FIELDS = ("user", "state", "node", "class", "name", "id")


@dataclass(frozen=True)
class Row:
    """One job as the table shows it; ``cells`` are the texts, ``key`` the values sorting uses."""

    job_id: int
    cells: tuple[str, ...]
    keys: tuple
    user: str
    state: str
    nodes: tuple[str, ...]
    klass: str
    text: str  #: lower-cased cells, for free-text search
    since: float = 0.0  #: TIME counts from here...
    until: float | None = None  #: ...to here; None: to now (the job has not ended)
    estimated_start: float | None = None  #: a waiting job's estimate, counted down in its reason
    why: str = ""  #: the reason without the estimate
    array: tuple[int, int] | None = None  #: an array's task: (the array's id, its index)

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def seconds_at(self, now: float) -> float:
        return (self.until if self.until is not None else now) - self.since

    def cells_at(self, now: float) -> tuple[str, ...]:
        """The cells as they read at ``now``: the time (and a waiting job's estimate) move with the clock."""
        if self.until is not None and self.estimated_start is None:
            return self.cells
        cells = list(self.cells)
        cells[TIME] = format_duration(self.seconds_at(now))
        if self.estimated_start is not None:
            cells[REASON] = f"est. {format_duration(max(0, self.estimated_start - now))}  {self.why}"
        return tuple(cells)


def make_row(job: Mapping, pending: Mapping | None, now: float) -> Row:
    spec = job["spec"]
    started, state = job.get("started_at"), job["state"]
    since = started if started and state not in ("queued", "held") else job["submitted_at"]
    until = (job.get("ended_at") or now) if state in FINISHED else None
    seconds = (until or now) - since
    reason = why = job_note(job)
    estimate = None
    if pending:
        reason = why = f"{pending['reason']}: {pending['detail']}"
        if pending.get("estimated_start"):
            estimate = pending["estimated_start"]
            reason = f"est. {format_duration(max(0, estimate - now))}  " + reason
    name = spec.get("name") or " ".join(spec.get("command") or [])
    klass = priority_name(spec.get("priority", 200))
    where = placement_text(job)
    cells = tuple(escape_controls(c) for c in (job_ref(job), spec.get("user", ""), name, state, klass,
                                                spec.get("gpus", 1), where, format_duration(seconds), reason))
    nodes = tuple(escape_controls(a["node"]) for a in (job.get("placement") or {}).get("allocations") or ())
    keys = (job["id"], spec.get("user", ""), name.lower(), state, -spec.get("priority", 200), spec.get("gpus", 1),
            where, seconds, reason)
    array = spec.get("array")
    return Row(job["id"], cells, keys, cells[1], cells[3], nodes, klass, " ".join(cells).lower(), since, until,
               estimate, escape_controls(why), (array["id"], array["index"]) if array else None)


def fold(ids: list[int], rows: Mapping[int, Row], expanded: set[int]) -> tuple[list[int], dict[int, list[int]]]:
    """``ids`` with the waiting tasks of an array that wait alike (one state, one reason) standing as one row, at
    the first of them, unless their array is ``expanded``: the ids to show, and for each row that stands for
    several, the tasks it stands for (itself first)."""
    def alike(job_id: int) -> tuple | None:
        row = rows[job_id]
        if row.array is None or row.array[0] in expanded:
            return None
        return wait_alike({"id": row.array[0]}, row.state, row.why)

    shown, folded = fold_alike(ids, alike)
    return shown, {members[0]: members for members in folded}


def parse_filter(text: str) -> Callable[[Row], bool]:
    """A predicate for ``text``; raises ValueError naming an unknown field."""
    tests: list[Callable[[Row], bool]] = []
    for word in text.split():
        negate = word.startswith("!")
        word = word[1:] if negate else word
        if not word:
            continue
        test = _word(word.lower())
        tests.append((lambda row, t=test: not t(row)) if negate else test)
    return lambda row: all(t(row) for t in tests)


def _word(word: str) -> Callable[[Row], bool]:
    field, colon, value = word.partition(":")
    if not colon:
        return lambda row: word in row.text
    if field not in FIELDS:
        raise ValueError(f"unknown filter {field}:, use {', '.join(f + ':' for f in FIELDS)} or free text")
    if field == "user":
        return lambda row: row.user.lower() == value
    if field == "state":
        return lambda row: row.state.startswith(value)
    if field == "node":
        return lambda row: any(n.lower() == value for n in row.nodes)
    if field == "class":
        return lambda row: row.klass == value
    if field == "id":
        return lambda row: str(row.job_id) == value
    return lambda row: value in row.cells[2].lower()


def view(rows: Mapping[int, Row], predicate: Callable[[Row], bool], column: int, reverse: bool,
         now: float | None = None) -> list[int]:
    """The ids to show, filtered and sorted (ties by id); by time as the jobs' times read at ``now``, if given."""
    shown = [r for r in rows.values() if predicate(r)]
    shown.sort(key=lambda r: r.job_id)
    if column == TIME and now is not None:
        shown.sort(key=lambda r: r.seconds_at(now), reverse=reverse)
    else:
        shown.sort(key=lambda r: r.keys[column], reverse=reverse)
    return [r.job_id for r in shown]
