"""The leader's HTTP front against what clients get wrong: every request gets a JSON answer with the right 4xx,
in bounded time, and a refused request leaves the database byte for byte as it was.

Each test here reproduces one report of issue 13 (part 3, 4's paths and queries, and 8) on a real leader on
loopback: real sockets, a real TinyDB store.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from tests.leader.loopback_leader import start_loopback_leader

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 1.0  #: the leader's request timeout here
CAP = 8  #: connections one address may hold open here


@pytest.fixture(scope="module")
def lb(tmp_path_factory):
    made = start_loopback_leader(tmp_path_factory.mktemp("leader"), request_timeout_s=TIMEOUT_S,
                                 max_connections_per_address=CAP)
    yield made
    made.stop()


@pytest.fixture
def unchanged(lb):
    """Asserts at the end of the test that the store is byte for byte what it was at its start."""
    before = lb.store_bytes()
    yield
    assert lb.store_bytes() == before


def error_of(doc) -> str:
    assert isinstance(doc, dict) and set(doc) == {"error"}, doc
    return doc["error"]["message"]


# -- bodies ----------------------------------------------------------------------------------


POST_ROUTES = ["/v1/jobs", "/v1/jobs/1/actions", "/v1/users", "/v1/reservations", "/v1/agents/register",
               "/v1/agents/ws1/sync"]


@pytest.mark.parametrize("path", POST_ROUTES)
@pytest.mark.parametrize("token", ["admin", None])
def test_a_null_body_is_a_400_on_every_route(lb, unchanged, path, token):
    status, _, doc = lb.request("POST", path, raw=b"null", token=token)
    assert status in ((400,) if token else (400, 401)), doc
    if status == 400:
        assert "must be a JSON object" in error_of(doc)


@pytest.mark.parametrize("path", POST_ROUTES)
@pytest.mark.parametrize("body", [b"[]", b"1", b'"text"', b"true", b"{}"])
def test_other_wrong_shapes_are_400s(lb, unchanged, path, body):
    status, _, doc = lb.request("POST", path, raw=body)
    assert 400 <= status < 500, doc
    error_of(doc)


@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff", "a\\udc00b"])
def test_a_lone_surrogate_is_a_400(lb, unchanged, escape):
    raw = ('{"command": ["echo", "' + escape + '"]}').encode()
    status, _, doc = lb.request("POST", "/v1/jobs", raw=raw)
    assert status == 400 and "surrogate" in error_of(doc)
    status, _, doc = lb.request("POST", "/v1/users", raw=('{"name": "' + escape + '"}').encode())
    assert status == 400 and "surrogate" in error_of(doc)


def test_a_surrogate_pair_is_a_character(lb):
    status, _, doc = lb.request("POST", "/v1/jobs", raw=b'{"command": ["echo", "\\ud83d\\ude00"]}')
    assert status == 201 and doc["job"]["spec"]["command"] == ["echo", "\U0001F600"]


@pytest.mark.parametrize("depth", [33, 1000, 100_000])
def test_deep_nesting_is_a_400(lb, unchanged, depth):
    status, _, doc = lb.request("POST", "/v1/jobs", raw=b'{"command":' + b"[" * depth)  # the report
    assert status == 400 and ("nested deeper" in error_of(doc) or "not JSON" in error_of(doc))
    status, _, doc = lb.request("POST", "/v1/jobs", raw=b'{"command":' + b"[" * depth + b"]" * depth + b"}")
    assert status == 400 and "nested deeper" in error_of(doc)


@pytest.mark.parametrize("raw", [b"NaN", b'{"command": ["x"], "gpus": Infinity}', b"\xff\xfe{}", b"{",
                                 b'{"gpus": ' + b"9" * 5000 + b"}"], ids=lambda raw: ascii(raw[:20]))
def test_what_is_not_json_is_a_400(lb, unchanged, raw):
    status, _, doc = lb.request("POST", "/v1/jobs", raw=raw)
    assert status == 400, doc
    error_of(doc)


@pytest.mark.parametrize("size", [10 << 20, 20 << 20])
def test_an_oversized_body_gets_a_413_stating_its_real_size(lb, unchanged, size):
    status, _, doc = lb.request("POST", "/v1/jobs", raw=b"x" * size, timeout=30)
    assert status == 413
    assert f"the request body is {size} bytes; the limit is 1048576" in error_of(doc)


def test_an_oversized_body_announced_with_expect_100_continue_is_refused_before_it_is_sent(lb):
    head = b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\nExpect: 100-continue\r\n\r\n"
    status, _, body = lb.send_raw(head, method="POST")
    assert status == 413 and b"50000000 bytes" in body


def signed(lb, raw: bytes) -> bytes:
    """``raw`` with the admin's token after its request line: the body is read only for a known caller."""
    line, _, rest = raw.partition(b"\r\n")
    return line + b"\r\nAuthorization: Bearer " + lb.admin_token.encode() + b"\r\n" + rest


def test_a_caller_without_a_token_is_a_401_before_its_body_is_read(lb, unchanged):
    status, _, body = lb.send_raw(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{bad}",
                                  method="POST")
    assert status == 401 and json.loads(body)["error"]["code"] == "unauthorized"
    status, _, body = lb.send_raw(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{}",
                                  method="POST", timeout=10 * TIMEOUT_S)
    assert status == 401  # not a wait for a body it would not read


@pytest.mark.parametrize("length", ["-1", "abc", "1e3", "0x10", "+5", "5_0", " ", "99999999999999999999999"])
def test_a_bad_content_length_is_a_400_at_once(lb, unchanged, length):
    start = time.monotonic()
    status, headers, body = lb.send_raw(
        signed(lb, f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n{{}}".encode()),
        method="POST")
    assert status in (400, 413) and json.loads(body)["error"]
    assert time.monotonic() - start < TIMEOUT_S


def test_two_different_content_lengths_are_a_400(lb, unchanged):
    status, _, body = lb.send_raw(
        signed(lb, b"POST /v1/jobs HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"), method="POST")
    assert status == 400 and b"Content-Length" in body


def test_a_chunked_body_is_a_411(lb, unchanged):
    status, _, body = lb.send_raw(
        signed(lb, b"POST /v1/jobs HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"), method="POST")
    assert status == 411 and json.loads(body)["error"]["code"] == "length_required"


def test_a_short_body_is_answered_within_the_request_timeout(lb, unchanged):
    start = time.monotonic()
    status, _, body = lb.send_raw(signed(lb, b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{}"),
                                  method="POST", timeout=10 * TIMEOUT_S)
    assert status == 408 and json.loads(body)["error"]["code"] == "timeout"
    assert time.monotonic() - start < 3 * TIMEOUT_S


def test_a_body_cut_short_by_the_client_is_a_400(lb, unchanged):
    sock = socket.create_connection(("127.0.0.1", lb.port), timeout=10)
    try:
        sock.sendall(signed(lb, b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{}"))
        sock.shutdown(socket.SHUT_WR)
        answer = sock.makefile("rb").read()
    finally:
        sock.close()
    assert answer.startswith(b"HTTP/1.1 400") and b"the body ended after 2 of the 100 bytes" in answer


# -- methods and the standard library's refusals ----------------------------------------------


@pytest.mark.parametrize("method", ["PATCH", "PUT", "TRACE", "PROPFIND", "BREW", "get"])
def test_other_methods_get_a_json_405(lb, unchanged, method):
    status, headers, doc = lb.request(method, "/v1/jobs")
    assert status == 405 and headers["Content-Type"] == "application/json"
    assert error_of(doc) == "/v1/jobs takes GET, HEAD, OPTIONS, POST"
    assert headers["Allow"] == "GET, HEAD, OPTIONS, POST"
    assert lb.request(method, "/v1/nope")[0] == 404


def test_options_lists_a_paths_methods(lb):
    status, headers, doc = lb.request("OPTIONS", "/v1/jobs/7", token=None)
    assert status == 200 and doc == {"allow": ["GET", "HEAD", "OPTIONS"]} and headers["Allow"] == "GET, HEAD, OPTIONS"
    assert lb.request("OPTIONS", "/v1/nope", token=None)[0] == 404


def test_head_is_get_without_the_body(lb):
    status, headers, doc = lb.request("HEAD", "/v1/whoami")
    get = lb.request("GET", "/v1/whoami")
    assert (status, doc) == (200, None) and headers["Content-Length"] == get[1]["Content-Length"]
    assert lb.request("HEAD", "/v1/whoami", token=None)[0] == 401
    status, headers, doc = lb.request("HEAD", "/v1/events")  # a stream has no head
    assert (status, doc) == (405, None) and headers["Allow"] == "GET, OPTIONS"


@pytest.mark.parametrize("line", [b"garbage", b"\x00\xff junk", b"GET / HTTP/1.1x", b"POST /v1/jobs HTTP/9.9",
                                  b"GET /" + b"a" * 70000 + b" HTTP/1.1"], ids=lambda line: ascii(line[:20]))
def test_a_garbled_request_line_gets_a_json_4xx_or_505(lb, unchanged, line):
    status, headers, body = lb.send_raw(line + b"\r\n\r\n")
    assert status in (400, 414, 505) and json.loads(body)["error"]


def test_too_many_headers_is_a_json_431(lb, unchanged):
    head = b"GET /v1/whoami HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(150)) + b"\r\n"
    status, _, body = lb.send_raw(head)
    assert status == 431 and json.loads(body)["error"]


def test_a_body_on_a_get_is_not_read_as_the_next_request(lb):
    sock = socket.create_connection(("127.0.0.1", lb.port), timeout=10)
    try:
        sock.sendall(b"GET /v1/whoami HTTP/1.1\r\nContent-Length: 25\r\n\r\nGET /v1/nope HTTP/1.1\r\n\r\n")
        answer = sock.makefile("rb").read()
    finally:
        sock.close()
    assert answer.count(b"HTTP/1.1 ") == 1 and b"Connection: close" in answer


# -- paths and queries -------------------------------------------------------------------------


@pytest.mark.parametrize("path", [
    "/v1/jobs/" + "9" * 5000, "/v1/jobs/" + "9" * 5000 + "/logs", "/v1/jobs?limit=-1", "/v1/jobs?limit=abc",
    "/v1/jobs?limit=" + "9" * 5000, "/v1/jobs?id=x", "/v1/jobs?id=-3", "/v1/jobs?id=1_0", "/v1/jobs/1/logs?attempt=x",
    "/v1/jobs/1/logs?offset=-1", "/v1/events?after=%00", "/v1/jobs?" + "&".join(["id=1"] * 2500),
], ids=lambda path: path[:40])
def test_bad_numbers_in_paths_and_queries_are_400s(lb, path):
    lb.request("POST", "/v1/jobs", {"command": ["true"]})  # job 1 exists
    before = lb.store_bytes()
    status, _, doc = lb.request("GET", path)
    assert status == 400, doc
    error_of(doc)
    assert lb.store_bytes() == before


@pytest.mark.parametrize(("method", "path"), [
    ("DELETE", "/v1/users/alice%0A"), ("DELETE", "/v1/users/%ff"), ("DELETE", "/v1/reservations/r%0D%0Ax"),
    ("DELETE", "/v1/reservations/%00"), ("POST", "/v1/agents/x%0A/sync"),
])
def test_bad_names_in_paths_are_400s(lb, unchanged, method, path):
    status, _, doc = lb.request(method, path, {"attempts": []} if method == "POST" else None)
    assert status == 400, doc
    assert "name" in error_of(doc)


def test_a_name_in_a_path_that_does_not_exist_is_a_404(lb, unchanged):
    assert lb.request("DELETE", "/v1/users/nobody")[0] == 404
    assert lb.request("DELETE", "/v1/reservations/nothing")[0] == 404


# -- connections -------------------------------------------------------------------------------


def test_slow_connections_from_one_address_are_capped_and_do_not_block_others(lb):
    slow = []
    try:
        for _ in range(CAP):
            sock = socket.create_connection(("127.0.0.1", lb.port), timeout=10)
            sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nContent-Le")  # and then nothing, for a while
            slow.append(sock)
        time.sleep(0.2)
        start = time.monotonic()
        status, _, body = lb.send_raw(b"GET /v1/whoami HTTP/1.1\r\n\r\n", timeout=5)  # the same address: refused
        assert status == 503 and json.loads(body)["error"]["code"] == "busy"
        token = lb.admin_token.encode()
        status, _, body = lb.send_raw(b"GET /v1/whoami HTTP/1.1\r\nAuthorization: Bearer " + token + b"\r\n\r\n",
                                      source="127.0.0.2", timeout=5)  # another address: served at once
        assert status == 200 and json.loads(body)["user"] == "root"
        assert time.monotonic() - start < TIMEOUT_S
        for sock in slow:  # the slow ones are dropped after the request timeout
            sock.settimeout(5 * TIMEOUT_S)
            assert sock.recv(100) == b""
    finally:
        for sock in slow:
            sock.close()
    deadline = time.monotonic() + 5
    while lb.server._open and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lb.request("GET", "/v1/whoami")[0] == 200  # and the address has its share back


def test_a_long_poll_outlives_the_request_timeout(lb):
    """The timeout is for reading a request; an agent's sync may wait for news far longer."""
    node = {"name": "ws1", "gpus": [{"index": 0, "uuid": "SIM-0", "model": "RTX 3090", "memory_mib": 24576}],
            "topology": {"pcie": [[0]], "nvlinks": [[0]], "nvswitch_links": [], "numa": []},
            "unmanaged_busy": [], "simulated": True, "labels": []}
    status, _, reply = lb.request("POST", "/v1/agents/register", {"node": node, "version": "t"}, token=lb.join_token)
    assert status == 200 and reply["allow_root"] is False
    sync = {"attempts": [], "unmanaged_busy": [], "wait_s": 2.5 * TIMEOUT_S}
    assert lb.request("POST", "/v1/agents/ws1/sync", sync, token=reply["agent_token"])[0] == 200  # news: at once
    start = time.monotonic()
    status, _, doc = lb.request("POST", "/v1/agents/ws1/sync", sync, token=reply["agent_token"])
    assert status == 200 and time.monotonic() - start >= 2 * TIMEOUT_S


def test_the_event_stream_outlives_the_request_timeout(lb):
    sock = socket.create_connection(("127.0.0.1", lb.port), timeout=10)
    try:
        sock.sendall(b"GET /v1/events HTTP/1.1\r\nAuthorization: Bearer " + lb.admin_token.encode() + b"\r\n\r\n")
        reader = sock.makefile("rb")
        assert reader.readline().startswith(b"HTTP/1.1 200")
        time.sleep(2 * TIMEOUT_S)
        threading.Thread(target=lb.request, args=("POST", "/v1/jobs", {"command": ["true"]})).start()
        while (line := reader.readline()) and not line.startswith(b"event: job"):
            pass
        assert line == b"event: job\n"
    finally:
        sock.close()


# -- what a submit means (issue 13, part 8) ------------------------------------------------------


def test_an_image_means_the_container_runtime(lb):
    status, _, doc = lb.request("POST", "/v1/jobs", {"command": ["nvidia-smi"], "image": "pytorch/pytorch:2.4"})
    assert status == 201, doc
    assert (doc["job"]["spec"]["runtime"], doc["job"]["spec"]["image"]) == ("docker", "pytorch/pytorch:2.4")


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"runtime": "process", "image": "busybox"}, "runtime", "runtime is process but an image is given"),
    ({"runtime": "docker"}, "image", "runtime docker needs an image"),
    ({"shm_size_mib": 2048}, "shm_size_mib", "shm_size_mib is for container jobs"),
    ({"runtime": "process", "shm_size_mib": 2048}, "shm_size_mib", "shm_size_mib is for container jobs"),
    ({"mounts": [{"source": "/data", "target": "/data"}]}, "mounts", "mounts is for container jobs"),
    ({"mounts": [{"source": "/d", "target": "/d"}], "shm_size_mib": 128}, "mounts",
     "mounts and shm_size_mib are for container jobs"),
    ({"image": ""}, "image", "image is empty"),
    ({"runtime": "vm", "image": "x"}, "runtime", "runtime must be process or docker"),
])
def test_contradictory_runtimes_are_refused_naming_the_fields(lb, unchanged, body, field, words):
    status, _, doc = lb.request("POST", "/v1/jobs", {"command": ["true"], **body})
    assert status == 400, doc
    assert words in error_of(doc) and doc["error"]["field"] == field
