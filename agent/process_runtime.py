"""Job attempts as plain processes that outlive the agent (labq.agent.process_runtime).

The agent is level-triggered: it reports what runs and makes it match what the leader
wants. So the truth must be on disk, not in the agent's memory, and an agent that
restarts must find its jobs still running. Each attempt is a folder
``root/attempts/<job>.<attempt>/``:

- ``spec.json``: what to run, written before anything starts.
- ``lock``: flock'ed by the attempt's shim (``labq.agent.shim``) for the shim's whole life.
  Held: the shim lives and will write ``exit.json``. Free: it is gone.
- ``pid.json``: the job's pid (also its process group) and its /proc start time.
- ``exit.json``: how the job ended, written by the shim.
- ``log``: the job's stdout and stderr, in the order written; ``forget`` moves it to
  ``root/logs/<job>.<attempt>.log``.

Where this machine lets the agent make cgroups (``labq.agent.cgroups.probe``, said in ``confinement``),
each attempt runs in one of its own, ``labq/<job>.<attempt>-<agent>``, made and removed by its shim with
the launch's CPU set, CPU quota and memory limit; ``exit.json`` then says whether the kernel OOM-killed
in it and its peak memory. The job's own temporary folder (``tmpdir``, its TMPDIR) goes on ``forget``.

A folder is assembled under a hidden name and renamed into place with the lock already
held, so no reader ever sees an attempt without a live owner or a recorded end.

Re-adoption needs no pids in memory: while the lock is held the job is RUNNING; once the
shim is gone ``exit.json`` says how the job ended. If the shim died without writing it
(killed with SIGKILL), a job whose pid still has the recorded start time is adopted as
RUNNING, and otherwise its end is recorded as lost (``exit_code`` None).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pwd
import select
import shutil
import signal as signals
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from labq.agent import cgroups
from labq.agent.faults import NodeFault
from labq.agent.shim import read_stat, write_json_atomically
from labq.models.spec import STANDARD_PATH

TYPE_CHECKING = False
if TYPE_CHECKING:
    from labq.protocol.agents import RunOrder

SHIM_READY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Launch:
    """One attempt of a job, as the leader asked for it."""

    job_id: int
    attempt: int
    command: tuple[str, ...]  #: argv, run without a shell
    env: dict[str, str]  #: on top of PATH, HOME, USER, LOGNAME, LANG, LABQ_JOB_ID, LABQ_ATTEMPT
    workdir: str | None = None  #: default: the run-as user's home, else /
    user: str | None = None  #: another user only when the agent runs as root
    gpu_env: dict[str, str] = field(default_factory=dict)
    #: the shim stops the job itself when the agent's heartbeat is older than this (None: never)
    fence_after_s: float | None = None
    #: what the fence sends first; None: what the job names in its marker by then, else TERM
    checkpoint_signal: str | None = None
    grace_s: float = 30.0  #: e.g. CUDA_VISIBLE_DEVICES; merged last
    #: the kernel's limits (a cgroup of its own): the CPUs it may run on, the cores of CPU time, the memory (MiB)
    cpu_set: tuple[int, ...] = ()
    cpu_limit: float | None = None
    memory_limit_mib: int | None = None
    #: the job's own temporary folder on this node (its TMPDIR; a container's /tmp), removed when it is forgotten
    tmpdir: str = ""

    @classmethod
    def of(cls, order: RunOrder, start: Start) -> Launch:
        """The attempt an order asks for, with what this node adds to it."""
        spec = order.spec
        return cls(order.job_id, order.attempt, spec.command, start.env, spec.workdir, start.user, start.gpu_env,
                   start.fence_after_s, order.checkpoint_signal, spec.grace_s, order.cpu_set, order.cpu_limit,
                   order.memory_limit_mib, start.tmpdir)


@dataclass(frozen=True)
class Start:
    """What this node adds to an order to start it: the environment, the account, its checkpoint folder."""

    env: dict[str, str]  #: the order's, with LABQ_CHECKPOINT_DIR, less the GPU variables
    user: str | None  #: the account to run as; None: the agent's own
    gpu_env: dict[str, str]  #: CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES
    fence_after_s: float | None
    checkpoint_dir: str  #: the job's own checkpoint folder, made by the agent
    tmpdir: str = ""  #: the job's own temporary folder, made by the agent (its TMPDIR)


class AttemptState(str, Enum):
    RUNNING = "running"  #: started (or starting) and its end not yet recorded
    EXITED = "exited"  #: its end is recorded; kept until ``forget``


@dataclass(frozen=True)
class AttemptStatus:
    job_id: int
    attempt: int
    state: AttemptState
    pid: int | None  #: the job's pid and process group id; None while starting or if it never started
    exit_code: int | None  #: the code, 128+N for signal N, 126/127 if it could not start, None if lost
    signal: int | None  #: the signal that killed it
    started_at: float
    ended_at: float | None
    log_path: str  #: where the log is now (it moves on ``forget``)
    fenced: bool = False  #: stopped by its shim because the agent lost the leader
    #: it could not start for a reason of this machine, not of the job (``labq.agent.faults``): why
    node_fault: str | None = None
    #: the checkpoint signal its container image's label names (``labq.checkpoint-signal``)
    image_signal: str | None = None
    #: the process below which every process is the attempt's, when it is not ``pid``: the shim, a subreaper,
    #: whose children the job's orphans become (one that left the job's group, a daemon's double fork)
    tree_pid: int | None = None
    oom: bool = False  #: the kernel killed a process of it for lack of memory (its limit)
    memory_peak_mib: int | None = None  #: the most memory it used, where the kernel kept count (its cgroup)


@dataclass(frozen=True)
class _RunAs:
    name: str
    home: str
    uid: int | None  #: None: the agent's own user, no switch
    gid: int | None
    groups: tuple[int, ...] | None


def _run_as(user: str | None, allow_root: bool = False) -> _RunAs:
    """Resolve the user before anything touches disk: only root may start jobs as someone else, and no job
    runs as uid 0 unless the admin allows it (``[jobs] allow_root``)."""
    uid = os.geteuid()
    try:
        me = pwd.getpwuid(uid)
        own = _RunAs(me.pw_name, me.pw_dir, None, None, None)
    except KeyError:  # a container uid without a passwd entry
        own = _RunAs(os.environ.get("USER", str(uid)), os.environ.get("HOME", "/"), None, None, None)
    if user is None or user == own.name:
        if uid == 0 and not allow_root:
            raise ValueError(_ROOT_REFUSED.format(
                user=user or own.name, how=f"user {user!r} is uid 0 on this machine" if user else
                "the agent runs as root and the job names no other user"))
        return own
    if uid != 0:
        raise ValueError(f"cannot run a job as user {user!r}: the agent runs as {own.name!r} (uid {uid}), "
                         "and only an agent running as root can start jobs as other users")
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise NodeFault(f"cannot run a job as user {user!r}: no such user on this machine") from None
    if pw.pw_uid == 0 and not allow_root:
        raise ValueError(_ROOT_REFUSED.format(user=user, how=f"user {user!r} is uid 0 on this machine"))
    return _RunAs(pw.pw_name, pw.pw_dir, pw.pw_uid, pw.pw_gid, tuple(os.getgrouplist(pw.pw_name, pw.pw_gid)))


_ROOT_REFUSED = ("job of user {user!r} refused: jobs never run as root (uid 0) here, and {how}; submit as an "
                 "ordinary user, or an admin sets allow_root = true in the leader's [jobs] section")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        record: dict[str, Any] = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    return record


def _alive(started: dict[str, Any] | None) -> bool:
    """The recorded job process still exists and is the same one (pid and start time), not a zombie."""
    if not started or started.get("start_time") is None:
        return False
    stat = read_stat(started["pid"])
    return stat is not None and stat[0] not in ("Z", "X") and stat[1] == started["start_time"]


class ProcessRuntime:
    """Starts, watches and stops job attempts under ``root``; any number of these may come and go."""

    def __init__(self, root: Path, python: str = sys.executable, allow_root: bool = False,
                 cgroup_parent: str | None = cgroups.PARENT) -> None:
        self.root = Path(root)
        self.allow_root = allow_root  #: whether a job may run as uid 0 (the leader's ``[jobs] allow_root``)
        #: whether the kernel holds jobs to their limits here (a cgroup each, under ``cgroup_parent``; None: never),
        #: and if not why, in one sentence for the agent's log
        self.confinement = (cgroups.probe(parent=cgroup_parent) if cgroup_parent else
                            cgroups.unconfined("the agent was told to make no cgroups"))
        self._attempts = self.root / "attempts"
        self._logs = self.root / "logs"
        self._python = python
        for folder in (self.root, self._attempts, self._logs):
            folder.mkdir(mode=0o700, exist_ok=True)
        self._mutex = threading.Lock()
        self._shims: dict[tuple[int, int], subprocess.Popen[bytes]] = {}  # ours to reap
        self._stops: dict[tuple[int, int], threading.Timer] = {}
        self._sweep()

    # --- the interface --------------------------------------------------------------------------

    def launch_of(self, order: RunOrder, start: Start) -> Launch:
        return Launch.of(order, start)

    def launch(self, spec: Launch) -> AttemptStatus:
        """Start an attempt; return once its pid is on disk (or it failed to start)."""
        if not spec.command:
            raise ValueError("a job needs a command")
        if spec.job_id < 0 or spec.attempt < 0:
            raise ValueError(f"bad job id or attempt: {spec.job_id}.{spec.attempt}")
        if (spec.cpu_limit is not None and spec.cpu_limit <= 0 or any(cpu < 0 for cpu in spec.cpu_set)
                or spec.memory_limit_mib is not None and spec.memory_limit_mib <= 0):
            raise ValueError(f"bad limits: cpu_set={spec.cpu_set}, cpu_limit={spec.cpu_limit}, "
                             f"memory_limit_mib={spec.memory_limit_mib}")
        run_as = _run_as(spec.user, self.allow_root)
        key = (spec.job_id, spec.attempt)
        folder = self._folder(*key)
        if folder.exists() or self._forgotten_log(*key).exists():
            raise ValueError(f"attempt {spec.job_id}.{spec.attempt} already exists on this agent")
        env = {"PATH": STANDARD_PATH, "HOME": run_as.home, "USER": run_as.name, "LOGNAME": run_as.name,
               "LANG": os.environ.get("LANG", "C.UTF-8"),
               "LABQ_JOB_ID": str(spec.job_id), "LABQ_ATTEMPT": str(spec.attempt),
               **spec.env, **({"TMPDIR": spec.tmpdir} if spec.tmpdir else {}), **spec.gpu_env}
        workdir = spec.workdir or (run_as.home if os.path.isdir(run_as.home) else "/")
        staging = Path(tempfile.mkdtemp(prefix=f".new-{spec.job_id}.{spec.attempt}-", dir=self._attempts))
        lock_fd = os.open(staging / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # handed to the shim; released when both have let go
        log_fd = os.open(staging / "log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            write_json_atomically(staging / "spec.json", {
                "job_id": spec.job_id, "attempt": spec.attempt, "command": list(spec.command), "env": env,
                "workdir": workdir, "user": run_as.name, "uid": run_as.uid, "gid": run_as.gid,
                "groups": None if run_as.groups is None else list(run_as.groups), "created_at": time.time(),
                "fence_after_s": spec.fence_after_s, "checkpoint_signal": spec.checkpoint_signal,
                "grace_s": spec.grace_s, "cpu_set": list(spec.cpu_set), "cpu_limit": spec.cpu_limit,
                "memory_limit_mib": spec.memory_limit_mib, "tmpdir": spec.tmpdir, "cgroup": self._cgroup_record(*key)})
            try:
                os.rename(staging, folder)  # fails on a non-empty folder: an attempt never starts twice
            except OSError:
                raise ValueError(f"attempt {spec.job_id}.{spec.attempt} already exists on this agent") from None
            self._start_shim(key, folder, lock_fd, log_fd)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        finally:
            os.close(log_fd)
            os.close(lock_fd)
        status = self._status(folder)
        assert status is not None
        return status

    def refuse(self, job_id: int, attempt: int, reason: str, exit_code: int = 126, *,
               node_fault: bool = False) -> AttemptStatus:
        """Record an attempt that cannot start (no such user, ...) as exited, with the reason in its log;
        ``node_fault``: for a reason of this machine, not of the job (its status says so)."""
        key = (job_id, attempt)
        folder = self._folder(*key)
        if folder.exists() or self._forgotten_log(*key).exists():
            raise ValueError(f"attempt {job_id}.{attempt} already exists on this agent")
        now = time.time()
        staging = Path(tempfile.mkdtemp(prefix=f".new-{job_id}.{attempt}-", dir=self._attempts))
        try:
            (staging / "lock").touch(mode=0o600)
            (staging / "log").write_text(f"labq: {reason}\n")
            write_json_atomically(staging / "spec.json", {"job_id": job_id, "attempt": attempt, "command": [],
                                                          "refused": reason, "created_at": now})
            write_json_atomically(staging / "exit.json", {"pid": None, "exit_code": exit_code, "signal": None,
                                                          "started_at": now, "ended_at": now,
                                                          "node_fault": reason if node_fault else None})
            os.rename(staging, folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        status = self._status(folder)
        assert status is not None
        return status

    def heartbeat(self) -> None:
        """The agent reached its leader just now: the shims' fences wait on from here."""
        path = self.root / "heartbeat"
        path.touch()
        os.utime(path)

    def attempts(self) -> list[AttemptStatus]:
        """Every attempt not yet forgotten, running or exited, read from disk."""
        self._reap_shims()
        found = []
        for folder in self._attempts.iterdir():
            if self._key(folder.name) is not None and (status := self._status(folder)) is not None:
                found.append(status)
        return sorted(found, key=lambda s: (s.job_id, s.attempt))

    def signal(self, job_id: int, attempt: int, sig: int) -> bool:
        """Send ``sig`` to the job's whole process group; False if it is not running."""
        folder = self._folder(job_id, attempt)
        status = self._status(folder)
        if status is None or status.state is not AttemptState.RUNNING or status.pid is None:
            return False
        if not _alive(_read_json(folder / "pid.json")):  # never signal a recycled pid's group
            return False
        try:
            os.killpg(status.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def stop(self, job_id: int, attempt: int, grace_s: float) -> None:
        """SIGTERM the group now, SIGKILL it after ``grace_s`` if it still runs; returns at once."""
        key = (job_id, attempt)
        with self._mutex:
            if key in self._stops or not self.signal(job_id, attempt, signals.SIGTERM):
                return  # already stopping, or nothing to stop
            timer = threading.Timer(grace_s, self._kill_after_grace, key)
            timer.daemon = True
            self._stops[key] = timer
        timer.start()

    def forget(self, job_id: int, attempt: int) -> None:
        """Drop an exited attempt's bookkeeping once the leader has recorded its end; keep its log."""
        folder = self._folder(job_id, attempt)
        status = self._status(folder)
        if status is None:
            return
        if status.state is AttemptState.RUNNING:
            raise ValueError(f"attempt {job_id}.{attempt} is still running: stop it before forgetting it")
        spec = _read_json(folder / "spec.json") or {}
        with contextlib.suppress(FileNotFoundError):
            os.replace(folder / "log", self._forgotten_log(job_id, attempt))
        gone = self._attempts / f".gone-{job_id}.{attempt}-{uuid.uuid4().hex}"
        os.rename(folder, gone)  # one step out of the listing, then the slow removal
        shutil.rmtree(gone, ignore_errors=True)
        tmpdir = spec.get("tmpdir")
        if tmpdir and os.path.isabs(tmpdir) and os.path.realpath(tmpdir) != "/":
            shutil.rmtree(tmpdir, ignore_errors=True)
        if spec.get("cgroup") and (left := self.cgroup(job_id, attempt)) is not None:
            left.remove(timeout_s=0)  # a shim killed before it removed it
        self._reap_shims()

    def cgroup(self, job_id: int, attempt: int) -> cgroups.Cgroup | None:
        """The attempt's cgroup while it exists (its shim removes it when the job ends); None where there is none."""
        host = self.confinement.host
        return host.find(self._cgroup_name(job_id, attempt)) if host is not None else None

    def read_log(self, job_id: int, attempt: int, offset: int = 0, limit: int = 1 << 20) -> bytes:
        """Up to ``limit`` bytes of the log from ``offset``; KeyError for an attempt never seen."""
        if offset < 0 or limit < 0:
            raise ValueError("offset and limit must not be negative")
        for path in (self._folder(job_id, attempt) / "log", self._forgotten_log(job_id, attempt)):
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    return f.read(limit)
            except FileNotFoundError:  # not there, or moved by forget: look in logs/
                continue
        raise KeyError((job_id, attempt))

    # --- the rest -------------------------------------------------------------------------------

    def _cgroup_name(self, job_id: int, attempt: int) -> str:
        """Unique on the machine: another agent's folder (a second agent, a test) numbers its jobs from 1 too."""
        return f"{job_id}.{attempt}-{hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:8]}"

    def _cgroup_record(self, job_id: int, attempt: int) -> dict[str, str] | None:
        """Where the shim makes the attempt's cgroup (spec.json's ``cgroup``); None: it runs unconfined."""
        host = self.confinement.host
        if host is None:
            return None
        return {"root": str(host.root), "parent": host.parent, "name": self._cgroup_name(job_id, attempt)}

    def _start_shim(self, key: tuple[int, int], folder: Path, lock_fd: int, log_fd: int) -> None:
        """Start the shim detached and wait until it has written pid.json or exit.json (or died)."""
        ready_read, ready_write = os.pipe()
        try:
            try:
                shim = subprocess.Popen(
                    [self._python, "-m", "labq.agent.shim", str(folder), str(ready_write)],
                    stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, start_new_session=True,
                    pass_fds=(lock_fd, ready_write))
            except OSError as exc:  # this machine's fault: the attempt never started
                os.write(log_fd, f"labq: cannot start the shim: {exc}\n".encode())
                now = time.time()
                write_json_atomically(folder / "exit.json", {
                    "pid": None, "exit_code": None, "signal": None, "started_at": now, "ended_at": now,
                    "node_fault": f"cannot start the shim: {exc.strerror or exc}"})
                return
            finally:
                os.close(ready_write)
            with self._mutex:
                self._shims[key] = shim
            deadline = time.monotonic() + SHIM_READY_TIMEOUT_S
            while (left := deadline - time.monotonic()) > 0 and select.select([ready_read], [], [], left)[0]:
                if not os.read(ready_read, 64):
                    break  # closed: pid.json is written, or the shim is gone
        finally:
            os.close(ready_read)

    def _status(self, folder: Path) -> AttemptStatus | None:
        key = self._key(folder.name)
        spec = _read_json(folder / "spec.json") if key else None
        if key is None or spec is None:
            return None  # not an attempt, or forgotten meanwhile
        ended = _read_json(folder / "exit.json") or self._end_if_shim_gone(folder, spec)
        started = _read_json(folder / "pid.json") or {}
        log = folder / "log"
        log_path = str(log if log.exists() else self._forgotten_log(*key))
        if ended is None:
            return AttemptStatus(key[0], key[1], AttemptState.RUNNING, started.get("pid"), None, None,
                                 started.get("started_at", spec["created_at"]), None, log_path,
                                 tree_pid=started.get("shim_pid"))
        return AttemptStatus(key[0], key[1], AttemptState.EXITED, ended["pid"], ended["exit_code"], ended["signal"],
                             ended["started_at"], ended["ended_at"], log_path, ended.get("fenced", False),
                             ended.get("node_fault"), oom=ended.get("oom", False),
                             memory_peak_mib=ended.get("memory_peak_mib"))

    def _end_if_shim_gone(self, folder: Path, spec: dict[str, Any]) -> dict[str, Any] | None:
        """None while the shim lives (or its orphaned job does); else the end, recorded as lost if need be."""
        try:
            fd = os.open(folder / "lock", os.O_RDONLY)
        except FileNotFoundError:
            return None  # forgotten meanwhile
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None  # the shim lives
            # We hold the lock, so no shim can write any more: what is on disk now is final.
            ended = _read_json(folder / "exit.json")
            started = _read_json(folder / "pid.json")
            if ended is not None or _alive(started):
                return ended  # finished just now, or an orphaned job we adopt
            ended = {"exit_code": None, "signal": None, "pid": started["pid"] if started else None,
                     "started_at": (started or spec).get("started_at", spec["created_at"]), "ended_at": time.time()}
            with open(folder / "log", "ab") as log:
                log.write(b"labq: the attempt's shim died before recording how the job ended; exit status lost\n")
            write_json_atomically(folder / "exit.json", ended)
            return ended
        finally:
            os.close(fd)

    def _kill_after_grace(self, job_id: int, attempt: int) -> None:
        with self._mutex:
            self._stops.pop((job_id, attempt), None)
        self.signal(job_id, attempt, signals.SIGKILL)

    def _reap_shims(self) -> None:
        """Collect the exit of shims this runtime started, so none stays a zombie."""
        with self._mutex:
            for key, shim in list(self._shims.items()):
                if shim.poll() is not None:
                    del self._shims[key]

    def _sweep(self) -> None:
        """Remove what an agent killed mid-launch or mid-forget left under hidden names."""
        for folder in self._attempts.glob(".*"):
            if folder.name.startswith(".new-") and lock_held(folder / "lock"):
                continue  # a launch in progress in another process
            shutil.rmtree(folder, ignore_errors=True)

    @staticmethod
    def _key(name: str) -> tuple[int, int] | None:
        job, _, attempt = name.partition(".")
        return (int(job), int(attempt)) if job.isdigit() and attempt.isdigit() else None

    def _folder(self, job_id: int, attempt: int) -> Path:
        return self._attempts / f"{job_id}.{attempt}"

    def _forgotten_log(self, job_id: int, attempt: int) -> Path:
        return self._logs / f"{job_id}.{attempt}.log"


def lock_held(path: Path) -> bool:
    """Whether a process holds the flock on ``path`` (an attempt's shim holds its ``lock`` while it runs)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
