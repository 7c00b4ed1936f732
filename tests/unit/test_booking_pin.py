"""Which GPUs a booking pins: idle ones first, then the least running work displaced, then topology.

The tables check each rule of ``labq.scheduler.booking`` on small labs; the properties compare the
pin with a brute-force oracle written here from the module's definition: every GPU set of the right
size on every node, the jobs it displaces, and what they lose.
"""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import combinations
from math import inf

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labq.models import Job, JobState, NodeAllocation, NodeHealth, Placement, Reservation
from labq.scheduler.booking import BookingLimits, better_pin, book, repin
from labq.scheduler.placement import indices_to_mask
from tests.conftest import NOW, JobFactory, make_node

H = 3600.0
M = 60.0
FREE = BookingLimits(max_gpu_hours_per_week=None, max_lead_s=None, max_duration_s=None)


def ask(gpus: int, start: float = NOW + 2 * H, hours: float = 1, *, name: str = "paper", owner: str = "alice",
        **kw) -> Reservation:
    return Reservation(name, owner, gpus, start, start + hours * H, **kw)


def pinned(r: Reservation, node: str, gpus: tuple[int, ...], **kw) -> Reservation:
    return replace(r, gpus=len(gpus), node=node, gpu_indices=gpus, **kw)


def lost(job: Job, start: float, now: float = NOW) -> int:
    """The module docstring's cost, written out again: all GPUs x (work since checkpoint at the signal + grace)."""
    signal = max(now, start - job.spec.grace_s)
    since = job.last_checkpoint_at if job.last_checkpoint_at is not None else job.started_at
    at_risk = max(0.0, signal - since) if since is not None else 0.0
    return round(job.spec.gpus * (at_risk + job.spec.grace_s))


# -- the rules, one table each -------------------------------------------------------


@pytest.mark.parametrize("also_on_3", [False, True])
def test_one_gpu_on_a_workstation_takes_the_idle_gpu_not_a_running_pair(jobs, also_on_3):
    """The 4x3090 case: GPU 2 idle for the whole window, a 2-GPU job on 0,1 that would lose 11 minutes."""
    ws = make_node("ws", "sim:ws-4x3090")
    pair = jobs.running(ws, (0, 1), started_at=NOW - 10 * M)
    lab = [pair] + ([jobs.running(ws, (3,), started_at=NOW - 5 * M)] if also_on_3 else [])
    answer = book(ask(1, NOW + 2 * M, 10 / 60), [ws], [], lab, now=NOW, limits=FREE)
    assert (answer.reservation.node, answer.reservation.gpu_indices) == ("ws", (2,))
    assert answer.displaced == () and answer.gpu_seconds_lost == 0


def test_a_job_that_ends_by_its_time_limit_before_the_start_leaves_its_gpus_idle(jobs):
    ws = make_node("ws", "sim:ws-4x3090")
    endless = jobs.running(ws, (0, 1))
    ending = jobs.running(ws, (2, 3), started_at=NOW - H, time_limit_s=2 * H)  # gone at NOW + 1 h
    answer = book(ask(2, NOW + H), [ws], [], [endless, ending], now=NOW, limits=FREE)
    assert answer.reservation.gpu_indices == (2, 3) and answer.displaced == ()
    late = book(ask(4, NOW + H - 1), [ws], [], [endless, ending], now=NOW, limits=FREE)  # a second too early
    assert {d.job_id for d in late.displaced} == {endless.id, ending.id}


def test_the_least_work_lost_wins_over_the_better_connected_set(jobs):
    ws = make_node("ws", "sim:ws-4x3090")
    start = NOW + H
    fresh = dict(last_checkpoint_at=NOW - 2 * M)  # checkpointed two minutes ago
    on_gpu = [jobs.running(ws, (0,), started_at=NOW - 5 * H, **fresh), jobs.running(ws, (1,), started_at=NOW - 5 * H),
              jobs.running(ws, (2,), started_at=NOW - 5 * H, **fresh), jobs.running(ws, (3,), started_at=NOW - 5 * H)]
    answer = book(ask(2, start), [ws], [], on_gpu, now=NOW, limits=FREE)
    # the two freshly checkpointed jobs, though their GPUs share no NVLink bridge
    assert answer.reservation.gpu_indices == (0, 2) and answer.reservation.score == 2
    assert [(d.job_id, d.gpus, d.gpu_seconds_lost) for d in answer.displaced] == [
        (on_gpu[0].id, 1, lost(on_gpu[0], start)), (on_gpu[2].id, 1, lost(on_gpu[2], start))]
    assert answer.gpu_seconds_lost == 2 * (H + 2 * M)  # each: an hour and two minutes of work, counting its grace


def test_a_displaced_job_costs_all_of_its_gpus(jobs):
    """On a flat node every GPU places alike: the 2-GPU job at risk 10 min costs more than the 1-GPU one at 15."""
    node = make_node("flat", "sim:flat:3")
    pair = jobs.running(node, (0, 1), started_at=NOW - 10 * M, grace_s=0)
    single = jobs.running(node, (2,), started_at=NOW - 15 * M, grace_s=0)
    answer = book(ask(1, NOW), [node], [], [pair, single], now=NOW, limits=FREE)
    assert answer.reservation.gpu_indices == (2,)
    assert [(d.job_id, d.gpus, d.gpu_seconds_lost) for d in answer.displaced] == [(single.id, 1, 15 * M)]
    assert lost(pair, NOW) == 20 * M


def test_a_multi_node_job_is_displaced_whole(jobs):
    a, b, c = make_node("a", "sim:flat:2"), make_node("b", "sim:flat:2"), make_node("c", "sim:flat:2")
    spread = Job(90, replace(jobs.queued(4).spec, nodes=2), NOW - H, JobState.RUNNING, started_at=NOW - 10 * M,
                 placement=Placement((NodeAllocation("a", (0, 1), ("x0", "x1")),
                                      NodeAllocation("b", (0, 1), ("y0", "y1")))))
    local = jobs.running(c, (0, 1), started_at=NOW - 15 * M)
    answer = book(ask(1, NOW + 5 * M), [a, b, c], [], [spread, local], now=NOW, limits=FREE)
    # 4 GPUs x 15 min (14 min at risk when signalled a minute before the start, then its minute of grace)
    # against 2 GPUs x 20 min: one GPU of the spread job would cost less, but it leaves both nodes
    assert answer.reservation.node == "c"
    assert [(d.job_id, d.gpus, d.gpu_seconds_lost) for d in answer.displaced] == [(local.id, 2, 2 * 20 * M)]
    assert lost(spread, NOW + 5 * M) == 4 * 15 * M


def test_equal_loss_then_the_better_connected_set(jobs):
    ws = make_node("ws", "sim:ws-4x3090")
    whole = jobs.running(ws, (0, 1, 2, 3))  # any pair displaces it, at the same cost
    answer = book(ask(2), [ws], [], [whole], now=NOW, limits=FREE)
    assert answer.reservation.score == 4002 and len(answer.displaced) == 1
    flat = make_node("flat", "sim:flat:4")
    same = jobs.running(flat, (0, 1, 2, 3))
    cheaper = jobs.running(flat, (0, 1, 2, 3), started_at=NOW - 5 * M)
    assert book(ask(2), [flat, ws], [], [whole, same], now=NOW, limits=FREE).reservation.node == "ws"
    answer = book(ask(2), [flat, ws], [], [whole, cheaper], now=NOW, limits=FREE)
    assert answer.reservation.node == "flat" and answer.displaced[0].job_id == cheaper.id


@pytest.mark.parametrize("order", [("ws2", "ws1"), ("ws1", "ws2")])
def test_idle_gpus_that_keep_a_pair_whole_then_the_node_name(jobs, order):
    """Anti-fragmentation among idle GPUs: GPU 1 leaves the NVLink pair 2,3 whole; ws1 before ws2."""
    nodes = [make_node(name, "sim:ws-4x3090") for name in order]
    lab = [jobs.running(node, (0,)) for node in nodes]
    answer = book(ask(1), nodes, [], lab, now=NOW, limits=FREE)
    assert (answer.reservation.node, answer.reservation.gpu_indices, answer.displaced) == ("ws1", (1,), ())


def test_a_job_that_cannot_be_preempted_blocks_its_gpus_unless_it_ends_before_the_start(jobs):
    ws = make_node("ws", "sim:ws-4x3090")
    movable = jobs.running(ws, (0, 1))
    stays = jobs.running(ws, (2, 3), preemptible=False)
    answer = book(ask(2), [ws], [], [movable, stays], now=NOW, limits=FREE)
    assert answer.reservation.gpu_indices == (0, 1) and [d.job_id for d in answer.displaced] == [movable.id]
    assert not book(ask(3), [ws], [], [movable, stays], now=NOW, limits=FREE).accepted
    leaving = jobs.running(ws, (2, 3), preemptible=False, started_at=NOW - H, time_limit_s=2 * H)
    answer = book(ask(2), [ws], [], [movable, leaving], now=NOW, limits=FREE)
    assert answer.reservation.gpu_indices == (2, 3) and answer.displaced == ()


def test_a_booking_back_to_back_with_the_same_users_takes_its_gpus_not_a_running_job(jobs):
    ws = make_node("ws", "sim:ws-4x3090")
    first = pinned(ask(2, NOW + 2 * H, 2, name="first"), "ws", (2, 3))  # alice, until NOW + 4 h
    running = jobs.running(ws, (0, 1))
    after = book(ask(2, NOW + 4 * H, 2), [ws], [first], [running], now=NOW, limits=FREE)
    assert (after.reservation.gpu_indices, after.displaced) == ((2, 3), ())  # windows that touch do not overlap
    overlapping = book(ask(2, NOW + 3 * H, 2), [ws], [first], [running], now=NOW, limits=FREE)
    assert overlapping.reservation.gpu_indices == (0, 1) and [d.job_id for d in overlapping.displaced] == [
        running.id]
    cancelled = replace(first, cancelled_at=NOW - M)  # a cancelled booking pins nothing
    again = book(ask(2, NOW + 3 * H, 2), [ws], [cancelled], [running], now=NOW, limits=FREE)
    assert (again.reservation.gpu_indices, again.displaced) == ((2, 3), ())


def test_a_booking_whose_node_goes_down_is_repinned_on_idle_gpus(jobs):
    ws2 = make_node("ws2", "sim:ws-4x3090")
    r = pinned(ask(1), "ws1", (0,))
    down = make_node("ws1", "sim:ws-4x3090", health=NodeHealth.DOWN)
    busy = jobs.running(ws2, (0, 1))
    moved = repin(r, [down, ws2], [r], [busy], now=NOW, why="down")
    assert (moved.node, moved.gpu_indices, moved.note) == ("ws2", (2,), "re-pinned from ws1 (down) to ws2")


# -- moving a pinned booking before its start ---------------------------------------


def test_better_pin_moves_to_a_gpu_that_freed_up_before_any_job_is_signalled(jobs):
    ws = make_node("ws", "sim:ws-4x3090")
    r = pinned(ask(1, NOW + H), "ws", (0,), note="booked by phone")  # when every GPU was busy
    pair = jobs.running(ws, (0, 1))
    others = [jobs.running(ws, (3,))]  # GPU 2's job has ended since
    moved = better_pin(r, [ws], [r], [pair, *others], now=NOW)
    assert moved == replace(r, gpu_indices=(2,), note="booked by phone; moved from ws GPUs 0 to GPUs 2: "
                                                       "displaces nothing")
    # once the displaced pair would have been signalled (a grace before the start) it stays
    assert better_pin(r, [ws], [r], [pair, *others], now=r.start - pair.spec.grace_s) is None
    assert better_pin(r, [ws], [r], [pair, *others], now=r.start - pair.spec.grace_s - 1) is not None
    draining = pair.evolve(state=JobState.PREEMPTING, drained_for=r.name)
    assert better_pin(r, [ws], [r], [draining, *others], now=NOW) is None


def test_better_pin_moves_only_for_strictly_less_work_lost(jobs):
    ws = make_node("ws", "sim:ws-4x3090")
    r = pinned(ask(1, NOW + H), "ws", (0,))
    started = NOW - H
    lab = [jobs.running(ws, (g,), started_at=started) for g in range(4)]  # every GPU costs the same
    assert better_pin(r, [ws], [r], lab, now=NOW) is None
    lab[3] = jobs.running(ws, (3,), started_at=started + M)  # a minute less at risk
    moved = better_pin(r, [ws], [r], lab, now=NOW)
    assert moved.gpu_indices == (3,)
    assert moved.note == "moved from ws GPUs 0 to GPUs 3: displaces about 119 GPU-min of running work instead of 120"
    assert better_pin(moved, [ws], [moved], lab, now=NOW) is None  # already the best
    assert better_pin(replace(moved, cancelled_at=NOW - 1), [ws], [moved], lab, now=NOW) is None


def test_better_pin_keeps_the_node_and_the_filters(jobs):
    from labq.models import Node

    big = make_node("big", "sim:flat:4")
    mixed = Node("big", tuple(replace(g, memory_mib=8 * 1024) if g.index == 3 else g for g in big.gpus),
                 big.topology, simulated=True)
    r = pinned(ask(1, NOW + H, min_gpu_memory_mib=16 * 1024), "big", (0,))
    on_0 = jobs.running(mixed, (0,))
    idle_elsewhere = make_node("other", "sim:flat:4")
    assert better_pin(r, [mixed, idle_elsewhere], [r], [on_0, *(jobs.running(mixed, (g,)) for g in (1, 2))],
                      now=NOW) is None  # GPU 3 is idle but too small; the idle node is another node
    moved = better_pin(r, [mixed], [r], [on_0, jobs.running(mixed, (1,))], now=NOW)
    assert moved.gpu_indices == (2,) and moved.node == "big"


# -- properties against a brute-force oracle ------------------------------------------

INVENTORIES = ["sim:dgx1", "sim:dgx-a100", "sim:pcie-2socket", "sim:ws-4x3090", "sim:flat:2", "sim:flat:3"]


@st.composite
def small_labs(draw):
    """1-3 nodes, running jobs (some on two nodes) of any kind, other bookings, and a booking to answer."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    factory = JobFactory()
    nodes = [make_node(f"n{i}", rng.choice(INVENTORIES), unmanaged_busy=frozenset([0] if rng.random() < 0.2 else []),
                       health=NodeHealth.UP if rng.random() < 0.9 else NodeHealth.DRAINING)
             for i in range(rng.randint(1, 3))]
    start = NOW + rng.choice([0, 30, 10 * M, H, 5 * H])
    free = {n.name: list(range(n.gpu_count)) for n in nodes}
    jobs: list[Job] = []
    for node in nodes:
        while free[node.name] and rng.random() < 0.85:
            gpus = tuple(sorted(rng.sample(free[node.name], min(len(free[node.name]), rng.choice([1, 1, 2, 4])))))
            for g in gpus:
                free[node.name].remove(g)
            started = NOW - rng.choice([0, 20, 300, H, 6 * H])
            job = factory.running(node, gpus, started_at=started, preemptible=rng.random() < 0.8,
                                  time_limit_s=rng.choice([None, None, 600, 2 * H, 8 * H]),
                                  grace_s=rng.choice([0, 0, 30, 60, 300]),
                                  last_checkpoint_at=rng.choice([None, NOW, started + (NOW - started) / 2]),
                                  state=rng.choice([JobState.RUNNING] * 4 + [JobState.STARTING, JobState.PREEMPTING]))
            if job.state is JobState.STARTING and rng.random() < 0.5:
                job = job.evolve(started_at=None, last_checkpoint_at=None)
            jobs.append(job)
    jobs += _spread_jobs(rng, nodes, free, factory)
    others = []
    for i in range(rng.randint(0, 3)):
        node = rng.choice(nodes)
        b_start = start + rng.choice([-2 * H, -H, 0, 30 * M, H, 3 * H])
        gpus = tuple(sorted(rng.sample(range(node.gpu_count), rng.randint(1, node.gpu_count))))
        others.append(Reservation(f"other{i}", rng.choice(["alice", "bob"]), len(gpus), b_start,
                                  b_start + rng.choice([30 * M, H, 2 * H]), node=node.name, gpu_indices=gpus,
                                  cancelled_at=NOW - 1 if rng.random() < 0.1 else None))
    request = Reservation("asked", "alice", rng.choice([1, 1, 2, 3, 4, 8]), start, start + rng.choice([M, H, 4 * H]),
                          node=rng.choice([None, None, None, nodes[0].name]),
                          min_gpu_memory_mib=rng.choice([0, 0, 40 * 1024]))
    return nodes, others, jobs, request


def _spread_jobs(rng: random.Random, nodes, free: dict[str, list[int]], factory: JobFactory) -> list[Job]:
    """Now and then a job on two nodes, one GPU each: displacing it takes it from both."""
    spread = [n for n in nodes if free[n.name]]
    if len(spread) < 2 or rng.random() < 0.5:
        return []
    a, b = rng.sample(spread, 2)
    ga, gb = free[a.name].pop(), free[b.name].pop()
    spec = replace(factory.queued(2).spec, nodes=2, grace_s=rng.choice([0, 60]))
    placement = Placement((NodeAllocation(a.name, (ga,), ("u",)), NodeAllocation(b.name, (gb,), ("v",))))
    return [Job(1000, spec, NOW - H, JobState.RUNNING, placement=placement,
                started_at=NOW - rng.choice([0, 600, H]))]


def _until(job: Job) -> float:
    if job.spec.time_limit_s is None:
        return inf
    return (job.started_at if job.started_at is not None else NOW) + job.spec.time_limit_s


def oracle_sets(request: Reservation, nodes, others, jobs, now: float = NOW):
    """Every GPU set the booking may pin, with its key (the module's order) and the jobs it displaces."""
    for node in nodes:
        if node.health is not NodeHealth.UP or (request.node is not None and node.name != request.node):
            continue
        blocked = {g.index for g in node.gpus if g.memory_mib < request.min_gpu_memory_mib}
        for r in others:
            if (r.node == node.name and r.cancelled_at is None and r.end > now
                    and r.start < request.end and request.start < r.end):
                blocked |= set(r.gpu_indices)
        if request.start - now < H:
            blocked |= set(node.unmanaged_busy)
        held: dict[int, Job] = {}
        for job in jobs:
            if not job.state.holds_gpus or _until(job) <= request.start:
                continue
            for a in job.placement.allocations:
                if a.node == node.name:
                    for g in a.gpu_indices:
                        (held.__setitem__(g, job) if job.spec.preemptible else blocked.add(g))
        candidates = [g for g in range(node.gpu_count) if g not in blocked]
        for gpus in combinations(candidates, request.gpus):
            victims = {held[g].id: held[g] for g in gpus if g in held}
            kept = [g for g in candidates if g not in held or held[g].id in victims]
            score = node.topology.set_score(gpus)
            loss = score_of(node, kept) - score_of(node, [g for g in kept if g not in gpus])
            cost = sum(lost(j, request.start, now) for j in victims.values())
            yield (bool(victims), cost, -score, loss, node.name), node.name, gpus, victims


def score_of(node, gpus) -> int:
    return node.topology.set_score(list(gpus))


@settings(max_examples=200, deadline=None)
@given(small_labs())
def test_the_pin_is_the_least_of_every_gpu_set(lab):
    nodes, others, jobs, request = lab
    every = list(oracle_sets(request, nodes, others, jobs))
    answer = book(request, nodes, others, jobs, now=NOW, limits=FREE)
    assert answer.accepted == bool(every), answer.reasons
    if not every:
        return
    best = min(key for key, *_ in every)
    r = answer.reservation
    mine = [(key, victims) for key, node, gpus, victims in every if (node, gpus) == (r.node, r.gpu_indices)]
    assert len(mine) == 1, "the pin is one of the sets the booking may have"
    key, victims = mine[0]
    assert key == best
    assert [(d.job_id, d.gpus, d.gpu_seconds_lost) for d in answer.displaced] == [
        (j.id, j.spec.gpus, lost(j, request.start)) for j in sorted(victims.values(), key=lambda j: j.id)]
    assert answer.gpu_seconds_lost == key[1]


@settings(max_examples=100, deadline=None)
@given(small_labs())
def test_better_pin_moves_only_to_the_least_set_of_its_node(lab):
    nodes, others, jobs, request = lab
    request = replace(request, start=max(request.start, NOW + 10 * M), end=max(request.end, NOW + 20 * M))
    sets = list(oracle_sets(request, nodes, others, jobs))
    if not sets:
        return
    _, node, gpus, _ = sets[len(sets) // 2]  # pinned somewhere, as if the lab had changed since
    r = replace(request, node=node, gpu_indices=gpus)
    on_node = [(key, g) for key, n, g, _ in oracle_sets(r, nodes, others, jobs) if n == node]
    current = next(key for key, g in on_node if g == gpus)
    best = min(key for key, _ in on_node)
    moved = better_pin(r, nodes, [r, *others], jobs, now=NOW)
    if moved is None:
        signalled = current[0] and NOW >= min(max(NOW, r.start - j.spec.grace_s) for j in _victims(r, jobs))
        draining = any(j.drained_for == r.name for j in jobs)
        assert best[:2] >= current[:2] or signalled or draining
        return
    assert (moved.node, moved.gpus, moved.start, moved.end) == (r.node, r.gpus, r.start, r.end)
    assert best[:2] < current[:2]
    assert next(key for key, g in on_node if g == moved.gpu_indices) == best


def _victims(r: Reservation, jobs) -> list[Job]:
    mask = indices_to_mask(r.gpu_indices)
    return [j for j in jobs if j.state.holds_gpus and j.spec.preemptible and _until(j) > r.start
            and any(a.node == r.node and indices_to_mask(a.gpu_indices) & mask for a in j.placement.allocations)]


def test_the_answer_says_what_each_displaced_job_loses(jobs):
    from labq.protocol.bookings import encode_answer
    from labq.render import answer_text

    ws = make_node("ws", "sim:ws-4x3090")
    pair = jobs.running(ws, (0, 1), started_at=NOW - 9 * M)  # signalled a minute before the start: 10 min at risk
    held = pinned(ask(2, NOW, 1, name="held"), "ws", (2, 3))
    answer = book(ask(1, NOW + 2 * M, 10 / 60), [ws], [held], [pair], now=NOW, limits=FREE)
    wire = encode_answer(answer, booked=True)
    assert wire["displaced"] == [{"job_id": pair.id, "user": "bob", "signal_at": NOW + M, "gpus": 2,
                                  "gpu_seconds_lost": 2 * 11 * M}]
    text = answer_text(wire, NOW, "UTC")
    assert f"    job {pair.id} (bob) at Mon 12 Jan 13:47 UTC: 2 GPUs, about 22 GPU-min lost" in text.splitlines()
