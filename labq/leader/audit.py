"""The audit trail: who did what to which job or thing, from where, and how it ended.

Every request that changes something (or tries to) is one line of JSON in ``<data>/audit.jsonl``: when,
a number that only grows, who (the user, or the agent or join token), how they came (their token's id,
or the node whose agent vouched for them), from which address, the action, its job or other target, and
the answer's status (a refusal too, with its sentence). No body is written: no command, no environment
value, no token. A line is written when the answer is known, flushed at once (a leader that dies keeps
it), and the file is rotated at ``ROTATE_BYTES`` into ``audit.jsonl.1`` .. ``.N``, the oldest dropped.
``labq events`` reads it back (``GET /v1/audit``): admins everything, a user what they did and what was
done to their jobs. The lab's own steps (a job placed, started, preempted, requeued, ended; a reservation's
start and end) are lines too, of ``kind: "lab"`` (``labq.leader.lab_trail``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("labq.leader")

FILE = "audit.jsonl"
ROTATE_BYTES = 32 << 20
KEEP = 5  #: rotated files kept
MAX_ANSWER = 1000  #: entries in one answer at most


@dataclass(frozen=True)
class AuditQuery:
    user: str | None = None  #: entries by this user, or about their jobs
    job: int | None = None
    action: str | None = None
    since: float | None = None
    until: float | None = None
    after: int | None = None  #: entries after this seq (``--follow``)
    limit: int = 100
    #: "user", "agent", "join" (who made the request) or "lab" (the lab's own steps: ``labq.leader.lab_trail``)
    kind: str | None = None


class AuditLog:
    def __init__(self, folder: Path, clock: Callable[[], float]) -> None:
        self.path = folder / FILE
        self.clock = clock
        self._lock = threading.Lock()
        self._seq = self._last_seq()
        self._file = None
        self._size = 0  #: the current file's size in bytes, once open

    def _last_seq(self) -> int:
        """The seq of the last entry written, from the newest file that has one."""
        for path in self._files(newest_first=True):
            try:
                with open(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(0, f.tell() - 65536))
                    lines = f.read().splitlines()
            except OSError:
                continue
            for line in reversed(lines):
                try:
                    return int(json.loads(line)["seq"])
                except (ValueError, KeyError, TypeError):
                    continue
        return 0

    def _files(self, newest_first: bool = False) -> list[Path]:
        found = [self.path.with_name(f"{FILE}.{n}") for n in range(KEEP, 0, -1)] + [self.path]
        found = [p for p in found if p.exists()]
        return found[::-1] if newest_first else found

    def record(self, entry: dict) -> None:
        """Append ``entry`` with its time and seq. A disk that refuses is logged, and the leader goes on: what
        the request it records did is done, and it is answered next."""
        with self._lock:
            self._seq += 1
            line = json.dumps({"seq": self._seq, "at": self.clock(), **entry}, separators=(",", ":")).encode() + b"\n"
            try:
                if self._file is None:
                    self._file = self._open()
                self._file.write(line)
                self._file.flush()
                self._size += len(line)  # kept here: a file's tell() is a system call, on every request
                if self._size > ROTATE_BYTES:
                    self._rotate()
            except OSError as err:
                log.error("cannot write the audit trail %s: %s", self.path, err)
                self._close()

    def _open(self):
        """The current file, to append to; a last line cut short (a crash mid-write) is ended first, so the
        next entry starts a line of its own."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a+b") as raw:
            self._size = raw.tell()
            if self._size > 0:
                raw.seek(self._size - 1)
                if raw.read(1) != b"\n":
                    raw.write(b"\n")
                    self._size += 1
        return open(self.path, "ab")  # noqa: SIM115 - kept open while the leader runs

    def _rotate(self) -> None:
        self._close()
        for n in range(KEEP - 1, 0, -1):
            older = self.path.with_name(f"{FILE}.{n}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{FILE}.{n + 1}"))
        os.replace(self.path, self.path.with_name(f"{FILE}.1"))

    def _close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def close(self) -> None:
        with self._lock:
            self._close()

    def entries(self) -> Iterator[dict]:
        """Every entry kept, oldest first (a damaged line is skipped)."""
        for path in self._files():
            try:
                with open(path, "rb") as f:
                    yield from filter(None, map(_entry, f))
            except OSError:
                continue

    def newest_first(self) -> Iterator[dict]:
        """Every entry kept, newest first, reading the files from their ends: a question about the last few
        entries (``labq events``, ``--follow``) reads only the tail of the trail."""
        for path in self._files(newest_first=True):
            try:
                with open(path, "rb") as f:
                    yield from filter(None, map(_entry, _lines_backwards(f)))
            except OSError:
                continue

    def find(self, query: AuditQuery, visible: Callable[[dict], bool]) -> list[dict]:
        """The last ``query.limit`` entries that match and ``visible`` allows, oldest first. Seqs only grow, so
        the reading stops at ``query.after``."""
        found: list[dict] = []
        for entry in self.newest_first():
            if query.after is not None and entry["seq"] <= query.after:
                break
            if visible(entry) and _matches(entry, query):
                found.append(entry)
                if len(found) >= query.limit:
                    break
        return found[::-1]


def _entry(line: bytes) -> dict | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("seq"), int) else None


def _lines_backwards(f, block: int = 1 << 16) -> Iterator[bytes]:
    """The lines of a binary file, last first."""
    f.seek(0, os.SEEK_END)
    end, rest = f.tell(), b""
    while end > 0:
        start = max(0, end - block)
        f.seek(start)
        lines = (f.read(end - start) + rest).split(b"\n")
        end, rest = start, lines[0]
        yield from reversed(lines[1:])
    yield rest


def _matches(entry: dict, q: AuditQuery) -> bool:
    at = entry.get("at", 0)
    return ((q.user is None or q.user in (entry.get("user"), entry.get("owner")))
            and (q.job is None or entry.get("job") == q.job)
            and (q.action is None or entry.get("action") == q.action)
            and (q.kind is None or entry.get("kind") == q.kind)
            and (q.since is None or at >= q.since) and (q.until is None or at < q.until)
            and (q.after is None or entry["seq"] > q.after))
