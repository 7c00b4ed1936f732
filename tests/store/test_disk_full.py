"""A full disk: the change is refused, nothing is acknowledged, the old data stays readable.

Runs on a real, small tmpfs mounted for the test (needs root, as in CI); the
disk is filled with a ballast file and commits of growing documents.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from labq.store import CommitFailed, PutJob, TinyDBStore
from tests.store.conftest import job


@pytest.fixture
def small_disk():
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    folder = tempfile.mkdtemp(prefix="labq-full-")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", folder],
                             capture_output=True, text=True, timeout=30)
    if mounted.returncode != 0:
        os.rmdir(folder)
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", folder], timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", folder], check=True, timeout=30)  # a failed test left files open
        os.rmdir(folder)


def test_disk_full_refuses_the_change_and_keeps_the_old_data(small_disk):
    data = os.path.join(small_disk, "data")
    store = TinyDBStore(data)
    store.commit([PutJob(job(i, note="x" * 1000)) for i in range(1, 31)])  # ~30 KB of hot jobs
    store.commit([PutJob(job(1, "succeeded", ended_at=1_700_000_000.0))])
    database = Path(data) / "labq.json"
    before = database.read_bytes()
    with open(os.path.join(small_disk, "ballast"), "wb", buffering=0) as ballast:  # fill the disk to the brim
        try:
            while True:
                ballast.write(b"\0" * 4096)
        except OSError:
            pass
    with pytest.raises(CommitFailed, match="No space left on device") as refused:
        store.commit([PutJob(job(31, note="y" * 4000)), PutJob(job(2, "failed", ended_at=1_700_000_100.0))])
    assert "Free some space" in str(refused.value)
    assert database.read_bytes() == before
    assert sorted(store.load().jobs) == list(range(2, 31))  # reads still served
    assert [d["id"] for d in store.history()] == [1]
    os.unlink(os.path.join(small_disk, "ballast"))
    store.commit([PutJob(job(31))])  # works again once there is room
    store.close()
    with TinyDBStore(data) as again:
        assert sorted(again.load().jobs) == list(range(2, 32))
        assert [d["id"] for d in again.history()] == [1]  # the refused finish left no archive line
