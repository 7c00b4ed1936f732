"""The leader's HTTP front: routes, authentication, JSON in and out, errors as JSON.

The standard library's threading server: one thread a request suits a lab's
scale (tens of agents and people), keeps long polls and event streams simple,
and matches the store's blocking group commit. What keeps it answering whatever
arrives: every request body goes through ``labq.protocol.body`` and a parse
function (a wrong shape is a 400 there), every refusal is JSON (the standard
library's too), reading a request has a time limit, and one address may hold
only so many connections.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from labq import __version__
from labq.leader.core import Leader
from labq.models.job import Job
from labq.protocol import errors
from labq.protocol.agents import encode_reply, parse_registration, parse_sync
from labq.protocol.body import decode_body
from labq.protocol.bookings import encode_answer, parse_reserve
from labq.protocol.codec import encode_job, encode_pending, encode_reservation
from labq.protocol.errors import ApiError
from labq.protocol.names import check_name
from labq.protocol.requests import MAX_BODY_BYTES, parse_action, parse_submit, parse_user, require_int

log = logging.getLogger("labq.leader.http")
KEEPALIVE_S = 15.0
DRAIN_LIMIT = 64 << 20  #: an oversized body up to this is read and dropped after the 413, so its sender reads it
DRAIN_S = 30.0  #: and for at most this long
MAX_QUERY_FIELDS = 2000
_CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")
#: the standard library's own refusals (a bad request line, headers too long) by labq's codes
_STDLIB_CODES = {400: "bad_request", 408: "timeout", 413: "too_large", 414: "too_large", 431: "too_large",
                 505: "http_version"}


class LeaderServer(ThreadingHTTPServer):
    """One thread a connection, at most ``max_connections_per_address`` of them from one address: a client that
    opens connections and sends nothing (or very slowly) ties up only its own share."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  #: the default listen backlog of 5 drops connections when many submit at once

    def __init__(self, leader: Leader, address: tuple[str, int]) -> None:
        self.leader = leader
        self.request_timeout_s = leader.config.request_timeout_s
        self.max_connections_per_address = leader.config.max_connections_per_address
        self._open: dict[str, int] = {}
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request, client_address) -> None:
        host = client_address[0]
        with self._open_lock:
            count = self._open.get(host, 0)
            if count < self.max_connections_per_address:
                self._open[host] = count + 1
        if count >= self.max_connections_per_address:
            _refuse_busy(request, host, count)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._closed(host)
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._closed(client_address[0])

    def _closed(self, host: str) -> None:
        with self._open_lock:
            left = self._open.get(host, 1) - 1
            if left > 0:
                self._open[host] = left
            else:
                self._open.pop(host, None)


def _refuse_busy(request, host: str, count: int) -> None:
    """Answer 503 without a thread and without reading: the answer fits the socket's buffer, so this never
    blocks the accepting thread."""
    doc = ApiError(503, "busy", f"{count} connections from {host} are open already; close some and retry").to_json()
    payload = json.dumps(doc).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}"
            "\r\nRetry-After: 1\r\nConnection: close\r\n\r\n").encode()
    try:
        request.setblocking(False)
        request.send(head + payload)
    except OSError:
        pass


Route = tuple[str, re.Pattern, Callable]
ROUTES: list[Route] = []
_NO_HEAD: set[Callable] = set()  #: GET routes that stream their answer: HEAD is refused there


def route(method: str, pattern: str, *, head: bool = True):
    def register(fn):
        ROUTES.append((method, re.compile(f"^{pattern}$"), fn))
        if not head:
            _NO_HEAD.add(fn)
        return fn
    return register


class _Handler(BaseHTTPRequestHandler):
    """Every answer is JSON with a 4xx for what the client got wrong: routes, methods, bodies, the standard
    library's own refusals. Reading a request has a time limit (``leader.request_timeout``); writing the answer
    of a long poll or an event stream may take as long as it needs."""

    server: LeaderServer
    protocol_version = "HTTP/1.1"
    server_version = f"labq/{__version__}"

    def setup(self) -> None:
        self.timeout = self.server.request_timeout_s  # socketserver sets it on the socket: every recv and send
        self._allow: str | None = None
        self._unread = False
        super().setup()

    def handle(self) -> None:
        try:
            super().handle()
        except (ConnectionError, TimeoutError):  # the client went away or stalled mid-request: nothing to answer
            self.close_connection = True

    def log_message(self, fmt: str, *args) -> None:
        log.debug("%s %s", self.address_string(), fmt % args)

    def __getattr__(self, name: str):
        """``do_METHOD`` for every method: the routes say which a path takes (405 with ``Allow`` for the others,
        a 4xx like any refusal, not the standard library's HTML 501)."""
        if name.startswith("do_"):
            return lambda: self._dispatch(name[3:])
        raise AttributeError(name)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's refusals (a bad request line, headers too long), as JSON."""
        self.close_connection = True
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "error"
        text = message or explain or phrase
        self._json(code, ApiError(code, _STDLIB_CODES.get(code, "bad_request"), text).to_json())

    def handle_expect_100(self) -> bool:
        """``Expect: 100-continue`` with a body over the limit: 413 now, before the client sends it."""
        length = self.headers.get("Content-Length", "").strip()
        if _CONTENT_LENGTH.fullmatch(length) and int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            self._json(413, _too_large(int(length)).to_json())
            return False
        return super().handle_expect_100()

    def _dispatch(self, method: str) -> None:
        self._unread = self.headers.get("Content-Length", "0").strip() != "0" or "Transfer-Encoding" in self.headers
        self._keep_alive = not self.close_connection
        if self._unread:  # until the body is read in full, the connection cannot carry another request
            self.close_connection = True
        try:
            routed = self._route(method)
            if routed is None:
                self._json(200, {"allow": self._allow.split(", ")})
                return
            handler, match = routed
            body = self._body() if method in ("POST", "PUT") else None
            who = self.server.leader.authenticate(self._token())
            args = (self, who, *match.groups())
            result = handler(*args, body) if method in ("POST", "PUT") else handler(*args)
            if result is not None:
                status, doc = result
                self._json(status, doc)
        except ApiError as err:
            self._json(err.status, err.to_json())
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception as err:  # a bug: answer 500, keep serving
            log.exception("internal error on %s %s", method, self.path)
            self.close_connection = True
            self._json(500, ApiError(500, "internal", f"internal error in the leader: {type(err).__name__}").to_json())
        finally:
            if self._unread:
                self._drain()

    def _route(self, method: str) -> tuple[Callable, re.Match] | None:
        """The handler for this method and path; None for OPTIONS (``_allow`` has the path's methods)."""
        try:
            url = urllib.parse.urlsplit(self.path)
            self.query = urllib.parse.parse_qs(url.query, max_num_fields=MAX_QUERY_FIELDS)
        except ValueError:
            raise errors.bad_request(f"the URL cannot be read (at most {MAX_QUERY_FIELDS} query fields)") from None
        matches = [(m, handler, match) for m, pattern, handler in ROUTES if (match := pattern.match(url.path))]
        if not matches:
            raise errors.not_found(f"no such API path: {ascii(url.path)[1:-1][:200]} (see labq/protocol/API.md)")
        allowed = {m for m, _, _ in matches}
        allowed |= {"HEAD"} if any(m == "GET" and h not in _NO_HEAD for m, h, _ in matches) else set()
        self._allow = ", ".join(sorted(allowed | {"OPTIONS"}))
        if method == "OPTIONS":
            return None
        wanted = "GET" if method == "HEAD" else method
        chosen = [(handler, match) for m, handler, match in matches if m == wanted]
        if not chosen or method == "HEAD" and chosen[0][0] in _NO_HEAD:
            raise ApiError(405, "method_not_allowed", f"{url.path} takes {self._allow}")
        return chosen[0]

    def _token(self) -> str | None:
        header = self.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None

    def _body(self) -> object:
        """The request's JSON body, read within the time limit; the connection may carry another request only
        once all of it is read."""
        if "Transfer-Encoding" in self.headers:
            raise ApiError(411, "length_required", "send the body with a Content-Length (no Transfer-Encoding)")
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:
            raise ApiError(411, "length_required", "the request needs a Content-Length")
        text = lengths[0].strip()
        if len(set(lengths)) > 1 or not _CONTENT_LENGTH.fullmatch(text):
            raise errors.bad_request(f"Content-Length must be one whole number of bytes, not {ascii(text)[:40]}")
        size = int(text)
        if size > MAX_BODY_BYTES:
            raise _too_large(size)  # and the body is drained after the answer, so its sender reads it
        try:
            raw = self.rfile.read(size)
        except TimeoutError:
            self._unread = False
            raise ApiError(408, "timeout", f"the request body did not arrive: {size} bytes were announced and "
                                           f"nothing came for {self.server.request_timeout_s:g} s") from None
        self._unread = False
        if len(raw) < size:
            raise errors.bad_request(f"the body ended after {len(raw)} of the {size} bytes its Content-Length "
                                     "announced")
        self.close_connection = not self._keep_alive
        return decode_body(raw)

    def _drain(self) -> None:
        """After the answer to a request whose body was not read (refused, or on a method that takes none): read
        and drop the body, up to ``DRAIN_LIMIT`` bytes and ``DRAIN_S`` seconds, then close. Closing with the body
        unread would reset the connection, and the sender, still sending, would never see the answer."""
        text = self.headers.get("Content-Length", "").strip()
        left = min(int(text), DRAIN_LIMIT) if _CONTENT_LENGTH.fullmatch(text) else DRAIN_LIMIT
        deadline = time.monotonic() + DRAIN_S
        try:
            while left > 0 and time.monotonic() < deadline:
                chunk = self.rfile.read1(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)
        except (OSError, ValueError):
            pass
        self._unread = False
        self.close_connection = True

    def _json(self, status: int, doc: object) -> None:
        """Sends ``doc`` as JSON; bytes are JSON already. A HEAD gets the headers only."""
        payload = doc if isinstance(doc, bytes) else json.dumps(doc, separators=(",", ":")).encode()
        if self.request_version not in ("HTTP/1.0", "HTTP/1.1"):  # a garbled request line: still a status line
            self.request_version = "HTTP/1.0"
            self.close_connection = True
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if self._allow and (status == 405 or self.command == "OPTIONS"):
            self.send_header("Allow", self._allow)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def arg(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None


def _too_large(size: int) -> ApiError:
    return errors.too_large(f"the request body is {size} bytes; the limit is {MAX_BODY_BYTES} "
                            f"(a command that long belongs in a script file)")


def _job_id(text: str) -> int:
    return require_int(text, "job id")


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


@route("GET", r"/v1/jobs/([0-9]+)")
def _job(h: _Handler, who, job_id: str) -> tuple[int, dict]:
    job, pending = h.server.leader.job(who, _job_id(job_id))
    return 200, {"job": encode_job(job), "pending": encode_pending(pending)}


@route("POST", r"/v1/jobs/([0-9]+)/actions")
def _action(h: _Handler, who, job_id: str, body) -> tuple[int, dict]:
    job = h.server.leader.act(who, _job_id(job_id), parse_action(body))
    return 200, {"job": encode_job(job)}


@route("GET", r"/v1/jobs/([0-9]+)/logs", head=False)
def _logs(h: _Handler, who, job_id: str) -> None:
    leader = h.server.leader
    job, _ = leader.job(who, _job_id(job_id))
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
    except ValueError:
        raise errors.unavailable("the node answered the log with a bad X-Labq-Offset") from None
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
    r = h.server.leader.bookings.cancel(who, check_name(urllib.parse.unquote(name), "reservation name"))
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
    return 200, {"user": h.server.leader.remove_user(who, check_name(urllib.parse.unquote(name), "user name"))}


@route("GET", "/v1/events", head=False)
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
                 "checkpoint_root": leader.config.checkpoint_root, "allow_root": leader.config.allow_root}


@route("POST", r"/v1/agents/([^/]+)/sync")
def _sync(h: _Handler, who, agent: str, body) -> tuple[int, dict]:
    agent = check_name(urllib.parse.unquote(agent), "node name")
    return 200, encode_reply(h.server.leader.sync(who, agent, parse_sync(body)))


def serve(leader: Leader, host: str, port: int) -> LeaderServer:
    """Bind the API; the caller runs ``serve_forever`` (and ``shutdown`` to stop)."""
    return LeaderServer(leader, (host, port))
