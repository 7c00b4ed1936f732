"""The agent's local socket: people on a lab workstation use the queue with no token (MUNGE's idea).

The agent serves the leader's API on a Unix socket (``/run/labq/agent.sock`` by default, mode 0666). The
kernel tells who connected (``SO_PEERCRED``: the caller's uid, as it was at ``connect``, which no process
can choose), the agent maps that account to the lab user (``Accounts.lab_user_of``: by name, or by the
admin's user map), and forwards the request to the leader under its own identity with the user it vouches
for (``labq.protocol.identity.USER_HEADER``). Whatever the caller sent as credentials is dropped: on this
socket a request is always its caller's, never the agent's own. The answer comes back as the leader gave
it, an event stream line by line.
"""

from __future__ import annotations

import logging
import os
import socket
import socketserver
import stat
import struct
from collections.abc import Callable
from pathlib import Path

from labq.http_server import JsonHandler
from labq.protocol.errors import ApiError
from labq.transport import Request, Response

log = logging.getLogger("labq.agent")

DEFAULT_PATH = Path("/run/labq/agent.sock")
MAX_BODY = (1 << 20) + 4096  #: the leader's limit on a request body, and a little more
#: what a caller's request keeps when forwarded; credentials and labq's own headers never pass
FORWARDED = ("content-type", "accept", "content-length")
#: what the leader's answer keeps
ANSWERED = ("content-type", "content-length", "allow", "retry-after", "cache-control", "x-labq-offset",
            "x-labq-done", "x-labq-attempt")
REQUEST_TIMEOUT_S = 10.0


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket, from the kernel (``SO_PEERCRED``)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


class LocalSocket:
    """Serves ``forward(user, request) -> Response`` to this machine's accounts, each as the lab user
    ``identify(uid)`` names (it raises ``LookupError`` with a sentence for an account that is none)."""

    def __init__(self, path: Path, identify: Callable[[int], str],
                 forward: Callable[[str, Request], Response]) -> None:
        self.path = path
        _clear_stale(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.server = _UnixServer(str(path), _Handler)
        self.server.identify, self.server.forward = identify, forward
        os.chmod(path, 0o666)  # anyone here may ask; the kernel says who they are

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def close(self, started: bool) -> None:
        if started:
            self.server.shutdown()
        self.server.server_close()
        try:
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                os.unlink(self.path)
        except OSError:
            pass


def _clear_stale(path: Path) -> None:
    """Remove a socket file nobody listens on (an agent killed before it could); refuse to take over one an
    agent still serves, or a file that is not a socket."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError:
        os.unlink(path)  # nobody answers: a dead agent's
        return
    finally:
        probe.close()
    raise OSError(f"another labq agent serves {path} already")


class _UnixServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    request_timeout_s = REQUEST_TIMEOUT_S
    tls = None
    identify: Callable[[int], str]
    forward: Callable[[str, Request], Response]


class _Handler(JsonHandler):
    server: _UnixServer
    logger = log

    def address_string(self) -> str:
        return f"uid {getattr(self, 'uid', '?')}"

    def __getattr__(self, name: str):
        if name.startswith("do_"):
            return self._relay
        raise AttributeError(name)

    def _relay(self) -> None:
        self.close_connection = True  # one request a connection, as the CLI sends them
        try:
            self.uid = peer_uid(self.request)
            try:
                user = self.server.identify(self.uid)
            except LookupError as err:
                raise ApiError(401, "unauthorized", f"this machine's agent cannot vouch for you: {err}") from None
            request = Request(self.command, "http://localhost" + self.path, self._headers(), self.read_body(MAX_BODY), 60.0)
            answer = self.server.forward(user, request)
        except ApiError as err:
            self.send_json(err.status, err.to_json())
            return
        try:
            self._answer(answer)
        finally:
            answer.close()

    def _headers(self) -> dict[str, str]:
        return {k: v for k, v in self.headers.items() if k.lower() in FORWARDED}

    def _answer(self, answer: Response) -> None:
        self.send_response(answer.status)
        for name, value in answer.headers.items():
            if name in ANSWERED:
                self.send_header(name, value)
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command == "HEAD":
            return
        if answer.header("content-length") is not None:
            self.wfile.write(answer.read())
            return
        self.request.settimeout(None)  # a stream: as long as the leader sends
        try:
            while line := answer.readline():  # an event stream, passed on as it comes
                self.wfile.write(line)
                self.wfile.flush()
        except OSError as err:  # the leader or the caller went away: this stream ends, the socket serves on
            log.debug("a stream through the local socket ended: %s", err)
