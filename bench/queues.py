"""Benchmark of the lab's queues (teams): guaranteed shares, borrowing, reclaims, aging, and the pass.

What it measures (labq's simulator, ``labq.sim.engine``: the real scheduler on a virtual clock)
  1. Shares. A month (``--days``, 30) of a two-team lab on 4 ``sim:dgx1`` (32 GPUs): queues ``a`` and
     ``b``, each guaranteed 50%, lending and borrowing, grace 120 s (a preempted job stops 30 s after
     its signal). Each team's jobs are ``labq.sim.workload.generate``'s lab of 4 users on its own
     16 GPUs (its guarantee) at an offered load of ``--load-a`` (1.0) and ``--load-b`` (0.8) times
     them (0.9 of the lab), without the deadline week (no bookings), seeds SEED and SEED+1: weekday
     submissions at about twice each team's share, nights and weekends far below; about 85% of the
     jobs preemptible. The simulation runs until every job has finished. A queue
     *wants more* at time t while one of its jobs was submitted (or requeued after a preemption)
     and has not started (again) by t; the *both busy* windows are the times both queues want
     more, within the month. The attempts (``SimResult.runs``) are clipped to them, and each
     queue's share of the GPU-hours used there is set against its guarantee (also shown: its share
     of the lab's capacity there, and its share over the whole month).
  2. Utilisation: the same workload on the same lab with hard caps and no borrowing
     (``QueueSpec(cap=16, borrows=False)`` for both queues): GPU-hours used within the month
     (attempts clipped to it; work later redone counts as used) over 32 GPUs x the month, both
     runs, and their ratio; the GPU-hours lost to preemptions and the mean wait (submit to first
     start, all jobs and per queue) beside them.
  3. Reclaim latency: 4 ``sim:dgx1`` (32 GPUs), queues ``a`` and ``b`` at 50% each, lab reclaim
     bound = grace = ``--grace`` (120 s) and victims that use all of it (``stop_s`` = grace). At 0,
     team ``a`` fills every GPU with 3-day preemptible normal jobs (4+2+1+1 GPUs a node) and queues
     200 more 1-GPU ones; team ``b`` then submits one low-priority job of 1, 4, 8 or 16 GPUs, an
     hour later (and once, 8 GPUs, 60 s later, before the victims' minimum runtime). Reported: the
     virtual seconds from its submit to its start (each case, and the worst) against the grace.
     Then the real ``schedule()`` call on the simulator's state at that submit (the pass that
     decides the reclaim), timed in wall time (median of 21 runs): the part that is not the grace.
  4. Aging: the month of 1. again with ``aging_s`` = ``--aging-h`` (24 h): the longest wait of any
     job (from its submit, or its requeue, to its start), against aging + the longest job of the
     month (the longest a job in its way can run); the longest wait per class, and the waits
     longer than the aging and than the bound; the same month without aging beside it. Then the
     month again with each queue's ``max_wait`` = the aging too: a job waiting longer may preempt
     preemptible jobs of its own served priority or lower in its way; its longest wait against the
     max wait + the minimum runtime + the grace. (An aged job goes before every low and normal job
     that has waited less, oldest first, and holds GPUs for itself: what is left is the longest job
     in its way.)
  5. Philly: ``../shared/data/traces/philly.csv`` from ``--philly-from`` to ``--philly-to``
     (2017-10-01 to 2017-10-05), simulated up to the window's end, in one shared lab of ``sim:dgx1``
     nodes sized so that the jobs' GPU-hours within the window (each job's run, started at its
     submit, clipped to the window) are ``--philly-load`` (1.0) times its capacity (bench/sim.py
     gives each VC its own cluster of the sizes Helios used; together, 2,816 GPUs, they would leave
     a shared lab mostly idle: about 18% busy in the first half of October). The
     ``--philly-queues`` (4) VCs with the most GPU-hours are each a queue, the rest one queue
     ``other``; each queue is guaranteed its share of the GPU-hours (whole percents, rounded down).
     Hard caps: each queue capped at its guarantee and not borrowing. For each queue: its
     guarantee, its share of the GPU-hours used within the window, and its share of the lab's
     capacity while it wants more; the lab's utilisation within the window, jobs started and
     still waiting at its end, preemptions, with borrowing and with hard caps, and the ratio.
     A shared lab's pass is slow on Philly's long queues (a week takes about 10 minutes here), so
     the window is short: four days (two with ``--quick``).
  6. One ``schedule()`` pass at 10,000 queued jobs, on bench/scheduler.py's state (20 ``sim:dgx1``,
     80 of 160 GPUs busy, ~20 users): with 5 queues of 4 users each (20% each), with one queue
     of everyone (100%), and with no queues; the same jobs and nodes, warm, median (and min) of
     ``--repeats`` (11) runs each, the cases taken in turn, and the ratios.

Goals (from the issue): in both-busy windows each queue's share within 5 percentage points of
its guarantee; utilisation with borrowing above that with hard caps; a reclaim within the
victims' grace plus under 1 s; no wait longer than the aging setting plus the longest job in its
way; the pass with 5 queues within 1.5x of one queue. Timings are reported, never asserted; the
machine is noisy, so the pass is compared by ratio. Consistency is checked (every simulated job
finished; the reclaim pass preempts for team b's job; equal passes decide equally): a violation
is printed after the figures and exits with status 1. Progress goes to stderr.

``--quick``: a week instead of a month, Philly 2017-10-01 to 2017-10-03, 3 repeats of the pass.

Run:  .venv/bin/python bench/queues.py [--json] [--quick] [--seed 1] [--days 30]
                                       [--load-a 1.0 --load-b 0.8] [--aging-h 24] [--grace 120]
                                       [--philly-from 2017-10-01 --philly-to 2017-10-05] [--parts 1,2,3,4,5,6]
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from figures import print_figures  # noqa: E402
from scheduler import NOW, USERS, make_nodes, make_queued, make_running  # noqa: E402
from labq.models import Job  # noqa: E402
from labq.models.priority import PriorityClass  # noqa: E402
from labq.models.queues import QueueSpec  # noqa: E402
from labq.scheduler import Policy, schedule  # noqa: E402
from labq.scheduler import placement as placement_module  # noqa: E402
from labq.sim.cluster import parse_cluster  # noqa: E402
from labq.sim.engine import SimOptions, _Simulation, simulate  # noqa: E402
from labq.sim.model import SimResult, TraceJob, Workload  # noqa: E402
from labq.sim.traces import load_trace, parse_when  # noqa: E402
from labq.sim.workload import EPOCH, generate  # noqa: E402

HOUR, DAY = 3600.0, 86400.0
TRACE = ROOT.parent / "shared" / "data" / "traces" / "philly.csv"
LAB = "4xsim:dgx1"  #: 32 GPUs, for the month and the reclaim
LAB_GPUS = 32
GRACE_S, STOP_S = 120.0, 30.0  #: the month's grace, and how long a signalled job takes to stop
MIN_RUNTIME_S = SimOptions().min_runtime_s  #: the simulator's (and the leader's) minimum runtime before a preemption
SHARE_GOAL_PP = 5.0
RECLAIM_GOAL_S = 1.0  #: beyond the victims' grace
PASS_RATIO_GOAL = 1.5


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# -- intervals ------------------------------------------------------------------------------

def union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The spans merged: disjoint, sorted, empty ones dropped."""
    out: list[list[float]] = []
    for s, e in sorted(sp for sp in spans if sp[1] > sp[0]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


class Covered:
    """How much of [s, e] a set of disjoint sorted spans covers, by bisection on their running total."""

    def __init__(self, spans: list[tuple[float, float]]) -> None:
        self.starts = [s for s, _ in spans]
        self.spans = spans
        self.before = [0.0]
        for s, e in spans:
            self.before.append(self.before[-1] + e - s)

    def upto(self, t: float) -> float:
        i = bisect.bisect_right(self.starts, t)
        if i == 0:
            return 0.0
        s, e = self.spans[i - 1]
        return self.before[i - 1] + min(t, e) - s

    def within(self, s: float, e: float) -> float:
        return max(0.0, self.upto(e) - self.upto(s))

    @property
    def total(self) -> float:
        return self.before[-1]


def waits(result: SimResult) -> list[tuple[int, float, float]]:
    """Every wait of every job: (job id, from, to): its submit to its first start, and each requeue (the end
    of a preempted attempt) to its next start; a job that never started waits to the last end."""
    attempts: dict[int, list[tuple[float, float]]] = {}
    for job_id, start, end, _ in result.runs:
        attempts.setdefault(job_id, []).append((start, end))
    last = result.meta.get("until", max((end for _, _, end, _ in result.runs), default=0.0))
    out = []
    for o in result.outcomes:
        job = o.job
        runs = sorted(attempts.get(job.id, []))
        since = job.submit
        for start, end in runs:
            out.append((job.id, since, start))
            since = end
        if o.end is None:  # never started, or requeued and never started again
            out.append((job.id, since, max(last, since)))
    return out


def wanting(result: SimResult, queue_of: dict[int, str]) -> dict[str, list[tuple[float, float]]]:
    """Per queue, when it wants more: one of its jobs waits."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for job_id, s, e in waits(result):
        spans.setdefault(queue_of[job_id], []).append((s, e))
    return {q: union(sp) for q, sp in spans.items()}


def gpu_s_within(result: SimResult, queue_of: dict[int, str], spans: list[tuple[float, float]]) -> dict[str, float]:
    """Per queue, the GPU-seconds its attempts held within ``spans``."""
    cover = Covered(spans)
    out: dict[str, float] = {}
    for job_id, s, e, gpus in result.runs:
        q = queue_of[job_id]
        out[q] = out.get(q, 0.0) + gpus * cover.within(s, e)
    return out


def utilisation(result: SimResult, until: float) -> float:
    """GPU-seconds held within [0, until] over the lab's GPUs x until."""
    held = sum(g * max(0.0, min(e, until) - max(s, 0.0)) for _, s, e, g in result.runs)
    return held / (result.gpus * until)


def check_finished(result: SimResult, what: str, problems: list[str]) -> None:
    unfinished = sum(o.end is None for o in result.outcomes)
    if unfinished or result.skipped:
        problems.append(f"{what}: {unfinished} jobs never finished, {len(result.skipped)} skipped "
                        f"({result.meta.get('never_started') or [why for _, why in result.skipped[:3]]})")


class Until(_Simulation):
    """The simulator, stopped at ``until``: the attempts still running then end there in ``runs``."""

    def __init__(self, *args, until: float) -> None:
        super().__init__(*args)
        self.until = until

    def _step(self, now: float) -> None:
        if now > self.until:
            self.clock.heap.clear()
            self.retry_at = math.inf
            return
        super()._step(now)


def simulate_until(workload: Workload, cluster: str, options: SimOptions, until: float) -> SimResult:
    """``simulate`` up to ``until`` on the virtual clock; attempts cut there (``meta["until"]``)."""
    nodes = parse_cluster(cluster)
    sim = Until(workload, nodes, "labq", options, None, until=until)
    t0 = time.perf_counter()
    sim.run()
    runs = [(j, s, min(e, until), g) for j, s, e, g in sim.runs if s < until]
    runs += [(j.id, sim.started[j.id], until, j.spec.gpus) for j in sim.jobs.values()
             if j.state.holds_gpus and sim.started.get(j.id, math.inf) < until]
    outcomes = tuple(replace(o, end=o.end if o.end is not None and o.end <= until else None,
                             start=o.start if o.start is not None and o.start <= until else None)
                     for o in sim.outcomes())
    return SimResult("labq", cluster, sum(n.gpu_count for n in nodes), outcomes, tuple(sim.skipped), (),
                     sum(g * (e - s) for _, s, e, g in runs), time.perf_counter() - t0, sim.passes,
                     workload.epoch, {"until": until}, tuple(runs))


def pct(x: float) -> float:
    return round(100.0 * x, 2)


# -- 1, 2, 4: the two-team month ------------------------------------------------------------

def team_jobs(seed: int, team: str, days: int, load: float) -> list[TraceJob]:
    """``generate``'s lab of 4 users on its guarantee's 16 GPUs, with no deadline week, in queue ``team``."""
    w = generate(seed=seed, days=days, users=4, gpus=LAB_GPUS // 2, load=load, deadline_week=False)
    return [replace(j, user=f"{team}-{j.user}", queue=team) for j in w.jobs]


def month_workload(seed: int, days: int, load_a: float, load_b: float) -> Workload:
    jobs = sorted(team_jobs(seed, "a", days, load_a) + team_jobs(seed + 1, "b", days, load_b),
                  key=lambda j: (j.submit, j.queue, j.id))
    return Workload(tuple(replace(j, id=i) for i, j in enumerate(jobs, 1)), (), EPOCH,
                    f"two teams, seeds {seed} and {seed + 1}, {days} days, loads {load_a:g} and {load_b:g}")


def two_queues(workload: Workload, borrows: bool, max_wait_s: float | None = None) -> tuple[QueueSpec, ...]:
    return tuple(QueueSpec(q, tuple(sorted({j.user for j in workload.jobs if j.queue == q})), guarantee_percent=50.0,
                           cap=None if borrows else LAB_GPUS // 2, borrows=borrows, max_wait_s=max_wait_s)
                 for q in ("a", "b"))


def run_month(workload: Workload, borrows: bool, aging_s: float | None, what: str, problems: list[str],
              max_wait_s: float | None = None) -> SimResult:
    options = SimOptions(grace_s=GRACE_S, stop_s=STOP_S, queues=two_queues(workload, borrows, max_wait_s),
                         aging_s=aging_s)
    t0 = time.perf_counter()
    result = simulate(workload, parse_cluster(LAB), "labq", cluster=LAB, options=options)
    say(f"  {what}: {len(workload.jobs):,} jobs, {result.passes:,} passes, {time.perf_counter() - t0:.1f} s")
    check_finished(result, what, problems)
    return result


def part_shares(workload: Workload, result: SimResult, days: int) -> dict:
    queue_of = {j.id: j.queue for j in workload.jobs}
    want = wanting(result, queue_of)
    both = intersect(intersect(want.get("a", []), want.get("b", [])), [(0.0, days * DAY)])
    both_s = sum(e - s for s, e in both)
    held = gpu_s_within(result, queue_of, both)
    used = sum(held.values())
    whole = gpu_s_within(result, queue_of, [(0.0, days * DAY)])
    fig: dict = {"month_days": days, "month_gpus": result.gpus, "month_jobs": len(workload.jobs),
                 "month_preemptible_pct": pct(sum(j.preemptible for j in workload.jobs) / len(workload.jobs)),
                 "month_both_busy_h": round(both_s / HOUR, 1),
                 "month_both_busy_pct_of_month": pct(both_s / (days * DAY)),
                 "month_both_busy_windows": len(both),
                 "month_both_busy_utilisation_pct": pct(used / (result.gpus * both_s)) if both_s else 0.0}
    for q in ("a", "b"):
        share = held.get(q, 0.0) / used if used else 0.0
        fig[f"month_{q}_guarantee_pct"] = 50.0
        fig[f"month_{q}_both_busy_share_pct"] = pct(share)
        fig[f"month_{q}_both_busy_off_by_pp"] = round(abs(100.0 * share - 50.0), 2)
        fig[f"month_{q}_both_busy_share_of_capacity_pct"] = pct(held.get(q, 0.0) / (result.gpus * both_s)) \
            if both_s else 0.0
        fig[f"month_{q}_month_share_pct"] = pct(whole.get(q, 0.0) / sum(whole.values()))
    fig["month_both_busy_worst_off_by_pp"] = max(fig["month_a_both_busy_off_by_pp"], fig["month_b_both_busy_off_by_pp"])
    return fig


def part_utilisation(workload: Workload, lend: SimResult, caps: SimResult, days: int) -> dict:
    fig = {}
    for key, r in (("borrowing", lend), ("hard_caps", caps)):
        delays = [o.start - o.job.submit for o in r.outcomes if o.start is not None]
        fig[f"util_{key}_pct"] = pct(utilisation(r, days * DAY))
        fig[f"util_{key}_lost_gpu_h"] = round(sum(o.lost_gpu_s for o in r.outcomes) / HOUR, 1)
        fig[f"util_{key}_preemptions"] = sum(o.preemptions for o in r.outcomes)
        fig[f"util_{key}_mean_wait_h"] = round(statistics.fmean(delays) / HOUR, 2) if delays else 0.0
        for q in ("a", "b"):
            mine = [o.start - o.job.submit for o in r.outcomes if o.start is not None and o.job.queue == q]
            fig[f"util_{key}_{q}_mean_wait_h"] = round(statistics.fmean(mine) / HOUR, 2) if mine else 0.0
    fig["util_borrowing_over_hard_caps"] = fig["util_borrowing_pct"] / fig["util_hard_caps_pct"]
    return fig


def part_aging(workload: Workload, aged: SimResult, plain: SimResult, bounded: SimResult, aging_s: float) -> dict:
    longest_job = max(j.duration for j in workload.jobs)
    fig: dict = {"aging_h": aging_s / HOUR, "aging_longest_job_h": round(longest_job / HOUR, 2),
                 "aging_bound_h": round((aging_s + longest_job) / HOUR, 2),
                 # a job past max_wait preempts what stands in its way: its victims run their minimum, then their grace
                 "aging_max_wait_bound_h": round((aging_s + MIN_RUNTIME_S + GRACE_S) / HOUR, 2)}
    by_id = {j.id: j for j in workload.jobs}
    for key, r in (("with_aging", aged), ("without_aging", plain), ("with_max_wait", bounded)):
        job_id, s, e = max(waits(r), key=lambda w: w[2] - w[1])
        job = by_id[job_id]
        fig[f"aging_longest_wait_{key}_h"] = round((e - s) / HOUR, 2)
        fig[f"aging_longest_wait_{key}_job"] = (
            f"{job_id}: {job.queue} {PriorityClass(job.priority).name.lower()} {job.gpus} GPU"
            f"{'' if job.preemptible else ' firm'} at {s / DAY:.2f} d")
        for cls in PriorityClass:
            longest = max((e - s for j, s, e in waits(r) if by_id[j].priority == cls), default=0.0)
            fig[f"aging_longest_wait_{key}_{cls.name.lower()}_h"] = round(longest / HOUR, 2)
        over = sorted((e - s for _, s, e in waits(r) if e - s > aging_s), reverse=True)
        fig[f"aging_waits_over_aging_{key}"] = len(over)
        fig[f"aging_waits_over_bound_{key}"] = sum(w > aging_s + longest_job for w in over)
    return fig


# -- 3: reclaim -----------------------------------------------------------------------------

class Watched(_Simulation):
    """The simulator, keeping the lab's state at the pass that runs at ``at``."""

    def __init__(self, *args, at: float) -> None:
        super().__init__(*args)
        self.at, self.state = at, None

    def _step(self, now: float) -> None:
        if now == self.at and self.state is None:
            self.state = (list(self.jobs.values()), self._usage_now(now))
        super()._step(now)


def reclaim_workload(gpus: int, at: float, backlog: int = 200) -> Workload:
    jobs = []
    for node in range(LAB_GPUS // 8):
        for size in (4, 2, 1, 1):
            jobs.append(TraceJob(len(jobs) + 1, 0.0, 3 * DAY, size, user="a-ana", queue="a"))
    for _ in range(backlog):
        jobs.append(TraceJob(len(jobs) + 1, 1.0, 3 * DAY, 1, user="a-ben", queue="a"))
    jobs.append(TraceJob(len(jobs) + 1, at, HOUR, gpus, user="b-bo", queue="b", priority=int(PriorityClass.LOW),
                         preemptible=False))
    return Workload(tuple(jobs), (), EPOCH, f"reclaim {gpus} GPUs at {at:g} s")


def part_reclaim(grace_s: float, repeats: int, problems: list[str]) -> dict:
    queues = (QueueSpec("a", ("a-ana", "a-ben"), guarantee_percent=50.0),
              QueueSpec("b", ("b-bo",), guarantee_percent=50.0))
    options = SimOptions(grace_s=grace_s, stop_s=grace_s, queues=queues, reclaim_grace_s=grace_s)
    nodes = parse_cluster(LAB)
    fig: dict = {"reclaim_grace_s": grace_s}
    latencies, pass_ms = [], []
    for gpus, at in ((1, HOUR), (4, HOUR), (8, HOUR), (16, HOUR), (8, 60.0)):
        workload = reclaim_workload(gpus, at)
        b = workload.jobs[-1]
        sim = Watched(workload, nodes, "labq", options, None, at=at)
        sim.run()
        key = f"reclaim_{gpus}gpu_at_{at:g}s"
        start = sim.first_start.get(b.id)
        if start is None:
            problems.append(f"{key}: team b's job never started")
            continue
        latencies.append(start - at)
        fig[f"{key}_latency_s"] = start - at
        jobs, usage = sim.state
        policy = sim._policy()
        first = schedule(jobs, nodes, now=at, usage=usage, policy=policy)
        fig[f"{key}_victims"] = sum(p.for_job == b.id for p in first.preemptions)
        if not any(p.for_job == b.id for p in first.preemptions):
            problems.append(f"{key}: the pass at its submit preempts nothing for team b's job "
                            f"({[p for p in first.pending if p.job_id == b.id]})")
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            again = schedule(jobs, nodes, now=at, usage=usage, policy=policy)
            times.append((time.perf_counter() - t0) * 1000.0)
            if again != first:
                problems.append(f"{key}: two passes over the same state decided differently")
        fig[f"{key}_pass_ms"] = statistics.median(times)
        fig[f"{key}_pass_jobs"] = len(jobs)
        pass_ms.append(statistics.median(times))
    if latencies:
        fig["reclaim_worst_latency_s"] = max(latencies)
        fig["reclaim_worst_pass_ms"] = max(pass_ms)
        #: what a real lab adds to the grace: the simulator's latency beyond it, plus the pass's wall time
        fig["reclaim_beyond_grace_s"] = max(latencies) - grace_s + max(pass_ms) / 1000.0
    return fig


# -- 5: Philly ------------------------------------------------------------------------------

def philly_workload(start: str, end: str, top: int) -> tuple[Workload, dict[str, float], float, list[str]]:
    """The window's jobs, each in its queue (its VC's, or ``other``); the queues' GPU-hours within the window."""
    lo, hi = parse_when(start), parse_when(end)
    workload, notes = load_trace(TRACE, "philly", start=lo, end=hi)
    span = hi - lo
    demand: dict[str, float] = {}
    for j in workload.jobs:
        demand[j.vc] = demand.get(j.vc, 0.0) + j.gpus * min(j.duration, span - j.submit)
    named = [vc for vc, _ in sorted(demand.items(), key=lambda kv: -kv[1])[:top]]
    queue_of_vc = {vc: (vc if vc in named else "other") for vc in demand}
    jobs = tuple(replace(j, queue=queue_of_vc[j.vc]) for j in workload.jobs)
    per_queue: dict[str, float] = {}
    for vc, gpu_s in demand.items():
        per_queue[queue_of_vc[vc]] = per_queue.get(queue_of_vc[vc], 0.0) + gpu_s
    return replace(workload, jobs=jobs), per_queue, span, notes


def part_philly(start: str, end: str, top: int, load: float, problems: list[str]) -> dict:
    t0 = time.perf_counter()
    workload, demand, span, _ = philly_workload(start, end, top)
    total = sum(demand.values())
    nodes_n = max(1, math.ceil(total / (8 * span * load)))
    # the largest job needs whole nodes: never fewer nodes than it spans
    nodes_n = max(nodes_n, math.ceil(max(j.gpus for j in workload.jobs) / 8))
    cluster = f"{nodes_n}xsim:dgx1"
    gpus = nodes_n * 8
    names = sorted(demand, key=lambda q: (q == "other", -demand[q]))
    percent = {q: math.floor(100.0 * demand[q] / total) for q in names}
    fig: dict = {"philly_window": f"{start} to {end}", "philly_jobs": len(workload.jobs), "philly_cluster": cluster,
                 "philly_offered_load": round(total / (gpus * span), 3)}
    say(f"  Philly {start} to {end}: {len(workload.jobs):,} jobs on {cluster}, loaded in "
        f"{time.perf_counter() - t0:.1f} s")
    queue_of = {j.id: j.queue for j in workload.jobs}
    members = {q: tuple(sorted({j.user for j in workload.jobs if j.queue == q})) for q in names}

    for key, borrows in (("borrowing", True), ("hard_caps", False)):
        queues = tuple(QueueSpec(q, members[q], guarantee_percent=float(percent[q]),
                                 cap=None if borrows else int(gpus * percent[q] / 100.0), borrows=borrows)
                       for q in names)
        r = simulate_until(workload, cluster, SimOptions(grace_s=GRACE_S, stop_s=STOP_S, queues=queues), span)
        say(f"  Philly, {key.replace('_', ' ')}: {r.passes:,} passes, {r.wall_s:.1f} s")
        fig[f"philly_{key}_started"] = sum(o.start is not None for o in r.outcomes)
        fig[f"philly_{key}_waiting_at_end"] = sum(o.start is None for o in r.outcomes)
        fig[f"philly_{key}_preemptions"] = sum(o.preemptions for o in r.outcomes)
        held = gpu_s_within(r, queue_of, [(0.0, span)])
        used = sum(held.values())
        want = wanting(r, queue_of)
        fig[f"philly_{key}_util_pct"] = pct(utilisation(r, span))
        for q in names:
            fig[f"philly_{q}_guarantee_pct"] = float(percent[q])
            fig[f"philly_{q}_{key}_share_pct"] = pct(held.get(q, 0.0) / used) if used else 0.0
            spans = intersect(want.get(q, []), [(0.0, span)])
            busy = sum(e - s for s, e in spans)
            mine = gpu_s_within(r, queue_of, spans).get(q, 0.0)
            fig[f"philly_{q}_{key}_wants_more_h"] = round(busy / HOUR, 1)
            fig[f"philly_{q}_{key}_share_while_wanting_pct"] = pct(mine / (gpus * busy)) if busy else 0.0
    fig["philly_util_borrowing_over_hard_caps"] = fig["philly_borrowing_util_pct"] / fig["philly_hard_caps_util_pct"]
    # the keys grouped per queue, for the table
    order = [k for k in fig if not k.startswith(tuple(f"philly_{q}_" for q in names))]
    for q in names:
        order += [k for k in fig if k.startswith(f"philly_{q}_")]
    return {k: fig[k] for k in order}


# -- 6: the pass at 10,000 queued jobs ------------------------------------------------------

def with_queues(jobs: list[Job], queue_of_user: dict[str, str]) -> list[Job]:
    return [replace(j, spec=replace(j.spec, queue=queue_of_user[j.spec.user])) for j in jobs]


def part_pass(seed: int, repeats: int, problems: list[str]) -> dict:
    nodes = make_nodes()
    running = make_running(nodes, random.Random(seed))
    queued = make_queued(10_000, len(running) + 1, random.Random(f"queued-{seed}"))
    five = {u: f"q{i // 4}" for i, u in enumerate(USERS)}
    cases = {
        "no_queues": (running + queued, Policy()),
        "one_queue": (with_queues(running + queued, {u: "all" for u in USERS}),
                      Policy(queues=(QueueSpec("all", ("*",), guarantee_percent=100.0),))),
        "five_queues": (with_queues(running + queued, five),
                        Policy(queues=tuple(QueueSpec(f"q{i}", tuple(u for u in USERS if five[u] == f"q{i}"),
                                                      guarantee_percent=20.0) for i in range(5)))),
    }
    placement_module.forget_tables()
    schedule(running + queued, nodes, now=NOW)  # builds the subset tables, shared by every case
    fig: dict = {"pass_queued_jobs": len(queued), "pass_running_jobs": len(running), "pass_repeats": repeats}
    first = {key: schedule(jobs, nodes, now=NOW, policy=policy) for key, (jobs, policy) in cases.items()}
    times: dict[str, list[float]] = {key: [] for key in cases}
    for _ in range(repeats):  # the cases in turn, so that a slow spell of the machine falls on each alike
        for key, (jobs, policy) in cases.items():
            t0 = time.perf_counter()
            again = schedule(jobs, nodes, now=NOW, policy=policy)
            times[key].append((time.perf_counter() - t0) * 1000.0)
            if again != first[key]:
                problems.append(f"pass {key}: two passes over the same jobs decided differently")
    for key in cases:
        decided = len(first[key].starts) + len(first[key].pending)
        if decided != len(queued):
            problems.append(f"pass {key}: {decided} queued jobs decided, of {len(queued)}")
        fig[f"pass_{key}_median_ms"] = statistics.median(times[key])
        fig[f"pass_{key}_min_ms"] = min(times[key])
        fig[f"pass_{key}_starts"] = len(first[key].starts)
        fig[f"pass_{key}_preemptions"] = len(first[key].preemptions)
    fig["pass_five_over_one_queue"] = fig["pass_five_queues_median_ms"] / fig["pass_one_queue_median_ms"]
    fig["pass_five_over_one_queue_min"] = fig["pass_five_queues_min_ms"] / fig["pass_one_queue_min_ms"]
    fig["pass_one_queue_over_none"] = fig["pass_one_queue_median_ms"] / fig["pass_no_queues_median_ms"]
    fig["pass_five_queues_over_none"] = fig["pass_five_queues_median_ms"] / fig["pass_no_queues_median_ms"]
    return fig


# -- report ---------------------------------------------------------------------------------

SECTIONS = (
    ("month", "1. Shares in a two-team month while both queues want more (goal: each within 5 pp of its guarantee)"),
    ("util", "2. Utilisation: borrowing against hard caps and no borrowing, same workload (goal: higher)"),
    ("reclaim", "3. Reclaim: team b's submit to its start, victims using all their grace "
                "(goal: the grace plus under 1 s)"),
    ("aging", "4. Aging on the month: the longest wait (goal: within aging + the longest job in its way)"),
    ("philly", "5. Philly in one shared lab, a queue per top VC and one for the rest"),
    ("pass", "6. One scheduling pass at 10,000 queued jobs (goal: 5 queues within 1.5x of one queue)"),
)


def goals(fig: dict) -> dict[str, tuple[str, bool]]:
    """Each figure with a goal: (the goal as shown, met)."""
    out: dict[str, tuple[str, bool]] = {}
    for q in ("a", "b"):
        k = f"month_{q}_both_busy_off_by_pp"
        if k in fig:
            out[k] = (f"<= {SHARE_GOAL_PP:g} pp", fig[k] <= SHARE_GOAL_PP)
    if "month_both_busy_worst_off_by_pp" in fig:
        out["month_both_busy_worst_off_by_pp"] = (f"<= {SHARE_GOAL_PP:g} pp",
                                                  fig["month_both_busy_worst_off_by_pp"] <= SHARE_GOAL_PP)
    if "util_borrowing_over_hard_caps" in fig:
        out["util_borrowing_over_hard_caps"] = ("> 1", fig["util_borrowing_over_hard_caps"] > 1.0)
    if "reclaim_beyond_grace_s" in fig:
        out["reclaim_beyond_grace_s"] = (f"< {RECLAIM_GOAL_S:g} s", fig["reclaim_beyond_grace_s"] < RECLAIM_GOAL_S)
        g = fig["reclaim_grace_s"]
        for k in [k for k in fig if k.startswith("reclaim_") and k.endswith("_latency_s")]:
            out[k] = (f"< {g + RECLAIM_GOAL_S:g} s", fig[k] < g + RECLAIM_GOAL_S)
    if "aging_longest_wait_with_aging_h" in fig:
        out["aging_longest_wait_with_aging_h"] = (f"<= {fig['aging_bound_h']:g} h",
                                                  fig["aging_longest_wait_with_aging_h"] <= fig["aging_bound_h"])
    if "aging_longest_wait_with_max_wait_h" in fig:
        out["aging_longest_wait_with_max_wait_h"] = (
            f"<= {fig['aging_max_wait_bound_h']:g} h",
            fig["aging_longest_wait_with_max_wait_h"] <= fig["aging_max_wait_bound_h"])
    if "philly_util_borrowing_over_hard_caps" in fig:
        out["philly_util_borrowing_over_hard_caps"] = ("> 1", fig["philly_util_borrowing_over_hard_caps"] > 1.0)
    if "pass_five_over_one_queue" in fig:
        for k in ("pass_five_over_one_queue", "pass_five_over_one_queue_min"):  # the min: less of the noise
            out[k] = (f"<= {PASS_RATIO_GOAL:g}", fig[k] <= PASS_RATIO_GOAL)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--quick", action="store_true",
                        help="a week, Philly 2017-10-01 to 2017-10-03, 3 repeats of the pass")
    parser.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")
    parser.add_argument("--days", type=int, help="days of the two-team lab (default 30; 7 with --quick)")
    parser.add_argument("--load-a", type=float, default=1.0, help="team a's offered load on its 16 GPUs (1.0)")
    parser.add_argument("--load-b", type=float, default=0.8, help="team b's offered load on its 16 GPUs (0.8)")
    parser.add_argument("--aging-h", type=float, default=24.0, help="aging for part 4, hours (24)")
    parser.add_argument("--grace", type=float, default=GRACE_S, help="the victims' grace in part 3, s (120)")
    parser.add_argument("--philly-from", help="Philly window start (2017-10-01)")
    parser.add_argument("--philly-to", help="Philly window end (2017-10-05; 2017-10-03 with --quick)")
    parser.add_argument("--philly-queues", type=int, default=4, help="VCs that get a queue of their own (4)")
    parser.add_argument("--philly-load", type=float, default=1.0,
                        help="the window's GPU-hours over the shared lab's capacity, to size it (1.0)")
    parser.add_argument("--no-philly", action="store_true", help="leave part 5 out")
    parser.add_argument("--repeats", type=int, help="timed runs of each pass (11; 3 with --quick)")
    parser.add_argument("--parts", default="1,2,3,4,5,6", help="which parts, comma-separated (all)")
    args = parser.parse_args(argv)
    days = args.days or (7 if args.quick else 30)
    repeats = args.repeats or (3 if args.quick else 11)
    philly_from = args.philly_from or "2017-10-01"
    philly_to = args.philly_to or ("2017-10-03" if args.quick else "2017-10-05")
    parts = {p.strip() for p in args.parts.split(",")}
    if args.no_philly:
        parts.discard("5")

    problems: list[str] = []
    fig: dict = {"seed": args.seed, "python": sys.version.split()[0], "quick": args.quick}
    began = time.perf_counter()
    if parts & {"1", "2", "4"}:
        say(f"the two-team month ({days} days on {LAB}):")
        workload = month_workload(args.seed, days, args.load_a, args.load_b)
        lend = run_month(workload, True, None, "borrowing", problems)
        if "1" in parts:
            fig |= part_shares(workload, lend, days)
        if "2" in parts:
            caps = run_month(workload, False, None, "hard caps, no borrowing", problems)
            fig |= part_utilisation(workload, lend, caps, days)
        if "4" in parts:
            aged = run_month(workload, True, args.aging_h * HOUR, f"borrowing, aging {args.aging_h:g} h", problems)
            bounded = run_month(workload, True, args.aging_h * HOUR,
                                f"borrowing, aging and max_wait {args.aging_h:g} h", problems,
                                max_wait_s=args.aging_h * HOUR)
            fig |= part_aging(workload, aged, lend, bounded, args.aging_h * HOUR)
    if "3" in parts:
        say("reclaim:")
        fig |= part_reclaim(args.grace, 21, problems)
    if "5" in parts:
        say("Philly:")
        fig |= part_philly(philly_from, philly_to, args.philly_queues, args.philly_load, problems)
    if "6" in parts:
        say("the pass at 10,000 queued jobs:")
        fig |= part_pass(args.seed, repeats, problems)
    fig["wall_s"] = round(time.perf_counter() - began, 1)
    targets = goals(fig)
    fig["goals_met"] = {k: met for k, (_, met) in targets.items()}
    fig["problems"] = problems

    if args.json:
        print(json.dumps(fig))
    else:
        print(f"labq queues benchmark (seed {fig['seed']}, Python {fig['python']}"
              f"{', quick' if args.quick else ''}; {fig['wall_s']:g} s)\n")
        for prefix, title in SECTIONS:
            part = {k: v for k, v in fig.items() if k.startswith(prefix + "_")}
            if part:
                print_figures(title, part, targets)
                print()
        for p in problems:
            print(f"PROBLEM: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
