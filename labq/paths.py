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
