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
from collections import Counter
from collections.abc import Iterable
from operator import itemgetter
from pathlib import Path

from labq.models.priority import priority_name
from labq.sim.model import TraceJob, TraceReservation, Workload

FORMATS = ("philly", "csv", "jsonl")
PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
GPUS_PER_PHILLY_NODE = 8
#: Virtual-cluster sizes in nodes of 8 GPUs, as the Helios (SC'21) artifact replays the Philly trace.
PHILLY_VC_NODES: dict[str, int] = {
    "6214e9": 64, "7f04ca": 32, "11cb48": 16, "b436b2": 64, "ee9e8c": 64, "e13805": 16,
    "6c71a0": 32, "2869ce": 16, "ed69ec": 8, "103959": 8, "0e4a51": 32,
}

from labq.sim.trace_fields import (
    JOB_KEYS, NORMAL, REQUIRED_JOB_KEYS, Row, TraceError, count, job_row, parse_when, philly_time, reservation,
    seconds, show_time, trace_time,
)

__all__ = ["FORMATS", "PHILLY_VC_NODES", "TraceError", "guess_format", "load_trace", "parse_when", "read_trace",
           "to_jsonl"]

# -------------------------------------------------------------------------------------------- formats


class _Parsed:
    """What a format parser found, before the window and virtual-cluster filters."""

    def __init__(self) -> None:
        self.rows: list[Row] = []
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
            submit = philly_time(fields[i_time], hours)
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
        rows.append((submit, duration, gpus, "vc-" + cluster, cluster, NORMAL, True, None, None))
    if no_gpu:
        parsed.notes.append(f"dropped {_many(no_gpu, 'row')} with num_gpus 0")
    return parsed


def _philly_row(fields: list[str], header: list[str], hours: dict[str, float]) -> tuple[float, float, int]:
    """Submit time, duration and GPUs of a row the fast path could not read: the slow, careful path,
    which accepts what the fast one does not (``num_gpus`` ``2.0``) and says what is wrong."""
    if len(fields) < len(header):
        raise ValueError(f"{len(fields)} fields, expected {len(header)}")
    row = dict(zip(header, fields))
    return (philly_time(row["timestamp"], hours), seconds(row["duration"], "duration"),
            count(row["num_gpus"], "num_gpus"))


def _parse_csv(lines: Iterable[str], name: str) -> _Parsed:
    """A generic CSV: ``submit,duration,gpus`` and any of ``user,class,preemptible,time_limit,vc,reservation``."""
    parsed = _Parsed()
    reader = csv.reader(lines)
    header = [h.strip().lower() for h in next(reader, [])]
    missing = [k for k in REQUIRED_JOB_KEYS if k not in header]
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
            parsed.rows.append(job_row(dict(zip(header, fields))))
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
                parsed.reservations.append(reservation(record["reservation"]))
            elif record.keys() == {"epoch"}:
                parsed.epoch = trace_time(record["epoch"], "epoch")
            else:
                parsed.rows.append(job_row(record))
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
        raise ValueError(f"the window ends ({show_time(end)}) before it starts ({show_time(start)})")
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


def _in_window(rows: list[Row], start: float | None, end: float | None, notes: list[str]) -> list[Row]:
    if start is None and end is None:
        return rows
    lo = -math.inf if start is None else start
    hi = math.inf if end is None else end
    kept = [row for row in rows if lo <= row[0] < hi]
    if len(kept) < len(rows):
        notes.append(f"left out {_many(len(rows) - len(kept), 'job')} submitted outside {_show_window(start, end)}")
    return kept


def _in_vc(rows: list[Row], every_row: list[Row], vc: str, name: str, notes: list[str]) -> list[Row]:
    kept = [row for row in rows if row[4] == vc]
    if not kept and not any(row[4] == vc for row in every_row):
        clusters = sorted({row[4] for row in every_row if row[4]})
        listed = ", ".join(clusters) if clusters else "none"
        raise TraceError(name, None, f"no virtual cluster {vc!r}; its virtual clusters: {listed}")
    if len(kept) < len(rows):
        notes.append(f"left out {_many(len(rows) - len(kept), 'job')} of virtual clusters other than {vc}")
    return kept


def _epoch(rows: list[Row], parsed: _Parsed, start: float | None) -> float:
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
        return f"the window before {show_time(end)}" if end is not None else "the window"
    if end is None:
        return f"the window from {show_time(start)}"
    return f"{show_time(start)} to {show_time(end)}"


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
    if job.priority != NORMAL:
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

