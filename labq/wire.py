"""A minimal HTTP/1.1 connection over a socket, for the CLI's fast start (``labq.transport`` sends on it).

``http.client`` pulls in ``email`` and ``ssl`` (about 30 ms of imports), more than
``labq submit`` spends talking to the leader. The leader always answers with a
Content-Length or by closing the connection (event streams), so a small reader
suffices. ``https://`` leaders go through ``http.client``, imported only then.
The interface is the part of ``http.client``'s the client uses.
"""

from __future__ import annotations

import socket


class WireError(OSError):
    """A malformed answer, as an OSError so callers treat it like a broken connection."""


class Response:
    def __init__(self, file) -> None:
        self._file = file
        status_line = file.readline(65537)
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
        return data

    def readline(self) -> bytes:
        return self._file.readline()


class Connection:
    """``http.client.HTTPConnection``'s request/getresponse/close, one request per connection."""

    def __init__(self, host: str, port: int | None, timeout: float, https: bool = False, context=None) -> None:
        self._address = (host, port or (443 if https else 80))
        self._timeout = timeout
        self._https = https
        self._context = context  #: the ssl.SSLContext of an https:// connection (labq.tls: pinned to a lab's CA)
        self._sock: socket.socket | None = None
        self._tls = None

    def request(self, method: str, target: str, body: bytes | None = None, headers: dict | None = None) -> None:
        headers = dict(headers or {})
        if self._https:
            import http.client

            self._tls = http.client.HTTPSConnection(*self._address, timeout=self._timeout, context=self._context)
            try:
                self._tls.request(method, target, body=body, headers=headers)
            except http.client.HTTPException as err:
                raise WireError(str(err)) from None
            return
        host, port = self._address
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        self._sock = socket.create_connection(self._address, timeout=self._timeout)
        self._sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))

    def getresponse(self):
        if self._tls is not None:
            import http.client

            try:
                return self._tls.getresponse()
            except http.client.HTTPException as err:
                raise WireError(str(err)) from None
        assert self._sock is not None, "request() first"
        return Response(self._sock.makefile("rb"))

    def close(self) -> None:
        for thing in (self._sock, self._tls):
            if thing is not None:
                thing.close()

    def interrupt(self) -> None:
        """From another thread: make a read blocked on this connection return (as the end of the stream)."""
        sock = self._sock if self._sock is not None else getattr(self._tls, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
