"""Plain aligned tables, and the short words their cells hold: durations, clock times, memory sizes.

Every cell goes out through ``escape_controls``; state words are painted with ANSI codes only when asked
(a terminal). No table library, so ``labq ls`` starts fast.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from labq.terminal_text import escape_controls

_COLORS = {"running": "32", "starting": "32", "queued": "33", "held": "35", "preempting": "35",
           "failed": "31", "timeout": "31", "cancelled": "2", "succeeded": "34",
           "up": "32", "draining": "33", "down": "2", "lost": "31"}


def format_duration(seconds: float) -> str:
    """``45s``, ``12m``, ``1h05m``, ``3d04h``: short and exact enough for a table."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_clock(t: float, now: float) -> str:
    """``14:05`` today, ``Tue 14:05`` within a week, else ``2024-05-03 14:05``."""
    when, today = time.localtime(t), time.localtime(now)
    if when[:3] == today[:3]:
        return time.strftime("%H:%M", when)
    if abs(t - now) < 6 * 86400:
        return time.strftime("%a %H:%M", when)
    return time.strftime("%Y-%m-%d %H:%M", when)


def format_mib(mib: int | float | None) -> str:
    if not mib:
        return "-"
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib:g} MiB"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, color: bool = False,
          color_column: str | None = None, max_width: Mapping[str, int] | None = None) -> str:
    """Left-aligned columns two spaces apart; ``color`` paints ``color_column``'s state words.

    Every cell is escaped (``escape_controls``), then clipped to its ``max_width``."""
    limits = max_width or {}
    cells = [[_clip(escape_controls(v) if v is not None else "-", limits.get(h)) for h, v in zip(headers, row)]
             for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    painted = headers.index(color_column) if color and color_column in headers else -1
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for row in cells:
        parts = [v.ljust(w) for v, w in zip(row, widths)]
        if painted >= 0 and row[painted] in _COLORS:
            parts[painted] = f"\x1b[{_COLORS[row[painted]]}m{parts[painted]}\x1b[0m"
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _clip(text: str, limit: int | None) -> str:
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"
