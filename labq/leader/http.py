"""The leader's HTTP server: finding the route, authentication, JSON in and out, errors as JSON.

The standard library's threading server, as ``labq.http_server`` hardens it for
the leader and the agent alike: one thread a request suits a lab's scale (tens of
agents and people), keeps long polls and event streams simple, and matches the
store's blocking group commit. What keeps it answering whatever arrives: every
request body goes through ``labq.protocol.body`` and a parse function (a wrong
shape is a 400 there), every refusal is JSON (the standard library's too), reading
a request has a time limit, and one address may hold only so many connections.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import urllib.parse
from collections.abc import Callable

from labq.http_server import JsonHandler, Server, same_secret
from labq.leader.core import Leader
from labq.protocol import errors
from labq.protocol.body import decode_body
from labq.protocol.errors import ApiError
from labq.protocol.identity import USER_HEADER
from labq.protocol.names import check_user_name
from labq.leader.auth import Principal
from labq.leader.routes import _NO_HEAD, AUDITED, PUBLIC, ROUTES, SCRAPED, TEMPLATES
from labq.protocol.requests import MAX_BODY_BYTES

log = logging.getLogger("labq.leader.http")
DRAIN_LIMIT = 64 << 20  #: an oversized body up to this is read and dropped after the 413, so its sender reads it
DRAIN_S = 30.0  #: and for at most this long
MAX_QUERY_FIELDS = 2000
_CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")
#: who shows the ``[metrics] scrape_token``: it may read ``/metrics`` (``SCRAPED``), nothing else
SCRAPER = Principal("scraper", "metrics")


class LeaderServer(Server):
    """The API on ``labq.http_server``'s server: its request time limit and connection cap from the config."""

    def __init__(self, leader: Leader, address: tuple[str, int], tls=None) -> None:
        self.leader = leader
        super().__init__(address, _Handler, request_timeout_s=leader.config.request_timeout_s,
                         max_connections_per_address=leader.config.max_connections_per_address, tls=tls)


class _Handler(JsonHandler):
    """Every answer is JSON with a 4xx for what the client got wrong: routes, methods, bodies, the standard
    library's own refusals. Reading a request has a time limit (``leader.request_timeout``); writing the answer
    of a long poll or an event stream may take as long as it needs."""

    server: LeaderServer
    logger = log

    def setup(self) -> None:
        self.allow = None
        self._unread = False
        #: (route, method) of the request being answered, until its answer is counted (``send_response``)
        self._counted_as: tuple[str, str] | None = None
        super().setup()

    def send_response(self, code: int, message: str | None = None) -> None:
        """The answer's status line; the metrics count it now, before the client can read it and ask again."""
        if self._counted_as is not None:
            self.server.leader.metrics.request(*self._counted_as, code)
            self._counted_as = None
        super().send_response(code, message)

    def _scraper(self, handler: Callable) -> Principal | None:
        """The scraper, for a route the lab's scrape token may call and a request that shows it."""
        token = self.server.leader.config.metrics_scrape_token
        if handler in SCRAPED and token and same_secret(self.bearer_token(), token):
            return SCRAPER
        return None

    def __getattr__(self, name: str):
        """``do_METHOD`` for every method: the routes say which a path takes (405 with ``Allow`` for the others,
        a 4xx like any refusal, not the standard library's HTML 501)."""
        if name.startswith("do_"):
            return lambda: self._dispatch(name[3:])
        raise AttributeError(name)

    def handle_expect_100(self) -> bool:
        """``Expect: 100-continue`` with a body over the limit: 413 now, before the client sends it."""
        length = self.headers.get("Content-Length", "").strip()
        if _CONTENT_LENGTH.fullmatch(length) and int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            self.send_json(413, _too_large(int(length)).to_json())
            return False
        return super().handle_expect_100()

    def _dispatch(self, method: str) -> None:
        self._unread = self.headers.get("Content-Length", "0").strip() != "0" or "Transfer-Encoding" in self.headers
        self._keep_alive = not self.close_connection
        if self._unread:  # until the body is read in full, the connection cannot carry another request
            self.close_connection = True
        handler = match = who = None
        self._counted_as = ("none", method)  #: a path no route takes
        outcome: tuple[int, str | None] | None = None  #: the answer's status and refusal, for the audit trail
        self.audited = {}  #: what the route learned for the audit trail: the job, its owner, the target
        try:
            routed = self._route(method)
            if routed is None:
                self.send_json(200, {"allow": self.allow.split(", ")})
                return
            handler, match = routed
            self._counted_as = (TEMPLATES[handler], method)
            who = None if handler in PUBLIC else self._scraper(handler) or self.server.leader.authenticate(
                self.bearer_token(), self.client_address[0], self._vouched_for(), self._certificate())  # before the body
            body = self._body() if method in ("POST", "PUT") else None
            args = (self, who, *match.groups())
            result = handler(*args, body) if method in ("POST", "PUT") else handler(*args)
            if result is not None:
                status, doc = result
                payload = doc if isinstance(doc, bytes) else json.dumps(doc, separators=(",", ":")).encode()
                outcome = self._audited(handler, match, who, status, None)
                self.send_json(status, payload)
        except ApiError as err:
            outcome = self._audited(handler, match, who, err.status, err.message)
            self.send_json(err.status, err.to_json())
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception as err:  # a bug: answer 500, keep serving
            log.exception("internal error on %s %s", method, self.path)
            self.close_connection = True
            if outcome is None:
                outcome = self._audited(handler, match, who, 500, "internal error")
            self.send_json(500, ApiError(500, "internal", f"internal error in the leader: {type(err).__name__}").to_json())
        finally:
            self._counted_as = None  # a request that got no answer (the client went away) is not counted
            if self._unread:
                self._drain()

    def _audited(self, handler: Callable | None, match: re.Match | None, who, status: int,
                 error: str | None) -> tuple[int, str | None]:
        """The answer's (status, refusal), written to the audit trail first if the route is audited: whoever has
        the answer finds the request in the trail."""
        if handler in AUDITED:
            try:
                self._audit(handler, match, who, status, error)
            except Exception:  # noqa: BLE001 - what happened has happened: the trail's bug must not change the answer
                log.exception("the audit trail could not record %s %s", self.command, self.path)
        return status, error

    def _audit(self, handler: Callable, match: re.Match, who, status: int, error: str | None) -> None:
        """One line of the audit trail for this request: who, how, from where, what, the answer."""
        action, about = AUDITED[handler]
        entry: dict = {"action": self.audited.get("action", action), "status": status,
                       "from": self.client_address[0]}
        if who is not None:
            entry.update(user=who.name, kind=who.kind)
            if who.via:
                entry["via"] = who.via
            if who.token_id:
                entry["token"] = who.token_id
        first = match.group(1) if match.lastindex else None
        if first is not None:
            if about == "job":
                entry["job"] = int(first)
            else:
                entry["target"] = urllib.parse.unquote(first)[:200]
        entry.update({k: v for k, v in self.audited.items() if k != "action"})
        if error:
            entry["error"] = error[:300]
        self.server.leader.audit.record(entry)

    def _certificate(self) -> str | None:
        """The SHA-256 of the certificate the client showed, which the lab's CA signed (an agent's); None for
        a client that showed none, or a connection without TLS."""
        getpeercert = getattr(self.connection, "getpeercert", None)
        der = getpeercert(binary_form=True) if getpeercert is not None else None
        return hashlib.sha256(der).hexdigest() if der else None

    def _vouched_for(self) -> str | None:
        """The user an agent vouches for (``X-Labq-User``), checked by the lab's rule for user names."""
        names = self.headers.get_all(USER_HEADER) or []
        if not names:
            return None
        if len(names) > 1:
            raise errors.bad_request(f"one {USER_HEADER} header at most")
        return check_user_name(names[0].strip(), "user name", USER_HEADER)

    def _route(self, method: str) -> tuple[Callable, re.Match] | None:
        """The handler for this method and path; None for OPTIONS (``_allow`` has the path's methods)."""
        try:
            url = urllib.parse.urlsplit(self.path)
            self.query = urllib.parse.parse_qs(url.query, max_num_fields=MAX_QUERY_FIELDS)
        except ValueError:
            raise errors.bad_request(f"the URL cannot be read (at most {MAX_QUERY_FIELDS} query fields)") from None
        matches = [(m, handler, match) for m, pattern, handler in ROUTES if (match := pattern.match(url.path))]
        if not matches:
            raise errors.not_found(f"no such API path: {ascii(url.path)[1:-1][:200]} (see docs/api.md)")
        allowed = {m for m, _, _ in matches}
        allowed |= {"HEAD"} if any(m == "GET" and h not in _NO_HEAD for m, h, _ in matches) else set()
        self.allow = ", ".join(sorted(allowed | {"OPTIONS"}))
        if method == "OPTIONS":
            return None
        wanted = "GET" if method == "HEAD" else method
        chosen = [(handler, match) for m, handler, match in matches if m == wanted]
        if not chosen or method == "HEAD" and chosen[0][0] in _NO_HEAD:
            raise ApiError(405, "method_not_allowed", f"{url.path} takes {self.allow}")
        return chosen[0]

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

    def arg(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else None


def _too_large(size: int) -> ApiError:
    return errors.too_large(f"the request body is {size} bytes; the limit is {MAX_BODY_BYTES} "
                            f"(a command that long belongs in a script file)")


def serve(leader: Leader, host: str, port: int, tls=None) -> LeaderServer:
    """Bind the API (over TLS with ``tls``, an ``ssl.SSLContext``); the caller runs ``serve_forever``."""
    return LeaderServer(leader, (host, port), tls)
