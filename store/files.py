"""Writing files so that a crash or a full disk never leaves a torn one.

``replace_atomically`` writes a temp file in the same folder, flushes and
fsyncs it, keeps the current file as the previous good copy (a hard link, so
the current name never disappears), renames the temp file over the current
one, and fsyncs the folder. At every instant the file on disk is either the
old content or the new, whole.

Every fsync goes through ``Disk``, the one seam where a test can make the
disk fail the way real disks do (EIO from fsync), which cannot be caused on
demand with a real device.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class Disk:
    """The operating system's fsync; a subclass may fail it."""

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fsync_folder(self, folder: Path) -> None:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.fsync(fd)
        finally:
            os.close(fd)


def write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def replace_atomically(path: Path, payload: bytes, disk: Disk, previous: Path | None = None) -> None:
    """Make ``path`` hold ``payload``, durably; keep the old content at ``previous``.

    On any error the old file is untouched, the temp file is removed, and the
    error propagates.
    """
    replace_atomically_with(path, lambda fd: write_all(fd, payload), disk, previous)


def replace_atomically_with(path: Path, write: Callable[[int], T], disk: Disk, previous: Path | None = None) -> T:
    """``replace_atomically`` of what ``write`` writes to the file descriptor it is given (a new file, opened for
    writing): a content too big to hold in memory at once. Returns what ``write`` returned."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            written = write(fd)
            disk.fsync(fd)
        finally:
            os.close(fd)
        if previous is not None and path.exists():
            _keep_previous(path, previous, disk)
        os.replace(tmp, path)
        disk.fsync_folder(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    return written


def _keep_previous(path: Path, previous: Path, disk: Disk) -> None:
    staging = previous.with_name(previous.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        staging.unlink()
    try:
        os.link(path, staging)
    except OSError:  # a file system without hard links: copy instead
        shutil.copyfile(path, staging)
        fd = os.open(staging, os.O_RDONLY)
        try:
            disk.fsync(fd)
        finally:
            os.close(fd)
    os.replace(staging, previous)


def remove_stale_temp_files(folder: Path, names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            (folder / (name + ".tmp")).unlink()
