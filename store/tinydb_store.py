"""The leader's durable store: a TinyDB database that is never torn, plus a job archive.

Layout of the data folder::

    labq.json        the hot database (TinyDB's JSON format): unfinished jobs,
                     reservations, users, ...; a checksummed ``_meta`` table
                     with the schema version, the commit count and the next job id
    labq.json.prev   the previous good copy, one commit older
    archive/         finished jobs, one JSON-lines file a month
    leader.lock      held by the one process that writes

A commit returns only once it is on disk. Commits arriving while one is
being written wait and then go to disk together (group commit): one write and
one fsync for all of them, so throughput does not collapse to one fsync per
submit.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tinydb import Query, TinyDB
from tinydb.storages import Storage
from tinydb.table import Document

from labq.store.archive import Archive
from labq.store.contract import (
    JOBS, META, Batch, Change, Ids, CommitFailed, CorruptDatabase, SchemaMismatch, StoredState, StoreError, StoreLocked,
)
from labq.store.files import Disk, remove_stale_temp_files, replace_atomically

SCHEMA = 1
#: Each commit records that ids up to this many past its next id may have been handed out,
#: so that a recovery to the previous copy never hands out an id a lost commit used.
ID_RESERVE = 1000
DB_NAME = "labq.json"
PREVIOUS_NAME = "labq.json.prev"
LOCK_NAME = "leader.lock"
ARCHIVE_DIR = "archive"


def recover_hint(data_dir: Path, *, checked: bool = False) -> str:
    """What to do about a damaged database in ``data_dir``: only steps that work there.

    It looks at the previous copy (reading only): ``--recover`` is suggested only when that
    copy is sound, else a restore from a backup. ``checked``: said after ``labq store check``.
    """
    lines = [] if checked else ["Nothing was changed. To see which files are sound: "
                                f"labq store check --data-dir {data_dir}"]
    problem = previous_copy_problem(data_dir)
    if problem is None:
        return "\n".join(lines + [
            f"To go back to the last good copy ({PREVIOUS_NAME}) and start, run:",
            f"    labq leader --recover --data-dir {data_dir}",
            f"(or labq store recover --data-dir {data_dir} to recover without starting). "
            f"Both say what will be lost before they do anything."])
    archive = data_dir / ARCHIVE_DIR
    return "\n".join(lines + [
        f"The previous copy, {data_dir / PREVIOUS_NAME}, {problem}: there is no good copy here to go back to.",
        "Restore the data folder from a backup made with `labq store backup`:",
        f"    labq store restore BACKUP --data-dir {data_dir} --force",
        f"where BACKUP is the backup's folder. The files it replaces (the database, the previous copy and "
        f"the archive of finished jobs, {archive}) are moved into {data_dir}/replaced-<time>/, not deleted.",
        f"Without a backup: move {data_dir} aside and start a new lab; the finished jobs stay readable, "
        f"one JSON line each, in the archive files it had ({archive}/jobs-YYYY-MM.jsonl)."])


def previous_copy_problem(data_dir: Path) -> str | None:
    """What is wrong with the previous copy ("is missing", "is damaged too"); None if it is sound."""
    previous = data_dir / PREVIOUS_NAME
    try:
        raw = previous.read_bytes()
    except FileNotFoundError:
        return "is missing"
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    try:
        decode(raw, previous)
    except StoreError:
        return "is damaged too"
    return None


def _dumps(data: dict) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# Canonical JSON sorts keys, so the file always opens with the _meta table (table names are
# lower-case, "_" sorts first) and its record, whose first key is "checksum". The checksum is
# spliced in there: one serialisation per commit, and a check on open that needs none.
_PREFIX = b'{"' + META.encode() + b'":{"1":{'
_CHECKSUM = re.compile(rb'"checksum":"([0-9a-f]{64})",')


def encode(data: dict) -> bytes:
    """The file's bytes: canonical JSON whose ``_meta`` carries a checksum of the rest."""
    data[META]["1"].pop("checksum", None)
    body = _dumps(data)
    assert body.startswith(_PREFIX), "the _meta table must come first"
    digest = hashlib.sha256(body).hexdigest().encode()
    return _PREFIX + b'"checksum":"' + digest + b'",' + body[len(_PREFIX):]


def decode(raw: bytes, path: Path) -> dict:
    """Parse and check a database file; raise with what is wrong. Never writes.

    Damage is raised without advice (``hint``): what to do depends on the rest of the data
    folder (is the previous copy sound?), which the caller adds with ``recover_hint``.
    """
    if not raw.strip():
        raise CorruptDatabase(f"{path} is empty ({len(raw)} bytes): it was cut off or never written")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorruptDatabase(f"{path} is not text (a byte that is not UTF-8 at {err.start} of {len(raw)}): "
                              f"it is damaged") from None
    try:
        data = json.loads(text)
    except ValueError as err:
        raise CorruptDatabase(f"{path} is not valid JSON ({err.msg}; character {err.pos} of {len(text)}): "
                              f"it is truncated or damaged") from None
    try:
        meta = data[META]["1"]
        schema = meta["schema"]
    except (KeyError, TypeError):
        raise CorruptDatabase(f"{path} is not a labq database: it has no {META} table") from None
    # The checksum first: a changed digit in the schema number is damage, not another labq.
    meta.pop("checksum", None)
    stamp = _CHECKSUM.match(raw, len(_PREFIX)) if raw.startswith(_PREFIX) else None
    body = _PREFIX + raw[stamp.end():] if stamp else b""
    if stamp is None or stamp.group(1).decode() != hashlib.sha256(body).hexdigest():
        if schema == SCHEMA:
            raise CorruptDatabase(f"{path} fails its checksum: it was changed or damaged on disk")
        raise CorruptDatabase(
            f"{path} may be damaged: its schema number reads {schema!r} (this labq reads schema {SCHEMA}) "
            f"and it fails its checksum, so a changed character is likelier than another labq version "
            f"(if another version did write it, use that version instead of recovering)")
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise SchemaMismatch(f"{path} has an unknown schema {schema!r}",
                             "Nothing was changed. Open it with the labq version that wrote it.")
    if schema > SCHEMA:
        raise SchemaMismatch(
            f"{path} was written by a newer labq (schema {schema}); this labq reads schema {SCHEMA}",
            "Nothing was changed. Upgrade labq on this machine to the version that wrote it.")
    if schema < SCHEMA:
        raise SchemaMismatch(f"{path} has schema {schema}, older than any this labq can read ({SCHEMA})",
                             "Nothing was changed. Open it with the labq version that wrote it.")
    for key in ("seq", "next_job_id", "ids_reserved_until"):
        if not isinstance(meta.get(key), int):
            raise CorruptDatabase(f"{path}: {META} has no integer {key}")
    return data


class _Memory(Storage):
    """TinyDB's view of the hot database: kept in memory; the store decides when it goes to disk."""

    def __init__(self, data: dict) -> None:
        self.data = data

    def read(self) -> dict:
        return self.data

    def write(self, data: dict) -> None:
        self.data = data


@dataclass
class _Ticket:
    changes: list[Change]
    seq: int | None = None
    error: StoreError | None = None
    done: bool = False


class TinyDBStore:
    """The store the leader uses. Thread-safe; one per data folder and process."""

    def __init__(self, data_dir: str | os.PathLike, *, disk: Disk | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / DB_NAME
        self.previous = self.data_dir / PREVIOUS_NAME
        self.disk = disk or Disk()
        self.clock = clock
        self.archive = Archive(self.data_dir / ARCHIVE_DIR, self.disk)
        self._cond = threading.Condition()
        self._queue: list[_Ticket] = []
        self._writing = False
        self._broken: str | None = None
        self._lock_fd = take_leader_lock(self.data_dir)
        try:
            self._open()
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _open(self) -> None:
        remove_stale_temp_files(self.data_dir, [DB_NAME, PREVIOUS_NAME])
        if self.path.exists():
            raw = self.path.read_bytes()
            try:
                data = decode(raw, self.path)
            except CorruptDatabase as err:
                raise CorruptDatabase(err.args[0], recover_hint(self.data_dir)) from None
        else:
            leftovers = [p.name for p in (self.previous,) if p.exists()] + [
                f"{ARCHIVE_DIR}/{p.name}" for p in self.archive.files()]
            if leftovers:
                raise CorruptDatabase(
                    f"{self.path} is missing, but {', '.join(leftovers)} is there: this is not a new lab",
                    recover_hint(self.data_dir))
            data = {META: {"1": {"schema": SCHEMA, "seq": 0, "next_job_id": 1,
                                 "ids_reserved_until": 1 + ID_RESERVE}}}
            raw = encode(data)
            replace_atomically(self.path, raw, self.disk)
        meta = data[META]["1"]
        self._committed = meta["seq"]
        self._reserved = meta["ids_reserved_until"]
        self.archive.cut_after(self._committed)
        self._last_good = raw
        self._db = TinyDB(data, storage=_Memory)
        self._ids = Ids(hot={doc.doc_id for doc in self._db.table(JOBS).all()}, next_job_id=meta["next_job_id"],
                        floor=meta["next_job_id"])
        self._record_keys = {
            name: {doc["key"] for doc in self._db.table(name).all()}
            for name in self._db.tables() if name not in (JOBS, META)
        }

    # -- reading -------------------------------------------------------------------------

    def load(self) -> StoredState:
        with self._cond:
            while self._writing:
                self._cond.wait()
            jobs = {doc.doc_id: dict(doc) for doc in self._db.table(JOBS).all()}
            records = {name: {doc["key"]: doc["record"] for doc in self._db.table(name).all()}
                       for name in self._db.tables() if name not in (JOBS, META)}
            return StoredState(jobs, records, self._ids.next_job_id, self._committed)

    def history(self, since: float | None = None, until: float | None = None) -> list[dict]:
        """Finished jobs from the archive (newest version of each), by when they ended."""
        return list(self.archive.read(self._committed, since, until))

    # -- writing -------------------------------------------------------------------------

    def commit(self, changes: Iterable[Change]) -> int:
        """Apply ``changes`` atomically and durably; return the commit number.

        Raises InvalidChange (this commit broke a rule; others are unaffected)
        or CommitFailed (the disk refused; nothing was acknowledged).
        """
        ticket = _Ticket(list(changes))
        with self._cond:
            self._queue.append(ticket)
            while not ticket.done and self._writing:
                self._cond.wait()
            if ticket.done:
                return self._result(ticket)
            self._writing = True
            batch, self._queue = self._queue, []
        try:
            self._write(batch)
        finally:
            with self._cond:
                self._writing = False
                for t in batch:
                    t.done = True
                self._cond.notify_all()
        return self._result(ticket)

    @staticmethod
    def _result(ticket: _Ticket) -> int:
        if ticket.error is not None:
            raise ticket.error
        assert ticket.seq is not None
        return ticket.seq

    def _write(self, tickets: list[_Ticket]) -> None:
        if self._broken:
            for t in tickets:
                t.error = CommitFailed(f"the store refuses changes until the leader restarts: {self._broken}")
            return
        batch = Batch(self._ids, self._record_keys)
        accepted = []
        for t in tickets:
            try:
                batch.add(t.changes)
                accepted.append(t)
            except StoreError as err:
                t.error = err
        if not accepted:
            return
        sizes: dict = {}
        try:
            if batch.next_job_id > self._reserved:
                # The previous copy must cover every id this commit hands out: commit the
                # reservation first, so that it becomes the previous copy.
                self._write_meta(self._committed + 1, self._ids.next_job_id, batch.next_job_id + ID_RESERVE)
            seq = self._committed + 1
            if batch.archive:
                sizes = self.archive.append(seq, batch.archive, self.clock())
            self._apply(batch)
            self._write_meta(seq, batch.next_job_id, max(self._reserved, batch.next_job_id + ID_RESERVE))
        except OSError as err:
            self._db = TinyDB(json.loads(self._last_good), storage=_Memory)
            try:
                self.archive.roll_back(sizes)
            except OSError as again:
                self._broken = f"the archive could not be rolled back ({again.strerror})"
            failure = CommitFailed(
                f"the change was not saved: {err.strerror or err} ({err.filename or self.path})",
                "Nothing was acknowledged and the database on disk is as it was. "
                + ("Free some space in " + str(self.data_dir) if err.errno == errno.ENOSPC
                   else "Check the disk (dmesg) before retrying."))
            for t in accepted:
                t.error = failure
            return
        batch.settle()
        for t in accepted:
            t.seq = seq

    def _write_meta(self, seq: int, next_job_id: int, reserved: int) -> None:
        """Stamp the commit into ``_meta`` and put the whole database on disk."""
        self._db.table(META).upsert(Document(
            {"schema": SCHEMA, "seq": seq, "next_job_id": next_job_id, "ids_reserved_until": reserved}, doc_id=1))
        payload = encode(self._db.storage.data)
        replace_atomically(self.path, payload, self.disk, previous=self.previous)
        self._committed, self._reserved, self._last_good = seq, reserved, payload

    def _apply(self, batch: Batch) -> None:
        jobs = self._db.table(JOBS)
        gone = [job_id for job_id in batch.jobs if job_id in self._ids.hot]
        if gone:
            jobs.remove(doc_ids=gone)
        fresh = [Document(doc, doc_id=job_id) for job_id, doc in batch.jobs.items() if doc is not None]
        if fresh:
            jobs.insert_multiple(fresh)
        for (name, key), record in batch.records.items():
            table = self._db.table(name)
            if record is None:
                table.remove(Query().key == key)
            else:
                table.upsert({"key": key, "record": record}, Query().key == key)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)

    def __enter__(self) -> TinyDBStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def take_leader_lock(data_dir: Path) -> int:
    """Hold the data folder for this process; refuse if another leader has it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StoreLocked(f"another labq process (pid {holder}) is using {data_dir}",
                          "Only one leader may write a data folder. Stop the other one first.") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd
