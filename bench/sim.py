"""Benchmark of ``labq sim``: the Philly trace's October-November 2017 through every policy.

What it measures
  Each virtual cluster (VC) of the Philly trace listed with a size in the traces README is
  simulated as its own cluster of that many ``sim:dgx1`` nodes (8 GPUs each), with only its own
  jobs submitted from 2017-10-01 to 2017-12-01 UTC (about 68,500 jobs); jobs of VCs with no
  listed size are counted and left out. For each policy (labq, fifo, sjf) it prints the wall time
  of the whole window (the sum over the VCs, run one after another in this process: the time a
  user of ``labq sim`` waits) and the report: jobs, queueing delay and JCT (mean, p50, p95,
  p99), makespan, utilization, preemptions, overall and per virtual cluster. Philly has one
  class and no user names, so the labq policy differs from the others by its placement and
  its backfill (jobs without time limits do not backfill past a blocked job), not by
  preemption. The overall utilization is busy GPU-seconds over the sum of each VC's GPUs times
  its own makespan.

Goal (from the issue): the whole window within 60 s per policy on this machine. Timings are
reported, never asserted. Consistency is checked (every job of the window is finished or
skipped with a reason; no VC has a job left unfinished): a violation is printed after the
figures and exits with status 1. Progress goes to stderr.

Run:  .venv/bin/python bench/sim.py [--json] [--policy labq,fifo,sjf] [--vc NAME] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from figures import profile_lines  # noqa: E402
from labq.sim.cluster import parse_cluster, vc_cluster  # noqa: E402
from labq.sim.engine import SimOptions, simulate  # noqa: E402
from labq.sim.model import SimResult, Workload  # noqa: E402
from labq.sim.report import make_report, report_json  # noqa: E402
from labq.sim.traces import PHILLY_VC_NODES, load_trace, parse_when  # noqa: E402

TRACE = ROOT.parent / "shared" / "data" / "traces" / "philly.csv"
START, END = "2017-10-01", "2017-12-01"
GOAL_S = 60.0


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def split_by_vc(workload: Workload) -> dict[str, Workload]:
    jobs: dict[str, list] = {}
    for job in workload.jobs:
        jobs.setdefault(job.vc, []).append(job)
    return {vc: Workload(tuple(js), (), workload.epoch, f"{workload.source} vc {vc}") for vc, js in jobs.items()}


def merged(results: list[SimResult], policy: str) -> SimResult:
    """One result for the whole trace: outcomes together; GPUs and busy time summed (no samples)."""
    return SimResult(policy, "per-VC clusters", sum(r.gpus for r in results),
                     tuple(o for r in results for o in r.outcomes), tuple(s for r in results for s in r.skipped),
                     (), sum(r.busy_gpu_s for r in results), sum(r.wall_s for r in results),
                     sum(r.passes for r in results), results[0].epoch if results else 0.0)


def utilization(results: list[SimResult]) -> float:
    capacity = 0.0
    for r in results:
        starts = [o.job.submit for o in r.outcomes]
        ends = [o.end for o in r.outcomes if o.end is not None]
        if starts and ends:
            capacity += r.gpus * (max(ends) - min(starts))
    return sum(r.busy_gpu_s for r in results) / capacity if capacity else 0.0


def run_policy(policy: str, vcs: dict[str, Workload], problems: list[str], profile: bool) -> dict:
    results, per_vc = [], {}
    prof = cProfile.Profile() if profile else None
    began = time.perf_counter()
    for vc, workload in sorted(vcs.items(), key=lambda kv: -len(kv[1].jobs)):
        nodes = parse_cluster(vc_cluster(PHILLY_VC_NODES[vc]))
        if prof:
            prof.enable()
        result = simulate(workload, nodes, policy, cluster=vc_cluster(PHILLY_VC_NODES[vc]), options=SimOptions(),
                          meta={"vc": vc})
        if prof:
            prof.disable()
        results.append(result)
        unfinished = sum(o.end is None for o in result.outcomes)
        if unfinished:
            problems.append(f"{policy} vc {vc}: {unfinished} jobs never finished")
        if len(result.outcomes) + len(result.skipped) != len(workload.jobs):
            problems.append(f"{policy} vc {vc}: {len(workload.jobs)} jobs in, "
                            f"{len(result.outcomes)} simulated + {len(result.skipped)} skipped out")
        per_vc[vc] = report_json(make_report(result))
        say(f"  {policy} vc {vc}: {len(workload.jobs):,} jobs on {result.gpus} GPUs in {result.wall_s:.1f} s "
            f"({result.passes:,} passes)")
    wall = time.perf_counter() - began
    overall = report_json(make_report(merged(results, policy)))
    overall["utilization"] = round(utilization(results), 4)
    out = {"wall_s": round(wall, 2), "goal_s": GOAL_S, "met": wall <= GOAL_S, "overall": overall, "per_vc": per_vc}
    if prof:
        for line in profile_lines(pstats.Stats(prof).stats, f"the {policy} runs", own=15, folders=2,
                                  ours=r"/labq/(sim|scheduler)/"):
            say(line)
    return out


def row(name: str, r: dict) -> str:
    d, c = r["queueing_delay"], r["jct"]
    return (f"{name:<10} {r['jobs']:>7,} {r['finished']:>7,} {d['mean'] / 3600:>8.2f} {d['p50'] / 3600:>7.2f} "
            f"{d['p95'] / 3600:>7.2f} {d['p99'] / 3600:>8.2f} {c['mean'] / 3600:>8.2f} {c['p50'] / 3600:>7.2f} "
            f"{c['p95'] / 3600:>7.2f} {c['p99'] / 3600:>8.2f} {r['makespan_s'] / 86400:>7.1f} "
            f"{100 * r['utilization']:>5.1f}% {r['preemptions']:>6}")


HEADER = (f"{'':<10} {'jobs':>7} {'done':>7} {'delay h':>8} {'p50':>7} {'p95':>7} {'p99':>8} {'JCT h':>8} "
          f"{'p50':>7} {'p95':>7} {'p99':>8} {'span d':>7} {'util':>6} {'preem':>6}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print everything as one JSON object")
    parser.add_argument("--policy", default="labq,fifo,sjf", help="policies, comma-separated")
    parser.add_argument("--vc", help="only this virtual cluster")
    parser.add_argument("--profile", action="store_true", help="profile each policy's run (slower)")
    args = parser.parse_args()
    problems: list[str] = []
    t0 = time.perf_counter()
    workload, notes = load_trace(TRACE, "philly", start=parse_when(START), end=parse_when(END))
    load_s = time.perf_counter() - t0
    vcs = split_by_vc(workload)
    unlisted = {vc: len(w.jobs) for vc, w in vcs.items() if vc not in PHILLY_VC_NODES}
    vcs = {vc: w for vc, w in vcs.items() if vc in PHILLY_VC_NODES and (args.vc is None or vc == args.vc)}
    say(f"Philly {START} to {END}: {len(workload.jobs):,} jobs loaded in {load_s:.1f} s; "
        f"{sum(len(w.jobs) for w in vcs.values()):,} in {len(vcs)} VCs simulated; left out (no listed size): "
        f"{unlisted or 'none'}")
    out: dict = {"trace": TRACE.name, "window": [START, END], "jobs": len(workload.jobs), "load_s": round(load_s, 2),
                 "left_out": unlisted, "notes": notes, "policies": {}}
    for policy in [p.strip() for p in args.policy.split(",") if p.strip()]:
        say(f"{policy}:")
        out["policies"][policy] = run_policy(policy, vcs, problems, args.profile)
    out["problems"] = problems
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"labq sim benchmark: Philly {START} to {END}, each VC its own cluster of sim:dgx1 nodes")
        print(f"{'policy':<10} {'wall s':>8} {'goal':>6}  verdict")
        for policy, r in out["policies"].items():
            print(f"{policy:<10} {r['wall_s']:>8.1f} {GOAL_S:>6.0f}  {'met' if r['met'] else 'MISSED'}")
        for policy, r in out["policies"].items():
            print(f"\n{policy}: overall and per virtual cluster (hours; makespan in days)")
            print(HEADER)
            print(row("all", r["overall"]))
            for vc, rep in sorted(r["per_vc"].items(), key=lambda kv: -kv[1]["jobs"]):
                print(row(vc, rep))
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
