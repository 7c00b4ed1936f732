"""Going back to the last sound state when the data is damaged, after saying what is lost.

The sound state is a snapshot (``labq.json``, or ``labq.json.prev`` when that is damaged) and the
journal records after it up to the first damaged one. A damaged snapshot alone loses nothing: the
journals kept reach back to the previous snapshot. Damage inside a journal loses the commits from
there on.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from labq.store.archive import Archive
from labq.store.check import recover_hint
from labq.store.contract import StoreError
from labq.store.data_folder import ARCHIVE_DIR, DB_NAME, PREVIOUS_NAME, take_leader_lock
from labq.store.files import Disk, replace_atomically
from labq.store.hot import HotState
from labq.store.journal import ids_mentioned, journal_files, read_journal
from labq.store.replay import Journaled
from labq.store.snapshot import decode


@dataclass(frozen=True)
class RecoveryPlan:
    data_dir: Path
    problem: str  #: what is wrong with the data now
    source: str  #: the snapshot the sound state starts from
    source_seq: int
    good_seq: int  #: the last sound commit
    good_jobs: int
    good_next_job_id: int
    resume_job_id: int  #: ids continue from here: past anything a lost commit handed out
    lost_archive: tuple[dict, ...]  #: archive lines of later commits, which are dropped
    #: the archive lines of the sound commits after the snapshot, from the journal (a crash may have lost them from
    #: the archive's files, which a store syncs only at its next snapshot): recovering writes them again
    journaled: Journaled
    state: HotState  #: the sound state, which recovering writes as the snapshot

    def describe(self) -> str:
        journal = (f" and the journal after it up to commit {self.good_seq}" if self.good_seq > self.source_seq
                   else "")
        lines = [
            f"The database is damaged: {self.problem.splitlines()[0]}",
            f"The last sound state ({self.source}, commit {self.source_seq}{journal}) holds commit "
            f"{self.good_seq}: {self.good_jobs} unfinished job(s), next job id {self.good_next_job_id}.",
            "Recovering makes it the database. Lost: whatever was committed after it "
            "(the damaged files are kept beside it, renamed, for inspection).",
            f"Job ids continue from {self.resume_job_id}, past any id a lost commit handed out.",
        ]
        finished = sorted({e["job"]["id"] for e in self.lost_archive if "job" in e})
        deleted = sorted({e["deleted"] for e in self.lost_archive if "deleted" in e})
        if finished:
            lines.append(f"Also lost: the archive records of finished job(s) {', '.join(map(str, finished))} "
                         f"written by those later commits.")
        if deleted:
            lines.append(f"Also lost: the deletion of job(s) {', '.join(map(str, deleted))}.")
        return "\n".join(lines)


def plan_recovery(data_dir: str | os.PathLike) -> RecoveryPlan:
    """What recovering would do; raises StoreError when there is nothing to do or nothing to go back to."""
    data_dir = Path(data_dir)
    current, previous = data_dir / DB_NAME, data_dir / PREVIOUS_NAME
    problem = None
    try:
        if not current.exists():
            raise StoreError(f"{current} is missing")
        state, source = HotState(decode(current.read_bytes(), current)), DB_NAME
    except StoreError as err:
        problem = str(err)
        if not previous.exists():
            raise StoreError(f"there is no previous copy ({previous}) to recover from", recover_hint(data_dir))
        try:
            state, source = HotState(decode(previous.read_bytes(), previous)), PREVIOUS_NAME
        except StoreError as again:
            raise StoreError(f"the previous copy is damaged too: {again.args[0]}", recover_hint(data_dir)) from None
    source_seq = state.seq
    journaled = Journaled(after=state.seq)
    journal_problem, mentioned = _replay_until_damage(state, data_dir, journaled)
    if problem is None and journal_problem is None:
        raise StoreError(f"{current} and its journal are fine: there is nothing to recover")
    lost = Archive(data_dir / ARCHIVE_DIR, Disk()).after(state.seq)
    # with commits lost, ids continue past any they may have handed out: what the sound ones reserved, and any
    # id a later record names (its digits may be the damage: the reservation covers that)
    resume = state.next_job_id if journal_problem is None else max(state.next_job_id, state.reserved, mentioned)
    return RecoveryPlan(data_dir, problem or journal_problem or "", source, source_seq, state.seq, len(state.jobs),
                        state.next_job_id, resume, tuple(e for e in lost if not e.get("torn")), journaled,
                        state)


def _replay_until_damage(state: HotState, data_dir: Path,
                         journaled: Journaled) -> tuple[str | None, int]:
    """Take the sound records after ``state`` (and what they say of the archive into ``journaled``); what stopped
    them (None: nothing), and the highest job id the records after that point may have handed out."""
    journals = journal_files(data_dir)
    for number, (_, path) in enumerate(journals):
        read = read_journal(path, last=number == len(journals) - 1, upto_damage=True)
        for index, record in enumerate(read.records):
            if record["seq"] <= state.seq:
                continue
            if record["seq"] != state.seq + 1:
                later = b"".join(p.read_bytes() for _, p in journals[number:])
                return (f"{path} goes on from commit {record['seq']}, after commit {state.seq}: "
                        f"commits are missing", ids_mentioned(later))
            state.take(record)
            journaled.take(record)
        if read.damage is not None:
            later = read.rest + b"".join(p.read_bytes() for _, p in journals[number + 1:])
            return str(read.damage), ids_mentioned(later)
    return None, 0


def recover(plan: RecoveryPlan, disk: Disk | None = None) -> Path | None:
    """Write the sound state as the database and move the journals aside; return where a damaged database
    file was kept (None when the database file itself was sound or missing)."""
    disk = disk or Disk()
    lock = take_leader_lock(plan.data_dir)
    try:
        current = plan.data_dir / DB_NAME
        stamp = time.strftime('%Y%m%dT%H%M%S')
        kept = None
        if current.exists() and plan.source != DB_NAME:
            kept = plan.data_dir / f"{DB_NAME}.damaged-{stamp}"
            os.link(current, kept)
        plan.state.next_job_id = plan.resume_job_id
        # the archive as of the sound state, durable before the journals that carry its last lines are moved aside
        Archive(plan.data_dir / ARCHIVE_DIR, disk).rewrite_after(plan.journaled.after, plan.journaled.lines)
        snapshot = plan.state.capture()
        replace_atomically(current, snapshot.encode(), disk)
        journals = journal_files(plan.data_dir)
        if journals:  # all in the new database up to the damage; the rest is lost: kept for inspection
            aside = plan.data_dir / f"journals-before-recovery-{stamp}"
            aside.mkdir(exist_ok=True)
            for _, path in journals:
                os.rename(path, aside / path.name)
            disk.fsync_folder(plan.data_dir)
        return kept
    finally:
        os.close(lock)
