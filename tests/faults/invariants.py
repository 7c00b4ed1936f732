"""The invariants of issue 13, each a function named after what it asserts.

They read the leader's API for what it acknowledged and the machine itself for what
runs: a job's processes carry ``LABQ_JOB_ID`` and ``LABQ_ATTEMPT`` in their
environment (a container's processes too, seen from the host's /proc), and this lab's
jobs carry its folder in ``LABQ_CHECKPOINT_DIR``. A host job runs in a session of its
own (its shim starts it so); a container job in a pid namespace of its own. So a *live
run* of a job is one session, or one container, holding processes of that job.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from labq.protocol.errors import ApiError
from tests.faults.counts import FaultCounts

# -- what the leader acknowledged ---------------------------------------------------------------


@dataclass
class Ledger:
    """Every submit the test sent and how the leader answered it.

    ``acked``: a 201 with an id, so the job must exist for good. ``refused``: an error answer,
    so it must not exist. ``in_doubt``: no answer (the leader died meanwhile), so either.
    """

    acked: list[tuple[int, dict]] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)
    in_doubt: list[dict] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    listed: int | None = None  #: acknowledgements before the last ``all_jobs`` listing

    def submit(self, client, command: list[str], **fields) -> int | None:
        """Submit a job tagged with a fresh ``FAULT_TAG``; its id if the leader acknowledged it."""
        body = {"command": command, **fields}
        body["env"] = {**body.get("env", {}), "FAULT_TAG": uuid.uuid4().hex}
        try:
            job = client.submit(body)
        except ApiError as err:
            with self._lock:
                (self.in_doubt if err.status == 0 else self.refused).append(body)
            return None
        with self._lock:
            self.acked.append((job["id"], body))
        return job["id"]

    def acked_ids(self) -> list[int]:
        with self._lock:
            return [job_id for job_id, _ in self.acked]


def all_jobs(client, ledger: Ledger | None = None) -> list[dict]:
    """Every job the leader knows, unfinished and archived.

    With ``ledger``, the acknowledgements received before the listing was asked for are noted in it
    (``ledger.listed``): a submit acknowledged while the listing was on its way may be missing from it.
    """
    if ledger is not None:
        with ledger._lock:
            ledger.listed = len(ledger.acked)
    return client.jobs(all=True, history=True)


def assert_every_acked_job_present(jobs: list[dict], ledger: Ledger, counts: FaultCounts) -> None:
    """Every submit the leader answered with an id is a job with that id and the spec sent."""
    by_id = {j["id"]: j for j in jobs}
    with ledger._lock:
        assert ledger.listed is not None, "list the jobs with all_jobs(client, ledger) first"
        acked = ledger.acked[:ledger.listed]  # those acknowledged before the listing was asked for
        ledger.listed = None
    missing, changed = [], []
    for job_id, body in acked:
        job = by_id.get(job_id)
        if job is None:
            missing.append(job_id)
            continue
        spec = job["spec"]
        sent = {"command": body["command"], "env": body["env"], "gpus": body.get("gpus", 1),
                "name": body.get("name", spec["name"]), "depends_on": body.get("depends_on", []),
                "image": body.get("image")}
        held = {"command": spec["command"], "env": {k: spec["env"].get(k) for k in body["env"]},
                "gpus": spec["gpus"], "name": spec["name"], "depends_on": spec["depends_on"], "image": spec["image"]}
        if sent != held:
            changed.append((job_id, sent, held))
    counts.acked_jobs_checked = max(counts.acked_jobs_checked, len(acked))  # distinct: a ledger only grows
    assert not missing, f"acknowledged jobs missing: {missing} (of {len(acked)} acknowledged)"
    assert not changed, f"acknowledged jobs whose spec changed: {changed[:3]}"


def assert_refused_submits_absent(jobs: list[dict], ledger: Ledger) -> None:
    """A submit the leader refused left no job behind."""
    tags = {j["spec"]["env"].get("FAULT_TAG") for j in jobs}
    with ledger._lock:
        present = [b["env"]["FAULT_TAG"] for b in ledger.refused if b["env"]["FAULT_TAG"] in tags]
    assert not present, f"{len(present)} refused submits became jobs anyway"


def assert_no_id_reused(jobs: list[dict], ledger: Ledger, counts: FaultCounts) -> None:
    """No id was acknowledged twice, the leader lists each id once, and no one submit became two jobs."""
    acked = Counter(ledger.acked_ids())
    listed = Counter(j["id"] for j in jobs)
    tags = Counter(j["spec"]["env"]["FAULT_TAG"] for j in jobs if "FAULT_TAG" in j["spec"]["env"])
    reused = {i: n for i, n in acked.items() if n > 1} | {i: n for i, n in listed.items() if n > 1}
    doubled = {t: n for t, n in tags.items() if n > 1}
    counts.duplicates_found += len(reused) + len(doubled)
    assert not reused, f"job ids acknowledged or listed more than once: {reused}"
    assert not doubled, f"one submit became several jobs: {doubled}"


# -- what runs on the machine -------------------------------------------------------------------


@dataclass(frozen=True)
class LiveRun:
    job_id: int
    attempt: int
    where: str  #: "session PID" on the host, "container pid:[INODE]" in a container


_OWN_PIDNS = os.readlink("/proc/self/ns/pid")


def live_runs(root: Path) -> dict[int, set[LiveRun]]:
    """The live runs of this lab's jobs, by job id, from every process on the machine."""
    marker = str(root)
    runs: dict[int, set[LiveRun]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = entry.name
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/environ", "rb") as f:
                raw = f.read()
            if b"LABQ_JOB_ID=" not in raw:
                continue
            env = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
            if not env.get("LABQ_CHECKPOINT_DIR", "").startswith(marker):
                continue
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if fields[0] in (b"Z", b"X"):
                continue
            pidns = os.readlink(f"/proc/{pid}/ns/pid")
            where = f"session {int(fields[3])}" if pidns == _OWN_PIDNS else f"container {pidns}"
            run = LiveRun(int(env["LABQ_JOB_ID"]), int(env.get("LABQ_ATTEMPT", 0)), where)
            runs.setdefault(run.job_id, set()).add(run)
    return runs


def assert_at_most_one_live_run(root: Path, counts: FaultCounts) -> dict[int, set[LiveRun]]:
    """No job runs twice anywhere in the lab (two attempts, or one attempt started twice)."""
    runs = live_runs(root)
    doubled = {j: sorted(r, key=str) for j, r in runs.items() if len(r) > 1}
    counts.duplicates_found += len(doubled)
    assert not doubled, f"jobs with more than one live run: {doubled}"
    return runs


class LiveRunWatch:
    """Looks at the machine every ``every`` seconds in the background, so a double run between two
    rounds' checks is caught too; ``check`` fails with the first one seen."""

    def __init__(self, root: Path, counts: FaultCounts, every: float = 0.2) -> None:
        self.root, self.counts, self.every = root, counts, every
        self.seen: list[tuple[float, dict]] = []
        self.looks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="live-run-watch", daemon=True)

    def __enter__(self) -> LiveRunWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            runs = live_runs(self.root)
            self.looks += 1
            doubled = {j: sorted(map(str, r)) for j, r in runs.items() if len(r) > 1}
            if doubled:
                self.seen.append((time.time(), doubled))

    def check(self) -> None:
        jobs = {j for _, doubled in self.seen for j in doubled}
        self.counts.duplicates_found += len(jobs)
        assert not self.seen, (f"jobs with more than one live run, seen in {len(self.seen)} of {self.looks} looks: "
                               f"first {self.seen[0]}")


# -- what a fault must not do -------------------------------------------------------------------


def assert_no_running_job_stopped_by_leader_restart(jobs: list[dict], before: dict[int, LiveRun],
                                                    runs: dict[int, set[LiveRun]]) -> None:
    """The jobs running before the leader went down run on: same attempt, same run, nothing ended."""
    assert_runs_unchanged(jobs, before, runs, "a leader restart")


def assert_runs_unchanged(jobs: list[dict], before: dict[int, LiveRun], runs: dict[int, set[LiveRun]],
                          fault: str) -> None:
    """Each job of ``before`` still runs as it did: its attempt, its one live run, no attempt ended."""
    by_id = {j["id"]: j for j in jobs}
    for job_id, run in before.items():
        job = by_id[job_id]
        assert (job["state"], job["attempt"], job["attempts"]) == ("running", run.attempt, []), (
            f"job {job_id} was stopped or requeued across {fault}: state {job['state']}, "
            f"attempt {job['attempt']}, ended attempts {job['attempts']}")
        assert runs.get(job_id) == {run}, f"across {fault}, job {job_id} ran as {run}, now as {runs.get(job_id)}"


def assert_nothing_fenced(jobs: list[dict], only: set[int] | None = None) -> None:
    """No attempt (of the jobs ``only``, or of any job) ended as lost: no node was fenced or given up on."""
    lost = {j["id"]: [a["attempt"] for a in j["attempts"] if a["ended"] == "lost"] for j in jobs
            if only is None or j["id"] in only}
    lost = {k: v for k, v in lost.items() if v}
    assert not lost, f"attempts fenced or lost: {lost}"


def assert_lease_not_renewed_while_partitioned(last_seen: float, cut_at: float, in_flight_s: float = 0.5) -> None:
    """Nothing but the node's own syncs renews its lease: once it is cut off, the leader hears nothing new
    (a sync already on its way when the link went down may land just after)."""
    assert last_seen <= cut_at + in_flight_s, (
        f"the leader heard from a cut-off node {last_seen - cut_at:.1f} s after its link went down")


def assert_node_lost_after_lease(lost_seen_at: float | None, last_seen: float, lease_s: float, slack_s: float,
                                 looked_until: float) -> None:
    """A silent node is marked lost once its lease runs out from its last sync: not before, and not long after."""
    assert lost_seen_at is not None, (f"node not marked lost {looked_until - last_seen:.1f} s after its last sync "
                                      f"(lease {lease_s:g} s)")
    silent = lost_seen_at - last_seen
    assert silent > lease_s, f"node marked lost {silent:.1f} s after its last sync, inside its {lease_s:g} s lease"
    assert silent <= lease_s + slack_s, (f"node marked lost only {silent:.1f} s after its last sync "
                                         f"(lease {lease_s:g} s, allowed {lease_s + slack_s:g} s)")


def assert_lost_node_requeued_only_after_requeue_after(job: dict, attempt: int, last_seen: float,
                                                       requeue_after_s: float) -> None:
    """The lost node's attempt ended as lost, and no sooner than requeue_after after the node's last sync."""
    ended = next((a for a in job["attempts"] if a["attempt"] == attempt), None)
    assert ended is not None, f"job {job['id']} attempt {attempt} has not ended: {job['state']}"
    assert ended["ended"] == "lost", f"job {job['id']} attempt {attempt} ended {ended['ended']}, not lost"
    waited = ended["ended_at"] - last_seen
    assert waited >= requeue_after_s, (f"job {job['id']} requeued {waited:.1f} s after its node's last sync, "
                                       f"before requeue_after ({requeue_after_s:g} s)")


def assert_stale_run_stopped_on_return(root: Path, job_id: int, stale_attempt: int) -> None:
    """Once the lost node is back, nothing of the job's old attempt runs anywhere."""
    stale = [r for r in live_runs(root).get(job_id, ()) if r.attempt == stale_attempt]
    assert not stale, f"job {job_id}'s stale attempt {stale_attempt} still runs after its node came back: {stale}"
