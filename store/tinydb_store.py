"""The leader's durable store: a journal of commits in front of a TinyDB snapshot, plus a job archive.

The data folder it keeps is drawn in ``labq.store.data_folder``.

A commit returns only once it is on disk: its archive lines are appended, then one
journal record that carries them too, and that one record is fsynced (the archive files
are fsynced by the next compaction, before the journals that carry their lines may go;
opening writes those lines again from the journal: ``labq.store.archive``). Commits
arriving while one is being written wait and are then written together (group commit), and
the records written while one fsync runs share the next. ``stage`` returns once a commit is
written (the next is checked against it) and leaves its fsync to a later ``wait``: the
leader takes a change in meanwhile. A failed fsync cuts off everything written since the
last good one; if a caller had taken any of it in, the store refuses changes until a restart. A commit
costs what it changed, not the size of the lab: only its documents are encoded.

When the journal has grown to the snapshot's size, a background thread compacts: it
starts a new journal (commits wait only for that swap, which makes no fsync; the new one
keeps a temporary name until its first sync, which comes after the old one's last records
are synced, so no journal ever follows one a power loss may have cut short), writes a new
snapshot the safe way (``replace_atomically``: the old one becomes ``labq.json.prev``) from documents
encoded once already, and removes the journals neither snapshot needs. Opening loads the
snapshot and replays the journals after it (``labq.store.replay``); only a torn last record (a crash mid-append,
never acknowledged) is dropped. Any other damage stops the store, with the way to
``labq store check`` and ``recover``. Closing compacts, so a clean restart reads one file.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from labq.store.archive import Archive
from labq.store.check import recover_hint
from labq.store.contract import (
    META, Batch, Change, Ids, CommitFailed, CorruptDatabase, Ended, HistoryPart, StoredState, StoreError, whole,
)
from labq.store.data_folder import ARCHIVE_DIR, DB_NAME, PREVIOUS_NAME, take_leader_lock
from labq.store.files import Disk, remove_stale_temp_files, replace_atomically, replace_atomically_with
from labq.store.hot import SCHEMA, HotState
from labq.store.journal import TEMP_SUFFIX, JournalStuck, JournalWriter, dumps, journal_files, journal_name
from labq.store.replay import Journaled, replay
from labq.store.snapshot import decode, encode

log = logging.getLogger("labq.store")
#: the least the journal grows to before a compaction (it also waits for a snapshot's size)
COMPACT_MIN_BYTES = 8 * 1024 * 1024
#: Each commit records that ids up to this many past its next id may have been handed out,
#: so that a recovery to the previous copy never hands out an id a lost commit used.
ID_RESERVE = 1000


@dataclass(eq=False)
class _Written:
    """A group commit written to the journal, not yet synced: what the sync takes into the hot state, or what a
    failed sync undoes."""

    seq: int
    journal: JournalWriter  #: the journal its record is in (a compaction may have started the next one since)
    end: int  #: that journal's size once its record was written: a sync of it makes the journal durable to there
    record: dict
    texts: dict[int, bytes]
    batch: Batch  #: settled into the ids and record keys once written; unsettled if lost
    archive_sizes: dict[Path, int]  #: the archive's files before its lines
    reserved_before: int
    #: a caller took one of its commits in before it was on disk (``stage``), or it was lost with one that was
    #: (whatever was built on the lost state may be built on it)
    staged: bool
    done: bool = False  #: synced, or lost (``error``)
    error: StoreError | None = None


@dataclass(eq=False)
class _Ticket:
    changes: list[Change]
    staged: bool
    written: _Written | None = None
    error: StoreError | None = None
    done: bool = False  #: written, or refused (``error``)


def _ends(batches: list[_Written]) -> list[tuple[JournalWriter, int, int]]:
    """Each journal ``batches`` are in, in order, with the end of the last of them there, and how many of
    ``batches`` are in it or before it."""
    ends: dict[int, tuple[JournalWriter, int, int]] = {}
    for count, w in enumerate(batches, 1):
        ends[id(w.journal)] = (w.journal, w.end, count)
    return list(ends.values())


class OnTheWay:
    """Commits written and on their way to disk (``TinyDBStore.stage``)."""

    def __init__(self, store: TinyDBStore, written: _Written) -> None:
        self._store, self._written = store, written

    @property
    def taken_in(self) -> bool:
        return self._written.staged

    def wait(self) -> int:
        """The commit number once on disk; CommitFailed if its sync failed (nothing of it was acknowledged)."""
        self._store._sync(self._written)
        if self._written.error is not None:
            raise self._written.error
        return self._written.seq


class TinyDBStore:
    """The store the leader uses. Thread-safe; one per data folder and process.

    ``compact_bytes``: the journal's size that starts a compaction (default: the snapshot's size, at
    least ``COMPACT_MIN_BYTES``), so loading never reads much more than one snapshot's worth."""

    def __init__(self, data_dir: str | os.PathLike, *, disk: Disk | None = None,
                 clock: Callable[[], float] = time.time, compact_bytes: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / DB_NAME
        self.previous = self.data_dir / PREVIOUS_NAME
        self.disk = disk or Disk()
        self.clock = clock
        self.compact_bytes = compact_bytes
        self.archive = Archive(self.data_dir / ARCHIVE_DIR, self.disk)
        self._cond = threading.Condition()
        self._queue: list[_Ticket] = []
        self._writing = False  #: a batch is being written (the writer's turn)
        self._syncing = False  #: the journal is being synced (the syncer's turn)
        self._unsynced: list[_Written] = []  #: batches written, in order, and not yet synced
        self._lost: _Written | None = None  #: the last of the batches a failed sync lost after a caller took them in
        self._swap_wanted = False  #: a compaction waits to swap the journal: commits wait for it
        self._broken: str | None = None
        self._hot_lock = threading.Lock()  #: the hot state changes or is captured; never held across a write
        self._compacting = threading.Lock()
        self._compact_wanted = threading.Event()
        self._closing = threading.Event()
        self.compactions = 0
        self._lock_fd = take_leader_lock(self.data_dir)
        try:
            with collector_paused(freeze=True):  # loading makes many objects and frees none: collections only cost time
                self._open()
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._compactor = threading.Thread(target=self._compact_loop, name="labq-store-compactor", daemon=True)
        self._compactor.start()

    def _open(self) -> None:
        remove_stale_temp_files(self.data_dir, [DB_NAME, PREVIOUS_NAME])
        for unsynced in self.data_dir.glob("journal-*.log" + TEMP_SUFFIX):  # never synced: nothing acknowledged
            unsynced.unlink()
        journals = journal_files(self.data_dir)
        if self.path.exists():
            raw = self.path.read_bytes()
            try:
                data = decode(raw, self.path)
            except CorruptDatabase as err:
                raise CorruptDatabase(err.args[0], recover_hint(self.data_dir)) from None
        else:
            leftovers = [p.name for p in (self.previous,) if p.exists()] + [p.name for _, p in journals] + [
                f"{ARCHIVE_DIR}/{p.name}" for p in self.archive.files()]
            if leftovers:
                raise CorruptDatabase(
                    f"{self.path} is missing, but {', '.join(leftovers)} {'is' if len(leftovers) == 1 else 'are'} "
                    f"there: this is not a new lab",
                    recover_hint(self.data_dir))
            data = {META: {"1": {"schema": SCHEMA, "seq": 0, "next_job_id": 1,
                                 "ids_reserved_until": 1 + ID_RESERVE}}}
            raw = encode(data)
            replace_atomically(self.path, raw, self.disk)
        self._hot = HotState(data)
        self._snapshot_seq, self._snapshot_bytes = self._hot.seq, len(raw)
        journaled = Journaled()
        try:
            good_bytes = replay(self._hot, journals, self.path, journaled)
        except CorruptDatabase as err:
            raise CorruptDatabase(err.args[0], recover_hint(self.data_dir)) from None
        if journals:
            self._journal = JournalWriter(journals[-1][1], self.disk, good_bytes=good_bytes)
        else:
            self._journal = JournalWriter(self.data_dir / journal_name(self._hot.seq + 1), self.disk)
        self._committed = self._written_seq = self._hot.seq  #: the last commit on disk; the last written
        self._reserved = self._hot.reserved
        try:  # the lines a crash lost of them come back, and nothing more
            self.archive.rewrite_after(journaled.after, journaled.lines)
        except BaseException:
            self._journal.close()
            raise
        self._ids = Ids(hot=set(self._hot.jobs), next_job_id=self._hot.next_job_id, floor=self._hot.next_job_id)
        self._record_keys = {name: set(table) for name, table in self._hot.tables.items()}

    # -- reading -------------------------------------------------------------------------

    def load(self) -> StoredState:
        with self._hot_lock, collector_paused(freeze=True):
            hot = self._hot
            jobs = {job_id: dict(whole(doc)) for job_id, doc in hot.jobs.items()}
            records = {name: {key: record for key, (_, record) in table.items()} for name, table in hot.tables.items()}
            return StoredState(jobs, records, hot.next_job_id, hot.seq)

    def history(self, since: float | None = None, until: float | None = None) -> list[dict]:
        """Finished jobs from the archive (newest version of each), by when they ended."""
        return list(self.archive.read(self._written_seq, since, until))

    def history_parts(self) -> list[HistoryPart]:
        return self.archive.parts(self._written_seq)

    def array_history(self, array_ids: Iterable[int]) -> list[dict]:
        return list(self.archive.read(self._written_seq, arrays=set(array_ids)))

    def ended(self, user: str | None = None) -> list[Ended]:
        return self.archive.ended(self._written_seq, user)

    def archived(self, job_ids: Iterable[int]) -> dict[int, dict]:
        ids = set(job_ids)
        return {doc["id"]: doc for doc in self.archive.read(self._written_seq, ids=ids)} if ids else {}

    def ends(self) -> Iterator[tuple[int, str | None]]:
        return self.archive.ends(self._written_seq)

    @property
    def journal_bytes(self) -> int:
        return self._journal.size

    # -- writing -------------------------------------------------------------------------

    def commit(self, changes: Iterable[Change]) -> int:
        """Apply ``changes`` atomically and durably; return the commit number.

        Raises InvalidChange (this commit broke a rule; others are unaffected)
        or CommitFailed (the disk refused; nothing was acknowledged).
        """
        return self._write_turn(list(changes), staged=False).wait()

    def stage(self, changes: Iterable[Change]) -> OnTheWay:
        """``commit``, returning once the changes are written (the next commit is checked against them), before
        their sync: ``wait()`` on the answer. Raises as ``commit`` does if the write fails. A caller takes the
        changes in meanwhile, so if their sync fails the store refuses changes until a restart (which reads what
        is on disk): that caller's memory is ahead of the disk."""
        return self._write_turn(list(changes), staged=True)

    def newest(self) -> OnTheWay | None:
        """The last commit written and not yet on disk; once a commit a caller had taken in was lost, that one, for
        good (whatever is read of the caller may come of it: nothing it makes may leave it until a restart)."""
        with self._cond:
            last = self._unsynced[-1] if self._unsynced else self._lost
            return OnTheWay(self, last) if last is not None else None

    def _write_turn(self, changes: list[Change], staged: bool) -> OnTheWay:
        """Queue ``changes`` and wait until they are written: the first waiting takes the writer's turn and writes
        all that queued meanwhile as one record (group commit). A commit that will wait for its sync at once
        (``commit``) also waits while a sync runs, so that those arriving meanwhile are written together, and its
        writer syncs at once what it wrote."""
        ticket = _Ticket(changes, staged)
        with self._cond:
            self._queue.append(ticket)
            while self._must_wait(ticket):
                self._cond.wait()
            batch = None
            if not ticket.done:
                self._writing = True
                batch, self._queue = self._queue, []
        flush = None
        if batch is not None:
            try:
                self._write(batch)
            finally:
                with self._cond:
                    self._writing = False
                    for t in batch:
                        t.done = True
                    # not if another's sync took it meanwhile: a turn claimed for nothing would never end
                    if not staged and ticket.written is not None and not ticket.written.done and not self._syncing:
                        self._syncing, flush = True, list(self._unsynced)
                    self._cond.notify_all()
        if ticket.error is not None:
            raise ticket.error
        assert ticket.written is not None
        if flush:
            self._flush(flush)
        return OnTheWay(self, ticket.written)

    def _must_wait(self, ticket: _Ticket) -> bool:
        """Whether ``ticket`` waits (``_cond`` held): for its turn to write, or, written by another and to be
        synced at once, for the sync that runs (which may take it)."""
        if ticket.done:
            return (not ticket.staged and ticket.error is None and ticket.written is not None
                    and not ticket.written.done and self._syncing)
        return self._writing or self._swap_wanted or (self._syncing and not ticket.staged)

    def _write(self, tickets: list[_Ticket]) -> None:
        """One group commit's write: the batch's archive lines, then its journal record, which carries them too;
        its sync, the commit's one fsync, comes after (``_sync``), while the next batch may be written."""
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
        seq = self._written_seq + 1
        reserved = max(self._reserved, batch.next_job_id + ID_RESERVE)  # a backup or recovery continues past it
        told = batch.told()  # an array's tasks: told as their differences, and encoded whole only by a compaction
        texts = {job_id: dumps(doc) for job_id, doc in batch.jobs.items() if doc is not None and job_id not in told}
        records = [[name, key, record] for (name, key), record in batch.records.items()]
        tasks = b',"tasks":%s' % dumps([[first, others] for first, others in batch.tasks]) if batch.tasks else b""
        lines = self.archive.lines(seq, batch.archive, self.clock()) if batch.archive else []
        archived = b'"archive":[%s],' % b",".join(b'["%s",%s]' % (name.encode(), line) for name, line in lines)
        payload = (b'{' + archived + b'"jobs":{'
                   + b",".join(b'"%d":%s' % (job_id, texts.get(job_id, b"null"))
                               for job_id in batch.jobs if job_id not in told)
                   + b'},"next_job_id":%d,"records":%s,"reserved":%d,"seq":%d%s}'
                   % (batch.next_job_id, dumps(records), reserved, seq, tasks))
        sizes: dict = {}
        try:
            if lines:
                sizes = self.archive.write(lines)  # durable by the journal's record, which carries them too
            self._journal.write(payload)
        except OSError as err:
            if isinstance(err, JournalStuck):
                self._broken = f"the journal could not be cut back after a failed write ({err.strerror})"
            try:
                self.archive.roll_back(sizes)
            except OSError as again:
                self._broken = f"the archive could not be rolled back ({again.strerror})"
            failure = self._not_saved(err.__cause__ if isinstance(err, JournalStuck) else err)
            for t in accepted:
                t.error = failure
            return
        record = {"jobs": {str(job_id): doc for job_id, doc in batch.jobs.items()}, "records": records,
                  "next_job_id": batch.next_job_id, "reserved": reserved, "seq": seq}
        written = _Written(seq, self._journal, self._journal.size, record, texts, batch, sizes, self._reserved,
                           any(t.staged for t in accepted))
        batch.settle()
        self._reserved = reserved
        with self._cond:
            self._unsynced.append(written)
            self._written_seq = seq
        for t in accepted:
            t.written = written
        if self._journal.size >= self._compact_at():
            self._compact_wanted.set()

    def _not_saved(self, cause: BaseException | None) -> CommitFailed:
        return CommitFailed(
            f"the change was not saved: {getattr(cause, 'strerror', None) or cause} "
            f"({getattr(cause, 'filename', None) or self._journal.path})",
            "Nothing was acknowledged and the data on disk is as it was. "
            + ("Free some space in " + str(self.data_dir) if getattr(cause, "errno", None) == errno.ENOSPC
               else "Check the disk (dmesg) before retrying."))

    def _sync(self, written: _Written) -> None:
        """Return once ``written`` is on disk or lost: whoever comes first syncs every commit written by then, the
        others wait for that sync (group commit: one fsync for all of them)."""
        with self._cond:
            while not written.done and self._syncing:
                self._cond.wait()
            if written.done:
                return
            self._syncing = True
            batches = list(self._unsynced)
        self._flush(batches)

    def _flush(self, batches: list[_Written]) -> None:
        """Sync the journal (the caller has set ``_syncing``): ``batches``, every commit written before, are then
        durable and the hot state takes them in."""
        synced = 0  #: how many of ``batches`` are on disk (a sync is made journal by journal, in order)
        try:
            for journal, end, count in _ends(batches):
                journal.sync(end)
                synced = count
        except OSError as err:
            try:
                if synced:
                    self._take_synced(batches[:synced])
            finally:
                self._lose_unsynced(err)
            return
        except BaseException:
            with self._cond:
                self._syncing = False
                self._cond.notify_all()
            raise
        try:
            self._take_synced(batches)
        finally:
            with self._cond:
                self._syncing = False
                self._cond.notify_all()

    def _take_synced(self, batches: list[_Written]) -> None:
        """``batches``, the first of ``_unsynced``, are on disk: the hot state takes them in (the syncer's turn
        is held)."""
        try:
            with self._hot_lock:
                for w in batches:
                    self._hot.take(w.record, w.texts)
        finally:
            with self._cond:
                self._committed = batches[-1].seq
                del self._unsynced[:len(batches)]
                for w in batches:
                    w.done = True
                self._cond.notify_all()

    def _lose_unsynced(self, err: OSError) -> None:
        """A sync failed: what was written since the last good one is cut off the journal and the archive and
        undone in the ids and record keys, and every commit of it fails. Taken with the writer's turn. If a caller
        had taken one of those commits in (``stage``), the store refuses changes until a restart."""
        with self._cond:
            while self._writing:
                self._cond.wait()
            self._writing = True
            lost, self._unsynced = self._unsynced, []
            failure = self._not_saved(err)
            taken_in = any(w.staged for w in lost)
            for w in lost:  # at once: none of them may read as on disk, nor be missed by ``newest`` meanwhile
                w.error, w.staged = failure, taken_in
            if taken_in:
                self._lost = lost[-1]  # what the caller took in is not on disk, and never will be: until a restart
        try:
            for journal, _, _ in _ends(lost):
                try:
                    journal.cut_back(err)
                except JournalStuck as stuck:
                    self._broken = f"the journal could not be cut back after a failed sync ({stuck.strerror})"
            if lost[0].journal is not self._journal:
                self._journal_back(lost[0].journal)
            for w in reversed(lost):
                try:
                    self.archive.roll_back(w.archive_sizes)
                except OSError as again:
                    self._broken = f"the archive could not be rolled back ({again.strerror})"
                w.batch.unsettle()
            self._written_seq, self._reserved = self._committed, lost[0].reserved_before
            if taken_in and not self._broken:
                self._broken = (f"a change the leader had taken in was lost on its way to disk "
                                f"({getattr(err, 'strerror', None) or err}); a restart reads what is on disk")
        finally:
            with self._cond:
                self._writing = False
                self._syncing = False
                for w in lost:
                    w.done = True
                self._cond.notify_all()

    def _journal_back(self, journal: JournalWriter) -> None:
        """Every record of the current journal was lost, and ``journal``, which a compaction swapped out before
        its last records were synced, was cut back: it is the current one again, and the other goes (the writer's
        turn is held)."""
        fresh, self._journal = self._journal, journal
        fresh.close()
        try:
            fresh.path.unlink()
            self.disk.fsync_folder(self.data_dir)
        except OSError as err:
            self._broken = f"a journal whose records were lost could not be removed ({err.strerror})"

    def _compact_at(self) -> int:
        if self.compact_bytes is not None:
            return self.compact_bytes
        return max(COMPACT_MIN_BYTES, self._snapshot_bytes)

    # -- compaction ------------------------------------------------------------------------

    def compact(self) -> bool:
        """Write a snapshot of the state now and start a new journal; commits wait only while the journal
        is swapped (no fsync: the new journal's folder is synced with its first record), never while the
        snapshot is encoded or written. Journals that neither the new snapshot
        nor the previous copy needs are removed. False when there was nothing to compact."""
        with self._compacting:
            with self._cond:
                self._swap_wanted = True  # no commit takes the writer's turn first: steady commits never starve it
                try:
                    while self._writing:
                        self._cond.wait()
                finally:
                    self._swap_wanted = False
                self._writing = True  # the writer waits while the journal is swapped
                on_the_way = self._unsynced[-1] if self._unsynced else None
            try:
                if self._broken or self._written_seq == self._snapshot_seq:
                    return False
                if self._journal.cut_unsynced:  # a failed sync's cut the disk never took: before any journal follows
                    self._journal.sync(self._journal.synced)
                fresh = JournalWriter(self.data_dir / journal_name(self._written_seq + 1), self.disk,
                                      unnamed=on_the_way is not None)
                self._journal, old = fresh, self._journal
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()
            if on_the_way is not None:  # the old journal's last records are synced there, with no turn held
                self._sync(on_the_way)
                if on_the_way.error is not None:  # lost: the old journal is the current one again
                    return False
            old.close()
            with self._hot_lock:  # everything the old journal has, and perhaps some of the new one's: replay skips it
                capture = self._hot.capture()
            try:  # the journals that carry the archive's lines may go once the snapshot is written
                self.archive.sync()
            except OSError as err:
                self._broken = (f"the archive's files could not be synced ({err.strerror}); a restart writes their "
                                f"lines again from the journal")
                raise
            size = replace_atomically_with(self.path, capture.write, self.disk, previous=self.previous)
            kept_from, self._snapshot_seq, self._snapshot_bytes = self._snapshot_seq, capture.seq, size
            journals = journal_files(self.data_dir)
            for (_, path), (following, _) in zip(journals, journals[1:]):
                if following - 1 <= kept_from:  # all of it is in the previous copy too
                    path.unlink()
            self.disk.fsync_folder(self.data_dir)
            self.compactions += 1
            return True

    def _compact_loop(self) -> None:
        """Compacts when a commit asks; a failure is logged and tried again later, never the end of the loop."""
        delay = 1.0
        while not self._closing.is_set():
            self._compact_wanted.wait()
            if self._closing.is_set():
                return
            self._compact_wanted.clear()
            try:
                self.compact()
                delay = 1.0
            except Exception:  # noqa: BLE001 - the journal keeps every commit meanwhile: try again later
                log.exception("compacting the store failed; the journal keeps every commit; trying again in %.0f s",
                              delay)
                self._closing.wait(delay)
                delay = min(delay * 2, 300.0)
                self._compact_wanted.set()

    def close(self) -> None:
        """Stop; a last compaction makes the next start read one snapshot (a failure only leaves the journal)."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._compact_wanted.set()
        self._compactor.join(timeout=60)
        try:
            self.compact()
        except Exception:  # noqa: BLE001 - the journal has every commit: the next start replays it
            log.exception("the last compaction failed; the next start replays the journal")
        self._journal.close()
        self.archive.close()
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)

    def __enter__(self) -> TinyDBStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def collector_paused(freeze: bool = False):
    """No garbage collection while many objects are made and none freed (the lab loaded, the archive read):
    collections in between would walk them again and again. With ``freeze``, what was made is kept out of later
    collections too (``gc.freeze``): the loaded lab lives as long as the leader."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if enabled:
            gc.enable()

