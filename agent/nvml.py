"""The one place that talks to NVML (``pynvml`` from nvidia-ml-py).

Every call goes through :class:`NvmlSession`, nvitop style: a query a GPU or
driver cannot answer (not supported, no permission, a function this driver or
binding lacks) returns the caller's default and leaves a note, so an old driver
or a consumer GPU degrades the inventory instead of crashing the agent. A
missing library or driver at start-up becomes :class:`NoGpuFound`, whose
message says what is missing and how to run on simulated GPUs instead.

``pynvml`` is imported only inside :class:`NvmlSession`, so importing the
agent costs nothing on machines without NVIDIA GPUs. The functions below
return plain data; :mod:`labq.agent.inventory` turns it into labq's types.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

SIM_HINT = "To run on simulated GPUs: labq agent --gpus sim:ws-4x3090 (see labq topo --list)"

#: Errors that mean "this GPU or driver cannot answer that", not "NVML is broken".
_SOFT_ERRORS = (
    "NVMLError_NotSupported", "NVMLError_NoPermission", "NVMLError_FunctionNotFound",
    "NVMLError_NotFound", "NVMLError_InvalidArgument", "NVMLError_NoData", "NVMLError_Deprecated", "NVMLError_Unknown",
)
#: Errors after which a versioned fallback (``..._v2``) is worth trying.
_MISSING_FUNCTION = ("NVMLError_FunctionNotFound", "NVMLLibraryMismatchError")

#: Why NVML would not start, by error class, in words an admin can act on.
_INIT_REASONS = {
    "NVMLError_LibraryNotFound": "NVML library not found: is the NVIDIA driver installed?",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
    "NVMLError_LibRmVersionMismatch":
        "the NVML library and the kernel driver differ in version: reboot or reload nvidia",
    "NVMLError_NoPermission": "no permission to use NVML",
}

#: NVML_NVLINK_DEVICE_TYPE_* (C ABI values, stable across drivers): what an NVLink link ends in.
NVLINK_GPU, NVLINK_IBMNPU, NVLINK_SWITCH = 0, 1, 2

_REQUIRED: Any = object()
_GENERIC: Any = object()


class NoGpuFound(Exception):
    """NVML, the driver or the GPUs are missing; the message offers simulated GPUs instead."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"no NVIDIA GPU found ({reason}). {SIM_HINT}")


class NvmlError(RuntimeError):
    """A query the inventory cannot do without failed (e.g. a GPU fell off the bus)."""


def _classes(module: ModuleType, names: tuple[str, ...]) -> tuple[type[BaseException], ...]:
    """The named exception classes this pynvml has (older bindings lack some)."""
    found = (getattr(module, name, None) for name in names)
    return tuple(c for c in found if isinstance(c, type) and issubclass(c, BaseException))


def _text(value: str | bytes) -> str:
    """Old bindings return bytes where new ones return str."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlSession:
    """An open NVML connection; calling it runs one pynvml function by name.

    ``nvml("nvmlDeviceGetUUID", handle)`` raises :class:`NvmlError` on any
    failure; with ``default=`` a soft failure returns the default and records
    ``note`` (a generic one unless given; ``note=None`` for expected failures,
    such as probing NVLink links past a GPU's last one). A tuple of names is
    tried in order while the function is missing, for versioned fallbacks.
    Not thread-safe: one reader at a time.
    """

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as err:
            raise NoGpuFound("the nvidia-ml-py package is not installed") from err
        self._pynvml = pynvml
        self._soft = _classes(pynvml, _SOFT_ERRORS)
        self._missing = _classes(pynvml, _MISSING_FUNCTION)
        self._notes: dict[str, None] = {}
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise NoGpuFound(_INIT_REASONS.get(type(err).__name__, f"NVML would not start: {err}")) from err
        self._open = True

    def __call__(self, fn_name: str | tuple[str, ...], *args: Any, default: Any = _REQUIRED,
                 note: str | None = _GENERIC) -> Any:
        names = (fn_name,) if isinstance(fn_name, str) else fn_name
        err: BaseException | None = None
        for name in names:
            fn = getattr(self._pynvml, name, None)
            if fn is None:
                err = AttributeError(f"this pynvml has no {name}")
                continue
            try:
                return fn(*args)
            except self._missing as e:
                err = e
            except self._pynvml.NVMLError as e:
                err = e
                break
        soft = isinstance(err, (AttributeError, *self._soft, *self._missing))
        if default is _REQUIRED or not soft:
            raise NvmlError(f"{names[0]} failed: {err}") from err
        if note is not None:
            self.note(f"{names[0]}: {err}" if note is _GENERIC else note)
        return default

    def constant(self, name: str, fallback: int) -> int:
        """An NVML constant, or ``fallback`` where this binding predates it."""
        return int(getattr(self._pynvml, name, fallback))

    def note(self, text: str) -> None:
        self._notes.setdefault(text)

    def take_notes(self) -> tuple[str, ...]:
        """The notes since the last take, once each, in the order they arose."""
        notes, self._notes = tuple(self._notes), {}
        return notes

    def close(self) -> None:
        if self._open:
            self._open = False
            self("nvmlShutdown", default=None, note=None)


@dataclass(frozen=True)
class NvLinkRemote:
    """The far end of one active NVLink link."""

    bus_id: str | None  #: normalised PCI bus id, None when NVML would not say
    device_type: int | None  #: NVML_NVLINK_DEVICE_TYPE_*, None when unknown


@dataclass(frozen=True)
class ProcessMemory:
    """One compute process on one GPU and the GPU memory it uses."""

    gpu: int
    pid: int
    used_mib: int | None  #: None where NVML will not say (``usedGpuMemory`` not available)


@dataclass(frozen=True)
class DeviceFacts:
    """What NVML says about one GPU, as plain data."""

    index: int
    handle: Any
    uuid: str
    model: str
    memory_mib: int
    bus_id: str | None
    numa: int | None
    pids: frozenset[int] | None  #: compute processes; None when NVML cannot list them
    nvlinks: tuple[NvLinkRemote, ...] | None  #: active links; None when NVLink queries are unsupported
    memory_free_mib: int | None = None  #: None when NVML would not say
    utilization_pct: int | None = None  #: GPU busy time over the last sample period; None when unsupported
    processes: tuple[ProcessMemory, ...] = ()  #: ``pids`` with the memory each uses
    #: the CPUs NVML calls ideal for the GPU (those of its NUMA node), sorted; None when NVML would not say
    local_cpus: tuple[int, ...] | None = None


def normalize_bus_id(bus_id: str | bytes) -> str:
    """``00000000:0A:00.0`` and ``0000:0a:00.0`` name the same device: one spelling for both."""
    text = _text(bus_id).strip().lower()
    parts = text.split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    try:
        domain, bus, devfn = int(parts[0], 16), int(parts[1], 16), parts[2]
        device, _, function = devfn.partition(".")
        return f"{domain:04x}:{bus:02x}:{int(device, 16):02x}.{int(function or '0', 16)}"
    except (ValueError, IndexError):
        return text


def source(nvml: NvmlSession) -> str:
    """``NVML 12.535.104, driver 535.104.05``: which NVML answered, for the admin."""
    version = nvml("nvmlSystemGetNVMLVersion", default="?", note=None)
    driver = nvml("nvmlSystemGetDriverVersion", default="?", note=None)
    return f"NVML {_text(version)}, driver {_text(driver)}"


def device_count(nvml: NvmlSession) -> int:
    return int(nvml("nvmlDeviceGetCount"))


def read_devices(nvml: NvmlSession) -> list[DeviceFacts]:
    """Every GPU NVML sees, in NVML's index order."""
    facts = []
    for index in range(device_count(nvml)):
        h = nvml("nvmlDeviceGetHandleByIndex", index)
        pci = nvml("nvmlDeviceGetPciInfo", h, default=None, note=None)
        numa = nvml("nvmlDeviceGetNumaNodeId", h, default=None, note=None)
        memory = nvml("nvmlDeviceGetMemoryInfo", h)
        rates = nvml("nvmlDeviceGetUtilizationRates", h, default=None, note="GPU utilization unsupported")
        processes = _compute_processes(nvml, h, index)
        facts.append(DeviceFacts(
            index=index,
            handle=h,
            uuid=_text(nvml("nvmlDeviceGetUUID", h)),
            model=_text(nvml("nvmlDeviceGetName", h, default="NVIDIA GPU")),
            memory_mib=int(memory.total) // (1024 * 1024),
            memory_free_mib=int(memory.free) // (1024 * 1024) if getattr(memory, "free", None) is not None else None,
            utilization_pct=int(rates.gpu) if rates is not None else None,
            bus_id=normalize_bus_id(pci.busId) if pci is not None else None,
            numa=numa if isinstance(numa, int) and numa >= 0 else None,
            pids=None if processes is None else frozenset(p.pid for p in processes),
            processes=tuple(processes or ()),
            nvlinks=_nvlinks(nvml, h),
            local_cpus=_cpu_affinity(nvml, h),
        ))
    return facts


_AFFINITY_WORD_BITS = 64  #: ``nvmlDeviceGetCpuAffinity`` fills an array of 64-bit words, CPU 0 in word 0's bit 0
#: words asked for: every CPU id Linux can have (8192), whatever this machine's count, since ids may have gaps
_AFFINITY_WORDS = 8192 // _AFFINITY_WORD_BITS


def _cpu_affinity(nvml: NvmlSession, h: Any) -> tuple[int, ...] | None:
    """The GPU's ideal CPUs (``nvmlDeviceGetCpuAffinity``: its NUMA node's); None where NVML will not say or says
    none."""
    words = nvml("nvmlDeviceGetCpuAffinity", h, _AFFINITY_WORDS, default=None, note=None)
    if words is None:
        return None
    cpus = []
    for w, word in enumerate(words):
        word = int(word)
        while word:
            low = word & -word
            cpus.append(w * _AFFINITY_WORD_BITS + low.bit_length() - 1)
            word ^= low
    return tuple(cpus) or None


_NOT_AVAILABLE = (1 << 64) - 1  #: NVML_VALUE_NOT_AVAILABLE, as older bindings pass it through


def read_process_memory(nvml: NvmlSession) -> tuple[list[ProcessMemory], dict[int, int | None]]:
    """Each compute process on each GPU with its memory, and each GPU's memory in use (total less free): the
    agent's watch of the jobs that share GPUs, read every second, so nothing else (no topology, no links)."""
    processes: list[ProcessMemory] = []
    used: dict[int, int | None] = {}
    for index in range(device_count(nvml)):
        h = nvml("nvmlDeviceGetHandleByIndex", index)
        memory = nvml("nvmlDeviceGetMemoryInfo", h, default=None, note=None)
        free = getattr(memory, "free", None) if memory is not None else None
        used[index] = (int(memory.total) - int(free)) // (1024 * 1024) if free is not None else None
        processes += _compute_processes(nvml, h, index) or ()
    return processes, used


def _compute_processes(nvml: NvmlSession, h: Any, index: int) -> list[ProcessMemory] | None:
    """GPU ``index``'s compute processes with their memory; None when NVML cannot list them."""
    procs = nvml(("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"), h,
                 default=None, note=f"compute processes unavailable on GPU {index}: other users' jobs go unseen")
    if procs is None:
        return None
    found = []
    for p in procs:
        mib = getattr(p, "usedGpuMemory", None)
        found.append(ProcessMemory(index, int(p.pid), None if mib is None or mib == _NOT_AVAILABLE
                                   else int(mib) // (1024 * 1024)))
    return found


def _nvlinks(nvml: NvmlSession, h: Any) -> tuple[NvLinkRemote, ...] | None:
    """The active links of one GPU. Links past the GPU's last fail: that is how NVML says "no more"."""
    answered = False
    remotes = []
    for link in range(nvml.constant("NVML_NVLINK_MAX_LINKS", 18)):
        state = nvml("nvmlDeviceGetNvLinkState", h, link, default=None, note=None)
        if state is None:
            continue
        answered = True
        if state != nvml.constant("NVML_FEATURE_ENABLED", 1):
            continue
        pci = nvml(("nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlDeviceGetNvLinkRemotePciInfo"), h, link,
                   default=None, note=None)
        kind = nvml("nvmlDeviceGetNvLinkRemoteDeviceType", h, link, default=None, note=None)
        remotes.append(NvLinkRemote(normalize_bus_id(pci.busId) if pci is not None else None, kind))
    return tuple(remotes) if answered else None


def read_pcie_levels(nvml: NvmlSession, handles: list[Any]) -> dict[tuple[int, int], int | None]:
    """NVML's common-ancestor level for every pair i < j; None where NVML would not say."""
    return {
        (i, j): nvml("nvmlDeviceGetTopologyCommonAncestor", handles[i], handles[j], default=None, note=None)
        for i in range(len(handles)) for j in range(i + 1, len(handles))
    }
