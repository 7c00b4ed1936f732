"""The leader stopped (TERM) or killed (KILL) at random moments of its agent's long poll and of submit bursts.

Issue 13, part 1: an agent stopped syncing for good after its leader was stopped during a
long poll (its sync thread died on ``http.client.IncompleteRead``), so new jobs stayed
``starting`` forever. Here a process job and a container job run throughout; every round
the leader goes down at a random moment of the agent's long poll, half the rounds while
submits are arriving, and comes back on the same address. Every round the agent syncs
again within 2 s of the leader's return, a new job starts, and nothing is lost, stopped,
fenced or run twice.
"""

from __future__ import annotations

import secrets
import signal
import threading
import time

import pytest

from labq.client import Client
from tests.faults.invariants import (
    Ledger, LiveRunWatch, all_jobs, assert_at_most_one_live_run, assert_every_acked_job_present,
    assert_no_id_reused, assert_no_running_job_stopped_by_leader_restart, assert_nothing_fenced, live_runs,
)
from tests.faults.lab import LEADER_ROUNDS, FaultLab, leader_toml, seeded

LEASE_S = 3.0
POLL_S = LEASE_S / 2  #: an agent's quiet long poll: half the lease
RESYNC_WITHIN_S = 2.0  #: issue 13: the agent is back within 2 s of its leader
BURST_MAX = 12


class Burst:
    """Submits arriving while the leader goes down: a few at random gaps, from a thread of their own."""

    def __init__(self, ledger: Ledger, client: Client, rng, depends_on: int) -> None:
        self.ids: list[int] = []
        self._args = (ledger, client, rng.randint(2, BURST_MAX), [rng.uniform(0, 0.15) for _ in range(BURST_MAX)],
                      depends_on)
        self._thread = threading.Thread(target=self._run, name="submit-burst", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        ledger, client, n, gaps, depends_on = self._args
        for i in range(n):  # never to start: they wait for a job that runs for the whole test
            job_id = ledger.submit(client, ["true"], name=f"burst-{i}", depends_on=[depends_on])
            if job_id is not None:
                self.ids.append(job_id)
            time.sleep(gaps[i])

    def join(self) -> list[int]:
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "a submit burst hung"
        return self.ids


@pytest.mark.timeout(150 + 8 * LEADER_ROUNDS)
def test_agent_resyncs_and_nothing_is_lost_across_leader_restarts(tmp_path, docker_image, fault_counts):
    rng = seeded("leader restarts")
    lab = FaultLab(tmp_path, leader_toml(lease=LEASE_S, fence_after=30, requeue_after=60))
    node = f"ws-{secrets.token_hex(3)}"
    ledger = Ledger()
    resyncs: list[float] = []
    try:
        lab.start_leader()
        lab.start_agent(node)
        _, nobody = lab.client.add_user("nobody")  # containers never run as root
        as_nobody = Client(lab.url, nobody, timeout=10)
        running = [ledger.submit(lab.client, ["sh", "-c", "exec sleep 3600"], name="process-throughout"),
                   ledger.submit(as_nobody, ["sleep", "3600"], image=docker_image, name="container-throughout")]
        assert None not in running
        for job_id in running:
            lab.wait_state(job_id, "running", timeout=60)
        runs = lab.wait(lambda: (r := live_runs(tmp_path)) and all(len(r.get(j, ())) == 1 for j in running) and r,
                        "the running jobs' processes", 30, lambda: live_runs(tmp_path))
        before = {j: next(iter(runs[j])) for j in running}
        signals = [signal.SIGTERM, signal.SIGKILL] * (LEADER_ROUNDS // 2 + 1)
        rng.shuffle(signals)

        with LiveRunWatch(tmp_path, fault_counts) as watch:
            for n in range(LEADER_ROUNDS):
                sig = signals[n]
                where = f"round {n + 1} of {LEADER_ROUNDS} ({sig.name})"
                burst = Burst(ledger, lab.client, rng, running[0]) if rng.random() < 0.5 else None
                time.sleep(rng.uniform(0, POLL_S))  # somewhere in the agent's long poll (and the burst)
                code = lab.stop_leader(sig)
                fault_counts.faults_injected += 1
                assert sig != signal.SIGTERM or code == 0, f"{where}: the leader exited {code} on TERM"
                served_at = lab.start_leader()

                new = ledger.submit(lab.client, ["true"], name=f"after-restart-{n + 1}")
                assert new is not None, f"{where}: a submit to the restarted leader was refused"
                seen = lab.wait(lambda: (s := lab.node(node).get("last_seen", 0)) > served_at and s,
                                f"{where}: agent {node} to sync with the restarted leader", 10,
                                lambda: lab.log(f"agent-{node}.log"), every=0.02)
                resyncs.append(seen - served_at)
                assert seen - served_at <= RESYNC_WITHIN_S, (
                    f"{where}: agent {node} synced {seen - served_at:.2f} s after its leader came back "
                    f"(at most {RESYNC_WITHIN_S} s)\n{lab.log(f'agent-{node}.log')}")
                lab.wait_state(new, "running", "succeeded", timeout=10)
                assert lab.agents[node].poll() is None, f"{where}: the agent exited\n{lab.log(f'agent-{node}.log')}"

                jobs = all_jobs(lab.client, ledger)
                assert_every_acked_job_present(jobs, ledger, fault_counts)
                assert_no_id_reused(jobs, ledger, fault_counts)
                runs = assert_at_most_one_live_run(tmp_path, fault_counts)
                assert_no_running_job_stopped_by_leader_restart(jobs, before, runs)
                assert_nothing_fenced(jobs)
                for job_id in burst.join() if burst else ():  # out of the queue, into the history
                    lab.client.action(job_id, "cancel")
        watch.check()
        assert_every_acked_job_present(all_jobs(lab.client, ledger), ledger, fault_counts)
    finally:
        if resyncs:
            print(f"resync after the leader's return: max {max(resyncs):.2f} s, "
                  f"mean {sum(resyncs) / len(resyncs):.2f} s over {len(resyncs)} rounds")
        lab.close()
