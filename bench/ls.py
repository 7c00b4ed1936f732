"""Benchmark of ``labq ls`` with a long queue: the command's wall time at 0, 1,000, 10,000 and 30,000 queued jobs.

What it measures: a real leader (``labq.leader.core.Leader`` behind its HTTP server on loopback, in this
process, on a ``MemoryStore``: listing jobs reads no store) with one simulated workstation (``sim:ws-4x3090``)
whose 4 GPUs a running 4-GPU job holds, so that every job submitted after it waits (REASON: Resources). The
queue is filled by ``Queue.submit`` calls, as the admin who runs ``labq ls`` (so its default view matches every
job), to each level in turn, with a scheduling pass after each fill so each waiting job has its pending reason.
At each level these run as commands, taking turns, 2 warm-ups then ``--runs`` (10) each:
``labq ls`` (the default view: the caller's unfinished jobs, one page of 100), ``labq ls --limit 0`` (every one
of them, unpaged: what ``labq ls`` printed before the listing was paged) and ``python -c pass`` (the
interpreter alone), each with its median, p90 and least (the least is the steadiest figure on a busy
machine). Beside them, from this process over HTTP, the API call the default view makes (``GET
/v1/jobs?after=0&limit=100&pending=1``) and the whole listing (``GET /v1/jobs?pending=1``).

Goal (issue: costs that grow with the lab): ``labq ls`` under 100 ms at 30,000 queued jobs. Timings are
printed, never asserted. Progress goes to stderr.

Run:  .venv/bin/python bench/ls.py [--levels 0,1000,10000,30000] [--runs 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
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

from labq.client import Client
from labq.leader.auth import Principal
from labq.leader.config import LeaderConfig
from labq.leader.core import Leader
from labq.leader.http import serve
from labq.leader.state import AgentSession
from labq.models import JobState, Node
from labq.models import transitions as t
from labq.protocol.requests import parse_submit
from labq.store import MemoryStore
from labq.topologies import parse_sim_spec

NEXT_TO_PYTHON = Path(sys.executable).with_name("labq")
LABQ = NEXT_TO_PYTHON if NEXT_TO_PYTHON.exists() else Path(__file__).resolve().parent.parent / ".venv/bin/labq"
WARMUPS, GOAL_MS, GOAL_AT = 2, 100.0, 30_000


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def p90(values: list[float]) -> float:
    return sorted(values)[int(0.9 * (len(values) - 1))]


class Lab:
    """The leader, serving on loopback, its one workstation full, and the admin's client."""

    def __init__(self, folder: Path) -> None:
        self.leader = leader = Leader(LeaderConfig(host="127.0.0.1", port=0, data_dir=folder), MemoryStore())
        name, token = leader.ensure_admin("root")
        self.admin = Principal("user", name, admin=True)
        inv = parse_sim_spec("sim:ws-4x3090")
        leader.state.agents["ws1"] = AgentSession("ws1", Node("ws1", inv.gpus("ws1"), inv.topology, simulated=True),
                                                  "x", None, None, last_seen=time.time())
        self.submit(1, gpus=4)  # the blocker: every job after it waits
        self.server = serve(leader, "127.0.0.1", 0)
        self.thread = threading.Thread(target=self.server.serve_forever, name="labq-http-bench", daemon=True)
        self.thread.start()
        self.client = Client(f"http://127.0.0.1:{self.server.server_address[1]}", token)
        self.queued = 0

    def submit(self, count: int, gpus: int = 1) -> None:
        for i in range(count):
            self.leader.queue.submit(self.admin, parse_submit({"command": ["train"], "gpus": gpus,
                                                               "name": f"job-{i}"}))
        self.leader.state.agents["ws1"].last_seen = time.time()
        self.leader.scheduling.schedule_pass()
        with self.leader.state.lock:  # what was placed runs
            placed = [j for j in self.leader.state.jobs.values() if j.state is JobState.STARTING]
            if placed:
                self.leader.state.apply([t.running(j, time.time()) for j in placed])

    def fill(self, level: int) -> None:
        self.submit(level - self.queued)
        self.queued = level

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.leader.stop()


def measure_level(lab: Lab, env: dict, runs: int) -> dict:
    commands = {"python_pass": [sys.executable, "-c", "pass"], "labq_ls": [str(LABQ), "ls"],
                "labq_ls_limit_0": [str(LABQ), "ls", "--limit", "0"]}
    times: dict[str, list[float]] = {key: [] for key in commands}
    lines = 0
    for turn in range(WARMUPS + runs):
        for key, argv in commands.items():
            start = time.perf_counter()
            out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
            elapsed = time.perf_counter() - start
            if out.returncode != 0:
                raise SystemExit(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip()}")
            if key == "labq_ls":
                lines = len(out.stdout.splitlines())
            if turn >= WARMUPS:
                times[key].append(elapsed)
    calls = {"api_page": lambda: lab.client.page(after=0, limit=100, pending=True),
             "api_whole": lambda: lab.client.page(pending=True)}
    for key, call in calls.items():
        for _ in range(runs):
            start = time.perf_counter()
            call()
            times.setdefault(key, []).append(time.perf_counter() - start)
    fig: dict = {"unfinished_jobs": lab.client.page(after=0, limit=1).total, "labq_ls_lines": lines}
    for key, values in times.items():
        fig |= {f"{key}_median_ms": ms(statistics.median(values)), f"{key}_p90_ms": ms(p90(values)),
                f"{key}_min_ms": ms(min(values))}
    return fig


def measure(levels: list[int], runs: int, root: Path) -> dict[int, dict]:
    lab = Lab(root / "data")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABQ_")}
    env.update(HOME=str(root / "home"), XDG_CONFIG_HOME=str(root / "home" / ".config"),
               LABQ_LEADER=lab.client.url, LABQ_TOKEN=lab.client.token)
    figures = {}
    try:
        for level in levels:
            print(f"filling the queue to {level:,} ...", file=sys.stderr, flush=True)
            began = time.perf_counter()
            lab.fill(level)
            print(f"  ({time.perf_counter() - began:.0f} s); timing labq ls", file=sys.stderr, flush=True)
            figures[level] = measure_level(lab, env, runs)
    finally:
        lab.close()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="0,1000,10000,30000", help="queued jobs, comma-separated, rising")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (the audit log)")
    args = parser.parse_args()
    levels = sorted(int(x) for x in args.levels.split(","))
    root = Path(tempfile.mkdtemp(prefix="labq-bench-ls-"))
    try:
        figures = measure(levels, args.runs, root)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps({"levels": {str(k): v for k, v in figures.items()}, "goal_ms": GOAL_MS}, indent=2))
        return 0
    for level, fig in figures.items():
        goal = fig["labq_ls_median_ms"] < GOAL_MS
        targets = {"labq_ls_median_ms": (f"< {GOAL_MS:g} ms", goal)} if level >= GOAL_AT else {}
        print_figures(f"labq ls, {level:,} queued jobs (the caller's)", fig, targets, digits=1)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
