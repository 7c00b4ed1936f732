"""Benchmark of labq's durable store (TinyDBStore): commit latency and throughput, and load time.

What it measures
  * At 0, 10,000 and 100,000 finished jobs in history (the archive is filled in commits of
    1,000 finished jobs spread over six months, so several monthly files):
    - single writer: ``--single`` sequential commits, each submitting one new queued job;
      median and p99 commit latency, commits per second;
    - 32 concurrent submitters, ``--each`` submits each, job ids taken from a shared counter
      under a lock before the commit (as the leader does); median and p99 commit latency,
      durable submits per second, and how many disk writes the group commit needed.
    After each measurement its jobs are finished (moved to history) in a few big commits,
    outside the timed part, so the hot database stays at ``--hot`` running jobs plus the
    jobs being submitted.
  * With 100,000 in history: ``TinyDBStore(folder)`` + ``load()`` (best of 3, each a fresh
    open), and ``history()`` (a figure, no goal).

Goals (from the issue): p99 single-writer commit at 100,000 history within 2x the p99 at 0;
at least 500 durable submits per second with 32 concurrent submitters; load within 1 s.
Timings are reported, never asserted. The store's content is checked at the end (every
submitted job hot or in history, history holds exactly the finished jobs, next_job_id above
every id, the commit count matches); a violation exits with status 1.

Run:  .venv/bin/python bench/store.py [--json] [--quick] [--dir PARENT] [--keep]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

try:
    import labq  # noqa: F401
except ImportError:  # running from a checkout without an installed labq
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from figures import print_figures
from labq.store import PutJob, TinyDBStore

DAY = 86400.0
HISTORY_SPAN_S = 180 * DAY  # prefilled jobs ended over six months
HISTORY_END = 1_730_000_000.0  # late October 2024: prefill spans May..October
USERS = [f"u{i:02d}" for i in range(20)]
THREADS = 32
PREFILL_BATCH = 1_000
FINISH_BATCH = 1_000
RATIO_GOAL = 2.0
SUBMITS_GOAL = 500.0
LOAD_GOAL_S = 1.0


def ms(seconds: float) -> float:
    return seconds * 1000.0


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def job_doc(job_id: int, state: str, now: float, ended_at: float | None = None) -> dict:
    """A realistic job document (~500 bytes of JSON)."""
    user = USERS[job_id % len(USERS)]
    gpus = (1, 1, 2, 4, 8)[job_id % 5]
    doc = {
        "id": job_id, "state": state, "submitted_at": now - 600.0,
        "spec": {"user": user, "command": ["python", "train.py", "--config", f"configs/run{job_id % 97}.yaml",
                                           "--seed", str(job_id % 7)],
                 "gpus": gpus, "image": "ghcr.io/lab/pytorch:2.4.1-cuda12.4", "priority": 1 + job_id % 3,
                 "time_limit_s": 14400.0, "preemptible": True,
                 "env": {"WANDB_PROJECT": f"{user}-exp", "HF_HOME": f"/scratch/{user}/hf", "OMP_NUM_THREADS": "8"}},
    }
    if state != "queued":
        node = f"n{job_id % 20:02d}"
        doc["started_at"] = now - 300.0
        doc["placement"] = [{"node": node, "gpu_indices": list(range(gpus)),
                             "gpu_uuids": [f"GPU-{node}-{i}" for i in range(gpus)]}]
    if ended_at is not None:
        doc |= {"ended_at": ended_at, "exit_code": 0}
    return doc


class Bench:
    """The store under test, and the bookkeeping the final checks need."""

    def __init__(self, folder: Path, history_max: int) -> None:
        self.folder = folder
        self.store = TinyDBStore(folder)
        self.next_id = 1
        self.id_lock = threading.Lock()
        self.submitted: set[int] = set()
        self.finished: set[int] = set()
        self.last_seq = 0
        self.history_max = history_max

    def take_id(self) -> int:
        with self.id_lock:
            job_id, self.next_id = self.next_id, self.next_id + 1
            return job_id

    def commit(self, docs: list[dict]) -> int:
        seq = self.store.commit([PutJob(d) for d in docs])
        with self.id_lock:
            self.last_seq = max(self.last_seq, seq)
        return seq

    def add_running(self, count: int) -> None:
        now = time.time()
        docs = [job_doc(self.take_id(), "running", now) for _ in range(count)]
        self.commit(docs)
        self.submitted.update(d["id"] for d in docs)

    def prefill(self, target: int) -> None:
        """Commit finished jobs, PREFILL_BATCH a commit, until history holds ``target``."""
        step = HISTORY_SPAN_S / self.history_max
        start = time.perf_counter()
        while len(self.finished) < target:
            count = min(PREFILL_BATCH, target - len(self.finished))
            docs = []
            for _ in range(count):
                ended = HISTORY_END - HISTORY_SPAN_S + step * len(self.finished) + step * len(docs)
                docs.append(job_doc(self.take_id(), "succeeded", ended - 3600.0, ended_at=ended))
            self.commit(docs)
            self.finished.update(d["id"] for d in docs)
            self.submitted.update(d["id"] for d in docs)
            if len(self.finished) % 10_000 == 0 or len(self.finished) == target:
                print(f"  history {len(self.finished):,}/{target:,} ({time.perf_counter() - start:.1f} s)",
                      file=sys.stderr)

    def finish(self, ids: list[int]) -> None:
        """Move submitted jobs to history in big commits (untimed)."""
        for i in range(0, len(ids), FINISH_BATCH):
            now = time.time()
            chunk = ids[i:i + FINISH_BATCH]
            self.commit([job_doc(j, "succeeded", now - 60.0, ended_at=now) for j in chunk])
            self.finished.update(chunk)

    def single_writer(self, count: int) -> dict:
        latencies, ids = [], []
        start = time.perf_counter()
        for _ in range(count):
            doc = job_doc(self.take_id(), "queued", time.time())
            t0 = time.perf_counter()
            self.commit([doc])
            latencies.append(time.perf_counter() - t0)
            ids.append(doc["id"])
        wall = time.perf_counter() - start
        self.submitted.update(ids)
        self.finish(ids)
        return {"single_median_ms": ms(statistics.median(latencies)), "single_p99_ms": ms(p99(latencies)),
                "single_commits_per_s": count / wall}

    def concurrent(self, each: int) -> dict:
        latencies: list[float] = []
        ids: list[int] = []
        seqs: set[int] = set()
        errors: list[BaseException] = []
        gate = threading.Barrier(THREADS + 1)

        def submitter() -> None:
            mine, my_ids, my_seqs = [], [], set()
            gate.wait()
            try:
                for _ in range(each):
                    doc = job_doc(self.take_id(), "queued", time.time())
                    t0 = time.perf_counter()
                    my_seqs.add(self.commit([doc]))
                    mine.append(time.perf_counter() - t0)
                    my_ids.append(doc["id"])
            except BaseException as err:  # reported as an inconsistency below
                errors.append(err)
            with self.id_lock:
                latencies.extend(mine)
                ids.extend(my_ids)
                seqs.update(my_seqs)

        threads = [threading.Thread(target=submitter) for _ in range(THREADS)]
        for t in threads:
            t.start()
        gate.wait()
        start = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        if errors:
            sys.exit(f"store benchmark: a concurrent submit failed: {errors[0]!r}")
        self.submitted.update(ids)
        self.finish(sorted(ids))
        return {"concurrent_median_ms": ms(statistics.median(latencies)), "concurrent_p99_ms": ms(p99(latencies)),
                "concurrent_submits_per_s": len(ids) / wall, "concurrent_disk_writes": len(seqs)}

    def check(self) -> None:
        """Exit 1 if the store lost a job, archived one wrongly, or miscounts ids or commits."""
        state = self.store.load()
        history = self.store.history()
        history_ids = [d["id"] for d in history]
        problems = []
        if len(history_ids) != len(set(history_ids)):
            problems.append("history holds a job twice")
        if set(history_ids) != self.finished:
            problems.append(f"history holds {len(set(history_ids)):,} jobs, {len(self.finished):,} were finished")
        if set(state.jobs) & set(history_ids):
            problems.append("a job is both hot and in history")
        missing = self.submitted - set(state.jobs) - set(history_ids)
        if missing:
            problems.append(f"{len(missing):,} submitted jobs are neither hot nor in history, e.g. {min(missing)}")
        if set(state.jobs) != self.submitted - self.finished:
            problems.append(f"{len(state.jobs):,} hot jobs, expected {len(self.submitted - self.finished):,}")
        if state.next_job_id <= max(self.submitted):
            problems.append(f"next_job_id {state.next_job_id} is not above the largest id {max(self.submitted)}")
        if state.seq != self.last_seq:
            problems.append(f"the store counts {state.seq} commits, the last acknowledged was {self.last_seq}")
        if self.store.archive.problems:
            problems.append(f"damaged archive lines: {self.store.archive.problems[:3]}")
        if problems:
            sys.exit("store benchmark: inconsistent store:\n  " + "\n  ".join(problems))


def measure_load(bench: Bench, repeats: int = 3) -> dict:
    bench.store.close()
    loads = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        store = TinyDBStore(bench.folder)
        store.load()
        loads.append(time.perf_counter() - t0)
        store.close()
    bench.store = TinyDBStore(bench.folder)
    t0 = time.perf_counter()
    count = len(bench.store.history())
    return {"load_s": min(loads), "load_history_jobs": len(bench.finished),
            "history_read_s": time.perf_counter() - t0, "history_read_jobs": count,
            "archive_files": len(bench.store.archive.files()),
            "hot_db_bytes": bench.store.path.stat().st_size}


def goals(levels: list[int]) -> list[tuple[str, str, float, bool]]:
    """(figure, shown goal, limit, higher is better) for each figure that has a goal."""
    top = f"h{levels[-1]}"
    return [(f"{top}_single_p99_over_h0", f"<= {RATIO_GOAL:g}x", RATIO_GOAL, False),
            *[(f"h{n}_concurrent_submits_per_s", f">= {SUBMITS_GOAL:g}/s", SUBMITS_GOAL, True) for n in levels],
            ("load_s", f"<= {LOAD_GOAL_S:g} s", LOAD_GOAL_S, False)]


def met(value: float, limit: float, higher: bool) -> bool:
    return value >= limit if higher else value <= limit


def print_table(fig: dict, levels: list[int]) -> None:
    targets = {name: (shown, met(fig[name], limit, higher)) for name, shown, limit, higher in goals(levels)}
    print_figures(f"labq store benchmark (Python {fig['python']}, {fig['hot_running']} running jobs hot, "
                  f"{fig['single_submits']} single / {THREADS}x{fig['concurrent_each']} concurrent submits a level)",
                  fig, targets, skip=("python", "goals_met", "hot_running", "single_submits", "concurrent_each"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--quick", action="store_true", help="history 0/1,000/5,000 and fewer submits (smoke run)")
    parser.add_argument("--dir", help="make the data folder inside this folder (default: the system temp folder)")
    parser.add_argument("--keep", action="store_true", help="leave the data folder in place")
    parser.add_argument("--hot", type=int, default=200, help="running jobs kept in the hot database (default 200)")
    args = parser.parse_args(argv)
    levels = [0, 1_000, 5_000] if args.quick else [0, 10_000, 100_000]
    single, each = (100, 10) if args.quick else (500, 50)

    folder = Path(tempfile.mkdtemp(prefix="labq-bench-store-", dir=args.dir))
    print(f"store benchmark in {folder}", file=sys.stderr)
    fig: dict = {"python": sys.version.split()[0], "hot_running": args.hot, "single_submits": single,
                 "concurrent_each": each}
    try:
        bench = Bench(folder, levels[-1])
        bench.add_running(args.hot)
        for level in levels:
            print(f"history {level:,}: filling", file=sys.stderr)
            bench.prefill(level)
            print(f"history {level:,}: {single} single-writer submits, then {THREADS}x{each} concurrent",
                  file=sys.stderr)
            fig[f"h{level}_single_history_jobs"] = len(bench.finished)
            fig |= {f"h{level}_{k}": v for k, v in bench.single_writer(single).items()}
            fig[f"h{level}_concurrent_history_jobs"] = len(bench.finished)
            fig |= {f"h{level}_{k}": v for k, v in bench.concurrent(each).items()}
        top = f"h{levels[-1]}"
        fig[f"{top}_single_p99_over_h0"] = fig[f"{top}_single_p99_ms"] / fig["h0_single_p99_ms"]
        fig[f"{top}_concurrent_p99_over_h0"] = fig[f"{top}_concurrent_p99_ms"] / fig["h0_concurrent_p99_ms"]
        print(f"load and history with {len(bench.finished):,} in history", file=sys.stderr)
        fig |= measure_load(bench)
        bench.check()
        bench.store.close()
    finally:
        if args.keep:
            print(f"data folder kept: {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    fig["goals_met"] = {name: met(fig[name], limit, higher) for name, _, limit, higher in goals(levels)}

    if args.json:
        print(json.dumps(fig))
    else:
        print_table(fig, levels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
