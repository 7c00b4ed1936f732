"""The leader's reservations: booking with an instant answer, listing, cancelling, re-pinning, expiring.

Reservations are records in the store (``reservations``/NAME), loaded with the
rest of the hot state. The lab's lock is held for every change, as for jobs.

A booking's end, or its cancellation, is a state change: the record stays (listed by
``labq reservations --all``) for ``KEEP_OVER_S``, and the jobs still naming it leave it in the
same commit or the next scheduling pass (``labq.models.transitions.out_of_reservations``), so
no job ever waits for a booking that no longer holds GPUs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from labq.leader.auth import Principal
from labq.leader.state import LabState
from labq.leader.users import user_only
from labq.models import transitions as t
from labq.models.job import Job, JobSpec, JobState
from labq.models.node import NodeHealth
from labq.models.reservation import BookingAnswer, DeadlineWindows, Reservation
from labq.models.usage import Booking
from labq.protocol import errors
from labq.protocol.bookings import ReserveRequest
from labq.protocol.codec import decode_reservation, encode_reservation
from labq.scheduler import why_never_fits_reservation
from labq.scheduler.booking import BookingLimits, better_pin, book, repin
from labq.scheduler.deadline import windows_by
from labq.scheduler.placement import indices_to_mask
from labq.store import DeleteRecord, PutRecord

#: an ended or cancelled reservation stays listed (``--all``) this long, then is forgotten
log = logging.getLogger("labq.leader")

KEEP_OVER_S = 7 * 86400.0
LEDGER = "booked"  #: the store's table of forgotten bookings: name@start -> ``labq.models.usage.Booking``


class Bookings:
    def __init__(self, state: LabState) -> None:
        self.state = state
        records = state.records.get("reservations", {})
        self.by_name: dict[str, Reservation] = {name: decode_reservation(doc) for name, doc in records.items()}
        #: called with (reservation, "started" or "ended") once for each moment of a booking that comes
        self.moment_heard: list[Callable[[Reservation, str], None]] = []
        #: the bookings forgotten once long over (``KEEP_OVER_S``), kept for ``labq usage`` (booked vs used)
        self.ledger: dict[str, Booking] = {key: Booking(**doc) for key, doc in state.records.get(LEDGER, {}).items()}

    def bookings(self) -> list[Booking]:
        """Every booking a report can know: the ones kept, and the ledger of those forgotten."""
        return list(self.ledger.values()) + [_booking(r) for r in self.by_name.values()]

    def current(self, now: float) -> list[Reservation]:
        """The reservations the scheduler must honour: not ended, not cancelled."""
        return [r for r in self.by_name.values() if r.live(now)]

    def standing(self) -> list[Reservation]:
        """What a new booking is checked against: all but the cancelled (the booking code skips ended ones)."""
        return [r for r in self.by_name.values() if r.cancelled_at is None]

    def limits(self) -> BookingLimits:
        c = self.state.config
        return BookingLimits(c.max_reserved_gpu_hours_per_week, c.max_reservation_lead_s, c.max_reservation_s)

    def reserve(self, who: Principal, request: ReserveRequest) -> tuple[BookingAnswer, bool, DeadlineWindows | None]:
        """Answer a booking, and book it if accepted and not a dry run: (answer, booked, and for a booking
        by need the earliest and latest windows that end by its deadline)."""
        user_only(who)
        state = self.state
        owner = request.owner or who.name
        if owner != who.name and not who.admin:
            raise errors.forbidden("only admins may book for someone else")
        users = request.users
        if request.group is not None:
            members = state.config.groups.get(request.group)
            if members is None:
                known = ", ".join(sorted(state.config.groups)) or "none: an admin defines them under [groups]"
                raise errors.unprocessable(f"there is no group {request.group!r}; groups: {known}", "group")
            users = members
        with state.lock:
            now = state.clock()
            wanted = Reservation(request.name or self._new_name(owner), owner, request.gpus, now, now + 1,
                                 frozenset(users) - {owner}, request.group, request.node, (), request.gpu_model,
                                 request.min_gpu_memory_mib)
            nodes, standing, jobs = state.nodes(), self.standing(), list(state.jobs.values())
            windows = None
            if request.by is not None:
                windows = windows_by(wanted, request.length, request.by, nodes, standing, jobs, now=now,
                                     limits=self.limits(), exempt=who.admin)
            start, end = _window(request, windows, now)
            if start < now - 60 or end <= now:
                raise errors.bad_request("the reservation would start in the past", "start")
            wanted = replace(wanted, start=max(start, now), end=end)
            answer = book(wanted, nodes, standing, jobs, now=now, limits=self.limits(), exempt=who.admin)
            if windows is not None and not answer.accepted and windows.earliest is None:
                answer = replace(answer, reasons=(f"no window of {request.gpus} GPU(s) for "
                                                  f"{_hours(request.length)} ends by the deadline", *answer.reasons))
            if not answer.accepted or request.dry_run:
                return answer, False, windows
            r = answer.reservation
            state.commit([PutRecord("reservations", r.name, encode_reservation(r))])
            self.by_name[r.name] = r
        state.events.publish("reservation", {"name": r.name, "state": "booked", "owner": r.owner})
        state.wake()
        return answer, True, windows

    def cancel(self, who: Principal, name: str) -> Reservation:
        """Cancel a booking; the jobs waiting in it leave it in the same commit (queued normally or cancelled)."""
        user_only(who)
        state = self.state
        with state.lock:
            now = state.clock()
            r = self.by_name.get(name)
            if r is None:
                raise errors.not_found(f"there is no reservation {name!r}")
            if r.owner != who.name and not who.admin:
                raise errors.forbidden(f"reservation {name!r} was booked by {r.owner}; only they or an admin may "
                                       "cancel it")
            if not r.live(now):
                raise errors.conflict(f"reservation {name!r} is already {r.state(now)}")
            r = replace(r, cancelled_at=now)
            mine = [j for j in state.jobs.values() if j.spec.reservation == name]
            state.apply(t.out_of_reservations(mine, {name: r}, now),
                        [PutRecord("reservations", name, encode_reservation(r))])
            self.by_name[name] = r
        state.events.publish("reservation", {"name": name, "state": "cancelled", "owner": r.owner})
        state.wake()
        return r

    def view(self, who: Principal, *, everything: bool = False) -> list[Reservation]:
        """The bookings still to come or running; ``everything`` adds those ended or cancelled lately."""
        user_only(who)
        with self.state.view:
            now = self.state.clock()
            return sorted((r for r in self.by_name.values() if everything or r.live(now)),
                          key=lambda r: (r.start, r.name))

    def release(self, now: float) -> list[Job]:
        """The jobs whose reservation is over, moved on (the lock is held): run before each scheduling pass."""
        return t.out_of_reservations(self.state.waiting_on.values(), self.by_name, now)

    def check_submit(self, spec: JobSpec, now: float) -> None:
        """A job naming a reservation (the view is held): it must exist, admit the user, and fit in it."""
        name, user = spec.reservation, spec.user
        r = self.by_name.get(name)
        if r is None:
            raise errors.unprocessable(f"there is no reservation {name!r}; `labq reservations` lists them",
                                       "reservation")
        if not r.live(now):
            raise errors.unprocessable(f"reservation {name!r} is {r.state(now)}; `labq reservations` lists the "
                                       "current ones", "reservation")
        if not r.admits(user):
            raise errors.forbidden(f"{user} may not use reservation {name!r} (booked by {r.owner} for "
                                   f"{', '.join(sorted({r.owner, *r.users}))})")
        session = self.state.agents.get(r.node) if r.node else None
        never = why_never_fits_reservation(spec, r, session.node if session else None, now=now,
                                           stops_at_end=self.state.config.reservation_at_end == "stop")
        if never is not None:
            raise errors.unprocessable(f"this job can never run in reservation {name!r}: {never}", "reservation")

    def tick(self, now: float) -> list[Job]:
        """Timers (the lock is held): re-pin reservations whose node went away, or whose pin would now displace
        less elsewhere on its node; stop jobs at a reservation's end (per the admin's at_end); forget
        reservations long over. Returns job updates."""
        state = self.state
        changes: list = []
        nodes = state.nodes()
        health = {n.name: n.health for n in nodes}
        displacing = _displacing(state.on_gpus.values())
        for r in list(self.by_name.values()):
            if r.over_at() + KEEP_OVER_S <= now:
                changes.append(DeleteRecord("reservations", r.name))
                del self.by_name[r.name]
                booking = _booking(r)
                key = f"{r.name}@{r.start:.0f}"
                changes.append(PutRecord(LEDGER, key, booking._asdict()))
                self.ledger[key] = booking
            elif r.live(now) and health.get(r.node) in (NodeHealth.LOST, NodeHealth.DOWN, None):
                changes += self._repin_lost(r, nodes, health, now)
            elif r.start > now and displacing.get(r.node, 0) & indices_to_mask(r.gpu_indices):
                moved = better_pin(r, nodes, self.standing(), list(state.jobs.values()), now=now)
                if moved is not None:
                    changes.append(self._moved(moved, "moved"))
        updates = []
        if state.config.reservation_at_end == "stop":
            for job in state.on_gpus.values():
                r = self.by_name.get(job.spec.reservation) if job.spec.reservation else None
                if (r is not None and job.state is JobState.RUNNING and not job.stop_requested
                        and now >= r.end - min(job.spec.grace_s, (r.end - r.start) / 2)):
                    updates.append(job.evolve(stop_requested="timeout"))
        told, notices, outbox = self._moments(now)
        changes += [PutRecord("reservations", r.name, encode_reservation(r)) for r in told]
        heard = [(r, moment) for r in told for moment in r.told[len(self.by_name[r.name].told):]]
        if changes:
            state.commit(changes + outbox)
            state.wake()
        self.by_name.update((r.name, r) for r in told)
        if notices:
            state.notify.committed(notices, outbox)
        for r, moment in heard:  # once written, for whoever keeps the lab's story (``labq.leader.lab_trail``)
            for hear in self.moment_heard:
                try:
                    hear(r, moment)
                except Exception:  # noqa: BLE001 - what listens never undoes a moment that is told already
                    log.exception("a listener of reservation %s's %s failed", r.name, moment)
        return updates

    def _moments(self, now: float) -> tuple[list[Reservation], list, list]:
        """The reservations that started or ended since the last look, marked told; and the notices of those
        their owners asked to hear of, with their outbox records (the lock is held)."""
        notify = self.state.notify
        if notify is None:
            return [], [], []
        told, notices = notify.reservation_moments(list(self.by_name.values()), now)
        return told, notices, notify.records(notices, now) if notices else []

    def _repin_lost(self, r: Reservation, nodes: list, health: dict, now: float) -> list:
        """A live booking whose node is lost, down or gone: onto GPUs that are up, or a note saying none fit."""
        why = health[r.node].value if r.node in health else "gone"
        moved = repin(r, nodes, self.standing(), list(self.state.jobs.values()), now=now, why=why)
        if moved is not None:
            return [self._moved(moved, "re-pinned")]
        if r.note.endswith("no other GPUs fit"):
            return []
        note = f"{r.node} is {why}; no other GPUs fit"
        self.by_name[r.name] = replace(r, note=f"{r.note}; {note}" if r.note else note)
        return [PutRecord("reservations", r.name, encode_reservation(self.by_name[r.name]))]

    def _moved(self, r: Reservation, what: str) -> PutRecord:
        self.by_name[r.name] = r
        self.state.events.publish("reservation", {"name": r.name, "state": what, "owner": r.owner})
        return PutRecord("reservations", r.name, encode_reservation(r))

    def _new_name(self, owner: str) -> str:
        n = 1
        while f"{owner}-{n}" in self.by_name:
            n += 1
        return f"{owner}-{n}"


def _displacing(jobs) -> dict[str, int]:
    """Per node, the GPUs of preemptible jobs on GPUs: where a booking's pin may displace running work."""
    found: dict[str, int] = {}
    for job in jobs:
        if job.state.holds_gpus and job.spec.preemptible and job.placement is not None:
            for a in job.placement.allocations:
                found[a.node] = found.get(a.node, 0) | indices_to_mask(a.gpu_indices)
    return found


def _window(request: ReserveRequest, windows: DeadlineWindows | None, now: float) -> tuple[float, float]:
    """The window to book: the one asked for, or the earliest or latest that ends by the deadline; when none
    does, the last one before it (so that the refusal says what is in the way, and what would work)."""
    if windows is None or request.pick is None:
        return request.start, request.end
    chosen = windows.earliest if request.pick == "earliest" else windows.latest
    if chosen is not None:
        return chosen.start, chosen.end
    start = max(now, request.by - request.length)
    return start, start + request.length


def _hours(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:g} h" if hours < 48 else f"{hours / 24:g} days"


def _booking(r: Reservation) -> Booking:
    return Booking(r.name, r.owner, r.node, r.gpus, r.start, r.end, r.cancelled_at)
