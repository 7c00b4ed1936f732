"""A real leader on loopback for API tests: a TinyDB store in a temporary folder and the real HTTP server.

Its scheduler thread is not started: a test of what requests do then knows that nothing else writes the
store while a request is answered, so "a refused request changed nothing" is a byte comparison.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from dataclasses import dataclass
from pathlib import Path

from labq.leader.auth import JOIN_TOKEN_FILE
from labq.leader.config import LeaderConfig
from labq.leader.core import Leader
from labq.leader.http import LeaderServer, serve
from labq.store import TinyDBStore
from tests.store.conftest import stored


@dataclass
class LoopbackLeader:
    leader: Leader
    server: LeaderServer
    store: TinyDBStore
    thread: threading.Thread
    data_dir: Path
    admin_token: str

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def join_token(self) -> str:
        return (self.data_dir / JOIN_TOKEN_FILE).read_text().strip()

    def store_bytes(self) -> bytes:
        """The snapshot and the journals: all the store holds on disk."""
        return stored(self.data_dir)

    def request(self, method: str, path: str, body: object = None, *, token: str | None = "admin",
                raw: bytes | None = None, headers: dict | None = None, timeout: float = 10):
        """(status, headers, JSON body or None): ``body`` as JSON, or ``raw`` bytes as they are."""
        token = self.admin_token if token == "admin" else token
        sent = {"Authorization": f"Bearer {token}"} if token else {}
        payload = raw if raw is not None else None if body is None else json.dumps(body).encode()
        if payload is not None:
            sent["Content-Length"] = str(len(payload))
        sent.update(headers or {})
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=payload, headers=sent)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        return response.status, dict(response.getheaders()), json.loads(data) if data else None

    def send_raw(self, data: bytes, *, method: str = "GET", timeout: float = 10, source: str | None = None):
        """Send ``data`` as it is on a new connection; (status, headers, body bytes)."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout,
                                        source_address=(source, 0) if source else None)
        try:
            sock.sendall(data)
            response = http.client.HTTPResponse(sock, method=method)
            response.begin()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            sock.close()

    def stop(self) -> None:
        self.server.shutdown()
        self.leader.stop()
        self.server.server_close()
        self.store.close()


def start_loopback_leader(data_dir: Path, *, clock=None, monotonic=None, **config) -> LoopbackLeader:
    """``clock`` and ``monotonic``, when given, are the leader's wall clock and its clock for waits and limits."""
    settings = LeaderConfig(host="127.0.0.1", port=0, data_dir=data_dir, **config)
    store = TinyDBStore(data_dir)
    times = {k: v for k, v in (("clock", clock), ("monotonic", monotonic)) if v is not None}
    leader = Leader(settings, store, **times)
    created = leader.ensure_admin("root")  # None for a lab that has users already
    token = created[1] if created else ""
    server = serve(leader, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, name="labq-http-test", daemon=True)
    thread.start()
    return LoopbackLeader(leader, server, store, thread, data_dir, token)
