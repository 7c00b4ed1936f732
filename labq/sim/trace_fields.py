"""Reading one field of a trace: times, durations, counts, flags, classes and names, each refused with
what is wrong (a ``TraceError`` naming the file and line comes from the caller's context). Pure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from labq.models.priority import PriorityClass, parse_priority
from labq.sim.model import TraceReservation

JOB_KEYS = ("submit", "duration", "gpus", "user", "class", "preemptible", "time_limit", "vc", "reservation")
REQUIRED_JOB_KEYS = ("submit", "duration", "gpus")
NORMAL = int(PriorityClass.NORMAL)
_TRUE = frozenset({"true", "1", "yes", "y"})
_FALSE = frozenset({"false", "0", "no", "n"})
_WHEN_EXAMPLES = "2017-10-01, 2017-10-01 08:00:00 or 2017-10-01T08:00:00+00:00"

#: A job before it is numbered: the TraceJob fields after ``id``, with ``submit`` still in Unix seconds
#: (submit, duration, gpus, user, vc, priority, preemptible, time_limit_s, reservation).
Row = tuple[float, float, int, str, str, int, bool, float | None, str | None]


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


def trace_time(value: object, what: str) -> float:
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


def philly_time(text: str, hours: dict[str, float]) -> float:
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
    return trace_time(text, "timestamp")


def show_time(t: float) -> str:
    """``2017-10-01 00:00 UTC``; with seconds only when there are some."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC" if t % 60 else "%Y-%m-%d %H:%M UTC", time.gmtime(t))


# --------------------------------------------------------------------------------------------- values


def seconds(value: object, what: str) -> float:
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


def count(value: object, what: str) -> int:
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
    gpus = count(value, "gpus")
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


def job_row(record: Mapping[str, object]) -> Row:
    """One job of a generic CSV or JSON-lines trace; raises ValueError saying what is wrong."""
    for key in REQUIRED_JOB_KEYS:
        if not _given(record, key):
            raise ValueError(f"{key} is missing" if key not in record else f"{key} is empty")
    user = _text(record["user"], "user") if _given(record, "user") else "user"
    return (
        trace_time(record["submit"], "submit"),
        seconds(record["duration"], "duration"),
        _gpus(record["gpus"]),
        user,
        _text(record["vc"], "vc") if _given(record, "vc") else "",
        _priority(record["class"]) if _given(record, "class") else NORMAL,
        _flag(record["preemptible"], "preemptible") if _given(record, "preemptible") else True,
        seconds(record["time_limit"], "time_limit") if _given(record, "time_limit") else None,
        _text(record["reservation"], "reservation") if _given(record, "reservation") else None,
    )


def reservation(record: object) -> TraceReservation:
    """A ``{"reservation": {...}}`` line, with its times still in Unix seconds."""
    if not isinstance(record, dict):
        raise ValueError("reservation must be an object with name, user, gpus, start and end")
    for key in ("name", "user", "gpus", "start", "end"):
        if not _given(record, key):
            raise ValueError(f"reservation {key} is missing")
    start = trace_time(record["start"], "reservation start")
    end = trace_time(record["end"], "reservation end")
    if end <= start:
        raise ValueError("reservation end must be after its start")
    booked = trace_time(record["booked"], "reservation booked") if _given(record, "booked") else math.nan
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


