"""When a reservation starts, as people type it: ``now``, ``in 2h``, ``14:00``, ``fri 9am``, ``2026-11-27 09:00``.

Pure: the clock (``now``, a Unix timestamp) and the time zone come in as arguments, so a test pins
both and the same text means the same instant everywhere. Only :func:`local_zone` looks at the
machine, and the CLI calls it. Wall-clock times are read in the user's zone with its daylight-saving
rules: days are counted on the calendar, never as 24 h, so ``tomorrow 09:00`` is 09:00 even across
a clock change.
"""

from __future__ import annotations

import os
import re
from datetime import date, datetime, time, timedelta, timezone, tzinfo, UTC
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from labq.units import parse_duration

PAST_GRACE_S = 60.0
"""A start up to a minute ago still counts: typing ``--start 14:00`` at 14:00:20 means now, not tomorrow."""

EXAMPLES = '"now", "in 2h", "14:00", "fri 09:00", "tomorrow 9am", "2026-11-27 09:00"'

_DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_WEEKDAYS = {
    **{name: i for i, name in enumerate(("monday", "tuesday", "wednesday", "thursday", "friday", "saturday",
                                         "sunday"))},
    **{name.lower(): i for i, name in enumerate(_DAY_NAMES)},
    "tues": 1, "thur": 3, "thurs": 3,
}
_MONTHS = {
    **{name: i + 1 for i, name in enumerate(("january", "february", "march", "april", "may", "june", "july",
                                             "august", "september", "october", "november", "december"))},
    **{name.lower(): i + 1 for i, name in enumerate(_MONTH_NAMES)},
    "sept": 9,
}
_CLOCK = re.compile(r"(?P<h>\d{1,2})(?::(?P<m>\d{2})(?::(?P<s>\d{2}))?)?(?P<ampm>am|pm)?")
_ISO = re.compile(r"(?P<date>\d{4}-\d{2}-\d{2})"
                  r"(?:[t ](?P<clock>\d{1,2}:\d{2}(?::\d{2})?)(?P<offset>z|[+-]\d{2}(?::?\d{2})?)?)?")
_ISO_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_DAY_OF_MONTH = re.compile(r"(\d{1,2})(?:st|nd|rd|th)?")
_YEAR = re.compile(r"\d{4}")


def parse_when(text: str, now: float, tz: tzinfo | str | None = None) -> float:
    """The Unix time a user means by ``labq reserve --start TEXT``, read in their time zone ``tz``.

    ``tz`` is a ``ZoneInfo``, an IANA name such as ``"Europe/Berlin"``, or None for the machine's zone
    (:func:`local_zone`, the one impure step). Accepted, case-insensitive:

    - ``now``; ``in 2h``, ``+90m``, ``in 1:30:00`` (any ``units.parse_duration`` duration from now);
    - a time of day ``14:00``, ``9:30``, ``9am``, ``2:30pm``: today if still ahead, else tomorrow;
    - ``today 14:00``, ``tomorrow 9am``, ``tomorrow`` (a day alone means 00:00 of that day);
    - a weekday ``fri 09:00``, ``friday 9am``, ``mon``: the next such day, today included while its time
      is still ahead. ``next fri`` skips the coming one: the Friday 7 to 13 days after today;
    - ``nov 27 09:00``, ``27 nov``, ``27 nov 2027``: without a year, the next time that date comes;
    - ISO 8601 ``2026-11-27``, ``2026-11-27 09:00``, ``2026-11-27T09:00``, ``2026-11-27T09:00+01:00``,
      ``2026-11-27T08:00Z``: an explicit offset wins over ``tz``.

    "Still ahead" and "in the past" allow :data:`PAST_GRACE_S`, the time it takes to type the command.
    A wall time skipped by a spring-forward change raises ValueError naming the hour after; one that
    happens twice at a fall-back change is its first occurrence (``fold=0``), so a reservation never
    starts an hour later than the user read on the clock the first time round.
    """
    zone = local_zone() if tz is None else time_zone(tz)
    said = _normalise(text)
    if said == "now":
        return float(now)
    if said.startswith(("in ", "+")):
        return float(now) + _duration_from_now(text, said.removeprefix("in ").removeprefix("+"))
    today = datetime.fromtimestamp(now, zone).date()
    days, clock, offset = _read(text, said, today)
    return _first_not_past(text, days, clock, offset or zone, now)


def format_when(t: float, now: float, tz: tzinfo | str | None = None) -> str:
    """``Fri 27 Nov 09:00 CET``: a start as the user reads it back, the year only when it is not this year's.

    The zone abbreviation is shown because near a clock change CET and CEST are what tell an answer
    apart; English names are built in so the answer does not depend on the machine's locale.
    """
    zone = local_zone() if tz is None else time_zone(tz)
    wall = datetime.fromtimestamp(t, zone)
    year = "" if wall.year == datetime.fromtimestamp(now, zone).year else f" {wall.year}"
    return (f"{_DAY_NAMES[wall.weekday()]} {wall.day} {_MONTH_NAMES[wall.month - 1]}{year} "
            f"{wall:%H:%M} {wall.tzname()}")


def parse_for(text: str) -> float:
    """How long a reservation lasts (``--for 4h``), in seconds: a duration with a unit, above zero."""
    seconds = parse_duration(text)
    if seconds <= 0:
        raise ValueError(f"{text!r} is no time at all: a reservation must last a while, e.g. 30m, 4h or 2d")
    return seconds


PAST_EXAMPLES = '"7d", "2h ago", "yesterday", "09:00", "mon", "2026-10-01", "2026-10-01 09:00", "27 oct"'


def parse_past(text: str, now: float, tz: tzinfo | str | None = None) -> float:
    """The Unix time a report looks back to (``labq usage --since``/``--until``), read in the zone ``tz``.

    ``parse_when``'s words, with the past meant instead of the future: ``7d`` or ``7d ago`` (any duration back
    from now), ``now``, ``today``, ``yesterday``, ``09:00`` (today's if it has come, else yesterday's),
    ``mon 09:00`` (the last Monday whose 09:00 has come), ``27 oct`` (the last 27 October that has come); a date
    with its year (``2026-10-01``, ``2026-10-01 09:00``, ``27 oct 2026``) is that date, past or not.
    """
    zone = local_zone() if tz is None else time_zone(tz)
    said = _normalise(text).removesuffix(" ago")
    if said == "now":
        return float(now)
    try:
        return float(now) - parse_duration(said)
    except ValueError:
        pass
    today = datetime.fromtimestamp(now, zone).date()
    try:
        days, clock, offset = _read(text, said, today, _past_days)
    except ValueError as err:  # _read's words are a start's: say what a time in the past looks like
        raise ValueError(str(err).replace(" as a start time", " as a time").replace(EXAMPLES, PAST_EXAMPLES)) from None
    for day in days:
        instant, exists = _wall_clock(day, clock, offset or zone)
        if instant <= now + PAST_GRACE_S or day is days[-1]:
            if not exists:
                raise _does_not_exist(text, day, clock, offset or zone)
            return instant
    raise AssertionError("unreachable: the last candidate day is always taken")


def _past_days(text: str, words: list[str], today: date) -> list[date] | None:
    """``_days`` looking back: candidate days latest first, the first whose time has come wins."""
    match words:
        case []:
            return [today, today - timedelta(days=1)]
        case ["today"]:
            return [today]
        case ["yesterday"]:
            return [today - timedelta(days=1)]
        case [name] if name in _WEEKDAYS:
            back = (today.weekday() - _WEEKDAYS[name]) % 7
            return [today - timedelta(days=back), today - timedelta(days=back + 7)]
        case [word] if (m := _ISO_DATE.fullmatch(word)):
            return [_calendar_date(text, *m.groups())]
        case [_, _] | [_, _, _]:
            return _month_day(text, words, today, back=True)
    return None


def parse_month(text: str, tz: tzinfo | str | None = None) -> tuple[float, float]:
    """``2026-10`` -> the Unix times of that month's first midnight and the next month's, in the zone ``tz``."""
    m = re.fullmatch(r"\s*(\d{4})-(\d{1,2})\s*", str(text))
    if not m or not 1 <= int(m[2]) <= 12:
        raise ValueError(f"can't read {str(text).strip()!r} as a month; use YYYY-MM, e.g. 2026-10")
    zone = local_zone() if tz is None else time_zone(tz)
    year, month = int(m[1]), int(m[2])
    start = datetime(year, month, 1, tzinfo=zone)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=zone)
    return start.timestamp(), end.timestamp()


def local_zone() -> tzinfo:
    """The machine's time zone with its daylight-saving rules, for when the user names none.

    ``datetime.now().astimezone().tzinfo`` alone is only today's fixed offset: a reservation after the
    next clock change would land an hour off. So the IANA name is looked for first, in ``$TZ`` and then
    in the ``/etc/localtime`` link; the fixed offset is the last resort (a ``$TZ`` that is no IANA name,
    a container without zone files).
    """
    name = os.environ.get("TZ")
    if name is None:
        name = os.path.realpath("/etc/localtime").partition("zoneinfo/")[2]
    try:
        return ZoneInfo(name.lstrip(":"))
    except (ZoneInfoNotFoundError, ValueError):
        here = datetime.now().astimezone().tzinfo
        return here if here is not None else UTC


def time_zone(tz: tzinfo | str) -> tzinfo:
    """A zone from a ``ZoneInfo`` (or any tzinfo) or an IANA name; a typo in the name says what is wanted."""
    if not isinstance(tz, str):
        return tz
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {tz!r}: use an IANA name such as Europe/Berlin, "
                         "America/New_York or UTC") from None


def _normalise(text: str) -> str:
    """Lower case, single spaces, no commas or ``at``, ``9 am`` as ``9am``: the forms differ only in words."""
    said = re.sub(r"(\d)\s+([ap]m)\b", r"\1\2", str(text).strip().lower().replace(",", " "))
    return " ".join(word for word in said.split() if word != "at")


def _unreadable(text: str, why: str = "") -> ValueError:
    """The one message for text that is no start time: what was typed, why if known, and what works."""
    return ValueError(f"can't read {str(text).strip()!r} as a start time{': ' + why if why else ''}; "
                      f"use e.g. {EXAMPLES}")


def _duration_from_now(text: str, duration: str) -> float:
    """The ``2h`` of ``in 2h``, with the duration's own hint when it is mistyped."""
    try:
        return parse_duration(duration.strip())
    except ValueError as e:
        raise ValueError(f"can't read {str(text).strip()!r} as a start time: {e}") from None


def _read(text: str, said: str, today: date, days_of=None) -> tuple[list[date], time, tzinfo | None]:
    """The days the text may mean (in the order they are tried: ``days_of``, by default ``_days``: earliest first,
    the first not in the past wins), the time, any explicit offset."""
    if iso := _ISO.fullmatch(said):
        day = _calendar_date(text, *_ISO_DATE.fullmatch(iso["date"]).groups())
        clock = _clock(text, iso["clock"]) if iso["clock"] else time(0)
        return [day], clock, _offset(text, iso["offset"])
    words = said.split()
    clock = None
    if words and (clock := _clock(text, words[-1])) is not None:
        words = words[:-1]
    elif words and (clock := _clock(text, words[0])) is not None:
        words = words[1:]
    if not words and clock is None:
        raise _unreadable(text)
    days = (days_of or _days)(text, words, today)
    if days is None:
        raise _unreadable(text)
    return days, clock or time(0), None


def _days(text: str, words: list[str], today: date) -> list[date] | None:
    """Candidate days for the day words (``[]``, ``tomorrow``, ``next fri``, ``27 nov``...); None if no day."""
    match words:
        case []:
            return [today, today + timedelta(days=1)]
        case ["today"]:
            return [today]
        case ["tomorrow"]:
            return [today + timedelta(days=1)]
        case [name] if name in _WEEKDAYS:
            ahead = (_WEEKDAYS[name] - today.weekday()) % 7
            return [today + timedelta(days=ahead)] if ahead else [today, today + timedelta(days=7)]
        case ["next", name] if name in _WEEKDAYS:
            return [today + timedelta(days=(_WEEKDAYS[name] - today.weekday()) % 7 + 7)]
        case [word] if (m := _ISO_DATE.fullmatch(word)):
            return [_calendar_date(text, *m.groups())]
        case [_, _] | [_, _, _]:
            return _month_day(text, words, today)
    return None


def _month_day(text: str, words: list[str], today: date, back: bool = False) -> list[date] | None:
    """``nov 27``, ``27 nov``, either with a year: that date, else the next years' (Feb 29 waits for a leap year);
    ``back``: this year's and the years' before, latest first."""
    first, second, *year = words
    if year and not _YEAR.fullmatch(year[0]):
        return None
    if first in _MONTHS and (day := _DAY_OF_MONTH.fullmatch(second)):
        month, day_number = _MONTHS[first], int(day[1])
    elif second in _MONTHS and (day := _DAY_OF_MONTH.fullmatch(first)):
        month, day_number = _MONTHS[second], int(day[1])
    else:
        return None
    if year:
        return [_calendar_date(text, year[0], str(month), str(day_number))]
    _calendar_date(text, "2000", str(month), str(day_number))  # a leap year: only a day no year has fails
    years = range(today.year, today.year - 9, -1) if back else range(today.year, today.year + 9)
    return [date(y, month, day_number) for y in years if _is_date(y, month, day_number)]


def _is_date(year: int, month: int, day: int) -> bool:
    try:
        date(year, month, day)
    except ValueError:
        return False
    return True


def _calendar_date(text: str, year: str, month: str, day: str) -> date:
    """A date from its numbers, or the reason it is none (``2026-02-30``, ``31 nov``)."""
    try:
        return date(int(year), int(month), int(day))
    except ValueError as e:
        raise _unreadable(text, f"no such date ({e})") from None


def _clock(text: str, word: str) -> time | None:
    """``14:00``, ``9:30``, ``09:00:30``, ``9am``, ``2:30pm`` -> a time; None if the word is no time.

    A bare number (``9``) is no time: 9:00 or 21:00 is for the user to say. ``12am`` is midnight.
    """
    m = _CLOCK.fullmatch(word)
    if not m or (m["m"] is None and m["ampm"] is None):
        return None
    hour, minute, second = int(m["h"]), int(m["m"] or 0), int(m["s"] or 0)
    if m["ampm"]:
        if not 1 <= hour <= 12:
            raise _unreadable(text, f"{word} has an hour outside 1-12")
        hour = hour % 12 + (12 if m["ampm"] == "pm" else 0)
    if hour > 23 or minute > 59 or second > 59:
        raise _unreadable(text, f"{word} is no time of day (00:00 to 23:59)")
    return time(hour, minute, second)


def _offset(text: str, offset: str | None) -> tzinfo | None:
    """``z``, ``+01:00``, ``+0100``, ``-05`` -> a fixed zone; None when the text gave none."""
    if offset is None:
        return None
    if offset == "z":
        return UTC
    digits = offset[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:] or 0)
    if hours > 23 or minutes > 59:
        raise _unreadable(text, f"{offset} is no UTC offset")
    sign = -1 if offset[0] == "-" else 1
    return timezone(sign * timedelta(hours=hours, minutes=minutes))


def _wall_clock(day: date, clock: time, zone: tzinfo) -> tuple[float, bool]:
    """The instant a wall clock in ``zone`` shows ``day clock``, and whether it ever shows it.

    ``fold=0`` takes the first of the two instants at a fall-back change. In a spring-forward gap the
    wall time never happens: going to UTC and back then lands on another wall time, which is the test.
    """
    wall = datetime.combine(day, clock, tzinfo=zone)
    instant = wall.astimezone(UTC)
    exists = instant.astimezone(zone).replace(tzinfo=None) == wall.replace(tzinfo=None)
    return instant.timestamp(), exists


def _first_not_past(text: str, days: list[date], clock: time, zone: tzinfo, now: float) -> float:
    """The first candidate day whose ``clock`` is not in the past; a skipped wall time is refused, not moved.

    A past candidate that never existed is passed over (``02:30`` typed after a spring-forward night
    means the next night's); a fixed day that never had it is refused as such, before being called past.
    """
    for day in days:
        instant, exists = _wall_clock(day, clock, zone)
        if instant >= now - PAST_GRACE_S:
            if not exists:
                raise _does_not_exist(text, day, clock, zone)
            return instant
    first, exists = _wall_clock(days[0], clock, zone)
    if not exists:
        raise _does_not_exist(text, days[0], clock, zone)
    raise ValueError(f"{str(text).strip()!r} is {format_when(first, now, zone)}, which is in the past")


def _does_not_exist(text: str, day: date, clock: time, zone: tzinfo) -> ValueError:
    """Say that the clocks skip this time on that day in that zone, and offer the hour after."""
    later = (datetime.combine(day, clock) + timedelta(hours=1)).time()
    name = getattr(zone, "key", None) or str(zone)
    return ValueError(f"{str(text).strip()!r}: {clock:%H:%M} does not exist on "
                      f"{_DAY_NAMES[day.weekday()]} {day.day} {_MONTH_NAMES[day.month - 1]} {day.year} in {name}, "
                      f"because the clocks skip forward for the daylight-saving change; use {later:%H:%M} instead")
