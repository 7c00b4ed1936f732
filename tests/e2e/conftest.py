"""A real lab on loopback: ``labq leader`` and ``labq agent`` processes, the CLI as a process.

Every process gets its own HOME, so credentials land in the test's folder.
Leases are short so that lost agents and fencing happen within a test.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TEST_CONFIG = """\
[leader]
listen = "127.0.0.1:0"
[scheduling]
min_runtime = "0s"
[jobs]
max_grace = "5s"
default_grace = "2s"
allow_root = true  # the suite runs as root (CI does), and its first admin is then root
[agents]
lease = "2s"
fence_after = "6s"
requeue_after = "25s"  # past half a lease, fence_after, max_grace, TERM-to-KILL (10 s) and looks
"""


class Lab:
    def __init__(self, root: Path, config: str = TEST_CONFIG) -> None:
        self.root = root
        self.home = root / "home"
        self.data = root / "data"
        self.home.mkdir(parents=True, exist_ok=True)
        self.config = root / "leader.toml"
        self.config.write_text(config)
        self.url: str | None = None
        self.procs: list[subprocess.Popen] = []
        self.leader: subprocess.Popen | None = None
        self.agents: dict[str, subprocess.Popen] = {}

    def env(self, **extra) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LABQ_")}
        env.update(HOME=str(self.home), XDG_CONFIG_HOME=str(self.home / ".config"), PYTHONUNBUFFERED="1", **extra)
        return env

    def _spawn(self, args: list[str], log: str, **env) -> subprocess.Popen:
        with open(self.root / log, "ab") as out:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen([sys.executable, "-m", "labq.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                                    env=self.env(**env), start_new_session=True)
        self.procs.append(proc)
        return proc

    def start_leader(self) -> None:
        log = self.root / "leader.log"
        start = log.stat().st_size if log.exists() else 0
        self.leader = self._spawn(["leader", "--no-mdns", "--config", str(self.config), "--data-dir", str(self.data),
                                   *(["--listen", self.url.removeprefix("http://")] if self.url else [])],
                                  "leader.log")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            text = log.read_bytes()[start:].decode(errors="replace") if log.exists() else ""
            found = re.search(r"serving (https?://127\.0\.0\.1:\d+)", text)
            if found:
                self.url = found.group(1)
                return
            if self.leader.poll() is not None:
                raise AssertionError(f"the leader died:\n{text}")
            time.sleep(0.05)
        raise AssertionError("the leader did not start in 30 s")

    def start_agent(self, name: str = "ws1", gpus: str = "sim:ws-4x3090") -> None:
        self.agents[name] = self._spawn(["agent", "--leader", self.url, "--gpus", gpus, "--name", name,
                                         "--data-dir", str(self.data)], f"agent-{name}.log")
        self.wait(lambda: any(n["name"] == name and n["health"] == "up" for n in self.api("nodes")),
                  f"agent {name} to join")

    def labq(self, *args: str, token: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        env = self.env(**({"LABQ_TOKEN": token, "LABQ_LEADER": self.url} if token else {}))
        out = subprocess.run([sys.executable, "-m", "labq.cli", *args], capture_output=True, text=True, env=env,
                             timeout=60)
        if check and out.returncode != 0:
            raise AssertionError(f"labq {' '.join(args)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
        return out

    def api(self, *args: str, token: str | None = None):
        """A listing through the CLI with --json."""
        return json.loads(self.labq(*args, "--json", token=token).stdout)

    def submit(self, *command: str, token: str | None = None, **options) -> int:
        flags = []
        for key, value in options.items():
            flag = "--" + key.replace("_", "-")
            flags += [flag] if value is True else [flag, str(value)]
        doc = json.loads(self.labq("submit", "--json", *flags, "--", *command, token=token).stdout)
        return doc["id"] if "id" in doc else doc["job"]["id"]

    def job(self, job_id: int, token: str | None = None) -> dict:
        doc = self.api("show", str(job_id), token=token)
        return doc.get("job", doc)

    def wait_state(self, job_id: int, *states: str, timeout: float = 30) -> dict:
        last = {}

        def reached() -> bool:
            nonlocal last
            last = self.job(job_id)
            return last["state"] in states

        self.wait(reached, f"job {job_id} to be {'/'.join(states)}", timeout, lambda: last)
        return last

    def wait(self, condition, what: str, timeout: float = 30, detail=lambda: "") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}: {detail()}\n--- leader log ---\n"
                             f"{(self.root / 'leader.log').read_text()[-3000:]}")

    def kill(self, proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
        proc.send_signal(sig)
        proc.wait(timeout=30)

    def close(self) -> None:
        stop_processes(self.procs)
        kill_job_processes(self.data)


def stop_processes(procs: list[subprocess.Popen], timeout: float = 20) -> None:
    """TERM every daemon a test started, then KILL what has not ended."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()


def kill_job_processes(root: Path) -> None:
    """Jobs run in their own sessions and outlive agents by design: end them after a test.

    Each attempt's pid.json names the job's process group; its shim ends with it."""
    for pid_file in root.glob("**/runtime/attempts/*/pid.json"):
        try:
            os.killpg(json.loads(pid_file.read_text())["pid"], signal.SIGKILL)
        except (OSError, ValueError, KeyError, TypeError):
            pass


@pytest.fixture
def lab(tmp_path):
    made = Lab(tmp_path)
    yield made
    made.close()


@pytest.fixture
def running_lab(lab):
    lab.start_leader()
    lab.start_agent()
    return lab
