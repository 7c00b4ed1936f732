"""``labq store backup`` while the leader commits, and ``labq store restore`` into a fresh lab.

The store's part runs on real files with threads committing; the lab's part runs a real leader
process, submits over HTTP from a thread during the backup, restores into a fresh data folder and
starts a fresh leader and agent on it.
"""

from __future__ import annotations

import itertools
import json
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from labq.store import PutJob, TinyDBStore
from labq.store.backup import JOIN_TOKEN, MANIFEST, BackupError, backup, check_backup, restore
from labq.store.tinydb_store import ARCHIVE_DIR, DB_NAME, ID_RESERVE, PREVIOUS_NAME
from tests.e2e.conftest import Lab, lab  # noqa: F401  (the fixture)
from tests.store.conftest import job, small_lab

pytestmark = pytest.mark.timeout(180)

WEEK = 7 * 86400


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def data(tmp_path) -> Path:
    folder = small_lab(tmp_path / "data")
    (folder / JOIN_TOKEN).write_text("join-secret\n")
    return folder


# -- the store's part ---------------------------------------------------------------------------


def test_backups_taken_while_commits_go_on_hold_each_committed_job_exactly_once(tmp_path):
    data = tmp_path / "data"
    store = TinyDBStore(data)
    ids = itertools.count(1)
    id_lock = threading.Lock()
    put: dict[int, int] = {}  # job id -> the commit that put it
    finished: dict[int, int] = {}  # job id -> the commit that finished it (moved it to the archive)
    stop = threading.Event()

    def commit_forever() -> None:
        mine = []
        while not stop.is_set():
            with id_lock:
                i = next(ids)
            put[i] = store.commit([PutJob(job(i))])
            mine.append(i)
            if len(mine) % 3 == 0:  # finish an earlier one: it leaves the database for the archive
                j = mine[-3]
                finished[j] = store.commit([PutJob(job(j, "succeeded", ended_at=1_700_000_000.0 + j * WEEK))])

    threads = [threading.Thread(target=commit_forever) for _ in range(2)]
    for t in threads:
        t.start()
    manifests = []
    try:
        while len(manifests) < 15:
            time.sleep(0.01)
            folder = tmp_path / f"backup-{len(manifests)}"
            manifests.append((backup(data, folder), folder))
    finally:
        stop.set()
        for t in threads:
            t.join()
        last_seq = store.load().seq
        store.close()

    assert manifests[0][0].seq < manifests[-1][0].seq < last_seq  # backups of different commits, mid-stream
    assert any(m.archive_records for m, _ in manifests)
    assert len({f.path for m, _ in manifests for f in m.files if f.path.startswith(ARCHIVE_DIR)}) > 1  # months
    for n, (manifest, folder) in enumerate(manifests):
        assert check_backup(folder) == manifest
        target = tmp_path / f"restored-{n}"
        restore(folder, target)
        with TinyDBStore(target) as restored:
            state = restored.load()
            archived = [doc["id"] for doc in restored.history()]
        s = manifest.seq
        assert state.seq == s
        assert sorted(archived) == sorted({j for j, at in finished.items() if at <= s})
        assert set(state.jobs) == {i for i, at in put.items() if at <= s and not finished.get(i, s + 1) <= s}
        # on an empty folder, ids continue past what the backed-up lab had reserved at that commit
        assert state.next_job_id > max(i for i, at in put.items() if at <= s) + ID_RESERVE
        # restored over the lab itself (the usual case: it went wrong after the backup), past every id it handed out
        over = tmp_path / f"over-{n}"
        shutil.copytree(data, over)
        restore(folder, over, force=True)
        with TinyDBStore(over) as restored:
            assert restored.load().next_job_id > max(put)


def test_a_backup_has_a_manifest_of_its_files_and_restores_byte_for_byte(data, tmp_path):
    manifest = backup(data, tmp_path / "backup", clock=lambda: 1_750_000_000.0)
    doc = json.loads((tmp_path / "backup" / MANIFEST).read_text())
    assert doc["format"] == "labq-backup" and doc["created_at"] == 1_750_000_000.0
    assert doc["labq_version"] and doc["schema"] == 1 and doc["seq"] == 2 == manifest.seq
    assert [f["path"] for f in doc["files"]] == [DB_NAME, f"{ARCHIVE_DIR}/jobs-2023-11.jsonl", JOIN_TOKEN]
    assert all(len(f["sha256"]) == 64 and f["size"] > 0 for f in doc["files"])
    restore(tmp_path / "backup", tmp_path / "new")
    source, copy = files_of(data), files_of(tmp_path / "new")
    assert copy[f"{ARCHIVE_DIR}/jobs-2023-11.jsonl"] == source[f"{ARCHIVE_DIR}/jobs-2023-11.jsonl"]
    assert copy[JOIN_TOKEN] == b"join-secret\n" and (tmp_path / "new" / JOIN_TOKEN).stat().st_mode & 0o077 == 0
    assert PREVIOUS_NAME not in copy
    with TinyDBStore(tmp_path / "new") as store:
        assert sorted(store.load().jobs) == [2, 3] and [d["id"] for d in store.history()] == [1]


def test_a_backup_refuses_a_folder_that_is_not_empty(data, tmp_path):
    dest = tmp_path / "backup"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(BackupError, match="is not empty"):
        backup(data, dest)
    assert files_of(dest) == {"notes.txt": b"mine"}


def test_a_backup_refuses_damaged_data_and_leaves_nothing(data, tmp_path):
    (data / DB_NAME).write_bytes((data / DB_NAME).read_bytes()[:-10])
    with pytest.raises(BackupError, match="the database is damaged") as refused:
        backup(data, tmp_path / "backup")
    assert "labq leader --recover" in str(refused.value)  # the previous copy is sound
    assert not (tmp_path / "backup").exists()


def test_a_backup_refuses_a_damaged_archive_line(data, tmp_path):
    month = data / ARCHIVE_DIR / "jobs-2023-11.jsonl"
    month.write_bytes(b"{not json\n" + month.read_bytes())
    with pytest.raises(BackupError, match="line 1 is damaged"):
        backup(data, tmp_path / "backup")
    assert not (tmp_path / "backup").exists()


@pytest.mark.parametrize("tamper", [
    lambda b: (b / DB_NAME).write_bytes((b / DB_NAME).read_bytes().replace(b"alice", b"alicf")),
    lambda b: (b / ARCHIVE_DIR / "jobs-2023-11.jsonl").open("ab").write(b'{"seq":1,"job":{"id":9}}\n'),
    lambda b: (b / JOIN_TOKEN).unlink(),
    lambda b: (b / MANIFEST).write_text((b / MANIFEST).read_text().replace('"seq": 2', '"seq": 1')),
])
def test_a_restore_checks_the_manifest_first_and_changes_nothing_when_it_fails(data, tmp_path, tamper):
    backup(data, tmp_path / "backup")
    tamper(tmp_path / "backup")
    target = tmp_path / "target"
    with TinyDBStore(target) as store:
        store.commit([PutJob(job(1))])
    before = files_of(target)
    with pytest.raises(BackupError):
        restore(tmp_path / "backup", target, force=True)
    assert files_of(target) == before


def test_a_restore_refuses_while_a_leader_holds_the_folder(data, tmp_path):
    backup(data, tmp_path / "backup")
    with TinyDBStore(tmp_path / "target") as running:
        before = files_of(tmp_path / "target")
        with pytest.raises(BackupError, match=r"(?s)is using .*Stop that leader first"):
            restore(tmp_path / "backup", tmp_path / "target", force=True)
        assert files_of(tmp_path / "target") == before
        assert running.commit([PutJob(job(1))]) == 1  # and it goes on unharmed


def test_a_restore_replaces_a_lab_only_with_force_and_keeps_its_files_aside(data, tmp_path):
    backup(data, tmp_path / "backup")
    target = tmp_path / "target"
    with TinyDBStore(target) as store:
        store.commit([PutJob(job(1))])
        store.commit([PutJob(job(1, "failed", ended_at=1_600_000_000.0))])
    before = files_of(target)
    with pytest.raises(BackupError, match=r"(?s)already holds a lab .*Add --force"):
        restore(tmp_path / "backup", target)
    assert files_of(target) == before
    done = restore(tmp_path / "backup", target, force=True)
    assert done.replaced is not None and done.replaced.parent == target
    kept = files_of(done.replaced)
    for name in (DB_NAME, PREVIOUS_NAME, f"{ARCHIVE_DIR}/jobs-2020-09.jsonl"):
        assert kept[name] == before[name]
    assert not (target / ARCHIVE_DIR / "jobs-2020-09.jsonl").exists()
    with TinyDBStore(target) as store:
        assert sorted(store.load().jobs) == [2, 3] and [d["id"] for d in store.history()] == [1]


# -- the lab's part: a real leader, the CLI ------------------------------------------------------


def test_backup_while_submitting_then_restore_into_a_fresh_leader_that_resumes_the_queue(lab):  # noqa: F811
    from labq.client import ApiError, Client
    from labq.credentials import credentials_path, load_credentials

    lab.start_leader()
    saved = credentials_path(lab.home)  # the leader saves them just after it says it serves
    lab.wait(lambda: "token" in load_credentials(saved), "the first admin's credentials")
    client = Client(lab.url, load_credentials(saved)["token"])
    body = {"command": ["sleep", "300"], "gpus": 1, "workdir": str(lab.root)}
    done = client.submit({**body, "command": ["true"], "name": "finished-before"})
    client.action(done["id"], "cancel")
    assert client.job(done["id"])[0]["state"] == "cancelled"  # finished: in the archive now
    acked: list[tuple[float, float, dict]] = []  # (sent, acknowledged, job)
    for i in range(3):
        sent = time.monotonic()
        doc = client.submit({**body, "name": f"q{i}"})
        acked.append((sent, time.monotonic(), doc))

    stop = threading.Event()

    def submit_forever() -> None:
        submitter = Client(client.url, client.token)
        n = 0
        while not stop.is_set():
            n += 1
            sent = time.monotonic()
            doc = submitter.submit({**body, "name": f"during-{n}"})
            acked.append((sent, time.monotonic(), doc))

    thread = threading.Thread(target=submit_forever)
    thread.start()
    try:
        lab.wait(lambda: len(acked) > 20, "submits before the backup")
        began = time.monotonic()
        out = json.loads(lab.labq("store", "backup", str(lab.root / "backup"), "--data-dir", str(lab.data),
                                  "--json").stdout)
        ended = time.monotonic()
        lab.wait(lambda: acked[-1][0] > ended + 0.2, "submits sent after the backup")
    finally:
        stop.set()
        thread.join()
    before = [doc for _, at, doc in acked if at < began]  # acknowledged before the backup began
    after = [doc for sent, _, doc in acked if sent > ended]  # sent after it ended
    assert after and out["manifest"]["seq"] > 1
    assert any(began < at < ended for _, at, _ in acked)  # the leader committed during the backup
    assert out["restore"] == f"labq store restore {lab.root / 'backup'} --data-dir DATA_DIR"

    # the backup folder is taken now
    again = lab.labq("store", "backup", str(lab.root / "backup"), "--data-dir", str(lab.data), check=False)
    assert again.returncode == 2 and "is not empty" in again.stderr

    lab.kill(lab.leader, signal.SIGTERM)
    fresh = lab.root / "fresh"
    restored = lab.labq("store", "restore", str(lab.root / "backup"), "--data-dir", str(fresh))
    assert f"Start the leader on it: labq leader --data-dir {fresh}" in restored.stdout
    lab.data = fresh
    lab.start_leader()

    for doc in before:
        job_now = client.job(doc["id"])[0]
        assert job_now["spec"] == doc["spec"] and job_now["state"] == "queued"
    assert client.job(done["id"])[0]["state"] == "cancelled"
    for doc in after:
        with pytest.raises(ApiError):
            client.job(doc["id"])
    newest = max(doc["id"] for _, _, doc in acked)
    assert client.submit({**body, "name": "after-restore"})["id"] > newest  # no id handed out twice

    # a restore over this running leader is refused, and changes nothing
    held = files_of(fresh / ARCHIVE_DIR)
    refused = lab.labq("store", "restore", str(lab.root / "backup"), "--data-dir", str(fresh), "--force",
                       check=False)
    assert refused.returncode == 2 and "Stop that leader first" in refused.stderr
    assert files_of(fresh / ARCHIVE_DIR) == held

    # the queue resumes: an agent joins with the restored join token and gets the first queued job
    lab.start_agent()
    first = before[0]["id"]
    seen: list[dict] = []
    lab.wait(lambda: seen.append(client.job(first)[0]) or seen[-1]["state"] != "queued",
             f"job {first} to be scheduled", detail=lambda: seen[-1])
    assert seen[-1]["attempt"] >= 1  # it was placed on the agent: started, or refused there


def test_a_tampered_backup_is_refused_by_the_cli(lab, tmp_path):  # noqa: F811
    lab.start_leader()
    lab.submit("sleep", "300")
    lab.labq("store", "backup", str(lab.root / "backup"), "--data-dir", str(lab.data))
    shutil.copytree(lab.root / "backup", lab.root / "tampered")
    db = lab.root / "tampered" / DB_NAME
    db.write_bytes(db.read_bytes().replace(b'"queued"', b'"queuee"'))
    refused = lab.labq("store", "restore", str(lab.root / "tampered"), "--data-dir", str(tmp_path / "new"),
                       check=False)
    assert refused.returncode == 2 and "does not match the manifest" in refused.stderr
    assert not (tmp_path / "new" / DB_NAME).exists()
