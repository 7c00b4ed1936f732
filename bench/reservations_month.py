"""The reservations benchmark's third part: running work displaced by bookings over a busy month,
against the brute-force best pin, and how long reserved GPUs sit idle before a start.

Running work displaced by bookings in a busy month, against the best pin. labq's simulator
    (``labq.sim.engine``: the real scheduler and booking code on a virtual clock, watched by the
    ``Month`` subclass) runs ``--month-days`` (30) days of ``labq.sim.workload.generate``'s lab
    (8 users, load 1.1) on 2 ``sim:dgx1`` and 4 ``sim:ws-4x3090`` (32 GPUs, grace 120 s), with 4
    bookings a day besides the generated deadline ones: booked at random moments, 10 min to 2 days
    ahead, 1-8 GPUs for 1-8 h, with no jobs of their own. At each booking every GPU set it may
    have is enumerated by brute force (``pin_costs``, written from the rules apart from the booking
    code) and costed with ``displacement``, the one definition: each displaced job's GPUs x (its
    work since its last checkpoint when signalled + its grace); the simulator reports no
    checkpoints, so the work since the attempt started. Reported: the GPU-seconds the pins
    displaced in all, the least possible for the same bookings at the same moments, their ratio
    and the bookings above it, and the booking time in the simulator. From the same run, per
    reserved GPU of each booking that started: the seconds from its last job leaving (or from the
    booking, if no job ran on it since) to the start, split by how that job left: drained for the
    booking (signalled a grace before the start; a simulated job stops 30 s after its signal),
    ended on its own, or none since the booking (a GPU idle when booked that nothing borrowed).

Run through ``bench/reservations.py`` (``--month-days``, ``--quick``), which prints the figures.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import replace
from itertools import combinations

from latency import ms, summary
from labq.models.job import Job, JobState
from labq.models.node import Node
from labq.models.reservation import Reservation
from labq.scheduler.booking import displacement
from labq.sim.engine import SimOptions, _Simulation
from labq.sim.model import TraceReservation, Workload
from labq.sim.workload import generate, user_names
from labq.topologies import parse_sim_spec

HOUR, DAY = 3600.0, 86400.0
GRACE_S = 120.0
# the simulated month (labq.sim): 2 x sim:dgx1 and 4 x sim:ws-4x3090
MONTH_DAYS, MONTH_GPUS, MONTH_LOAD, MONTH_BOOKINGS_PER_DAY = 30, 32, 1.1, 4


def month_nodes() -> list[Node]:
    specs = [("d0", "sim:dgx1"), ("d1", "sim:dgx1"), *((f"w{i}", "sim:ws-4x3090") for i in range(4))]
    return [Node(name, (inv := parse_sim_spec(spec)).gpus(name), inv.topology, simulated=True)
            for name, spec in specs]


def month_workload(seed: int, days: int) -> Workload:
    """``generate``'s lab at MONTH_LOAD, plus MONTH_BOOKINGS_PER_DAY bookings with no jobs of their own:
    booked at random moments, 10 min to 2 days ahead, 1-8 GPUs for 1-8 h."""
    rng = random.Random(seed)
    workload = generate(seed=seed, days=days, users=8, gpus=MONTH_GPUS, load=MONTH_LOAD)
    extra = []
    for i in range(days * MONTH_BOOKINGS_PER_DAY):
        booked = rng.uniform(0.0, (days - 1) * DAY)
        start = math.ceil((booked + rng.choice((600.0, 1800.0, HOUR, 4 * HOUR, DAY, 2 * DAY))) / 60) * 60
        extra.append(TraceReservation(f"b{i:03d}", rng.choice(user_names(8)), rng.choice((1, 1, 2, 2, 4, 8)),
                                      start, start + rng.choice((1, 2, 4, 8)) * HOUR, booked=booked))
    return replace(workload, reservations=workload.reservations + tuple(extra))


def pin_costs(request: Reservation, nodes: list[Node], others: list[Reservation], jobs: list[Job],
              now: float) -> dict[tuple[str, tuple[int, ...]], tuple[bool, int]]:
    """Every GPU set the booking may pin, by brute force, with what it displaces: (any job, GPU-seconds).

    Written apart from the booking code, from its rules (the month has no filters and no GPUs busy
    outside labq): a GPU is out when an overlapping live booking holds it, or a job that cannot be
    preempted still runs on it at the start; a preemptible job still running then is displaced, at
    ``displacement``'s cost (the one definition)."""
    sets = {}
    for node in nodes:
        if not node.schedulable:
            continue
        blocked = {g for r in others if r.node == node.name and r.live(now) and r.overlaps(request.start, request.end)
                   for g in r.gpu_indices}
        on: dict[int, Job] = {}
        for job in jobs:
            until = job.expected_end() or (now + job.spec.time_limit_s if job.spec.time_limit_s else math.inf)
            if not job.state.holds_gpus or until <= request.start:
                continue
            for g in (g for a in job.placement.allocations if a.node == node.name for g in a.gpu_indices):
                if job.spec.preemptible:
                    on[g] = job
                else:
                    blocked.add(g)
        cost = {j.id: displacement(j, request.start, now).gpu_seconds_lost for j in on.values()}
        for gpus in combinations([g for g in range(node.gpu_count) if g not in blocked], request.gpus):
            victims = {on[g].id for g in gpus if g in on}
            sets[(node.name, gpus)] = (bool(victims), sum(cost[v] for v in victims))
    return sets


class Month(_Simulation):
    """labq's simulator (``labq.sim.engine``), watched: each booking's pin against the brute-force best at
    the same moment, and each GPU's busy spans, to see how long reserved GPUs sat idle before a start."""

    def __init__(self, workload: Workload, nodes: list[Node]) -> None:
        super().__init__(workload, nodes, "labq", SimOptions(grace_s=GRACE_S, stop_s=30.0), None)
        self.on_gpus: dict[int, tuple[list[tuple[str, int]], float]] = {}
        self.spans: dict[tuple[str, int], list[tuple[float, float, int]]] = {}
        self.booked: list[dict] = []
        self.drained: dict[str, set[int]] = {}  #: reservation -> the jobs preempted to free its GPUs
        self.problems: list[str] = []

    def _on_book(self, now: float, wanted: TraceReservation) -> None:
        jobs, others = list(self.jobs.values()), list(self.reservations)
        t0 = time.perf_counter()
        super()._on_book(now, wanted)
        took = time.perf_counter() - t0
        pinned = next((r for r in self.reservations if r.name == wanted.name), None)
        sets = pin_costs(Reservation(wanted.name, wanted.user, wanted.gpus, wanted.start, wanted.end), self.nodes,
                         others, jobs, now)
        best = min(sets.values(), default=None)
        got = sets.get((pinned.node, pinned.gpu_indices), "invalid") if pinned else None
        if got == "invalid" or (pinned is None) != (best is None):
            self.problems.append(f"booking {wanted.name} at {now:.0f} s: pinned {got}, the brute force found {best}")
        self.booked.append({"name": wanted.name, "at": now, "gpus": wanted.gpus, "ms": ms(took),
                            "pinned": f"{pinned.node}:{pinned.gpu_indices}" if pinned else None,
                            "cost": list(got) if isinstance(got, tuple) else None,
                            "best": list(best) if best else None})

    def _start(self, now: float, job_id: int) -> None:
        super()._start(now, job_id)
        placement = self.jobs[job_id].placement
        self.on_gpus[job_id] = ([(a.node, g) for a in placement.allocations for g in a.gpu_indices], now)

    def _on_end(self, now: float, job_id: int, attempt: int) -> None:
        job = self.jobs.get(job_id)
        if job is not None and job.attempt == attempt and job.state is JobState.RUNNING:
            self._left(job_id, now)
        super()._on_end(now, job_id, attempt)

    def _on_exit(self, now: float, job_id: int, attempt: int) -> None:
        self._left(job_id, now)
        super()._on_exit(now, job_id, attempt)

    def _left(self, job_id: int, now: float) -> None:
        gpus, since = self.on_gpus.pop(job_id)
        for gpu in gpus:
            self.spans.setdefault(gpu, []).append((since, now, job_id))

    def _preempt(self, now: float, job_id: int, for_job: int | None, reservation: str | None) -> None:
        super()._preempt(now, job_id, for_job, reservation)
        if reservation is not None:
            self.drained.setdefault(reservation, set()).add(job_id)

    def idle_before_starts(self) -> list[tuple[float, str]]:
        """Per reserved GPU of each booking that started: seconds from its last job leaving (or from the
        booking, if none left after it) to the start, and how: ``drained`` for it, ``ended`` on its own,
        or ``idle since booked`` (no job on it between the booking and the start)."""
        out = []
        still = {gpu: [(since, math.inf, j)] for j, (gpus, since) in self.on_gpus.items() for gpu in gpus}
        for r in self.reservations:
            if r.start > self.clock_now:
                continue
            for gpu in ((r.node, g) for g in r.gpu_indices):
                spans = self.spans.get(gpu, []) + still.get(gpu, [])
                stayed = [j for s, e, j in spans if s < r.start < e and self.trace[j].reservation != r.name]
                if stayed:
                    self.problems.append(f"jobs {stayed} were still on GPU {gpu} at the start of {r.name}")
                last, job = max(((e, j) for s, e, j in spans if r.created_at < e <= r.start),
                                default=(r.created_at, None))
                how = "idle since booked" if job is None else (
                    "drained" if job in self.drained.get(r.name, ()) else "ended")
                out.append((r.start - last, how))
        return out


def part_month(seed: int, days: int, problems: list[str], raw: dict) -> dict:
    """A busy month on labq's simulator: what bookings displace against the best pin, and idle GPUs before starts."""
    t0 = time.perf_counter()
    month = Month(month_workload(seed, days), month_nodes())
    month.run()
    problems.extend(f"month: {p}" for p in month.problems)
    rows = month.booked
    idle = month.idle_before_starts()
    raw["raw_month_bookings"] = rows
    raw["raw_month_idle_before_start"] = [{"idle_s": s, "how": how} for s, how in idle]
    pinned = [r for r in rows if r["cost"] is not None and r["best"] is not None]
    total, best = sum(r["cost"][1] for r in pinned), sum(r["best"][1] for r in pinned)
    fig = {"month_days": days, "month_gpus": MONTH_GPUS, "month_jobs": len(month.trace),
           "month_bookings": len(rows), "month_bookings_pinned": len(pinned),
           "month_bookings_displacing": sum(1 for r in pinned if r["cost"][0]),
           "month_displaced_gpu_s": total, "month_best_pin_displaced_gpu_s": best,
           "month_displaced_over_best": total / best if best else (1.0 if total == 0 else math.inf),
           "month_bookings_above_best": sum(1 for r in pinned if r["cost"] != r["best"])}
    fig |= summary("month_book", [r["ms"] for r in rows], tails=False)
    fig |= {"month_reserved_gpus_started": len(idle),
            "month_idle_before_start_per_gpu_s": statistics.fmean(s for s, _ in idle) if idle else 0.0,
            "month_idle_before_start_max_gpu_s": max((s for s, _ in idle), default=0.0),
            "month_idle_before_start_over_a_grace_gpus": sum(1 for s, _ in idle if s >= GRACE_S)}
    for how in ("drained", "ended", "idle since booked"):
        these = [s for s, kind in idle if kind == how]
        key = f"month_{how.replace(' ', '_')}"
        fig |= {f"{key}_gpus": len(these), f"{key}_idle_per_gpu_s": statistics.fmean(these) if these else 0.0}
    fig["month_wall_s"] = time.perf_counter() - t0
    return fig


