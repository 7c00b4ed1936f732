"""Processes on a test LAN's hosts (``tests.discovery.netns``): daemons and commands in each host's
namespace, each with its own HOME under the test's folder and a log file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e.conftest import kill_job_processes, stop_processes

REPO = Path(__file__).parents[2]


class Hosts:
    """Processes on the LAN's hosts, each with its own HOME under the test's folder and a log file."""

    def __init__(self, lab, root: Path) -> None:
        self.lab = lab
        self.root = root
        self.procs: list[subprocess.Popen] = []

    def env(self, home: str, **extra) -> dict:
        path = self.root / home
        path.mkdir(exist_ok=True)
        return {**{k: v for k, v in os.environ.items() if not k.startswith("LABQ_")},
                "HOME": str(path), "XDG_CONFIG_HOME": str(path / ".config"), "PYTHONUNBUFFERED": "1", **extra}

    def spawn(self, host: int, log: str, argv: list[str], home: str, **env) -> subprocess.Popen:
        with open(self.root / f"{log}.log", "ab") as out:  # the child keeps its own copy of the descriptor
            proc = self.lab.run_in(self.lab.hosts[host], argv, stdout=out, stderr=subprocess.STDOUT,
                                   env=self.env(home, **env), cwd=str(REPO))
        self.procs.append(proc)
        return proc

    def labq_daemon(self, host: int, log: str, *args: str, home: str | None = None, **env) -> subprocess.Popen:
        return self.spawn(host, log, [sys.executable, "-m", "labq.cli", *args], home or log, **env)

    def script(self, host: int, log: str, text: str, *args: str) -> subprocess.Popen:
        path = self.root / f"{log}.py"
        path.write_text(text)
        return self.spawn(host, log, [sys.executable, str(path), *args], log)

    def run(self, host: int, argv: list[str], home: str, **env) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.lab.hosts[host], *argv], capture_output=True, text=True,
                              env=self.env(home, **env), cwd=str(REPO), timeout=60)

    def labq(self, host: int, home: str, *args: str, **env) -> subprocess.CompletedProcess:
        return self.run(host, [sys.executable, "-m", "labq.cli", *args], home, **env)

    def nodes(self, host: int, home: str) -> list[dict]:
        out = self.labq(host, home, "nodes", "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def log(self, name: str) -> str:
        path = self.root / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait(self, condition, what: str, timeout: float = 60, detail=lambda: "") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}: {detail()}")

    def wait_log(self, name: str, text: str, proc: subprocess.Popen, after: int = 0, timeout: float = 60) -> str:
        """Wait for ``text`` in log ``name`` (past its first ``after`` characters); the process must not die."""
        def seen() -> bool:
            assert proc.poll() is None or text in self.log(name)[after:], f"{name} ended:\n{self.log(name)[-3000:]}"
            return text in self.log(name)[after:]
        self.wait(seen, f"{text!r} in {name}'s log", timeout, lambda: self.log(name)[-3000:])
        return self.log(name)[after:]

    def stop(self, proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)

    def close(self) -> None:
        stop_processes(self.procs, timeout=15)
        kill_job_processes(self.root)
