"""Fixtures for discovery tests: a thread-leak guard and a factory of namespace LANs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from netns import NetLab, netlab


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    """Fail a test that leaves zeroconf (or any) threads behind, as python-zeroconf's suite does."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 3
    while (left := [t for t in threading.enumerate() if t not in before and t.is_alive()]):
        if time.monotonic() > deadline:
            pytest.fail(f"threads left behind: {[t.name for t in left]}")
        time.sleep(0.05)


@pytest.fixture
def lan() -> Iterator[Callable[[int], NetLab]]:
    """``lan(3)`` builds three hosts on one bridge; all of it is removed after the test."""
    with ExitStack() as stack:
        yield lambda n: stack.enter_context(netlab(n))
