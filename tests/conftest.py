"""Shared test helpers: nodes from simulated inventories, jobs in any state."""

from __future__ import annotations

import itertools
import os

import pytest

from labq.models import Job, JobSpec, JobState, Node, NodeAllocation, Placement
from labq.topologies import parse_sim_spec

NOW = 1_000_000.0


def unavailable(part: str, why: str) -> None:
    """A real ``part`` a test needs cannot be had here: fail under CI (a guard that skips guards nothing), skip
    elsewhere."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI needs {part}: {why}", pytrace=False)
    pytest.skip(why)


class FakeClock:
    """A clock a test moves by hand (``clock.now += 30``): pass it where labq takes ``clock`` or ``monotonic``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_node(name: str, spec: str, **kw) -> Node:
    inv = parse_sim_spec(spec)
    return Node(name, inv.gpus(name), inv.topology, simulated=True, **kw)


class JobFactory:
    """Builds jobs with fresh ids; running jobs get a placement on the GPUs given."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def queued(self, gpus: int = 1, *, user: str = "alice", priority: int = 200, submitted_at: float = NOW - 100,
               state: JobState = JobState.QUEUED, **spec) -> Job:
        return Job(next(self._ids), JobSpec(user=user, command=("train",), gpus=gpus, priority=priority, **spec),
                   submitted_at=submitted_at, state=state)

    def running(self, node: Node, gpus: tuple[int, ...], *, user: str = "bob", priority: int = 200,
                started_at: float = NOW - 3600, state: JobState = JobState.RUNNING, **kw) -> Job:
        spec_kw = {k: kw.pop(k) for k in list(kw) if k in JobSpec.__dataclass_fields__}
        alloc = NodeAllocation(node.name, tuple(gpus), tuple(node.gpus[i].uuid for i in gpus))
        return Job(next(self._ids),
                   JobSpec(user=user, command=("train",), gpus=len(gpus), priority=priority, **spec_kw),
                   submitted_at=started_at - 60, state=state, placement=Placement((alloc,)),
                   started_at=started_at, **kw)


@pytest.fixture
def jobs() -> JobFactory:
    return JobFactory()
