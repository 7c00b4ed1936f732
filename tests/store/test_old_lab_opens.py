"""A lab's data folder written by an earlier labq opens, and reads the same: its stored documents never change.

``data/old_lab`` is the store of a real lab (a leader, two agents on ``sim:ws-4x3090``, jobs submitted through the
CLI) made by labq at commit 4a6b884 and stopped cleanly: the snapshot ``labq.json``, its previous copy, the journal
of every commit (the previous copy, of the new lab, needs it) and the archive of finished jobs. Its jobs between
them set every field of a job spec that a submit can set; ``cpus`` and ``memory_mib`` no submit sets, and they are
stored as null. ``expected.json`` is every job as that labq's store loaded it (unfinished and archived) and as its
codec decoded and encoded it again (``encode_job(decode_job(doc))``; for that labq the same as the stored document),
in order of id, with the keys in the order that labq wrote them: the archive reads a job's head by that order
(the job's own keys, and the spec's first; see the test of that order).

Opening the store writes nothing of it: a clean stop compacted, so the journal after the snapshot is empty, nothing
is replayed and nothing of the archive is written again; closing compacts only when a commit came since.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from labq.leader.auth import Principal
from labq.leader.config import LeaderConfig
from labq.leader.core import Leader
from labq.protocol.codec import decode_job, encode_job
from labq.store import PutJob, TinyDBStore, plan_recovery, recover

FIXTURE = Path(__file__).parent / "data" / "old_lab"
EXPECTED = FIXTURE / "expected.json"
#: what the fixture's folder holds besides the data folder itself
NOT_DATA = ("expected.json", "README.md")
LOCK = "leader.lock"  #: made by whoever opens the folder; no document

#: the fixture as made: 25 jobs (ids 1-27; 6 and 11 are the ids of an array and a grid, no job's), by state
STATES = {
    1: "succeeded", 2: "succeeded", 3: "failed", 4: "timeout", 5: "succeeded",
    7: "succeeded", 8: "succeeded", 9: "succeeded", 10: "succeeded",  # array 6: --array 0-3%2
    12: "succeeded", 13: "succeeded", 14: "succeeded", 15: "succeeded",  # grid 11: --grid lr=.. --grid seed=..
    16: "running", 17: "queued", 18: "queued", 19: "queued", 20: "held", 21: "queued",
    22: "cancelled", 23: "cancelled", 24: "running", 25: "cancelled", 26: "succeeded", 27: "cancelled",
}
UNFINISHED = {16, 17, 18, 19, 20, 21, 24}

#: every key of a stored spec, with what a job stores that did not set it (the lab's default grace was 2 s)
SPEC_UNSET = {
    "user": None, "gpus": 1, "name": "", "image": None, "workdir": None, "nodes": 1, "min_gpu_memory_mib": 0,
    "gpu_model": None, "node": None, "priority": 200, "preemptible": True, "time_limit_s": None,
    "checkpoint_signal": None, "grace_s": 2.0, "reservation": None, "shm_size_mib": 1024,
    "requeue_on_timeout": False, "after_any": False, "queue": None, "runtime": "process", "after_reservation": "queue",
    "command": None, "env": {}, "mounts": [], "depends_on": [],
}
#: keys a stored spec has only when set
SPEC_WHEN_SET = ("notify", "share_mib", "array")
#: keys no submit sets: stored as null in every job
SPEC_NEVER_SET = ("cpus", "memory_mib")
ABSENT = object()


def data_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    shutil.copytree(FIXTURE, folder, ignore=shutil.ignore_patterns(*NOT_DATA))
    return folder


def on_disk(folder: Path) -> dict[str, bytes]:
    """Every file of a data folder, by path inside it, but the lock."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != LOCK and str(p.relative_to(folder)) not in NOT_DATA}


def snapshot_meta(name: str) -> dict:
    return json.loads((FIXTURE / name).read_text())["_meta"]["1"]


def expected() -> list[dict]:
    return json.loads(EXPECTED.read_text())


def loaded(folder: Path) -> tuple[dict[int, dict], list[dict]]:
    """The unfinished jobs' documents and the archived ones, as the store loads them."""
    with TinyDBStore(folder) as store:
        return store.load().jobs, store.history()


def assert_as_expected(docs: list[dict]) -> None:
    """``docs`` are the fixture's jobs: each as stored, and decoded and encoded again, is what expected.json has."""
    want = {doc["id"]: doc for doc in expected()}
    assert sorted(doc["id"] for doc in docs) == sorted(want)
    for doc in docs:
        assert doc == want[doc["id"]], f"job {doc['id']} as stored"
        assert encode_job(decode_job(doc)) == want[doc["id"]], f"job {doc['id']} decoded and encoded again"


def test_the_fixture_is_what_it_says():
    """Not vacuous: the jobs, their states and that every spec field a submit sets is set by at least one job."""
    jobs = expected()
    assert [j["id"] for j in jobs] == sorted(STATES)
    assert {j["id"]: j["state"] for j in jobs} == STATES
    specs = [j["spec"] for j in jobs]
    for spec in specs:
        assert set(spec) <= set(SPEC_UNSET) | set(SPEC_WHEN_SET) | set(SPEC_NEVER_SET), spec
        assert set(SPEC_UNSET) | set(SPEC_NEVER_SET) <= set(spec), spec
        assert all(spec[key] is None for key in SPEC_NEVER_SET), spec
    for key, unset in SPEC_UNSET.items():
        assert any(spec.get(key, ABSENT) not in (unset, ABSENT) for spec in specs), f"no job sets {key}"
        if unset is not None:
            assert any(spec[key] == unset for spec in specs), f"every job sets {key}"
    for key in SPEC_WHEN_SET:
        assert any(key in spec for spec in specs), f"no job sets {key}"
    by_id = {j["id"]: j for j in jobs}
    first = by_id[1]["spec"]  # the submit of many flags: --gpus 2 --gpu-mem 10G --gpu-model 3090 --node ws1 ...
    assert (first["gpus"], first["min_gpu_memory_mib"], first["gpu_model"], first["node"], first["priority"],
            first["preemptible"], first["time_limit_s"], first["requeue_on_timeout"], first["checkpoint_signal"],
            first["grace_s"], first["queue"], first["env"], first["notify"]) == (
        2, 10240, "3090", "ws1", 300, False, 3600.0, True, "SIGUSR1", 3.0, "nlp", {"A": "1", "B": "two words"},
        ["end", "fail"])
    assert by_id[2]["spec"]["nodes"] == 2 and len(by_id[2]["placement"]["allocations"]) == 2
    assert by_id[5]["spec"]["share_mib"] == 4096 and by_id[5]["spec"]["min_gpu_memory_mib"] == 0
    boxed = by_id[19]["spec"]
    assert (boxed["runtime"], boxed["image"], boxed["shm_size_mib"], boxed["mounts"], boxed["depends_on"]) == (
        "docker", "busybox:latest", 2048, [{"source": "/tmp/oldlab_work/mnt", "target": "/data", "read_only": True}],
        [16])
    assert (by_id[18]["spec"]["after_any"], by_id[18]["spec"]["depends_on"]) == (True, [16, 3])
    assert (by_id[21]["spec"]["reservation"], by_id[21]["spec"]["after_reservation"]) == ("paper", "cancel")
    assert by_id[7]["spec"]["array"] == {"id": 6, "index": 0, "cap": 2, "tasks": 4}
    assert by_id[12]["spec"]["array"] == {"id": 11, "index": 0, "cap": 3, "tasks": 4}
    assert by_id[12]["spec"]["notify"] == [] and by_id[12]["spec"]["env"]["LABQ_PARAM_LR"] == "1e-3"
    # and of the jobs' lives: attempts that ended every way a requeue or an end records, who cancelled, what was learned
    ends = {(a["ended"], a["stop_reason"]) for j in jobs for a in j["attempts"]}
    assert {("succeeded", None), ("failed", None), ("timeout", "timeout"), ("cancelled", "cancel"),
            ("checkpointed", "preempted"), ("checkpointed", "timeout"), ("over_memory", "over_memory")} <= ends
    assert by_id[22]["cancelled_by"] == "root" and by_id[22]["spec"]["user"] == "bob"
    assert (by_id[24]["attempt"], by_id[24]["preemptions"], by_id[24]["placement"] is not None) == (2, 1, True)
    assert (by_id[26]["learned_signal"], by_id[26]["learned_from"]) == ("SIGUSR1", "job")
    assert by_id[27]["gpu_mem_peak_mib"] == 8192


def test_every_job_reads_and_encodes_as_it_was_stored(tmp_path):
    live, archived = loaded(data_copy(tmp_path))
    assert set(live) == UNFINISHED
    assert all(key == doc["id"] for key, doc in live.items())
    assert sorted(doc["id"] for doc in archived) == sorted(set(STATES) - UNFINISHED)
    assert_as_expected(list(live.values()) + archived)


def test_jobs_encoded_now_keep_the_order_the_archive_reads_them_by(tmp_path):
    """The snapshot and the journal keep documents as canonical JSON (keys sorted), but an archive line is
    ``encode_job``'s document as it is (``labq.store.archive.encode_line``), and the archive finds a job's head (id,
    state, user) and its times by where their keys are. So a job encoded now keeps the old labq's order of the job's
    own keys, its spec starts with its user, and the archive reads jobs archived again as it read the old lines.
    The spec's other keys follow their declaration (``labq.models.spec``), which no reader of JSON minds."""
    want = {doc["id"]: list(doc) for doc in expected()}
    folder = data_copy(tmp_path)
    live, archived = loaded(folder)
    again = [encode_job(decode_job(doc)) for doc in list(live.values()) + archived]
    for doc in again:
        assert list(doc) == want[doc["id"]], f"job {doc['id']}: the order of its own keys"
        assert next(iter(doc["spec"])) == "user", f"job {doc['id']}: its spec's first key"
    with TinyDBStore(folder) as store:
        old = sorted(store.ended())
    with TinyDBStore(tmp_path / "again") as store:
        store.commit([PutJob(doc) for doc in again if doc["state"] in set(STATES.values()) - {"running", "queued",
                                                                                            "held"}])
        assert sorted(store.ended()) == old and len(old) == len(archived)


def test_opening_and_closing_rewrite_nothing(tmp_path):
    folder = data_copy(tmp_path)
    before = on_disk(folder)
    assert before == on_disk(FIXTURE)
    seq = snapshot_meta("labq.json")["seq"]
    # the journal of every commit, and the next one's, empty: a clean stop
    assert {"labq.json", "labq.json.prev", "journal-000000000001.log", f"journal-{seq + 1:012d}.log",
            "archive/jobs-2026-12.jsonl"} == set(before)
    assert before[f"journal-{seq + 1:012d}.log"] == b""
    store = TinyDBStore(folder)
    try:
        store.load()
        store.history()
        assert on_disk(folder) == before, "opening the store (and reading it) changed its files"
    finally:
        store.close()
    assert on_disk(folder) == before, "closing a store with no new commit changed its files"
    assert {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()} == set(before) | {LOCK}


def test_the_old_journal_replayed_over_the_previous_copy_gives_the_same_jobs(tmp_path):
    """The journal's records, in the old labq's form: a lab whose snapshot is lost goes back to the previous copy
    (the new lab's, commit 0) and replays them all, the archive's lines included."""
    folder = data_copy(tmp_path)
    (folder / "labq.json").unlink()
    plan = plan_recovery(folder)
    assert (plan.source, plan.source_seq, plan.good_seq) == ("labq.json.prev", 0, snapshot_meta("labq.json")["seq"])
    recover(plan)
    live, archived = loaded(folder)
    assert set(live) == UNFINISHED
    assert_as_expected(list(live.values()) + archived)


def test_a_leader_opened_on_it_lists_every_job(tmp_path):
    folder = data_copy(tmp_path)
    store = TinyDBStore(folder)
    leader = Leader(LeaderConfig(host="127.0.0.1", port=0, data_dir=folder), store)
    try:
        admin = Principal("user", "root", admin=True)
        listing = leader.queue.visible(admin, user=None, states=(), everyone=True, history=True, limit=None)
        assert sorted(j.id for j in listing.jobs) == sorted(STATES)
        assert set(listing.live) == UNFINISHED
        assert_as_expected([encode_job(j) for j in listing.jobs])
        for job_id in (17, 22):  # one unfinished, one from the archive
            job, _ = leader.queue.job(admin, job_id)
            assert encode_job(job) == next(d for d in expected() if d["id"] == job_id)
    finally:
        leader.stop()
        store.close()


def test_the_snapshots_say_which_commits_they_hold():
    """As the clean stop left the folder: the snapshot holds the last commit, the previous copy the new lab."""
    last, first = snapshot_meta("labq.json"), snapshot_meta("labq.json.prev")
    assert (last["schema"], last["next_job_id"]) == (1, 28)
    assert (first["schema"], first["seq"], first["next_job_id"]) == (1, 0, 1)
    assert last["seq"] > 25
