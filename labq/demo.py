"""``labq demo``: a self-contained tour of labq on simulated GPUs. Runs anywhere, leaves nothing behind.

It starts a leader and an agent for a simulated workstation (four RTX 3090s in
two NVLink pairs) in a temporary folder, submits a few jobs as the person
running it, and narrates what the queue does: best-connected placement, a
waiting job and why, a preemption, logs. The jobs are tiny shell loops.
"""

from __future__ import annotations

import getpass
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from labq.agent.daemon import Agent, AgentConfig
from labq.agent.inventory import open_inventory
from labq.client import Client
from labq.leader.config import LeaderConfig
from labq.leader.main import join_token_path, start_leader
from labq.render import jobs_table, why_text

TRAIN = ("sh", "-c", 'i=0; while [ $i -lt {steps} ]; do i=$((i+1)); echo "step $i on GPUs $CUDA_VISIBLE_DEVICES"; '
         "sleep 0.5; done")


def _say(text: str = "") -> None:
    print(text, flush=True)


def _wait(client: Client, job_id: int, states: set[str], timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job, _ = client.job(job_id)
        if job["state"] in states or time.monotonic() > deadline:
            return job
        time.sleep(0.1)


def _ls(client: Client) -> None:
    _say(jobs_table(client.jobs(all=True, history=True), time.time()))
    _say()


def run_demo(keep: bool = False) -> int:
    folder = Path(tempfile.mkdtemp(prefix="labq-demo-"))
    user = getpass.getuser()
    # the tour's jobs run as whoever runs it: as root only because root asked for the tour
    config = replace(LeaderConfig(data_dir=folder / "leader", port=0), min_runtime_s=0.0, default_grace_s=2.0,
                     allow_root=os.geteuid() == 0)
    running, token = start_leader(config, first_admin=user)
    agent = None
    try:
        agent = Agent(AgentConfig(running.url, join_token_path(config).read_text().strip(), "ws1", folder / "agent"),
                      open_inventory("sim:ws-4x3090", "ws1"))
        agent.register()
        agent.start()
        _tour(Client(running.url, token), running.url, folder)
        return 0
    finally:
        if agent is not None:
            agent.stop()
        running.stop()
        if agent is not None:  # the demo's jobs must not outlive it
            for status in agent.runtime.attempts():
                agent.runtime.stop(status.job_id, status.attempt, 0.1)
        if keep:
            print(f"(kept {folder})", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)


def _tour(client: Client, url: str, folder: Path) -> None:
    """The narrated part: who submits what, and what labq does about it."""
    _say("A lab of one simulated workstation, ws1: four RTX 3090s, NVLink pairs 0+1 and 2+3.")
    _say(f"The leader serves {url}; everything lives in {folder}.\n")

    _say("1. Two people submit. A 2-GPU job gets an NVLink pair; a 1-GPU job leaves the other pair whole.")
    pair = client.submit({"command": list(TRAIN[:2]) + [TRAIN[2].format(steps=8)], "gpus": 2, "name": "bert"})
    single = client.submit({"command": list(TRAIN[:2]) + [TRAIN[2].format(steps=6)], "gpus": 1, "name": "probe"})
    for job in (pair, single):
        _wait(client, job["id"], {"running"})
    _ls(client)

    _say("2. A low-priority job takes the last GPU: the workstation is full.")
    filler = client.submit({"command": list(TRAIN[:2]) + [TRAIN[2].format(steps=12)], "gpus": 1,
                            "name": "filler", "priority": "low"})
    _wait(client, filler["id"], {"running"})
    _say("   A 4-GPU job cannot start now; labq says why, and holds the GPUs it will get.")
    wide = client.submit({"command": list(TRAIN[:2]) + [TRAIN[2].format(steps=3)], "gpus": 4,
                          "name": "sweep", "priority": "low"})
    time.sleep(1.0)
    job, pending = client.job(wide["id"])
    _say(f"   labq why {wide['id']}: {why_text(job, pending, time.time())}\n")
    _preempt_and_finish(client, [pair, single, wide, filler])


def _preempt_and_finish(client: Client, jobs: list[dict]) -> None:
    pair, single, wide, filler = jobs
    _say("3. An urgent 1-GPU job arrives: labq signals the cheapest lower-priority job to checkpoint,")
    _say("   requeues it as the same job, and starts the urgent one on the GPU it freed.")
    urgent = client.submit({"command": ["sh", "-c", "echo deadline work; sleep 2"], "gpus": 1,
                            "name": "hotfix", "priority": "urgent"})
    _wait(client, urgent["id"], {"running", "succeeded"})
    after, _ = client.job(filler["id"])
    _say(f"   job {filler['id']} ({after['spec']['name']}) is {after['state']}, attempt {after['attempt']}, "
         f"preempted {after['preemptions']} time(s)\n")
    _ls(client)

    _say("4. Everything runs to the end; finished jobs stay in the history.")
    for job in (pair, single, wide, filler, urgent):
        _wait(client, job["id"], {"succeeded", "failed", "cancelled"}, timeout=120)
    _ls(client)
    data, _, _ = client.logs(pair["id"])
    _say(f"labq logs {pair['id']} (last lines):")
    for line in data.decode().splitlines()[-3:]:
        _say(f"   {line}")
    _say("\nThat was labq. To run it for real on this machine: labq up (or labq up --gpus sim:dgx1).")
