"""The TinyDB store on real files: damaged databases are refused untouched, recovery, locks, fsync errors."""

from __future__ import annotations

import errno
import re
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from labq.store import (
    CommitFailed, CorruptDatabase, PutJob, PutRecord, SchemaMismatch, StoreError, StoreLocked, TinyDBStore, plan_recovery,
    recover,
)
from labq.store.files import Disk
from labq.store.tinydb_store import DB_NAME, PREVIOUS_NAME, encode
from tests.store.conftest import job


@pytest.fixture
def data(tmp_path) -> Path:
    folder = tmp_path / "data"
    with TinyDBStore(folder) as store:
        store.commit([PutJob(job(1)), PutJob(job(2))])
        store.commit([PutJob(job(2, "running")), PutJob(job(3))])
    return folder


def _flip_a_bit(raw: bytes) -> bytes:
    i = raw.index(b'"alice"') + 2
    return raw[:i] + bytes([raw[i] ^ 0x01]) + raw[i + 1:]


def _future_schema(raw: bytes) -> bytes:
    data = json.loads(raw)
    data["_meta"]["1"]["schema"] = 7
    return encode(data)


@pytest.mark.parametrize(
    ("damage", "error", "words"),
    [
        (lambda raw: raw[: len(raw) // 2], CorruptDatabase, "not valid JSON"),
        (lambda raw: b"", CorruptDatabase, "is empty (0 bytes)"),
        (lambda raw: raw + b"garbage", CorruptDatabase, "not valid JSON"),
        (_flip_a_bit, CorruptDatabase, "fails its checksum"),
        (_future_schema, SchemaMismatch, "newer labq (schema 7); this labq reads schema 1"),
        (lambda raw: b'{"_default": {}}', CorruptDatabase, "not a labq database"),
        (lambda raw: b"\x00" * 10, CorruptDatabase, "is not valid JSON"),
        (lambda raw: b"\xff\xfe" + raw, CorruptDatabase, "is not text"),
    ],
)
def test_damaged_databases_are_refused_and_left_byte_identical(data, damage, error, words):
    path = data / DB_NAME
    path.write_bytes(damage(path.read_bytes()))
    before = {p.name: p.read_bytes() for p in data.iterdir() if p.is_file()}
    with pytest.raises(error, match=re.escape(words)) as refused:
        TinyDBStore(data)
    assert {p.name: p.read_bytes() for p in data.iterdir() if p.is_file()} == before
    if error is CorruptDatabase:
        assert "labq leader --recover --data-dir" in str(refused.value)


def test_a_damaged_snapshot_loses_nothing_the_previous_one_and_the_journal_hold_every_commit(data):
    with TinyDBStore(data) as store:
        store.commit([PutJob(job(1, "succeeded", ended_at=1_700_000_000.0)), PutJob(job(4))])
    (data / DB_NAME).write_bytes(b"\x00" * 10)
    plan = plan_recovery(data)
    text = plan.describe()
    assert "(labq.json.prev, commit 2 and the journal after it up to commit 3) holds commit 3" in text, text
    assert "3 unfinished job(s), next job id 5" in text and "Job ids continue from 5" in text
    assert "Also lost" not in text
    kept = recover(plan)
    assert kept is not None and kept.read_bytes() == b"\x00" * 10
    with TinyDBStore(data) as store:
        state = store.load()
        assert sorted(state.jobs) == [2, 3, 4] and state.seq == 3 and state.next_job_id == 5
        assert [d["id"] for d in store.history()] == [1]


def test_damage_inside_the_journal_loses_the_commits_from_there_and_says_so(tmp_path):
    folder = tmp_path / "data"
    died = subprocess.run([sys.executable, "-c", f"""
import os
from labq.store import PutJob, TinyDBStore
from tests.store.conftest import job
store = TinyDBStore({str(folder)!r})
store.commit([PutJob(job(1)), PutJob(job(2))])
store.commit([PutJob(job(1, "succeeded", ended_at=1_700_000_000.0)), PutJob(job(3))])
store.commit([PutJob(job(4))])
os._exit(0)  # as a leader killed -9: nothing compacted, every commit only in the journal
"""], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
    assert died.returncode == 0, died.stderr
    journal = next(folder.glob("journal-*.log"))
    raw = journal.read_bytes()
    second = raw.index(b"\n") + 1
    i = raw.index(b'"id":3', second)
    journal.write_bytes(raw[:i] + b'"id":7' + raw[i + 6:])  # one digit of commit 2 changed on disk
    with pytest.raises(CorruptDatabase, match="fails its checksum") as refused:
        TinyDBStore(folder)
    assert "labq leader --recover" in str(refused.value)
    plan = plan_recovery(folder)
    text = plan.describe()
    assert "holds commit 1: 2 unfinished job(s), next job id 3" in text, text
    assert "finished job(s) 1" in text  # commit 2's archive line goes with it
    assert plan.resume_job_id >= 1001  # commits 2 and 3 handed out ids 3 and 4: never again
    recover(plan)
    assert not list(folder.glob("journal-*.log")) and list(folder.glob("journals-before-recovery-*/journal-*.log"))
    with TinyDBStore(folder) as again:
        state = again.load()
        assert sorted(state.jobs) == [1, 2] and state.seq == 1 and again.history() == []
        assert state.next_job_id >= 1001
        assert again.commit([PutJob(job(state.next_job_id))]) == 2


def test_a_commit_handing_out_many_ids_keeps_them_through_a_recovery(tmp_path):
    folder = tmp_path / "data"
    with TinyDBStore(folder) as store:
        store.commit([PutJob(job(i)) for i in range(1, 1500)])  # past the first reservation
    (folder / DB_NAME).write_bytes(b"{")
    plan = plan_recovery(folder)
    assert plan.resume_job_id >= 1500 and plan.good_jobs == 1499
    recover(plan)
    with TinyDBStore(folder) as store:
        assert store.load().next_job_id >= 1500


def test_nothing_to_recover_and_nothing_to_recover_from(data, tmp_path):
    with pytest.raises(StoreError, match="nothing to recover"):
        plan_recovery(data)
    (data / DB_NAME).write_bytes(b"")
    (data / PREVIOUS_NAME).write_bytes(b"{")
    with pytest.raises(StoreError, match="previous copy is damaged too"):
        plan_recovery(data)


def test_a_missing_database_never_starts_empty_over_existing_data(data):
    (data / DB_NAME).unlink()
    with pytest.raises(CorruptDatabase, match="is missing, but labq.json.prev, journal-.* are there"):
        TinyDBStore(data)
    assert not (data / DB_NAME).exists()


def test_a_second_process_cannot_open_the_same_folder(data):
    with TinyDBStore(data):
        probe = subprocess.run(
            [sys.executable, "-c", f"from labq.store import TinyDBStore; TinyDBStore({str(data)!r})"],
            capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "StoreLocked" in probe.stderr and "is using" in probe.stderr
    with TinyDBStore(data), pytest.raises(StoreLocked):  # and a second handle in this process
        TinyDBStore(data)


class FailingDisk(Disk):
    """A disk whose fsync fails with EIO once armed: what a dying disk does."""

    def __init__(self) -> None:
        self.armed = False
        self.syncs = 0

    def fsync(self, fd: int) -> None:
        self.syncs += 1
        if self.armed:
            raise OSError(errno.EIO, "Input/output error")
        super().fsync(fd)


def test_a_failed_fsync_acknowledges_nothing_and_keeps_serving(data):
    disk = FailingDisk()
    store = TinyDBStore(data, disk=disk)
    before = (data / DB_NAME).read_bytes()
    disk.armed = True
    with pytest.raises(CommitFailed, match="not saved: Input/output error") as failed:
        store.commit([PutJob(job(4)), PutJob(job(1, "failed", ended_at=1_700_000_000.0))])
    assert "Nothing was acknowledged" in str(failed.value)
    assert (data / DB_NAME).read_bytes() == before
    assert sorted(store.load().jobs) == [1, 2, 3] and store.history() == []  # reads still served
    disk.armed = False
    assert store.commit([PutJob(job(4))]) == 3  # the next commit works and reuses no number
    store.close()
    with TinyDBStore(data) as again:
        assert sorted(again.load().jobs) == [1, 2, 3, 4] and again.history() == []


def test_concurrent_commits_share_writes(tmp_path):
    disk = FailingDisk()
    store = TinyDBStore(tmp_path / "data", disk=disk)
    start = disk.syncs
    barrier = threading.Barrier(32)

    def submit(i: int) -> None:
        barrier.wait(timeout=30)
        store.commit([PutJob(job(i))])

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(1, 33)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(store.load().jobs) == list(range(1, 33))
    writes = (disk.syncs - start) // 2  # each write: the file and its folder
    assert writes < 32, f"{writes} writes for 32 commits: no group commit"
    store.close()


def test_unacknowledged_archive_lines_and_torn_tails_are_cut_at_open(data):
    with TinyDBStore(data) as store:
        store.commit([PutJob(job(1, "succeeded", ended_at=1_700_000_000.0))])
    archive = next((data / "archive").iterdir())
    good = archive.read_bytes()
    # a later commit appended to the archive and died before replacing the database
    archive.write_bytes(good + b'{"seq":99,"job":{"id":2,"state":"failed"}}\n{"seq":100,"jo')
    with TinyDBStore(data) as store:
        assert [d["id"] for d in store.history()] == [1]
        assert sorted(store.load().jobs) == [2, 3]
    assert archive.read_bytes() == good


def test_the_snapshot_is_tinydbs_format_and_canonical(data):
    """TinyDB itself opens the snapshot (read-only) and finds the jobs and records; the store's snapshot, joined
    from documents it encoded once, is byte for byte the canonical encoding of the same database."""
    from tinydb import Query, TinyDB

    with TinyDBStore(data) as store:
        store.commit([PutJob(job(4, note="é ü 中")), PutRecord("reservations", "r1", {"gpus": 2})])
    raw = (data / DB_NAME).read_bytes()
    db = TinyDB(data / DB_NAME, access_mode="r")
    try:
        assert sorted(doc.doc_id for doc in db.table("jobs").all()) == [1, 2, 3, 4]
        assert db.table("jobs").get(doc_id=4)["note"] == "é ü 中"
        assert db.table("reservations").get(Query().key == "r1")["record"] == {"gpus": 2}
    finally:
        db.close()
    assert encode(json.loads(raw)) == raw


def test_a_snapshot_bigger_than_its_pieces_is_written_piece_by_piece_and_is_canonical(tmp_path):
    """A compaction writes the snapshot a piece of about ``CHUNK_BYTES`` at a time, the checksum written last into
    its place: a lab whose snapshot spans several pieces (and several tables) gets the same canonical bytes, with
    a checksum that its next start checks, as the whole database encoded at once."""
    from tinydb import TinyDB

    from labq.store.hot import CHUNK_BYTES
    from labq.store.replay import read_state

    folder = tmp_path / "data"
    jobs = [job(i, workdir=f"/home/alice/{i}/" + "w" * 600, note="é 中") for i in range(1, 3001)]
    with TinyDBStore(folder) as store:
        store.commit([PutJob(doc) for doc in jobs] + [PutRecord("reservations", f"r{i}", {"gpus": i})
                                                       for i in range(50)])
        store.commit([PutJob(job(7, "running")), PutRecord("users", "bob", {"admin": False})])
        assert store.compact()
    raw = (folder / DB_NAME).read_bytes()
    assert len(raw) > 2 * CHUNK_BYTES  # written as three pieces or more
    assert encode(json.loads(raw)) == raw  # canonical, its checksum that of the rest
    capture = read_state(folder).capture()
    assert capture.encode() == raw
    small = list(capture.parts(chunk_bytes=10_000))
    assert len(small) > 100 and b"".join(small) == b"".join(capture.parts())
    db = TinyDB(folder / DB_NAME, access_mode="r")
    try:
        assert len(db.table("jobs")) == 3000 and db.table("jobs").get(doc_id=7)["state"] == "running"
        assert len(db.table("reservations")) == 50 and len(db.table("users")) == 1
    finally:
        db.close()
    with TinyDBStore(folder) as store:  # its checksum holds: the store opens it
        loaded = store.load()
        assert len(loaded.jobs) == 3000 and loaded.jobs[7]["state"] == "running"
        assert loaded.records["users"] == {"bob": {"admin": False}}


def test_an_arrays_tasks_are_one_small_record_and_whole_documents_in_the_snapshot(tmp_path):
    """The journal keeps an array's tasks as the first one's document and the others' differences; a compaction
    writes each whole into the snapshot, in TinyDB's canonical form, and either way the lab loads the same."""
    from labq.store import PutTasks
    from labq.store.contract import task_doc
    from labq.store.journal import journal_files, read_journal

    first = {"id": 1, "state": "queued", "note": "é", "spec": {"user": "alice", "gpus": 1, "command": ["t", "0"],
                                                              "env": {"I": "0"}, "array": {"id": 0, "index": 0},
                                                              "workdir": "/home/alice/" + "w" * 300}}
    others = [(1 + i, ["t", str(i)], {"I": str(i)}, i) for i in range(1, 1000)]
    whole = {1: first} | {o[0]: task_doc(first, *o) for o in others}
    folder = tmp_path / "data"
    with TinyDBStore(folder) as store:
        store.commit([PutTasks(first, others)])
        [(_, path)] = journal_files(folder)
        [record] = read_journal(path, last=True).records
        assert record["jobs"] == {} and record["tasks"] == [[first, [list(o) for o in others]]]
        assert path.stat().st_size < len(json.dumps(list(whole.values()))) / 5  # not a thousand documents
    with TinyDBStore(folder) as store:  # replayed from the journal
        assert store.load().jobs == whole
        store.compact()  # (unless opening compacted it already)
    raw = (folder / DB_NAME).read_bytes()
    assert encode(json.loads(raw)) == raw and json.loads(raw)["jobs"]["1000"] == whole[1000]
    with TinyDBStore(folder) as store:  # from the snapshot
        assert store.load().jobs == whole
