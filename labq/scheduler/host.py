"""A node's CPUs and memory: what a job needs of them there, and the CPUs it gets.

What a job needs on each of its nodes is its spec's ``cpus`` and ``memory_mib`` where it says them. Where it
does not, the lab's default per GPU (``Policy.cpus_per_gpu``, ``mem_per_gpu_mib``) times its GPUs on that node,
else the node's share per GPU (its CPUs, its memory, over its GPUs) times those; a default never asks more than
the node has. The node's share counts whole CPUs, rounded down, so that jobs on all of a node's GPUs never need
more than it has together. A job that shares a GPU (``--share``) needs, by default, the part of one GPU's that
its GPU memory is of that GPU's.

A node is passed over for a job unless what it needs there is free besides the GPUs (held by no running job),
and a job waiting for it says which is short (``needs 16 CPUs; ws1 has 8 free``). Its GPU set is the best by
interconnect; where that set has a GPU whose NUMA node lacks free CPUs for it, the best set of GPUs whose NUMA
nodes have them, if there is one (``best_near_set``).

A job holds its CPUs to itself: ``ceil(cores)`` of them, with ``cores`` as its quota. They come from the NUMA
nodes of its GPUs, from each in proportion to its GPUs there, where free; then from the other free CPUs of its
GPUs' NUMA nodes; then from any free CPU, which its allocation counts (``NodeAllocation.far_cpus``). Within a
NUMA node the lowest ids go first: Linux numbers a socket's cores before their hyperthreads, so a job gets
whole cores before it gets siblings.

A node that reports no CPUs (an agent of an older labq) is placed by its GPUs alone, as one without memory is
for memory. Pure: CPU sets are bit masks (bit ``i``: CPU ``i``).
"""

from __future__ import annotations

from math import ceil, floor
from typing import NamedTuple

from labq.models.job import JobSpec
from labq.models.node import Node
from labq.models.sharing import mib_text
from labq.scheduler.placement import SetChoice, best_set
from labq.scheduler.policy import Policy

_EPSILON = 1e-9  #: 1.5 cores asked as 0.1 + 1.4 are still 2 CPUs, not 3


#: by node (found by identity, as ``placement`` finds topologies): what jobs of each shape need there, kept across
#: passes, since the simulator runs one per event and a need depends only on the job, the node and the policy
_NEEDS: dict[int, tuple[Node, dict]] = {}
NEEDS_KEPT = 4096  #: nodes, and answers per node, remembered


def needs_known(node: Node, defaults: tuple) -> dict:
    """The needs of job shapes on ``node`` under the lab's ``defaults`` worked out so far (the caller reads and
    fills it)."""
    hit = _NEEDS.get(id(node))
    if hit is None or hit[0] is not node:
        if len(_NEEDS) > NEEDS_KEPT:
            _NEEDS.clear()
        hit = _NEEDS[id(node)] = (node, {})
    table = hit[1].setdefault(defaults, {})
    if len(table) > NEEDS_KEPT:
        table.clear()
    return table


class HostNeed(NamedTuple):
    """What a job needs of one node besides GPUs."""

    cores: float | None  #: its quota of CPU time, in cores; None: the node does not report its CPUs
    count: int  #: the CPUs it holds there (0 where they are not known)
    memory_mib: int | None  #: None: the node does not report its memory


def need_on(spec: JobSpec, node: Node, policy: Policy, share_of_gpu: float = 1.0) -> HostNeed:
    """What ``spec`` needs of ``node``'s CPUs and memory. ``share_of_gpu``: for a job that shares one GPU, how
    much of that GPU's memory it declares (0 to 1)."""
    per_node = spec.gpus_per_node if spec.share_mib is None else share_of_gpu
    cores: float | None = None
    count = 0
    if node.cpus:
        have = len(node.cpus)
        if spec.cpus is not None:
            cores = spec.cpus
        elif policy.cpus_per_gpu is not None:
            cores = min(policy.cpus_per_gpu * per_node, have)
        else:  # the node's share, in whole CPUs
            cores = float(min(max(1, floor(have * per_node / max(1, node.gpu_count) + _EPSILON)), have))
        count = max(1, ceil(cores - _EPSILON))
    memory = None
    if node.memory_mib is not None:
        if spec.memory_mib is not None:
            memory = spec.memory_mib
        elif policy.mem_per_gpu_mib is not None:
            memory = min(int(policy.mem_per_gpu_mib * per_node), node.memory_mib)
        else:
            memory = min(int(node.memory_mib * per_node) // max(1, node.gpu_count), node.memory_mib)
    return HostNeed(cores, count, memory)


def near_gpus(node: Node, gpus: int, free_cpus: int, need: HostNeed, k: int) -> int:
    """Those of ``gpus`` whose NUMA node has free CPUs for one GPU's part of ``need`` (of ``k`` GPUs)."""
    per_gpu = ceil(need.count / max(1, k) - _EPSILON)
    local = node.local_cpu_masks
    near = 0
    for gpu in range(gpus.bit_length()):
        if gpus >> gpu & 1 and (local[gpu] & free_cpus).bit_count() >= per_gpu:
            near |= 1 << gpu
    return near


def lacks_near(node: Node, gpus: int, free_cpus: int, need: HostNeed, k: int) -> bool:
    """Whether a GPU of ``gpus`` has a NUMA node without free CPUs for its part of ``need``."""
    return near_gpus(node, gpus, free_cpus, need, k) != gpus


def best_near_set(node: Node, gpus: int, k: int, need: HostNeed, free_cpus: int | None) -> tuple[SetChoice | None,
                                                                                                    bool]:
    """The best ``k``-GPU set of ``gpus`` (``placement.best_set``); where it has a GPU whose NUMA node lacks free
    CPUs for ``need``, the best set of those whose NUMA nodes have them, if there is one. And whether it is that
    other set."""
    choice = best_set(node.topology, gpus, k)
    if free_cpus is None or choice is None:
        return choice, False
    near = near_gpus(node, gpus, free_cpus, need, k)
    if choice.mask & ~near:
        other = best_set(node.topology, near, k)
        if other is not None:
            return other, True
    return choice, False


def lowest(mask: int, n: int) -> int:
    """The ``n`` lowest CPUs of ``mask`` (all of them where it has fewer)."""
    out = 0
    while n > 0 and mask:
        low = mask & -mask
        out |= low
        mask ^= low
        n -= 1
    return out


def choose_cpus(node: Node, gpus: int, count: int, free: int) -> tuple[int, int] | None:
    """``count`` CPUs of ``free`` for a job on GPUs ``gpus`` of ``node``: (their mask, how many lie outside its
    GPUs' NUMA nodes); None when fewer are free."""
    if free.bit_count() < count:
        return None
    local = node.local_cpu_masks
    groups: dict[int, int] = {}  # a NUMA node's CPUs -> the job's GPUs there
    for gpu in range(gpus.bit_length()):
        if gpus >> gpu & 1:
            groups[local[gpu]] = groups.get(local[gpu], 0) + 1
    k = sum(groups.values())
    if not k:
        return lowest(free, count), 0
    order = sorted(groups.items(), key=lambda group: group[0] & -group[0])  # NUMA nodes by their first CPU
    shares = [count * n // k for _, n in order]
    for i in range(count - sum(shares)):
        shares[i] += 1
    chosen = 0
    for (cpus, _), share in zip(order, shares):
        chosen |= lowest(free & cpus & ~chosen, share)
    near = 0
    for cpus in groups:
        near |= cpus
    chosen |= lowest(free & near & ~chosen, count - chosen.bit_count())
    short = count - chosen.bit_count()
    chosen |= lowest(free & ~chosen, short)
    return chosen, short


def short_text(need: HostNeed, free_cpus: int | None, free_memory: int | None, node: str, nodes: int = 1) -> str | None:
    """What a node lacks for ``need``, as a reason says it (``needs 16 CPUs; ws1 has 8 free``; a job of several
    nodes needs them ``on each of 2 nodes``); None if nothing."""
    each = f" on each of {nodes} nodes" if nodes > 1 else ""
    said = []
    if free_cpus is not None and free_cpus.bit_count() < need.count:
        said.append(f"needs {need.count} CPUs{each}; {node} has {free_cpus.bit_count()} free")
    if free_memory is not None and need.memory_mib is not None and free_memory < need.memory_mib:
        said.append(f"needs {mib_text(need.memory_mib)} of memory{each}; {node} has {mib_text(max(0, free_memory))} "
                    "free")
    return "; ".join(said) or None
