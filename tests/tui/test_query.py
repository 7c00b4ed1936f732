"""The queue table's rows, filters and sorting, as pure functions."""

from __future__ import annotations

import pytest

from labq.models import JobState, Node
from labq.models.decisions import Pending, PendingReason
from labq.protocol.codec import encode_job, encode_pending
from labq.tui.query import make_row, parse_filter, view
from tests.conftest import NOW, JobFactory, make_node


@pytest.fixture
def rows():
    jobs = JobFactory()
    ws1: Node = make_node("ws1", "sim:ws-4x3090")
    ws2: Node = make_node("ws2", "sim:ws-4x3090")
    made = [
        jobs.running(ws1, (0, 1), user="alice", name="bert-large"),
        jobs.running(ws2, (2,), user="bob", priority=300),
        jobs.queued(4, user="alice", priority=100),
        jobs.queued(1, user="carol", state=JobState.HELD),
    ]
    waits = {made[2].id: Pending(made[2].id, PendingReason.RESOURCES, "needs 4 GPUs", None, NOW + 600)}
    return {j.id: make_row(encode_job(j), encode_pending(waits.get(j.id)), NOW) for j in made}


@pytest.mark.parametrize(("text", "expected"), [
    ("", [1, 2, 3, 4]),
    ("user:alice", [1, 3]),
    ("!user:alice", [2, 4]),
    ("state:run", [1, 2]),
    ("state:held", [4]),
    ("node:ws2", [2]),
    ("class:low", [3]),
    ("bert", [1]),
    ("name:bert", [1]),
    ("user:alice !state:queued", [1]),
    ("needs 4", [3]),  # every word must be somewhere in the row
    ("needs bert", []),
    ("needs", [3]),
    ("id:4", [4]),
])
def test_filters(rows, text, expected):
    assert view(rows, parse_filter(text), 0, False) == expected


def test_unknown_fields_are_named():
    with pytest.raises(ValueError, match="unknown filter colour:"):
        parse_filter("colour:red")


def test_sorting_by_a_column_and_reversed(rows):
    assert view(rows, parse_filter(""), 1, False) == [1, 3, 2, 4]  # by user, ties by id
    assert view(rows, parse_filter(""), 4, False) == [2, 1, 4, 3]  # by class, highest first
    assert view(rows, parse_filter(""), 5, True) == [3, 1, 2, 4]  # most GPUs first


def test_rows_say_where_and_why(rows):
    assert rows[1].cells[6] == "ws1:0,1" and rows[1].cells[3] == "running"
    assert rows[3].cells[8] == "est. 10m  Resources: needs 4 GPUs"
    assert rows[2].cells[4] == "high"


def test_the_columns_fit_80_columns_with_room_for_the_reason():
    from labq.tui.job_table import MIN_REASON, NARROW, WIDTHS, widths_for

    def used(widths):
        return sum(widths) + len(widths) - 1  # a space between columns

    assert used(widths_for(80)) == 80 and widths_for(80)[-1] >= MIN_REASON
    assert widths_for(140)[:-1] == WIDTHS[:-1] and used(widths_for(140)) == 140
    assert widths_for(400) == WIDTHS  # the reason stops growing
    for columns in range(40, 200):
        widths = widths_for(columns)
        assert all(w >= n for w, n in zip(widths, NARROW)) and widths[-1] >= MIN_REASON
        if columns < 80:
            assert used(widths) == 80  # narrower: the table scrolls sideways
        else:
            assert used(widths) == columns or widths[-1] == WIDTHS[-1]


def test_an_arrays_task_shows_as_array_dot_index_and_sorts_by_its_job_id():
    task = JobFactory().queued(1, array_id=12, array_index=3, array_cap=2)
    row = make_row(encode_job(task), None, NOW)
    assert row.cells[0] == "12.3" and row.job_id == task.id


def test_an_arrays_tasks_that_wait_alike_fold_into_one_row_until_expanded():
    from labq.tui.query import fold

    jobs = JobFactory()
    ws1 = make_node("ws1", "sim:ws-4x3090")
    made = [jobs.running(ws1, (0,), array_id=12, array_index=0)]
    made += [jobs.queued(1, array_id=12, array_index=i) for i in range(1, 5)]
    made += [jobs.queued(1, state=JobState.HELD, array_id=12, array_index=5), jobs.queued(1)]
    capped = Pending(0, PendingReason.ARRAY_LIMIT, "1 of array 12's tasks are on GPUs", None, None)
    waits = {j.id: capped._replace(job_id=j.id) for j in made[1:5]}
    waits[made[4].id] = Pending(made[4].id, PendingReason.RESOURCES, "needs a GPU", None, NOW + 60)
    rows = {j.id: make_row(encode_job(j), encode_pending(waits.get(j.id)), NOW) for j in made}
    ids = [j.id for j in made]
    shown, folded = fold(ids, rows, set())
    # the running task, tasks 1-3 as one row, task 4 (another reason), the held task, the plain job
    assert shown == [ids[0], ids[1], ids[4], ids[5], ids[6]]
    assert folded == {ids[1]: [ids[1], ids[2], ids[3]]}
    assert fold(ids, rows, {12}) == (ids, {})
