"""Threads that must not die quietly: a backoff for loops that retry, and a supervisor that restarts.

A daemon's loop survives any error of one round: it logs, waits a backoff with
jitter, and goes on. Should a thread die all the same (a bug in the handler
itself), the process's main thread notices through ``Supervisor.check`` and
starts it again; a thread that keeps dying makes ``check`` raise, and the
daemon exits non-zero so that its service manager sees it, instead of idling on
with a part missing.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("labq.workers")


class Backoff:
    """Waits that double from ``first`` up to ``cap``, each drawn between half and all of its step,
    so that many agents retrying one leader do not arrive together."""

    def __init__(self, first: float = 0.2, cap: float = 1.6, rng: Callable[[], float] = random.random) -> None:
        self.first, self.cap, self.rng = first, cap, rng
        self.step = first

    def next(self) -> float:
        wait = self.step * (0.5 + 0.5 * self.rng())
        self.step = min(self.step * 2, self.cap)
        return wait

    def reset(self) -> None:
        self.step = self.first


class RetryLog:
    """How a retrying loop reports its failures: the first of a kind at once, then a reminder a minute,
    and the recovery with how long it took; never one log line per retry."""

    def __init__(self, logger: logging.Logger, what: str, remind_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log, self.what, self.remind_s, self.clock = logger, what, remind_s, clock
        self.since: float | None = None
        self.failures = 0
        self._said: tuple[str, float] | None = None

    def failed(self, err: BaseException) -> None:
        now = self.clock()
        kind = type(err).__name__
        if self.since is None:
            self.since = now
        self.failures += 1
        if self._said is None or self._said[0] != kind or now - self._said[1] >= self.remind_s:
            extra = f" ({self.failures} tries in {now - self.since:.0f} s)" if self.failures > 1 else ""
            self.log.warning("%s: %s: %s%s; retrying", self.what, kind, err, extra)
            self._said = (kind, now)

    def ok(self) -> None:
        if self.since is not None:
            self.log.info("%s works again after %.1f s (%d failed tries)", self.what, self.clock() - self.since,
                          self.failures)
        self.since, self.failures, self._said = None, 0, None


class WorkerFailed(RuntimeError):
    """A thread died again and again: the daemon should exit non-zero rather than run without it."""


@dataclass
class _Worker:
    name: str
    target: Callable[[], None]
    thread: threading.Thread
    deaths: list[float] = field(default_factory=list)


class Supervisor:
    """Starts named daemon threads and, on ``check``, restarts the ones that died."""

    def __init__(self, max_deaths: int = 5, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_deaths, self.window_s, self.clock = max_deaths, window_s, clock
        self._workers: dict[str, _Worker] = {}
        self.stopping = False

    def spawn(self, name: str, target: Callable[[], None]) -> threading.Thread:
        thread = threading.Thread(target=target, name=name, daemon=True)
        old = self._workers.get(name)
        self._workers[name] = _Worker(name, target, thread, old.deaths if old else [])
        thread.start()
        return thread

    @property
    def threads(self) -> list[threading.Thread]:
        return [w.thread for w in self._workers.values()]

    def check(self) -> list[str]:
        """Restart dead threads; the names restarted. Raises WorkerFailed for one that died too often."""
        if self.stopping:
            return []
        restarted = []
        for worker in list(self._workers.values()):
            if worker.thread.is_alive():
                continue
            now = self.clock()
            worker.deaths = [t for t in worker.deaths if now - t < self.window_s] + [now]
            if len(worker.deaths) > self.max_deaths:
                raise WorkerFailed(f"thread {worker.name} died {len(worker.deaths)} times within "
                                   f"{self.window_s:g} s; see the errors above")
            log.error("thread %s had died; starting it again", worker.name)
            self.spawn(worker.name, worker.target)
            restarted.append(worker.name)
        return restarted

    def join(self, timeout: float) -> None:
        self.stopping = True
        for thread in self.threads:
            thread.join(timeout)
