"""Backing up a data folder while the leader runs, and restoring a backup into a data folder.

A backup needs no lock, so the leader keeps committing meanwhile. It reads the state as the
store would load it: the snapshot and the journal records after it (a record being appended
is torn, and left out), checked as the store checks them on open, and writes that state as the
backup's one database file. Then it copies the archive lines of the commits up to that one.
Lines are appended and fsynced before their commit's journal record, so every line of those
commits is there; lines of later commits (and one being appended, torn) are left out. So every job is in the backup exactly once: in the database if it was unfinished
at that commit, else in the archive. The backup is then read back and checked against its
manifest (``manifest.json``: when, which labq, schema, commit, files with sizes and sha256).

A restore checks the backup first, holds the leader lock of the data folder (so it refuses
while a leader runs there, and no leader starts during it), moves the files it replaces aside,
and writes the database last: an interrupted restore leaves no database, which the store
refuses to open as a new lab, and running the restore again finishes it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from labq.store.check import recover_hint
from labq.store.contract import JOBS, META, StoreError, StoreLocked
from labq.store.data_folder import ARCHIVE_DIR, DB_NAME, PREVIOUS_NAME, take_leader_lock
from labq.store.files import Disk, replace_atomically
from labq.store.journal import ids_named, journal_files
from labq.store.replay import Journaled, read_state
from labq.store.snapshot import decode, encode

MANIFEST = "manifest.json"
FORMAT = "labq-backup"
#: The leader's join token (labq.leader.auth.JOIN_TOKEN_FILE): agents of the restored lab join with it.
JOIN_TOKEN = "join-token"
_BACKED_UP = re.compile(rf"^(?:{re.escape(DB_NAME)}|{JOIN_TOKEN}|{ARCHIVE_DIR}/jobs-\d{{4}}-\d{{2}}\.jsonl)$")


class BackupError(StoreError):
    """A backup cannot be made, checked or restored; the message says why."""


@dataclass(frozen=True)
class BackedUpFile:
    path: str  #: relative to the backup folder, and to the data folder it restores into
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    created_at: float
    labq_version: str
    schema: int
    seq: int  #: the commit the backup holds
    next_job_id: int
    unfinished_jobs: int
    archive_records: int
    source: str  #: the data folder it was taken from
    files: tuple[BackedUpFile, ...]

    def as_dict(self) -> dict:
        return {"format": FORMAT, **asdict(self), "files": [asdict(f) for f in self.files]}

    @classmethod
    def read(cls, folder: Path) -> Manifest:
        path = folder / MANIFEST
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise BackupError(f"{folder} is not a labq backup: it has no {MANIFEST}") from None
        except (OSError, ValueError) as err:
            raise BackupError(f"{path} cannot be read ({err}): the backup is damaged") from None
        try:
            if doc.pop("format") != FORMAT:
                raise ValueError("not a labq backup")
            files = tuple(BackedUpFile(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in doc.pop("files"))
            return cls(**doc, files=files)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise BackupError(f"{path} is not a labq backup manifest ({err})") from None

    @property
    def created(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.created_at))


@dataclass(frozen=True)
class Restored:
    manifest: Manifest
    data_dir: Path
    next_job_id: int  #: where job ids continue
    replaced: Path | None  #: where the files it replaced were moved


# -- backing up ---------------------------------------------------------------------------------


def backup(data_dir: str | os.PathLike, dest: str | os.PathLike, *, clock=time.time) -> Manifest:
    """Copy the lab in ``data_dir`` into the new or empty folder ``dest``, consistently, and check the copy."""
    from labq import __version__

    data_dir, dest = Path(data_dir), Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupError(f"{dest} is not empty: a backup goes into a new or empty folder",
                          "Nothing was written. Choose another folder, e.g. one named by the date.")
    files, data = _snapshot(data_dir)
    unfinished, records = _check_contents(files, data, data_dir)
    meta = data[META]["1"]
    made_dest = not dest.exists()
    written: list[Path] = []
    try:
        dest.mkdir(parents=True, exist_ok=True)
        entries = []
        for name, payload in files.items():
            written.append(_write_new(dest / name, payload))
            entries.append(BackedUpFile(name, len(payload), hashlib.sha256(payload).hexdigest()))
        manifest = Manifest(clock(), __version__, meta["schema"], meta["seq"], meta["next_job_id"], unfinished,
                            records, str(data_dir.resolve()), tuple(entries))
        written.append(_write_new(dest / MANIFEST, json.dumps(manifest.as_dict(), indent=2).encode() + b"\n"))
        for folder in {p.parent for p in written}:
            Disk().fsync_folder(folder)
        check_backup(dest)
    except BaseException:
        for path in reversed(written):
            path.unlink(missing_ok=True)
        for folder in ([dest / ARCHIVE_DIR] + ([dest] if made_dest else [])):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    return manifest


def _snapshot(data_dir: Path) -> tuple[dict[str, bytes], dict]:
    """One consistent view: the database as one commit, and the archive lines up to that commit."""
    path = data_dir / DB_NAME
    if not path.exists():
        raise BackupError(f"{data_dir} has no database ({DB_NAME}): there is nothing to back up",
                          "Give the leader's data folder with --data-dir.")
    try:
        journaled = Journaled()  # the archive lines of the commits after the snapshot
        raw = read_state(data_dir, journaled).capture().encode()  # the snapshot and the journal after it: one commit
        data = decode(raw, path)
    except StoreError as err:
        raise BackupError(f"the database is damaged, and a backup of it would not restore: {err.args[0]}",
                          recover_hint(data_dir)) from None
    files = {DB_NAME: raw}
    # the journal has the lines of the commits after the snapshot, and a crash may have lost them from the files
    # (a store syncs them at its next snapshot): the files' lines up to the snapshot, then the journal's
    from_journal: dict[str, list[bytes]] = {}
    for name, line in journaled.lines:
        from_journal.setdefault(name, []).append(line + b"\n")
    names = {p.name for p in (data_dir / ARCHIVE_DIR).glob("jobs-*.jsonl")} | set(from_journal)
    for name in sorted(names):
        month = data_dir / ARCHIVE_DIR / name
        kept = _archive_up_to(month.read_bytes(), journaled.after, month) if month.exists() else b""
        kept += b"".join(from_journal.get(name, ()))
        if kept:
            files[f"{ARCHIVE_DIR}/{name}"] = kept
    token = data_dir / JOIN_TOKEN
    if token.exists():
        files[JOIN_TOKEN] = token.read_bytes()
    return files, data


def _archive_up_to(raw: bytes, seq: int, path: Path) -> bytes:
    """The whole lines of commits up to ``seq``; a damaged line inside the file is refused."""
    lines = raw.split(b"\n")
    kept = []
    for number, line in enumerate(lines[:-1], 1):  # lines[-1]: b"" or a line being appended now
        try:
            record_seq = json.loads(line)["seq"]
        except (ValueError, KeyError, TypeError):
            raise BackupError(f"{path} line {number} is damaged: not backing up a damaged archive",
                              "Look at that line: labq skips it when reading history. Remove it "
                              "(with the leader stopped) and back up again.") from None
        if record_seq <= seq:
            kept.append(line + b"\n")
    return b"".join(kept)


def _check_contents(files: dict[str, bytes], data: dict, where: Path) -> tuple[int, int]:
    """Every job once (unfinished or archived, not both), no archive line past the commit, no id past the next.

    Returns (unfinished jobs, archive records).
    """
    meta = data[META]["1"]
    hot = {int(job_id) for job_id in data.get(JOBS, {})}
    latest: dict[int, bool] = {}  # id -> archived (False: deleted since)
    records = 0
    for name in sorted(n for n in files if n.startswith(ARCHIVE_DIR + "/")):
        for number, line in enumerate(files[name].splitlines(), 1):
            try:
                record = json.loads(line)
                if record["seq"] > meta["seq"]:
                    raise BackupError(f"{where / name} line {number} is of commit {record['seq']}, "
                                      f"after the database's commit {meta['seq']}: the files do not agree")
                if "deleted" in record:
                    latest[int(record["deleted"])] = False
                else:
                    latest[int(record["job"]["id"])] = True
            except (ValueError, KeyError, TypeError):
                raise BackupError(f"{where / name} line {number} is damaged") from None
            records += 1
    both = sorted(hot & {i for i, archived in latest.items() if archived})
    if both:
        raise BackupError(f"job(s) {', '.join(map(str, both))} are both unfinished and archived in {where}: "
                          f"the database and the archive do not agree")
    too_high = sorted(i for i in hot | set(latest) if i >= meta["next_job_id"])
    if too_high:
        raise BackupError(f"job(s) {', '.join(map(str, too_high))} are at or past the next job id "
                          f"{meta['next_job_id']} in {where}")
    return len(hot), records


def _write_new(path: Path, payload: bytes) -> Path:
    path.parent.mkdir(exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


# -- checking a backup --------------------------------------------------------------------------


def check_backup(folder: str | os.PathLike) -> Manifest:
    """Read a backup and check it against its manifest and the store's own checks; raise BackupError."""
    folder = Path(folder)
    manifest = Manifest.read(folder)
    files: dict[str, bytes] = {}
    for entry in manifest.files:
        if not _BACKED_UP.match(entry.path):
            raise BackupError(f"{folder / MANIFEST} lists {entry.path!r}, which is not a file a backup holds")
        try:
            payload = (folder / entry.path).read_bytes()
        except FileNotFoundError:
            raise BackupError(f"{folder / entry.path} is missing: the backup is incomplete") from None
        digest = hashlib.sha256(payload).hexdigest()
        if len(payload) != entry.size or digest != entry.sha256:
            raise BackupError(f"{folder / entry.path} does not match the manifest ({len(payload)} bytes, sha256 "
                              f"{digest[:12]}…; the manifest says {entry.size} bytes, {entry.sha256[:12]}…): "
                              f"the backup was changed or damaged", "Nothing was changed. Use another backup.")
        files[entry.path] = payload
    if DB_NAME not in files:
        raise BackupError(f"{folder / MANIFEST} lists no {DB_NAME}: it is not a whole backup")
    try:
        data = decode(files[DB_NAME], folder / DB_NAME)
    except StoreError as err:
        raise BackupError(f"the backup's database does not open: {err}") from None
    meta = data[META]["1"]
    if (meta["seq"], meta["schema"]) != (manifest.seq, manifest.schema):
        raise BackupError(f"{folder / DB_NAME} is commit {meta['seq']} (schema {meta['schema']}), the manifest "
                          f"says commit {manifest.seq} (schema {manifest.schema})")
    _check_contents(files, data, folder)
    return manifest


# -- restoring ----------------------------------------------------------------------------------


def lab_files(data_dir: Path) -> list[str]:
    """The files of a lab in ``data_dir`` that a restore replaces (relative names)."""
    names = [n for n in (DB_NAME, PREVIOUS_NAME, JOIN_TOKEN) if (data_dir / n).exists()]
    names += [path.name for _, path in journal_files(data_dir)]
    archive = data_dir / ARCHIVE_DIR
    if archive.is_dir():
        names += [f"{ARCHIVE_DIR}/{p.name}" for p in sorted(archive.glob("jobs-*.jsonl"))]
    return names


def restore(folder: str | os.PathLike, data_dir: str | os.PathLike, *, force: bool = False,
            disk: Disk | None = None) -> Restored:
    """Put the backup in ``folder`` into ``data_dir``; refuse while a leader runs there."""
    folder, data_dir, disk = Path(folder), Path(data_dir), disk or Disk()
    manifest = check_backup(folder)
    try:
        lock = take_leader_lock(data_dir)
    except StoreLocked as err:
        raise BackupError(f"not restoring: {err.args[0]}",
                          "Nothing was changed. Stop that leader first: a restore replaces the files it writes.") \
            from None
    try:
        existing = lab_files(data_dir)
        if existing and not force:
            raise BackupError(f"{data_dir} already holds a lab ({', '.join(existing)}): not replacing it",
                              f"Nothing was changed. Add --force to replace it: the replaced files are moved into "
                              f"{data_dir}/replaced-<time>/, not deleted.")
        payloads = {entry.path: (folder / entry.path).read_bytes() for entry in manifest.files}
        for entry in manifest.files:  # again: the backup may have changed since it was checked
            if hashlib.sha256(payloads[entry.path]).hexdigest() != entry.sha256:
                raise BackupError(f"{folder / entry.path} changed while restoring", "Nothing was changed.")
        # ids continue past every id the lab it replaces names (damaged or not), so jobs submitted after the
        # backup keep ids of their own
        named = max((ids_named((data_dir / name).read_bytes()) for name in existing), default=0)
        replaced = _move_aside(data_dir, existing, disk) if existing else None
        data = decode(payloads.pop(DB_NAME), folder / DB_NAME)
        meta = data[META]["1"]
        # and, like a recovery, past those the backed-up leader had reserved (each commit reserves the next
        # ID_RESERVE): on an empty folder, that is all there is to go by
        meta["next_job_id"] = max(meta["next_job_id"], meta["ids_reserved_until"], named + 1)
        if any(name.startswith(ARCHIVE_DIR + "/") for name in payloads):
            (data_dir / ARCHIVE_DIR).mkdir(exist_ok=True)
        for name, payload in payloads.items():
            replace_atomically(data_dir / name, payload, disk)
        replace_atomically(data_dir / DB_NAME, encode(data), disk)  # last: the restore's commit point
        return Restored(manifest, data_dir, meta["next_job_id"], replaced)
    finally:
        os.close(lock)


def _move_aside(data_dir: Path, names: list[str], disk: Disk) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    aside = data_dir / f"replaced-{stamp}"
    n = 1
    while aside.exists():
        n += 1
        aside = data_dir / f"replaced-{stamp}-{n}"
    (aside / ARCHIVE_DIR).mkdir(parents=True)
    for name in names:
        os.rename(data_dir / name, aside / name)
    for folder in (aside / ARCHIVE_DIR, aside, data_dir / ARCHIVE_DIR, data_dir):
        if folder.is_dir():
            disk.fsync_folder(folder)
    return aside

