"""``labq usage``: who used the lab's GPUs over a window, like Slurm's sreport, in 80 columns, CSV or JSON.

The leader computes the report (``labq.models.usage``: what counts, and when); this module reads the window as
people type it (``--since 7d``, ``--month 2026-10``, in their zone), asks once, and lays out one grouping's table.
"""

from __future__ import annotations

import argparse
import time

from labq.cli.common import command, leader_client, leader_option, zone_arg
from labq.cli.errors import CliError

GROUPINGS = ("user", "group", "class", "node", "model")
WIDTH = 80  #: the text report fits a terminal of this many columns
HEADERS = ("GPU-H", "SHARE", "UTIL", "JOBS", "F/P/C", "WAIT", "P90", "LOST")
CSV_FIELDS = ("gpu_hours", "share", "utilization", "memory_gib", "jobs", "failed", "preempted", "cancelled",
              "mean_wait_s", "p90_wait_s", "lost_gpu_hours")
TOTAL = "(all)"  #: the last row's name: no user, node or class name has parentheses
LEGEND = ("GPU-H: GPU-hours allocated in the window; SHARE: of the lab's capacity;\n"
          "UTIL: the GPUs' mean utilisation while allocated, as NVML measured it (low:\n"
          "allocated but idle; -: not measured); JOBS: jobs that ran; F/P/C: jobs failed,\n"
          "preempted, cancelled; WAIT, P90: mean and 90th-percentile wait from submit to\n"
          "first start; LOST: GPU-hours of work lost to preemptions and lost nodes")
#: what the text table leaves out of a GPU model's name, for room (JSON and CSV keep it whole)
MODEL_PREFIXES = ("NVIDIA ", "GeForce ", "Tesla ")

EXAMPLES = """\
  labq usage --me                          your GPU-hours over the last 30 days
  labq usage --month 2026-10               the whole lab in October, per user (admins)
  labq usage --since 7d --by node          each node over the last week
  labq usage --month 2026-10 --by group    per group of [groups] in leader.toml
  labq usage --since 2026-10-01 --until 2026-10-15 --by class
  labq usage --me --since yesterday --by model
  labq usage --month 2026-10 --by user --csv > october.csv
  labq usage --user alice --since 90d --json | jq .total
"""


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "usage", "GPU-hours per user, group, class, node and GPU model over a window",
                "Who used the lab's GPUs over a window: GPU-hours allocated (every attempt's GPUs from its start "
                "to its end, the part inside the window; running jobs count so far), each row's share of the "
                "lab's capacity (its nodes' GPUs x the window's hours), jobs run, failed (or timed out), "
                "preempted and cancelled, the mean and 90th-percentile queue wait, and the work lost to "
                "requeues. Your own jobs for anyone (--me); the whole lab, or another user, for admins. Times "
                "are read and shown in your zone (--tz). The default window is the last 30 days.",
                EXAMPLES, _usage, [leader_option()])
    who = p.add_mutually_exclusive_group()
    who.add_argument("--me", action="store_true", help="your own jobs (anyone may ask)")
    who.add_argument("--user", metavar="NAME", help="this user's jobs (admins; yours for anyone)")
    p.add_argument("--by", choices=GROUPINGS, default="user", help="the table's rows (default user)")
    p.add_argument("--since", metavar="WHEN", help="from this long ago (7d, 12h) or this time (yesterday, 09:00, "
                   "mon, 2026-10-01, 2026-10-01 09:00)")
    p.add_argument("--until", metavar="WHEN", help="up to this time (default now)")
    p.add_argument("--month", metavar="YYYY-MM", help="that calendar month (instead of --since and --until)")
    p.add_argument("--tz", metavar="ZONE", help="read and show times in this zone (e.g. Europe/Berlin)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the whole report (every grouping and the totals) as JSON")
    out.add_argument("--csv", action="store_true", help="the chosen table as CSV, with a header")


def window(args: argparse.Namespace, now: float, tz) -> tuple[float | None, float | None]:
    """(since, until) as Unix times from the flags; None: the leader's default (30 days back, now)."""
    from labq.when import parse_month, parse_past

    def when(text: str | None, flag: str) -> float | None:
        if text is None:
            return None
        try:
            return parse_past(text, now, tz)
        except ValueError as err:
            raise CliError(f"{flag}: {err}") from None

    if args.month is not None:
        if args.since is not None or args.until is not None:
            raise CliError("--month is a whole window: leave out --since and --until")
        try:
            since, until = parse_month(args.month, tz)
        except ValueError as err:
            raise CliError(f"--month: {err}") from None
        flag, said = "--month", args.month
    else:
        since, until = when(args.since, "--since"), when(args.until, "--until")
        flag, said = "--since", args.since
    if since is not None and since >= now:
        raise CliError(f"{flag}: {said!r} begins {_clock(since, tz)}, which has not come yet")
    if since is not None and until is not None and since >= until:
        raise CliError(f"--since ({_clock(since, tz)}) must be before --until ({_clock(until, tz)})")
    return since, until


def _usage(args: argparse.Namespace) -> int:
    import json

    tz = zone_arg(args)
    since, until = window(args, time.time(), tz)
    client = leader_client(args)
    user = client.whoami()["user"] if args.me else args.user
    report = client.usage(since=since, until=until, user=user)
    if args.json:
        print(json.dumps(report, indent=2))
    elif args.csv:
        print(csv_text(report, args.by), end="")
    else:
        print(usage_text(report, args.by, tz))
    return 0


# -- the report as text and CSV -------------------------------------------------------------------

def _clock(t: float, tz) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(t, tz).strftime("%Y-%m-%d %H:%M")


def _hours(value: float) -> str:
    """GPU-hours in a few characters: ``0.5``, ``12.3``, ``1,234``."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _percent(share: float | None) -> str:
    """``12.3%``; ``<0.1%`` for a use too small to show but not none; ``-`` when the capacity is unknown."""
    if share is None:
        return "-"
    return "<0.1%" if 0 < share < 0.0005 else f"{share * 100:.1f}%"


def _cells(row: dict) -> list[str]:
    from labq.render.tables import format_duration

    share = row.get("share")
    return [_hours(row["gpu_hours"]), _percent(share), _percent(row.get("utilization")), str(row["jobs"]),
            f"{row['failed']}/{row['preempted']}/{row['cancelled']}",
            "-" if row["mean_wait_s"] is None else format_duration(row["mean_wait_s"]),
            "-" if row["p90_wait_s"] is None else format_duration(row["p90_wait_s"]), _hours(row["lost_gpu_hours"])]


def _name(row: dict, by: str) -> str:
    name = row["name"]
    if by == "model":
        for prefix in MODEL_PREFIXES:
            name = name.removeprefix(prefix)
    return name


def usage_text(report: dict, by: str, tz) -> str:
    """The window, the capacity, then one row per ``by`` (most GPU-hours first) and the lab's total, in ``WIDTH``
    columns: names too long for what the numbers leave are clipped."""
    from labq.render.tables import format_duration, table
    from labq.terminal_text import escape_controls

    whose = f"{report['user']}'s jobs" if report.get("user") else "the lab"
    lines = [escape_controls(f"GPU use of {whose} by {by}, {_clock(report['since'], tz)} to "
                             f"{_clock(report['until'], tz)} ({format_duration(report['until'] - report['since'])})")]
    if report.get("capacity_gpu_hours") is None:
        lines.append("capacity unknown: no node has joined the lab")
    else:
        lines.append(f"capacity: {report['gpus']} GPUs x {report['hours']:,.1f} h = "
                     f"{report['capacity_gpu_hours']:,.0f} GPU-h; used {_hours(report['total']['gpu_hours'])} "
                     f"GPU-h ({(report['total']['share'] or 0) * 100:.1f}%)")
    rows = report["by"][by]
    if not rows:
        lines.append("no job ran, waited or ended in this window")
        return "\n".join(lines)
    body = [[_name(r, by), *_cells(r)] for r in rows] + [[TOTAL, *_cells(report["total"])]]
    first = by.upper()
    numbers = sum(max(len(h), *(len(r[i + 1]) for r in body)) + 2 for i, h in enumerate(HEADERS))
    room = max(len(TOTAL), len(first), WIDTH - numbers)
    lines += ["", table((first, *HEADERS), body, max_width={first: room}), "", LEGEND]
    if report.get("reservations"):
        lines += ["", reservations_text(report["reservations"], tz)]
    return "\n".join(lines)


def reservations_text(bookings: list[dict], tz) -> str:
    """The bookings in the window: GPU-hours booked there, and used by the jobs that ran in them."""
    from labq.render.tables import table

    body = [[b["name"], b["owner"], b["node"] or "-", _clock(b["start"], tz), _hours(b["booked_gpu_hours"]),
             _hours(b["used_gpu_hours"]),
             f"{b['used_gpu_hours'] / b['booked_gpu_hours'] * 100:.0f}%" if b["booked_gpu_hours"] else "-"]
            for b in bookings]
    booked = sum(b["booked_gpu_hours"] for b in bookings)
    used = sum(b["used_gpu_hours"] for b in bookings)
    body.append([TOTAL, "", "", "", _hours(booked), _hours(used), f"{used / booked * 100:.0f}%" if booked else "-"])
    return "reservations (GPU-hours in the window: booked, and used by the jobs in them):\n" + table(
        ("BOOKING", "OWNER", "NODE", "FROM", "BOOKED", "USED", "USED%"), body, max_width={"BOOKING": 16})


def csv_text(report: dict, by: str) -> str:
    """The ``by`` table as CSV: a header, then a row per name, numbers as the leader sent them (empty: none)."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow((by, *CSV_FIELDS))
    for row in report["by"][by]:
        writer.writerow((row["name"], *("" if row[f] is None else row[f] for f in CSV_FIELDS)))
    return out.getvalue()
