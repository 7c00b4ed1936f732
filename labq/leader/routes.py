"""The leader's API routes: each takes the request's handler, who sent it and the path's parts (and the
decoded body for POST and PUT), calls the leader and returns (status, JSON document), or streams its answer.

The server (``labq.leader.http``) finds the route, authenticates, decodes the body and turns errors into
JSON answers; the API is documented in ``docs/api.md``.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING

from labq.leader.audit import MAX_ANSWER, AuditQuery
from labq.leader.node_logs import fetch_log
from labq.leader.users import user_only
from labq.models.job import Job
from labq.protocol import errors
from labq.protocol.agents import encode_reply, parse_registration, parse_sync
from labq.protocol.bookings import encode_answer, encode_windows, parse_reserve
from labq.protocol.codec import encode_job, encode_pending, encode_reservation, hide_env
from labq.protocol.names import check_name, check_user_name
from labq.protocol.identity import join_token
from labq.protocol.history import encode_policy
from labq.protocol.notify import parse_settings
from labq.protocol.usage import DEFAULT_WINDOW_S, encode_usage, parse_usage_query
from labq.protocol.requests import (
    MAX_PAGE,
    PAGE,
    parse_action,
    parse_join,
    parse_submit,
    parse_token,
    parse_user,
    require_int,
)

if TYPE_CHECKING:
    from labq.leader.http import _Handler

KEEPALIVE_S = 15.0

Route = tuple[str, re.Pattern, Callable]
ROUTES: list[Route] = []
_NO_HEAD: set[Callable] = set()  #: GET routes that stream their answer: HEAD is refused there
PUBLIC: set[Callable] = set()  #: routes anyone may call, without a token: what is public anyway
#: routes whose every call goes into the audit trail (``labq.leader.audit``), with the action's name; the
#: path's first part is its job (``job``) or its target (``target``)
AUDITED: dict[Callable, tuple[str, str]] = {}
#: routes the ``[metrics] scrape_token`` may call too; everywhere else it is no token at all
SCRAPED: set[Callable] = set()
#: each route's path as the metrics name it: its groups as ``{}`` (``/v1/jobs/{}/actions``)
TEMPLATES: dict[Callable, str] = {}


def route(method: str, pattern: str, *, head: bool = True, public: bool = False, audit: str | None = None,
          about: str = "target", scraped: bool = False):
    def register(fn):
        ROUTES.append((method, re.compile(f"^{pattern}$"), fn))
        TEMPLATES[fn] = re.sub(r"\([^)]*\)", "{}", pattern)
        if scraped:
            SCRAPED.add(fn)
        if not head:
            _NO_HEAD.add(fn)
        if public:
            PUBLIC.add(fn)
        if audit is not None:
            AUDITED[fn] = (audit, about)
        return fn
    return register


def _job_id(text: str) -> int:
    return require_int(text, "job id")


_REF = r"([0-9][0-9.]*)"  #: a job (``12``), an array (``12``) or an array's task (``12.3``): one group, no nesting


def _task_or_job(h: _Handler, who, ref: str) -> int:
    """The job id that ``ref`` names: a task's (``12.3``), or the id itself."""
    if "." in ref:
        array_id, _, index = ref.partition(".")
        if not index.isdigit():
            raise errors.bad_request(f"a task is ARRAY.INDEX (12.3), not {ref}", "job id")
        return h.server.leader.queue.task(who, _job_id(array_id), require_int(index, "task index"))
    return _job_id(ref)


def _array_doc(array_id: int, tasks: list, whole, pending: dict) -> dict:
    """An array as ``GET /v1/jobs/ID`` answers for it: its tasks by index, how many are in each state, and why
    those that wait do (by job id)."""
    counts: dict[str, int] = {}
    for task in tasks:
        counts[task.state.value] = counts.get(task.state.value, 0) + 1
    return {"id": array_id, "user": tasks[0].user, "cap": tasks[-1].spec.array_cap, "counts": counts,
            "tasks": [encode_job(t) if whole(t) else hide_env(encode_job(t)) for t in tasks],
            "pending": {str(i): encode_pending(p) for i, p in pending.items()}}


# -- the lab's health ----------------------------------------------------------------------


@route("GET", "/metrics", scraped=True)
def _metrics(h: _Handler, who) -> None:
    """Prometheus's text format (``labq.leader.metrics``), for any person or the scrape token."""
    if who.kind != "scraper":
        user_only(who)
    from labq.leader.metrics import CONTENT_TYPE

    h.send_answer(200, {"Content-Type": CONTENT_TYPE}, h.server.leader.metrics.exposition())


# -- people -------------------------------------------------------------------------------


@route("GET", "/v1/tls/ca", public=True)
def _lab_ca(h: _Handler, who) -> tuple[int, dict]:
    """The lab CA's certificate, which clients check against their pin before they trust the leader."""
    ca = h.server.leader.tls_ca
    if ca is None:
        raise errors.not_found("this leader serves plain HTTP: it has no TLS certificate authority")
    return 200, {"ca": ca, "fingerprint": h.server.leader.tls_pin}


@route("GET", "/v1/whoami")
def _whoami(h: _Handler, who) -> tuple[int, dict]:
    user_only(who)  # an agent's or the join token says nothing of itself to whoever holds it
    doc = {"user": who.name, "kind": who.kind, "admin": who.admin}
    if who.via:
        doc["via"] = who.via  # the node whose agent vouched for the user
    return 200, doc


@route("POST", "/v1/jobs", audit="submit")
def _submit(h: _Handler, who, body) -> tuple[int, dict]:
    request, queue = parse_submit(body), h.server.leader.queue
    if request.sweep is not None:  # an array: its first task, and the array
        array_id, tasks = queue.submit_sweep(who, request)
        h.audited.update(job=array_id, owner=tasks[0].user, target=f"an array of {len(tasks)} tasks")
        return 201, {"job": encode_job(tasks[0]), "array": {"id": array_id, "tasks": len(tasks), "first": tasks[0].id,
                                                            "last": tasks[-1].id, "cap": tasks[0].spec.array_cap}}
    job = queue.submit(who, request)
    h.audited.update(job=job.id, owner=job.user)
    return 201, {"job": encode_job(job)}


class _JobTexts:
    """Each unfinished job's JSON, made once per version of the job: jobs are immutable and replaced
    on every change, so the object itself says whether the text is current. A listing of 10,000 jobs
    is then a join of strings instead of 10,000 encodings (most of its cost). Two texts a job: whole, for
    its owner and the admins, and with its environment's values hidden, for everyone else."""

    def __init__(self) -> None:
        self._texts: dict[int, tuple[Job, str, str | None]] = {}

    def listing(self, jobs: list[Job], live: dict[int, Job], whole: Callable[[Job], bool] = lambda job: True) -> str:
        texts, parts = self._texts, []
        for job in jobs:
            shows = whole(job)
            cached = texts.get(job.id)
            if cached is None or cached[0] is not job:
                cached = (job, json.dumps(encode_job(job), separators=(",", ":")), None)
            if not shows and cached[2] is None:
                cached = (job, cached[1], json.dumps(hide_env(encode_job(job)), separators=(",", ":")))
            if live.get(job.id) is job:
                texts[job.id] = cached
            parts.append(cached[1] if shows else cached[2])
        if len(texts) > 2 * len(live) + 1000:  # finished jobs linger until the cache is twice the queue
            for job_id in [i for i in list(texts) if i not in live]:
                texts.pop(job_id, None)
        return "[" + ",".join(parts) + "]"


def _whole_for(who) -> Callable[[Job], bool]:
    """Whether ``who`` sees a job's environment values: its owner and the admins do (secrets live there)."""
    return lambda job: who.admin or job.user == who.name


_JOB_TEXTS = _JobTexts()


@route("GET", "/v1/jobs")
def _jobs(h: _Handler, who) -> tuple[int, bytes]:
    limit, after = h.arg("limit"), h.arg("after")
    limit = require_int(limit, "limit", low=1, high=MAX_PAGE) if limit is not None else None
    after = require_int(after, "after") if after is not None else None
    ids = tuple(require_int(i, "id") for i in h.query.get("id", ()))
    if len(ids) > 1000:
        raise errors.bad_request("at most 1000 ids at once", "id")
    queue = h.server.leader.queue
    found = queue.visible(
        who, user=h.arg("user"), states=tuple(h.query.get("state", ())), everyone=h.arg("all") == "1" or bool(ids),
        history=h.arg("history") == "1", limit=PAGE if limit is None and after is not None else limit, ids=ids,
        finished=h.arg("finished") == "1", after=after)
    text = '{"jobs":' + _JOB_TEXTS.listing(found.jobs, found.live, _whole_for(who))
    text += f',"total":{found.total},"next":{json.dumps(found.next)}'
    if h.arg("pending") == "1":
        pending = {str(i): encode_pending(p) for i, p in queue.pending_of(j.id for j in found.jobs).items()}
        text += ',"pending":' + json.dumps(pending, separators=(",", ":"))
    return 200, (text + "}").encode()


@route("GET", r"/v1/jobs/" + _REF)
def _job(h: _Handler, who, ref: str) -> tuple[int, dict]:
    queue, job_id = h.server.leader.queue, _task_or_job(h, who, ref)
    if "." in ref or not queue.is_array(job_id):  # no job has an unfinished array's id
        try:
            job, pending = queue.job(who, job_id)
            doc = encode_job(job)
            if (there := h.server.leader.state.waiting_there.get(job.id)) is not None:
                doc["waiting_there"] = there  # its node's scheduler (Slurm) holds it back
            return 200, {"job": doc if _whole_for(who)(job) else hide_env(doc), "pending": encode_pending(pending)}
        except errors.ApiError as err:
            if err.status != 404 or "." in ref:
                raise
    tasks = queue.array(who, job_id)  # an array's, unfinished or ended
    if tasks is None:
        raise errors.not_found(f"there is no job {job_id}")
    return 200, {"array": _array_doc(job_id, tasks, _whole_for(who), queue.pending_of(t.id for t in tasks))}


@route("POST", r"/v1/jobs/" + _REF + "/actions", audit="act", about="job")
def _action(h: _Handler, who, ref: str, body) -> tuple[int, dict]:
    request, queue = parse_action(body), h.server.leader.queue
    h.audited["action"] = request.action
    job_id = _task_or_job(h, who, ref)
    if "." not in ref and queue.is_array(job_id):  # the whole array
        changed = queue.act_on_array(who, job_id, request)
        h.audited.update(owner=changed[0].user, target=f"{len(changed)} tasks")
        return 200, {"array": {"id": job_id, "changed": len(changed)}, "jobs": [encode_job(j) for j in changed]}
    if request.action == "restart":  # a new job: its answer is the new job's
        job = queue.restart(who, job_id)
        h.audited.update(owner=job.user, target=f"as job {job.id}")
        return 201, {"job": encode_job(job)}
    job = queue.act(who, job_id, request)
    h.audited["owner"] = job.user
    return 200, {"job": encode_job(job)}


@route("DELETE", "/v1/history", audit="clean history")
def _clean(h: _Handler, who) -> tuple[int, dict]:
    up_to, hidden = h.server.leader.queue.clean(who)
    return 200, {"cleaned_up_to": up_to, "hidden": hidden}


@route("GET", r"/v1/jobs/" + _REF + "/logs", head=False)
def _logs(h: _Handler, who, ref: str) -> None:
    leader = h.server.leader
    job_id = _task_or_job(h, who, ref)
    if "." not in ref and leader.queue.is_array(job_id):
        raise errors.bad_request(f"{job_id} is an array: its tasks have the logs ({job_id}.0, {job_id}.1, ...)",
                                 "job id")
    job, _ = leader.queue.job(who, job_id)
    if job.user != who.name and not who.admin:
        raise errors.forbidden(f"job {job.id} belongs to {job.user}")
    attempt = require_int(h.arg("attempt"), "attempt") if h.arg("attempt") else job.latest_run()
    offset = require_int(h.arg("offset"), "offset") if h.arg("offset") else 0
    if attempt is None:
        raise errors.not_found(f"job {job.id} has not started yet: no log")
    placement = job.placement if attempt == job.attempt else next(
        (a.placement for a in job.history if a.number == attempt), None)
    if placement is None:
        if attempt == job.attempt:
            raise errors.not_found(f"job {job.id} has not started attempt {attempt} yet: no log")
        raise errors.not_found(f"job {job.id} has no attempt {attempt} that ran; it is on attempt {job.attempt}")
    node = placement.nodes[0]
    logs_url, logs_token = leader.agents.logs_of(node) or (None, None)
    if not logs_url:
        raise errors.unavailable(f"node {node} does not serve logs")
    data, next_offset, done = fetch_log(logs_url, logs_token, job.id, attempt, offset,
                                        tls=leader.agents.logs_tls(node, logs_url))
    done = done and not job.state.holds_gpus or (done and attempt != job.attempt)
    h.send_response(200)
    h.send_header("Content-Type", "text/plain; charset=utf-8")
    h.send_header("Content-Length", str(len(data)))
    h.send_header("X-Labq-Offset", str(next_offset))
    h.send_header("X-Labq-Done", "1" if done else "0")
    h.send_header("X-Labq-Attempt", str(attempt))
    h.end_headers()
    h.wfile.write(data)


@route("POST", "/v1/reservations", audit="book")
def _reserve(h: _Handler, who, body) -> tuple[int, dict]:
    answer, booked, windows = h.server.leader.bookings.reserve(who, parse_reserve(body))
    if booked:
        h.audited["target"] = answer.reservation.name
    doc = encode_answer(answer, booked)
    if windows is not None:
        doc["deadline"] = encode_windows(windows)
    return (201 if booked else 200), doc


@route("GET", "/v1/reservations")
def _reservations(h: _Handler, who) -> tuple[int, dict]:
    found = h.server.leader.bookings.view(who, everything=h.arg("all") == "1")
    return 200, {"reservations": [encode_reservation(r) for r in found]}


@route("DELETE", r"/v1/reservations/([^/]+)", audit="cancel booking")
def _cancel_reservation(h: _Handler, who, name: str) -> tuple[int, dict]:
    r = h.server.leader.bookings.cancel(who, check_name(urllib.parse.unquote(name), "reservation name"))
    return 200, {"reservation": encode_reservation(r)}


@route("GET", "/v1/nodes")
def _nodes(h: _Handler, who) -> tuple[int, dict]:
    leader = h.server.leader
    doc = {"nodes": leader.agents.view(who), "unadmitted": leader.agents.unadmitted()}
    config = leader.config
    if not config.uses_tls and not config.loopback_only:  # the admin's insecure = true
        doc["insecure"] = True
    return 200, doc


@route("GET", "/v1/queues")
def _queues(h: _Handler, who) -> tuple[int, dict]:
    return 200, {"queues": h.server.leader.scheduling.queues(who)}


@route("GET", "/v1/usage")
def _usage(h: _Handler, who) -> tuple[int, dict]:
    """GPU-hours and outcomes over a window (``labq usage``): a user's own, or an admin's view of anyone's."""
    query = parse_usage_query(h.arg("since"), h.arg("until"), h.arg("user"))
    return 200, encode_usage(h.server.leader.accounting.usage(who, query))


@route("GET", "/v1/history")
def _history(h: _Handler, who) -> tuple[int, dict]:
    """The lab's finished jobs submitted in a window, for a what-if replay (``labq sim --from-history``; admins)."""
    query = parse_usage_query(h.arg("since"), h.arg("until"), None)
    leader = h.server.leader
    until = query.until if query.until is not None else leader.state.clock()
    since = query.since if query.since is not None else until - DEFAULT_WINDOW_S
    jobs = leader.queue.history_window(who, since, until)
    return 200, {"since": since, "until": until, "policy": encode_policy(leader.config.policy()),
                 "queues": bool(leader.config.queues), "jobs": jobs}


@route("DELETE", r"/v1/nodes/([^/]+)", audit="forget node")
def _forget_node(h: _Handler, who, name: str) -> tuple[int, dict]:
    return 200, h.server.leader.agents.forget(who, check_name(urllib.parse.unquote(name), "node name"))


@route("GET", "/v1/joins")
def _joins(h: _Handler, who) -> tuple[int, dict]:
    return 200, {"joins": h.server.leader.users.join_listing(who)}


@route("POST", "/v1/joins", audit="create join token")
def _create_join(h: _Handler, who, body) -> tuple[int, dict]:
    request = parse_join(body)
    join, secret = h.server.leader.users.create_join(who, request.node, request.expires_s)
    h.audited["target"] = join["id"] + (f" for {request.node}" if request.node else "")
    return 201, {"join": join, "token": join_token(h.server.leader.tls_pin, secret)}


@route("DELETE", r"/v1/joins/([^/]+)", audit="revoke join token")
def _revoke_join(h: _Handler, who, join_id: str) -> tuple[int, dict]:
    return 200, {"join": h.server.leader.users.revoke_join(who, _hex_id(join_id, "a join token id"))}


@route("GET", "/v1/users")
def _users(h: _Handler, who) -> tuple[int, dict]:
    return 200, {"users": h.server.leader.users.listing(who)}


@route("POST", "/v1/users", audit="add user")
def _add_user(h: _Handler, who, body) -> tuple[int, dict]:
    request = parse_user(body)
    h.audited["target"] = request.name + (" (admin)" if request.admin else "")
    user, token = h.server.leader.users.add(who, request)
    return 201, {"user": user, "token": token}


@route("DELETE", r"/v1/users/([^/]+)", audit="remove user")
def _remove_user(h: _Handler, who, name: str) -> tuple[int, dict]:
    return 200, {"user": h.server.leader.users.remove(who, check_name(urllib.parse.unquote(name), "user name"))}


@route("GET", "/v1/tokens")
def _tokens(h: _Handler, who) -> tuple[int, dict]:
    user = h.arg("user")
    return 200, {"tokens": h.server.leader.users.token_listing(who, check_user_name(user, "user") if user else None)}


@route("POST", "/v1/tokens", audit="create token")
def _create_token(h: _Handler, who, body) -> tuple[int, dict]:
    request = parse_token(body)
    h.audited["target"] = f"for {request.user}"
    token, secret = h.server.leader.users.create_token(who, request)
    h.audited["target"] = f"{token['id']} ({token['name']}) for {request.user}"
    return 201, {"token": token, "secret": secret}


@route("DELETE", r"/v1/tokens/([^/]+)", audit="revoke token")
def _revoke_token(h: _Handler, who, token_id: str) -> tuple[int, dict]:
    return 200, {"token": h.server.leader.users.revoke_token(who, _hex_id(token_id, "a token id"))}


def _hex_id(text: str, what: str) -> str:
    text = urllib.parse.unquote(text)
    if not re.fullmatch(r"[0-9a-f]{1,64}", text):
        raise errors.bad_request(f"{what} is hex digits (the list shows them), not {ascii(text)[:40]}")
    return text


@route("GET", "/v1/notify")
def _notify_settings(h: _Handler, who) -> tuple[int, dict]:
    """What notifies a person (their own; an admin: anyone's with ``user``), and the lab's channels."""
    user = h.arg("user")
    return 200, h.server.leader.notify.view(who, check_user_name(user, "user") if user else None)


@route("PUT", "/v1/notify", audit="set notifications")
def _set_notify(h: _Handler, who, body) -> tuple[int, dict]:
    request = parse_settings(body)
    h.audited["target"] = request.user or who.name
    return 200, h.server.leader.notify.change(who, request)


@route("GET", "/v1/notify/status")
def _notify_status(h: _Handler, who) -> tuple[int, dict]:
    """Each channel's queue, last success and last error (admins): a failing channel shows here."""
    return 200, {"channels": h.server.leader.notify.status(who)}


@route("GET", "/v1/audit")
def _audit(h: _Handler, who) -> tuple[int, dict]:
    user_only(who)
    user = h.arg("user")
    if user is not None:
        check_user_name(user, "user")
    if not who.admin and user not in (None, who.name):
        raise errors.forbidden("only admins may read what other users did")

    def number(name: str, high: float = 1e12) -> float | None:
        text = h.arg(name)
        if text is None:
            return None
        try:
            value = float(text)
        except ValueError:
            raise errors.bad_request(f"{name} must be a number, not {ascii(text)[:40]}", name) from None
        if not 0 <= value <= high:
            raise errors.bad_request(f"{name} must be between 0 and {high:g}", name)
        return value

    job, after, limit = h.arg("job"), h.arg("after"), h.arg("limit")
    query = AuditQuery(user=user, job=require_int(job, "job") if job else None, action=h.arg("action"),
                       since=number("since"), until=number("until"),
                       after=require_int(after, "after") if after else None,
                       limit=require_int(limit, "limit", low=1, high=MAX_ANSWER) if limit else 100,
                       kind=h.arg("kind"))
    if query.kind not in (None, "user", "agent", "join", "lab"):
        raise errors.bad_request("kind is user, agent, join or lab (the lab's own steps)", "kind")
    if query.action is not None and (len(query.action) > 64 or not query.action.isprintable()):
        raise errors.bad_request("action must be a short printable name (submit, cancel, add user, ...)", "action")
    mine = (lambda e: True) if who.admin else (lambda e: e.get("user") == who.name and e.get("kind") == "user"
                                                or e.get("owner") == who.name)
    return 200, {"events": h.server.leader.audit.find(query, mine)}


@route("GET", "/v1/events", head=False)
def _events(h: _Handler, who) -> None:
    if who.kind != "user":
        raise errors.forbidden("events are for users")
    hub = h.server.leader.state.events
    after = require_int(h.arg("after"), "after") if h.arg("after") else hub.seq
    h.send_response(200)
    h.send_header("Content-Type", "text/event-stream")
    h.send_header("Cache-Control", "no-store")
    h.end_headers()
    h.close_connection = True
    leader = h.server.leader
    while not leader.stopping.is_set():
        events = hub.after(after, KEEPALIVE_S)
        if not leader.users.still_valid(who):  # revoked or expired: the stream ends with its token
            h.wfile.write(b"event: revoked\ndata: {}\n\n")
            h.wfile.flush()
            return
        if not events:
            h.wfile.write(b": keepalive\n\n")
        for event in events:
            if event.kind == "notify" and event.data.get("user") != who.name:
                after = event.seq  # a notice is its person's alone
                continue
            h.wfile.write(f"id: {event.seq}\nevent: {event.kind}\ndata: {json.dumps(event.data)}\n\n".encode())
            after = event.seq
        h.wfile.flush()


# -- agents ------------------------------------------------------------------------------


@route("POST", "/v1/agents/register", audit="join")
def _register(h: _Handler, who, body) -> tuple[int, dict]:
    registration = parse_registration(body)
    h.audited["target"] = registration.node.name
    leader = h.server.leader
    token, certificate = leader.agents.register(who, registration, h.client_address[0])
    _, logs_token = leader.agents.logs_of(registration.node.name) or (None, None)
    return 200, {"agent_token": token, "logs_token": logs_token, "certificate": certificate,
                 "lease_s": leader.config.lease_s, "fence_after_s": leader.config.fence_after_s,
                 "allowed_mount_roots": list(leader.config.allowed_mount_roots),
                 "allowed_images": list(leader.config.allowed_images),
                 "checkpoint_root": leader.config.checkpoint_root, "allow_root": leader.config.allow_root}


@route("POST", r"/v1/agents/([^/]+)/sync")
def _sync(h: _Handler, who, agent: str, body) -> tuple[int, dict]:
    agent = check_name(urllib.parse.unquote(agent), "node name")
    return 200, encode_reply(h.server.leader.agents.sync(who, agent, parse_sync(body)))
