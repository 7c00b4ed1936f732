"""``labq admin token create|list|revoke``: tokens for use off the lab's machines (a laptop, a script), each
with a name and an expiry, revoked at once."""

from __future__ import annotations

import argparse
import time

from labq.cli.common import command, emit, leader_client
from labq.terminal_text import escape_controls


def add_token_commands(admin_sub: argparse._SubParsersAction, parents: list) -> None:
    tokens = command(admin_sub, "token", "create, list and revoke tokens",
                     "Tokens let a person use the queue from a machine that is not one of the lab's (on a lab "
                     "workstation the local agent vouches for them and no token is needed). The leader keeps only "
                     "each token's hash: a token is shown once, when it is made.",
                     "  labq admin token create alice --name laptop --expires 30d\n"
                     "  labq admin token list\n  labq admin token revoke 3f9a2b1c0d4e", None, [])
    tokens_sub = tokens.add_subparsers(title="token commands", metavar="COMMAND")
    tokens.set_defaults(run=lambda args: (tokens.print_help(), 0)[1])
    p = command(tokens_sub, "create", "make a token for a user (admins)",
                "Make a new token for USER and print it once, with the `labq login` line that saves it with the "
                "lab's CA pin. The user's other tokens keep working.",
                "  labq admin token create alice --name laptop --expires 30d\n"
                "  labq admin token create ci-bot --name nightly --expires never", _create, parents)
    p.add_argument("user", metavar="USER", help="whose token it is")
    p.add_argument("--name", default="api", help="what it is for, to tell it apart in the list (default: api)")
    p.add_argument("--expires", metavar="DURATION", default="never",
                   help="how long it works: 12h, 30d, 1y ... or never (default: never)")
    p.add_argument("--json", action="store_true", help="print JSON (the token is in it: keep it secret)")
    p = command(tokens_sub, "list", "list tokens (yours; everyone's for admins)",
                "List tokens by id, user, name, age and expiry. Never shows a token itself.",
                "  labq admin token list\n  labq admin token list --user alice --json", _list, parents)
    p.add_argument("--user", help="only this user's tokens (admins)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = command(tokens_sub, "revoke", "revoke a token by its id",
                "The token fails on its next request, and its open event streams (labq ls --watch, the TUI) end "
                "now. Admins may revoke anyone's; a user their own.",
                "  labq admin token revoke 3f9a2b1c0d4e", _revoke, parents)
    p.add_argument("token_id", metavar="ID", help="the token's id, from `labq admin token list`")


def _expires_s(text: str) -> float | None:
    from labq.cli.errors import CliError
    from labq.units import parse_duration

    said = text.strip().lower()
    if said in ("never", "0", ""):
        return None
    years = said.endswith("y") and said[:-1].isdigit()
    try:
        seconds = int(said[:-1]) * 365 * 86400 if years else parse_duration(said)
    except ValueError as err:
        raise CliError(f"--expires: {err} (or 1y, or never)") from None
    if seconds < 60:
        raise CliError(f"--expires {text}: a token must last at least a minute")
    return seconds


def _create(args: argparse.Namespace) -> int:
    import json
    import shlex

    expires = _expires_s(args.expires)
    client = leader_client(args)
    token, secret = client.create_token(args.user, args.name, expires)
    if args.json:
        print(json.dumps({**token, "secret": secret}, indent=2))
        return 0
    until = f", valid until {_when(token['expires_at'])}" if token.get("expires_at") else ", with no expiry"
    print(escape_controls(f"made token {token['id']} ({token['name']}) for {token['user']}{until}. "
                          "It is shown only now."))
    login = ["labq", "login", client.url, *(["--pin", client.pin] if client.pin else []), "--token", secret]
    print(escape_controls(f"{token['user']} runs this one line on the machine it is for:\n"))
    print(escape_controls(shlex.join(login)) + "\n")
    return 0


def _when(at: float | None) -> str:
    from labq.when import format_when

    return format_when(at, time.time()) if at else "never"


def _list(args: argparse.Namespace) -> int:
    from labq.render import format_duration, table

    found = leader_client(args).tokens(args.user)
    now = time.time()
    rows = [[t["id"], t["user"], t["name"], format_duration(max(0.0, now - t["created_at"])) + " ago",
             "expired" if t.get("expired") else _when(t.get("expires_at")),
             "this one" if t.get("this_request") else ""] for t in found]
    return emit(args, found, lambda: table(("ID", "USER", "NAME", "MADE", "EXPIRES", ""), rows)
                if rows else "no tokens")


def _revoke(args: argparse.Namespace) -> int:
    token = leader_client(args).revoke_token(args.token_id.strip().lower())
    print(escape_controls(f"revoked token {token['id']} ({token['name']}) of {token['user']}: it no longer works"))
    return 0
