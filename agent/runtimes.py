"""The agent's runtimes behind one face: attempts from all of them, each attempt's calls to its owner.

Each runtime keeps the ``Runtime`` contract below. Which one runs a job is its spec's ``runtime``
(``labq.models.job.Runtime``), looked up in one table (``Runtimes._engine``): process jobs run under the shim,
or as Slurm batch jobs on a node that hands its jobs to Slurm; container jobs in Docker. Docker is opened
only when a container job arrives, or at start when an earlier agent left containers to re-adopt, so a
workstation without Docker runs process jobs as before.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from labq.agent.faults import NodeFault, sentence
from labq.agent.process_runtime import AttemptStatus, Launch, ProcessRuntime, Start
from labq.models.job import Runtime as JobRuntime
from labq.models.node import NodeProblem
from labq.protocol.agents import RunOrder

log = logging.getLogger("labq.agent")
PROBE_TIMEOUT_S = 5.0  #: a look at the Docker daemon, for a problem the node reports


class Runtime(Protocol):
    """What runs a job's attempts on this node and knows them afterwards, across agent restarts."""

    def launch_of(self, order: RunOrder, start: Start) -> Launch:
        """The launch it takes for an order, with what this node adds (``Launch.of``, ``DockerLaunch.of``)."""

    def launch(self, launch: Launch) -> AttemptStatus:
        """Start an attempt; ValueError if it cannot (the job's fault), ``NodeFault`` if that is this machine's."""

    def signal(self, job_id: int, attempt: int, sig: int) -> bool:
        """Send ``sig`` to a running attempt; False if it is not running."""

    def stop(self, job_id: int, attempt: int, grace_s: float) -> None:
        """TERM, then KILL after ``grace_s``."""

    def attempts(self) -> list[AttemptStatus]:
        """Every attempt it knows: running, or exited and not yet forgotten."""

    def forget(self, job_id: int, attempt: int) -> None:
        """Drop an exited attempt the leader has recorded (its log is kept)."""

    def read_log(self, job_id: int, attempt: int, offset: int = 0, limit: int = 1 << 20) -> bytes:
        """Up to ``limit`` bytes of the attempt's log from ``offset``; KeyError if it has none."""


class Runtimes:
    def __init__(self, state_dir: Path, node: str, lab: str = "", slurm=None) -> None:
        """``slurm``: a ``labq.agent.slurm.SlurmSite``: this node's jobs run as Slurm batch jobs there."""
        self.state_dir = state_dir
        self.node = node
        self.lab = lab
        self.process = ProcessRuntime(state_dir / "runtime")
        self.slurm = None
        if slurm is not None:
            from labq.agent.slurm import SlurmRuntime

            self.slurm = SlurmRuntime(state_dir / "slurm", slurm, slurm.node or slurm.slurm_node())
        self.allowed_roots: tuple[str, ...] = ()
        self.allowed_images: tuple[str, ...] = ()
        self.checkpoint_areas: tuple[str, ...] = ()
        self._docker = None
        if (state_dir / "docker").exists():
            try:
                self.docker()
            except ValueError as err:
                log.warning("containers of an earlier agent cannot be re-adopted: %s", err)

    def set_policy(self, allowed_roots: tuple[str, ...], allowed_images: tuple[str, ...],
                   checkpoint_areas: tuple[str, ...] = (), allow_root: bool = False) -> None:
        """The leader's policy, checked again here on this machine's resolved paths.

        ``allowed_roots`` are the admin's: a job mounts nothing else. ``checkpoint_areas`` hold every job's
        checkpoint folder: no job may mount in them, since the agent mounts each job's own folder for it.
        ``allow_root``: whether a process job may run as uid 0 (containers never do).
        """
        self.allowed_roots = tuple(allowed_roots)
        self.allowed_images = allowed_images
        self.checkpoint_areas = tuple(checkpoint_areas)
        self.process.allow_root = allow_root
        if self._docker is not None:
            self._share_policy(self._docker)

    def _share_policy(self, docker_runtime) -> None:
        docker_runtime.allowed_roots, docker_runtime.allowed_images = self.allowed_roots, self.allowed_images
        docker_runtime.checkpoint_areas = self.checkpoint_areas

    def docker(self):
        if self._docker is None:
            try:
                import docker

                from labq.agent.docker_runtime import DockerRuntime

                self._docker = DockerRuntime(self.state_dir / "docker", self.node, lab=self.lab)
                self._share_policy(self._docker)
            except (ImportError, docker.errors.DockerException) as err:
                why = f"docker is not available on node {self.node}: {sentence(err)}"
                raise NodeFault(why, NodeProblem(why, runtime="docker")) from None
        return self._docker

    def _engine(self, runtime: JobRuntime) -> Runtime:
        """The runtime that runs jobs of ``runtime`` here: the one table of them."""
        engines = {JobRuntime.PROCESS: lambda: self.slurm or self.process, JobRuntime.DOCKER: self._containers}
        return engines[runtime]()

    def _containers(self) -> Runtime:
        if self.slurm is not None:
            why = f"node {self.node} runs its jobs through Slurm, and container jobs are not run that way yet"
            raise NodeFault(why, NodeProblem(why, runtime="docker"))
        return self.docker()

    def launch(self, order: RunOrder, start: Start) -> AttemptStatus:
        """Start the attempt an order asks for, in the runtime its spec names; ValueError if it cannot start,
        ``NodeFault`` if that is this machine's fault."""
        engine = self._engine(order.spec.runtime)
        launch = engine.launch_of(order, start)
        try:
            return engine.launch(launch)
        except (ValueError, NodeFault):
            raise
        except Exception as err:  # noqa: BLE001 - sorted below: the engine's fault, or a refusal of the job
            if engine is not self._docker:
                raise
            raise self._docker_failure(err) from None

    def _docker_failure(self, err: Exception) -> Exception:
        """What a Docker error in a launch means: the engine refused the container (the job's fault), or it
        is out of reach or failed on its side (this machine's). Anything else is no Docker error: as it was."""
        import docker.errors
        import requests.exceptions

        if isinstance(err, docker.errors.APIError) and not err.is_server_error():
            return ValueError(f"docker refused the container: {sentence(err.explanation or err)}")
        if isinstance(err, (docker.errors.DockerException, requests.exceptions.RequestException)):
            why = f"docker is not reachable on node {self.node}: {sentence(err)}"
            return NodeFault(why, NodeProblem(why, runtime="docker"))
        return err

    def attempts(self) -> list[AttemptStatus]:
        found = self.process.attempts()
        if self._docker is not None:
            found += self._docker.attempts()
        if self.slurm is not None:
            found += self.slurm.attempts()
        return found

    def waiting(self, job_id: int, attempt: int) -> str | None:
        """Why an attempt handed to another scheduler (Slurm) has not started there yet; None if it runs."""
        return self.slurm.waiting(job_id, attempt) if self.slurm is not None else None

    def _owner(self, job_id: int, attempt: int):
        if self.slurm is not None and self.slurm.owns(job_id, attempt):
            return self.slurm
        if self._docker is not None and any(s.job_id == job_id and s.attempt == attempt
                                            for s in self._docker.attempts()):
            return self._docker
        return self.process

    def signal(self, job_id: int, attempt: int, sig: int) -> bool:
        return self._owner(job_id, attempt).signal(job_id, attempt, sig)

    def stop(self, job_id: int, attempt: int, grace_s: float) -> None:
        self._owner(job_id, attempt).stop(job_id, attempt, grace_s)

    def forget(self, job_id: int, attempt: int) -> None:
        self._owner(job_id, attempt).forget(job_id, attempt)

    def read_log(self, job_id: int, attempt: int, offset: int = 0, limit: int = 1 << 20) -> bytes:
        if self.slurm is not None and self.slurm.owns(job_id, attempt):
            return self.slurm.read_log(job_id, attempt, offset, limit)
        try:
            return self.process.read_log(job_id, attempt, offset, limit)
        except KeyError:
            if self.slurm is not None:
                return self.slurm.read_log(job_id, attempt, offset, limit)
            if self._docker is None:
                raise
            return self._docker.read_log(job_id, attempt, offset, limit)

    def still_there(self, problem: NodeProblem) -> bool | None:
        """Whether a Docker problem of this node is still there: the daemon out of reach, an image missing.
        None for any other problem: this cannot tell. A look takes at most ``PROBE_TIMEOUT_S``."""
        if problem.runtime != "docker" or problem.user is not None:
            return None
        try:
            import docker

            client = docker.from_env(timeout=PROBE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - no engine, or no docker package: still out of reach
            return problem.image is None or None
        try:
            if problem.image is None:
                return not client.ping()
            client.images.get(problem.image)
            return False
        except docker.errors.ImageNotFound:
            return True
        except Exception:  # noqa: BLE001 - the engine failed the look: the daemon problem says so, if any
            return problem.image is None or None
        finally:
            client.close()

    def refuse(self, job_id: int, attempt: int, reason: str, exit_code: int = 126, *,
               node_fault: bool = False) -> AttemptStatus:
        return self.process.refuse(job_id, attempt, reason, exit_code, node_fault=node_fault)

    def heartbeat(self) -> None:
        self.process.heartbeat()
        if self._docker is not None:
            self._docker.heartbeat()
