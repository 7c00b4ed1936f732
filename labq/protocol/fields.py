"""A JSON object's fields, read one by one with their checks: each error names the field (400 bad_request).

Unknown fields are refused at ``done()`` rather than ignored, so a typo never silently changes what runs.
"""

from __future__ import annotations

from collections.abc import Mapping

from labq.protocol.errors import bad_request
from labq.protocol.names import MAX_NAME, check_name, check_user_name


class Fields:
    """Typed access to a JSON object's fields; refuses unknown ones at ``done()``. Errors name the field by its
    ``path`` in the request (``node.gpus.memory_mib``) when the object is inside another."""

    def __init__(self, body: object, where: str, path: str = "") -> None:
        if not isinstance(body, Mapping):
            raise bad_request(f"{where} must be a JSON object", path.rstrip(".") or None)
        self.body = body
        self.where = where
        self.path = path
        self.seen: set[str] = set()

    def _get(self, name: str, required: bool):
        self.seen.add(name)
        if name not in self.body or self.body[name] is None:
            if required:
                raise bad_request(f"{self.where}: {name} is required", self.path + name)
            return None
        return self.body[name]

    def string(self, name: str, *, required: bool = False, max_len: int = MAX_NAME) -> str | None:
        """A short, printable string: no control characters (those are for commands and env values)."""
        value, field = self._get(name, required), self.path + name
        if value is None:
            return None
        if not isinstance(value, str):
            raise bad_request(f"{field} must be a string", field)
        if utf8_len(field, value) > max_len:
            raise bad_request(f"{field} is longer than {max_len} bytes", field)
        if not value.isprintable():
            odd = next(c for c in value if not c.isprintable())
            raise bad_request(f"{field} {ascii(value[:64])} contains a control or unprintable character "
                              f"(U+{ord(odd):04X})", field)
        return value

    def name(self, name: str, what: str, *, required: bool = False) -> str | None:
        """A name of a job, node, reservation or group: ``labq.protocol.names``' one rule."""
        value = self._get(name, required)
        return None if value is None else check_name(value, what, self.path + name)

    def user_name(self, name: str, what: str = "user name", *, required: bool = False) -> str | None:
        value = self._get(name, required)
        return None if value is None else check_user_name(value, what, self.path + name)

    def integer(self, name: str, *, required: bool = False, low: int = 0, high: int = 2**31) -> int | None:
        value, field = self._get(name, required), self.path + name
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise bad_request(f"{field} must be an integer", field)
        if not low <= value <= high:
            raise bad_request(f"{field} must be between {low} and {high}, not {value}", field)
        return value

    def number(self, name: str, *, required: bool = False, low: float = 0.0, high: float = 1e12) -> float | None:
        value, field = self._get(name, required), self.path + name
        if value is None:
            return None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
            raise bad_request(f"{field} must be a number", field)
        if not low <= value <= high:
            raise bad_request(f"{field} must be between {low:g} and {high:g}, not {value:g}", field)
        return float(value)

    def boolean(self, name: str, *, default: bool) -> bool:
        value, field = self._get(name, False), self.path + name
        if value is None:
            return default
        if not isinstance(value, bool):
            raise bad_request(f"{field} must be true or false", field)
        return value

    def raw(self, name: str, *, required: bool = False):
        return self._get(name, required)

    def done(self) -> None:
        unknown = sorted(set(self.body) - self.seen)
        if unknown:
            shown = [u if u.isprintable() and len(u) <= 64 else ascii(u[:64]) for u in unknown[:5]]
            raise bad_request(f"{self.where}: unknown field{'s' if len(unknown) > 1 else ''} "
                              f"{', '.join(shown)}{', ...' if len(unknown) > 5 else ''}", self.path + shown[0])


def utf8_len(name: str, value: str) -> int:
    """The length of ``value`` in UTF-8; 400 for a NUL or a lone surrogate (``labq.protocol.body`` refuses those
    already; this keeps the parse functions safe for any caller)."""
    if "\x00" in value:
        raise bad_request(f"{name} contains a NUL byte", name)
    try:
        return len(value.encode())
    except UnicodeEncodeError:
        raise bad_request(f"{name} contains a lone surrogate, which is not a character", name) from None
