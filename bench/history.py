"""Benchmark of what reads finished jobs with a long history: ``labq ls --history``, ``labq show`` of an ended
job and ``labq clean``, at 100,000 archived jobs.

What it measures: a real leader (``labq.leader.core.Leader`` behind its HTTP server on loopback, in this process)
on a ``TinyDBStore`` whose archive holds ``--archived`` (100,000) finished jobs of labq's own shape
(``encode_job``; 20 users, ``root`` among them, who runs the commands; ended over six months, so six monthly
archive files; a tenth failed, a tenth cancelled), committed before the leader starts. Then, as commands
taking turns, 1 warm-up then ``--runs`` (5) each: ``labq ls --history --limit 20`` (the caller's twenty that
ended last), ``labq ls --all --history --state failed --limit 20`` and ``labq show ID`` of a job that ended in
the first month; each with its median and least. Beside them, from this process over HTTP, the API calls
they make (``GET /v1/jobs?finished=1&limit=20``, ``GET /v1/jobs/ID``), and ``labq clean`` once, last (it
hides what it counts). The leader's peak RSS over all of that (``VmHWM`` after ``clear_refs``, in this
process, which holds only the leader then), and for scale what decoding the whole archive takes
(``Store.history()``, which each of these requests did before they read the archive by its lines' heads).

Goal (issue: costs that grow with the lab): each request answered in bounded time, well under a second at
100,000 archived jobs, with no growth of the leader's memory by the archive's size. Timings are printed, never
asserted. Checked: each command's output lists what was asked for (a violation exits with status 1).

Run:  .venv/bin/python bench/history.py [--archived 100000] [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import gc
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
from labq.leader.config import LeaderConfig
from labq.leader.core import Leader
from labq.leader.http import serve
from labq.models.job import Job, JobSpec, JobState
from labq.protocol.codec import encode_job
from labq.store import PutJob, TinyDBStore

NEXT_TO_PYTHON = Path(sys.executable).with_name("labq")
LABQ = NEXT_TO_PYTHON if NEXT_TO_PYTHON.exists() else Path(__file__).resolve().parent.parent / ".venv/bin/labq"
USERS = ["root"] + [f"u{i:02d}" for i in range(1, 20)]
SPAN_S, BATCH, WARMUPS, GOAL_MS = 180 * 86400.0, 1_000, 1, 1000.0


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def archived_job(job_id: int, ended_at: float) -> dict:
    """A finished job as the leader archives it: about 800 bytes of JSON."""
    user = USERS[job_id % len(USERS)]
    state = JobState.FAILED if job_id % 10 == 3 else JobState.CANCELLED if job_id % 10 == 7 else JobState.SUCCEEDED
    spec = JobSpec(user=user, command=("python", "train.py", "--config", f"configs/run{job_id % 97}.yaml"),
                   gpus=(1, 1, 2, 4)[job_id % 4], name=f"sweep-{job_id % 300}",
                   env=(("WANDB_PROJECT", f"{user}-exp"), ("OMP_NUM_THREADS", "8")), time_limit_s=14400.0)
    code = None if state is JobState.CANCELLED else int(state is JobState.FAILED)
    return encode_job(Job(job_id, spec, state=state, submitted_at=ended_at - 7200.0, started_at=ended_at - 3600.0,
                          ended_at=ended_at, exit_code=code))


def fill(folder: Path, count: int) -> float:
    """Commit ``count`` finished jobs, ``BATCH`` a commit, ended evenly over ``SPAN_S`` up to now; the seconds."""
    began, start = time.perf_counter(), time.time() - SPAN_S
    with TinyDBStore(folder) as store:
        for first in range(1, count + 1, BATCH):
            ids = range(first, min(first + BATCH, count + 1))
            store.commit([PutJob(archived_job(i, start + SPAN_S * i / count)) for i in ids])
            if first % 20_000 < BATCH:
                print(f"  {ids[-1]:,}/{count:,} archived", file=sys.stderr, flush=True)
    return time.perf_counter() - began


def peak_rss_reset() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak resident size starts again from the present one


def rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no {field} in /proc/self/status")


def timed(runs: int, call) -> list[float]:
    times = []
    for turn in range(WARMUPS + runs):
        start = time.perf_counter()
        call()
        if turn >= WARMUPS:
            times.append(time.perf_counter() - start)
    return times


def measure(root: Path, count: int, runs: int, problems: list[str]) -> dict:
    folder = root / "data"
    fig: dict = {"archived_jobs": count, "fill_s": round(fill(folder, count), 1)}
    store = TinyDBStore(folder)
    leader = Leader(LeaderConfig(host="127.0.0.1", port=0, data_dir=folder), store)
    name, token = leader.ensure_admin("root")
    server = serve(leader, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, name="labq-http-bench", daemon=True).start()
    client = Client(f"http://127.0.0.1:{server.server_address[1]}", token)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABQ_")}
    env.update(HOME=str(root / "home"), XDG_CONFIG_HOME=str(root / "home" / ".config"), LABQ_LEADER=client.url,
               LABQ_TOKEN=token)
    early = len(USERS) * 5  # root's, ended in the first month
    last_mine = max(i for i in range(count - len(USERS), count + 1) if USERS[i % len(USERS)] == "root")

    def command(*argv: str, expect: str):
        def run() -> None:
            out = subprocess.run([str(LABQ), *argv], env=env, capture_output=True, text=True, timeout=300)
            if out.returncode != 0 or expect not in out.stdout:
                problems.append(f"labq {' '.join(argv)} exited {out.returncode} without {expect!r}: "
                                f"{(out.stderr or out.stdout).strip()[:200]}")
        return run

    def api(path: str, expect):
        def run() -> None:
            answer = client._json("GET", path)
            if not expect(answer):
                problems.append(f"GET {path} answered {str(answer)[:200]}")
        return run

    try:
        gc.collect()
        peak_rss_reset()
        fig["leader_rss_before_mb"] = rss_mb("VmRSS")
        calls = {
            "ls_history_limit_20": command("ls", "--history", "--limit", "20", expect=str(last_mine)),
            "ls_all_history_failed_limit_20": command("ls", "--all", "--history", "--state", "failed", "--limit",
                                                      "20", expect="failed"),
            "show_ended_job": command("show", str(early), expect="succeeded"),
            "api_finished_limit_20": api("/v1/jobs?finished=1&limit=20",
                                         lambda a: len(a["jobs"]) == 20 and a["jobs"][-1]["id"] == last_mine),
            "api_ended_job": api(f"/v1/jobs/{early}", lambda a: a["job"]["id"] == early),
        }
        for key, call in calls.items():
            print(f"timing {key}", file=sys.stderr, flush=True)
            values = timed(runs, call)
            fig |= {f"{key}_median_ms": ms(statistics.median(values)), f"{key}_min_ms": ms(min(values))}
        start = time.perf_counter()
        command("clean", expect=f"hid {count // len(USERS)} finished jobs")()
        fig["clean_ms"] = ms(time.perf_counter() - start)
        fig["leader_peak_rss_mb"] = rss_mb("VmHWM")
        start = time.perf_counter()
        whole = len(store.history())
        fig["whole_archive_decode_ms"] = ms(time.perf_counter() - start)
        if whole != count:
            problems.append(f"the archive holds {whole:,} jobs, not {count:,}")
    finally:
        server.shutdown()
        server.server_close()
        leader.stop()
        store.close()
    return fig


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archived", type=int, default=100_000, help="finished jobs in the archive")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.archived < 1_000:
        parser.error("--archived: at least 1000")
    root = Path(tempfile.mkdtemp(prefix="labq-bench-history-"))
    problems: list[str] = []
    try:
        fig = measure(root, args.archived, args.runs, problems)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps({"figures": fig, "problems": problems}, indent=2))
    else:
        fig["slowest_median_ms"] = max(v for k, v in fig.items() if k.endswith("_median_ms"))
        print_figures(f"finished jobs read with {args.archived:,} archived", fig,
                      {"slowest_median_ms": (f"< {GOAL_MS:g} ms", fig["slowest_median_ms"] < GOAL_MS)}, digits=1)
        for problem in problems:
            print(f"PROBLEM: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
