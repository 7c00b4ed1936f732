"""An agent's network namespace cut off from its leader: first past the lease, then past requeue_after.

Three hosts are network namespaces on one bridge (tests/discovery/netns.py): the leader,
agent A that runs two jobs, and agent B with room for them. Each round A's link goes down:

1. for longer than the lease and shorter than ``fence_after``: the leader marks A lost once
   its lease has run out (counted from A's last sync, not from anything the leader held
   open), requeues nothing, and A's jobs run on untouched when the link is back;
2. for longer than ``requeue_after``: A's jobs stop on A (fenced), the leader requeues them
   only after ``requeue_after`` and they run on B, and when A returns nothing of the old
   attempts runs anywhere. No job has two live runs at any look.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.discovery.netns import NetLab, netlab
from tests.faults.invariants import (
    Ledger, LiveRunWatch, all_jobs, assert_at_most_one_live_run, assert_every_acked_job_present,
    assert_lease_not_renewed_while_partitioned, assert_lost_node_requeued_only_after_requeue_after,
    assert_no_id_reused, assert_node_lost_after_lease, assert_nothing_fenced, assert_runs_unchanged,
    assert_stale_run_stopped_on_return, live_runs,
)
from tests.conftest import unavailable
from tests.faults.lab import FaultLab, leader_toml, soak

LEASE_S, FENCE_S, REQUEUE_S, GRACE_S = 4.0, 14.0, 34.0, 2.0  #: requeue_after past the last stop (33 s)
SHORT_S = LEASE_S + 2.0  #: past the lease; with a long poll and a reconnect still well inside fence_after
LOST_SLACK_S = 2.0  #: the leader's timers tick every second; the test looks every 0.1 s
SAVES_ON_SIGNAL = "trap 'exit 0' USR1; echo ready; while true; do sleep 0.1; done"
ROUNDS = soak(1)


@pytest.fixture
def lan(netns_root) -> Iterator:
    with ExitStack() as stack:
        def build(n: int) -> NetLab:
            try:
                return stack.enter_context(netlab(n))
            except pytest.skip.Exception as err:
                unavailable("this fault test's real parts", str(err))
        yield build


class Watcher:
    """Looks at the cut-off node through the leader every 0.1 s: its last sync and when it was marked lost."""

    def __init__(self, lab: FaultLab, node: str) -> None:
        self.lab, self.node = lab, node
        self.last_seen = 0.0
        self.lost_at: float | None = None

    def look(self) -> dict:
        node = self.lab.node(self.node)
        self.last_seen = max(self.last_seen, node.get("last_seen", 0.0))
        if node.get("health") == "lost" and self.lost_at is None:
            self.lost_at = time.time()
        return node


@pytest.mark.timeout(90 + 90 * ROUNDS)
def test_a_cut_off_agent_is_lost_after_its_lease_and_its_jobs_requeued_only_after_requeue_after(
        tmp_path, lan, fault_counts):
    net = lan(3)
    lab = FaultLab(tmp_path, leader_toml(lease=LEASE_S, fence_after=FENCE_S, requeue_after=REQUEUE_S,
                                         max_grace=GRACE_S, default_grace=GRACE_S, listen="0.0.0.0:7733"),
                   leader_netns=net.hosts[0])
    leader_url = f"https://{net.addr(0)}:7733"  # other machines reach it: TLS, pinned by the join token
    tag = secrets.token_hex(3)
    ledger = Ledger()
    cut_off, other, host = f"a-{tag}", f"b-{tag}", net.hosts[1]
    try:
        lab.start_leader()
        lab.start_agent(cut_off, "sim:flat:2", netns=host, leader_url=leader_url)
        lab.start_agent(other, "sim:flat:2", netns=net.hosts[2], leader_url=leader_url)
        for n in range(ROUNDS):
            where = f"round {n + 1} of {ROUNDS}"
            filler = ledger.submit(lab.client, ["sleep", "3600"], gpus=2, node=other)  # so that A gets the jobs
            lab.wait_state(filler, "running")
            jobs = [ledger.submit(lab.client, ["sh", "-c", SAVES_ON_SIGNAL], name=f"round-{n + 1}",
                                  checkpoint_signal="SIGUSR1") for _ in range(2)]
            for job_id in jobs:
                assert lab.wait_state(job_id, "running")["placement"]["allocations"][0]["node"] == cut_off
            lab.client.action(filler, "cancel")  # B has room for them now
            lab.wait_state(filler, "cancelled")
            runs = lab.wait(lambda: (r := live_runs(tmp_path)) and all(len(r.get(j, ())) == 1 for j in jobs) and r,
                            "the jobs' processes", 30)
            before = {j: next(iter(runs[j])) for j in jobs}

            with LiveRunWatch(tmp_path, fault_counts) as watch:
                # 1. past the lease, short of fence_after
                watcher = Watcher(lab, cut_off)
                cut_at = time.time()
                net.set_link(host, up=False)
                fault_counts.faults_injected += 1
                while time.time() < cut_at + SHORT_S:
                    watcher.look()
                    time.sleep(0.1)
                assert_lease_not_renewed_while_partitioned(watcher.last_seen, cut_at)
                if watcher.lost_at is not None:
                    print(f"{where}: lost {watcher.lost_at - watcher.last_seen:.2f} s after its last sync "
                          f"(lease {LEASE_S:g} s)")
                assert_node_lost_after_lease(watcher.lost_at, watcher.last_seen, LEASE_S, LOST_SLACK_S, time.time())
                assert_runs_unchanged(all_jobs(lab.client), before, live_runs(tmp_path),
                                      "a partition shorter than fence_after")
                net.set_link(host, up=True)
                lab.wait(lambda: watcher.look().get("health") == "up", f"{where}: {cut_off} to come back", 30)
                print(f"{where}: back {time.time() - cut_at - SHORT_S:.2f} s after its link")
                listed = all_jobs(lab.client)
                assert_runs_unchanged(listed, before, live_runs(tmp_path), "a partition shorter than fence_after")
                assert_nothing_fenced(listed, set(jobs))

                # 2. past requeue_after
                watcher = Watcher(lab, cut_off)
                cut_at = time.time()
                net.set_link(host, up=False)
                fault_counts.faults_injected += 1

                def moved() -> bool:
                    watcher.look()
                    now = {j["id"]: j for j in lab.client.jobs(all=True) if j["id"] in jobs}
                    return all(now[j]["state"] == "running" and now[j]["attempt"] == 2 for j in jobs)

                lab.wait(moved, f"{where}: {cut_off}'s jobs to be requeued and run on {other}", REQUEUE_S + 20,
                         lambda: lab.log(f"agent-{cut_off}.log"))
                assert_lease_not_renewed_while_partitioned(watcher.last_seen, cut_at)
                for job_id in jobs:
                    job = lab.job(job_id)
                    print(f"{where}: job {job_id} requeued {job['attempts'][0]['ended_at'] - watcher.last_seen:.2f} s "
                          f"after its node's last sync (requeue_after {REQUEUE_S:g} s)")
                    assert_lost_node_requeued_only_after_requeue_after(job, 1, watcher.last_seen, REQUEUE_S)
                    assert [a["node"] for a in job["placement"]["allocations"]] == [other], job["placement"]
                net.set_link(host, up=True)
                up_at = time.time()
                lab.wait(lambda: watcher.look().get("health") == "up", f"{where}: {cut_off} to come back", 45,
                         lambda: lab.log(f"agent-{cut_off}.log"))
                print(f"{where}: back {time.time() - up_at:.2f} s after its link")
                for job_id in jobs:
                    assert_stale_run_stopped_on_return(tmp_path, job_id, 1)
                runs = assert_at_most_one_live_run(tmp_path, fault_counts)
                assert all({r.attempt for r in runs.get(j, ())} == {2} for j in jobs), runs
            watch.check()

            listed = all_jobs(lab.client, ledger)
            assert_every_acked_job_present(listed, ledger, fault_counts)
            assert_no_id_reused(listed, ledger, fault_counts)
            for job_id in jobs:
                lab.client.action(job_id, "cancel")
            for job_id in jobs:
                lab.wait_state(job_id, "cancelled")
    finally:
        lab.close()
