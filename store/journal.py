"""The journal: every group commit's changes, appended as one checksummed record and fsynced once.

A record is one line, ``LEN CRC PAYLOAD`` and a newline: LEN and CRC are 8 hex digits each (the
payload's length in bytes and its CRC-32), the payload compact JSON::

    {"archive":[[FILE,LINE],...],"jobs":{"ID":DOC or null,...},"next_job_id":N,
     "records":[[TABLE,KEY,RECORD or null],...],"reserved":R,"seq":S,
     "tasks":[[FIRST DOC,[[ID,COMMAND,ENV,INDEX],...]],...]}

``archive`` holds the commit's archive lines (``labq.store.archive``: the jobs it finished or deleted), each as
the name of the month's file and the line itself; every record has it, so that one without it tells a record of
an older labq, whose archive lines are in the archive's files alone (it fsynced them there).
``tasks`` (only when a commit made an array's tasks) holds them as the first task's document and each other
task's differences from it (``PutTasks``), applied before ``jobs``.

Journal files are named by the first commit they may hold (``journal-000000000042.log``); the
snapshot (``labq.json``) says which commit it holds, and loading replays every record after it.

Reading tells a torn tail from damage. A crash mid-append leaves the last record cut short (its
header or its payload runs past the end of the file) or filled with zero bytes (blocks the file
system had allotted but not written): that record was never acknowledged and is dropped. Anything
else that fails (a bad header, a checksum that does not match, a cut record with a sound one after
it) is damage, and the store refuses to open until ``labq store recover`` has said what it loses.
"""

from __future__ import annotations

import json
import logging
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from labq.store.files import Disk, write_all

_HEADER = re.compile(rb"([0-9a-f]{8}) ([0-9a-f]{8}) ")
HEADER_BYTES = 18
_HEADER_SHAPE = b"xxxxxxxx xxxxxxxx "  #: x: a hex digit
_NAME = re.compile(r"^journal-(\d{12})\.log$")
_IDS = re.compile(rb'"(?:next_job_id|reserved)":(\d+)')

log = logging.getLogger("labq.store")


def journal_name(first_seq: int) -> str:
    return f"journal-{first_seq:012d}.log"


def journal_files(data_dir: Path) -> list[tuple[int, Path]]:
    """The journals in ``data_dir`` as (first commit, path), oldest first."""
    found = []
    for path in data_dir.glob("journal-*.log"):
        match = _NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def frame(payload: bytes) -> bytes:
    return b"%08x %08x " % (len(payload), zlib.crc32(payload)) + payload + b"\n"


def dumps(value: object) -> bytes:
    """Canonical compact JSON: the journal's records and the snapshot's documents."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class JournalDamaged(Exception):
    """A journal record before the tail fails its checks; ``offset`` is where, in ``path``."""

    def __init__(self, path: Path, offset: int, what: str) -> None:
        super().__init__(f"{path} is damaged at byte {offset}: {what}")
        self.path, self.offset, self.what = path, offset, what


@dataclass(frozen=True)
class JournalRead:
    records: list[dict]
    good_bytes: int  #: where the last sound record ends
    torn: bool  #: a torn record followed the sound ones (a crash mid-append): dropped
    damage: JournalDamaged | None = None  #: only with ``upto_damage``: what stopped the reading
    rest: bytes = b""  #: only with ``upto_damage``: the bytes from the damage on


def read_journal(path: Path, *, last: bool, upto_damage: bool = False) -> JournalRead:
    """The sound records of ``path``; ``last``: the newest journal, the only one a crash can leave torn.

    Raises JournalDamaged for damage (anything but a torn tail of the last journal), unless ``upto_damage``:
    then the records before it, and the damage, as a recovery needs them."""
    raw = path.read_bytes()
    records: list[dict] = []
    pos = 0
    try:
        for start, end, payload in _frames(raw, path):
            if payload is None:  # torn
                if not last:
                    raise JournalDamaged(path, start, "a record is cut short, in a journal that was closed whole")
                return JournalRead(records, pos, True)
            try:
                record = json.loads(payload)
            except ValueError:
                raise JournalDamaged(path, start, "a record with a sound checksum is not JSON") from None
            if not isinstance(record, dict) or not isinstance(record.get("seq"), int):
                raise JournalDamaged(path, start, "a record has no commit number")
            records.append(record)
            pos = end
    except JournalDamaged as err:
        if not upto_damage:
            raise
        return JournalRead(records, pos, False, err, raw[pos:])
    return JournalRead(records, pos, False)


def _frames(raw: bytes, path: Path) -> Iterator[tuple[int, int, bytes | None]]:
    """(start, end, payload) of each record; payload None for a torn one, which ends the file."""
    pos, size = 0, len(raw)
    while pos < size:
        header = _HEADER.match(raw, pos)
        if header is None:
            rest = raw[pos:]
            if (len(rest) < HEADER_BYTES and _could_be_header(rest)) or not rest.strip(b"\0"):
                yield pos, size, None
                return
            raise JournalDamaged(path, pos, "a record header is not readable")
        length, crc = int(header.group(1), 16), int(header.group(2), 16)
        body = pos + HEADER_BYTES
        end = body + length + 1
        if end > size:
            if _sound_record_after(raw, pos + 1):
                raise JournalDamaged(path, pos, "a record's length runs past sound records after it")
            yield pos, size, None
            return
        payload = raw[body:body + length]
        if zlib.crc32(payload) != crc or raw[end - 1:end] != b"\n":
            if end == size and b"\0" in payload:  # blocks allotted but never written: the append was cut
                yield pos, size, None
                return
            raise JournalDamaged(path, pos, "a record fails its checksum")
        yield pos, end, payload
        pos = end


def _could_be_header(rest: bytes) -> bool:
    """``rest`` is the start of a header: what a crash in the middle of writing one leaves."""
    return all(c == ord(" ") if t == ord(" ") else c in b"0123456789abcdef" for c, t in zip(rest, _HEADER_SHAPE))


def _sound_record_after(raw: bytes, pos: int) -> bool:
    """Is there a whole record with a sound checksum anywhere after ``pos``? (a rare path: a cut record)"""
    for match in _HEADER.finditer(raw, pos):
        length, crc = int(match.group(1), 16), int(match.group(2), 16)
        body = match.end()
        if body + length < len(raw) and raw[body + length] == ord("\n") and zlib.crc32(raw[body:body + length]) == crc:
            return True
    return False


_NAMED = re.compile(rb'"(?:id|deleted|next_job_id|reserved|ids_reserved_until)":(\d+)')


def ids_named(raw: bytes) -> int:
    """The highest number any of labq's files ``raw`` gives as a job id, a next id or a reservation (0 if none):
    read as bytes, so a damaged file still tells."""
    return max((int(m.group(1)) for m in _NAMED.finditer(raw)), default=0)


def ids_mentioned(raw: bytes) -> int:
    """The highest job id any record of ``raw`` may have handed out, sound or not (0 if none): a recovery
    that drops damaged records resumes ids past it."""
    return max((int(m.group(1)) for m in _IDS.finditer(raw)), default=0)


#: what a journal is named until its first sync (``JournalWriter``)
TEMP_SUFFIX = ".unsynced"


class JournalWriter:
    """The journal commits append to: ``write`` from the store's writer, one at a time, and ``sync`` from its
    syncer, which may run beside a write (it counts only the records it was given)."""

    def __init__(self, path: Path, disk: Disk, *, good_bytes: int | None = None, unnamed: bool = False) -> None:
        """Open ``path`` for appending, made if missing; ``good_bytes``: cut a torn tail off first. ``unnamed``: a
        new journal that follows one whose last records may not be on disk yet: it is made under a temporary name
        (``TEMP_SUFFIX``, which opening removes) and takes ``path`` at its first sync, which comes after theirs, so
        that no journal follows one whose end a power loss may have cut off."""
        self.disk = disk
        self.named: Path | None = None
        if unnamed:
            self.named, path = path, path.with_name(path.name + TEMP_SUFFIX)
            path.unlink(missing_ok=True)
        self.path = path
        made = not path.exists()
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            size = os.fstat(self.fd).st_size
            if good_bytes is not None and good_bytes < size:
                os.ftruncate(self.fd, good_bytes)
                size = good_bytes
            if size and not made:  # what opening read (a tail a stopped writer never synced, a cut) is on disk
                disk.fsync(self.fd)  # before anything is built on it
        except BaseException:
            os.close(self.fd)
            raise
        #: its name is made durable (the folder synced) with its first record's sync, so that a compaction swaps
        #: journals without waiting for the disk; a journal found at opening may be one whose name never was
        self.folder_unsynced = True
        self.size = self.synced = size  #: ``synced``: what the last sync made durable
        self.cut_unsynced = False  #: a cut (``cut_back``) whose sync failed: no journal may follow it until synced

    def write(self, payload: bytes) -> None:
        """One record, written but not yet durable (``sync``); on an error the file is as it was, or the error
        says it could not be cut back (``JournalStuck``)."""
        record = frame(payload)
        try:
            write_all(self.fd, record)
        except OSError as err:
            self._cut(self.size, err)
            raise
        self.size += len(record)

    def sync(self, upto: int) -> None:
        """Make the records up to byte ``upto`` durable (the fsync may take later ones too, but those count as
        synced only by a sync of their own). An error propagates, and what was written since the last sync is not
        to be trusted on disk (Linux does not report a failed write-back twice): ``cut_back``."""
        self.disk.fsync(self.fd)
        self.cut_unsynced = False
        if self.named is not None:  # what went before it is on disk: it may be found now
            os.rename(self.path, self.named)
            self.path, self.named = self.named, None
        if self.folder_unsynced:
            self.disk.fsync_folder(self.path.parent)
            self.folder_unsynced = False
        self.synced = max(self.synced, upto)

    def cut_back(self, err: OSError) -> None:
        """Cut off what was written since the last sync that succeeded (a sync of it failed with ``err``), or
        raise ``JournalStuck``: the records after that sync are written again or not at all."""
        self._cut(self.synced, err)
        self.size = self.synced
        self.cut_unsynced = True
        try:  # the cut is durable with the next good sync; this one makes it so now, if the disk lets it
            self.disk.fsync(self.fd)
            self.cut_unsynced = False
        except OSError as again:
            log.warning("the journal %s was cut back after a failed sync, but the cut could not be synced (%s): "
                        "the next sync makes it durable", self.path, again.strerror or again)

    def _cut(self, size: int, err: OSError) -> None:
        try:
            os.ftruncate(self.fd, size)
        except OSError as again:
            raise JournalStuck(again) from err

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class JournalStuck(OSError):
    """A write or a sync failed and the part written could not be cut off: the journal takes no more records."""
