"""A real lab for fault rounds: ``labq leader`` and ``labq agent`` processes that a test kills and restarts.

Unlike ``tests/e2e``'s lab, the test talks to the leader through ``labq.client.Client`` in
its own process (a round checks many jobs; a CLI process per look would not fit CI's
budget), keeps the leader on one port across restarts, and can put the leader or an
agent in a network namespace. Everything the lab starts carries its folder in its
command line or environment, so ``close`` finds and ends what is left even after a
failed test.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from labq.client import Client
from labq.credentials import credentials_path
from labq.protocol.errors import ApiError

CLONE_NEWNET = 0x40000000


def leader_toml(*, lease: float, fence_after: float, requeue_after: float, max_grace: float = 5,
                default_grace: float = 2, listen: str = "127.0.0.1:0", extra_jobs: str = "") -> str:
    """The leader's settings for a fault test: short leases, so that a round takes seconds.

    The suite runs as root (as CI does), so its first admin is root: ``allow_root``."""
    return (f'[leader]\nlisten = "{listen}"\n[scheduling]\nmin_runtime = "0s"\n'
            f'[jobs]\nmax_grace = "{max_grace}s"\ndefault_grace = "{default_grace}s"\n'
            f'allow_root = true\n{extra_jobs}'
            f'[agents]\nlease = "{lease}s"\nfence_after = "{fence_after}s"\nrequeue_after = "{requeue_after}s"\n')


class InNamespace:
    """A client whose sockets live in a network namespace: every call runs on one thread that entered it."""

    def __init__(self, client: Client, netns: str) -> None:
        self._client = client
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"netns-{netns}", initializer=_enter_netns,
                                        initargs=(netns,))

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)
        return lambda *args, **kw: self._pool.submit(method, *args, **kw).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _enter_netns(netns: str) -> None:
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {netns}")
    finally:
        os.close(fd)


class FaultLab:
    """One leader (restartable on the same address) and its agents, each a real process."""

    def __init__(self, root: Path, config: str, *, leader_netns: str | None = None) -> None:
        self.root = root
        self.home = root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.data = root / "data"
        self.config = root / "leader.toml"
        self.config.write_text(config)
        self.settings = tomllib.loads(config)
        self.leader_netns = leader_netns
        self.url: str | None = None
        self.listen: str | None = None
        self.leader: subprocess.Popen | None = None
        self.agents: dict[str, subprocess.Popen] = {}
        self._agent_starts: dict[str, tuple[list[str], str | None]] = {}  #: how each agent was started
        self.procs: list[subprocess.Popen] = []
        self.client: Client | InNamespace | None = None
        self.token: str | None = None
        self.served_at = 0.0  #: when the test saw the current leader process serve (time.time)

    # -- processes ------------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LABQ_")}
        env.update(HOME=str(self.home), XDG_CONFIG_HOME=str(self.home / ".config"), PYTHONUNBUFFERED="1", **extra)
        return env

    def spawn(self, args: list[str], log: str, netns: str | None = None) -> subprocess.Popen:
        argv = [sys.executable, "-m", "labq.cli", *args]
        if netns:
            argv = ["ip", "netns", "exec", netns, *argv]  # it execs: the pid is labq's own
        with open(self.root / log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env(), start_new_session=True, cwd=str(Path(__file__).parents[2]))
        self.procs.append(proc)
        return proc

    def log(self, name: str, tail: int = 3000) -> str:
        path = self.root / name
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def start_leader(self, timeout: float = 30) -> float:
        """Start (or start again, on the same address) the leader; the time it was seen serving."""
        log = self.root / "leader.log"
        start = log.stat().st_size if log.exists() else 0
        args = ["leader", "--no-mdns", "--config", str(self.config), "--data-dir", str(self.data)]
        same_address = ["--listen", self.listen] if self.listen and not self.leader_netns else []  # port 0 at first
        self.leader = self.spawn(args + same_address, "leader.log", self.leader_netns)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = log.read_bytes()[start:].decode(errors="replace")
            found = re.search(r"serving (https?://[\d.]+:\d+)", text)
            if found:
                self.served_at = time.time()
                if self.url is None:
                    self.url = found.group(1)
                    self.listen = self.url.split("://", 1)[1]
                    self._connect()
                return self.served_at
            if self.leader.poll() is not None:
                raise AssertionError(f"the leader exited {self.leader.returncode} at start:\n{text[-3000:]}")
            time.sleep(0.02)
        raise AssertionError(f"the leader did not serve within {timeout:.0f} s:\n{self.log('leader.log')}")

    def _connect(self) -> None:
        """The first admin's token, which a new leader saves just after it says it serves."""
        saved_at = credentials_path(self.home)
        self.wait(lambda: saved_at.exists() and "token" in saved_at.read_text(), "the first admin's credentials", 10)
        saved = tomllib.loads(saved_at.read_text())
        self.token = saved["token"]
        url, pin = self.url, saved.get("pin")
        if self.leader_netns:  # the test reaches it from inside its namespace, on its loopback
            url = self.url.split("://", 1)[0] + "://127.0.0.1:" + self.url.rsplit(":", 1)[1]
            self.client = InNamespace(Client(url, self.token, timeout=10, pin=pin), self.leader_netns)
        else:
            self.client = Client(url, self.token, timeout=10, pin=pin)

    def stop_leader(self, sig: int, timeout: float = 30) -> int:
        """Send the leader ``sig`` and wait for it to end; its exit status."""
        self.leader.send_signal(sig)
        return self.leader.wait(timeout=timeout)

    def start_agent(self, name: str, gpus: str = "sim:ws-4x3090", *, netns: str | None = None,
                    leader_url: str | None = None, wait: bool = True) -> subprocess.Popen:
        args = ["agent", "--leader", leader_url or self.url, "--gpus", gpus, "--name", name, "--no-mdns",
                "--join-token-file", str(self.data / "join-token"), "--state-dir", str(self.root / "agents" / name)]
        self._agent_starts[name] = (args, netns)
        self.agents[name] = self.spawn(args, f"agent-{name}.log", netns)
        if wait:
            self.wait(lambda: self.node(name).get("health") == "up", f"agent {name} to join", 30,
                      lambda: self.log(f"agent-{name}.log"))
        return self.agents[name]

    def restart_agent(self, name: str) -> subprocess.Popen:
        """Start the agent again as before: the same node, the same state folder (its jobs to re-adopt)."""
        args, netns = self._agent_starts[name]
        self.agents[name] = self.spawn(args, f"agent-{name}.log", netns)
        return self.agents[name]

    def kill(self, proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
        proc.send_signal(sig)
        proc.wait(timeout=30)

    # -- looking ----------------------------------------------------------------------------------

    def node(self, name: str) -> dict:
        try:
            return next((n for n in self.client.nodes() if n["name"] == name), {})
        except ApiError:
            return {}

    def job(self, job_id: int) -> dict:
        return self.client.job(job_id)[0]

    def wait(self, condition: Callable[[], Any], what: str, timeout: float = 30,
             detail: Callable[[], Any] = lambda: "", every: float = 0.1) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                result = condition()
            except ApiError:  # the leader is restarting: look again
                result = None
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}: {detail()}\n"
                                     f"--- leader log ---\n{self.log('leader.log')}")
            time.sleep(every)

    def wait_state(self, job_id: int, *states: str, timeout: float = 30) -> dict:
        last: dict = {}

        def reached() -> bool:
            nonlocal last
            last = self.job(job_id)
            return last["state"] in states

        self.wait(reached, f"job {job_id} to be {'/'.join(states)}", timeout,
                  lambda: {k: last.get(k) for k in ("state", "attempt", "attempts")})
        return last

    # -- the end ----------------------------------------------------------------------------------

    def close(self) -> None:
        """TERM every daemon, then KILL what is left; end every job and watchdog the lab started."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        if isinstance(self.client, InNamespace):
            self.client.close()
        for pid_file in self.root.glob("agents/*/runtime/attempts/*/pid.json"):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                os.killpg(int(json.loads(pid_file.read_text())["pid"]), signal.SIGKILL)
        remove_containers(self.agents)
        end_leftovers(self.root)


def remove_containers(nodes) -> None:
    """Every container of these nodes, running or not (the engine is shared with other tests)."""
    try:
        import docker
        import docker.errors
    except ImportError:
        return
    if not nodes:
        return
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except docker.errors.DockerException:
        return
    try:
        for node in nodes:
            for container in client.containers.list(all=True, filters={"label": f"labq.agent={node}"}):
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    container.remove(force=True)
    finally:
        client.close()


def lab_processes(root: Path) -> list[int]:
    """Pids of every process this lab started: its folder is in their command line or environment."""
    marker = str(root).encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read()
            if marker in cmdline or marker in environ:
                found.append(int(entry.name))
    return found


def end_leftovers(root: Path, timeout: float = 10) -> list[int]:
    """KILL what is left of the lab (shims, watchdogs, jobs); the pids that were left."""
    left = lab_processes(root)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(pid) for pid in left):
        time.sleep(0.05)
    return left


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


#: rounds of the leader-restart test (issue 13 asks for 50); a soak run sets more, and the other
#: fault tests scale their own rounds by the same factor
LEADER_ROUNDS = int(os.environ.get("LABQ_FAULT_ROUNDS", "50"))


def soak(default: int) -> int:
    """A test's rounds: its default, times how many 50s LABQ_FAULT_ROUNDS asks for."""
    return default * max(1, -(-LEADER_ROUNDS // 50))


def seeded(name: str) -> random.Random:
    """The random moments of a test: LABQ_FAULT_SEED replays a run; the seed is printed either way."""
    seed = int(os.environ.get("LABQ_FAULT_SEED") or random.randrange(1 << 32))
    print(f"{name}: LABQ_FAULT_SEED={seed}")
    return random.Random(seed)
