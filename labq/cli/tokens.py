"""``labq admin token create|list|revoke``: tokens for use off the lab's machines (a laptop, a script), each
with a name and an expiry, revoked at once; ``labq admin join create|list|revoke``: join tokens for one
workstation each; ``labq admin node forget``: a node's name free again."""

from __future__ import annotations

import argparse
import time

from labq.cli.common import command, command_group, emit, leader_client
from labq.terminal_text import escape_controls


def add_token_commands(admin_sub: argparse._SubParsersAction, parents: list) -> None:
    tokens_sub = command_group(admin_sub, "token", "create, list and revoke tokens",
                               "Tokens let a person use the queue from a machine that is not one of the lab's (on a "
                               "lab workstation the local agent vouches for them and no token is needed). The leader "
                               "keeps only each token's hash: a token is shown once, when it is made.",
                               "  labq admin token create alice --name laptop --expires 30d\n"
                               "  labq admin token list\n  labq admin token revoke 3f9a2b1c0d4e")
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


def add_join_commands(admin_sub: argparse._SubParsersAction, parents: list) -> None:
    joins_sub = command_group(admin_sub, "join", "join tokens for one workstation each",
                              "A join token made here admits one agent: the first node that joins with it (or the "
                              "one named with --node) holds it, and any other is refused, so a copy that leaks "
                              "afterwards admits nobody. After its join a node speaks with its own certificate and "
                              "needs no token again.",
                              "  labq admin join create --node ws5\n  labq admin join list\n"
                              "  labq admin join revoke 3f9a2b1c0d4e")
    p = command(joins_sub, "create", "make a join token for one agent (admins)",
                "Print a join token for one new workstation, and the line that starts its agent with it.",
                "  labq admin join create --node ws5 --expires 2h", _join_create, parents)
    p.add_argument("--node", metavar="NAME", help="the only node name that may join with it")
    p.add_argument("--expires", metavar="DURATION", default="24h",
                   help="how long it waits to be used: 30m, 24h, 7d ... (default: 24h)")
    p.add_argument("--json", action="store_true", help="print JSON (the token is in it: keep it secret)")
    p = command(joins_sub, "list", "list join tokens (admins)",
                "List the one-time join tokens by id: which node used each, and until when an unused one works.",
                "  labq admin join list --json", _join_list, parents)
    p.add_argument("--json", action="store_true", help="print JSON")
    p = command(joins_sub, "revoke", "revoke a join token (admins)",
                "An unused join token stops working; nodes that joined with it keep their certificates.",
                "  labq admin join revoke 3f9a2b1c0d4e", _join_revoke, parents)
    p.add_argument("join_id", metavar="ID", help="the join token's id, from `labq admin join list`")


def _join_create(args: argparse.Namespace) -> int:
    import json

    expires = _expires_s(args.expires)
    client = leader_client(args)
    join, token = client.create_join(args.node, expires)
    if args.json:
        print(json.dumps({"join": join, "token": token}, indent=2))
        return 0
    target = f" for node {join['node']}" if join.get("node") else " for one node"
    print(escape_controls(f"made join token {join['id']}{target}; it works until {_when(join['expires_at'])} "
                          "or its first join. It is shown only now."))
    leader = "" if client.url.startswith("unix:") else f" --leader {client.url}"
    print("On the new workstation, as root:\n")
    print(escape_controls(f"  LABQ_JOIN_TOKEN={token} labq agent{leader}") + "\n")
    return 0


def _join_list(args: argparse.Namespace) -> int:
    from labq.render.tables import table

    found = leader_client(args).joins()
    rows = [[j["id"], j.get("node") or "any", j.get("used_by") or ("expired" if j.get("expired") else "unused"),
             _when(j["expires_at"]) if not j.get("used_by") else "", j.get("created_by", "")] for j in found]
    return emit(args, found, lambda: table(("ID", "FOR", "USED BY", "UNUSED UNTIL", "MADE BY"), rows)
                if rows else "no join tokens")


def _join_revoke(args: argparse.Namespace) -> int:
    join = leader_client(args).revoke_join(args.join_id.strip().lower())
    print(escape_controls(f"revoked join token {join['id']}"))
    return 0


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
    from labq.render.tables import format_duration, table

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
