"""Benchmark of ``labq usage``: the leader's report over one and five years of a 10-node lab's history.

What it measures
  A lab of 10 nodes (4 ``sim:dgx1`` and 6 ``sim:ws-4x3090``: 56 GPUs) with ``--jobs-per-day`` (100) jobs a
  day over one year and over five, generated with a fixed seed and lived through ``labq.models.transitions``
  as the leader records them: 15 users, classes low/normal/high/urgent, 1-8 GPUs, waits of minutes to hours,
  runs of minutes to a day; 15% of the jobs preempted once and 5% once more (checkpointed or not), 8% failed,
  5% cancelled (half of them before they ran), 2% stopped at their time limit. The finished jobs are committed
  to a real TinyDB store (``TinyDBStore``, 1,000 a commit), so the archive holds one file a month; the jobs
  still running at the end stay in the hot database. Then the leader's own call, ``Leader.accounting.usage``
  for an admin asking for the whole lab, and ``encode_usage`` (what ``GET /v1/usage`` answers; the HTTP around
  it is not timed), over the whole history: the last 365 days of the one-year lab, the last 5 x 365 days of the
  five-year lab. The first report after the leader starts reads the archive (``labq.leader.accounting``); the
  later ones (best of ``--repeats``, 3) read the months the leader does not keep (it keeps those a report of the
  default 30-day window spans) from the digests the first one wrote. Then a leader started again on the same
  folder: its first report reads each closed month from the digest the first leader wrote
  (``labq.leader.digests``) and the newest month from the archive (``first_report_again``, checked to give the
  same figures). The five-year lab's first report is split into its parts (reading the archive, reducing the
  documents to ``JobUse``, the tally), and a report of its last month and of one user's five years are timed
  too, with the memory the leader keeps for its finished jobs (``y5_cached_mib``: the kept months').

Then the ``/metrics`` scrape of a lab of 10 nodes x 8 GPUs and 10,000 jobs (``bench/metrics.py``'s ``measure``).

Goals (from the issue): the one-year report within 1 s, the five-year one within 3 s; shown against the very
first report (no digest yet), the first of a leader started again, and the later ones (a leader reads the archive
in the background as it starts, so the first report a person asks for is most often a later one); a scrape
within 50 ms. Timings are reported, never asserted. labq's own workload generator (``labq.sim.workload.generate``)
has a 56-GPU lab at 0.7 load submit about 124 jobs a day: 100 is of that order.

Run:  .venv/bin/python bench/usage.py [--jobs-per-day N] [--repeats N] [--quick] [--json] [--dir PARENT] [--keep]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

try:
    import labq  # noqa: F401
except ImportError:  # running from a checkout without an installed labq
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from figures import print_figures
from labq.store import collector_paused
from labq.leader.auth import Principal
from labq.leader.config import LeaderConfig
from labq.leader.core import Leader
from labq.leader.state import AgentSession
from labq.models import transitions as t
from labq.models.job import Job, JobSpec
from labq.models.node import Node
from labq.models.placement import NodeAllocation, Placement
from labq.models.priority import PriorityClass
from labq.models.usage import node_gpu_models, report
from labq.protocol.codec import encode_job
from labq.protocol.usage import UsageQuery, decode_use, encode_usage
from labq.store import PutJob, TinyDBStore
from labq.topologies import parse_sim_spec

H, DAY, YEAR = 3600.0, 86400.0, 365 * 86400.0
END = 1_793_491_200.0  # 2026-11-01 00:00 UTC: "now" for the lab
USERS = [f"u{i:02d}" for i in range(15)]
CLASSES = [int(PriorityClass.LOW)] * 3 + [int(PriorityClass.NORMAL)] * 5 + [int(PriorityClass.HIGH),
                                                                              int(PriorityClass.URGENT)]
BATCH = 1_000
GOALS_S = {1: 1.0, 5: 3.0}
ADMIN = Principal("user", "root", admin=True)


def lab_nodes() -> list[Node]:
    specs = [*((f"dgx{i}", "sim:dgx1") for i in range(4)), *((f"ws{i}", "sim:ws-4x3090") for i in range(6))]
    return [Node(name, (inv := parse_sim_spec(spec)).gpus(name), inv.topology, simulated=True)
            for name, spec in specs]


def _placement(rng: random.Random, nodes: list[Node], gpus: int) -> Placement:
    node = rng.choice([n for n in nodes if n.gpu_count >= gpus])
    indices = tuple(sorted(rng.sample(range(node.gpu_count), gpus)))
    return Placement((NodeAllocation(node.name, indices, tuple(node.gpus[i].uuid for i in indices)),))


def _job(job_id: int, rng: random.Random, nodes: list[Node], submitted: float) -> Job:
    """One job's life, as the leader would have recorded it, up to ``END`` (finished, running or queued)."""
    gpus = rng.choice((1, 1, 1, 1, 2, 2, 4, 8))
    spec = JobSpec(user=rng.choice(USERS), command=("python", "train.py", "--config", f"configs/run{job_id % 97}.yaml",
                                                    "--seed", str(job_id % 7)),
                   gpus=gpus, name=f"run-{job_id}", priority=rng.choice(CLASSES), time_limit_s=2 * DAY,
                   env=(("WANDB_PROJECT", "exp"), ("OMP_NUM_THREADS", "8")))
    job, now = Job(job_id, spec, submitted_at=submitted), submitted
    roll = rng.random()
    if roll < 0.025:  # cancelled before it ran
        return t.cancelled(job, min(END, now + rng.uniform(60, 6 * H)))
    for _ in range((rng.random() < 0.15) + (rng.random() < 0.05)):  # preempted, then requeued
        now += rng.expovariate(1 / (30 * 60))
        job = t.running(t.placed(job, _placement(rng, nodes, gpus)), now)
        now += rng.uniform(10 * 60, 6 * H)
        if now >= END:
            return job
        saved = rng.random() < 0.7
        job = t.exited(t.preempting(job, for_job=None), 0 if saved else 137, now, escalated=not saved,
                       checkpoint_at=now - rng.uniform(0, 30 * 60) if saved else None)
    now += rng.expovariate(1 / (30 * 60))
    if now >= END:
        return job
    job = t.running(t.placed(job, _placement(rng, nodes, gpus)), now)
    now += min(2 * DAY, rng.lognormvariate(8.5, 1.2))  # a median of about 80 min, a long tail to the limit
    if now >= END:
        return job
    if roll < 0.05:
        return t.exited(job.evolve(stop_requested="cancel"), 143, now)
    if roll < 0.07:
        return t.exited(job.evolve(stop_requested="timeout"), 143, now)
    return t.exited(job, 1 if roll < 0.15 else 0, now)


def fill(folder: Path, years: int, jobs_per_day: float, seed: int) -> dict:
    """A data folder holding ``years`` of history ending at ``END``; what it holds."""
    rng, nodes = random.Random(seed), lab_nodes()
    count = int(years * 365 * jobs_per_day)
    start, step = END - years * YEAR, years * YEAR / count
    finished = live = 0
    began = time.perf_counter()
    with TinyDBStore(folder) as store:
        batch: list[PutJob] = []
        hot: list[PutJob] = []
        for i in range(count):
            job = _job(i + 1, rng, nodes, start + (i + rng.random()) * step)
            if job.state.finished:
                batch.append(PutJob(encode_job(job)))
                finished += 1
            else:
                hot.append(PutJob(encode_job(job)))
                live += 1
            if len(batch) == BATCH:
                store.commit(batch)
                batch = []
        if batch:
            store.commit(batch)
        if hot:
            store.commit(hot)
        files = len(store.archive.files())
    print(f"  {years} year(s): {finished:,} finished jobs and {live} unfinished in "
          f"{time.perf_counter() - began:.0f} s", file=sys.stderr)
    return {"finished": finished, "unfinished": live, "archive_files": files,
            "archive_mib": sum(p.stat().st_size for p in (folder / "archive").iterdir()) / 2**20}


def open_leader(folder: Path) -> Leader:
    store = TinyDBStore(folder)
    leader = Leader(LeaderConfig(data_dir=folder), store, clock=lambda: END)
    for node in lab_nodes():
        leader.state.agents[node.name] = AgentSession(node.name, node, "x", None, None, last_seen=END)
    return leader


def best(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - began)
    return min(times), result


def measure(folder: Path, years: int, repeats: int) -> dict:
    leader = open_leader(folder)
    try:
        query = UsageQuery(END - years * YEAR, None, None)
        ask = lambda: encode_usage(leader.accounting.usage(ADMIN, query))  # noqa: E731
        first, _ = best(ask, 1)  # reads the archive
        later, doc = best(ask, repeats)
        fig = {f"y{years}_first_report_s": first, f"y{years}_report_s": later,
               f"y{years}_gpu_hours": round(doc["total"]["gpu_hours"]), f"y{years}_jobs_run": doc["total"]["jobs"],
               f"y{years}_utilisation": round(doc["total"]["share"], 3)}
        if years == 5:
            state = leader.state
            with collector_paused():  # as the leader reads it
                read, docs = best(state.store.history, 1)
                decoding, uses = best(lambda: [decode_use(d, END) for d in docs], 1)
            gpus = node_gpu_models(state.nodes())
            tally, _ = best(lambda: report(uses, query.since, END, gpus, END), repeats)
            month = UsageQuery(END - 30 * DAY, None, None)
            last_month, _ = best(lambda: leader.accounting.usage(ADMIN, month), repeats)
            alice = UsageQuery(query.since, None, USERS[0])
            one_user, _ = best(lambda: leader.accounting.usage(Principal("user", USERS[0]), alice), repeats)
            fig |= {"y5_read_archive_s": read, "y5_decode_s": decoding, "y5_tally_s": tally,
                    "y5_last_month_s": last_month, "y5_one_user_s": one_user,
                    "y5_cached_mib": _size({i: use for uses in leader.accounting._kept.values()
                                            for i, use in uses.items()}) / 2**20}
    finally:
        leader.stop()
        leader.state.store.close()
    again = open_leader(folder)  # a leader started again: the closed months from the digests the first one wrote
    try:
        first_again, doc_again = best(lambda: encode_usage(again.accounting.usage(ADMIN, query)), 1)
        if doc_again != doc:
            raise AssertionError(f"a leader started again reports other figures over {years} year(s)")
        digests = again.accounting.digests
        fig |= {f"y{years}_first_report_again_s": first_again, f"y{years}_months_read_again": digests.read_again,
                f"y{years}_digests_mib": sum(p.stat().st_size for p in digests.folder.iterdir()) / 2**20}
    finally:
        again.stop()
        again.state.store.close()
    return fig


def _size(finished: dict) -> int:
    """The bytes of the leader's finished jobs as a report keeps them (floats, tuples, the dict; names shared)."""
    seen: set[int] = set()

    def size(obj) -> int:
        if id(obj) in seen:
            return 0
        seen.add(id(obj))
        own = sys.getsizeof(obj)
        if isinstance(obj, tuple):
            return own + sum(size(x) for x in obj)
        return own

    return sys.getsizeof(finished) + sum(size(k) + size(v) for k, v in finished.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs-per-day", type=float, default=100.0, help="jobs submitted a day (default 100)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each report; the best counts")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="10 jobs a day, one run each (smoke run)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--dir", help="make the data folders inside this folder (default: the system temp folder)")
    parser.add_argument("--keep", action="store_true", help="leave the data folders in place")
    args = parser.parse_args(argv)
    per_day, repeats = (10.0, 1) if args.quick else (args.jobs_per_day, args.repeats)
    parent = Path(tempfile.mkdtemp(prefix="labq-bench-usage-", dir=args.dir))
    fig: dict = {"python": sys.version.split()[0], "jobs_per_day": per_day}
    try:
        for years in (1, 5):
            print(f"filling {years} year(s) of history", file=sys.stderr)
            held = fill(parent / f"y{years}", years, per_day, args.seed)
            fig |= {f"y{years}_{k}": v for k, v in held.items()}
            fig |= measure(parent / f"y{years}", years, repeats)
    finally:
        if args.keep:
            print(f"data folders kept: {parent}", file=sys.stderr)
        else:
            shutil.rmtree(parent, ignore_errors=True)
    print("the /metrics scrape of 10 nodes x 8 GPUs and 10,000 jobs (bench/metrics.py)", file=sys.stderr)
    from metrics import GOAL_MS, measure as measure_scrape

    scraped, problems = measure_scrape(1_000 if args.quick else 10_000, 10)
    fig |= {f"metrics_{k}": v for k, v in scraped.items() if k.startswith("scrape_")}
    targets = {f"y{y}_{kind}": (f"<= {goal:g} s", fig[f"y{y}_{kind}"] <= goal)
               for y, goal in GOALS_S.items() for kind in ("first_report_s", "first_report_again_s", "report_s")}
    targets["metrics_scrape_median_ms"] = (f"< {GOAL_MS:g} ms", fig["metrics_scrape_median_ms"] < GOAL_MS)
    fig["goals_met"] = {name: met for name, (_, met) in targets.items()}
    if args.json:
        print(json.dumps(fig))
    else:
        print_figures(f"labq usage benchmark (Python {fig['python']}, 10 nodes / 56 GPUs, {per_day:g} jobs a day, "
                      f"best of {repeats})", fig, targets, skip=("python", "goals_met", "jobs_per_day"))
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
