"""A stand-in for ``pynvml`` that answers like NVML for a described machine.

A :class:`Machine` is plain data: each GPU's bus id, PCIe path, NUMA node,
NVLink remotes (one bus id per active link, as NVML reports them) and compute
processes. :func:`module` turns it into a module that mirrors the real
binding: the same function names, return types (``nvmlPciInfo_t`` with a bytes
``busId``, ``c_nvmlMemory_t``, friendly process objects) and the real error
classes and constants, taken from the installed nvidia-ml-py, which imports
without a driver. Only functions the real binding has are exposed, so the
code under test cannot rely on a name NVML does not have.

Install it with ``monkeypatch.setitem(sys.modules, "pynvml", module(machine))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pynvml as real

from labq.topologies import parse_sim_spec

MIB = 1024 * 1024


@dataclass(frozen=True)
class FakeGpu:
    bus_id: str  #: as NVML spells it, ``00000000:06:00.0``
    name: str
    memory_mib: int
    #: PCIe ancestors from the CPU down: socket, host bridge, then switches
    pcie_path: tuple[str, ...]
    numa: int | None = None
    #: the remote bus id of each active link, link 0 first (any spelling NVML might use)
    nvlinks: tuple[str, ...] = ()
    #: NVLink links the GPU has (active or not); None: as many as ``nvlinks``; 0: no NVLink at all
    link_slots: int | None = None
    pids: tuple[int, ...] = ()
    #: the GPU memory of each of ``pids``, in order (None: NVML will not say); 512 MiB each when not given
    pid_mib: tuple[int | None, ...] = ()
    used_mib: int = 0
    utilization_pct: int = 0
    #: the CPUs NVML calls ideal for it (nvmlDeviceGetCpuAffinity); None: NVML will not say (NotSupported)
    cpus: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Machine:
    gpus: tuple[FakeGpu, ...]
    switches: frozenset[str] = frozenset()  #: bus ids of NVSwitches, as the GPUs' links name them
    nvml_version: str = "12.535.104"
    driver_version: str = "535.104.05"
    init_error: int | None = None  #: an NVML_ERROR_* code nvmlInit fails with
    not_supported: frozenset[str] = frozenset()  #: functions that raise NVMLError_NotSupported
    no_permission: frozenset[str] = frozenset()  #: functions that raise NVMLError_NoPermission
    driver_lacks: frozenset[str] = frozenset()  #: functions the driver lacks (NVMLError_FunctionNotFound)
    binding_lacks: frozenset[str] = frozenset()  #: functions an older pynvml does not define
    lost: frozenset[int] = frozenset()  #: GPU indices that fell off the bus (NVMLError_GpuIsLost)

    def uuid(self, index: int) -> str:
        return f"GPU-{index:08x}-0000-4000-8000-{int(self.gpus[index].bus_id[9:11], 16):012x}"


def _ancestor(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """NVML_TOPOLOGY_* for two PCIe paths (socket, host bridge, switches...)."""
    shared = 0
    for x, y in zip(a, b):
        if x != y:
            break
        shared += 1
    if shared == 0:
        return real.NVML_TOPOLOGY_SYSTEM
    if shared == 1:
        return real.NVML_TOPOLOGY_NODE
    if shared == 2:
        return real.NVML_TOPOLOGY_HOSTBRIDGE
    return real.NVML_TOPOLOGY_SINGLE if a == b else real.NVML_TOPOLOGY_MULTIPLE


def _pci(bus_id: str) -> real.nvmlPciInfo_t:
    """The real struct, filled as NVML fills it: bytes bus ids, numeric fields."""
    domain, bus, devfn = bus_id.split(":")
    info = real.nvmlPciInfo_t()
    info.busId = bus_id.encode()
    info.busIdLegacy = f"{int(domain, 16):04X}:{bus.upper()}:{devfn.upper()}".encode()
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(devfn.split(".")[0], 16)
    return info


class Handle:
    """What nvmlDeviceGetHandleByIndex returns: opaque to the caller."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"<fake nvmlDevice {self.index}>"


class FakeNvml:
    """NVML for one machine; methods carry the real function names."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.refcount = 0
        self.calls: list[str] = []

    # -- plumbing ---------------------------------------------------------------------------------

    def _enter(self, name: str, handle: Handle | None = None) -> None:
        self.calls.append(name)
        m = self.machine
        if self.refcount == 0:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)
        if handle is not None and handle.index in m.lost:
            raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
        if name in m.driver_lacks:
            raise real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)
        if name in m.not_supported:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        if name in m.no_permission:
            raise real.NVMLError(real.NVML_ERROR_NO_PERMISSION)

    def _gpu(self, handle: Handle) -> FakeGpu:
        return self.machine.gpus[handle.index]

    def _link(self, name: str, handle: Handle, link: int) -> str | None:
        """The remote bus id of an active link, None for an inactive one."""
        self._enter(name, handle)
        gpu = self._gpu(handle)
        slots = len(gpu.nvlinks) if gpu.link_slots is None else gpu.link_slots
        if slots == 0:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < slots:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlinks[link] if link < len(gpu.nvlinks) else None

    # -- the API ----------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.machine.init_error is not None:
            raise real.NVMLError(self.machine.init_error)
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.refcount -= 1

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._enter("nvmlSystemGetNVMLVersion")
        return self.machine.nvml_version

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.machine.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.machine.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.machine.gpus):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return Handle(index)

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        self._enter("nvmlDeviceGetUUID", handle)
        return self.machine.uuid(handle.index)

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        self._enter("nvmlDeviceGetName", handle)
        return self._gpu(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: Any = None) -> real.c_nvmlMemory_t:
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        mem = real.c_nvmlMemory_t()
        mem.total = self._gpu(handle).memory_mib * MIB
        mem.used = self._gpu(handle).used_mib * MIB
        mem.free = mem.total - mem.used
        return mem

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> real.c_nvmlUtilization_t:
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        rates = real.c_nvmlUtilization_t()
        rates.gpu = self._gpu(handle).utilization_pct
        rates.memory = 0
        return rates

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> real.nvmlPciInfo_t:
        self._enter("nvmlDeviceGetPciInfo", handle)
        return _pci(self._gpu(handle).bus_id)

    def nvmlDeviceGetNumaNodeId(self, handle: Handle) -> int:
        self._enter("nvmlDeviceGetNumaNodeId", handle)
        numa = self._gpu(handle).numa
        return -1 if numa is None else numa

    def nvmlDeviceGetCpuAffinity(self, handle: Handle, cpuSetSize: int) -> Any:
        self._enter("nvmlDeviceGetCpuAffinity", handle)
        cpus = self._gpu(handle).cpus
        if cpus is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        words = (real.c_ulonglong * cpuSetSize)()  # as the real binding returns it: a ctypes array of 64-bit words
        for cpu in cpus:
            if cpu // 64 < cpuSetSize:
                words[cpu // 64] |= 1 << cpu % 64
        return words

    def _processes(self, name: str, handle: Handle) -> list[Any]:
        self._enter(name, handle)
        gpu = self._gpu(handle)
        mib = gpu.pid_mib or (512,) * len(gpu.pids)
        # as the real binding turns NVML_VALUE_NOT_AVAILABLE into None
        return [real.nvmlFriendlyObject({"pid": pid, "usedGpuMemory": None if m is None else m * MIB,
                                         "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF})
                for pid, m in zip(gpu.pids, mib)]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[Any]:
        # The real one calls the driver's _v3 and turns a missing function into this error.
        try:
            return self._processes("nvmlDeviceGetComputeRunningProcesses", handle)
        except real.NVMLError_FunctionNotFound as err:
            raise real.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not "
                                                "match the NVML lib version.") from err

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Handle) -> list[Any]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v2", handle)

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Handle, device2: Handle) -> int:
        self._enter("nvmlDeviceGetTopologyCommonAncestor", device1)
        if device1.index == device2.index:
            return real.NVML_TOPOLOGY_INTERNAL
        return _ancestor(self._gpu(device1).pcie_path, self._gpu(device2).pcie_path)

    def nvmlDeviceGetNvLinkState(self, device: Handle, link: int) -> int:
        remote = self._link("nvmlDeviceGetNvLinkState", device, link)
        return real.NVML_FEATURE_ENABLED if remote is not None else real.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Handle, link: int) -> real.nvmlPciInfo_t:
        remote = self._link("nvmlDeviceGetNvLinkRemotePciInfo", device, link)
        if remote is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        return _pci(remote)

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, device: Handle, link: int) -> real.nvmlPciInfo_t:
        return self.nvmlDeviceGetNvLinkRemotePciInfo(device, link)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Handle, link: int) -> int:
        remote = self._link("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        if remote is None:
            raise real.NVMLError(real.NVML_ERROR_NOT_FOUND)
        if _norm(remote) in {_norm(s) for s in self.machine.switches}:
            return real.NVML_NVLINK_DEVICE_TYPE_SWITCH
        if _norm(remote) in {_norm(g.bus_id) for g in self.machine.gpus}:
            return real.NVML_NVLINK_DEVICE_TYPE_GPU
        return real.NVML_NVLINK_DEVICE_TYPE_UNKNOWN


def _norm(bus_id: str) -> tuple[int, ...]:
    """Compare bus ids however they are spelt (the fake's own bookkeeping, not the code under test's)."""
    domain, bus, devfn = bus_id.split(":")
    device, function = devfn.split(".")
    return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)


def module(machine: Machine) -> tuple[ModuleType, FakeNvml]:
    """A ``pynvml`` look-alike for ``machine``, and the fake behind it (to inspect calls)."""
    fake = FakeNvml(machine)
    mod = ModuleType("pynvml", "fake pynvml for labq tests")
    for name in dir(real):
        if name.startswith(("NVML_", "NVMLError", "NVMLLibraryMismatchError")) or name in (
                "nvmlFriendlyObject", "nvmlPciInfo_t", "c_nvmlMemory_t", "c_nvmlUtilization_t"):
            setattr(mod, name, getattr(real, name))
    for name in dir(FakeNvml):
        if name.startswith("nvml") and hasattr(real, name) and name not in machine.binding_lacks:
            setattr(mod, name, getattr(fake, name))
    return mod, fake


# -- machines -------------------------------------------------------------------------------------

def _bus(b: int) -> str:
    return f"00000000:{b:02X}:00.0"


def _short(b: int) -> str:
    """How a remote end may be spelt: four-digit domain, lower case (normalising must match it)."""
    return f"0000:{b:02x}:00.0"


def _cpus(machine: str, gpu: int) -> tuple[int, ...]:
    """The CPUs of GPU ``gpu``'s NUMA node on ``machine``, as the simulated machine of that name has them."""
    return parse_sim_spec(f"sim:{machine}").local_cpus(gpu)


_DGX1_BUS = (0x06, 0x07, 0x0A, 0x0B, 0x85, 0x86, 0x89, 0x8A)
#: The DGX-1's hybrid cube-mesh, as each V100 sees its six links: the peer GPU at the far end of each.
_DGX1_PEERS = (
    (1, 2, 3, 3, 4, 4),
    (0, 2, 2, 3, 5, 5),
    (0, 1, 1, 3, 3, 6),
    (0, 0, 1, 2, 2, 7),
    (0, 0, 5, 6, 7, 7),
    (1, 1, 4, 6, 6, 7),
    (2, 4, 5, 5, 7, 7),
    (3, 4, 4, 5, 6, 6),
)

DGX1 = Machine(gpus=tuple(
    FakeGpu(bus_id=_bus(_DGX1_BUS[i]), name="Tesla V100-SXM2-32GB", memory_mib=32768,
            pcie_path=(f"cpu{i // 4}", f"root{i // 4}", f"plx{i // 2}"), numa=i // 4,
            nvlinks=tuple(_short(_DGX1_BUS[p]) for p in _DGX1_PEERS[i]), cpus=_cpus("dgx1", i))
    for i in range(8)
))

_WS_BUS = (0x01, 0x21, 0x41, 0x61)
#: Four RTX 3090s on one CPU's root ports; NVLink bridges (4 links) join 0+1 and 2+3.
WS_4X3090 = Machine(gpus=tuple(
    FakeGpu(bus_id=_bus(_WS_BUS[i]), name="NVIDIA GeForce RTX 3090", memory_mib=24576,
            pcie_path=("cpu0", "root0"), numa=0, nvlinks=(_bus(_WS_BUS[i ^ 1]),) * 4, cpus=_cpus("ws-4x3090", i))
    for i in range(4)
))

_A100_BUS = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)
_NVSWITCH_BUS = tuple(_bus(b) for b in (0xC4, 0xC5, 0xC6, 0xC7, 0xC8, 0xC9))
#: A DGX A100: every GPU has two links into each of six NVSwitches, none to another GPU directly.
DGX_A100 = Machine(
    gpus=tuple(
        FakeGpu(bus_id=_bus(_A100_BUS[i]), name="NVIDIA A100-SXM4-80GB", memory_mib=81920,
                pcie_path=(f"cpu{i // 4}", f"root{i // 2}", f"plx{i // 2}", f"sw{i}"), numa=i // 4,
                nvlinks=tuple(s for s in _NVSWITCH_BUS for _ in range(2)), cpus=_cpus("dgx-a100", i))
        for i in range(8)
    ),
    switches=frozenset(_NVSWITCH_BUS),
)

#: Eight GPUs without NVLink hardware (every NVLink query is unsupported), pairs under PCIe switches.
PCIE_2SOCKET = Machine(gpus=tuple(
    FakeGpu(bus_id=_bus(0x1A + 0x10 * i), name="NVIDIA RTX A6000", memory_mib=49152,
            pcie_path=(f"cpu{i // 4}", f"root{i // 4}", f"plx{i // 2}"), numa=i // 4, link_slots=0,
            cpus=_cpus("pcie-2socket", i))
    for i in range(8)
))

MACHINES: dict[str, Machine] = {"dgx1": DGX1, "ws-4x3090": WS_4X3090, "dgx-a100": DGX_A100,
                                "pcie-2socket": PCIE_2SOCKET}
