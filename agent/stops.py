"""What the agent knows of each attempt beyond its runtime: where it checkpoints, and how it was stopped.

One small JSON file per attempt under ``state_dir/attempts/``, so that an agent
restarted in the middle of a grace period neither signals the job again nor
forgets to stop it when the grace runs out, and still reports whether it had to
(``escalated``: the job was still running when its grace ended).

A job reports a finished checkpoint by touching ``CHECKPOINT_MARKER`` in its
checkpoint folder; its modification time is the checkpoint's time. Its content,
when the job wrote one (``labq checkpoint --signal SIGUSR1``), names the signal
the job checkpoints on.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from labq.models.job import catchable_signal
from labq.protocol.agents import CHECKPOINT_MARKER, MARKER_READ_BYTES


@dataclass(frozen=True)
class AttemptNotes:
    checkpoint_dir: str | None = None
    signalled_at: float | None = None  #: when the stop's first signal went out (this machine's clock)
    grace_s: float = 0.0
    reason: str = ""
    escalated: bool = False  #: still running when the grace ran out: TERM, then KILL
    refused: str = ""  #: why it could not start, for a reason of the job's (the leader shows it as the job's)

    def checkpoint_at(self) -> float | None:
        """When the job last reported a finished checkpoint (the marker's time), if ever."""
        if self.checkpoint_dir is None:
            return None
        try:
            return os.stat(os.path.join(self.checkpoint_dir, CHECKPOINT_MARKER)).st_mtime
        except OSError:
            return None


def marker_signal(checkpoint_dir: str | None) -> str | None:
    """The signal the job named in its marker, if it did; None for no marker, no content or junk.

    The folder is the job's to write, so the marker may be anything: it is read only if it is a plain file
    (never through a symlink, never blocking on a FIFO), and only its first bytes.
    """
    if checkpoint_dir is None:
        return None
    try:
        fd = os.open(os.path.join(checkpoint_dir, CHECKPOINT_MARKER), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        content = os.read(fd, MARKER_READ_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(content) > MARKER_READ_BYTES:
        return None  # no signal's name is this long
    return catchable_signal(content.decode("ascii", "replace"))


class NotesBook:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def get(self, job_id: int, attempt: int) -> AttemptNotes:
        try:
            return AttemptNotes(**json.loads(self._path(job_id, attempt).read_text()))
        except (OSError, ValueError, TypeError):
            return AttemptNotes()

    def update(self, job_id: int, attempt: int, **changes) -> AttemptNotes:
        notes = replace(self.get(job_id, attempt), **changes)
        path = self._path(job_id, attempt)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(notes)))
        os.replace(tmp, path)
        return notes

    def forget(self, job_id: int, attempt: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(job_id, attempt).unlink()

    def _path(self, job_id: int, attempt: int) -> Path:
        return self.root / f"{job_id}.{attempt}.json"
