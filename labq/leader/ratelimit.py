"""Failed authentication, limited per source: a guesser gets a 429 after a few tries, everyone else nothing.

Each address may fail ``limit`` times in any ``window_s``; past that its requests are refused without looking
at their token until the oldest failure leaves the window. A success does not clear the count (a guesser
who also holds a token of their own gains nothing by using it). Time comes from the clock given, so a test
steps it.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable

from labq.protocol.errors import ApiError

MAX_SOURCES = 10_000  #: addresses remembered at most; the oldest are forgotten first


class AuthFailures:
    def __init__(self, limit: int, window_s: float, clock: Callable[[], float]) -> None:
        self.limit, self.window_s, self.clock = limit, window_s, clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, source: str, now: float) -> deque[float] | None:
        times = self._failures.get(source)
        if times is not None:
            while times and times[0] <= now - self.window_s:
                times.popleft()
            if not times:
                del self._failures[source]
                return None
        return times

    def check(self, source: str | None) -> None:
        """Raise 429 if ``source`` has failed too often lately."""
        if source is None or self.limit <= 0:
            return
        with self._lock:
            now = self.clock()
            times = self._recent(source, now)
            if times is not None and len(times) >= self.limit:
                wait = max(1, math.ceil(times[0] + self.window_s - now))
                raise ApiError(429, "too_many_failures",
                               f"{len(times)} failed authentications from {source} in the last "
                               f"{self.window_s:g} s: wait {wait} s before trying again")

    def failed(self, source: str | None) -> None:
        if source is None or self.limit <= 0:
            return
        with self._lock:
            now = self.clock()
            times = self._recent(source, now)
            if times is None:
                if len(self._failures) >= MAX_SOURCES:
                    del self._failures[next(iter(self._failures))]
                times = self._failures[source] = deque()
            times.append(now)
