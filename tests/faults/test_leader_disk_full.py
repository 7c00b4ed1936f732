"""The leader's disk fills up while jobs run and submits arrive; then the leader is stopped or killed.

The leader's data folder is a 2 MiB tmpfs of the test's own. Each round fills it to the
brim: once the journal's last page is full too, submits are refused with an error and leave no job behind, the leader keeps
answering, a job that ends meanwhile is recorded once there is room, and nothing
running is stopped. With room again, a submit burst is cut by a TERM or a KILL of the
leader, which comes back with every acknowledged job and no id handed out twice.
"""

from __future__ import annotations

import errno
import secrets
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.faults.invariants import (
    Ledger, LiveRunWatch, all_jobs, assert_at_most_one_live_run, assert_every_acked_job_present,
    assert_no_id_reused, assert_no_running_job_stopped_by_leader_restart, assert_nothing_fenced,
    assert_refused_submits_absent, assert_runs_unchanged, live_runs,
)
from tests.faults.lab import FaultLab, leader_toml, seeded, soak

ROUNDS = soak(3)


def fill(disk: Path) -> Path:
    """Write a ballast file until the disk refuses another byte."""
    ballast = disk / "ballast"
    with open(ballast, "ab", buffering=0) as f:
        for size in (1 << 16, 4096, 512, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as err:
                assert err.errno == errno.ENOSPC, err
    return ballast


@pytest.mark.timeout(60 + 30 * ROUNDS)
def test_a_full_disk_refuses_changes_and_loses_nothing_acknowledged(tmp_path, small_disk, fault_counts):
    rng = seeded("disk full")
    lab = FaultLab(tmp_path, leader_toml(lease=3, fence_after=30, requeue_after=60))
    lab.data = small_disk / "data"  # the leader's database; the agent keeps its state on the big disk
    node = f"ws-{secrets.token_hex(3)}"
    ledger = Ledger()
    try:
        lab.start_leader()
        lab.start_agent(node, "sim:flat:2")
        throughout = ledger.submit(lab.client, ["sh", "-c", "exec sleep 3600"], name="throughout")
        lab.wait_state(throughout, "running")
        runs = lab.wait(lambda: len((r := live_runs(tmp_path)).get(throughout, ())) == 1 and r, "its process", 30)
        before = {throughout: next(iter(runs[throughout]))}
        with LiveRunWatch(tmp_path, fault_counts) as watch:
            for n in range(ROUNDS):
                where = f"round {n + 1} of {ROUNDS}"
                ends_meanwhile = ledger.submit(lab.client, ["sleep", "1"], name=f"ends-while-full-{n + 1}")
                lab.wait_state(ends_meanwhile, "running")
                ballast = fill(small_disk)
                fault_counts.faults_injected += 1
                # the journal's last page may still have room for a record or two: such a submit is on disk, and
                # is acknowledged (and checked below like any); once that room is gone, every submit is refused
                for slack in range(64):
                    if ledger.submit(lab.client, ["true"], name=f"on-the-last-page-{slack}") is None:
                        break
                else:
                    raise AssertionError(f"{where}: 64 submits were acknowledged on a full disk")
                refused_before = len(ledger.refused)
                for i in range(5):
                    assert ledger.submit(lab.client, ["true"], name=f"while-full-{i}") is None, (
                        f"{where}: a submit was acknowledged on a full disk")
                assert len(ledger.refused) - refused_before == 5, f"{where}: a submit got no answer on a full disk"
                time.sleep(1.5)  # the short job ends; its end cannot be saved yet
                jobs = all_jobs(lab.client)  # the leader still answers
                assert_refused_submits_absent(jobs, ledger)
                assert_runs_unchanged(jobs, before, live_runs(tmp_path), "a full disk")
                ballast.unlink()
                assert lab.wait_state(ends_meanwhile, "succeeded", "failed", timeout=30)["exit_code"] == 0

                sig = (signal.SIGTERM, signal.SIGKILL)[n % 2]
                burst = threading.Thread(target=lambda: [ledger.submit(lab.client, ["true"], name="burst",
                                                                       depends_on=[throughout]) for _ in range(8)])
                burst.start()
                time.sleep(rng.uniform(0, 0.2))
                lab.stop_leader(sig)
                fault_counts.faults_injected += 1
                burst.join(timeout=60)
                lab.start_leader()
                lab.wait(lambda: lab.node(node).get("last_seen", 0) > lab.served_at, f"{where}: the agent to sync")

                jobs = all_jobs(lab.client, ledger)
                assert_every_acked_job_present(jobs, ledger, fault_counts)
                assert_refused_submits_absent(jobs, ledger)
                assert_no_id_reused(jobs, ledger, fault_counts)
                runs = assert_at_most_one_live_run(tmp_path, fault_counts)
                assert_no_running_job_stopped_by_leader_restart(jobs, before, runs)
                assert_nothing_fenced(jobs)
                ended = next(j for j in jobs if j["id"] == ends_meanwhile)
                assert (ended["state"], ended["exit_code"]) == ("succeeded", 0), f"{where}: {ended}"
                assert ledger.submit(lab.client, ["true"], name=f"after-{n + 1}") is not None, where
        watch.check()
    finally:
        lab.close()
