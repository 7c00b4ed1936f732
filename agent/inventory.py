"""The agent's GPU inventory: this node's GPUs, how they are wired, and which are busy.

One small interface, two implementations. :class:`SimulatedInventory` is a
product feature: demos and machines without NVIDIA GPUs run the same agent on
a named simulated machine (``--gpus sim:dgx1``). :class:`NvmlInventory` reads
the real GPUs through :mod:`labq.agent.nvml`, the only module that touches
pynvml. Turning NVML's answers into labq's :class:`Topology` is a pure
function (:func:`build_topology`) so it can be checked without a GPU.

Besides its GPUs a node says what else it may give jobs: the CPUs this agent
may run on (its own CPU affinity), the machine's memory (``MemTotal``), and the
CPUs local to each GPU (NVML's ideal affinity for it, else the kernel's
``local_cpulist`` of its PCI device), which the scheduler hands out near the
GPUs. A simulated machine says those of the machine it models.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from labq.agent.nvml import (
    NVLINK_GPU,
    NVLINK_IBMNPU,
    NVLINK_SWITCH,
    DeviceFacts,
    NoGpuFound,
    NvmlError,
    NvmlSession,
    ProcessMemory,
    device_count,
    read_devices,
    read_pcie_levels,
    read_process_memory,
    source,
)
from labq.agent.procfs import environment, process_table
from labq.models.node import Gpu, Node, parse_cpu_list
from labq.models.topology import PcieLevel, Topology
from labq.topologies import names, parse_sim_spec
from labq.units import parse_size_mib

__all__ = ["GpuInventory", "GpuMemory", "Inventory", "NoGpuFound", "NvmlInventory", "SimulatedInventory",
           "build_topology", "open_inventory"]

NVLINK_UNSUPPORTED = "NVLink query unsupported: topology from PCIe only"


@dataclass(frozen=True)
class GpuUsage:
    """How busy one GPU is right now (real GPUs only)."""

    index: int
    memory_free_mib: int | None
    utilization_pct: int | None


@dataclass(frozen=True)
class Inventory:
    """One reading of a node's GPUs, as the agent reports it to the leader."""

    gpus: tuple[Gpu, ...]
    topology: Topology  #: full pairwise tables, indexed like ``gpus``
    simulated: bool  #: simulated GPUs are handed to jobs by index, real ones by UUID
    unmanaged_busy: frozenset[int]  #: GPU indices with compute processes labq did not start
    source: str  #: ``sim:dgx1`` or ``NVML 12.535.104, driver 535.104.05``
    notes: tuple[str, ...] = ()  #: what could not be read, and what was assumed instead
    usage: tuple[GpuUsage, ...] = ()  #: free memory and utilization per GPU, when known
    unmanaged_mib: tuple[tuple[int, int], ...] = ()  #: (GPU index, MiB) used by processes outside labq
    shares: bool = True  #: whether jobs may share these GPUs by memory (``Node.shares``)
    hands_over: bool = False  #: another scheduler starts jobs here once their GPUs are free (``Node.hands_over``)
    cpus: tuple[int, ...] = ()  #: the CPUs jobs may have here (the agent's own affinity); () not known
    memory_mib: int | None = None  #: the machine's memory; None not known

    def as_node(self, name: str, labels: tuple[str, ...] = ()) -> Node:
        """The node as the leader models it (which also checks the tables fit the GPUs)."""
        return Node(name, self.gpus, self.topology, unmanaged_busy=self.unmanaged_busy,
                    simulated=self.simulated, labels=labels, unmanaged_mib=self.unmanaged_mib, shares=self.shares,
                    hands_over=self.hands_over, cpus=self.cpus, memory_mib=self.memory_mib)


def host_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on, and so give its jobs (``sched_getaffinity``; all of them elsewhere)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no CPU affinity on this system
        return tuple(range(os.cpu_count() or 0))


def host_memory_mib(proc: str = "/proc") -> int | None:
    """The machine's memory (``MemTotal`` of ``/proc/meminfo``); None where it cannot be read."""
    try:
        with open(Path(proc, "meminfo"), encoding="ascii", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name == "MemTotal":
                    number, _, unit = value.strip().partition(" ")
                    return int(number) // 1024 if unit.strip().lower() == "kb" else int(number) // (1 << 20)
    except (OSError, ValueError):
        pass
    return None


def pci_local_cpus(bus_id: str | None, sysfs: str = "/sys") -> tuple[int, ...]:
    """The CPUs local to a PCI device, as the kernel lists them (``/sys/bus/pci/devices/BUS/local_cpulist``); ()
    where it cannot be read."""
    if not bus_id:
        return ()
    try:
        return parse_cpu_list(Path(sysfs, "bus/pci/devices", bus_id, "local_cpulist").read_text(encoding="ascii"))
    except (OSError, ValueError, UnicodeDecodeError):
        return ()


@dataclass(frozen=True)
class GpuMemory:
    """One reading of who uses how much GPU memory: the agent's watch of the jobs that share GPUs."""

    #: every compute process seen on a GPU: pid -> (GPU index, MiB; None where NVML will not say)
    by_pid: dict[int, tuple[int, int | None]]
    #: per GPU with processes outside labq: the memory they use (where one's is unknown, all that the GPU's
    #: processes use less labq's own: never less than the truth)
    unmanaged_mib: dict[int, int]

    @classmethod
    def of(cls, processes: list[ProcessMemory], used: dict[int, int | None],
           managed_pids: frozenset[int]) -> GpuMemory:
        by_pid = {p.pid: (p.gpu, p.used_mib) for p in processes}
        unmanaged: dict[int, int] = {}
        for gpu in sorted({p.gpu for p in processes if p.pid not in managed_pids}):
            here = [p for p in processes if p.gpu == gpu]
            outside = [p.used_mib for p in here if p.pid not in managed_pids]
            if None not in outside:
                unmanaged[gpu] = sum(outside)
            elif used.get(gpu) is not None:
                unmanaged[gpu] = max(0, used[gpu] - sum(p.used_mib or 0 for p in here if p.pid in managed_pids))
        return cls(by_pid, unmanaged)


class GpuInventory(Protocol):
    def read(self, managed_pids: frozenset[int] = frozenset()) -> Inventory:
        """The GPUs now. ``managed_pids``: processes labq started, whose GPU use is not "unmanaged"."""
        ...

    def memory(self, managed_pids: frozenset[int] = frozenset()) -> GpuMemory:
        """Who uses how much GPU memory now: cheap enough to read every second."""
        ...

    def close(self) -> None:
        """Release what the inventory holds open (NVML); reading afterwards is an error."""
        ...


#: a process on a simulated GPU says in its environment how much GPU memory it uses (``12G``), and which GPU it
#: is on by ``CUDA_VISIBLE_DEVICES``; one that labq did not start names its simulated node in ``SIM_NODE_ENV``
SIM_GPU_MEM_ENV = "SIM_GPU_MEM"
SIM_NODE_ENV = "SIM_GPU_NODE"


class SimulatedInventory:
    """A named simulated machine (``sim:dgx1``, ``sim:flat:4``).

    Its GPU memory is modelled from the processes themselves: one whose environment says
    ``SIM_GPU_MEM=12G`` uses that much of the simulated GPU its ``CUDA_VISIBLE_DEVICES`` names, as
    NVML would report it (a child that inherited the same environment is the same user, not another).
    Jobs labq runs here count as this node's; any other process counts only when ``SIM_GPU_NODE`` names
    this node (someone's notebook, for a demo), and is then busy outside labq. So sharing GPUs by memory,
    and the watch that stops a job using more than it declared, run whole on machines without GPUs."""

    def __init__(self, spec: str, node: str) -> None:
        self.sim = parse_sim_spec(spec)  # ValueError naming every choice when unknown
        self.node = node

    def read(self, managed_pids: frozenset[int] = frozenset()) -> Inventory:
        memory = self.memory(managed_pids)
        return Inventory(gpus=self.sim.gpus(self.node), topology=self.sim.topology, simulated=True,
                         unmanaged_busy=frozenset(memory.unmanaged_mib), source=f"sim:{self.sim.name}",
                         unmanaged_mib=tuple(sorted(memory.unmanaged_mib.items())), cpus=self.sim.cpus,
                         memory_mib=self.sim.host_memory_mib)

    def memory(self, managed_pids: frozenset[int] = frozenset()) -> GpuMemory:
        declaring = dict(_declaring_processes())
        processes = []
        for pid, (parent, env) in declaring.items():
            if pid not in managed_pids and env.get(SIM_NODE_ENV) != self.node:
                continue
            mine = (env.get(SIM_GPU_MEM_ENV), env.get("CUDA_VISIBLE_DEVICES"))
            above = declaring.get(parent)
            if above is not None and (above[1].get(SIM_GPU_MEM_ENV), above[1].get("CUDA_VISIBLE_DEVICES")) == mine:
                continue  # a child that inherited its parent's environment: the same user of that memory
            try:
                gpu = int((mine[1] or "").split(",")[0])
                mib = parse_size_mib(mine[0])
            except ValueError:
                continue
            if 0 <= gpu < self.sim.gpu_count:
                processes.append(ProcessMemory(gpu, pid, mib))
        return GpuMemory.of(processes, {}, managed_pids)

    def close(self) -> None:
        pass


def _declaring_processes():
    """(pid, (parent pid, environment)) of each process on this machine that declares simulated GPU memory, as far
    as this user may read environments."""
    needle = SIM_GPU_MEM_ENV.encode() + b"="
    for pid, (parent, _) in process_table().items():
        env = environment(pid, needle)
        if env is not None:
            yield pid, (parent, env)


class NvmlInventory:
    """The real NVIDIA GPUs. Opening it starts NVML, so a machine without GPUs fails at once."""

    def __init__(self, *, proc: str = "/proc", sysfs: str = "/sys") -> None:
        self._proc, self._sysfs = proc, sysfs  #: where the kernel's files are read (a test's copy of them)
        self._nvml = NvmlSession()
        try:
            if device_count(self._nvml) == 0:
                raise NoGpuFound("NVML is running but lists no GPUs")
        except NvmlError as err:
            self._nvml.close()
            raise NoGpuFound(f"NVML could not count the GPUs: {err}") from err
        except NoGpuFound:
            self._nvml.close()
            raise
        self._source = source(self._nvml)

    def memory(self, managed_pids: frozenset[int] = frozenset()) -> GpuMemory:
        return GpuMemory.of(*read_process_memory(self._nvml), managed_pids)

    def read(self, managed_pids: frozenset[int] = frozenset()) -> Inventory:
        devices = read_devices(self._nvml)
        levels = read_pcie_levels(self._nvml, [d.handle for d in devices])
        topology, topology_notes = build_topology(devices, levels)
        local = {d.index: d.local_cpus or pci_local_cpus(d.bus_id, self._sysfs) for d in devices}
        memory = host_memory_mib(self._proc)
        host_notes = [f"CPUs near GPU {_list([i for i, cpus in local.items() if not cpus])} unknown: their jobs get "
                      "any free CPUs"] if not all(local.values()) else []
        if memory is None:
            host_notes.append(f"memory unknown ({self._proc}/meminfo unreadable): jobs are placed by GPUs and CPUs")
        return Inventory(
            gpus=tuple(Gpu(d.index, d.uuid, d.model, d.memory_mib, local[d.index]) for d in devices),
            topology=topology,
            simulated=False,
            unmanaged_busy=frozenset(d.index for d in devices if d.pids and d.pids - managed_pids),
            source=self._source,
            notes=(*self._nvml.take_notes(), *topology_notes, *host_notes),
            cpus=host_cpus(),
            memory_mib=memory,
            usage=tuple(GpuUsage(d.index, d.memory_free_mib, d.utilization_pct) for d in devices),
            unmanaged_mib=tuple(sorted(GpuMemory.of(  # from the same reading: NVML is asked once
                [p for d in devices for p in d.processes],
                {d.index: d.memory_mib - d.memory_free_mib if d.memory_free_mib is not None else None
                 for d in devices}, managed_pids).unmanaged_mib.items())),
        )

    def close(self) -> None:
        self._nvml.close()


def open_inventory(gpus: str | None, node: str) -> GpuInventory:
    """The inventory for the agent's ``--gpus`` value.

    ``None``/``auto`` and ``nvml``: the real GPUs, :class:`NoGpuFound` (which
    offers ``--gpus sim:...``) when NVML, the driver or the GPUs are missing.
    ``sim:NAME``: a simulated machine, ValueError listing the names if unknown.
    """
    choice = (gpus or "auto").strip()
    if choice.lower() in ("auto", "nvml"):
        return NvmlInventory()
    if choice.lower().startswith("sim:"):
        return SimulatedInventory(choice, node)
    raise ValueError(f"--gpus {gpus!r}: use auto, nvml or a simulated inventory: "
                     + ", ".join(f"sim:{n}" for n in names()))


def build_topology(devices: list[DeviceFacts],
                   levels: dict[tuple[int, int], int | None]) -> tuple[Topology, tuple[str, ...]]:
    """labq's topology from NVML's answers, with a note for everything assumed.

    A pair whose PCIe level NVML will not give counts as SYS (the farthest, so
    the scheduler never prefers it on a guess). NVLink links are counted from
    each GPU's side and the larger count kept, so one GPU that cannot answer
    does not make the tables asymmetric.
    """
    n = len(devices)
    notes: list[str] = []
    pcie = _pcie_levels(levels, notes)
    silent = [d.index for d in devices if d.nvlinks is None]
    if silent and len(silent) == n:
        notes.append(NVLINK_UNSUPPORTED)
    elif silent:
        notes.append(f"NVLink query unsupported on GPU {_list(silent)}: "
                     "their links counted from their peers only")
    directed, switch_links = _nvlink_counts(devices, notes)
    nvlinks = {(i, j): max(directed[i, j], directed[j, i]) for i in range(n) for j in range(i + 1, n)}
    numa = tuple(d.numa for d in devices)
    topology = Topology.from_pairs(
        n,
        pcie,
        {pair: count for pair, count in nvlinks.items() if count},
        nvswitch_links=tuple(switch_links) if any(switch_links) else (),
        numa=numa if any(x is not None for x in numa) else (),
    )
    return topology, tuple(notes)


def _pcie_levels(levels: dict[tuple[int, int], int | None], notes: list[str]) -> dict[tuple[int, int], PcieLevel]:
    """Each pair's PCIe level; one NVML will not give counts as SYS, with a note."""
    pcie: dict[tuple[int, int], PcieLevel] = {}
    unknown_pairs = []
    for (i, j), level in sorted(levels.items()):
        try:
            pcie[i, j] = PcieLevel(level)
        except ValueError:
            pcie[i, j] = PcieLevel.SYSTEM
            unknown_pairs.append(f"{i}-{j}")
    if unknown_pairs:
        notes.append(f"PCIe common ancestor unknown for GPU pairs {', '.join(unknown_pairs)}: counted as SYS")
    return pcie


def _nvlink_counts(devices: list[DeviceFacts], notes: list[str]) -> tuple[Counter[tuple[int, int]], list[int]]:
    """Links from each GPU to each other GPU as that GPU sees them, and each GPU's links to NVSwitches."""
    by_bus = {d.bus_id: d.index for d in devices if d.bus_id is not None}
    directed: Counter[tuple[int, int]] = Counter()
    switch_links = [0] * len(devices)
    unnamed: set[int] = set()  # GPUs with active links whose far end NVML would not name
    strays: set[int] = set()  # GPUs linked to a CPU (IBM NPU) or to a GPU NVML does not list
    for d in devices:
        for remote in d.nvlinks or ():
            peer = by_bus.get(remote.bus_id) if remote.bus_id is not None else None
            if remote.device_type == NVLINK_SWITCH:
                switch_links[d.index] += 1
            elif peer is not None:
                if peer != d.index:
                    directed[d.index, peer] += 1
            elif remote.bus_id is None:
                unnamed.add(d.index)
            elif remote.device_type in (NVLINK_GPU, NVLINK_IBMNPU):
                strays.add(d.index)
            else:
                switch_links[d.index] += 1  # not one of our GPUs and not a CPU: the NVSwitch fabric
    if unnamed:
        notes.append(f"NVLink remote ends unknown on GPU {_list(unnamed)}: those links not counted")
    if strays:
        notes.append(f"NVLink links to devices other than this node's GPUs ignored on GPU {_list(strays)}")
    return directed, switch_links


def _list(indices: set[int] | list[int]) -> str:
    return ", ".join(map(str, sorted(indices)))
