"""The one rule for names: jobs, users, nodes, reservations and groups. Pure.

A name is shown in listings, used in paths and URLs, and compared as a key, so it
is short, printable and plain: letters, digits and ``. _ @ + -``, not starting
with a punctuation mark other than ``_``, at most 128 characters. No control
characters, no spaces: ``evil\\n`` would split its row in ``labq ls``.

People's account names are Unix-style on top of that (lower case, at most 32).
Every check says in a sentence what is wrong, so a 400 can say it too.
"""

from __future__ import annotations

import re

from labq.protocol.errors import bad_request

MAX_NAME = 128  #: characters (they are ASCII, so bytes too)
MAX_USER_NAME = 32
_NAME = r"[A-Za-z0-9_][A-Za-z0-9._@+-]*"  #: compiled (and kept by ``re``) on first use: `labq ls` never checks one
_USER_NAME = r"[a-z_][a-z0-9_.-]*"


def name_problem(value: str, what: str) -> str | None:
    """What is wrong with ``value`` as a name (``what`` is e.g. "job name"), or None if nothing is."""
    if not isinstance(value, str):
        return f"{what} must be a string"
    if not value:
        return f"{what} is empty"
    odd = next((c for c in value if not c.isprintable() or c.isspace()), None)
    if odd is not None:
        kind = "a space" if odd == " " else "a control character" if ord(odd) < 32 or 127 <= ord(odd) < 160 \
            else "an unprintable character"
        return f"{what} {_shown(value)} contains {kind} (U+{ord(odd):04X})"
    if len(value) > MAX_NAME:
        return f"{what} is longer than {MAX_NAME} characters"
    if not re.fullmatch(_NAME, value):
        return (f"{what} {_shown(value)} is not valid: letters, digits and . _ @ + -, "
                f"starting with a letter, a digit or _")
    return None


def user_name_problem(value: str, what: str = "user name") -> str | None:
    """``name_problem``, and a Unix-style account name: lower-case letters, digits, _ . -, up to 32."""
    problem = name_problem(value, what)
    if problem is not None:
        return problem
    if len(value) > MAX_USER_NAME or not re.fullmatch(_USER_NAME, value):
        return (f"{what} {_shown(value)} is not valid: a Unix-style name, lower-case letters, digits, _ . -, "
                f"up to {MAX_USER_NAME}")
    return None


def check_name(value: str, what: str, field: str | None = None) -> str:
    """``value`` if it is a good name; else the protocol's 400 naming ``field``."""
    problem = name_problem(value, what)
    if problem is not None:
        raise bad_request(problem, field)
    return value


def check_user_name(value: str, what: str = "user name", field: str | None = None) -> str:
    problem = user_name_problem(value, what)
    if problem is not None:
        raise bad_request(problem, field)
    return value


def _shown(value: str) -> str:
    """The value quoted with its odd characters escaped, and cut short: it goes into a message."""
    text = ascii(value[:64])
    return text if len(value) <= 64 else text[:-1] + "...'"
