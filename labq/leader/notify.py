"""Notifications: who is told of which change, their settings, and the admin's view of the channels.

``LabState.apply`` asks ``notices_for`` which notices the jobs it takes in cause (``labq.models.notify``: what
their owners asked for, per job or by default), adds their deliveries (``records``) to the same commit as the
jobs, and hands them over once written (``committed``): to the outbox (``labq.leader.outbox``), whose channel
threads deliver them once on disk (``LabState.on_disk``), and to the owner's terminals as a ``notify`` event of
the event stream (``labq ls --watch`` rings), which shows what the leader took in, as every look does. The
timers ask ``reservation_moments`` each second for the starts and ends of reservations.

A person's settings (``labq notify``) live in their record of the ``users`` table, under ``notify``; a user
changes their own, an admin anyone's.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from labq.leader.auth import Principal
from labq.leader.channels import channels_of
from labq.leader.config import NotifyConfig
from labq.leader.outbox import Channel, Outbox
from labq.leader import finished as finished_jobs
from labq.leader.finished import missing
from labq.leader.scheduling import finished_states
from labq.leader.state import LabState
from labq.leader.users import admin_only, user_only
from labq.models.job import Job
from labq.models.notify import (
    Notice, NotifyEvent, NotifySettings, RetryPolicy, array_notice, job_notices, reservation_moments,
    reservation_notice,
)
from labq.models.reservation import Reservation
from labq.protocol import errors
from labq.protocol.notify import SettingsRequest, decode_settings, encode_settings
from labq.store import Change, PutRecord

log = logging.getLogger("labq.leader")


class Notify:
    def __init__(self, state: LabState, config: NotifyConfig, channels: dict[str, Channel] | None = None) -> None:
        self.state = state
        retry = RetryPolicy(config.retry_first_s, config.retry_max_s, config.give_up_after_s)
        self.outbox = Outbox(state, channels_of(config) if channels is None else channels, retry)
        self._decoded: dict[str, tuple[dict, NotifySettings]] = {}  #: user -> (their record, its settings)

    def settings_of(self, user: str) -> NotifySettings:
        """``user``'s settings as stored (the view is held); the defaults for someone who set none. Decoded once
        per version of their record (a record is replaced, never changed in place)."""
        record = self.state.users.get(user)
        if record is None:
            return NotifySettings()
        known = self._decoded.get(user)
        if known is None or known[0] is not record:
            known = self._decoded[user] = (record, decode_settings(record.get("notify")))
        return known[1]

    # -- what LabState.apply asks (the lock is held) --------------------------------------------

    def notices_for(self, changes: list[tuple[Job | None, Job]]) -> list[Notice]:
        """The notices these changes of jobs (old version or None, new version) cause."""
        found: list[Notice] = []
        settings: dict[str, NotifySettings] = {}
        ended: dict[int, Job] = {}  #: arrays with a task that ends here: the last such task
        for old, new in changes:
            if new.spec.notify == ():  # --notify none: the common case costs nothing more
                continue
            if new.spec.array_id is not None:  # an array's tasks notify as one, once the last has ended
                if new.state.finished and (old is None or not old.state.finished):
                    ended[new.spec.array_id] = new
                continue
            mine = settings.get(new.user)
            if mine is None:
                mine = settings[new.user] = self.settings_of(new.user)
            wanted = mine.wanted_for(new)
            if wanted:
                found += job_notices(old, new, wanted)
        for array_id, last in ended.items():
            notice = self._array_ended(array_id, last, changes)
            if notice is not None:
                found.append(notice)
        return found

    def _array_ended(self, array_id: int, last: Job, changes: list[tuple[Job | None, Job]]) -> Notice | None:
        """The notice of array ``array_id`` if these changes end its last unfinished task: its tasks' ends counted
        (those that ended before from the lab's record of finished jobs, read from the archive once)."""
        here = {new.id: new.state.value for _, new in changes if new.spec.array_id == array_id and new.state.finished}
        if set(self.state.arrays.get(array_id, ())) - set(here) or last.spec.array_tasks is None:
            return None  # tasks still to end (or an array of an older labq, which did not say its size)
        ids = range(array_id + 1, array_id + 1 + last.spec.array_tasks)
        wanted = [i for i in ids if i not in here]
        readable = True
        if missing(self.state, wanted):  # tasks that ended before the leader started: the archive, read once
            with self.state.lock.outside_view():  # by a change (whose lock is held), but not by whoever only looks
                try:
                    finished_jobs.ensure(self.state, wanted)
                except OSError as err:  # the notice counts the ends it knows: the change goes on
                    log.warning("array %d's notice counts only the tasks that ended since the leader started: the "
                                "archive of finished jobs could not be read (%s)", array_id, err)
                    readable = False
        before = finished_states(self.state, wanted, read=readable)
        ends: dict[str, int] = {}
        for i in ids:
            end = here.get(i) or (before[i].value if i in before else None)
            if end is not None:
                ends[end] = ends.get(end, 0) + 1
        return array_notice(last, ends, self.settings_of(last.user).wanted_for(last))

    def records(self, notices: list[Notice], now: float) -> list[PutRecord]:
        """The outbox records of ``notices``: one a channel its person gets it by."""
        out = []
        self.outbox.staged.clear()  # the last change's, taken in or not: a change at a time (the lock)
        for notice in notices:
            mine = self.settings_of(notice.user)
            out += self.outbox.records(notice, mine.email, mine.webhook, now)
        return out

    def committed(self, notices: list[Notice], records: list[Change]) -> None:
        """``notices`` and their ``records`` are on disk: to the channels, and to their people's terminals."""
        self.outbox.took(records)
        for n in notices:
            event = {"user": n.user, "event": n.event.value, "text": n.headline(), "key": n.key}
            event.update({k: v for k, v in (("job_id", n.job_id), ("reservation", n.reservation)) if v is not None})
            self.state.events.publish("notify", event)

    def reservation_moments(self, reservations: list[Reservation], now: float
                            ) -> tuple[list[Reservation], list[Notice]]:
        """The reservations with a start or an end come that their owner was not told of yet, marked told (their
        owner asked for them or not: a moment is looked at once), and the notices of those their owner wants."""
        marked, notices = [], []
        for r in reservations:
            due = reservation_moments(r, now)
            if not due:
                continue
            marked.append(replace(r, told=r.told + due))
            if NotifyEvent.RESERVATION in self.settings_of(r.owner).on:
                notices += [reservation_notice(r, moment, r.start if moment == "started" else r.end)
                            for moment in due]
        return marked, notices

    # -- people's settings ----------------------------------------------------------------------

    def view(self, who: Principal, user: str | None = None) -> dict:
        """``GET /v1/notify``: a person's settings (their own; an admin's, anyone's) and the lab's channels."""
        user_only(who)
        name = user or who.name
        if name != who.name and not who.admin:
            raise errors.forbidden("only admins may see another user's notifications")
        with self.state.view:
            if name not in self.state.users:
                raise errors.not_found(f"there is no user {name!r}")
            return self._answer(name)

    def change(self, who: Principal, request: SettingsRequest) -> dict:
        """``PUT /v1/notify``: change what was sent of a person's settings, their own (an admin: anyone's)."""
        user_only(who)
        name = request.user or who.name
        if name != who.name and not who.admin:
            raise errors.forbidden(f"only admins may change another user's notifications ({name}'s)")
        state = self.state
        with state.lock:
            record = state.users.get(name)
            if record is None:
                raise errors.not_found(f"there is no user {name!r}")
            old = self.settings_of(name)
            new = NotifySettings(
                frozenset(request.on) if request.on is not None else old.on,
                old.email if request.email is None else (request.email or None),
                old.webhook if request.webhook is None else request.webhook)
            record = {**record, "notify": encode_settings(new)}
            state.commit([PutRecord("users", name, record)])
            state.users[name] = record
            return self._answer(name)

    def _answer(self, name: str) -> dict:
        return {"user": name, **encode_settings(self.settings_of(name)),
                "channels": [n for n, line in sorted(self.outbox.lines.items()) if line.channel is not None]}

    def status(self, who: Principal) -> list[dict]:
        """``GET /v1/notify/status`` (admins): each channel's queue, last success, last error, what it gave up."""
        admin_only(who, "see the notification channels")
        with self.state.view:
            return self.outbox.status()

    # -- the threads --------------------------------------------------------------------------------

    def start(self, workers) -> None:
        """A supervised thread per channel (``labq.workers.Supervisor``)."""
        for name, line in self.outbox.lines.items():
            if line.channel is not None:
                workers.spawn(f"labq-notify-{name}", lambda name=name: self.outbox.loop(name))
