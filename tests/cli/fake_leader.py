"""A tiny real HTTP server on 127.0.0.1 with canned answers by (method, path), for CLI tests without a leader,
and ``labq`` run as a process against it (stdin not a terminal unless a test gives one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from labq.http_server import serve_app
from labq.transport import Request, Response

ROOT = Path(__file__).resolve().parents[2]


class FakeLeader:
    """Canned answers by (method, path); records every request it gets."""

    def __init__(self, port: int = 0) -> None:
        #: an answer, or a function of the query (and the body) that returns one
        self.routes: dict[tuple[str, str], tuple[int, dict, bytes] | Callable] = {}
        self.requests: list[dict] = []
        self.server = serve_app(self._answer, ("127.0.0.1", port))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _answer(self, request: Request) -> Response:
        body = json.loads(request.body) if request.body else None
        self.requests.append({"method": request.method, "path": request.path, "query": request.query, "body": body})
        route = self.routes.get((request.method, request.path),
                                (404, {}, b'{"error": {"code": "not_found", "message": "no route"}}'))
        status, headers, data = route(request.query) if callable(route) else route
        headers = {"Content-Type": "application/json"} | headers
        return Response(status, {k: v for k, v in headers.items() if v is not None}, data)

    def json(self, method: str, path: str, answer: object, status: int = 200) -> None:
        self.routes[(method, path)] = (status, {}, json.dumps(answer).encode())

    def error(self, method: str, path: str, status: int, code: str, message: str) -> None:
        self.json(method, path, {"error": {"code": code, "message": message}}, status)

    def sent(self, method: str, path: str) -> list[dict]:
        return [r for r in self.requests if (r["method"], r["path"]) == (method, path)]

    def env(self) -> dict:
        return {"LABQ_LEADER": self.url, "LABQ_TOKEN": "secret"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def environment(extra: dict) -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("LABQ_")} | extra


def labq(leader: FakeLeader | None, *args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run([sys.executable, "-m", "labq.cli", *args], capture_output=True, text=True, timeout=60,
                          env=environment((leader.env() if leader else {}) | (env or {})), cwd=ROOT, **kw)
