"""Going back to the last good copy when the database is damaged, after saying what is lost."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from labq.store.archive import Archive
from labq.store.contract import JOBS, META, StoreError
from labq.store.files import Disk, replace_atomically
from labq.store.tinydb_store import (
    ARCHIVE_DIR, DB_NAME, PREVIOUS_NAME, decode, encode, recover_hint, take_leader_lock,
)


@dataclass(frozen=True)
class RecoveryPlan:
    data_dir: Path
    problem: str  #: what is wrong with the database now
    good_seq: int  #: the commit the previous copy holds
    good_jobs: int
    good_next_job_id: int
    resume_job_id: int  #: ids continue from here: past anything a lost commit handed out
    lost_archive: tuple[dict, ...]  #: archive lines of later commits, which are dropped

    def describe(self) -> str:
        lines = [
            f"The database is damaged: {self.problem.splitlines()[0]}",
            f"The last good copy ({PREVIOUS_NAME}) holds commit {self.good_seq}: "
            f"{self.good_jobs} unfinished job(s), next job id {self.good_next_job_id}.",
            "Recovering makes it the database. Lost: whatever was committed after it "
            "(the damaged file is kept beside it, renamed, for inspection).",
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
    try:
        if not current.exists():
            raise StoreError(f"{current} is missing")
        decode(current.read_bytes(), current)
    except StoreError as err:
        problem = str(err)
    else:
        raise StoreError(f"{current} is fine: there is nothing to recover")
    if not previous.exists():
        raise StoreError(f"there is no previous copy ({previous}) to recover from", recover_hint(data_dir))
    try:
        good = decode(previous.read_bytes(), previous)
    except StoreError as err:
        raise StoreError(f"the previous copy is damaged too: {err.args[0]}", recover_hint(data_dir)) from None
    meta = good[META]["1"]
    lost = Archive(data_dir / ARCHIVE_DIR, Disk()).after(meta["seq"])
    return RecoveryPlan(data_dir, problem, meta["seq"], len(good.get(JOBS, {})), meta["next_job_id"],
                        meta["ids_reserved_until"], tuple(e for e in lost if not e.get("torn")))


def recover(plan: RecoveryPlan, disk: Disk | None = None) -> Path | None:
    """Make the previous copy the database; return where the damaged file was kept."""
    disk = disk or Disk()
    lock = take_leader_lock(plan.data_dir)
    try:
        current, previous = plan.data_dir / DB_NAME, plan.data_dir / PREVIOUS_NAME
        kept = None
        if current.exists():
            kept = plan.data_dir / f"{DB_NAME}.damaged-{time.strftime('%Y%m%dT%H%M%S')}"
            os.link(current, kept)
        good = decode(previous.read_bytes(), previous)
        good[META]["1"]["next_job_id"] = plan.resume_job_id
        replace_atomically(current, encode(good), disk)
        return kept
    finally:
        os.close(lock)
