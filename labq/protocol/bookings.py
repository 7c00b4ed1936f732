"""Reservation requests and answers on the wire.

A booking is ``POST /v1/reservations`` with the window as Unix times (the CLI
reads "fri 09:00" in the user's zone and sends the instant). The answer is
always 200 with ``accepted`` true or false: a refusal is an answer, with its
reasons and alternatives, not an error. Malformed requests get 400.

A booking by need names no window but a length and a deadline: ``{"gpus", "length", "by", "start":
"earliest"|"latest"|TIME}``; the leader finds the earliest and the latest window of that length that
ends by the deadline, books the one asked for (``earliest`` when ``start`` is left out), and its answer
carries both under ``deadline``.

``reserve_request`` builds the body that ``parse_reserve`` reads back, for the CLI and the TUI alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from labq.models.reservation import BookingAnswer, DeadlineWindows
from labq.protocol.codec import encode_reservation
from labq.protocol.errors import bad_request
from labq.protocol.names import user_name_problem
from labq.protocol.fields import Fields

MAX_RESERVATION_GPUS = 512
MAX_WINDOW_S = 366 * 86400.0
MAX_USERS = 256
PICKS = ("earliest", "latest")  #: which window of a booking by need to book


@dataclass(frozen=True)
class ReserveRequest:
    """A booking: a window (``start``, ``end``), or a need (``length`` seconds ending ``by``) and ``pick``."""

    gpus: int
    start: float | None
    end: float | None
    name: str | None = None
    node: str | None = None
    gpu_model: str | None = None
    min_gpu_memory_mib: int = 0
    users: tuple[str, ...] = ()
    group: str | None = None
    owner: str | None = None  #: an admin booking for someone else
    dry_run: bool = False
    by: float | None = None  #: the deadline, for a booking by need
    length: float | None = None
    pick: str | None = None  #: ``earliest`` or ``latest``, when ``start`` is not a time


def reserve_request(gpus: int, start: float | str | None, end: float | None, *, by: float | None = None,
                    length: float | None = None, name: str | None = None, node: str | None = None,
                    gpu_model: str | None = None, min_gpu_memory_mib: int | None = None,
                    users: Sequence[str] = (), group: str | None = None, owner: str | None = None,
                    dry_run: bool = False) -> dict:
    """The ``POST /v1/reservations`` body that ``parse_reserve`` reads back: the window as Unix times (or, by
    need, ``length`` and ``by`` with ``start`` a time, ``earliest`` or ``latest``), and only the optional
    fields that are given."""
    body: dict = {"gpus": gpus}
    optional = {"start": start, "end": end, "by": by, "length": length,"name": name, "node": node, "gpu_model": gpu_model, "min_gpu_memory_mib": min_gpu_memory_mib,
                "users": list(users) or None, "group": group, "owner": owner, "dry_run": dry_run or None}
    body.update((key, value) for key, value in optional.items() if value is not None)
    return body


def parse_reserve(body: object) -> ReserveRequest:
    f = Fields(body, "a reservation")
    gpus = f.integer("gpus", required=True, low=1, high=MAX_RESERVATION_GPUS)
    by = f.number("by", high=4e9)
    if by is None:
        if f.raw("length") is not None:
            raise bad_request("length goes with a deadline (by): a booking by need", "length")
        start, end = f.number("start", required=True, high=4e9), f.number("end", required=True, high=4e9)
        length, pick = None, None
    else:
        start, end, length, pick = _by_need(f, by)
    name = f.name("name", "reservation name")
    node = f.name("node", "node name")
    gpu_model = f.string("gpu_model")
    memory = f.integer("min_gpu_memory_mib", low=0, high=10**7) or 0
    users = f.raw("users")
    group = f.name("group", "group name")
    owner = f.user_name("owner", "owner")
    dry_run = f.boolean("dry_run", default=False)
    f.done()
    if end is not None and end <= start:
        raise bad_request("end must be after start", "end")
    if end is not None and end - start > MAX_WINDOW_S:
        raise bad_request("a reservation may last at most a year", "end")
    if users is not None:
        if (not isinstance(users, list) or len(users) > MAX_USERS
                or not all(user_name_problem(u) is None for u in users)):
            raise bad_request(f"users must be a list of at most {MAX_USERS} user names", "users")
        if group is not None and users:
            raise bad_request("give users or a group, not both", "group")
    return ReserveRequest(gpus, start, end, name, node, gpu_model, memory, tuple(users or ()), group, owner, dry_run,
                          by, length, pick)


def _by_need(f: Fields, by: float) -> tuple[float | None, float | None, float, str | None]:
    """(start, end, length, pick) of a booking by need: a start time gives the window, else a pick."""
    length = f.number("length", required=True, low=60, high=MAX_WINDOW_S)
    if f.raw("end") is not None:
        raise bad_request("a booking by need gives its length and deadline (by), not an end", "end")
    start = f.raw("start")
    if start is None or start in PICKS:
        return None, None, length, start or "earliest"
    start = f.number("start", high=4e9)
    if start + length > by:
        raise bad_request("a window of that length starting then ends after the deadline (by)", "start")
    return start, start + length, length, None


def encode_windows(windows: DeadlineWindows) -> dict:
    """The ``deadline`` part of an answer to a booking by need: the earliest and latest windows, or null."""
    return {name: None if w is None else {"start": w.start, "end": w.end}
            for name, w in (("earliest", windows.earliest), ("latest", windows.latest))}


def encode_answer(answer: BookingAnswer, booked: bool) -> dict:
    return {
        "accepted": answer.accepted,
        "booked": booked,
        "reservation": encode_reservation(answer.reservation) if answer.reservation else None,
        "displaced": [{"job_id": d.job_id, "user": d.user, "signal_at": d.signal_at, "gpus": d.gpus,
                       "gpu_seconds_lost": d.gpu_seconds_lost} for d in answer.displaced],
        "reasons": list(answer.reasons),
        "alternatives": [{"start": a.start, "end": a.end, "gpus": a.gpus, "node": a.node,
                          "gpu_indices": list(a.gpu_indices), "score": a.score} for a in answer.alternatives],
    }
