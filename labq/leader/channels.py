"""Where the leader sends notices: the lab's webhook (a chat channel) and e-mail over SMTP.

Each channel has one method that does I/O, ``send(notice, to)``, which returns once the other side took the notice
and raises ``DeliveryFailed`` (with a sentence for the admin's status) otherwise; the outbox
(``labq.leader.outbox``) calls it outside the leader's lock, from the channel's own thread, and retries.

A notice carries user text (a job's name, typed by its owner; old databases and other versions may hold
anything): each channel shows it safely in its own medium. For a chat, control characters are escaped, ``&``,
``<`` and ``>`` are written as entities (Slack's rule; an unescaped ``<!channel>`` would page everyone) and the
name goes into a code span, where neither Slack nor Mattermost reads mentions or markup. For e-mail, the
subject and body are built by ``email.message.EmailMessage`` from escaped text, so no header can be injected.
"""

from __future__ import annotations

import json
import smtplib
import ssl
from email.message import EmailMessage
from email.utils import formatdate

from labq import __version__
from labq.leader.config import NotifyConfig
from labq.models.notify import Notice
from labq.protocol.notify import webhook_body
from labq.terminal_text import escape_controls
from labq.transport import Request, Transport, socket_transport, split_url


class DeliveryFailed(Exception):
    """The channel did not take the notice; the message says why, for the admin's status."""


def describe(err: BaseException) -> str:
    """An error of a send as one short line for the status: the channel's own sentence, else its type and text."""
    if isinstance(err, DeliveryFailed):
        return escape_controls(str(err))[:300]
    text = getattr(err, "strerror", None) or str(err) or ""
    return escape_controls(f"{type(err).__name__}: {text}" if text else type(err).__name__)[:300]


class Webhook:
    """An HTTP POST of the notice as JSON (``labq.protocol.notify.webhook_body``); any 2xx is delivered."""

    name = "webhook"

    def __init__(self, url: str, timeout_s: float = 10.0, transport: Transport = socket_transport) -> None:
        self.url, self.timeout_s, self.transport = url, timeout_s, transport
        parts = split_url(url)
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        #: what the status shows of it: its scheme, host and port; the path of a Slack webhook is its secret
        self.target = f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "") + "/..."

    def wants(self, email: str | None, webhook: bool) -> bool:
        return webhook

    def send(self, notice: Notice, to: str | None = None) -> None:
        body = json.dumps(webhook_body(notice, chat_line(notice))).encode()
        request = Request("POST", self.url, {"Content-Type": "application/json", "User-Agent": "labq"}, body,
                          timeout=self.timeout_s, tls=self._tls)
        response = self.transport(request)
        try:
            answer = response.read()[:200]
        finally:
            response.close()
        if not 200 <= response.status < 300:
            said = escape_controls(answer.decode("utf-8", "replace").strip())
            raise DeliveryFailed(f"the webhook answered HTTP {response.status}" + (f": {said}" if said else ""))


def chat_line(notice: Notice) -> str:
    """The notice's headline for a chat: escaped, its user text in code spans, ``& < >`` as Slack asks."""
    line = escape_controls(notice.headline(quote=lambda text: "`" + text.replace("`", "'") + "`"))
    return line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Email:
    """A message over SMTP to the address the person set: STARTTLS (checked against the system's CAs, or the
    admin's ``ca_file``) unless the admin turned it off, a login when configured. Any refusal of the server is a
    failed delivery."""

    name = "email"

    def __init__(self, config: NotifyConfig) -> None:
        self.config = config
        self.target = f"smtp://{config.smtp_host}:{config.smtp_port}" + (" (STARTTLS)" if config.smtp_starttls else "")

    def wants(self, email: str | None, webhook: bool) -> bool:
        return email is not None

    def send(self, notice: Notice, to: str | None = None) -> None:
        if not to:
            raise DeliveryFailed(f"{notice.user} has no e-mail address any more")
        c = self.config
        with smtplib.SMTP(c.smtp_host, c.smtp_port, timeout=c.smtp_timeout_s) as smtp:
            if c.smtp_starttls:
                smtp.starttls(context=ssl.create_default_context(cafile=c.smtp_ca_file))
            if c.smtp_user is not None:
                smtp.login(c.smtp_user, c.smtp_password or "")
            refused = smtp.send_message(message(notice, c.email_from, to))
        if refused:
            raise DeliveryFailed(f"the server refused {', '.join(refused)}")


def message(notice: Notice, sender: str, to: str) -> EmailMessage:
    """The e-mail of a notice: its subject and headline escaped (a name with a newline is ``\\n``, never a new
    header), the facts one a line, and the key as the Message-ID's left part for a receiver that de-duplicates."""
    mail = EmailMessage()
    mail["From"], mail["To"] = sender, to
    mail["Subject"] = escape_controls(notice.subject())
    mail["Date"] = formatdate(notice.at, localtime=False, usegmt=True)
    key = "".join(c if c.isascii() and (c.isalnum() or c in ".-_") else "-" for c in notice.key)
    mail["Message-ID"] = f"<labq.{key}@{sender.rpartition('@')[2]}>"  # the same each time the notice is sent
    facts = [("job", notice.job_id), ("name", notice.job_name or None), ("attempt", notice.attempt),
             ("state", notice.state), ("exit code", notice.exit_code), ("node", notice.node),
             ("reservation", notice.reservation), ("GPUs", notice.gpus)]
    lines = [escape_controls(notice.headline()), ""]
    lines += [f"{name}: {escape_controls(value)}" for name, value in facts if value is not None]
    lines += ["", f"-- labq {__version__}: `labq notify` says what notifies you, and changes it"]
    mail.set_content("\n".join(lines) + "\n")
    return mail


def channels_of(config: NotifyConfig) -> dict[str, Webhook | Email]:
    """The channels the admin configured, by name."""
    found: dict[str, Webhook | Email] = {}
    if config.webhook_url:
        found["webhook"] = Webhook(config.webhook_url, config.webhook_timeout_s)
    if config.smtp_host:
        found["email"] = Email(config)
    return found
