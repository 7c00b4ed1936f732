"""Actions on jobs through the leader: who may do what, to jobs in which state, and what changes."""

from __future__ import annotations

import pytest

from labq.leader.auth import Principal
from labq.leader.config import LeaderConfig
from labq.leader.core import Leader
from labq.leader.state import AgentSession
from labq.models import JobState, Node
from labq.protocol.errors import ApiError
from labq.protocol.requests import parse_action, parse_submit
from labq.store import MemoryStore
from labq.topologies import parse_sim_spec

ALICE = Principal("user", "alice")
ADMIN = Principal("user", "root", admin=True)


@pytest.fixture
def leader(tmp_path):
    # the lab lets its users ask for high (by default, classes above normal are the admin's to grant)
    made = Leader(LeaderConfig(data_dir=tmp_path, user_max_priority=300), MemoryStore(), clock=lambda: 1000.0)
    inv = parse_sim_spec("sim:ws-4x3090")
    made.state.agents["ws1"] = AgentSession("ws1", Node("ws1", inv.gpus("ws1"), inv.topology, simulated=True), "x", None,
                                      None, last_seen=1000.0)
    return made


def submit(leader: Leader, who: Principal = ALICE, **fields) -> int:
    return leader.queue.submit(who, parse_submit({"command": ["train"], **fields})).id


def act(leader: Leader, job_id: int, who: Principal = ALICE, **body):
    return leader.queue.act(who, job_id, parse_action(body))


def test_edit_changes_gpus_and_time_limit_of_a_queued_job(leader):
    job = submit(leader, gpus=2, time_limit_s=3600)
    edited = act(leader, job, action="edit", gpus=4, time_limit_s=7200)
    assert (edited.spec.gpus, edited.spec.time_limit_s) == (4, 7200)
    assert act(leader, job, action="edit", time_limit_s=0).spec.time_limit_s is None  # 0 removes it
    with pytest.raises(ApiError, match="could never run so"):
        act(leader, job, action="edit", gpus=8)
    assert leader.state.jobs[job].spec.gpus == 4  # a refused edit changes nothing
    with pytest.raises(ApiError, match="edit needs gpus or time_limit_s"):
        act(leader, job, action="edit")


def test_only_admins_move_jobs_to_the_top_and_it_goes_ahead_of_every_queued_job(leader):
    first = submit(leader, priority="high")
    mine = submit(leader)
    with pytest.raises(ApiError, match="only admins"):
        act(leader, mine, action="top")
    moved = act(leader, mine, ADMIN, action="top")
    assert moved.spec.priority == 301 and moved.spec.priority > leader.state.jobs[first].spec.priority


def test_preempting_by_hand_is_for_admins_and_running_jobs(leader):
    job = submit(leader)
    with pytest.raises(ApiError, match="only a running job"):
        act(leader, job, ADMIN, action="preempt")
    leader.state.jobs[job] = leader.state.jobs[job].evolve(state=JobState.RUNNING, started_at=900.0)
    with pytest.raises(ApiError, match="only admins"):
        act(leader, job, action="preempt")
    done = act(leader, job, ADMIN, action="preempt")
    assert done.state is JobState.PREEMPTING and done.preempted_for is None


def test_running_jobs_cannot_be_edited_or_moved(leader):
    job = submit(leader)
    leader.state.jobs[job] = leader.state.jobs[job].evolve(state=JobState.RUNNING, started_at=900.0)
    with pytest.raises(ApiError, match="only a queued or held job can be edited"):
        act(leader, job, action="edit", gpus=1)
    with pytest.raises(ApiError, match="only a queued job can move"):
        act(leader, job, ADMIN, action="top")


def test_classes_above_normal_need_the_admins_grant_at_submit_and_in_a_change(tmp_path):
    config = LeaderConfig(data_dir=tmp_path, class_grants={300: ("alice",)})  # user_max_priority: normal
    lab = Leader(config, MemoryStore(), clock=lambda: 1000.0)
    bob = Principal("user", "bob")
    assert submit(lab, priority="high") > 0  # granted to alice
    with pytest.raises(ApiError, match=r"priority high is for admins and those they grant it "
                                       r"\(scheduling.class_grants\); the highest for bob is normal"):
        submit(lab, bob, priority="high")
    mine = submit(lab, bob)
    with pytest.raises(ApiError, match="the highest for you is normal"):
        act(lab, mine, bob, action="prio", by=100)
    assert act(lab, mine, bob, action="prio", by=-100).spec.priority == 100  # down is always allowed
    theirs = submit(lab)
    assert act(lab, theirs, action="prio", priority="high").spec.priority == 300
    assert submit(lab, ADMIN, priority="urgent") > 0
