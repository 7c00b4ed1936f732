"""Workstations and their GPUs, as the leader knows them."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from labq.models.topology import Topology


@dataclass(frozen=True)
class Gpu:
    index: int  #: the node-local index, as NVML numbers it
    uuid: str  #: ``GPU-…`` from NVML, or ``SIM-…`` for a simulated GPU
    model: str  #: e.g. ``NVIDIA A100-SXM4-80GB``
    memory_mib: int  #: total memory


@dataclass(frozen=True)
class Account:
    """How a node runs one lab user's jobs: as which local account, or why it cannot (``problem``)."""

    user: str  #: the lab's user name
    login: str | None = None  #: the local account; another name where the agent's user map says so
    uid: int | None = None
    gid: int | None = None
    problem: str | None = None  #: e.g. "no such user on this machine"; None: the node runs the user's jobs


@dataclass(frozen=True)
class NodeProblem:
    """A reason of the node, not of the job, why jobs fail to start there, as its agent reports it.

    It concerns the jobs it names (one user's, one runtime's, one image's; all of them where it names
    none): the scheduler places none of those on the node while its agent reports the problem.
    """

    detail: str  #: a sentence, e.g. "docker is not available on node ws1: ..."
    user: str | None = None  #: only this lab user's jobs
    runtime: str | None = None  #: only jobs of this runtime ("process", "docker")
    image: str | None = None  #: only jobs of this container image

    def concerns(self, user: str, runtime: str, image: str | None) -> bool:
        return ((self.user is None or self.user == user) and (self.runtime is None or self.runtime == runtime)
                and (self.image is None or self.image == image))


class NodeHealth(str, Enum):
    UP = "up"  #: takes new jobs
    DRAINING = "draining"  #: keeps its running jobs, takes no new ones
    DOWN = "down"  #: taken out by an admin
    LOST = "lost"  #: missed its lease; its jobs may still be running


@dataclass(frozen=True)
class Node:
    name: str
    gpus: tuple[Gpu, ...]
    topology: Topology
    health: NodeHealth = NodeHealth.UP
    #: GPU indices busy with processes labq did not start (someone's notebook)
    unmanaged_busy: frozenset[int] = frozenset()
    #: simulated GPUs are handed to jobs by index, real ones by UUID
    simulated: bool = False
    labels: tuple[str, ...] = field(default=())
    #: how the node maps the lab's users to local accounts, as its agent last reported (empty: not reported)
    accounts: tuple[Account, ...] = ()
    #: what keeps jobs from starting here now, as its agent last reported
    problems: tuple[NodeProblem, ...] = ()
    #: (GPU index, MiB) of GPU memory that processes outside labq use, where NVML says: a job that shares a GPU
    #: is placed only where it fits beside them (``labq.models.sharing``)
    unmanaged_mib: tuple[tuple[int, int], ...] = ()
    #: whether jobs may share its GPUs by memory (``--share``): not where its agent cannot watch each process's GPU
    #: memory, or where another scheduler hands out whole GPUs (a Slurm node)
    shares: bool = True
    #: whether its agent hands jobs to another scheduler that starts one only once its GPUs are free (a Slurm
    #: node): a job that preempts there is handed over while its victims checkpoint, and starts when they end
    hands_over: bool = False

    def __post_init__(self) -> None:
        if [g.index for g in self.gpus] != list(range(len(self.gpus))):
            raise ValueError(f"node {self.name}: GPUs must be indexed 0..{len(self.gpus) - 1} in order")
        if self.topology.size != len(self.gpus):
            raise ValueError(
                f"node {self.name}: topology describes {self.topology.size} GPUs but the node has {len(self.gpus)}"
            )

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def unmanaged_on(self, index: int) -> int:
        """The GPU memory processes outside labq use on GPU ``index`` (0 where none do, or NVML does not say)."""
        for gpu, mib in self.unmanaged_mib:
            if gpu == index:
                return mib
        return 0

    @property
    def schedulable(self) -> bool:
        return self.health is NodeHealth.UP

    def account_problem(self, user: str) -> str | None:
        """Why this node cannot run ``user``'s jobs as a local account; None if it can or has not said."""
        for account in self.accounts:
            if account.user == user:
                return account.problem
        return None

    def refuses(self, user: str, runtime: str = "process", image: str | None = None) -> str | None:
        """Why this node cannot start a job of ``user`` (of that runtime and image) now; None if it can."""
        problem = self.account_problem(user) if self.accounts else None
        if problem is not None:
            return f"no account for {user} on {self.name}: {problem}"
        for found in self.problems:
            if found.concerns(user, runtime, image):
                return found.detail
        return None
