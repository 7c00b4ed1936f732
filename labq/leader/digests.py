"""What ``labq usage`` keeps of each month of the archive, beside it: a digest of that month's finished jobs, as
the report needs them (``labq.models.usage.JobUse``), in rows of a few numbers each.

A report that reaches back months or years reads the months the leader does not keep (``labq.leader.accounting``):
years of whole job documents, seconds of parsing. A month's digest is read in about a fifth of the time
(``bench/usage.py``); the leader makes those of the closed months as it starts. A digest names the
archive file it was made of with that file's size and modification time; when either differs (a job archived
late, a recovery that cut the file) it is stale, and the file is read again and a new digest written. The newest
file, still being written to, and a file with a damaged line (``labq store check`` reports it) get none. A digest
that cannot be read or written costs only time: the archive is read, and the trouble logged.

Digests live in ``DATA/cache/usage/``: derived, never backed up, safe to delete.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from labq.models.usage import JobUse
from labq.protocol.usage import decode_use, use_of_row, use_row
from labq.store import HistoryPart
from labq.store.files import Disk, replace_atomically

log = logging.getLogger("labq.leader")
FORMAT = 1  #: a digest of another format is stale
CACHE_DIR = "cache/usage"


class Digests:
    def __init__(self, data_dir: Path, disk: Disk | None = None) -> None:
        self.folder = Path(data_dir) / CACHE_DIR
        self.disk = disk or Disk()
        self.read_again = 0  #: parts read from the archive (no digest, or a stale one), for tests and benchmarks
        self._saving = threading.Lock()  #: two reports that read the same month write its digest one after the other

    def uses(self, part: HistoryPart, now: float) -> dict[int, JobUse | None]:
        """What a report needs of each job of ``part`` (None: deleted there): from its digest when that is fresh,
        else read from the archive (and a digest made of it, when the part is closed and whole)."""
        found = self._load(part) if part.name is not None else None
        if found is not None:
            return found
        self.read_again += 1
        docs, whole = part.read()
        found = {job_id: None if doc is None else decode_use(doc, now) for job_id, doc in docs.items()}
        if part.name is not None and part.closed and whole:
            self._save(part, found)
        return found

    def _path(self, part: HistoryPart) -> Path:
        return self.folder / f"{part.name}.usage"

    def _load(self, part: HistoryPart) -> dict[int, JobUse | None] | None:
        path = self._path(part)
        try:
            doc = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            log.warning("the usage digest %s could not be read (%s): reading the archive instead", path, err)
            return None
        if not isinstance(doc, dict) or [doc.get("format"), doc.get("of"), doc.get("size"), doc.get("mtime_ns")] != [
                FORMAT, part.name, part.size, part.mtime_ns]:
            return None  # stale: the archive file changed since
        try:
            return {row[0]: None if len(row) == 1 else use_of_row(row) for row in doc["jobs"]}
        except (KeyError, TypeError, ValueError, IndexError) as err:
            log.warning("the usage digest %s is damaged (%s): reading the archive instead", path, err)
            return None

    def _save(self, part: HistoryPart, uses: dict[int, JobUse | None]) -> None:
        rows = [[job_id] if use is None else use_row(use) for job_id, use in uses.items()]
        doc = {"format": FORMAT, "of": part.name, "size": part.size, "mtime_ns": part.mtime_ns, "jobs": rows}
        try:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            with self._saving:
                replace_atomically(self._path(part), json.dumps(doc, separators=(",", ":")).encode(), self.disk)
        except OSError as err:
            log.warning("the usage digest of %s was not written (%s): the next leader reads that month again",
                        part.name, err)
