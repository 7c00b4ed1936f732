"""Queues (teams), as properties: what holds for any lab with queues in one pass (random labs, as in
``test_scheduler_properties``), and what holds over days on the simulator's virtual clock (the real scheduler,
no sleeps): shares follow guarantees, reclaims end within the grace, and aging still bounds a low job's wait."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from labq.models import JobState, PendingReason, PriorityClass
from labq.models.decisions import Decisions
from labq.models.job import Job
from labq.models.node import Node
from labq.models.queues import QueueSpec
from labq.scheduler import Policy, schedule
from labq.scheduler.placement import best_set, indices_to_mask
from labq.sim.engine import SimOptions, simulate
from labq.sim.model import SimResult, TraceJob, Workload
from labq.sim.report import make_report
from tests.conftest import NOW, JobFactory, make_node
from tests.unit.test_scheduler_properties import labs

LOW, NORMAL, HIGH, URGENT = (int(p) for p in PriorityClass)
PRIORITIES = [LOW, NORMAL, HIGH, URGENT, 150, 250]
INVENTORIES = ["sim:ws-4x3090", "sim:dgx1", "sim:pcie-2socket", "sim:flat:2", "sim:flat:3"]
OUTSIDE = ""  #: the queue of a job outside every queue, as ``labq.scheduler.queues`` names it
HOUR = 3600.0
DAY = 24 * HOUR


# -- random labs with queues ------------------------------------------------------------------------------


class Lab:
    """Nodes, jobs and a policy; shown as the call that makes it again (``make_lab(seed, ...)``), so that a
    failing example reads short."""

    def __init__(self, nodes: list[Node], jobs: list[Job], policy: Policy, made_by: str = "") -> None:
        self.nodes, self.jobs, self.policy, self.made_by = nodes, jobs, policy, made_by

    def __repr__(self) -> str:
        return self.made_by or f"Lab({len(self.nodes)} nodes, {len(self.jobs)} jobs)"


def _guarantees(rng: random.Random, names: tuple[str, ...], lab_gpus: int) -> list[int]:
    """Random guarantees in GPUs summing to at most ``lab_gpus`` (sometimes all of it, sometimes a queue has none)."""
    total = rng.choice([lab_gpus, lab_gpus, rng.randint(0, lab_gpus)])
    cuts = sorted(rng.randint(0, total) for _ in range(len(names) - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, total])]


def queue_labs(*, single_gpu: bool = False, plain: bool = False):
    """Labs from ``make_lab``, drawn by seed: a failing example reads ``make_lab(seed, ...)``."""
    return st.integers(0, 2**32 - 1).map(lambda seed: make_lab(seed, single_gpu=single_gpu, plain=plain))


def make_lab(seed: int, *, single_gpu: bool = False, plain: bool = False) -> Lab:
    """A random but consistent lab with 2-3 queues: 1-3 nodes, running jobs of random queues on disjoint GPUs,
    queued jobs of random queues.

    ``single_gpu``: every job asks one GPU. ``plain``: every running job is RUNNING and preemptible, no job is
    outside every queue or held, and the queues are as the admin gets them by default (they lend and borrow,
    no cap, no maximum wait): the lab where the service property (a queue below its guarantee is served) is
    exact."""
    rng = random.Random(seed)
    factory = JobFactory()
    nodes = [make_node(f"n{i}", rng.choice(INVENTORIES)) for i in range(rng.randint(1, 3))]
    # some nodes hand their jobs to a scheduler of their own (Slurm), which holds a preemptor until its victims
    # are gone: drawn apart, so that a seed makes the same lab as before otherwise
    handing = random.Random(seed * 7 + 1)
    nodes = [replace(n, hands_over=True, shares=False) if handing.random() < 0.3 else n for n in nodes]
    lab_gpus = sum(n.gpu_count for n in nodes)
    names = ("a", "b", "c")[: rng.randint(2, 3)]
    specs = []
    for name, g in zip(names, _guarantees(rng, names, lab_gpus)):
        if plain:
            specs.append(QueueSpec(name, ("*",), guarantee_gpus=g))
            continue
        specs.append(QueueSpec(
            name, ("*",), guarantee_gpus=g,
            cap=rng.choice([None, None, None, g + rng.randint(0, 4)]),
            lends=rng.random() < 0.85, borrows=rng.random() < 0.85,
            max_wait_s=rng.choice([None, None, None, 1800.0]),
        ))
    queue_choices = [*names, *([] if plain else [None])]  # None: outside every queue (rarely)
    weights = [1.0] * len(names) + ([] if plain else [0.15])

    def some_queue() -> str | None:
        return rng.choices(queue_choices, weights)[0]

    jobs = []
    for node in nodes:
        free = (1 << node.gpu_count) - 1
        while free and rng.random() < 0.75:
            k = 1 if single_gpu else rng.choice([1, 1, 2, 4])
            choice = best_set(node.topology, free, k)
            if choice is None:
                break
            free &= ~choice.mask
            state = JobState.RUNNING if plain else rng.choice([JobState.RUNNING] * 6 +
                                                              [JobState.STARTING, JobState.PREEMPTING])
            jobs.append(factory.running(
                node, choice.gpus, user=rng.choice("xyz"), priority=rng.choice(PRIORITIES), queue=some_queue(),
                started_at=NOW - rng.choice([30, 600, 7200]), state=state,
                preemptible=plain or rng.random() < 0.8, time_limit_s=rng.choice([None, 3600, 4 * 3600]),
                grace_s=rng.choice([30.0, 60.0, 600.0]),
            ))
    for _ in range(rng.randint(0, 15)):
        gpus = 1 if single_gpu else rng.choice([1, 1, 2, 4, 8])
        jobs.append(factory.queued(
            gpus, user=rng.choice("xyzw"), priority=rng.choice(PRIORITIES), queue=some_queue(),
            preemptible=rng.random() < 0.7, grace_s=rng.choice([30.0, 60.0, 600.0]),
            submitted_at=NOW - rng.randint(0, 10_000), time_limit_s=rng.choice([None, 1800, 8 * 3600]),
            state=JobState.HELD if not plain and rng.random() < 0.05 else JobState.QUEUED,
        ))
    queued = [j for j in jobs if j.state is JobState.QUEUED]
    jobs = [j.evolve(preempted_for=rng.choice(queued).id) if j.state is JobState.PREEMPTING and queued else j
            for j in jobs]
    policy = Policy(queues=tuple(specs), min_runtime_s=rng.choice([0, 300]), hold_depth=rng.choice([0, 4, 16]),
                    reclaim_grace_s=None if plain else rng.choice([None, 120.0]))
    return Lab(nodes, jobs, policy, f"make_lab({seed}, single_gpu={single_gpu}, plain={plain})")


# -- what a pass's queues hold, worked out from the jobs (not with the scheduler's own QueueBook) ------------


def queue_of(job: Job, policy: Policy) -> str:
    return job.spec.queue if job.spec.queue in {q.name for q in policy.queues} else OUTSIDE


def guarantees(lab: Lab) -> dict[str, int]:
    gpus = sum(n.gpu_count - len(n.unmanaged_busy) for n in lab.nodes if n.schedulable)
    return {OUTSIDE: 0, **{q.name: q.guarantee(gpus) for q in lab.policy.queues}}


def inflight_preemptors(jobs: list[Job]) -> dict[int, int]:
    """Queued jobs that running jobs are already checkpointing for, and the GPUs those victims free: their
    queue counts those GPUs (the free GPUs that complete the preemptor's set stay free, held for it)."""
    queued = {j.id for j in jobs if j.state is JobState.QUEUED}
    promised: dict[int, int] = {}
    for j in jobs:
        if j.state is JobState.PREEMPTING and j.preempted_for in queued:
            promised[j.preempted_for] = promised.get(j.preempted_for, 0) + j.spec.gpus
    gpus = {j.id: j.spec.gpus for j in jobs}
    return {i: min(n, gpus[i]) for i, n in promised.items()}  # a victim may free more than the preemptor takes


def use_at_start_of_pass(lab: Lab) -> dict[str, int]:
    """GPUs each queue holds as the pass begins: its running jobs', less those being preempted, plus what
    preemptions in flight free for its jobs."""
    use = {q: 0 for q in guarantees(lab)}
    by_id = {j.id: j for j in lab.jobs}
    for job in lab.jobs:
        if job.state in (JobState.RUNNING, JobState.STARTING):
            use[queue_of(job, lab.policy)] += job.spec.gpus
    for job_id, gpus in inflight_preemptors(lab.jobs).items():
        use[queue_of(by_id[job_id], lab.policy)] += gpus
    return use


def _describe(lab: Lab, d: Decisions) -> str:
    def job(j: Job) -> str:
        where = "" if j.placement is None else " on " + ",".join(f"{a.node}:{list(a.gpu_indices)}"
                                                                for a in j.placement.allocations)
        return (f"#{j.id} {j.state.value} q={j.spec.queue} gpus={j.spec.gpus} prio={j.spec.priority} "
                f"preemptible={j.spec.preemptible} grace={j.spec.grace_s:g} started={j.started_at}"
                f"{where} for={j.preempted_for}")

    lines = [f"nodes: {[(n.name, n.gpu_count) for n in lab.nodes]}", f"policy: {lab.policy}",
             *map(job, lab.jobs), f"starts: {[s.job_id for s in d.starts]}",
             f"preemptions: {[(p.job_id, p.for_job) for p in d.preemptions]}",
             *(f"pending #{p.job_id}: {p}" for p in d.pending)]
    return "\n".join(lines)


# -- one pass ------------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(queue_labs())
# failures the search found once, kept so that every run checks them
@example(lab=make_lab(4394))  # a preemption by priority
@example(lab=make_lab(27113))  # a reclaim: a victim of the preemptor's own priority
@example(lab=make_lab(864190282))  # a victim that frees more GPUs than its preemptor takes
@example(lab=make_lab(111836))  # a preemptor in flight that takes one more victim in the pass
def test_no_preemption_takes_another_queue_below_its_guarantee(lab):
    """A reclaim (and a priority preemption across queues) takes only borrowed work: after it, the victim's
    queue still holds at least its guarantee. Counted as generously for the victim's queue as the pass could
    have it at that moment: everything its jobs start or are promised in the pass, less the GPUs of its jobs
    preempted so far (preemptions are listed in the order the pass made them)."""
    d = schedule(lab.jobs, lab.nodes, now=NOW, policy=lab.policy)
    by_id = {j.id: j for j in lab.jobs}
    g = guarantees(lab)
    promised = inflight_preemptors(lab.jobs)
    at_most = use_at_start_of_pass(lab)
    for s in d.starts:
        at_most[queue_of(by_id[s.job_id], lab.policy)] += by_id[s.job_id].spec.gpus - promised.get(s.job_id, 0)
    for p in d.pending:  # a preemptor in flight may take one more victim in the pass: all its GPUs count then
        if p.reason is PendingReason.PREEMPTING:
            at_most[queue_of(by_id[p.job_id], lab.policy)] += by_id[p.job_id].spec.gpus - promised.get(p.job_id, 0)
    seen = set()
    for p in d.preemptions:
        victim = by_id[p.job_id]
        assert victim.state is JobState.RUNNING and victim.spec.preemptible
        if victim.id in seen:
            continue  # its queue loses its GPUs once, however its preemption is listed
        seen.add(victim.id)
        qv = queue_of(victim, lab.policy)
        at_most[qv] -= victim.spec.gpus
        if p.for_job is None:
            continue
        preemptor = by_id[p.for_job]
        if queue_of(preemptor, lab.policy) == qv or qv == OUTSIDE:
            continue  # its own queue's choice, or work that is all borrowed
        by_priority = lab.policy.can_preempt(preemptor.priority, victim.priority)
        assert at_most[qv] >= g[qv], (
            f"job {preemptor.id} (queue {preemptor.spec.queue}) {'preempts' if by_priority else 'reclaims'} "
            f"job {victim.id}, taking queue {qv} to at most {at_most[qv]} GPUs, below its guarantee of "
            f"{g[qv]}\n{_describe(lab, d)}")


@settings(max_examples=300, deadline=None)
@given(queue_labs(single_gpu=True, plain=True))
@example(lab=make_lab(13926, single_gpu=True, plain=True))
def test_a_queue_below_its_guarantee_is_never_kept_waiting_by_one_over_it(lab):
    """In a lab of one-GPU jobs where everything running may be reclaimed, the free GPUs and what queues over
    their guarantee borrow always cover what queues below it lack; so in one pass, each queue below its
    guarantee starts (or has preemptions made for) as many of its waiting jobs as fit in its guarantee,
    whatever their priority, the borrowers' priority, or how short the borrowers have run."""
    d = schedule(lab.jobs, lab.nodes, now=NOW, policy=lab.policy)
    g = guarantees(lab)
    use = use_at_start_of_pass(lab)
    served = {s.job_id for s in d.starts} | {p.job_id for p in d.pending if p.reason is PendingReason.PREEMPTING}
    over = {q for q in use if use[q] > g[q]}
    for q in use:
        if use[q] >= g[q]:
            continue
        waiting = [j for j in lab.jobs if j.state is JobState.QUEUED and queue_of(j, lab.policy) == q]
        owed = min(len(waiting), g[q] - use[q])
        got = sum(j.id in served for j in waiting)
        assert got >= owed, (f"queue {q} holds {use[q]} of its guarantee of {g[q]} and has {len(waiting)} "
                             f"one-GPU jobs waiting, but only {got} of them are served while queues {sorted(over)} "
                             f"borrow\n{_describe(lab, d)}")
        # the literal form: the first of its waiting jobs that the queue serves is started or preempting
        if waiting:
            first = min(waiting, key=lambda j: (-j.priority, j.submitted_at, j.id))
            assert first.id in served, f"job {first.id} of queue {q} waits\n{_describe(lab, d)}"


@settings(max_examples=300, deadline=None)
@given(queue_labs())
def test_no_gpu_is_double_booked_and_what_borrows_is_preemptible(lab):
    """Starts take only free GPUs, each once (on a node that hands its jobs over, as a Slurm node does, also the
    GPUs of jobs on their way out: its own scheduler starts the job once they are gone). A start that certainly
    takes its queue over its guarantee (even if every preemption in the pass came first, and every start of its
    queue before it too) is a loan: the job is preemptible, its grace within the lab's reclaim bound, its queue
    borrows; and no start passes a cap."""
    d = schedule(lab.jobs, lab.nodes, now=NOW, policy=lab.policy)
    by_id = {j.id: j for j in lab.jobs}
    hands_over = {n.name for n in lab.nodes if n.hands_over}
    leaving = {p.job_id for p in d.preemptions}
    taken = set()
    for job in lab.jobs:
        if job.state.holds_gpus:
            gone = job.id in leaving or job.state is JobState.PREEMPTING or job.stop_requested is not None
            taken |= {(a.node, i) for a in job.placement.allocations for i in a.gpu_indices
                      if not (gone and a.node in hands_over)}
    for s in d.starts:
        for a in s.placement.allocations:
            assert len(a.gpu_indices) == by_id[s.job_id].spec.gpus_per_node
            for i in a.gpu_indices:
                assert (a.node, i) not in taken, f"GPU {i} on {a.node} handed out twice\n{_describe(lab, d)}"
                taken.add((a.node, i))
    g = guarantees(lab)
    specs = {q.name: q for q in lab.policy.queues}
    promised = inflight_preemptors(lab.jobs)
    at_least = use_at_start_of_pass(lab)
    for victim_id in {p.job_id for p in d.preemptions}:
        at_least[queue_of(by_id[victim_id], lab.policy)] -= by_id[victim_id].spec.gpus
    for s in d.starts:
        job = by_id[s.job_id]
        q = queue_of(job, lab.policy)
        at_least[q] += job.spec.gpus - promised.get(job.id, 0)  # its victims' GPUs are counted already
        spec = specs.get(q)
        if spec is not None and spec.cap is not None:
            assert at_least[q] <= spec.cap, f"job {job.id} takes queue {q} past its cap\n{_describe(lab, d)}"
        if at_least[q] > g[q]:
            bound = lab.policy.reclaim_grace_s
            assert job.spec.preemptible, f"job {job.id} borrows but is not preemptible\n{_describe(lab, d)}"
            assert bound is None or job.spec.grace_s <= bound, f"job {job.id} borrows with a long grace"
            assert spec is None or spec.borrows, f"job {job.id} of queue {q}, which does not borrow, borrows"


def _one_queue_lab(rng: random.Random) -> tuple[list[Node], list[Job], dict]:
    """Like ``test_scheduler_properties.labs``, every job in queue ``all``, and queued jobs of either kind."""
    factory = JobFactory()
    nodes = [make_node(f"n{i}", rng.choice(INVENTORIES + ["sim:dgx-a100"]),
                       unmanaged_busy=frozenset(rng.sample(range(2), rng.choice([0, 0, 0, 1]))))
             for i in range(rng.randint(1, 3))]
    jobs = []
    for node in nodes:
        free = ((1 << node.gpu_count) - 1) & ~indices_to_mask(node.unmanaged_busy)
        while free and rng.random() < 0.7:
            choice = best_set(node.topology, free, rng.choice([1, 1, 2, 4]))
            if choice is None:
                break
            free &= ~choice.mask
            jobs.append(factory.running(
                node, choice.gpus, user=rng.choice("abc"), priority=rng.choice(PRIORITIES), queue="all",
                started_at=NOW - rng.choice([30, 600, 7200]),
                state=rng.choice([JobState.RUNNING] * 6 + [JobState.STARTING, JobState.PREEMPTING]),
                preemptible=rng.random() < 0.8, time_limit_s=rng.choice([None, 3600, 4 * 3600]),
            ))
    for _ in range(rng.randint(0, 20)):
        gpus = rng.choice([1, 1, 2, 4, 8, 16])
        jobs.append(factory.queued(
            gpus, nodes=2 if gpus in (4, 8) and rng.random() < 0.15 else 1, user=rng.choice("abcd"),
            priority=rng.choice(PRIORITIES), queue="all", preemptible=rng.random() < 0.7,
            submitted_at=NOW - rng.randint(0, 10_000), time_limit_s=rng.choice([None, 1800, 3600 * 8]),
            state=JobState.HELD if rng.random() < 0.05 else JobState.QUEUED,
        ))
    queued = [j for j in jobs if j.state is JobState.QUEUED]
    jobs = [j.evolve(preempted_for=rng.choice(queued).id) if j.state is JobState.PREEMPTING and queued else j
            for j in jobs]
    knobs = dict(max_gpus_per_user=rng.choice([None, None, 8]), min_runtime_s=rng.choice([0, 300]),
                 hold_depth=rng.choice([0, 4, 16]), aging_s=rng.choice([None, None, 3600.0]))
    return nodes, jobs, knobs


ALL = (QueueSpec("all", ("*",), guarantee_percent=100),)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1))
@example(seed=5340)  # a non-preemptible job gets no hold, and a low job starts on the GPUs it would hold
@example(seed=17829)  # a preemptor whose victims are checkpointing is counted twice
def test_a_lab_with_one_queue_of_the_whole_lab_decides_exactly_as_a_lab_without_queues(seed):
    """No decision changes for a lab with one queue: starts, preemptions and every waiting job's reason,
    detail and estimate are those of the same lab without queues."""
    nodes, jobs, knobs = _one_queue_lab(random.Random(seed))
    plain = schedule(jobs, nodes, now=NOW, policy=Policy(**knobs))
    one = schedule(jobs, nodes, now=NOW, policy=Policy(queues=ALL, **knobs))
    assert one == plain, f"seed {seed}\n{_describe(Lab(nodes, jobs, Policy(queues=ALL, **knobs)), one)}\n" \
                         f"without queues:\n" + "\n".join(f"pending #{p.job_id}: {p}" for p in plain.pending)


@settings(max_examples=100, deadline=None)
@given(labs())
def test_the_scheduler_properties_labs_decide_alike_with_one_queue_of_the_whole_lab(lab):
    """The same, over the labs of ``test_scheduler_properties`` (their queued jobs are all preemptible)."""
    nodes, jobs, policy = lab
    jobs = [j.evolve(spec=replace(j.spec, queue="all")) for j in jobs]
    plain = schedule(jobs, nodes, now=NOW, policy=policy)
    one = schedule(jobs, nodes, now=NOW, policy=replace(policy, queues=ALL))
    assert one == plain, _describe(Lab(nodes, jobs, replace(policy, queues=ALL)), one)


# -- on the virtual clock --------------------------------------------------------------------------------------


def _queue_hours(result: SimResult, queue: dict[int, str], start: float, end: float) -> dict[str, float]:
    """GPU-hours each queue's attempts used between ``start`` and ``end``."""
    hours: dict[str, float] = {}
    for job_id, a, b, gpus in result.runs:
        overlap = min(b, end) - max(a, start)
        if overlap > 0:
            hours[queue[job_id]] = hours.get(queue[job_id], 0.0) + gpus * overlap / HOUR
    return hours


def _held(result: SimResult, queue: dict[int, str], name: str, t: float) -> int:
    """GPUs the queue's attempts hold at ``t``."""
    return sum(gpus for job_id, a, b, gpus in result.runs if queue[job_id] == name and a <= t < b)


def two_streams(days: float = 3.0, per_hour: int = 8) -> Workload:
    """Queues a and b each submit ``per_hour`` one-GPU, one-hour preemptible jobs an hour: either alone would
    keep an 8-GPU node busy."""
    submits = []
    for i in range(int(days * 24 * per_hour)):
        t = i * HOUR / per_hour
        submits += [(t, "a"), (t + 1.0, "b")]
    jobs = [TraceJob(n + 1, submit=t, duration=HOUR, gpus=1, user=f"user-{q}", queue=q)
            for n, (t, q) in enumerate(sorted(submits))]
    return Workload(tuple(jobs))


@pytest.mark.parametrize("share_a", [50, 75])
def test_backlogged_queues_share_the_lab_by_their_guarantees(share_a):
    """Two queues that both always have work waiting get the lab's GPU-hours in the shares of their
    guarantees (within 5 points), and the lab stays busy."""
    node = make_node("n", "sim:dgx1")
    queues = (QueueSpec("a", ("*",), guarantee_percent=share_a),
              QueueSpec("b", ("*",), guarantee_percent=100 - share_a))
    workload = two_streams()
    result = simulate(workload, [node], "labq", options=SimOptions(queues=queues, reclaim_grace_s=120.0))
    queue = {j.id: j.queue for j in workload.jobs}
    first_start = {o.job.id: o.start for o in result.outcomes}
    # each queue waits from a job's submit to its first start: the quarter hours where both queues do
    ticks = [k * HOUR / 4 for k in range(int(8 * DAY / (HOUR / 4)))]
    waits = {"a": [False] * len(ticks), "b": [False] * len(ticks)}
    for j in workload.jobs:
        start = first_start[j.id]
        for k in range(int(-(-j.submit // (HOUR / 4))), len(ticks)):
            if start is not None and ticks[k] >= start:
                break
            waits[j.queue][k] = True
    both = [t for k, t in enumerate(ticks) if waits["a"][k] and waits["b"][k]]
    start, end = both[0], both[-1]
    assert end - start > 2.5 * DAY and len(both) == int((end - start) / (HOUR / 4)) + 1  # one unbroken window
    hours = _queue_hours(result, queue, start, end)
    share = 100 * hours["a"] / (hours["a"] + hours["b"])
    assert abs(share - share_a) <= 5, (share, hours)
    assert hours["a"] + hours["b"] >= 0.97 * 8 * (end - start) / HOUR
    # the report's figure is the same attempts, unclipped
    assert make_report(result).gpu_hours_by_queue == pytest.approx(_queue_hours(result, queue, 0.0, float("inf")),
                                                                   abs=0.01)


@pytest.mark.parametrize("a_shapes, b_shapes, b_priority", [
    ([1] * 8, [1] * 4, LOW),  # b takes back exactly its guarantee, from urgent work
    ([1] * 8, [1] * 6, LOW),  # b wants more than its guarantee: only its guarantee is reclaimed
    ([2] * 4, [1] * 3, NORMAL),  # victims larger than what b needs
    ([2] * 4, [2, 2], LOW),
    ([1, 1, 2, 4], [1, 2, 1], URGENT),
])
def test_a_queue_gets_its_guarantee_back_within_the_grace_and_the_lender_keeps_its_own(a_shapes, b_shapes,
                                                                                       b_priority):
    """Queue a fills the lab with long urgent work, half of it borrowed; when b submits, its jobs within its
    guarantee start as soon as their victims have exited (the reclaim bound: the grace), whatever their
    priority, and a never holds less than its guarantee."""
    node = make_node("n", "sim:dgx1")
    queues = (QueueSpec("a", ("ann",), guarantee_gpus=4), QueueSpec("b", ("bob",), guarantee_gpus=4))
    back_at = 10 * HOUR
    a = [TraceJob(i + 1, submit=i, duration=3 * DAY, gpus=g, user="ann", priority=URGENT, queue="a")
         for i, g in enumerate(a_shapes)]
    b = [TraceJob(len(a) + i + 1, submit=back_at, duration=2 * HOUR, gpus=g, user="bob", priority=b_priority,
                  queue="b") for i, g in enumerate(b_shapes)]
    options = SimOptions(queues=queues, reclaim_grace_s=120.0, grace_s=60.0, stop_s=10.0)
    result = simulate(Workload(tuple(a + b)), [node], "labq", options=options)
    queue = {j.id: j.queue for j in a + b}
    outcomes = {o.job.id: o for o in result.outcomes}
    assert all(outcomes[j.id].start is not None and outcomes[j.id].start < HOUR for j in a)  # a fills the lab
    # b's jobs within its guarantee start once their victims have exited: within the grace of the signal
    within, total = [], 0
    for j in b:
        total += j.gpus
        if total <= 4:
            within.append(j)
    assert within
    for j in within:
        start = outcomes[j.id].start
        assert start is not None and start <= back_at + options.stop_s + 1.0, (j, start)
        assert start <= back_at + options.grace_s
    # a is never taken below its guarantee, at any moment before its own jobs end
    moments = sorted({t for _, s, e, _ in result.runs for t in (s, e) if 10.0 <= t < 3 * DAY})
    low = [(t / HOUR, _held(result, queue, "a", t)) for t in moments if _held(result, queue, "a", t) < 4]
    assert not low, low
    # and only what b needed within its guarantee was taken from a
    taken = sum(outcomes[j.id].preemptions * j.gpus for j in a)
    assert taken <= 4 + max(a_shapes) - 1


def stream(low_at: float, low_queue: str, split: bool) -> Workload:
    """test_aging's stream: a 4-GPU node's worth of normal work arriving faster than it runs for four days, and
    one low job; the normal jobs in queue a (or in a and b by turns), the low job in ``low_queue``."""
    normal = [TraceJob(i + 1, submit=i * 0.5 * HOUR, duration=HOUR, gpus=4, user="busy",
                       queue="ab"[i % 2] if split else "a") for i in range(192)]
    low = TraceJob(len(normal) + 1, submit=low_at, duration=HOUR, gpus=4, user="patient", priority=LOW,
                   queue=low_queue)
    return Workload(tuple(sorted([*normal, low], key=lambda j: j.submit)))


@pytest.mark.parametrize("low_queue, split, aging_h", [
    ("a", False, 6.0),  # in the stream's queue
    ("b", False, 6.0),  # in the other queue, asking more than its guarantee
    ("b", False, 12.0),
    ("a", True, 6.0),  # the stream comes from both queues
])
def test_a_low_job_behind_an_endless_normal_stream_starts_within_the_aging_bound_with_two_queues(
        low_queue, split, aging_h):
    """test_aging's bound holds in a lab with two queues: without aging the low job waits out the stream; with
    it, it starts after at most the normal jobs submitted within one aging wait of it, plus the one running."""
    node = [make_node("ws1", "sim:ws-4x3090")]
    queues = (QueueSpec("a", ("*",), guarantee_gpus=2), QueueSpec("b", ("*",), guarantee_gpus=2))
    low_at = 2 * HOUR
    never = simulate(stream(low_at, low_queue, split), node, "labq", options=SimOptions(queues=queues))
    low = next(o for o in never.outcomes if o.job.priority == LOW)
    assert low.start is None or low.start > 90 * HOUR  # without aging it waits out the whole stream
    aged = simulate(stream(low_at, low_queue, split), node, "labq",
                    options=SimOptions(queues=queues, aging_s=aging_h * HOUR))
    low = next(o for o in aged.outcomes if o.job.priority == LOW)
    ahead = sum(1 for o in aged.outcomes if o.job.priority == NORMAL and o.job.submit <= low_at + aging_h * HOUR)
    assert low.start is not None and low.start <= low_at + (ahead + 1) * HOUR, (low.start, ahead)
    assert low.start - low_at <= 3 * aging_h * HOUR
