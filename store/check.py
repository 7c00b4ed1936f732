"""A read-only look at a data folder: are the snapshot and its journals sound, is there a good previous copy."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from labq.store.contract import JOBS, META, StoreError
from labq.store.journal import JournalDamaged, journal_files, read_journal
from labq.store.tinydb_store import ARCHIVE_DIR, DB_NAME, PREVIOUS_NAME, decode


@dataclass(frozen=True)
class FileReport:
    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict:
        return {"file": self.name, "ok": self.ok, "detail": self.detail}


def check_data_dir(data_dir: str | os.PathLike) -> list[FileReport]:
    """Report on the database, its previous copy and the archive; changes nothing."""
    data_dir = Path(data_dir)
    reports = [_database(data_dir / DB_NAME), _database(data_dir / PREVIOUS_NAME)]
    journals = journal_files(data_dir)
    reports += [_journal(path, last=number == len(journals) - 1) for number, (_, path) in enumerate(journals)]
    archive = data_dir / ARCHIVE_DIR
    files = sorted(archive.glob("jobs-*.jsonl")) if archive.is_dir() else []
    lines = 0
    for path in files:
        with open(path, "rb") as f:
            lines += sum(1 for _ in f)
    reports.append(FileReport(ARCHIVE_DIR, True, f"{len(files)} file(s), {lines} record(s)"))
    return reports


def _database(path: Path) -> FileReport:
    if not path.exists():
        return FileReport(path.name, False, "missing")
    try:
        data = decode(path.read_bytes(), path)
    except StoreError as err:
        return FileReport(path.name, False, str(err).splitlines()[0])
    meta = data[META]["1"]
    return FileReport(path.name, True, f"commit {meta['seq']}, {len(data.get(JOBS, {}))} unfinished job(s), "
                                       f"next job id {meta['next_job_id']}")


def _journal(path: Path, *, last: bool) -> FileReport:
    try:
        read = read_journal(path, last=last)
    except JournalDamaged as err:
        return FileReport(path.name, False, f"damaged at byte {err.offset}: {err.what}")
    if not read.records:
        detail = "no commits"
    else:
        detail = f"commits {read.records[0]['seq']} to {read.records[-1]['seq']}"
    if read.torn:
        detail += "; a torn last record (a crash mid-append, never acknowledged): cut off at the next start"
    return FileReport(path.name, True, detail)
