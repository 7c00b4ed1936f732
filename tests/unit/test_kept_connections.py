"""Kept-alive connections (``labq.transport.KeptConnections``, ``labq.http_server``'s keep-alive): a client's
requests share one connection and the server one thread; an idle one closes on the server after
``KEEPALIVE_IDLE_S``, and the client never sends on one it finds closed; a request that meets a closed one
anyway is sent again only if it changes nothing, so a submit is never sent twice."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from labq import http_server
from labq.client import Client
from labq.http_server import serve_app
from labq.protocol.errors import ApiError
from labq.transport import KeptConnections, Request, Response

pytestmark = pytest.mark.timeout(60)


class Counted:
    """An app on a real loopback server that counts the connections it accepted and the requests it got."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[tuple[str, str]] = []
        self.server = serve_app(self.app, ("127.0.0.1", 0))
        accept = self.server.get_request

        def counted():
            got = accept()
            self.connections += 1
            return got

        self.server.get_request = counted
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def app(self, request: Request) -> Response:
        self.requests.append((request.method, request.path))
        if request.path == "/v1/events":  # a stream: no Content-Length, it ends with the connection
            return Response(200, {"Content-Type": "text/event-stream"}, b"id: 1\nevent: hello\ndata: {}\n\n")
        if request.path == "/v1/jobs" and request.method == "POST":
            return Response.json(201, {"job": {"id": len(self.requests)}})
        return Response.json(200, {"user": "ada", "kind": "user", "admin": False})

    def open_connections(self) -> int:
        with self.server._open_lock:
            return sum(self.server._open.values())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def counted():
    server = Counted()
    yield server
    server.close()


def test_a_clients_requests_share_one_connection(counted):
    with Client(counted.url, "tok") as client:
        for _ in range(5):
            assert client.whoami()["user"] == "ada"
        assert client.submit({"command": ["true"]})["id"] == 6
    assert counted.connections == 1 and len(counted.requests) == 6


def test_threads_of_one_client_each_get_a_connection_and_keep_it(counted):
    client = Client(counted.url, "tok")
    gate = threading.Barrier(3)

    def ask() -> None:
        gate.wait()
        for _ in range(20):
            client.whoami()

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(counted.requests) == 60
    assert counted.connections <= 3 * 2, "connections are reused across a thread's requests"
    client.close()


def test_an_event_stream_is_not_kept_and_requests_after_it_go_on(counted):
    client = Client(counted.url, "tok")
    stream = client.events()
    assert next(stream)["event"] == "hello"
    stream.close()
    assert client.whoami()["user"] == "ada" and client.whoami()["user"] == "ada"
    assert counted.connections == 2, "the stream's connection, then one kept for the two requests"
    client.close()


def test_the_server_closes_an_idle_connection_and_the_client_opens_a_new_one(counted, monkeypatch):
    monkeypatch.setattr(http_server, "KEEPALIVE_IDLE_S", 0.2)
    monkeypatch.setattr(KeptConnections, "IDLE_S", 60.0)  # so the client would reuse it: it must see it closed
    client = Client(counted.url, "tok")
    client.whoami()
    closed = threading.Event()
    while not closed.wait(0.05):  # the server gives the connection's thread and its count back
        if counted.open_connections() == 0:
            closed.set()
    assert client.submit({"command": ["true"]})["id"] == 2
    assert counted.requests == [("GET", "/v1/whoami"), ("POST", "/v1/jobs")], "the submit was sent once"
    assert counted.connections == 2
    client.close()


class Hangs:
    """A raw HTTP server whose first connection answers its first request kept alive, then closes without an
    answer when the next request comes (a leader that went away between the two); later connections answer."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.got: list[bytes] = []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        first = True
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn, conn.makefile("rb") as reader:
                while True:
                    head = self.read_request(reader)
                    if head is None:
                        break
                    self.got.append(head.split(b"\r\n", 1)[0])
                    if first and len(self.got) > 1:
                        first = False
                        break  # closes without answering
                    body = json.dumps({"user": "ada", "kind": "user", "admin": False, "id": len(self.got)}).encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)

    @staticmethod
    def read_request(reader) -> bytes | None:
        lines, length = [], 0
        while True:
            line = reader.readline()
            if not line:
                return None
            if line == b"\r\n":
                break
            lines.append(line.strip())
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        reader.read(length)
        return b"\r\n".join(lines)


def test_a_read_meeting_a_closed_connection_is_sent_again_on_a_new_one():
    server = Hangs()
    client = Client(server.url, "tok")
    client.whoami()
    assert client.whoami()["user"] == "ada"
    assert [line.split()[0] for line in server.got] == [b"GET", b"GET", b"GET"]
    server.listener.close()


def test_a_submit_meeting_a_closed_connection_is_never_sent_twice():
    server = Hangs()
    client = Client(server.url, "tok")
    client.whoami()
    with pytest.raises(ApiError) as caught:
        client.submit({"command": ["true"]})
    assert caught.value.code == "unreachable"
    assert [line.split()[0] for line in server.got] == [b"GET", b"POST"], "the POST went out once"
    assert client.whoami()["user"] == "ada", "the next request opens a new connection"
    server.listener.close()


def test_a_closed_server_answers_nothing_more_even_on_a_kept_connection():
    server = Counted()
    client = Client(server.url, "tok")
    client.whoami()
    server.close()
    with pytest.raises(ApiError) as caught:
        client.whoami()
    assert caught.value.code == "unreachable"
    assert len(server.requests) == 1
