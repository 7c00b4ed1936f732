"""Fault rounds against a real lab: the counts they end with, and the real parts they need.

Under CI (``CI=true``) a part that cannot be had here (dockerd, network namespaces, a
tmpfs mount) fails the test: a guard that skips itself guards nothing. Elsewhere it skips
with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults.counts import CONTROLLER_PRINTS, PROPERTY, FaultCounts, Tally, merge_and_maybe_print
from tests.conftest import unavailable

_tally = Tally()


@pytest.fixture
def fault_counts(request) -> Iterator[FaultCounts]:
    counts = FaultCounts()
    yield counts
    request.node.user_properties.append((PROPERTY, vars(counts).copy()))
    print(f"{request.node.name}: {counts.line()}")


@pytest.fixture(scope="session")
def docker_image() -> str:
    """The busybox test image on a running engine (started as tests/docker does if none answers)."""
    try:
        import fcntl

        from tests.docker.conftest import ENGINE_LOCK, IMAGE, _build_image, _ping, _start_dockerd
    except pytest.skip.Exception as err:  # the docker package is missing
        unavailable("this fault test's real parts", str(err))
    try:
        with open(ENGINE_LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            client = _ping() or _start_dockerd()
            try:
                try:
                    client.images.get(IMAGE)
                except Exception:  # noqa: BLE001 - ImageNotFound: build it
                    _build_image(client)
            finally:
                client.close()
    except pytest.skip.Exception as err:
        unavailable("this fault test's real parts", f"no Docker engine for the container jobs: {err}")
    return IMAGE


@pytest.fixture
def netns_root() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        unavailable("this fault test's real parts", "network namespaces need root and iproute2")


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A 2 MiB tmpfs of the test's own, unmounted afterwards."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        unavailable("this fault test's real parts", "mounting a small tmpfs needs root")
    folder = tempfile.mkdtemp(prefix="labq-fault-disk-")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", folder], capture_output=True,
                             text=True, timeout=30)
    if mounted.returncode != 0:
        os.rmdir(folder)
        unavailable("this fault test's real parts", f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield Path(folder)
    finally:
        if subprocess.run(["umount", folder], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", folder], check=True, timeout=30)
        os.rmdir(folder)


# -- the counts at the end of the run -------------------------------------------------------------


def pytest_runtest_logreport(report) -> None:
    _tally.report(report)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """An xdist controller that loaded this file prints the totals itself."""
    node.workerinput[CONTROLLER_PRINTS] = True


def pytest_terminal_summary(terminalreporter, config) -> None:
    if hasattr(config, "workerinput") or not _tally.tests:
        return
    terminalreporter.write_sep("-", "labq fault rounds")
    for line in _tally.lines():
        terminalreporter.write_line(line)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session) -> None:
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is not None and not workerinput.get(CONTROLLER_PRINTS):
        merge_and_maybe_print(_tally, workerinput, session.config.pluginmanager.getplugin("capturemanager"))
