"""A minimal HTTP/1.1 connection over a socket, for the CLI's fast start (``labq.transport`` sends on it).

``http.client`` pulls in ``email`` and ``ssl`` (about 30 ms of imports), more than
``labq submit`` spends talking to the leader. The leader always answers with a
Content-Length or by closing the connection (event streams), so a small reader
suffices. An ``https://`` leader is the same on a socket the caller's ``ssl`` context
wraps (``labq.tls``: pinned to the lab's CA). The interface is the part of
``http.client``'s the client uses.

Plain connections use ``_socket`` and a small reader of their own, not the ``socket`` module: its import
(with ``selectors`` and the enum classes it builds for every constant) is a tenth of ``labq submit``'s start.
An ``https://`` connection imports ``ssl``, which brings ``socket`` anyway.
"""

from __future__ import annotations

import _socket

#: what one recv asks for: an answer of the leader's is most often whole in one
_CHUNK = 65536


class WireError(OSError):
    """A malformed answer, as an OSError so callers treat it like a broken connection."""


class NoAnswer(WireError):
    """The connection closed before a byte of an answer came."""


class Response:
    def __init__(self, file, method: str = "GET") -> None:
        self._file = file
        status_line = file.readline(65537)
        if not status_line:
            raise NoAnswer("the connection closed before an answer")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            raise WireError(f"not an HTTP answer: {status_line[:80]!r}")
        self.status = int(parts[1])
        self._headers: dict[str, str] = {}
        while True:
            line = file.readline(65537)
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            self._headers[name.strip().lower()] = value.strip()
        #: the connection can carry another request once this answer's body is read: an HTTP/1.1 answer with
        #: a Content-Length that does not close (an event stream has none: it ends with the connection)
        self.keeps = (parts[0] == b"HTTP/1.1" and self.status >= 200 and method != "HEAD"
                      and "content-length" in self._headers
                      and self._headers.get("connection", "").lower() != "close")
        self.done = False  #: the whole body was read

    @property
    def headers(self) -> dict[str, str]:
        """Every header, by lower-case name."""
        return self._headers

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self._headers.get(name.lower(), default)

    def read(self) -> bytes:
        length = self._headers.get("content-length")
        if length is None:
            return self._file.read()
        data = self._file.read(int(length))
        if len(data) != int(length):
            raise WireError(f"the answer ended after {len(data)} of {length} bytes")
        self.done = True
        return data

    def readline(self) -> bytes:
        self.keeps = False  # read by lines: a stream, not a body of a known length
        return self._file.readline()


class _Reader:
    """The buffered reading of a file made by ``socket.makefile("rb")``, over ``recv``: lines, a number of
    bytes, or all until the end."""

    def __init__(self, sock) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self._ended = False

    def _fill(self) -> bool:
        """One more recv into the buffer; False at the end of the stream."""
        if self._ended:
            return False
        data = self._sock.recv(_CHUNK)
        if not data:
            self._ended = True
            return False
        self._buffer += data
        return True

    def readline(self, limit: int = -1) -> bytes:
        start = 0
        while True:
            end = self._buffer.find(b"\n", start)
            if end >= 0:
                end += 1
                break
            if 0 <= limit <= len(self._buffer):
                end = limit
                break
            start = len(self._buffer)
            if not self._fill():
                end = len(self._buffer)
                break
        if 0 <= limit < end:
            end = limit
        line = bytes(self._buffer[:end])
        del self._buffer[:end]
        return line

    def read(self, size: int = -1) -> bytes:
        while (size < 0 or len(self._buffer) < size) and self._fill():
            pass
        end = len(self._buffer) if size < 0 else min(size, len(self._buffer))
        data = bytes(self._buffer[:end])
        del self._buffer[:end]
        return data

    def close(self) -> None:
        self._buffer.clear()


def _open_tcp(host, port: int, timeout: float):
    """``socket.create_connection`` on ``_socket``: the first of the name's addresses that takes the connection."""
    last: OSError | None = None
    for family, kind, proto, _, address in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as err:
            sock.close()
            last = err
    raise last or OSError(f"no address for {host!r}")


class Connection:
    """``http.client.HTTPConnection``'s request/getresponse/close. One request per connection; with
    ``keep_alive``, one after the other on the same socket for as long as the answers allow (``reusable``)."""

    def __init__(self, host: str, port: int | None, timeout: float, https: bool = False, context=None,
                 unix: str | None = None, keep_alive: bool = False) -> None:
        self._address = (host, port or (443 if https else 80))
        self._unix = unix  #: a Unix socket's path to connect to instead of (host, port): the local agent
        self._timeout = timeout
        self._https = https
        self._context = context  #: the ssl.SSLContext of an https:// connection (labq.tls: pinned to a lab's CA)
        self._sock = None  #: a ``_socket.socket``, or an ``ssl.SSLSocket`` for https://
        self._file: _Reader | None = None  #: the socket's reader, one for the connection's life (it reads ahead)
        self._keep_alive = keep_alive
        self._method = "GET"
        self._answer: Response | None = None
        self.requests = 0  #: sent on this connection so far

    def request(self, method: str, target: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float | None = None) -> None:
        headers = dict(headers or {})
        host, port = self._address
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}"]
        if not self._keep_alive:
            lines.append("Connection: close")
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        if timeout is not None:
            self._timeout = timeout
        if self._sock is None:
            self._sock = self._connect()
        else:
            self._sock.settimeout(self._timeout)
        self._method, self._answer = method, None
        self.requests += 1
        self._sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))

    def _connect(self):
        if self._unix is not None:
            sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
            try:
                sock.settimeout(self._timeout)
                sock.connect(self._unix)
            except BaseException:
                sock.close()
                raise
            return sock
        host, port = self._address
        # an ASCII name goes to getaddrinfo as bytes: a str is first encoded with the "idna" codec, whose import
        # (with stringprep) costs a plain-HTTP command 1 ms of its start
        name = host.encode() if host.isascii() else host
        if not self._https:
            return _open_tcp(name, port, self._timeout)
        import socket  # ssl's sockets are socket.socket's: ssl has imported it already

        sock = socket.create_connection((name, port), timeout=self._timeout)
        try:  # the request goes out in one write, and the answer's parts need no delayed ACK to follow
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return self._context.wrap_socket(sock, server_hostname=self._address[0])
        except BaseException:
            sock.close()
            raise

    def getresponse(self):
        assert self._sock is not None, "request() first"
        if self._file is None:
            self._file = _Reader(self._sock)
        self._answer = Response(self._file, self._method)
        return self._answer

    @property
    def reusable(self) -> bool:
        """Open, kept alive, and its last answer read whole: it can carry the next request."""
        answer = self._answer
        return (self._keep_alive and self._sock is not None and answer is not None and answer.keeps
                and answer.done)

    def stale(self) -> bool:
        """An idle kept connection that has something to read: the server closed it (or sent what no request
        asked for). Either way it cannot carry a request."""
        import select

        sock = self._sock
        if sock is None:
            return True
        try:
            pending = getattr(sock, "pending", None)
            return bool(pending and pending()) or bool(select.select([sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def interrupt(self) -> None:
        """From another thread: make a read blocked on this connection return (as the end of the stream)."""
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(_socket.SHUT_RDWR)
            except OSError:
                pass
