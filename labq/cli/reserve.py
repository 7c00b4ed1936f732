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

from labq.cli.common import command, leader_client, leader_option, parse_size_mib
from labq.cli.errors import CliError
from labq.terminal_text import escape_controls


def build_reserve_body(args: argparse.Namespace, now: float, tz) -> dict:
    """The ``POST /v1/reservations`` body for ``labq reserve``'s arguments (``labq.protocol.bookings``)."""
    from labq.protocol.bookings import reserve_request
    from labq.when import parse_for, parse_when

    if args.gpus is None or args.start is None:
        raise CliError('say how many GPUs and when: labq reserve --gpus 4 --start "fri 09:00" --for 48h')
    if args.gpus < 1:
        raise CliError("--gpus must be 1 or more")
    if (args.duration is None) == (args.end is None):
        raise CliError("say how long with --for DURATION (90m, 48h, 2d) or until when with --end WHEN")
    try:
        start = parse_when(args.start, now, tz)
    except ValueError as err:
        raise CliError(f"--start: {err}") from None
    try:
        end = start + parse_for(args.duration) if args.duration else parse_when(args.end, now, tz)
    except ValueError as err:
        raise CliError(f"{'--for' if args.duration else '--end'}: {err}") from None
    if end <= start:
        raise CliError("--end must be after --start")
    memory = parse_size_mib(args.min_gpu_mem, "--min-gpu-mem") if args.min_gpu_mem else None
    if args.users and args.group:
        raise CliError("give --users or --group, not both")
    return reserve_request(
        args.gpus, start, end, name=args.name or None, node=args.node or None, gpu_model=args.gpu_model or None,
        min_gpu_memory_mib=memory,
        users=[u.strip() for u in args.users.split(",") if u.strip()] if args.users else (),
        group=args.group or None, owner=args.for_user or None, dry_run=args.dry_run)


def _zone(args: argparse.Namespace):
    from labq.when import local_zone, time_zone

    if not args.tz:
        return local_zone()
    try:
        return time_zone(args.tz)
    except ValueError as err:
        raise CliError(f"--tz: {err}") from None


def _reserve(args: argparse.Namespace) -> int:
    if args.action is not None:
        if args.action != "cancel" or not args.target:
            raise CliError("to cancel a booking: labq reserve cancel NAME")
        r = leader_client(args).cancel_reservation(args.target)
        print(json.dumps(r, indent=2) if args.json else f"cancelled {escape_controls(r['name'])}")
        return 0
    now, tz = time.time(), _zone(args)
    from labq.render import answer_text

    answer = leader_client(args).reserve(build_reserve_body(args, now, tz))
    print(json.dumps(answer, indent=2) if args.json else answer_text(answer, now, tz))
    return 0 if answer["accepted"] else 1


def _reservations(args: argparse.Namespace) -> int:
    from labq.render import reservations_table

    found = leader_client(args).reservations(everything=args.all)
    now = time.time()
    print(json.dumps(found, indent=2) if args.json else reservations_table(found, now, _zone(args)))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    common = leader_option()
    p = command(sub, "reserve", "book GPUs for a window of time (or cancel a booking)",
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

    p = command(sub, "reservations", "list the lab's reservations",
                "List the reservations that have not ended: where they are pinned, when, for whom, and what "
                "happened to them (re-pinned after a node went away). With --all, also those that ended or "
                "were cancelled in the last week. When a booking ends or is cancelled, the jobs still waiting "
                "in it go to the normal queue (or are cancelled, if submitted with --after-reservation cancel).",
                "  labq reservations\n  labq reservations --all\n  labq reservations --json", _reservations,
                [common])
    p.add_argument("--all", action="store_true", help="also the bookings that ended or were cancelled lately")
    p.add_argument("--tz", metavar="ZONE", help="show times in this zone")
    p.add_argument("--json", action="store_true", help="print JSON")
