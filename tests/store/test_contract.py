"""The store's rules, for every store."""

from __future__ import annotations

import threading

import pytest

from labq.store import DeleteJob, DeleteRecord, InvalidChange, PutJob, PutRecord, PutTasks
from labq.store.contract import Ids
from tests.store.conftest import job


def test_a_new_store_is_empty_and_starts_ids_at_one(store):
    state = store.load()
    assert state.jobs == {} and state.records == {} and state.next_job_id == 1 and state.seq == 0


def test_commits_are_applied_and_numbered(store):
    assert store.commit([PutJob(job(1))]) == 1
    assert store.commit([PutJob(job(2)), PutRecord("reservations", "paper", {"gpus": 4})]) == 2
    state = store.load()
    assert sorted(state.jobs) == [1, 2] and state.jobs[1]["state"] == "queued"
    assert state.records == {"reservations": {"paper": {"gpus": 4}}}
    assert state.next_job_id == 3 and state.seq == 2


def test_state_survives_a_restart(stores):
    store = stores.open()
    store.commit([PutJob(job(1)), PutJob(job(2, "running"))])
    store.commit([PutRecord("users", "alice", {"admin": True})])
    state = stores.reopen().load()
    assert state.jobs[2]["state"] == "running" and state.records["users"]["alice"] == {"admin": True}


def test_a_commit_is_all_or_nothing(store):
    store.commit([PutJob(job(1))])
    with pytest.raises(InvalidChange, match="no job 9"):
        store.commit([PutJob(job(2)), DeleteJob(9)])
    state = store.load()
    assert sorted(state.jobs) == [1] and state.next_job_id == 2 and state.seq == 1


def test_finished_jobs_leave_the_hot_state_for_history(store):
    store.commit([PutJob(job(1)), PutJob(job(2))])
    store.commit([PutJob(job(1, "succeeded", ended_at=1_700_000_000.0))])
    assert sorted(store.load().jobs) == [2]
    assert [d["id"] for d in store.history()] == [1]
    assert store.history()[0]["state"] == "succeeded"


def test_ends_say_how_each_archived_job_ended_and_a_deletion_forgets_it(stores):
    store = stores.open()
    store.commit([PutJob(job(i)) for i in (1, 2, 3, 4)])
    store.commit([PutJob(job(1, "succeeded", ended_at=1_700_000_000.0)),
                  PutJob(job(2, "failed", ended_at=1_700_000_000.0))])
    store.commit([PutJob(job(3, "cancelled", ended_at=1_703_000_000.0)), DeleteJob(2)])
    store = stores.reopen()
    assert dict(store.ends()) == {1: "succeeded", 2: None, 3: "cancelled"}  # in order: the last of each job says


def test_array_history_is_the_history_of_those_arrays_tasks_alone(stores):
    store = stores.open()

    def task(job_id: int, array_id: int, index: int, state: str = "queued", **extra) -> dict:
        return job(job_id, state, **extra) | {"spec": {"user": "alice", "gpus": 1,
                                                       "array": {"id": array_id, "index": index}}}

    store.commit([PutJob(task(11, 10, 0)), PutJob(task(12, 10, 1)), PutJob(task(21, 20, 0)), PutJob(job(10)),
                  PutJob(job(13))])
    store.commit([PutJob(task(i, a, x, "succeeded", ended_at=1_700_000_000.0))
                  for i, a, x in ((11, 10, 0), (12, 10, 1), (21, 20, 0))]
                 + [PutJob(job(10, "failed", ended_at=1_700_000_000.0)), DeleteJob(13)])
    store.commit([DeleteJob(12)])
    store = stores.reopen()
    assert sorted(d["id"] for d in store.array_history([10])) == [11]  # job 10 itself is no task; 12 was deleted
    assert sorted(d["id"] for d in store.array_history([10, 20])) == [11, 21]
    assert store.array_history([30]) == []


def test_ended_lists_the_last_version_of_each_archived_job_and_archived_reads_those_asked_for(stores):
    store = stores.open()
    store.commit([PutJob(job(i, user=("alice", "bob", 'd"é')[i % 3])) for i in (1, 2, 3, 4, 5)])
    store.commit([PutJob(job(1, "succeeded", user="bob", ended_at=1_700_000_000.0)),
                  PutJob(job(2, "failed", user='d"é', ended_at=1_700_000_100.5)),
                  PutJob(job(3, "cancelled", user='d"é'))])  # ended with no time: an older labq's
    store.commit([DeleteJob(2), PutJob(job(4, "cancelled", user="bob", ended_at=1_703_000_000.0))])
    store = stores.reopen()
    assert sorted(store.ended()) == [(1, "succeeded", "bob", 1_700_000_000.0), (3, "cancelled", 'd"é', None),
                                     (4, "cancelled", "bob", 1_703_000_000.0)]
    assert sorted(store.ended("bob")) == [(1, "succeeded", "bob", 1_700_000_000.0), (4, "cancelled", "bob", 1.703e9)]
    assert store.ended('d"é') == [(3, "cancelled", 'd"é', None)] and store.ended("carol") == []
    docs = store.archived([4, 2, 5, 99, 1])  # 2 was deleted; 5 is unfinished; 99 was never a job
    assert sorted(docs) == [1, 4] and docs[4] == job(4, "cancelled", user="bob", ended_at=1_703_000_000.0)
    assert store.archived([]) == {}


def test_history_filters_by_end_time_across_months(stores):
    store = stores.open()
    ends = {1: 1_696_118_400.0, 2: 1_698_796_800.0, 3: 1_701_388_800.0}  # 1 Oct, 1 Nov, 1 Dec 2023
    store.commit([PutJob(job(i)) for i in ends])
    store.commit([PutJob(job(i, "failed", ended_at=t)) for i, t in ends.items()])
    store = stores.reopen()
    assert sorted(d["id"] for d in store.history()) == [1, 2, 3]
    assert sorted(d["id"] for d in store.history(since=ends[2])) == [2, 3]
    assert sorted(d["id"] for d in store.history(since=ends[1], until=ends[3])) == [1, 2]


def test_ids_are_never_reused_after_deleting_the_newest_job(stores):
    store = stores.open()
    store.commit([PutJob(job(1)), PutJob(job(2)), PutJob(job(3))])
    store.commit([DeleteJob(3)])
    store = stores.reopen()
    assert store.load().next_job_id == 4
    with pytest.raises(InvalidChange, match="never reused"):
        store.commit([PutJob(job(3))])
    store.commit([PutJob(job(4, "succeeded"))])  # straight to history
    store.commit([DeleteJob(4)])
    store = stores.reopen()
    assert store.load().next_job_id == 5
    assert store.history() == []  # the deleted archived job is gone from history too


def test_finished_jobs_cannot_be_brought_back(store):
    store.commit([PutJob(job(1, "cancelled"))])
    with pytest.raises(InvalidChange, match="no longer active"):
        store.commit([PutJob(job(1))])


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ([], "at least one change"),
        ([PutJob({"state": "queued"})], "integer id"),
        ([PutJob({"id": 0, "state": "queued"})], "integer id of 1 or more"),
        ([PutJob({"id": True, "state": "queued"})], "integer id"),
        ([PutJob({"id": 1, "state": "sleeping"})], "unknown state 'sleeping'"),
        ([PutJob(["not", "a", "dict"])], "JSON object"),
        ([DeleteJob(1)], "no job 1"),
        ([PutRecord("jobs", "x", {})], "bad table name"),
        ([PutRecord("Bad-Name", "x", {})], "bad table name"),
        ([PutRecord("users", "", {})], "non-empty string key"),
        ([PutRecord("users", "bob", "admin")], "JSON object"),
        ([DeleteRecord("users", "nobody")], "no users record 'nobody'"),
        (["drop table"], "not a store change"),
    ],
)
def test_bad_changes_are_refused_with_a_reason(store, changes, words):
    with pytest.raises(InvalidChange, match=words):
        store.commit(changes)
    assert store.load().seq == 0


def test_records_can_be_replaced_and_deleted(stores):
    store = stores.open()
    store.commit([PutRecord("reservations", "paper", {"gpus": 4})])
    store.commit([PutRecord("reservations", "paper", {"gpus": 2}), PutRecord("reservations", "demo", {"gpus": 1})])
    store.commit([DeleteRecord("reservations", "demo")])
    assert stores.reopen().load().records == {"reservations": {"paper": {"gpus": 2}}}


def test_concurrent_commits_all_land_and_a_bad_one_fails_alone(store):
    errors = []

    def submit(i: int) -> None:
        try:
            store.commit([PutJob(job(i))] if i != 13 else [DeleteJob(999)])
        except InvalidChange as err:
            errors.append((i, err))

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(1, 33)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert [i for i, _ in errors] == [13]
    assert sorted(store.load().jobs) == [i for i in range(1, 33) if i != 13]


def test_ids_handed_out_together_may_commit_in_any_order(stores):
    store = stores.open()
    store.commit([PutJob(job(2))])
    store.commit([PutJob(job(1))])  # allocated before 2, committed after it
    store.commit([PutJob(job(4))])  # 3 was handed out and its submit failed
    store = stores.reopen()
    if stores.kind == "tinydb":  # after a restart, an id never committed is spent
        with pytest.raises(InvalidChange, match="never reused"):
            store.commit([PutJob(job(3))])
    assert store.load().next_job_id == 5


# -- an array's tasks, told as their differences (PutTasks) ------------------------------------------------------


def task(job_id: int, index: int = 0) -> dict:
    return {"id": job_id, "state": "queued", "spec": {"user": "alice", "gpus": 1, "command": ["train", str(index)],
                                                      "env": {"I": str(index)}, "array": {"id": 9, "index": index}}}


def test_an_arrays_tasks_are_made_whole_and_survive_a_restart(stores):
    store = stores.open()
    store.commit([PutTasks(task(10), [(10 + i, ["train", str(i)], {"I": str(i)}, i) for i in range(1, 5)])])
    for state in (store.load(), stores.reopen().load()):
        assert state.jobs == {10 + i: task(10 + i, i) for i in range(5)} and state.next_job_id == 15


def test_later_changes_in_the_commit_that_made_the_tasks_win(stores):
    store = stores.open()
    store.commit([PutTasks(task(1), [(2, ["train", "1"], [("I", "1")], 1), (3, ["train", "2"], {"I": "2"}, 2)]),
                  PutJob(task(2, 1) | {"state": "held"}), DeleteJob(3)])
    state = stores.reopen().load()
    assert state.jobs == {1: task(1), 2: task(2, 1) | {"state": "held"}} and state.next_job_id == 4


@pytest.mark.parametrize(("changes", "words"), [
    ([PutTasks(task(1), [(1, ["x"], {}, 1)])], "ids of their own, each once"),
    ([PutTasks(task(1), [(2, ["x"], {}, 1), (2, ["x"], {}, 2)])], "ids of their own, each once"),
    ([PutJob(task(2)), PutTasks(task(1), [(2, ["x"], {}, 1)])], "job 2 exists already"),
    ([PutTasks(task(1), [(2, "train", {}, 1)])], "command is words"),
    ([PutTasks(task(1), [(2, ["train", 3], {}, 1)])], "command is words"),
    ([PutTasks(task(1), [(2, ["x"], {"A": 1}, 1)])], "environment names to words"),
    ([PutTasks(task(1), [(2, ["x"], "A=1", 1)])], "environment names to words"),
    ([PutTasks(task(1), [(2, ["x"], {}, -1)])], "index a whole number"),
    ([PutTasks(task(1), [(0, ["x"], {}, 1)])], "integer id of 1 or more"),
    ([PutTasks(task(1), [(2, ["x"], {})])], r"\(id, command, environment, index\)"),
    ([PutTasks({"id": 1, "state": "queued", "spec": {}}, [])], "needs spec.array"),
    ([PutTasks(task(1) | {"state": "succeeded"}, [])], "not finished"),
])
def test_bad_tasks_are_refused_with_a_reason_and_store_nothing(store, changes, words):
    with pytest.raises(InvalidChange, match=words):
        store.commit(changes)
    assert store.load().seq == 0 and store.load().jobs == {}


def test_tasks_of_a_job_that_is_gone_cannot_come_back(store):
    store.commit([PutJob(task(1)), PutJob(task(2))])
    store.commit([PutJob(task(2) | {"state": "cancelled", "ended_at": 1_700_000_000.0})])
    with pytest.raises(InvalidChange, match="job 2 has ended: job ids are never reused"):
        store.commit([PutTasks(task(3), [(2, ["x"], {}, 1)])])


def test_spent_ids_are_a_mark_an_id_from_the_floor_on():
    ids = Ids(hot={5, 120}, next_job_id=200, floor=100)
    ids.spend([5, 100, 150])  # below the floor, the hot set alone says (5 is still in it)
    assert [i for i in (4, 5, 99, 100, 101, 120, 150, 151, 10**6) if ids.is_spent(i)] == [4, 99, 100, 150]
    assert len(ids.spent) < 100  # a byte an id handed out since the store opened, not a set's entry
