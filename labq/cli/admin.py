"""``labq admin user add|ls|rm``: who may use the queue (admins only); ``labq login``: a user saves what an admin
gave them."""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from labq.cli.common import command, command_group, emit, leader_client, leader_option
from labq.cli.tokens import add_join_commands, add_token_commands
from labq.protocol.errors import ApiError
from labq.terminal_text import escape_controls


def add_commands(sub: argparse._SubParsersAction) -> None:
    login = command(
        sub, "login", "save a leader's address, its CA pin and your token",
        "Check that the leader at URL is your lab's (its CA's fingerprint is the pin), that it knows the token, "
        "and save all three in your credentials file (mode 0600) for every later command. An admin's "
        "`labq admin user add NAME` prints this line for you to run.",
        "  labq login https://gpu1:7733 --pin sha256:3f9a... --token lqu_...\n"
        "  labq login http://127.0.0.1:7733 --token lqu_...     a leader on this machine, no TLS", _login, [])
    login.add_argument("url", metavar="URL", help="the leader's address, https://HOST:PORT")
    login.add_argument("--pin", metavar="sha256:HEX", help="the lab CA's fingerprint (needed for https://)")
    login.add_argument("--token", metavar="TOKEN", required=True, help="your token (lqu_...)")
    c = [leader_option()]
    admin_sub = command_group(sub, "admin", "manage users, tokens and nodes (admins)", "Commands for labq admins.",
                              "  labq admin user add alice\n  labq admin user ls\n"
                              "  labq admin token create alice --name laptop --expires 30d")
    users_sub = command_group(admin_sub, "user", "add, list and remove users", "Manage who may use the queue.",
                              "  labq admin user add alice\n  labq admin user rm alice")
    p = command(users_sub, "add", "add a user, or give one a new token",
                "Make a token for NAME (replacing any old one). If NAME is you, it is saved to your credentials "
                "file; run as root, it is saved into NAME's home; otherwise it is printed for you to pass on.",
                "  labq admin user add alice\n  labq admin user add bob --admin\n"
                "  labq admin user add carol --print      print, do not save", _user_add, c)
    p.add_argument("name", metavar="NAME", help="the user's Unix login name")
    p.add_argument("--admin", action="store_true", help="may act on everyone's jobs and manage users")
    p.add_argument("--print", action="store_true", help="print the token instead of saving it")
    p = command(users_sub, "ls", "list users", "List labq's users.", "  labq admin user ls --json", _user_ls, c)
    p.add_argument("--json", action="store_true", help="print JSON")
    p = command(users_sub, "rm", "remove a user", "Remove a user; their token stops working at once.",
                "  labq admin user rm alice", _user_rm, c)
    p.add_argument("name", metavar="NAME")
    add_token_commands(admin_sub, c)
    add_join_commands(admin_sub, c)
    nodes_sub = command_group(admin_sub, "node", "forget a node", "Commands for the lab's nodes.",
                              "  labq admin node forget ws3")
    p = command(nodes_sub, "forget", "forget a node: a reinstalled or retired machine",
                "The node leaves `labq nodes`, its certificate and token stop working, and a join token may take "
                "its name again (a reinstalled machine joins as before). Refused while jobs hold its GPUs.",
                "  labq admin node forget ws3", _node_forget, c)
    p.add_argument("name", metavar="NAME")
    notify_sub = command_group(admin_sub, "notify", "the notification channels' health",
                               "Commands for the lab's notification channels ([notify] in leader.toml).",
                               "  labq admin notify status")
    p = command(notify_sub, "status", "each channel's queue, last success and last error",
                "Each notification channel the leader delivers through (webhook, e-mail): where it sends (a "
                "webhook's secret path is not shown), whether it is failing, how many notices wait and the oldest, "
                "its last success and last error, and the notices it gave up (after [notify] give_up_after).",
                "  labq admin notify status\n  labq admin notify status --json | jq '.[] | select(.failing)'",
                _notify_status, c)
    p.add_argument("--json", action="store_true", help="print JSON")


def _notify_status(args: argparse.Namespace) -> int:
    import time

    from labq.render.notify import notify_status_table

    channels = leader_client(args).notify_status()
    return emit(args, channels, lambda: notify_status_table(channels, time.time()) if channels else
                "this lab has no notification channels ([notify.webhook] or [notify.email] in leader.toml)")


def _login(args: argparse.Namespace) -> int:
    from labq.cli.errors import CliError
    from labq.client import Client
    from labq.credentials import credentials_path, save_credentials
    from labq.tls import check_pin

    if args.pin is not None:
        try:
            args.pin = check_pin(args.pin)
        except ValueError as err:
            raise CliError(f"--pin: {err}") from None
    client = Client(args.url, args.token, timeout=15, pin=args.pin, ca_cache=credentials_path().parent)
    me = client.whoami()  # the pin, then the token: nothing is saved unless both hold
    path = save_credentials(client.url, client.token, pin=client.pin)
    trust = f", pinned to CA {client.pin}" if client.pin else ""
    print(escape_controls(f"logged in to {client.url} as {me.get('user')}{trust}; saved in {path}"))
    return 0


def _user_add(args: argparse.Namespace) -> int:
    import pwd

    from labq.credentials import credentials_path, credentials_text, save_credentials

    client = leader_client(args)
    user, token = client.add_user(args.name, args.admin)
    _warn_accounts(args.name, user)
    role = "admin" if user.get("admin") else "user"
    name = escape_controls(args.name)
    try:
        me = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a container's uid with no passwd entry
        me = os.environ.get("USER", "")
    target: tuple | None = None
    if args.print:
        pass
    elif args.name == me:
        target = (credentials_path(), None, None)
    elif os.geteuid() == 0:
        try:
            account = pwd.getpwnam(args.name)
            target = (credentials_path(account.pw_dir), account.pw_uid, account.pw_gid)
        except KeyError:
            pass
    if target is not None:
        try:
            path = save_credentials(client.url, token, *target, pin=client.pin)
            owned = f", owned by {name}" if target[1] is not None else ""
            print(escape_controls(f"added {role} {name}; saved the token to {path} (mode 0600{owned})"))
            return 0
        except (OSError, ApiError) as err:
            print(f"labq: warning: could not save the token ({escape_controls(err)}); here it is instead",
                  file=sys.stderr)
    print(f"added {role} {name}. The token is shown only now (running this again makes a new one).")
    if client.pin:
        print(f"{name} runs this one line, which saves it with the lab's CA pin:\n")
        print(shlex.join(["labq", "login", client.url, "--pin", client.pin, "--token", token]) + "\n")
    else:
        print(f"{name} puts these two lines in ~/.config/labq/credentials (chmod 600):\n")
        print(credentials_text(client.url, token))
    if "127.0.0.1" in client.url or "localhost" in client.url:
        print("(from another machine, use the leader's host name instead of this loopback address)")
    return 0


def _warn_accounts(name: str, user: dict) -> None:
    """Say which nodes have no account for the new user (their jobs will not run there), and which have not
    said; the leader asked the agents (a leader of an older labq does not, and this says nothing)."""
    lacking = user.get("no_account_on") or {}
    if lacking:
        print(escape_controls(f"labq: warning: no account for {name} on {', '.join(sorted(lacking))}: "
                              f"{name}'s jobs will not run there"), file=sys.stderr)
        for node, why in sorted(lacking.items()):
            print(escape_controls(f"  {node}: {why}"), file=sys.stderr)
        print(escape_controls(f"  make the account there, or map {name} to another account in that agent's "
                              "user-map.toml"), file=sys.stderr)
    unheard = user.get("not_heard_from") or []
    if unheard:
        print(escape_controls(f"labq: note: {', '.join(unheard)} {'has' if len(unheard) == 1 else 'have'} not said "
                              f"yet whether {'it has' if len(unheard) == 1 else 'they have'} an account for {name}"),
              file=sys.stderr)


def _user_ls(args: argparse.Namespace) -> int:
    from labq.render.tables import table

    users = leader_client(args).users()
    return emit(args, users, lambda: table(("NAME", "ADMIN"), [[u["name"], "yes" if u.get("admin") else ""]
                                                                 for u in users]))


def _user_rm(args: argparse.Namespace) -> int:
    user = leader_client(args).remove_user(args.name)
    print(f"removed user {escape_controls(user.get('name', args.name))}; their token no longer works")
    return 0


def _node_forget(args: argparse.Namespace) -> int:
    leader_client(args).forget_node(args.name)
    print(escape_controls(f"forgot node {args.name}: its certificate no longer works, and a join token may take "
                          "its name again (its agent, started anew, will join again)"))
    return 0
