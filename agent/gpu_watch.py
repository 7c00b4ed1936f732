"""The agent's watch over jobs that share a GPU by memory: what each uses, the most it used, who went over.

Each attempt's processes are its process group and every process descended from its first one (a container's
processes descend from the container's first process), or from its shim, whose children the job's orphans become
(``attempt_roots``), found in /proc. Their GPU memory is what the inventory
reads per process (NVML, or the simulated model). An attempt over its limit (``RunOrder.gpu_mem_limit_mib``:
its declaration and the margin) is news for the leader at once; the leader asks it to stop through its
checkpoint contract, so it is the one that stops and never its neighbours on the GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from labq.agent.inventory import GpuMemory
from labq.agent.process_runtime import AttemptStatus
from labq.agent.procfs import below, children_of
from labq.models.sharing import over_limit

Key = tuple[int, int]  #: (job id, attempt)
WATCH_EVERY_S = 1.0  #: how often the GPU memory of sharing jobs is read


def attempt_roots(attempts: Iterable[AttemptStatus], table: Mapping[int, tuple[int, int]]) -> dict[Key, int]:
    """Where each running attempt's processes start (for ``processes_of``): its ``tree_pid`` (the shim) while that
    is still the job's parent, so that what left the job's group and was orphaned counts too; else the job."""
    roots = {}
    for status in attempts:
        if status.pid:
            parent = table.get(status.pid, (None, None))[0]
            tree = status.tree_pid
            roots[(status.job_id, status.attempt)] = tree if tree is not None and parent == tree else status.pid
    return roots


def processes_of(roots: Mapping[Key, int], table: Mapping[int, tuple[int, int]]) -> dict[Key, set[int]]:
    """Each attempt's processes: its first process's group, and everything descended from that process."""
    children = children_of(table)
    groups: dict[int, list[int]] = {}
    for pid, (_, group) in table.items():
        groups.setdefault(group, []).append(pid)
    return {key: below({root, *groups.get(root, ())}, children) for key, root in roots.items()}


class MemoryWatch:
    """The GPU memory of the attempts that share a GPU, as last read, and the most each was seen using."""

    def __init__(self) -> None:
        self.limits: dict[Key, int] = {}  #: per sharing attempt: past this many MiB it is stopped
        self.used: dict[Key, int] = {}
        self.peaks: dict[Key, int] = {}
        self._told: set[Key] = set()  #: attempts whose going over was news already

    def expect(self, limits: Mapping[Key, int]) -> None:
        """The sharing attempts the leader wants running here now, with their limits (the whole truth)."""
        self.limits = dict(limits)
        for book in (self.used, self.peaks):
            for key in [k for k in book if k not in self.limits]:
                del book[key]
        self._told &= set(self.limits)

    def look(self, memory: GpuMemory, processes: Mapping[Key, Iterable[int]]) -> list[Key]:
        """Take in a reading; the attempts that went over their limit since the last look (news for the leader)."""
        for key in self.limits:
            pids = processes.get(key, ())
            used = sum(mib or 0 for pid in pids if (seen := memory.by_pid.get(pid)) for mib in (seen[1],))
            self.used[key] = used
            self.peaks[key] = max(self.peaks.get(key, 0), used)
        over = [key for key in over_limit(self.limits, self.peaks) if key not in self._told]
        self._told.update(over)
        return over

    def reading(self, key: Key) -> tuple[int | None, int | None]:
        """What the attempt uses now and the most it used, for the leader; (None, None) if not watched."""
        if key not in self.used:
            return None, None
        return self.used[key], self.peaks[key]
