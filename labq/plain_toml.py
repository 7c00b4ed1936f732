"""The plain TOML of a credentials file: ``key = "value"`` lines, read without ``tomllib`` and written.

``tomllib`` costs 7 ms of every command's start, and ``labq submit`` or ``labq ls`` reads the credentials file
first: a file of the usual shape is read here, and anything else (escapes, tables, numbers) is left to
``tomllib``. ``toml_string`` writes a value that either reads back.
"""

from __future__ import annotations


def plain_toml(data: bytes) -> dict[str, str] | None:
    """A TOML file of the shape ``labq.credentials.credentials_text`` writes, read without ``tomllib``:
    ``key = "value"`` lines (ASCII; no escapes in the value), comment lines and blank lines. None for anything
    else, which ``tomllib`` reads: what this accepts, it reads as ``tomllib`` does."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return None
    if any((c < " " and c not in "\t\n") or c == "\x7f" for c in text):
        return None
    doc: dict[str, str] = {}
    for line in text.split("\n"):
        line = line.strip(" \t")
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        key, value = key.strip(" \t"), value.strip(" \t")
        if (not key or not all(c.isalnum() or c in "-_" for c in key) or key in doc or len(value) < 2
                or value[0] != '"' or value[-1] != '"' or '"' in value[1:-1] or "\\" in value):
            return None
        doc[key] = value[1:-1]
    return doc


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string: quoted, with backslashes, quotes and control characters escaped."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if c >= " " and c != "\x7f" else f"\\u{ord(c):04x}" for c in escaped) + '"'
