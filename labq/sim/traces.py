"""Job traces into a :class:`Workload`: the Philly trace, a generic CSV, and JSON lines.

Parsing is pure (lines in, workload out); :func:`load_trace` is the one function that reads a file.
A bad row stops the load with a :class:`TraceError` naming the file, the line and what is wrong, so
a typo never silently shrinks a replay. Rows left out on purpose (a time window, one virtual cluster,
Philly's GPU-less rows) are counted in the notes that come back with the workload.

Times in a trace are Unix seconds or ISO 8601 (UTC unless an offset is given); in the workload they
are seconds since its ``epoch``, so the first job is submitted at or after virtual time 0.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from operator import itemgetter
from pathlib import Path

from labq.models.priority import PriorityClass, parse_priority, priority_name
from labq.sim.model import TraceJob, TraceReservation, Workload

FORMATS = ("philly", "csv", "jsonl")
PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
GPUS_PER_PHILLY_NODE = 8
#: Virtual-cluster sizes in nodes of 8 GPUs, as the Helios (SC'21) artifact replays the Philly trace.
PHILLY_VC_NODES: dict[str, int] = {
    "6214e9": 64, "7f04ca": 32, "11cb48": 16, "b436b2": 64, "ee9e8c": 64, "e13805": 16,
    "6c71a0": 32, "2869ce": 16, "ed69ec": 8, "103959": 8, "0e4a51": 32,
}

JOB_KEYS = ("submit", "duration", "gpus", "user", "class", "preemptible", "time_limit", "vc", "reservation")
_REQUIRED_JOB_KEYS = ("submit", "duration", "gpus")
_NORMAL = int(PriorityClass.NORMAL)
_TRUE = frozenset({"true", "1", "yes", "y"})
_FALSE = frozenset({"false", "0", "no", "n"})
_WHEN_EXAMPLES = "2017-10-01, 2017-10-01 08:00:00 or 2017-10-01T08:00:00+00:00"

#: A job before it is numbered: the TraceJob fields after ``id``, with ``submit`` still in Unix seconds
#: (submit, duration, gpus, user, vc, priority, preemptible, time_limit_s, reservation).
_Row = tuple[float, float, int, str, str, int, bool, float | None, str | None]


class TraceError(ValueError):
    """A trace that cannot be read as it is: says which file, which line and what is wrong."""

    def __init__(self, path: str, line: int | None, what: str) -> None:
        self.path, self.line, self.what = path, line, what
        where = f"{path}, line {line}" if line is not None else path
        super().__init__(f"{where}: {what}")


# ---------------------------------------------------------------------------------------------- times


def parse_when(text: str) -> float:
    """The Unix time of an ISO 8601 date or date-time, for ``labq sim --from/--to``.

    UTC unless the text carries an offset, so a window means the same jobs on every machine."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"empty date: use an ISO date or date-time such as {_WHEN_EXAMPLES}")
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(
            f"unreadable date {text!r}: use an ISO date or date-time such as {_WHEN_EXAMPLES} "
            "(UTC unless it has an offset)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _trace_time(value: object, what: str) -> float:
    """A time in a trace cell: Unix seconds, or an ISO 8601 date-time read as :func:`parse_when` reads it."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            try:
                return parse_when(value)
            except ValueError:
                raise ValueError(
                    f"{what} {value!r} is not a time: use Unix seconds or ISO 8601 such as {_WHEN_EXAMPLES}"
                ) from None
    else:
        raise ValueError(f"{what} {value!r} is not a time: use Unix seconds or an ISO 8601 string")
    if not math.isfinite(number):
        raise ValueError(f"{what} {value!r} is not a finite time")
    return number


def _philly_time(text: str, hours: dict[str, float]) -> float:
    """``2017-10-09 07:01:55`` (UTC) in Unix seconds, with each date and hour parsed once.

    82,247 ``strptime`` calls take longer than the rest of the load; slicing off minutes and seconds
    and caching the start of each hour keeps the whole Philly trace well under a second."""
    if len(text) == 19 and text[13] == ":" and text[16] == ":" and text[14:16].isdigit() and text[17:].isdigit():
        hour = hours.get(text[:13])
        if hour is None:
            try:
                hour = hours[text[:13]] = parse_when(text[:13] + ":00:00")
            except ValueError:
                hour = None
        minute, second = int(text[14:16]), int(text[17:19])
        if hour is not None and minute < 60 and second < 60:
            return hour + minute * 60 + second
    return _trace_time(text, "timestamp")


def _show_time(t: float) -> str:
    """``2017-10-01 00:00 UTC``; with seconds only when there are some."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC" if t % 60 else "%Y-%m-%d %H:%M UTC", time.gmtime(t))


# --------------------------------------------------------------------------------------------- values


def _seconds(value: object, what: str) -> float:
    """A duration or time limit: a finite number of seconds, zero allowed, never negative."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{what} {value!r} is not a number of seconds")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{what} {value!r} is not a number of seconds") from None
    if not math.isfinite(number):
        raise ValueError(f"{what} {value!r} is not a finite number")
    if number < 0:
        raise ValueError(f"{what} {value!r} is negative")
    return number


def _count(value: object, what: str) -> int:
    """A whole number such as a GPU count; ``"2"``, ``2`` and ``2.0`` are all 2."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{what} {value!r} is not a whole number")
    if isinstance(value, int):
        return value
    try:
        return int(value)
    except ValueError:
        pass
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{what} {value!r} is not a whole number") from None
    if not number.is_integer():
        raise ValueError(f"{what} {value!r} is not a whole number")
    return int(number)


def _gpus(value: object) -> int:
    gpus = _count(value, "gpus")
    if gpus < 1:
        raise ValueError(f"gpus {value!r} is less than 1: every job needs a GPU")
    return gpus


def _flag(value: object, what: str) -> bool:
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(f"{what} {value!r} is not true/false (or 1/0)")


def _priority(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"class {value!r}: use low, normal, high, urgent or an integer")
    try:
        return parse_priority(value)
    except ValueError as err:
        raise ValueError(f"class: {err}") from None


def _text(value: object, what: str) -> str:
    if isinstance(value, (dict, list, bool)) or value is None:
        raise ValueError(f"{what} {value!r} is not a name")
    return str(value).strip()


def _given(record: Mapping[str, object], key: str) -> bool:
    """Whether an optional field is there: an empty CSV cell or a JSON null means the default."""
    value = record.get(key)
    return value is not None and not (isinstance(value, str) and not value.strip())


def _job_row(record: Mapping[str, object]) -> _Row:
    """One job of a generic CSV or JSON-lines trace; raises ValueError saying what is wrong."""
    for key in _REQUIRED_JOB_KEYS:
        if not _given(record, key):
            raise ValueError(f"{key} is missing" if key not in record else f"{key} is empty")
    user = _text(record["user"], "user") if _given(record, "user") else "user"
    return (
        _trace_time(record["submit"], "submit"),
        _seconds(record["duration"], "duration"),
        _gpus(record["gpus"]),
        user,
        _text(record["vc"], "vc") if _given(record, "vc") else "",
        _priority(record["class"]) if _given(record, "class") else _NORMAL,
        _flag(record["preemptible"], "preemptible") if _given(record, "preemptible") else True,
        _seconds(record["time_limit"], "time_limit") if _given(record, "time_limit") else None,
        _text(record["reservation"], "reservation") if _given(record, "reservation") else None,
    )


def _reservation(record: object) -> TraceReservation:
    """A ``{"reservation": {...}}`` line, with its times still in Unix seconds."""
    if not isinstance(record, dict):
        raise ValueError("reservation must be an object with name, user, gpus, start and end")
    for key in ("name", "user", "gpus", "start", "end"):
        if not _given(record, key):
            raise ValueError(f"reservation {key} is missing")
    start = _trace_time(record["start"], "reservation start")
    end = _trace_time(record["end"], "reservation end")
    if end <= start:
        raise ValueError("reservation end must be after its start")
    booked = _trace_time(record["booked"], "reservation booked") if _given(record, "booked") else math.nan
    users = record.get("users") or ()
    if not isinstance(users, (list, tuple)):
        raise ValueError(f"reservation users {users!r} must be a list of user names")
    return TraceReservation(
        name=_text(record["name"], "reservation name"),
        user=_text(record["user"], "reservation user"),
        gpus=_gpus(record["gpus"]),
        start=start,
        end=end,
        booked=booked,
        users=tuple(_text(u, "reservation user") for u in users),
    )


# -------------------------------------------------------------------------------------------- formats


class _Parsed:
    """What a format parser found, before the window and virtual-cluster filters."""

    def __init__(self) -> None:
        self.rows: list[_Row] = []
        self.reservations: list[TraceReservation] = []
        self.epoch: float | None = None  #: a JSON-lines ``{"epoch": T}`` line
        self.notes: list[str] = []


def _parse_philly(lines: Iterable[str], name: str) -> _Parsed:
    """Philly's ``timestamp,duration,num_gpus,gpu_time,cluster``: no users or classes, so each job is
    a normal, preemptible job of user ``vc-<cluster>``. Rows asking for no GPU are dropped, counted."""
    parsed = _Parsed()
    reader = csv.reader(lines)
    header = [h.strip() for h in next(reader, [])]
    missing = [c for c in PHILLY_COLUMNS if c != "gpu_time" and c not in header]
    if missing:
        raise TraceError(name, 1, f"missing Philly column(s) {', '.join(missing)}; the header is {header}")
    i_time, i_duration, i_gpus, i_vc = (header.index(c) for c in ("timestamp", "duration", "num_gpus", "cluster"))
    hours: dict[str, float] = {}
    rows, no_gpu = parsed.rows, 0
    for fields in reader:
        if not fields:
            continue
        try:
            submit = _philly_time(fields[i_time], hours)
            duration, gpus = float(fields[i_duration]), int(fields[i_gpus])
            if not 0 <= duration < math.inf:
                raise ValueError
        except (ValueError, IndexError):
            try:
                submit, duration, gpus = _philly_row(fields, header, hours)
            except ValueError as err:
                raise TraceError(name, reader.line_num, str(err)) from None
        if gpus < 1:
            if gpus < 0:
                raise TraceError(name, reader.line_num, f"num_gpus {fields[i_gpus]!r} is negative")
            no_gpu += 1
            continue
        cluster = fields[i_vc].strip()
        rows.append((submit, duration, gpus, "vc-" + cluster, cluster, _NORMAL, True, None, None))
    if no_gpu:
        parsed.notes.append(f"dropped {_many(no_gpu, 'row')} with num_gpus 0")
    return parsed


def _philly_row(fields: list[str], header: list[str], hours: dict[str, float]) -> tuple[float, float, int]:
    """Submit time, duration and GPUs of a row the fast path could not read: the slow, careful path,
    which accepts what the fast one does not (``num_gpus`` ``2.0``) and says what is wrong."""
    if len(fields) < len(header):
        raise ValueError(f"{len(fields)} fields, expected {len(header)}")
    row = dict(zip(header, fields))
    return (_philly_time(row["timestamp"], hours), _seconds(row["duration"], "duration"),
            _count(row["num_gpus"], "num_gpus"))


def _parse_csv(lines: Iterable[str], name: str) -> _Parsed:
    """A generic CSV: ``submit,duration,gpus`` and any of ``user,class,preemptible,time_limit,vc,reservation``."""
    parsed = _Parsed()
    reader = csv.reader(lines)
    header = [h.strip().lower() for h in next(reader, [])]
    missing = [k for k in _REQUIRED_JOB_KEYS if k not in header]
    if missing:
        raise TraceError(name, 1, f"missing column(s) {', '.join(missing)}; the header is {header}")
    unknown = [h for h in header if h not in JOB_KEYS]
    if unknown:
        parsed.notes.append(f"ignored unknown column(s) {', '.join(unknown)}")
    for fields in reader:
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            continue
        if len(fields) != len(header):
            raise TraceError(name, reader.line_num, f"{len(fields)} fields, expected {len(header)} as in the header")
        try:
            parsed.rows.append(_job_row(dict(zip(header, fields))))
        except ValueError as err:
            raise TraceError(name, reader.line_num, str(err)) from None
    return parsed


def _parse_jsonl(lines: Iterable[str], name: str) -> _Parsed:
    """One JSON object a line: a job (the generic CSV's keys), ``{"reservation": {...}}`` or
    ``{"epoch": T}`` (virtual time 0, which :func:`to_jsonl` writes so a round trip keeps the clock)."""
    parsed = _Parsed()
    unknown: Counter[str] = Counter()
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as err:
            raise TraceError(name, number, f"not JSON: {err.msg} at column {err.colno}") from None
        if not isinstance(record, dict):
            raise TraceError(name, number, "expected a JSON object")
        try:
            if isinstance(record.get("reservation"), dict):
                parsed.reservations.append(_reservation(record["reservation"]))
            elif record.keys() == {"epoch"}:
                parsed.epoch = _trace_time(record["epoch"], "epoch")
            else:
                parsed.rows.append(_job_row(record))
                unknown.update(k for k in record if k not in JOB_KEYS)
        except ValueError as err:
            raise TraceError(name, number, str(err)) from None
    if unknown:
        parsed.notes.append("ignored unknown key(s) " + ", ".join(f"{k} ({n:,}x)" for k, n in sorted(unknown.items())))
    names = Counter(r.name for r in parsed.reservations)
    doubled = sorted(n for n, count in names.items() if count > 1)
    if doubled:
        raise TraceError(name, None, f"reservation(s) {', '.join(doubled)} listed more than once")
    return parsed


_PARSERS = {"philly": _parse_philly, "csv": _parse_csv, "jsonl": _parse_jsonl}


def guess_format(name: str, first_line: str) -> str:
    """``jsonl`` by extension or a line starting ``{``; a CSV whose header is exactly Philly's is
    ``philly``; any other CSV is ``csv``."""
    suffix = Path(name).suffix.lower()
    head = first_line.strip()
    if suffix in (".jsonl", ".ndjson", ".json") or head.startswith(("{", "#")):
        return "jsonl"
    columns = tuple(c.strip() for c in next(csv.reader([head]), []))
    return "philly" if columns == PHILLY_COLUMNS else "csv"


# ------------------------------------------------------------------------------------------- workload


def read_trace(lines: list[str], fmt: str | None = None, *, name: str = "<trace>", start: float | None = None,
               end: float | None = None, vc: str | None = None) -> tuple[Workload, list[str]]:
    """:func:`load_trace` on lines already read: pure, so it is the same on every machine."""
    if fmt is None:
        fmt = guess_format(name, next((line for line in lines if line.strip()), ""))
    if fmt not in _PARSERS:
        raise ValueError(f"unknown trace format {fmt!r}: use {', '.join(FORMATS)}")
    if start is not None and end is not None and end <= start:
        raise ValueError(f"the window ends ({_show_time(end)}) before it starts ({_show_time(start)})")
    parsed = _PARSERS[fmt](lines, name)
    notes = parsed.notes
    rows = parsed.rows
    rows.sort(key=itemgetter(0))  # stable: jobs submitted in the same second keep the file's order
    rows = _in_window(rows, start, end, notes)
    if vc is not None:
        rows = _in_vc(rows, parsed.rows, vc, name, notes)
    epoch = _epoch(rows, parsed, start)
    jobs = tuple(TraceJob(i, row[0] - epoch, *row[1:]) for i, row in enumerate(rows, 1))
    reservations = _reservations(parsed.reservations, start, end, epoch, notes)
    _note_unknown_reservations(jobs, reservations, notes)
    return Workload(jobs, reservations, epoch, _source(name, fmt, start, end, vc)), notes


def load_trace(path: str | Path, fmt: str | None = None, *, start: float | None = None, end: float | None = None,
               vc: str | None = None) -> tuple[Workload, list[str]]:
    """The jobs of a trace file submitted in ``[start, end)`` (Unix times), of virtual cluster ``vc``.

    ``fmt`` is ``philly``, ``csv`` or ``jsonl``; None guesses it from the extension and header. Returns
    the workload and notes saying what was left out and why, counted. Raises :class:`TraceError` for a
    row that cannot be read or a ``vc`` the trace does not have; ValueError for an unknown ``fmt`` or a
    window that ends before it starts."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise TraceError(name, None, f"not UTF-8 text ({err.reason} at byte {err.start})") from None
    lines = io.StringIO(text, newline="").readlines()  # only \n and \r end a line, as csv expects
    return read_trace(lines, fmt, name=name, start=start, end=end, vc=vc)


def _in_window(rows: list[_Row], start: float | None, end: float | None, notes: list[str]) -> list[_Row]:
    if start is None and end is None:
        return rows
    lo = -math.inf if start is None else start
    hi = math.inf if end is None else end
    kept = [row for row in rows if lo <= row[0] < hi]
    if len(kept) < len(rows):
        notes.append(f"left out {_many(len(rows) - len(kept), 'job')} submitted outside {_show_window(start, end)}")
    return kept


def _in_vc(rows: list[_Row], every_row: list[_Row], vc: str, name: str, notes: list[str]) -> list[_Row]:
    kept = [row for row in rows if row[4] == vc]
    if not kept and not any(row[4] == vc for row in every_row):
        clusters = sorted({row[4] for row in every_row if row[4]})
        listed = ", ".join(clusters) if clusters else "none"
        raise TraceError(name, None, f"no virtual cluster {vc!r}; its virtual clusters: {listed}")
    if len(kept) < len(rows):
        notes.append(f"left out {_many(len(rows) - len(kept), 'job')} of virtual clusters other than {vc}")
    return kept


def _epoch(rows: list[_Row], parsed: _Parsed, start: float | None) -> float:
    """Virtual time 0: the window's start, else the trace's own epoch line, else the first job."""
    if start is not None:
        return start
    first = rows[0][0] if rows else None
    if parsed.epoch is not None:
        return parsed.epoch if first is None else min(parsed.epoch, first)
    if first is not None:
        return first
    return min((r.start for r in parsed.reservations), default=0.0)


def _reservations(found: list[TraceReservation], start: float | None, end: float | None, epoch: float,
                  notes: list[str]) -> tuple[TraceReservation, ...]:
    """Reservations overlapping the window, on the virtual clock; one booked at no stated time counts as
    booked at virtual 0 (or its start, if that is earlier)."""
    lo = -math.inf if start is None else start
    hi = math.inf if end is None else end
    kept = []
    for r in found:
        if r.start < hi and lo < r.end:
            booked = min(0.0, r.start - epoch) if math.isnan(r.booked) else r.booked - epoch
            kept.append(TraceReservation(r.name, r.user, r.gpus, r.start - epoch, r.end - epoch, booked, r.users))
    if len(kept) < len(found):
        notes.append(f"left out {_many(len(found) - len(kept), 'reservation')} outside {_show_window(start, end)}")
    return tuple(kept)


def _note_unknown_reservations(jobs: tuple[TraceJob, ...], reservations: tuple[TraceReservation, ...],
                               notes: list[str]) -> None:
    listed = {r.name for r in reservations}
    named = Counter(j.reservation for j in jobs if j.reservation is not None and j.reservation not in listed)
    if named:
        names = ", ".join(sorted(named))
        notes.append(f"{_many(sum(named.values()), 'job')} name reservations the trace does not list: {names}")


def _many(count: int, thing: str) -> str:
    """``1 job``, ``13,737 jobs``."""
    return f"{count:,} {thing}{'' if count == 1 else 's'}"


def _show_window(start: float | None, end: float | None) -> str:
    if start is None:
        return f"the window before {_show_time(end)}" if end is not None else "the window"
    if end is None:
        return f"the window from {_show_time(start)}"
    return f"{_show_time(start)} to {_show_time(end)}"


def _source(name: str, fmt: str, start: float | None, end: float | None, vc: str | None) -> str:
    words = [f"{Path(name).name} ({fmt})"]
    if start is not None or end is not None:
        words.append(_show_window(start, end).removeprefix("the window "))
    if vc is not None:
        words.append(f"virtual cluster {vc}")
    return ", ".join(words)


# ---------------------------------------------------------------------------------------------- write


def to_jsonl(workload: Workload) -> str:
    """The workload as JSON lines that :func:`load_trace` reads back to the same jobs, reservations
    and epoch: times in Unix seconds, an ``{"epoch": T}`` line first, defaults left out."""
    epoch = workload.epoch
    out = [f"# {workload.source}\n"] if workload.source else []
    out.append(json.dumps({"epoch": _number(epoch)}) + "\n")
    for r in workload.reservations:
        record = {"name": r.name, "user": r.user, "gpus": r.gpus, "start": _number(epoch + r.start),
                  "end": _number(epoch + r.end), "booked": _number(epoch + r.booked)}
        if r.users:
            record["users"] = list(r.users)
        out.append(json.dumps({"reservation": record}) + "\n")
    for job in sorted(workload.jobs, key=lambda j: (j.submit, j.id)):
        out.append(json.dumps(_job_record(job, epoch)) + "\n")
    return "".join(out)


def _job_record(job: TraceJob, epoch: float) -> dict[str, object]:
    record: dict[str, object] = {"submit": _number(epoch + job.submit), "duration": _number(job.duration),
                                 "gpus": job.gpus, "user": job.user}
    if job.priority != _NORMAL:
        record["class"] = priority_name(job.priority)
    if not job.preemptible:
        record["preemptible"] = False
    if job.time_limit_s is not None:
        record["time_limit"] = _number(job.time_limit_s)
    if job.vc:
        record["vc"] = job.vc
    if job.reservation is not None:
        record["reservation"] = job.reservation
    return record


def _number(x: float) -> float | int:
    """Whole seconds as ints, so a written trace reads as people write them."""
    return int(x) if float(x).is_integer() else x

