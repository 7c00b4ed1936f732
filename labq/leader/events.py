"""Changes that live views follow: a numbered stream of small events, kept for a while."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    seq: int
    kind: str  #: "job" or "node"
    data: dict


class EventHub:
    def __init__(self, keep: int = 4096) -> None:
        self._cond = threading.Condition()
        self._seq = 0
        self.keep = keep  #: how many recent events a stream that falls behind may still read
        self._recent: deque[Event] = deque(maxlen=keep)
        self._closed = False
        self._interrupts = 0

    @property
    def seq(self) -> int:
        return self._seq

    def publish(self, kind: str, data: dict) -> None:
        self.publish_all(kind, (data,))

    def publish_all(self, kind: str, datas: Iterable[dict], skipped: int = 0) -> None:
        """Several events of one kind, in order, with one wake-up of the streams (an array's tasks); ``skipped``
        more before them that no stream could read (past what is kept), counted but not made."""
        with self._cond:
            self._seq += skipped
            for data in datas:
                self._seq += 1
                self._recent.append(Event(self._seq, kind, data))
            self._cond.notify_all()

    def after(self, seq: int, timeout: float) -> list[Event]:
        """Events after ``seq``, waiting up to ``timeout`` for one; empty when none came or on close."""
        with self._cond:
            interrupts = self._interrupts
            self._cond.wait_for(lambda: self._seq > seq or self._closed or self._interrupts != interrupts, timeout)
            return [e for e in self._recent if e.seq > seq]

    def interrupt(self) -> None:
        """Wake every stream's wait now (a token was revoked: each stream checks that its own still holds)."""
        with self._cond:
            self._interrupts += 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
