"""Workstations and their GPUs, as the leader knows them.

A node says what it may give jobs besides its GPUs: its CPUs (by Linux CPU id), its memory (MiB), and for each
GPU the CPUs local to it (its NUMA node's CPU list, as NVML or ``/sys`` says). An agent of an older labq says
none of this: its CPUs and memory are unknown, and the scheduler places its jobs by GPUs alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

from labq.models.topology import Topology


@dataclass(frozen=True)
class Gpu:
    index: int  #: the node-local index, as NVML numbers it
    uuid: str  #: ``GPU-…`` from NVML, or ``SIM-…`` for a simulated GPU
    model: str  #: e.g. ``NVIDIA A100-SXM4-80GB``
    memory_mib: int  #: total memory
    #: the CPUs local to it (its NUMA node's CPU list), sorted; () where the agent did not say
    local_cpus: tuple[int, ...] = ()


MAX_CPU_ID = 8191  #: the highest CPU id a node may name (Linux builds for at most 8192 CPUs)


def cpu_list_text(cpus: tuple[int, ...] | list[int]) -> str:
    """CPU ids as Linux writes a CPU list: ``0-3,8,10-11`` (``""`` for none)."""
    ranges: list[str] = []
    ids = sorted(set(cpus))
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        ranges.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(ranges)


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """``0-3,8,10-11`` (a Linux CPU list, as ``/sys`` and ``cpuset`` write it) to sorted CPU ids; ValueError
    for anything else, or an id past ``MAX_CPU_ID``."""
    ids: set[int] = set()
    body = text.strip()
    if not body:
        return ()
    for part in body.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or dash and not high.isdigit():
            raise ValueError(f"{text!r} is not a CPU list such as 0-3,8")
        first, last = int(low), int(high) if dash else int(low)
        if first > last or last > MAX_CPU_ID:
            raise ValueError(f"{text!r}: CPU ids run from 0 to {MAX_CPU_ID}, each range low to high")
        ids.update(range(first, last + 1))
    return tuple(sorted(ids))


def cpu_mask(cpus) -> int:
    """CPU ids as a bit mask (bit ``i``: CPU ``i``)."""
    mask = 0
    for cpu in cpus:
        mask |= 1 << cpu
    return mask


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
    #: the CPUs its agent may give jobs (its own CPU affinity), sorted; (): not reported (an agent of an older labq)
    cpus: tuple[int, ...] = ()
    #: the memory its agent may give jobs (MiB, ``MemTotal``); None: not reported
    memory_mib: int | None = None

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

    @cached_property
    def cpu_mask(self) -> int:
        """Its CPUs as a bit mask (0: not reported); worked out once per node, not once per pass."""
        return cpu_mask(self.cpus)

    @cached_property
    def local_cpu_masks(self) -> tuple[int, ...]:
        """Per GPU, the node's CPUs local to it as a bit mask; all its CPUs where the GPU's are not known."""
        every = self.cpu_mask
        return tuple(cpu_mask(g.local_cpus) & every if g.local_cpus else every for g in self.gpus)

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
