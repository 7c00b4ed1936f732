"""The leader's HTTP front: routes, authentication, JSON in and out, errors as JSON.

The standard library's threading server: one thread a request suits a lab's
scale (tens of agents and people), keeps long polls and event streams simple,
and matches the store's blocking group commit.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from labq import __version__
from labq.leader.core import Leader
from labq.models.job import Job
from labq.protocol import errors
from labq.protocol.agents import encode_reply, parse_registration, parse_sync
from labq.protocol.bookings import encode_answer, parse_reserve
from labq.protocol.codec import encode_job, encode_pending, encode_reservation
from labq.protocol.errors import ApiError
from labq.protocol.requests import MAX_BODY_BYTES, parse_action, parse_submit, parse_user, require_int

log = logging.getLogger("labq.leader.http")
KEEPALIVE_S = 15.0
DRAIN_LIMIT = 16 << 20  #: an oversized body up to this is read and dropped before the 413


class LeaderServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  #: the default listen backlog of 5 drops connections when many submit at once

    def __init__(self, leader: Leader, address: tuple[str, int]) -> None:
        self.leader = leader
        super().__init__(address, _Handler)


Route = tuple[str, re.Pattern, Callable]
ROUTES: list[Route] = []


def route(method: str, pattern: str):
    def register(fn):
        ROUTES.append((method, re.compile(f"^{pattern}$"), fn))
        return fn
    return register


class _Handler(BaseHTTPRequestHandler):
    server: LeaderServer
    protocol_version = "HTTP/1.1"
    server_version = f"labq/{__version__}"

    def log_message(self, fmt: str, *args) -> None:
        log.debug("%s %s", self.address_string(), fmt % args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def _dispatch(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        self.query = urllib.parse.parse_qs(url.query)
        try:
            matches = [(m, handler, match) for m, pattern, handler in ROUTES if (match := pattern.match(url.path))]
            chosen = [(handler, match) for m, handler, match in matches if m == method]
            if not chosen:
                if matches:
                    allowed = ", ".join(sorted({m for m, _, _ in matches}))
                    raise ApiError(405, "method_not_allowed", f"{url.path} takes {allowed}")
                raise errors.not_found(f"no such API path: {url.path} (see labq/protocol/API.md)")
            handler, match = chosen[0]
            body = self._body() if method in ("POST", "PUT") else None
            who = self.server.leader.authenticate(self._token())
            args = (self, who, *match.groups())
            result = handler(*args, body) if body is not None else handler(*args)
            if result is not None:
                status, doc = result
                self._json(status, doc)
        except ApiError as err:
            self._json(err.status, err.to_json())
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as err:  # a bug: answer 500, keep serving
            log.exception("internal error on %s %s", method, self.path)
            self._json(500, ApiError(500, "internal", f"internal error in the leader: {type(err).__name__}").to_json())

    def _token(self) -> str | None:
        header = self.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None

    def _body(self) -> object:
        length = self.headers.get("Content-Length")
        if length is None:
            self.close_connection = True
            raise ApiError(411, "length_required", "the request needs a Content-Length")
        try:
            size = int(length)
        except ValueError:
            self.close_connection = True
            raise errors.bad_request("Content-Length is not a number") from None
        if size > MAX_BODY_BYTES:
            self.close_connection = True
            if size <= DRAIN_LIMIT:  # read it away, so the sender sees the answer instead of a broken pipe
                while size > 0:
                    size -= len(self.rfile.read(min(size, 1 << 16)) or b"\0" * size)
            raise errors.too_large(f"the request body is {size} bytes; the limit is {MAX_BODY_BYTES} "
                                   f"(a command that long belongs in a script file)")
        raw = self.rfile.read(size)
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as err:
            raise errors.bad_request(f"the body is not JSON: {err}") from None

    def _json(self, status: int, doc: object) -> None:
        """Sends ``doc`` as JSON; bytes are JSON already."""
        payload = doc if isinstance(doc, bytes) else json.dumps(doc, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def arg(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None


# -- people -------------------------------------------------------------------------------


@route("GET", "/v1/whoami")
def _whoami(h: _Handler, who) -> tuple[int, dict]:
    return 200, {"user": who.name, "kind": who.kind, "admin": who.admin}


@route("POST", "/v1/jobs")
def _submit(h: _Handler, who, body) -> tuple[int, dict]:
    job = h.server.leader.submit(who, parse_submit(body))
    return 201, {"job": encode_job(job)}


class _JobTexts:
    """Each unfinished job's JSON, made once per version of the job: jobs are immutable and replaced
    on every change, so the object itself says whether the text is current. A listing of 10,000 jobs
    is then a join of strings instead of 10,000 encodings (most of its cost)."""

    def __init__(self) -> None:
        self._texts: dict[int, tuple[Job, str]] = {}

    def listing(self, jobs: list[Job], live: dict[int, Job]) -> str:
        texts, parts = self._texts, []
        for job in jobs:
            cached = texts.get(job.id)
            if cached is not None and cached[0] is job:
                parts.append(cached[1])
                continue
            text = json.dumps(encode_job(job), separators=(",", ":"))
            if live.get(job.id) is job:
                texts[job.id] = (job, text)
            parts.append(text)
        if len(texts) > 2 * len(live) + 1000:  # finished jobs linger until the cache is twice the queue
            for job_id in [i for i in list(texts) if i not in live]:
                texts.pop(job_id, None)
        return "[" + ",".join(parts) + "]"


_JOB_TEXTS = _JobTexts()


@route("GET", "/v1/jobs")
def _jobs(h: _Handler, who) -> tuple[int, bytes]:
    limit = h.arg("limit")
    ids = tuple(require_int(i, "id") for i in h.query.get("id", ()))
    if len(ids) > 1000:
        raise errors.bad_request("at most 1000 ids at once", "id")
    leader = h.server.leader
    jobs = leader.visible_jobs(
        who, user=h.arg("user"), states=tuple(h.query.get("state", ())), everyone=h.arg("all") == "1" or bool(ids),
        history=h.arg("history") == "1", limit=require_int(limit, "limit") if limit else None, ids=ids)
    text = '{"jobs":' + _JOB_TEXTS.listing(jobs, leader.jobs)
    if h.arg("pending") == "1":
        pending = {str(i): encode_pending(p) for i, p in leader.pending_of(j.id for j in jobs).items()}
        text += ',"pending":' + json.dumps(pending, separators=(",", ":"))
    return 200, (text + "}").encode()


@route("GET", r"/v1/jobs/(\d+)")
def _job(h: _Handler, who, job_id: str) -> tuple[int, dict]:
    job, pending = h.server.leader.job(who, int(job_id))
    return 200, {"job": encode_job(job), "pending": encode_pending(pending)}


@route("POST", r"/v1/jobs/(\d+)/actions")
def _action(h: _Handler, who, job_id: str, body) -> tuple[int, dict]:
    job = h.server.leader.act(who, int(job_id), parse_action(body))
    return 200, {"job": encode_job(job)}


@route("GET", r"/v1/jobs/(\d+)/logs")
def _logs(h: _Handler, who, job_id: str) -> None:
    leader = h.server.leader
    job, _ = leader.job(who, int(job_id))
    if job.user != who.name and not who.admin:
        raise errors.forbidden(f"job {job.id} belongs to {job.user}")
    attempt = require_int(h.arg("attempt"), "attempt") if h.arg("attempt") else job.attempt
    offset = require_int(h.arg("offset"), "offset") if h.arg("offset") else 0
    placement = job.placement if attempt == job.attempt else next(
        (a.placement for a in job.history if a.number == attempt), None)
    if placement is None:
        if attempt == job.attempt:
            raise errors.not_found(f"job {job.id} has not started yet: no log")
        raise errors.not_found(f"job {job.id} has no attempt {attempt} that ran; it is on attempt {job.attempt}")
    node = placement.nodes[0]
    session = leader.agents.get(node)
    if session is None or not session.logs_url:
        raise errors.unavailable(f"node {node} does not serve logs")
    data, next_offset, done = _fetch_log(session.logs_url, session.logs_token, job.id, attempt, offset)
    done = done and not job.state.holds_gpus or (done and attempt != job.attempt)
    h.send_response(200)
    h.send_header("Content-Type", "text/plain; charset=utf-8")
    h.send_header("Content-Length", str(len(data)))
    h.send_header("X-Labq-Offset", str(next_offset))
    h.send_header("X-Labq-Done", "1" if done else "0")
    h.end_headers()
    h.wfile.write(data)


def _fetch_log(url: str, token: str | None, job_id: int, attempt: int, offset: int) -> tuple[bytes, int, bool]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", f"{parts.path.rstrip('/')}/v1/logs/{job_id}/{attempt}?offset={offset}",
                     headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        data = response.read()
        if response.status == 404:
            raise errors.not_found(f"the node has no log for job {job_id} attempt {attempt}")
        if response.status != 200:
            raise errors.unavailable(f"the node answered {response.status} for the log")
        return data, int(response.getheader("X-Labq-Offset", offset + len(data))), \
            response.getheader("X-Labq-Done") == "1"
    except OSError as err:
        raise errors.unavailable(f"cannot reach the node for the log: {err}") from None
    finally:
        conn.close()


@route("POST", "/v1/reservations")
def _reserve(h: _Handler, who, body) -> tuple[int, dict]:
    answer, booked = h.server.leader.bookings.reserve(who, parse_reserve(body))
    return (201 if booked else 200), encode_answer(answer, booked)


@route("GET", "/v1/reservations")
def _reservations(h: _Handler, who) -> tuple[int, dict]:
    return 200, {"reservations": [encode_reservation(r) for r in h.server.leader.bookings.view(who)]}


@route("DELETE", r"/v1/reservations/([^/]+)")
def _cancel_reservation(h: _Handler, who, name: str) -> tuple[int, dict]:
    r = h.server.leader.bookings.cancel(who, urllib.parse.unquote(name))
    return 200, {"reservation": encode_reservation(r)}


@route("GET", "/v1/nodes")
def _nodes(h: _Handler, who) -> tuple[int, dict]:
    return 200, {"nodes": h.server.leader.nodes_view(who), "unadmitted": h.server.leader.unadmitted()}


@route("GET", "/v1/users")
def _users(h: _Handler, who) -> tuple[int, dict]:
    return 200, {"users": h.server.leader.list_users(who)}


@route("POST", "/v1/users")
def _add_user(h: _Handler, who, body) -> tuple[int, dict]:
    user, token = h.server.leader.add_user(who, parse_user(body))
    return 201, {"user": user, "token": token}


@route("DELETE", r"/v1/users/([^/]+)")
def _remove_user(h: _Handler, who, name: str) -> tuple[int, dict]:
    return 200, {"user": h.server.leader.remove_user(who, urllib.parse.unquote(name))}


@route("GET", "/v1/events")
def _events(h: _Handler, who) -> None:
    if who.kind != "user":
        raise errors.forbidden("events are for users")
    hub = h.server.leader.events
    after = require_int(h.arg("after"), "after") if h.arg("after") else hub.seq
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.send_header("Cache-Control", "no-store")
    h.end_headers()
    h.close_connection = True
    stopping = h.server.leader._stopping
    while not stopping.is_set():
        events = hub.after(after, KEEPALIVE_S)
        if not events:
            h.wfile.write(b": keepalive\n\n")
        for event in events:
            h.wfile.write(f"id: {event.seq}\nevent: {event.kind}\ndata: {json.dumps(event.data)}\n\n".encode())
            after = event.seq
        h.wfile.flush()


# -- agents ------------------------------------------------------------------------------


@route("POST", "/v1/agents/register")
def _register(h: _Handler, who, body) -> tuple[int, dict]:
    registration = parse_registration(body)
    token = h.server.leader.register(who, registration, h.client_address[0])
    leader = h.server.leader
    return 200, {"agent_token": token, "logs_token": leader.logs_token(registration.node.name),
                 "lease_s": leader.config.lease_s, "fence_after_s": leader.config.fence_after_s,
                 "allowed_mount_roots": list(leader.config.allowed_mount_roots),
                 "allowed_images": list(leader.config.allowed_images),
                 "checkpoint_root": leader.config.checkpoint_root}


@route("POST", r"/v1/agents/([^/]+)/sync")
def _sync(h: _Handler, who, agent: str, body) -> tuple[int, dict]:
    return 200, encode_reply(h.server.leader.sync(who, agent, parse_sync(body)))


def serve(leader: Leader, host: str, port: int) -> LeaderServer:
    """Bind the API; the caller runs ``serve_forever`` (and ``shutdown`` to stop)."""
    return LeaderServer(leader, (host, port))
