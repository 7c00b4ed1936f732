"""A listing of finished jobs reads the archive by each line's head and times (``Archive.ended``), and then only the
page's jobs whole (``Archive.read(ids=...)``): what it reads must be what decoding every line whole says."""

from __future__ import annotations

import json

from labq.models.job import Attempt, AttemptEnd, Job, JobSpec, JobState
from labq.protocol.codec import encode_job
from labq.store import Ended
from labq.store.archive import Archive, encode_line
from labq.store.files import Disk


def labq_job(job_id: int, user: str, state: JobState, ended_at: float | None, **spec) -> dict:
    """A job's document as the leader archives it (``encode_job``)."""
    history = (Attempt(1, None, 1_000.0, 1_500.0, AttemptEnd.PREEMPTED),) if job_id % 2 else ()
    return encode_job(Job(job_id, JobSpec(user=user, command=("train", '"attempt":1,'), **spec), state=state,
                          submitted_at=900.0, started_at=1_600.0 if ended_at else None, ended_at=ended_at,
                          attempt=len(history) + 1, history=history))


def decoding(monkeypatch) -> list[bytes]:
    """The archive's lines decoded whole from now on (``json.loads`` of bytes), as a list that grows."""
    decoded: list[bytes] = []
    loads = json.loads
    monkeypatch.setattr(json, "loads", lambda raw, *a, **k: (
        decoded.append(raw) if isinstance(raw, bytes) else None) or loads(raw, *a, **k))
    return decoded


def as_decoded(archive: Archive, committed: int) -> list[Ended]:
    """What ``ended`` must say: every line decoded whole (``read``)."""
    return sorted(Ended(d["id"], d["state"], d["spec"]["user"], d.get("ended_at")) for d in archive.read(committed))


def test_the_heads_and_times_of_labqs_lines_say_what_decoding_them_whole_says(tmp_path, monkeypatch):
    folder = tmp_path / "archive"
    folder.mkdir()
    tricky_env = (("A", "1"), ("attempt", "2"), ("submitted_at", "1"), ("started_at", "null"), ("ended_at", "3"))
    docs = [
        labq_job(1, "alice", JobState.SUCCEEDED, 1_700_000_000.25),
        labq_job(2, 'bo"b\\', JobState.FAILED, 1_700_000_001.0),  # a user whose name JSON escapes
        labq_job(3, "zoë", JobState.CANCELLED, None),  # no end: a job of an older labq
        labq_job(4, "dora", JobState.FAILED, 1.5e9, env=tricky_env),  # the times' keys in its environment
        labq_job(5, "eve", JobState.SUCCEEDED, 1_700_000_002.0),
        labq_job(9, "ida", JobState.SUCCEEDED, 1_700_000_003),  # a whole number stays one
    ]
    lines = [encode_line({"seq": 1, "job": doc}) for doc in docs]
    lines += [
        encode_line({"seq": 2, "job": labq_job(5, "eve", JobState.SUCCEEDED, 1_700_000_009.0)}),  # its later line
        b'{"seq":2,"job":{"state":"failed","spec":{"user":"fay"},"id":6,"ended_at":17}}',  # another shape
        b'{"seq":2,"job":{"id":7,"state":"failed","spec":{"user":"gus"}}}',  # labq's head, no times
        b'{"seq":2,"job":{"id":8,"sta',  # damaged
        b'{"seq":3,"deleted":1}',
        encode_line({"seq": 9, "job": labq_job(10, "hal", JobState.FAILED, 1.0)}),  # of a commit not made yet
    ]
    (folder / "jobs-2023-11.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    (folder / "jobs-2023-12.jsonl").write_bytes(encode_line({"seq": 3, "job": docs[0]})[:-9])  # torn: no newline
    archive = Archive(folder, Disk())
    decoded = decoding(monkeypatch)

    listed = sorted(archive.ended(committed=3))
    assert len(decoded) == 3, decoded  # the line of another shape, the one with no times, the damaged one
    monkeypatch.undo()
    assert listed == as_decoded(archive, committed=3)
    assert listed == [Ended(2, "failed", 'bo"b\\', 1_700_000_001.0), Ended(3, "cancelled", "zoë", None),
                      Ended(4, "failed", "dora", 1.5e9), Ended(5, "succeeded", "eve", 1_700_000_009.0),
                      Ended(6, "failed", "fay", 17), Ended(7, "failed", "gus", None),
                      Ended(9, "succeeded", "ida", 1_700_000_003)]
    assert [type(e.ended_at) for e in listed if e.ended_at is not None] == [float, float, float, int, int]
    for user in ('bo"b\\', "zoë", "fay", "gus", "eve", "ida", "alice", "nobody"):
        assert sorted(archive.ended(committed=3, user=user)) == [e for e in listed if e.user == user], user
    (folder / "jobs-2024-01.jsonl").write_bytes(  # a line of another writer's JSON: its user escaped as ASCII
        json.dumps({"seq": 3, "job": labq_job(11, "zoë", JobState.FAILED, 2e9)}, separators=(",", ":")).encode()
        + b"\n")
    assert [e.id for e in archive.ended(committed=3, user="zoë")] == [3, 11]
    assert sorted(archive.ended(committed=1)) == as_decoded(archive, committed=1)
    assert [e.id for e in sorted(archive.ended(committed=1))] == [1, 2, 3, 4, 5, 9]


def test_reading_some_jobs_decodes_only_their_lines(tmp_path, monkeypatch):
    folder = tmp_path / "archive"
    folder.mkdir()
    lines = [encode_line({"seq": 1, "job": labq_job(i, "alice", JobState.SUCCEEDED, 1_700_000_000.0 + i)})
             for i in range(1, 101)]
    lines += [b'{"seq":2,"job":{"state":"failed","spec":{"user":"fay"},"id":200}}', b'{"seq":2,"deleted":7}']
    (folder / "jobs-2023-11.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    archive = Archive(folder, Disk())
    decoded = decoding(monkeypatch)

    assert sorted(d["id"] for d in archive.read(committed=2, ids={7, 42, 200, 300})) == [42, 200]
    # 7's and 42's lines, the line of another shape, and the deletion: 4 of 102
    assert sorted(decoded) == sorted(line + b"\n" for line in [lines[6], lines[41], *lines[-2:]])
