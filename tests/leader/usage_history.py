"""A lab's history for ``labq usage`` tests, each job lived through ``labq.models.transitions`` as the leader
would (placed, running, preempting, exited, cancelled), and stored in a real TinyDB store: finished jobs land in
the archive files of the months they ended (September, October, November 2026), the running and queued ones in
the hot database.

Two nodes: ``dgx`` (``sim:dgx1``, 8 x Tesla V100) and ``ws1`` (``sim:ws-4x3090``, 4 x RTX 3090), 12 GPUs.
``NOW`` is 2 November 2026 00:00 UTC. The jobs, in UTC (October unless said):

1. alice, normal, 2 GPUs ws1:0,1: submitted 30 Sep 22:00, ran 30 Sep 23:00 - 1 Oct 03:00, succeeded.
2. bob, low, 4 GPUs: submitted 10 Oct 00:00; dgx:0-3 01:00 - 05:00 preempted (checkpoint 04:30, so 30 min
   lost); ws1:0-3 07:00 - 09:00 preempted with no checkpoint (killed: 2 h lost); dgx:4-7 11 Oct 00:00 - 10:00
   succeeded.
3. carol, high, 1 GPU dgx:0: submitted 20 Oct 00:00, ran 00:30 - 02:30, failed (exit 1).
4. alice, normal, 8 GPUs dgx:0-7: submitted 31 Oct 18:00, running since 31 Oct 20:00.
5. bob, normal, 1 GPU: submitted 5 Oct 00:00, cancelled while queued 6 Oct 00:00.
6. alice, low, 2 GPUs ws1:2,3: submitted 1 Sep 00:00, ran 1 Sep 01:00 - 2 Sep 01:00, succeeded (September).
7. carol, normal, 1 GPU ws1:0: submitted 31 Oct 22:00, ran 31 Oct 23:00 - 1 Nov 01:00, succeeded (November).
8. dave, normal, 1 GPU ws1:3: submitted 14 Oct 23:00, ran 15 Oct 00:00 - 06:00, cancelled while running.
9. alice, normal, 1 GPU: submitted 30 Oct 00:00, still queued.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from labq.models import transitions as t
from labq.models.job import Job, JobSpec
from labq.models.node import Node
from labq.models.placement import NodeAllocation, Placement
from labq.models.priority import PriorityClass
from labq.protocol.codec import encode_job, encode_node
from labq.store import PutJob, TinyDBStore
from tests.conftest import FakeClock, make_node
from tests.leader.loopback_leader import LoopbackLeader, start_loopback_leader

H = 3600.0
USERS = ("alice", "bob", "carol", "dave")
DGX, WS1 = make_node("dgx", "sim:dgx1"), make_node("ws1", "sim:ws-4x3090")
NODES = (DGX, WS1)
LOW, NORMAL, HIGH = int(PriorityClass.LOW), int(PriorityClass.NORMAL), int(PriorityClass.HIGH)


def at(day: int, hour: float = 0, month: int = 10) -> float:
    """The Unix time of ``day`` ``month`` 2026, ``hour`` o'clock UTC."""
    return datetime(2026, month, day, tzinfo=UTC).timestamp() + hour * H


NOW = at(2, 0, 11)
OCTOBER = (at(1), at(1, 0, 11))


def on(node: Node, *gpus: int) -> Placement:
    return Placement((NodeAllocation(node.name, gpus, tuple(node.gpus[i].uuid for i in gpus)),))


def submitted(job_id: int, user: str, gpus: int, priority: int, at_: float) -> Job:
    return Job(job_id, JobSpec(user=user, command=("train",), gpus=gpus, priority=priority), submitted_at=at_)


def ran(job: Job, where: Placement, start: float) -> Job:
    return t.running(t.placed(job, where), start)


def preempted(job: Job, end: float, *, checkpoint_at: float | None = None, exit_code: int = 0) -> Job:
    return t.exited(t.preempting(job, for_job=99), exit_code, end, escalated=exit_code != 0,
                    checkpoint_at=checkpoint_at)


def history() -> list[list[Job]]:
    """Each job's versions, as the leader commits them: submitted, then how it is now."""
    lives = []
    j1 = submitted(1, "alice", 2, NORMAL, at(30, 22, 9))
    lives.append([j1, t.exited(ran(j1, on(WS1, 0, 1), at(30, 23, 9)), 0, at(1, 3))])
    j2 = submitted(2, "bob", 4, LOW, at(10, 0))
    first = preempted(ran(j2, on(DGX, 0, 1, 2, 3), at(10, 1)), at(10, 5), checkpoint_at=at(10, 4.5))
    second = preempted(ran(first, on(WS1, 0, 1, 2, 3), at(10, 7)), at(10, 9), exit_code=137)
    lives.append([j2, first, second, t.exited(ran(second, on(DGX, 4, 5, 6, 7), at(11, 0)), 0, at(11, 10))])
    j3 = submitted(3, "carol", 1, HIGH, at(20, 0))
    lives.append([j3, t.exited(ran(j3, on(DGX, 0), at(20, 0.5)), 1, at(20, 2.5))])
    j4 = submitted(4, "alice", 8, NORMAL, at(31, 18))
    lives.append([j4, ran(j4, on(DGX, *range(8)), at(31, 20))])
    j5 = submitted(5, "bob", 1, NORMAL, at(5, 0))
    lives.append([j5, t.cancelled(j5, at(6, 0))])
    j6 = submitted(6, "alice", 2, LOW, at(1, 0, 9))
    lives.append([j6, t.exited(ran(j6, on(WS1, 2, 3), at(1, 1, 9)), 0, at(2, 1, 9))])
    j7 = submitted(7, "carol", 1, NORMAL, at(31, 22))
    lives.append([j7, t.exited(ran(j7, on(WS1, 0), at(31, 23)), 0, at(1, 1, 11))])
    j8 = submitted(8, "dave", 1, NORMAL, at(14, 23))
    running = ran(j8, on(WS1, 3), at(15, 0)).evolve(stop_requested="cancel")
    lives.append([j8, t.exited(running, 143, at(15, 6))])
    lives.append([submitted(9, "alice", 1, NORMAL, at(30, 0))])
    return lives


def store_history(data_dir: Path) -> None:
    """Commit every version of every job into a TinyDB store in ``data_dir``, as the leader would have."""
    with TinyDBStore(data_dir) as store:
        for life in history():
            for version in life:
                store.commit([PutJob(encode_job(version))])


def start_usage_lab(data_dir: Path) -> LoopbackLeader:
    """A real leader on loopback over this history at ``NOW``, its nodes registered through the API, with
    ``tokens``: user -> token (none is an admin; the admin is ``root``)."""
    store_history(data_dir)
    lb = start_loopback_leader(data_dir, clock=FakeClock(NOW))
    lb.tokens = {user: lb.request("POST", "/v1/users", {"name": user})[2]["token"] for user in USERS}
    for node in NODES:
        status, _, doc = lb.request("POST", "/v1/agents/register", {"node": encode_node(node), "version": "0"},
                                    token=lb.join_token)
        assert status == 200, doc
    return lb
