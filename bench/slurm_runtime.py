"""Benchmark of a Slurm partition as a labq node (``labq agent --runtime slurm``), against Slurm itself.

What it measures, on a real one-node Slurm with 8 GRES GPUs (``tests/slurm_cluster.py``: slurmctld, slurmd and
munge of its own in a temp folder) and a real labq leader with two agents (one ``--runtime slurm`` on that
partition, one a simulated workstation ``sim:ws-4x3090``):

  * Submit to running: ``sbatch`` of a 1-GPU job to the moment its process starts (it writes the time first
    thing), against ``labq submit`` of the same job to the Slurm-backed node to the moment its process starts.
    Slurm starts batch jobs on a tick of its own (``batch_sched_delay``, 3 s by default), so one sample submits
    both together, the sbatch first: both wait for the same tick, and the difference is what labq adds (a sample
    whose labq job misses the tick its sbatch twin made counts in full). ``--samples`` of them, at random
    moments. Goal: labq adds at most 300 ms (the median of the differences).
  * Preemption overhead: a low job holding the node's GPUs that saves on SIGUSR1 (half a second: its own
    checkpoint time, from the signal to its exit) and a high job that needs them. The overhead is the high job's
    submit to its process start, less the low job's checkpoint time. On the Slurm-backed node and on the
    simulated workstation (a native node), ``--samples`` each. Goal: on the Slurm node within 500 ms. On the
    Slurm node labq hands the high job to Slurm with the low job's signal (``Node.hands_over``), and Slurm starts
    it once the low job has gone; when labq's sbatch of it came is printed too, from the agent's log, as the time
    after the low job's checkpoint (negative: before the low job had saved).
  * Slurm's own floor for the same hand-over, without labq, in the same run: a plain sbatch job like the low one,
    signalled with ``scancel --batch --signal=USR1`` (as Slurm's own preemption does before its GraceTime), and
    the high job either submitted with sbatch as soon as squeue no longer shows the low one running (``fresh``:
    what labq does) or already pending in Slurm behind it (``pending``: Slurm's own preemption, whose preemptor
    waits in Slurm's queue, as labq's does). The overhead is the signal to the high job's start, less the
    checkpoint time. ``beyond_slurm`` is labq's overhead on the Slurm node less Slurm's ``pending`` floor
    (medians).

Slurm 22.05 starts a waiting job the moment a node's epilog completes, and otherwise only on its scheduler's
tick (``batch_sched_delay``, 3 s by default). Its Slurm runs an Epilog (one that does nothing), as labq's README
asks of a site and its agent says at start where there is none; ``--no-epilog`` runs it without one, where every
Slurm figure here is that tick, with or without labq.

``--batch-sched-delay S`` runs Slurm with ``SchedulerParameters=batch_sched_delay=S`` (how long Slurm may put
off scheduling a newly submitted batch job; 3 s by default), as a site may tune it.

Timings are printed, never asserted. Without slurm-wlm the benchmark says so and exits 2.

Run:  .venv/bin/python bench/slurm_runtime.py [--samples 5] [--json] [--keep] [--batch-sched-delay S] [--no-epilog]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))  # tests.slurm_cluster: the Slurm the tests run

from figures import print_figures
from latency import Lab, say

ADDED_GOAL_S, PREEMPT_GOAL_S = 0.3, 0.5
CHECKPOINT_S = 0.5  #: the victim's own checkpoint time
VICTIM = ('trap \'date +%s.%N > {sig}; sleep ' + str(CHECKPOINT_S) + '; date +%s.%N > {saved}; exit 0\' USR1; '
          'while true; do sleep 0.05; done')


def wait_file(path: Path, timeout: float = 120.0) -> float:
    """The time a job wrote into ``path`` once it appears."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            text = ""
        if text:
            return float(text)
        time.sleep(0.005)
    raise RuntimeError(f"{path} was not written in {timeout:g} s")


def both_start(slurm, client, folder: Path, i: int) -> tuple[float, float]:
    """(sbatch's submit to start, labq's submit to start) of two alike jobs submitted together, the sbatch first."""
    mark, twin = folder / f"sbatch-{i}", folder / f"labq-{i}"
    script = folder / f"sbatch-{i}.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --partition={slurm.partition}\n#SBATCH --gres=gpu:1\n"
                      f"#SBATCH --output=/dev/null\ndate +%s.%N > {mark}\nsleep 1\n")
    began = time.time()
    slurm.run("sbatch", "--parsable", str(script))
    job = client.submit({"command": ["sh", "-c", f"date +%s.%N > {twin}; sleep 1"], "node": "slurm1", "gpus": 1})
    took = wait_file(mark) - began, wait_file(twin) - began
    wait_ended(client, job["id"])
    return took


def wait_ended(client, job_id: int, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job, _ = client.job(job_id)
        if job["state"] in ("succeeded", "failed", "cancelled", "timeout"):
            return job
        time.sleep(0.05)
    raise RuntimeError(f"job {job_id} did not end in {timeout:g} s")


def handed_to_slurm(lab, job_id: int) -> float:
    """When the Slurm node's agent ran sbatch for ``job_id`` (its log's "starting job N attempt 1" line)."""
    found = re.search(rf"^(\S+ \S+) labq\.agent INFO starting job {job_id} attempt 1 ", lab.log("agent-slurm1.log"),
                      re.MULTILINE)
    if found is None:
        raise RuntimeError(f"the Slurm node's agent did not log the start of job {job_id}")
    stamp, _, ms = found.group(1).partition(",")
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000


def preemption(client, folder: Path, node: str, gpus: int, i: int) -> tuple[float, float, int]:
    """(the high job's submit to start, the low job's checkpoint time, the high job's id) on ``node``."""
    sig, saved, start = (folder / f"{node}-{i}-{name}" for name in ("sig", "saved", "start"))
    low = client.submit({"command": ["sh", "-c", VICTIM.format(sig=sig, saved=saved)], "node": node, "gpus": gpus,
                         "priority": "low", "checkpoint_signal": "SIGUSR1", "grace_s": 5})
    deadline = time.monotonic() + 60
    while client.job(low["id"])[0]["state"] != "running":
        if time.monotonic() > deadline:
            raise RuntimeError(f"the low job on {node} did not start")
        time.sleep(0.05)
    time.sleep(0.5)
    began = time.time()
    high = client.submit({"command": ["sh", "-c", f"date +%s.%N > {start}"], "node": node, "gpus": gpus,
                          "priority": "high"})
    took = wait_file(start) - began
    checkpoint = wait_file(saved) - wait_file(sig)
    wait_ended(client, high["id"])
    client.action(low["id"], "cancel")
    wait_ended(client, low["id"])
    return took, checkpoint, high["id"], began


def slurm_alone(slurm, folder: Path, i: int, pending: bool) -> float:
    """Slurm's own hand-over, no labq: a low job on the node's 8 GPUs signalled to save, then a high job started
    there (``pending``: waiting in Slurm's queue already; else sbatch once the low job no longer runs). Returns the
    signal to the high job's start, less the low job's checkpoint time."""
    kind = "pending" if pending else "fresh"
    up, sig, saved, start = (folder / f"alone-{kind}-{i}-{name}" for name in ("up", "sig", "saved", "start"))
    node = slurm.host
    common = f"#SBATCH --partition={slurm.partition}\n#SBATCH --nodelist={node}\n#SBATCH --gres=gpu:8\n" \
             "#SBATCH --output=/dev/null\n"
    low_script, high_script = folder / f"alone-{kind}-{i}-low.sh", folder / f"alone-{kind}-{i}-high.sh"
    low_script.write_text(f"#!/bin/bash\n{common}date +%s.%N > {up}\n" + VICTIM.format(sig=sig, saved=saved) + "\n")
    high_script.write_text(f"#!/bin/bash\n{common}date +%s.%N > {start}\n")
    low = slurm.run("sbatch", "--parsable", str(low_script)).stdout.strip().split(";")[0]
    wait_file(up)
    time.sleep(0.5)
    if pending:
        slurm.run("sbatch", "--parsable", str(high_script))
        time.sleep(1.0)  # Slurm has looked at it: it waits for Resources
    began = time.time()
    slurm.run("scancel", "--batch", "--signal=USR1", low)
    if not pending:
        while "RUNNING" in slurm.run("squeue", "-h", "-j", low, "-o", "%T").stdout:  # labq's agent looks so
            time.sleep(0.01)
        slurm.run("sbatch", "--parsable", str(high_script))
    took = wait_file(start) - began
    return took - (wait_file(saved) - wait_file(sig))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (logs) for a look")
    parser.add_argument("--batch-sched-delay", type=float, metavar="S",
                        help="run Slurm with SchedulerParameters=batch_sched_delay=S (Slurm's default: 3)")
    parser.add_argument("--no-epilog", dest="epilog", action="store_false",
                        help="run Slurm without an Epilog (its Slurm has one that does nothing): Slurm then starts "
                             "a waiting job only on its scheduler's next tick, not when a node's epilog completes")
    args = parser.parse_args(argv)
    from tests.slurm_cluster import SlurmCluster, missing_tools

    if missing_tools():
        print(f"slurm-wlm is not installed here ({', '.join(missing_tools())} missing): nothing to compare against",
              file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="labq-bench-slurm-runtime-"))
    tuned = None if args.batch_sched_delay is None else f"batch_sched_delay={args.batch_sched_delay:g}"
    slurm = SlurmCluster(root / "slurm", scheduler_parameters=tuned, epilog=args.epilog)
    lab = Lab(root / "lab")
    marks = root / "marks"
    marks.mkdir()
    try:
        slurm.start()
        os.environ["SLURM_CONF"] = str(slurm.conf)  # the agents this process starts find that Slurm
        client = lab.start("sim:ws-4x3090")
        lab.spawn("agent-slurm1.log", "agent", "--leader", lab.url, "--runtime", "slurm", "--partition",
                  slurm.partition, "--name", "slurm1", "--data-dir", str(lab.data))
        lab.wait(lambda: any(n["name"] == "slurm1" and n["health"] == "up" for n in client.nodes()),
                 "the Slurm node to join")
        rng = random.Random(1)
        sbatch, labq = [], []
        for i in range(args.samples):
            time.sleep(rng.uniform(0.5, 3.5))  # a moment anywhere in Slurm's tick (the twins' second is over)
            a, b = both_start(slurm, client, marks, i)
            sbatch.append(a)
            labq.append(b)
        say(f"submit to start: sbatch {[round(x, 3) for x in sbatch]}, labq {[round(x, 3) for x in labq]}")
        over, labq_part = {}, []
        for node, gpus in (("slurm1", 8), ("ws1", 4)):
            runs = [preemption(client, marks, node, gpus, i) for i in range(args.samples)]
            say(f"preemption on {node}: {[(round(a, 3), round(b, 3)) for a, b, _, _ in runs]}")
            over[node] = [took - checkpoint for took, checkpoint, _, _ in runs]
            if node == "slurm1":  # when labq's sbatch of the high job came, after the low job's checkpoint
                labq_part = [handed_to_slurm(lab, job) - began - checkpoint for _, checkpoint, job, began in runs]
        alone = {kind: [slurm_alone(slurm, marks, i, kind == "pending") for i in range(args.samples)]
                 for kind in ("fresh", "pending")}
        say(f"Slurm alone: {({k: [round(x, 3) for x in v] for k, v in alone.items()})}")
    finally:
        lab.close()
        slurm.stop()
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    fig = {"python": sys.version.split()[0], "sbatch_to_start_median_s": statistics.median(sbatch),
           "labq_to_start_on_slurm_median_s": statistics.median(labq),
           "labq_added_s": statistics.median(b - a for a, b in zip(sbatch, labq)),
           "preemption_overhead_slurm_median_s": statistics.median(over["slurm1"]),
           "preemption_overhead_native_median_s": statistics.median(over["ws1"]),
           "preemption_overhead_slurm_to_sbatch_median_s": statistics.median(labq_part),
           "slurm_alone_fresh_overhead_median_s": statistics.median(alone["fresh"]),
           "slurm_alone_pending_overhead_median_s": statistics.median(alone["pending"]),
           "batch_sched_delay": args.batch_sched_delay if args.batch_sched_delay is not None else "default (3)",
           "epilog": args.epilog}
    fig["preemption_overhead_beyond_slurm_s"] = (fig["preemption_overhead_slurm_median_s"]
                                                 - fig["slurm_alone_pending_overhead_median_s"])
    targets = {"labq_added_s": (f"<= {ADDED_GOAL_S:g} s", fig["labq_added_s"] <= ADDED_GOAL_S),
               "preemption_overhead_slurm_median_s": (f"<= {PREEMPT_GOAL_S:g} s",
                                                      fig["preemption_overhead_slurm_median_s"] <= PREEMPT_GOAL_S),
               "preemption_overhead_beyond_slurm_s": (f"<= {PREEMPT_GOAL_S:g} s (labq's part)",
                                                      fig["preemption_overhead_beyond_slurm_s"] <= PREEMPT_GOAL_S)}
    fig["goals_met"] = {name: met for name, (_, met) in targets.items()}
    if args.json:
        print(json.dumps(fig))
    else:
        print_figures(f"labq on a Slurm partition (Python {fig['python']}, {args.samples} samples)", fig, targets,
                      skip=("python", "goals_met", "batch_sched_delay", "epilog"))
        print(f"Slurm's SchedulerParameters batch_sched_delay: {fig['batch_sched_delay']}; "
              f"Epilog: {'yes' if args.epilog else 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
