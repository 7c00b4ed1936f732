"""``--cluster``: ``16xsim:dgx1`` or ``4xsim:dgx1,2xsim:ws-4x3090`` into simulated nodes."""

from __future__ import annotations

import re

from labq.models.node import Node
from labq.topologies import parse_sim_spec

_PART = re.compile(r"^\s*(?:(\d+)\s*[x*]\s*)?(\S+?)\s*$")
MAX_NODES = 10_000


def parse_cluster(spec: str) -> list[Node]:
    """Nodes named after their inventory and number (``dgx1-00``, ``dgx1-01``, ``ws-4x3090-00``), with the CPUs and
    memory of the machine they model.

    Raises ValueError saying what is accepted."""
    if not spec or not spec.strip():
        raise ValueError("the cluster is empty: say e.g. 16xsim:dgx1 or 4xsim:dgx1,2xsim:ws-4x3090")
    nodes: list[Node] = []
    counts: dict[str, int] = {}
    for part in spec.split(","):
        match = _PART.match(part)
        if not match:
            raise ValueError(f"{part!r} in --cluster: write COUNTxsim:INVENTORY, e.g. 16xsim:dgx1")
        count = int(match[1]) if match[1] else 1
        if count < 1:
            raise ValueError(f"{part.strip()!r} in --cluster: the count must be 1 or more")
        inventory = parse_sim_spec(match[2])  # raises with the list of inventories
        base = match[2].lower().removeprefix("sim:").replace(":", "-")
        for _ in range(count):
            n = counts.get(base, 0)
            counts[base] = n + 1
            name = f"{base}-{n:02d}"
            nodes.append(inventory.node(name))  # its CPUs, NUMA nodes and memory too
        if len(nodes) > MAX_NODES:
            raise ValueError(f"--cluster {spec!r} has more than {MAX_NODES} nodes")
    return nodes


def vc_cluster(nodes: int, inventory: str = "sim:dgx1") -> str:
    """The spec of a virtual cluster of ``nodes`` nodes (the Philly trace's sizes are in nodes of 8 GPUs)."""
    return f"{nodes}x{inventory}"
