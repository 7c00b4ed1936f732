"""The outbox: notices waiting for delivery, kept in the store, and the threads that deliver them.

A delivery is one notice for one channel, a record of the store's ``outbox`` table, written in the commit of the
change that caused it (``labq.leader.notify``): a leader killed after the change and before the delivery finds
it at its next start and delivers it then. A delivery leaves the table once its channel took it, or once it is
given up.

Each channel has its own thread (``labq-notify-webhook``, ``labq-notify-email``), supervised as the scheduler's
is, so a channel that hangs delays only itself. A round takes the deliveries that are due under the lab's lock,
sends them outside it (nothing waits on a network under the lock: not a pass, not a request), and takes the
answers in. A failed delivery is tried again after ``RetryPolicy.delay`` (doubling to a cap), until the notice
is ``give_up_s`` old; its last error stays in the channel's status. After a failure the round ends: the other
deliveries due wait for the next, so a channel that is down is asked once a round, not once a notice. The removals
of delivered notices are committed together, within ``SAVE_AFTER_S``: one commit a second, not one a notice, in the
journal that submits share.

Delivery is at least once: a leader killed between a send and the commit of its removal sends that notice again at
its next start (the webhook's ``labq.key`` and the e-mail's Message-ID let a receiver see the repeat). A leader that
stops writes its removals down first.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from labq.leader.channels import describe
from labq.leader.state import LabState
from labq.models.notify import Notice, RetryPolicy
from labq.protocol.errors import ApiError
from labq.protocol.notify import decode_notice, encode_notice
from labq.store import Change, DeleteRecord, PutRecord
from labq.workers import RetryLog

log = logging.getLogger("labq.leader.notify")

OUTBOX = "outbox"  #: the store's table of deliveries: "KEY.CHANNEL" -> {channel, to, notice, created_at}
STATUS = "notify_status"  #: the store's table of each channel's last success and what it gave up
ROUND = 50  #: the most deliveries of one channel sent in one round, and of its removals held back in memory
#: how long the removal of a delivered notice may wait to share a commit with the next ones (``Outbox._delivered``)
SAVE_AFTER_S = 1.0
IDLE_S = 60.0  #: a channel with nothing due looks again this often (a new delivery wakes it at once)
#: a channel woken by a new delivery waits this long for more, so that a burst of them is one round, not one each
GATHER_S = 0.05


class Channel(Protocol):
    name: str
    target: str  #: what the admin's status shows of where it sends (no secret)

    def wants(self, email: str | None, webhook: bool) -> bool: ...

    def send(self, notice: Notice, to: str | None = None) -> None: ...


@dataclass
class Delivery:
    """One notice for one channel, as the outbox holds it; the tries are counted in memory only (a restart
    tries at once again)."""

    key: str  #: its record's key in ``OUTBOX``
    channel: str
    notice: Notice
    to: str | None  #: the e-mail address, for the e-mail channel
    created_at: float
    tries: int = 0
    next_at: float = 0.0  #: when it is due (the lab's clock)
    last_error: str | None = None
    sent: bool = False  #: the channel took it; the commit that removes it is still to be made

    def record(self) -> dict:
        return {"channel": self.channel, "to": self.to, "notice": encode_notice(self.notice),
                "created_at": self.created_at}


@dataclass
class Line:
    """A channel's queue and how it has fared: what the admin's status shows."""

    name: str
    channel: Channel | None  #: None: deliveries for a channel the settings no longer have (kept, not sent)
    pending: dict[str, Delivery] = field(default_factory=dict)
    woken: threading.Event = field(default_factory=threading.Event)
    last_success_at: float | None = None
    last_error: str | None = None
    last_error_at: float | None = None
    failing_since: float | None = None  #: the first failure since its last success
    delivered: int = 0  #: since the leader started
    failed_tries: int = 0  #: sends the channel refused, since the leader started
    given_up: int = 0  #: in all (kept in the store)
    last_given_up: dict | None = None  #: {key, user, error, at} of the last notice given up
    round_failures: int = 0  #: rounds in a row that failed for the leader's own reasons (a commit)
    unsaved_since: float = 0.0  #: when the oldest delivery not yet removed from the store was sent (monotonic)
    #: the log of its failures: the first at once, a reminder a minute, and its recovery (``labq.workers``)
    said: RetryLog | None = None

    def status_record(self) -> dict:
        return {"last_success_at": self.last_success_at, "given_up": self.given_up,
                "last_given_up": self.last_given_up}


class Outbox:
    def __init__(self, state: LabState, channels: Mapping[str, Channel], retry: RetryPolicy) -> None:
        self.state, self.retry = state, retry
        #: the deliveries ``records`` made for the change being committed (by key), for ``took``
        self.staged: dict[str, Delivery] = {}
        self.lines: dict[str, Line] = {
            name: Line(name, ch, said=RetryLog(log, f"notifications: the {name} channel ({ch.target})"))
            for name, ch in channels.items()}
        for name, doc in state.records.get(STATUS, {}).items():
            line = self._line(name)
            line.last_success_at, line.given_up = doc.get("last_success_at"), doc.get("given_up", 0)
            line.last_given_up = doc.get("last_given_up")
        for key, doc in state.records.get(OUTBOX, {}).items():
            self._take(key, doc)
        for line in self.lines.values():
            if line.channel is None and line.pending:
                log.warning("%d notices wait for the %s channel, which the settings no longer have: they are "
                            "kept, and sent once it is configured again", len(line.pending), line.name)

    def _line(self, name: str) -> Line:
        if name not in self.lines:
            self.lines[name] = Line(name, None)
        return self.lines[name]

    def _take(self, key: str, doc: Mapping) -> None:
        notice = decode_notice(doc["notice"])
        self._line(doc["channel"]).pending[key] = Delivery(key, doc["channel"], notice, doc.get("to"),
                                                           doc["created_at"], next_at=doc["created_at"])

    # -- in: the commit of a change ---------------------------------------------------------

    def records(self, notice: Notice, email: str | None, webhook: bool, now: float) -> list[PutRecord]:
        """The deliveries of ``notice`` to the channels its person wants (by their e-mail address and their
        choice of the webhook), as records for the commit of the change that caused it; the deliveries are kept
        (``staged``) for ``took``, which need not read them back from their records."""
        found = []
        for name, line in self.lines.items():
            if line.channel is not None and line.channel.wants(email, webhook):
                delivery = Delivery(f"{notice.key}.{name}", name, notice, email if name == "email" else None, now,
                                    next_at=now)
                self.staged[delivery.key] = delivery
                found.append(PutRecord(OUTBOX, delivery.key, delivery.record()))
        return found

    def took(self, records: Iterable[Change]) -> None:
        """The records of ``records`` are on disk now (the lock is held): queue them and wake their channels."""
        woken = set()
        for change in records:
            if isinstance(change, PutRecord) and change.table == OUTBOX:
                delivery = self.staged.pop(change.key, None)
                if delivery is None:
                    self._take(change.key, change.doc)
                else:
                    self._line(delivery.channel).pending[delivery.key] = delivery
                woken.add(change.doc["channel"])
        for name in woken:
            self.lines[name].woken.set()

    # -- out: the channels' threads -----------------------------------------------------------

    def loop(self, name: str) -> None:
        """A channel's thread: a round, then a wait until the next delivery is due or a new one comes; it ends
        with the leader, once what it delivered is written down."""
        line, stopping = self.lines[name], self.state.stopping
        while not stopping.is_set():
            pause = self.step(name)
            if stopping.is_set():
                break
            if line.woken.wait(pause):
                stopping.wait(GATHER_S)  # what else comes meanwhile goes in the same round
            line.woken.clear()
        try:
            self._save(line, [])
        except ApiError as err:  # the store refuses: the next start sends these again (at least once)
            log.warning("notifications: could not note what the %s channel delivered before stopping: %s", name,
                        err.message)
        except Exception:  # noqa: BLE001 - the next start sends these again: at least once
            log.exception("notifications: could not note what the %s channel delivered before stopping", name)

    def wake(self) -> None:
        """Every channel's thread looks now (the leader stops; a test stepped the clock)."""
        for line in self.lines.values():
            line.woken.set()

    def step(self, name: str) -> float:
        """One round of channel ``name`` that never raises: how long to wait before the next. A failure of the
        leader's own (a commit) is logged and waited out, longer each time (2 s doubling to 60 s)."""
        line = self.lines[name]
        try:
            pause = self._round(line)
        except Exception:  # noqa: BLE001 - the outbox must outlive a bad round (the store, a bug), and not spin on it
            line.round_failures += 1
            log.exception("notifications: a round of the %s channel failed (%d in a row)", name, line.round_failures)
            return min(60.0, 2.0 ** line.round_failures)
        line.round_failures = 0
        return pause

    def _round(self, line: Line) -> float:
        """Send what is due, outside the lab's locks; then take the answers in, under its view (they change the
        line alone); writing down what was delivered is a change, under the lock (``_save``)."""
        state = self.state
        if line.channel is None:
            return IDLE_S
        with state.view:
            due = sorted((d for d in line.pending.values() if not d.sent and d.next_at <= state.clock()),
                         key=lambda d: (d.next_at, d.created_at, d.key))[:ROUND]
        if due:
            state.on_disk()  # the change that made them may still be on its way there
        sent: list[Delivery] = []
        failed: tuple[Delivery, Exception] | None = None
        for delivery in due:
            if state.stopping.is_set():
                break
            try:
                line.channel.send(delivery.notice, delivery.to)
            except Exception as err:  # noqa: BLE001 - whatever the channel raised, the notice waits and is retried
                failed = (delivery, err)
                break
            sent.append(delivery)
        with state.view:  # what the channel said changes the line alone: no change of the lab's, no commit
            now = state.clock()
            if sent:
                self._delivered(line, sent, now)
            gone = self._failed(line, *failed, now) if failed is not None else []
            unsaved = [d for d in line.pending.values() if d.sent]
            if not (gone or (unsaved and (len(unsaved) >= ROUND
                                          or state.monotonic() - line.unsaved_since >= SAVE_AFTER_S))):
                return self._pause(line)
        self._save(line, gone)  # a change: it takes the lock
        with state.view:
            return self._pause(line)

    def _delivered(self, line: Line, sent: list[Delivery], now: float) -> None:
        """The channel took ``sent`` (the view is held). Their removal from the store waits a little
        (``SAVE_AFTER_S``), to go in one commit with the next ones: a leader killed meanwhile sends them again."""
        if not any(d.sent for d in line.pending.values()):
            line.unsaved_since = self.state.monotonic()
        for d in sent:
            d.sent = True
        if line.said is not None:
            line.said.ok()
        line.last_success_at, line.failing_since = now, None
        line.delivered += len(sent)

    def _failed(self, line: Line, delivery: Delivery, err: Exception, now: float) -> list[Delivery]:
        """The channel refused ``delivery`` (the view is held): it waits its next try, or is given up (returned)."""
        error = describe(err)
        delivery.tries += 1
        line.failed_tries += 1
        delivery.last_error = error
        line.last_error, line.last_error_at = error, now
        if line.failing_since is None:
            line.failing_since = now
        if line.said is not None:
            line.said.failed(err)
        if self.retry.gives_up(delivery.created_at, now):
            line.given_up += 1
            line.last_given_up = {"key": delivery.key, "user": delivery.notice.user, "error": error, "at": now,
                                  "tries": delivery.tries}
            log.warning("notifications: gave up %s for %s on the %s channel after %d tries: %s", delivery.key,
                        delivery.notice.user, line.name, delivery.tries, error)
            return [delivery]
        delivery.next_at = now + self.retry.delay(delivery.tries)
        return []

    def _save(self, line: Line, gone: list[Delivery]) -> None:
        """Commit the removal of what was delivered and of what was ``gone`` (given up), with the channel's status
        (the lock is taken); in memory they leave the queue only once that is written."""
        with self.state.lock:
            done = [d for d in line.pending.values() if d.sent]
            if not done and not gone:
                return
            changes: list[Change] = [DeleteRecord(OUTBOX, d.key) for d in (*done, *gone)]
            changes.append(PutRecord(STATUS, line.name, line.status_record()))
            try:
                self.state.commit(changes)
            except ApiError:
                for d in gone:  # not on disk: given up again at its next try
                    d.next_at, line.given_up = self.state.clock(), line.given_up - 1
                raise
            for d in (*done, *gone):
                line.pending.pop(d.key, None)

    def _pause(self, line: Line) -> float:
        """How long the channel's thread may sleep (the view is held): until its next delivery is due, or what it
        delivered is to be written down; a minute at most."""
        waits = [IDLE_S]
        if any(d.sent for d in line.pending.values()):
            waits.append(SAVE_AFTER_S - (self.state.monotonic() - line.unsaved_since))
        due = min((d.next_at for d in line.pending.values() if not d.sent), default=None)
        if due is not None:
            waits.append(due - self.state.clock())
        return max(0.0, min(waits))

    # -- the admin's view -----------------------------------------------------------------------

    def status(self) -> list[dict]:
        """Each channel's queue and health (the view is held)."""
        rows = []
        for name in sorted(self.lines):
            line = self.lines[name]
            waiting = [d for d in line.pending.values() if not d.sent]
            errors = [d for d in waiting if d.last_error is not None]
            rows.append({
                "channel": name, "configured": line.channel is not None,
                "target": line.channel.target if line.channel is not None else None,
                "queued": len(waiting), "oldest_queued_at": min((d.created_at for d in waiting), default=None),
                "next_try_at": min((d.next_at for d in errors), default=None),
                "failing": line.failing_since is not None, "failing_since": line.failing_since,
                "last_success_at": line.last_success_at, "last_error": line.last_error,
                "last_error_at": line.last_error_at, "delivered": line.delivered, "failed_tries": line.failed_tries,
                "given_up": line.given_up,
                "last_given_up": line.last_given_up,
            })
        return rows
