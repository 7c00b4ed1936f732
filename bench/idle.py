"""Benchmark: what an idle leader costs with a long queue (its scheduler thread and timers).

A leader in this process (``labq.leader.core.Leader`` on a ``MemoryStore``, so the store's cost is not in
it) with four simulated ``sim:dgx1`` nodes whose agents stay alive. The queue is filled by ``submit`` calls
(1 to 4 GPUs each) to 0, 1,000, 10,000 and 30,000 queued jobs; the first pass places what fits and those
jobs are reported running. Then the scheduler thread (``Scheduling.loop``, as the leader runs it) is left
alone for ``--seconds`` (62: one heartbeat falls in it, as in any minute): the figure is the process's CPU time over that wall time, in percent of one
core, and the scheduling passes it made. Nothing changes meanwhile, so passes come only from the heartbeat
(``Scheduling.HEARTBEAT_S``) and the edges of time (``labq.scheduler.edges``).

Goal (issue 19): an idle lab of 30,000 queued jobs uses < 0.5% of a core. The HTTP API and the store on
disk are measured by ``bench/store.py`` and ``bench/latency.py``.

    .venv/bin/python bench/idle.py [--seconds 62] [--levels 0,1000,10000,30000] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from labq.leader.auth import Principal  # noqa: E402
from labq.leader.config import LeaderConfig  # noqa: E402
from labq.leader.core import Leader  # noqa: E402
from labq.leader.state import AgentSession  # noqa: E402
from labq.models import JobState, Node  # noqa: E402
from labq.models import transitions as t  # noqa: E402
from labq.protocol.requests import parse_submit  # noqa: E402
from labq.store import MemoryStore  # noqa: E402
from labq.topologies import parse_sim_spec  # noqa: E402

GOAL_PCT = 0.5


def idle_cost(queued: int, seconds: float) -> dict:
    data = Path(tempfile.mkdtemp(prefix="labq-idle-"))
    leader = Leader(LeaderConfig(data_dir=data), MemoryStore())
    inv = parse_sim_spec("sim:dgx1")
    for i in range(4):
        name = f"n{i}"
        leader.state.agents[name] = AgentSession(name, Node(name, inv.gpus(name), inv.topology, simulated=True),
                                                 "x", None, None, last_seen=time.time())
    alice = Principal("user", "alice")
    began = time.perf_counter()
    for i in range(queued):
        leader.queue.submit(alice, parse_submit({"command": ["train"], "gpus": 1 + i % 4}))
    filled_s = time.perf_counter() - began
    leader.scheduling.schedule_pass()
    with leader.state.lock:
        placed = [j for j in leader.state.jobs.values() if j.state is JobState.STARTING]
        if placed:
            leader.state.apply([t.running(j, time.time()) for j in placed])
    stop = threading.Event()

    def agents_alive() -> None:  # their syncs change nothing; the lease must not run out
        while not stop.is_set():
            for session in leader.state.agents.values():
                session.last_seen = time.time()
            stop.wait(1.0)

    threads = [threading.Thread(target=leader.scheduling.loop, daemon=True),
               threading.Thread(target=agents_alive, daemon=True)]
    for th in threads:
        th.start()
    time.sleep(2.0)  # the first turns pass over what was just reported
    passes, cpu, wall = leader.scheduling.passes, time.process_time(), time.perf_counter()
    time.sleep(seconds)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    figures = {"queued": queued - len(placed), "running": len(placed), "fill_s": round(filled_s, 2),
               "idle_cpu_pct": round(100.0 * cpu / wall, 3), "passes": leader.scheduling.passes - passes,
               "seconds": round(wall, 1)}
    stop.set()
    leader.stop()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=62.0,
                        help="how long to watch each idle lab (62: a heartbeat pass falls in it)")
    parser.add_argument("--levels", default="0,1000,10000,30000", help="queued jobs, comma-separated")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    rows = []
    for level in (int(x) for x in args.levels.split(",")):
        print(f"filling the queue to {level:,} ...", file=sys.stderr, flush=True)
        rows.append(idle_cost(level, args.seconds))
    if args.json:
        print(json.dumps({"idle": rows, "goal_pct": GOAL_PCT}, indent=2))
        return 0
    print(f"{'queued':>8} {'running':>8} {'idle CPU':>10} {'passes':>7} {'watched':>8}   goal: < {GOAL_PCT}% of a core")
    for r in rows:
        verdict = "met" if r["idle_cpu_pct"] < GOAL_PCT else "MISSED"
        print(f"{r['queued']:>8,} {r['running']:>8} {r['idle_cpu_pct']:>9.3f}% {r['passes']:>7} {r['seconds']:>7}s"
              f"   {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
