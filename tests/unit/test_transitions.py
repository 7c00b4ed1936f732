"""A job's life, step by step."""

from __future__ import annotations

import pytest

from labq.models import transitions as t
from labq.models import Job, JobSpec, JobState, NodeAllocation, Placement
from labq.models.job import AttemptEnd, StopReason
from labq.protocol.codec import decode_job, encode_job

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


@pytest.mark.parametrize(("stop", "exit_code", "escalated", "state", "ended", "lost"), [
    # preempted: back in the queue however it ended; work lost since the checkpoint at 250 unless it saved on exit
    ("preempt", 0, False, JobState.QUEUED, AttemptEnd.CHECKPOINTED, 40.0),
    ("preempt", 3, False, JobState.QUEUED, AttemptEnd.PREEMPTED, 40.0),  # crashed in its grace: not a failure
    ("preempt", 138, False, JobState.QUEUED, AttemptEnd.PREEMPTED, 40.0),  # died of the signal (no handler)
    ("preempt", 137, True, JobState.QUEUED, AttemptEnd.KILLED, 40.0),  # ignored the signal
    ("timeout", 0, False, JobState.TIMEOUT, AttemptEnd.CHECKPOINTED, 0.0),
    ("timeout", 143, True, JobState.TIMEOUT, AttemptEnd.KILLED, 0.0),
    ("timeout", 1, False, JobState.TIMEOUT, AttemptEnd.TIMEOUT, 0.0),
    ("cancel", 143, False, JobState.CANCELLED, AttemptEnd.CANCELLED, 0.0),
    (None, 0, False, JobState.SUCCEEDED, AttemptEnd.SUCCEEDED, 0.0),
    (None, 2, False, JobState.FAILED, AttemptEnd.FAILED, 0.0),
])
def test_how_an_attempt_ended_is_recorded(stop, exit_code, escalated, state, ended, lost):
    running = t.running(t.placed(job(), PLACE), 200.0).evolve(last_checkpoint_at=250.0)
    if stop == "preempt":
        running = t.preempting(running, for_job=9)
    elif stop is not None:
        running = running.evolve(stop_requested=stop)
    after = t.exited(running, exit_code, 290.0, escalated=escalated)
    assert after.state is state
    (attempt,) = after.history
    assert (attempt.number, attempt.ended, attempt.exit_code, attempt.work_lost_s) == (1, ended, exit_code, lost)
    assert (attempt.started_at, attempt.ended_at, attempt.placement) == (200.0, 290.0, PLACE)
    assert attempt.preempted_for == (9 if stop == "preempt" else None)
    assert after.preemptions == (1 if stop == "preempt" else 0)
    assert after.work_lost_s == lost


def test_work_lost_without_reported_checkpoints():
    running = t.preempting(t.running(t.placed(job(), PLACE), 200.0), for_job=9)
    assert t.exited(running, 0, 290.0).work_lost_s == 0.0  # exited 0 in its grace: it saved as it left
    assert t.exited(running, 1, 290.0).work_lost_s == 90.0  # crashed: everything since the start
    assert t.exited(running, 137, 290.0, escalated=True).work_lost_s == 90.0


def test_a_checkpoint_reported_with_the_exit_counts():
    running = t.preempting(t.running(t.placed(job(), PLACE), 200.0), for_job=9)
    after = t.exited(running, 137, 300.0, escalated=True, checkpoint_at=280.0)
    assert after.history[0].last_checkpoint_at == 280.0 and after.work_lost_s == 20.0
    assert after.last_checkpoint_at is None  # the next attempt starts with none of its own


def test_checkpoints_only_move_forward_within_the_attempt():
    running = t.running(t.placed(job(), PLACE), 200.0)
    assert t.checkpointed(running, 150.0) is running  # before this attempt started: an earlier attempt's
    later = t.checkpointed(running, 260.0)
    assert later.last_checkpoint_at == 260.0
    assert t.checkpointed(later, 240.0) is later
    assert later.work_at_risk(300.0) == 40.0


def test_a_time_limit_requeues_when_asked():
    spec = JobSpec(user="alice", command=("train",), gpus=2, time_limit_s=3600, requeue_on_timeout=True)
    running = t.running(t.placed(Job(7, spec, submitted_at=100.0), PLACE), 200.0).evolve(stop_requested="timeout")
    back = t.exited(running, 0, 3800.0)
    assert (back.state, back.attempt, back.preemptions) == (JobState.QUEUED, 2, 0)
    assert back.history[0].stop_reason is StopReason.TIMEOUT and back.history[0].ended is AttemptEnd.CHECKPOINTED


def test_a_lost_attempt_is_requeued_with_its_history():
    running = t.running(t.placed(job(), PLACE), 200.0)
    back = t.lost(running, 500.0, checkpoint_at=450.0)
    assert (back.state, back.attempt, back.preemptions, back.work_lost_s) == (JobState.QUEUED, 2, 0, 50.0)
    assert back.history[0].ended is AttemptEnd.LOST


def test_history_survives_the_store_format():
    running = t.preempting(t.running(t.placed(job(), PLACE), 200.0), for_job=9)
    back = t.exited(running, 137, 300.0, escalated=True, checkpoint_at=280.0)
    again = t.exited(t.running(t.placed(back, PLACE), 400.0), 0, 500.0)
    assert decode_job(encode_job(again)) == again
    assert [a.ended for a in again.history] == [AttemptEnd.KILLED, AttemptEnd.SUCCEEDED]


def test_gpu_hours_count_the_current_attempt():
    running = t.running(t.placed(job(), PLACE), 0.0)
    assert t.gpu_hours(running, 1800.0) == 1.0  # 2 GPUs for half an hour
    assert t.gpu_hours(job(), 1800.0) == 0.0



def test_fair_share_counts_running_work_of_users_with_no_history(tmp_path):
    from labq.leader.config import LeaderConfig
    from labq.leader.core import Leader
    from labq.leader.state import AgentSession
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
    leader.state.usage = {"veteran": 1.0}  # one GPU-hour of finished work
    leader.state.usage_at = 7200.0
    leader.state.agents["ws1"] = AgentSession("ws1", node, "x", None, None, last_seen=7200.0)
    leader.scheduling.schedule_pass()
    assert leader.state.jobs[veteran.id].state is JobState.STARTING  # less used, though submitted later
    assert leader.state.jobs[newcomer.id].state is JobState.QUEUED


# -- leaving a reservation that is over ---------------------------------------------------------

def _in(name: str | None, after: str = "queue", state: JobState = JobState.QUEUED, note: str = "") -> Job:
    from labq.models.job import AfterReservation

    spec = JobSpec(user="alice", command=("train",), reservation=name, after_reservation=AfterReservation(after))
    placed = PLACE if state.holds_gpus else None
    return Job(7, spec, submitted_at=100.0, state=state, placement=placed, note=note)


def _booking(name: str = "paper", end: float = 500.0, cancelled_at: float | None = None):
    from labq.models.reservation import Reservation

    return Reservation(name, "alice", 1, 100.0, end, cancelled_at=cancelled_at)


@pytest.mark.parametrize("job, bookings, now, state, reservation, note", [
    # still live: nothing moves
    (_in("paper"), [_booking()], 499.0, JobState.QUEUED, "paper", ""),
    # ended: released, or cancelled as asked
    (_in("paper"), [_booking()], 500.0, JobState.QUEUED, None, "reservation 'paper' ended; released to the normal queue"),
    (_in("paper", "cancel"), [_booking()], 500.0, JobState.CANCELLED, "paper",
     "cancelled: reservation 'paper' ended before it started (--after-reservation cancel)"),
    (_in("paper", "cancel", JobState.HELD), [_booking()], 500.0, JobState.CANCELLED, "paper",
     "cancelled: reservation 'paper' ended before it started (--after-reservation cancel)"),
    (_in("paper", state=JobState.HELD), [_booking()], 500.0, JobState.HELD, None,
     "reservation 'paper' ended; released to the normal queue"),
    # on GPUs already: it runs on, outside the booking, whatever it asked for the queue
    (_in("paper", "cancel", JobState.RUNNING), [_booking()], 500.0, JobState.RUNNING, None,
     "reservation 'paper' ended; runs on outside it"),
    # cancelled early, or not there at all (forgotten, never booked)
    (_in("paper"), [_booking(cancelled_at=200.0)], 200.0, JobState.QUEUED, None,
     "reservation 'paper' was cancelled; released to the normal queue"),
    (_in("paper"), [], 200.0, JobState.QUEUED, None, "reservation 'paper' does not exist; released to the normal queue"),
    # an earlier note is kept
    (_in("paper", note="moved"), [_booking()], 600.0, JobState.QUEUED, None,
     "moved; reservation 'paper' ended; released to the normal queue"),
])
def test_a_job_leaves_a_reservation_that_is_over(job, bookings, now, state, reservation, note):
    moved = t.out_of_reservations([job], {r.name: r for r in bookings}, now)
    if note == "":
        assert moved == []
        return
    [out] = moved
    assert (out.state, out.spec.reservation, out.note) == (state, reservation, note)
    assert (out.ended_at == now) == (state is JobState.CANCELLED)
    assert decode_job(encode_job(out)) == out  # the note and the choice survive the store


def test_jobs_without_a_reservation_or_finished_never_move():
    done = _in("paper").evolve(state=JobState.SUCCEEDED)
    assert t.out_of_reservations([_in(None), done], {}, 10_000.0) == []


def test_a_job_that_declared_no_checkpoint_signal_is_stopped_with_term_never_a_signal_it_would_die_of():
    from labq.protocol.requests import parse_submit
    from labq.render import show_text

    plain = parse_submit({"command": ["python", "train.py"]}).spec_for("alice")
    declared = parse_submit({"command": ["x"], "checkpoint_signal": "usr1"}).spec_for("alice")
    assert (plain.checkpoint_signal, Job(1, plain, submitted_at=0.0).stop_signal) == (None, "SIGTERM")
    assert (declared.checkpoint_signal, Job(1, declared, submitted_at=0.0).stop_signal) == ("SIGUSR1", "SIGUSR1")
    for spec, says in ((plain, "no checkpoint signal (a stop is TERM)"), (declared, "checkpoint signal SIGUSR1")):
        job = encode_job(Job(1, spec, submitted_at=0.0))
        assert says in show_text(job, None, 10.0)
    assert decode_job(encode_job(Job(1, plain, submitted_at=0.0))).spec.checkpoint_signal is None
