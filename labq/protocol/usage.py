"""``GET /v1/usage`` on the wire: the query (a window and a user) and the report (``labq.models.usage``); and
the archive's job documents read straight into what a report needs of them (``decode_use``).

The CLI reads "--month 2026-10" or "--since 7d" in the user's zone and sends the instants as Unix times; the
leader fills what is left out (``until``: now; ``since``: ``DEFAULT_WINDOW_S`` before ``until``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from labq.models.job import JobState
from labq.models.priority import PriorityClass, class_of
from labq.models.usage import CANCELLED, FAILED, Grouping, JobUse, Run, UsageReport, UsageRow, measured, shared
from labq.protocol.errors import bad_request
from labq.protocol.names import check_user_name

DEFAULT_WINDOW_S = 30 * 86400.0  #: the window of a query that names no ``since``
MAX_TIME = 1e12  #: Unix times beyond this (year 33658) are typing errors
_OUTCOMES = {JobState.FAILED.value: FAILED, JobState.TIMEOUT.value: FAILED, JobState.CANCELLED.value: CANCELLED}
_FINISHED = frozenset(s.value for s in JobState if s.finished)
_PREEMPTED = "preempted"  #: ``StopReason.PREEMPTED`` on the wire
_CLASS_NAMES = {int(c): c.name.lower() for c in PriorityClass}


@dataclass(frozen=True)
class UsageQuery:
    since: float | None  #: None: ``DEFAULT_WINDOW_S`` before ``until``
    until: float | None  #: None: now
    user: str | None  #: None: the whole lab (admins only)


def parse_usage_query(since: str | None, until: str | None, user: str | None) -> UsageQuery:
    """The query's parameters as sent (strings, or None when absent), checked; 400 naming the one that is wrong."""
    start, end = _time(since, "since"), _time(until, "until")
    if start is not None and end is not None and not start < end:
        raise bad_request("since must be before until: the window is empty", "since")
    return UsageQuery(start, end, check_user_name(user, "user", "user") if user is not None else None)


def _time(text: str | None, name: str) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise bad_request(f"{name} must be a Unix time in seconds, not {ascii(text)[:40]}", name) from None
    if not 0 <= value <= MAX_TIME:  # also refuses nan
        raise bad_request(f"{name} must be a Unix time between 0 and {MAX_TIME:g}", name)
    return value


def encode_row(row: UsageRow) -> dict:
    return {"name": row.name, "gpu_hours": round(row.gpu_hours, 4),
            "share": None if row.share is None else round(row.share, 6), "jobs": row.jobs_run,
            "failed": row.failed, "preempted": row.preempted, "cancelled": row.cancelled,
            "mean_wait_s": None if row.mean_wait_s is None else round(row.mean_wait_s, 1),
            "p90_wait_s": None if row.p90_wait_s is None else round(row.p90_wait_s, 1),
            "lost_gpu_hours": round(row.lost_gpu_hours, 4),
            "utilization": None if row.utilization is None else round(row.utilization, 4),
            "memory_gib": None if row.memory_gib is None else round(row.memory_gib, 3),
            "measured_gpu_hours": round(row.measured_gpu_hours, 4)}


def encode_usage(report: UsageReport) -> dict:
    """The whole report: the window, the capacity, every grouping's rows (most GPU-hours first) and the total."""
    return {"since": report.since, "until": report.until, "hours": round(report.hours, 4), "user": report.user,
            "gpus": report.gpus,
            "capacity_gpu_hours": None if report.capacity_gpu_hours is None else round(report.capacity_gpu_hours, 4),
            "by": {g.value: [encode_row(r) for r in report.rows[g]] for g in Grouping},
            "total": encode_row(report.total),
            "reservations": [{"name": r.name, "owner": r.owner, "node": r.node, "start": r.start, "end": r.end,
                              "booked_gpu_hours": round(r.booked_gpu_hours, 4),
                              "used_gpu_hours": round(r.used_gpu_hours, 4)} for r in report.reserved]}


def decode_use(doc: dict, now: float) -> JobUse:
    """A job document (``labq.protocol.codec.encode_job``) read straight into ``job_use(decode_job(doc), now)``.

    A report of five years reads a few hundred thousand jobs from the archive; making each whole job first
    (its spec, attempts and placements as models) would take twice as long as reading what the report needs.
    Names are interned: the leader keeps these for every finished job. ``tests/unit/test_usage_report.py``
    holds the two to the same answers."""
    spec = doc["spec"]
    gpus = spec.get("gpus", 1)
    history = doc.get("attempts") or ()
    runs = [_run(a["started_at"], a["ended_at"], a.get("placement"), gpus, a.get("stop_reason") == _PREEMPTED,
                 a.get("work_lost_s", 0.0)) for a in history if a.get("started_at") is not None]
    last = history[-1] if history else None
    current = last is None or last["attempt"] != doc.get("attempt", 1)
    started, ended, state = doc.get("started_at"), doc.get("ended_at"), doc["state"]
    if started is not None and current:
        runs.append(_run(started, ended if ended is not None else now, doc.get("placement"), gpus, False, 0.0))
    return JobUse(doc["id"], sys.intern(spec["user"]), _class_name(spec.get("priority", PriorityClass.NORMAL)),
                  doc["submitted_at"], ended if state in _FINISHED else None, _OUTCOMES.get(state), tuple(runs),
                  started is not None or (not current and last.get("started_at") is not None),
                  spec.get("reservation"), *measured(doc.get("measured_gpu_s", 0.0), doc.get("busy_gpu_s", 0.0),
                                                     doc.get("memory_mib_gpu_s", 0.0)))


def _class_name(priority: int) -> str:
    return _CLASS_NAMES.get(priority) or sys.intern(class_of(priority).name.lower())


def _run(started_at: float, ended_at: float, placement: dict | None, gpus: int, preempted: bool,
         work_lost_s: float) -> Run:
    if placement is None:
        return Run(started_at, ended_at, gpus, preempted, work_lost_s or 0.0, ())
    allocations = shared(tuple((a["node"], tuple(a["gpu_indices"])) for a in placement["allocations"]))
    return Run(started_at, ended_at, sum(len(i) for _, i in allocations), preempted, work_lost_s or 0.0,
               allocations)


def use_row(use: JobUse) -> list:
    """``use`` as a JSON row, its fields in order and its runs as rows (``labq.leader.digests`` keeps them)."""
    return [use.id, use.user, use.klass, use.submitted_at, use.ended_at, use.outcome,
            [[r.started_at, r.ended_at, r.gpus, r.preempted, r.work_lost_s, [[n, list(i)] for n, i in r.allocations]]
             for r in use.runs],
            use.ended_in_last_run, use.reservation, use.utilization, use.memory_gib]


def use_of_row(row: list) -> JobUse:
    """The ``JobUse`` a ``use_row`` was made of (names interned and GPU sets shared, as ``decode_use`` does)."""
    job_id, user, klass, submitted_at, ended_at, outcome, runs, ended_in_last_run, reservation, busy, memory = row
    return JobUse(job_id, sys.intern(user), sys.intern(klass), submitted_at, ended_at,
                  None if outcome is None else sys.intern(outcome),
                  tuple(Run(started, ended, gpus, preempted, lost, shared(tuple((n, tuple(i)) for n, i in placed)))
                        for started, ended, gpus, preempted, lost, placed in runs),
                  ended_in_last_run, reservation, busy, memory)
