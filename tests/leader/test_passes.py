"""A pass runs when something changed or time alone can change a decision, not every second: an idle lab
with a long queue costs nothing between. A leader on a stepped fake clock; passes are counted."""

from __future__ import annotations

import pytest

from labq.leader.auth import Principal
from labq.leader.core import Leader
from labq.models import JobState
from labq.models import transitions as t
from labq.leader.state import QUIET_PASS_S, QUIET_SUBMIT_MAX_S, QUIET_SUBMIT_SHARE
from labq.protocol.requests import parse_action, parse_submit
from tests.conftest import FakeClock
from tests.leader.labs import leader_with_ws1

ALICE = Principal("user", "alice")


@pytest.fixture
def lab(tmp_path):
    leader, clock = leader_with_ws1(tmp_path, min_runtime_s=300.0)
    yield leader, clock
    leader.stop()


def submit(leader: Leader, **fields) -> int:
    return leader.queue.submit(ALICE, parse_submit({"command": ["train"], **fields})).id


def turn(leader: Leader, clock: FakeClock, seconds: float = 1.0) -> bool:
    """A second of the scheduler thread on an idle lab: the agent syncs (nothing changes), the timers run."""
    clock.now += seconds
    leader.state.agents["ws1"].last_seen = clock.now
    return leader.scheduling.turn(leader.state.woken.wait(0))


def run_placed(leader: Leader, clock: FakeClock) -> None:
    """The agent reports every placed job running, as its next sync would."""
    with leader.state.lock:
        placed = [j for j in leader.state.jobs.values() if j.state is JobState.STARTING]
        leader.state.apply([t.running(j, clock.now) for j in placed])


def fill_ws1(leader: Leader, clock: FakeClock) -> None:
    """ws1 full of two running 2-GPU normal jobs; the lab's clock for waits steps with its wall clock."""
    leader.state.monotonic = clock
    for _ in range(2):
        submit(leader, gpus=2)
    assert turn(leader, clock)
    run_placed(leader, clock)


def test_an_idle_lab_is_passed_over_again_only_when_time_alone_can_change_a_decision(lab):
    leader, clock = lab
    low = [submit(leader, gpus=1, priority="low") for _ in range(4)]
    assert turn(leader, clock)  # the submits woke it: the four fill ws1
    run_placed(leader, clock)
    big = submit(leader, gpus=4)  # normal: it may preempt the low jobs once they have run 5 minutes
    assert turn(leader, clock)
    assert leader.state.pending[big].reason.value == "Resources"
    last = clock.now
    heartbeat = leader.scheduling.HEARTBEAT_S
    passed_at = [clock.now for _ in range(297) if turn(leader, clock)]
    # nothing changes, and no job reaches its minimum runtime: only the heartbeat's passes
    assert passed_at == [last + heartbeat * k for k in range(1, 5)]
    assert clock.now < leader.scheduling.next_edge <= clock.now + 3
    while not turn(leader, clock):  # the low jobs reach their minimum runtime: a pass preempts them
        pass
    assert leader.state.pending[big].reason.value == "Preempting"
    assert {leader.state.jobs[j].state for j in low} == {JobState.PREEMPTING}


def test_with_nothing_due_a_pass_still_comes_at_the_heartbeat(lab):
    leader, clock = lab
    for _ in range(4):
        submit(leader, gpus=1)
    waiting = submit(leader, gpus=1)
    assert turn(leader, clock)
    run_placed(leader, clock)
    assert turn(leader, clock)  # the reports of the starts woke it
    assert leader.state.pending[waiting].reason.value == "Resources"  # equal priority: it preempts nothing
    quiet = [turn(leader, clock) for _ in range(int(leader.scheduling.HEARTBEAT_S) - 1)]
    assert not any(quiet)
    assert turn(leader, clock)  # the heartbeat


def test_a_change_wakes_the_next_turn_at_once_and_changes_that_come_together_make_one_pass(lab):
    leader, clock = lab
    assert turn(leader, clock)  # the first turn always passes
    assert not turn(leader, clock)
    for _ in range(3):
        submit(leader, gpus=1)
    passes = leader.scheduling.passes
    assert turn(leader, clock, seconds=0.0)
    assert leader.scheduling.passes == passes + 1  # three submits, one pass
    assert not turn(leader, clock, seconds=0.0)


def test_a_failing_turn_is_logged_and_paused_after_longer_each_time_and_the_next_good_one_passes(lab, caplog):
    leader, clock = lab
    scheduling = leader.scheduling
    broken = RuntimeError("the disk is gone")

    def tick() -> None:
        raise broken

    scheduling.tick = tick
    submit(leader, gpus=1)  # wakes it
    pauses = [scheduling.step(leader.state.woken.wait(0)) for _ in range(6)]
    assert pauses == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert not leader.state.woken.is_set()  # the loop's next wait is the pause, not a spin
    assert "scheduling pass failed (6 in a row)" in caplog.text and "the disk is gone" in caplog.text
    del scheduling.tick  # mended
    passes = scheduling.passes
    pause = scheduling.step(False)  # nothing woke it, yet the turn after failures passes
    assert scheduling.passes == passes + 1 and scheduling.failures == 0
    assert pause == min(scheduling.COALESCE_MAX_S, scheduling.pass_seconds)  # only what a pass pauses


@pytest.mark.parametrize(("took", "pause"), [(0.25, 0.25), (5.0, 1.0)])
def test_after_a_pass_the_changes_gather_for_as_long_as_it_took_at_most_a_second(lab, monkeypatch, took, pause):
    """Under a stream of submits, back-to-back passes of a long queue would take a whole core from the API that
    brings the submits: the scheduler thread waits as long as its pass took (at most COALESCE_MAX_S)."""
    from labq.leader import scheduling as module

    leader, _ = lab
    ticks = [0.0]
    leader.state.monotonic = lambda: ticks[0]
    real = module.schedule

    def slow(*args, **kwargs):
        ticks[0] += took
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "schedule", slow)
    submit(leader, gpus=1)
    assert leader.scheduling.step(True) == pause
    assert leader.scheduling.step(False) == 0.0  # a turn with nothing to pass does not pause


def test_submits_that_can_neither_start_nor_preempt_are_taken_in_by_one_pass_within_a_second(lab):
    """On a full lab, a stream of submits that only wait costs one pass, not one each; a submit that may
    preempt still brings its pass at once."""
    leader, clock = lab
    fill_ws1(leader, clock)
    assert turn(leader, clock)
    passes = leader.scheduling.passes
    waiting = [submit(leader, gpus=1) for _ in range(50)]
    assert not leader.state.woken.is_set()
    assert leader.state.pass_by == clock.now + QUIET_PASS_S
    assert not turn(leader, clock, seconds=0.5) and leader.scheduling.passes == passes
    assert all(j not in leader.state.pending for j in waiting)  # "the scheduler has not placed it yet"
    assert turn(leader, clock, seconds=0.5)  # due: one pass for the fifty
    assert leader.scheduling.passes == passes + 1 and leader.state.pass_by is None
    assert {leader.state.pending[j].reason.value for j in waiting} == {"Resources"}
    assert not turn(leader, clock, seconds=5.0)
    boss = Principal("user", "boss", admin=True)
    urgent = leader.queue.submit(boss, parse_submit({"command": ["train"], "priority": "high"})).id
    # it may preempt a normal job: a pass now
    assert leader.state.woken.is_set()
    assert turn(leader, clock, seconds=0.0) and urgent in leader.state.pending


def test_on_a_queue_whose_passes_take_long_waiting_submits_are_taken_in_by_passes_that_take_a_fifth_of_the_time(
        lab, monkeypatch):
    """A long queue's pass takes a while (half a second of wall time at 30,000 queued under a stream of
    submits): a pass a second for submits that can only wait would take half of the leader's time from the API
    that brings them. Their pass comes as many times the last pass's time later as keeps the passes to
    QUIET_SUBMIT_SHARE of the time, QUIET_SUBMIT_MAX_S at most; a submit that may start still brings its pass
    at once, and once passes are quick again, so are their reasons."""
    from labq.leader import scheduling as module

    leader, clock = lab
    fill_ws1(leader, clock)
    took = [0.6]
    real = module.schedule

    def timed(*args, **kwargs):
        clock.now += took[0]  # the pass's wall time, on the clock its duration is read from
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "schedule", timed)
    assert turn(leader, clock)
    later = took[0] / QUIET_SUBMIT_SHARE
    assert QUIET_PASS_S < later < QUIET_SUBMIT_MAX_S and leader.state.quiet_submit_s == pytest.approx(later)
    passes = leader.scheduling.passes
    waiting = [submit(leader, gpus=1) for _ in range(20)]
    assert leader.state.pass_by == pytest.approx(clock.now + later)
    for _ in range(2):
        assert not turn(leader, clock, seconds=1.0)
    assert leader.scheduling.passes == passes and all(j not in leader.state.pending for j in waiting)
    assert not turn(leader, clock, seconds=later - 2.1)
    assert turn(leader, clock, seconds=0.2)  # due: one pass for the twenty
    assert {leader.state.pending[j].reason.value for j in waiting} == {"Resources"}
    took[0] = 2.0  # longer still: at most QUIET_SUBMIT_MAX_S apart
    submit(leader, gpus=1)
    assert turn(leader, clock, seconds=later + 0.1) and leader.state.quiet_submit_s == QUIET_SUBMIT_MAX_S
    took[0] = 0.01
    submit(leader, gpus=1)
    assert leader.state.pass_by == pytest.approx(clock.now + QUIET_SUBMIT_MAX_S)
    assert not turn(leader, clock, seconds=QUIET_SUBMIT_MAX_S - 0.1)
    assert turn(leader, clock, seconds=0.2) and leader.state.quiet_submit_s == QUIET_PASS_S
    submit(leader, gpus=1)
    assert leader.state.pass_by == pytest.approx(clock.now + QUIET_PASS_S)
    boss = Principal("user", "boss", admin=True)
    leader.queue.submit(boss, parse_submit({"command": ["train"], "priority": "high"}))  # may preempt: at once
    assert leader.state.woken.is_set()


def test_waiting_jobs_cancelled_or_held_are_taken_in_by_one_pass_within_a_second(lab):
    """A waiting job that ends or is held frees no GPU: a burst of such cancels costs one pass within
    QUIET_PASS_S, not a pass each; a job that waits on one of them (``--after``), the end of a running job and a
    release each bring their pass at once."""
    leader, clock = lab
    fill_ws1(leader, clock)
    waiting = [submit(leader, gpus=1) for _ in range(30)]
    assert turn(leader, clock)
    passes = leader.scheduling.passes

    def act(job_id: int, action: str) -> None:
        leader.queue.act(ALICE, job_id, parse_action({"action": action}))

    for job_id in waiting[:20]:
        act(job_id, "cancel")
    act(waiting[20], "hold")
    assert not leader.state.woken.is_set() and leader.state.pass_by == clock.now + QUIET_PASS_S
    assert not turn(leader, clock, seconds=0.5) and leader.scheduling.passes == passes
    assert turn(leader, clock, seconds=0.5)  # due: one pass for the twenty-one
    assert leader.scheduling.passes == passes + 1
    assert {leader.state.pending[j].reason.value for j in waiting[21:]} == {"Resources"}
    assert leader.state.pending[waiting[20]].reason.value == "Held"
    act(waiting[20], "release")
    assert leader.state.woken.is_set() and turn(leader, clock, seconds=0.0)
    dependent = submit(leader, gpus=1, depends_on=[waiting[21]])
    assert turn(leader, clock, seconds=QUIET_PASS_S) and dependent in leader.state.pending
    act(waiting[21], "cancel")  # its dependent can never start now: told at once
    assert leader.state.woken.is_set() and turn(leader, clock, seconds=0.0)
    assert dependent not in leader.state.jobs  # it failed with what it waited for
    act(next(iter(leader.state.on_gpus)), "cancel")  # a running job: its GPUs come free
    assert leader.state.woken.is_set()
