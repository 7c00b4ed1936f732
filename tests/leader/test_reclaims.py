"""Two teams on ws1 (queues a and b, each guaranteed 2 of its 4 GPUs), a leader on a fake clock: the passes'
decisions turn by turn while jobs stop and victims checkpoint, as tests/e2e/test_two_teams.py sees them through
real processes, but with every interleaving of the agent's reports chosen by the test."""

from __future__ import annotations

import pytest

from labq.leader.auth import Principal
from labq.leader.core import Leader
from labq.models import JobState
from labq.models import transitions as t
from labq.models.queues import QueueSpec
from labq.protocol.requests import parse_action, parse_submit
from tests.conftest import FakeClock
from tests.leader.labs import leader_with_ws1

ANN, BOB = Principal("user", "ann"), Principal("user", "bob")
TEAMS = (QueueSpec("a", ("ann",), guarantee_gpus=2), QueueSpec("b", ("bob",), guarantee_gpus=2))
SAVES = {"checkpoint_signal": "SIGUSR1", "grace_s": 30}  #: the victims: 30 s to checkpoint


@pytest.fixture
def lab(tmp_path):
    leader, clock = leader_with_ws1(tmp_path, min_runtime_s=0.0, max_grace_s=30.0, default_grace_s=2.0,
                                    queues=TEAMS)
    yield leader, clock
    leader.stop()


def submit(leader: Leader, who: Principal, **fields) -> int:
    return leader.queue.submit(who, parse_submit({"command": ["train"], **fields})).id


def turn(leader: Leader, clock: FakeClock) -> bool:
    """A second of the scheduler thread; the agent has synced."""
    clock.now += 1.0
    leader.state.agents["ws1"].last_seen = clock.now
    return leader.scheduling.turn(leader.state.woken.wait(0))


def report(leader: Leader, clock: FakeClock, *ended: int) -> None:
    """The agent's next sync: placed jobs run, and the attempts of ``ended`` have exited."""
    state = leader.state
    with state.lock:
        updates = [t.running(j, clock.now) for j in state.jobs.values() if j.state is JobState.STARTING]
        updates += [t.exited(state.jobs[i], 143, clock.now) for i in ended]
        state.apply(updates)


def gpus(leader: Leader, job: int) -> tuple[int, ...]:
    return leader.state.jobs[job].placement.gpus_on("ws1")


def test_a_job_submitted_while_a_cancelled_job_stops_waits_for_its_gpu_so_each_reclaim_has_its_victim(lab):
    """The e2e test's setup under load: the agent reports the placeholder's exit only after the next job is
    submitted. That job waits for the cancelled job's GPU instead of preempting ann's low job, so when bob submits
    twice, each of his jobs reclaims one of ann's borrowed GPUs (low first), and both say Preempting, pass after
    pass, until their victims have saved."""
    leader, clock = lab
    state = leader.state
    quick = submit(leader, ANN, priority="low", **SAVES)
    assert turn(leader, clock)
    placeholder = submit(leader, ANN)
    assert turn(leader, clock)
    older = []
    for _ in range(2):
        older.append(submit(leader, ANN))
        assert turn(leader, clock)
    report(leader, clock)
    assert turn(leader, clock)
    assert (gpus(leader, quick), gpus(leader, placeholder)) == ((0,), (1,))

    leader.queue.act(ANN, placeholder, parse_action({"action": "cancel"}))  # it runs until the agent says it ended
    slow = submit(leader, ANN, **SAVES)
    assert turn(leader, clock)
    assert state.jobs[quick].state is JobState.RUNNING  # not preempted for a GPU that comes back anyway
    assert str(state.pending[slow]) == f"Resources: job {placeholder} is being cancelled; then it runs on GPUs 1 on ws1"
    report(leader, clock, placeholder)
    assert turn(leader, clock)
    assert gpus(leader, slow) == (1,)
    report(leader, clock)
    assert turn(leader, clock)

    first = submit(leader, BOB)
    assert turn(leader, clock)
    second = submit(leader, BOB)
    assert turn(leader, clock)
    expected = {first: f"Preempting: job {quick} is checkpointing; then it runs on GPUs 0 on ws1",
                second: f"Preempting: job {slow} is checkpointing; then it runs on GPUs 1 on ws1"}
    for _ in range(3):  # the pass that preempted, and every later one while the victims checkpoint
        assert (state.jobs[quick].preempted_for, state.jobs[slow].preempted_for) == (first, second)
        assert {j: str(state.pending[j]) for j in (first, second)} == expected
        assert all(state.jobs[j].state is JobState.RUNNING for j in older)
        clock.now += 5.0
        leader.scheduling.schedule_pass()
