"""Notifications on the wire: a person's settings (``GET``/``PUT /v1/notify``), a notice as the outbox keeps it, and
the webhook's body. Matched pairs, as ``labq.protocol.codec``; what people send is checked field by field.

The words ``labq submit --notify`` takes are in ``labq.protocol.requests`` (``NOTIFY_WORDS``), which the CLI loads
on every submit; this module is for the leader and for ``labq notify``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from labq.models.notify import Notice, NotifyEvent, NotifySettings
from labq.protocol.errors import bad_request
from labq.protocol.fields import Fields

MAX_EMAIL = 254  #: characters of an address (RFC 5321's path limit)
#: a plain address: one ``@``, a local part of the usual characters, a domain of dot-separated labels. No names,
#: comments, quotes, spaces or brackets: it goes into a header and to the SMTP server as it is
_EMAIL = r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?" \
         r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"


def email_problem(value: object) -> str | None:
    """What is wrong with ``value`` as an e-mail address, or None."""
    if not isinstance(value, str):
        return "email must be a string"
    if len(value) > MAX_EMAIL or not re.fullmatch(_EMAIL, value) or value.startswith(".") or ".." in value:
        return f"email {ascii(value[:64])} is not a plain address such as alice@lab.org"
    return None


def events_of(words: object, field: str, allowed: tuple[NotifyEvent, ...] = tuple(NotifyEvent)
              ) -> tuple[NotifyEvent, ...]:
    """A list of moments (``["end", "fail"]``) as events, each once, in the enum's order; 400 naming ``field``
    for anything else."""
    if not isinstance(words, list) or len(words) > 16:
        raise bad_request(f"{field} must be a list of {', '.join(e.value for e in allowed)}", field)
    found = set()
    for word in words:
        event = next((e for e in allowed if e.value == word), None)
        if event is None:
            shown = ascii(word)[:40]
            raise bad_request(f"{field}: {shown} is not one of {', '.join(e.value for e in allowed)}", field)
        found.add(event)
    return tuple(e for e in allowed if e in found)


@dataclass(frozen=True)
class SettingsRequest:
    """``PUT /v1/notify``: what to change of whose settings; None leaves a setting as it is."""

    user: str | None  #: whose (admins: anyone's); None: the sender's own
    on: tuple[NotifyEvent, ...] | None = None
    email: str | None = None  #: "" removes the address
    webhook: bool | None = None


def parse_settings(body: object) -> SettingsRequest:
    f = Fields(body, "notification settings")
    user = f.user_name("user")
    on = f.raw("on")
    email = f.raw("email")
    if email is not None and email != "":
        problem = email_problem(email)
        if problem is not None:
            raise bad_request(problem, "email")
    webhook = f.raw("webhook")
    if webhook is not None and not isinstance(webhook, bool):
        raise bad_request("webhook must be true or false", "webhook")
    f.done()
    request = SettingsRequest(user, events_of(on, "on") if on is not None else None, email, webhook)
    if (request.on, request.email, request.webhook) == (None, None, None):
        raise bad_request("say what to change: on, email or webhook", "on")
    return request


def encode_settings(settings: NotifySettings) -> dict:
    return {"on": [e.value for e in NotifyEvent if e in settings.on], "email": settings.email,
            "webhook": settings.webhook}


def decode_settings(doc: dict | None) -> NotifySettings:
    if not doc:
        return NotifySettings()
    return NotifySettings(frozenset(NotifyEvent(e) for e in doc.get("on", ())), doc.get("email"),
                          doc.get("webhook", True))


_NOTICE_FIELDS = ("key", "user", "at", "state", "job_id", "job_name", "attempt", "exit_code", "node", "reason",
                  "reservation", "gpus", "tasks")


def encode_notice(notice: Notice) -> dict:
    doc = {name: getattr(notice, name) for name in _NOTICE_FIELDS}
    doc["event"] = notice.event.value
    return doc


def decode_notice(doc: dict) -> Notice:
    return Notice(**{name: doc[name] for name in _NOTICE_FIELDS if name in doc}, event=NotifyEvent(doc["event"]))


def webhook_body(notice: Notice, text: str) -> dict:
    """What the webhook receives: ``text``, the one line Slack and Mattermost show, and labq's own fields under
    ``labq`` for a program (the values as they are: JSON escapes them)."""
    fields = {k: v for k, v in encode_notice(notice).items() if v is not None and v != ""}
    return {"text": text, "labq": fields}


__all__ = ["SettingsRequest", "decode_notice", "decode_settings", "email_problem", "encode_notice",
           "encode_settings", "events_of", "parse_settings", "webhook_body"]
