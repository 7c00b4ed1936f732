"""An agent killed (SIGKILL) in the middle of a preemption's grace, then started again.

Two low-class jobs fill a node, a process and a container, each ignoring its checkpoint
signal. An urgent job needs both GPUs: the victims get their signal, and at a random
moment of their grace the agent is killed and started again. The grace is the first
agent's, not a new one; each victim is signalled once, stopped after its grace, requeued
and run again; the urgent job starts only once both have stopped; and no job runs twice.
"""

from __future__ import annotations

import secrets
import signal
import time

import pytest

from labq.client import Client
from tests.faults.invariants import (
    Ledger, LiveRunWatch, all_jobs, assert_at_most_one_live_run, assert_every_acked_job_present, assert_no_id_reused,
    assert_nothing_fenced,
)
from tests.faults.lab import FaultLab, leader_toml, seeded, soak

GRACE_S = 3.0
ROUNDS = soak(3)
IGNORES_SIGNAL = "trap 'echo GOT' USR1; echo ready; while true; do sleep 0.1; done"


def log(lab: FaultLab, job_id: int, attempt: int) -> str:
    try:
        return lab.client.logs(job_id, attempt)[0].decode(errors="replace")
    except Exception:  # noqa: BLE001 - the node is restarting: nothing yet
        return ""


@pytest.mark.timeout(60 + 45 * ROUNDS)
def test_an_agent_killed_mid_grace_stops_its_victims_once_and_runs_nothing_twice(tmp_path, docker_image,
                                                                                    fault_counts):
    rng = seeded("agent kill mid-grace")
    lab = FaultLab(tmp_path, leader_toml(lease=3, fence_after=30, requeue_after=60, max_grace=10))
    node = f"ws-{secrets.token_hex(3)}"
    ledger = Ledger()
    try:
        lab.start_leader()
        lab.start_agent(node, "sim:flat:2")
        _, nobody = lab.client.add_user("nobody")  # containers never run as root
        as_nobody = Client(lab.url, nobody, timeout=10)
        with LiveRunWatch(tmp_path, fault_counts) as watch:
            for n in range(ROUNDS):
                where = f"round {n + 1} of {ROUNDS}"
                victims = [ledger.submit(lab.client, ["sh", "-c", IGNORES_SIGNAL], priority="low", grace_s=GRACE_S,
                                         checkpoint_signal="SIGUSR1"),
                           ledger.submit(as_nobody, ["sh", "-c", IGNORES_SIGNAL], image=docker_image, priority="low",
                                         grace_s=GRACE_S, checkpoint_signal="SIGUSR1")]
                assert None not in victims
                for job_id in victims:
                    lab.wait_state(job_id, "running", timeout=60)
                lab.wait(lambda: all("ready" in log(lab, j, 1) for j in victims), f"{where}: the traps to be set")
                urgent = ledger.submit(lab.client, ["sleep", "1"], gpus=2, priority="urgent")
                lab.wait(lambda: all("GOT" in log(lab, j, 1) for j in victims), f"{where}: the checkpoint signals")

                time.sleep(rng.uniform(0, GRACE_S * 0.8))  # somewhere in the grace
                lab.kill(lab.agents[node], signal.SIGKILL)
                fault_counts.faults_injected += 1
                time.sleep(rng.uniform(0, 0.5))
                lab.restart_agent(node)

                done = lab.wait_state(urgent, "succeeded", timeout=60)
                for job_id in victims:
                    first = lab.job(job_id)["attempts"][0]
                    assert (first["ended"], first["stop_reason"]) == ("killed", "preempted"), (where, first)
                    assert first["ended_at"] - first["started_at"] >= GRACE_S, (
                        f"{where}: job {job_id} stopped before its grace was over: {first}")
                    assert done["started_at"] >= first["ended_at"], (
                        f"{where}: urgent job {urgent} started at {done['started_at']:.2f} on GPUs job {job_id} "
                        f"held until {first['ended_at']:.2f}")
                    assert log(lab, job_id, 1).count("GOT") == 1, f"{where}: job {job_id} signalled again"
                    lab.wait(lambda j=job_id: lab.job(j)["state"] == "running" and lab.job(j)["attempt"] == 2,
                             f"{where}: job {job_id} to run again", 60)

                jobs = all_jobs(lab.client, ledger)
                assert_every_acked_job_present(jobs, ledger, fault_counts)
                assert_no_id_reused(jobs, ledger, fault_counts)
                assert_at_most_one_live_run(tmp_path, fault_counts)
                assert_nothing_fenced(jobs)
                for job_id in victims:
                    lab.client.action(job_id, "cancel")
                for job_id in victims:
                    lab.wait_state(job_id, "cancelled", timeout=30)
        watch.check()
    finally:
        lab.close()
