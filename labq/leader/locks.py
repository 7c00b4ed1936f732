"""The lab's two locks: one that makes changes one at a time, and one that guards the lab in memory.

A change reads the lab, decides, writes its commit to the store and then takes the new versions in; no other
change may come between, or two of them would work from the same version of a job. Neither lock is held
while a commit waits for the disk: a change lets both go once its commit is written, and only then waits for
the sync, so the next change is decided meanwhile and their syncs are shared. So:

- ``view`` guards what is in memory. Whoever reads or changes the lab holds it, briefly; it is never held
  across a write to disk: a change steps out of it to write its commit (``LabLock.outside_view``).
- ``with lab.lock:`` is a change: it takes ``writing`` (changes one at a time) and then ``view``. Reads
  (listings, tokens, long polls, scrapes) and submits (a new job changes no other version) take ``view``
  alone, so they never wait for a commit in flight.
- A change answers only once what it wrote and what it read is on disk: as it lets go of the locks it asks
  the store for its newest commit written (``newest``), and waits for that and for its own (``staged``)
  with ``settle``, which raises if one of them was lost on the way after a change had taken it in.

Taken in that order only: a thread that holds ``view`` alone and asks for ``writing`` is a bug (it could
deadlock with a change stepping back in), and raises at once. Nobody waits for news (``Condition.wait``)
while holding ``writing``: every change would wait too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class _Held(threading.local):
    view = 0  #: how deep this thread is in ``view``
    writing = 0  #: how deep this thread is in ``writing``

    def __init__(self) -> None:
        self.staged: list = []  #: the commits this thread's change wrote, on their way to disk


class LabLock:
    """``with lock:`` makes a change; ``with lock.view:`` looks (or adds a job); ``lock.condition`` is bound to
    ``view``, for whoever waits for the lab to change."""

    def __init__(self) -> None:
        self._writing = threading.RLock()
        self._view = threading.RLock()
        self._held = _Held()
        self.view = _View(self)
        self.condition = threading.Condition(self._view)
        #: the newest commit written and not yet on disk, if any (what a change read may be ahead of the disk)
        self.newest: Callable[[], object | None] = lambda: None
        #: wait until a change's own commits and the newest one are on disk (raise if it was lost): as it ends
        self.settle: Callable[[list, object | None], None] = lambda staged, newest: None

    def __enter__(self) -> LabLock:
        held = self._held
        if held.view and not held.writing:
            raise RuntimeError("a thread that holds the lab's view may not start a change: take the lab's lock "
                               "first (labq.leader.locks)")
        self._writing.acquire()
        held.writing += 1
        self.view.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        held = self._held
        self.view.__exit__()
        held.writing -= 1
        if held.writing:
            self._writing.release()
            return
        staged, held.staged = held.staged, []
        try:
            newest = self.newest()
        finally:
            self._writing.release()  # whatever happens, the next change may go
        if staged or newest is not None:
            self.settle(staged, newest)

    def staged(self, commit) -> None:
        """This thread's change wrote ``commit`` (the store's ``Staged``): it ends once that is on disk."""
        if not self._held.writing:
            raise RuntimeError("only a change (with the lab's lock) commits: a look (the lab's view) may not")
        self._held.staged.append(commit)

    @property
    def changing(self) -> bool:
        """Whether this thread is making a change (holds ``writing``)."""
        return self._held.writing > 0

    @contextmanager
    def outside_view(self) -> Iterator[None]:
        """Step out of ``view`` (every level this thread holds) for a while, keeping ``writing``: a change's
        commit, which waits for the disk. Only a change may (it alone keeps others from changing meanwhile)."""
        held = self._held
        if not held.writing:
            raise RuntimeError("only a change (with the lab's lock) commits: a look (the lab's view) may not")
        depth = held.view
        for _ in range(depth):
            self._view.release()
        held.view = 0
        try:
            yield
        finally:
            for _ in range(depth):
                self._view.acquire()
            held.view = depth

    def wait(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` for news (``view`` held, ``writing`` not): ``Condition.wait``."""
        self._not_changing()
        return self.condition.wait(timeout)

    def wait_for(self, predicate, timeout: float | None) -> bool:
        """Wait up to ``timeout`` for ``predicate`` (``view`` held, ``writing`` not): ``Condition.wait_for``."""
        self._not_changing()
        return self.condition.wait_for(predicate, timeout)

    def _not_changing(self) -> None:
        if self._held.writing:
            raise RuntimeError("waiting for news while making a change would stop every other change")


class _View:
    """``view``, counted per thread so that a change can step out of all of it."""

    def __init__(self, lock: LabLock) -> None:
        self._lock = lock

    def __enter__(self) -> _View:
        self._lock._view.acquire()
        self._lock._held.view += 1
        return self

    def __exit__(self, *exc) -> None:
        self._lock._held.view -= 1
        self._lock._view.release()
