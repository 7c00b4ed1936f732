"""Hypothesis against the whole API surface of a real leader: every route in ``ROUTES``, with random methods,
paths, queries, headers, tokens and bodies (random JSON of any shape and type, invalid UTF-8, deep nesting,
huge strings, wrong lengths). For each request: an answer within a few seconds, never a 5xx, a JSON body, and
when the request is refused (4xx) the database file is byte for byte what it was.

Requests go over raw sockets, so what ``http.client`` would refuse to send (odd header values, wrong lengths)
is sent too.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.parse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labq.leader.routes import ROUTES
from labq.protocol.requests import MAX_BODY_BYTES
from tests.leader.loopback_leader import start_loopback_leader

pytestmark = pytest.mark.timeout(300)

ANSWER_WITHIN_S = 5.0
FUZZ = settings(max_examples=2500, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                                       HealthCheck.function_scoped_fixture])

#: each route's path with its groups as ``{}``: ``/v1/jobs/{}/actions``
TEMPLATES = [(method, re.sub(r"\([^)]*\)", "{}", pattern.pattern.strip("^$"))) for method, pattern, _ in ROUTES]

NODE = {"name": "fz1", "gpus": [{"index": 0, "uuid": "SIM-0", "model": "RTX 3090", "memory_mib": 24576}],
        "topology": {"pcie": [[0]], "nvlinks": [[0]], "nvswitch_links": [], "numa": []},
        "unmanaged_busy": [], "simulated": True, "labels": []}
#: a valid body per POST route, for mutations that reach past the first check
VALID = {
    "/v1/jobs": {"command": ["python", "train.py"], "gpus": 1, "name": "fz", "priority": "normal",
                 "time_limit_s": 60, "env": {"A": "b"}, "image": "busybox", "shm_size_mib": 128,
                 "mounts": [{"source": "/data", "target": "/data", "read_only": True}]},
    "/v1/jobs/{}/actions": {"action": "prio", "priority": "high"},
    "/v1/users": {"name": "fuzzed", "admin": False},
    "/v1/tokens": {"user": "alice", "name": "fz", "expires_s": 3600},
    "/v1/joins": {"node": "fzn", "expires_s": 3600},
    "/v1/reservations": {"gpus": 1, "start": 3e9, "end": 3e9 + 600, "name": "fzr", "users": ["bob"]},
    "/v1/agents/register": {"node": NODE, "logs_url": "http://127.0.0.1:9/", "version": "0"},
    "/v1/agents/{}/sync": {"attempts": [{"job_id": 1, "attempt": 1, "running": True}], "unmanaged_busy": [],
                           "wait_s": 0, "gpu_usage": {"0": {"memory_free_mib": 1, "utilization_pct": 5}}},
}
#: how the Content-Length is wrong, if it is. A body shorter than its length on a connection left open ("more")
#: is answered after the leader's request timeout: 1 in 100, in the middle, where Hypothesis draws no more often
LENGTHS = ["right"] * 42 + ["none", "negative", "text", "less", "two", "huge", "more_eof"] * 2 + ["more"] \
    + ["right"] * 43
FIELDS = sorted({key for body in VALID.values() for key in body} | set(NODE) | {"action", "runtime", "workdir"})


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    # no limit on failed authentication: the fuzz sends wrong tokens often, and a 429 would hide the routes
    # (tests/leader/test_tokens.py tests the limit)
    lb = start_loopback_leader(tmp_path_factory.mktemp("fuzz"), request_timeout_s=0.25, max_connections_per_address=64,
                               auth_failures_per_minute=0)
    status, _, doc = lb.request("POST", "/v1/users", {"name": "alice"})
    assert status == 201
    lb.user_token = doc["token"]
    _, _, doc = lb.request("POST", "/v1/agents/register", {"node": NODE, "version": "0"}, token=lb.join_token)
    lb.agent_token = doc["agent_token"]
    assert lb.request("POST", "/v1/jobs", {"command": ["true"]}, token=lb.user_token)[0] == 201
    yield lb
    lb.stop()


# -- strategies ----------------------------------------------------------------------------------


def huge(n: int) -> str:
    return "x" * n


scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=False), st.text(max_size=40), st.sampled_from(["", "\n", "evil\n", "\x00", "\ud800", "a\udfff",
                                                                       "\u202e", "../..", "*", "-1", "1e999"]),
    st.sampled_from([10, 5000, 70_000]).map(huge),
)
keys = st.one_of(st.sampled_from(FIELDS), st.text(max_size=10))
json_values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(keys, inner, max_size=6)),
    max_leaves=20,
)


@st.composite
def mutated(draw, template: str) -> object:
    """A valid body with a few fields replaced, removed or added."""
    body = json.loads(json.dumps(VALID[template]))
    for _ in range(draw(st.integers(1, 3))):
        target = body
        if isinstance(target, dict) and target and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(target)))
            if isinstance(target[key], dict) and target[key] and draw(st.booleans()):
                target = target[key]
                key = draw(st.sampled_from(sorted(target)))
            elif isinstance(target[key], list) and target[key] and isinstance(target[key][0], dict) and target[key][0]:
                target = target[key][0]
                key = draw(st.sampled_from(sorted(target)))
        else:
            key = draw(st.sampled_from(FIELDS))
        if draw(st.integers(0, 4)) == 0:
            target.pop(key, None)
        else:
            target[key] = draw(json_values)
    return body


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


raw_bodies = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([b"", b"null", b"{", b"\xff\xfe", b'{"command": ["\\ud800"]}', b'{"a": NaN}', b"[" * 100_000,
                     b'{"command":' + b"[" * 100_000, deep(40), b'"' + b"x" * (MAX_BODY_BYTES + 10) + b'"',
                     b'{"command": ["' + b"y" * (MAX_BODY_BYTES - 20) + b'"]}']),
)


@st.composite
def requests(draw, lab):
    method, template = draw(st.sampled_from(TEMPLATES))
    if draw(st.integers(0, 5)) == 0:
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "FOO",
                                       "get", "M-SEARCH"]))
    parts = [draw(st.one_of(
        st.integers(0, 3).map(str), st.integers(0, 10**40).map(str), st.sampled_from(["fz1", "root", "nobody"]),
        st.text(max_size=20).map(lambda t: urllib.parse.quote(t, safe="")),
        st.sampled_from(["%0A", "x%0D%0A", "%ff", "%00", "..", "%2F", "-1", "1e3", "\u0661"]),
    )) for _ in range(template.count("{}"))]
    path = template.format(*parts)
    if draw(st.integers(0, 3)) == 0:
        names = ["limit", "id", "offset", "after", "attempt", "user", "state", "all", "history", "pending"]
        values = st.one_of(st.integers(-5, 10**30).map(str), st.text(max_size=12), st.sampled_from(["", "1", "%00"]))
        query = draw(st.lists(st.tuples(st.sampled_from(names), values), max_size=5))
        path += "?" + urllib.parse.urlencode(query)
    if draw(st.integers(0, 30)) == 0:
        path = draw(st.sampled_from(["/", "//v1/jobs", "/v1/jobs/", "http://[::1/v1/jobs", "*", "/v1/../v1/jobs",
                                     "/v1/jobs#x", "/v1/" + "a" * 5000]))
    token = draw(st.sampled_from([None, "", "garbage", "admin", "user", "join", "agent"]))
    token = {"admin": lab.admin_token, "user": lab.user_token, "join": lab.join_token,
             "agent": lab.agent_token}.get(token, token)
    kind = draw(st.sampled_from(["valid", "mutated", "mutated", "json", "raw"] if template in VALID
                                else ["json", "raw", "none", "none"]))
    if kind == "valid":
        body: bytes | None = json.dumps(VALID[template]).encode()
    elif kind == "mutated":
        body = json.dumps(draw(mutated(template))).encode()
    elif kind == "json":
        body = json.dumps(draw(json_values)).encode()
    elif kind == "raw":
        body = draw(raw_bodies)
    else:
        body = None
    if "sync" in template and body and b'"wait_s"' in body:  # a long poll may hold a valid request for its wait
        try:
            doc = json.loads(body)
            if isinstance(doc, dict) and isinstance(doc.get("wait_s"), (int, float)):
                doc["wait_s"] = min(abs(doc["wait_s"]), 0.2)
                body = json.dumps(doc).encode()
        except ValueError:
            pass
    length = draw(st.sampled_from(LENGTHS))
    headers = [(b"Host", b"127.0.0.1")]
    if token is not None:
        headers.append((b"Authorization", draw(st.sampled_from([b"Bearer ", b"bearer ", b"Basic ", b"Bearer  "]))
                        + token.encode()))
    size = len(body or b"")
    cut = False
    if body is not None or length != "right":
        if length == "text":
            value = draw(st.sampled_from(["abc", "1e3", " ", "0x10", "\u0661"]))
        elif length == "huge":
            value = str(draw(st.sampled_from([2**31, 10**30, 50 << 20])))
        else:
            value = {"right": str(size), "negative": "-1", "less": str(max(size - 1, 0)), "more_eof": str(size + 10),
                     "more": str(size + 10)}.get(length)
        if value is not None:
            headers.append((b"Content-Length", value.encode("latin-1", "replace")))
        if length == "two":
            headers += [(b"Content-Length", str(size).encode()), (b"Content-Length", str(size + 1).encode())]
        cut = length == "more_eof"
    for _ in range(draw(st.integers(0, 2))):
        headers.append(draw(st.sampled_from([
            (b"Transfer-Encoding", b"chunked"), (b"Expect", b"100-continue"), (b"Connection", b"close"),
            (b"Connection", b"keep-alive"), (b"Content-Type", b"text/plain"), (b"X-\xff", b"\xfe"),
            (b"Authorization", b"Bearer " + b"z" * 9000)])))
    head = method.encode("latin-1", "replace") + b" " + path.encode("utf-8", "surrogateescape") + b" HTTP/1.1\r\n"
    head += b"".join(name + b": " + value + b"\r\n" for name, value in headers) + b"\r\n"
    return method, path, head + (body or b""), cut


# -- the property ------------------------------------------------------------------------------


def exchange(lab, method: str, data: bytes, cut: bool) -> tuple[int, dict, bytes]:
    sock = socket.create_connection(("127.0.0.1", lab.port), timeout=ANSWER_WITHIN_S)
    try:
        try:
            sock.sendall(data)
            if cut:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the leader answered before reading all and closed (a 413 too big to drain): the answer is there
        response = http.client.HTTPResponse(sock, method=method)
        started = time.monotonic()
        response.begin()
        headers = {k.lower(): v for k, v in response.getheaders()}
        if headers.get("content-type", "").startswith("text/event-stream"):
            return response.status, headers, b""  # the event stream: a 200 that goes on
        body = response.read()
        assert time.monotonic() - started < ANSWER_WITHIN_S
        return response.status, headers, body
    finally:
        sock.close()


def check(lab, method: str, path: str, data: bytes, cut: bool) -> None:
    before = lab.store_bytes()
    started = time.monotonic()
    status, headers, body = exchange(lab, method, data, cut)
    assert time.monotonic() - started < ANSWER_WITHIN_S + 1
    assert status < 500, (status, body[:500], data[:300])
    if headers.get("content-type", "").startswith("text/event-stream"):
        assert status == 200 and path.startswith("/v1/events")
        return
    if headers.get("content-type", "").startswith("text/plain; version=0.0.4"):  # Prometheus's text
        assert status == 200 and path.split("?")[0] == "/metrics" and (method == "HEAD" or body.startswith(b"# HELP"))
        return
    if method == "HEAD":
        assert body == b""
    else:
        assert headers.get("content-type") == "application/json", (status, headers, body[:200])
        doc = json.loads(body)
        if status >= 400:
            assert isinstance(doc["error"]["message"], str) and doc["error"]["code"]
    if status >= 400:
        assert lab.store_bytes() == before, (status, body[:300], data[:300])


@FUZZ
@given(data=st.data())
def test_the_whole_api_never_answers_5xx_and_refusals_change_nothing(lab, data):
    method, path, request, cut = data.draw(requests(lab))
    check(lab, method, path, request, cut)


@settings(FUZZ, max_examples=500)
@given(body=json_values, template=st.sampled_from(sorted(VALID)), who=st.sampled_from(["admin", "user", "agent"]))
def test_random_json_bodies_on_every_post_route(lab, body, template, who):
    token = {"admin": lab.admin_token, "user": lab.user_token, "agent": lab.agent_token}[who]
    if "sync" in template and isinstance(body, dict) and isinstance(body.get("wait_s"), (int, float)):
        body["wait_s"] = 0
    data = json.dumps(body).encode()
    path = template.format("fz1" if "agents" in template else "1")
    head = (f"POST {path} HTTP/1.1\r\nAuthorization: Bearer {token}\r\nContent-Length: {len(data)}\r\n\r\n").encode()
    check(lab, "POST", path, head + data, False)


def test_every_route_is_fuzzed():
    assert {template for _, template in TEMPLATES} >= {"/v1/jobs", "/v1/jobs/{}", "/v1/jobs/{}/actions",
                                                        "/v1/jobs/{}/logs", "/v1/users/{}", "/v1/agents/{}/sync"}
    assert {template for method, template in TEMPLATES if method == "POST"} == set(VALID)
