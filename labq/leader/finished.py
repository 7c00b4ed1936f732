"""How finished jobs ended, for what depends on them: a job that waits for others (``--after``), an array's notice
of how its tasks ended.

The leader learns it two ways: each job that finishes while it runs (``LabState.apply``), and, once in its life
and only when something asks for a job it does not know, the archive (``Store.ends``: a job's head, not the
whole job). That read runs outside the lab's locks (``load``): at 100,000 archived jobs it takes a twentieth of
a second, and nobody who only looks waits for it. What this leader saw finish (meanwhile too) is laid over what
it read: the leader deletes no job, so the archive never knows better.

A job's end costs one byte (a code of its state, by job id: ids are dense), not a dict's entry.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from labq.models.job import JobState

if TYPE_CHECKING:
    from labq.leader.state import LabState

_STATES = (None, *JobState)  #: a code is an index here; 0: not known to have finished
_CODES = {state: code for code, state in enumerate(_STATES) if state is not None}
_KNOWN = re.compile(rb"[^\x00]+")  #: runs of codes of known jobs


class FinishedStates(Mapping[int, JobState]):
    """Job id -> the state it ended in, for the finished jobs known (``loaded``: the archive's too)."""

    def __init__(self) -> None:
        self._codes = bytearray()
        self.loaded = False  #: the archive was read in
        self._loading: threading.Event | None = None  #: set once the read that is under way is in

    def __setitem__(self, job_id: int, state: JobState) -> None:
        if job_id >= len(self._codes):
            self._codes.extend(bytes(max(job_id + 1 - len(self._codes), len(self._codes) // 2)))
        self._codes[job_id] = _CODES[state]

    def __getitem__(self, job_id: int) -> JobState:
        state = _STATES[self._codes[job_id]] if 0 <= job_id < len(self._codes) else None
        if state is None:
            raise KeyError(job_id)
        return state

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, int) and 0 <= job_id < len(self._codes) and self._codes[job_id] != 0

    def __iter__(self) -> Iterator[int]:
        return (job_id for job_id, code in enumerate(self._codes) if code)

    def __len__(self) -> int:
        return len(self._codes) - self._codes.count(0)

    def read(self, ends: Iterable[tuple[int, str | None]]) -> bytearray:
        """The codes of the archive's ``ends`` (``Store.ends``), the last of each job winning; a deletion forgets it."""
        codes = bytearray()
        by_value = {state.value: code for state, code in _CODES.items()}
        for job_id, state in ends:
            if job_id < 1:
                continue
            if job_id >= len(codes):
                codes.extend(bytes(max(job_id + 1 - len(codes), len(codes) // 2, 1024)))
            codes[job_id] = by_value.get(state, 0) if state is not None else 0
        return codes

    def take(self, codes: bytearray) -> None:
        """The archive's codes as read, with what this leader saw finish laid over them (the view is held);
        nothing when they were taken in already (by a caller that could not wait: ``labq.leader.scheduling``)."""
        if self.loaded:
            return
        mine = self._codes
        if len(codes) < len(mine):
            codes.extend(bytes(len(mine) - len(codes)))
        for run in _KNOWN.finditer(mine):
            codes[run.start():run.end()] = run.group()
        self._codes, self.loaded = codes, True


def missing(state: LabState, wanted: Iterable[int] = ()) -> bool:
    """Whether the archive must be read for ``wanted`` or for what the waiting jobs wait for: one of them is
    neither unfinished nor known to have finished, and the archive was not read yet (the view is held)."""
    known = state.finished
    if known.loaded:
        return False
    wanted = {d for j in state.waiting_on.values() for d in j.spec.depends_on} | set(wanted)
    return any(d not in known and d not in state.jobs for d in wanted)


def ensure(state: LabState, wanted: Iterable[int] = ()) -> None:
    """``load`` when ``missing`` (hold none of the lab's locks). Raises the read's OSError."""
    with state.view:
        needed = missing(state, wanted)
    if needed:
        load(state)


def load(state: LabState) -> None:
    """Read the archive's ends in, once in the leader's life, outside the lab's locks (hold neither: a change
    steps out of the view first, ``LabLock.outside_view``). A second caller meanwhile waits for the first one's
    read, and reads itself if that one failed. Raises the read's OSError: callers go on without it."""
    known = state.finished
    while True:
        with state.view:
            if known.loaded:
                return
            reading = known._loading
            if reading is None:
                reading = known._loading = threading.Event()
                break
        reading.wait()
    try:
        codes = known.read(state.store.ends())
        with state.view:
            known.take(codes)
    finally:
        with state.view:
            known._loading = None
        reading.set()
