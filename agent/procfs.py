"""What the agent reads of this machine's processes from /proc: who is whose parent and group, and a process's
environment. Processes come and go between two reads: one that is gone, or not this user's to read, is left out."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping


def process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process (fields 4 and 5 of /proc/PID/stat)."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 2:
            table[int(entry.name)] = (int(fields[1]), int(fields[2]))
    return table


def children_of(table: Mapping[int, tuple[int, int]]) -> dict[int, list[int]]:
    """Each parent's children, from a ``process_table``."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    return children


def below(starts: Iterable[int], children: Mapping[int, list[int]]) -> set[int]:
    """``starts`` and every process descended from them (``children`` from ``children_of``)."""
    found = set(starts)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def environment(pid: int, needle: bytes = b"") -> dict[str, str] | None:
    """Process ``pid``'s environment as it started; None if it cannot be read, or lacks ``needle`` (a quick look
    before the parse)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    if needle not in raw:
        return None
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env
