"""Job attempts as Docker containers that outlive the agent (labq.agent.docker_runtime).

The same interface as ``ProcessRuntime``; the truth lives in Docker and in files under
``root``, never in memory, so a new ``DockerRuntime`` (an agent restart) finds its jobs:

- a container ``labq-<job>-<attempt>`` labelled ``labq.job``, ``labq.attempt``,
  ``labq.agent=<node>`` and ``labq.managed=1`` per attempt, kept after it exits until ``forget``;
- ``logs/<job>.<attempt>.log``: the container's output, copied by one streamer thread per
  attempt that holds an flock on the file (a second runtime's streamer waits for it, then
  carries on from the file's size: Docker replays the same bytes in the same order);
- ``logs/.<job>.<attempt>.done``: the log is complete. An attempt is EXITED only once its
  container has exited *and* its log is complete, so "exited" means "the log has it all";
- ``refused/<job>.<attempt>.json``: an attempt that never got a container (``refuse``).

Images are never pulled (the nodes reach no registry): a missing image fails the launch
at once. Fencing (stopping jobs once the leader is out of reach) is the agent's job for
containers; ``heartbeat`` only records the time.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pwd
import re
import shutil
import signal as signals
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import docker
import docker.errors

from labq.agent.faults import NodeFault, sentence
from labq.agent.process_runtime import AttemptState, AttemptStatus, Launch, Start
from labq.isolation import (
    IsolationError, check_env, check_image, check_mounts, container_settings, refuse_checkpoint_folders,
)
from labq.models.job import JobSpec, Mount, catchable_signal
from labq.models.node import NodeProblem
from labq.models.spec import STANDARD_PATH
from labq.protocol.agents import CHECKPOINT_LABEL, RunOrder

REFUSED_EXIT = 126
TMPDIR_LABEL = "labq.tmpdir"  #: the job's own temporary folder (its /tmp), removed on ``forget``


@dataclass(frozen=True)
class DockerLaunch(Launch):
    """One attempt of a container job; ``user`` picks the container's uid:gid (the agent's own unless root)."""

    spec: JobSpec | None = None  #: the job's: its image, mounts and container settings
    simulated: bool = False
    gpu_uuids: tuple[str, ...] = ()  #: the placed GPUs' UUIDs; their indices on a simulated node
    checkpoint_dir: str = ""  #: the job's own checkpoint folder, made by the agent, mounted at the same path

    @classmethod
    def of(cls, order: RunOrder, start: Start) -> DockerLaunch:
        """A container for the order: it sees its GPUs through the NVIDIA runtime, not the GPU variables."""
        spec = order.spec
        visible = tuple(map(str, order.gpu_indices)) if order.simulated else order.gpu_uuids
        return cls(order.job_id, order.attempt, spec.command, start.env, spec.workdir, start.user, {},
                   start.fence_after_s, order.checkpoint_signal, spec.grace_s, order.cpu_set, order.cpu_limit,
                   order.memory_limit_mib, start.tmpdir, spec=spec, simulated=order.simulated, gpu_uuids=visible,
                   checkpoint_dir=start.checkpoint_dir)

    @property
    def image(self) -> str:
        return self.spec.image or ""


@dataclass(frozen=True)
class DockerAttemptStatus(AttemptStatus):
    """``oom`` from Docker's state (``OOMKilled``); ``memory_peak_mib`` stays None: an exited container's cgroup
    is gone, and Docker keeps no peak of it."""

    container: str | None = None  #: the container's name; None for a refused attempt


def _timestamp(text: str | None) -> float | None:
    """Docker's RFC 3339 time with nanoseconds; None for its zero time."""
    if not text or text.startswith("0001-"):
        return None
    head, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").timestamp()


def _label_signal(labels: dict[str, str] | None) -> str | None:
    """The checkpoint signal an image's label names (a container carries its image's labels); None if none."""
    text = (labels or {}).get(CHECKPOINT_LABEL)
    return catchable_signal(text) if text else None


def _user_ids(user: str | None) -> tuple[int, int, tuple[int, ...]]:
    """uid, gid and groups for the container: the job's user when the agent is root, else the agent's own."""
    uid = os.geteuid()
    if uid != 0:
        try:
            own = pwd.getpwuid(uid).pw_name
        except KeyError:
            own = None
        if user is not None and user != own:
            raise ValueError(f"cannot run a job as user {user!r}: only an agent running as root can")
        return uid, os.getegid(), ()
    if user is None:
        raise ValueError("a container job needs a non-root user: the agent runs as root and the job names none")
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise NodeFault(f"cannot run a job as user {user!r}: no such user on this machine") from None
    return pw.pw_uid, pw.pw_gid, tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))


class DockerRuntime:
    """Starts, watches and stops container attempts of node ``node``; any number may come and go."""

    def __init__(self, root: Path, node: str, *, allowed_roots: tuple[str, ...] = (),
                 allowed_images: tuple[str, ...] = (), client: docker.DockerClient | None = None,
                 lab: str = "", checkpoint_areas: tuple[str, ...] = ()) -> None:
        self.root = Path(root)
        self.node = node
        #: the lab (cluster id): no two attempts of one of its jobs run at once on this engine,
        #: while another lab's job of the same number is none of our business
        self.lab = lab
        self.allowed_roots = tuple(allowed_roots)
        self.allowed_images = tuple(allowed_images)
        self.checkpoint_areas = tuple(checkpoint_areas)  #: no mount from these: each job gets its own folder
        self._logs = self.root / "logs"
        self._refused = self.root / "refused"
        for folder in (self.root, self._logs, self._refused):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.client = client or docker.from_env(max_pool_size=64)
        self._mutex = threading.Lock()
        self._streamers: dict[tuple[int, int], threading.Thread] = {}
        self._stopping: set[tuple[int, int]] = set()
        self._sweep()
        self._rewatch()
        self.attempts()  # starts the log streamers of what an earlier agent left running

    # --- the interface --------------------------------------------------------------------------

    def launch_of(self, order: RunOrder, start: Start) -> DockerLaunch:
        return DockerLaunch.of(order, start)

    def launch(self, launch: Launch) -> AttemptStatus:
        """Create and start the attempt's container; ValueError (the daemon refuses it) if it cannot."""
        if not isinstance(launch, DockerLaunch):
            raise ValueError("a container job needs a DockerLaunch (image, mounts, ...)")
        if not launch.command:
            raise ValueError("a job needs a command")
        if launch.job_id < 0 or launch.attempt < 0:
            raise ValueError(f"bad job id or attempt: {launch.job_id}.{launch.attempt}")
        check_image(launch.image, self.allowed_images)
        check_env(launch.env)
        mounts = refuse_checkpoint_folders(check_mounts(launch.spec.mounts, self.allowed_roots), self.checkpoint_areas)
        if launch.checkpoint_dir:
            mounts.append(Mount(os.path.realpath(launch.checkpoint_dir), launch.checkpoint_dir))
        uid, gid, groups = _user_ids(launch.user)
        settings = container_settings(launch.spec, uid, gid, launch.gpu_uuids, launch.simulated, mounts,
                                      groups=groups, cpu_set=launch.cpu_set, cpu_limit=launch.cpu_limit,
                                      memory_limit_mib=launch.memory_limit_mib, tmpdir=launch.tmpdir)
        try:
            image = self.client.images.get(launch.image)  # never pulled: no registry is reachable from a node
        except docker.errors.ImageNotFound:
            missing = f"image {launch.image} not found on node {self.node}"
            raise NodeFault(missing, NodeProblem(missing, runtime="docker", image=launch.image)) from None
        if launch.checkpoint_signal is None and (named := _label_signal(image.labels)):
            launch = replace(launch, checkpoint_signal=named)  # the leader hears it with the attempt's status
            settings["environment"]["LABQ_PREEMPT_SIGNAL"] = named
        key = (launch.job_id, launch.attempt)
        env = {"PATH": STANDARD_PATH, "LABQ_JOB_ID": str(launch.job_id), "LABQ_ATTEMPT": str(launch.attempt),
               **({"USER": launch.user, "LOGNAME": launch.user} if launch.user else {}),
               **launch.env, **settings.pop("environment")}
        with self._mutex:  # one launch at a time: the check below and the create are one step
            if self._exists(*key):
                raise ValueError(f"attempt {launch.job_id}.{launch.attempt} already exists on this agent")
            running = [c.name for c in self.client.containers.list(
                all=True, ignore_removed=True,
                filters={"label": [f"labq.job={launch.job_id}", f"labq.lab={self.lab}", "labq.managed=1"]})
                if c.status not in ("exited", "dead")]
            if running:
                raise ValueError(f"job {launch.job_id} already has a container that has not exited: {running[0]}")
            container = self.client.containers.create(
                launch.image, list(launch.command), name=self.container_name(*key), environment=env,
                working_dir=launch.workdir or None,
                labels={**self._labels(*key), **({TMPDIR_LABEL: launch.tmpdir} if launch.tmpdir else {})},
                stop_signal="SIGTERM", detach=True, **settings)
            self._log(*key).touch(mode=0o600)
            try:
                container.start()
            except docker.errors.APIError as err:  # e.g. no such executable: Docker records 126/127
                if err.is_server_error():  # the engine or its runtime failed (a GPU hook, cgroups): not the job
                    self._unmake(container, key)
                    why = f"docker cannot start containers on node {self.node}: {sentence(err.explanation or err)}"
                    raise NodeFault(why, NodeProblem(why, runtime="docker")) from None
                with open(self._log(*key), "ab") as log:
                    log.write(f"labq: cannot start the container: {err.explanation or err}\n".encode())
                self._done(*key).touch()
            else:
                self._watch(container.name, launch)
        status = self._find(*key)
        assert status is not None
        return status

    def refuse(self, job_id: int, attempt: int, reason: str, exit_code: int = REFUSED_EXIT) -> AttemptStatus:
        """Record an attempt that cannot start (missing image, bad mount, ...) as exited, with the reason in its log."""
        if self._exists(job_id, attempt):
            raise ValueError(f"attempt {job_id}.{attempt} already exists on this agent")
        now = time.time()
        self._log(job_id, attempt).write_text(f"labq: {reason}\n")
        self._done(job_id, attempt).touch()
        record = self._refused / f"{job_id}.{attempt}.json"
        partial = record.with_suffix(".tmp")
        partial.write_text(json.dumps({"job_id": job_id, "attempt": attempt, "reason": reason,
                                       "exit_code": exit_code, "at": now}))
        os.replace(partial, record)
        status = self._find(job_id, attempt)
        assert status is not None
        return status

    def _unmake(self, container: Any, key: tuple[int, int]) -> None:
        """Remove a container that never started, and its log: the attempt is recorded as refused instead."""
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)
        with contextlib.suppress(FileNotFoundError):
            self._log(*key).unlink()

    def _watch(self, name: str, spec: Launch) -> None:
        """Start the container's watchdog, which fences it even when this agent is gone."""
        if not spec.fence_after_s:
            return
        argv = [sys.executable, "-m", "labq.agent.container_watch", str(self.root), name, str(spec.fence_after_s),
                spec.checkpoint_signal or "", str(spec.grace_s), spec.checkpoint_dir]
        record = {"argv": argv}
        (self.root / "watch").mkdir(exist_ok=True)
        (self.root / "watch" / f"{name}.json").write_text(json.dumps(record))
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)

    def _rewatch(self) -> None:
        """After an agent restart: a watchdog for every running container of ours that lost its own."""
        watching = set()
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    cmdline = (proc / "cmdline").read_bytes().split(b"\0")
                    if b"labq.agent.container_watch" in cmdline and str(self.root).encode() in cmdline:
                        watching.add(cmdline[cmdline.index(b"labq.agent.container_watch") + 2].decode())
        for record in (self.root / "watch").glob("*.json") if (self.root / "watch").is_dir() else ():
            name = record.stem
            with contextlib.suppress(docker.errors.NotFound, ValueError, OSError):
                if name not in watching and self.client.containers.get(name).status == "running":
                    subprocess.Popen(json.loads(record.read_text())["argv"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def heartbeat(self) -> None:
        """The agent reached its leader: the containers' watchdogs wait on from here."""
        (self.root / "heartbeat").touch()
        os.utime(self.root / "heartbeat")

    def attempts(self) -> list[AttemptStatus]:
        """Every attempt of this node not yet forgotten, from Docker and the refusal records."""
        found: list[AttemptStatus] = []
        for container in self.client.containers.list(
                all=True, ignore_removed=True, filters={"label": [f"labq.agent={self.node}", "labq.managed=1"]}):
            status = self._container_status(container)
            if status is not None:
                found.append(status)
        for record in self._refused.glob("*.json"):
            with contextlib.suppress(FileNotFoundError, ValueError):
                found.append(self._refused_status(json.loads(record.read_text())))
        return sorted(found, key=lambda s: (s.job_id, s.attempt))

    def signal(self, job_id: int, attempt: int, sig: int) -> bool:
        """Send ``sig`` to the container (its init passes it to the job); False if it is not running."""
        container = self._container(job_id, attempt)
        if container is None or container.status != "running":
            return False
        try:
            container.kill(signal=int(sig))
        except docker.errors.APIError:  # exited meanwhile
            return False
        return True

    def stop(self, job_id: int, attempt: int, grace_s: float) -> None:
        """SIGTERM now, SIGKILL after ``grace_s``, in a background thread; returns at once."""
        key = (job_id, attempt)
        container = self._container(job_id, attempt)
        if container is None or container.status != "running":
            return
        with self._mutex:
            if key in self._stopping:
                return
            self._stopping.add(key)

        def stop() -> None:
            try:
                container.stop(timeout=max(0, int(round(grace_s))))
            except docker.errors.APIError:
                pass
            finally:
                with self._mutex:
                    self._stopping.discard(key)

        threading.Thread(target=stop, name=f"labq-stop-{job_id}.{attempt}", daemon=True).start()

    def forget(self, job_id: int, attempt: int) -> None:
        """Remove an exited attempt's container (or refusal record) once the leader has its end; keep its log."""
        status = self._find(job_id, attempt)
        if status is None:
            return
        if status.state is AttemptState.RUNNING:
            raise ValueError(f"attempt {job_id}.{attempt} is still running: stop it before forgetting it")
        container = self._container(job_id, attempt)
        if container is not None:
            tmpdir = (container.labels or {}).get(TMPDIR_LABEL, "")
            with contextlib.suppress(docker.errors.NotFound):
                container.remove()
            if os.path.isabs(tmpdir) and os.path.realpath(tmpdir) != "/":
                shutil.rmtree(tmpdir, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (self._refused / f"{job_id}.{attempt}.json").unlink()
        with contextlib.suppress(FileNotFoundError):
            self._done(job_id, attempt).unlink()

    def read_log(self, job_id: int, attempt: int, offset: int = 0, limit: int = 1 << 20) -> bytes:
        """Up to ``limit`` bytes of the log from ``offset``; KeyError for an attempt never seen."""
        if offset < 0 or limit < 0:
            raise ValueError("offset and limit must not be negative")
        try:
            with open(self._log(job_id, attempt), "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            raise KeyError((job_id, attempt)) from None

    # --- the rest -------------------------------------------------------------------------------

    def _container_status(self, container: Any) -> DockerAttemptStatus | None:
        labels = container.labels or {}
        try:
            key = (int(labels["labq.job"]), int(labels["labq.attempt"]))
        except (KeyError, ValueError):
            return None
        state = container.attrs.get("State", {})
        started = _timestamp(state.get("StartedAt")) or _timestamp(container.attrs.get("Created")) or time.time()
        log_path = str(self._log(*key))
        exited = container.status in ("exited", "dead") or (container.status == "created" and state.get("Error"))
        if not exited or not self._done(*key).exists():
            if container.status != "created":
                self._ensure_streamer(key)
            return DockerAttemptStatus(key[0], key[1], AttemptState.RUNNING, state.get("Pid") or None, None, None,
                                       started, None, log_path, image_signal=_label_signal(labels),
                                       container=container.name)
        code = state.get("ExitCode")
        oom = bool(state.get("OOMKilled"))
        sig = signals.SIGKILL if oom else (code - 128 if isinstance(code, int) and 128 < code < 128 + 65 else None)
        fenced = (self.root / "fenced" / container.name).exists()
        return DockerAttemptStatus(key[0], key[1], AttemptState.EXITED, None, code, sig, started,
                                   max(_timestamp(state.get("FinishedAt")) or started, started), log_path,
                                   fenced=fenced, image_signal=_label_signal(labels), oom=oom,
                                   container=container.name)

    def _refused_status(self, record: dict[str, Any]) -> DockerAttemptStatus:
        key = (record["job_id"], record["attempt"])
        return DockerAttemptStatus(key[0], key[1], AttemptState.EXITED, None, record["exit_code"], None,
                                   record["at"], record["at"], str(self._log(*key)))

    def _find(self, job_id: int, attempt: int) -> DockerAttemptStatus | None:
        container = self._container(job_id, attempt)
        if container is not None:
            return self._container_status(container)
        with contextlib.suppress(FileNotFoundError):
            return self._refused_status(json.loads((self._refused / f"{job_id}.{attempt}.json").read_text()))
        return None

    def _container(self, job_id: int, attempt: int) -> Any | None:
        try:
            container = self.client.containers.get(self.container_name(job_id, attempt))
        except docker.errors.NotFound:
            return None
        return container if container.labels.get("labq.agent") == self.node else None

    def _exists(self, job_id: int, attempt: int) -> bool:
        """The attempt has a container, a refusal or a log: it may never start (again)."""
        return (self._log(job_id, attempt).exists() or (self._refused / f"{job_id}.{attempt}.json").exists()
                or self._container(job_id, attempt) is not None)

    def _ensure_streamer(self, key: tuple[int, int]) -> None:
        with self._mutex:
            thread = self._streamers.get(key)
            if thread is not None and thread.is_alive():
                return
            thread = threading.Thread(target=self._stream, args=key, name=f"labq-log-{key[0]}.{key[1]}", daemon=True)
            self._streamers[key] = thread
        thread.start()

    def _stream(self, job_id: int, attempt: int) -> None:
        """Copy the container's output into its log until it exits, then mark the log complete.

        Holds an flock on the log: a streamer of another runtime (the agent before a restart)
        finishes first, and this one then skips what the file already has.
        """
        done = self._done(job_id, attempt)
        with open(self._log(job_id, attempt), "ab") as log:
            fcntl.flock(log, fcntl.LOCK_EX)
            while not done.exists():
                container = self._container(job_id, attempt)
                if container is None:  # removed behind our back: nothing more will come
                    done.touch()
                    return
                skip = log.tell()
                try:
                    for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
                        if skip >= len(chunk):
                            skip -= len(chunk)
                            continue
                        log.write(chunk[skip:])
                        log.flush()
                        skip = 0
                except (docker.errors.APIError, OSError) as err:  # the engine restarting: try again
                    log.flush()
                    time.sleep(1.0)
                    if isinstance(err, docker.errors.NotFound):
                        continue
                container = self._container(job_id, attempt)
                if container is None or container.status in ("exited", "dead"):
                    state = container.attrs.get("State", {}) if container is not None else {}
                    if state.get("OOMKilled"):
                        log.write(b"labq: the container ran out of memory and was killed (oom=True)\n")
                    log.flush()
                    done.touch()
                    return
                time.sleep(0.5)

    def _sweep(self) -> None:
        """Remove containers an agent created but died before starting: the leader asks again."""
        for container in self.client.containers.list(
                all=True, ignore_removed=True,
                filters={"label": [f"labq.agent={self.node}", "labq.managed=1"], "status": "created"}):
            if not container.attrs.get("State", {}).get("Error"):
                key = (int(container.labels["labq.job"]), int(container.labels["labq.attempt"]))
                with contextlib.suppress(docker.errors.APIError):
                    container.remove(force=True)
                with contextlib.suppress(FileNotFoundError):
                    self._log(*key).unlink()

    def _labels(self, job_id: int, attempt: int) -> dict[str, str]:
        return {"labq.job": str(job_id), "labq.attempt": str(attempt), "labq.agent": self.node,
                "labq.lab": self.lab, "labq.managed": "1"}

    @property
    def _instance(self) -> str:
        """This agent, as opposed to another lab's agent of the same name on a shared engine."""
        return hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:6]

    def container_name(self, job_id: int, attempt: int) -> str:
        """Unique on a shared engine: every lab numbers its jobs from 1. The node name (in Docker's
        alphabet) and a hash of this agent's folder, which stays the same across its restarts."""
        node = re.sub(r"[^a-zA-Z0-9_.-]", "_", self.node)
        return f"labq-{node}-{self._instance}-{job_id}-{attempt}"

    def _log(self, job_id: int, attempt: int) -> Path:
        return self._logs / f"{job_id}.{attempt}.log"

    def _done(self, job_id: int, attempt: int) -> Path:
        return self._logs / f".{job_id}.{attempt}.done"


__all__ = ["DockerAttemptStatus", "DockerLaunch", "DockerRuntime", "IsolationError"]
