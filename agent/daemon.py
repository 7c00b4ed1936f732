"""The workstation daemon: makes this machine run what the leader says, and nothing else.

Level-triggered, like a kubelet: each sync reports every attempt the runtime
knows and receives the attempts that should run here and those to stop. The
agent launches what is missing, stops what it is told to and anything the
leader does not expect (an attempt requeued elsewhere while this agent was
away), and forgets exits the leader has recorded.

If the leader cannot be reached the jobs keep running: a leader restart must
never kill work. The agent touches a heartbeat after every sync; each job's
shim stops its job (checkpoint signal, grace, TERM, KILL) once the heartbeat is
older than ``fence_after``, even if the agent itself is gone, so that the
leader, which requeues only after a longer time, never has a job running twice.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from labq import __version__
from labq.agent.accounts import USER_MAP_FILE, Accounts
from labq.agent.faults import NodeFault, ProblemBook, sentence
from labq.agent.gpu_watch import WATCH_EVERY_S as MEMORY_EVERY_S
from labq.agent.gpu_watch import MemoryWatch, attempt_roots, processes_of
from labq.agent.procfs import process_table
from labq.agent.identity import AgentIdentity
from labq.agent.inventory import GpuInventory, Inventory
from labq.agent.launches import Launcher
from labq.agent.process_runtime import AttemptState
from labq.agent.runtimes import Runtimes
from labq.agent.stops import NotesBook, marker_signal
from labq.models.job import SignalSource
from labq.models.node import Node, NodeProblem
from labq.protocol.agents import (
    KILL_AFTER_TERM_S, AttemptReport, Registration, RunOrder, StopOrder, SyncReport, decode_reply,
    encode_registration, encode_sync,
)
from labq.protocol.errors import ApiError
from labq.http_server import bearer_token, same_secret, serve_app
from labq.protocol.identity import USER_HEADER, lab_of, parse_join_token
from labq.transport import KeptConnections, Request, Response, Transport
from labq.workers import Backoff, RetryLog, Supervisor

log = logging.getLogger("labq.agent")
LONG_POLL_S = 20.0
KILL_AFTER_S = KILL_AFTER_TERM_S  #: after the grace, TERM; this long after TERM, KILL
WATCH_EVERY_S = 0.1  #: how often the agent looks for exits and new checkpoints to report at once
CHECKPOINT_NEWS_S = 2.0
LAUNCH_GAP_S = 0.002  #: between two launches of a burst, for a stop or a newer reply waiting for the lock
GRACE_RETRY_S = 1.0  #: when stopping a job after its grace failed, the next try
LOG_CHUNK = 1 << 20


@dataclass
class AgentConfig:
    leader: str  #: http://host:port
    join_token: str
    name: str
    state_dir: Path
    logs_host: str = "127.0.0.1"
    run_as_job_user: bool = field(default_factory=lambda: os.geteuid() == 0)
    #: the admin's map from lab users to this machine's accounts (``labq.agent.accounts``); None: in state_dir
    user_map: Path | None = None
    #: where to serve this machine's people without a token (``labq.agent.local_socket``); None: nowhere
    local_socket: Path | None = None
    #: a ``labq.agent.slurm.SlurmSite``: this node's jobs run as batch jobs of that Slurm partition
    slurm: object | None = None


class Agent:
    def __init__(self, config: AgentConfig, inventory: GpuInventory, transport: Transport | None = None, *,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock, self.monotonic = clock, monotonic  #: graces are kept on the wall clock, retries on monotonic
        self.inventory = inventory
        self.transport = transport or KeptConnections()  #: how requests reach the leader
        self.pin, self.join_secret = parse_join_token(config.join_token)
        self._pinned = None  #: the TLS context, once the lab's CA is fetched and checked against the pin
        config.state_dir.mkdir(parents=True, exist_ok=True)
        self.runtime = Runtimes(config.state_dir, config.name, lab=lab_of(config.join_token), slurm=config.slurm)
        self.checkpoints = config.state_dir / "checkpoints"
        self.checkpoint_root: str | None = None  #: the admin's shared checkpoint storage, when set
        self.notes = NotesBook(config.state_dir / "attempts")
        self.accounts = Accounts(config.user_map or config.state_dir / USER_MAP_FILE,
                                 run_as_job_user=config.run_as_job_user, monotonic=monotonic)
        self.problems = ProblemBook()  #: launches that failed for reasons of this machine, lately
        self.launcher = Launcher(config.name, self.runtime, self.accounts, self.notes, self.problems,
                                 self.checkpoints, config.state_dir / "tmp", run_as_job_user=config.run_as_job_user,
                                 monotonic=monotonic)
        #: the lab's users, as the leader last said; None until it does (a leader of an older labq never does,
        #: and is sent no accounts, problems or refusals it would not understand)
        self.users: tuple[str, ...] | None = None
        self._graces: dict[tuple[int, int], float] = {}  #: attempts being stopped: when their grace ends
        self._checkpoints_told: dict[tuple[int, int], float | None] = {}  #: as the leader last heard them
        self.token: str | None = None
        self.logs_token: str | None = None
        self.fence_after_s = 600.0
        self.lease_s = 30.0
        self.last_contact = monotonic()
        self._apply_lock = threading.Lock()
        self._applied = None  #: the last sync reply applied
        self._stopping: set[tuple[int, int]] = set()
        self._stop = threading.Event()
        self._reported_running: set[tuple[int, int]] = set()  #: as the leader last heard it
        self._waiting_told: set[tuple[int, int]] = set()  #: attempts the leader last heard Slurm holds back
        self.memory_watch = MemoryWatch()  #: the GPU memory of the jobs that share GPUs
        self._launches_pending = False  #: the latest reply wants attempts this node has not launched yet
        self._kick = threading.Event()
        #: this node's own key and certificate, in a TLS lab (``labq.agent.identity``)
        self.identity = AgentIdentity(config.state_dir / "tls", config.name) if self.pin else None
        self._logs_tls = self._logs_context()
        self._logs = serve_app(self.serve_log, (config.logs_host, 0), tls=self._logs_tls)
        self.local = self._open_local_socket(config.local_socket)
        self.workers = Supervisor()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        confinement = self.runtime.process.confinement
        if not confinement.enforced:  # jobs still run: accounted, their CPU set kept by affinity
            log.warning("%s", confinement.sentence)
        self.workers.spawn("labq-agent-logs", self._logs.serve_forever)
        self.workers.spawn("labq-agent-sync", self._sync_loop)
        self.workers.spawn("labq-agent-exits", self._watch_exits)
        self.workers.spawn("labq-agent-gpu-memory", self._memory_loop)
        if self.local is not None:
            self.workers.spawn("labq-agent-local", self.local.serve_forever)

    def check(self) -> list[str]:
        """For the process's main thread: restart a worker thread that died (``WorkerFailed`` if it keeps dying)."""
        return self.workers.check()

    def stop(self) -> None:
        """Stop the daemon; the jobs keep running and are re-adopted by the next agent."""
        self._stop.set()
        self._kick.set()
        self.workers.stopping = True
        if self.workers.threads:  # shutdown() waits for serve_forever, which only a started agent runs
            self._logs.shutdown()
        self._logs.server_close()
        if self.local is not None:
            self.local.close(started=bool(self.workers.threads))
        self.workers.join(timeout=1.0)  # daemons: a sync blocked in a long poll is not waited for

    def limits(self) -> str:
        """Whether the kernel keeps jobs to their CPUs and memory here, in a sentence for its start-up message."""
        return self.runtime.process.confinement.sentence

    def runs_jobs_as(self) -> str:
        """Which account this agent's jobs run as, in a sentence for its start-up message."""
        mapped = self.accounts.describe()
        slurm = self.runtime.slurm
        if self.config.run_as_job_user:
            root = "allowed" if self.runtime.process.allow_root else "refused"
            how = "sudo -n -u USER sbatch" if slurm and slurm.site.submit == "sudo" else "sbatch --uid"
            where = (f"jobs go to Slurm partition {slurm.site.partition} (node {slurm.node}) as their lab user's "
                     f"account ({how})" if slurm else "jobs run as their lab user's Unix account here")
            return f"{where} (uid 0 {root}, as the leader's [jobs] allow_root says){'; ' + mapped if mapped else ''}"
        import getpass

        if slurm is not None:
            return (f"jobs go to Slurm partition {slurm.site.partition} (node {slurm.node}) as "
                    f"{getpass.getuser()}, this agent's own account, whoever submits them: Slurm charges them to "
                    "it. To submit each as its user's account, run the agent as root (sbatch --uid), or let its "
                    "account run sbatch and scancel as the lab's users in sudoers and start it with "
                    "--slurm-submit sudo")
        return (f"jobs run as {getpass.getuser()}, this agent's own account, whoever submits them (an agent "
                "started as root runs each job as its user's account)")

    def _open_local_socket(self, path: Path | None):
        """This machine's people reach the queue through the agent here (``labq.agent.local_socket``); a socket
        that cannot be made is said and done without: the agent's work for the lab goes on."""
        if path is None:
            return None
        from labq.agent.local_socket import LocalSocket

        try:
            return LocalSocket(path, self.accounts.lab_user_of, self.forward_for)
        except OSError as err:
            log.warning("no local socket (people here need a token): cannot serve %s: %s", path,
                        getattr(err, "strerror", None) or err)
            return None

    def forward_for(self, user: str, request: Request) -> Response:
        """A request from ``user`` on this machine, sent to the leader as this agent, vouching for them."""
        token = self.token
        if token is None:
            raise ApiError(503, "unavailable", "this machine's labq agent has not joined its leader yet; try again "
                                               "in a moment (`labq agent` says why in its log)")
        headers = {**request.headers, "Authorization": f"Bearer {token}", USER_HEADER: user}
        try:
            return self.transport(Request(request.method, self.leader_url + request.target, headers, request.body,
                                          request.timeout, tls=self._tls()))
        except ApiError as err:  # the leader is not the pinned one
            raise ApiError(502, err.code, err.message) from None
        except OSError as err:
            raise ApiError(502, "unreachable", f"this machine's agent cannot reach the leader at {self.leader_url}: "
                                               f"{getattr(err, 'strerror', None) or err}") from None

    @property
    def logs_url(self) -> str:
        host, port = self._logs.server_address[:2]
        return f"{'https' if self._logs_tls is not None else 'http'}://{host}:{port}"

    def _logs_context(self):
        """In a TLS lab the log server serves over TLS as ``NODE.agent.labq``, with this node's certificate
        once it has one (until then it answers no one: no job runs here before the node has joined)."""
        if self.identity is None:
            return None
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        files = self.identity.files()
        if files is not None:
            context.load_cert_chain(*files)
        return context

    # -- talking to the leader -------------------------------------------------------------

    @property
    def leader_url(self) -> str:
        """The leader's address; https:// whenever the join token pins a CA, whatever an mDNS advert said."""
        url = self.config.leader.rstrip("/")
        return "https://" + url.removeprefix("http://") if self.pin and url.startswith("http://") else url

    def _tls(self):
        """The TLS context pinned to the lab's CA (the join token's pin), fetched once and kept in state_dir."""
        if self.pin is None:
            if self.leader_url.startswith("https://"):
                raise ApiError(0, "untrusted_leader", f"{self.leader_url} speaks TLS, but the join token carries no "
                               "CA pin to trust it by: use the join-token file of that leader's data folder")
            return None
        if self._pinned is None:
            from labq.tls import PinError, pinned_context

            try:
                cert = self.identity.files() if self.identity is not None else None
                self._pinned = pinned_context(self.leader_url, self.pin, self.config.state_dir, cert=cert)
            except PinError as err:
                raise ApiError(0, "untrusted_leader", str(err)) from None
        return self._pinned

    def _request(self, path: str, body: dict, token: str | None, timeout: float) -> dict:
        """POST ``body`` to the leader with ``token`` (none: this node's certificate alone speaks for it)."""
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        response = self.transport(Request("POST", self.leader_url + path, headers, json.dumps(body).encode(),
                                          timeout, tls=self._tls()))
        try:
            data = json.loads(response.read() or b"null")
        finally:
            response.close()
        if response.status != 200:
            raise ApiError.from_json(response.status, data)
        return data

    def register(self) -> None:
        inv = self.inventory.read(self._managed_pids())
        node = inv.as_node(self.config.name)
        reply, how = self._join(node)
        if reply.get("certificate") and self.identity is not None:
            self.identity.save(reply["certificate"])
            self._pinned = None  # the next connection shows the new certificate
            self._logs_tls.load_cert_chain(*self.identity.files())
        self.token, self.logs_token = reply["agent_token"], reply["logs_token"]
        self.fence_after_s, self.lease_s = reply["fence_after_s"], reply["lease_s"]
        self.checkpoint_root = reply.get("checkpoint_root") or None
        areas = (str(self.checkpoints), *filter(None, [self.checkpoint_root]))
        self.runtime.set_policy(tuple(reply.get("allowed_mount_roots", ())), tuple(reply.get("allowed_images", ())),
                                checkpoint_areas=areas, allow_root=bool(reply.get("allow_root", False)))
        log.info("registered %s with %d GPU(s) (%s) %s", self.config.name, len(inv.gpus), inv.source, how)

    def _join(self, node: Node) -> tuple[dict, str]:
        """Register ``node``: by this node's certificate when it holds one, else with the join secret (the
        secret is sent once per node, not at every start). A certificate the leader no longer takes (an admin
        forgot the node) falls back to the secret, once."""
        held = self.identity is not None and self.identity.files() is not None
        wanted = self.identity is not None and self.identity.due()
        body = encode_registration(Registration(node, self.logs_url, __version__,
                                                self.identity.request() if wanted else None))
        if held:
            try:
                return self._request("/v1/agents/register", body, None, timeout=30), "by its certificate"
            except ApiError as err:
                if err.status != 401:
                    raise
                log.warning("the leader does not take this node's certificate (%s): joining with the join token",
                            err.message)
                self.identity.cert_path.unlink(missing_ok=True)
                self._pinned = None
                body = encode_registration(Registration(node, self.logs_url, __version__, self.identity.request()))
        return self._request("/v1/agents/register", body, self.join_secret, timeout=30), "with the join token"

    def sync_once(self, wait_s: float, *, launch: bool = True) -> None:
        if self.token is None:
            self.register()
        report = self.report(wait_s)
        try:
            doc = self._request(f"/v1/agents/{self.config.name}/sync", encode_sync(report), self.token,
                                timeout=wait_s + 30)
        except ApiError as err:
            if err.status == 401:  # the leader forgot us (a recovered database): join again
                self.token = None
            raise
        try:
            reply = decode_reply(doc)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
            raise ValueError(f"the leader's sync reply is not understood ({type(err).__name__}: {err})") from None
        self.runtime.heartbeat()
        self.last_contact = self.monotonic()
        self.fence_after_s, self.lease_s = reply.fence_after_s, reply.lease_s
        self.users = reply.users
        self.apply(reply, launch=launch)

    def report(self, wait_s: float) -> SyncReport:
        """Every attempt the runtimes know, the GPUs busy outside labq, and (to a leader that asks, by naming
        its users) how this machine maps the lab's users and what keeps jobs from starting here."""
        statuses = self.runtime.attempts()
        self._reported_running = {(s.job_id, s.attempt) for s in statuses if s.state is AttemptState.RUNNING}
        waiting = {(s.job_id, s.attempt): self.runtime.waiting(s.job_id, s.attempt) for s in statuses
                   if s.state is AttemptState.RUNNING}
        self._waiting_told = {key for key, why in waiting.items() if why is not None}
        users = self.users
        attempts = []
        for s in statuses:
            notes = self.notes.get(s.job_id, s.attempt)
            checkpoint_at = notes.checkpoint_at()
            if checkpoint_at is not None and checkpoint_at < s.started_at:
                checkpoint_at = None  # an earlier attempt's
            self._checkpoints_told[(s.job_id, s.attempt)] = checkpoint_at
            declared = self._declared(s, notes)
            attempts.append(AttemptReport(s.job_id, s.attempt, s.state is AttemptState.RUNNING, s.exit_code,
                                          s.signal, s.started_at, s.ended_at, s.fenced, notes.escalated,
                                          checkpoint_at, sentence(s.node_fault) if users is not None and
                                          s.node_fault is not None else None, *declared,
                                          *self.memory_watch.reading((s.job_id, s.attempt)),
                                          waiting.get((s.job_id, s.attempt)), notes.refused or None,
                                          s.oom, s.memory_peak_mib))
        reading = self._read_inventory()
        return SyncReport(tuple(attempts),
            reading.unmanaged_busy if reading else None, wait_s,
            {u.index: {"memory_free_mib": u.memory_free_mib, "utilization_pct": u.utilization_pct}
             for u in reading.usage} if reading and reading.usage else None,
            tuple(replace(a, problem=sentence(a.problem)) if a.problem else a for a in self.accounts.report(users))
            if users is not None else None,
            self.problems.current(self.monotonic(), self.runtime.still_there) if users is not None else None,
            dict(reading.unmanaged_mib) if reading and users is not None else None)

    def _sync_loop(self) -> None:
        """Sync for as long as the agent runs: no error of the network, the leader or this machine ends it.

        A failed sync is logged (once per kind of failure, then every minute) and retried after a
        short backoff with jitter, capped so that the agent is back within about 2 s of its leader.
        """
        wait_s = 0.0  # the first sync after a start gets every order at once
        backoff, trouble = Backoff(), RetryLog(log, f"cannot sync with the leader at {self.config.leader}")
        while not self._stop.is_set():
            try:
                self.sync_once(wait_s)
            except Exception as err:  # noqa: BLE001 - a daemon loop outlives every error of one round
                if self._stop.is_set():
                    return  # stopping: the leader's answer was cut by our own shutdown
                trouble.failed(err)
                self._stop.wait(backoff.next())
                wait_s = 0.0
            else:
                trouble.ok()
                backoff.reset()
                wait_s = self.poll_s

    @property
    def poll_s(self) -> float:
        """How long a quiet sync may wait: a healthy agent renews its lease and its jobs' heartbeat
        well inside both the leader's lease and the shims' fence."""
        return min(LONG_POLL_S, self.lease_s / 2, self.fence_after_s / 3)

    def _watch_exits(self) -> None:
        """Report an exit, or a new checkpoint, at once instead of at the end of the current long poll.

        Compared with what the leader last heard, not with the last look: a job that
        starts and ends between two looks must be reported too. New checkpoints are
        reported at most every ``CHECKPOINT_NEWS_S``, however often a job saves.
        """
        told_at, pause = 0.0, WATCH_EVERY_S
        backoff, trouble = Backoff(cap=2.0), RetryLog(log, "cannot report an exit or a checkpoint at once")
        while not self._stop.wait(pause):
            try:
                if self._launches_pending:
                    self.launch_pending()
                running = [s for s in self.runtime.attempts() if s.state is AttemptState.RUNNING]
                exited = self._reported_running - {(s.job_id, s.attempt) for s in running}
                # an attempt another scheduler (Slurm) held back has started: news, as an exit is
                exited |= {key for key in self._waiting_told if self.runtime.waiting(*key) is None}
                self.check_graces()
                news = self.monotonic() - told_at >= CHECKPOINT_NEWS_S and any(
                    self._checkpoints_told.get((s.job_id, s.attempt)) != self._checkpoint_at(s) for s in running)
                if (exited or news) and self.token is not None:
                    told_at = self.monotonic()
                    self.sync_once(0.0)
                    trouble.ok()  # only a report that went through says the leader is reachable again
                    backoff.reset()
                pause = WATCH_EVERY_S
            except Exception as err:  # noqa: BLE001 - the sync loop retries too; this loop goes on
                if self._stop.is_set():
                    return
                trouble.failed(err)
                pause = max(WATCH_EVERY_S, backoff.next())

    def _declared(self, status, notes) -> tuple[str | None, SignalSource | None]:
        """The checkpoint signal the job named in its marker, else its image's label, and which; or neither.
        Only to a leader that names its users (one that understands the fields)."""
        if self.users is None:
            return None, None
        if named := marker_signal(notes.checkpoint_dir):
            return named, SignalSource.JOB
        if status.image_signal:
            return status.image_signal, SignalSource.IMAGE
        return None, None

    def _checkpoint_at(self, status) -> float | None:
        at = self.notes.get(status.job_id, status.attempt).checkpoint_at()
        return at if at is not None and at >= status.started_at else None

    # -- serving job logs to the leader -----------------------------------------------------

    def serve_log(self, request: Request) -> Response:
        """The log server's one route, ``GET /v1/logs/JOB/ATTEMPT?offset=N`` with the leader's logs token:
        up to ``LOG_CHUNK`` bytes from the offset, the next offset, and whether the log has ended."""
        if not same_secret(bearer_token(request.header("Authorization")), self.logs_token):
            return Response(401, body=b"unknown token")
        parts = request.path.strip("/").split("/")
        if len(parts) != 4 or parts[:2] != ["v1", "logs"] or not parts[2].isdigit() or not parts[3].isdigit():
            return Response(404, body=b"no such path")
        if request.method != "GET":
            return Response(405, {"Allow": "GET"}, b"the log server takes GET")
        job_id, attempt = int(parts[2]), int(parts[3])
        offset_text = request.query.get("offset", ["0"])[-1] or "0"
        if not offset_text.isdigit() or len(offset_text) > 18:
            return Response(400, body=b"offset must be a whole number of bytes")
        offset = int(offset_text)
        running = any(s.job_id == job_id and s.attempt == attempt and s.state is AttemptState.RUNNING
                      for s in self.runtime.attempts())
        try:
            data = self.runtime.read_log(job_id, attempt, offset, LOG_CHUNK)
        except KeyError:
            return Response(404, body=b"no such log")
        done = not running and len(data) < LOG_CHUNK  # checked before reading: nothing written after
        return Response(200, {"X-Labq-Offset": str(offset + len(data)), "X-Labq-Done": "1" if done else "0"}, data)

    # -- doing what the leader says --------------------------------------------------------

    def apply(self, reply, *, launch: bool = True) -> None:
        """Follow a sync reply: stop what it says to stop, and what this node runs that it does not expect; then
        (``launch``) start what it wants that is not running here yet (``launch_pending``)."""
        with self._apply_lock:
            if reply.older_than(self._applied):
                return  # a long poll answered before the reply just applied: its orders are stale
            self._applied = reply
            known = {(s.job_id, s.attempt): s for s in self.runtime.attempts()}
            wanted = {(r.job_id, r.attempt): r for r in reply.run}
            self.memory_watch.expect({key: r.gpu_mem_limit_mib for key, r in wanted.items()
                                      if r.gpu_mem_limit_mib is not None})
            for order in reply.stop:  # first: a stop is due now, and a burst of launches takes a while
                status = known.get((order.job_id, order.attempt))
                if status is not None and status.state is AttemptState.RUNNING:
                    self._stop_attempt(order)
            for key, status in known.items():
                if key in wanted:
                    continue
                if status.state is AttemptState.RUNNING:  # not expected here: requeued while we were away
                    self._stop_attempt(StopOrder(key[0], key[1], "SIGTERM", 0.0, "not expected on this node"))
                else:
                    self.runtime.forget(*key)
                    self.notes.forget(*key)
                    self._checkpoints_told.pop(key, None)
                    self._stopping.discard(key)
            self._launches_pending = any(key not in known for key in wanted)
        if launch:
            self.launch_pending()

    def launch_pending(self) -> None:
        """Start what the latest reply wants and this node does not run yet, one launch at a time: the lock is let
        go between launches, so a stop (or a newer reply) never waits for a burst of them to end."""
        tried: set[tuple[int, int]] = set()
        while True:
            if tried:
                time.sleep(LAUNCH_GAP_S)  # a lock is not fair: without a pause this loop would take it straight back
            with self._apply_lock:
                reply = self._applied
                if reply is None:
                    return
                skip = {(s.job_id, s.attempt) for s in self.runtime.attempts()} | tried
                order = next((r for r in reply.run if (r.job_id, r.attempt) not in skip), None)
                if order is None:
                    self._launches_pending = False
                    return
                tried.add((order.job_id, order.attempt))
                self.launcher.launch(order, self.fence_after_s)

    def _stop_attempt(self, order: StopOrder) -> None:
        """The signal, then after the grace (if it still runs) TERM and KILL; the grace survives an agent restart."""
        key = (order.job_id, order.attempt)
        if key in self._stopping:
            return
        self._stopping.add(key)
        sig = getattr(signal, order.signal, signal.SIGTERM)
        if sig == signal.SIGTERM and order.grace_s == 0:
            log.info("stopping job %d attempt %d (%s)", order.job_id, order.attempt, order.reason)
            self.runtime.stop(order.job_id, order.attempt, KILL_AFTER_S)
            return
        notes = self.notes.get(*key)
        if notes.signalled_at is None:  # not signalled by an earlier agent
            log.info("job %d attempt %d: %s, %gs to checkpoint (%s)", order.job_id, order.attempt, order.signal,
                     order.grace_s, order.reason)
            notes = self.notes.update(*key, signalled_at=self.clock(), grace_s=order.grace_s, reason=order.reason)
            self.runtime.signal(order.job_id, order.attempt, sig)
        self._graces[key] = notes.signalled_at + notes.grace_s

    def check_graces(self) -> None:
        """Stop (TERM, then KILL) each signalled attempt that still runs at the end of its grace, by the agent's
        clock; the exit watcher calls this every look. A stop that fails is tried again a moment later."""
        now = self.clock()
        due = [key for key, end in list(self._graces.items()) if end <= now]
        if not due:
            return
        running = {(s.job_id, s.attempt) for s in self.runtime.attempts() if s.state is AttemptState.RUNNING}
        for key in due:
            if key not in running:
                self._graces.pop(key, None)  # it stopped within its grace
                continue
            try:
                log.info("job %d attempt %d still runs after its grace: TERM, then KILL", *key)
                self.notes.update(*key, escalated=True)
                self.runtime.stop(*key, KILL_AFTER_S)
            except Exception as err:  # noqa: BLE001 - a job past its grace must still be stopped: try again soon
                log.warning("cannot stop job %d attempt %d after its grace: %s: %s; trying again in %g s", *key,
                            type(err).__name__, err, GRACE_RETRY_S)
                self._graces[key] = now + GRACE_RETRY_S
            else:
                self._graces.pop(key, None)

    def _memory_loop(self) -> None:
        """Read the GPU memory of the jobs that share GPUs every ``MEMORY_EVERY_S``, and tell the leader at once of
        one past its limit. A thread of its own: nothing the agent does meanwhile (a burst of launches) delays it."""
        backoff, trouble = Backoff(cap=5.0), RetryLog(log, "cannot watch the GPU memory of the jobs that share GPUs")
        pause = MEMORY_EVERY_S
        while not self._stop.wait(pause):
            try:
                pause = MEMORY_EVERY_S
                if not self.memory_watch.limits:
                    continue
                running = [s for s in self.runtime.attempts() if s.state is AttemptState.RUNNING]
                if self._watch_memory(running) and self.token is not None:
                    self.sync_once(0.0, launch=False)  # the exit watcher launches what the reply adds
                trouble.ok()
                backoff.reset()
            except Exception as err:  # noqa: BLE001 - a daemon loop outlives every error of one round
                if self._stop.is_set():
                    return
                trouble.failed(err)
                pause = max(MEMORY_EVERY_S, backoff.next())

    def _watch_memory(self, running) -> list[tuple[int, int]]:
        """Read the GPU memory of the jobs that share GPUs; the attempts that went over their limit just now."""
        table = process_table()
        processes = processes_of(attempt_roots(running, table), table)
        managed = frozenset(pid for pids in processes.values() for pid in pids)
        over = self.memory_watch.look(self.inventory.memory(managed), processes)
        for key in over:
            log.info("job %d attempt %d uses %d MiB of GPU memory, past its limit of %d MiB: telling the leader",
                     *key, self.memory_watch.used.get(key, 0), self.memory_watch.limits[key])
        return over

    def _managed_pids(self) -> frozenset[int]:
        """Every process of every running job: its whole process group, dataloader workers and all."""
        running = [s for s in self.runtime.attempts() if s.pid and s.state is AttemptState.RUNNING]
        if not running:
            return frozenset()
        table = process_table()
        return frozenset(pid for pids in processes_of(attempt_roots(running, table), table).values() for pid in pids)

    def _read_inventory(self) -> Inventory | None:
        try:
            return self.inventory.read(self._managed_pids())
        except Exception as err:  # an inventory hiccup must not stop the sync
            log.warning("cannot read the GPU inventory: %s", err)
            return None
