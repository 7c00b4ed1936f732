"""The ``labq`` command. Thin: parse, call one function, print.

One module per command family registers its commands on the parser: ``tools`` (topo, place, checkpoint),
``jobs``, ``admin``, ``events``, ``usage``, ``notify``, ``reserve``, ``tui``, ``daemons``, ``sim``, ``store`` and
``export`` (``FAMILIES``).
Each command runs under the one guard of ``labq.cli.errors``. Imports stay lazy, and ``labq CMD`` loads CMD's family
alone and builds CMD's parser alone, so that ``labq`` starts fast and never loads the TUI's libraries for a plain
command (``bench/cli_start.py`` times ``labq submit`` and ``labq ls``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

if "argparse" in sys.modules or "gettext" in sys.modules:
    import argparse
else:
    # argparse imports gettext for its few words of its own ("usage:", "error:"). labq speaks English, so a
    # stand-in gives them as written: the real gettext (whose import compiles a verbose pattern, and whose every
    # message looks for a catalog on disk) cost each start ~2 ms. It is not left in sys.modules: code that
    # imports gettext later gets the real one.
    _as_written = type(sys)("gettext")
    _as_written.gettext = lambda message: message
    _as_written.ngettext = lambda singular, plural, n: singular if n == 1 else plural
    sys.modules["gettext"] = _as_written
    try:
        import argparse
    finally:
        del sys.modules["gettext"]

EPILOG = """\
examples:
  labq submit --gpus 2 -- python3 train.py   queue a 2-GPU job
  labq ls                                your jobs; `labq why ID` says why one waits
  labq logs -f 12                        follow a job's output
  labq topo --list                       simulated GPU inventories
  labq topo sim:dgx1                     a DGX-1's GPUs and how they are linked
  labq place sim:dgx1 --gpus 2           the GPU pair labq would give a 2-GPU job
  labq place sim:ws-4x3090 --gpus 1 --busy 0
  labq usage --me --since 7d             your GPU-hours this week
  labq store check                       is the leader's database sound?
  labq store backup DIR                  a consistent copy of the lab, while the leader runs
  labq checkpoint                        (inside a job) report a finished checkpoint
"""


#: the command families (modules of ``labq.cli`` whose ``add_commands`` register commands) and their commands, in
#: the order of ``labq --help``. ``labq CMD ...`` loads CMD's family alone and builds CMD's parser alone
#: (``labq.cli.common.CommandSet``); ``labq``, ``labq --help`` and an unknown command build them all.
#: ``tests/cli/test_cli_start.py`` checks this table against what the families register.
FAMILIES = {
    "tools": ("topo", "place", "checkpoint"),
    "jobs": ("submit", "ls", "show", "why", "logs", "cancel", "hold", "release", "prio", "edit", "restart", "wait",
             "clean", "nodes", "queues", "gpus", "whoami"),
    "admin": ("login", "admin"),
    "events": ("events",),
    "usage": ("usage",),
    "notify": ("notify",),
    "reserve": ("reserve", "reservations"),
    "tui": ("tui",),
    "daemons": ("leader", "agent", "up", "demo"),
    "sim": ("sim",),
    "store": ("store",),
    "export": ("export",),
}
COMMANDS = {command: family for family, commands in FAMILIES.items() for command in commands}


def main(argv: Sequence[str] | None = None) -> int:
    from labq.cli.errors import guard

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 0
    return guard(args.run, args)


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """``labq``'s parser: for a ``command`` of ``COMMANDS``, with that command's parser alone; else with all."""
    from labq import __version__
    from labq.cli.common import CommandSet, Help

    parser = argparse.ArgumentParser(
        prog="labq",
        description="labq: a shared GPU job queue for small research labs.",
        epilog=EPILOG,
        formatter_class=Help,
    )
    parser.add_argument("--version", action="version", version=f"labq {__version__}")
    only = command if command in COMMANDS else None
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", action=CommandSet, only=only)
    for family in (COMMANDS[only],) if only else FAMILIES:
        __import__(f"labq.cli.{family}", fromlist=["add_commands"]).add_commands(sub)  # importlib costs an import
    return parser
