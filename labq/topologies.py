"""Named simulated GPU inventories, as pure data.

``sim:dgx1`` and friends describe real machine types closely enough that the
scheduler places jobs on them as it would on the real thing: their GPUs and
interconnect, and their CPUs (numbered as Linux numbers them, hyperthreads
after the cores), NUMA nodes and memory. They serve the agent on machines
without an NVIDIA GPU (``labq agent --gpus sim:dgx1``), the demo, and the
simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from labq.models.node import Gpu, Node
from labq.models.topology import PcieLevel, Topology

GIB = 1024  # MiB


@dataclass(frozen=True)
class SimInventory:
    name: str
    description: str
    model: str
    memory_mib: int  #: each GPU's memory
    topology: Topology
    #: the CPU ids of each NUMA node, by NUMA node id (``topology.numa`` says each GPU's); () where not modelled
    numa_cpus: tuple[tuple[int, ...], ...] = ()
    host_memory_mib: int | None = None  #: the machine's memory

    @property
    def gpu_count(self) -> int:
        return self.topology.size

    @property
    def cpus(self) -> tuple[int, ...]:
        """Every CPU of the machine, by id."""
        return tuple(sorted(cpu for cpus in self.numa_cpus for cpu in cpus))

    def local_cpus(self, index: int) -> tuple[int, ...]:
        """The CPUs of GPU ``index``'s NUMA node."""
        numa = self.topology.numa[index] if self.topology.numa else None
        return self.numa_cpus[numa] if numa is not None and numa < len(self.numa_cpus) else ()

    def gpus(self, node: str) -> tuple[Gpu, ...]:
        """The GPUs, with UUIDs unique to this node and stable across restarts, and the CPUs near each."""
        return tuple(
            Gpu(index=i, uuid=f"SIM-{node}-{self.name}-{i}", model=self.model, memory_mib=self.memory_mib,
                local_cpus=self.local_cpus(i))
            for i in range(self.gpu_count)
        )

    def node(self, name: str, **facts) -> Node:
        """The machine as a node of that name: its GPUs, wiring, CPUs and memory (``facts``: more ``Node`` fields)."""
        return Node(name, self.gpus(name), self.topology, simulated=True, cpus=self.cpus,
                    memory_mib=self.host_memory_mib, **facts)


def _sockets(cores: int, sockets: int = 2, threads: int = 2) -> tuple[tuple[int, ...], ...]:
    """The CPU ids of each socket (one NUMA node each) as Linux numbers them: every socket's cores first, then
    their hyperthreads in the same order (socket 0 of two 20-core sockets: 0-19 and 40-59)."""
    total = cores * sockets
    return tuple(tuple(t * total + s * cores + c for t in range(threads) for c in range(cores))
                 for s in range(sockets))


def _two_sockets(
    size: int, switch: int, in_switch: PcieLevel, in_socket: PcieLevel
) -> dict[tuple[int, int], PcieLevel]:
    """GPUs in blocks of ``switch`` under PCIe switches; the first half on socket 0, the rest on 1."""
    half = size // 2
    table = {}
    for i, j in combinations(range(size), 2):
        if i // switch == j // switch:
            table[i, j] = in_switch
        elif i // half == j // half:
            table[i, j] = in_socket
        else:
            table[i, j] = PcieLevel.SYSTEM
    return table


def _dgx1() -> SimInventory:
    # The DGX-1 with V100s: a hybrid cube-mesh. Each GPU has six NVLink links;
    # GPUs 0-3 and 4-7 form two fully connected quads, and each GPU has one
    # link pair to its twin in the other quad.
    nvlinks = {
        (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
        (1, 2): 2, (1, 3): 1, (1, 5): 2,
        (2, 3): 2, (2, 6): 1,
        (3, 7): 1,
        (4, 5): 1, (4, 6): 1, (4, 7): 2,
        (5, 6): 2, (5, 7): 1,
        (6, 7): 2,
    }
    topo = Topology.from_pairs(
        8,
        _two_sockets(8, 2, PcieLevel.SWITCH, PcieLevel.HOST_BRIDGE),
        nvlinks,
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
    )
    return SimInventory("dgx1", "DGX-1: 8x V100 32 GB, hybrid cube-mesh NVLink, 2 sockets of 20 cores, 512 GB",
                        "Tesla V100-SXM2-32GB", 32 * GIB, topo, _sockets(20), 512 * GIB)


def _dgx_a100() -> SimInventory:
    # Every A100 has 12 NVLink links into six NVSwitches: all pairs are equal
    # on NVLink. PCIe: pairs behind two levels of switches, 4 GPUs per socket.
    topo = Topology.from_pairs(
        8,
        _two_sockets(8, 2, PcieLevel.MULTI_SWITCH, PcieLevel.NUMA),
        nvswitch_links=(12,) * 8,
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
    )
    return SimInventory("dgx-a100", "DGX A100: 8x A100 80 GB on NVSwitch, 2 sockets of 64 cores, 1 TB",
                        "NVIDIA A100-SXM4-80GB", 80 * GIB, topo, _sockets(64), 1024 * GIB)


def _dgx2() -> SimInventory:
    # 16 V100s, each with 6 links into the NVSwitch fabric; PCIe switches of
    # two GPUs, eight GPUs per socket.
    topo = Topology.from_pairs(
        16,
        _two_sockets(16, 2, PcieLevel.MULTI_SWITCH, PcieLevel.NUMA),
        nvswitch_links=(6,) * 16,
        numa=(0,) * 8 + (1,) * 8,
    )
    return SimInventory("dgx2", "DGX-2: 16x V100 32 GB on NVSwitch, 2 sockets of 24 cores, 1.5 TB",
                        "Tesla V100-SXM3-32GB", 32 * GIB, topo, _sockets(24), 1536 * GIB)


def _pcie_2socket() -> SimInventory:
    # A common 8-GPU server without NVLink: pairs share a PCIe switch, four GPUs
    # per CPU socket, sockets joined by the CPU interconnect.
    topo = Topology.from_pairs(
        8,
        _two_sockets(8, 2, PcieLevel.SWITCH, PcieLevel.HOST_BRIDGE),
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
    )
    return SimInventory("pcie-2socket", "8x RTX A6000 48 GB on PCIe: pairs under switches, 4 per socket "
                        "of 24 cores, 512 GB", "NVIDIA RTX A6000", 48 * GIB, topo, _sockets(24), 512 * GIB)


def _ws_4x3090() -> SimInventory:
    # A lab workstation: four RTX 3090s on one CPU's root ports, GPUs 0+1 and
    # 2+3 joined by NVLink bridges (4 links each).
    topo = Topology.from_pairs(
        4,
        PcieLevel.HOST_BRIDGE,
        {(0, 1): 4, (2, 3): 4},
        numa=(0, 0, 0, 0),
    )
    return SimInventory("ws-4x3090", "workstation: 4x RTX 3090 24 GB, two NVLink bridges, one socket of 24 "
                        "cores, 256 GB", "NVIDIA GeForce RTX 3090", 24 * GIB, topo, _sockets(24, 1), 256 * GIB)


def flat(n: int) -> SimInventory:
    """N GPUs under the same host bridge, no NVLink."""
    if not 1 <= n <= 64:
        raise ValueError(f"flat:{n}: the GPU count must be between 1 and 64")
    topo = Topology.from_pairs(n, PcieLevel.HOST_BRIDGE, numa=(0,) * n)
    return SimInventory(f"flat:{n}", f"{n}x RTX A5000 24 GB on one host bridge, no NVLink; {4 * n} cores, "
                        f"{64 * n} GB", "NVIDIA RTX A5000", 24 * GIB, topo, _sockets(4 * n, 1), 64 * n * GIB)


NAMED: dict[str, SimInventory] = {
    inv.name: inv for inv in (_dgx1(), _dgx_a100(), _dgx2(), _pcie_2socket(), _ws_4x3090())
}


def names() -> list[str]:
    return [*NAMED, "flat:N"]


def parse_sim_spec(spec: str) -> SimInventory:
    """``sim:dgx1``, ``sim:flat:4`` (the ``sim:`` prefix is optional) -> SimInventory."""
    body = spec.strip()
    body = body[4:] if body.lower().startswith("sim:") else body
    key = body.lower()
    if key in NAMED:
        return NAMED[key]
    if key.startswith("flat:"):
        count = key[5:]
        if not count.isdigit():
            raise ValueError(f"{spec!r}: flat needs a GPU count, e.g. sim:flat:4")
        return flat(int(count))
    raise ValueError(f"unknown simulated inventory {spec!r}: choose one of " + ", ".join(f"sim:{n}" for n in names()))
