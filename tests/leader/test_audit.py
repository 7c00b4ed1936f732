"""The audit trail's file: one line an entry, a seq that only grows (across restarts and rotations), filters."""

from __future__ import annotations

import json

from labq.leader import audit
from labq.leader.audit import AuditLog, AuditQuery
from tests.conftest import FakeClock


def test_entries_are_lines_with_a_growing_seq_kept_across_a_restart_and_rotation(tmp_path, monkeypatch):
    monkeypatch.setattr(audit, "ROTATE_BYTES", 2000)
    monkeypatch.setattr(audit, "KEEP", 2)
    clock = FakeClock(1000.0)
    trail = AuditLog(tmp_path, clock)
    for i in range(100):
        clock.now += 1
        trail.record({"user": "alice" if i % 2 else "bob", "action": "submit", "job": i, "status": 201})
    trail.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["audit.jsonl", "audit.jsonl.1", "audit.jsonl.2"]
    again = AuditLog(tmp_path, clock)
    again.record({"user": "carol", "action": "cancel", "job": 3, "status": 403, "error": "not yours"})
    seqs = [e["seq"] for e in again.entries()]
    assert seqs == list(range(seqs[0], 102)) and seqs[0] > 1  # the oldest beyond KEEP files were dropped
    last = json.loads((tmp_path / "audit.jsonl").read_text().splitlines()[-1])
    assert last == {"seq": 101, "at": 1100.0, "user": "carol", "action": "cancel", "job": 3, "status": 403,
                    "error": "not yours"}


def test_a_query_filters_by_user_owner_job_action_time_and_seq_and_keeps_the_last(tmp_path):
    clock = FakeClock(0.0)
    trail = AuditLog(tmp_path, clock)
    for i, (user, owner, action) in enumerate([("alice", "alice", "submit"), ("root", "alice", "cancel"),
                                               ("bob", "bob", "submit"), ("root", None, "add user"),
                                               ("alice", "alice", "hold")]):
        clock.now = 100.0 * (i + 1)
        trail.record({"user": user, "kind": "user", "action": action, "status": 200,
                      **({"owner": owner, "job": i} if owner else {"target": "dan"})})
    everyone = (lambda e: True)
    assert [e["seq"] for e in trail.find(AuditQuery(user="alice"), everyone)] == [1, 2, 5]
    assert [e["seq"] for e in trail.find(AuditQuery(action="submit"), everyone)] == [1, 3]
    assert [e["seq"] for e in trail.find(AuditQuery(job=1), everyone)] == [2]
    assert [e["seq"] for e in trail.find(AuditQuery(since=250, until=450), everyone)] == [3, 4]
    assert [e["seq"] for e in trail.find(AuditQuery(after=3), everyone)] == [4, 5]
    assert [e["seq"] for e in trail.find(AuditQuery(limit=2), everyone)] == [4, 5]
    bobs = (lambda e: e.get("user") == "bob" or e.get("owner") == "bob")
    assert [e["seq"] for e in trail.find(AuditQuery(), bobs)] == [3]


def test_a_damaged_line_is_skipped_and_the_next_seq_follows_the_last_good_one(tmp_path):
    (tmp_path / "audit.jsonl").write_text('{"seq": 7, "at": 1, "action": "submit"}\n{"seq": 8, "at": 2, "act')
    trail = AuditLog(tmp_path, FakeClock(5.0))
    assert [e["seq"] for e in trail.entries()] == [7]
    trail.record({"action": "cancel"})
    assert [e["seq"] for e in trail.entries()] == [7, 8]


def test_the_trail_read_from_its_end_is_the_trail_reversed_across_rotations_and_blocks(tmp_path, monkeypatch):
    import io

    monkeypatch.setattr(audit, "ROTATE_BYTES", 1500)
    trail = AuditLog(tmp_path, FakeClock(0.0))
    for i in range(60):
        trail.record({"user": "u" * (i % 7), "action": "submit", "job": i})
    assert [e["seq"] for e in trail.newest_first()] == [e["seq"] for e in trail.entries()][::-1]
    lines = b"a\nbb\n\nccc\nd"
    for block in (1, 2, 3, 64):
        assert list(audit._lines_backwards(io.BytesIO(lines), block)) == [b"d", b"ccc", b"", b"bb", b"a"]
    assert [e["seq"] for e in trail.find(AuditQuery(after=55), lambda e: True)] == [56, 57, 58, 59, 60]
