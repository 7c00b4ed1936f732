"""A job's life, step by step."""

from __future__ import annotations

from labq.leader import transitions as t
from labq.models import Job, JobSpec, JobState, NodeAllocation, Placement

PLACE = Placement((NodeAllocation("ws1", (0, 1), ("u0", "u1")),))


def job(**kw) -> Job:
    return Job(7, JobSpec(user="alice", command=("train",), gpus=2), submitted_at=100.0, **kw)


def test_a_job_runs_and_ends_by_its_exit_code():
    started = t.running(t.placed(job(), PLACE), 200.0)
    assert started.state is JobState.RUNNING and started.placement == PLACE
    assert t.exited(started, 0, 300.0).state is JobState.SUCCEEDED
    failed = t.exited(started, 3, 300.0)
    assert (failed.state, failed.exit_code, failed.ended_at) == (JobState.FAILED, 3, 300.0)
    assert t.exited(started, None, 300.0).state is JobState.FAILED  # the exit status was lost


def test_stop_requests_decide_how_it_ends():
    running = t.running(t.placed(job(), PLACE), 200.0)
    assert t.exited(running.evolve(stop_requested="cancel"), 143, 300.0).state is JobState.CANCELLED
    assert t.exited(running.evolve(stop_requested="timeout"), 143, 300.0).state is JobState.TIMEOUT


def test_a_preempted_job_comes_back_as_the_same_job():
    running = t.running(t.placed(job(), PLACE), 200.0).evolve(last_checkpoint_at=250.0)
    back = t.exited(t.preempting(running, for_job=9), 0, 290.0)
    assert back.state is JobState.QUEUED and back.id == 7 and back.submitted_at == 100.0
    assert (back.attempt, back.preemptions, back.placement, back.preempted_for) == (2, 1, None, None)
    assert back.work_lost_s == 40.0  # since the checkpoint at 250
    cancelled = t.exited(t.preempting(running, 9).evolve(stop_requested="cancel"), 0, 290.0)
    assert cancelled.state is JobState.CANCELLED  # a cancel during preemption wins


def test_gpu_hours_count_the_current_attempt():
    running = t.running(t.placed(job(), PLACE), 0.0)
    assert t.gpu_hours(running, 1800.0) == 1.0  # 2 GPUs for half an hour
    assert t.gpu_hours(job(), 1800.0) == 0.0



def test_fair_share_counts_running_work_of_users_with_no_history(tmp_path):
    from labq.leader.config import LeaderConfig
    from labq.leader.core import AgentSession, Leader
    from labq.models import Node
    from labq.protocol.codec import encode_job
    from labq.store import MemoryStore, PutJob
    from labq.topologies import parse_sim_spec

    inv = parse_sim_spec("sim:flat:2")
    node = Node("ws1", inv.gpus("ws1"), inv.topology, simulated=True)
    on_gpu0 = Placement((NodeAllocation("ws1", (0,), (node.gpus[0].uuid,)),))
    running = Job(1, JobSpec(user="newcomer", command=("train",)), submitted_at=0.0, state=JobState.RUNNING,
                  placement=on_gpu0, started_at=0.0)  # two GPU-hours by now, nothing finished yet
    newcomer = Job(2, JobSpec(user="newcomer", command=("x",)), submitted_at=10.0)
    veteran = Job(3, JobSpec(user="veteran", command=("x",)), submitted_at=20.0)
    store = MemoryStore()
    store.commit([PutJob(encode_job(j)) for j in (running, newcomer, veteran)])
    leader = Leader(LeaderConfig(data_dir=tmp_path, preemption=False), store, clock=lambda: 7200.0)
    leader.usage = {"veteran": 1.0}  # one GPU-hour of finished work
    leader.usage_at = 7200.0
    leader.agents["ws1"] = AgentSession("ws1", node, "x", None, None, last_seen=7200.0)
    leader.schedule_pass()
    assert leader.jobs[veteran.id].state is JobState.STARTING  # less used, though submitted later
    assert leader.jobs[newcomer.id].state is JobState.QUEUED
