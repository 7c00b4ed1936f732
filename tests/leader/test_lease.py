"""A node is lost when its lease runs out, counted from the last message its agent actually sent.

The leader's clock is a fake one the test moves: an agent's long poll that the
leader still holds open (the agent may be dead, its connection half-open) is
not a message from it, and must not keep the node alive.
"""

from __future__ import annotations

import threading

import pytest

from labq.leader.auth import Principal
from labq.leader.config import LeaderConfig
from labq.leader.core import Leader
from labq.leader.state import AgentSession
from labq.models import Node, NodeHealth
from labq.protocol.agents import SyncReport
from labq.store import MemoryStore
from labq.topologies import parse_sim_spec
from tests.conftest import FakeClock
from tests.leader.labs import leader_with_ws1

WS1 = Principal("agent", "ws1")


@pytest.fixture
def lab(tmp_path):
    leader, clock = leader_with_ws1(tmp_path, lease_s=30.0)
    yield leader, clock
    leader.stop()


def _health(leader: Leader) -> NodeHealth:
    return leader.state.agents["ws1"].node.health


def test_a_node_is_lost_within_a_second_of_its_lease_from_its_last_sync(lab):
    leader, clock = lab
    leader.agents.sync(WS1, "ws1", SyncReport((), None, 0.0))
    clock.now += 30.0
    leader.scheduling.tick()
    assert _health(leader) is NodeHealth.UP  # exactly the lease: not yet
    clock.now += 0.9
    leader.scheduling.tick()
    assert _health(leader) is NodeHealth.LOST


def test_an_open_long_poll_does_not_keep_a_silent_node_alive(lab):
    leader, clock = lab
    leader.agents.sync(WS1, "ws1", SyncReport((), None, 0.0))  # the orders are delivered: the next sync waits
    polling = threading.Thread(target=leader.agents.sync, args=(WS1, "ws1", SyncReport((), None, 3.0)))
    polling.start()
    try:
        # the agent died with its long poll open; the leader's state changes meanwhile and wakes the poll
        for _ in range(5):
            clock.now += 7.0
            with leader.state.lock:
                leader.state.changed.notify_all()
            polling.join(0.05)
        assert clock.now - 1000.0 == 35.0
        leader.scheduling.tick()
        assert _health(leader) is NodeHealth.LOST, "the open poll refreshed the lease of an agent that sent nothing"
    finally:
        polling.join(5.0)
    assert not polling.is_alive()


def test_a_node_that_syncs_again_is_up_again(lab):
    leader, clock = lab
    clock.now += 31.0
    leader.scheduling.tick()
    assert _health(leader) is NodeHealth.LOST
    leader.agents.sync(WS1, "ws1", SyncReport((), None, 0.0))
    assert _health(leader) is NodeHealth.UP


def test_a_long_poll_ends_when_the_injected_clock_says_so_not_the_wall(tmp_path):
    wall, ticks = FakeClock(1000.0), FakeClock(50.0)
    leader = Leader(LeaderConfig(data_dir=tmp_path, lease_s=30.0), MemoryStore(), clock=wall, monotonic=ticks)
    inv = parse_sim_spec("sim:ws-4x3090")
    leader.state.agents["ws1"] = AgentSession("ws1", Node("ws1", inv.gpus("ws1"), inv.topology, simulated=True),
                                              "x", None, None, last_seen=wall.now)
    try:
        leader.agents.sync(WS1, "ws1", SyncReport((), None, 0.0))
        polling = threading.Thread(target=leader.agents.sync, args=(WS1, "ws1", SyncReport((), None, 15.0)))
        polling.start()
        polling.join(0.3)
        assert polling.is_alive()  # a quiet poll waits
        ticks.now += 15.0  # half the lease has passed on the leader's clock
        with leader.state.lock:
            leader.state.changed.notify_all()
        polling.join(2.0)
        assert not polling.is_alive(), "the poll waited on the wall clock"
    finally:
        leader.stop()
