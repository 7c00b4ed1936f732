"""One HTTP seam: a ``Request``, a ``Response``, and a ``Transport`` that turns one into the other.

httpx's ``handle_request`` idea: whatever in labq speaks HTTP to another labq process (the client of the
CLI and the TUI, the agent's registration and syncs, the leader's fetch of a job's log from a node) builds
a ``Request`` and hands it to a transport, a plain callable. ``socket_transport`` sends it over a socket
(``labq.wire``: no ``http.client`` for plain HTTP). A server's side is the same shape: an *app* is a
``Request -> Response`` function, ``labq.http_server.serve_app`` serves one on a socket, and
``in_process(app)`` is a transport that calls it directly, for tests that need no socket.

Plain classes, no ``dataclasses``, ``http.client`` or ``email``: the CLI imports this on every start.
Network failures are ``OSError`` (``labq.wire.WireError`` for a malformed answer), as callers expect.
"""

from __future__ import annotations

import io
import json
from _thread import allocate_lock
from collections.abc import Callable
from time import monotonic

from labq.protocol.errors import ApiError
from labq.wire import Connection, NoAnswer

TYPE_CHECKING = False  # typing's, without importing typing: 3 ms of the CLI's start (type checkers take it as true)
if TYPE_CHECKING:  # typing.Protocol, for type checkers only
    from typing import Protocol

    class Body(Protocol):
        """A response's body as it arrives: the part of a binary file the callers use (and, optionally,
        ``interrupt()``)."""

        def read(self) -> bytes: ...

        def readline(self) -> bytes: ...

        def close(self) -> None: ...


class Url:
    """An absolute URL's parts as the seam uses them: ``urllib.parse.urlsplit``'s ``scheme``, ``hostname``
    (lower case) and ``port``, and the ``target`` (path and query) that goes on a request line."""

    __slots__ = ("scheme", "hostname", "port", "path", "query")

    def __init__(self, scheme: str, hostname: str | None, port: int | None, path: str, query: str) -> None:
        self.scheme, self.hostname, self.port, self.path, self.query = scheme, hostname, port, path, query

    @property
    def target(self) -> str:
        return (self.path or "/") + ("?" + self.query if self.query else "")


#: a URL any of these is in goes to urllib.parse: IPv6 literals, user info, fragments, backslashes
_UNUSUAL = frozenset("[]@#\\ \t\r\n")


def split_url(url: str) -> Url:
    """``url``'s parts; ValueError for a port that is not one, as ``urlsplit(url).port`` raises. The plain
    ``scheme://host:port/path?query`` of labq's addresses is split here; anything else by ``urllib.parse``, whose
    import (with ``ipaddress``) would be a tenth of the CLI's start."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.isalpha() and _UNUSUAL.isdisjoint(rest):
        end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
        netloc, tail = rest[:end], rest[end:]
        path, _, query = tail.partition("?")
        host, colon, port_text = netloc.rpartition(":")
        if not colon:
            host, port_text = netloc, ""
        if port_text and (not port_text.isdigit() or int(port_text) > 65535):
            raise ValueError(f"Port out of range or not a number: {port_text!r}")
        return Url(scheme.lower(), host.lower() or None, int(port_text) if port_text else None, path, query)
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return Url(parts.scheme, parts.hostname, parts.port, parts.path, parts.query)


_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def quote_part(text: str) -> str:
    """``urllib.parse.quote(text, safe="")``: a path segment, every byte but the unreserved ones %-escaped."""
    return "".join(chr(b) if b in _PLAIN else f"%{b:02X}" for b in text.encode())


def encode_query(pairs) -> str:
    """``urllib.parse.urlencode(pairs)`` for a list of (name, value) pairs: values as ``str()``, spaces as +."""
    return "&".join(f"{_quote_plus(str(k))}={_quote_plus(str(v))}" for k, v in pairs)


def _quote_plus(text: str) -> str:
    return "".join(chr(b) if b in _PLAIN else "+" if b == 32 else f"%{b:02X}" for b in text.encode())


class Request:
    """One HTTP request: ``url`` is absolute (``http://host:port/path?query``); ``timeout`` is per read;
    ``tls`` the ``ssl.SSLContext`` of an ``https://`` one (``labq.tls``: pinned to the lab's CA)."""

    __slots__ = ("method", "url", "headers", "body", "timeout", "tls")

    def __init__(self, method: str, url: str, headers: dict[str, str] | None = None, body: bytes | None = None,
                 timeout: float = 30.0, tls=None) -> None:
        self.method, self.url, self.headers, self.body, self.timeout = method, url, dict(headers or {}), body, timeout
        self.tls = tls

    def __repr__(self) -> str:
        return f"Request({self.method!r}, {self.url!r})"

    @property
    def target(self) -> str:
        """What goes on the request line: the path and query."""
        return split_url(self.url).target

    @property
    def path(self) -> str:
        return split_url(self.url).path or "/"

    @property
    def query(self) -> dict[str, list[str]]:
        from urllib.parse import parse_qs  # a server's side reads queries: it has urllib.parse already

        return parse_qs(split_url(self.url).query)

    def header(self, name: str, default: str | None = None) -> str | None:
        """A header by its name, in any case."""
        wanted = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == wanted), default)


class Response:
    """One HTTP answer: a status, headers (by lower-case name) and a body read once, possibly as it arrives.

    ``close()`` when done; ``interrupt()``, from another thread, makes a blocked read return as at the end.
    """

    __slots__ = ("status", "headers", "_body")

    def __init__(self, status: int, headers: dict[str, str] | None = None, body: bytes | Body = b"") -> None:
        self.status = status
        self.headers = {k.lower(): v for k, v in (headers or {}).items()}
        self._body = io.BytesIO(body) if isinstance(body, bytes) else body

    def __repr__(self) -> str:
        return f"Response({self.status})"

    @classmethod
    def json(cls, status: int, doc: object, headers: dict[str, str] | None = None) -> Response:
        payload = json.dumps(doc, separators=(",", ":")).encode()
        return cls(status, {"Content-Type": "application/json", **(headers or {})}, payload)

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)

    def read(self) -> bytes:
        return self._body.read()

    def readline(self) -> bytes:
        return self._body.readline()

    def close(self) -> None:
        self._body.close()

    def interrupt(self) -> None:
        stop = getattr(self._body, "interrupt", None)
        if stop is not None:
            stop()


Transport = Callable[[Request], Response]
App = Callable[[Request], Response]  #: a server's side of the seam: what it answers to a request


class _SocketBody:
    """A response body on its connection, which closes with it (or, read whole, goes back to ``kept``)."""

    def __init__(self, conn: Connection, answer, kept: KeptConnections | None = None, key: tuple = ()) -> None:
        self._conn, self._answer, self._kept, self._key = conn, answer, kept, key

    def read(self) -> bytes:
        return self._answer.read()

    def readline(self) -> bytes:
        return self._answer.readline()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._kept is not None and conn.reusable:
            self._kept.put(self._key, conn)
        else:
            conn.close()

    def interrupt(self) -> None:
        conn = self._conn
        if conn is not None:
            conn.interrupt()


def _exchange(conn: Connection, request: Request, kept: KeptConnections | None = None, key: tuple = ()) -> Response:
    """Sends ``request`` on ``conn`` and returns once the answer's headers are in."""
    try:
        conn.request(request.method, request.target, body=request.body, headers=request.headers,
                     timeout=request.timeout)
        answer = conn.getresponse()
    except BaseException:
        conn.close()
        raise
    return Response(answer.status, answer.headers, _SocketBody(conn, answer, kept, key))


def socket_transport(request: Request) -> Response:
    """Sends ``request`` on a new connection (``Connection: close``), over TLS for ``https://``."""
    parts = split_url(request.url)
    return _exchange(Connection(parts.hostname or "", parts.port, request.timeout, https=parts.scheme == "https",
                                context=request.tls), request)


#: requests that may be sent again when a kept connection turns out closed before it answered: they change nothing
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})


class KeptConnections:
    """A transport that keeps connections open between requests (HTTP/1.1 keep-alive): a client that makes
    several requests (a command that pages, an agent's syncs, a script's submits) pays for one connection,
    and the server for one thread, not one each.

    A connection goes back to the pool once its answer was read whole (``close()`` on the response) and is
    used again for at most ``IDLE_S``, under the server's ``labq.http_server.KEEPALIVE_IDLE_S``, so the server
    never closes one that is about to carry a request. One found closed anyway (the leader restarted) is
    dropped before use; a request that meets a closed one all the same is sent again on a new connection
    only if it changes nothing (a GET), so a submit is never sent twice. Thread-safe; ``close()`` closes the
    idle ones."""

    IDLE_S = 2.0
    KEEP = 4  #: idle connections kept to one server

    def __init__(self) -> None:
        self._idle: dict[tuple, list[tuple[float, Connection]]] = {}
        self._lock = allocate_lock()

    def __call__(self, request: Request) -> Response:
        parts = split_url(request.url)
        key = (parts.scheme, parts.hostname or "", parts.port, request.tls)
        conn = self._take(key)
        if conn is not None:
            try:
                return _exchange(conn, request, self, key)
            except (NoAnswer, ConnectionError):
                if request.method not in _SAFE:
                    raise
        conn = Connection(parts.hostname or "", parts.port, request.timeout, https=parts.scheme == "https",
                          context=request.tls, keep_alive=True)
        return _exchange(conn, request, self, key)

    def _take(self, key: tuple) -> Connection | None:
        with self._lock:
            idle = self._idle.get(key)
            while idle:
                since, conn = idle.pop()
                if monotonic() - since <= self.IDLE_S and not conn.stale():
                    return conn
                conn.close()
        return None

    def put(self, key: tuple, conn: Connection) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < self.KEEP:
                idle.append((monotonic(), conn))
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for _, conn in conns:
                conn.close()


def unix_transport(path: str) -> Transport:
    """Sends each request over the Unix socket at ``path`` (the agent of this machine), whatever host its URL
    names; one connection a request, as ``socket_transport``."""
    return lambda request: _exchange(Connection("localhost", 80, request.timeout, unix=path), request)


def in_process(app: App, on_bug: Callable[[Request], object] | None = None) -> Transport:
    """A transport that answers with ``app`` in this process, as a server would: an ``ApiError`` the app
    raises becomes its JSON answer, any other exception a 500 (after ``on_bug(request)``, in the
    ``except`` block: a server logs the traceback there)."""

    def transport(request: Request) -> Response:
        try:
            return app(request)
        except ApiError as err:
            return Response.json(err.status, err.to_json())
        except Exception as err:  # noqa: BLE001 - a bug in the app is its 500, as on a socket
            if on_bug is not None:
                on_bug(request)
            return Response.json(500, ApiError(500, "internal", f"internal error: {type(err).__name__}").to_json())

    return transport
