"""A job's fields as flags (``labq submit``, ``labq edit``): registered from their one declaration
(``labq.models.spec.FIELDS``) and read back by kind (``labq.spec_text``), each error naming its flag."""

from __future__ import annotations

import argparse

from labq.cli.errors import CliError
from labq.models.spec import CLASSES, FIELDS, Field

#: the fields ``labq submit`` has a flag for, in the order of its ``--help``
FLAGGED = tuple(f for f in FIELDS if f.flag)
_LISTS = ("env", "mounts", "ids", "events")  #: kinds whose flag is given again for each value


def dest(field: Field) -> str:
    return field.flag.lstrip("-").replace("-", "_")


def add_flag(p: argparse.ArgumentParser, field: Field, help: str) -> None:
    """``field``'s flag on ``p`` (``labq submit``'s, or ``labq edit``'s with its own help), as its kind takes it."""
    kind = field.flag_kind
    if kind == "priority":
        group = p.add_mutually_exclusive_group()
        group.add_argument("--class", dest="klass", choices=CLASSES,
                           help="priority class" + (" (default normal)" if help == field.help else ""))
        group.add_argument(field.flag, metavar=field.metavar, help=help)
    elif kind == "switch":
        p.add_argument(field.flag, action="store_true", help=help)
    elif kind in _LISTS:
        p.add_argument(field.flag, action="append", default=[], metavar=field.metavar, help=help)
    elif kind == "choice":
        p.add_argument(field.flag, choices=[c.value for c in field.choices], help=help)
    else:
        p.add_argument(field.flag, type=int if kind == "count" else None, metavar=field.metavar, help=help)


def flag_value(args: argparse.Namespace, field: Field, context: dict):
    """A flag's value as the request carries it, read by the field's kind; None when the flag was not given."""
    from labq import spec_text

    raw = getattr(args, dest(field))
    if field.container and raw and not args.image:
        raise CliError(f"{field.flag} is for container jobs: add --image IMAGE")
    if raw is None or raw is False or raw == "" or raw == []:
        return None
    try:
        if field.flag_kind == "switch":
            return not field.default
        if field.flag_kind == "count":
            return spec_text.at_least(field, raw)
        return spec_text.read(field, raw)
    except ValueError as err:
        raise CliError(str(err)) from None
