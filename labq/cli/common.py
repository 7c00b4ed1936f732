"""What the command families share: the parser helpers, the client, printing, and flags read into plain values.

Nothing heavy at module level: every command module imports this one while ``labq`` builds its parser. Not even
``typing`` (3 ms of a start that has about 10): ``TYPE_CHECKING`` below is the constant of that name, which type
checkers take as true.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from labq import units
from labq.cli.errors import UNREACHABLE, CliError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from labq.client import Client

Command = Callable[[argparse.Namespace], int]
STATES = ("queued", "held", "starting", "running", "preempting", "succeeded", "failed", "cancelled", "timeout")
FINISHED = frozenset(STATES[5:])


# -- the parsers ----------------------------------------------------------------------------------

class Help(argparse.RawDescriptionHelpFormatter):
    """How labq lays out help: a text of one line (a command's description) is wrapped to 88 columns, a text of
    several lines (the examples) is shown as written.

    argparse makes a formatter for every argument it is given, so this one is cheap to make: the terminal's width
    comes from ``os``, as ``shutil.get_terminal_size`` finds it, without importing ``shutil`` and its compression
    modules, and ``textwrap`` is imported only when help is shown (together 3 ms of every start)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position, terminal_columns() - 2 if width is None else width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return super()._fill_text(text, width, indent)
        import textwrap

        return textwrap.fill(text, 88, initial_indent=indent, subsequent_indent=indent)


def terminal_columns() -> int:
    """``shutil.get_terminal_size().columns``: ``$COLUMNS``, else the terminal's, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class CommandSet(argparse._SubParsersAction):
    """``labq``'s commands (``add_subparsers(action=CommandSet, only=NAME)``). With ``only``, a run that knows its
    command builds that command's parser alone: ``command`` hands every other one an ``UNBUILT`` parser, so
    ``labq ls`` does not build the 40 others (about 14 ms, besides importing their modules)."""

    def __init__(self, *args, only: str | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.only = only

    def builds(self, name: str) -> bool:
        return self.only is None or self.only == name


class _Unbuilt:
    """The parser of a command this run does not build: whatever a command module adds to it is dropped."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: self


UNBUILT = _Unbuilt()


def path_arg(text: str):
    """An argparse type for paths, importing pathlib only when a path is given: it costs a fast start."""
    from pathlib import Path

    return Path(text).expanduser()


def leader_option() -> argparse.ArgumentParser:
    """The ``--leader`` option of every command that talks to the leader, as a parent parser."""
    common = argparse.ArgumentParser(add_help=False, formatter_class=Help)
    common.add_argument("--leader", metavar="URL", help="the leader's address, e.g. http://gpu1:7733 "
                        "(default: $LABQ_LEADER, else ~/.config/labq/credentials)")
    return common


def command(sub: argparse._SubParsersAction, name: str, summary: str, description: str, examples: str,
            run: Command | None, parents: list) -> argparse.ArgumentParser:
    """A subcommand with a wrapped description and an ``examples:`` epilog, that runs ``run`` (``UNBUILT`` when
    this run of ``labq`` runs another command: see ``CommandSet``)."""
    if isinstance(sub, CommandSet) and not sub.builds(name):
        return UNBUILT
    p = sub.add_parser(name, help=summary, description=description, epilog="examples:\n" + examples,
                       formatter_class=Help, parents=parents)
    if run is not None:
        p.set_defaults(run=run)
    return p


# -- talking and printing -------------------------------------------------------------------------

def command_group(sub: argparse._SubParsersAction, name: str, summary: str, description: str,
                  examples: str) -> argparse._SubParsersAction:
    """A command of commands (``labq admin token ...``): alone, it prints its help; returns where its own
    commands go."""
    group = command(sub, name, summary, description, examples, None, [])
    group.set_defaults(run=lambda args: (group.print_help(), 0)[1])
    return group.add_subparsers(title=f"{name} commands", metavar="COMMAND")


def leader_client(args: argparse.Namespace) -> Client:
    from labq.client import Client

    return Client.from_environment(leader=args.leader)


def emit(args: argparse.Namespace, data: object, text: Callable[[], str]) -> int:
    """``--json``: the data as the leader sent it; else the text for people."""
    print(json.dumps(data, indent=2) if args.json else text())
    return 0


def use_color() -> bool:
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def ask(question: str, yes: bool, what: str) -> bool:
    """``yes`` (``--yes``) or the person at the terminal says y; refused (exit 2) when nobody can be asked."""
    if yes:
        return True
    if not sys.stdin.isatty():
        raise CliError(f"{what}: stdin is not a terminal, so labq cannot ask; add --yes to go ahead")
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)  # to the person even when stdout is a file
    return sys.stdin.readline().strip().lower() in ("y", "yes")


class Patience:
    """Calls to the leader that wait out its restarts: an unreachable leader (or a proxy's 502 or 504) is retried,
    saying so once on stderr, until ``limit_s`` seconds pass without an answer; then exit 4 (``labq logs -f``,
    ``labq wait``)."""

    def __init__(self, limit_s: float, sleep: Callable[[float], None] | None = None) -> None:
        import time

        self.limit_s, self.sleep, self.clock = limit_s, sleep or time.sleep, time.monotonic
        self.since: float | None = None  #: when the leader stopped answering

    def call(self, fn: Callable, *args):
        from labq.protocol.errors import ApiError
        from labq.render.tables import format_duration
        from labq.terminal_text import escape_controls

        while True:
            try:
                result = fn(*args)
            except ApiError as err:
                if err.code != "unreachable" and err.status not in (502, 504):  # not there, or a proxy says so
                    raise
                now = self.clock()
                if self.since is None:
                    self.since = now
                    print(f"labq: {escape_controls(err)}; retrying for up to {format_duration(self.limit_s)}",
                          file=sys.stderr)
                if now - self.since >= self.limit_s:
                    raise CliError(f"gave up after {format_duration(self.limit_s)} without the leader: "
                                   f"{escape_controls(err)}", UNREACHABLE) from None
                self.sleep(min(2.0, max(0.2, self.limit_s / 10)))
                continue
            if self.since is not None:
                print("labq: the leader answers again", file=sys.stderr)
                self.since = None
            return result


def retry_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--retry-for", metavar="DURATION", default="2m",
                   help="how long to wait out an unreachable leader (a restart) before exiting 4 (default 2m)")


def patience(args: argparse.Namespace) -> Patience:
    return Patience(parse_duration(args.retry_for, "--retry-for", bare_seconds=True))


# -- flags to plain values; a mistake names the flag ----------------------------------------------

def parse_duration(text: str, option: str = "--time", bare_seconds: bool = False) -> float:
    """Seconds in ``text`` (see ``labq.units.parse_duration``)."""
    try:
        return units.parse_duration(text, bare_seconds=bare_seconds)
    except ValueError as err:
        raise CliError(f"{option}: {err}") from None


def parse_size_mib(text: str, option: str = "--gpu-mem") -> int:
    try:
        return units.parse_size_mib(text)
    except ValueError as err:
        raise CliError(f"{option}: {err}") from None


def parse_priority_arg(text: str, option: str = "--priority") -> int | str:
    """A class name (sent as the name) or an integer 0-1000 (sent as the integer)."""
    from labq.protocol.requests import wire_priority

    try:
        return wire_priority(text)
    except ValueError as err:
        raise CliError(f"{option}: {err}") from None


def parse_signal(text: str, option: str = "--checkpoint-signal") -> str:
    """``SIGUSR1`` for ``usr1``; a clear error for what no job can catch."""
    from labq.models.job import catchable_signal

    name = catchable_signal(text)
    if name is None:
        raise CliError(f"{option}: {text!r} is not a signal a job can catch (e.g. SIGUSR1, SIGTERM)")
    return name


def zone_arg(args: argparse.Namespace):
    """The zone of ``--tz``, else the machine's (``labq.when.local_zone``): where times are read and shown."""
    from labq.when import local_zone, time_zone

    if not args.tz:
        return local_zone()
    try:
        return time_zone(args.tz)
    except ValueError as err:
        raise CliError(f"--tz: {err}") from None


def parse_ids(values: list[str], what: str = "job id") -> list[int | str]:
    """``12 13`` or ``12,13`` -> [12, 13]; an array's task stays a text: ``12.3`` -> "12.3"."""
    ids: list[int | str] = []
    for word in (w.strip() for v in values for w in v.split(",") if w.strip()):
        ids.append(job_ref(word, what))
    if not ids:
        raise CliError(f"name at least one {what}")
    return ids


def job_ref_arg(word: str) -> int | str:
    """``job_ref`` as an argparse type: a bad id is a usage error (exit 2), said as ``job_ref`` says it."""
    try:
        return job_ref(word)
    except CliError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def job_ref(word: str, what: str = "job id") -> int | str:
    """A job or an array (``12`` -> 12) or an array's task (``12.3``, kept as text); a clear error else."""
    head, dot, index = word.strip().partition(".")
    if not head.isdigit() or int(head) < 1 or dot and not index.isdigit():
        raise CliError(f"{word!r} is not a {what}: use the number `labq ls` shows (12, or 12.3 for an array's task)")
    return f"{int(head)}.{int(index)}" if dot else int(head)
