"""Benchmark of how labq's costs grow with the queue: submit latency and rate, idle CPU, ``labq ls``, the store.

What it measures, against a real ``labq leader`` and one ``labq agent`` (``sim:ws-4x3090``, process
runtime) started as processes in a temp folder with a temp HOME (``bench/latency.py``'s ``Lab``): a
4-GPU ``sleep`` job fills the node first, so every job submitted after it stays queued. The queue is then
filled through the API (16 threads, each with its own ``Client``; progress on stderr) to 0, 1,000, 10,000
and 30,000 queued jobs (1 to 4 GPUs each), and at each level, in this order:
  * the leader's idle CPU: once the data folder has been quiet for 2 s (a compaction the fill started is
    over), its process's utime+stime from ``/proc/PID/stat`` over 30 s, in % of one core, and the largest
    1-s share of it (the scheduler's 60 s heartbeat pass falls in a 30 s window or not: the peak shows it);
    the agent keeps syncing meanwhile, as in any idle lab. Journal bytes appended meanwhile are a figure.
  * ``labq ls`` (the default view) as a command, run as the admin whose token the lab made (the
    credentials file in the temp HOME, as the other benchmarks run the CLI): median of 5 after a warm-up.
  * submit acknowledgement latency with 1 client (``Client.submit``): 10 warm-ups, then 200 one after
    the other; median and p99. Then those 200 are cancelled one after the other, each timed the same way
    (``qN_cancel_p50_ms``, ``qN_cancel_p99_ms``): an action's cost should not grow with the queue either.
  * acknowledged submits per second with 8 and with 32 clients (threads, each with its own ``Client``):
    each submits one after the other for 2 s; acks over the wall time until the last answer, and the
    median and p99 of one submit under that load. The 8-client burst's jobs are then cancelled by 8 clients,
    timed (``qN_cancels_per_s_8_clients``): actions are changes, decided and written in turn
    (``labq.leader.locks``) and synced together, where submits are also written together.
  The jobs each submit measurement added are cancelled after it (the others untimed), so every measurement starts
  at its level. The clients run in this process, on the same CPUs as the leader. The fill's own rate is a
  figure (``qN_fill_acks_per_s_16_clients``): where submits slow down as the queue grows, the fill is most
  of the run.

Then the store alone (``TinyDBStore`` in this process, in a temp folder, no leader): 100,000 finished jobs
committed 1,000 a commit (six months of ``bench/store.py``'s ``job_doc``s, so several monthly archive
files), then 30,000 queued jobs, 1,000 a commit, with compaction as the leader has it (in the background
when the journal reaches the snapshot's size). Then, three times: 200 single-job commits, then
``store.compact()`` timed while another thread commits one job every 5 ms (its commits' largest latency
shows what a compaction makes commits wait). Then load: a fresh ``TinyDBStore(folder)`` + ``load()``, best
of 3; and once more the compaction, by the reopened store, whose jobs were read from the snapshot (it keeps
no encodings of them). Sizes: the snapshot, the journal after the fill, the archive.

sbatch: if ``sbatch``, ``slurmctld``, ``munged`` and ``scontrol`` are on PATH (Debian's slurm-wlm), a
single-node Slurm with its own munge daemon runs in a temp folder (no slurmd: jobs are submitted
``--hold`` and stay pending), and ``sbatch`` commands from 8 threads for 2 s give its acknowledgements per
second, beside labq's 8 clients. sbatch is Slurm's C client, one process a submit; labq's figure is API
calls from one Python process. Without slurm-wlm the ratio is skipped, and said so.

Goals (issue: costs that grow with the lab): submit p99 at 30,000 queued within 2x the p99 at 0; 8-client
acks/s at least 2x sbatch's (with no sbatch, the figure alone); an idle leader under 0.5% of a core;
``labq ls`` under 100 ms; store load under 1 s; compaction time is a figure. Timings are printed, never
asserted. Checked at each level: the queue holds exactly the level's jobs and the blocker still runs;
every submit got an id, none twice; the store's content (``bench/store.py``'s checks). A violation is
printed after the figures and exits with status 1.

``--quick``: 0, 1,000 and 5,000 queued, 10 s idle windows, 100 single submits, 1 s windows, a store of
5,000 queued + 20,000 finished jobs.

Run:  .venv/bin/python bench/scale.py [--quick] [--levels 0,1000,10000,30000] [--json] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

try:
    import labq  # noqa: F401
except ImportError:  # running from a checkout without an installed labq
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.append(str(Path(__file__).resolve().parent.parent))  # tests.slurm_cluster: the Slurm the tests run too

from figures import print_figures
from latency import LABQ, Lab, ms, pct, say
from store import Bench, job_doc, measure_load

from labq.agent.process_runtime import lock_held
from labq.client import Client
from labq.protocol.errors import ApiError

FILL_THREADS, CANCEL_THREADS, WARMUPS, LS_RUNS = 16, 8, 10, 5
P99_RATIO_GOAL, SBATCH_RATIO_GOAL, IDLE_GOAL_PCT, LS_GOAL_MS, LOAD_GOAL_S = 2.0, 2.0, 0.5, 100.0, 1.0
QUIET_S = 2.0  #: the data folder unchanged this long: no compaction or commit under way
STORE_SINGLES, STORE_ROUNDS, STORE_BATCH = 200, 3, 1_000
#: the committer beside a timed compaction pauses this long between commits, as a leader's commits come from
#: requests with gaps between them (back to back, one thread's commits keep compact() from its journal swap)
COMMITTER_PAUSE_S = 0.005
TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Plan:
    levels: list[int]
    idle_s: float
    single: int
    window_s: float
    store_queued: int
    store_archived: int

    @classmethod
    def of(cls, quick: bool) -> Plan:
        if quick:
            return cls([0, 1_000, 5_000], 10.0, 100, 1.0, 5_000, 20_000)
        return cls([0, 1_000, 10_000, 30_000], 30.0, 200, 2.0, 30_000, 100_000)


def body(n: int, root: Path) -> dict:
    return {"command": ["python", "train.py", "--seed", str(n)], "gpus": 1 + n % 4, "name": f"scale-{n}",
            "workdir": str(root)}


@dataclass
class Burst:
    """What a group of submitting threads got: each submit's latency (s), the ids, the failures, the wall time."""
    latencies: list[float] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0

    @property
    def rate(self) -> float:
        return len(self.ids) / self.wall if self.wall else 0.0


def submit_burst(lab: Lab, clients: int, *, total: int | None = None, seconds: float | None = None,
                 stop: threading.Event, progress: str = "") -> Burst:
    """``clients`` threads, each with its own ``Client``, submitting one after the other until ``total`` submits
    were taken or ``seconds`` have gone by. ``progress``: say how far it got every 5 s (a long fill)."""
    burst, lock, taken = Burst(), threading.Lock(), [0]
    gate = threading.Barrier(clients + 1)
    deadline = [float("inf")]

    def submitter() -> None:
        client = lab.new_client(lab.client.token)
        latencies, ids, errors = [], [], []
        gate.wait()
        while not stop.is_set():
            with lock:
                if (total is not None and taken[0] >= total) or time.perf_counter() >= deadline[0]:
                    break
                n = taken[0] = taken[0] + 1
            t0 = time.perf_counter()
            try:
                job = client.submit(body(n, lab.root))
            except ApiError as err:
                errors.append(f"a submit failed after {ms(time.perf_counter() - t0):.0f} ms: {err}")
                continue
            latencies.append(time.perf_counter() - t0)
            ids.append(job.get("id"))
        with lock:
            burst.latencies += latencies
            burst.ids += ids
            burst.errors += errors

    threads = [threading.Thread(target=submitter, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    gate.wait()
    start = time.perf_counter()
    if seconds is not None:
        deadline[0] = start + seconds
    last = (start, 0)
    for t in threads:
        while t.is_alive():
            t.join(5.0)
            if progress and t.is_alive():
                now, done = time.perf_counter(), taken[0]
                say(f"  {progress}: {done:,}/{total:,} submitted, {(done - last[1]) / (now - last[0]):.0f}/s lately")
                last = (now, done)
    burst.wall = time.perf_counter() - start
    return burst


def cancel_all(lab: Lab, ids: list[int], problems: list[str]) -> None:
    """Cancel the given (queued) jobs, 8 threads, untimed."""
    local = threading.local()

    def cancel(job_id: int) -> None:
        client = getattr(local, "client", None) or lab.new_client(lab.client.token)
        local.client = client
        try:
            client.action(job_id, "cancel")
        except ApiError as err:
            problems.append(f"cancelling job {job_id}: {err}")

    with ThreadPoolExecutor(CANCEL_THREADS) as pool:
        list(pool.map(cancel, ids))


def check_level(client: Client, blocker: int, expected: int, problems: list[str]) -> None:
    """The queue holds exactly ``expected`` jobs and the blocker still runs (untimed; a whole listing)."""
    jobs = client.jobs()
    states = {j["id"]: j["state"] for j in jobs}
    queued = sum(1 for s in states.values() if s == "queued")
    if queued != expected:
        problems.append(f"{queued:,} jobs queued where {expected:,} were expected")
    if states.get(blocker) != "running":
        problems.append(f"the blocker job {blocker} is {states.get(blocker, 'gone')}, not running")


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid``, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def folder_stamp(folder: Path) -> tuple:
    """The data folder's top-level files as (name, size, mtime): it changes with every commit or compaction."""
    return tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir() if p.is_file()))


def journal_bytes(folder: Path) -> int:
    total = 0
    for path in folder.glob("journal-*.log"):
        try:
            total += path.stat().st_size
        except FileNotFoundError:  # a compaction removed it meanwhile
            pass
    return total


def settle(folder: Path, at_most_s: float = 120.0) -> float:
    """Wait until the data folder has not changed for QUIET_S; how long that took."""
    began = time.perf_counter()
    last, since = folder_stamp(folder), time.perf_counter()
    while time.perf_counter() - since < QUIET_S and time.perf_counter() - began < at_most_s:
        time.sleep(0.2)
        now = folder_stamp(folder)
        if now != last:
            last, since = now, time.perf_counter()
    return time.perf_counter() - began


def idle_cpu(pid: int, folder: Path, seconds: float) -> dict:
    """The leader's CPU over ``seconds``, in % of one core, and its largest 1-s share."""
    settled = settle(folder)
    journal, snapshot = journal_bytes(folder), (folder / "labq.json").stat().st_mtime_ns
    first = ticks = cpu_ticks(pid)
    start = time.perf_counter()
    peak = 0.0
    while time.perf_counter() - start < seconds:
        mark = time.perf_counter()
        time.sleep(min(1.0, seconds - (mark - start)))
        now = cpu_ticks(pid)
        peak = max(peak, (now - ticks) / TICK / (time.perf_counter() - mark) * 100.0)
        ticks = now
    wall = time.perf_counter() - start
    return {"idle_cpu_pct": (ticks - first) / TICK / wall * 100.0, "idle_cpu_peak_1s_pct": peak,
            "idle_journal_bytes": journal_bytes(folder) - journal,
            "idle_snapshot_written": (folder / "labq.json").stat().st_mtime_ns != snapshot,
            "settle_s": settled}


def ls_wall(lab: Lab) -> dict:
    """``labq ls`` as a command: a warm-up, then the median of LS_RUNS."""
    times, lines = [], 0
    for turn in range(1 + LS_RUNS):
        start = time.perf_counter()
        out = subprocess.run([str(LABQ), "ls"], env=lab.env(), cwd=lab.root, capture_output=True, text=True,
                             timeout=120)
        elapsed = time.perf_counter() - start
        if out.returncode != 0:
            raise RuntimeError(f"labq ls exited {out.returncode}: {out.stderr.strip()}")
        lines = len(out.stdout.splitlines())
        if turn:
            times.append(elapsed)
    return {"ls_median_ms": ms(statistics.median(times)), "ls_max_ms": ms(max(times)), "ls_lines": lines}


def measure_level(lab: Lab, plan: Plan, stop: threading.Event, ids: list[int], problems: list[str]) -> dict:
    """One level's figures; the jobs its submit measurements add are cancelled after each."""
    fig = idle_cpu(lab.procs[0].pid, lab.data, plan.idle_s)
    fig |= ls_wall(lab)
    client = lab.client
    for n in range(WARMUPS):
        ids.append(client.submit(body(n, lab.root))["id"])
    single = []
    for n in range(plan.single):
        t0 = time.perf_counter()
        ids.append(client.submit(body(n, lab.root))["id"])
        single.append(time.perf_counter() - t0)
    fig |= {"submit_p50_ms": ms(statistics.median(single)), "submit_p99_ms": ms(pct(single, 0.99))}
    cancel_all(lab, ids[-(WARMUPS + plan.single):-plan.single], problems)
    cancels = []
    for job_id in ids[-plan.single:]:
        t0 = time.perf_counter()
        try:
            client.action(job_id, "cancel")
        except ApiError as err:
            problems.append(f"cancelling job {job_id}: {err}")
            continue
        cancels.append(time.perf_counter() - t0)
    fig |= {"cancel_p50_ms": ms(statistics.median(cancels)), "cancel_p99_ms": ms(pct(cancels, 0.99))}
    for clients in (8, 32):
        burst = submit_burst(lab, clients, seconds=plan.window_s, stop=stop)
        ids.extend(burst.ids)
        problems.extend(burst.errors[:3])
        fig |= {f"acks_per_s_{clients}_clients": burst.rate,
                f"submit_{clients}_clients_p50_ms": ms(statistics.median(burst.latencies)),
                f"submit_{clients}_clients_p99_ms": ms(pct(burst.latencies, 0.99))}
        began = time.perf_counter()
        cancel_all(lab, burst.ids, problems)
        if clients == 8:
            fig["cancels_per_s_8_clients"] = len(burst.ids) / (time.perf_counter() - began)
    return fig


def bench_api(plan: Plan, gpus: str, keep: bool, problems: list[str]) -> dict:
    root = Path(tempfile.mkdtemp(prefix="labq-bench-scale-"))
    lab, stop, ids, fig = Lab(root), threading.Event(), [], {}
    try:
        client = lab.start(gpus)
        blocker = client.submit({"command": ["sleep", "3600"], "gpus": len(client.nodes()[0]["gpus"]),
                                 "workdir": str(root)})["id"]
        lab.wait(lambda: client.job(blocker)[0]["state"] == "running", "the blocker job to run")
        queued = 0
        for level in plan.levels:
            if level > queued:
                say(f"filling the queue to {level:,} ({FILL_THREADS} clients)")
                burst = submit_burst(lab, FILL_THREADS, total=level - queued, stop=stop, progress="fill")
                ids.extend(burst.ids)
                problems.extend(burst.errors[:3])
                fig[f"q{level}_fill_acks_per_s_{FILL_THREADS}_clients"] = burst.rate
                queued += len(burst.ids)
            check_level(client, blocker, queued, problems)
            say(f"{level:,} queued: idle CPU over {plan.idle_s:g} s, labq ls, submits with 1, 8 and 32 clients")
            fig |= {f"q{level}_{k}": v for k, v in measure_level(lab, plan, stop, ids, problems).items()}
        if None in ids or 0 in ids:
            problems.append("a submit was answered without a job id")
        if len(ids) != len(set(ids)):
            problems.append(f"{len(ids) - len(set(ids))} job ids were handed out twice")
        fig["api_jobs_submitted"] = len(ids)
    finally:
        stop.set()
        lab.close()
        if keep:
            say(f"kept {root}")
        else:
            remove_tree(root)
    return fig


def remove_tree(root: Path, at_most_s: float = 10.0) -> None:
    """Remove ``root`` once the jobs' shims are gone: a shim holds its attempt's ``lock`` while it lives, and
    writes the attempt's ``exit.json`` (making its folders again) just after its job was killed."""
    deadline = time.monotonic() + at_most_s
    locks = list(root.glob("data/agents/*/runtime/attempts/*/lock"))
    while time.monotonic() < deadline and any(lock_held(lock) for lock in locks):
        time.sleep(0.1)
    shutil.rmtree(root, ignore_errors=True)


def timed_compaction(bench: Bench) -> dict:
    """STORE_SINGLES single-job commits, then ``compact()`` while a thread commits one job at a time."""
    single = []
    for _ in range(STORE_SINGLES):
        doc = job_doc(bench.take_id(), "queued", time.time())
        t0 = time.perf_counter()
        bench.commit([doc])
        single.append(time.perf_counter() - t0)
        bench.submitted.add(doc["id"])
    during, done = [], threading.Event()

    def committer() -> None:
        while not done.is_set():
            doc = job_doc(bench.take_id(), "queued", time.time())
            t0 = time.perf_counter()
            bench.commit([doc])
            during.append(time.perf_counter() - t0)
            bench.submitted.add(doc["id"])
            done.wait(COMMITTER_PAUSE_S)

    journal = bench.store.journal_bytes
    thread = threading.Thread(target=committer)
    thread.start()
    t0 = time.perf_counter()
    try:
        bench.store.compact()
        took = time.perf_counter() - t0
    finally:
        done.set()
        thread.join()
    return {"compact_s": took, "journal_bytes": journal,
            "commit_p50_ms": ms(statistics.median(single)),
            "commit_max_ms": ms(max(single)), "during_max_ms": ms(max(during, default=0.0)), "during_n": len(during)}


def bench_store(plan: Plan, keep: bool) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="labq-bench-scale-store-"))
    say(f"store: {plan.store_archived:,} finished + {plan.store_queued:,} queued jobs in {folder}")
    fig: dict = {}
    try:
        bench = Bench(folder, plan.store_archived)
        began = time.perf_counter()
        bench.prefill(plan.store_archived)
        for start in range(0, plan.store_queued, STORE_BATCH):
            now = time.time()
            docs = [job_doc(bench.take_id(), "queued", now) for _ in range(min(STORE_BATCH, plan.store_queued - start))]
            bench.commit(docs)
            bench.submitted.update(d["id"] for d in docs)
        fig["store_fill_s"] = time.perf_counter() - began
        fig["store_compactions_during_fill"] = bench.store.compactions
        fig["store_journal_bytes_after_fill"] = journal_bytes(folder)
        bench.store.compact()  # untimed: waits for a background one, so none runs in the timed ones
        say(f"store: {STORE_ROUNDS} x ({STORE_SINGLES} single-job commits, then compact() beside a committer)")
        rounds = [timed_compaction(bench) for _ in range(STORE_ROUNDS)]
        fig["store_snapshot_bytes"] = (folder / "labq.json").stat().st_size
        fig["store_archive_bytes"] = sum(p.stat().st_size for p in (folder / "archive").iterdir())
        fig["store_compact_s"] = statistics.median(r["compact_s"] for r in rounds)
        fig["store_compact_max_s"] = max(r["compact_s"] for r in rounds)
        fig["store_compact_journal_bytes"] = rounds[-1]["journal_bytes"]
        fig["store_commit_p50_ms"] = statistics.median(r["commit_p50_ms"] for r in rounds)
        fig["store_commit_max_ms"] = max(r["commit_max_ms"] for r in rounds)
        fig["store_commit_during_compaction_max_ms"] = max(r["during_max_ms"] for r in rounds)
        say("store: load, best of 3")
        loaded = measure_load(bench)
        fig |= {"store_load_s": loaded["load_s"], "store_archive_files": loaded["archive_files"],
                "store_history_read_s": loaded["history_read_s"]}
        after = timed_compaction(bench)  # the reopened store: its jobs came from the snapshot
        fig["store_compact_after_reopen_s"] = after["compact_s"]
        fig["store_commit_during_compaction_after_reopen_max_ms"] = after["during_max_ms"]
        fig["store_queued_jobs"] = len(bench.store.load().jobs)
        fig["store_archived_jobs"] = len(bench.finished)
        bench.check()
        bench.store.close()
    finally:
        if keep:
            say(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return fig


def bench_sbatch(clients: int, seconds: float, keep: bool) -> tuple[dict, str]:
    """sbatch acknowledgements per second from ``clients`` threads against a single-node Slurm of its own (no
    slurmd: jobs are submitted held, and never run); or no figures and why."""
    from tests.slurm_cluster import SlurmCluster

    root = Path(tempfile.mkdtemp(prefix="labq-bench-slurm-"))
    cluster = SlurmCluster(root, partition="bench", with_slurmd=False)
    try:
        try:
            cluster.start()
        except RuntimeError as err:
            return {}, f"sbatch: {err}; ratio skipped"
        argv = ["sbatch", "--hold", "--parsable", "-p", "bench", "-J", "bench", "-o", "/dev/null", "--wrap", "sleep 60"]
        counts, failures, lock = [], [], threading.Lock()
        gate = threading.Barrier(clients + 1)
        end = [0.0]

        def submitter() -> None:
            acked = 0
            gate.wait()
            while time.perf_counter() < end[0]:
                out = cluster.run(*argv, check=False, timeout=60)
                if out.returncode == 0 and out.stdout.split(";")[0].strip().isdigit():
                    acked += 1
                else:
                    with lock:
                        failures.append(out.stderr.strip()[:200])
            with lock:
                counts.append(acked)

        threads = [threading.Thread(target=submitter, daemon=True) for _ in range(clients)]
        for t in threads:
            t.start()
        end[0] = time.perf_counter() + 3600
        gate.wait()
        start = time.perf_counter()
        end[0] = start + seconds
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        note = f"sbatch: {sum(counts)} acknowledged, {len(failures)} refused"
        note += f" (e.g. {failures[0]})" if failures else ""
        return {f"sbatch_acks_per_s_{clients}_clients": sum(counts) / wall}, note
    finally:
        cluster.stop()
        if keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def goals(fig: dict, levels: list[int]) -> dict[str, tuple[str, bool | None]]:
    """Each figure with a goal: (the goal as shown, whether it was met; None where there is nothing to judge)."""
    top = levels[-1]
    targets: dict[str, tuple[str, bool | None]] = {
        f"q{top}_submit_p99_over_q0": (f"<= {P99_RATIO_GOAL:g}x", fig[f"q{top}_submit_p99_over_q0"] <= P99_RATIO_GOAL),
        "store_load_s": (f"< {LOAD_GOAL_S:g} s", fig["store_load_s"] < LOAD_GOAL_S),
        "store_compact_s": ("(a figure)", None)}
    sbatch = fig.get("sbatch_acks_per_s_8_clients")
    for level in levels:
        targets[f"q{level}_idle_cpu_pct"] = (f"< {IDLE_GOAL_PCT:g}%", fig[f"q{level}_idle_cpu_pct"] < IDLE_GOAL_PCT)
        targets[f"q{level}_ls_median_ms"] = (f"< {LS_GOAL_MS:g} ms", fig[f"q{level}_ls_median_ms"] < LS_GOAL_MS)
        acks = f"q{level}_acks_per_s_8_clients"
        targets[acks] = ((f">= {SBATCH_RATIO_GOAL:g}x sbatch", fig[acks] >= SBATCH_RATIO_GOAL * sbatch) if sbatch
                         else ("2x sbatch: no sbatch", None))
        if sbatch:
            targets[f"q{level}_8_clients_over_sbatch"] = (f">= {SBATCH_RATIO_GOAL:g}x",
                                                          fig[f"q{level}_8_clients_over_sbatch"] >= SBATCH_RATIO_GOAL)
    return targets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--quick", action="store_true",
                        help="0/1,000/5,000 queued, 10 s idle windows, a smaller store (a smoke run, ~3 minutes)")
    parser.add_argument("--levels", help="queued jobs to measure at, comma-separated (0 is always measured)")
    parser.add_argument("--keep", action="store_true", help="leave the temp folders (logs, data) in place")
    parser.add_argument("--gpus", default="sim:ws-4x3090", help="the agent's simulated GPUs (default sim:ws-4x3090)")
    args = parser.parse_args(argv)
    plan = Plan.of(args.quick)
    if args.levels:
        plan.levels = sorted({0, *(int(n) for n in args.levels.split(","))})
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("scale benchmark: stopped by SIGTERM"))  # run the finally
    began = time.perf_counter()
    problems: list[str] = []
    fig: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "gpus": args.gpus,
                 "loadavg_at_start": os.getloadavg()[0]}
    fig |= bench_api(plan, args.gpus, args.keep, problems)
    top = plan.levels[-1]
    fig[f"q{top}_submit_p99_over_q0"] = fig[f"q{top}_submit_p99_ms"] / fig["q0_submit_p99_ms"]
    fig |= bench_store(plan, args.keep)
    say("sbatch: 8 clients" if shutil.which("sbatch") else "sbatch: not on PATH")
    sbatch, note = bench_sbatch(8, plan.window_s, args.keep)
    fig |= sbatch
    if sbatch:
        for level in plan.levels:
            fig[f"q{level}_8_clients_over_sbatch"] = fig[f"q{level}_acks_per_s_8_clients"] / sbatch[
                "sbatch_acks_per_s_8_clients"]
    fig["wall_s"], fig["loadavg_at_end"] = time.perf_counter() - began, os.getloadavg()[0]
    targets = goals(fig, plan.levels)
    if args.json:
        print(json.dumps(fig | {"levels": plan.levels, "sbatch_note": note, "problems": problems,
                                "goals_met": {k: met for k, (_, met) in targets.items() if met is not None}}))
    else:
        print_figures(f"labq scale benchmark (Python {fig['python']}, {fig['cpus']} CPUs, agent {args.gpus}, "
                      f"queued {'/'.join(f'{n:,}' for n in plan.levels)}, {fig['wall_s']:.0f} s; the machine's "
                      f"1-min load average {fig['loadavg_at_start']:.1f} at the start, {fig['loadavg_at_end']:.1f} "
                      f"at the end)", fig, targets,
                      skip=("python", "cpus", "gpus", "wall_s", "loadavg_at_start", "loadavg_at_end"))
        print(f"\n{note}")
    if problems:  # after the figures, which help to find the cause
        say("scale benchmark: inconsistent:\n  " + "\n  ".join(problems[:20]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
