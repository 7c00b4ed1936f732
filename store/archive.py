"""Finished jobs, out of the hot database: append-only JSON lines, one file a month.

Each line is ``{"seq": N, "job": {...}}`` or a tombstone ``{"seq": N,
"deleted": ID}``, where N is the commit that wrote it. A commit writes its lines
here and then its journal record, which carries the same lines: the record is
the commit point, and its one fsync makes both durable. The archive files are
fsynced later, before a new snapshot lets the journals that carry their lines
go (``sync``); so when the store opens, the lines of commits after the snapshot
are written again from the journal (``rewrite_after``): whatever a crash lost
of them comes back, and lines of a commit that was never acknowledged (with a
higher seq than the last commit) are cut off, as is a torn last line.

The cost of a commit does not grow with history: an append touches only the
end of one file.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from labq.store.contract import Ended, HistoryPart, ended_within, month_at
from labq.store.files import Disk, write_all

_TAIL_CHUNK = 64 * 1024
#: the id of the array a line's job is a task of (its spec's ``"array":{"id":N,...}``; an id in a string is escaped)
_ARRAY = re.compile(rb'"array":\{[^{}]*?"id":(\d+)[,}]')
#: the head of a line as ``Archive.lines`` writes it: its commit, and its job's id and state, or a deletion
_HEAD = re.compile(rb'\{"seq":(\d+),(?:"job":\{"id":(\d+),"state":"([a-z_]+)"|"deleted":(\d+)\})')
#: the head of a line as ``Archive.lines`` writes a job (``encode_job``), as far as its spec's first key: its
#: commit, its job's id, state and user (a JSON string's inside)
_LISTED = re.compile(rb'\{"seq":(\d+),"job":\{"id":(\d+),"state":"([a-z_]+)","spec":\{"user":"((?:[^"\\]|\\.)*)"')
#: where a job's own times follow its spec (``encode_job``): only its own keys are followed by a number there, as the
#: spec's keys that a user names (the environment's) hold strings, and the attempts come later
_TIMES = re.compile(rb',"attempt":\d+,"submitted_at":[^,]*,"started_at":[^,]*,'
                    rb'"ended_at":(null|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?),')


def encode_line(line: dict) -> bytes:
    """One archive line's JSON (without its newline): the same bytes wherever it is encoded."""
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode()


def month_of(doc: dict, now: float) -> str:
    """The archive file a record goes to: the month its job ended, else now (UTC)."""
    return month_at(doc.get("ended_at"), now)


class Archive:
    def __init__(self, folder: Path, disk: Disk) -> None:
        self.folder = folder
        self.disk = disk
        self.problems: list[str] = []  #: damaged lines met while reading history
        #: the files written since the last ``sync``, open; the lock is held while one is written to
        self._unsynced: dict[Path, int] = {}
        self._unsynced_lock = threading.Lock()
        self._new_file = False  #: a file was made since the last ``sync``: the folder is synced too
        self._new_folder = False  #: the folder was made since the last ``sync``: its parent is synced too
        self._folder_made = False

    def files(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return sorted(self.folder.glob("jobs-*.jsonl"))

    @staticmethod
    def lines(seq: int, entries: list[dict], now: float) -> list[tuple[str, bytes]]:
        """The lines of commit ``seq`` for job documents and tombstones ``entries``: (file name, line)."""
        lines = []
        for entry in entries:
            if "deleted" in entry:
                line, month = {"seq": seq, "deleted": entry["deleted"]}, month_at(None, now)
            else:
                line, month = {"seq": seq, "job": entry}, month_of(entry, now)
            lines.append((f"jobs-{month}.jsonl", encode_line(line)))
        return lines

    def write(self, lines: list[tuple[str, bytes]]) -> dict[Path, int]:
        """Append ``lines`` (``Archive.lines``), not yet durably (``sync``). Returns the files' sizes before, for
        ``roll_back`` if the commit fails afterwards; on an error here it rolls back itself."""
        by_file: dict[Path, list[bytes]] = {}
        for name, line in lines:
            by_file.setdefault(self.folder / name, []).append(line + b"\n")
        sizes: dict[Path, int] = {}
        try:
            if not self._folder_made:
                if not self.folder.is_dir():
                    self.folder.mkdir(parents=True)
                    self._new_folder = True
                self._folder_made = True
            with self._unsynced_lock:  # a sync takes the open files: not while one is written to
                for path, chunk in by_file.items():
                    fd = self._unsynced.get(path)
                    if fd is None:
                        self._new_file |= not path.exists()
                        fd = self._unsynced[path] = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                    sizes[path] = os.fstat(fd).st_size
                    write_all(fd, b"".join(chunk))
        except BaseException:
            self.roll_back(sizes)
            raise
        return sizes

    def sync(self) -> None:
        """Make every line written so far durable: fsync the files written (or cut back) since the last sync, and
        the folders where one was made. An error propagates, and what this sync took is not to be trusted on
        disk (Linux does not report a failed write-back twice): only the journal still has it."""
        with self._unsynced_lock:
            files, self._unsynced = self._unsynced, {}
            new_file, self._new_file = self._new_file, False
            new_folder, self._new_folder = self._new_folder, False
        try:
            if new_folder:
                self.disk.fsync_folder(self.folder.parent)
            for fd in files.values():
                self.disk.fsync(fd)
            if new_file:
                self.disk.fsync_folder(self.folder)
        finally:
            for fd in files.values():
                os.close(fd)

    def rewrite_after(self, seq: int, lines: list[tuple[str, bytes]]) -> None:
        """Make the lines of the commits after ``seq`` exactly ``lines`` (in commit order, from the journal), and
        durable: cut off what the files have after their last sound line of a commit up to ``seq`` (those lines,
        or part of them, or blocks a crash left unwritten, or lines of a commit never acknowledged), append
        ``lines``, and sync."""
        self.cut_after(seq, past_damage=True)
        if lines:
            self.write(lines)
        self.sync()

    def close(self) -> None:
        """Let go of the files written since the last sync, unsynced (the journal has their lines)."""
        with self._unsynced_lock:
            files, self._unsynced = self._unsynced, {}
        for fd in files.values():
            os.close(fd)

    def roll_back(self, sizes: dict[Path, int]) -> None:
        """Cut files back to the sizes ``write`` returned: a commit that failed. Not synced here, as the lines were
        not: the next sync makes the cut durable (a sync may have taken the lines meanwhile)."""
        for path, size in sizes.items():
            if path.exists():
                os.truncate(path, size)
                with self._unsynced_lock:
                    if path not in self._unsynced:
                        self._unsynced[path] = os.open(path, os.O_WRONLY | os.O_APPEND)

    def cut_after(self, seq: int, *, past_damage: bool = False) -> list[dict]:
        """Remove lines of commits after ``seq`` and torn last lines; return what was cut. ``past_damage``: damaged
        lines after the last sound line up to ``seq`` go too (else the cut stops at one)."""
        cut: list[dict] = []
        for path in self.files():
            keep, removed = self._tail_boundary(path, seq, past_damage)
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

    def _tail_boundary(self, path: Path, seq: int, past_damage: bool = False) -> tuple[int | None, list[dict]]:
        """Where the file should end to hold only commits up to ``seq``: (offset or None, lines past it).
        ``past_damage``: a damaged line is past it too, until a sound line up to ``seq``."""
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
                        if past_damage:
                            offset -= len(raw) + 1
                            removed.append({"damaged": True})
                            continue
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

    def read(self, committed: int, since: float | None = None, until: float | None = None,
             arrays: set[int] | None = None, ids: set[int] | None = None) -> Iterator[dict]:
        """Archived jobs, last version of each, without the deleted; ``since``/``until`` on ``ended_at``;
        ``arrays``: the tasks of those arrays alone; ``ids``: those jobs alone (either way, a line that cannot be
        one of them is not decoded).

        Lines of commits after ``committed`` (one being written now) are left out.
        """
        self.problems = []
        first = month_at(since, 0.0) if since is not None else None
        keep = _of_arrays(arrays) if arrays is not None else _of_jobs(ids) if ids is not None else None
        latest: dict[int, dict | None] = {}
        for path in self.files():
            month = path.stem.removeprefix("jobs-")
            # tombstones land in the month of the deletion, so read later months too
            if first is not None and month < first:
                continue
            latest.update(self._latest_in(path, committed, keep)[0])
        for doc in latest.values():
            if doc is not None and ended_within(doc, since, until) and (
                    arrays is None or (doc["spec"].get("array") or {}).get("id") in arrays) and (
                    ids is None or doc["id"] in ids):
                yield doc

    def ended(self, committed: int, user: str | None = None) -> list[Ended]:
        """The last version of each job archived by a commit up to ``committed`` and not deleted (``user``: of that
        user's jobs alone), as ``Ended``. A line of the shape labq writes is read by its head and its times
        (``_LISTED``, ``_TIMES``), and no further when its user is another; one of another shape is decoded whole,
        and a damaged one is skipped (``read`` reports those)."""
        #: ``user`` as a line of labq's writes it (a name that JSON escapes is compared as text)
        named = json.dumps(user, ensure_ascii=False)[1:-1].encode() if user is not None else None
        latest: dict[int, Ended | None] = {}
        for raw in self._lines():
            if not raw.endswith(b"}\n"):  # torn
                continue
            head = _LISTED.match(raw)
            if head is not None:
                seq, job_id, state, quoted = head.groups()
                if int(seq) > committed or named is not None and quoted != named and b"\\" not in quoted:
                    continue
                ended_at = _ended_at(raw, head.end())
                if ended_at is not None:
                    try:
                        name = _text(quoted)
                    except ValueError:  # no JSON string: a damaged line, skipped as history skips it
                        continue
                    if user is None or name == user:
                        latest[int(job_id)] = Ended(int(job_id), state.decode(), name, ended_at[0])
                    continue
            head = _HEAD.match(raw)
            if head is not None and head.group(4) is not None:
                if int(head.group(1)) <= committed:
                    latest[int(head.group(4))] = None
                continue
            try:
                record = json.loads(raw)
                if record["seq"] > committed:
                    continue
                if "job" not in record:
                    latest[record["deleted"]] = None
                    continue
                job = record["job"]
                ended = Ended(job["id"], job["state"], job["spec"]["user"], job.get("ended_at"))
            except (ValueError, KeyError, TypeError):
                continue
            if type(ended.id) is int and ended.id >= 1 and type(ended.state) is str and type(ended.user) is str and (
                    ended.ended_at is None or type(ended.ended_at) in (int, float)) and user in (None, ended.user):
                latest[ended.id] = ended
        return [ended for ended in latest.values() if ended is not None]

    def ends(self, committed: int) -> Iterator[tuple[int, str | None]]:
        """(job id, state; None: deleted) of each line of a commit up to ``committed``, file by file, in order.
        A line's head is matched where it has the shape labq writes (``{"seq":N,"job":{"id":I,"state":"S"``); a
        line of another shape is decoded whole, and a damaged one is skipped (``read`` reports those)."""
        for raw in self._lines():
            head = _HEAD.match(raw) if raw.endswith(b"}\n") else None  # else torn, or of another shape
            if head is not None:
                seq, job_id, state, deleted = head.groups()
                if int(seq) <= committed:
                    yield (int(job_id), state.decode()) if deleted is None else (int(deleted), None)
                continue
            try:
                record = json.loads(raw)
                if record["seq"] > committed:
                    continue
                job_id, state = ((record["job"]["id"], record["job"]["state"]) if "job" in record
                                 else (record["deleted"], None))
            except (ValueError, KeyError, TypeError):
                continue
            if type(job_id) is int and job_id >= 1 and (state is None or type(state) is str):
                yield job_id, state

    def _lines(self) -> Iterator[bytes]:
        """Every line of the archive's files, oldest first."""
        for path in self.files():
            try:
                f = open(path, "rb")
            except FileNotFoundError:  # cut away by a recovery meanwhile
                continue
            with f:
                yield from f

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
                                     partial(self._latest_in, path, committed), path.stem.removeprefix("jobs-")))
        return found

    def _latest_in(self, path: Path, committed: int, keep: Callable[[bytes], bool] | None = None
                   ) -> tuple[dict[int, dict | None], bool]:
        """The last version of each job in one file (None: deleted there), leaving out lines of commits after
        ``committed``; and whether nothing was left out (no such line, no damaged one). ``keep``: only the lines
        it keeps are decoded."""
        latest: dict[int, dict | None] = {}
        whole = True
        with open(path, "rb") as f:
            for number, raw in enumerate(f, 1):
                if keep is not None and not keep(raw):
                    continue
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


def _of_arrays(arrays: set[int]) -> Callable[[bytes], bool]:
    """Whether a line may be of a task of ``arrays``, or a deletion: only such lines are decoded."""

    def keep(raw: bytes) -> bool:
        if b'"deleted":' in raw:
            return True
        task = _ARRAY.search(raw)
        return task is not None and int(task.group(1)) in arrays

    return keep


def _of_jobs(ids: set[int]) -> Callable[[bytes], bool]:
    """Whether a line may be of one of the jobs ``ids``: one of labq's shape names its job in its head
    (``_HEAD``); one of another shape is decoded to see."""

    def keep(raw: bytes) -> bool:
        head = _HEAD.match(raw)
        return head is None or int(head.group(2) or head.group(4)) in ids

    return keep


def _ended_at(raw: bytes, start: int) -> tuple[float | None] | None:
    """When the job of a line of labq's shape ended, as a 1-tuple (None in it: it has no end), from its times past
    ``start`` (its spec's first key, ``_TIMES``); None: they are not there (a line of another shape)."""
    at = raw.find(b',"attempt":', start)
    while at != -1:
        times = _TIMES.match(raw, at)
        if times is not None:
            value = times.group(1)
            return (None if value == b"null" else int(value) if value.isdigit() or value[1:].isdigit()
                    else float(value),)
        at = raw.find(b',"attempt":', at + 1)
    return None


def _text(quoted: bytes) -> str:
    """A JSON string's inside, as text."""
    return json.loads(b'"%s"' % quoted) if b"\\" in quoted else quoted.decode()
