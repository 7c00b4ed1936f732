"""``labq demo``: a self-contained tour of labq on simulated GPUs. Runs anywhere, leaves nothing behind.

It starts a leader and an agent for a simulated workstation (four RTX 3090s in
two NVLink pairs) in a temporary folder, adds two lab users with tokens of their
own, submits a few jobs as each, and narrates what the queue does: best-connected
placement, a waiting job and why, a preemption, logs, and small jobs sharing a GPU
by memory. The jobs are tiny shell loops that run as the account running the demo,
whichever lab user submits them.
It takes about 20 seconds, and says at the end how long it took.

It ends in order: the agent first, waiting for its threads to end (a short lease
keeps its long poll short), then any job still running, then the leader, then the
folder; so no thread of the agent looks at a folder that is gone.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from labq.agent.daemon import Agent, AgentConfig
from labq.agent.inventory import open_inventory
from labq.agent.process_runtime import AttemptState
from labq.client import Client
from labq.leader.config import LeaderConfig
from labq.leader.main import RunningLeader, join_token_path, start_leader
from labq.render.job_detail import why_text
from labq.render.jobs import jobs_table
from labq.render.nodes import gpu_rows, gpus_table

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


PEOPLE = ("ada", "grace")  #: the tour's two lab users: ada, and grace, an admin (who may submit urgent jobs)
LEASE_S = 3.0  #: the agent's long poll lasts half a lease: short, so that stopping it is quick
JOBS_END_S = 5.0  #: how long the end waits for a killed job's exit to be written


def run_demo(keep: bool = False) -> int:
    started = time.monotonic()
    folder = Path(tempfile.mkdtemp(prefix="labq-demo-"))
    # the tour's jobs run as whoever runs it (as root only because root asked for the tour), for both lab users
    config = replace(LeaderConfig(data_dir=folder / "leader", port=0), min_runtime_s=0.0, default_grace_s=2.0,
                     allow_root=os.geteuid() == 0, lease_s=LEASE_S)
    running, token = start_leader(config, first_admin=getpass.getuser())
    agent = None
    try:
        agent = Agent(AgentConfig(running.url, join_token_path(config).read_text().strip(), "ws1", folder / "agent",
                                  run_as_job_user=False), open_inventory("sim:ws-4x3090", "ws1"))
        agent.register()
        agent.start()
        admin = Client(running.url, token)
        people = {name: Client(running.url, admin.add_user(name, admin=name == PEOPLE[1])[1]) for name in PEOPLE}
        _tour(admin, people, running.url, folder)
        _say(f"\nThat was labq; the tour took {time.monotonic() - started:.0f} s. To run it for real on this "
             "machine: labq up (or labq up --gpus sim:dgx1).")
        return 0
    finally:
        _take_down(agent, running, folder, keep)


def _take_down(agent: Agent | None, running: RunningLeader, folder: Path, keep: bool) -> None:
    """The agent first, waiting until its threads have ended; then the jobs, which must not outlive the demo;
    then the leader; then the folder, which nothing running looks at any more."""
    if agent is not None:
        agent.stop()
        for thread in agent.workers.threads:  # a sync in its long poll comes back within half a lease
            thread.join(LEASE_S + 5.0)
        _end_jobs(agent)
    running.stop()
    if keep:
        print(f"(kept {folder})", file=sys.stderr)
    else:
        shutil.rmtree(folder, ignore_errors=True)


def _end_jobs(agent: Agent) -> None:
    """Kill the jobs still running (only a demo cut short has any) and wait until their shims have written
    their exits, so that neither a job nor its shim is left behind."""
    for status in agent.runtime.attempts():
        if status.state is AttemptState.RUNNING:
            agent.runtime.signal(status.job_id, status.attempt, signal.SIGKILL)
    deadline = time.monotonic() + JOBS_END_S
    while (any(s.state is AttemptState.RUNNING for s in agent.runtime.attempts())
           and time.monotonic() < deadline):
        time.sleep(0.05)


def _tour(admin: Client, people: dict[str, Client], url: str, folder: Path) -> None:
    """The narrated part: who submits what, and what labq does about it."""
    ada, grace = (people[name] for name in PEOPLE)
    _say("A lab of one simulated workstation, ws1: four RTX 3090s, NVLink pairs 0+1 and 2+3.")
    _say(f"The leader serves {url}; everything lives in {folder}.")
    _say(f"Two lab users, {PEOPLE[0]} and {PEOPLE[1]} (an admin), each with a token of their own (labq admin user "
         f"add); their jobs run as {getpass.getuser()}, the account running this tour.\n")

    _say(f"1. Both submit. {PEOPLE[0]}'s 2-GPU job gets an NVLink pair; {PEOPLE[1]}'s 1-GPU job leaves the other "
         "pair whole.")
    pair = ada.submit({"command": _train(8), "gpus": 2, "name": "bert"})
    single = grace.submit({"command": _train(6), "gpus": 1, "name": "probe"})
    for job in (pair, single):
        _wait(admin, job["id"], {"running"})
    _ls(admin)

    _say(f"2. A low-priority job of {PEOPLE[0]}'s takes the last GPU: the workstation is full.")
    filler = ada.submit({"command": _train(12), "gpus": 1, "name": "filler", "priority": "low"})
    _wait(admin, filler["id"], {"running"})
    _say(f"   {PEOPLE[1]}'s 4-GPU job cannot start now; labq says why, and holds the GPUs it will get.")
    wide = grace.submit({"command": _train(3), "gpus": 4, "name": "sweep", "priority": "low"})
    time.sleep(1.0)
    job, pending = admin.job(wide["id"])
    _say(f"   labq why {wide['id']}: {why_text(job, pending, time.time())}\n")
    _preempt_and_finish(admin, grace, [pair, single, wide, filler])


def _train(steps: int) -> list[str]:
    return [*TRAIN[:2], TRAIN[2].format(steps=steps)]


def _preempt_and_finish(admin: Client, urgent_user: Client, jobs: list[dict]) -> None:
    pair, single, wide, filler = jobs
    _say(f"3. {PEOPLE[1]}, an admin and so allowed the urgent class, submits an urgent 1-GPU job: labq signals")
    _say("   the cheapest lower-priority job to checkpoint, requeues it as the same job, and starts the urgent one")
    _say("   on the GPU it freed.")
    urgent = urgent_user.submit({"command": ["sh", "-c", "echo deadline work; sleep 2"], "gpus": 1,
                                 "name": "hotfix", "priority": "urgent"})
    _wait(admin, urgent["id"], {"running", "succeeded"})
    after, _ = admin.job(filler["id"])
    _say(f"   job {filler['id']} ({after['spec']['name']}) is {after['state']}, attempt {after['attempt']}, "
         f"preempted {after['preemptions']} time(s)\n")
    _ls(admin)

    _say("4. Everything runs to the end; finished jobs stay in the history.")
    for job in (pair, single, wide, filler, urgent):
        _wait(admin, job["id"], {"succeeded", "failed", "cancelled"}, timeout=120)
    _ls(admin)
    data, _, _ = admin.logs(pair["id"])
    _say(f"labq logs {pair['id']} (last lines):")
    for line in data.decode().splitlines()[-3:]:
        _say(f"   {line}")
    _say()
    _share(admin, urgent_user)


#: a small job that saves and exits 0 on SIGUSR1 (its checkpoint signal), using the simulated GPU memory it is given
EVAL = 'trap "echo saved; exit 0" USR1; i=0; while [ $i -lt {steps} ]; do i=$((i+1)); sleep 0.5; done'


def _share(admin: Client, user: Client) -> None:
    """Sharing one GPU by memory, and the watch that stops only the job using more than it declared."""
    _say("5. Small jobs share a GPU by memory (labq submit --share --gpu-mem 8G). Two evaluations that declare 8 GiB")
    _say("   each go on one GPU together. One of them grows to 12 GiB a second in (its simulated GPU memory): the")
    _say("   agent sees it through NVML, and labq stops that job, and only that job, through its checkpoint")
    _say("   signal, and requeues it to run with what it used. Its neighbour runs on.")
    common = {"gpus": 1, "share_mib": 8192, "checkpoint_signal": "SIGUSR1"}
    steady = user.submit({**common, "name": "eval-a", "env": {"SIM_GPU_MEM": "6G"},
                          "command": ["sh", "-c", EVAL.format(steps=16)]})
    grows = user.submit({**common, "name": "eval-b", "env": {"SIM_GPU_MEM": "4G"},
                         # a second in, it becomes a process that uses 12 GiB ($0: the loop, as sh -c's name)
                         "command": ["sh", "-c", 'sleep 1; exec env SIM_GPU_MEM=12G sh -c "$0"',
                                     EVAL.format(steps=8)]})
    for job in (steady, grows):
        _wait(admin, job["id"], {"running"})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        job, _ = admin.job(grows["id"])
        if job["attempt"] > 1 and job["state"] == "running":
            break
        time.sleep(0.2)
    _say(f"   labq show {grows['id']}: {job['note']}")
    neighbour, _ = admin.job(steady["id"])
    _say(f"   job {steady['id']} ({neighbour['spec']['name']}) is {neighbour['state']}, attempt {neighbour['attempt']}."
         " labq gpus:")
    _say(gpus_table([r for r in gpu_rows(admin.nodes(), {}) if r["sharing"]]))
    _say()
    for job in (steady, grows):
        _wait(admin, job["id"], {"succeeded", "failed", "cancelled"}, timeout=60)
