"""The archive of finished jobs is made durable by the journal: a group commit fsyncs once, its journal record,
which carries the commit's archive lines too; the archive's files are fsynced before a snapshot lets those
journals go. So a power loss, which drops whatever was written and not fsynced, loses no archived job that a
commit acknowledged: opening the store, a backup and a recovery all take the lost lines from the journal.

A power loss is played on real files: a writer process logs the size of each file at each of its fsyncs and is
killed; the test then cuts every archive file and journal back to its size at its last fsync (a file never
fsynced is removed), as the disk would hold them after the machine lost power."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from labq.store import CommitFailed, PutJob, TinyDBStore, plan_recovery, recover
from labq.store.archive import Archive
from labq.store.backup import backup
from labq.store.files import Disk
from labq.store.journal import dumps, frame, journal_files
from labq.store.tinydb_store import ARCHIVE_DIR, DB_NAME
from tests.store.conftest import job

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
SEPTEMBER, OCTOBER = 1_790_000_000.0, 1_791_500_000.0  # jobs end in two months: two archive files

WRITER = r"""
import json, os, sys
from labq.store import DeleteJob, PutJob, TinyDBStore
from labq.store.files import Disk

class LoggingDisk(Disk):
    def fsync(self, fd):
        super().fsync(fd)
        log.write(json.dumps({"path": os.readlink(f"/proc/self/fd/{fd}"), "size": os.fstat(fd).st_size}) + "\n")
        log.flush()

def job(job_id, state="queued", **extra):
    return {"id": job_id, "state": state, "spec": {"user": "alice", "gpus": 1}, **extra}

log = open(sys.argv[2], "a")
store = TinyDBStore(sys.argv[1], disk=LoggingDisk(), compact_bytes=int(sys.argv[3]))
next_id, queued, archived = 1, [], []
for n in range(int(sys.argv[4])):
    new = list(range(next_id, next_id + 3))
    next_id += 3
    done, queued = queued[:2], queued[2:] + new
    changes = [PutJob(job(i)) for i in new]
    changes += [PutJob(job(i, "succeeded", ended_at=(1_790_000_000.0, 1_791_500_000.0)[i % 2])) for i in done]
    deleted = archived.pop(0) if n % 5 == 4 and archived else None
    if deleted is not None:
        changes.append(DeleteJob(deleted))  # a finished job deleted: a tombstone in the archive
    store.commit(changes)
    archived += done
    print(json.dumps({"ack": n, "finished": done, "deleted": deleted, "compactions": store.compactions}), flush=True)
print(json.dumps({"done": True}), flush=True)
sys.stdin.read()  # until the test kills it (or, gone itself, closes this)
"""


def written_then_killed(folder: Path, rounds: int, compact_bytes: int) -> tuple[dict, dict[str, int]]:
    """Run the writer for ``rounds`` commits and kill it. Returns what it acknowledged (the finished jobs, less the
    deleted ones; the queued ones; the compactions) and each file's size at its last fsync."""
    log = folder.parent / "fsyncs.jsonl"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(folder), str(log), str(compact_bytes), str(rounds)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    said = []
    try:
        for line in child.stdout:
            said.append(json.loads(line))
            if said[-1].get("done"):
                break
    finally:
        os.kill(child.pid, signal.SIGKILL)
        _, err = child.communicate(timeout=30)
    assert said and said[-1].get("done"), f"the writer stopped early:\n{err}"
    synced: dict[str, int] = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        synced[entry["path"]] = entry["size"]
    acks = said[:-1]
    finished = {i for a in acks for i in a["finished"]} - {a["deleted"] for a in acks}
    started = {i for i in range(1, 3 * len(acks) + 1)}
    queued = started - {i for a in acks for i in a["finished"]}
    return {"finished": finished, "queued": queued, "compactions": acks[-1]["compactions"]}, synced


def lose_power(folder: Path, synced: dict[str, int]) -> None:
    """Cut every archive file and journal back to its size at its last fsync; remove one never fsynced."""
    for path in [*(folder / ARCHIVE_DIR).glob("jobs-*.jsonl"), *(p for _, p in journal_files(folder))]:
        if str(path) in synced:
            os.truncate(path, synced[str(path)])
        else:
            path.unlink()


def written_then_power_lost(folder: Path, rounds: int, compact_bytes: int) -> dict:
    acked, synced = written_then_killed(folder, rounds, compact_bytes)
    lose_power(folder, synced)
    return acked


def history_ids(store: TinyDBStore) -> set[int]:
    return {doc["id"] for doc in store.history()}


def archive_in_order(folder: Path) -> bool:
    """Each archive file's lines are whole, and in commit order."""
    for path in (folder / ARCHIVE_DIR).glob("jobs-*.jsonl"):
        seqs = [json.loads(line)["seq"] for line in path.read_bytes().splitlines()]
        if seqs != sorted(seqs):
            return False
    return True


class CountingDisk(Disk):
    def __init__(self) -> None:
        self.fsyncs = 0

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        super().fsync(fd)


def test_a_group_commit_that_archives_jobs_fsyncs_once_its_journal_record(tmp_path):
    disk = CountingDisk()
    with TinyDBStore(tmp_path / "data", disk=disk) as store:
        store.commit([PutJob(job(i)) for i in range(1, 7)])
        for first in (1, 4):  # the first archived jobs make the archive's folder and files; the next ones do not
            before = disk.fsyncs
            store.commit([PutJob(job(first, "succeeded", ended_at=SEPTEMBER)),
                          PutJob(job(first + 1, "failed", ended_at=OCTOBER)), PutJob(job(first + 2, "running"))])
            assert disk.fsyncs - before == 1, f"a commit archiving two jobs fsynced {disk.fsyncs - before} times"
        assert history_ids(store) == {1, 2, 4, 5}
    with TinyDBStore(tmp_path / "data") as again:
        assert history_ids(again) == {1, 2, 4, 5}
        assert set(again.load().jobs) == {3, 6}


@pytest.mark.parametrize("compact_bytes", [10**9, 6_000], ids=["no-compaction", "compactions"])
def test_a_power_loss_loses_no_archived_job_a_commit_acknowledged(tmp_path, compact_bytes):
    folder = tmp_path / "data"
    acked = written_then_power_lost(folder, rounds=60, compact_bytes=compact_bytes)
    if compact_bytes < 10**9:
        assert acked["compactions"] >= 2, "the writer was to compact along the way"
    left = sum(1 for p in (folder / ARCHIVE_DIR).glob("*.jsonl") for _ in p.read_bytes().splitlines())
    with TinyDBStore(folder) as store:
        assert history_ids(store) == acked["finished"]
        assert set(store.load().jobs) == acked["queued"]
    assert archive_in_order(folder)
    written = sum(1 for p in (folder / ARCHIVE_DIR).glob("*.jsonl") for _ in p.read_bytes().splitlines())
    assert written > left, "the power loss took no archive line: the test shows nothing"
    with TinyDBStore(folder) as again:  # opening once more changes nothing
        assert history_ids(again) == acked["finished"]


def test_a_backup_after_a_power_loss_has_every_archived_job_from_the_journal(tmp_path):
    folder = tmp_path / "data"
    acked = written_then_power_lost(folder, rounds=40, compact_bytes=10**9)
    backup(folder, tmp_path / "backup")
    assert not (folder / ARCHIVE_DIR).exists() or not any((folder / ARCHIVE_DIR).glob("*.jsonl")), \
        "the power loss was to take every archive line (none was fsynced before a snapshot)"
    with TinyDBStore(tmp_path / "backup") as restored:
        assert history_ids(restored) == acked["finished"]
        assert set(restored.load().jobs) == acked["queued"]


def test_a_recovery_after_a_power_loss_writes_the_archived_jobs_of_the_sound_commits(tmp_path):
    folder = tmp_path / "data"
    acked = written_then_power_lost(folder, rounds=60, compact_bytes=6_000)
    raw = bytearray((folder / DB_NAME).read_bytes())
    raw[len(raw) // 2] ^= 0x20  # the snapshot is damaged: recovery goes back to the previous copy and the journals
    (folder / DB_NAME).write_bytes(bytes(raw))
    plan = plan_recovery(folder)
    assert plan.source.endswith(".prev") and plan.good_seq > plan.source_seq
    recover(plan)
    with TinyDBStore(folder) as store:
        assert history_ids(store) == acked["finished"]
        assert set(store.load().jobs) == acked["queued"]
    assert archive_in_order(folder)


def test_records_of_an_older_labq_keep_the_archive_lines_it_fsynced_in_the_files(tmp_path):
    """An older labq's journal records carry no archive lines: it fsynced them in the archive's files, which are
    then all there is of them, and opening (after an upgrade) keeps them."""
    folder = tmp_path / "data"
    acked, _ = written_then_killed(folder, rounds=30, compact_bytes=10**9)  # killed: no compaction, files whole
    for _, path in journal_files(folder):
        records = [json.loads(line.split(b" ", 2)[2]) for line in path.read_bytes().splitlines()]
        path.write_bytes(b"".join(frame(dumps({k: v for k, v in r.items() if k != "archive"})) for r in records))
    with TinyDBStore(folder) as store:
        assert history_ids(store) == acked["finished"]
        assert set(store.load().jobs) == acked["queued"]


class ArchiveDisk(Disk):
    """fsync as the OS does it, noting which files it synced; ``failing``: the archive's (or the journal's) fail."""

    def __init__(self) -> None:
        self.synced: list[str] = []
        self.failing: str | None = None  #: "archive" or "journal"
        self.meanwhile = None  #: called before a failure: what another thread does then

    def fsync(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if self.failing and (f"/{ARCHIVE_DIR}/" in path if self.failing == "archive" else "/journal-" in path):
            if self.meanwhile is not None:
                self.meanwhile()
            raise OSError(errno.EIO, "Input/output error")
        self.synced.append(path)
        super().fsync(fd)


def test_an_archive_that_cannot_be_synced_writes_no_snapshot_and_stops_changes_until_a_restart(tmp_path):
    folder, disk = tmp_path / "data", ArchiveDisk()
    store = TinyDBStore(folder, disk=disk)
    store.commit([PutJob(job(i)) for i in range(1, 5)])
    store.commit([PutJob(job(1, "succeeded", ended_at=SEPTEMBER))])
    snapshot = (folder / DB_NAME).read_bytes()
    disk.failing = "archive"
    with pytest.raises(OSError, match="Input/output error"):
        store.compact()
    assert (folder / DB_NAME).read_bytes() == snapshot  # the journal that carries the lines stays needed
    with pytest.raises(CommitFailed, match="could not be synced.*restart"):
        store.commit([PutJob(job(5))])
    assert history_ids(store) == {1}  # reads go on
    store.close()  # its last compaction is refused too: the journal keeps every commit
    assert (folder / DB_NAME).read_bytes() == snapshot
    for path in (folder / ARCHIVE_DIR).glob("*.jsonl"):  # a power loss now: the archive was never synced
        path.unlink()
    with TinyDBStore(folder) as again:
        assert history_ids(again) == {1}
        assert set(again.load().jobs) == {2, 3, 4}


def test_a_failed_commits_archive_lines_are_cut_and_the_next_compaction_syncs_the_cut(tmp_path):
    folder, disk = tmp_path / "data", ArchiveDisk()
    with TinyDBStore(folder, disk=disk) as store:
        store.commit([PutJob(job(i)) for i in range(1, 5)])
        store.commit([PutJob(job(1, "succeeded", ended_at=SEPTEMBER))])
        store.compact()
        month = folder / ARCHIVE_DIR / "jobs-2026-09.jsonl"
        size = month.stat().st_size
        disk.failing = "journal"
        # the commit's journal fsync fails, after a compaction's sync (in its own thread) took its archive line
        disk.meanwhile = store.archive.sync
        with pytest.raises(CommitFailed, match="Input/output error"):
            store.commit([PutJob(job(3, "succeeded", ended_at=SEPTEMBER))])
        assert month.stat().st_size == size  # its line was written, synced, then cut
        disk.failing = disk.meanwhile = None
        store.commit([PutJob(job(5))])  # a commit that archives nothing
        disk.synced.clear()
        store.compact()
        assert str(month) in disk.synced, "the cut was never synced: a power loss could bring the failed line back"
        assert history_ids(store) == {1}


def test_blocks_a_crash_left_unwritten_after_the_snapshot_are_cut_and_the_journals_lines_written(tmp_path):
    folder = tmp_path / "data"
    acked, synced = written_then_killed(folder, rounds=60, compact_bytes=6_000)
    lose_power(folder, synced)
    month = max((folder / ARCHIVE_DIR).glob("*.jsonl"), key=lambda p: p.stat().st_size)
    with open(month, "ab") as f:  # blocks the file system allotted and never wrote, then a later line that it did
        f.write(b"\0" * 300 + b"\n" + b'{"seq":%d,"deleted":2}\n' % 10**6)
    with TinyDBStore(folder) as store:
        assert history_ids(store) == acked["finished"]
        assert store.archive.problems == [], store.archive.problems
    assert archive_in_order(folder)


def test_ends_match_the_head_of_labqs_own_lines_decode_others_whole_and_skip_damaged_ones(tmp_path):
    folder = tmp_path / "archive"
    folder.mkdir()
    (folder / "jobs-2026-09.jsonl").write_bytes(b"".join(line + b"\n" for line in [
        b'{"seq":1,"job":{"id":1,"state":"succeeded","spec":{"state":"not this one"}}}',
        b'{"seq":2,"job":{"state":"failed","id":2}}',  # another shape: decoded whole
        b'{"seq":2,"job":{"id":3,"sta',  # damaged: skipped
        b'{"seq":2,"job":{"id":5,"state":"failed","spe',  # its head whole, the rest damaged: skipped as history does
        b'{"seq":2,"job":{"state":"failed","id":"6"}}',  # not an id
        b'{"seq":2,"deleted":-1}',  # not an id either
        b'{"seq":3,"deleted":1}',
        b'{"seq":9,"job":{"id":4,"state":"failed"}}',  # a commit after the last one: not acknowledged
    ]))
    assert list(Archive(folder, Disk()).ends(committed=3)) == [(1, "succeeded"), (2, "failed"), (1, None)]
