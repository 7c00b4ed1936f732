"""Durations and sizes as people write them: ``90m``, ``2h``, ``1d``, ``1:30:00``; ``40G``, ``512M``."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d)?\s*$", re.IGNORECASE)
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(m|mb|mib|g|gb|gib|t|tb|tib)?\s*$", re.IGNORECASE)


def parse_duration(text: str, *, default_unit: str = "s") -> float:
    """Seconds in ``text``: ``45s``, ``90m``, ``2h``, ``1.5d``, ``1:30:00`` or ``30:00``."""
    text = str(text).strip()
    if ":" in text:
        parts = text.split(":")
        if len(parts) in (2, 3) and all(p.isdigit() for p in parts):
            seconds = 0
            for part in parts:
                seconds = seconds * 60 + int(part)
            return float(seconds)
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration: use 90s, 30m, 2h, 1d or H:MM:SS")
    return float(match.group(1)) * _UNITS[(match.group(2) or default_unit).lower()]


def parse_size_mib(text: str) -> int:
    """MiB in ``text``: ``40G`` (GiB), ``512M`` (MiB), ``1T``; a plain number is GiB."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"{text!r} is not a size: use 40G, 512M or 80GiB")
    unit = (match.group(2) or "g")[0].lower()
    return int(float(match.group(1)) * {"m": 1, "g": 1024, "t": 1024 * 1024}[unit])


def format_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    if seconds < 90:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 90:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"
