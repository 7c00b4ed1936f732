"""What people and agents may send, checked field by field before anything is stored.

Every check raises ``ApiError`` (400 bad_request) naming the field and saying
what is accepted. Unknown fields are refused rather than ignored (``labq.protocol.fields``), so a typo
never silently changes what runs.

Each request has its builder beside its parser, a matched pair. A submission's pair, derived from the one
declaration of a job's fields, is ``labq.protocol.submit`` (named here too); this module has the actions,
users, tokens and joins. The models are imported inside the functions that need them, and what a parser
returns is defined in ``labq.protocol.checked`` (dataclasses), so ``labq submit`` can build its body without
loading either.
"""

from __future__ import annotations

import re

from labq.models.spec import MAX_GPUS, MAX_TIME_LIMIT_S
from labq.protocol.errors import ApiError, bad_request
from labq.protocol.fields import Fields
from labq.protocol.submit import NOTIFY_WORDS, notify_words, parse_submit, priority_value, submit_request

TYPE_CHECKING = False  # typing's, without importing typing: 3 ms of the CLI's start (type checkers take it as true)
if TYPE_CHECKING:
    from labq.protocol.checked import ActionRequest, JoinRequest, SubmitRequest, TokenRequest, UserRequest

#: what the parsers return, defined in ``labq.protocol.checked`` and loaded on first use (see ``__getattr__``)
CHECKED = ("ActionRequest", "JoinRequest", "SubmitRequest", "TokenRequest", "UserRequest")


def __getattr__(name: str):
    """``from labq.protocol.requests import SubmitRequest``, as before they moved to ``labq.protocol.checked``."""
    if name in CHECKED:
        from labq.protocol import checked

        return getattr(checked, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


MAX_BODY_BYTES = 1 << 20  #: a request body larger than this is refused with 413
MAX_PAGE = 5000  #: the most jobs one ``GET /v1/jobs`` may be asked for (``limit``)
PAGE = 100  #: the jobs of a page (``after``) that names no ``limit``
MAX_QUERY_INT = 2**53  #: the largest number a query parameter or path id may be


def wire_priority(text: str) -> int | str:
    """A priority as people type it, as the API takes it: a class name (``High`` -> ``"high"``) or an integer
    0-1000 (``"250"`` -> 250). ValueError says what is accepted; ``+10`` is a change, not a priority."""
    from labq.models.priority import PriorityClass, parse_priority

    name = text.strip().lower()
    if name[:1] in ("+", "-"):
        raise ValueError(f"{text.strip()!r} is a change, not a priority: use low, normal, high, urgent or 0-1000")
    value = parse_priority(text)
    return name if name.upper() in PriorityClass.__members__ else value


def priority_change(text: str) -> int | None:
    """``+10`` -> 10, ``-50`` -> -50: a relative change as people type it; None for anything else."""
    word = text.strip()
    if word[:1] in ("+", "-") and word[1:].isdigit() and word[1:].isascii():
        return int(word)
    return None


ACTIONS = ("cancel", "hold", "release", "prio", "top", "edit", "preempt", "restart")


def parse_action(body: object) -> ActionRequest:
    from labq.protocol.checked import ActionRequest

    f = Fields(body, "an action")
    action = f.string("action", required=True, max_len=16)
    if action not in ACTIONS:
        raise bad_request(f"action must be one of {', '.join(ACTIONS)}, not {action!r}", "action")
    fields: dict = {}
    if action in ("prio", "edit"):
        fields["priority"] = priority_value(f.raw("priority"))
    if action == "prio":
        fields["by"] = f.integer("by", low=-1000, high=1000)
        if (fields["priority"] is None) == (fields["by"] is None):
            raise bad_request("prio needs priority (a value) or by (a change), one of them", "priority")
    if action == "edit":
        fields["gpus"] = f.integer("gpus", low=1, high=MAX_GPUS)
        fields["time_limit_s"] = f.number("time_limit_s", low=0, high=MAX_TIME_LIMIT_S)
        name = f.raw("name")
        fields["name"] = "" if name == "" else f.name("name", "job name")
        if all(value is None for value in fields.values()):
            raise bad_request("edit needs gpus or time_limit_s, or priority or name", "action")
    f.done()
    return ActionRequest(action, **fields)


def parse_user(body: object) -> UserRequest:
    from labq.protocol.checked import UserRequest

    f = Fields(body, "a user")
    name = f.user_name("name", required=True)
    admin = f.boolean("admin", default=False)
    f.done()
    return UserRequest(name, admin)


MAX_TOKEN_S = 10 * 365 * 86400


def parse_token(body: object) -> TokenRequest:
    from labq.protocol.checked import TokenRequest

    f = Fields(body, "a token")
    user = f.user_name("user", required=True)
    name = f.name("name", "token name") or "api"
    expires = f.number("expires_s", low=60, high=MAX_TOKEN_S)
    f.done()
    return TokenRequest(user, name, expires)


DEFAULT_JOIN_S = 86400.0


def parse_join(body: object) -> JoinRequest:
    from labq.protocol.checked import JoinRequest

    f = Fields(body, "a join token")
    node = f.name("node", "node name")
    expires = f.number("expires_s", low=60, high=MAX_TOKEN_S)
    f.done()
    return JoinRequest(node, expires or DEFAULT_JOIN_S)


def require_int(value: str, what: str, *, low: int = 0, high: int = MAX_QUERY_INT) -> int:
    """A whole number from a query parameter or a path, written in ASCII digits, between ``low`` and ``high``."""
    if not isinstance(value, str) or not re.fullmatch(r"[0-9]{1,20}", value):
        raise bad_request(f"{what} must be a whole number, not {ascii(value)[:40]}", what)
    number = int(value)
    if not low <= number <= high:
        raise bad_request(f"{what} must be between {low} and {high}, not {number}", what)
    return number


__all__ = ["ACTIONS", "ActionRequest", "ApiError", "Fields", "MAX_BODY_BYTES", "MAX_PAGE", "NOTIFY_WORDS", "PAGE",
           "SubmitRequest", "UserRequest", "notify_words", "parse_action", "parse_submit", "parse_user",
           "priority_change", "require_int", "submit_request", "wire_priority"]
