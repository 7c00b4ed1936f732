"""What depends on finished jobs that ended before the leader started (``--after`` an old job, a waiting job loaded
at a restart) reads the archive once, outside the lab's locks: whoever only looks, or makes another change, is
answered meanwhile, and what finishes meanwhile is kept.

A leader on a real TinyDB store whose archive read (``Store.ends``) the test holds, and a fake clock."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable

import pytest

from labq.leader.auth import Principal
from labq.leader.finished import FinishedStates
from labq.models import JobState
from labq.protocol import errors
from labq.protocol.requests import parse_submit
from labq.store import TinyDBStore
from tests.leader import answers
from tests.leader.answers import WAIT_S, in_thread
from tests.leader.labs import leader_with_ws1
from tests.leader.test_queue_habits import act, end, submit

ALICE = Principal("user", "alice")


class HeldArchive(TinyDBStore):
    """A store whose archive read waits, once it has begun, until the test lets it go; it counts the reads, and
    fails them with EIO while ``failing``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reading, self.go, self.reads, self.failing = threading.Event(), threading.Event(), 0, False

    def history(self, *args, **kwargs):
        raise AssertionError("the whole archive was decoded")

    def ends(self):
        self.reads += 1
        self.reading.set()
        assert self.go.wait(30), "the test never let the archive go"
        if self.failing:
            raise OSError(errno.EIO, "Input/output error")
        yield from super().ends()


def answered(call: Callable[[], object]) -> object:
    return answers.answered(call, "it waited for the archive being read")


@pytest.fixture
def restarted(tmp_path):
    """A lab whose jobs 1 (succeeded) and 2 (failed) ended, and whose 3 waits for 1 (``--after``); restarted on a
    store whose archive read the test holds."""
    first, clock = leader_with_ws1(tmp_path, TinyDBStore(tmp_path / "data"))
    done, failed = submit(first, gpus=4), submit(first, gpus=4)
    waiting = submit(first, depends_on=[done])
    end(first, done, 0, clock.now)
    end(first, failed, 1, clock.now + 1)  # a pass placed it: and none since, so 3 still waits at the restart
    assert first.state.jobs[waiting].state is JobState.QUEUED
    first.stop()
    first.state.store.close()
    store = HeldArchive(tmp_path / "data")
    leader, clock = leader_with_ws1(tmp_path, store)
    yield leader, store, (done, failed, waiting)
    store.go.set()
    leader.stop()
    store.close()


def look(leader):
    return [j.id for j in leader.queue.visible(ALICE, user=None, states=(), everyone=True, history=False,
                                               limit=None).jobs]


def test_a_submit_after_an_old_job_reads_the_archive_while_looks_and_changes_are_answered(restarted):
    leader, store, (done, failed, waiting) = restarted
    dependent, out = in_thread(lambda: submit(leader, depends_on=[done]))
    assert store.reading.wait(WAIT_S), "the submit never read the archive"
    assert answered(lambda: look(leader)) == [waiting]
    other = answered(lambda: submit(leader))  # a submit that depends on nothing
    assert answered(lambda: act(leader, other, action="cancel")).state is JobState.CANCELLED  # a change
    assert dependent.is_alive(), "the submit came back before the archive was read"
    store.go.set()
    dependent.join(WAIT_S)
    assert leader.state.jobs[out["value"]].spec.depends_on == (done,)
    with pytest.raises(errors.ApiError, match=f"job {failed} ended failed"):
        submit(leader, depends_on=[failed])  # known now: the archive is not read again
    with pytest.raises(errors.ApiError, match="job 999 does not exist"):
        submit(leader, depends_on=[999])  # an id never handed out: no array's, and the archive is not read for it
    assert store.reads == 1
    finished = leader.state.finished
    assert (finished[done], finished[failed], finished[other]) == (JobState.SUCCEEDED, JobState.FAILED,
                                                                   JobState.CANCELLED)


def test_a_pass_reads_the_archive_for_a_waiting_job_before_it_takes_the_lock(restarted):
    leader, store, (done, failed, waiting) = restarted
    passing, _ = in_thread(leader.scheduling.schedule_pass)
    assert store.reading.wait(WAIT_S), "the pass never read the archive"
    assert answered(lambda: look(leader)) == [waiting]
    mine = answered(lambda: submit(leader))
    assert answered(lambda: act(leader, mine, action="hold")).state is JobState.HELD
    store.go.set()
    passing.join(WAIT_S)
    assert not passing.is_alive()
    job = leader.state.jobs[waiting]
    assert job.state is JobState.STARTING and job.placement is not None  # its dependency succeeded: it starts
    assert store.reads == 1


def test_jobs_that_finish_while_the_archive_is_read_are_kept_over_what_it_read(restarted):
    leader, store, (done, failed, waiting) = restarted
    reading, _ = in_thread(lambda: submit(leader, depends_on=[done]))
    assert store.reading.wait(WAIT_S)
    answered(lambda: act(leader, waiting, action="cancel"))  # ends while the archive (without it) is read
    store.go.set()
    reading.join(WAIT_S)
    assert leader.state.finished[waiting] is JobState.CANCELLED
    assert leader.state.finished[done] is JobState.SUCCEEDED


def test_an_archive_that_cannot_be_read_refuses_a_submit_after_an_old_job_and_the_next_one_reads_it(restarted):
    leader, store, (done, failed, waiting) = restarted
    store.go.set()
    store.failing = True
    with pytest.raises(errors.ApiError, match="could not be looked up.*Input/output error.*nothing was submitted") \
            as caught:
        submit(leader, depends_on=[done])
    assert caught.value.status == 503
    store.failing = False
    assert leader.state.jobs[submit(leader, depends_on=[done])].spec.depends_on == (done,)
    assert store.reads == 2


def test_a_pass_that_cannot_read_the_archive_leaves_the_waiting_job_waiting_and_starts_the_others(restarted):
    leader, store, (done, failed, waiting) = restarted
    store.go.set()
    store.failing = True
    other = submit(leader)
    leader.scheduling.schedule_pass()
    assert leader.state.jobs[waiting].state is JobState.QUEUED  # not cancelled for a job that "does not exist"
    assert leader.state.jobs[other].state is JobState.STARTING
    store.failing = False
    leader.scheduling.schedule_pass()  # the next pass reads it: the job that succeeded lets the waiting one start
    assert leader.state.jobs[waiting].state is JobState.STARTING
    assert done in leader.state.finished and store.reads == 2


def test_an_array_whose_last_task_ends_while_the_archive_cannot_be_read_still_ends(tmp_path):
    first, clock = leader_with_ws1(tmp_path, TinyDBStore(tmp_path / "data"))
    array_id, tasks = first.queue.submit_sweep(ALICE, parse_submit({"command": ["t", "{index}"], "gpus": 4,
                                                                   "array": "0-1"}))
    end(first, tasks[0].id, 0, clock.now)
    first.stop()
    first.state.store.close()
    store = HeldArchive(tmp_path / "data")
    store.go.set()
    store.failing = True
    leader, clock = leader_with_ws1(tmp_path, store)
    try:
        end(leader, tasks[1].id, 0, clock.now)  # its notice counts what it knows: the end is taken in all the same
        assert leader.state.finished[tasks[1].id] is JobState.SUCCEEDED and store.reads == 1
        assert array_id not in leader.state.arrays
    finally:
        leader.stop()
        store.close()


def test_finished_states_keep_a_byte_a_job_and_read_the_last_end_of_each():
    known = FinishedStates()
    known[3] = JobState.FAILED  # seen to finish by this leader: over what the archive says
    known[200_000] = JobState.SUCCEEDED
    codes = known.read([(1, "succeeded"), (2, "failed"), (1, None), (100_000, "cancelled"), (2, "succeeded"),
                        (3, "succeeded")])
    known.take(codes)
    assert dict(known) == {2: JobState.SUCCEEDED, 3: JobState.FAILED, 100_000: JobState.CANCELLED,
                           200_000: JobState.SUCCEEDED}
    assert 1 not in known and known.get(1) is None and len(known) == 4 and known.loaded
    assert len(known._codes) < 2 * 200_000  # a byte a job id, not a dict's entry
