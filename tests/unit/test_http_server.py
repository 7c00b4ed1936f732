"""labq.http_server, the server the leader and the agent share, on real sockets: reading a request has a time
limit, one address holds at most so many connections (the next is answered 503 at once), the standard
library's refusals are JSON, and a bearer token is compared in constant time."""

from __future__ import annotations

import email.utils
import http.client
import json
import logging
import socket
import threading
import time

import pytest

from labq.http_server import APP_MAX_BODY, AppHandler, AppServer, bearer_token, same_secret, serve_app
from labq.transport import Request, Response

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 0.5
CAP = 3


def hello(request: Request) -> Response:
    if request.path == "/boom":
        raise KeyError("a bug")
    return Response(200, {"X-Seen": str(len(request.body or b""))}, b"hello")


@pytest.fixture
def server():
    made = serve_app(hello, ("127.0.0.1", 0), request_timeout_s=TIMEOUT_S, max_connections_per_address=CAP)
    thread = threading.Thread(target=made.serve_forever, daemon=True)
    thread.start()
    yield made
    made.shutdown()
    made.server_close()
    thread.join(5)


def connect(server) -> socket.socket:
    return socket.create_connection(server.server_address[:2], timeout=10)


def ask(server, data: bytes) -> tuple[int, dict, bytes]:
    with connect(server) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock, method="GET")
        response.begin()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()


def test_an_app_is_served_with_its_headers_and_a_content_length(server):
    status, headers, body = ask(server, b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc")
    assert (status, headers["x-seen"], headers["content-length"], body) == (200, "3", "5", b"hello")
    assert headers["server"].startswith("labq/")


def test_a_bug_in_the_app_is_a_json_500(server, caplog):
    status, headers, body = ask(server, b"GET /boom HTTP/1.1\r\nHost: h\r\n\r\n")
    assert status == 500 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"] == {"code": "internal", "message": "internal error: KeyError"}
    assert "internal error on Request('GET'" in caplog.text


@pytest.mark.parametrize("data, status, code", [
    (b"GARBAGE\r\n\r\n", 400, "bad_request"),
    (b"GET / HTTP/1.1\r\nHost: h\r\n" + b"X-Long: " + b"a" * 70000 + b"\r\n\r\n", 431, "too_large"),
    (b"GET / HTTP/2.0\r\n\r\n", 505, "http_version"),
    (b"GET / HTTP/1.1\r\nHost: h\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(101)) + b"\r\n", 431, "too_large"),
    # a head that two readers could read differently is refused, not guessed at
    (b"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n folded\r\n\r\n", 400, "bad_request"),
    (b"GET / HTTP/1.1\r\nHost: h\r\nno colon\r\n\r\n", 400, "bad_request"),
    (b"GET / HTTP/1.1\r\nContent-Length : 3\r\n\r\nabc", 400, "bad_request"),
    (b"GET /\r\n\r\n", 400, "bad_request"),  # HTTP/0.9
    (b"GET / HTTP/1.x\r\n\r\n", 400, "bad_request"),
])
def test_a_head_that_cannot_be_read_is_refused_as_json(server, data, status, code):
    got, headers, body = ask(server, data)
    assert (got, headers["content-type"], json.loads(body)["error"]["code"]) == (status, "application/json", code)


def test_header_names_are_read_whatever_their_case_and_the_first_of_a_repeated_one_counts(server):
    status, headers, _ = ask(server, b"POST /x HTTP/1.1\r\nhost: h\r\ncontent-LENGTH:   2 \r\nX-A: 1\r\n\r\nab")
    assert (status, headers["x-seen"]) == (200, "2")


def test_a_kept_connection_carries_requests_until_one_says_close(server):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    try:
        for n in range(3):
            conn.request("POST", "/x", body=b"a" * n)
            response = conn.getresponse()
            assert (response.status, response.getheader("X-Seen"), response.read()) == (200, str(n), b"hello")
            if n == 0:
                sock = conn.sock
            assert conn.sock is sock  # the same connection
        conn.request("GET", "/x", headers={"Connection": "close"})
        response = conn.getresponse()
        assert (response.status, response.getheader("Connection"), response.read()) == (200, "close", b"hello")
        assert conn.sock is None  # the answer said close, and the client closed its end
    finally:
        conn.close()


def test_an_answer_is_one_write_with_a_date_and_a_line_in_the_debug_log(caplog):
    """The head and the body go out together: sent apart, the client waits for the second part (each answer
    is a round more of the client's reads, and of the server's writes)."""
    writes = []

    class Counted(AppHandler):
        def setup(self) -> None:
            super().setup()
            send = self.wfile.write
            self.wfile.write = lambda data: writes.append(bytes(data)) or send(data)

    made = AppServer(hello, ("127.0.0.1", 0))
    made.RequestHandlerClass = Counted
    thread = threading.Thread(target=made.serve_forever, daemon=True)
    thread.start()
    try:
        with caplog.at_level(logging.DEBUG, logger="labq.http"):
            status, headers, body = ask(made, b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n")
    finally:
        made.shutdown()
        made.server_close()
        thread.join(5)
    assert (status, body) == (200, b"hello")
    assert len(writes) == 1 and writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and writes[0].endswith(b"\r\n\r\nhello")
    sent = email.utils.parsedate_to_datetime(headers["date"]).timestamp()
    assert abs(sent - time.time()) < 5
    assert '"GET /x HTTP/1.1" 200' in caplog.text


def test_an_oversized_body_is_refused_unread(server):
    status, _, body = ask(server, f"POST / HTTP/1.1\r\nContent-Length: {APP_MAX_BODY + 1}\r\n\r\n".encode())
    assert status == 413 and json.loads(body)["error"]["code"] == "too_large"


def test_a_request_that_stalls_is_dropped_after_the_time_limit(server):
    with connect(server) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n")  # and never the blank line
        started = time.monotonic()
        assert sock.recv(100) == b""  # closed, nothing answered
        assert TIMEOUT_S * 0.8 < time.monotonic() - started < TIMEOUT_S + 3


def test_one_address_holds_at_most_its_cap_of_connections(server):
    idle = [connect(server) for _ in range(CAP)]
    try:
        deadline = time.monotonic() + 5
        while sum(server._open.values()) < CAP and time.monotonic() < deadline:
            time.sleep(0.01)
        status, headers, body = ask(server, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        assert (status, headers["retry-after"]) == (503, "1")
        assert json.loads(body)["error"]["code"] == "busy"
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 5  # their threads end as they see the close: room again
    while time.monotonic() < deadline:
        if ask(server, b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")[0] == 200:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the address never got its connections back")


def test_bearer_tokens_are_read_and_compared_as_secrets():
    assert bearer_token("Bearer abc ") == "abc" and bearer_token("bearer abc") == "abc"
    assert bearer_token("Basic abc") is None and bearer_token(None) is None and bearer_token("") is None
    assert same_secret("abc", "abc")
    assert not same_secret("abc", "abd") and not same_secret("", "") and not same_secret(None, "abc")
    assert not same_secret("abc", None) and not same_secret("\udcff", "x")
