"""Where labq keeps its files by default."""

from __future__ import annotations

import os
from pathlib import Path


def default_data_dir() -> Path:
    """``$LABQ_DATA_DIR``, else ``$XDG_DATA_HOME/labq``, else ``~/.local/share/labq``."""
    if os.environ.get("LABQ_DATA_DIR"):
        return Path(os.environ["LABQ_DATA_DIR"])
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "labq"


def write_secret(path: Path, secret: str) -> None:
    """A file only its owner can read, written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (secret + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
