"""labq.transport: the one HTTP seam. An app answers in-process as a server would; the socket transport
carries the same request over a real connection (loopback), with its per-request timeout, and its failures
are the ``OSError`` callers catch; the client reads both alike."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from labq.client import Client
from labq.http_server import serve_app
from labq.protocol import errors
from labq.protocol.errors import ApiError
from labq.transport import Request, Response, in_process, socket_transport
from labq.wire import WireError

pytestmark = pytest.mark.timeout(60)


def echo(request: Request) -> Response:
    """An app that says what it got."""
    if request.path == "/boom":
        raise RuntimeError("a bug")
    if request.path == "/refuse":
        raise errors.forbidden("not yours")
    return Response.json(200, {"method": request.method, "path": request.path, "query": request.query,
                               "auth": request.header("authorization"), "body": (request.body or b"").decode()},
                         {"X-Labq-Offset": "7"})


@pytest.fixture
def served():
    """``served(app)``: the app on a real socket on loopback; its base URL."""
    servers = []

    def start(app) -> str:
        server = serve_app(app, ("127.0.0.1", 0))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_request_knows_its_target_path_query_and_headers_in_any_case():
    request = Request("GET", "http://h:1/v1/jobs?all=1&id=3&id=4", {"Authorization": "Bearer t"})
    assert (request.target, request.path) == ("/v1/jobs?all=1&id=3&id=4", "/v1/jobs")
    assert request.query == {"all": ["1"], "id": ["3", "4"]}
    assert request.header("AUTHORIZATION") == "Bearer t" and request.header("x-none") is None
    assert Request("GET", "http://h:1").target == "/"


def test_a_response_reads_lines_then_the_rest_and_names_headers_in_lower_case():
    response = Response(200, {"X-Labq-Done": "1"}, b"one\ntwo\nrest")
    assert response.header("x-labq-done") == "1" and response.headers == {"x-labq-done": "1"}
    assert (response.readline(), response.readline(), response.read()) == (b"one\n", b"two\n", b"rest")
    response.interrupt()  # a body in memory has nothing to interrupt
    response.close()


def test_in_process_answers_as_a_server_would():
    bugs: list[Request] = []
    transport = in_process(echo, on_bug=bugs.append)
    response = transport(Request("POST", "http://h:1/x?a=1", {"Authorization": "Bearer t"}, b"hi"))
    assert response.status == 200 and response.header("X-Labq-Offset") == "7"
    refused = transport(Request("GET", "http://h:1/refuse"))
    assert (refused.status, refused.read()) == (403, b'{"error":{"code":"forbidden","message":"not yours"}}')
    broken = transport(Request("GET", "http://h:1/boom"))
    assert broken.status == 500 and b"RuntimeError" in broken.read() and [r.path for r in bugs] == ["/boom"]


@pytest.mark.parametrize("over", ["socket", "in-process"])
def test_the_client_reads_an_app_the_same_over_a_socket_and_in_process(served, over):
    def leader(request: Request) -> Response:
        if request.path == "/v1/whoami":
            assert request.header("Authorization") == "Bearer tok"
            return Response.json(200, {"user": "ada", "kind": "user", "admin": False})
        if request.path == "/v1/jobs/3/logs":
            return Response(200, {"X-Labq-Offset": "12", "X-Labq-Done": "1"}, b"hello\n")
        raise errors.not_found(f"no such API path: {request.path}")

    url = served(leader) if over == "socket" else "http://nowhere.invalid:1"
    client = Client(url, "tok", transport=None if over == "socket" else in_process(leader))
    assert client.whoami()["user"] == "ada"
    assert client.logs(3, offset=6) == (b"hello\n", 12, True)
    with pytest.raises(ApiError) as caught:
        client.nodes()
    assert (caught.value.status, caught.value.code, caught.value.message) == (404, "not_found",
                                                                               "no such API path: /v1/nodes")


def test_the_socket_transport_carries_method_target_headers_and_body(served):
    url = served(echo)
    response = socket_transport(Request("POST", url + "/v1/x?a=1&a=2", {"Authorization": "Bearer t"}, b"{}", 5))
    try:
        assert response.status == 200 and response.header("Content-Type") == "application/json"
        assert response.read() == (b'{"method":"POST","path":"/v1/x","query":{"a":["1","2"]},'
                                   b'"auth":"Bearer t","body":"{}"}')
    finally:
        response.close()


@pytest.fixture
def silent_port():
    """A port that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    yield listener.getsockname()[1]
    listener.close()


def test_the_socket_transport_times_out_per_request(silent_port):
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        socket_transport(Request("GET", f"http://127.0.0.1:{silent_port}/v1/whoami", timeout=0.5))
    assert 0.4 < time.monotonic() - started < 5
    with pytest.raises(ApiError, match="it stopped answering \\(timed out\\)") as caught:
        Client(f"http://127.0.0.1:{silent_port}", "t", timeout=0.3).whoami()
    assert caught.value.code == "unreachable"


def test_a_refused_connection_and_a_reply_that_is_not_http_are_oserrors(silent_port):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        socket_transport(Request("GET", f"http://127.0.0.1:{closed}/"))

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def ssh() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"SSH-2.0-OpenSSH\r\n\r\n")
        conn.close()

    threading.Thread(target=ssh, daemon=True).start()
    try:
        with pytest.raises(WireError, match="not an HTTP answer"):
            socket_transport(Request("GET", f"http://127.0.0.1:{listener.getsockname()[1]}/", timeout=5))
    finally:
        listener.close()


def test_interrupt_ends_a_blocked_read_of_a_stream_from_another_thread():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    held: list[socket.socket] = []

    def stream() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n: keepalive\n\n")
        held.append(conn)  # and then nothing, as a quiet leader

    threading.Thread(target=stream, daemon=True).start()
    try:
        response = socket_transport(Request("GET", f"http://127.0.0.1:{listener.getsockname()[1]}/v1/events",
                                            timeout=30))
        assert response.readline() == b": keepalive\n" and response.readline() == b"\n"
        threading.Timer(0.2, response.interrupt).start()
        started = time.monotonic()
        assert response.readline() == b""
        assert time.monotonic() - started < 5
        response.close()
    finally:
        listener.close()
        for conn in held:
            conn.close()


URLS = ["http://127.0.0.1:7733", "http://127.0.0.1:7733/", "http://h:1/v1/jobs?all=1&id=3&id=4", "https://Leader.Lab:443/x",
        "http://h:1?x=1", "http://h", "http://h/", "http://h:/p", "http://h:99999", "http://h:12a/p", "http://[::1]:80/x",
        "http://u@h:1/", "http://h:1/p#frag", "unix:/run/x.sock", "http://h:1/a/b?c=d/e?f", "HTTP://H:2/P?Q=R",
        "http://:5/x", "http://h:1/p%20q?x=%41", "localhost:7733", "http://h:01/", "http://h:1/a b", "http://h:-1/"]


@pytest.mark.parametrize("url", URLS)
def test_split_url_splits_as_urllib_does(url):
    """The CLI splits its URLs without importing urllib.parse; where both answer, they answer alike."""
    from urllib.parse import urlsplit

    from labq.transport import split_url

    def parts(split):
        try:
            got = split(url)
            return got.scheme, got.hostname, got.port, got.path, got.query
        except ValueError:
            return "ValueError"

    assert parts(split_url) == parts(urlsplit)


def test_query_and_path_quoting_match_urllib_on_any_text():
    import random
    from urllib.parse import quote, urlencode

    from labq.transport import encode_query, quote_part

    rng = random.Random(3)
    alphabet = "aZ09 _.-~/?&=%+é中\x01#:"

    def text() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8)))

    for _ in range(2000):
        pairs = [(text(), rng.choice([3, True, None, text()])) for _ in range(rng.randint(1, 3))]
        assert encode_query(pairs) == urlencode(pairs), pairs
        part = text()
        assert quote_part(part) == quote(part, safe=""), part


def test_the_wire_reader_reads_lines_sizes_and_the_rest_across_recvs(monkeypatch):
    """labq.wire reads answers with a reader of its own over ``_socket`` (not ``socket.makefile``): lines (at
    most ``limit`` long), a number of bytes, all to the end, whatever the sizes each recv brings."""
    from labq import wire

    monkeypatch.setattr(wire, "_CHUNK", 3)  # every recv brings 3 bytes at most
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(b"HTTP/1.1 200 OK\r\nX: " + b"y" * 20 + b"\r\n\r\nbody-of-12!!tail")
        theirs.shutdown(socket.SHUT_WR)
        reader = wire._Reader(ours)
        assert reader.readline(65537) == b"HTTP/1.1 200 OK\r\n"
        assert reader.readline(10) == b"X: yyyyyyy"
        assert reader.readline() == b"y" * 13 + b"\r\n"
        assert reader.readline() == b"\r\n"
        assert reader.read(12) == b"body-of-12!!"
        assert reader.read() == b"tail"
        assert reader.readline() == b"" and reader.read(5) == b""
