"""``labq reserve`` and ``labq reservations``: book GPUs for a deadline, see and cancel bookings.

Times are read and shown in the user's time zone (``--tz``, default the
machine's); the leader works in Unix time. A refused booking exits 1 and prints
the alternatives, each with the command that books it. Names and the leader's
reasons are printed escaped (``escape_controls``), a line at a time.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping

from labq.cli_jobs import UsageError, _client, _command, parse_size_mib
from labq.terminal_text import escape_controls


def build_reserve_body(args: argparse.Namespace, now: float, tz) -> dict:
    """The ``POST /v1/reservations`` body for ``labq reserve``'s arguments."""
    from labq.when import parse_for, parse_when

    if args.gpus is None or args.start is None:
        raise UsageError('say how many GPUs and when: labq reserve --gpus 4 --start "fri 09:00" --for 48h')
    if args.gpus < 1:
        raise UsageError("--gpus must be 1 or more")
    if (args.duration is None) == (args.end is None):
        raise UsageError("say how long with --for DURATION (90m, 48h, 2d) or until when with --end WHEN")
    try:
        start = parse_when(args.start, now, tz)
    except ValueError as err:
        raise UsageError(f"--start: {err}") from None
    try:
        end = start + parse_for(args.duration) if args.duration else parse_when(args.end, now, tz)
    except ValueError as err:
        raise UsageError(f"{'--for' if args.duration else '--end'}: {err}") from None
    if end <= start:
        raise UsageError("--end must be after --start")
    body: dict = {"gpus": args.gpus, "start": start, "end": end}
    if args.name:
        body["name"] = args.name
    if args.node:
        body["node"] = args.node
    if args.gpu_model:
        body["gpu_model"] = args.gpu_model
    if args.min_gpu_mem:
        body["min_gpu_memory_mib"] = parse_size_mib(args.min_gpu_mem, "--min-gpu-mem")
    if args.users and args.group:
        raise UsageError("give --users or --group, not both")
    if args.users:
        body["users"] = [u.strip() for u in args.users.split(",") if u.strip()]
    if args.group:
        body["group"] = args.group
    if args.for_user:
        body["owner"] = args.for_user
    if args.dry_run:
        body["dry_run"] = True
    return body


def answer_text(answer: Mapping, now: float, tz) -> str:
    """What ``labq reserve`` says: booked (or would book) where, whom it displaces; or why not and what works."""
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
            lines += [f"    job {d['job_id']} ({d['user']}) at {format_when(d['signal_at'], now, tz)}"
                      for d in answer["displaced"]]
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


def reservations_table(reservations: list[Mapping], now: float, tz) -> str:
    from labq.render import table
    from labq.when import format_when

    if not reservations:
        return "no reservations"
    rows = []
    for r in reservations:
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


def _zone(args: argparse.Namespace):
    from labq.when import local_zone, time_zone

    if not args.tz:
        return local_zone()
    try:
        return time_zone(args.tz)
    except ValueError as err:
        raise UsageError(f"--tz: {err}") from None


def _reserve(args: argparse.Namespace) -> int:
    if args.action is not None:
        if args.action != "cancel" or not args.target:
            raise UsageError("to cancel a booking: labq reserve cancel NAME")
        r = _client(args).cancel_reservation(args.target)
        print(json.dumps(r, indent=2) if args.json else f"cancelled {escape_controls(r['name'])}")
        return 0
    now, tz = time.time(), _zone(args)
    answer = _client(args).reserve(build_reserve_body(args, now, tz))
    print(json.dumps(answer, indent=2) if args.json else answer_text(answer, now, tz))
    return 0 if answer["accepted"] else 1


def _reservations(args: argparse.Namespace) -> int:
    found = _client(args).reservations()
    now = time.time()
    print(json.dumps(found, indent=2) if args.json else reservations_table(found, now, _zone(args)))
    return 0


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = _command(sub, "reserve", "book GPUs for a window of time (or cancel a booking)",
                 "Book GPUs from --start for --for (or until --end), for you and the --users or --group you name. "
                 "The answer comes at once: the node and GPUs pinned, and the jobs that will be asked to "
                 "checkpoint before the start; or why not, with alternatives that work. Times are in your time "
                 "zone: now, in 2h, 14:00, tomorrow 9am, fri 09:00, next mon 8:00, 2026-11-27 09:00.",
                 '  labq reserve --gpus 4 --start "fri 09:00" --for 48h --name paper\n'
                 '  labq reserve --gpus 2 --start tomorrow --for 8h --gpu-model A100 --users alice,bob\n'
                 '  labq reserve --gpus 8 --start "2026-12-01 09:00" --end "2026-12-03 18:00" --dry-run\n'
                 "  labq reserve cancel paper\n"
                 "  labq submit --reservation paper --gpus 4 -- python train.py   a job in it", _reserve, [common])
    p.add_argument("action", nargs="?", choices=["cancel"], help="cancel a booking (with its NAME)")
    p.add_argument("target", nargs="?", metavar="NAME", help="the booking to cancel")
    p.add_argument("--gpus", type=int, metavar="N", help="how many GPUs (on one node)")
    p.add_argument("--start", metavar="WHEN", help="when it starts, in your time zone")
    p.add_argument("--for", dest="duration", metavar="DURATION", help="how long: 90m, 48h, 2d")
    p.add_argument("--end", metavar="WHEN", help="when it ends (instead of --for)")
    p.add_argument("--name", help="a name for it (default: USER-N)")
    p.add_argument("--node", metavar="NAME", help="only on this node")
    p.add_argument("--gpu-model", metavar="MODEL", help="part of the GPU model name: A100, 3090")
    p.add_argument("--min-gpu-mem", metavar="SIZE", help="least memory per GPU: 40G")
    p.add_argument("--users", metavar="A,B", help="who else may run jobs in it")
    p.add_argument("--group", metavar="NAME", help="a group from the leader's [groups] may run jobs in it")
    p.add_argument("--for-user", metavar="USER", help="(admins) book it for someone else")
    p.add_argument("--dry-run", action="store_true", help="ask without booking")
    p.add_argument("--tz", metavar="ZONE", help="read and show times in this zone (e.g. Europe/Berlin)")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")

    p = _command(sub, "reservations", "list the lab's reservations",
                 "List the reservations that have not ended: where they are pinned, when, for whom, and what "
                 "happened to them (re-pinned after a node went away).",
                 "  labq reservations\n  labq reservations --json", _reservations, [common])
    p.add_argument("--tz", metavar="ZONE", help="show times in this zone")
    p.add_argument("--json", action="store_true", help="print JSON")


def _tui(args: argparse.Namespace) -> int:
    from labq.tui.app import make_app

    make_app(args.leader, readonly=args.readonly).run()
    return 0


def add_tui_command(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = _command(sub, "tui", "the live, keyboard-first screen of the shared queue",
                 "A live view of the lab: the queue (filter with /, sort with o, tag with space, act on the "
                 "selected jobs), job details and logs (Enter, l), the nodes' GPUs (n) and the reservations "
                 "(R). ? lists the keys of each screen; ctrl+p finds any action by name; q quits.",
                 "  labq tui\n  labq tui --readonly          look, change nothing\n"
                 "  labq tui --leader http://gpu1:7733", _tui, [common])
    p.add_argument("--readonly", action="store_true", help="show everything, allow no action")
