"""Calls made in a thread of their own, for tests that hold something (the disk, the archive) and check who is
answered meanwhile."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from labq.protocol import errors

WAIT_S = 10.0


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, dict]:
    """``call`` started in a thread: the thread, and where its answer (``value``) or API error (``error``) lands."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = call()
        except errors.ApiError as err:
            out["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def answered(call: Callable[[], object], waited: str) -> object:
    """``call``'s answer, which must come within ``WAIT_S`` (else it ``waited``: what the assertion says)."""
    thread, out = in_thread(call)
    thread.join(WAIT_S)
    assert not thread.is_alive(), waited
    assert "error" not in out, out.get("error")
    return out["value"]


def wait_until(seen: Callable[[], object], never: str) -> object:
    """``seen()`` once it is true, looked at every few milliseconds for up to ``WAIT_S`` (else ``never``)."""
    deadline = time.monotonic() + WAIT_S
    while not (found := seen()):
        assert time.monotonic() < deadline, never
        time.sleep(0.005)
    return found
