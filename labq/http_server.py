"""The one HTTP server of labq's daemons: the leader's API (``labq.leader.http``) and the agent's log server.

The standard library's threading server, hardened the same way for both: reading a request has a time
limit, one address may hold only so many connections (more are answered 503 without a thread), every
refusal of the standard library's own is JSON, and tokens are compared in constant time. A request's head
is read here (``read_headers``), strictly and without the ``email`` package, and an answer goes out in one
write: sent as two, a head and then a body, it cost a stream of submits twice the leader's time per answer
(``bench/scale.py``: about 1.1 ms of CPU each against 0.6, and as many more acknowledgements a second).

``JsonHandler`` is the base of a request handler; ``serve_app`` serves an *app*, a
``labq.transport.Request -> Response`` function, which a test can also call in-process through
``labq.transport.in_process``.
"""

from __future__ import annotations

import email.utils
import hmac
import json
import logging
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from labq import __version__
from labq.protocol.errors import ApiError
from labq.transport import App, Request, in_process

log = logging.getLogger("labq.http")
REQUEST_TIMEOUT_S = 10.0  #: the defaults of ``serve_app``, as the leader's config has them
MAX_CONNECTIONS_PER_ADDRESS = 128
#: a kept-alive connection waits this long for its next request, then closes: its thread and its share of
#: ``MAX_CONNECTIONS_PER_ADDRESS`` go back (``labq.transport.KeptConnections`` reuses one for less)
KEEPALIVE_IDLE_S = 5.0
APP_MAX_BODY = 1 << 20  #: the largest request body ``serve_app`` reads
#: the standard library's own refusals (a bad request line, headers too long) by labq's codes
STDLIB_CODES = {400: "bad_request", 408: "timeout", 413: "too_large", 414: "too_large", 431: "too_large",
                505: "http_version"}
MAX_LINE = 65536  #: the longest request line or header line, and
MAX_HEADERS = 100  #: the most header lines a request may have (both as the standard library's http.client)


class Server(ThreadingHTTPServer):
    """One thread a connection, at most ``max_connections_per_address`` of them from one address: a client that
    opens connections and sends nothing (or very slowly) ties up only its own share."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  #: the default listen backlog of 5 drops connections when many submit at once

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], *,
                 request_timeout_s: float = REQUEST_TIMEOUT_S,
                 max_connections_per_address: int = MAX_CONNECTIONS_PER_ADDRESS, tls=None) -> None:
        self.request_timeout_s = request_timeout_s
        #: an ``ssl.SSLContext`` to serve TLS with; the handshake happens in the connection's own thread, under
        #: the request time limit, so a client that never finishes one holds up nobody else
        self.tls = tls
        self.max_connections_per_address = max_connections_per_address
        self._open: dict[str, int] = {}
        self._open_lock = threading.Lock()
        self._connections: set = set()  #: the open connections' sockets, which ``server_close`` closes
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        host = client_address[0]
        with self._open_lock:
            count = self._open.get(host, 0)
            if count < self.max_connections_per_address:
                self._open[host] = count + 1
        if count >= self.max_connections_per_address:
            _refuse_busy(request, host, count)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._closed(host)
            raise

    def process_request_thread(self, request, client_address) -> None:
        with self._open_lock:
            self._connections.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._connections.discard(request)
            self._closed(client_address[0])

    def server_close(self) -> None:
        """Stop listening and end the open connections too: a closed server answers nothing more, not even
        on a connection a client kept alive."""
        super().server_close()
        with self._open_lock:
            connections = list(self._connections)
        for sock in connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _closed(self, host: str) -> None:
        with self._open_lock:
            left = self._open.get(host, 1) - 1
            if left > 0:
                self._open[host] = left
            else:
                self._open.pop(host, None)


def _refuse_busy(request, host: str, count: int) -> None:
    """Answer 503 without a thread and without reading: the answer fits the socket's buffer, so this never
    blocks the accepting thread."""
    doc = ApiError(503, "busy", f"{count} connections from {host} are open already; close some and retry").to_json()
    payload = json.dumps(doc).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}"
            "\r\nRetry-After: 1\r\nConnection: close\r\n\r\n").encode()
    try:
        request.setblocking(False)
        request.send(head + payload)
    except OSError:
        pass


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer ...`` header; None for none or another scheme."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def same_secret(given: str | None, expected: str | None) -> bool:
    """Whether a token someone sent is the expected one, in time that does not tell how much of it matched."""
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode("utf-8", "surrogateescape"))


class Headers:
    """A request's header fields, each name whatever its case: ``email.message.Message``'s ``get``, ``get_all``,
    ``in`` and ``items``, which the handlers use."""

    def __init__(self, fields: list[tuple[str, str]]) -> None:
        self._fields = fields
        self._values: dict[str, list[str]] = {}
        for name, value in fields:
            self._values.setdefault(name.lower(), []).append(value)

    def get(self, name: str, default: str | None = None) -> str | None:
        """The first value of ``name``."""
        values = self._values.get(name.lower())
        return values[0] if values else default

    def get_all(self, name: str, default: list[str] | None = None) -> list[str] | None:
        return list(self._values.get(name.lower(), ())) or default

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._values

    def items(self) -> list[tuple[str, str]]:
        return list(self._fields)


class BadHead(Exception):
    """A request's head that cannot be read: the status and the reason to answer with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def read_headers(rfile) -> Headers:
    """The header fields of a request, up to its blank line. Each line must be ``name: value``: a folded
    line (one starting with a space) or one without a name is refused, as RFC 9112 lets a server do, so that
    no two readers of one request can see different fields."""
    fields = []
    while True:
        line = rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise BadHead(431, "a header line is longer than %d bytes" % MAX_LINE)
        if line in (b"\r\n", b"\n", b""):
            return Headers(fields)
        if len(fields) == MAX_HEADERS:
            raise BadHead(431, "more than %d header lines" % MAX_HEADERS)
        name, colon, value = line.decode("iso-8859-1").partition(":")
        if not colon or not name or not name.isprintable() or " " in name:
            raise BadHead(400, "a header line is not 'name: value': %s" % ascii(line[:80]))
        fields.append((name, value.strip()))


_date = (0, "")  #: the Date header of the current second, made once a second: (the second, the text)


def http_date() -> str:
    """Now, as an answer's Date header says it."""
    global _date
    second = int(time.time())
    if _date[0] != second:
        _date = (second, email.utils.formatdate(second, usegmt=True))
    return _date[1]


class JsonHandler(BaseHTTPRequestHandler):
    """A request handler whose refusals are JSON. Reading a request has the server's time limit (on every
    recv and send: an answer that may take long, a long poll or an event stream, waits in its own code)."""

    server: Server
    protocol_version = "HTTP/1.1"
    server_version = f"labq/{__version__}"
    logger = log
    allow: str | None = None  #: the path's methods, sent with a 405 and with an answer to OPTIONS

    def setup(self) -> None:
        self.timeout = self.server.request_timeout_s  # socketserver sets it on the socket: every recv and send
        if self.request.family in (socket.AF_INET, socket.AF_INET6):
            # an answer's head and body go out in two writes; without this the body waits for the client's
            # delayed ACK (40 ms), which TLS makes every request pay
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.handshake_failed = False
        if self.server.tls is not None:
            import ssl

            self.request.settimeout(self.timeout)
            try:
                self.request = self.server.tls.wrap_socket(self.request, server_side=True)
            except (ssl.SSLError, OSError) as err:  # plain HTTP, a scanner, a client that gave up: nothing to say
                self.logger.debug("no TLS handshake with %s: %s", self.client_address[0], err)
                self.handshake_failed = True
        super().setup()

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if self.server.tls is not None:  # the TLS socket took over the connection: close it here
                try:
                    self.request.close()
                except OSError:
                    pass

    def handle(self) -> None:
        """The requests of one connection, one after the other while the client keeps it alive; between two,
        it waits ``KEEPALIVE_IDLE_S`` at most (each request itself has the request time limit)."""
        if self.handshake_failed:
            return
        try:
            self.close_connection = True
            self.handle_one_request()
            while not self.close_connection and self._next_request():
                self.handle_one_request()
        except (ConnectionError, TimeoutError):  # the client went away or stalled mid-request: nothing to answer
            self.close_connection = True

    def _next_request(self) -> bool:
        """Whether a next request starts on this connection within ``KEEPALIVE_IDLE_S``."""
        try:
            self.connection.settimeout(min(KEEPALIVE_IDLE_S, self.timeout or KEEPALIVE_IDLE_S))
            started = bool(self.rfile.peek(1))
        except (OSError, ValueError):  # idle too long, or closed
            return False
        self.connection.settimeout(self.timeout)
        return started

    def parse_request(self) -> bool:
        """The standard library's reading of the request line and the head, with the header fields read by
        ``read_headers`` (the ``email`` package it uses costs a small request a tenth of its time, and reads a
        malformed line as it can). HTTP/0.9, a request line of two words, is refused."""
        self.command, self.request_version, self.close_connection = None, "HTTP/0.9", True
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if not words:
            return False
        if len(words) != 3:
            self.send_error(400, "Bad request syntax (%r)" % self.requestline[:200])
            return False
        command, path, version = words
        numbers = version[5:].split(".") if version.startswith("HTTP/") else []
        if len(numbers) != 2 or not all(n.isdigit() and len(n) <= 10 for n in numbers):
            self.send_error(400, "Bad request version (%r)" % version[:40])
            return False
        number = int(numbers[0]), int(numbers[1])
        if number >= (2, 0):
            self.send_error(505, "Invalid HTTP version (%s)" % version[5:45])
            return False
        self.request_version = version
        self.close_connection = number < (1, 1)
        self.command, self.path = command, "/" + path.lstrip("/") if path.startswith("//") else path
        try:
            self.headers = read_headers(self.rfile)
        except BadHead as err:
            self.send_error(err.status, str(err))
            return False
        connection = self.headers.get("Connection", "").lower()
        if connection == "close":
            self.close_connection = True
        elif connection == "keep-alive":
            self.close_connection = False
        if self.headers.get("Expect", "").lower() == "100-continue" and number >= (1, 1):
            return self.handle_expect_100()
        return True

    def send_response(self, code: int, message: str | None = None) -> None:
        """The standard library's status line, Server and Date; logged only where debug logging is on (the
        standard library formats the log line for every answer)."""
        if self.logger.isEnabledFor(logging.DEBUG):
            self.log_request(code)
        self.send_response_only(code, message)
        self.send_header("Server", self.version_string())
        self.send_header("Date", http_date())

    def log_message(self, fmt: str, *args) -> None:
        self.logger.debug("%s %s", self.address_string(), fmt % args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's refusals (a bad request line, headers too long), as JSON."""
        self.close_connection = True
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "error"
        text = message or explain or phrase
        self.send_json(code, ApiError(code, STDLIB_CODES.get(code, "bad_request"), text).to_json())

    def read_body(self, limit: int) -> bytes | None:
        """A small request body, whole (None for none); ``ApiError`` for one sent without a Content-Length
        or announced over ``limit``."""
        if "Transfer-Encoding" in self.headers:
            raise ApiError(411, "length_required", "send the body with a Content-Length (no Transfer-Encoding)")
        text = self.headers.get("Content-Length", "").strip()
        if not text:
            return None
        if not text.isdigit() or int(text) > limit:
            raise ApiError(413 if text.isdigit() else 400, "too_large" if text.isdigit() else "bad_request",
                           f"Content-Length must be a number of bytes up to {limit}, not {ascii(text)[:40]}")
        return self.rfile.read(int(text))

    def bearer_token(self) -> str | None:
        return bearer_token(self.headers.get("Authorization", ""))

    def send_json(self, status: int, doc: object) -> None:
        """Sends ``doc`` as JSON; bytes are JSON already."""
        payload = doc if isinstance(doc, bytes) else json.dumps(doc, separators=(",", ":")).encode()
        self.send_answer(status, {"Content-Type": "application/json"}, payload)

    def send_answer(self, status: int, headers: dict[str, str], payload: bytes) -> None:
        """A whole answer with its Content-Length; a HEAD gets the headers only."""
        if self.request_version not in ("HTTP/1.0", "HTTP/1.1"):  # a garbled request line: still a status line
            self.request_version = "HTTP/1.0"
            self.close_connection = True
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        if self.allow and (status == 405 or self.command == "OPTIONS"):
            self.send_header("Allow", self.allow)
        if self.close_connection:
            self.send_header("Connection", "close")
        # the head and the body in one write (``end_headers`` would send the head on its own)
        self._headers_buffer += (b"\r\n", payload if self.command != "HEAD" else b"")
        self.flush_headers()


class AppHandler(JsonHandler):
    """Serves the server's ``app``: the request, its body read whole, as a ``Request``; the answer whole."""

    server: AppServer

    def _serve(self) -> None:
        try:
            body = self._body()
        except ApiError as err:
            self.close_connection = True
            return self.send_json(err.status, err.to_json())
        host, port = self.server.server_address[:2]
        request = Request(self.command, f"http://{host}:{port}{self.path}", dict(self.headers.items()), body,
                          self.server.request_timeout_s)
        response = self.server.transport(request)
        try:
            payload = response.read()
        finally:
            response.close()
        headers = {k: v for k, v in response.headers.items() if k not in ("content-length", "connection")}
        self.send_answer(response.status, headers, payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _serve

    def _body(self) -> bytes | None:
        return self.read_body(APP_MAX_BODY)


class AppServer(Server):
    def __init__(self, app: App, address: tuple[str, int], **limits) -> None:
        self.app = app
        self.transport = in_process(app, on_bug=lambda request: log.exception("internal error on %r", request))
        super().__init__(address, AppHandler, **limits)


def serve_app(app: App, address: tuple[str, int], *, request_timeout_s: float = REQUEST_TIMEOUT_S,
              max_connections_per_address: int = MAX_CONNECTIONS_PER_ADDRESS, tls=None) -> AppServer:
    """Bind ``app`` (over TLS with ``tls``, an ``ssl.SSLContext``); the caller runs ``serve_forever`` (and
    ``shutdown`` and ``server_close`` to stop)."""
    return AppServer(app, address, request_timeout_s=request_timeout_s,
                     max_connections_per_address=max_connections_per_address, tls=tls)
