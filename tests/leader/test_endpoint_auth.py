"""Who may call what: every route in ``ROUTES``, called by each kind of caller, answers exactly what
``docs/api.md`` promises. One table: a route (method, path template) -> its cases (a path with
real ids, a valid body where it takes one, and the status each caller gets). The callers: no token, a
wrong token, alice (a non-admin user: the owner of what a case acts on), bob (another non-admin user,
acting on alice's things), an admin, an agent's token, the join token and the lab's metrics scrape token.

Bodies are valid, so that the only reason for a refusal is who is asking; a refusal is a JSON error
with the code of its status, and the store's file is byte for byte what it was. What a call changes
(a cancel, a new user, a revoked token, a booking) is made fresh for each call, so every call stands
alone. A route added to ``ROUTES`` without a row here fails ``test_the_table_covers_every_route``.

A real leader on loopback (``tests/leader/loopback_leader.py``) with its TinyDB store; its scheduler
thread is not started, so nothing but the request writes the store while it is answered (one pass is
run by hand at the start, to place alice's job whose log is asked for).
"""

from __future__ import annotations

import http.client
import itertools
import json
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from labq.leader.routes import PUBLIC, ROUTES
from tests.leader.loopback_leader import start_loopback_leader

pytestmark = pytest.mark.timeout(120)

#: each route's path with its groups as ``{}``: ``/v1/jobs/{}/actions`` (as tests/leader/test_api_fuzz.py)
TEMPLATES = {(method, re.sub(r"\([^)]*\)", "{}", pattern.pattern.strip("^$"))): handler
             for method, pattern, handler in ROUTES}
PUBLIC_TEMPLATES = {key for key, handler in TEMPLATES.items() if handler in PUBLIC}

CALLERS = ("none", "wrong", "alice", "bob", "admin", "agent", "join", "scrape")
SCRAPE_TOKEN = "lab-scrape-" + secrets.token_urlsafe(24)  #: the leader's ``[metrics] scrape_token``
CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
         409: "conflict", 422: "unprocessable", 503: "unavailable"}
AGENT_NODE = "n1"  #: the node whose agent token is the "agent" caller; alice's placed job runs there
OTHER_NODE = "n2"  #: another node, registered with its own agent token


def node(name: str) -> dict:
    return {"name": name, "gpus": [{"index": 0, "uuid": f"SIM-{name}-0", "model": "RTX 3090", "memory_mib": 24576}],
            "topology": {"pcie": [[0]], "nvlinks": [[0]], "nvswitch_links": [], "numa": []},
            "unmanaged_busy": [], "simulated": True, "labels": []}


class Lab:
    """The leader, the callers' tokens and the objects the cases act on; ``fresh_*`` make new ones."""

    def __init__(self, lb) -> None:
        self.lb = lb
        self._n = itertools.count(1)
        self.tokens = {"none": None, "wrong": "lqu_" + secrets.token_urlsafe(32), "admin": lb.admin_token,
                       "join": lb.join_token, "scrape": SCRAPE_TOKEN}
        self.names = {"alice": "alice", "bob": "bob", "admin": "root"}
        for user in ("alice", "bob"):
            status, _, doc = lb.request("POST", "/v1/users", {"name": user, "admin": False})
            assert status == 201, doc
            self.tokens[user] = doc["token"]
        for name in (AGENT_NODE, OTHER_NODE):
            status, _, doc = lb.request("POST", "/v1/agents/register", {"node": node(name), "version": "0"},
                                        token=lb.join_token)
            assert status == 200, doc
            if name == AGENT_NODE:
                self.tokens["agent"] = doc["agent_token"]
        # alice's job, placed on n1 by one scheduling pass (what the scheduler thread runs), so that it has a log
        self.placed_job = self.fresh_job("alice")
        lb.leader.scheduling.schedule_pass()
        _, _, doc = lb.request("GET", f"/v1/jobs/{self.placed_job}")
        assert doc["job"]["placement"]["allocations"][0]["node"] in (AGENT_NODE, OTHER_NODE), doc
        # bob's finished job, which only bob may restart
        self.bobs_finished_job = self.fresh_job("bob")
        status, _, doc = lb.request("POST", f"/v1/jobs/{self.bobs_finished_job}/actions", {"action": "cancel"},
                                    token=self.tokens["bob"])
        assert status == 200 and doc["job"]["state"] == "cancelled", doc

    def unique(self, prefix: str) -> str:
        return f"{prefix}{next(self._n)}"

    def fresh_job(self, user: str) -> int:
        status, _, doc = self.lb.request("POST", "/v1/jobs", {"command": ["python", "train.py"], "gpus": 1},
                                         token=self.tokens[user])
        assert status == 201, doc
        return doc["job"]["id"]

    def window(self) -> tuple[float, float]:
        """An hour of its own, a day or more ahead: bookings never overlap one another."""
        start = time.time() + 2 * 86400 + next(self._n) * 4000.0
        return start, start + 3600.0

    def booking(self, **extra) -> dict:
        start, end = self.window()
        return {"gpus": 1, "start": start, "end": end, "name": self.unique("r"), "users": ["bob"], **extra}

    def fresh_reservation(self) -> str:
        status, _, doc = self.lb.request("POST", "/v1/reservations", self.booking(), token=self.tokens["alice"])
        assert status == 201, doc
        return doc["reservation"]["name"]

    def fresh_user(self) -> str:
        name = self.unique("carol")
        status, _, doc = self.lb.request("POST", "/v1/users", {"name": name, "admin": False})
        assert status == 201, doc
        return name

    def fresh_node(self) -> str:
        name = self.unique("gone")
        status, _, doc = self.lb.request("POST", "/v1/agents/register", {"node": node(name), "version": "0"},
                                         token=self.lb.join_token)
        assert status == 200, doc
        return name

    def fresh_join(self) -> str:
        status, _, doc = self.lb.request("POST", "/v1/joins", {"expires_s": 3600})
        assert status == 201, doc
        return doc["join"]["id"]

    def fresh_token_of_alice(self) -> str:
        status, _, doc = self.lb.request("POST", "/v1/tokens", {"user": "alice", "name": self.unique("spare")})
        assert status == 201, doc
        return doc["token"]["id"]


def people(alice: int, bob: int, admin: int, *, agent: int = 403, join: int = 403, scrape: int = 401
           ) -> dict[str, int]:
    """A route behind a token: no token or a wrong one is a 401; the agent and join tokens are for agents; the
    scrape token opens ``/metrics`` alone: anywhere else it is no token at all."""
    return {"none": 401, "wrong": 401, "alice": alice, "bob": bob, "admin": admin, "agent": agent, "join": join,
            "scrape": scrape}


def everyone(status: int) -> dict[str, int]:
    return dict.fromkeys(CALLERS, status)


@dataclass(frozen=True)
class Case:
    label: str
    expect: dict[str, int]
    path: Callable[[Lab], str]
    body: Callable[[Lab], object] | None = None
    stream: bool = False  #: an event stream: only its status line and headers are read
    ok: Callable[[Lab, str, dict], None] | None = None  #: more to check of a success's body
    content_type: str = "application/json"  #: a success's; refusals are always JSON


def same_user(lab: Lab, caller: str, doc: dict) -> None:
    assert doc["user"] == lab.names[caller] and doc["admin"] == (caller == "admin"), doc


def own_jobs_only(lab: Lab, caller: str, doc: dict) -> None:
    assert all(j["spec"]["user"] == lab.names[caller] for j in doc["jobs"]), doc


def own_tokens_unless_admin(lab: Lab, caller: str, doc: dict) -> None:
    users = {t["user"] for t in doc["tokens"]}
    assert users >= {"root", "alice", "bob"} if caller == "admin" else users == {lab.names[caller]}, doc
    assert not any("secret" in t or "token_sha256" in t or "sha256" in t for t in doc["tokens"]), doc


def own_events_unless_admin(lab: Lab, caller: str, doc: dict) -> None:
    who = {e.get("user") for e in doc["events"]} | {e.get("owner") for e in doc["events"] if "owner" in e}
    if caller == "admin":
        assert {"root", "alice", "bob"} <= who, doc
    else:
        assert all(e.get("user") == lab.names[caller] or e.get("owner") == lab.names[caller]
                   for e in doc["events"]) and doc["events"], doc


def own_settings(lab: Lab, caller: str, doc: dict) -> None:
    assert doc["user"] == lab.names[caller] and "on" in doc and "channels" in doc, doc


def submitted_as_caller(lab: Lab, caller: str, doc: dict) -> None:
    assert doc["job"]["spec"]["user"] == lab.names[caller], doc


#: (method, template) -> the cases of that route. Expected statuses come from the route and service code
#: (labq/leader/routes.py, users.py, queue.py, agents.py, bookings.py) and API.md; where they disagree on who
#: may call, the row says what API.md promises (see the comments).
TABLE: dict[tuple[str, str], list[Case]] = {
    # public: no token read, so every caller gets the same; a plain-HTTP leader has no CA (404)
    ("GET", "/v1/tls/ca"): [Case("plain HTTP: no CA", everyone(404), lambda lab: "/v1/tls/ca")],
    # API.md: a user token for everything under People; the join token only for registering, an agent's only
    # for /v1/agents/NAME/... The route answers any valid token (routes.py _whoami): agent and join SHOULD be 403
    ("GET", "/metrics"): [Case("the lab's metrics", people(200, 200, 200, scrape=200), lambda lab: "/metrics",
                               content_type="text/plain; version=0.0.4; charset=utf-8")],
    ("GET", "/v1/whoami"): [Case("who am I", people(200, 200, 200, agent=403, join=403), lambda lab: "/v1/whoami",
                                 ok=same_user)],
    ("POST", "/v1/jobs"): [
        Case("submit", people(201, 201, 201), lambda lab: "/v1/jobs",
             lambda lab: {"command": ["python", "train.py"], "gpus": 1}, ok=submitted_as_caller),
        Case("submit --no-preempt (admins only)", people(403, 403, 201), lambda lab: "/v1/jobs",
             lambda lab: {"command": ["python", "train.py"], "gpus": 1, "preemptible": False}),
    ],
    ("GET", "/v1/jobs"): [Case("own jobs", people(200, 200, 200), lambda lab: "/v1/jobs", ok=own_jobs_only)],
    # the queue is the lab's: any user sees any job (API.md: `all=1` lists everyone's)
    ("GET", "/v1/jobs/{}"): [Case("alice's job", people(200, 200, 200), lambda lab: f"/v1/jobs/{lab.placed_job}")],
    ("POST", "/v1/jobs/{}/actions"): [
        Case("cancel alice's job", people(200, 403, 200), lambda lab: f"/v1/jobs/{lab.fresh_job('alice')}/actions",
             lambda lab: {"action": "cancel"}),
        Case("top alice's job (admins only)", people(403, 403, 200),
             lambda lab: f"/v1/jobs/{lab.fresh_job('alice')}/actions", lambda lab: {"action": "top"}),
        # bob's finished job: only its submitter restarts it, not even an admin (queue.py restart)
        Case("restart bob's job", people(403, 201, 403), lambda lab: f"/v1/jobs/{lab.bobs_finished_job}/actions",
             lambda lab: {"action": "restart"}),
    ],
    # alice's placed job; its node serves no logs, so those who may read it get 503 (after the 401s and 403s)
    ("GET", "/v1/jobs/{}/logs"): [Case("alice's log", people(503, 403, 503),
                                       lambda lab: f"/v1/jobs/{lab.placed_job}/logs")],
    ("DELETE", "/v1/history"): [Case("clean own history", people(200, 200, 200), lambda lab: "/v1/history")],
    ("POST", "/v1/reservations"): [
        Case("book", people(201, 201, 201), lambda lab: "/v1/reservations", lambda lab: lab.booking()),
        Case("book for alice (owner: admins for others)", people(201, 403, 201), lambda lab: "/v1/reservations",
             lambda lab: lab.booking(owner="alice")),
    ],
    ("GET", "/v1/reservations"): [Case("list", people(200, 200, 200), lambda lab: "/v1/reservations?all=1")],
    ("DELETE", "/v1/reservations/{}"): [Case("cancel alice's booking", people(200, 403, 200),
                                             lambda lab: f"/v1/reservations/{lab.fresh_reservation()}")],
    ("GET", "/v1/nodes"): [Case("nodes", people(200, 200, 200), lambda lab: "/v1/nodes")],
    ("GET", "/v1/queues"): [Case("queues", people(200, 200, 200), lambda lab: "/v1/queues")],
    # a user's own usage for anyone; another user's, or the whole lab's, for admins
    ("GET", "/v1/usage"): [
        Case("alice's usage (hers; admins)", people(200, 403, 200), lambda lab: "/v1/usage?user=alice"),
        Case("the lab's usage (admins)", people(403, 403, 200), lambda lab: "/v1/usage"),
    ],
    ("DELETE", "/v1/nodes/{}"): [Case("forget a node (admins)", people(403, 403, 200),
                                      lambda lab: f"/v1/nodes/{lab.fresh_node()}")],
    ("GET", "/v1/history"): [Case("the lab's finished jobs, for a replay (admins)", people(403, 403, 200),
                                  lambda lab: "/v1/history")],
    ("GET", "/v1/joins"): [Case("join tokens (admins)", people(403, 403, 200), lambda lab: "/v1/joins")],
    ("POST", "/v1/joins"): [Case("a join token (admins)", people(403, 403, 201), lambda lab: "/v1/joins",
                                 lambda lab: {"expires_s": 3600})],
    ("DELETE", "/v1/joins/{}"): [Case("revoke a join token (admins)", people(403, 403, 200),
                                      lambda lab: f"/v1/joins/{lab.fresh_join()}")],
    ("GET", "/v1/users"): [Case("users (admins)", people(403, 403, 200), lambda lab: "/v1/users")],
    ("POST", "/v1/users"): [Case("add a user (admins)", people(403, 403, 201), lambda lab: "/v1/users",
                                 lambda lab: {"name": lab.unique("dave"), "admin": False})],
    ("DELETE", "/v1/users/{}"): [Case("remove a user (admins)", people(403, 403, 200),
                                      lambda lab: f"/v1/users/{lab.fresh_user()}")],
    ("GET", "/v1/tokens"): [
        Case("own tokens (admins: everyone's)", people(200, 200, 200), lambda lab: "/v1/tokens",
             ok=own_tokens_unless_admin),
        Case("alice's tokens", people(200, 403, 200), lambda lab: "/v1/tokens?user=alice"),
    ],
    # admins only, a token for oneself too
    ("POST", "/v1/tokens"): [Case("a token for alice (admins)", people(403, 403, 201), lambda lab: "/v1/tokens",
                                  lambda lab: {"user": "alice", "name": lab.unique("t"), "expires_s": 3600})],
    # another user's token is "not found" for a user (users.py revoke_token): no way to tell which ids exist
    ("DELETE", "/v1/tokens/{}"): [Case("revoke alice's spare token", people(200, 404, 200),
                                       lambda lab: f"/v1/tokens/{lab.fresh_token_of_alice()}")],
    ("GET", "/v1/audit"): [
        Case("the audit trail (users: their own part)", people(200, 200, 200), lambda lab: "/v1/audit",
             ok=own_events_unless_admin),
        Case("another user's part (admins)", people(200, 403, 200), lambda lab: "/v1/audit?user=alice"),
    ],
    # a person's notification settings: their own for anyone, another's for admins (users.py's rule for tokens)
    ("GET", "/v1/notify"): [
        Case("own notification settings", people(200, 200, 200), lambda lab: "/v1/notify", ok=own_settings),
        Case("alice's notification settings", people(200, 403, 200), lambda lab: "/v1/notify?user=alice"),
    ],
    ("PUT", "/v1/notify"): [
        Case("set own notifications", people(200, 200, 200), lambda lab: "/v1/notify",
             lambda lab: {"on": ["end", "fail"]}, ok=own_settings),
        Case("set alice's notifications (hers; admins)", people(200, 403, 200), lambda lab: "/v1/notify",
             lambda lab: {"user": "alice", "on": ["fail"], "email": "alice@lab.org"}),
    ],
    ("GET", "/v1/notify/status"): [Case("the channels' health (admins)", people(403, 403, 200),
                                        lambda lab: "/v1/notify/status")],
    ("GET", "/v1/events"): [Case("event stream", people(200, 200, 200), lambda lab: "/v1/events", stream=True)],
    ("POST", "/v1/agents/register"): [
        Case("register a new node (join token)", people(403, 403, 403, agent=403, join=200),
             lambda lab: "/v1/agents/register", lambda lab: {"node": node(lab.unique("new")), "version": "0"}),
    ],
    ("POST", "/v1/agents/{}/sync"): [
        Case("sync as itself", people(403, 403, 403, agent=200, join=403), lambda lab: f"/v1/agents/{AGENT_NODE}/sync",
             lambda lab: {"attempts": [], "unmanaged_busy": [], "wait_s": 0}),
        Case("sync as another node", people(403, 403, 403, agent=403, join=403),
             lambda lab: f"/v1/agents/{OTHER_NODE}/sync", lambda lab: {"attempts": [], "wait_s": 0}),
    ],
}
#: the routes that need no token (``public=True`` in routes.py)
PUBLIC_ROWS = {("GET", "/v1/tls/ca")}

ROWS = [pytest.param(key, case, caller, id=f"{key[0]} {key[1]} [{case.label}] {caller}")
        for key, cases in TABLE.items() for case in cases for caller in CALLERS]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    # no limit on failed authentication: the wrong-token rows would get 429s (tests/leader/test_tokens.py tests it)
    lb = start_loopback_leader(tmp_path_factory.mktemp("endpoint-auth"), auth_failures_per_minute=0,
                               metrics_scrape_token=SCRAPE_TOKEN)
    try:
        yield Lab(lb)
    finally:
        lb.stop()


def call(lab: Lab, method: str, path: str, body: object, token: str | None, stream: bool):
    """(status, headers, body bytes); of an event stream that answered 200, only the status and headers."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    payload = None if body is None else json.dumps(body).encode()
    if payload is not None:
        headers["Content-Type"] = "application/json"
    conn = http.client.HTTPConnection("127.0.0.1", lab.lb.port, timeout=10)
    try:
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        found = {k.lower(): v for k, v in response.getheaders()}
        if stream and response.status == 200:
            return response.status, found, b""
        return response.status, found, response.read()
    finally:
        conn.close()


def test_the_table_covers_every_route():
    """Every route has a row, every row a route, and the table knows which routes are public."""
    assert set(TABLE) == set(TEMPLATES), (
        f"routes without a row: {sorted(set(TEMPLATES) - set(TABLE))}; rows without a route: "
        f"{sorted(set(TABLE) - set(TEMPLATES))}")
    assert PUBLIC_ROWS == PUBLIC_TEMPLATES
    for key, cases in TABLE.items():
        for case in cases:
            assert set(case.expect) == set(CALLERS), (key, case.label)
            if key in PUBLIC_ROWS:  # no token is read: whoever asks gets the same
                assert len(set(case.expect.values())) == 1, (key, case.label)
            else:  # behind a token: no token or a wrong one is refused first
                assert case.expect["none"] == case.expect["wrong"] == 401, (key, case.label)


@pytest.mark.parametrize("key, case, caller", ROWS)
def test_each_caller_gets_what_the_api_promises(lab, key, case, caller):
    method, _ = key
    path = case.path(lab)  # fresh objects first: the store is compared from here on
    body = case.body(lab) if case.body else None
    before = lab.lb.store_bytes()
    status, headers, raw = call(lab, method, path, body, lab.tokens[caller], case.stream)
    expected = case.expect[caller]
    assert status == expected, f"{method} {path} as {caller}: {status}, not {expected}: {raw[:300]!r}"
    if case.stream and status == 200:
        assert headers["content-type"] == "text/event-stream"
        return
    if status < 400 and case.content_type != "application/json":
        assert headers["content-type"] == case.content_type and raw, (headers, raw[:200])
        assert lab.lb.store_bytes() == before
        return
    assert headers["content-type"] == "application/json", headers
    doc = json.loads(raw)
    if status >= 400:
        assert doc["error"]["code"] == CODES[status] and doc["error"]["message"], doc
        assert lab.lb.store_bytes() == before, f"{method} {path} as {caller} was refused but changed the store"
    else:
        assert isinstance(doc, dict) and "error" not in doc, doc
        if case.ok:
            case.ok(lab, caller, doc)
