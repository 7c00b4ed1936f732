"""Reservations, with times in the user's zone ``tz``: a booking's answer, the list, and the windows a
deadline leaves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from labq.render.tables import table
from labq.terminal_text import escape_controls


def answer_text(answer: Mapping, now: float, tz) -> str:
    """What a booking's answer says: booked (or would book) where, whom it displaces; or why not and what works."""
    return "\n".join(escape_controls(line) for line in _answer_lines(answer, now, tz))


def _answer_lines(answer: Mapping, now: float, tz) -> list[str]:
    from labq.when import format_when

    if answer["accepted"]:
        r = answer["reservation"]
        verb = "booked" if answer["booked"] else "would book (dry run)"
        lines = [f"{verb} {r['name']}: {r['gpus']} GPU(s) on {r['node']} (GPUs "
                 f"{','.join(map(str, r['gpu_indices']))}, topology score {r['score']}), "
                 f"{format_when(r['start'], now, tz)} to {format_when(r['end'], now, tz)}"]
        if answer["displaced"]:
            lines.append("  jobs asked to checkpoint and requeued before it starts:")
            for d in answer["displaced"]:
                line = f"    job {d['job_id']} ({d['user']}) at {format_when(d['signal_at'], now, tz)}"
                if "gpu_seconds_lost" in d:  # an older leader sends no cost
                    minutes = d["gpu_seconds_lost"] / 60
                    lost = f"{minutes / 60:.1f} GPU-h" if minutes >= 120 else f"{minutes:.0f} GPU-min"
                    line += f": {d['gpus']} GPU{'' if d['gpus'] == 1 else 's'}, about {lost} lost"
                lines.append(line)
        if answer["booked"]:
            lines.append(f"  run jobs in it with: labq submit --reservation {r['name']} ...")
        return lines
    lines = ["cannot book it: " + "; ".join(answer["reasons"])]
    if answer["alternatives"]:
        lines.append("  what would work:")
        for a in answer["alternatives"]:
            hours = (a["end"] - a["start"]) / 3600
            lines.append(f"    {a['gpus']} GPU(s) on {a['node']} (score {a['score']}), "
                         f"{format_when(a['start'], now, tz)} to {format_when(a['end'], now, tz)}: "
                         f"labq reserve --gpus {a['gpus']} --start \"{_iso(a['start'], tz)}\" --for {hours:g}h")
    return lines


def reservations_table(reservations: Sequence[Mapping], now: float, tz) -> str:
    from labq.when import format_when

    if not reservations:
        return "no reservations"
    rows = []
    for r in reservations:
        if r.get("cancelled_at") is not None:
            state = "cancelled"
        else:
            state = "active" if r["start"] <= now < r["end"] else ("ended" if r["end"] <= now else "upcoming")
        users = ",".join(sorted({r["owner"], *r.get("users", ())}))
        if r.get("group"):
            users = f"group {r['group']}"
        rows.append([r["name"], r["owner"], r["gpus"], f"{r['node']}:{','.join(map(str, r['gpu_indices']))}",
                     format_when(r["start"], now, tz), format_when(r["end"], now, tz), state, users,
                     r.get("note") or ""])
    return table(("NAME", "OWNER", "GPUS", "NODE:GPUS", "START", "END", "STATE", "USERS", "NOTE"), rows)


def _iso(t: float, tz) -> str:
    from datetime import datetime

    from labq.when import time_zone

    return datetime.fromtimestamp(t, time_zone(tz)).strftime("%Y-%m-%d %H:%M")


def deadline_text(answer: Mapping, now: float, tz) -> str:
    """For a booking by need: the earliest and the latest window that end by the deadline, and how to pick."""
    from labq.when import format_when

    windows = answer["deadline"]
    earliest, latest = windows.get("earliest"), windows.get("latest")
    if earliest is None:
        return "  nothing of that size ends by the deadline"
    lines = [f"  earliest start {format_when(earliest['start'], now, tz)} (ends {format_when(earliest['end'], now, tz)})",
             f"  latest start   {format_when(latest['start'], now, tz)} (ends {format_when(latest['end'], now, tz)})"]
    r = answer.get("reservation") or {}
    if answer.get("accepted") and latest["start"] != earliest["start"]:
        other = "latest" if r.get("start") == earliest["start"] else "earliest"
        lines.append(f"  --start {other} books the {other} window instead; a --start between them works too")
    return "\n".join(escape_controls(line) for line in lines)
