"""Booking a reservation: an instant answer, a pinned GPU set, or why not and what would work.

Pure, like the rest of the scheduler: the leader passes the nodes, the other
reservations, the jobs and the time. A window [start, end) fits a node when
enough suitable GPUs there are

- up (a node that is lost, draining or down takes no bookings),
- not pinned by another reservation that overlaps the window (windows that
  only touch do not overlap),
- not held at the start by a job that cannot make room: a running job that is
  not preemptible and whose time limit does not end by the start. Preemptible
  jobs still running at the start are displaced: they get their checkpoint
  signal a grace before it.

Among the nodes that fit, the set with the best interconnect score wins, then
the one displacing the fewest GPUs. A refusal says why and offers up to three
alternatives: the nearest windows of the same size, and the largest smaller
set at the asked time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import inf

from labq.models.job import Job
from labq.models.node import Node
from labq.models.reservation import Alternative, BookingAnswer, Displaced, Reservation
from labq.scheduler.placement import best_set, indices_to_mask, mask_to_indices

WEEK_S = 7 * 86400.0
_MONDAY = 4 * 86400.0  #: 1970-01-05 00:00 UTC, the first Monday after the epoch
#: GPUs busy with processes labq did not start count as taken for bookings starting this soon
UNMANAGED_HORIZON_S = 3600.0
MAX_ALTERNATIVES = 3


@dataclass(frozen=True)
class BookingLimits:
    """The admin's limits on what a user may book for themselves (admins are exempt)."""

    max_gpu_hours_per_week: float | None = None  #: per user, weeks from Monday 00:00 UTC
    max_lead_s: float | None = 30 * 86400.0  #: how far ahead a booking may start
    max_duration_s: float | None = 7 * 86400.0


@dataclass(frozen=True)
class _Pin:
    node: str
    mask: int
    score: int
    loss: int
    displaced: tuple[Displaced, ...]

    def key(self) -> tuple:
        return (-self.score, sum(1 for _ in self.displaced), self.loss, self.node)


class _Lab:
    """What the bookings are checked against, indexed by node once per answer."""

    def __init__(self, nodes: list[Node], reservations: list[Reservation], jobs: list[Job], now: float,
                 skip: str | None) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.now = now
        self.booked: dict[str, list[tuple[float, float, int, str]]] = {n: [] for n in self.nodes}
        for r in reservations:
            if r.name != skip and r.node in self.booked and r.end > now:
                self.booked[r.node].append((r.start, r.end, indices_to_mask(r.gpu_indices), r.name))
        self.running: dict[str, list[tuple[Job, int]]] = {n: [] for n in self.nodes}
        for job in jobs:
            if job.state.holds_gpus and job.placement is not None:
                for a in job.placement.allocations:
                    if a.node in self.running:
                        self.running[a.node].append((job, indices_to_mask(a.gpu_indices)))

    def suitable(self, node: Node, r: Reservation) -> int:
        mask = 0
        for gpu in node.gpus:
            if gpu.memory_mib >= r.min_gpu_memory_mib and (
                    r.gpu_model is None or r.gpu_model.lower() in gpu.model.lower()):
                mask |= 1 << gpu.index
        return mask

    def pin_on(self, node: Node, r: Reservation, start: float, end: float, gpus: int) -> _Pin | None:
        if not node.schedulable:
            return None
        free = self.suitable(node, r)
        for b_start, b_end, b_mask, _ in self.booked[node.name]:
            if b_start < end and start < b_end:
                free &= ~b_mask
        if start - self.now < UNMANAGED_HORIZON_S:
            free &= ~indices_to_mask(node.unmanaged_busy)
        movable = []
        for job, mask in self.running[node.name]:
            job_end = _still_running_until(job, self.now)
            if job_end <= start:
                continue  # gone by the start
            if job.spec.preemptible:
                movable.append((job, mask))
            else:
                free &= ~mask
        choice = best_set(node.topology, free, gpus)
        if choice is None:
            return None
        displaced = tuple(Displaced(job.id, job.user, max(self.now, start - job.spec.grace_s))
                          for job, mask in movable if mask & choice.mask)
        return _Pin(node.name, choice.mask, choice.score, choice.loss, displaced)

    def best_pin(self, r: Reservation, start: float, end: float, gpus: int) -> _Pin | None:
        pins = [p for n in self.nodes.values() if r.node is None or n.name == r.node
                if (p := self.pin_on(n, r, start, end, gpus)) is not None]
        return min(pins, key=_Pin.key) if pins else None


def book(request: Reservation, nodes: list[Node], reservations: list[Reservation], jobs: list[Job], *,
         now: float, limits: BookingLimits = BookingLimits(), exempt: bool = False) -> BookingAnswer:
    """Answer a booking: ``request`` names the window, size and filters; ``node`` set means only there."""
    if any(r.name == request.name and r.end > now for r in reservations):
        return BookingAnswer(False, reasons=(f"a reservation named {request.name!r} exists; choose another name",))
    if request.node is not None and request.node not in {n.name for n in nodes}:
        known = ", ".join(sorted(n.name for n in nodes)) or "none yet"
        return BookingAnswer(False, reasons=(f"there is no node {request.node!r}; nodes: {known}",))
    lab = _Lab(nodes, reservations, jobs, now, skip=None)
    reasons = [] if exempt else _over_limits(request, reservations, now, limits)
    if not reasons:
        pin = lab.best_pin(request, request.start, request.end, request.gpus)
        if pin is not None:
            pinned = replace(request, node=pin.node, gpu_indices=mask_to_indices(pin.mask), score=pin.score,
                             created_at=now)
            return BookingAnswer(True, pinned, pin.displaced)
        reasons.append(_why_no_room(request, lab))
    return BookingAnswer(False, reasons=tuple(reasons),
                         alternatives=_alternatives(request, lab, reservations, jobs, limits, exempt))


def repin(r: Reservation, nodes: list[Node], reservations: list[Reservation], jobs: list[Job], *,
          now: float, why: str) -> Reservation | None:
    """The same booking on GPUs of nodes that are up, when its node went away; None if nothing fits."""
    lab = _Lab(nodes, reservations, jobs, now, skip=r.name)
    unpinned = replace(r, node=None, gpu_indices=())
    pin = lab.best_pin(unpinned, max(r.start, now), r.end, r.gpus)
    if pin is None:
        return None
    note = f"re-pinned from {r.node} ({why}) to {pin.node}"
    return replace(r, node=pin.node, gpu_indices=mask_to_indices(pin.mask), score=pin.score,
                   note=f"{r.note}; {note}" if r.note else note)


def week_of(t: float) -> float:
    """The start of the booking week (Monday 00:00 UTC) that ``t`` falls in."""
    return _MONDAY + ((t - _MONDAY) // WEEK_S) * WEEK_S


def booked_hours(owner: str, week: float, reservations: list[Reservation], now: float) -> float:
    return sum(r.gpu_hours for r in reservations
               if r.owner == owner and r.end > now and week_of(r.start) == week)


def _over_limits(r: Reservation, reservations: list[Reservation], now: float, limits: BookingLimits) -> list[str]:
    reasons = []
    if limits.max_duration_s is not None and r.end - r.start > limits.max_duration_s:
        reasons.append(f"a booking may last at most {_span(limits.max_duration_s)}; this one is "
                       f"{_span(r.end - r.start)}")
    if limits.max_lead_s is not None and r.start - now > limits.max_lead_s:
        reasons.append(f"a booking may start at most {_span(limits.max_lead_s)} ahead; this one starts in "
                       f"{_span(r.start - now)}")
    cap = limits.max_gpu_hours_per_week
    if cap is not None:
        used = booked_hours(r.owner, week_of(r.start), reservations, now)
        if used + r.gpu_hours > cap + 1e-9:
            reasons.append(f"quota: {r.owner} may book {cap:g} GPU-hours a week and has {used:g} booked that week; "
                           f"this one is {r.gpu_hours:g}")
    return reasons


def _why_no_room(r: Reservation, lab: _Lab) -> str:
    nodes = [n for n in lab.nodes.values() if r.node is None or n.name == r.node]
    up = [n for n in nodes if n.schedulable]
    if not up:
        states = ", ".join(f"{n.name} is {n.health.value}" for n in nodes)
        return "capacity: no node that is up" + (f" ({states})" if nodes else "")
    largest = max(lab.suitable(n, r).bit_count() for n in up)
    if largest < r.gpus:
        what = " suitable" if r.gpu_model or r.min_gpu_memory_mib else ""
        return f"capacity: no node has {r.gpus}{what} GPUs (the most is {largest})"
    clashing = sorted({name for n in up for b_start, b_end, _, name in lab.booked[n.name]
                       if b_start < r.end and r.start < b_end})
    pinned = sorted({j.id for n in up for j, _ in lab.running[n.name]
                     if not j.spec.preemptible and _still_running_until(j, lab.now) > r.start})
    parts = []
    if clashing:
        parts.append(f"overlapping bookings: {', '.join(clashing)}")
    if pinned:
        parts.append(f"jobs that cannot be preempted and may still run then: {', '.join(map(str, pinned))}")
    return "capacity: " + ("; ".join(parts) if parts else f"{r.gpus} GPUs are not free together on one node then")


def _alternatives(r: Reservation, lab: _Lab, reservations: list[Reservation], jobs: list[Job],
                  limits: BookingLimits, exempt: bool) -> tuple[Alternative, ...]:
    """Up to three: the nearest windows of the same length and size, then the largest smaller set."""
    length = r.end - r.start
    if not exempt and limits.max_duration_s is not None:
        length = min(length, limits.max_duration_s)
    starts = {r.start}
    if limits.max_gpu_hours_per_week is not None and not exempt:
        starts.add(week_of(r.start) + WEEK_S)  # a week's quota renews on Monday
    for entries in lab.booked.values():  # whole minutes, which people can type back
        for b_start, b_end, _, _ in entries:
            starts.update((_minute_up(b_end), (b_start - length) // 60 * 60))
    for job in jobs:
        if job.state.holds_gpus and not job.spec.preemptible:
            end = _still_running_until(job, lab.now)
            if end < inf:
                starts.add(_minute_up(end))
    latest = lab.now + limits.max_lead_s if limits.max_lead_s is not None and not exempt else inf
    found: list[Alternative] = []
    for start in sorted((s for s in starts if lab.now <= s <= latest), key=lambda s: (abs(s - r.start), s)):
        if len(found) == MAX_ALTERNATIVES - 1:
            break
        window = replace(r, start=start, end=start + length)
        if not exempt and _over_limits(window, reservations, lab.now, limits):
            continue
        pin = lab.best_pin(r, start, start + length, r.gpus)
        if pin is not None:
            found.append(Alternative(start, start + length, r.gpus, pin.node, mask_to_indices(pin.mask), pin.score))
    for k in range(r.gpus - 1, 0, -1):
        smaller = replace(r, gpus=k, end=r.start + length)
        if not exempt and _over_limits(smaller, reservations, lab.now, limits):
            continue
        pin = lab.best_pin(r, r.start, r.start + length, k)
        if pin is not None:
            found.append(Alternative(r.start, r.start + length, k, pin.node, mask_to_indices(pin.mask), pin.score))
            break
    return tuple(found[:MAX_ALTERNATIVES])


def _still_running_until(job: Job, now: float) -> float:
    """When a job on GPUs is gone at the latest: its time limit, or never known."""
    end = job.expected_end()
    if end is not None:
        return end
    if job.spec.time_limit_s is not None:  # placed, not started yet
        return now + job.spec.time_limit_s
    return inf


def _minute_up(t: float) -> float:
    return -(-t // 60) * 60


def _span(seconds: float) -> str:
    hours = seconds / 3600
    return f"{round(hours / 24, 1):g} days" if hours >= 48 else f"{round(hours, 1):g} h"
