"""A request body, bytes to a JSON value, or the 400 that says why not. Pure.

This is the one door every request body comes through, so what the parse
functions (``labq.protocol.requests``, ``agents``, ``bookings``) get is always
plain JSON: UTF-8 text, no ``NaN``, at most ``MAX_DEPTH`` levels deep, and no
lone surrogate (``"\\ud800"`` is valid JSON text but no valid string: it cannot
be written back as UTF-8, to the store or to anyone).
"""

from __future__ import annotations

import json
import re

from labq.protocol.errors import bad_request

MAX_DEPTH = 32  #: lists and objects inside each other; the deepest real payload (an agent's inventory) is 5
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def decode_body(raw: bytes) -> object:
    """The JSON value in ``raw``; ApiError 400 when it is not UTF-8 JSON of a sane shape."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise bad_request(f"the body is not UTF-8 text (byte {err.start} is not)") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise bad_request(f"the body is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as err:
        raise bad_request(f"the body is not JSON: {err}") from None
    _check_shape(value, strings=_SURROGATE_ESCAPE.search(raw) is not None)
    return value


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _check_shape(value: object, strings: bool) -> None:
    """Depth at most ``MAX_DEPTH``; with ``strings``, every key and string is valid Unicode. Iterative, so no
    shape can exhaust the stack."""
    kinds = (dict, list, str) if strings else (dict, list)
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
            if strings:
                _check_strings(item.keys())
        elif isinstance(item, list):
            children = item
        else:
            if strings and isinstance(item, str):
                _check_strings((item,))
            continue
        if depth > MAX_DEPTH:
            raise bad_request(f"the body is nested deeper than {MAX_DEPTH} levels")
        stack.extend((child, depth + 1) for child in children if isinstance(child, kinds))


def _check_strings(texts) -> None:
    for text in texts:
        if _SURROGATE.search(text):
            raise bad_request(f"the body has a string with a lone surrogate ({ascii(text[:40])}): "
                              "not a Unicode character, cannot be stored")
