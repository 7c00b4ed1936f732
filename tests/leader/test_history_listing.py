"""Finished jobs are listed (``ls --history``), shown (``labq show``) and cleaned (``labq clean``) from the
archive's heads, and only the jobs a page shows are read whole: at 100,000 archived jobs each of these decoded the
whole archive (2-5 s a request).

A leader on a real TinyDB store that fails if anything decodes the whole archive, and a fake clock."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from labq.leader.auth import Principal
from labq.models import transitions as t
from labq.protocol.errors import ApiError
from labq.store import TinyDBStore
from tests.leader.answers import WAIT_S
from tests.leader.labs import leader_with_ws1
from tests.leader.test_queue_habits import end, submit

ALICE = Principal("user", "alice")
BOB = Principal("user", "bob")


class PageReads(TinyDBStore):
    """A store that refuses to decode the whole archive, and keeps which archived jobs were read whole."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read_whole: list[list[int]] = []
        #: once, after the next commit is written (the leader stages its changes), from another thread
        self.after_commit: Callable[[], None] | None = None

    def stage(self, changes):
        staged = super().stage(changes)
        if self.after_commit is not None:
            then, self.after_commit = self.after_commit, None
            looker = threading.Thread(target=then)
            looker.start()
            looker.join(WAIT_S)
            assert not looker.is_alive(), "the look waited for the change"
        return staged

    def history(self, *args, **kwargs):
        raise AssertionError("the whole archive was decoded")

    def archived(self, job_ids):
        job_ids = sorted(job_ids)
        self.read_whole.append(job_ids)
        return super().archived(job_ids)


@pytest.fixture
def lab(tmp_path):
    """Alice's jobs a-f ended out of id order (b and e failed) and g waits; Bob's h ended."""
    store = PageReads(tmp_path / "data")
    leader, clock = leader_with_ws1(tmp_path, store)
    a, b, c, d, e, f = (submit(leader) for _ in range(6))
    h = submit(leader, BOB)
    for job_id, code, at in ((a, 0, 1300.0), (b, 1, 1100.0), (c, 0, 1600.0), (d, 0, 1200.0), (e, 1, 1500.0),
                             (f, 0, 1400.0), (h, 0, 1700.0)):
        end(leader, job_id, code, at)
    g = submit(leader)
    store.read_whole.clear()
    yield leader, store, clock, dict(zip("abcdefgh", (a, b, c, d, e, f, g, h)))
    leader.stop()
    store.close()


def listed(leader, who=ALICE, **kw) -> list[int]:
    found = leader.queue.visible(who, user=kw.pop("user", None), states=kw.pop("states", ()),
                                 everyone=kw.pop("everyone", False), history=kw.pop("history", False),
                                 limit=kw.pop("limit", None), **kw)
    return [job.id for job in found.jobs]


def test_a_listing_of_finished_jobs_reads_only_its_page_whole(lab):
    leader, store, _, j = lab
    assert listed(leader, finished=True, limit=2) == [j["e"], j["c"]]  # the two of hers that ended last
    assert store.read_whole == [sorted([j["c"], j["e"]])]
    store.read_whole.clear()

    assert listed(leader, history=True, limit=3) == [j["e"], j["f"], j["g"]]  # by id, with her waiting job
    assert store.read_whole == [sorted([j["e"], j["f"]])]

    assert listed(leader, history=True, after=j["a"], limit=2) == [j["b"], j["c"]]
    assert listed(leader, history=True, everyone=True, states=("failed",)) == [j["b"], j["e"]]
    assert listed(leader, history=True, everyone=True, states=("succeeded",), user="bob") == [j["h"]]
    assert listed(leader, history=True, everyone=True, ids=(j["d"], j["g"], j["h"])) == [j["d"], j["h"], j["g"]]
    assert listed(leader, history=True, ids=(j["d"], j["g"], j["h"])) == [j["d"], j["g"]]  # h is Bob's
    found = leader.queue.visible(ALICE, user=None, states=(), everyone=False, history=False, limit=2, finished=True)
    assert found.total == 6 and found.jobs[-1].exit_code == 0 and found.jobs[-1].ended_at == 1600.0


def test_show_and_clean_read_one_job_whole_or_none(lab):
    leader, store, clock, j = lab
    job, pending = leader.queue.job(ALICE, j["b"])
    assert (job.id, job.state.value, job.exit_code, pending) == (j["b"], "failed", 1, None)
    assert store.read_whole == [[j["b"]]]
    store.read_whole.clear()
    for never in (0, -3, j["g"] + 1, 10**9):  # never handed out: nothing is read
        with pytest.raises(ApiError, match=f"there is no job {never}"):
            leader.queue.job(ALICE, never)
    assert store.read_whole == []

    clock.now = 1450.0
    assert leader.queue.clean(ALICE) == (1450.0, 4)  # a, b, d and f ended by then
    assert listed(leader, finished=True) == [j["e"], j["c"]]
    assert leader.queue.clean(BOB) == (1450.0, 0)  # h ended later
    assert store.read_whole == [sorted([j["c"], j["e"]])]


def test_a_job_archived_while_a_listing_is_taken_is_listed_once_as_it_ended(lab):
    leader, store, _, j = lab
    leader.scheduling.schedule_pass()  # places g
    seen = {}

    def look() -> None:  # its commit is written; the leader has not taken it in yet
        assert leader.state.jobs[j["g"]].state.value == "starting"
        for states in (("failed",), ()):
            found = leader.queue.visible(ALICE, user=None, states=states, everyone=False, history=True, limit=None)
            seen[states] = [(job.id, job.state.value) for job in found.jobs if job.id == j["g"]], found.total

    store.after_commit = look
    with leader.state.lock:
        job = leader.state.jobs[j["g"]]
        leader.state.apply([t.exited(t.running(job, 1790.0), 1, 1800.0)])
    assert seen == {("failed",): ([(j["g"], "failed")], 3), (): ([(j["g"], "failed")], 7)}


def test_an_archived_job_whose_line_is_damaged_past_its_head_is_not_listed_nor_counted(lab, tmp_path):
    leader, store, _, j = lab
    month = next((tmp_path / "data" / "archive").glob("jobs-*.jsonl"))
    text = month.read_bytes()
    head = b'{"seq":'
    lines = text.split(b"\n")
    damaged = [line.replace(b'"placement":', b'"placement":nul\xff,"x":') if b'"job":{"id":%d,' % j["c"] in line
               else line for line in lines]
    assert damaged != lines and all(line.startswith(head) for line in damaged if line)
    month.write_bytes(b"\n".join(damaged))
    found = leader.queue.visible(ALICE, user=None, states=(), everyone=False, history=False, limit=2, finished=True)
    assert [job.id for job in found.jobs] == [j["f"], j["e"]] and found.total == 5  # as history, without c
    assert [e.id for e in store.ended("alice")] == [j[x] for x in "abcdef"]  # its head and times are whole
