"""Log lines with no raw control character from a user: ``EscapingFormatter``.

A log line quotes job names, users, nodes, commands and error messages. The formatter
escapes the formatted message (``msg % args``) with ``labq.terminal_text.escape_controls``,
so a name like ``"evil\\n..."`` cannot forge a second log line or send escape sequences to
the terminal that tails the log. A traceback keeps its line breaks; every other control
character in it is escaped too, line by line.

A module of its own so that the CLI's fast path, which escapes but never logs, does not
import ``logging``.
"""

from __future__ import annotations

import logging

from labq.terminal_text import escape_controls


class EscapingFormatter(logging.Formatter):
    """A ``logging.Formatter`` (same arguments) that escapes what came from users.

    Use it wherever a handler gets a formatter: ``handler.setFormatter(EscapingFormatter(fmt))``.
    """

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_text:  # a traceback another handler's formatter cached, maybe raw
            record.exc_text = _escape_lines(record.exc_text)
        return super().format(record)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = escape_controls(record.message)
        return super().formatMessage(record)

    def formatException(self, ei) -> str:  # noqa: N802 - logging's name
        return _escape_lines(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802 - logging's name
        return _escape_lines(super().formatStack(stack_info))


def _escape_lines(text: str) -> str:
    return "\n".join(escape_controls(line) for line in text.split("\n"))
