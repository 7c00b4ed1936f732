"""Scheduling passes as tables of situations: who starts where, whom to preempt, why the rest wait."""

from __future__ import annotations

import pytest

from labq.models import (
    Job, JobSpec, JobState, NodeAllocation, NodeHealth, PendingReason, Placement, PriorityClass, Reservation,
)
from labq.scheduler import Policy, schedule
from tests.conftest import NOW, make_node

LOW, NORMAL, HIGH, URGENT = (int(p) for p in PriorityClass)


def gpus_of(decisions, job_id):
    start = decisions.started(job_id)
    assert start is not None, f"job {job_id} did not start: {decisions.pending_for(job_id)}"
    return [(a.node, a.gpu_indices) for a in start.placement.allocations]


# -- placement across nodes --------------------------------------------------------------


def test_two_gpu_job_goes_to_the_node_it_fragments_least(jobs):
    a, b = make_node("a", "sim:ws-4x3090"), make_node("b", "sim:ws-4x3090")
    busy = jobs.running(b, (0, 1))
    job = jobs.queued(2)
    d = schedule([busy, job], [a, b], now=NOW)
    assert gpus_of(d, job.id) == [("b", (2, 3))]  # node a keeps all four GPUs free


def test_one_gpu_job_fills_the_hole_before_opening_an_empty_node(jobs):
    a, b = make_node("a", "sim:dgx1"), make_node("b", "sim:dgx1")
    busy = jobs.running(b, (0, 1, 2, 3, 4, 5, 6))
    job = jobs.queued(1)
    d = schedule([busy, job], [a, b], now=NOW)
    assert gpus_of(d, job.id) == [("b", (7,))]


def test_better_connected_set_wins_over_a_fuller_node(jobs):
    pcie, ws = make_node("pcie", "sim:pcie-2socket"), make_node("ws", "sim:ws-4x3090")
    job = jobs.queued(2)
    d = schedule([job], [pcie, ws], now=NOW)
    assert gpus_of(d, job.id) == [("ws", (0, 1))]  # NVLink bridge beats a PCIe switch pair
    assert d.started(job.id).placement.score == 4002


def test_jobs_in_one_pass_never_share_gpus_and_pack_nvlink_pairs(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    one_a, one_b, two = jobs.queued(1), jobs.queued(1), jobs.queued(2)
    d = schedule([one_a, one_b, two], [node], now=NOW)
    assert sorted(gpus_of(d, one_a.id) + gpus_of(d, one_b.id)) == [("ws", (0,)), ("ws", (1,))]
    assert gpus_of(d, two.id) == [("ws", (2, 3))]


def test_gang_never_splits_a_single_node_job(jobs):
    a, b = make_node("a", "sim:ws-4x3090"), make_node("b", "sim:ws-4x3090")
    busy = [jobs.running(a, (0,)), jobs.running(b, (3,))]
    job = jobs.queued(4)
    d = schedule([*busy, job], [a, b], now=NOW)
    assert d.started(job.id) is None
    pending = d.pending_for(job.id)
    assert pending.reason is PendingReason.RESOURCES
    assert "at most 3 free together" in pending.detail


def test_multi_node_job_gets_its_gpus_on_distinct_nodes_at_once(jobs):
    a, b, c = (make_node(n, "sim:ws-4x3090") for n in "abc")
    busy = jobs.running(c, (0, 1, 2))
    job = jobs.queued(4, nodes=2)
    d = schedule([busy, job], [a, b, c], now=NOW)
    assert gpus_of(d, job.id) == [("a", (0, 1)), ("b", (0, 1))]


def test_filters_memory_model_node_and_unmanaged_gpus(jobs):
    ws = make_node("ws", "sim:ws-4x3090", unmanaged_busy=frozenset({0, 1}))
    a100 = make_node("big", "sim:dgx-a100")
    small = jobs.queued(2, gpu_model="3090")
    big_mem = jobs.queued(1, min_gpu_memory_mib=40 * 1024)
    pinned = jobs.queued(1, node="ws")
    d = schedule([small, big_mem, pinned], [ws, a100], now=NOW)
    assert gpus_of(d, small.id) == [("ws", (2, 3))]  # 0 and 1 are busy with someone's notebook
    assert gpus_of(d, big_mem.id)[0][0] == "big"
    assert d.pending_for(pinned.id).reason is PendingReason.RESOURCES


def test_a_job_that_waits_for_gpus_busy_outside_labq_is_told_so(jobs):
    """A notebook nobody queued, or a Slurm node its own scheduler took back, holds the GPUs the job could use."""
    ws = make_node("ws", "sim:ws-4x3090", unmanaged_busy=frozenset({0, 1, 2, 3}))
    other = make_node("other", "sim:ws-4x3090", unmanaged_busy=frozenset({1}))
    busy = [jobs.running(other, (0, 2, 3))]
    pinned, anywhere = jobs.queued(1, node="ws"), jobs.queued(2)
    d = schedule([*busy, pinned, anywhere], [ws, other], now=NOW)
    assert d.pending_for(pinned.id).detail.endswith("none is free; busy outside labq: 4 on ws")
    assert d.pending_for(anywhere.id).detail.endswith("none is free; busy outside labq: 4 on ws, 1 on other")


def test_nodes_that_are_not_up_take_no_new_jobs(jobs):
    draining = make_node("a", "sim:dgx1", health=NodeHealth.DRAINING)
    lost = make_node("b", "sim:dgx1", health=NodeHealth.LOST)
    job = jobs.queued(1)
    d = schedule([job], [draining, lost], now=NOW)
    assert d.starts == ()
    assert d.pending_for(job.id).reason is PendingReason.RESOURCES


# -- order -------------------------------------------------------------------------------


def test_order_is_priority_then_fair_share_then_submit_time(jobs):
    node = make_node("ws", "sim:flat:1")
    early_normal = jobs.queued(1, user="carol", submitted_at=NOW - 500)
    heavy_user_high = jobs.queued(1, user="dave", priority=HIGH, submitted_at=NOW - 10)
    light_user_high = jobs.queued(1, user="erin", priority=HIGH, submitted_at=NOW - 5)
    queue = [early_normal, heavy_user_high, light_user_high]
    d = schedule(queue, [node], now=NOW, usage={"dave": 120.0, "erin": 3.0}, policy=Policy(preemption=False))
    assert [s.job_id for s in d.starts] == [light_user_high.id]
    d = schedule(queue, [node], now=NOW, usage={}, policy=Policy(preemption=False))
    assert [s.job_id for s in d.starts] == [heavy_user_high.id]  # equal usage: earlier submit


# -- preemption --------------------------------------------------------------------------


def test_empty_node_is_used_before_anything_is_preempted(jobs):
    a, b = make_node("a", "sim:dgx1"), make_node("b", "sim:dgx1")
    victims = [jobs.running(a, (i,), priority=LOW) for i in range(8)]
    urgent = jobs.queued(2, priority=URGENT)
    d = schedule([*victims, urgent], [a, b], now=NOW)
    assert d.preemptions == ()
    assert gpus_of(d, urgent.id) == [("b", (2, 3))]


def test_one_small_victim_beats_one_big_low_class_victim(jobs):
    a, b = make_node("a", "sim:dgx1"), make_node("b", "sim:ws-4x3090")
    big_low = jobs.running(a, tuple(range(8)), priority=LOW)
    small = [jobs.running(b, (i,), priority=NORMAL) for i in range(4)]
    urgent = jobs.queued(1, priority=URGENT)
    d = schedule([big_low, *small, urgent], [a, b], now=NOW)
    assert len(d.preemptions) == 1
    victim = d.preemptions[0]
    assert victim.job_id in {j.id for j in small} and victim.for_job == urgent.id
    assert d.pending_for(urgent.id).reason is PendingReason.PREEMPTING


def test_two_gpu_urgent_job_evicts_exactly_the_gpus_it_needs(jobs):
    node = make_node("a", "sim:dgx1")
    ones = [jobs.running(node, (i,), priority=LOW) for i in range(8)]
    urgent = jobs.queued(2, priority=URGENT)
    d = schedule([*ones, urgent], [node], now=NOW)
    assert sorted(p.gpu_indices for p in d.preemptions) == [(2,), (3,)]  # the best pair, NV2 on one switch
    assert "then it runs on GPUs 2,3 on a" in d.pending_for(urgent.id).detail


def test_a_free_gpu_counts_so_only_one_victim_is_needed(jobs):
    node = make_node("a", "sim:dgx1")
    ones = [jobs.running(node, (i,), priority=LOW) for i in range(7)]  # GPU 7 free
    urgent = jobs.queued(2, priority=URGENT)
    d = schedule([*ones, urgent], [node], now=NOW)
    assert [p.gpu_indices for p in d.preemptions] == [(6,)]  # 6+7: NV2 under one switch


@pytest.mark.parametrize(
    ("victims", "expected"),
    [
        # (priority, started minutes ago, checkpointed minutes ago) per 1-GPU job on GPU i
        ([(NORMAL, 60, None), (LOW, 60, None)], 1),  # lowest class first
        ([(LOW, 60, None), (LOW, 60, 2)], 1),  # least work lost since the last checkpoint
        ([(LOW, 60, None), (LOW, 30, None)], 1),  # ... or since start
        ([(LOW, 2, None), (NORMAL, 60, None)], 1),  # the low one has not run its minimum 5 minutes
    ],
)
def test_victim_choice_table(jobs, victims, expected):
    node = make_node("a", "sim:flat:2")
    running = [
        jobs.running(node, (i,), priority=prio, started_at=NOW - started * 60,
                     last_checkpoint_at=None if ckpt is None else NOW - ckpt * 60)
        for i, (prio, started, ckpt) in enumerate(victims)
    ]
    urgent = jobs.queued(1, priority=URGENT)
    d = schedule([*running, urgent], [node], now=NOW)
    assert [p.job_id for p in d.preemptions] == [running[expected].id]


@pytest.mark.parametrize(
    ("victim_kw", "preemptor_priority"),
    [
        ({"priority": URGENT}, URGENT),  # equal priority
        ({"priority": URGENT + 50}, URGENT),  # higher
        ({"priority": LOW, "preemptible": False}, URGENT),
        ({"priority": LOW, "started_at": NOW - 60}, URGENT),  # under the minimum runtime
    ],
)
def test_never_preempted(jobs, victim_kw, preemptor_priority):
    node = make_node("a", "sim:flat:1")
    running = jobs.running(node, (0,), **victim_kw)
    preemptor = jobs.queued(1, priority=preemptor_priority)
    d = schedule([running, preemptor], [node], now=NOW)
    assert d.preemptions == ()
    assert d.pending_for(preemptor.id).reason is PendingReason.RESOURCES


@pytest.mark.parametrize(("victim", "preemptor", "allowed"), [
    (LOW, URGENT, True), (NORMAL, URGENT, True), (HIGH, URGENT, False),  # urgent may take low and normal only
    (LOW, HIGH, True), (NORMAL, HIGH, False),
    (LOW, NORMAL, False),  # a class the rules leave out preempts nothing
    (LOW + 50, HIGH + 20, True),  # in-between priorities belong to the class at or below them
])
def test_admin_rules_say_which_classes_preempt_which(jobs, victim, preemptor, allowed):
    node = make_node("a", "sim:flat:1")
    running = jobs.running(node, (0,), priority=victim)
    waiting = jobs.queued(1, priority=preemptor)
    rules = {URGENT: frozenset({LOW, NORMAL}), HIGH: frozenset({LOW})}
    d = schedule([running, waiting], [node], now=NOW, policy=Policy(may_preempt=rules))
    assert [p.job_id for p in d.preemptions] == ([running.id] if allowed else [])


def test_a_job_preempted_too_often_today_is_left_alone(jobs):
    from labq.models.job import Attempt, AttemptEnd, StopReason

    node = make_node("a", "sim:flat:2")

    def preempted(hours_ago: float) -> Attempt:
        return Attempt(1, None, NOW - hours_ago * 3600 - 600, NOW - hours_ago * 3600, AttemptEnd.CHECKPOINTED,
                       0, StopReason.PREEMPTED)

    twice_today = jobs.running(node, (0,), priority=LOW, history=(preempted(2), preempted(5)),
                               last_checkpoint_at=NOW - 60)  # the cheapest victim, were it not for the cap
    once_today = jobs.running(node, (1,), priority=LOW, history=(preempted(30), preempted(3)))
    urgent = jobs.queued(1, priority=URGENT)
    d = schedule([twice_today, once_today, urgent], [node], now=NOW)
    assert [p.job_id for p in d.preemptions] == [twice_today.id]
    policy = Policy(max_preemptions_per_day=2)
    d = schedule([twice_today, once_today, urgent], [node], now=NOW, policy=policy)
    assert [p.job_id for p in d.preemptions] == [once_today.id]
    capped = once_today.evolve(history=(*once_today.history, preempted(1)))
    d = schedule([twice_today, capped, urgent], [node], now=NOW, policy=policy)
    assert d.preemptions == ()
    assert d.pending_for(urgent.id).reason is PendingReason.RESOURCES


def test_preemption_can_be_turned_off(jobs):
    node = make_node("a", "sim:flat:1")
    running = jobs.running(node, (0,), priority=LOW)
    urgent = jobs.queued(1, priority=URGENT)
    d = schedule([running, urgent], [node], now=NOW, policy=Policy(preemption=False))
    assert d.preemptions == ()


def test_gpus_being_freed_are_held_for_the_preemptor(jobs):
    node = make_node("a", "sim:ws-4x3090")
    low = [jobs.running(node, (i,), priority=LOW) for i in (0, 1, 2)]  # GPU 3 free
    urgent = jobs.queued(2, priority=URGENT)
    small = jobs.queued(1, priority=LOW)  # cannot preempt its equals, so it needs a free GPU
    d = schedule([*low, urgent, small], [node], now=NOW)
    assert [p.gpu_indices for p in d.preemptions] == [(2,)]
    # GPU 3 is free now but held for the urgent job: the low job may not take it
    assert d.started(small.id) is None
    assert d.pending_for(small.id).reason is PendingReason.PRIORITY
    assert d.pending_for(small.id).waiting_for == urgent.id


def test_next_pass_waits_for_the_victim_and_keeps_the_promised_gpus(jobs):
    node = make_node("a", "sim:ws-4x3090")
    low = [jobs.running(node, (i,), priority=LOW) for i in (0, 1)]
    victim = jobs.running(node, (2,), priority=LOW, state=JobState.PREEMPTING)
    urgent = jobs.queued(2, priority=URGENT)
    victim = victim.evolve(preempted_for=urgent.id)
    higher = jobs.queued(1, priority=URGENT + 100)
    d = schedule([*low, victim, urgent, higher], [node], now=NOW)
    pending = d.pending_for(urgent.id)
    assert pending.reason is PendingReason.PREEMPTING and pending.waiting_for == victim.id
    # nothing more is preempted for the urgent job, and even a higher job keeps off
    # GPU 2 (being freed) and GPU 3 (free, promised to complete the urgent job's pair)
    assert all(p.for_job == higher.id for p in d.preemptions)
    assert d.started(higher.id) is None
    assert [p.gpu_indices for p in d.preemptions] == [(0,)]
    # once the victim has gone, the urgent job starts on the GPUs held for it
    d = schedule([*low, urgent], [node], now=NOW + 30)
    assert gpus_of(d, urgent.id) == [("a", (2, 3))]


@pytest.mark.parametrize(("stop", "words"), [("cancel", "is being cancelled"),
                                            ("timeout", "is stopping at its time limit")])
def test_gpus_a_stopping_job_gives_back_are_waited_for_not_won_by_preempting(jobs, stop, words):
    """A job that is stopping for its own reasons (cancelled, at its time limit) leaves its GPUs whatever a pass
    decides: a job that needs GPUs waits for those rather than preempting other work, and none takes it as a
    victim. (The race of tests/e2e/test_two_teams.py: a job submitted just after a cancel preempted a low job,
    then started on the cancelled job's GPU, and its victim lost its work for nothing.)"""
    node = make_node("a", "sim:ws-4x3090")
    low = jobs.running(node, (0,), priority=LOW)
    stopping = jobs.running(node, (1,), priority=LOW, stop_requested=stop)
    others = [jobs.running(node, (i,)) for i in (2, 3)]
    normal = jobs.queued(1)
    d = schedule([low, stopping, *others, normal], [node], now=NOW)
    assert d.preemptions == ()
    pending = d.pending_for(normal.id)
    assert (pending.reason, pending.waiting_for) == (PendingReason.RESOURCES, stopping.id)
    assert pending.detail == f"job {stopping.id} {words}; then it runs on GPUs 1 on a"
    # a second job may preempt the low one, not the stopping one, nor take the GPU the first waits for
    second = jobs.queued(1)
    d = schedule([low, stopping, *others, normal, second], [node], now=NOW)
    assert [(p.job_id, p.for_job) for p in d.preemptions] == [(low.id, second.id)]
    assert d.pending_for(normal.id) == pending
    # once it has gone, the job starts on its GPU
    assert gpus_of(schedule([low, *others, normal], [node], now=NOW + 5), normal.id) == [("a", (1,))]


def test_a_victim_whose_preemptor_no_longer_waits_frees_its_gpus_for_the_next_job(jobs):
    """A victim still checkpointing for a job that started elsewhere (or was cancelled) gives its GPUs back all
    the same: the next job that needs them waits for them instead of preempting another job."""
    node = make_node("a", "sim:ws-4x3090")
    low = [jobs.running(node, (i,), priority=LOW) for i in (0, 1, 2)]
    started = jobs.running(make_node("b", "sim:ws-4x3090"), (0,), priority=URGENT)
    orphan = jobs.running(node, (3,), priority=LOW, state=JobState.PREEMPTING, preempted_for=started.id)
    urgent, after = jobs.queued(1, priority=URGENT), jobs.queued(1, priority=URGENT)
    d = schedule([*low, orphan, started, urgent, after], [node], now=NOW)
    pending = d.pending_for(urgent.id)
    assert (pending.reason, pending.waiting_for) == (PendingReason.PREEMPTING, orphan.id)
    assert pending.detail == f"job {orphan.id} is checkpointing; then it runs on GPUs 3 on a"
    assert [p.for_job for p in d.preemptions] == [after.id]  # one victim, for the job after it
    assert d.pending_for(after.id).waiting_for == d.preemptions[0].job_id != orphan.id



def test_on_a_node_that_hands_jobs_over_the_preemptor_starts_while_its_victims_checkpoint(jobs):
    """A node whose own scheduler starts a job only once its GPUs are free (a Slurm node) is handed the preemptor
    with the victims' signals: it waits there, and starts the moment they end, where labq would hand it over only
    after hearing of their end (Slurm then starts it on a tick of its own: seconds)."""
    slurm = make_node("s", "sim:ws-4x3090", shares=False, hands_over=True)
    low = [jobs.running(slurm, (i,), priority=LOW) for i in (0, 1, 2)]  # GPU 3 free
    urgent, small = jobs.queued(2, priority=URGENT), jobs.queued(1, priority=LOW)
    d = schedule([*low, urgent, small], [slurm], now=NOW)
    assert [(p.job_id, p.for_job, p.gpu_indices) for p in d.preemptions] == [(low[2].id, urgent.id, (2,))]
    assert gpus_of(d, urgent.id) == [("s", (2, 3))]
    assert d.started(small.id) is None and d.pending_for(small.id).reason is PendingReason.RESOURCES
    # the next pass: the victim checkpoints, its preemptor waits in Slurm on its GPU. That GPU is no longer on its
    # way back to the lab, so a job that needs one preempts the next low job (and is handed over too) rather than
    # waiting for a GPU that will never be free
    victim = low[2].evolve(state=JobState.PREEMPTING, preempted_for=urgent.id)
    handed = urgent.evolve(state=JobState.STARTING, placement=d.started(urgent.id).placement)
    normal = jobs.queued(1)
    d = schedule([low[0], low[1], victim, handed, normal], [slurm], now=NOW + 1)
    [preempt] = d.preemptions
    assert preempt.for_job == normal.id and preempt.gpu_indices in ((0,), (1,))
    assert gpus_of(d, normal.id) == [("s", preempt.gpu_indices)]


def test_a_job_is_handed_over_early_only_where_every_node_it_needs_hands_jobs_over(jobs):
    """A native node starts what it is given at once, on GPUs its victim may still use: the preemptor waits."""
    slurm = make_node("s", "sim:ws-4x3090", shares=False, hands_over=True)
    native = make_node("w", "sim:ws-4x3090")
    low = [jobs.running(n, (i,), priority=LOW) for n in (slurm, native) for i in range(4)]
    both = jobs.queued(8, nodes=2, priority=URGENT)
    d = schedule([*low, both], [slurm, native], now=NOW)
    assert len(d.preemptions) == 8 and d.started(both.id) is None
    assert d.pending_for(both.id).reason is PendingReason.PREEMPTING
    alone = jobs.queued(4, priority=URGENT)
    d = schedule([*low, alone], [slurm, native], now=NOW)
    started = d.started(alone.id)
    planned = {p.node for p in d.preemptions}
    assert (started is not None) == (planned == {"s"}), (planned, started)


def test_a_victim_on_several_nodes_handed_over_on_one_is_no_victim_on_the_others(jobs):
    """A job handed over early preempts a job that also runs elsewhere: the pass forgets what it had worked out on
    every node that victim is on (as it does for a preemptor that waits), so a second job does not count on
    taking it again there: it waits for a plan of its own. (A review found the second job held the victim's
    other GPUs with "job  is checkpointing" for its reason, and its queue promised none of them.)"""
    slurm = make_node("a", "sim:ws-4x3090", shares=False, hands_over=True)
    native = make_node("b", "sim:ws-4x3090")
    on = Placement(tuple(NodeAllocation(n.name, (0, 1), (n.gpus[0].uuid, n.gpus[1].uuid)) for n in (slurm, native)))
    wide = Job(100, JobSpec(user="bob", command=("x",), gpus=4, nodes=2, priority=LOW), submitted_at=NOW - 4000,
               state=JobState.RUNNING, placement=on, started_at=NOW - 3600)
    kept = [jobs.running(n, (2, 3), preemptible=False) for n in (slurm, native)]
    first, second = jobs.queued(2, priority=URGENT), jobs.queued(2, priority=URGENT)
    d = schedule([wide, *kept, first, second], [slurm, native], now=NOW)
    assert [(p.job_id, p.for_job) for p in d.preemptions] == [(wide.id, first.id)]
    assert gpus_of(d, first.id) == [("a", (0, 1))]
    pending = d.pending_for(second.id)
    assert (pending.reason, pending.detail) == (PendingReason.RESOURCES,
                                                "needs 2 suitable GPUs on one node; none is free")

def test_whether_a_node_hands_jobs_over_travels_from_its_agent_and_through_the_store():
    from labq.protocol.agents import parse_node
    from labq.protocol.codec import decode_node, encode_node

    slurm, ws = make_node("s", "sim:ws-4x3090", hands_over=True), make_node("w", "sim:ws-4x3090")
    assert parse_node(encode_node(slurm)).hands_over is True and decode_node(encode_node(slurm)).hands_over is True
    assert "hands_over" not in encode_node(ws)  # an agent or a store from before says nothing: it starts at once
    assert parse_node(encode_node(ws)).hands_over is False and decode_node(encode_node(ws)).hands_over is False

# -- backfill and estimates ----------------------------------------------------------------


def test_backfill_only_when_the_time_limit_ends_before_the_held_gpus_are_due(jobs):
    node = make_node("a", "sim:dgx1")
    running = jobs.running(node, (0, 1, 2, 3), priority=HIGH, time_limit_s=3600, started_at=NOW - 600)
    big = jobs.queued(8, priority=HIGH)
    short = jobs.queued(1, priority=LOW, time_limit_s=1800)
    long = jobs.queued(1, priority=LOW, time_limit_s=4 * 3600)
    unlimited = jobs.queued(1, priority=LOW)
    d = schedule([running, big, short, long, unlimited], [node], now=NOW)
    assert d.pending_for(big.id).reason is PendingReason.RESOURCES
    assert d.pending_for(big.id).estimated_start == NOW + 3000
    assert d.started(short.id) is not None
    for job in (long, unlimited):
        pending = d.pending_for(job.id)
        assert pending.reason is PendingReason.PRIORITY and pending.waiting_for == big.id


def test_lower_jobs_use_gpus_the_blocked_job_is_not_waiting_for(jobs):
    a, b = make_node("a", "sim:dgx1"), make_node("b", "sim:ws-4x3090")
    running = jobs.running(a, (0, 1, 2, 3), time_limit_s=3600)
    big = jobs.queued(8, priority=HIGH)
    small = jobs.queued(2, priority=LOW)
    d = schedule([running, big, small], [a, b], now=NOW)
    assert gpus_of(d, small.id) == [("b", (0, 1))]


# -- gates: quota, dependencies, holds, reservations --------------------------------------


def test_quota(jobs):
    node = make_node("a", "sim:dgx1")
    mine = jobs.running(node, (0, 1, 2), user="alice")
    over = jobs.queued(2, user="alice")
    other = jobs.queued(2, user="bob")
    d = schedule([mine, over, other], [node], now=NOW, policy=Policy(max_gpus_per_user=4))
    pending = d.pending_for(over.id)
    assert pending.reason is PendingReason.QUOTA
    assert "holds 3 of a quota of 4" in pending.detail
    assert d.started(other.id) is not None
    d = schedule([mine, over], [node], now=NOW, policy=Policy(max_gpus_per_user=4, user_gpu_quota={"alice": 8}))
    assert d.started(over.id) is not None


def test_dependencies(jobs):
    node = make_node("a", "sim:dgx1")
    first = jobs.queued(1, state=JobState.RUNNING)
    after_running = jobs.queued(1, depends_on=(first.id,))
    after_done = jobs.queued(1, depends_on=(900,))
    after_failed = jobs.queued(1, depends_on=(901,))
    after_missing = jobs.queued(1, depends_on=(999,))
    d = schedule([first, after_running, after_done, after_failed, after_missing], [node], now=NOW,
                 finished={900: JobState.SUCCEEDED, 901: JobState.FAILED})
    assert d.started(after_done.id) is not None
    assert d.pending_for(after_running.id).reason is PendingReason.DEPENDENCY
    assert "running" in d.pending_for(after_running.id).detail
    assert "ended failed" in d.pending_for(after_failed.id).detail
    assert "does not exist" in d.pending_for(after_missing.id).detail


def test_held_jobs_do_not_start(jobs):
    node = make_node("a", "sim:dgx1")
    held = jobs.queued(1, state=JobState.HELD)
    d = schedule([held], [node], now=NOW)
    assert d.starts == () and d.pending_for(held.id).reason is PendingReason.HELD


def _reservation(**kw):
    base = dict(name="paper", owner="alice", gpus=4, start=NOW - 60, end=NOW + 48 * 3600,
                node="a", gpu_indices=(0, 1, 2, 3))
    return Reservation(**{**base, **kw})


def test_reserved_gpus_serve_only_jobs_that_name_the_reservation(jobs):
    node = make_node("a", "sim:dgx1")
    inside = jobs.queued(2, user="alice", reservation="paper")
    outsider = jobs.queued(4, user="bob")
    squeezed = jobs.queued(1, user="bob", preemptible=False)  # only reserved GPUs 2 and 3 are left
    borrower = jobs.queued(1, user="bob")  # preemptible: may borrow an idle reserved GPU
    d = schedule([inside, outsider, squeezed, borrower], [node], now=NOW, reservations=[_reservation()])
    assert gpus_of(d, inside.id) == [("a", (2, 3))]
    assert gpus_of(d, outsider.id) == [("a", (4, 5, 6, 7))]
    assert d.pending_for(squeezed.id).reason is PendingReason.RESERVATION
    assert "paper, until" in d.pending_for(squeezed.id).detail
    assert gpus_of(d, borrower.id)[0][1][0] in (0, 1)


def test_before_a_reservation_only_jobs_that_end_in_time_use_its_gpus(jobs):
    node = make_node("a", "sim:flat:2")
    future = _reservation(start=NOW + 7200, gpu_indices=(0, 1), gpus=2)
    short = jobs.queued(2, user="bob", time_limit_s=3600)
    d = schedule([short], [node], now=NOW, reservations=[future])
    assert d.started(short.id) is not None
    unlimited = jobs.queued(2, user="bob", preemptible=False)
    d = schedule([unlimited], [node], now=NOW, reservations=[future])
    assert d.pending_for(unlimited.id).reason is PendingReason.RESERVATION
    assert "paper, starts in 2h 00m" in d.pending_for(unlimited.id).detail


@pytest.mark.parametrize(
    ("reservation", "user", "words"),
    [
        (_reservation(start=NOW + 3600), "alice", "starts in 1h 00m"),
        (_reservation(), "mallory", "may not use reservation"),
        (_reservation(start=NOW - 7200, end=NOW - 60), "alice", "has ended"),
        (None, "alice", "does not exist"),
    ],
)
def test_jobs_naming_a_reservation_wait_with_a_reason(jobs, reservation, user, words):
    node = make_node("a", "sim:dgx1")
    job = jobs.queued(1, user=user, reservation="paper")
    d = schedule([job], [node], now=NOW, reservations=[reservation] if reservation else [])
    pending = d.pending_for(job.id)
    assert pending.reason is PendingReason.RESERVATION and words in pending.detail


def test_preemptible_jobs_borrow_reserved_gpus_until_a_grace_before_the_start(jobs):
    node = make_node("a", "sim:flat:2")
    future = _reservation(start=NOW + 7200, gpu_indices=(0, 1), gpus=2)
    borrower = jobs.queued(2, user="bob", grace_s=60)
    assert schedule([borrower], [node], now=NOW, reservations=[future]).started(borrower.id) is not None
    late = schedule([borrower], [node], now=NOW + 7200 - 30, reservations=[future])  # inside its grace: no
    assert late.pending_for(borrower.id).reason is PendingReason.RESERVATION


@pytest.mark.parametrize(("now", "drained"), [
    (NOW + 7200 - 121, False),  # more than its grace (120 s) before the start
    (NOW + 7200 - 120, True),
    (NOW + 7200 - 5, True),
])
def test_jobs_on_reserved_gpus_are_drained_a_grace_before_the_start(jobs, now, drained):
    node = make_node("a", "sim:flat:4")
    future = _reservation(start=NOW + 7200, gpu_indices=(0, 1), gpus=2)
    on_reserved = jobs.running(node, (0,), priority=URGENT, grace_s=120)  # priority does not matter
    ends_in_time = jobs.running(node, (1,), started_at=NOW - 60, time_limit_s=7000)  # ends 140 s before
    elsewhere = jobs.running(node, (2,), grace_s=120)
    d = schedule([on_reserved, ends_in_time, elsewhere], [node], now=now, reservations=[future])
    expected = [(on_reserved.id, None, "paper")] if drained else []
    assert [(p.job_id, p.for_job, p.reservation) for p in d.preemptions] == expected


def test_a_reservation_job_takes_back_lent_gpus_whatever_the_borrowers_priority(jobs):
    node = make_node("a", "sim:flat:4")
    active = _reservation(gpu_indices=(0, 1), gpus=2)
    borrower = jobs.running(node, (0, 1), user="bob", priority=URGENT, started_at=NOW - 10)  # under min runtime
    protected = jobs.running(node, (2, 3), user="bob", priority=LOW, preemptible=False)
    member = jobs.queued(2, user="alice", reservation="paper", priority=LOW)
    d = schedule([borrower, protected, member], [node], now=NOW, reservations=[active])
    assert [(p.job_id, p.for_job) for p in d.preemptions] == [(borrower.id, member.id)]
    assert d.pending_for(member.id).reason is PendingReason.PREEMPTING


def test_jobs_in_a_reservation_are_never_preempted_by_outsiders(jobs):
    node = make_node("a", "sim:flat:4")
    active = _reservation(gpu_indices=(0, 1), gpus=2)
    member = jobs.running(node, (0, 1), user="alice", priority=LOW, reservation="paper")
    others = jobs.running(node, (2, 3), user="carol", priority=LOW)
    outsider = jobs.queued(4, user="bob", priority=URGENT)  # would need the member's GPUs too
    d = schedule([member, others, outsider], [node], now=NOW, reservations=[active])
    assert d.preemptions == ()
    outsider_2 = jobs.queued(2, user="bob", priority=URGENT)
    d = schedule([member, others, outsider_2], [node], now=NOW, reservations=[active])
    assert [p.job_id for p in d.preemptions] == [others.id]  # it takes the unreserved GPUs instead


def test_a_blocked_job_does_not_hold_reserved_gpus_it_could_only_borrow(jobs):
    node = make_node("a", "sim:flat:4")
    future = _reservation(start=NOW + 6 * 3600, gpu_indices=(0, 1), gpus=2)
    busy = jobs.running(node, (2, 3), user="carol", preemptible=False)
    big = jobs.queued(4, user="bob", priority=HIGH)  # blocked: 4 GPUs, two of them reserved later
    small = jobs.queued(1, user="bob", priority=LOW)  # may borrow a reserved GPU meanwhile
    d = schedule([busy, big, small], [node], now=NOW, reservations=[future])
    assert d.started(big.id) is None
    assert gpus_of(d, small.id)[0][1][0] in (0, 1)


# -- every pending job has a reason --------------------------------------------------------


def test_every_queued_or_held_job_gets_exactly_one_verdict(jobs):
    a, b = make_node("a", "sim:dgx1"), make_node("b", "sim:ws-4x3090")
    running = [jobs.running(a, (0, 1, 2, 3), priority=LOW, time_limit_s=7200), jobs.running(b, (0, 1))]
    queue = [
        jobs.queued(8, priority=URGENT),
        jobs.queued(16),
        jobs.queued(2, user="carol", depends_on=(running[0].id,)),
        jobs.queued(1, state=JobState.HELD),
        *[jobs.queued(g, priority=p) for g, p in [(1, LOW), (2, HIGH), (4, NORMAL), (1, NORMAL)]],
    ]
    d = schedule([*running, *queue], [a, b], now=NOW, policy=Policy(max_gpus_per_user=12))
    verdicts = [s.job_id for s in d.starts] + [p.job_id for p in d.pending]
    assert sorted(verdicts) == sorted(j.id for j in queue)
    for p in d.pending:
        assert p.detail, p
    never = d.pending_for(queue[1].id)
    assert never.reason is PendingReason.RESOURCES and "largest suitable node" in never.detail


def test_fair_share_usage_decays_by_half_life():
    from labq.scheduler import decay_usage

    decayed = decay_usage({"alice": 40.0, "bob": 8.0}, elapsed_s=2 * 3600, half_life_s=3600)
    assert decayed == {"alice": 10.0, "bob": 2.0}
    assert decay_usage({"alice": 3.0}, elapsed_s=100, half_life_s=0) == {"alice": 3.0}


def test_queue_order_breaks_ties_by_usage_then_submit_time_then_id(jobs):
    from labq.scheduler import order_queue

    a = jobs.queued(user="heavy", submitted_at=1.0)
    b = jobs.queued(user="light", submitted_at=5.0)
    c = jobs.queued(user="light", submitted_at=5.0)
    d = jobs.queued(user="heavy", priority=HIGH, submitted_at=9.0)
    assert order_queue([a, b, c, d], {"heavy": 9.0}) == [d, b, c, a]
    assert order_queue([c, b, a, d], {}) == [d, a, b, c]


# -- arrays: %N --------------------------------------------------------------------------


def test_an_arrays_cap_counts_its_tasks_on_gpus_and_those_the_pass_starts(jobs):
    node = make_node("dgx", "sim:dgx1")  # 8 GPUs
    running = jobs.running(node, (0,), user="alice", array_id=50, array_index=0, array_cap=3)
    tasks = [jobs.queued(1, array_id=50, array_index=i, array_cap=3) for i in range(1, 6)]
    free = [jobs.queued(1, array_id=60, array_index=i) for i in range(3)]  # an array with no cap
    d = schedule([running, *tasks, *free], [node], now=NOW)
    assert [t.id for t in tasks if d.started(t.id)] == [tasks[0].id, tasks[1].id]  # 3 with the one running
    for t in tasks[2:]:
        pending = d.pending_for(t.id)
        assert pending.reason is PendingReason.ARRAY_LIMIT
        assert pending.detail == "3 of array 50's tasks are on GPUs, as many as its %3 allows"
    assert all(d.started(j.id) for j in free)


def test_a_capped_array_leaves_the_gpus_it_may_not_use_to_the_jobs_behind_it(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    tasks = [jobs.queued(1, priority=HIGH, array_id=50, array_index=i, array_cap=1) for i in range(4)]
    other = jobs.queued(2, user="bob")
    d = schedule([*tasks, other], [node], now=NOW)
    assert sum(1 for t in tasks if d.started(t.id)) == 1
    assert d.started(other.id) is not None


def test_two_users_arrays_share_by_fair_share_not_by_who_submitted_first(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    alice = [jobs.queued(1, user="alice", array_id=50, array_index=i, submitted_at=NOW - 200) for i in range(6)]
    bob = [jobs.queued(1, user="bob", array_id=60, array_index=i, submitted_at=NOW - 100) for i in range(6)]
    d = schedule([*alice, *bob], [node], now=NOW, usage={"alice": 40.0, "bob": 1.0})
    assert [t.id for t in bob if d.started(t.id)] == [t.id for t in bob[:4]]  # bob used less: his tasks go first
    assert not any(d.started(t.id) for t in alice)
    d = schedule([*alice, *bob], [node], now=NOW, usage={"alice": 1.0, "bob": 40.0})
    assert [t.id for t in alice if d.started(t.id)] == [t.id for t in alice[:4]]
