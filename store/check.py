"""A read-only look at a data folder: are the snapshot and its journals sound, is there a good previous copy, and
what to do about damage (``recover_hint``): only steps that work there."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from labq.store.contract import JOBS, META, StoreError
from labq.store.data_folder import ARCHIVE_DIR, DB_NAME, PREVIOUS_NAME
from labq.store.journal import JournalDamaged, journal_files, read_journal
from labq.store.snapshot import decode


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


def recover_hint(data_dir: Path, *, checked: bool = False) -> str:
    """What to do about a damaged database in ``data_dir``: only steps that work there.

    It looks at the previous copy (reading only): ``--recover`` is suggested only when that
    copy is sound, else a restore from a backup. ``checked``: said after ``labq store check``.
    """
    lines = [] if checked else ["Nothing was changed. To see which files are sound: "
                                f"labq store check --data-dir {data_dir}"]
    problem = previous_copy_problem(data_dir)
    if problem is None or _sound(data_dir / DB_NAME):
        return "\n".join(lines + [
            "To go back to the last sound state (a sound copy of the database and the journal up to the damage) "
            "and start, run:",
            f"    labq leader --recover --data-dir {data_dir}",
            f"(or labq store recover --data-dir {data_dir} to recover without starting). "
            f"Both say what will be lost before they do anything."])
    archive = data_dir / ARCHIVE_DIR
    return "\n".join(lines + [
        f"The previous copy, {data_dir / PREVIOUS_NAME}, {problem}: there is no good copy here to go back to.",
        "Restore the data folder from a backup made with `labq store backup`:",
        f"    labq store restore BACKUP --data-dir {data_dir} --force",
        f"where BACKUP is the backup's folder. The files it replaces (the database, the previous copy and "
        f"the archive of finished jobs, {archive}) are moved into {data_dir}/replaced-<time>/, not deleted.",
        f"Without a backup: move {data_dir} aside and start a new lab; the finished jobs stay readable, "
        f"one JSON line each, in the archive files it had ({archive}/jobs-YYYY-MM.jsonl)."])


def _sound(path: Path) -> bool:
    try:
        decode(path.read_bytes(), path)
    except (OSError, StoreError):
        return False
    return True


def previous_copy_problem(data_dir: Path) -> str | None:
    """What is wrong with the previous copy ("is missing", "is damaged too"); None if it is sound."""
    previous = data_dir / PREVIOUS_NAME
    try:
        raw = previous.read_bytes()
    except FileNotFoundError:
        return "is missing"
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    try:
        decode(raw, previous)
    except StoreError:
        return "is damaged too"
    return None
