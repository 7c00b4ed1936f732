"""``labq events``: the lab's audit trail, who did what to which job or thing, from where, and the answer."""

from __future__ import annotations

import argparse
import time

from labq.cli.common import command, leader_client, leader_option
from labq.terminal_text import escape_controls

FOLLOW_EVERY_S = 2.0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "events", "the lab's event log: who did what, and what the lab did",
                "Every request that changed something, or tried to: when, who, how they came (a token's id, or "
                "the node whose agent vouched for them), from which address, the action, its job or target, and "
                "the answer; and the lab's own steps (kind lab): each job placed, started, asked to make room, "
                "requeued and ended, each reservation begun and over. Admins see everything; a user sees what "
                "they did and what was done to their jobs and bookings.",
                "  labq events --since 1d\n  labq events --user alice --since 7d\n  labq events --job 12\n"
                "  labq events --action cancel --json\n  labq events --follow\n"
                "  labq events --job 12                    a job's whole story\n"
                "  labq events --kind lab --action preempting --since 7d", _events, [leader_option()])
    p.add_argument("--user", help="what this user did, or what was done to their jobs")
    p.add_argument("--job", type=int, metavar="ID", help="what was done to this job")
    p.add_argument("--action", help="one action: submit, cancel, hold, prio, add user, revoke token, join, ...; "
                        "the lab's: placed, started, preempting, requeued, succeeded, failed, reservation started, ...")
    p.add_argument("--kind", choices=("user", "agent", "join", "lab"),
                   help="who acted: a user's request, an agent's, a join, or the lab itself")
    p.add_argument("--since", metavar="WHEN", help="from this long ago (1d, 2h) or this time (yesterday 9:00)")
    p.add_argument("--until", metavar="WHEN", help="up to this time")
    p.add_argument("-n", "--limit", type=int, default=100, metavar="N", help="the last N entries (default 100)")
    p.add_argument("-f", "--follow", action="store_true", help="then print new entries as they come")
    p.add_argument("--json", action="store_true", help="one JSON object a line")


def _when(text: str | None, flag: str, now: float) -> float | None:
    """A time in the past, as ``--since``/``--until`` mean it (``labq.when.parse_past``: a duration back from
    now, ``yesterday 9:00``, ``14:00`` today or yesterday, a date)."""
    from labq.cli.errors import CliError
    from labq.when import parse_past

    if text is None:
        return None
    try:
        return parse_past(text, now)
    except ValueError as err:
        raise CliError(f"{flag}: {err}") from None


def _events(args: argparse.Namespace) -> int:
    import json

    from labq.cli.errors import CliError

    if not 1 <= args.limit <= 1000:
        raise CliError("--limit must be between 1 and 1000")
    now = time.time()
    since, until = _when(args.since, "--since", now), _when(args.until, "--until", now)
    client = leader_client(args)
    found = client.audit(user=args.user, job=args.job, action=args.action, since=since, until=until,
                         limit=args.limit, kind=args.kind)
    show = (lambda e: print(json.dumps(e), flush=True)) if args.json else (lambda e: print(line(e), flush=True))
    if not found and not args.json and not args.follow:
        print("no events")
    for entry in found:
        show(entry)
    last = found[-1]["seq"] if found else None
    while args.follow:
        time.sleep(FOLLOW_EVERY_S)
        for entry in client.audit(user=args.user, job=args.job, action=args.action, after=last, limit=1000,
                                  since=since if last is None else None, kind=args.kind):
            show(entry)
            last = entry["seq"]
    return 0


def line(entry: dict) -> str:
    """One entry for people: ``2026-11-26 10:14:03  alice via ws2  cancel job 12  ok``."""
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.get("at", 0)))
    if entry.get("kind") == "lab":  # the lab's own step: no request, no answer
        target = f" job {entry['job']}" if entry.get("job") is not None else f" {entry.get('target', '')}"
        owner = f" ({entry['owner']}'s)" if entry.get("owner") else ""
        detail = f": {entry['detail']}" if entry.get("detail") else ""
        return escape_controls(f"{at}  labq  {entry.get('action', '?')}{target}{owner}{detail}")
    who = entry.get("user") or "?"
    how = f" via {entry['via']}" if entry.get("via") else f" (token {entry['token']})" if entry.get("token") else ""
    what = entry.get("action", "?")
    target = f" job {entry['job']}" if entry.get("job") is not None else (
        f" {entry['target']}" if entry.get("target") else "")
    status = entry.get("status", 0)
    result = "ok" if status < 400 else f"refused ({status}): {entry.get('error', '')}".rstrip(": ")
    where = f" from {entry['from']}" if entry.get("from") else ""
    return escape_controls(f"{at}  {who}{how}{where}  {what}{target}  {result}")
