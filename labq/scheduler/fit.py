"""Which GPUs may serve a job, and whether a job can ever fit the lab at all."""

from __future__ import annotations

from collections.abc import Iterable
from math import ceil

from labq.models.decisions import PendingReason
from labq.models.job import JobSpec
from labq.models.node import Node
from labq.models.reservation import Reservation
from labq.models.sharing import margin_mib


def gpu_matches(spec: JobSpec, model: str, memory_mib: int) -> bool:
    if memory_mib < spec.min_gpu_memory_mib:
        return False
    return spec.gpu_model is None or spec.gpu_model.lower() in model.lower()


def eligible_mask(spec: JobSpec, node: Node) -> int:
    """GPUs of ``node`` that the job may use, whatever runs on them now."""
    if spec.node is not None and spec.node != node.name:
        return 0
    if spec.gpu_model is None and spec.min_gpu_memory_mib <= 0:  # most jobs: any GPU not busy outside labq
        mask = (1 << len(node.gpus)) - 1
        for index in node.unmanaged_busy:
            mask &= ~(1 << index)
        return mask
    mask = 0
    for gpu in node.gpus:
        if gpu.index not in node.unmanaged_busy and gpu_matches(spec, gpu.model, gpu.memory_mib):
            mask |= 1 << gpu.index
    return mask


def no_account(user: str, nodes: Iterable[str]) -> str:
    """The sentence for a user whom ``nodes`` have no local account for."""
    return f"no account for {user} on {', '.join(sorted(nodes))}"


def why_no_node_runs_user(user: str, nodes: Iterable[Node]) -> str | None:
    """For a submit: "no account for bob on ws1, ws2" when every node of the lab has said it has no
    account for ``user``; None when some node runs their jobs, or has not said (an agent of an older
    labq, one that has not synced since the user was added), or the lab has no nodes yet."""
    nodes = list(nodes)
    lacking = [n.name for n in nodes if n.account_problem(user) is not None]
    if not nodes or len(lacking) < len(nodes):
        return None
    return no_account(user, lacking)


def why_kept_off(user: str, runtime: str, image: str | None, nodes: list[Node]) -> tuple[PendingReason, str]:
    """Why a job waits when only ``nodes``, which cannot start it now, could run it: User when some lack an
    account for its user ("no account for bob on ws1, ws2"), with the other nodes' own problems after."""
    lacking = [n.name for n in nodes if n.account_problem(user) is not None]
    problems = [why for n in nodes if n.name not in lacking and (why := n.refuses(user, runtime, image))]
    if lacking:
        return PendingReason.USER, "; ".join([no_account(user, lacking), *problems])
    return PendingReason.RESOURCES, f"no node that is up can start it now: {'; '.join(problems)}"


def _mib(value: int) -> str:
    return f"{value / 1024:g} GiB" if value % 1024 == 0 or value > 10240 else f"{value} MiB"


def _size_flag(mib: int) -> str:
    """MiB as ``--mem`` takes it: ``256G``, ``1500M``."""
    return f"{mib // 1024}G" if mib % 1024 == 0 else f"{mib}M"


def _shares_fit(spec: JobSpec, memory_mib: int) -> bool:
    return spec.share_mib is None or memory_mib - margin_mib(memory_mib) >= spec.share_mib


def _cpus_fit(spec: JobSpec, node: Node) -> bool:
    """The node has the CPUs the job asks for (``--cpus``), or does not say how many it has."""
    return spec.cpus is None or not node.cpus or len(node.cpus) >= ceil(spec.cpus - 1e-9)


def _memory_fits(spec: JobSpec, node: Node) -> bool:
    """The node has the memory the job asks for (``--mem``), or does not say how much it has."""
    return spec.memory_mib is None or node.memory_mib is None or node.memory_mib >= spec.memory_mib


def _gpus_fit(spec: JobSpec, node: Node) -> bool:
    """The node has enough GPUs the job may use, when idle."""
    if spec.node is not None and node.name != spec.node or spec.share_mib is not None and not node.shares:
        return False
    return sum(1 for g in node.gpus
               if gpu_matches(spec, g.model, g.memory_mib) and _shares_fit(spec, g.memory_mib)) >= spec.gpus_per_node


def _fits_when_idle(spec: JobSpec, nodes: list[Node] | tuple[Node, ...], host: bool = True) -> bool:
    """Whether enough nodes have enough suitable GPUs (and, with ``host``, the CPUs and memory it asks for): the
    usual answer, found at the first nodes that fit.

    Checked before anything else because why_never_fits runs for every job shape in every pass,
    and on a lab of many alike nodes the first node settles it.
    """
    host = host and (spec.cpus is not None or spec.memory_mib is not None)  # a default always fits
    missing = spec.nodes
    for node in nodes:
        if _gpus_fit(spec, node) and (not host or _cpus_fit(spec, node) and _memory_fits(spec, node)):
            missing -= 1
            if not missing:
                return True
    return False


def _why_host_never_fits(spec: JobSpec, nodes: list[Node] | tuple[Node, ...]) -> str:
    """Why a job that enough nodes have GPUs for fits none of them for the CPUs or memory it asks for."""
    fitting = [n for n in nodes if _gpus_fit(spec, n)]
    each = "" if spec.nodes == 1 else f" on each of {spec.nodes} nodes"
    cpus_fit = sum(_cpus_fit(spec, n) for n in fitting)
    if cpus_fit < spec.nodes:
        if spec.nodes > 1:
            return (f"asks for {spec.cpus:g} CPUs{each} but only {cpus_fit} node(s) that have its GPUs have that "
                    "many CPUs")
        most = max(fitting, key=lambda n: (len(n.cpus), n.name))
        return (f"asks for {spec.cpus:g} CPUs but the largest node that has its GPUs ({most.name}) has "
                f"{len(most.cpus)}; ask for --cpus {len(most.cpus)} or fewer")
    memory_fits = sum(_memory_fits(spec, n) for n in fitting)
    if memory_fits < spec.nodes:
        if spec.nodes > 1:
            return (f"asks for {_mib(spec.memory_mib)} of memory{each} but only {memory_fits} node(s) that have its "
                    "GPUs have that much")
        most = max(fitting, key=lambda n: (n.memory_mib or 0, n.name))
        return (f"asks for {_mib(spec.memory_mib)} of memory but the largest node that has its GPUs ({most.name}) "
                f"has {_mib(most.memory_mib or 0)}; ask for --mem {_size_flag(most.memory_mib or 0)} or less")
    return (f"asks for {spec.cpus:g} CPUs and {_mib(spec.memory_mib)} of memory{each}, and too few nodes that "
            "have its GPUs have both")


def why_never_fits(spec: JobSpec, nodes: list[Node] | tuple[Node, ...]) -> str | None:
    """None if some set of the given nodes could run ``spec`` when idle; else why not, and what would fit."""
    if spec.gpus == 0:
        return None
    if not nodes:
        return "the lab has no nodes yet: start an agent (labq agent) first"
    if _fits_when_idle(spec, nodes):
        return None
    if (spec.cpus is not None or spec.memory_mib is not None) and _fits_when_idle(spec, nodes, host=False):
        return _why_host_never_fits(spec, nodes)
    gpn = spec.gpus_per_node
    if spec.node is not None:
        named = [n for n in nodes if n.name == spec.node]
        if not named:
            return f"there is no node {spec.node!r}; nodes: {', '.join(sorted(n.name for n in nodes))}"
        nodes = named
    if spec.gpu_model is not None:
        models = sorted({g.model for n in nodes for g in n.gpus})
        if not any(spec.gpu_model.lower() in m.lower() for m in models):
            return f"no GPU model matches {spec.gpu_model!r}; the lab has: {', '.join(models)}"
    biggest = max(g.memory_mib for n in nodes for g in n.gpus) if any(n.gpus for n in nodes) else 0
    if spec.min_gpu_memory_mib > biggest:
        return f"asks for GPUs with {_mib(spec.min_gpu_memory_mib)} but the largest GPU has {_mib(biggest)}"
    if spec.share_mib is not None:
        sharing = [g.memory_mib for n in nodes if n.shares for g in n.gpus]
        if not sharing:
            where = f"node {spec.node} does not" if spec.node is not None else "no node of the lab does"
            return (f"shares a GPU (--share), and {where} let jobs share its GPUs (a Slurm node hands out whole "
                    "GPUs, and their memory is not watched there): submit it without --share")
        biggest = max(sharing)
        return (f"declares {_mib(spec.share_mib)} of GPU memory to share a GPU, but no GPU it may use has that "
                f"much beside its margin (the largest has {_mib(biggest)}, less {_mib(margin_mib(biggest))})")
    counts = sorted(
        (sum(1 for g in n.gpus if gpu_matches(spec, g.model, g.memory_mib)), n.name) for n in nodes
    )
    fitting = [name for count, name in counts if count >= gpn]
    if len(fitting) >= spec.nodes:
        return None
    largest, largest_node = counts[-1]
    if spec.nodes == 1:
        hint = f"ask for --gpus {largest} or fewer" if largest else "relax the GPU model or memory filter"
        if largest and spec.gpus > largest and len(nodes) > 1:
            hint += ", or spread it with --nodes"
        return (
            f"asks for {spec.gpus} GPUs on one node but the largest suitable node "
            f"({largest_node}) has {largest}; {hint}"
        )
    return (
        f"asks for {gpn} GPUs on each of {spec.nodes} nodes but only {len(fitting)} "
        f"node(s) have {gpn} suitable GPUs"
    )


def why_never_fits_reservation(spec: JobSpec, r: Reservation, node: Node | None, *, now: float,
                               stops_at_end: bool) -> str | None:
    """None if ``spec`` could run inside reservation ``r`` (pinned to ``node``); else why not, and what would.

    A booking holds its GPUs on one node for [start, end): a job asking for more GPUs, or GPUs of
    another model or memory than the pinned ones, or more nodes, can never start in it; nor can one
    whose time limit runs past the end when the lab stops jobs at a booking's end.
    """
    if r.end <= now:
        return f"reservation {r.name!r} has ended; submit without --reservation"
    if spec.nodes > 1:
        return f"reservation {r.name!r} holds GPUs on one node; this job asks for {spec.nodes} nodes"
    if spec.gpus > r.gpus:
        return f"asks for {spec.gpus} GPUs but reservation {r.name!r} holds {r.gpus}; ask for --gpus {r.gpus} or fewer"
    if node is not None and r.node == node.name and r.gpu_indices:
        pinned = [node.gpus[i] for i in r.gpu_indices if i < len(node.gpus)]
        suitable = sum(1 for g in pinned if gpu_matches(spec, g.model, g.memory_mib))
        if suitable < spec.gpus:
            kinds = ", ".join(sorted({f"{g.model} {_mib(g.memory_mib)}" for g in pinned}))
            return (f"reservation {r.name!r} holds {kinds}; {suitable} of its GPUs match this job's model and "
                    f"memory filter, and it asks for {spec.gpus}")
    if stops_at_end and spec.time_limit_s is not None:
        left = r.end - max(r.start, now)
        if left < 60:
            return f"reservation {r.name!r} ends in less than a minute; submit without --reservation"
        if spec.time_limit_s > left:
            return (f"its time limit ({_hours(spec.time_limit_s)}) runs past the end of reservation {r.name!r}, where "
                    f"the lab stops its jobs; ask for --time {_hours(left)} or less")
    return None


def _hours(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{max(minutes, 1)}m"
