"""The one HTTP client of the leader's API (``docs/api.md``), for the CLI and the TUI.

Requests go through a transport (``labq.transport``): by default a socket-level HTTP/1.1 connection
(``labq.wire``), since ``labq ls`` must start fast and nothing here may pull in an HTTP stack; a test
passes an app that answers in-process. Every failure is an ``ApiError``: the leader's own error body
when it answered, code ``unreachable`` when it did not. Which leader, and who asks, come from the
environment or the credentials file (``labq.credentials``).
"""

from __future__ import annotations

import json
import os
from collections import namedtuple
from collections.abc import Iterable, Iterator

from labq.credentials import credentials_path, load_credentials, normalize_url
from labq.protocol.errors import ApiError
from labq.transport import (KeptConnections, Request, Response, Transport, encode_query, quote_part,
                            split_url, unix_transport)

TYPE_CHECKING = False  # typing's, without importing typing: 3 ms of the CLI's start (type checkers take it as true)
if TYPE_CHECKING:
    from pathlib import Path

DEFAULT_LEADER = "http://127.0.0.1:7733"
#: where a lab workstation's agent serves its local socket: ``$LABQ_SOCKET``, else the first that exists
LOCAL_SOCKETS = ("/run/labq/agent.sock",)
#: the event stream sends a keepalive every 15 s; a read that waits longer than this means a dead leader
EVENTS_READ_TIMEOUT = 45.0


class LogChunk(namedtuple("LogChunk", ("data", "next_offset", "done", "attempt"))):
    """A piece of an attempt's log: ``data`` (bytes); ``next_offset``, where the next read starts; ``done``, whether
    the attempt has ended and all of its log has been sent; ``attempt``, the attempt read (None: an older leader
    does not say which). A ``collections.namedtuple``: ``typing.NamedTuple`` would load ``typing``."""

    __slots__ = ()


class Page(namedtuple("Page", ("jobs", "pending", "total", "next"))):
    """A listing of jobs (``Client.page``): ``jobs``, as the API sends them; ``pending``, job id -> why it waits;
    ``total``, how many jobs match the filters on all pages; ``next``, the ``after`` of the next page (None: this
    is the last, or the listing is not paged)."""

    __slots__ = ()


def _ref(job_id: int | str) -> str:
    """A job id (``12``) or an array's task (``12.3``) as it goes in a path: digits and one dot, nothing else."""
    text = str(job_id)
    head, dot, index = text.partition(".")
    if not head.isdigit() or dot and not index.isdigit():
        raise ValueError(f"not a job id: {text!r}")
    return text


class EventStream:
    """An open event stream: iterate it for the events; ``close()`` ends it, read or not (also at its end)."""

    def __init__(self, resp: Response, events: Iterator[dict]) -> None:
        self._resp, self._events = resp, events

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> dict:
        try:
            return next(self._events)
        except BaseException:  # the end, a lost leader, or a stop: the connection goes with it
            self.close()
            raise

    def close(self) -> None:
        self._resp.close()


class Client:
    """A user's view of the leader: one method per API call, JSON in, plain dicts out."""

    def __init__(self, url: str, token: str, timeout: float = 30, transport: Transport | None = None,
                 pin: str | None = None, ca_cache: Path | None = None) -> None:
        self.url = normalize_url(url)
        try:
            parts = split_url(self.url)
            host, _ = parts.hostname, parts.port
        except ValueError:
            host = None
        if host is None or parts.scheme not in ("http", "https"):
            raise ApiError(0, "bad_credentials", f"{url!r} is not a leader address: use http://HOST:PORT")
        #: where requests go: kept connections to the leader, or an app in-process
        self.transport = transport or KeptConnections()
        self.token = token.strip()
        if not self.token.isprintable() or " " in self.token:
            raise ApiError(0, "bad_credentials", "the labq token has spaces or control characters in it")
        self.timeout = timeout
        self.pin, self.ca_cache, self._tls = pin, ca_cache, None
        if parts.scheme == "https":
            from labq.tls import check_pin

            if not pin:
                raise ApiError(0, "bad_credentials", f"{self.url} speaks TLS: it needs the lab's CA pin next to the "
                               "token (`labq login URL --pin sha256:... --token ...`, or pin = ... in the "
                               "credentials file)")
            try:
                self.pin = check_pin(pin)
            except ValueError as err:
                raise ApiError(0, "bad_credentials", str(err)) from None

    def _context(self):
        """The TLS context of an https:// leader, pinned to the lab's CA (fetched once, then kept)."""
        if self._tls is None and self.pin is not None:
            from labq.tls import PinError, pinned_context

            try:
                self._tls = pinned_context(self.url, self.pin, self.ca_cache, self.timeout)
            except PinError as err:
                raise ApiError(0, "untrusted_leader", str(err)) from None
            except OSError as err:
                raise self._unreachable(err) from None
        return self._tls

    @classmethod
    def local(cls, path: str, timeout: float = 30) -> Client:
        """A client of the agent on this machine, over its Unix socket: the agent vouches for the caller's
        Unix account to the leader, so no token is needed (``labq.agent.local_socket``)."""
        client = cls(DEFAULT_LEADER, "", timeout, unix_transport(path))
        client.url = f"unix:{path}"
        return client

    @classmethod
    def from_environment(cls, leader: str | None = None, timeout: float = 30,
                         transport: Transport | None = None) -> Client:
        """``$LABQ_LEADER``/``$LABQ_TOKEN``, else the credentials file, else the agent of this machine over its
        local socket (no token needed); ``leader`` (``--leader``) wins."""
        env_token, env_leader = os.environ.get("LABQ_TOKEN"), os.environ.get("LABQ_LEADER")
        saved = {} if env_token and (leader or env_leader) else load_credentials()
        token = env_token or saved.get("token")
        if not token and not (leader or env_leader) and transport is None:
            path = local_socket()
            if path is not None:
                return cls.local(path, timeout)
        if not token:
            raise ApiError(0, "no_credentials", (
                f"no labq token: set $LABQ_TOKEN or put `leader = ...` and `token = ...` in {credentials_path()}. "
                "Ask an admin to run `labq admin user add YOUR_NAME`, or run `labq up` on your own workstation."))
        url = leader or env_leader or saved.get("leader") or DEFAULT_LEADER
        pin = os.environ.get("LABQ_PIN") or saved.get("pin")
        return cls(str(url), str(token), timeout, transport, pin=pin,
                   ca_cache=credentials_path().parent if pin else None)  # the CA is kept for a pinned leader only

    # -- the API ----------------------------------------------------------------------------------

    def whoami(self) -> dict:
        return self._json("GET", "/v1/whoami")

    def submit(self, body: dict) -> dict:
        return self._json("POST", "/v1/jobs", body=body)["job"]

    def submit_sweep(self, body: dict) -> dict:
        """An array or grid (``array``, ``grid`` in ``body``): ``{job: its first task, array: {id, tasks, first,
        last, cap}}``."""
        return self._json("POST", "/v1/jobs", body=body)

    def jobs(self, user: str | None = None, states: Iterable[str] = (), all: bool = False,
             history: bool = False, limit: int | None = None) -> list[dict]:
        return self.listing(user, states, all=all, history=history, limit=limit)[0]

    def listing(self, user: str | None = None, states: Iterable[str] = (), *, all: bool = False,
                history: bool = False, finished: bool = False, limit: int | None = None, after: int | None = None,
                pending: bool = False) -> tuple[list[dict], dict[int, dict]]:
        """Jobs as ``labq ls`` lists them, and (``pending``) why each waiting one waits: ``page``'s first two."""
        found = self.page(user, states, all=all, history=history, finished=finished, limit=limit, after=after,
                          pending=pending)
        return found.jobs, found.pending

    def page(self, user: str | None = None, states: Iterable[str] = (), *, all: bool = False,
             history: bool = False, finished: bool = False, limit: int | None = None, after: int | None = None,
             pending: bool = False) -> Page:
        """Jobs as ``labq ls`` lists them, and (``pending``) why each waiting one waits. By id, the last ``limit``
        (at most ``labq.protocol.requests.MAX_PAGE``); ``after``: the first ``limit`` with ids above it (a page;
        ``next`` is the ``after`` of the next one). ``finished``: only finished jobs, the ``limit`` that ended
        last; ``history`` adds finished jobs to the unfinished ones."""
        query: list[tuple[str, object]] = [("user", user)] if user else []
        query += [("state", s) for s in states]
        query += [("all", 1)] * all + [("history", 1)] * history + [("finished", 1)] * finished
        query += [("limit", limit)] if limit is not None else []
        query += [("after", after)] if after is not None else []
        query += [("pending", 1)] * pending
        answer = self._json("GET", "/v1/jobs", query)
        jobs = answer["jobs"]
        return Page(jobs, {int(k): v for k, v in (answer.get("pending") or {}).items() if v},
                    answer.get("total", len(jobs)), answer.get("next"))  # an older leader sends neither

    def queue(self, ids: Iterable[int] = ()) -> tuple[list[dict], dict[int, dict]]:
        """Everyone's unfinished jobs (or just ``ids``) and the pending reasons of those that wait."""
        query: list[tuple[str, object]] = [("all", 1), ("pending", 1)] + [("id", i) for i in ids]
        answer = self._json("GET", "/v1/jobs", query)
        return answer["jobs"], {int(k): v for k, v in answer.get("pending", {}).items() if v}

    def job(self, job_id: int | str) -> tuple[dict, dict | None]:
        """A job or an array's task (``12.3``), and why it waits; an array's id is a 400 here (``lookup``)."""
        answer = self.lookup(job_id)
        if "job" not in answer:
            raise ApiError(400, "bad_request", f"{job_id} is an array, not a job: name one of its tasks ({job_id}.0)")
        return answer["job"], answer.get("pending")

    def lookup(self, ref: int | str) -> dict:
        """``GET /v1/jobs/REF``: ``{job, pending}`` for a job or a task (``12.3``), ``{array}`` for an array."""
        return self._json("GET", f"/v1/jobs/{_ref(ref)}")

    def action(self, job_id: int, action: str, priority: int | str | None = None, **fields) -> dict:
        """``cancel``, ``hold``, ``release``, ``prio`` (with ``priority``), ``top``, ``preempt``, or ``edit``
        (with ``gpus`` and/or ``time_limit_s``, 0 removing the limit)."""
        body: dict = {"action": action, **{k: v for k, v in fields.items() if v is not None}}
        if priority is not None:
            body["priority"] = priority
        answer = self._json("POST", f"/v1/jobs/{_ref(job_id)}/actions", body=body)
        return answer.get("job") or answer  # an array's: {array: {id, changed}, jobs}

    def restart(self, job_id: int) -> dict:
        """A finished job submitted again with the same spec: the new job."""
        return self._json("POST", f"/v1/jobs/{_ref(job_id)}/actions", body={"action": "restart"})["job"]

    def clean(self) -> dict:
        """Hide your finished jobs from listings: ``{"cleaned_up_to", "hidden"}``."""
        return self._json("DELETE", "/v1/history")

    def logs(self, job_id: int, attempt: int | None = None, offset: int = 0) -> tuple[bytes, int, bool]:
        """Bytes from ``offset`` of an attempt's log, the offset to ask for next, and whether it has ended."""
        data, next_offset, done, _ = self.log(job_id, attempt, offset)
        return data, next_offset, done

    def log(self, job_id: int, attempt: int | None = None, offset: int = 0) -> LogChunk:
        """``logs`` and the attempt the leader read: without ``attempt``, the latest that ran."""
        query = [("offset", offset)] + ([("attempt", attempt)] if attempt is not None else [])
        resp = self._send("GET", f"/v1/jobs/{_ref(job_id)}/logs", query)
        try:
            data = self._read(resp)
            header = resp.header("X-Labq-Offset") or ""
            next_offset = int(header) if header.isdigit() else offset + len(data)
            served = resp.header("X-Labq-Attempt") or ""
            return LogChunk(data, next_offset, resp.header("X-Labq-Done") == "1",
                            int(served) if served.isdigit() else attempt)
        finally:
            resp.close()

    def reserve(self, body: dict) -> dict:
        """A booking's answer: ``accepted``, ``booked``, the pinned reservation or reasons and alternatives."""
        return self._json("POST", "/v1/reservations", body=body)

    def reservations(self, *, everything: bool = False) -> list[dict]:
        """Bookings to come or running; ``everything`` adds those ended or cancelled lately."""
        return self._json("GET", "/v1/reservations" + ("?all=1" if everything else ""))["reservations"]

    def cancel_reservation(self, name: str) -> dict:
        return self._json("DELETE", f"/v1/reservations/{quote_part(name)}")["reservation"]

    def nodes(self) -> list[dict]:
        return self._json("GET", "/v1/nodes")["nodes"]

    def nodes_report(self) -> tuple[list[dict], list[dict], bool]:
        """The nodes, the agents the leader sees over mDNS that have not joined, and whether the leader serves
        plain HTTP to the network (the admin's ``insecure = true``)."""
        answer = self._json("GET", "/v1/nodes")
        return answer["nodes"], answer.get("unadmitted", []), bool(answer.get("insecure"))

    def queues(self) -> list[dict]:
        """The lab's queues: guarantee, use, borrowed and lent GPUs, waiting work, members' fair share."""
        return self._json("GET", "/v1/queues")["queues"]

    def history(self, since: float, until: float) -> dict:
        """The lab's finished jobs submitted in [since, until) (admins; ``labq sim --from-history``):
        ``{"since", "until", "jobs": [JOB]}``, their environments' values hidden."""
        return self._json("GET", "/v1/history", [("since", repr(since)), ("until", repr(until))])

    def usage(self, *, since: float | None = None, until: float | None = None, user: str | None = None) -> dict:
        """GPU-hours, outcomes, waits and work lost over ``[since, until)`` per user, class, node and GPU model, and
        in all (``labq usage``): ``user``'s jobs only, or (admins, ``user`` None) the whole lab's."""
        query = [(k, v) for k, v in (("since", since), ("until", until), ("user", user)) if v is not None]
        return self._json("GET", "/v1/usage", query)

    def users(self) -> list[dict]:
        return self._json("GET", "/v1/users")["users"]

    def add_user(self, name: str, admin: bool = False) -> tuple[dict, str]:
        answer = self._json("POST", "/v1/users", body={"name": name, "admin": admin})
        return answer["user"], answer["token"]

    def remove_user(self, name: str) -> dict:
        return self._json("DELETE", f"/v1/users/{quote_part(name)}")["user"]

    def tokens(self, user: str | None = None) -> list[dict]:
        return self._json("GET", "/v1/tokens", [("user", user)] if user else [])["tokens"]

    def create_token(self, user: str, name: str = "api", expires_s: float | None = None) -> tuple[dict, str]:
        """A new token for ``user``: (what ``tokens()`` lists of it, the token itself, shown only now)."""
        answer = self._json("POST", "/v1/tokens", body={"user": user, "name": name, "expires_s": expires_s})
        return answer["token"], answer["secret"]

    def revoke_token(self, token_id: str) -> dict:
        return self._json("DELETE", f"/v1/tokens/{quote_part(token_id)}")["token"]

    def audit(self, *, user: str | None = None, job: int | None = None, action: str | None = None,
              since: float | None = None, until: float | None = None, after: int | None = None,
              limit: int = 100, kind: str | None = None) -> list[dict]:
        """The audit trail's entries that match, oldest first (``labq events``)."""
        query = [(k, v) for k, v in (("user", user), ("job", job), ("action", action), ("since", since),
                                     ("until", until), ("after", after), ("limit", limit), ("kind", kind))
                 if v is not None]
        return self._json("GET", "/v1/audit", query)["events"]

    def notify_settings(self, user: str | None = None) -> dict:
        """What notifies ``user`` (None: you) of their jobs, where, and the lab's channels (``labq notify``)."""
        return self._json("GET", "/v1/notify", [("user", user)] if user else [])

    def set_notify(self, *, user: str | None = None, on: list[str] | None = None, email: str | None = None,
                   webhook: bool | None = None) -> dict:
        """Change what notifies ``user`` (None: you; others: admins): ``on``, the moments (``["end", "fail"]``);
        ``email``, the address ("" removes it); ``webhook``, whether the lab's webhook gets them too."""
        body = {k: v for k, v in (("user", user), ("on", on), ("email", email), ("webhook", webhook)) if v is not None}
        return self._json("PUT", "/v1/notify", body=body)

    def notify_status(self) -> list[dict]:
        """Each notification channel's queue, last success and last error (admins)."""
        return self._json("GET", "/v1/notify/status")["channels"]

    def joins(self) -> list[dict]:
        return self._json("GET", "/v1/joins")["joins"]

    def create_join(self, node: str | None = None, expires_s: float | None = None) -> tuple[dict, str]:
        """A join token for one agent: (what ``joins()`` lists of it, the token to hand over, shown only now)."""
        answer = self._json("POST", "/v1/joins", body={"node": node, "expires_s": expires_s})
        return answer["join"], answer["token"]

    def revoke_join(self, join_id: str) -> dict:
        return self._json("DELETE", f"/v1/joins/{quote_part(join_id)}")["join"]

    def forget_node(self, name: str) -> dict:
        return self._json("DELETE", f"/v1/nodes/{quote_part(name)}")

    def close(self) -> None:
        """Close the connections kept open to the leader (a later request opens a new one)."""
        close = getattr(self.transport, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close_events(self) -> None:
        """End an ``events()`` stream read in another thread: its blocked read returns at once."""
        resp = getattr(self, "_events_response", None)
        if resp is not None:
            resp.interrupt()

    def events(self, after: int | str | None = None) -> EventStream:
        """Events as ``{"id", "event", "data"}`` until the leader closes the stream.

        The stream is open when this returns: every event published after it is in the stream, so a view
        that opens it first and loads after misses nothing. A caller that wants to go on reconnects with
        ``after=`` the last id it saw.
        """
        resp = self._send("GET", "/v1/events", [("after", after)] if after is not None else [],
                          timeout=max(self.timeout, EVENTS_READ_TIMEOUT))
        self._events_response = resp
        if resp.status >= 400:
            try:
                self._read(resp)  # raises the leader's error
            finally:
                resp.close()
        return EventStream(resp, parse_event_stream(self._lines(resp)))

    # -- the wire ---------------------------------------------------------------------------------

    def _json(self, method: str, path: str, query: list | None = None, body: dict | None = None) -> dict:
        resp = self._send(method, path, query or [], body)
        try:
            data = self._read(resp)
        finally:
            resp.close()
        try:
            answer = json.loads(data)
        except ValueError:
            raise ApiError(resp.status, "bad_response", f"the leader at {self.url} answered {method} {path} "
                           "with something that is not JSON") from None
        if not isinstance(answer, dict):
            raise ApiError(resp.status, "bad_response", f"the leader answered {method} {path} with {answer!r}")
        return answer

    def _send(self, method: str, path: str, query: list, body: dict | None = None,
              timeout: float | None = None) -> Response:
        base = "http://localhost" if self.url.startswith("unix:") else self.url  # the socket's agent: any host
        url = base + path + ("?" + encode_query(query) if query else "")
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        tls = self._context()
        try:
            return self.transport(Request(method, url, headers, payload, timeout or self.timeout, tls=tls))
        except OSError as err:  # labq.wire's WireError (a malformed answer) too
            import ssl  # loaded already with the context

            if tls is not None and isinstance(err, ssl.SSLCertVerificationError):
                self._untrusted()
            raise self._unreachable(err) from None

    def _untrusted(self) -> None:
        """The server at our address shows a certificate our kept CA did not sign: say whose it is."""
        from labq.tls import PinError, fetch_ca

        try:
            fetch_ca(self.url, self.pin, self.timeout)
        except PinError as err:
            raise ApiError(0, "untrusted_leader", str(err)) from None
        except OSError:
            pass
        raise ApiError(0, "untrusted_leader", f"the leader at {self.url} shows a certificate the lab's CA "
                       f"({self.pin}) did not sign: refusing it")

    def _read(self, resp: Response) -> bytes:
        """The whole body; an error status becomes the leader's ``ApiError``."""
        try:
            data = resp.read()
        except OSError as err:
            raise self._unreachable(err) from None
        if resp.status >= 400:
            try:
                body = json.loads(data)
            except ValueError:
                body = None
            raise ApiError.from_json(resp.status, body)
        return data

    def _lines(self, resp: Response) -> Iterator[bytes]:
        try:
            while line := resp.readline():
                yield line
        except OSError as err:
            raise self._unreachable(err) from None

    def _unreachable(self, err: BaseException) -> ApiError:
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
        if isinstance(err, TimeoutError):
            reason = "it stopped answering (timed out)"
        if self.url.startswith("unix:"):
            return ApiError(0, "unreachable", f"cannot reach this machine's labq agent at {self.url[5:]}: {reason}. "
                            "Is `labq agent` running here? (Or log in to the leader: `labq login URL ...`)")
        return ApiError(0, "unreachable", f"cannot reach the leader at {self.url}: {reason}. "
                        "Is `labq leader` (or `labq up`) running?")


def local_socket() -> str | None:
    """The agent's local socket on this machine: ``$LABQ_SOCKET`` (when it exists), else the first of
    ``LOCAL_SOCKETS`` that does; None on a machine with no agent."""
    import stat

    named = os.environ.get("LABQ_SOCKET")
    for path in ([named] if named else LOCAL_SOCKETS):
        try:
            if stat.S_ISSOCK(os.stat(path).st_mode):
                return path
        except OSError:
            continue
    return None


def parse_event_stream(lines: Iterable[bytes | str]) -> Iterator[dict]:
    """``text/event-stream`` lines to events, as the HTML spec reads them.

    A blank line ends an event; ``:`` lines are comments (keepalives); ``data`` lines join
    with newlines and are decoded as JSON when they are JSON. ``id`` is an int when it is one.
    """
    event_id: int | str | None = None
    kind, data = "", []
    for raw in lines:
        line = (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw).rstrip("\r\n")
        if not line:
            if data:
                text = "\n".join(data)
                try:
                    payload = json.loads(text)
                except ValueError:
                    payload = text
                yield {"id": event_id, "event": kind or "message", "data": payload}
            kind, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "event":
            kind = value
        elif name == "id" and "\x00" not in value:
            event_id = int(value) if value.isdigit() else value
