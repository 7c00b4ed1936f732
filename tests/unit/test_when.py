"""`labq reserve --start` reads the start time as the user typed it, in the user's own time zone; `labq usage --since`
reads a time looked back to the same way, and `--month` a calendar month."""

from __future__ import annotations

import re
from datetime import datetime, UTC
from zoneinfo import ZoneInfo

import pytest

from labq.when import format_when, local_zone, parse_for, parse_month, parse_past, parse_when

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
TOKYO = ZoneInfo("Asia/Tokyo")
LOS_ANGELES = ZoneInfo("America/Los_Angeles")


def wall(text: str, zone: ZoneInfo = BERLIN) -> float:
    """The instant a clock in ``zone`` shows ``YYYY-MM-DD HH:MM[:SS]`` (first occurrence)."""
    return datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


def utc(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


FRI_0800 = wall("2026-11-27 08:00")  # a Friday in winter (CET, UTC+1)
FRI_1000 = wall("2026-11-27 10:00")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", FRI_0800),
        ("  NOW ", FRI_0800),
        ("in 2h", FRI_0800 + 2 * 3600),
        ("+2h", FRI_0800 + 2 * 3600),
        ("in 90m", FRI_0800 + 90 * 60),
        ("In 1h30m", FRI_0800 + 90 * 60),
        ("in 1:30:00", FRI_0800 + 90 * 60),
        ("in 2d", FRI_0800 + 2 * 86400),
        # a time of day: today while still ahead, else tomorrow
        ("14:00", wall("2026-11-27 14:00")),
        ("9:30", wall("2026-11-27 09:30")),
        ("07:00", wall("2026-11-28 07:00")),
        ("08:00", FRI_0800),
        ("07:59:30", wall("2026-11-27 07:59:30")),  # within the minute's grace: now, not tomorrow
        ("07:58", wall("2026-11-28 07:58")),
        ("9am", wall("2026-11-27 09:00")),
        ("9 AM", wall("2026-11-27 09:00")),
        ("2:30pm", wall("2026-11-27 14:30")),
        ("12pm", wall("2026-11-27 12:00")),
        ("12am", wall("2026-11-28 00:00")),
        ("7am", wall("2026-11-28 07:00")),
        # today / tomorrow; a day alone is 00:00
        ("today 14:00", wall("2026-11-27 14:00")),
        ("tomorrow 14:00", wall("2026-11-28 14:00")),
        ("Tomorrow at 9am", wall("2026-11-28 09:00")),
        ("14:00 tomorrow", wall("2026-11-28 14:00")),
        ("tomorrow", wall("2026-11-28 00:00")),
        # weekdays, asked on Friday 08:00
        ("fri 09:00", wall("2026-11-27 09:00")),
        ("friday 9am", wall("2026-11-27 09:00")),
        ("fri", wall("2026-12-04 00:00")),  # today's 00:00 has passed
        ("sat 10:00", wall("2026-11-28 10:00")),
        ("mon", wall("2026-11-30 00:00")),
        ("Thursday 17:30", wall("2026-12-03 17:30")),
        ("next fri 09:00", wall("2026-12-04 09:00")),
        ("next sat", wall("2026-12-05 00:00")),
        ("next thu 9am", wall("2026-12-10 09:00")),
        # ISO 8601: without an offset the time is in the zone; with one, the offset wins
        ("2026-11-28", wall("2026-11-28 00:00")),
        ("2026-11-28 09:00", wall("2026-11-28 09:00")),
        ("2026-11-28T09:00", wall("2026-11-28 09:00")),
        ("2026-11-28t09:00:30", wall("2026-11-28 09:00:30")),
        ("2026-11-28 9am", wall("2026-11-28 09:00")),
        ("2026-11-28T09:00:00+01:00", utc("2026-11-28 08:00")),
        ("2026-11-28T09:00-05:00", utc("2026-11-28 14:00")),
        ("2026-11-28T09:00+0530", utc("2026-11-28 03:30")),
        ("2026-11-28T08:00Z", utc("2026-11-28 08:00")),
        ("2026-11-28T08:00z", utc("2026-11-28 08:00")),
        # month and day, the next time that date comes
        ("nov 28 09:00", wall("2026-11-28 09:00")),
        ("28 nov 09:00", wall("2026-11-28 09:00")),
        ("27 Nov 09:00", wall("2026-11-27 09:00")),
        ("november 26", wall("2027-11-26 00:00")),
        ("dec 1st 9am", wall("2026-12-01 09:00")),
        ("jan 5, 2027 14:00", wall("2027-01-05 14:00")),
        ("29 feb", wall("2028-02-29 00:00")),
    ],
)
def test_forms_read_on_a_friday_morning_in_berlin(text, expected):
    assert parse_when(text, FRI_0800, BERLIN) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("fri 09:00", wall("2026-12-04 09:00")),  # today's 09:00 has passed: next Friday
        ("next fri 09:00", wall("2026-12-04 09:00")),
        ("friday 11:00", wall("2026-11-27 11:00")),
        ("14:00", wall("2026-11-27 14:00")),
        ("09:00", wall("2026-11-28 09:00")),
        ("today 11:00", wall("2026-11-27 11:00")),
    ],
)
def test_the_same_words_later_that_friday(text, expected):
    assert parse_when(text, FRI_1000, BERLIN) == expected


def test_a_zone_name_reads_like_the_zone():
    assert parse_when("fri 09:00", FRI_0800, "Europe/Berlin") == parse_when("fri 09:00", FRI_0800, BERLIN)


def test_the_same_words_in_tokyo_and_los_angeles_are_17_hours_apart_in_winter():
    now = utc("2026-01-01 00:00")
    for text in ("2026-01-15 09:00", "jan 15 9am"):
        tokyo, los_angeles = parse_when(text, now, TOKYO), parse_when(text, now, LOS_ANGELES)
        assert tokyo == utc("2026-01-15 00:00")
        assert los_angeles - tokyo == 17 * 3600


def test_an_explicit_offset_wins_over_the_zone():
    text = "2026-11-28T09:00:00+01:00"
    assert parse_when(text, FRI_0800, TOKYO) == parse_when(text, FRI_0800, LOS_ANGELES) == utc("2026-11-28 08:00")


THU_BEFORE_FALL_BACK = wall("2026-10-22 12:00")  # Berlin leaves summer time on Sunday 25 October 2026


@pytest.mark.parametrize(
    ("text", "expected_utc"),
    [
        ("fri 09:00", "2026-10-23 07:00"),  # still CEST, UTC+2
        ("2026-10-24 09:00", "2026-10-24 07:00"),
        ("2026-10-25 09:00", "2026-10-25 08:00"),  # now CET, UTC+1
        ("sun 09:00", "2026-10-25 08:00"),
        ("next fri 09:00", "2026-10-30 08:00"),
        ("mon 9am", "2026-10-26 08:00"),
    ],
)
def test_wall_times_across_the_october_change_in_berlin(text, expected_utc):
    assert parse_when(text, THU_BEFORE_FALL_BACK, BERLIN) == utc(expected_utc)


def test_a_booking_over_the_change_from_09_00_to_09_00_is_25_hours():
    start = parse_when("2026-10-24 09:00", THU_BEFORE_FALL_BACK, BERLIN)
    end = parse_when("2026-10-25 09:00", THU_BEFORE_FALL_BACK, BERLIN)
    assert end - start == 25 * 3600


@pytest.mark.parametrize(
    ("text", "zone", "now", "expected_utc"),
    [
        ("2026-10-25 02:30", BERLIN, THU_BEFORE_FALL_BACK, "2026-10-25 00:30"),  # the CEST 02:30, not the CET one
        ("sun 2:30am", BERLIN, THU_BEFORE_FALL_BACK, "2026-10-25 00:30"),
        ("2026-11-01 01:30", NEW_YORK, utc("2026-10-30 12:00"), "2026-11-01 05:30"),  # EDT, not EST
    ],
)
def test_a_time_that_happens_twice_is_its_first_occurrence(text, zone, now, expected_utc):
    assert parse_when(text, now, zone) == utc(expected_utc)


@pytest.mark.parametrize(
    ("text", "zone", "now"),
    [
        ("2026-03-29 02:30", BERLIN, wall("2026-03-26 12:00")),
        ("sun 02:30", BERLIN, wall("2026-03-26 12:00")),
        ("02:30", BERLIN, wall("2026-03-28 10:00")),  # tomorrow's 02:30
        ("2026-03-08 2:30am", NEW_YORK, wall("2026-03-01 12:00", NEW_YORK)),
        ("2026-03-29 02:30", BERLIN, wall("2026-04-01 12:00")),  # never was, rather than merely past
    ],
)
def test_a_time_skipped_by_the_spring_change_does_not_exist(text, zone, now):
    with pytest.raises(ValueError, match="does not exist") as caught:
        parse_when(text, now, zone)
    assert "daylight-saving" in str(caught.value) and "03:30" in str(caught.value)
    assert zone.key in str(caught.value)


def test_a_skipped_time_already_past_today_means_tomorrow():
    now = wall("2026-03-29 10:00")  # the spring-forward day, after the gap
    assert parse_when("02:30", now, BERLIN) == wall("2026-03-30 02:30")


@pytest.mark.parametrize(
    "text",
    ["fryday 9", "", "9", "soon", "tomorrow 25:00", "13pm", "0am", "9:60", "next tomorrow", "next", "at",
     "in 2x", "+", "in -2h", "2026-02-30", "2026-13-01 09:00", "nov 31", "30 feb 2027", "2026-11-28T09:00+25:00",
     "fri 9 am pm", "27 nov 26", "tomorrow today"],
)
def test_garbage_is_refused_with_what_to_type(text):
    with pytest.raises(ValueError, match="can't read") as caught:
        parse_when(text, FRI_0800, BERLIN)
    assert repr(text.strip()) in str(caught.value)


def test_the_refusal_lists_the_accepted_forms():
    with pytest.raises(ValueError) as caught:
        parse_when("fryday 9", FRI_0800, BERLIN)
    for example in ('"fri 09:00"', '"tomorrow 9am"', '"in 2h"', '"2026-11-27 09:00"'):
        assert example in str(caught.value)


@pytest.mark.parametrize(
    "text", ["today 07:00", "today", "2026-11-27", "2026-11-26 09:00", "2026-11-27T06:00Z", "26 nov 2026 9am",
             "today 07:58"],
)
def test_a_start_in_the_past_is_refused(text):
    with pytest.raises(ValueError, match="is in the past"):
        parse_when(text, FRI_0800, BERLIN)


def test_a_minute_ago_still_counts_as_now():
    assert parse_when("today 07:59", FRI_0800, BERLIN) == wall("2026-11-27 07:59")


def test_an_unknown_zone_says_what_a_zone_looks_like():
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'.*Europe/Berlin"):
        parse_when("now", FRI_0800, "Mars/Olympus")


@pytest.mark.parametrize(
    ("t", "zone", "expected"),
    [
        (wall("2026-11-27 09:00"), BERLIN, "Fri 27 Nov 09:00 CET"),
        (wall("2026-10-23 09:00"), BERLIN, "Fri 23 Oct 09:00 CEST"),
        (wall("2026-12-04 09:05"), "Europe/Berlin", "Fri 4 Dec 09:05 CET"),
        (wall("2027-01-05 14:00"), BERLIN, "Tue 5 Jan 2027 14:00 CET"),  # another year says which
        (utc("2026-11-28 00:00"), TOKYO, "Sat 28 Nov 09:00 JST"),
        (utc("2026-11-28 17:00"), LOS_ANGELES, "Sat 28 Nov 09:00 PST"),
    ],
)
def test_format_when_reads_back_the_start(t, zone, expected):
    assert format_when(t, FRI_0800, zone) == expected


@pytest.mark.parametrize("text", ["fri 09:00", "tomorrow 9am", "in 2h", "2026-11-28 09:00", "dec 1st 9am"])
def test_what_format_when_prints_reads_back_to_the_same_start(text):
    start = parse_when(text, FRI_0800, BERLIN)
    shown = format_when(start, FRI_0800, BERLIN)  # "Fri 27 Nov 10:00 CET"
    _, day, month, clock, _ = shown.split()
    assert parse_when(f"{day} {month} {clock}", FRI_0800, BERLIN) == start - start % 60


@pytest.mark.parametrize(("text", "seconds"), [("4h", 4 * 3600), ("90m", 5400), ("2d", 2 * 86400), ("1:30:00", 5400)])
def test_parse_for_is_a_duration(text, seconds):
    assert parse_for(text) == seconds


@pytest.mark.parametrize(("text", "words"), [("0m", "no time at all"), ("0:00:00", "no time at all"),
                                             ("-2h", "not a duration"), ("90", "not a duration"),
                                             ("", "not a duration")])
def test_parse_for_refuses_nothing_and_less(text, words):
    with pytest.raises(ValueError, match=words):
        parse_for(text)


def test_local_zone_follows_tz(monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    assert local_zone() == TOKYO
    monkeypatch.setenv("TZ", "not a zone")
    assert local_zone() is not None  # the machine's fixed offset, as a last resort


def test_no_zone_means_the_local_one(monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    assert parse_when("2026-11-28 09:00", FRI_0800) == parse_when("2026-11-28 09:00", FRI_0800, TOKYO)


# -- looking back: labq usage --since/--until and --month ------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("now", "2026-11-27 08:00"),
    ("7d", "2026-11-20 08:00"),
    ("2h ago", "2026-11-27 06:00"),
    ("today", "2026-11-27 00:00"),
    ("yesterday", "2026-11-26 00:00"),
    ("yesterday 18:00", "2026-11-26 18:00"),
    ("07:30", "2026-11-27 07:30"),  # has come today
    ("09:00", "2026-11-26 09:00"),  # has not: yesterday's
    ("fri", "2026-11-27 00:00"),  # today is a Friday
    ("fri 09:00", "2026-11-20 09:00"),  # today's 09:00 has not come: last week's
    ("mon", "2026-11-23 00:00"),
    ("27 oct", "2026-10-27 00:00"),
    ("28 nov", "2025-11-28 00:00"),  # this year's has not come
    ("2026-10-01", "2026-10-01 00:00"),  # CEST, a month before the change
    ("2026-10-01 09:00", "2026-10-01 09:00"),
    ("2026-12-24", "2026-12-24 00:00"),  # a date with its year is that date, even to come (an --until)
])
def test_a_time_looked_back_to_on_a_friday_morning_in_berlin(text, expected):
    assert parse_past(text, FRI_0800, BERLIN) == wall(expected)


@pytest.mark.parametrize(("text", "words"), [
    ("last tuesday-ish", "can't read 'last tuesday-ish' as a time; use e.g. \"7d\""),
    ("2026-02-30", "no such date"),
    ("25:00", "no time of day"),
])
def test_a_time_looked_back_to_that_is_none_says_what_works(text, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        parse_past(text, FRI_0800, BERLIN)


@pytest.mark.parametrize(("text", "zone", "start", "end"), [
    ("2026-10", BERLIN, "2026-10-01 00:00", "2026-11-01 00:00"),  # 31 days and the hour of the fall-back change
    ("2026-12", NEW_YORK, "2026-12-01 00:00", "2027-01-01 00:00"),
    (" 2027-2 ", TOKYO, "2027-02-01 00:00", "2027-03-01 00:00"),
])
def test_a_month_is_its_first_midnight_to_the_next_ones(text, zone, start, end):
    assert parse_month(text, zone) == (wall(start, zone), wall(end, zone))


@pytest.mark.parametrize("text", ["2026-13", "2026-0", "oct", "2026/10", "26-10"])
def test_a_month_that_is_none_says_how_to_write_one(text):
    with pytest.raises(ValueError, match="use YYYY-MM, e.g. 2026-10"):
        parse_month(text, BERLIN)
