"""The queue as Slurm and pueue users expect it: relative priorities, edits, dependencies refused or ended
with a reason, restart, clean, and the history listing. A leader on a fake clock with a memory store; jobs
end through the leader's own ``LabState.apply``, as an agent's report would end them."""

from __future__ import annotations

import pytest

from labq.leader.auth import Principal
from labq.leader.core import Leader
from labq.models import JobState
from labq.models import transitions as t
from labq.protocol.errors import ApiError
from labq.protocol.requests import parse_action, parse_submit
from labq.store import TinyDBStore
from tests.leader.labs import leader_with_ws1

ALICE = Principal("user", "alice")
BOB = Principal("user", "bob")
ADMIN = Principal("user", "root", admin=True)


@pytest.fixture
def lab(tmp_path):
    leader, clock = leader_with_ws1(tmp_path)
    yield leader, clock
    leader.stop()


def submit(leader: Leader, who: Principal = ALICE, **fields) -> int:
    return leader.queue.submit(who, parse_submit({"command": ["train"], **fields})).id


def act(leader: Leader, job_id: int, who: Principal = ALICE, **body):
    return leader.queue.act(who, job_id, parse_action(body))


def end(leader: Leader, job_id: int, exit_code: int, at: float) -> None:
    """The job ran on ws1 and exited with ``exit_code`` at ``at``."""
    leader.scheduling.schedule_pass()  # places it, as the scheduler thread would
    with leader.state.lock:
        job = leader.state.jobs[job_id]
        assert job.placement is not None, leader.state.pending.get(job_id)
        leader.state.apply([t.exited(t.running(job, at - 10), exit_code, at)])


# -- prio +N / -N, and edit ------------------------------------------------------------------------

def test_prio_plus_ten_raises_the_priority_by_ten_and_minus_lowers_it(lab):
    leader, _ = lab
    job = submit(leader, priority="low")  # 100; users here go up to normal (200)
    assert act(leader, job, action="prio", by=10).spec.priority == 110
    assert act(leader, job, action="prio", by=-60).spec.priority == 50
    with pytest.raises(ApiError, match="outside 0-1000") as caught:
        act(leader, job, action="prio", by=-51)
    assert caught.value.status == 400 and leader.state.jobs[job].spec.priority == 50
    with pytest.raises(ApiError, match="for admins") as caught:
        act(leader, job, action="prio", by=200)  # 250: above normal
    assert caught.value.status == 403
    assert act(leader, job, ADMIN, action="prio", by=200).spec.priority == 250
    assert act(leader, job, action="prio", by=-20).spec.priority == 230  # a user may always go down


def test_a_signed_priority_is_a_change_never_a_value_and_prio_takes_one_of_them():
    assert parse_action({"action": "prio", "by": -5}).by == -5
    for body in ({"action": "prio", "priority": "+10"}, {"action": "prio", "priority": "-5"}, {"action": "prio"},
                 {"action": "prio", "priority": "high", "by": 1}, {"action": "prio", "by": 1001}):
        with pytest.raises(ApiError) as caught:
            parse_action(body)
        assert caught.value.status == 400, body


def test_a_submit_with_a_signed_priority_is_refused_not_read_as_a_value():
    with pytest.raises(ApiError, match="a change such as"):
        parse_submit({"command": ["x"], "priority": "+10"})


def test_edit_renames_and_reprioritises_a_running_job_but_changes_its_gpus_only_while_it_waits(lab):
    leader, _ = lab
    job = submit(leader, name="first", time_limit_s=3600)
    edited = act(leader, job, action="edit", name="second", priority="low", time_limit_s=7200)
    assert (edited.spec.name, edited.spec.priority, edited.spec.time_limit_s) == ("second", 100, 7200)
    leader.state.jobs[job] = leader.state.jobs[job].evolve(state=JobState.RUNNING, started_at=900.0)
    assert act(leader, job, action="edit", name="third").spec.name == "third"
    assert act(leader, job, action="edit", name="").spec.name == ""
    with pytest.raises(ApiError, match="only a queued or held job can be edited") as caught:
        act(leader, job, action="edit", gpus=2)
    assert caught.value.status == 409
    with pytest.raises(ApiError, match="for admins"):
        act(leader, job, action="edit", priority="urgent")
    with pytest.raises(ApiError, match="job name"):
        parse_action({"action": "edit", "name": "two words"})


# -- dependencies ----------------------------------------------------------------------------------

def test_a_dependency_that_does_not_exist_or_already_failed_is_refused_at_submit(lab):
    leader, clock = lab
    failed = submit(leader)
    end(leader, failed, 3, clock.now)
    before = dict(leader.state.jobs)
    for deps, words in (([99999], "job 99999 does not exist"), ([failed], f"job {failed} ended failed")):
        with pytest.raises(ApiError, match=words) as caught:
            submit(leader, depends_on=deps)
        assert (caught.value.status, caught.value.field) == (422, "depends_on")
    assert leader.state.jobs == before
    after_any = submit(leader, depends_on=[failed], after_any=True)  # however it ended: it may start
    assert leader.state.jobs[after_any].spec.after_any


def test_a_dependency_in_the_archive_only_is_found_after_a_restart(tmp_path):
    leader, clock = leader_with_ws1(tmp_path, TinyDBStore(tmp_path))
    failed = submit(leader)
    end(leader, failed, 1, clock.now)
    leader.stop()
    leader.state.store.close()
    again, _ = leader_with_ws1(tmp_path, TinyDBStore(tmp_path))
    try:
        with pytest.raises(ApiError, match=f"job {failed} ended failed"):
            submit(again, depends_on=[failed])
        assert submit(again, depends_on=[failed], after_any=True)
    finally:
        again.stop()
        again.state.store.close()


def test_a_job_whose_dependency_fails_is_cancelled_with_the_reason_unless_it_asked_for_any_end(lab):
    leader, clock = lab
    first = submit(leader, gpus=4)
    after = submit(leader, depends_on=[first])
    chained = submit(leader, depends_on=[after])
    any_end = submit(leader, depends_on=[first], after_any=True)
    end(leader, first, 2, clock.now)
    clock.now += 1
    leader.scheduling.schedule_pass()
    finished = leader.state.finished
    assert finished[after] is JobState.CANCELLED and finished[chained] is JobState.CANCELLED
    archived = {doc["id"]: doc for doc in leader.state.store.history()}
    assert archived[after]["note"] == (f"cancelled: it can never start: job {first} ended failed "
                                       "(--after waits for success; --after-any for any end)")
    assert archived[after]["ended_at"] == clock.now
    assert leader.state.jobs[any_end].state in (JobState.STARTING, JobState.QUEUED)
    assert leader.state.jobs[any_end].placement is not None  # it started, in the same pass


# -- restart, clean, history ----------------------------------------------------------------------

def test_restart_submits_a_finished_job_again_as_a_new_job_of_its_submitter(lab):
    leader, clock = lab
    job = submit(leader, gpus=2, name="bert", time_limit_s=600, env={"K": "v"})
    with pytest.raises(ApiError, match="restart submits a finished job again") as caught:
        leader.queue.restart(ALICE, job)
    assert caught.value.status == 409
    end(leader, job, 1, clock.now)
    with pytest.raises(ApiError, match="only they may restart it") as caught:
        leader.queue.restart(BOB, job)
    assert caught.value.status == 403
    with pytest.raises(ApiError) as caught:
        leader.queue.restart(ALICE, 777)
    assert caught.value.status == 404
    new = leader.queue.restart(ALICE, job)
    old = leader.queue.job(ALICE, job)[0]
    assert new.id > job and new.state is JobState.QUEUED and new.spec == old.spec
    assert new.note == f"restart of job {job}" and new.attempt == 1 and new.history == ()


def test_history_is_finished_jobs_the_limit_that_ended_last_and_clean_hides_what_ended_before_it(lab):
    leader, clock = lab
    ids = [submit(leader) for _ in range(4)]
    for job_id, at in zip(ids, (1300.0, 1100.0, 1400.0, 1200.0)):  # ended out of id order
        end(leader, job_id, 0, at)
    waiting = submit(leader)

    def history(who=ALICE, **kw):
        return [j.id for j in leader.queue.visible(who, user=None, states=(), everyone=False, history=False,
                                                    limit=kw.pop("limit", None), finished=True, **kw)[0]]

    assert history() == [ids[1], ids[3], ids[0], ids[2]]  # by when they ended
    assert history(limit=2) == [ids[0], ids[2]]  # the two that ended last, not the newest ids nor the queued one
    assert waiting not in history()
    clock.now = 1250.0
    assert leader.queue.clean(ALICE) == (1250.0, 2)
    assert history() == [ids[0], ids[2]]
    assert leader.queue.job(ALICE, ids[1])[0].id == ids[1]  # still there for show
    assert leader.queue.clean(ALICE) == (1250.0, 0)
    assert leader.queue.clean(BOB)[1] == 0


def test_clean_is_remembered_across_a_restart(tmp_path):
    leader, clock = leader_with_ws1(tmp_path, TinyDBStore(tmp_path))
    job = submit(leader)
    end(leader, job, 0, clock.now)
    clock.now += 5
    leader.queue.clean(ALICE)
    leader.stop()
    leader.state.store.close()
    again, _ = leader_with_ws1(tmp_path, TinyDBStore(tmp_path))
    try:
        listed = again.queue.visible(ALICE, user=None, states=(), everyone=False, history=True, limit=None)[0]
        assert job not in [j.id for j in listed]
    finally:
        again.stop()
        again.state.store.close()
