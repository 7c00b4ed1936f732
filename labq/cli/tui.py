"""``labq tui``: the live, keyboard-first screen of the shared queue (``labq.tui``, loaded only for it)."""

from __future__ import annotations

import argparse

from labq.cli.common import command, leader_option


def _tui(args: argparse.Namespace) -> int:
    from labq.tui.app import make_app

    make_app(args.leader, readonly=args.readonly).run()
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "tui", "the live, keyboard-first screen of the shared queue",
                "A live view of the lab: the queue (filter with /, sort with o, tag with space, act on the "
                "selected jobs), job details and logs (Enter, l), the nodes' GPUs (n) and the reservations "
                "(R). ? lists the keys of each screen; ctrl+p finds any action by name; q quits.",
                "  labq tui\n  labq tui --readonly          look, change nothing\n"
                "  labq tui --leader http://gpu1:7733", _tui, [leader_option()])
    p.add_argument("--readonly", action="store_true", help="show everything, allow no action")
