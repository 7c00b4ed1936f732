"""Text from users made safe to show on one line of a terminal.

Names, commands, environment values, reasons that quote them and error messages that echo
them come from users (or from old databases, agents, a leader of another version). Printed
raw, a newline splits a table row, ``ESC [2J`` clears the screen, ``ESC ]0;...BEL`` retitles
the window, U+202E reverses what follows and a zero-width space makes two names look alike.
``escape_controls`` shows every such character as a visible escape and leaves everything
printable, CJK included, as it is. It is pure and cheap (one ``str.isprintable`` call for the
usual string), so every table cell of ``labq ls`` goes through it.

It does not escape the backslash: ``a\\nb`` typed by a user and a newline both show as
``a\\nb``, which is ambiguous but harmless, while escaping backslashes would mangle every
Windows path and regular expression in a command line.
"""

from __future__ import annotations

#: the categories shown escaped: control (C0, DEL, C1), format (bidi controls, zero-width
#: characters, soft hyphen), lone surrogates (no terminal encoding can print them), and the
#: line and paragraph separators
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape_controls(value: object, keep: str = "") -> str:
    """``value`` as text with no control, format or separator character left raw.

    ``"evil\\n"`` -> ``"evil\\\\n"``, ESC -> ``"\\\\x1b"``, U+202E -> ``"\\\\u202e"``; ``"学生"``
    and ``"[red]"`` stay as they are (markup is the renderer's business: pass the result to
    ``rich.text.Text``, never to markup). Characters in ``keep`` (e.g. ``"\\n"`` for a log
    shown line by line) are left raw. Escaping is idempotent: escaped text has nothing left
    to escape.
    """
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():  # false for every character escaped here (and for some that are not)
        return text
    from unicodedata import category  # a C extension to load: only for text that needs a look (CLI start)

    return "".join(_escape(c) if c not in keep and category(c) in HIDDEN_CATEGORIES else c for c in text)


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
