"""The ``labq`` command. Thin: parse, call one function, print.

One module per command family registers its commands on the parser: ``tools`` (topo, place, checkpoint),
``jobs``, ``admin``, ``events``, ``reserve``, ``tui``, ``daemons``, ``sim`` and ``store``. Each command runs under the one
guard of ``labq.cli.errors``. Imports stay lazy so that ``labq`` starts fast and never loads the TUI's
libraries for a plain command.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

EPILOG = """\
examples:
  labq submit --gpus 2 -- python train.py   queue a 2-GPU job
  labq ls                                your jobs; `labq why ID` says why one waits
  labq logs -f 12                        follow a job's output
  labq topo --list                       simulated GPU inventories
  labq topo sim:dgx1                     a DGX-1's GPUs and how they are linked
  labq place sim:dgx1 --gpus 2           the GPU pair labq would give a 2-GPU job
  labq place sim:ws-4x3090 --gpus 1 --busy 0
  labq store check                       is the leader's database sound?
  labq store backup DIR                  a consistent copy of the lab, while the leader runs
  labq checkpoint                        (inside a job) report a finished checkpoint
"""


def main(argv: Sequence[str] | None = None) -> int:
    from labq.cli.errors import guard

    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 0
    return guard(args.run, args)


def _parser() -> argparse.ArgumentParser:
    from labq import __version__
    from labq.cli import admin, daemons, events, jobs, reserve, sim, store, tools, tui

    parser = argparse.ArgumentParser(
        prog="labq",
        description="labq: a shared GPU job queue for small research labs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"labq {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for family in (tools, jobs, admin, events, reserve, tui, daemons, sim, store):  # the order of `labq --help`
        family.add_commands(sub)
    return parser
