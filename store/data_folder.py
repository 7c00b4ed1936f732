"""The leader's data folder: which file is what, and the lock its one leader holds.

Layout of the data folder::

    labq.json        the snapshot (TinyDB's JSON format): unfinished jobs, reservations,
                     users, ...; a checksummed ``_meta`` table with the schema version,
                     the commit it holds and the next job id
    labq.json.prev   the snapshot before it
    journal-*.log    every commit after the previous snapshot, one checksummed record
                     each (``labq.store.journal``), named by the first commit it holds
    archive/         finished jobs, one JSON-lines file a month
    leader.lock      held by the one process that writes
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from labq.store.contract import StoreLocked

DB_NAME = "labq.json"
PREVIOUS_NAME = "labq.json.prev"
LOCK_NAME = "leader.lock"
ARCHIVE_DIR = "archive"


def take_leader_lock(data_dir: Path) -> int:
    """Hold the data folder for this process; refuse if another leader has it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StoreLocked(f"another labq process (pid {holder}) is using {data_dir}",
                          "Only one leader may write a data folder. Stop the other one first.") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd
