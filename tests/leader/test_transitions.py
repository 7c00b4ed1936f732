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
