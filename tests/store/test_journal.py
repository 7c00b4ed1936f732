"""The journal on real files and real processes: a crash at any byte of an append, a crash in a compaction
before and after its rename, a torn or zero-filled tail, a flipped bit, a full disk in a compaction.

Each asserts what the store promises: every acknowledged commit is there after the restart, and nothing else
(the one in flight may or may not have landed, whole).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from labq.store import CommitFailed, CorruptDatabase, PutJob, TinyDBStore, plan_recovery, recover
from labq.store.journal import journal_files
from tests.store.conftest import job
from tests.store.test_disk_full import small_disk  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[2]

# A writer whose appends go to disk a few bytes at a time, so that a kill lands inside a record.
SLOW_WRITER = r"""
import json, os, sys, time
import labq.store.journal as journal
from labq.store import PutJob, TinyDBStore

def slow_write_all(fd, payload):
    for i in range(0, len(payload), 7):
        os.write(fd, payload[i:i + 7])
        time.sleep(0.0003)

journal.write_all = slow_write_all
store = TinyDBStore(sys.argv[1])
next_id = store.load().next_job_id
while True:
    doc = {"id": next_id, "state": "queued", "spec": {"user": "ann", "gpus": 1}, "note": "x" * (next_id % 300)}
    print(json.dumps({"try": next_id}), flush=True)
    store.commit([PutJob(doc)])
    print(json.dumps({"ack": next_id}), flush=True)
    next_id += 1
"""


def run_and_kill(script: str, folder: Path, seconds: float, *args: str) -> tuple[list[int], int | None, str]:
    child = subprocess.Popen([sys.executable, "-c", script, str(folder), *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=ROOT)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    out, err = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL, f"the writer died on its own:\n{err}"
    acked, trying = [], None
    for line in out.splitlines():
        try:
            said = json.loads(line)
        except ValueError:
            break
        if "try" in said:
            trying = said["try"]
        elif "ack" in said:
            acked.append(said["ack"])
            trying = None
    return acked, trying, err


def test_a_kill_at_any_byte_of_an_append_loses_only_the_unacknowledged_record(tmp_path):
    folder = tmp_path / "data"
    rng = random.Random(19)
    acked_all: list[int] = []
    torn_seen = 0
    for run in range(8):
        acked, trying, _ = run_and_kill(SLOW_WRITER, folder, 0.4 + rng.random() * 0.6)
        acked_all += acked
        last = journal_files(folder)[-1][1]
        torn_seen += _has_torn_tail(last)
        with TinyDBStore(folder) as store:
            jobs = store.load().jobs
        expected = set(acked_all)
        assert expected <= set(jobs), f"run {run}: acknowledged jobs lost: {sorted(expected - set(jobs))}"
        extra = set(jobs) - expected
        assert extra <= ({trying} if trying is not None else set()), f"run {run}: jobs never submitted: {extra}"
        acked_all += sorted(extra)  # the one in flight landed whole: it counts from now on
    assert torn_seen >= 2, f"only {torn_seen} of 8 kills landed inside a record: the test did not test that"


def _has_torn_tail(path: Path) -> bool:
    from labq.store.journal import read_journal

    return read_journal(path, last=True).torn


def committed(folder: Path, count: int, *, close: bool = False) -> list[int]:
    """``count`` commits of one job each, by a process that then dies without closing (no compaction)."""
    script = f"""
import os
from labq.store import PutJob, TinyDBStore
from tests.store.conftest import job
store = TinyDBStore({str(folder)!r})
first = store.load().next_job_id
for i in range(first, first + {count}):
    store.commit([PutJob(job(i, note="n" * (i % 50)))])
print(first)
{"store.close()" if close else "os._exit(0)"}
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    first = int(done.stdout)
    return list(range(first, first + count))


@pytest.mark.parametrize("cut", ["every byte", "zeros"])
def test_a_torn_last_record_is_dropped_and_cut_off_and_the_rest_loads(tmp_path, cut):
    crashed = tmp_path / "crashed"
    ids = committed(crashed, 5)
    folder = tmp_path / "data"
    name = journal_files(crashed)[-1][1].name
    whole = (crashed / name).read_bytes()
    last_start = whole.rindex(b"\n", 0, len(whole) - 1) + 1
    if cut == "every byte":
        tails = [whole[:i] for i in range(last_start + 1, len(whole))]
    else:  # the file system allotted the blocks of the last append but never wrote them
        tails = [whole[:last_start] + b"\0" * (len(whole) - last_start),
                 whole[:last_start + 20] + b"\0" * (len(whole) - last_start - 20)]
    for tail in tails:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(crashed, folder)
        (folder / name).write_bytes(tail)
        store = TinyDBStore(folder)
        assert sorted(store.load().jobs) == ids[:-1], f"cut at byte {len(tail)}"
        assert (folder / name).read_bytes() == whole[:last_start]  # the torn record was cut off at the open
        store.close()
    with TinyDBStore(folder) as store:
        assert store.commit([PutJob(job(ids[-1] + 1))]) > 0  # appends go on after the sound records
    with TinyDBStore(folder) as store:
        assert sorted(store.load().jobs) == ids[:-1] + [ids[-1] + 1]


@pytest.mark.parametrize("where", ["first record", "last record"])
def test_a_flipped_bit_in_an_acknowledged_record_stops_the_store_never_drops_it(tmp_path, where):
    folder = tmp_path / "data"
    ids = committed(folder, 4)
    journal = journal_files(folder)[-1][1]
    raw = journal.read_bytes()
    start = 0 if where == "first record" else raw.rindex(b"\n", 0, len(raw) - 1) + 1
    i = raw.index(b'"queued"', start) + 3
    damaged = raw[:i] + bytes([raw[i] ^ 0x04]) + raw[i + 1:]
    journal.write_bytes(damaged)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != "leader.lock"}
    with pytest.raises(CorruptDatabase, match="fails its checksum") as refused:
        TinyDBStore(folder)
    assert "labq leader --recover" in str(refused.value)
    after = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != "leader.lock"}
    assert after == before  # refused, with every file as it was
    plan = plan_recovery(folder)
    sound = [] if where == "first record" else ids[:-1]  # the records before the damaged one
    assert plan.good_jobs == len(sound)
    recover(plan)
    with TinyDBStore(folder) as store:
        state = store.load()
        assert sorted(state.jobs) == sound
        assert state.next_job_id > ids[-1]  # the ids of the lost commits are never handed out again


# A compaction that stops for good at one point: the parent kills it there, while commits went on.
COMPACTION_KILLED = r"""
import json, os, sys, threading, time
from labq.store import PutJob, TinyDBStore
from labq.store.files import Disk

where = sys.argv[2]
lines = threading.Lock()
COMPACTOR = "labq-store-compactor"

def say(doc):  # one whole line at a time: the compactor's thread and the committing one both speak
    with lines:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()

class StopsInCompaction(Disk):
    snapshot_synced = False
    def fsync(self, fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("labq.json.tmp"):
            if where == "before rename":
                say({"at": where}); threading.Event().wait()  # until the test kills it
            self.snapshot_synced = True
        os.fsync(fd)
    def fsync_folder(self, folder):  # the compaction's (a new journal's first sync makes its name durable too)
        if where == "after rename" and self.snapshot_synced and threading.current_thread().name == COMPACTOR:
            say({"at": where}); threading.Event().wait()  # until the test kills it
        super().fsync_folder(folder)

store = TinyDBStore(sys.argv[1], disk=StopsInCompaction(), compact_bytes=4000)
next_id = store.load().next_job_id
while True:
    doc = {"id": next_id, "state": "queued", "spec": {"user": "ann", "gpus": 1}}
    say({"try": next_id})
    store.commit([PutJob(doc)])
    say({"ack": next_id})
    next_id += 1
    time.sleep(0.002)
"""


@pytest.mark.parametrize("where", ["before rename", "after rename"])
def test_a_kill_in_a_compaction_loses_nothing_and_commits_went_on_during_it(tmp_path, where):
    folder = tmp_path / "data"
    committed(folder, 3, close=True)
    child = subprocess.Popen([sys.executable, "-c", COMPACTION_KILLED, str(folder), where], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=ROOT)
    lines, acked_after_stop = [], 0
    deadline = time.monotonic() + 60
    stopped = False
    while time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        lines.append(line)
        said = json.loads(line)
        stopped = stopped or said.get("at") == where
        acked_after_stop += stopped and "ack" in said
        if acked_after_stop >= 20:  # the compaction hangs where it stopped; commits do not wait for it
            break
    os.kill(child.pid, signal.SIGKILL)
    child.communicate(timeout=30)
    assert stopped and acked_after_stop >= 20, "".join(lines[-5:])
    acked = [json.loads(line)["ack"] for line in lines if "ack" in line]
    with TinyDBStore(folder) as store:
        jobs = store.load().jobs
    assert set(acked) <= set(jobs), sorted(set(acked) - set(jobs))
    tried = [json.loads(line)["try"] for line in lines if "try" in line]
    assert set(jobs) - {1, 2, 3} <= set(tried)


def test_a_full_disk_in_a_compaction_loses_nothing_and_it_is_tried_again(small_disk):  # noqa: F811
    data = Path(small_disk) / "data"
    store = TinyDBStore(data, compact_bytes=10**9)
    ids = []
    for i in range(1, 41):
        store.commit([PutJob(job(i, note="x" * 3000))])  # ~120 KB in the journal, not in the snapshot
        ids.append(i)
    ballast = Path(small_disk) / "ballast"
    with open(ballast, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    with pytest.raises(OSError, match="No space left"):
        store.compact()
    with pytest.raises(CommitFailed, match="No space left on device"):
        store.commit([PutJob(job(41))])
    assert sorted(store.load().jobs) == ids  # still served
    ballast.unlink()
    assert store.compact()
    store.commit([PutJob(job(41))])
    store.close()
    with TinyDBStore(data) as again:
        assert sorted(again.load().jobs) == ids + [41]


def test_a_compaction_gets_its_turn_while_commits_never_pause(tmp_path):
    """A writer that commits back to back must not keep the compaction from swapping the journal for ever."""
    store = TinyDBStore(tmp_path / "data", compact_bytes=10**9)
    store.commit([PutJob(job(i)) for i in range(1, 2001)])
    stop = threading.Event()
    committed: list[int] = []

    def commit_forever() -> None:
        i = 2001
        while not stop.is_set():
            store.commit([PutJob(job(i))])
            committed.append(i)
            i += 1

    writer = threading.Thread(target=commit_forever)
    writer.start()
    try:
        while len(committed) < 50:
            time.sleep(0.01)
        compacting = threading.Thread(target=store.compact)
        compacting.start()
        compacting.join(60)
        assert not compacting.is_alive(), "the compaction never got its turn"
        assert store.compactions == 1
    finally:
        stop.set()
        writer.join(30)
    store.close()
    with TinyDBStore(tmp_path / "data") as again:
        assert sorted(again.load().jobs) == list(range(1, 2001)) + committed
