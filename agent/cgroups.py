"""A job's own cgroup: the kernel keeps it to its CPUs and memory (labq.agent.cgroups).

Each attempt gets a cgroup ``<parent>/<name>`` (``labq/<job>.<attempt>-<agent>``) made by its shim
(``labq.agent.shim``), which starts the job inside it, reads what it used when it ends, and removes it.
Two implementations of one small interface, a ``Host`` that makes ``Cgroup``s:

- ``V2Host``: the unified hierarchy (``/sys/fs/cgroup/cgroup.controllers`` exists): ``cpuset.cpus``,
  ``cpu.max``, ``memory.max`` (and ``memory.swap.max`` = 0 where the kernel has it); usage from
  ``cpu.stat``, ``memory.peak`` (else the most ``memory.current`` was seen at), ``memory.events``.
- ``V1Host``: one hierarchy per controller (memory, cpu, cpuset, and cpuacct when mounted):
  ``cpuset.cpus`` and ``cpuset.mems`` (which a v1 cpuset must be given), ``cpu.cfs_quota_us``,
  ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes`` where present, so no swap); usage
  from ``cpuacct.usage``, ``memory.max_usage_in_bytes``, ``memory.oom_control``.

``probe()`` answers, at an agent's start, whether limits are enforced here, and why not in one sentence
(not root, nothing delegated, a read-only or missing cgroup file system): jobs then run unconfined. The
parent sits at the top of each hierarchy, not below the agent's own cgroup, so jobs outlive the agent's
service as they outlive the agent.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PARENT = "labq"
PERIOD_US = 100_000  #: the CPU quota's period: 100 ms, the kernel's default
MIB = 1 << 20
V1_NEEDED = ("memory", "cpu", "cpuset")  #: and cpuacct, for the CPU time used, where it is mounted
V2_NEEDED = ("cpu", "cpuset", "memory")


class CgroupError(Exception):
    """A cgroup cannot be made or entered here; the message is one sentence saying why."""


@dataclass(frozen=True)
class Limits:
    """What the kernel holds a job to; () and None: not limited."""

    cpu_set: tuple[int, ...] = ()  #: the CPUs it may run on
    cpu_limit: float | None = None  #: cores of CPU time (a quota per period)
    memory_limit_mib: int | None = None  #: past this the kernel's OOM killer kills in it; no swap

    @property
    def quota_us(self) -> int | None:
        return None if self.cpu_limit is None else max(1000, round(self.cpu_limit * PERIOD_US))

    @property
    def memory_bytes(self) -> int | None:
        return None if self.memory_limit_mib is None else self.memory_limit_mib * MIB


def cpu_list(cpus: tuple[int, ...]) -> str:
    """The kernel's list format: (0, 1, 2, 5) is "0-2,5"."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _read(path: Path) -> str:
    with open(path) as f:
        return f.read().strip()


def _read_or_empty(path: Path) -> str:
    try:
        return _read(path)
    except FileNotFoundError:
        return ""


def _write(path: Path, value: str) -> None:
    """One write(2), as cgroupfs wants; an error names the file. (O_CREAT: a plain folder stands in for
    cgroupfs in tests; the kernel's files are there already.)"""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def _keyed(path: Path, key: str) -> int | None:
    """The number after ``key`` in a flat-keyed file (``cpu.stat``, ``memory.events``); None if absent."""
    try:
        for line in _read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def _number(path: Path) -> int | None:
    try:
        return int(_read(path))
    except (OSError, ValueError):
        return None


def _why(exc: OSError, doing: str) -> str:
    if exc.errno == errno.EROFS:
        return f"cannot {doing}: {exc.filename or 'the cgroup file system'} is read-only"
    if exc.errno in (errno.EACCES, errno.EPERM) and os.geteuid() != 0:
        return (f"cannot {doing}: the agent is not root and {exc.filename} is not delegated to it "
                f"({exc.strerror})")
    return f"cannot {doing}: {exc.filename or ''} {exc.strerror}".replace("  ", " ")


def _fresh(folder: Path) -> None:
    """Make the cgroup's folder; one left by a shim killed before it removed it is made again, empty."""
    try:
        os.mkdir(folder)
    except FileExistsError:
        with contextlib.suppress(OSError):
            os.rmdir(folder)
        os.mkdir(folder)  # still there (processes in it): EEXIST, and the attempt does not start


def _cpus(folder: Path, cpus: tuple[int, ...] | None) -> None:
    """The cgroup's cpuset.cpus: ``cpus``, or its parent's (None); a set the parent lacks is a sentence saying so."""
    try:
        _write(folder / "cpuset.cpus", cpu_list(cpus) if cpus else _read(folder.parent / "cpuset.cpus"))
    except OSError as exc:
        has = _read_or_empty(folder.parent / "cpuset.effective_cpus") or "?"
        raise CgroupError(f"cannot keep the job on CPUs {cpu_list(cpus or ())}: {folder.parent} has CPUs {has} "
                          f"({exc.strerror})") from None


def _writable(folder: Path) -> None:
    """OSError if this process may not make cgroups in ``folder`` (mkdir of one that exists does not say)."""
    fd = os.open(folder / "cgroup.procs", os.O_WRONLY)  # opened, never written: EACCES, EROFS
    os.close(fd)
    if not os.access(folder, os.W_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(folder))


def own_cgroups() -> dict[str, str]:
    """This process's cgroup per controller, from /proc/self/cgroup; v2's under the key ""."""
    found = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


class Cgroup:
    """One job's cgroup: a folder per hierarchy (one in v2), the same name in each."""

    def __init__(self, name: str, folders: tuple[Path, ...]) -> None:
        self.name = name
        self.folders = folders
        self._seen = 0  #: the most memory.current was read at (v2 without memory.peak)

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) in; OSError if the kernel refuses."""
        for folder in self.folders:
            _write(folder / "cgroup.procs", str(pid))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for folder in self.folders:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(pid) for pid in _read(folder / "cgroup.procs").split())
        return found

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """This process is in the cgroup for the block, then back where it was: a child forked in the block is
        in it from its first instruction (how the shim starts the job), and the shim is not in it after."""
        homes, me, entered = self._homes(), str(os.getpid()), []
        try:
            for folder, home in homes:
                try:
                    _write(folder / "cgroup.procs", me)
                except OSError as exc:
                    raise CgroupError(_why(exc, f"enter cgroup {self.name}")) from None
                entered.append(home)
            yield
        finally:
            for home in entered:
                with contextlib.suppress(OSError):
                    _write(home / "cgroup.procs", me)

    def remove(self, timeout_s: float = 1.0) -> bool:
        """Remove the cgroup once no process is left in it (retrying for ``timeout_s``); True once it is gone."""
        deadline = time.monotonic() + timeout_s
        for folder in reversed(self.folders):
            while True:
                try:
                    os.rmdir(folder)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:  # EBUSY: a process in it (or exiting); ENOTEMPTY: a plain folder
                    if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY) or time.monotonic() >= deadline:
                        return False
                    time.sleep(0.01)
        return True

    def sample(self) -> None:
        """Note the memory used now, where the kernel keeps no peak of its own (called every second or so)."""

    def _homes(self) -> list[tuple[Path, Path]]:
        """(the cgroup's folder, this process's own cgroup in that hierarchy), per hierarchy."""
        raise NotImplementedError

    def cpu_usage_s(self) -> float | None:
        """CPU time used by every process that ran in it, in seconds (None if the kernel does not say)."""
        raise NotImplementedError

    def memory_peak_mib(self) -> int | None:
        """The most memory it used, in MiB rounded up (None if unknown)."""
        raise NotImplementedError

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer killed a process in it."""
        raise NotImplementedError


class V2Cgroup(Cgroup):
    def __init__(self, name: str, folder: Path, root: Path) -> None:
        super().__init__(name, (folder,))
        self.folder, self._root = folder, root

    def _homes(self) -> list[tuple[Path, Path]]:
        return [(self.folder, self._root / own_cgroups()[""].lstrip("/"))]

    def cpu_usage_s(self) -> float | None:
        usec = _keyed(self.folder / "cpu.stat", "usage_usec")
        return None if usec is None else usec / 1e6

    def sample(self) -> None:
        self._seen = max(self._seen, _number(self.folder / "memory.current") or 0)

    def memory_peak_mib(self) -> int | None:
        peak = _number(self.folder / "memory.peak")
        if peak is None:
            self.sample()
            peak = self._seen or None
        return None if peak is None else -(-peak // MIB)

    def oom_killed(self) -> bool:
        return (_keyed(self.folder / "memory.events", "oom_kill") or 0) > 0


class V1Cgroup(Cgroup):
    def __init__(self, name: str, folders: dict[str, Path], mounts: dict[str, Path]) -> None:
        super().__init__(name, tuple(dict.fromkeys(folders.values())))  # cpu,cpuacct may share one hierarchy
        self.by_controller, self._mounts = folders, mounts

    def _homes(self) -> list[tuple[Path, Path]]:
        own = own_cgroups()
        homes = {folder: self._mounts[c] / own.get(c, "/").lstrip("/") for c, folder in self.by_controller.items()}
        return list(homes.items())

    def cpu_usage_s(self) -> float | None:
        if "cpuacct" in self.by_controller:
            ns = _number(self.by_controller["cpuacct"] / "cpuacct.usage")
            return None if ns is None else ns / 1e9
        usec = _keyed(self.by_controller["cpu"] / "cpu.stat", "usage_usec")  # newer kernels' v1 cpu.stat
        return None if usec is None else usec / 1e6

    def memory_peak_mib(self) -> int | None:
        peak = _number(self.by_controller["memory"] / "memory.max_usage_in_bytes")
        return None if peak is None else -(-peak // MIB)

    def oom_killed(self) -> bool:
        memory = self.by_controller["memory"]
        kills = _keyed(memory / "memory.oom_control", "oom_kill")  # Linux 4.13 and later
        if kills is None:  # older: it hit its limit, the nearest the kernel says
            kills = _number(memory / "memory.failcnt")
        return (kills or 0) > 0


class V2Host:
    """The unified hierarchy at ``root``; jobs' cgroups in ``root/parent``."""

    version = 2

    def __init__(self, root: Path, parent: str = PARENT) -> None:
        self.root, self.parent = Path(root), parent.strip("/")
        self.base = self.root / self.parent

    def setup(self) -> None:
        """Make the parent and give its children the cpu, cpuset and memory controllers; CgroupError if not."""
        above = self.base.parent
        try:
            offered = set(_read(above / "cgroup.controllers").split())
        except OSError as exc:
            raise CgroupError(_why(exc, f"read the controllers of {above}")) from None
        missing = [c for c in V2_NEEDED if c not in offered]
        if missing:
            raise CgroupError(f"cgroup v2 at {above} does not offer the {', '.join(missing)} controller"
                              f"{'s' if len(missing) > 1 else ''}")
        enable = " ".join(f"+{c}" for c in V2_NEEDED)
        try:
            self.base.mkdir(exist_ok=True)
            _writable(self.base)
            for folder in (above, self.base):
                if not set(V2_NEEDED) <= set(_read_or_empty(folder / "cgroup.subtree_control").split()):
                    _write(folder / "cgroup.subtree_control", enable)
        except OSError as exc:
            raise CgroupError(_why(exc, f"make cgroups under {self.base}")) from None

    def where(self) -> str:
        return f"cgroup v2 under {self.base}"

    def create(self, name: str, limits: Limits) -> V2Cgroup:
        folder = self.base / name
        try:
            _fresh(folder)
        except OSError as exc:
            raise CgroupError(_why(exc, f"make cgroup {folder}")) from None
        try:
            if limits.cpu_set:
                _cpus(folder, limits.cpu_set)
            if limits.quota_us is not None:
                _write(folder / "cpu.max", f"{limits.quota_us} {PERIOD_US}")
            if limits.memory_bytes is not None:
                _write(folder / "memory.max", str(limits.memory_bytes))
                if (self.base / "memory.swap.max").exists():  # where the kernel accounts swap
                    _write(folder / "memory.swap.max", "0")
        except (OSError, CgroupError) as exc:
            with contextlib.suppress(OSError):
                os.rmdir(folder)
            if isinstance(exc, CgroupError):
                raise
            raise CgroupError(_why(exc, f"set the limits of cgroup {folder}")) from None
        return V2Cgroup(name, folder, self.root)

    def find(self, name: str) -> V2Cgroup | None:
        folder = self.base / name
        return V2Cgroup(name, folder, self.root) if folder.is_dir() else None


class V1Host:
    """The v1 hierarchies mounted under ``root``; jobs' cgroups in ``<hierarchy>/parent`` of each."""

    version = 1

    def __init__(self, root: Path, mounts: dict[str, Path], parent: str = PARENT) -> None:
        self.root, self.parent = Path(root), parent.strip("/")
        self.mounts = {c: m for c, m in mounts.items() if c in (*V1_NEEDED, "cpuacct")}

    @classmethod
    def mounted(cls, root: Path, parent: str = PARENT) -> V1Host:
        """The hierarchies /proc/self/mounts has under ``root``; CgroupError if one that is needed is not."""
        mounts: dict[str, Path] = {}
        with contextlib.suppress(OSError):
            for line in _read(Path("/proc/self/mounts")).splitlines():
                _, point, kind, options, *_ = line.split()
                point = point.replace("\\040", " ")
                if kind == "cgroup" and (point + "/").startswith(str(root).rstrip("/") + "/"):
                    for option in options.split(","):
                        mounts.setdefault(option, Path(point))
        if not mounts:
            raise CgroupError(f"no cgroup file system is mounted at {root}")
        missing = [c for c in V1_NEEDED if c not in mounts]
        if missing:
            raise CgroupError(f"cgroup v1 at {root} has no {', '.join(missing)} hierarchy")
        return cls(root, mounts, parent)

    def setup(self) -> None:
        """Make the parent in each hierarchy, the cpuset one with the CPUs and memory nodes it may hand out."""
        try:
            for mount in dict.fromkeys(self.mounts.values()):
                (mount / self.parent).mkdir(exist_ok=True)
                _writable(mount / self.parent)
            cpuset = self.mounts["cpuset"]
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if not _read(cpuset / self.parent / knob):
                    _write(cpuset / self.parent / knob, _read(cpuset / knob))
        except OSError as exc:
            raise CgroupError(_why(exc, f"make cgroups under {self.root}/*/{self.parent}")) from None

    def where(self) -> str:
        return f"cgroup v1 under {self.root}/{{{','.join(self.mounts)}}}/{self.parent}"

    def _folders(self, name: str) -> dict[str, Path]:
        return {c: m / self.parent / name for c, m in self.mounts.items()}

    def create(self, name: str, limits: Limits) -> V1Cgroup:
        folders, made = self._folders(name), []
        try:
            for folder in dict.fromkeys(folders.values()):
                _fresh(folder)
                made.append(folder)
            cpuset = folders["cpuset"]
            _write(cpuset / "cpuset.mems", _read(cpuset.parent / "cpuset.mems"))
            _cpus(cpuset, limits.cpu_set or None)
            if limits.quota_us is not None:
                _write(folders["cpu"] / "cpu.cfs_period_us", str(PERIOD_US))
                _write(folders["cpu"] / "cpu.cfs_quota_us", str(limits.quota_us))
            if limits.memory_bytes is not None:
                memory = folders["memory"]
                _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))  # first: memsw may not be less
                if (memory / "memory.memsw.limit_in_bytes").exists():  # where the kernel accounts swap
                    _write(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        except (OSError, CgroupError) as exc:
            for folder in reversed(made):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
            if isinstance(exc, CgroupError):
                raise
            raise CgroupError(_why(exc, f"make cgroup {self.parent}/{name} with its limits")) from None
        return V1Cgroup(name, folders, self.mounts)

    def find(self, name: str) -> V1Cgroup | None:
        folders = self._folders(name)
        return V1Cgroup(name, folders, self.mounts) if any(f.is_dir() for f in folders.values()) else None


Host = V1Host | V2Host


def open_host(root: Path | str = ROOT, parent: str = PARENT) -> Host:
    """This machine's cgroups at ``root``, set up for jobs under ``parent``; CgroupError (one sentence) if not."""
    root = Path(root)
    if not parent.strip("/"):
        raise CgroupError("jobs' cgroups need a parent of their own, not the root cgroup")
    host: Host = V2Host(root, parent) if (root / "cgroup.controllers").exists() else V1Host.mounted(root, parent)
    host.setup()
    return host


@dataclass(frozen=True)
class Confinement:
    """Whether this machine's kernel holds jobs to their CPUs and memory, said in one sentence for a log."""

    host: Host | None
    sentence: str

    @property
    def enforced(self) -> bool:
        return self.host is not None


def probe(root: Path | str = ROOT, parent: str = PARENT) -> Confinement:
    """What an agent calls at its start: the host to make jobs' cgroups on, or why there is none."""
    try:
        host = open_host(root, parent)
    except CgroupError as exc:
        return Confinement(None, f"Jobs' CPU and memory limits are not enforced here, so jobs run unconfined "
                                 f"(only their CPU set is kept, by affinity): {exc}.")
    return Confinement(host, f"Jobs' CPUs and memory are enforced by the kernel: {host.where()}.")


def unconfined(why: str) -> Confinement:
    """A confinement that makes no cgroups (an agent told not to)."""
    return Confinement(None, f"Jobs' CPU and memory limits are not enforced here, so jobs run unconfined: {why}.")
