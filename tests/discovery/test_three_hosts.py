"""Three hosts that know no addresses: a leader and two agents find each other over mDNS and run jobs.

Each host is a network namespace on one bridge; the test sends nothing
anywhere else. One agent's link goes down: its node is marked lost after the
lease and its job requeued only after requeue_after. A rogue agent without the
join token is never given work.
"""

from __future__ import annotations

import re

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import TEST_CONFIG, kill_job_processes, stop_processes

pytestmark = pytest.mark.timeout(180)

# the end-to-end tests' short leases, served on the host's address rather than loopback
CONFIG = TEST_CONFIG.replace('listen = "127.0.0.1:0"', 'listen = "0.0.0.0:7733"')


class Hosts:
    def __init__(self, lab, root: Path) -> None:
        self.lab = lab
        self.root = root
        self.procs: list[subprocess.Popen] = []

    def spawn(self, host: int, name: str, *args: str, **env) -> subprocess.Popen:
        home = self.root / name
        home.mkdir(exist_ok=True)
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - the child keeps it
        environment = {**{k: v for k, v in os.environ.items() if not k.startswith("LABQ_")},
                       "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "PYTHONUNBUFFERED": "1", **env}
        proc = self.lab.run_in(self.lab.hosts[host], [sys.executable, "-m", "labq.cli", *args], stdout=log,
                               stderr=subprocess.STDOUT, env=environment, cwd=str(Path(__file__).parents[2]))
        log.close()
        self.procs.append(proc)
        return proc

    def labq(self, *args: str) -> subprocess.CompletedProcess:
        """The CLI on the leader's host, as its first admin."""
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("LABQ_")},
               "HOME": str(self.root / "leader"), "XDG_CONFIG_HOME": str(self.root / "leader" / ".config")}
        return subprocess.run(["ip", "netns", "exec", self.lab.hosts[0], sys.executable, "-m", "labq.cli", *args],
                              capture_output=True, text=True, env=env, timeout=60)

    def json(self, *args: str):
        out = self.labq(*args, "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text(errors="replace")

    def wait(self, condition, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}\n--- leader ---\n{self.log('leader')[-2000:]}")

    def close(self) -> None:
        stop_processes(self.procs, timeout=15)
        kill_job_processes(self.root)


def test_three_hosts_find_each_other_run_jobs_and_survive_a_lost_link(lan, tmp_path):
    lab = lan(3)
    hosts = Hosts(lab, tmp_path)
    try:
        (tmp_path / "leader.toml").write_text(CONFIG)
        hosts.spawn(0, "leader", "leader", "--config", str(tmp_path / "leader.toml"), "--data-dir",
                    str(tmp_path / "leader" / "data"))
        hosts.wait(lambda: "serving https://" in hosts.log("leader"), "the leader to serve")  # TLS: off loopback
        join = (tmp_path / "leader" / "data" / "join-token").read_text().strip()
        for i in (1, 2):  # no --leader: they find it over mDNS
            hosts.spawn(i, f"a{i}", "agent", "--gpus", "sim:flat:2", "--name", f"a{i}",
                        "--data-dir", str(tmp_path / f"a{i}" / "data"), LABQ_JOIN_TOKEN=join)
        hosts.wait(lambda: sorted(n["name"] for n in hosts.json("nodes")) == ["a1", "a2"], "both agents to join")
        assert f"found the leader over mDNS: https://{lab.addr(0)}:7733" in hosts.log("a1")
        hosts.wait(lambda: all(n["found"] == "mDNS" for n in hosts.json("nodes")), "the leader to see them")

        jobs = {}
        for node in ("a1", "a2"):
            out = hosts.labq("submit", "--json", "--node", node, "--", "sh", "-c", "echo on $LABQ_JOB_ID; sleep 300")
            assert out.returncode == 0, out.stderr
            jobs[node] = json.loads(out.stdout)["id"]
        for node, job in jobs.items():
            hosts.wait(lambda job=job: hosts.json("show", str(job))["job"]["state"] == "running", f"job on {node}")
        assert "on " in hosts.labq("logs", str(jobs["a2"])).stdout  # logs come across hosts

        pin = re.search(r"CA (sha256:[0-9a-f]{64})", hosts.log("leader")).group(1)
        rogue = hosts.spawn(2, "rogue", "agent", "--gpus", "sim:flat:8", "--name", "rogue",
                            "--leader", f"https://{lab.addr(0)}:7733", "--data-dir", str(tmp_path / "rogue"),
                            LABQ_JOIN_TOKEN=f"labq-join:v1:{pin}:lqj_not-the-token")  # the right pin, a wrong secret
        assert rogue.wait(timeout=60) != 0
        assert "unknown token" in hosts.log("rogue")
        assert "rogue" not in [n["name"] for n in hosts.json("nodes")]

        lab.set_link(lab.hosts[1], up=False)  # a1 drops off the network
        hosts.wait(lambda: {n["name"]: n["health"] for n in hosts.json("nodes")}["a1"] == "lost", "a1 to be lost")
        assert hosts.json("show", str(jobs["a1"]))["job"]["attempt"] == 1  # not requeued yet
        hosts.wait(lambda: hosts.json("show", str(jobs["a1"]))["job"]["state"] == "queued", "the requeue", 60)
        moved = hosts.json("show", str(jobs["a1"]))["job"]
        assert moved["attempt"] == 2
        other = hosts.json("show", str(jobs["a2"]))["job"]
        assert (other["state"], other["attempt"]) == ("running", 1)  # the healthy host is untouched
        hosts.labq("cancel", str(jobs["a1"]), str(jobs["a2"]))
    finally:
        hosts.close()
