"""The leader's reservations: booking with an instant answer, listing, cancelling, re-pinning, expiring.

Reservations are records in the store (``reservations``/NAME), loaded with the
rest of the hot state. The lab's lock is held for every change, as for jobs.
"""

from __future__ import annotations

from dataclasses import replace

from labq.leader.auth import Principal
from labq.leader.state import LabState
from labq.leader.users import user_only
from labq.models.job import Job, JobSpec, JobState
from labq.models.node import NodeHealth
from labq.models.reservation import BookingAnswer, Reservation
from labq.protocol import errors
from labq.protocol.bookings import ReserveRequest
from labq.protocol.codec import decode_reservation, encode_reservation
from labq.scheduler import why_never_fits_reservation
from labq.scheduler.booking import BookingLimits, book, repin
from labq.store import DeleteRecord, PutRecord

#: a reservation is forgotten this long after its end
KEEP_ENDED_S = 3600.0


class Bookings:
    def __init__(self, state: LabState) -> None:
        self.state = state
        records = state.records.get("reservations", {})
        self.by_name: dict[str, Reservation] = {name: decode_reservation(doc) for name, doc in records.items()}

    def current(self, now: float) -> list[Reservation]:
        """The reservations the scheduler must honour: not yet ended."""
        return [r for r in self.by_name.values() if r.end > now]

    def limits(self) -> BookingLimits:
        c = self.state.config
        return BookingLimits(c.max_reserved_gpu_hours_per_week, c.max_reservation_lead_s, c.max_reservation_s)

    def reserve(self, who: Principal, request: ReserveRequest) -> tuple[BookingAnswer, bool]:
        """Answer a booking, and book it if accepted and not a dry run: (answer, booked)."""
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
            if request.start < now - 60:
                raise errors.bad_request("the reservation would start in the past", "start")
            name = request.name or self._new_name(owner)
            wanted = Reservation(name, owner, request.gpus, max(request.start, now), request.end,
                                 frozenset(users) - {owner}, request.group, request.node, (), request.gpu_model,
                                 request.min_gpu_memory_mib)
            nodes = state.nodes()
            answer = book(wanted, nodes, list(self.by_name.values()), list(state.jobs.values()), now=now,
                          limits=self.limits(), exempt=who.admin)
            if not answer.accepted or request.dry_run:
                return answer, False
            r = answer.reservation
            state.commit([PutRecord("reservations", r.name, encode_reservation(r))])
            self.by_name[r.name] = r
        state.events.publish("reservation", {"name": r.name, "state": "booked", "owner": r.owner})
        state.wake()
        return answer, True

    def cancel(self, who: Principal, name: str) -> Reservation:
        user_only(who)
        state = self.state
        with state.lock:
            r = self.by_name.get(name)
            if r is None:
                raise errors.not_found(f"there is no reservation {name!r}")
            if r.owner != who.name and not who.admin:
                raise errors.forbidden(f"reservation {name!r} was booked by {r.owner}; only they or an admin may "
                                       "cancel it")
            state.commit([DeleteRecord("reservations", name)])
            del self.by_name[name]
        state.events.publish("reservation", {"name": name, "state": "cancelled", "owner": r.owner})
        state.wake()
        return r

    def view(self, who: Principal) -> list[Reservation]:
        user_only(who)
        with self.state.lock:
            return sorted(self.by_name.values(), key=lambda r: (r.start, r.name))

    def check_submit(self, spec: JobSpec, now: float) -> None:
        """A job naming a reservation (the lock is held): it must exist, admit the user, and fit in it."""
        name, user = spec.reservation, spec.user
        r = self.by_name.get(name)
        if r is None:
            raise errors.unprocessable(f"there is no reservation {name!r}; `labq reservations` lists them",
                                       "reservation")
        if not r.admits(user):
            raise errors.forbidden(f"{user} may not use reservation {name!r} (booked by {r.owner} for "
                                   f"{', '.join(sorted({r.owner, *r.users}))})")
        session = self.state.agents.get(r.node) if r.node else None
        never = why_never_fits_reservation(spec, r, session.node if session else None, now=now,
                                           stops_at_end=self.state.config.reservation_at_end == "stop")
        if never is not None:
            raise errors.unprocessable(f"this job can never run in reservation {name!r}: {never}", "reservation")

    def tick(self, now: float) -> list[Job]:
        """Timers (the lock is held): re-pin reservations whose node went away, stop jobs at a
        reservation's end (per the admin's at_end), forget ended reservations. Returns job updates."""
        state = self.state
        changes, updates = [], []
        nodes = state.nodes()
        health = {n.name: n.health for n in nodes}
        for r in list(self.by_name.values()):
            if r.end + KEEP_ENDED_S <= now:
                changes.append(DeleteRecord("reservations", r.name))
                del self.by_name[r.name]
                continue
            if r.end > now and health.get(r.node) in (NodeHealth.LOST, NodeHealth.DOWN, None):
                why = health[r.node].value if r.node in health else "gone"
                moved = repin(r, nodes, list(self.by_name.values()), list(state.jobs.values()), now=now, why=why)
                if moved is not None:
                    changes.append(PutRecord("reservations", r.name, encode_reservation(moved)))
                    self.by_name[r.name] = moved
                    state.events.publish("reservation", {"name": r.name, "state": "re-pinned", "owner": r.owner})
                elif not r.note.endswith("no other GPUs fit"):
                    note = f"{r.node} is {why}; no other GPUs fit"
                    self.by_name[r.name] = replace(r, note=f"{r.note}; {note}" if r.note else note)
                    changes.append(PutRecord("reservations", r.name, encode_reservation(self.by_name[r.name])))
        if state.config.reservation_at_end == "stop":
            for job in state.jobs.values():
                r = self.by_name.get(job.spec.reservation) if job.spec.reservation else None
                if (r is not None and job.state is JobState.RUNNING and not job.stop_requested
                        and now >= r.end - min(job.spec.grace_s, (r.end - r.start) / 2)):
                    updates.append(job.evolve(stop_requested="timeout"))
        if changes:
            state.commit(changes)
            state.wake()
        return updates

    def _new_name(self, owner: str) -> str:
        n = 1
        while f"{owner}-{n}" in self.by_name:
            n += 1
        return f"{owner}-{n}"
