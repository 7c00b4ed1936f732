"""Benchmark of preemption: how soon an urgent job runs on GPUs held by low jobs, and what they lose.

What it measures, against a real ``labq leader`` (``min_runtime = "0s"``, ``default_grace =
"30s"``) and one ``labq agent`` (``sim:ws-4x3090``, process runtime) started as processes in a
temp folder with a temp HOME (``Lab`` of ``latency.py``). The victims are the examples' training
loop (``examples/checkpointing/train.py``, 0.05 s steps), one low-priority 1-GPU job per GPU:
  * Urgent submit to urgent running, with 4 victims that save on the checkpoint signal: each sample
    submits a 2-GPU urgent ``sleep 60`` (t0 just before the submit call) and waits for its
    ``running`` event on ``/v1/events``. Split into the victims' own checkpoint time (signal to exit:
    per victim, its attempt's ``ended_at`` minus the agent's "SIGUSR1, ... to checkpoint" log line;
    the largest of the victims) and labq's overhead (the rest), and the overhead further into
    submit to the victims' ``preempting`` event (the leader's decision), decision to signal (the
    agent's log line), last exit to the leader requeueing the victims (their second ``queued``
    event: the agent's report of the exit), requeue to the urgent job's ``starting`` event, and
    ``starting`` to ``running`` (the agent launches it). Then every job is cancelled and its end
    awaited, so each sample starts from 4 fresh, running victims. 2 warm-ups, ``--samples`` (12).
  * Work lost per preemption for victims that checkpoint every N s (``--save-every N
    --no-save-on-signal``: they stop on the signal without saving), N in 2 and 5: the urgent job
    comes at a random time (``random.Random(--seed)``) max(3, N + 1) + uniform(0, N) s after the
    victims run, so after their first periodic save and at a uniform phase of their save cycle.
    labq's accounting is each victim's ``attempts[0]["work_lost_s"]``; the truth comes from the
    logs: (step K of "stopping at step K without saving") minus (step J of the next attempt's
    "resumed at step J"), times the step time; labq's figure runs from the last save to the exit,
    so it is expected a little above the truth (labq minus true is reported). The urgent job is
    then cancelled, so the victims' second attempts start, and each one's "resumed at" line is
    awaited. ``--samples`` // 2 (6) samples for each N, 2 victims each. With ``--json`` the raw
    samples come too (``raw_overhead``, ``raw_work_lost``).

Goals (from the issue): labq's overhead median within 500 ms; work lost per preemption at most N
for a job checkpointing every N s. The loop can save only between steps, so its saves are up to
N plus one step (0.05 s) apart, and that is the limit each maximum is held to. Timings are
reported, never asserted. Consistency is checked (exactly 2 victims per urgent job, each first
attempt ended ``checkpointed`` for a preemption by that urgent job, every victim resumed where its
last checkpoint was, every benchmark job ends
cancelled): a violation is printed after the figures and exits with status 1. Progress goes to
stderr.

Run:  .venv/bin/python bench/preemption.py [--json] [--keep] [--samples 12] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from figures import print_figures
from latency import Events, Lab, finish_all, ms, pct, say
from labq.client import Client
from labq.protocol.errors import ApiError

TRAIN = Path(__file__).resolve().parent.parent / "examples" / "checkpointing" / "train.py"
SLEEP = shutil.which("sleep") or "/bin/sleep"
GPUS, URGENT_GPUS, STEP_S = "sim:ws-4x3090", 2, 0.05
WARMUPS, SAMPLES, SAVE_EVERY = 2, 12, (2, 5)
OVERHEAD_GOAL_MS = 500.0
CONFIG = ('[leader]\nlisten = "127.0.0.1:0"\n[scheduling]\nmin_runtime = "0s"\n'
          '[jobs]\ndefault_grace = "30s"\nmax_grace = "4m"\nallow_root = true\n')
SIGNALLED = re.compile(r"^(\S+ \S+),(\d{3}) \S+ INFO job (\d+) attempt (\d+): SIGUSR1, \S+ to checkpoint \(preempted\)",
                       re.M)


class AllEvents(Events):
    """``Events``, and besides the first time, every time each (job id, state) was seen (a job is
    ``queued`` once when submitted and again when requeued)."""

    def __init__(self, client: Client) -> None:
        self.times: dict[tuple[int, str], list[float]] = {}
        super().__init__(client)

    def _follow(self) -> None:
        try:
            for event in self.client.events(after=0):
                now, data = time.time(), event["data"]
                with self.cond:
                    self.count += 1
                    if event["event"] == "job" and isinstance(data, dict) and "state" in data:
                        self.seen.setdefault((data["job_id"], data["state"]), now)
                        self.times.setdefault((data["job_id"], data["state"]), []).append(now)
                    self.cond.notify_all()
        except ApiError:
            pass  # the leader went away at the end

    def nth(self, job_id: int, state: str, n: int, timeout: float = 30.0) -> float:
        """When ``job_id`` was seen in ``state`` for the ``n``-th time (1-based)."""
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.times.get((job_id, state), ())) >= n, timeout):
                raise RuntimeError(f"no {state} event #{n} for job {job_id} within {timeout:g} s")
            return self.times[(job_id, state)][n - 1]


def signalled(log: str) -> dict[tuple[int, int], float]:
    """When the agent logged the checkpoint signal of a preemption, per (job, attempt), its local time."""
    return {(int(job), int(attempt)): datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp() + int(millis) / 1000
            for stamp, millis, job, attempt in SIGNALLED.findall(log)}


def job_log(client: Client, job_id: int, attempt: int) -> str:
    try:
        return client.logs(job_id, attempt)[0].decode(errors="replace")
    except ApiError:
        return ""  # not there yet


def wait_for(condition, what: str, timeout: float = 30.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what}")
        time.sleep(every)
    return found


def start_victims(lab: Lab, client: Client, events: Events, ids: list[int], *extra: str) -> list[int]:
    """4 low 1-GPU training loops, running, each past its first step (its signal handler is set)."""
    victims = []
    for _ in range(4):
        job = client.submit({"command": [sys.executable, str(TRAIN), "--steps", "10000000", "--step-time", str(STEP_S),
                                         *extra], "gpus": 1, "priority": "low", "name": "victim",
                             "checkpoint_signal": "SIGUSR1",  # declared: the example saves on it
                             "workdir": str(lab.root)})
        ids.append(job["id"])
        victims.append(job["id"])
    for job_id in victims:
        events.wait(job_id, "running", 60.0)
    for job_id in victims:
        wait_for(lambda j=job_id: re.search(r"^step \d+", job_log(client, j, 1), re.M), f"job {job_id} to step", 30.0)
    return victims


def submit_urgent(lab: Lab, client: Client, ids: list[int]) -> tuple[int, float]:
    t0 = time.time()
    job = client.submit({"command": [SLEEP, "60"], "gpus": URGENT_GPUS, "priority": "urgent", "name": "urgent",
                         "workdir": str(lab.root)})
    ids.append(job["id"])
    return job["id"], t0


def cancel_and_wait(client: Client, events: Events, order: list[int], problems: list[str]) -> None:
    """Cancel in this order (queued victims first, so none restarts on GPUs that come free), then await each end."""
    for job_id in order:
        try:
            client.action(job_id, "cancel")
        except ApiError as err:
            if err.status not in (404, 409):
                problems.append(f"cancelling job {job_id}: {err}")
    for job_id in order:
        events.wait(job_id, "cancelled", 60.0)


def preempted_victims(client: Client, victims: list[int], urgent: int, problems: list[str],
                      what: str) -> dict[int, dict]:
    """The victims the urgent job preempted (first attempt done), with their job documents; checks each one."""
    docs = {j: client.job(j)[0] for j in victims}
    hit = {j: d for j, d in docs.items() if d["attempts"]}
    if len(hit) != URGENT_GPUS:
        problems.append(f"{what}: urgent job {urgent} preempted {len(hit)} victims, not {URGENT_GPUS}: "
                        f"{ {j: (d['state'], d['attempt']) for j, d in docs.items()} }")
    for j, d in hit.items():
        first = d["attempts"][0]
        if (first["ended"], first["stop_reason"], first["preempted_for"]) != ("checkpointed", "preempted", urgent):
            problems.append(f"{what}: victim {j}'s first attempt ended {first['ended']!r} (stop reason "
                            f"{first['stop_reason']!r}, for {first['preempted_for']}), not checkpointed for {urgent}")
    return hit


def bench_overhead(lab: Lab, client: Client, events: AllEvents, ids: list[int], samples: int,
                   problems: list[str]) -> tuple[dict, list[dict]]:
    rows, ends = [], []
    for i in range(WARMUPS + samples):
        what = f"overhead sample {i + 1 - WARMUPS}" if i >= WARMUPS else f"overhead warm-up {i + 1}"
        victims = start_victims(lab, client, events, ids)
        urgent, t0 = submit_urgent(lab, client, ids)
        running = events.wait(urgent, "running", 120.0)
        starting = events.wait(urgent, "starting", 1.0)
        hit = preempted_victims(client, victims, urgent, problems, what)
        sig = signalled(lab.log("agent.log"))
        row = {"urgent": urgent, "victims": sorted(hit), "t0": t0, "starting": starting, "running": running}
        if hit and all((j, 1) in sig for j in hit):
            row["preempting"] = min(events.wait(j, "preempting", 1.0) for j in hit)
            row["signals"] = {j: sig[(j, 1)] for j in hit}
            row["ended_at"] = {j: d["attempts"][0]["ended_at"] for j, d in hit.items()}
            row["requeued"] = max(events.nth(j, "queued", 2, 5.0) for j in hit)
            ends += [d["attempts"][0]["ended"] for d in hit.values()]
            if i >= WARMUPS:
                rows.append(row)
        else:
            problems.append(f"{what}: no agent log line for the checkpoint signal of every victim of job {urgent}")
        cancel_and_wait(client, events, sorted(hit) + [urgent] + [j for j in victims if j not in hit], problems)
        if i >= WARMUPS:
            say(f"  {what}: urgent running {ms(running - t0):.0f} ms after its submit")
    col: dict[str, list[float]] = {name: [] for name in (
        "total", "checkpoint", "overhead", "submit_to_decision", "decision_to_signal", "exit_to_requeue",
        "requeue_to_starting", "starting_to_running")}
    for r in rows:
        checkpoint = max(r["ended_at"][j] - r["signals"][j] for j in r["victims"])
        last_exit = max(r["ended_at"].values())
        col["total"].append(r["running"] - r["t0"])
        col["checkpoint"].append(checkpoint)
        col["overhead"].append(r["running"] - r["t0"] - checkpoint)
        col["submit_to_decision"].append(r["preempting"] - r["t0"])
        col["decision_to_signal"].append(min(r["signals"].values()) - r["preempting"])
        col["exit_to_requeue"].append(r["requeued"] - last_exit)
        col["requeue_to_starting"].append(r["starting"] - r["requeued"])
        col["starting_to_running"].append(r["running"] - r["starting"])
    fig: dict = {"overhead_samples": len(rows)}
    for name, values in col.items():
        if values:
            fig |= {f"{name}_median_ms": ms(statistics.median(values)), f"{name}_p95_ms": ms(pct(values, 0.95))}
    fig["overhead_victim_ends"] = ", ".join(f"{e} x{ends.count(e)}" for e in sorted(set(ends))) or "none"
    return fig, rows


def bench_work_lost(lab: Lab, client: Client, events: Events, ids: list[int], samples: int, rng: random.Random,
                    problems: list[str]) -> tuple[dict, list[dict]]:
    fig: dict = {}
    rows: list[dict] = []
    for every in SAVE_EVERY:
        mine: list[dict] = []
        for i in range(samples):
            what = f"work lost, save every {every} s, sample {i + 1}"
            victims = start_victims(lab, client, events, ids, "--save-every", str(every), "--no-save-on-signal")
            delay = max(3.0, every + 1.0) + rng.uniform(0.0, every)
            time.sleep(max(0.0, max(events.wait(j, "running") for j in victims) + delay - time.time()))
            urgent, _ = submit_urgent(lab, client, ids)
            events.wait(urgent, "running", 120.0)
            hit = preempted_victims(client, victims, urgent, problems, what)
            cancel_and_wait(client, events, [urgent], problems)  # the victims' next attempts need its GPUs
            for j, doc in hit.items():
                try:
                    wait_for(lambda j=j: re.search(r"resumed at step (\d+)|starting at step 0", job_log(client, j, 2)),
                             f"job {j}'s second attempt to start its loop", 60.0, 0.1)
                except RuntimeError as err:
                    problems.append(f"{what}: victim {j}: {err}")
                    continue
                stopped = re.search(r"stopping at step (\d+) without saving", job_log(client, j, 1))
                resumed = re.search(r"resumed at step (\d+)", job_log(client, j, 2))
                first = doc["attempts"][0]
                if not stopped or not resumed:
                    problems.append(f"{what}: victim {j} did not " + ("stop on the signal" if not stopped else
                                    "resume from a checkpoint (its second attempt started at step 0)"))
                    continue
                mine.append({"save_every_s": every, "job": j, "urgent": urgent, "delay_s": delay,
                             "stopped_at_step": int(stopped[1]), "resumed_at_step": int(resumed[1]),
                             "true_lost_s": (int(stopped[1]) - int(resumed[1])) * STEP_S,
                             "labq_lost_s": first["work_lost_s"], "ended": first["ended"],
                             "last_checkpoint_at": first["last_checkpoint_at"], "ended_at": first["ended_at"]})
            cancel_and_wait(client, events, victims, problems)
            say(f"  {what}: preempted {delay:.1f} s in, lost (labq / true) "
                + ", ".join(f"{r['labq_lost_s']:.2f}/{r['true_lost_s']:.2f} s" for r in mine if r["urgent"] == urgent))
        rows += mine
        if not mine:
            continue
        labq_lost, true_lost = [r["labq_lost_s"] for r in mine], [r["true_lost_s"] for r in mine]
        fig |= {f"save_{every}s_preemptions": len(mine),
                f"save_{every}s_labq_lost_median_s": statistics.median(labq_lost),
                f"save_{every}s_labq_lost_max_s": max(labq_lost),
                f"save_{every}s_true_lost_median_s": statistics.median(true_lost),
                f"save_{every}s_true_lost_max_s": max(true_lost)}
    if rows:
        excess = [r["labq_lost_s"] - r["true_lost_s"] for r in rows]
        fig |= {"labq_minus_true_lost_median_s": statistics.median(excess), "labq_minus_true_lost_max_s": max(excess)}
        fig["labq_lost_within_0.5s_of_true_share"] = sum(abs(r["labq_lost_s"] - r["true_lost_s"]) <= 0.5
                                                        for r in rows) / len(rows)
        ends = [r["ended"] for r in rows]
        fig["work_lost_victim_ends"] = ", ".join(f"{e} x{ends.count(e)}" for e in sorted(set(ends)))
    return fig, rows


def goals(fig: dict) -> list[tuple[str, str, float]]:
    found = [("overhead_median_ms", f"<= {OVERHEAD_GOAL_MS:g} ms", OVERHEAD_GOAL_MS)]
    for every in SAVE_EVERY:
        # the loop saves at the first step boundary N s after its last save: its saves are up to N + one step apart
        limit = every + STEP_S
        found += [(f"save_{every}s_{who}_lost_max_s", f"<= {limit:g} s", limit) for who in ("labq", "true")]
    return [g for g in found if g[0] in fig]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures and the raw samples as one JSON object")
    parser.add_argument("--keep", action="store_true", help="leave the temp folder (logs, data) in place")
    parser.add_argument("--samples", type=int, default=SAMPLES,
                        help=f"overhead samples (default {SAMPLES}); work-lost samples per N are half as many")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random preemption times (default 1)")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    began = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="labq-bench-preemption-"))
    fig: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "gpus": GPUS}
    raw: dict = {}
    ids: list[int] = []
    problems: list[str] = []
    lab = Lab(root)
    (root / "leader.toml").write_text(CONFIG)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("preemption benchmark: stopped by SIGTERM"))  # run the finally
    try:
        client = lab.start(GPUS)
        events = AllEvents(client)
        events.wait(None, "any", 10.0)  # the stream is connected
        say(f"urgent submit to running: {WARMUPS}+{args.samples} samples, 4 victims saving on the signal")
        part, raw["raw_overhead"] = bench_overhead(lab, client, events, ids, args.samples, problems)
        fig |= part
        lost_samples = max(1, args.samples // 2)
        say(f"work lost: {lost_samples} samples for each of save-every {', '.join(map(str, SAVE_EVERY))} s")
        part, raw["raw_work_lost"] = bench_work_lost(lab, client, events, ids, lost_samples,
                                                         random.Random(args.seed), problems)
        fig |= part
        say(f"cancelling the benchmark's {len(ids)} jobs")
        finish_all(client, ids, problems)
    except RuntimeError as err:  # a wait gave up: report what was measured so far
        problems.append(str(err))
    finally:
        lab.close()
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    fig["wall_s"] = time.perf_counter() - began
    fig["goals_met"] = {name: fig[name] <= limit for name, _, limit in goals(fig)}
    fig["problems"] = problems
    if args.json:
        print(json.dumps(fig | raw))
    else:
        targets = {name: (shown, fig[name] <= limit) for name, shown, limit in goals(fig)}
        print_figures(f"labq preemption benchmark (Python {fig['python']}, {fig['cpus']} CPUs, agent {fig['gpus']}, "
                      f"{fig['wall_s']:.0f} s)", fig, targets,
                      skip=("python", "cpus", "gpus", "goals_met", "wall_s", "problems"), digits=2)
    if problems:  # after the figures, which help to find the cause
        say("preemption benchmark: inconsistent:\n  " + "\n  ".join(problems))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
