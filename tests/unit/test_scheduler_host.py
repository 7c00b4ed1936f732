"""CPUs and memory placed with GPUs, as tables of situations: which CPUs a job gets, and why one waits for them."""

from __future__ import annotations

import pytest

from labq.models import Job, JobSpec, JobState, NodeAllocation, Placement, PriorityClass, Reservation
from labq.models.decisions import PendingReason
from labq.models.node import Node, cpu_list_text, parse_cpu_list
from labq.scheduler import Policy, schedule
from labq.topologies import parse_sim_spec
from tests.conftest import NOW, make_node

LOW, NORMAL, HIGH = int(PriorityClass.LOW), int(PriorityClass.NORMAL), int(PriorityClass.HIGH)
GIB = 1024
SOCKET0, SOCKET1 = parse_cpu_list("0-23,48-71"), parse_cpu_list("24-47,72-95")  # of sim:pcie-2socket


def node(name: str, inventory: str) -> Node:
    """A node as a current agent reports it: GPUs, CPUs, NUMA nodes and memory."""
    return parse_sim_spec(inventory).node(name)


class Lab:
    """Jobs with fresh ids: queued, or running on GPUs and holding CPUs and memory."""

    def __init__(self) -> None:
        self.next_id = 0

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    def queued(self, gpus: int = 1, **spec) -> Job:
        spec.setdefault("user", "alice")
        return Job(self._id(), JobSpec(command=("train",), gpus=gpus, **spec), submitted_at=NOW - 100)

    def running(self, where: Node, gpus: tuple[int, ...], cpus: str = "", memory_mib: int | None = None,
                started_at: float = NOW - 3600, **spec) -> Job:
        spec.setdefault("user", "bob")
        cpu_set = parse_cpu_list(cpus)
        alloc = NodeAllocation(where.name, gpus, tuple(where.gpus[i].uuid for i in gpus), 0, cpu_set,
                               float(len(cpu_set)) if cpu_set else None, memory_mib)
        return Job(self._id(), JobSpec(command=("train",), gpus=len(gpus), **spec), submitted_at=started_at - 60,
                   state=JobState.RUNNING, placement=Placement((alloc,)), started_at=started_at)


@pytest.fixture
def lab() -> Lab:
    return Lab()


def allocation(decisions, job: Job, index: int = 0) -> NodeAllocation:
    start = decisions.started(job.id)
    assert start is not None, f"job {job.id} did not start: {decisions.pending_for(job.id)}"
    return start.placement.allocations[index]


def local(inventory_node: Node, alloc: NodeAllocation) -> set[int]:
    """The CPUs of the NUMA nodes of an allocation's GPUs."""
    return {cpu for i in alloc.gpu_indices for cpu in inventory_node.gpus[i].local_cpus}


# -- which CPUs a job gets --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("gpus", "asked", "count", "cores", "memory_gib"), [
    (1, {}, 12, 12.0, 64),  # the node's share per GPU: 96 CPUs and 512 GiB over 8 GPUs
    (2, {}, 24, 24.0, 128),
    (8, {}, 96, 96.0, 512),
    (1, {"cpus": 4}, 4, 4.0, 64),
    (1, {"cpus": 2.5, "memory_mib": 10 * GIB}, 3, 2.5, 10),  # whole CPUs to itself, its quota as asked
    (2, {"cpus": 30, "memory_mib": 300 * GIB}, 30, 30.0, 300),  # more than one socket's share: still near
])
def test_a_job_gets_its_cpus_from_its_gpus_numa_node(lab, gpus, asked, count, cores, memory_gib):
    pcie = node("pcie", "sim:pcie-2socket")
    job = lab.queued(gpus, **asked)
    alloc = allocation(schedule([job], [pcie], now=NOW), job)
    assert len(alloc.cpu_set) == count and alloc.cpus == cores and alloc.memory_mib == memory_gib * GIB
    assert set(alloc.cpu_set) <= local(pcie, alloc) and alloc.far_cpus == 0


def test_the_first_cpus_of_a_numa_node_are_its_cores_before_their_hyperthreads(lab):
    pcie = node("pcie", "sim:pcie-2socket")
    job = lab.queued(1, cpus=4, node="pcie")
    alloc = allocation(schedule([job], [pcie], now=NOW), job)
    assert alloc.cpu_set == tuple(sorted(local(pcie, alloc)))[:4]
    assert cpu_list_text(alloc.cpu_set) in ("0-3", "24-27")


def test_a_job_over_both_sockets_takes_cpus_from_each_as_it_has_gpus_there(lab):
    pcie = node("pcie", "sim:pcie-2socket")
    busy = lab.running(pcie, (0, 1, 2, 4, 5, 6))  # GPUs 3 and 7 are left, one on each socket
    job = lab.queued(2, cpus=16)
    alloc = allocation(schedule([busy, job], [pcie], now=NOW), job)
    assert alloc.gpu_indices == (3, 7)
    assert len(set(alloc.cpu_set) & set(SOCKET0)) == 8 and len(set(alloc.cpu_set) & set(SOCKET1)) == 8


def test_jobs_of_one_pass_never_share_cpus_and_fill_a_node_exactly(lab):
    pcie = node("pcie", "sim:pcie-2socket")
    queue = [lab.queued(1) for _ in range(8)]
    d = schedule(queue, [pcie], now=NOW)
    sets = [set(allocation(d, job).cpu_set) for job in queue]
    assert sum(map(len, sets)) == len(set().union(*sets)) == 96
    assert all(s <= local(pcie, allocation(d, job)) for s, job in zip(sets, queue))


def test_a_job_goes_to_the_gpus_whose_numa_node_has_free_cpus(lab):
    pcie = node("pcie", "sim:pcie-2socket")
    hungry = lab.running(pcie, (0,), cpus="0-23,48-71")  # socket 0's CPUs, all of them
    job = lab.queued(1, cpus=8)
    alloc = allocation(schedule([hungry, job], [pcie], now=NOW), job)
    assert alloc.gpu_indices[0] >= 4 and set(alloc.cpu_set) <= set(SOCKET1) and alloc.far_cpus == 0


def test_cpus_come_from_the_other_socket_when_none_are_free_near_the_gpus_and_the_start_says_so(lab):
    pcie = node("pcie", "sim:pcie-2socket")
    far = lab.running(pcie, (4, 5, 6, 7), cpus="0-23,48-71")  # socket 1's GPUs, socket 0's CPUs
    job = lab.queued(1, cpus=8)
    alloc = allocation(schedule([far, job], [pcie], now=NOW), job)
    assert alloc.gpu_indices[0] < 4 and set(alloc.cpu_set) <= set(SOCKET1) and alloc.far_cpus == 8


def test_the_lab_default_per_gpu_applies_to_jobs_that_ask_for_none(lab):
    pcie = node("pcie", "sim:pcie-2socket")
    job, own = lab.queued(2), lab.queued(1, cpus=3, memory_mib=GIB)
    d = schedule([job, own], [pcie], now=NOW, policy=Policy(cpus_per_gpu=4, mem_per_gpu_mib=16 * GIB))
    assert (len(allocation(d, job).cpu_set), allocation(d, job).memory_mib) == (8, 32 * GIB)
    assert (len(allocation(d, own).cpu_set), allocation(d, own).memory_mib) == (3, GIB)


def test_a_lab_default_never_asks_more_than_the_node_has(lab):
    ws = node("ws", "sim:ws-4x3090")
    job = lab.queued(4)
    alloc = allocation(schedule([job], [ws], now=NOW, policy=Policy(cpus_per_gpu=32, mem_per_gpu_mib=100 * GIB)),
                       job)
    assert (len(alloc.cpu_set), alloc.memory_mib) == (48, 256 * GIB)


def test_a_gang_job_gets_cpus_and_memory_on_each_of_its_nodes(lab):
    a, b = node("a", "sim:dgx1"), node("b", "sim:dgx1")
    job = lab.queued(8, nodes=2, cpus=20, memory_mib=100 * GIB)
    d = schedule([job], [a, b], now=NOW)
    for i in range(2):
        alloc = allocation(d, job, i)
        where = a if alloc.node == "a" else b
        assert len(alloc.cpu_set) == 20 and alloc.memory_mib == 100 * GIB
        assert set(alloc.cpu_set) <= local(where, alloc)


def test_a_gang_job_goes_to_the_nodes_with_the_cpus_it_needs(lab):
    a, b, c = node("a", "sim:dgx1"), node("b", "sim:dgx1"), node("c", "sim:dgx1")
    busy = lab.running(b, (0,), cpus="0-75")  # b has its GPUs, not the CPUs
    job = lab.queued(8, nodes=2, cpus=20)
    d = schedule([busy, job], [a, b, c], now=NOW)
    assert sorted(x.node for x in d.started(job.id).placement.allocations) == ["a", "c"]


def test_a_job_in_a_reservation_gets_cpus_near_the_reserved_gpus(lab):
    pcie = node("pcie", "sim:pcie-2socket")
    booking = Reservation("r1", "alice", 2, NOW - 60, NOW + 3600, node="pcie", gpu_indices=(6, 7))
    job = lab.queued(2, reservation="r1", cpus=10)
    alloc = allocation(schedule([job], [pcie], now=NOW, reservations=[booking]), job)
    assert alloc.gpu_indices == (6, 7) and set(alloc.cpu_set) <= set(SOCKET1) and len(alloc.cpu_set) == 10


def test_a_sharing_job_needs_the_part_of_its_gpus_cpus_its_memory_is(lab):
    ws = node("ws", "sim:ws-4x3090")  # 12 CPUs and 64 GiB per GPU of 24 GiB
    job = lab.queued(1, share_mib=6 * GIB)
    alloc = allocation(schedule([job], [ws], now=NOW), job)
    assert (len(alloc.cpu_set), alloc.memory_mib) == (3, 16 * GIB)


# -- what a job waits for ---------------------------------------------------------------------------------------

def test_a_job_waiting_for_cpus_names_them(lab):
    ws = node("ws1", "sim:ws-4x3090")
    busy = lab.running(ws, (0,), cpus="0-39")
    job = lab.queued(1, cpus=16)
    pending = schedule([busy, job], [ws], now=NOW).pending_for(job.id)
    assert pending.reason is PendingReason.RESOURCES and pending.detail == "needs 16 CPUs; ws1 has 8 free"


def test_a_job_waiting_for_memory_names_it(lab):
    ws = node("ws1", "sim:ws-4x3090")
    busy = lab.running(ws, (0,), cpus="0-3", memory_mib=200 * GIB)
    job = lab.queued(1, memory_mib=64 * GIB)
    pending = schedule([busy, job], [ws], now=NOW).pending_for(job.id)
    assert pending.detail == "needs 64 GiB of memory; ws1 has 56 GiB free"


def test_a_gang_job_waiting_for_cpus_says_it_needs_them_on_each_node(lab):
    a, b = node("a", "sim:ws-4x3090"), node("b", "sim:ws-4x3090")
    busy = lab.running(b, (0,), cpus="0-39")
    job = lab.queued(4, nodes=2, cpus=16)
    pending = schedule([busy, job], [a, b], now=NOW).pending_for(job.id)
    assert pending.detail == "needs 16 CPUs on each of 2 nodes; b has 8 free"


def test_a_job_waiting_for_cpus_is_due_when_the_job_holding_them_ends(lab):
    ws = node("ws1", "sim:ws-4x3090")
    busy = lab.running(ws, (0,), cpus="0-39", time_limit_s=7200.0)  # ends an hour from now
    job = lab.queued(1, cpus=16)
    pending = schedule([busy, job], [ws], now=NOW).pending_for(job.id)
    assert pending.estimated_start == NOW + 3600


def test_a_smaller_job_starts_beside_one_that_waits_for_cpus(lab):
    ws = node("ws1", "sim:ws-4x3090")
    busy = lab.running(ws, (0,), cpus="0-39", time_limit_s=7200.0)
    top = lab.queued(1, cpus=16, priority=HIGH)
    small = lab.queued(1, cpus=4)
    d = schedule([busy, top, small], [ws], now=NOW)
    assert d.pending_for(top.id).estimated_start == NOW + 3600
    assert len(allocation(d, small).cpu_set) == 4


def test_a_sharing_job_waiting_for_cpus_names_them(lab):
    ws = node("ws1", "sim:ws-4x3090")
    busy = lab.running(ws, (0,), cpus="0-46")
    job = lab.queued(1, share_mib=6 * GIB, cpus=4)
    assert schedule([busy, job], [ws], now=NOW).pending_for(job.id).detail == "needs 4 CPUs; ws1 has 1 free"


@pytest.mark.parametrize(("asked", "said"), [
    ({"cpus": 64}, "asks for 64 CPUs but the largest node that has its GPUs (ws1) has 48; ask for --cpus 48 or fewer"),
    ({"memory_mib": 300 * GIB},
     "asks for 300 GiB of memory but the largest node that has its GPUs (ws1) has 256 GiB; ask for --mem 256G or less"),
    ({"cpus": 40, "nodes": 2, "gpus": 2},
     "asks for 40 CPUs on each of 2 nodes but only 1 node(s) that have its GPUs have that many CPUs"),
    ({"memory_mib": 100 * GIB, "nodes": 2, "gpus": 2},
     "asks for 100 GiB of memory on each of 2 nodes but only 1 node(s) that have its GPUs have that much"),
])
def test_a_job_asking_more_than_any_node_has_can_never_run(lab, asked, said):
    nodes = [node("ws1", "sim:ws-4x3090"), node("f1", "sim:flat:1")]  # 48 CPUs and 256 GiB; 4 CPUs and 64 GiB
    job = lab.queued(**{"gpus": 1, **asked})
    pending = schedule([job], nodes, now=NOW).pending_for(job.id)
    assert pending.reason is PendingReason.RESOURCES
    assert pending.detail == f"no node that is up can run it: {said}"


# -- preemption ---------------------------------------------------------------------------------------------------

def test_a_preemption_frees_the_cpus_with_the_gpus(lab):
    ws = node("ws1", "sim:ws-4x3090")
    low = lab.running(ws, (0, 1, 2, 3), cpus="0-47", priority=LOW)
    job = lab.queued(1, cpus=16, priority=HIGH)
    d = schedule([low, job], [ws], now=NOW)
    assert [p.job_id for p in d.preemptions] == [low.id]
    assert d.pending_for(job.id).reason is PendingReason.PREEMPTING


def test_no_job_is_preempted_for_gpus_whose_node_lacks_the_cpus(lab):
    ws = node("ws1", "sim:ws-4x3090")
    kept = lab.running(ws, (0,), cpus="0-39", preemptible=False)
    low = lab.running(ws, (1, 2, 3), cpus="40-43", priority=LOW)
    job = lab.queued(1, cpus=16, priority=HIGH)
    d = schedule([kept, low, job], [ws], now=NOW)
    assert d.preemptions == () and d.pending_for(job.id) is not None


# -- nodes of an older labq ----------------------------------------------------------------------------------------

def test_a_node_that_reports_no_cpus_or_memory_runs_jobs_by_gpus_alone(lab):
    old = make_node("old", "sim:ws-4x3090")  # as an older agent registers it: GPUs only
    job = lab.queued(2, cpus=16, memory_mib=64 * GIB)
    alloc = allocation(schedule([job], [old], now=NOW), job)
    assert alloc.gpu_indices == (0, 1) and alloc.cpu_set == () and alloc.cpus is None and alloc.memory_mib is None


def test_a_job_too_big_for_the_nodes_that_report_runs_on_one_that_does_not(lab):
    new, old = node("new", "sim:ws-4x3090"), make_node("old", "sim:ws-4x3090")
    job = lab.queued(1, cpus=100)
    assert allocation(schedule([job], [new, old], now=NOW), job).node == "old"


def test_jobs_without_requests_on_nodes_without_facts_decide_as_before(lab):
    old = make_node("old", "sim:dgx1")
    queue = [lab.queued(g) for g in (1, 2, 4, 1)]
    d = schedule(queue, [old], now=NOW)
    assert len(d.starts) == 4
    assert all(a.cpu_set == () and a.memory_mib is None for s in d.starts for a in s.placement.allocations)
