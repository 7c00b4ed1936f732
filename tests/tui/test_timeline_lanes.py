"""The timeline's lanes, as tables: bookings that overlap or touch are drawn whole, short bars are keyed.

Most cases draw one day over 24 columns (``width`` 29 = the 4-wide name column, a space, 24), so column
``c`` is ``NOW + c`` hours and midnight (UTC) is column 15.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from labq.tui.reservations import timeline_text
from labq.tui.timeline import Bar, draw_timeline, pack_lanes, timeline_lines

H = 3600.0
NOW = datetime(2026, 11, 20, 9, 0, tzinfo=UTC).timestamp()  #: a Friday, 09:00 UTC
NODES = [{"name": "ws1"}, {"name": "ws2"}]
DAY = {"now": NOW, "days": 1, "width": 29, "tz": UTC}  #: a column an hour


def booking(name: str, start_h: float, end_h: float, node: str = "ws1", gpus: tuple[int, ...] = (0,)) -> dict:
    return {"name": name, "node": node, "start": NOW + start_h * H, "end": NOW + end_h * H, "gpu_indices": list(gpus)}


@pytest.mark.parametrize(("bookings", "lines", "keyed"), [
    pytest.param([booking("roo", 2, 8), booking("in", 4, 12, gpus=(1,))],
                 ["ws1  ..[roo=].......|........",
                  "     ....[in====]...|........",
                  "ws2  ...............|........"], [], id="overlapping pair on one node: a lane each"),
    pytest.param([booking("a", 1, 5), booking("b", 3, 9, gpus=(1,)), booking("c", 5, 10)],
                 ["ws1  .[a=][c==].....|........",
                  "     ...[b===]......|........",
                  "ws2  ...............|........"], [], id="two overlap, the third back to back: two lanes"),
    pytest.param([booking("a", 1, 5), booking("c", 6, 10, gpus=(1,)), booking("d", 12, 15, gpus=(2,))],
                 ["ws1  .[a=].[c=]..[d]|........",
                  "ws2  ...............|........"], [], id="no overlaps: one line"),
    pytest.param([booking("a", 1, 4.5), booking("c", 4.5, 8)],
                 ["ws1  .[a][c=].......|........",
                  "ws2  ...............|........"], [], id="back to back inside a column: the later one takes it"),
    pytest.param([booking("a", 1.2, 1.6), booking("c", 1.6, 3)],
                 ["ws1  .1.............|........",
                  "     .2]............|........",
                  "ws2  ...............|........"], ["a", "c"], id="back to back in one column of one: two lanes"),
    pytest.param([booking("old", 2, 7, "ws9"), booking("new", 5, 9, "ws9", (1,))],
                 ["ws1  ...............|........",
                  "ws2  ...............|........",
                  "ws9  ..[old]........|........",
                  "     .....[1=]......|........"], ["new"], id="GPUs of a node that went away: its own lanes"),
    pytest.param([booking("cross", -3, 5), booking("over", 2, 6, gpus=(1,)), booking("late", 20, 30, gpus=(0, 1))],
                 ["ws1  <1:c]..........|....[3=>",
                  "     ..[2=].........|........",
                  "ws2  ...............|........"], ["cross", "over", "late"], id="crossing the window's edges"),
])
def test_lanes(bookings, lines, keyed):
    drawn = draw_timeline(NODES, bookings, [], **DAY)
    assert list(drawn.lines[1:]) == lines
    assert [line.split("  ")[:2] for line in drawn.key if not line.startswith(" ")] == [
        [key, name] for key, name in zip("123456789", keyed)]
    assert all(len(line) == 29 for line in drawn.lines + drawn.key)


def test_eighty_columns_long_names_are_whole_or_keyed_and_named_in_full_below():
    bookings = [booking("paper-deadline-final-v2", 20, 44, gpus=(0, 1)),
                booking("bert-large-pretraining-sweep", 30, 36, gpus=(2, 3)),
                booking("llama-finetune-7b", 44, 60, gpus=(0, 1)), booking("x", 50, 51, "ws2")]
    drawn = draw_timeline(NODES, bookings, [], NOW, 3, 80, UTC)  # 75 columns over 72 hours
    assert list(drawn.lines) == [
        "UTC  now 09:00      |Sat 21                  |Sun 22                  |Mon 23   ",
        "ws1  ...............|....[paper-deadline-final-v2][2:llama-finetune]..|.........",
        "     ...............|...............[1:ber]..|........................|.........",
        "ws2  ...............|........................|...........3]...........|........."]
    assert [line.rstrip() for line in drawn.key] == [
        "1  bert-large-pretraining-sweep  ws1:2,3  Sat 21 15:00–21:00",
        "2  llama-finetune-7b  ws1:0,1  Sun 22 05:00–21:00",
        "3  x  ws2:0  Sun 22 11:00–12:00"]
    assert all(len(line) == 80 for line in drawn.lines + drawn.key)
    assert sorted(drawn.bars) == [(1, 25, 50), (1, 50, 68), (2, 36, 43), (3, 57, 59)]  # where the screen colors


def test_overlapping_hostile_names_stay_escaped_in_the_bar_and_the_key():
    drawn = draw_timeline(NODES, [booking("evil\x1b[2J\n", 2, 8), booking("ok", 4, 12, gpus=(1,))], [], **DAY)
    assert list(drawn.lines[1:3]) == ["ws1  ..[1:ev].......|........",
                                      "     ....[ok====]...|........"]
    assert drawn.key == ("1  evil\\x1b[2J\\n  ws1:0  Fri ",  # a long line wraps, under the name
                         "   20 11:00–17:00            ")


def test_a_job_end_goes_to_the_first_lane_with_room_for_it():
    job = {"id": 1, "state": "running", "started_at": NOW - H, "spec": {"time_limit_s": 6 * H},
           "placement": {"allocations": [{"node": "ws1", "gpu_indices": [2]}]}}
    bookings = [booking("alpha", 2, 9), booking("b", 3, 12, gpus=(1,))]  # column 5: a name, then a fill
    drawn = draw_timeline(NODES, bookings, [job], **DAY)
    assert list(drawn.lines[1:3]) == ["ws1  ..[alpha]......|........",
                                      "     ...[b*=====]...|........"]
    assert drawn.job_ends == ((2, 5 + 5),)


def test_timeline_lines_are_the_drawn_lines():
    bookings = [booking("roo", 2, 8), booking("in", 4, 12, gpus=(1,))]
    assert timeline_lines(NODES, bookings, [], **DAY) == list(draw_timeline(NODES, bookings, [], **DAY).lines)


def bar(name: str, first: int, last: int, start_h: float, end_h: float) -> Bar:
    return Bar(booking(name, start_h, end_h), first, last)


@pytest.mark.parametrize(("bars", "lanes"), [
    ([bar("a", 0, 3, 0, 4), bar("b", 4, 6, 4, 7)], [["a", "b"]]),
    ([bar("a", 0, 3, 0, 4), bar("b", 3, 6, 3.5, 7)], [["a"], ["b"]]),  # overlap in time: never one lane
    ([bar("a", 0, 3, 0, 3.5), bar("b", 3, 6, 3.5, 7)], [["a", "b"]]),  # touch in a column: a gives it up
    ([bar("a", 3, 3, 3.1, 3.5), bar("b", 3, 6, 3.5, 7)], [["a"], ["b"]]),  # a has no column to give
    ([bar("a", 0, 9, 0, 10), bar("b", 1, 2, 1, 3), bar("c", 3, 4, 3, 5), bar("d", 2, 5, 2, 6)],
     [["a"], ["b", "c"], ["d"]]),  # first fit: c goes back beside b, d needs a third lane
])
def test_pack_lanes(bars, lanes):
    packed = pack_lanes(bars)
    assert [[b.reservation["name"] for b in lane] for lane in packed] == lanes
    for lane in packed:  # whole bars, one after another
        assert all(before.last < after.first for before, after in zip(lane, lane[1:]))


def test_the_screen_shows_as_much_of_the_key_as_leaves_room_for_the_list():
    drawn = draw_timeline(NODES, [booking(f"name-{i}", i, i + 0.5) for i in range(5)], [], NOW, 1, 40, UTC)
    assert [line.rstrip() for line in drawn.key] == [f"{i + 1}  name-{i}  ws1:0  Fri 20 {9 + i:02}:00–{9 + i:02}:30"
                                                     for i in range(5)]  # bars of one column: all keyed
    lines = timeline_text(drawn, 40, key_rows=3).plain.splitlines()
    assert lines[len(drawn.lines) + 1:] == [*drawn.key[:2], "... 3 more lines of the key: - shows few"]
    assert timeline_text(drawn, 40, key_rows=5).plain.splitlines()[len(drawn.lines) + 1:] == list(drawn.key)
