"""``labq tui``: the live, keyboard-first screen of the shared queue (``labq.tui``, loaded only for it)."""

from __future__ import annotations

import argparse

from labq.cli.common import command, leader_option, parse_duration


def app_for(args: argparse.Namespace):
    """The app ``labq tui`` runs, from its flags."""
    from labq.tui.app import make_app

    keep = parse_duration(args.keep_finished, "--keep-finished", bare_seconds=True)
    return make_app(args.leader, readonly=args.readonly, keep_finished_s=keep)


def _tui(args: argparse.Namespace) -> int:
    app_for(args).run()
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "tui", "the live, keyboard-first screen of the shared queue",
                "A live view of the lab: who holds each GPU, the queue (filter with /, sort with o or a capital "
                "letter, tag with space, act on the selected jobs), job details and logs (Enter, l), the nodes' "
                "GPUs (n) and the reservations (R). Finished jobs leave the queue after --keep-finished. ? lists "
                "the keys of each screen; ctrl+p finds any action by name; q quits.",
                "  labq tui\n  labq tui --readonly          look, change nothing\n"
                "  labq tui --keep-finished 10m  finished jobs stay 10 minutes\n"
                "  labq tui --leader http://gpu1:7733", _tui, [leader_option()])
    p.add_argument("--readonly", action="store_true", help="show everything, allow no action")
    p.add_argument("--keep-finished", metavar="DURATION", default="60s",
                   help="how long a finished job stays in the queue view (default 60s; 0: leaves at once)")
