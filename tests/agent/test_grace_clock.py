"""An agent stops a signalled job at the end of its grace by its own clock, which a test steps: a real job that
ignores its checkpoint signal, a 10-minute grace, and no waiting for it."""

from __future__ import annotations

import os
import sys
import time

import pytest

from labq.agent.daemon import Agent, AgentConfig
from labq.agent.inventory import open_inventory
from labq.agent.process_runtime import AttemptState
from labq.models.job import JobSpec
from labq.protocol.agents import RunOrder, StopOrder, SyncReply
from tests.conftest import FakeClock

pytestmark = pytest.mark.timeout(60)

IGNORES_USR1 = "import signal; signal.signal(signal.SIGUSR1, signal.SIG_IGN); print('up', flush=True); signal.pause()"


def _state(agent: Agent) -> AttemptState | None:
    return next((s.state for s in agent.runtime.attempts() if (s.job_id, s.attempt) == (7, 1)), None)


def _wait(condition, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_a_job_that_ignores_its_signal_is_stopped_when_the_agents_clock_passes_its_grace(tmp_path):
    clock = FakeClock(1_000_000.0)
    agent = Agent(AgentConfig("http://127.0.0.1:9", "join", "ws1", tmp_path / "agent"),
                  open_inventory("sim:ws-4x3090", "ws1"), clock=clock)
    agent.runtime.set_policy((), (), allow_root=True)  # the suite may run as root: this job then runs as root
    spec = JobSpec(os.environ.get("USER", "root"), (sys.executable, "-c", IGNORES_USR1), workdir=str(tmp_path),
                   grace_s=600.0)
    order = RunOrder(7, 1, spec, {}, (0,), ("SIM-0",), "SIGUSR1", simulated=True)
    try:
        agent.apply(SyncReply((order,), (), 30.0, 600.0, 1, "e"))
        assert _wait(lambda: b"up" in agent.runtime.read_log(7, 1))
        agent.apply(SyncReply((order,), (StopOrder(7, 1, "SIGUSR1", 600.0, "preempted"),), 30.0, 600.0, 2, "e"))
        assert agent.notes.get(7, 1).signalled_at == clock.now
        clock.now += 599.0
        agent.check_graces()  # decides and acts before it returns
        assert _state(agent) is AttemptState.RUNNING and not agent.notes.get(7, 1).escalated  # within its grace
        clock.now += 2.0
        agent.check_graces()
        assert agent.notes.get(7, 1).escalated
        assert _wait(lambda: _state(agent) is AttemptState.EXITED), "the job still runs after its grace"
    finally:
        for s in agent.runtime.attempts():
            if s.state is AttemptState.RUNNING:
                agent.runtime.stop(s.job_id, s.attempt, 1.0)
        agent.stop()
