"""The notification channels, for admins: where each sends, what waits, and its last success and error."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from labq.render.tables import format_duration, table
from labq.terminal_text import escape_controls


def notify_status_table(channels: Sequence[Mapping], now: float) -> str:
    """The notification channels for admins: where each sends, what waits, and its last success and error."""
    rows = []
    for c in channels:
        health = "FAILING" if c.get("failing") else ("not configured" if not c.get("configured") else "ok")
        error = c.get("last_error")
        if error and c.get("last_error_at"):
            error = f"{_ago(c['last_error_at'], now)}: {error}"
        rows.append([c["channel"], health, c.get("target"), c.get("queued", 0), _ago(c.get("oldest_queued_at"), now),
                     _ago(c.get("last_success_at"), now), c.get("given_up", 0), error])
    text = table(("CHANNEL", "HEALTH", "TARGET", "QUEUED", "OLDEST", "LAST SUCCESS", "GAVE UP", "LAST ERROR"), rows,
                 max_width={"LAST ERROR": 100})
    gone = [(c["channel"], c["last_given_up"]) for c in channels if c.get("last_given_up")]
    for channel, g in gone:
        text += escape_controls(f"\n{channel}: last given up {_ago(g.get('at'), now)}: {g.get('key')} for "
                                f"{g.get('user')} after {g.get('tries', '?')} tries: {g.get('error')}")
    return text


def _ago(t: float | None, now: float) -> str | None:
    return None if t is None else f"{format_duration(now - t)} ago"
