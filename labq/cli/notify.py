"""``labq notify``: what tells you of your jobs, and where; ``labq admin notify status`` is in ``labq.cli.admin``.

A person sets their own defaults (an admin anyone's with ``--user``): the moments of a job that notify them when it
was submitted without ``--notify``, their reservations' start and end, their e-mail address, and whether the lab's
webhook (its chat channel) gets their notices. The leader delivers through the channels the admin configured
(``[notify]`` in leader.toml); ``labq ls --watch`` shows your notices too.
"""

from __future__ import annotations

import argparse

from labq.cli.common import command, emit, leader_client, leader_option
from labq.cli.errors import CliError
from labq.terminal_text import escape_controls

EXAMPLES = """\
  labq notify                                   what notifies you, and where
  labq notify --on end,fail --email me@lab.org  e-mail when a job ends or fails
  labq notify --on end,fail,reservation         and when your reservations start and end
  labq notify --on none                         nothing unless a job asks (labq submit --notify)
  labq notify --no-webhook                      keep your notices out of the lab's chat channel
  labq notify --user alice --on fail            (admins) alice's defaults
"""


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = command(sub, "notify", "what tells you when your jobs start, end, fail or are preempted",
                "Show or change your notification defaults: the moments of a job submitted without --notify that "
                "notify you (start, end, fail, preempt), and your reservations' start and end (reservation); your "
                "e-mail address; whether the lab's webhook (its chat channel) gets your notices too. The leader "
                "delivers through the channels the admin set up (the answer lists them), retrying until they "
                "take them; `labq ls --watch` rings for them as well.", EXAMPLES, _notify, [leader_option()])
    p.add_argument("--on", metavar="WHEN[,WHEN]", help="start, end, fail, preempt, reservation; several with commas; "
                   "none: nothing")
    mail = p.add_mutually_exclusive_group()
    mail.add_argument("--email", metavar="ADDRESS", help="where the lab's e-mail channel writes to you")
    mail.add_argument("--no-email", action="store_true", help="no e-mail")
    hook = p.add_mutually_exclusive_group()
    hook.add_argument("--webhook", action="store_true", default=None, help="your notices go to the lab's webhook too "
                      "(the default)")
    hook.add_argument("--no-webhook", dest="webhook", action="store_false", default=None,
                      help="keep them out of the lab's webhook")
    p.add_argument("--user", metavar="NAME", help="another user's settings (admins)")
    p.add_argument("--json", action="store_true", help="print the settings as JSON")


def moments(text: str) -> list[str]:
    """``end,fail`` -> ["end", "fail"]; ``none`` -> []; a clear error for anything else."""
    from labq.models.notify import NotifyEvent

    words = [w.strip().lower() for w in text.split(",") if w.strip()]
    if words == ["none"]:
        return []
    allowed = [e.value for e in NotifyEvent]
    wrong = [w for w in words if w not in allowed]
    if wrong or not words:
        raise CliError(f"--on {wrong[0]!r} is not a moment: use {', '.join(allowed)} (several with commas), or none"
                       if wrong else f"--on names no moment: use {', '.join(allowed)}, or none")
    return list(dict.fromkeys(words))


def _notify(args: argparse.Namespace) -> int:
    change = {"on": moments(args.on) if args.on is not None else None,
              "email": "" if args.no_email else args.email, "webhook": args.webhook}
    client = leader_client(args)
    if all(v is None for v in change.values()):
        settings = client.notify_settings(args.user)
    else:
        settings = client.set_notify(user=args.user, **change)
    return emit(args, settings, lambda: settings_text(settings))


def settings_text(s: dict) -> str:
    """A person's settings in a few lines, with what the lab's channels make of them."""
    on, channels = s.get("on") or [], s.get("channels") or []
    name = escape_controls(s.get("user", "you"))
    lines = [f"{name} is told of: {', '.join(on) if on else 'nothing'}"
             + (" (for jobs submitted without --notify)" if on else " unless a job asks (labq submit --notify)")]
    email = s.get("email")
    lines.append(f"e-mail: {escape_controls(email)}" if email else "e-mail: none (labq notify --email ADDRESS)")
    lines.append(f"the lab's webhook: {'yes' if s.get('webhook', True) else 'no'}")
    lines.append(f"the lab's channels: {', '.join(channels) if channels else 'none'}; and labq ls --watch")
    if email and "email" not in channels:
        lines.append("note: this lab sends no e-mail (the admin sets [notify.email] in leader.toml)")
    if on and not ("webhook" in channels and s.get("webhook", True)) and not (email and "email" in channels):
        lines.append("note: no channel reaches you: you see your notices only in labq ls --watch")
    return "\n".join(lines)
