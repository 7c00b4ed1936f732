"""Crash test: a leader killed with SIGKILL at random moments loses nothing it acknowledged.

A child process commits a stream of random changes (submits, an array's tasks,
state changes, finishes that move jobs to the archive, deletions, records) and prints each
change before committing it and again once acknowledged. The parent kills it
at a random moment, reopens the store, and checks every acknowledged change.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from labq.store import TinyDBStore

CHILD = r"""
import json, random, sys, time
from labq.store import TinyDBStore, PutJob, PutTasks, DeleteJob, PutRecord
from labq.store.contract import task_doc
store = TinyDBStore(sys.argv[1])
rng = random.Random(int(sys.argv[2]))
state = store.load()
hot = dict(state.jobs)
next_id = state.next_job_id
while True:
    changes, intent = [], []
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.45 or not hot:
            doc = {"id": next_id, "state": "queued", "n": rng.random()}
            next_id += 1
        elif roll < 0.7:
            doc = dict(rng.choice(list(hot.values())), state="running", n=rng.random())
        elif roll < 0.9:
            doc = dict(rng.choice(list(hot.values())), state="succeeded", ended_at=time.time())
        else:
            victim = rng.choice(list(hot))
            if any(c.get("id") == victim for c in intent):
                continue
            changes.append(DeleteJob(victim)); intent.append({"deleted": victim}); hot.pop(victim)
            continue
        if any(c.get("id") == doc["id"] or c.get("deleted") == doc["id"] for c in intent):
            continue
        changes.append(PutJob(doc)); intent.append(doc)
        if doc["state"] == "succeeded":
            hot.pop(doc["id"], None)
        else:
            hot[doc["id"]] = doc
    if rng.random() < 0.15:  # an array's tasks, told as their differences
        first = {"id": next_id, "state": "queued", "n": rng.random(),
                 "spec": {"command": ["t", "0"], "env": {"I": "0"}, "array": {"id": next_id - 1, "index": 0}}}
        others = [(next_id + i, ["t", str(i)], {"I": str(i)}, i) for i in range(1, rng.randint(2, 60))]
        changes.append(PutTasks(first, others))
        for doc in [first] + [task_doc(first, *o) for o in others]:
            intent.append(doc)
            hot[doc["id"]] = doc
        next_id += 1 + len(others)
    if rng.random() < 0.2:
        changes.append(PutRecord("reservations", f"r{rng.randint(1, 5)}", {"n": rng.random()}))
    print(json.dumps({"try": intent}), flush=True)
    seq = store.commit(changes)
    print(json.dumps({"ack": seq}), flush=True)
"""


def _run_and_kill(folder, seed: int, rng: random.Random) -> tuple[list[list[dict]], list[dict] | None]:
    """Run the child until a random moment; return the acknowledged commits and the one in flight."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(folder), str(seed)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # let it open the store and commit for a while
    deadline = time.monotonic() + 0.3 + rng.random() * 0.7
    while time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    out, err = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL, f"the child died on its own:\n{err}"
    acked, pending = [], None
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            break  # the kill cut the last line
        if "try" in msg:
            pending = msg["try"]
        elif "ack" in msg:
            acked.append(pending)
            pending = None
    return acked, pending


@pytest.mark.parametrize("series", range(4))
def test_every_acknowledged_change_survives_sigkill(tmp_path, series):
    folder = tmp_path / "data"
    rng = random.Random(series)
    expected: dict[int, dict | None] = {}  # job id -> last acknowledged doc, None if deleted
    for run in range(10):  # 4 series x 10 kills
        acked, pending = _run_and_kill(folder, series * 100 + run, rng)
        with TinyDBStore(folder) as store:  # always loads
            state = store.load()
            history = {d["id"]: d for d in store.history()}
        for commit in acked:
            for change in commit:
                if "deleted" in change:
                    expected[change["deleted"]] = None
                else:
                    expected[change["id"]] = change
        maybe = {c.get("id", c.get("deleted")): c for c in pending or []}
        for job_id, doc in expected.items():
            found = state.jobs.get(job_id) or history.get(job_id)
            if job_id in maybe:  # the commit in flight may or may not have landed
                allowed = [doc, None if "deleted" in maybe[job_id] else maybe[job_id]]
                assert found in allowed, f"run {run}: job {job_id} is {found}, expected one of {allowed}"
            else:
                assert found == doc, f"run {run}: job {job_id} is {found}, acknowledged {doc}"
        # the in-flight commit, if it landed, counts from now on
        for job_id in maybe:
            found = state.jobs.get(job_id) or history.get(job_id)
            if found is not None or job_id in expected:  # landed, or a delete that landed
                expected[job_id] = found
        assert state.next_job_id > max(expected, default=0)
