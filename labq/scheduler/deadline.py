"""Booking by need: the windows of a given length that finish by a deadline.

``labq reserve --gpus 4 --gpu-hours 200 --by "fri 18:00"`` asks for 50 hours of
4 GPUs that end by Friday 18:00; the answer is the earliest start available and
the latest start that still finishes in time, and the user books either (or a
start between them). Pure, like ``labq.scheduler.booking``, whose rules decide
whether a window fits.

Whether a window ``[s, s + length)`` fits changes only at a few instants, so
only those are tried. A start is kept off a set of GPUs by

- another booking ``b`` on them when ``b.start - length < s < b.end``,
- a job that cannot be preempted while ``s`` is before its time limit's end,
- processes labq did not start while ``s`` is within ``UNMANAGED_HORIZON_S``,
- the admin's limits: the lead (``s`` too far ahead) and the weekly quota
  (which depends on the week ``s`` falls in).

So the earliest start that fits is now or the end of one of those (a booking's
end, a job's end, the horizon, a Monday), and the latest is ``by - length`` or
the start of a booking minus ``length``, or the lead limit. Candidates are whole
minutes (rounded towards the inside of the free interval), which people can type
back (but ``by - length`` itself, so that no time before the deadline is lost).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from math import inf

from labq.models.job import Job
from labq.models.node import Node
from labq.models.reservation import DeadlineWindows, Reservation, Window
from labq.scheduler.booking import (UNMANAGED_HORIZON_S, WEEK_S, BookingLimits, _Lab, _over_limits,
                                    _still_running_until, week_of)


def windows_by(request: Reservation, length: float, by: float, nodes: list[Node], reservations: list[Reservation],
               jobs: list[Job], *, now: float, limits: BookingLimits = BookingLimits(),
               exempt: bool = False) -> DeadlineWindows:
    """The earliest and the latest window of ``length`` seconds for ``request`` (its GPUs, node and filters;
    its own window is ignored) that start now or later and end by ``by``."""
    lab = _Lab(nodes, reservations, jobs, now, skip=None)
    last_start = by - length  # not rounded: a deadline of "in 6h" is not a whole minute, and no minute is lost
    lead = now + limits.max_lead_s if limits.max_lead_s is not None and not exempt else inf
    last_start = min(last_start, lead)
    if last_start < now:
        return DeadlineWindows(None, None)

    def fits(start: float) -> bool:
        window = replace(request, start=start, end=start + length)
        if not exempt and _over_limits(window, reservations, now, limits):
            return False
        return lab.fits(request, start, start + length, request.gpus)

    lefts, rights = _edges(lab, jobs, length, now, last_start, limits, exempt)
    earliest = next((s for s in sorted(lefts) if now <= s <= last_start and fits(s)), None)
    if earliest is None:
        return DeadlineWindows(None, None)
    latest = next(s for s in sorted(rights, reverse=True) if earliest <= s <= last_start and
                  (s == earliest or fits(s)))
    return DeadlineWindows(Window(earliest, earliest + length), Window(latest, latest + length))


def _edges(lab: _Lab, jobs: Iterable[Job], length: float, now: float, last_start: float, limits: BookingLimits,
           exempt: bool) -> tuple[set[float], set[float]]:
    """Where free intervals of starts may begin (``lefts``) and end (``rights``)."""
    lefts, rights = {now, _minute_up(now + UNMANAGED_HORIZON_S)}, {last_start}
    for entries in lab.booked.values():
        for b_start, b_end, _, _ in entries:
            lefts.add(_minute_up(b_end))
            rights.add(_minute_down(b_start - length))
    for job in jobs:
        if job.state.holds_gpus and not job.spec.preemptible:
            end = _still_running_until(job, now)
            if end < inf:
                lefts.add(_minute_up(end))
    if limits.max_gpu_hours_per_week is not None and not exempt:
        monday = week_of(now) + WEEK_S
        while monday <= last_start:  # a week's quota renews on Monday
            lefts.add(monday)
            rights.add(monday - 60)
            monday += WEEK_S
    rights.update(s for s in lefts if s <= last_start)  # a free interval may be a single instant
    return lefts, rights


def _minute_up(t: float) -> float:
    return -(-t // 60) * 60


def _minute_down(t: float) -> float:
    return t // 60 * 60
