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

from labq.cli.common import command, leader_client, leader_option, parse_size_mib, zone_arg
from labq.cli.errors import CliError
from labq.terminal_text import escape_controls


def build_reserve_body(args: argparse.Namespace, now: float, tz) -> dict:
    """The ``POST /v1/reservations`` body for ``labq reserve``'s arguments (``labq.protocol.bookings``)."""
    from labq.protocol.bookings import reserve_request

    if args.gpus is None or (args.start is None and args.by is None):
        raise CliError('say how many GPUs and when: labq reserve --gpus 4 --start "fri 09:00" --for 48h, '
                       'or by when: labq reserve --gpus 4 --gpu-hours 200 --by "fri 18:00"')
    if args.gpus < 1:
        raise CliError("--gpus must be 1 or more")
    if sum(x is not None for x in (args.duration, args.end, args.gpu_hours)) != 1:
        raise CliError("say how long with --for DURATION (90m, 48h, 2d), until when with --end WHEN, or how much "
                       "with --gpu-hours H")
    if args.by is not None and args.end is not None:
        raise CliError("with --by DEADLINE, say how long (--for or --gpu-hours), not --end")
    start, end, by, length = _window_args(args, now, tz)
    memory = parse_size_mib(args.min_gpu_mem, "--min-gpu-mem") if args.min_gpu_mem else None
    if args.users and args.group:
        raise CliError("give --users or --group, not both")
    return reserve_request(
        args.gpus, start, end, by=by, length=length, name=args.name or None, node=args.node or None,
        gpu_model=args.gpu_model or None, min_gpu_memory_mib=memory,
        users=[u.strip() for u in args.users.split(",") if u.strip()] if args.users else (),
        group=args.group or None, owner=args.for_user or None, dry_run=args.dry_run)


def _window_args(args: argparse.Namespace, now: float, tz) -> tuple:
    """(start, end, by, length): a window, or for a booking by need (--by) a length and a start that may be
    ``earliest`` or ``latest``."""
    from labq.when import parse_for, parse_when

    def when(text: str, flag: str) -> float:
        try:
            return parse_when(text, now, tz)
        except ValueError as err:
            raise CliError(f"{flag}: {err}") from None

    if args.gpu_hours is not None:
        if not args.gpu_hours > 0:
            raise CliError("--gpu-hours must be more than 0")
        length = round(args.gpu_hours * 3600 / args.gpus / 60) * 60.0  # whole minutes
    elif args.duration is not None:
        try:
            length = parse_for(args.duration)
        except ValueError as err:
            raise CliError(f"--for: {err}") from None
    else:
        length = None
    by = when(args.by, "--by") if args.by is not None else None
    pick = args.start if args.start in ("earliest", "latest") else None
    if pick is not None and by is None:
        raise CliError(f"--start {pick} picks a window that ends by a deadline: give --by WHEN too")
    if by is not None:
        return pick or (when(args.start, "--start") if args.start else None), None, by, length
    start = when(args.start, "--start")
    end = start + length if length is not None else when(args.end, "--end")
    if end <= start:
        raise CliError("--end must be after --start")
    return start, end, None, None


def _reserve(args: argparse.Namespace) -> int:
    if args.action is not None:
        if args.action != "cancel" or not args.target:
            raise CliError("to cancel a booking: labq reserve cancel NAME")
        r = leader_client(args).cancel_reservation(args.target)
        print(json.dumps(r, indent=2) if args.json else f"cancelled {escape_controls(r['name'])}")
        return 0
    now, tz = time.time(), zone_arg(args)
    from labq.render.reservations import answer_text

    answer = leader_client(args).reserve(build_reserve_body(args, now, tz))
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        from labq.render.reservations import deadline_text

        print(answer_text(answer, now, tz))
        if answer.get("deadline") is not None:
            print(deadline_text(answer, now, tz))
    return 0 if answer["accepted"] else 1


def _reservations(args: argparse.Namespace) -> int:
    from labq.render.reservations import reservations_table

    found = leader_client(args).reservations(everything=args.all)
    now = time.time()
    print(json.dumps(found, indent=2) if args.json else reservations_table(found, now, zone_arg(args)))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    common = leader_option()
    p = command(sub, "reserve", "book GPUs for a window of time (or cancel a booking)",
                "Book GPUs from --start for --for (or until --end), for you and the --users or --group you name. "
                "Or book by need: how much (--gpu-hours, or --for) by when (--by); the answer gives the earliest "
                "start available and the latest that still finishes by the deadline, and books the one you pick "
                "with --start earliest (the default), --start latest or --start TIME. "
                "The answer comes at once: the node and GPUs pinned, and the jobs that will be asked to "
                "checkpoint before the start, with the work they lose; or why not, with alternatives that work. "
                "The GPUs pinned are those that displace the least running work. Times are in your time "
                "zone: now, in 2h, 14:00, tomorrow 9am, fri 09:00, next mon 8:00, 2026-11-27 09:00.",
                '  labq reserve --gpus 4 --start "fri 09:00" --for 48h --name paper\n'
                '  labq reserve --gpus 4 --gpu-hours 200 --by "fri 18:00" --dry-run   when could it run?\n'
                '  labq reserve --gpus 4 --for 48h --by "fri 18:00" --start latest\n'
                '  labq reserve --gpus 2 --start tomorrow --for 8h --gpu-model A100 --users alice,bob\n'
                '  labq reserve --gpus 8 --start "2026-12-01 09:00" --end "2026-12-03 18:00" --dry-run\n'
                "  labq reserve cancel paper\n"
                "  labq submit --reservation paper --gpus 4 -- python3 train.py   a job in it", _reserve, [common])
    p.add_argument("action", nargs="?", choices=["cancel"], help="cancel a booking (with its NAME)")
    p.add_argument("target", nargs="?", metavar="NAME", help="the booking to cancel")
    p.add_argument("--gpus", type=int, metavar="N", help="how many GPUs (on one node)")
    p.add_argument("--start", metavar="WHEN", help="when it starts, in your time zone; with --by also earliest "
                   "or latest")
    p.add_argument("--for", dest="duration", metavar="DURATION", help="how long: 90m, 48h, 2d")
    p.add_argument("--end", metavar="WHEN", help="when it ends (instead of --for)")
    p.add_argument("--gpu-hours", type=float, metavar="H", help="how much: GPU-hours, spread over --gpus "
                   "(instead of --for)")
    p.add_argument("--by", metavar="WHEN", help="the deadline: book a window of --for or --gpu-hours that ends by "
                   "then")
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
