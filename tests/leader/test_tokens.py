"""Tokens an admin manages: made, listed by id, revoked at once (their event streams too), expiring, limited
guessing; a real leader on loopback with its TinyDB store, restarted where a test says so."""

from __future__ import annotations

import http.client
import json
import threading
import time

import pytest

from labq.leader.config import LeaderConfig
from labq.leader.core import Leader
from labq.protocol.identity import token_hash
from labq.store import PutRecord, TinyDBStore
from tests.conftest import FakeClock
from tests.leader.loopback_leader import start_loopback_leader

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def leaders(tmp_path):
    made = []

    def start(folder: str = "leader", **kw):
        made.append(start_loopback_leader(tmp_path / folder, **kw))
        return made[-1]

    yield start
    for lab in made:
        lab.stop()


def add_user(lab, name: str, admin: bool = False) -> str:
    status, _, doc = lab.request("POST", "/v1/users", {"name": name, "admin": admin})
    assert status == 201, doc
    return doc["token"]


def whoami(lab, token: str) -> int:
    return lab.request("GET", "/v1/whoami", token=token)[0]


def test_an_admin_makes_lists_and_revokes_a_token_and_the_store_keeps_only_hashes(leaders, tmp_path):
    lab = leaders()
    alice = add_user(lab, "alice")
    status, _, made = lab.request("POST", "/v1/tokens", {"user": "alice", "name": "laptop"})
    assert status == 201, made
    secret, token_id = made["secret"], made["token"]["id"]
    assert whoami(lab, secret) == 200 and whoami(lab, alice) == 200
    assert lab.request("GET", "/v1/whoami", token=secret)[2]["user"] == "alice"
    stored = lab.store_bytes()
    assert secret.encode() not in stored and alice.encode() not in stored
    assert token_hash(secret).encode() in stored  # only its hash is kept
    _, _, listed = lab.request("GET", "/v1/tokens")
    mine = {t["id"]: t for t in listed["tokens"] if t["user"] == "alice"}
    assert mine[token_id]["name"] == "laptop" and {t["name"] for t in mine.values()} == {"laptop", "login"}
    assert not any("secret" in t or "token_sha256" in t for t in listed["tokens"])
    assert secret not in json.dumps(listed)

    status, _, doc = lab.request("DELETE", f"/v1/tokens/{token_id}")
    assert status == 200 and doc["token"]["id"] == token_id
    assert whoami(lab, secret) == 401  # at once
    assert whoami(lab, alice) == 200  # her other token works on
    data = lab.data_dir
    lab.stop()
    again = start_loopback_leader(data)  # revoked stays revoked, kept stays kept
    try:
        assert whoami(again, secret) == 401 and whoami(again, alice) == 200
    finally:
        again.stop()


def test_who_may_make_see_and_revoke_tokens(leaders):
    lab = leaders()
    alice, bob = add_user(lab, "alice"), add_user(lab, "bob")
    _, _, made = lab.request("POST", "/v1/tokens", {"user": "bob", "name": "ci"})
    bobs = made["token"]["id"]
    assert lab.request("POST", "/v1/tokens", {"user": "alice"}, token=alice)[0] == 403
    assert lab.request("POST", "/v1/tokens", {"user": "nobody"})[0] == 404
    assert lab.request("POST", "/v1/tokens", {"user": "bob", "name": "ci"})[0] == 409  # names are unique per user
    assert lab.request("POST", "/v1/tokens", {"user": "bob", "expires_s": 1})[0] == 400
    assert lab.request("POST", "/v1/tokens", {"user": "bob", "extra": 1})[0] == 400
    _, _, seen = lab.request("GET", "/v1/tokens", token=alice)
    assert {t["user"] for t in seen["tokens"]} == {"alice"}  # a user sees their own
    assert [t["this_request"] for t in seen["tokens"]] == [True]
    assert lab.request("GET", "/v1/tokens?user=bob", token=alice)[0] == 403
    assert lab.request("DELETE", f"/v1/tokens/{bobs}", token=alice)[0] == 404  # another's: as if not there
    assert lab.request("DELETE", "/v1/tokens/not-hex", token=alice)[0] == 400
    own = seen["tokens"][0]["id"]
    assert lab.request("DELETE", f"/v1/tokens/{own}", token=alice)[0] == 200  # a user revokes their own
    assert whoami(lab, alice) == 401 and whoami(lab, bob) == 200


def test_user_add_again_replaces_the_login_token_and_user_rm_ends_every_token(leaders):
    lab = leaders()
    first = add_user(lab, "carol")
    _, _, made = lab.request("POST", "/v1/tokens", {"user": "carol", "name": "laptop"})
    second = add_user(lab, "carol")
    assert whoami(lab, first) == 401 and whoami(lab, second) == 200 and whoami(lab, made["secret"]) == 200
    assert lab.request("DELETE", "/v1/users/carol")[0] == 200
    assert whoami(lab, second) == 401 and whoami(lab, made["secret"]) == 401
    assert not [t for t in lab.request("GET", "/v1/tokens")[2]["tokens"] if t["user"] == "carol"]


def test_a_token_expires_on_the_leaders_clock(leaders):
    clock = FakeClock(1_000_000.0)
    lab = leaders(clock=clock)
    add_user(lab, "dave")
    _, _, made = lab.request("POST", "/v1/tokens", {"user": "dave", "name": "day", "expires_s": 86400})
    assert made["token"]["expires_at"] == 1_000_000.0 + 86400
    assert whoami(lab, made["secret"]) == 200
    clock.now += 86400
    status, _, doc = lab.request("GET", "/v1/whoami", token=made["secret"])
    assert status == 401 and "expired" in doc["error"]["message"]
    listed = {t["id"]: t for t in lab.request("GET", "/v1/tokens")[2]["tokens"]}
    assert listed[made["token"]["id"]]["expired"] is True
    # an expired name may be used again
    assert lab.request("POST", "/v1/tokens", {"user": "dave", "name": "day"})[0] == 201


def test_a_revoked_tokens_open_event_stream_ends_at_once(leaders):
    lab = leaders()
    add_user(lab, "erin")
    _, _, made = lab.request("POST", "/v1/tokens", {"user": "erin", "name": "watch"})
    conn = http.client.HTTPConnection("127.0.0.1", lab.port, timeout=30)
    conn.request("GET", "/v1/events", headers={"Authorization": f"Bearer {made['secret']}"})
    stream = conn.getresponse()
    assert stream.status == 200
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(stream.read()), daemon=True)
    reader.start()  # the headers came: the leader's side waits for events, 15 s between keepalives
    started = time.monotonic()
    assert lab.request("DELETE", f"/v1/tokens/{made['token']['id']}")[0] == 200
    reader.join(10)
    assert not reader.is_alive(), "the revoked token's stream is still open"
    assert time.monotonic() - started < 10  # not at the next keepalive 15 s on
    assert b"event: revoked" in got[0]
    conn.close()


def test_an_address_that_keeps_failing_is_refused_for_a_while_and_others_are_not(leaders):
    monotonic = FakeClock(500.0)
    lab = leaders(monotonic=monotonic, auth_failures_per_minute=3)

    def whoami_from(source: str, token: str) -> int:
        request = f"GET /v1/whoami HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
        return lab.send_raw(request, source=source)[0]

    assert [whoami_from("127.0.0.2", "lqu_guess") for _ in range(3)] == [401, 401, 401]
    assert whoami_from("127.0.0.2", "lqu_guess") == 429
    assert whoami_from("127.0.0.2", lab.admin_token) == 429  # not even looked at
    assert whoami_from("127.0.0.3", lab.admin_token) == 200  # another address is not held up
    assert [whoami_from("127.0.0.2", "") for _ in range(2)] == [429, 429]
    monotonic.now += 61
    assert whoami_from("127.0.0.2", lab.admin_token) == 200
    status, _, body = lab.send_raw(b"GET /v1/whoami HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer x\r\n\r\n",
                                   source="127.0.0.4")
    assert status == 401 and b"lqu_guess" not in body


def test_a_lab_whose_users_kept_their_token_hash_in_their_record_still_works(tmp_path):
    """Labs made before tokens had names: the hash in the user's record is their login token."""
    data = tmp_path / "old"
    store = TinyDBStore(data)
    store.commit([PutRecord("users", "root", {"admin": True, "token_sha256": token_hash("lqu_old_root")}),
                  PutRecord("users", "fay", {"admin": False, "token_sha256": token_hash("lqu_old_fay")})])
    store.close()
    lab = start_loopback_leader(data)
    try:
        assert whoami(lab, "lqu_old_fay") == 200
        listed = lab.request("GET", "/v1/tokens", token="lqu_old_root")[2]["tokens"]
        fays = [t for t in listed if t["user"] == "fay"]
        assert [t["name"] for t in fays] == ["login"]
        assert lab.request("DELETE", f"/v1/tokens/{fays[0]['id']}", token="lqu_old_root")[0] == 200
        assert whoami(lab, "lqu_old_fay") == 401 and whoami(lab, "lqu_old_root") == 200
    finally:
        lab.stop()
    store = TinyDBStore(data)
    try:
        leader = Leader(LeaderConfig(host="127.0.0.1", port=0, data_dir=data), store)
        assert leader.users.tokens.find("lqu_old_fay") is None  # the revocation was saved
        assert leader.users.tokens.find("lqu_old_root") is not None
    finally:
        store.close()
