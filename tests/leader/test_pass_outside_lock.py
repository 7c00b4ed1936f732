"""A scheduling pass runs outside the leader's lock: the API is answered while it decides, and a decision
about a job that changed meanwhile is dropped, for the next pass to make again. A leader on a fake clock;
the pass is held (after it decided) by wrapping the scheduler's own ``schedule``."""

from __future__ import annotations

import threading

import pytest

from labq.leader import scheduling
from labq.leader.auth import Principal
from labq.protocol.requests import parse_action, parse_submit
from tests.leader.labs import leader_with_ws1

ALICE = Principal("user", "alice")


@pytest.fixture
def lab(tmp_path):
    leader, clock = leader_with_ws1(tmp_path)
    yield leader, clock
    leader.stop()


def submit(leader, **fields) -> int:
    return leader.queue.submit(ALICE, parse_submit({"command": ["train"], **fields})).id


@pytest.fixture
def held_pass(monkeypatch):
    """Runs one pass in a thread and holds it after ``schedule`` decided, until the test lets it go."""
    decided, go, armed = threading.Event(), threading.Event(), threading.Event()
    real = scheduling.schedule

    def held(*args, **kwargs):
        decisions = real(*args, **kwargs)
        if armed.is_set():  # only the pass ``start`` runs is held
            decided.set()
            assert go.wait(30), "the test never let the pass go"
        return decisions

    monkeypatch.setattr(scheduling, "schedule", held)

    def start(leader) -> threading.Thread:
        armed.set()
        thread = threading.Thread(target=leader.scheduling.schedule_pass, name="held-pass")
        thread.start()
        assert decided.wait(30), "the pass never decided"
        return thread

    yield start, go
    go.set()


def within(seconds: float, work) -> object:
    """``work()`` in a thread; fails if it has not returned in ``seconds`` (it waits for a lock held elsewhere)."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(work()))
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the API waited for the pass"
    return out[0]


def test_the_api_is_answered_while_a_pass_decides_and_a_job_cancelled_meanwhile_is_not_started(lab, held_pass):
    leader, _ = lab
    start, go = held_pass
    first = submit(leader, gpus=2)
    passing = start(leader)  # it has decided to start `first`
    second = within(5, lambda: submit(leader, gpus=2))
    listed = within(5, lambda: leader.queue.visible(ALICE, user=None, states=(), everyone=True, history=False,
                                                    limit=None))
    assert [j.id for j in listed.jobs] == [first, second]
    within(5, lambda: leader.queue.act(ALICE, first, parse_action({"action": "cancel"})))
    leader.state.woken.clear()
    go.set()
    passing.join(30)
    state = leader.state
    assert first not in state.jobs and state.finished[first].value == "cancelled"  # not started after its cancel
    assert state.jobs[second].state.value == "queued"  # submitted after the pass took its inputs
    assert state.woken.is_set()  # the next pass decides again, with both changes
    leader.scheduling.schedule_pass()
    assert state.jobs[second].state.value == "starting"


def test_a_preemption_for_a_job_held_meanwhile_is_dropped(lab, held_pass):
    leader, clock = lab
    start, go = held_pass
    low = [submit(leader, gpus=1, priority="low") for _ in range(4)]
    leader.scheduling.schedule_pass()
    with leader.state.lock:
        from labq.models import transitions as t

        leader.state.apply([t.running(leader.state.jobs[i], clock.now) for i in low])
    clock.now += 3600  # past every minimum runtime
    big = submit(leader, gpus=4)
    passing = start(leader)  # it has decided to preempt the low jobs for `big`
    within(5, lambda: leader.queue.act(ALICE, big, parse_action({"action": "hold"})))
    go.set()
    passing.join(30)
    assert [leader.state.jobs[i].state.value for i in low] == ["running"] * 4  # nobody checkpoints for nothing
    assert leader.state.jobs[big].state.value == "held"
