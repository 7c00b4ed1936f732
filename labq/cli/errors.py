"""The CLI's one error type and the one guard every command runs under.

Exit codes, as the README's table says them: 0 ok; 1 refused (the leader said no: not yours, not for your role,
not in a state for it, no such job; or you answered no); 2 bad input (a flag or value labq cannot use, a job that
could never run or start); 3 authentication (no token, or one the leader does not know); 4 the leader cannot be
reached; 130 interrupted (Ctrl-C), 0 for a command that runs until Ctrl-C (``ls --watch``, ``logs -f``).
``labq wait`` exits with the status of the jobs it waited for (``labq.cli.actions``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from labq.protocol.errors import ApiError
from labq.terminal_text import escape_controls

OK, REFUSED, USAGE, CREDENTIALS, UNREACHABLE, INTERRUPTED = 0, 1, 2, 3, 4, 130


class CliError(Exception):
    """Something labq cannot do as asked (most often, something the user typed that it cannot take): printed as
    one ``labq: error:`` line, without a traceback, and the command exits with ``code``."""

    def __init__(self, message: str, code: int = USAGE) -> None:
        super().__init__(message)
        self.code = code


def exit_code(err: ApiError) -> int:
    """The exit status for an API error (see the module docstring): a 403 is a refusal, not a failure to
    authenticate: the leader knows who you are and says you may not."""
    if err.code == "unreachable":
        return UNREACHABLE
    if err.status == 401 or err.code in ("no_credentials", "bad_credentials", "untrusted_leader"):
        return CREDENTIALS
    return USAGE if err.status in (400, 413, 422) else REFUSED


def guard(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Runs a command: our errors become one ``labq: error:`` line and an exit code, never a traceback."""
    try:
        return command(args)
    except CliError as err:
        print(f"labq: error: {escape_controls(err)}", file=sys.stderr)
        return err.code
    except ApiError as err:
        print(f"labq: error: {escape_controls(err)}", file=sys.stderr)
        return exit_code(err)
    except KeyboardInterrupt:
        return OK if getattr(args, "interruptible", False) else INTERRUPTED
    except BrokenPipeError:
        return OK
