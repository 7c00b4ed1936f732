"""Sharing a GPU by memory: where the scheduler puts a job that shares, and what it never does."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labq.models import JobSpec, JobState, PendingReason, PriorityClass
from labq.models.job import Job
from labq.models.placement import NodeAllocation, Placement
from labq.models.sharing import limit_mib, margin_mib, need_mib, over_limit, room_mib
from labq.models import transitions as t
from labq.scheduler import Policy, schedule
from tests.conftest import NOW, make_node

GiB = 1024
A100 = 81920  #: sim:dgx-a100's GPUs
RTX3090 = 24576  #: sim:ws-4x3090's GPUs
LOW, NORMAL, HIGH, URGENT = (int(p) for p in PriorityClass)


def sharing(jobs, mib: int, **kw) -> Job:
    return jobs.queued(1, share_mib=mib, **kw)


def on_gpu(jobs, node, gpu: int, mib: int | None, **kw) -> Job:
    """A running job on ``gpu``: sharing with ``mib`` declared, or with the GPU to itself when ``mib`` is None."""
    return jobs.running(node, (gpu,), share_mib=mib, **kw)


def gpu_of(decisions, job_id) -> tuple[str, int]:
    start = decisions.started(job_id)
    assert start is not None, f"job {job_id} did not start: {decisions.pending_for(job_id)}"
    (alloc,) = start.placement.allocations
    (gpu,) = alloc.gpu_indices
    return alloc.node, gpu


# -- the rules, as numbers ----------------------------------------------------------------------


@pytest.mark.parametrize(("gpu_mib", "margin"), [(RTX3090, 1228), (A100, 4096), (8192, 512), (4096, 512)])
def test_margin_is_five_percent_and_at_least_512_mib(gpu_mib, margin):
    assert margin_mib(gpu_mib) == margin


@pytest.mark.parametrize(("memory", "declared", "unmanaged", "room"), [
    (A100, 0, 0, A100 - 4096),
    (A100, 30 * GiB, 0, A100 - 4096 - 30 * GiB),
    (A100, 30 * GiB, 21 * GiB, A100 - 4096 - 51 * GiB),  # someone's notebook outside labq counts
    (RTX3090, 20 * GiB, 4 * GiB, RTX3090 - 1228 - 24 * GiB),  # below zero: nothing more fits
])
def test_room_is_memory_less_margin_declarations_and_unmanaged_use(memory, declared, unmanaged, room):
    assert room_mib(memory, declared, unmanaged) == room


def test_a_job_is_placed_by_its_declaration_or_by_more_once_seen_using_more(jobs):
    job = sharing(jobs, 10 * GiB)
    assert need_mib(job) == 10 * GiB
    assert need_mib(job.evolve(gpu_mem_peak_mib=14 * GiB)) == 14 * GiB
    assert limit_mib(10 * GiB, A100) == 14 * GiB


def test_over_limit_names_only_the_jobs_past_their_limit():
    assert over_limit({"a": 100, "b": 100, "c": 100}, {"a": 100, "b": 101}) == ["b"]


@pytest.mark.parametrize(("spec", "error"), [
    ({"gpus": 2, "share_mib": 1024}, "--gpus 1"),
    ({"gpus": 1, "share_mib": 0}, "--gpu-mem"),
])
def test_a_sharing_spec_is_one_gpu_with_a_declaration(spec, error):
    with pytest.raises(ValueError, match=error):
        JobSpec(user="alice", command=("x",), **spec)


# -- placement ------------------------------------------------------------------------------------


def test_small_jobs_fill_one_gpu_before_opening_the_next(jobs):
    node = make_node("dgx", "sim:dgx-a100")
    small = [sharing(jobs, 10 * GiB) for _ in range(8)]  # 80 GiB declared: 7 fit beside the margin
    d = schedule(small, [node], now=NOW)
    gpus = [gpu_of(d, j.id) for j in small]
    first = gpus[0]
    assert gpus[:7] == [first] * 7
    assert gpus[7] != first


def test_a_node_that_does_not_share_takes_whole_gpu_jobs_alone(jobs):
    """A Slurm node (``Node.shares`` False): Slurm hands out whole GPUs and labq cannot watch their memory there.
    Jobs that ask for memory still go there when its GPUs have it; a sharing job never does, and says why."""
    slurm = make_node("slurm1", "sim:dgx-a100", shares=False)
    ws = make_node("ws", "sim:ws-4x3090")
    big, shared = jobs.queued(1, min_gpu_memory_mib=40 * GiB), sharing(jobs, 8 * GiB)
    pinned = sharing(jobs, 8 * GiB, node="slurm1")
    d = schedule([big, shared, pinned], [slurm, ws], now=NOW)
    assert d.started(big.id).placement.nodes == ("slurm1",)
    assert gpu_of(d, shared.id)[0] == "ws"
    assert d.started(pinned.id) is None
    assert d.pending_for(pinned.id).detail == ("no node that is up can run it: shares a GPU (--share), and node "
                                               "slurm1 does not let jobs share its "
                                               "GPUs (a Slurm node hands out whole GPUs, and their memory is not "
                                               "watched there): submit it without --share")
    alone = schedule([sharing(jobs, 8 * GiB)], [slurm], now=NOW)
    assert "no node of the lab does let jobs share" in alone.pending[0].detail


def test_whether_a_node_shares_goes_over_the_wire_and_into_the_store():
    from labq.protocol.agents import parse_node
    from labq.protocol.codec import decode_node, encode_node

    slurm = make_node("slurm1", "sim:dgx-a100", shares=False)
    assert parse_node(encode_node(slurm)).shares is False and decode_node(encode_node(slurm)).shares is False
    ws = make_node("ws", "sim:ws-4x3090")
    assert "shares" not in encode_node(ws)  # an agent or a store from before says nothing: it shares
    assert parse_node(encode_node(ws)).shares is True and decode_node(encode_node(ws)).shares is True


def test_a_running_shared_gpu_is_filled_before_a_free_one_is_opened(jobs):
    node = make_node("dgx", "sim:dgx-a100")
    there = on_gpu(jobs, node, 5, 40 * GiB)
    job = sharing(jobs, 30 * GiB)
    d = schedule([there, job], [node], now=NOW)
    assert gpu_of(d, job.id) == ("dgx", 5)


def test_the_fullest_gpu_with_room_is_joined(jobs):
    node = make_node("dgx", "sim:dgx-a100")
    roomy, tight = on_gpu(jobs, node, 1, 10 * GiB), on_gpu(jobs, node, 2, 50 * GiB)
    job = sharing(jobs, 20 * GiB)
    d = schedule([roomy, tight, job], [node], now=NOW)
    assert gpu_of(d, job.id) == ("dgx", 2)  # 76 GiB of 80 with the margin: the best fit


def test_the_margin_keeps_the_last_job_off(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    a, b = on_gpu(jobs, node, 0, 11 * GiB), sharing(jobs, 11 * GiB)
    c = sharing(jobs, 1 * GiB)  # 23 GiB declared + 1.2 GiB margin > 24 GiB: c goes elsewhere
    d = schedule([a, b, c], [node], now=NOW)
    assert gpu_of(d, b.id) == ("ws", 0)
    assert gpu_of(d, c.id) != ("ws", 0)


def test_memory_used_outside_labq_counts_and_such_a_gpu_is_filled_first(jobs):
    node = replace(make_node("ws", "sim:ws-4x3090"), unmanaged_busy=frozenset({0}), unmanaged_mib=((0, 20 * GiB),))
    fits, too_big = sharing(jobs, 2 * GiB), sharing(jobs, 4 * GiB)
    d = schedule([fits, too_big], [node], now=NOW)
    assert gpu_of(d, fits.id) == ("ws", 0)  # 24 - 1.2 - 20 = 2.8 GiB of room
    assert gpu_of(d, too_big.id) != ("ws", 0)


def test_a_gpu_a_job_has_to_itself_is_never_joined(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    whole = [on_gpu(jobs, node, g, None) for g in (0, 1, 2)]
    job = sharing(jobs, 1 * GiB)
    d = schedule([*whole, job], [node], now=NOW)
    assert gpu_of(d, job.id) == ("ws", 3)
    d = schedule([*whole, on_gpu(jobs, node, 3, None), job], [node], now=NOW)
    assert d.started(job.id) is None
    assert d.pending_for(job.id).reason is PendingReason.RESOURCES
    assert "left to share" in d.pending_for(job.id).detail


def test_a_shared_gpu_is_never_given_to_a_job_that_wants_it_whole(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    shared = [on_gpu(jobs, node, g, 1 * GiB, preemptible=False) for g in range(4)]
    whole = jobs.queued(1)
    d = schedule([*shared, whole], [node], now=NOW)
    assert d.started(whole.id) is None


def test_opening_a_gpu_keeps_nvlink_pairs_whole(jobs):
    node = make_node("ws", "sim:ws-4x3090")  # pairs 0-1 and 2-3
    busy = on_gpu(jobs, node, 2, None)
    job = sharing(jobs, 1 * GiB)
    d = schedule([busy, job], [node], now=NOW)
    assert gpu_of(d, job.id) == ("ws", 3)  # the broken pair's other half, not a whole pair


def test_a_job_seen_using_more_is_placed_by_what_it_used(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    there = on_gpu(jobs, node, 0, 12 * GiB)
    job = sharing(jobs, 8 * GiB).evolve(gpu_mem_peak_mib=14 * GiB)
    d = schedule([there, job], [node], now=NOW)
    assert gpu_of(d, job.id) != ("ws", 0)  # by its declaration it fits beside the other; by its use, not


def test_a_declaration_no_gpu_can_hold_says_so(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    job = sharing(jobs, 24 * GiB)
    d = schedule([job], [node], now=NOW)
    pending = d.pending_for(job.id)
    assert pending.reason is PendingReason.RESOURCES
    assert "declares 24 GiB of GPU memory to share a GPU" in pending.detail


def test_a_model_filter_holds_for_sharing_jobs(jobs):
    a100, ws = make_node("dgx", "sim:dgx-a100"), make_node("ws", "sim:ws-4x3090")
    job = sharing(jobs, 2 * GiB, gpu_model="3090")
    d = schedule([job], [a100, ws], now=NOW)
    assert gpu_of(d, job.id)[0] == "ws"


# -- preemption --------------------------------------------------------------------------------


def test_a_sharing_job_alone_on_its_gpu_is_preempted_by_the_usual_rules(jobs):
    node = make_node("ws", "sim:flat:1")
    low = on_gpu(jobs, node, 0, 2 * GiB, priority=LOW, preemptible=True)
    urgent = jobs.queued(1, priority=URGENT)
    d = schedule([low, urgent], [node], now=NOW, policy=Policy())
    assert [p.job_id for p in d.preemptions] == [low.id]


def test_sharing_jobs_together_on_a_gpu_are_not_preempted_one_by_one(jobs):
    node = make_node("ws", "sim:flat:1")
    lows = [on_gpu(jobs, node, 0, 2 * GiB, priority=LOW, preemptible=True) for _ in range(2)]
    urgent = jobs.queued(1, priority=URGENT)
    d = schedule([*lows, urgent], [node], now=NOW, policy=Policy())
    assert d.preemptions == ()
    assert d.started(urgent.id) is None


def test_a_sharing_job_preempts_nobody(jobs):
    node = make_node("ws", "sim:flat:1")
    low = on_gpu(jobs, node, 0, None, priority=LOW, preemptible=True)
    urgent = sharing(jobs, 1 * GiB, priority=URGENT)
    d = schedule([low, urgent], [node], now=NOW, policy=Policy())
    assert d.preemptions == ()
    assert d.pending_for(urgent.id).reason is PendingReason.RESOURCES


# -- over its declaration ---------------------------------------------------------------------


def test_a_job_over_its_declaration_is_stopped_and_requeued_with_what_it_used(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    job = on_gpu(jobs, node, 0, 8 * GiB)
    stopped = t.over_memory(job, 10 * GiB, "stopped: over")
    assert stopped.stop_requested == "over_memory" and stopped.gpu_mem_peak_mib == 10 * GiB
    assert stopped.note == "stopped: over"
    saved = t.exited(stopped, 0, NOW)
    assert saved.state is JobState.QUEUED and saved.attempt == 2 and saved.preemptions == 0
    assert saved.history[-1].ended.value == "checkpointed"
    assert saved.gpu_mem_peak_mib == 10 * GiB
    crashed = t.exited(stopped, 1, NOW)
    assert crashed.state is JobState.QUEUED and crashed.history[-1].ended.value == "over_memory"


def test_a_stop_already_asked_stays_the_one_asked(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    job = on_gpu(jobs, node, 0, 8 * GiB).evolve(stop_requested="cancel")
    assert t.over_memory(job, 10 * GiB, "over").stop_requested == "cancel"


# -- what a pass never does, whatever the lab looks like ------------------------------------------


@st.composite
def labs(draw):
    node = make_node("ws", "sim:ws-4x3090")
    unmanaged = draw(st.dictionaries(st.integers(0, 3), st.integers(1, 20 * GiB), max_size=2))
    node = replace(node, unmanaged_busy=frozenset(unmanaged), unmanaged_mib=tuple(sorted(unmanaged.items())))
    ids = iter(range(1, 1000))
    running = []
    for gpu in range(4):
        if gpu in unmanaged:
            continue
        if draw(st.booleans()):
            running.append(Job(next(ids), JobSpec(user="bob", command=("x",)), NOW - 100, JobState.RUNNING,
                               placement=Placement((NodeAllocation("ws", (gpu,), (node.gpus[gpu].uuid,)),)),
                               started_at=NOW - 50))
    queued = [Job(next(ids), JobSpec(user=draw(st.sampled_from(["alice", "carol"])), command=("x",),
                                     share_mib=draw(st.integers(256, 12 * GiB)) if draw(st.booleans()) else None),
                  NOW - 10) for _ in range(draw(st.integers(1, 12)))]
    return node, running, queued


@settings(max_examples=150, deadline=None)
@given(labs())
def test_declared_memory_never_passes_a_gpus_size_and_no_gpu_is_both_whole_and_shared(lab):
    node, running, queued = lab
    jobs = running + queued
    for _ in range(3):  # a few passes, each starting what the last decided
        d = schedule(jobs, [node], now=NOW)
        started = {s.job_id: s.placement for s in d.starts}
        jobs = [j.evolve(state=JobState.RUNNING, placement=started[j.id], started_at=NOW) if j.id in started else j
                for j in jobs]
    declared: dict[int, int] = {}
    whole: dict[int, int] = {}
    for job in jobs:
        if job.state is not JobState.RUNNING:
            continue
        (gpu,) = job.placement.allocations[0].gpu_indices
        if job.spec.share_mib is None:
            whole[gpu] = whole.get(gpu, 0) + 1
        else:
            declared[gpu] = declared.get(gpu, 0) + job.spec.share_mib
    for gpu, mib in declared.items():
        memory = node.gpus[gpu].memory_mib
        assert mib + node.unmanaged_on(gpu) + margin_mib(memory) <= memory
        assert gpu not in whole
    assert all(n == 1 for n in whole.values())
    assert not set(whole) & node.unmanaged_busy
