"""Reservation requests and answers on the wire.

A booking is ``POST /v1/reservations`` with the window as Unix times (the CLI
reads "fri 09:00" in the user's zone and sends the instant). The answer is
always 200 with ``accepted`` true or false: a refusal is an answer, with its
reasons and alternatives, not an error. Malformed requests get 400.

``reserve_request`` builds the body that ``parse_reserve`` reads back, for the CLI and the TUI alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from labq.models.reservation import BookingAnswer
from labq.protocol.codec import encode_reservation
from labq.protocol.errors import bad_request
from labq.protocol.names import user_name_problem
from labq.protocol.requests import Fields

MAX_RESERVATION_GPUS = 512
MAX_WINDOW_S = 366 * 86400.0
MAX_USERS = 256


@dataclass(frozen=True)
class ReserveRequest:
    gpus: int
    start: float
    end: float
    name: str | None = None
    node: str | None = None
    gpu_model: str | None = None
    min_gpu_memory_mib: int = 0
    users: tuple[str, ...] = ()
    group: str | None = None
    owner: str | None = None  #: an admin booking for someone else
    dry_run: bool = False


def reserve_request(gpus: int, start: float, end: float, *, name: str | None = None, node: str | None = None,
                    gpu_model: str | None = None, min_gpu_memory_mib: int | None = None,
                    users: Sequence[str] = (), group: str | None = None, owner: str | None = None,
                    dry_run: bool = False) -> dict:
    """The ``POST /v1/reservations`` body that ``parse_reserve`` reads back: the window as Unix times, and only
    the optional fields that are given."""
    body: dict = {"gpus": gpus, "start": start, "end": end}
    optional = {"name": name, "node": node, "gpu_model": gpu_model, "min_gpu_memory_mib": min_gpu_memory_mib,
                "users": list(users) or None, "group": group, "owner": owner, "dry_run": dry_run or None}
    body.update((key, value) for key, value in optional.items() if value is not None)
    return body


def parse_reserve(body: object) -> ReserveRequest:
    f = Fields(body, "a reservation")
    gpus = f.integer("gpus", required=True, low=1, high=MAX_RESERVATION_GPUS)
    start = f.number("start", required=True, high=4e9)
    end = f.number("end", required=True, high=4e9)
    name = f.name("name", "reservation name")
    node = f.name("node", "node name")
    gpu_model = f.string("gpu_model")
    memory = f.integer("min_gpu_memory_mib", low=0, high=10**7) or 0
    users = f.raw("users")
    group = f.name("group", "group name")
    owner = f.user_name("owner", "owner")
    dry_run = f.boolean("dry_run", default=False)
    f.done()
    if end <= start:
        raise bad_request("end must be after start", "end")
    if end - start > MAX_WINDOW_S:
        raise bad_request("a reservation may last at most a year", "end")
    if users is not None:
        if (not isinstance(users, list) or len(users) > MAX_USERS
                or not all(user_name_problem(u) is None for u in users)):
            raise bad_request(f"users must be a list of at most {MAX_USERS} user names", "users")
        if group is not None and users:
            raise bad_request("give users or a group, not both", "group")
    return ReserveRequest(gpus, start, end, name, node, gpu_model, memory, tuple(users or ()), group, owner, dry_run)


def encode_answer(answer: BookingAnswer, booked: bool) -> dict:
    return {
        "accepted": answer.accepted,
        "booked": booked,
        "reservation": encode_reservation(answer.reservation) if answer.reservation else None,
        "displaced": [{"job_id": d.job_id, "user": d.user, "signal_at": d.signal_at} for d in answer.displaced],
        "reasons": list(answer.reasons),
        "alternatives": [{"start": a.start, "end": a.end, "gpus": a.gpus, "node": a.node,
                          "gpu_indices": list(a.gpu_indices), "score": a.score} for a in answer.alternatives],
    }
