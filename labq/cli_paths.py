"""argparse types for paths, importing pathlib only when a path is given: it costs a fast start."""

from __future__ import annotations


def path_arg(text: str):
    from pathlib import Path

    return Path(text).expanduser()
