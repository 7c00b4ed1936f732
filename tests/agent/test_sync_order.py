"""An agent has two syncs open at times (its long poll and an exit report): a reply that the leader
made before the one the agent last applied must not undo it (stop a job just started, or start one
just stopped)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace

import pytest

from labq.agent.daemon import Agent, AgentConfig
from labq.agent.inventory import open_inventory
from labq.agent.process_runtime import AttemptState
from labq.models.job import JobSpec
from labq.protocol.agents import RunOrder, SyncReply, decode_reply, encode_reply

pytestmark = pytest.mark.timeout(60)


def reply(seq: int, epoch: str, *run: RunOrder) -> SyncReply:
    return SyncReply(tuple(run), (), 30.0, 600.0, seq, epoch)


def test_a_reply_is_older_only_than_a_later_one_of_the_same_leader_process():
    assert reply(4, "a").older_than(reply(5, "a"))
    assert reply(5, "a").older_than(reply(5, "a"))  # the same reply twice
    assert not reply(6, "a").older_than(reply(5, "a"))
    assert not reply(1, "b").older_than(reply(5, "a"))  # a restarted leader counts again from 1
    assert not reply(4, "a").older_than(None)
    assert not reply(0, "").older_than(reply(0, ""))  # a leader that does not number its replies
    assert decode_reply(encode_reply(reply(7, "e1"))) == reply(7, "e1")
    old = encode_reply(reply(7, "e1"))
    del old["seq"], old["epoch"]
    assert decode_reply(old) == reply(0, "")


def running(agent: Agent) -> set[tuple[int, int]]:
    return {(s.job_id, s.attempt) for s in agent.runtime.attempts() if s.state is AttemptState.RUNNING}


def record_orders(agent: Agent, monkeypatch) -> list[tuple]:
    """What the agent asks of its runtime: a job starts, is signalled or stops only through these."""
    asked: list[tuple] = []
    for name in ("launch", "signal", "stop"):
        real = getattr(agent.runtime, name)

        def recorded(*args, _name=name, _real=real, **kw):
            asked.append((_name, *args))
            return _real(*args, **kw)

        monkeypatch.setattr(agent.runtime, name, recorded)
    return asked


def test_a_stale_reply_neither_stops_a_new_attempt_nor_restarts_a_stopped_one(tmp_path, monkeypatch):
    agent = Agent(AgentConfig("http://127.0.0.1:9", "join", "ws1", tmp_path / "agent"),
                  open_inventory("sim:ws-4x3090", "ws1"))
    agent.runtime.set_policy((), (), allow_root=True)  # the suite may run as root: this job then runs as root
    asked = record_orders(agent, monkeypatch)
    spec = JobSpec(os.environ.get("USER", "root"), (sys.executable, "-c", "import time; time.sleep(60)"),
                   workdir=str(tmp_path), grace_s=2.0)
    order = RunOrder(7, 2, spec, {"LABQ_TEST_ROOT": str(tmp_path)}, (0,), ("SIM-0",), "SIGUSR1", simulated=True)
    try:
        agent.apply(reply(5, "a", order))  # the exit report's answer: run attempt 2
        assert running(agent) == {(7, 2)}
        assert [what for what, *_ in asked] == ["launch"]
        # apply decides at once: whatever it asks of the runtime is asked before it returns
        agent.apply(reply(4, "a"))  # the long poll's answer, made before: it knew no attempt 2
        assert [what for what, *_ in asked] == ["launch"], "a stale reply signalled or stopped the attempt"
        assert running(agent) == {(7, 2)}, "a stale reply stopped the attempt"
        agent.apply(reply(6, "a"))  # a newer reply without it: the leader moved it away
        deadline = time.monotonic() + 20
        while running(agent) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert running(agent) == set()
        agent.apply(reply(7, "a"))  # the next one: the agent forgets the ended attempt
        assert agent.runtime.attempts() == []
        launches = sum(what == "launch" for what, *_ in asked)
        agent.apply(reply(5, "a", order))  # the stale order to run it
        assert sum(what == "launch" for what, *_ in asked) == launches, "a stale reply launched the attempt again"
        assert agent.runtime.attempts() == [], "a stale reply started a stopped attempt again"
        other = replace(order, job_id=8, attempt=1)
        agent.apply(reply(1, "b", other))  # a restarted leader numbers from 1 again, and is heard
        assert running(agent) == {(8, 1)}
    finally:
        for s in agent.runtime.attempts():
            if s.state is AttemptState.RUNNING:
                agent.runtime.stop(s.job_id, s.attempt, 1.0)
        deadline = time.monotonic() + 10
        while running(agent) and time.monotonic() < deadline:
            time.sleep(0.1)
