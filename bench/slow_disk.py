"""Benchmark of concurrent changes on a slow disk: acknowledged submits and cancels per second, 8 clients.

What it measures
  A leader in this process (``Leader`` on a real ``TinyDBStore`` in a temp folder, its scheduler thread
  started, no nodes: every job stays queued) whose disk adds ``--extra-ms`` (0, 2 and 5 ms) to every fsync,
  as a slower disk does (a spinning disk, a network volume, a busy SSD). 8 threads submit ``--jobs`` (800)
  jobs through the leader's own calls (``Queue.submit``; the HTTP around it is not timed), then 8 threads
  cancel them (``Queue.act``). Figures: acknowledged submits and cancels per second (over the wall time until
  the last answer) and the fsyncs each burst took. A submit adds a job and shares the store's group commit; a
  cancel is a change (``labq.leader.locks``): it is decided and written in turn, and its fsync is shared with
  the changes written while one runs. ``cancels_ceiling_one_fsync_each`` is what cancels would top out at if
  each waited for its own fsync in turn (1 / (the disk's extra + the 0 ms run's cost of one)); the goal is to
  beat it at 5 ms: changes must not take turns across the disk.

Run:  .venv/bin/python bench/slow_disk.py [--jobs N] [--extra-ms 0,2,5] [--json]
"""

from __future__ import annotations

import argparse
import json
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
from labq.leader.auth import Principal
from labq.leader.config import LeaderConfig
from labq.leader.core import Leader
from labq.protocol.requests import parse_action, parse_submit
from labq.store import TinyDBStore
from labq.store.files import Disk

CLIENTS = 8
WHO = Principal("user", "alice")


class SlowDisk(Disk):
    """fsync as the OS does it, and ``extra_s`` more: a slower disk. Counts them."""

    def __init__(self, extra_s: float) -> None:
        self.extra_s, self.syncs = extra_s, 0

    def fsync(self, fd: int) -> None:
        self.syncs += 1
        super().fsync(fd)
        if self.extra_s:
            time.sleep(self.extra_s)


def burst(calls: list, clients: int = CLIENTS) -> float:
    """Run ``calls`` from ``clients`` threads, each taking the next; the wall time until the last answer."""
    lock, left, errors = threading.Lock(), list(reversed(calls)), []

    def client() -> None:
        while True:
            with lock:
                if not left:
                    return
                call = left.pop()
            try:
                call()
            except Exception as err:  # noqa: BLE001 - counted and printed: a failed call is a broken bench
                errors.append(err)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - began
    if errors:
        raise SystemExit(f"{len(errors)} calls failed, the first: {errors[0]!r}")
    return took


def measure(extra_ms: float, jobs: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="labq-slow-disk-") as folder:
        disk = SlowDisk(extra_ms / 1000)
        store = TinyDBStore(Path(folder) / "data", disk=disk)
        leader = Leader(LeaderConfig(data_dir=Path(folder)), store)
        leader.start()
        try:
            spec = parse_submit({"command": ["train"], "gpus": 1})
            ids: list[int] = []
            before = disk.syncs
            took = burst([lambda: ids.append(leader.queue.submit(WHO, spec).id)] * jobs)
            submits = (jobs / took, disk.syncs - before)
            cancel = parse_action({"action": "cancel"})
            before = disk.syncs
            took = burst([lambda i=i: leader.queue.act(WHO, i, cancel) for i in ids])
            cancels = (jobs / took, disk.syncs - before)
            left = [j for j in leader.state.jobs.values()]
            if len(set(ids)) != jobs or left:
                raise SystemExit(f"{len(set(ids))} distinct ids for {jobs} submits; {len(left)} jobs left queued")
        finally:
            leader.stop()
            store.close()
    return {"submits_per_s": submits[0], "submit_fsyncs": submits[1],
            "cancels_per_s": cancels[0], "cancel_fsyncs": cancels[1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=800)
    parser.add_argument("--extra-ms", default="0,2,5")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    fig: dict[str, object] = {}
    for extra in [float(x) for x in args.extra_ms.split(",")]:
        print(f"fsync + {extra:g} ms ...", file=sys.stderr)
        for name, value in measure(extra, args.jobs).items():
            fig[f"fsync_plus_{extra:g}ms_{name}"] = value
    targets = {}
    base = fig.get("fsync_plus_0ms_cancels_per_s")
    if base and "fsync_plus_5ms_cancels_per_s" in fig:
        ceiling = 1 / (0.005 + 1 / base)
        fig["cancels_ceiling_one_fsync_each_5ms"] = ceiling
        met = fig["fsync_plus_5ms_cancels_per_s"] > ceiling
        targets["fsync_plus_5ms_cancels_per_s"] = (f"> {ceiling:.0f}", met)
    if args.json:
        print(json.dumps(fig, indent=1))
    else:
        print_figures(f"Concurrent changes on a slow disk ({CLIENTS} clients, {args.jobs} jobs)", fig, targets,
                      digits=1)


if __name__ == "__main__":
    main()
