"""A leader on a fake clock with one simulated workstation, ws1 (``sim:ws-4x3090``), its agent just seen."""

from __future__ import annotations

from labq.leader.config import LeaderConfig
from labq.leader.core import Leader
from labq.leader.state import AgentSession
from labq.models import Node
from labq.store import MemoryStore, Store
from labq.topologies import parse_sim_spec
from tests.conftest import FakeClock


def leader_with_ws1(path, store: Store | None = None, **config) -> tuple[Leader, FakeClock]:
    clock = FakeClock(1000.0)
    leader = Leader(LeaderConfig(data_dir=path, **config), store or MemoryStore(), clock=clock)
    inv = parse_sim_spec("sim:ws-4x3090")
    leader.state.agents["ws1"] = AgentSession("ws1", Node("ws1", inv.gpus("ws1"), inv.topology, simulated=True), "x",
                                              None, None, last_seen=clock.now)
    return leader, clock
