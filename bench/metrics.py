"""Benchmark of ``GET /metrics``: a scrape of a lab of 10 nodes of 8 GPUs and 10,000 jobs.

What it measures: a real leader (``labq.leader``, its HTTP server on loopback in this process, a TinyDB store in a
temp folder) with 10 ``sim:dgx1`` nodes registered through the API, each reporting every GPU's utilisation and
memory in a sync; 10,000 jobs submitted (through the queue service: the submits are not what is timed), and one
scheduling pass, so that the nodes are full and the rest waits. Then ``GET /metrics`` over HTTP with the scrape
token, 5 warm-ups and 30 timed (a new connection each, as Prometheus's scrapes of a leader come seconds apart):
median, p90 and the largest; and the size of the answer. Checked: the scrape names every node and GPU, and counts
every job.

Goal (issue: know the lab): a scrape under 50 ms. Timings are printed, never asserted.

Run:  .venv/bin/python bench/metrics.py [--jobs 10000] [--nodes 10] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from figures import print_figures  # noqa: E402

from labq.leader.auth import Principal  # noqa: E402
from labq.protocol.requests import parse_submit  # noqa: E402
from labq.topologies import parse_sim_spec  # noqa: E402
from tests.leader.loopback_leader import start_loopback_leader  # noqa: E402

GOAL_MS = 50.0
TOKEN = "bench-scrape-token-" + "0" * 16


def node_doc(name: str) -> dict:
    sim = parse_sim_spec("sim:dgx1")
    gpus = sim.gpus(name)
    return {"name": name, "gpus": [{"index": g.index, "uuid": g.uuid, "model": g.model, "memory_mib": g.memory_mib}
                                   for g in gpus],
            "topology": {"pcie": [list(r) for r in sim.topology.pcie], "nvlinks": [list(r) for r in sim.topology.nvlinks],
                         "nvswitch_links": [], "numa": []},
            "unmanaged_busy": [], "simulated": True, "labels": []}


def scrape(port: int) -> tuple[float, bytes]:
    began = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        answer = conn.getresponse()
        body = answer.read()
        if answer.status != 200:
            sys.exit(f"metrics benchmark: /metrics answered {answer.status}: {body[:200]!r}")
    finally:
        conn.close()
    return (time.perf_counter() - began) * 1000.0, body


def measure(jobs: int = 10_000, nodes: int = 10) -> tuple[dict, list[str]]:
    """The scrape figures of a lab of ``nodes`` x 8 GPUs and ``jobs`` jobs, and the problems the checks found."""
    with tempfile.TemporaryDirectory(prefix="labq-bench-metrics-") as folder:
        lb = start_loopback_leader(Path(folder), metrics_scrape_token=TOKEN)
        try:
            for i in range(nodes):
                name = f"n{i:02d}"
                status, _, doc = lb.request("POST", "/v1/agents/register", {"node": node_doc(name), "version": "0"},
                                            token=lb.join_token)
                assert status == 200, doc
                usage = {str(g): {"memory_free_mib": 8192, "utilization_pct": 50 + g} for g in range(8)}
                status, _, doc = lb.request("POST", f"/v1/agents/{name}/sync", {"attempts": [], "gpu_usage": usage},
                                            token=doc["agent_token"])
                assert status == 200, doc
            admin = Principal("user", "root", admin=True)
            began = time.perf_counter()
            for n in range(jobs):
                lb.leader.queue.submit(admin, parse_submit({"command": ["train"], "gpus": 1 + n % 4,
                                                            "workdir": "/tmp"}))
            fill_s = time.perf_counter() - began
            lb.leader.scheduling.schedule_pass()
            for _ in range(5):
                scrape(lb.port)
            times, body = [], b""
            for _ in range(30):
                took, body = scrape(lb.port)
                times.append(took)
        finally:
            lb.stop()
    text = body.decode()
    lines = [line for line in text.splitlines() if line.startswith("labq_jobs{")]
    counted = sum(float(line.rsplit(" ", 1)[1]) for line in lines)
    seen = {line.split('node="', 1)[1].split('"', 1)[0] for line in text.splitlines()
            if line.startswith("labq_gpu_utilization_ratio{")}
    problems = []
    if counted != jobs:
        problems.append(f"the scrape counts {counted:.0f} jobs, not {jobs}")
    if len(seen) != nodes or text.count("labq_gpu_utilization_ratio{") != 8 * nodes:
        problems.append(f"the scrape has {len(seen)} nodes' GPUs, not {nodes} x 8")
    times.sort()
    fig = {"nodes": nodes, "gpus": 8 * nodes, "jobs": jobs, "fill_s": fill_s,
           "scrape_median_ms": statistics.median(times), "scrape_p90_ms": times[int(0.9 * len(times))],
           "scrape_max_ms": times[-1], "scrape_bytes": len(body)}
    return fig, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    fig, problems = measure(args.jobs, args.nodes)
    if args.json:
        print(json.dumps(fig))
    else:
        print_figures(f"labq /metrics scrape ({args.nodes} nodes x 8 GPUs, {args.jobs:,} jobs, Python "
                      f"{sys.version.split()[0]})", fig,
                      {"scrape_median_ms": (f"< {GOAL_MS:g} ms", fig["scrape_median_ms"] < GOAL_MS)})
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
