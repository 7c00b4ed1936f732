"""Malformed requests get a 4xx with a clear message and change nothing on disk."""

from __future__ import annotations

import http.client
import json
import urllib.parse

import pytest

from tests.store.conftest import stored

pytestmark = pytest.mark.timeout(120)


def _token(lab) -> str:
    import tomllib

    return tomllib.loads((lab.home / ".config" / "labq" / "credentials").read_text())["token"]


def _raw(lab, method: str, path: str, body: bytes | None, token: str | None, headers: dict | None = None):
    parts = urllib.parse.urlsplit(lab.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    sent = {"Authorization": f"Bearer {token}"} if token else {}
    if body is not None:
        sent["Content-Length"] = str(len(body))
    sent.update(headers or {})
    conn.request(method, path, body=body, headers=sent)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, json.loads(data) if data else None


BIG = ["x" * (10 * 1024 * 1024)]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "not JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (json.dumps({"command": "sleep 1"}).encode(), 400, "list of strings"),
        (json.dumps({"command": ["true"], "gpus": -1}).encode(), 400, "between 1 and 64"),
        (json.dumps({"command": ["true"], "gpus": 10**9}).encode(), 400, "between 1 and 64"),
        (json.dumps({"command": ["true"], "gpus": "2"}).encode(), 400, "must be an integer"),
        (json.dumps({"command": ["true"], "gpu": 2}).encode(), 400, "unknown field gpu"),
        (json.dumps({"command": ["true\u0000"]}).encode(), 400, "NUL byte"),
        (json.dumps({"command": ["true"], "env": {"A": "b\u0000"}}).encode(), 400, "NUL byte"),
        pytest.param(json.dumps({"command": BIG}).encode(), 413, "limit is", id="a 10 MiB command"),
        (json.dumps({"command": ["true"], "gpus": 8}).encode(), 422, "can never run here"),
        (json.dumps({"command": ["true"], "priority": "urgentest"}).encode(), 400, "unknown priority"),
        (json.dumps({"command": ["true"], "requeue_on_timeout": True}).encode(), 400, "needs a time limit"),
        (json.dumps({"command": ["true"], "requeue_on_timeout": "yes"}).encode(), 400, "true or false"),
        (json.dumps({"command": ["true"], "grace_s": 600}).encode(), 400, "grace is at most"),
        (json.dumps({"command": ["true"], "after_reservation": "cancel"}).encode(), 400, "name the reservation too"),
        (json.dumps({"command": ["true"], "reservation": "x", "after_reservation": "drop"}).encode(), 400,
         "must be queue or cancel"),
        (json.dumps({"command": ["true"], "reservation": "x"}).encode(), 422, "there is no reservation 'x'"),
    ],
)
def test_bad_submits_are_refused_and_nothing_is_stored(running_lab, body, status, words):
    lab = running_lab
    before = stored(lab.data)
    got, doc = _raw(lab, "POST", "/v1/jobs", body, _token(lab))
    assert got == status, doc
    assert words in doc["error"]["message"]
    assert stored(lab.data) == before


@pytest.mark.parametrize("token", [None, "", "lqu_wrong"])
def test_missing_or_wrong_tokens_get_401(running_lab, token):
    got, doc = _raw(running_lab, "GET", "/v1/jobs", None, token)
    assert got == 401 and doc["error"]["code"] == "unauthorized"


def test_unknown_paths_methods_and_missing_length(running_lab):
    token = _token(running_lab)
    assert _raw(running_lab, "GET", "/v1/nope", None, token)[0] == 404
    assert _raw(running_lab, "DELETE", "/v1/jobs", None, token)[0] == 405
    got, doc = _raw(running_lab, "POST", "/v1/jobs/1/actions", json.dumps({"action": "explode"}).encode(), token)
    assert got == 400 and "action must be one of" in doc["error"]["message"]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"gpus": 2, "start": 4e9 - 10}, 400, "end is required"),
        ({"gpus": 0, "start": 1, "end": 2}, 400, "gpus"),
        ({"gpus": 2, "start": 100, "end": 50}, 400, "end must be after start"),
        ({"gpus": 2, "start": "fri 09:00", "end": 5}, 400, "start must be a number"),
        ({"gpus": 2, "start": 1, "end": 2, "users": "alice"}, 400, "users must be a list"),
        ({"gpus": 2, "start": 1, "end": 2, "users": ["alice"], "group": "nlp"}, 400, "not both"),
        ({"gpus": 2, "start": 1, "end": 2, "color": "red"}, 400, "unknown field color"),
        ({"gpus": 2, "start": 1, "end": 2}, 400, "in the past"),
        ({"gpus": 2, "start": 3e9, "end": 3e9 + 60, "group": "nlp"}, 422, "there is no group 'nlp'"),
        ({"gpus": 2, "start": 3e9, "end": 3e9 + 60, "name": "../x"}, 400, "name"),
    ],
)
def test_bad_bookings_are_refused_and_nothing_is_stored(running_lab, body, status, words):
    lab = running_lab
    before = stored(lab.data)
    got, doc = _raw(lab, "POST", "/v1/reservations", json.dumps(body).encode(), _token(lab))
    assert got == status, doc
    assert words in doc["error"]["message"]
    assert stored(lab.data) == before


def test_reservation_names_that_do_not_exist(running_lab):
    token = _token(running_lab)
    got, doc = _raw(running_lab, "DELETE", "/v1/reservations/nope", None, token)
    assert got == 404 and "no reservation 'nope'" in doc["error"]["message"]
    got, doc = _raw(running_lab, "POST", "/v1/jobs", json.dumps({"command": ["true"], "reservation": "nope"}).encode(),
                    token)
    assert got == 422 and "no reservation 'nope'" in doc["error"]["message"]


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "words"),
    [
        ("POST", "/v1/jobs", b"null", None, 400, "must be a JSON object"),
        ("POST", "/v1/jobs/1/actions", b"null", None, 400, "must be a JSON object"),
        ("POST", "/v1/users", b"null", None, 400, "must be a JSON object"),
        ("POST", "/v1/agents/ws1/sync", b"null", None, 400, "must be a JSON object"),
        ("POST", "/v1/jobs", b'{"command": ["echo", "\\ud800"]}', None, 400, "lone surrogate"),
        ("POST", "/v1/jobs", b'{"command":' + b"[" * 100_000, None, 400, "nested deeper"),
        ("POST", "/v1/jobs", json.dumps({"command": ["true"], "name": "evil\n"}).encode(), None, 400,
         "control character"),
        ("POST", "/v1/users", json.dumps({"name": "alice\n"}).encode(), None, 400, "control character"),
        ("POST", "/v1/jobs", json.dumps({"command": ["true"], "runtime": "process", "image": "busybox"}).encode(),
         None, 400, "an image is given"),
        ("POST", "/v1/jobs", b"{}", {"Content-Length": "-1"}, 400, "Content-Length"),
        ("PATCH", "/v1/jobs", None, None, 405, "takes GET"),
        ("DELETE", "/v1/users/alice%0A", None, None, 400, "control character"),
        ("GET", "/v1/jobs?limit=-1", None, None, 400, "limit"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 30 else None,
)
def test_reports_of_issue_13_get_a_json_4xx_and_change_nothing(running_lab, method, path, body, headers, status,
                                                               words):
    lab = running_lab
    before = stored(lab.data)
    got, doc = _raw(lab, method, path, body, _token(lab), headers)
    assert got == status, doc
    assert words in doc["error"]["message"]
    assert stored(lab.data) == before


def test_a_short_body_does_not_hold_the_leader(running_lab):
    """A body that never comes is answered after the request timeout (10 s by default), and meanwhile the leader
    answers everyone else."""
    import socket
    import time

    parts = urllib.parse.urlsplit(running_lab.url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30)
    try:
        sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nAuthorization: Bearer " + _token(running_lab).encode()
                     + b"\r\nContent-Length: 100\r\n\r\n{}")  # a known caller: its body is waited for
        start = time.monotonic()
        assert _raw(running_lab, "GET", "/v1/whoami", None, _token(running_lab))[0] == 200
        answer = sock.makefile("rb").readline()
        assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - start < 15
    finally:
        sock.close()
