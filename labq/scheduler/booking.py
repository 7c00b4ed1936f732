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

A GPU is *idle* for a booking when no job on it would still run at the start
(by its time limit). Displacing a job costs, in whole GPU-seconds,

    cost(job) = round(job.spec.gpus * (job.work_at_risk(signal_at) + job.spec.grace_s))
    signal_at = max(now, start - job.spec.grace_s)

all of its GPUs (it leaves whole, on every node), times the work it has not
checkpointed when it is signalled (since its last checkpoint, or its start) plus
the grace it spends stopping. ``displacement`` computes it; the answer, the
re-pinning and the benchmark use that one function. A pin's cost is the sum over
the jobs whose GPUs it takes. Among the GPU sets that fit, the pin is the least by

1. whether it displaces any job at all (idle GPUs first),
2. its cost,
3. its interconnect score (higher first),
4. its loss: score(F) - score(F without the set), where F is the idle GPUs and
   the displaced jobs' GPUs it may have (what stays free for others after it),
5. the node's name, then the set's mask (lowest GPUs), for determinism.

The search is exact up to 10 displaceable jobs on a node (all 1,023 sets of
them); past that it tries the 1,024 cheapest sets, and nodes of more than 16
GPUs place with placement's greedy search. A refusal says why and offers up to
three alternatives: the nearest windows of the same size, and the largest
smaller set at the asked time. ``better_pin`` moves a pinned booking within its
node when the lab changed so that it would displace strictly less, before any
job is signalled for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from heapq import heappop, heappush
from itertools import combinations
from math import inf

from labq.models.job import Job
from labq.models.node import Node
from labq.models.reservation import Alternative, BookingAnswer, Displaced, Reservation
from labq.models.topology import Topology
from labq.scheduler.placement import SetChoice, best_set, indices_to_mask, mask_to_indices

WEEK_S = 7 * 86400.0
_MONDAY = 4 * 86400.0  #: 1970-01-05 00:00 UTC, the first Monday after the epoch
#: GPUs busy with processes labq did not start count as taken for bookings starting this soon
UNMANAGED_HORIZON_S = 3600.0
MAX_ALTERNATIVES = 3
#: sets of victims tried per node, cheapest first (all of them up to 10 jobs on a node); past it the search
#: keeps the best it found, or takes the cheapest jobs that make room
VICTIM_SETS_TRIED = 1024


@dataclass(frozen=True)
class BookingLimits:
    """The admin's limits on what a user may book for themselves (admins are exempt)."""

    max_gpu_hours_per_week: float | None = None  #: per user, weeks from Monday 00:00 UTC
    max_lead_s: float | None = 30 * 86400.0  #: how far ahead a booking may start
    max_duration_s: float | None = 7 * 86400.0


def displacement(job: Job, start: float, now: float) -> Displaced:
    """What displacing ``job`` for a booking that starts at ``start`` costs (the module's definition)."""
    signal_at = max(now, start - job.spec.grace_s)
    lost = round(job.spec.gpus * (job.work_at_risk(signal_at) + job.spec.grace_s))
    return Displaced(job.id, job.user, signal_at, job.spec.gpus, lost)


@dataclass(frozen=True)
class _Pin:
    node: str
    mask: int
    score: int
    loss: int
    displaced: tuple[Displaced, ...]

    @property
    def cost(self) -> int:
        return sum(d.gpu_seconds_lost for d in self.displaced)

    def key(self) -> tuple:
        return (bool(self.displaced), self.cost, -self.score, self.loss, self.node, self.mask)


@dataclass(frozen=True)
class _Victim:
    """A preemptible job that would still run at the start, on GPUs a booking may take."""

    mask: int  #: its GPUs on this node
    displaced: Displaced


@dataclass(frozen=True)
class _Spot:
    """What one node offers a booking's window."""

    node: Node
    allowed: int  #: suitable, not booked by an overlapping reservation, not held by a job that stays
    idle: int  #: allowed, and no job on it at the start
    victims: tuple[_Victim, ...]  #: cheapest first

    def idle_pin(self, gpus: int) -> _Pin | None:
        choice = best_set(self.node.topology, self.idle, gpus)
        return None if choice is None else _Pin(self.node.name, choice.mask, choice.score, choice.loss, ())


class _Lab:
    """What the bookings are checked against, indexed by node once per answer."""

    def __init__(self, nodes: list[Node], reservations: list[Reservation], jobs: list[Job], now: float,
                 skip: str | None) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.now = now
        self.booked: dict[str, list[tuple[float, float, int, str]]] = {n: [] for n in self.nodes}
        for r in reservations:
            if r.name != skip and r.node in self.booked and r.live(now):
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

    def spot(self, node: Node, r: Reservation, start: float, end: float) -> _Spot | None:
        if not node.schedulable:
            return None
        allowed = self.suitable(node, r)
        for b_start, b_end, b_mask, _ in self.booked[node.name]:
            if b_start < end and start < b_end:
                allowed &= ~b_mask
        if start - self.now < UNMANAGED_HORIZON_S:
            allowed &= ~indices_to_mask(node.unmanaged_busy)
        movable = []
        for job, mask in self.running[node.name]:
            if _still_running_until(job, self.now) <= start:
                continue  # gone by the start
            if job.spec.preemptible:
                movable.append(_Victim(mask, displacement(job, start, self.now)))
            else:
                allowed &= ~mask
        busy = 0
        for v in movable:
            busy |= v.mask
        victims = sorted((v for v in movable if v.mask & allowed),
                         key=lambda v: (v.displaced.gpu_seconds_lost, v.displaced.job_id))
        return _Spot(node, allowed, allowed & ~busy, tuple(victims))

    def fits(self, r: Reservation, start: float, end: float, gpus: int) -> bool:
        """Whether some pin exists (best_pin would find one), without costing the choices."""
        return any((s := self.spot(n, r, start, end)) is not None and s.allowed.bit_count() >= gpus
                   for n in self.nodes.values() if r.node is None or n.name == r.node)

    def best_pin(self, r: Reservation, start: float, end: float, gpus: int) -> _Pin | None:
        """The least pin over the nodes the booking may use: idle GPUs anywhere first, then the cheapest
        displacement, each node's search cut off by the best cost found on the nodes before it."""
        spots = [s for n in self.nodes.values() if r.node is None or n.name == r.node
                 if (s := self.spot(n, r, start, end)) is not None and s.allowed.bit_count() >= gpus]
        calm = [p for s in spots if (p := s.idle_pin(gpus)) is not None]
        if calm:
            return min(calm, key=_Pin.key)
        best: _Pin | None = None
        for s in spots:
            pin = _least_displacing(s, gpus, None if best is None else best.cost)
            if pin is not None and (best is None or pin.key() < best.key()):
                best = pin
        return best


def _least_displacing(spot: _Spot, gpus: int, bound: int | None) -> _Pin | None:
    """The least pin on a node that displaces jobs, costing at most ``bound``; None if none.

    For each set V of victims, cheapest first, the best set among the idle GPUs and V's (placement's
    best_set) is costed by the victims it really touches. Why this is the optimum over all GPU sets:
    take the optimal set S* and V* the jobs it touches; at V*, best_set returns a set S that scores
    and loses no worse than S* within the same free GPUs. If S touches all of V*, its key is S*'s.
    If S touches only V' < V* and costs less, S beats S*: impossible. So S costs the same (V* has
    jobs of zero cost) and the exact search over sets touching all of V* (_touching_all) finds S*.
    Sets that touch only part of a V are found at their own V, which costs less and comes earlier;
    a V that costs more than the best found cannot hold the optimum, so the search stops there.
    """
    victims = spot.victims
    best: _Pin | None = None
    for tried, (cost, members) in enumerate(_subsets_by_cost([v.displaced.gpu_seconds_lost for v in victims])):
        if (bound is not None and cost > bound) or (best is not None and cost > best.cost):
            break
        if tried == VICTIM_SETS_TRIED:  # a crowded node: keep the best found, or take the cheapest jobs first
            return best or _pin_taking(spot, gpus, _cheapest_room(spot, gpus), exact=False)
        chosen = [v for i, v in enumerate(victims) if members >> i & 1]
        pin = _pin_taking(spot, gpus, chosen)
        if pin is not None and (best is None or pin.key() < best.key()):
            best = pin
    return best


def _cheapest_room(spot: _Spot, gpus: int) -> list[_Victim]:
    """The cheapest victims that, with the idle GPUs, make room for ``gpus``."""
    room, taken = spot.idle.bit_count(), []
    for v in spot.victims:
        if room >= gpus:
            break
        taken.append(v)
        room += (v.mask & spot.allowed).bit_count()
    return taken


def _pin_taking(spot: _Spot, gpus: int, chosen: list[_Victim], exact: bool = True) -> _Pin | None:
    """The best set among the idle GPUs and the chosen victims', costed by the victims it touches.
    Exact: None if it touches only some of them for less (that set is found with those victims alone)."""
    free = spot.idle
    for v in chosen:
        free |= v.mask & spot.allowed
    choice = best_set(spot.node.topology, free, gpus)
    if choice is None:
        return None
    touched = [v for v in chosen if v.mask & choice.mask]
    if not exact:
        chosen = touched
    elif len(touched) < len(chosen):
        if sum(v.displaced.gpu_seconds_lost for v in touched) < sum(v.displaced.gpu_seconds_lost for v in chosen):
            return None
        choice = _touching_all(spot.node.topology, free, gpus, chosen)
        if choice is None:
            return None
    displaced = tuple(sorted((v.displaced for v in chosen), key=lambda d: d.job_id))
    return _Pin(spot.node.name, choice.mask, choice.score, choice.loss, displaced)


def _touching_all(topology: Topology, free: int, gpus: int, chosen: list[_Victim]) -> SetChoice | None:
    """best_set's order over the sets inside ``free`` that take a GPU from every chosen victim (exact, slow:
    needed only when some victims cost nothing)."""
    free_score = topology.set_score(mask_to_indices(free))
    best: SetChoice | None = None
    for combo in combinations(mask_to_indices(free), gpus):
        mask = indices_to_mask(combo)
        if not all(v.mask & mask for v in chosen):
            continue
        score = topology.set_score(combo)
        choice = SetChoice(mask, score, free_score - topology.set_score(mask_to_indices(free & ~mask)))
        if best is None or (-choice.score, choice.loss, choice.mask) < (-best.score, best.loss, best.mask):
            best = choice
    return best


def _subsets_by_cost(costs: list[int]) -> Iterator[tuple[int, int]]:
    """Every non-empty subset of items costing ``costs`` (ascending) as (total, bitmask), cheapest first."""
    heap = [(costs[0], 1, 0)] if costs else []
    while heap:
        total, members, last = heappop(heap)
        yield total, members
        following = last + 1
        if following < len(costs):  # each subset once: grow by the next item, or swap the last for it
            heappush(heap, (total + costs[following], members | 1 << following, following))
            heappush(heap, (total - costs[last] + costs[following], members ^ 1 << last | 1 << following, following))


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


def better_pin(r: Reservation, nodes: list[Node], reservations: list[Reservation], jobs: list[Job], *,
               now: float) -> Reservation | None:
    """The booking moved to other GPUs of its node that displace strictly less running work; else None.

    The contract, for the leader's timer (pure and cheap: call it whenever the lab changed):

    - only an upcoming, pinned, not cancelled booking on a node that is up moves (a node that
      went away is ``repin``'s), and only before any job is signalled for it: ``now`` is before the
      earliest ``signal_at`` of the jobs its pin displaces, and no job is draining for it;
    - it stays on its node (the booking does not say whether its owner asked for that node), on
      GPUs that pass its filters and that no other live booking overlapping its window holds;
    - it moves only when the best pin there displaces strictly less than the current one: nothing
      where the current displaces a job, or fewer GPU-seconds, both costed now by ``displacement``;
    - name, owner, size, window, filters and users stay; ``gpu_indices`` and ``score`` are the new
      set's, and ``note`` gains ``moved from ws1 GPUs 0 to GPUs 2: displaces nothing``.
    """
    if r.cancelled_at is not None or r.node is None or not r.gpu_indices or now >= r.start:
        return None
    lab = _Lab(nodes, reservations, jobs, now, skip=r.name)
    node = lab.nodes.get(r.node)
    if node is None or not node.schedulable:
        return None
    pinned = indices_to_mask(r.gpu_indices)
    current = [displacement(job, r.start, now) for job, mask in lab.running[r.node]
               if mask & pinned and job.spec.preemptible and _still_running_until(job, now) > r.start]
    if not current or now >= min(d.signal_at for d in current):
        return None
    if any(job.drained_for == r.name and job.state.holds_gpus for job, _ in lab.running[r.node]):
        return None
    pin = lab.best_pin(r, r.start, r.end, r.gpus)
    cost = sum(d.gpu_seconds_lost for d in current)
    if pin is None or (bool(pin.displaced), pin.cost) >= (True, cost):
        return None
    what = "displaces nothing" if not pin.displaced else (
        f"displaces about {_gpu_minutes(pin.cost)} GPU-min of running work instead of {_gpu_minutes(cost)}")
    note = (f"moved from {r.node} GPUs {','.join(map(str, r.gpu_indices))} to GPUs "
            f"{','.join(map(str, mask_to_indices(pin.mask)))}: {what}")
    return replace(r, gpu_indices=mask_to_indices(pin.mask), score=pin.score,
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


def _gpu_minutes(gpu_seconds: int) -> str:
    return f"{round(gpu_seconds / 60):g}"


def _minute_up(t: float) -> float:
    return -(-t // 60) * 60


def _span(seconds: float) -> str:
    hours = seconds / 3600
    return f"{round(hours / 24, 1):g} days" if hours >= 48 else f"{round(hours, 1):g} h"
