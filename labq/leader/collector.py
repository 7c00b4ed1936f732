"""The leader's garbage collector: what outlived a full collection is frozen out of the next ones.

A leader holds every unfinished job in memory, each a tree of objects the collector tracks. CPython
collects its oldest generation whenever it has grown by a quarter since the last time, and then walks
all of it holding the interpreter lock: at 30,000 queued jobs that took 144-210 ms on this project's
test machines, about every 5,000 submits under a stream of them, and no request was answered meanwhile.
Jobs do not need the collector: they hold no cycles, and their reference counts free the versions that
are replaced. So after each full collection, whatever survived it is frozen (``gc.freeze``), and the
next ones walk only what was made since (12-26 ms there).

What is frozen is never collected, so a cycle of objects that dies after it was frozen would be kept.
Once every ``THAW_S`` the frozen objects are thawed instead (``gc.unfreeze``): the next full collection
walks everything once, frees such cycles, and what survives it is frozen again.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

THAW_S = 3600.0  #: how often a full collection walks every object, so no dead cycle is kept longer
OLDEST = 2  #: CPython's oldest generation: a collection of it is a full one


class FreezingCollector:
    """A ``gc.callbacks`` entry: after a full collection, freeze what survived, or once in ``thaw_s``, thaw."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic, thaw_s: float = THAW_S) -> None:
        self.monotonic, self.thaw_s = monotonic, thaw_s
        self.thawed_at = monotonic()
        self.frozen = 0  #: full collections after which what survived was frozen
        self.thawed = 0  #: times everything frozen was thawed for the next full collection

    def __call__(self, phase: str, info: dict) -> None:
        if phase != "stop" or info.get("generation") != OLDEST:
            return
        now = self.monotonic()
        if now - self.thawed_at >= self.thaw_s:
            self.thawed_at = now
            self.thawed += 1
            gc.unfreeze()
        else:
            self.frozen += 1
            gc.freeze()


_installed: FreezingCollector | None = None


def freeze_after_full_collections() -> FreezingCollector:
    """Install the one ``FreezingCollector`` of this process (the leader daemon's; a second call keeps the
    first)."""
    global _installed
    if _installed is None:
        _installed = FreezingCollector()
        gc.callbacks.append(_installed)
    return _installed
