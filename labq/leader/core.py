"""The leader: the lab's queue in memory, every change on disk before it counts.

``Leader`` puts the parts together over one ``LabState`` (``labq.leader.state``):
``users`` (people, tokens, the join token), ``queue`` (submit, look, act on
jobs), ``agents`` (joining and the sync long poll), ``bookings``
(reservations), ``scheduling`` (the scheduler thread and the timers) and
``accounting`` (``labq usage``). The HTTP routes call these services; each
takes the lab's lock itself.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

from labq.leader.accounting import Accounting
from labq.leader.agents import Agents
from labq.leader.audit import AuditLog
from labq.leader.auth import Principal
from labq.leader.bookings import Bookings
from labq.leader.config import LeaderConfig
from labq.leader.lab_trail import LabTrail
from labq.leader.metrics import Metrics, TimedStore
from labq.leader.notify import Notify
from labq.leader.queue import Queue
from labq.leader.ratelimit import AuthFailures
from labq.leader.scheduling import Scheduling
from labq.leader.state import LabState
from labq.leader.users import Users
from labq.protocol.errors import ApiError
from labq.store import Store
from labq.workers import Supervisor


class Leader:
    def __init__(self, config: LeaderConfig, store: Store, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.state = LabState(config, store, clock, monotonic)
        self.users = Users(self.state)
        self.bookings = Bookings(self.state)
        self.queue = Queue(self.state, self.bookings)
        self.agents = Agents(self.state, self.users.joins)
        self.agents.epoch = secrets.token_hex(6)
        self.scheduling = Scheduling(self.state, self.bookings)
        #: ``GET /metrics``: fed by every job taken in, every pass and every commit
        self.metrics = Metrics(self.state, self.bookings)
        self.state.watchers.append(self.metrics.watch)
        self.scheduling.timed = self.metrics.passes.observe
        self.state.store = TimedStore(self.state.store, self.metrics.commits)
        #: ``labq usage``: who used the GPUs over a window
        self.accounting = Accounting(self.state, self.bookings)
        #: notifications: the notices a commit causes go into the outbox with it; a thread per channel delivers
        self.notify = Notify(self.state, config.notify)
        self.state.notify = self.notify
        self.users.ensure_join_token()
        self.workers = Supervisor()
        self.auth_failures = AuthFailures(config.auth_failures_per_minute, 60.0, monotonic)
        #: who did what, from where (``labq events``)
        self.audit = AuditLog(config.data_dir, clock)
        #: the lab's own steps in it: jobs placed, started, preempted, requeued, ended; bookings begun and over
        self.trail = LabTrail(self.audit)
        self.state.watchers.append(self.trail.watch)
        self.bookings.moment_heard.append(self.trail.booking)
        #: the lab CA's certificate (PEM) and pin when the leader serves TLS (``labq.leader.certs``)
        self.tls_ca: str | None = None
        self.tls_pin: str | None = None

    def use_tls(self, ca) -> None:
        """Serve the lab's CA (a ``labq.leader.certs.LabCA``) to clients that check it against their pin, sign
        the agents' certificates with it, and put the pin in the join token."""
        self.tls_ca, self.tls_pin = ca.cert_pem, ca.fingerprint
        self.agents.ca = ca
        self.users.pin_join_token(ca.fingerprint)

    def authenticate(self, token: str | None, source: str | None = None, vouched_for: str | None = None,
                     certificate: str | None = None) -> Principal:
        """Who sent a request with ``token`` from address ``source`` over a connection that showed the lab's
        ``certificate`` (its SHA-256; an agent's), for ``vouched_for`` when an agent sends it for a person on
        its machine. An address that keeps failing is refused (429) for a while without a look at its token."""
        self.auth_failures.check(source)
        try:
            return self.users.authenticate(token, vouched_for, certificate)
        except ApiError as err:
            if err.code == "unauthorized" and (token or certificate):  # a token that is none (not a person the lab lacks)
                self.auth_failures.failed(source)
            raise

    def ensure_admin(self, name: str | None = None) -> tuple[str, str] | None:
        """On a fresh lab, make the person starting the leader its first admin: (name, token)."""
        return self.users.ensure_admin(name)

    @property
    def stopping(self):
        """Set once the leader stops: long polls and event streams end."""
        return self.state.stopping

    def start(self) -> None:
        self.workers.spawn("labq-scheduler", self.scheduling.loop)
        self.accounting.warm_up()
        self.notify.start(self.workers)

    def check(self) -> list[str]:
        """For the process's main thread: restart the scheduler's and the notifications' threads if one died
        (``WorkerFailed`` if it keeps dying)."""
        return self.workers.check()

    def stop(self) -> None:
        state = self.state
        state.stopping.set()
        self.workers.stopping = True
        state.wake()
        with state.view:
            state.changed.notify_all()
        state.events.close()
        self.notify.outbox.wake()
        self.workers.join(timeout=10)
        self.audit.close()
