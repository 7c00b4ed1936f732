"""What the agent knows of each attempt beyond its runtime: where it checkpoints, and how it was stopped.

One small JSON file per attempt under ``state_dir/attempts/``, so that an agent
restarted in the middle of a grace period neither signals the job again nor
forgets to stop it when the grace runs out, and still reports whether it had to
(``escalated``: the job was still running when its grace ended).

A job reports a finished checkpoint by touching ``CHECKPOINT_MARKER`` in its
checkpoint folder; its modification time is the checkpoint's time.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from labq.protocol.agents import CHECKPOINT_MARKER


@dataclass(frozen=True)
class AttemptNotes:
    checkpoint_dir: str | None = None
    signalled_at: float | None = None  #: when the stop's first signal went out (this machine's clock)
    grace_s: float = 0.0
    reason: str = ""
    escalated: bool = False  #: still running when the grace ran out: TERM, then KILL

    def checkpoint_at(self) -> float | None:
        """When the job last reported a finished checkpoint (the marker's time), if ever."""
        if self.checkpoint_dir is None:
            return None
        try:
            return os.stat(os.path.join(self.checkpoint_dir, CHECKPOINT_MARKER)).st_mtime
        except OSError:
            return None


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
