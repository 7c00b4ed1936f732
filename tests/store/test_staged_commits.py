"""Staged commits (``TinyDBStore.stage``): written at once, so that the next commit is checked against them,
and synced together afterwards; a sync that fails loses everything written since the last good one, and since
the caller had taken it in, the store refuses changes until a restart, which reads what is on disk.

Real files; the disk counts its fsyncs and fails them with EIO when told to."""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from labq.store import CommitFailed, DeleteJob, InvalidChange, PutJob, TinyDBStore
from labq.store.files import Disk
from labq.store.journal import TEMP_SUFFIX, journal_files
from tests.store.conftest import job

ENDED = 1_700_000_000.0
WAIT_S = 10.0


class CountingDisk(Disk):
    def __init__(self) -> None:
        self.syncs = 0
        self.failing = False

    def fsync(self, fd: int) -> None:
        self.syncs += 1
        if self.failing:
            raise OSError(errno.EIO, "Input/output error")
        super().fsync(fd)


@pytest.fixture
def data(tmp_path) -> Path:
    folder = tmp_path / "data"
    with TinyDBStore(folder) as store:
        store.commit([PutJob(job(1)), PutJob(job(2)), PutJob(job(3))])
    return folder


def test_a_staged_commit_is_checked_by_the_next_and_their_syncs_are_one(data):
    disk = CountingDisk()
    with TinyDBStore(data, disk=disk) as store:
        store.commit([PutJob(job(2, "running"))])  # the journal's first sync after opening syncs its folder too
        before = disk.syncs
        started = store.stage([PutJob(job(4)), PutJob(job(1, "running"))])
        ended = store.stage([PutJob(job(1, "succeeded", ended_at=ENDED))])  # job 1 is hot: its end is checked on it
        assert disk.syncs == before, "a stage waited for the disk"
        assert [doc["id"] for doc in store.history()] == [1]  # written: reads see it
        assert store.newest() is not None
        assert ended.wait() == 4 and started.wait() == 3
        assert disk.syncs == before + 1, "two commits written one after the other took more than one fsync"
        assert store.newest() is None
    with TinyDBStore(data) as again:
        assert sorted(again.load().jobs) == [2, 3, 4]
        assert [doc["id"] for doc in again.history()] == [1]


def test_a_lost_sync_undoes_all_written_since_the_last_good_one_and_stops_changes_until_a_restart(data):
    disk = CountingDisk()
    with TinyDBStore(data, disk=disk) as store:
        disk.failing = True
        new = store.stage([PutJob(job(4))])
        ended = store.stage([PutJob(job(2, "failed", ended_at=ENDED))])
        assert store.newest() is not None
        for staged in (ended, new):
            with pytest.raises(CommitFailed, match="not saved: Input/output error"):
                staged.wait()
        lost = store.newest()  # for good: whatever the caller makes now may come of what it took in
        assert lost is not None and lost.taken_in
        with pytest.raises(CommitFailed, match="not saved"):
            lost.wait()
        disk.failing = False
        with pytest.raises(CommitFailed, match="refuses changes until the leader restarts: a change the leader had "
                                               "taken in was lost on its way to disk"):
            store.commit([PutJob(job(5))])
        assert sorted(store.load().jobs) == [1, 2, 3] and store.history() == []  # reads go on, as on disk
    with TinyDBStore(data) as again:
        assert sorted(again.load().jobs) == [1, 2, 3] and again.history() == []
        assert again.commit([PutJob(job(4)), PutJob(job(2, "failed", ended_at=ENDED))]) == 2  # its number, again
        assert [doc["id"] for doc in again.history()] == [2]


def test_a_compaction_syncs_what_was_written_before_it_starts_a_new_journal(data):
    with TinyDBStore(data) as store:
        staged = store.stage([PutJob(job(4))])
        assert store.compact()
        assert staged.wait() == 2
        assert store.newest() is None
    with TinyDBStore(data) as again:
        assert sorted(again.load().jobs) == [1, 2, 3, 4]


class HeldDisk(Disk):
    """fsync (of a file or a folder) waits while the test holds the disk."""

    def __init__(self) -> None:
        self.holding = False
        self.entered = threading.Event()
        self.go = threading.Event()

    def _wait(self) -> None:
        if self.holding:
            self.entered.set()
            assert self.go.wait(30), "the test never let the disk go"

    def fsync(self, fd: int) -> None:
        self._wait()
        super().fsync(fd)

    def fsync_folder(self, folder) -> None:
        self._wait()
        super().fsync_folder(folder)


def written_at_once(store: TinyDBStore, doc: dict):
    """``store.stage`` of ``doc``, which must come back while the disk is held."""
    out: dict = {}
    thread = threading.Thread(target=lambda: out.setdefault("staged", store.stage([PutJob(doc)])), daemon=True)
    thread.start()
    thread.join(WAIT_S)
    assert not thread.is_alive(), "a commit waited for the disk to be written"
    return out["staged"]


@pytest.mark.parametrize("written_before", [True, False], ids=["its sync", "its snapshot"])
def test_commits_are_written_while_a_compaction_waits_for_the_disk(data, written_before):
    disk = HeldDisk()
    with TinyDBStore(data, disk=disk) as store:
        store.commit([PutJob(job(4))])  # something to compact
        first = store.stage([PutJob(job(5))]) if written_before else None
        disk.holding = True
        compaction = threading.Thread(target=store.compact, daemon=True)
        compaction.start()
        assert disk.entered.wait(WAIT_S), "the compaction never reached the disk"
        # what was written is synced before the swap, and the swap makes no fsync: neither holds the writer's turn
        later = written_at_once(store, job(6))
        disk.holding = False
        disk.go.set()
        compaction.join(WAIT_S)
        assert not compaction.is_alive()
        assert later.wait() and (first is None or first.wait())
    with TinyDBStore(data) as again:
        assert sorted(again.load().jobs) == sorted([1, 2, 3, 4, 6] + ([5] if written_before else []))


class NextSyncHeld(Disk):
    """Once ``holding``, the next fsync waits until the test lets it go; once ``failing``, the later ones fail
    with EIO."""

    def __init__(self) -> None:
        self.holding = False
        self.failing = False
        self.entered = threading.Event()
        self.go = threading.Event()

    def fails(self, fd: int) -> bool:
        return self.failing

    def fsync(self, fd: int) -> None:
        if self.holding:
            self.holding = False
            self.entered.set()
            assert self.go.wait(30), "the test never let the disk go"
        elif self.fails(fd):
            raise OSError(errno.EIO, "Input/output error")
        super().fsync(fd)


def test_a_commit_written_during_a_sync_is_durable_only_by_a_sync_of_its_own(data):
    disk = NextSyncHeld()
    with TinyDBStore(data, disk=disk) as store:
        store.commit([PutJob(job(3, "running"))])  # the journal's first sync after opening syncs its folder too
        disk.holding = True
        first = store.stage([PutJob(job(4))])
        syncing = threading.Thread(target=first.wait, daemon=True)
        syncing.start()
        assert disk.entered.wait(WAIT_S)
        second = written_at_once(store, job(5))  # its record is in the file the held fsync will sync
        disk.failing = True
        disk.go.set()
        syncing.join(WAIT_S)
        assert first.wait() == 3
        with pytest.raises(CommitFailed):  # its own sync failed: it is cut off, though the first sync took it
            second.wait()
    with TinyDBStore(data) as again:
        assert sorted(again.load().jobs) == [1, 2, 3, 4]


def test_an_id_spent_before_a_lost_commit_stays_spent(data):
    disk = CountingDisk()
    with TinyDBStore(data, disk=disk) as store:
        store.commit([PutJob(job(4))])
        store.commit([PutJob(job(4, "succeeded", ended_at=ENDED))])  # 4 is spent
        disk.failing = True
        with pytest.raises(CommitFailed):
            store.commit([DeleteJob(4)])
        disk.failing = False
        with pytest.raises(InvalidChange):
            store.commit([PutJob(job(4))])  # an id is never handed out twice
        assert store.commit([DeleteJob(4)])


class FolderSyncs(Disk):
    def __init__(self) -> None:
        self.folders: list[Path] = []

    def fsync_folder(self, folder) -> None:
        self.folders.append(Path(folder))
        super().fsync_folder(folder)


def test_the_first_sync_of_a_journal_found_at_opening_makes_its_name_durable(data):
    """A compaction makes a journal without syncing the folder, which the journal's first sync does; a leader
    stopped before that sync leaves a journal whose name is not durable, and the next one to open it syncs it."""
    disk = FolderSyncs()
    with TinyDBStore(data, disk=disk) as store:
        opened = len(disk.folders)
        store.commit([PutJob(job(4))])
        assert disk.folders[opened:] == [data]
        store.commit([PutJob(job(5))])
        assert disk.folders[opened + 1:] == []  # once


class FailsThenHolds(Disk):
    """Once ``armed``: the next fsync fails with EIO, and the one after it (the cut's) waits until let go."""

    def __init__(self) -> None:
        self.armed = 0
        self.entered = threading.Event()
        self.go = threading.Event()

    def fsync(self, fd: int) -> None:
        if self.armed == 1:
            self.armed = 2
            raise OSError(errno.EIO, "Input/output error")
        if self.armed == 2:
            self.armed = 0
            self.entered.set()
            assert self.go.wait(30), "the test never let the disk go"
        super().fsync(fd)


def test_a_lost_commit_a_caller_took_in_is_the_newest_from_the_moment_its_sync_fails(data):
    disk = FailsThenHolds()
    with TinyDBStore(data, disk=disk) as store:
        store.commit([PutJob(job(4))])
        disk.armed = 1
        staged = store.stage([PutJob(job(5))])
        waiting = threading.Thread(target=lambda: pytest.raises(CommitFailed, staged.wait), daemon=True)
        waiting.start()
        assert disk.entered.wait(WAIT_S), "the failed sync's cut never reached the disk"
        lost = store.newest()  # while the cut is on its way: whatever is read now may come of the lost commit
        assert lost is not None and lost.taken_in
        disk.go.set()
        waiting.join(WAIT_S)
        with pytest.raises(CommitFailed):
            lost.wait()


class PausedAfterWrite(TinyDBStore):
    """A store that, once ``pausing``, stops its next writer right after its write (where it checks whether a
    compaction is due), until let go."""

    pausing = False

    def _compact_at(self) -> int:
        if self.pausing:
            self.pausing = False
            self.paused.set()
            assert self.go.wait(30), "the test never let the writer go"
        return super()._compact_at()


def test_a_commit_synced_by_another_before_its_writer_looks_leaves_no_sync_turn_taken(data):
    store = PausedAfterWrite(data)
    store.paused, store.go = threading.Event(), threading.Event()
    after = None
    try:
        store.pausing = True
        writer = threading.Thread(target=lambda: store.commit([PutJob(job(4))]), daemon=True)
        writer.start()
        assert store.paused.wait(WAIT_S)
        store.newest().wait()  # another thread syncs the writer's commit before the writer looks
        store.go.set()
        writer.join(WAIT_S)
        assert not writer.is_alive()
        after = threading.Thread(target=lambda: store.commit([PutJob(job(5))]), daemon=True)
        after.start()
        after.join(WAIT_S)
        assert not after.is_alive(), "the next commit waited for a sync that nobody runs"
    finally:
        store.go.set()
        if after is None or not after.is_alive():  # else closing would wait for that sync too
            store.close()


def test_a_commit_lost_after_a_compaction_swapped_journals_leaves_the_journal_it_was_in(data):
    """A compaction starts the next journal at once and syncs what the old one has afterwards; if that sync fails,
    the new journal, which holds nothing that reached the disk, goes, and the old one is the current one again."""
    disk = CountingDisk()
    with TinyDBStore(data, disk=disk) as store:
        store.commit([PutJob(job(4))])
        before = [path.name for _, path in journal_files(data)]
        staged = store.stage([PutJob(job(5))])
        disk.failing = True
        assert store.compact() is False
        with pytest.raises(CommitFailed, match="not saved"):
            staged.wait()
        assert [path.name for _, path in journal_files(data)] == before
    with TinyDBStore(data) as again:
        assert sorted(again.load().jobs) == [1, 2, 3, 4]
        assert again.commit([PutJob(job(5))]) == 3
        again.compact()
    with TinyDBStore(data) as reopened:
        assert sorted(reopened.load().jobs) == [1, 2, 3, 4, 5]


def test_commits_from_many_threads_through_many_compactions_are_all_there_after_a_restart(tmp_path):
    folder = tmp_path / "data"
    acknowledged: list[int] = []
    with TinyDBStore(folder, compact_bytes=2000) as store:
        def client(first: int) -> None:
            for job_id in range(first, first + 100):
                if job_id % 2:
                    store.stage([PutJob(job(job_id))]).wait()
                else:
                    store.commit([PutJob(job(job_id))])
                acknowledged.append(job_id)

        threads = [threading.Thread(target=client, args=(1 + 100 * n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert store.compactions >= 3, f"{store.compactions} compactions: too few to have raced the commits"
    with TinyDBStore(folder) as again:
        assert sorted(again.load().jobs) == sorted(acknowledged) == list(range(1, 801))


class UnnamedJournalFails(NextSyncHeld):
    """``NextSyncHeld``, whose ``failing`` fails only an fsync of a journal not yet named."""

    def fails(self, fd: int) -> bool:
        return self.failing and os.readlink(f"/proc/self/fd/{fd}").endswith(TEMP_SUFFIX)


def swapping(store: TinyDBStore, disk, before: list[str]) -> threading.Thread:
    """A compaction in a thread, once it has started the next journal (a file beside ``before``)."""
    compaction = threading.Thread(target=store.compact, daemon=True)
    compaction.start()
    deadline = time.monotonic() + WAIT_S
    while sorted(p.name for p in store.data_dir.iterdir()) == before:
        assert time.monotonic() < deadline, "the compaction never started the next journal"
        time.sleep(0.005)
    return compaction


def test_a_sync_that_fails_in_the_next_journal_keeps_what_the_old_one_had_on_disk(data):
    disk = UnnamedJournalFails()
    with TinyDBStore(data, disk=disk) as store:
        store.commit([PutJob(job(4))])
        disk.holding = True
        first = store.stage([PutJob(job(5))])
        syncing = threading.Thread(target=first.wait, daemon=True)
        syncing.start()
        assert disk.entered.wait(WAIT_S)
        old = store.stage([PutJob(job(6))])  # in the old journal, after the sync that is held
        compaction = swapping(store, disk, sorted(p.name for p in data.iterdir()))
        new = store.stage([PutJob(job(7))])  # in the next journal
        disk.failing = True
        disk.go.set()  # the next sync takes the old journal's part, then fails in the new one
        syncing.join(WAIT_S)
        assert old.wait() == 4
        with pytest.raises(CommitFailed):
            new.wait()
        compaction.join(WAIT_S)
        assert not compaction.is_alive()
    with TinyDBStore(data) as again:
        assert sorted(again.load().jobs) == [1, 2, 3, 4, 5, 6]
        assert again.commit([PutJob(job(7))]) == 5  # the lost commit's number, once
    with TinyDBStore(data) as reopened:
        assert sorted(reopened.load().jobs) == [1, 2, 3, 4, 5, 6, 7]


def test_a_power_loss_while_a_compaction_waits_for_the_old_journal_leaves_a_lab_that_opens(data, tmp_path):
    disk = HeldDisk()
    with TinyDBStore(data, disk=disk) as store:
        store.commit([PutJob(job(4))])
        before = sorted(p.name for p in data.iterdir())
        old = store.stage([PutJob(job(5))])  # in the old journal, not synced
        disk.holding = True
        compaction = swapping(store, disk, before)
        assert disk.entered.wait(WAIT_S), "the compaction never synced the old journal"
        written_at_once(store, job(6))  # in the next journal, which is written to while the old one is synced
        # the power goes: the old journal's unsynced record is torn, while the next one's reached the disk
        crashed = tmp_path / "crashed"
        shutil.copytree(data, crashed, ignore=shutil.ignore_patterns("leader.lock"))
        journals = journal_files(crashed)
        torn = journals[-1][1] if journals[-1][1].stat().st_size else journals[-2][1]
        raw = torn.read_bytes()
        torn.write_bytes(raw[:len(raw) - 20])
        disk.holding = False
        disk.go.set()
        compaction.join(WAIT_S)
        assert old.wait()
    with TinyDBStore(crashed) as again:  # only what was acknowledged then: jobs 1 to 4
        assert sorted(again.load().jobs) == [1, 2, 3, 4]


class NamedSyncs(Disk):
    """Fails every fsync with EIO while ``failing``; keeps the path of each fsync made."""

    def __init__(self) -> None:
        self.failing = False
        self.paths: list[str] = []

    def fsync(self, fd: int) -> None:
        if self.failing:
            raise OSError(errno.EIO, "Input/output error")
        self.paths.append(os.readlink(f"/proc/self/fd/{fd}"))
        super().fsync(fd)


def test_a_cut_the_disk_did_not_take_is_synced_before_a_compaction_starts_the_next_journal(data):
    disk = NamedSyncs()
    with TinyDBStore(data, disk=disk) as store:
        store.commit([PutJob(job(4))])
        journal = str(journal_files(data)[-1][1])
        disk.failing = True  # the sync fails, and so does the sync of the cut after it
        with pytest.raises(CommitFailed):
            store.commit([PutJob(job(5))])
        disk.failing = False
        disk.paths.clear()
        assert store.compact()
        assert disk.paths[0] == journal, disk.paths
    with TinyDBStore(data) as again:
        assert sorted(again.load().jobs) == [1, 2, 3, 4]
