"""A Slurm partition of two nodes as two labq nodes, served by one agent: ``labq agent --runtime slurm --partition
gpu`` with no ``--slurm-node`` registers each Slurm node as a labq node of its name. Real leader, a real two-node
Slurm (two slurmd of their own, ``tests/slurm_cluster.py``): a job runs on each node, a job spread over both
runs as one Slurm job on each, and the agent stops both nodes on SIGTERM."""

from __future__ import annotations

import signal
import time

import pytest

from tests.e2e.conftest import Lab
from tests.slurm.conftest import running
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    yield from running(SlurmCluster(tmp_path_factory.mktemp("slurm"), two_nodes=True, epilog=True))


def test_one_agent_serves_every_node_of_a_partition(tmp_path, two_nodes):
    first, second = two_nodes.nodes
    lab = Lab(tmp_path)
    try:
        lab.start_leader()
        agent = lab._spawn(["agent", "--leader", lab.url, "--runtime", "slurm", "--partition", two_nodes.partition,
                            "--slurm-gpu-memory", "80G", "--data-dir", str(lab.data)], "agent-slurm.log",
                           SLURM_CONF=str(two_nodes.conf))
        lab.agents["slurm"] = agent
        log = tmp_path / "agent-slurm.log"
        lab.wait(lambda: {n["name"]: n["health"] for n in lab.api("nodes")} == {first: "up", second: "up"},
                 "both Slurm nodes to join as labq nodes", detail=lambda: log.read_text()[-2000:])
        nodes = {n["name"]: n for n in lab.api("nodes")}
        assert all(len(nodes[name]["gpus"]) == 8 for name in (first, second))
        assert {g["memory_mib"] for name in (first, second) for g in nodes[name]["gpus"]} == {80 * 1024}
        lab.wait(lambda: all(f"labq agent {name} serving" in log.read_text() for name in (first, second)),
                 "the agent to say it serves both")
        assert two_nodes.epilog and "Epilog" not in log.read_text()  # a Slurm with one starts preemptors at once

        on = {name: lab.submit("sh", "-c", "echo on $SLURMD_NODENAME", node=name, gpus=2) for name in (first, second)}
        for name, job in on.items():
            lab.wait_state(job, "succeeded", timeout=60)
            assert lab.labq("logs", str(job)).stdout == f"on {name}\n"
        # the declared memory lets a job that asks for memory in; sharing a GPU is not done there, and said so
        big = lab.submit("sh", "-c", "echo 40G is enough", gpu_mem="40G")
        lab.wait_state(big, "succeeded", timeout=60)
        refused = lab.labq("submit", "--share", "--gpu-mem", "8G", "--", "true", check=False)
        assert refused.returncode == 2 and "no node of the lab does let jobs share its GPUs" in refused.stderr
        spread = lab.submit("sh", "-c", "echo part of $LABQ_JOB_ID on $SLURMD_NODENAME", nodes=2, gpus=16)
        done = lab.wait_state(spread, "succeeded", timeout=60)
        placed = sorted(a["node"] for a in done["placement"]["allocations"])
        assert placed == sorted([first, second]), done["placement"]

        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0
        deadline = time.monotonic() + 60
        while {n["health"] for n in lab.api("nodes")} == {"up"}:
            assert time.monotonic() < deadline, "the leader still has the stopped agent's nodes up"
            time.sleep(0.2)
    finally:
        lab.close()
