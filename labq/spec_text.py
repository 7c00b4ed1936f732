"""A job's fields as people type them, in ``labq submit``'s flags and the TUI's submit form: one text to the
plain value a request carries (seconds, MiB, a signal's name), by the field's kind (``labq.models.spec``).

A ValueError names the flag and says what is accepted. The shaped kinds (variables, mounts, job ids, moments)
are read where they are typed: they need the shell's environment, the current folder, repeated flags.
"""

from __future__ import annotations

from labq import units
from labq.models.spec import Field


def _count(field: Field, text: str) -> int:
    if not text.strip().isdigit():
        raise ValueError(f"{field.flag}: {text!r} is not a whole number")
    return _at_least(field, int(text))


def _at_least(field: Field, value: int) -> int:
    if field.low is not None and value < field.low:
        raise ValueError(f"{field.flag} must be {field.low:g} or more")
    return value


def _size(field: Field, text: str) -> int:
    try:
        return units.parse_size_mib(text)
    except ValueError as err:
        raise ValueError(f"{field.flag}: {err}") from None


def _number(field: Field, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{field.flag}: {text!r} is not a number") from None


def _duration(field: Field, text: str) -> float:
    try:
        seconds = units.parse_duration(text, bare_seconds=field.bare_seconds)
    except ValueError as err:
        raise ValueError(f"{field.flag}: {err}") from None
    if field.low and seconds <= 0:
        raise ValueError(f"{field.flag} must be longer than 0")
    return seconds


def _signal(field: Field, text: str) -> str:
    from labq.models.job import catchable_signal

    name = catchable_signal(text)
    if name is None:
        raise ValueError(f"{field.flag}: {text!r} is not a signal a job can catch (e.g. SIGUSR1, SIGTERM)")
    return name


def _priority(field: Field, text: str) -> int | str:
    """A class name (sent as the name) or an integer 0-1000 (sent as the integer)."""
    from labq.protocol.requests import wire_priority

    try:
        return wire_priority(text)
    except ValueError as err:
        raise ValueError(f"{field.flag}: {err}") from None


#: a field's text to its value, by kind; a kind not here is not typed as one text
READ = {
    "count": _count, "size": _size, "number": _number, "duration": _duration, "signal": _signal,
    "priority": _priority, "text": lambda field, text: text, "name": lambda field, text: text,
    "path": lambda field, text: text, "choice": lambda field, text: text,
}


def read(field: Field, text: str):
    """``text`` typed for ``field`` as the value a request carries; ValueError naming the flag."""
    return READ[field.kind](field, text)


def at_least(field: Field, value: int) -> int:
    """A whole number already read (argparse's ``type=int``), checked against the field's least."""
    return _at_least(field, value)


def fields_table() -> str:
    """The fields a submit body may carry, as the Markdown table of the HTTP API's reference (``docs/api.md``,
    checked against this by a test): name, kind, default, bounds and the ``labq submit`` flag of each."""
    from labq.models.spec import SENT

    rows = ["| field | kind | default | bounds | `labq submit` |", "|---|---|---|---|---|"]
    for f in SENT:
        bounds = (f"{_number(f.low)} to {_number(f.high)}" if f.low is not None and f.high is not None
                  else " or ".join(c.value for c in f.choices) if f.choices else "")
        flag = f"`{f.flag}`" if f.flag else ""
        rows.append(f"| `{f.name}` | {f.kind} | {_default(f)} | {bounds} | {flag} |")
    return "\n".join(rows) + "\n"


def _number(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


def _default(field: Field) -> str:
    if field.required:
        return "required"
    value = getattr(field.default, "value", field.default)
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return _number(value)
    return f"`{value!r}`".replace("()", "[]" if field.kind != "env" else "{}").replace("\'", '"')
