"""Durations and sizes as people write them: ``90m``, ``2h``, ``1h30m``, ``1:30:00``; ``40G``, ``512M``."""

from __future__ import annotations

import re

# patterns, compiled (and kept by ``re``) on first use: every CLI command imports this module, few parse a duration
_DURATION_PART = r"(?i)(\d+(?:\.\d+)?)\s*(d|h|m|s)"
_CLOCK = r"^(\d+):([0-5]\d):([0-5]\d)$"
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_SIZE = r"(?i)^(\d+(?:\.\d+)?)\s*([mgt]?)(?:i?b)?$"
_UNIT_MIB = {"m": 1, "g": 1024, "t": 1024 * 1024, "": 1024}


def parse_duration(text: str, *, bare_seconds: bool = False) -> float:
    """``90m``, ``2h``, ``1d``, ``1h30m``, ``1:30:00`` -> seconds.

    A bare number is refused unless ``bare_seconds``: for a time limit, ``90`` means
    minutes to a Slurm user and seconds to everyone else, so labq asks for a unit.
    """
    raw = str(text).strip()
    if bare_seconds and re.fullmatch(r"\d+(\.\d+)?", raw):
        return float(raw)
    if m := re.match(_CLOCK, raw):
        return float(int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]))
    parts = re.findall(_DURATION_PART, raw)
    if raw and parts and re.sub(_DURATION_PART, "", raw).strip() == "":
        return float(sum(float(n) * _UNIT_S[u.lower()] for n, u in parts))
    hint = "60s, 2m" if bare_seconds else "90m, 2h, 1d or H:MM:SS"
    raise ValueError(f"{text!r} is not a duration: use {hint}")


def parse_size_mib(text: str) -> int:
    """``40G``, ``24GiB``, ``8000M``, ``40`` (GiB) -> MiB. GB means GiB, as GPU memory is sold."""
    m = re.match(_SIZE, str(text).strip())
    if not m:
        raise ValueError(f"{text!r} is not a size: use 40G, 24GiB or 8000M (a plain number is GiB)")
    return round(float(m[1]) * _UNIT_MIB[m[2].lower()])
