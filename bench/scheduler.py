"""Benchmark of labq's pure scheduler: one scheduling pass, and single GPU-set placements.

What it measures
  * One ``schedule(...)`` pass with 1,000 and 10,000 queued jobs (1/2/4/8 GPUs, classes
    low..urgent, ~20 users) on 20 ``sim:dgx1`` nodes with 80 of their 160 GPUs held by
    running jobs. The first (cold) pass, which builds the per-topology subset tables, is
    reported on its own; then the pass is repeated warm (min and median).
  * ``best_set`` on one 16-GPU node (``sim:dgx2`` and ``sim:flat:16``): 5,000 random free
    masks (free count uniform in 0..16) with k in {1, 2, 4, 8}; p50, p99 and max over the
    feasible ones (infeasible ones counted apart), after a timed one-time table build.

Goals (from the issue): a 10,000-job pass within 50 ms; a 16-GPU placement p99 within 5 ms.
Timings are reported, never asserted. The pass's decisions are checked for consistency
(every queued job started or pending exactly once, no GPU given twice, only eligible victims
preempted, equal input gives equal decisions); a violation exits with status 1.

Run:  .venv/bin/python bench/scheduler.py [--json] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

try:
    import labq  # noqa: F401
except ImportError:  # running from a checkout without an installed labq
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from figures import print_figures
from labq.models import Job, JobSpec, JobState, Node, NodeAllocation, Placement, PriorityClass
from labq.scheduler import Policy, best_set, schedule
from labq.scheduler import placement as placement_module
from labq.topologies import parse_sim_spec

NOW = 1_000_000.0
HOUR = 3600.0
USERS = [f"u{i:02d}" for i in range(20)]
PASS_GOAL_MS = 50.0  # a pass at 10,000 queued jobs
PLACEMENT_P99_GOAL_MS = 5.0  # one placement on a 16-GPU node
LINEAR_RATIO = 10.0  # 10x the jobs in at most 10x the time
MIN_RUNTIME_S = Policy().min_runtime_s


def clear_set_tables() -> None:
    """Forget the cached per-topology subset tables, so the next pass or placement is cold."""
    placement_module.forget_tables()


def ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000.0


# -- workload ---------------------------------------------------------------------------

def make_nodes() -> list[Node]:
    inv = parse_sim_spec("sim:dgx1")
    return [Node(f"n{i:02d}", inv.gpus(f"n{i:02d}"), inv.topology, simulated=True) for i in range(20)]


def make_running(nodes: list[Node], rng: random.Random) -> list[Job]:
    """Half of every node busy: 4 of its 8 GPUs, in 1/2/4-GPU jobs placed by ``best_set``."""
    jobs = []
    for node in nodes:
        free = (1 << node.gpu_count) - 1
        for gpus in rng.choice([(4,), (2, 2), (2, 1, 1), (1, 1, 1, 1), (1, 2, 1)]):
            choice = best_set(node.topology, free, gpus)
            free &= ~choice.mask
            limit = rng.choice([None, HOUR, 4 * HOUR, 24 * HOUR])
            ran = rng.uniform(30.0, 0.9 * (limit or 8 * HOUR))  # some under the 300 s minimum runtime
            spec = JobSpec(user=rng.choice(USERS), command=("train",), gpus=gpus,
                           priority=int(rng.choices([PriorityClass.LOW, PriorityClass.NORMAL, PriorityClass.HIGH],
                                                    [0.4, 0.45, 0.15])[0]),
                           time_limit_s=limit, preemptible=rng.random() < 0.85)
            alloc = NodeAllocation(node.name, choice.gpus, tuple(node.gpus[i].uuid for i in choice.gpus), choice.score)
            jobs.append(Job(len(jobs) + 1, spec, submitted_at=NOW - ran - rng.uniform(0, HOUR),
                            state=JobState.RUNNING, placement=Placement((alloc,)), started_at=NOW - ran))
    return jobs


def make_queued(count: int, first_id: int, rng: random.Random) -> list[Job]:
    classes = [PriorityClass.LOW, PriorityClass.NORMAL, PriorityClass.HIGH, PriorityClass.URGENT]
    jobs = []
    for i in range(count):
        spec = JobSpec(user=rng.choice(USERS), command=("train",),
                       gpus=rng.choices([1, 2, 4, 8], [0.55, 0.25, 0.12, 0.08])[0],
                       priority=int(rng.choices(classes, [0.3, 0.5, 0.15, 0.05])[0]),
                       time_limit_s=rng.choice([None, HOUR, 4 * HOUR, 24 * HOUR]), preemptible=rng.random() < 0.9)
        jobs.append(Job(first_id + i, spec, submitted_at=NOW - rng.uniform(0, 3 * 24 * HOUR)))
    return jobs


# -- the pass -----------------------------------------------------------------------------

def check_decisions(decisions, running: list[Job], queued: list[Job]) -> None:
    """Exit 1 if the pass lost a job, decided one twice, handed out a busy GPU or preempted wrongly."""
    problems = []
    decided = [s.job_id for s in decisions.starts] + [p.job_id for p in decisions.pending]
    if len(decided) != len(queued) or set(decided) != {j.id for j in queued}:
        problems.append(f"{len(decisions.starts)} starts + {len(decisions.pending)} pending != {len(queued)} queued "
                        f"(or some job decided twice / not at all)")
    by_id = {j.id: j for j in running + queued}
    victims = [p.job_id for p in decisions.preemptions]
    if len(victims) != len(set(victims)):
        problems.append("a job was preempted twice")
    for p in decisions.preemptions:
        victim, preemptor = by_id.get(p.job_id), by_id.get(p.for_job)
        if victim not in running or preemptor is None or not (
                victim.spec.preemptible and victim.priority < preemptor.priority
                and NOW - victim.started_at >= MIN_RUNTIME_S):
            problems.append(f"job {p.job_id} may not be preempted for job {p.for_job}")
    busy: dict[str, int] = {}
    for job in running:
        for a in job.placement.allocations:
            busy[a.node] = busy.get(a.node, 0) | sum(1 << i for i in a.gpu_indices)
    for start in decisions.starts:
        for a in start.placement.allocations:
            mask = sum(1 << i for i in a.gpu_indices)
            if busy.get(a.node, 0) & mask:
                problems.append(f"job {start.job_id} started on busy GPUs {a.gpu_indices} of {a.node}")
            busy[a.node] = busy.get(a.node, 0) | mask
    if problems:
        sys.exit("scheduler benchmark: inconsistent decisions:\n  " + "\n  ".join(problems))


def bench_pass(nodes: list[Node], running: list[Job], queued: list[Job], repeats: int) -> dict:
    jobs = running + queued
    clear_set_tables()
    start = time.perf_counter()
    first = schedule(jobs, nodes, now=NOW)
    cold_ms = ms_since(start)
    check_decisions(first, running, queued)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        again = schedule(jobs, nodes, now=NOW)
        times.append(ms_since(start))
        if again != first:
            sys.exit(f"scheduler benchmark: two passes over the same {len(queued)} jobs decided differently")
    n = len(queued)
    return {f"pass_{n}_cold_ms": cold_ms, f"pass_{n}_min_ms": min(times),
            f"pass_{n}_median_ms": statistics.median(times),
            f"pass_{n}_starts": len(first.starts), f"pass_{n}_preemptions": len(first.preemptions),
            f"pass_{n}_pending": len(first.pending)}


# -- single placements --------------------------------------------------------------------

def bench_placement(spec: str, key: str, samples: int, rng: random.Random) -> dict:
    topology = parse_sim_spec(spec).topology
    clear_set_tables()
    start = time.perf_counter()
    best_set(topology, (1 << topology.size) - 1, 1)  # builds the subset table
    build_ms = ms_since(start)
    feasible, infeasible = [], 0
    for _ in range(samples):
        # as many free GPUs as a node at any fill level has (0..16), then which ones
        free = sum(1 << i for i in rng.sample(range(topology.size), rng.randint(0, topology.size)))
        k = rng.choice((1, 2, 4, 8))
        start = time.perf_counter()
        choice = best_set(topology, free, k)
        elapsed = ms_since(start)
        if choice is None:
            infeasible += 1
        else:
            feasible.append(elapsed)
    feasible.sort()
    p99 = feasible[min(len(feasible) - 1, int(0.99 * len(feasible)))]
    return {f"placement_{key}_table_build_ms": build_ms, f"placement_{key}_p50_ms": statistics.median(feasible),
            f"placement_{key}_p99_ms": p99, f"placement_{key}_max_ms": feasible[-1],
            f"placement_{key}_feasible": len(feasible), f"placement_{key}_infeasible": infeasible}


# -- report -------------------------------------------------------------------------------

def goals() -> list[tuple[str, str, float]]:
    """(figure, shown goal, limit): each figure that has a goal, met when figure <= limit."""
    return [
        ("pass_10000_median_ms", f"<= {PASS_GOAL_MS:g} ms", PASS_GOAL_MS),
        ("pass_scaling_10k_over_1k", f"<= {LINEAR_RATIO:g} (linear)", LINEAR_RATIO),
        ("placement_dgx2_p99_ms", f"<= {PLACEMENT_P99_GOAL_MS:g} ms", PLACEMENT_P99_GOAL_MS),
        ("placement_flat16_p99_ms", f"<= {PLACEMENT_P99_GOAL_MS:g} ms", PLACEMENT_P99_GOAL_MS),
        ("placement_16gpu_p99_ms", f"<= {PLACEMENT_P99_GOAL_MS:g} ms", PLACEMENT_P99_GOAL_MS),
    ]


def print_table(fig: dict) -> None:
    targets = {name: (shown, fig[name] <= limit) for name, shown, limit in goals()}
    print_figures(f"labq scheduler benchmark (seed {fig['seed']}, Python {fig['python']})", fig, targets,
                  skip=("seed", "python", "goals_met"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--seed", type=int, default=1, help="workload seed (default 1)")
    parser.add_argument("--samples", type=int, default=5000, help="placements per 16-GPU topology")
    args = parser.parse_args(argv)

    nodes = make_nodes()
    running = make_running(nodes, random.Random(args.seed))
    queued = make_queued(10_000, len(running) + 1, random.Random(f"queued-{args.seed}"))
    fig: dict = {"seed": args.seed, "python": sys.version.split()[0],
                 "running_jobs": len(running), "busy_gpus": sum(j.spec.gpus for j in running)}
    fig |= bench_pass(nodes, running, queued[:1_000], repeats=21)
    fig |= bench_pass(nodes, running, queued, repeats=7)
    fig["pass_scaling_10k_over_1k"] = fig["pass_10000_median_ms"] / fig["pass_1000_median_ms"]
    fig |= bench_placement("sim:dgx2", "dgx2", args.samples, random.Random(f"dgx2-{args.seed}"))
    fig |= bench_placement("sim:flat:16", "flat16", args.samples, random.Random(f"flat16-{args.seed}"))
    fig["placement_16gpu_p99_ms"] = max(fig["placement_dgx2_p99_ms"], fig["placement_flat16_p99_ms"])
    fig["goals_met"] = {name: fig[name] <= limit for name, _, limit in goals()}

    if args.json:
        print(json.dumps(fig))
    else:
        print_table(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
