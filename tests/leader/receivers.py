"""Real receivers of the leader's notifications on loopback: an HTTP server for the webhook (``http.server`` in a
thread) and an SMTP server (``aiosmtpd``), each keeping what it received and waking whoever waits for it.

The webhook receiver can go ``down`` (its socket closed: connections are refused) and come back ``up`` on the same
port, or answer with an error status (``answer``), so that a test sees the leader retry.
"""

from __future__ import annotations

import email
import email.policy
import json
import socket
import threading
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class WebhookReceiver:
    """``url`` takes POSTs of JSON; ``bodies`` are those it answered 2xx, in order."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.refused = 0  #: requests it answered with ``answer`` >= 300
        self.answer = 200  #: the status it answers with
        self.answer_text = b""
        self.changed = threading.Condition()
        self.server: ThreadingHTTPServer | None = None
        self.port = 0
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/T000/B000/secret-path"

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.changed:
                    status, text = receiver.answer, receiver.answer_text
                    if status < 300:
                        receiver.bodies.append(json.loads(data))
                    else:
                        receiver.refused += 1
                    receiver.changed.notify_all()
                self.send_response(status)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, name="test-webhook", daemon=True).start()

    def down(self) -> None:
        """Close the listening socket: the leader's connections are refused until ``up``."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def wait_for(self, count: int, timeout: float = 15.0) -> list[dict]:
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.bodies) >= count, timeout):
                raise AssertionError(f"the webhook got {len(self.bodies)} notices in {timeout} s, not {count}: "
                                     f"{self.bodies}")
            return list(self.bodies)

    def wait_refused(self, count: int, timeout: float = 15.0) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: self.refused >= count, timeout):
                raise AssertionError(f"the webhook refused {self.refused} requests in {timeout} s, not {count}")

    def close(self) -> None:
        self.down()


class SmtpReceiver:
    """An SMTP server on loopback; ``messages`` are (envelope sender, recipients, parsed message)."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[tuple[str, list[str], EmailMessage]] = []
        self.changed = threading.Condition()
        receiver = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
                message = email.message_from_bytes(envelope.content, policy=email.policy.default)
                with receiver.changed:
                    receiver.messages.append((envelope.mail_from, list(envelope.rcpt_tos), message))
                    receiver.changed.notify_all()
                return "250 OK"

        for _ in range(5):  # aiosmtpd's controller needs a port number: a free one, taken again at once
            probe = socket.socket()
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
            probe.close()
            self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)
            try:
                self.controller.start()
                return
            except OSError:  # taken meanwhile: another
                continue
        raise AssertionError("no free port for the SMTP receiver")

    def wait_for(self, count: int, timeout: float = 15.0) -> list[tuple[str, list[str], EmailMessage]]:
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.messages) >= count, timeout):
                raise AssertionError(f"the SMTP server got {len(self.messages)} messages in {timeout} s, not {count}")
            return list(self.messages)

    def close(self) -> None:
        self.controller.stop()
