"""Finished jobs, out of the hot database: append-only JSON lines, one file a month.

Each line is ``{"seq": N, "job": {...}}`` or a tombstone ``{"seq": N,
"deleted": ID}``, where N is the commit that wrote it. Lines are appended and
fsynced before the hot database is replaced, and the hot database's ``seq`` is
the commit point: lines with a higher seq belong to a commit that was never
acknowledged, and are cut off when the store opens. A torn last line (a crash
mid-append) is cut off the same way.

The cost of a commit does not grow with history: an append touches only the
end of one file.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from labq.store.contract import HistoryPart, ended_within
from labq.store.files import Disk, write_all

_TAIL_CHUNK = 64 * 1024


def month_of(doc: dict, now: float) -> str:
    """The archive file a record goes to: the month its job ended, else now (UTC)."""
    ended = doc.get("ended_at")
    stamp = ended if isinstance(ended, (int, float)) and not isinstance(ended, bool) else now
    return time.strftime("%Y-%m", time.gmtime(stamp))


class Archive:
    def __init__(self, folder: Path, disk: Disk) -> None:
        self.folder = folder
        self.disk = disk
        self.problems: list[str] = []  #: damaged lines met while reading history

    def files(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return sorted(self.folder.glob("jobs-*.jsonl"))

    def append(self, seq: int, entries: list[dict], now: float) -> dict[Path, int]:
        """Append job documents and tombstones for commit ``seq``, durably.

        Returns the files' sizes before the append, for ``roll_back`` if the
        commit fails afterwards; on an error here it rolls back itself.
        """
        by_file: dict[Path, list[bytes]] = {}
        for entry in entries:
            if "deleted" in entry:
                line = {"seq": seq, "deleted": entry["deleted"]}
                month = time.strftime("%Y-%m", time.gmtime(now))
            else:
                line = {"seq": seq, "job": entry}
                month = month_of(entry, now)
            path = self.folder / f"jobs-{month}.jsonl"
            by_file.setdefault(path, []).append(
                json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")
        sizes: dict[Path, int] = {}
        try:
            if not self.folder.is_dir():
                self.folder.mkdir(parents=True)
                self.disk.fsync_folder(self.folder.parent)
            new_file = False
            for path, lines in by_file.items():
                new_file |= not path.exists()
                sizes[path] = path.stat().st_size if path.exists() else 0
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                try:
                    write_all(fd, b"".join(lines))
                    self.disk.fsync(fd)
                finally:
                    os.close(fd)
            if new_file:
                self.disk.fsync_folder(self.folder)
        except BaseException:
            self.roll_back(sizes)
            raise
        return sizes

    def roll_back(self, sizes: dict[Path, int]) -> None:
        """Cut files back to the sizes ``append`` returned."""
        for path, size in sizes.items():
            if path.exists():
                with open(path, "r+b") as f:
                    f.truncate(size)
                    self.disk.fsync(f.fileno())

    def cut_after(self, seq: int) -> list[dict]:
        """Remove lines of commits after ``seq`` and torn last lines; return what was cut."""
        cut: list[dict] = []
        for path in self.files():
            keep, removed = self._tail_boundary(path, seq)
            if removed:
                cut.extend(removed)
            if keep is not None:
                with open(path, "r+b") as f:
                    f.truncate(keep)
                    f.flush()
                    self.disk.fsync(f.fileno())
        return cut

    def after(self, seq: int) -> list[dict]:
        """Lines of commits after ``seq`` (what a recovery to ``seq`` loses), without changing anything."""
        lost = []
        for path in self.files():
            _, removed = self._tail_boundary(path, seq)
            lost.extend(removed)
        return lost

    def _tail_boundary(self, path: Path, seq: int) -> tuple[int | None, list[dict]]:
        """Where the file should end to hold only commits up to ``seq``: (offset or None, lines past it)."""
        size = path.stat().st_size
        with open(path, "rb") as f:
            start = max(0, size - _TAIL_CHUNK)
            while True:
                f.seek(start)
                data = f.read(size - start)
                lines = data.split(b"\n")
                # lines[0] may be partial unless we read from the file's start
                first_whole = 0 if start == 0 else 1
                offset = size
                removed: list[dict] = []
                stop = False
                # walk backwards over whole lines
                tail = lines[-1]
                if tail:  # torn last line: no newline at the end
                    offset -= len(tail)
                    removed.append({"torn": True})
                for raw in reversed(lines[first_whole:-1]):
                    try:
                        record = json.loads(raw)
                        record_seq = record["seq"]
                    except (ValueError, KeyError, TypeError):
                        stop = True  # a damaged line inside the file: leave it to history's checks
                        break
                    if record_seq <= seq:
                        stop = True
                        break
                    offset -= len(raw) + 1
                    removed.append(record)
                if stop or start == 0:
                    break
                start = max(0, start - _TAIL_CHUNK)
        return (offset if offset != size else None), list(reversed(removed))

    def read(self, committed: int, since: float | None = None, until: float | None = None) -> Iterator[dict]:
        """Archived jobs, last version of each, without the deleted; ``since``/``until`` on ``ended_at``.

        Lines of commits after ``committed`` (one being written now) are left out.
        """
        self.problems = []
        first = time.strftime("%Y-%m", time.gmtime(since)) if since is not None else None
        latest: dict[int, dict | None] = {}
        for path in self.files():
            month = path.stem.removeprefix("jobs-")
            # tombstones land in the month of the deletion, so read later months too
            if first is not None and month < first:
                continue
            latest.update(self._latest_in(path, committed)[0])
        for doc in latest.values():
            if doc is not None and ended_within(doc, since, until):
                yield doc

    def parts(self, committed: int) -> list[HistoryPart]:
        """The archive's files, oldest first, as parts (``HistoryPart``) that read as ``read`` does."""
        self.problems = []
        files = self.files()
        found = []
        for number, path in enumerate(files, 1):
            try:
                stat = path.stat()
            except FileNotFoundError:  # cut away by a recovery meanwhile
                continue
            found.append(HistoryPart(path.name, stat.st_size, stat.st_mtime_ns, number < len(files),
                                     partial(self._latest_in, path, committed)))
        return found

    def _latest_in(self, path: Path, committed: int) -> tuple[dict[int, dict | None], bool]:
        """The last version of each job in one file (None: deleted there), leaving out lines of commits after
        ``committed``; and whether nothing was left out (no such line, no damaged one)."""
        latest: dict[int, dict | None] = {}
        whole = True
        with open(path, "rb") as f:
            for number, raw in enumerate(f, 1):
                try:
                    record = json.loads(raw)
                    if record["seq"] > committed:
                        whole = False
                        continue
                except (ValueError, KeyError, TypeError):
                    self.problems.append(f"{path.name} line {number} is damaged and was skipped")
                    whole = False
                    continue
                if "deleted" in record:
                    latest[record["deleted"]] = None
                elif "job" in record:
                    latest[record["job"]["id"]] = record["job"]
        return latest, whole
