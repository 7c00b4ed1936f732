"""The agent's sync loop outlives every error of the network and of its leader, and is back at once.

A real agent syncs with a real HTTP server on loopback that plays a leader
going wrong in the ways a restart or a bug makes it: a reply cut short
(``IncompleteRead``, as when the leader is stopped during a long poll), a JSON
``null``, a reply that is not HTTP, an error page, a refused connection. After
each the agent must sync again, within the backoff's cap.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from labq.agent.daemon import Agent, AgentConfig
from labq.agent.inventory import open_inventory
from labq.workers import Backoff, Supervisor, WorkerFailed

pytestmark = pytest.mark.timeout(60)

GOOD_SYNC = {"run": [], "stop": [], "lease_s": 30.0, "fence_after_s": 600.0, "seq": 0, "epoch": ""}
REGISTERED = {"agent_token": "agent-t", "logs_token": "logs-t", "lease_s": 30.0, "fence_after_s": 600.0,
              "allowed_mount_roots": [], "allowed_images": [], "checkpoint_root": None}


class FlakyLeader(ThreadingHTTPServer):
    """Answers the n-th sync as ``script[n]`` says, then well; counts and times the syncs."""

    daemon_threads = True

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)
        self.syncs: list[float] = []
        self.connections: list[socket.socket] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request, client_address) -> None:
        self.connections.append(request)
        super().process_request(request, client_address)

    def stop(self) -> None:
        """As the leader's process ending does: no more connections, and the open ones (the agent keeps its
        connection alive between syncs) closed."""
        self.shutdown()
        self.server_close()
        for conn in self.connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    server: FlakyLeader
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/agents/register":
            return self._send(200, json.dumps(REGISTERED).encode())
        self.server.syncs.append(time.monotonic())
        how = self.server.script.pop(0) if self.server.script else "good"
        if how == "cut":  # the leader went away in the middle of its answer
            self.send_response(200)
            self.send_header("Content-Length", "500")
            self.end_headers()
            self.wfile.write(b'{"run": [')
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
        elif how == "null":
            self._send(200, b"null")
        elif how == "not-http":
            self.wfile.write(b"SSH-2.0-OpenSSH\r\n\r\n")
            self.close_connection = True
        elif how == "html-500":
            self._send(500, b"<html>oops</html>")
        elif how == "wrong-shape":
            self._send(200, json.dumps({"run": [{"job_id": "x"}], "stop": 5}).encode())
        else:
            time.sleep(0.2)  # a short long poll: the agent does not spin
            self._send(200, json.dumps(GOOD_SYNC).encode())

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def flaky(tmp_path):
    made: list = []

    def start(script: list[str]) -> tuple[FlakyLeader, Agent]:
        server = FlakyLeader(script)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        host, port = server.server_address[:2]
        agent = Agent(AgentConfig(f"http://{host}:{port}", "join", "ws1", tmp_path / "agent"),
                      open_inventory("sim:ws-4x3090", "ws1"))
        made.append((server, agent))
        return server, agent

    yield start
    for server, agent in made:
        agent.stop()
        server.stop()


def _refuse_on(host: str, port: int, until: int, timeout: float = 30.0) -> int:
    """Stand in for a leader that is down: accept each connection on ``port`` and close it at once, until
    ``until`` of them came (or ``timeout``); how many came."""
    tries = 0
    with socket.create_server((host, port), reuse_port=False) as gone:
        gone.settimeout(0.5)
        deadline = time.monotonic() + timeout
        while tries < until and time.monotonic() < deadline:
            try:
                conn, _ = gone.accept()
            except TimeoutError:
                continue
            conn.close()
            tries += 1
    return tries


def _wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_the_sync_loop_survives_every_broken_answer_and_syncs_again_within_two_seconds(flaky):
    script = ["cut", "null", "not-http", "html-500", "wrong-shape", "cut"]
    server, agent = flaky(script)
    agent.start()
    assert _wait_for(lambda: len(server.syncs) >= len(script) + 2, 20), \
        f"the agent stopped syncing after {len(server.syncs)} syncs"
    sync_thread = next(t for t in agent.workers.threads if t.name == "labq-agent-sync")
    assert sync_thread.is_alive()
    gaps = [b - a for a, b in zip(server.syncs, server.syncs[1:len(script) + 1])]
    assert max(gaps) < 2.0, f"the agent waited {max(gaps):.1f} s before syncing again"


def test_an_agent_whose_leader_is_gone_syncs_within_two_seconds_of_its_return(flaky):
    server, agent = flaky([])
    agent.start()
    assert _wait_for(lambda: len(server.syncs) >= 1, 10)
    host, port = server.server_address[:2]
    server.stop()
    tries = _refuse_on(host, port, until=6)  # six failed syncs: an exponential backoff would be far past 2 s
    assert tries >= 6, f"the agent stopped retrying after {tries} failed syncs"
    back = ThreadingHTTPServer((host, port), _Handler)
    back.script, back.syncs = [], []
    threading.Thread(target=back.serve_forever, daemon=True).start()
    returned = time.monotonic()
    try:
        assert _wait_for(lambda: len(back.syncs) >= 1, 10)
        assert back.syncs[0] - returned < 2.0, f"the agent came back {back.syncs[0] - returned:.1f} s after its leader"
    finally:
        back.shutdown()
        back.server_close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_supervisor_restarts_a_thread_that_died_and_gives_up_on_one_that_keeps_dying():
    runs: list[int] = []
    alive = threading.Event()

    def dies_once() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("a bug in the loop itself")
        alive.wait(5)

    supervisor = Supervisor(max_deaths=3, window_s=60)
    supervisor.spawn("once", dies_once)
    assert _wait_for(lambda: not supervisor.threads[0].is_alive(), 5)
    assert supervisor.check() == ["once"]
    assert _wait_for(lambda: len(runs) == 2, 5) and supervisor.threads[0].is_alive()
    assert supervisor.check() == []
    alive.set()

    always = Supervisor(max_deaths=3, window_s=60)
    always.spawn("always", lambda: 1 / 0)
    with pytest.raises(WorkerFailed, match="always died 4 times"):
        for _ in range(10):
            _wait_for(lambda: not always.threads[0].is_alive(), 5)
            always.check()


def test_backoff_is_jittered_and_capped():
    backoff = Backoff(first=0.2, cap=1.6)
    waits = [backoff.next() for _ in range(50)]
    assert all(0.1 <= w <= 1.6 for w in waits)
    assert len({round(w, 6) for w in waits}) > 10  # jittered, so agents do not retry in step
    backoff.reset()
    assert backoff.next() <= 0.2
