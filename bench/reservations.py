"""Benchmark of reservations: how fast a booking is answered, and what a booking costs the lab in idle GPUs.

What it measures
  * Booking answer time, against a real ``labq leader`` started as a process in a temp folder
    with a temp HOME (``Lab`` of ``latency.py``, without an agent: ``[agents] lease = "1h"``, so
    the nodes stay up without syncing). 10 nodes ``n00``..``n09``, each a simulated ``sim:dgx1``
    (8 GPUs), are registered through ``POST /v1/agents/register`` with the join token; they never
    sync, so the jobs placed on them stay ``starting`` and hold their GPUs. The lab is filled
    through the API: 80 1-GPU jobs (they take every GPU), then 1,000 queued jobs (1/2/4/8 GPUs,
    classes low/normal/high, 30% with a time limit, 10% not preemptible), by 4 users, 8 threads.
    Then 100 reservations over the next 14 days (1-8 GPUs, 1-48 h, random starts) are booked as
    the admin (exempt from limits), refused tries skipped (their count is reported). Then 200
    bookings by a user (not an admin, so the limits are checked), one at a time
    (``random.Random(--seed)``): windows in the next 14 days, 1-48 h, 1-8 GPUs; half ``dry_run``,
    half real, each real one that is accepted cancelled right after (not timed), so 100
    reservations stand throughout. Each request is timed from the ``Client.reserve`` call to its
    answer: median, p95, p99 and max, for all, for accepted and for refused answers (a refusal
    computes alternatives: the slow path), and split by whether the request before it booked
    (its booking and the cancel each woke a scheduling pass, which holds the leader's lock).
    Then, in this process, on the same state (the jobs and reservations read back through the
    API): the pure ``book(...)`` on the same 200 requests, and the scheduling pass
    (``schedule(...)``) that every booking, cancel and submit wakes in the leader. With
    ``--profile``, or when the p95 misses its goal, both are profiled (cProfile) and the
    functions with the largest share of their time are printed to stderr.
  * Idle GPU-hours on reserved GPUs before the start, in simulated busy days, with the pure
    scheduler and no processes: a discrete-event simulation on a virtual clock. 4 ``sim:dgx1``
    nodes (32 GPUs); Poisson arrivals from 00:00 to 24:00 offering 1.5x the capacity; 1/2/4/8-GPU
    jobs (mostly 1-2), durations log-normal between 10 min and 8 h, classes low/normal/high, 80%
    preemptible, 30% with a time limit of 1-1.5x their duration; grace 120 s; a job checkpoints in
    uniform(5, 60) s after its signal and resumes where it saved. At 08:00 a reservation of 8 GPUs
    for 14:00-20:00 is booked for user "paper" with the pure ``book(...)`` (exempt; retried every
    10 minutes if refused) and passed to every ``schedule(...)`` from then on; at 14:00 an 8-GPU
    job of "paper" naming it is submitted (normal class, preemptible, 5 h 55 min of work). A pass
    runs at every event (arrival, end, a victim's exit, the drain time start - grace, the start)
    and every 60 s, with ``Policy(min_runtime_s=0)``; decisions are applied with
    ``labq.models.transitions`` (a start runs at once; a victim exits min(its checkpoint time,
    grace) after the decision and is requeued). Measured, from the booking to the start:
    GPU-seconds with no job on each pinned GPU (GPU-hours a day, minutes and seconds per GPU,
    split into before and within the last grace), beside the idle time per GPU of the other GPUs
    over the same hours. A busy lab leaves GPUs idle anyway (a big job waits for a whole node, a
    held set waits for its last GPU), so each day is simulated a second time without the
    reservation, and the idle time of the same GPUs over the same hours in that run is the
    baseline: what the reservation costs is the difference (``sim_extra_idle_per_gpu_s``); the
    jobs displaced at booking and drained by the scheduler; how late the paper job started. One day
    is one sample and days differ a lot, so ``--days`` (5) days are
    simulated (seeds SEED, SEED+1, ...) and the figures pooled over them, with the idle seconds
    per GPU of each day listed. The wall time and pass count are reported.
  * Running work displaced by bookings in a busy month, against the best pin, and the idle time of
    reserved GPUs before their start: ``bench/reservations_month.py`` (its docstring says how).

Goals (from the issues): booking answer p95 within 100 ms (10 nodes x 8 GPUs, 1,000 queued
jobs, 100 reservations); idle time on the reserved GPUs before the start below one grace period
(120 s) per GPU, held to the idle time the reservation adds over the same day without it, and
for the month's GPUs drained for a booking, from the drained job leaving to the start; the
month's pins displace exactly what the brute-force best pins would (ratio 1, no booking above).
Timings are reported, never asserted. Consistency is checked (every booking pinned its GPUs on one
node clear of the other reservations, every refusal has a reason, 100
reservations stand at the end; in each simulated day: no GPU given twice, the paper job starts
at 14:00, no job outside the reservation on its GPUs while the paper job waits, the paper job
is never preempted while it runs): a violation is printed after the figures and exits with status 1.
Progress goes to stderr.

Run:  .venv/bin/python bench/reservations.py [--json] [--keep] [--seed 1] [--days 5] [--month-days 30]
                                            [--quick] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import heapq
import json
import math
import os
import pstats
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from figures import print_figures, profile_lines
from reservations_month import MONTH_BOOKINGS_PER_DAY, MONTH_DAYS, part_month
from latency import Lab, ms, say, summary
from labq.client import Client
from labq.models.transitions import exited, placed, preempting, running
from labq.models.job import Job, JobSpec, JobState
from labq.models.node import Node
from labq.models.priority import PriorityClass
from labq.models.reservation import Reservation
from labq.protocol.agents import Registration, encode_registration
from labq.protocol.codec import decode_job, decode_reservation
from labq.protocol.errors import ApiError
from labq.scheduler.booking import BookingLimits, book
from labq.scheduler.cycle import schedule
from labq.scheduler.policy import Policy
from labq.topologies import parse_sim_spec
from labq.wire import Connection

HOUR, DAY = 3600.0, 86400.0
INVENTORY = "sim:dgx1"
NODES, FILL, QUEUED, RESERVATIONS, SAMPLES = 10, 80, 1000, 100, 200
HORIZON_S = 14 * DAY
MAX_LEAD_S, MAX_DURATION_S = 60 * DAY, 7 * DAY  # the leader's limits below (max_duration: the default)
USERS = ("alice", "bob", "carol", "dave")
BOOKER = "alice"
BOOK_P95_GOAL_MS = 100.0
CONFIG = ('[leader]\nlisten = "127.0.0.1:0"\n[scheduling]\nmin_runtime = "0s"\nclass_grants = {high = ["*"]}\n[jobs]\nmax_grace = "4m"\nallow_root = true\n'
          '[reservations]\nmax_lead_time = "60d"\n'
          '[agents]\nlease = "1h"\nfence_after = "2h"\nrequeue_after = "3h"\n')
# the simulated day
SIM_NODES, GRACE_S, LOAD, PASS_EVERY_S, DAYS = 4, 120.0, 1.5, 60.0, 5
BOOK_AT, RES_START, RES_END, RES_GPUS = 8 * HOUR, 14 * HOUR, 20 * HOUR, 8
PAPER_WORK_S = 6 * HOUR - 5 * 60
SIZES, SIZE_WEIGHTS = (1, 2, 4, 8), (0.45, 0.30, 0.15, 0.10)
CLASSES = ((PriorityClass.LOW, 0.3), (PriorityClass.NORMAL, 0.5), (PriorityClass.HIGH, 0.2))


def dgx1(name: str) -> Node:
    inv = parse_sim_spec(INVENTORY)
    return Node(name, inv.gpus(name), inv.topology, simulated=True)


# -- part 1: booking answer time against a leader ------------------------------------------------


class LeaderOnly(Lab):
    """``Lab`` with the leader alone: nodes join by registering, and never sync."""

    def start_leader(self) -> Client:
        (self.root / "leader.toml").write_text(CONFIG)
        self.serve_leader()
        say(f"leader {self.url} up in {self.root}")
        return self.client

    def register(self, node: Node) -> None:
        token_file = self.data / "join-token"
        self.wait(token_file.exists, "the join token")
        body = json.dumps(encode_registration(Registration(node, None, "bench"))).encode()
        host, port = re.match(r"http://([^:/]+):(\d+)", self.url).groups()
        conn = Connection(host, int(port), 30)
        try:
            conn.request("POST", "/v1/agents/register", body=body,
                         headers={"Authorization": f"Bearer {token_file.read_text().strip()}",
                                  "Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        if resp.status != 200:
            raise ApiError.from_json(resp.status, json.loads(data or b"null"))


def pick_class(rng: random.Random) -> str:
    return rng.choices([c.name.lower() for c, _ in CLASSES], [w for _, w in CLASSES])[0]


def fill_lab(lab: LeaderOnly, rng: random.Random, clients: dict[str, Client], problems: list[str]) -> dict:
    """80 1-GPU jobs on every GPU, then 1,000 queued; returns figures."""
    admin = lab.client

    def submit(who_body: tuple[str, dict]) -> int | None:
        who, body = who_body
        try:
            return clients[who].submit(body)["id"]
        except ApiError as err:
            problems.append(f"a submit failed: {err}")
            return None

    def body(gpus: int, tag: str) -> dict:
        b = {"command": ["sleep", "3600"], "gpus": gpus, "priority": pick_class(rng), "name": tag,
             "workdir": str(lab.root)}
        if rng.random() < 0.3:
            b["time_limit_s"] = rng.choice((1, 2, 4, 8, 12, 24)) * HOUR
        return b

    fill = [(rng.choice(USERS), body(1, "fill") | {"priority": "normal"}) for _ in range(FILL)]
    queued = []
    for _ in range(QUEUED):
        b = body(rng.choices(SIZES, (0.4, 0.3, 0.2, 0.1))[0], "queued")
        who = rng.choice(USERS)
        if rng.random() < 0.1:  # only admins may submit jobs that cannot be preempted
            b["preemptible"], who = False, "admin"
        queued.append((who, b))
    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        fill_ids = list(pool.map(submit, fill))
    lab.wait(lambda: len(admin.jobs(all=True, states=["starting"])) >= FILL, "the fill jobs to be placed", 60)
    fill_s = time.perf_counter() - start
    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        queued_ids = list(pool.map(submit, queued))
    queued_s = time.perf_counter() - start
    if None in fill_ids or None in queued_ids:
        problems.append(f"{(fill_ids + queued_ids).count(None)} submits got no job id")
    states: dict[str, int] = {}
    for job in admin.jobs(all=True):
        states[job["state"]] = states.get(job["state"], 0) + 1
    if states.get("starting") != FILL or states.get("queued") != QUEUED:
        problems.append(f"after the fill, jobs by state are {states}, not {FILL} starting and {QUEUED} queued")
    return {"fill_submit_and_place_s": fill_s, "queued_submits_per_s": QUEUED / queued_s}


def window(rng: random.Random, now: float) -> tuple[float, float, int]:
    start = now + rng.uniform(300.0, HORIZON_S)
    return start, start + rng.uniform(1.0, 48.0) * HOUR, rng.randint(1, 8)


def book_setup(admin: Client, rng: random.Random, problems: list[str]) -> tuple[dict, list[dict]]:
    booked, tries = [], 0
    start = time.perf_counter()
    while len(booked) < RESERVATIONS and tries < 20 * RESERVATIONS:
        tries += 1
        s, e, gpus = window(rng, time.time())
        answer = admin.reserve({"gpus": gpus, "start": s, "end": e, "name": f"r{len(booked):03d}",
                                "owner": rng.choice(USERS)})
        if answer["booked"]:
            booked.append(answer["reservation"])
    if len(booked) < RESERVATIONS:
        problems.append(f"only {len(booked)} of {RESERVATIONS} reservations were booked in {tries} tries")
    return {"setup_reservations": len(booked), "setup_reservation_tries": tries,
            "setup_booking_s": time.perf_counter() - start}, booked


def clashes(pinned: dict, others: list[dict]) -> list[str]:
    mine = set(pinned["gpu_indices"])
    return [o["name"] for o in others if o["name"] != pinned["name"] and o["node"] == pinned["node"]
            and mine & set(o["gpu_indices"]) and o["start"] < pinned["end"] and pinned["start"] < o["end"]]


def bench_booking(user: Client, rng: random.Random, standing: list[dict], problems: list[str]) -> list[dict]:
    modes = [True] * (SAMPLES // 2) + [False] * (SAMPLES - SAMPLES // 2)
    rng.shuffle(modes)
    rows = []
    for i, dry in enumerate(modes):
        s, e, gpus = window(rng, time.time())
        body = {"gpus": gpus, "start": s, "end": e, "dry_run": dry} | ({} if dry else {"name": f"t{i:03d}"})
        t0 = time.perf_counter()
        try:
            answer = user.reserve(body)
        except ApiError as err:
            problems.append(f"booking {i} failed: {err}")
            continue
        took = time.perf_counter() - t0
        rows.append({"i": i, "dry_run": dry, "gpus": gpus, "start": s, "end": e, "ms": ms(took),
                     "accepted": answer["accepted"], "booked": answer["booked"],
                     "alternatives": len(answer["alternatives"]), "displaced": len(answer["displaced"])})
        if answer["accepted"]:
            r = answer["reservation"]
            if r is None or len(r["gpu_indices"]) != gpus or not r["node"]:
                problems.append(f"booking {i} was accepted without {gpus} pinned GPUs: {r}")
            elif bad := clashes(r, standing):
                problems.append(f"booking {i} pinned GPUs {r['gpu_indices']} on {r['node']} that {bad} hold then")
            if answer["booked"] == dry:
                problems.append(f"booking {i} (dry_run {dry}) came back booked={answer['booked']}")
        elif not answer["reasons"]:
            problems.append(f"booking {i} was refused without a reason")
        if answer["booked"]:
            user.cancel_reservation(answer["reservation"]["name"])
        if (i + 1) % 50 == 0:
            say(f"  {i + 1} bookings, last {ms(took):.0f} ms")
    return rows


def pure_replay(admin: Client, rows: list[dict], nodes: list[Node], profile: bool) -> tuple[dict, list[str]]:
    """The same requests to ``book(...)`` in this process, on the leader's state read back; and the pass."""
    jobs = [decode_job(d) for d in admin.jobs(all=True)]
    standing = [decode_reservation(d) for d in admin.reservations()]
    limits = BookingLimits(None, MAX_LEAD_S, MAX_DURATION_S)
    now = time.time()

    def request(row: dict) -> Reservation:
        return Reservation(f"t{row['i']:03d}", BOOKER, row["gpus"], max(row["start"], now), row["end"])

    book(request(rows[0]), nodes, standing, jobs, now=now, limits=limits)  # warm the placement tables
    agree = 0
    for row in rows:
        t0 = time.perf_counter()
        answer = book(request(row), nodes, standing, jobs, now=now, limits=limits)
        row["pure_ms"] = ms(time.perf_counter() - t0)
        agree += answer.accepted == row["accepted"]
    fig = summary("pure_book_all", [r["pure_ms"] for r in rows], tails=False)
    fig |= summary("pure_book_refused", [r["pure_ms"] for r in rows if not r["accepted"]], tails=False)
    fig["pure_book_same_verdict_as_leader"] = agree
    passes = []
    policy = Policy(min_runtime_s=0.0)
    for _ in range(5):
        t0 = time.perf_counter()
        schedule(jobs, nodes, now=now, reservations=standing, policy=policy)
        passes.append(ms(time.perf_counter() - t0))
    fig |= {"leader_pass_median_ms": statistics.median(passes), "leader_pass_max_ms": max(passes)}
    passes = []
    for _ in range(5):
        t0 = time.perf_counter()
        schedule(jobs, nodes, now=now, policy=policy)
        passes.append(ms(time.perf_counter() - t0))
    fig["leader_pass_without_reservations_median_ms"] = statistics.median(passes)
    lines = []
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        for row in rows:
            book(request(row), nodes, standing, jobs, now=now, limits=limits)
        prof.disable()
        lines = profile_lines(pstats.Stats(prof).stats, f"book() on the same {len(rows)} requests")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(3):
            schedule(jobs, nodes, now=now, reservations=standing, policy=policy)
        prof.disable()
        lines += profile_lines(pstats.Stats(prof).stats, "3 scheduling passes on the same state")
    return fig, lines


def part_booking(args, root: Path, problems: list[str], raw: dict) -> tuple[dict, list[str]]:
    rng = random.Random(args.seed)
    lab = LeaderOnly(root)
    fig: dict = {}
    lines: list[str] = []
    try:
        admin = lab.start_leader()
        nodes = [dgx1(f"n{i:02d}") for i in range(NODES)]
        for node in nodes:
            lab.register(node)
        up = [n for n in admin.nodes() if n["health"] == "up"]
        if len(up) != NODES:
            problems.append(f"{len(up)} of {NODES} registered nodes are up")
        clients = {"admin": admin} | {name: Client(lab.url, admin.add_user(name)[1]) for name in USERS}
        say(f"{NODES} nodes registered; submitting {FILL} fill jobs, then {QUEUED} queued jobs")
        fig |= {"nodes": NODES, "gpus": NODES * 8, "fill_jobs": FILL, "queued_jobs": QUEUED}
        fig |= fill_lab(lab, rng, clients, problems)
        say(f"booking {RESERVATIONS} reservations over the next {HORIZON_S / DAY:g} days as the admin")
        part, standing = book_setup(admin, rng, problems)
        fig |= part
        for r in standing:
            if bad := clashes(r, standing):
                problems.append(f"setup reservation {r['name']} shares GPUs and time with {bad}")
        say(f"timing {SAMPLES} bookings by {BOOKER} (half dry runs)")
        rows = bench_booking(clients[BOOKER], rng, standing, problems)
        raw["raw_bookings"] = rows
        left = admin.reservations()
        if len(left) != RESERVATIONS or {r["name"] for r in left} != {r["name"] for r in standing}:
            problems.append(f"{len(left)} reservations stand at the end, not the {RESERVATIONS} of the setup")
        if rows:
            fig |= summary("book_all", [r["ms"] for r in rows])
            fig |= summary("book_accepted", [r["ms"] for r in rows if r["accepted"]])
            fig |= summary("book_refused", [r["ms"] for r in rows if not r["accepted"]])
            fig["book_refused_with_alternatives_n"] = sum(1 for r in rows if not r["accepted"] and r["alternatives"])
            fig["book_dry_run_median_ms"] = statistics.median(r["ms"] for r in rows if r["dry_run"])
            fig["book_real_median_ms"] = statistics.median(r["ms"] for r in rows if not r["dry_run"])
            # the previous request booked (and its reservation was cancelled): both woke a scheduling pass
            woke = [b["ms"] for a, b in zip(rows, rows[1:]) if a["booked"]]
            quiet = [b for a, b in zip(rows, rows[1:]) if not a["booked"]]
            fig |= summary("book_after_booked_and_cancelled", woke, tails=False)
            fig |= summary("book_after_quiet", [r["ms"] for r in quiet], tails=False)
            for dry, name in ((True, "dry_run"), (False, "real")):
                values = [r["ms"] for r in quiet if r["dry_run"] == dry]
                if values:
                    fig[f"book_{name}_after_quiet_median_ms"] = statistics.median(values)
            missed = fig["book_all_p95_ms"] > BOOK_P95_GOAL_MS
            say("the same requests to book() in this process" + (", profiled" if args.profile or missed else ""))
            part, lines = pure_replay(admin, rows, nodes, args.profile or missed)
            fig |= part
    finally:
        lab.close()
    return fig, lines


# -- part 2: simulated busy days -------------------------------------------------------------------


def duration(rng: random.Random) -> float:
    return min(8 * HOUR, max(600.0, math.exp(rng.gauss(math.log(HOUR), 1.0))))


def workload(rng: random.Random) -> list[tuple[float, JobSpec, float, float]]:
    """(arrival, spec, work seconds, checkpoint seconds), Poisson arrivals offering LOAD x the capacity."""
    probe = random.Random(0)
    mean_gpu_s = statistics.fmean(probe.choices(SIZES, SIZE_WEIGHTS)[0] * duration(probe) for _ in range(20000))
    rate = LOAD * SIM_NODES * 8 / mean_gpu_s
    out, t, n = [], 0.0, 0
    while (t := t + rng.expovariate(rate)) < DAY:
        work = duration(rng)
        priority = rng.choices([int(c) for c, _ in CLASSES], [w for _, w in CLASSES])[0]
        limit = work * rng.uniform(1.0, 1.5) if rng.random() < 0.3 else None
        spec = JobSpec(user=f"u{rng.randrange(6)}", command=("train",), gpus=rng.choices(SIZES, SIZE_WEIGHTS)[0],
                       name=f"j{n}", priority=priority, preemptible=rng.random() < 0.8, time_limit_s=limit,
                       grace_s=GRACE_S)
        out.append((t, spec, work, rng.uniform(5.0, 60.0)))
        n += 1
    return out


class Day:
    """The simulated lab: unfinished jobs, the GPUs' busy intervals, and an event heap on a virtual clock."""

    def __init__(self, seed: int, booking: bool = True) -> None:
        self.booking = booking  #: False: the same day without the reservation, as the baseline
        self.nodes = [dgx1(f"s{i}") for i in range(SIM_NODES)]
        self.arrivals = workload(random.Random(seed))
        self.jobs: dict[int, Job] = {}
        self.work: dict[int, float] = {}  # seconds of work left, as of the current attempt's start
        self.ckpt: dict[int, float] = {}
        self.owner: dict[tuple[str, int], tuple[int, float]] = {}  # GPU -> (job, since)
        self.busy: dict[tuple[str, int], list[tuple[float, float, int]]] = {
            (n.name, g.index): [] for n in self.nodes for g in n.gpus}
        self.heap: list = []
        self.seq = 0
        self.reservation: Reservation | None = None
        self.booked_at: float | None = None
        self.displaced_at_booking: list[int] = []
        self.booking_tries = 0
        self.paper_id: int | None = None
        self.paper_started: float | None = None
        self.paper_preempted: list[str] = []
        self.drained: list[int] = []
        self.preemptions = 0
        self.completed = 0
        self.passes: list[float] = []
        self.queue_sizes: list[int] = []
        self.problems: list[str] = []
        self.waiting_intruders: set[int] = set()
        self.next_id = 1

    def at(self, t: float, kind: str, *data) -> None:
        heapq.heappush(self.heap, (t, self.seq, kind, data))
        self.seq += 1

    def run(self) -> None:
        for t, spec, work, ckpt in self.arrivals:
            self.at(t, "arrive", spec, work, ckpt)
        if self.booking:
            self.at(BOOK_AT, "book")
            self.at(RES_START - GRACE_S, "mark")  # the drain time
            self.at(RES_START, "paper")
        tick = 0.0
        while True:
            t = min(self.heap[0][0] if self.heap else math.inf, tick)
            if t >= DAY:
                break
            while self.heap and self.heap[0][0] <= t:
                _, _, kind, data = heapq.heappop(self.heap)
                getattr(self, f"on_{kind}")(t, *data)
            if t == tick:
                tick += PASS_EVERY_S
            self.step(t)
        for gpu, (job_id, since) in self.owner.items():  # close what still runs at the end of the day
            self.busy[gpu].append((since, DAY, job_id))

    # events
    def on_arrive(self, t: float, spec: JobSpec, work: float, ckpt: float) -> None:
        job = Job(self.next_id, spec, submitted_at=t)
        self.next_id += 1
        self.jobs[job.id], self.work[job.id], self.ckpt[job.id] = job, work, ckpt

    def on_mark(self, t: float) -> None:
        pass

    def on_book(self, t: float) -> None:
        self.booking_tries += 1
        want = Reservation("paper", "paper", RES_GPUS, RES_START, RES_END)
        answer = book(want, self.nodes, [], list(self.jobs.values()), now=t, exempt=True)
        if answer.accepted:
            self.reservation = answer.reservation
            self.booked_at = t
            self.displaced_at_booking = [d.job_id for d in answer.displaced]
        elif t + 600 < RES_START - GRACE_S:
            self.at(t + 600, "book")
        else:
            self.problems.append(f"the paper reservation was never accepted: {'; '.join(answer.reasons)}")

    def on_paper(self, t: float) -> None:
        if self.reservation is None:
            return
        spec = JobSpec(user="paper", command=("paper",), gpus=RES_GPUS, name="paper", reservation="paper",
                       grace_s=GRACE_S, time_limit_s=RES_END - RES_START)
        self.paper_id = self.next_id
        self.on_arrive(t, spec, PAPER_WORK_S, 30.0)

    def on_end(self, t: float, job_id: int, attempt: int) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.attempt != attempt or job.state is not JobState.RUNNING:
            return  # preempted meanwhile: its exit event ends it
        self.release(job, t)
        del self.jobs[job_id]
        self.completed += 1

    def on_exit(self, t: float, job_id: int, attempt: int) -> None:
        job = self.jobs[job_id]
        if job.attempt != attempt or job.state is not JobState.PREEMPTING:
            self.problems.append(f"job {job_id} attempt {attempt} exits in state {job.state.value}")
            return
        self.release(job, t)
        self.jobs[job_id] = exited(job, 0, t)  # saved on the signal: requeued, resumes where it saved

    def release(self, job: Job, t: float) -> None:
        for a in job.placement.allocations:
            for g in a.gpu_indices:
                held, since = self.owner.pop((a.node, g))
                if held != job.id:
                    self.problems.append(f"GPU {g} of {a.node} was held by job {held}, not {job.id}")
                self.busy[(a.node, g)].append((since, t, job.id))

    # a scheduling pass and its decisions
    def step(self, t: float) -> None:
        reservations = [self.reservation] if self.reservation else []
        t0 = time.perf_counter()
        d = schedule(list(self.jobs.values()), self.nodes, now=t, reservations=reservations,
                     policy=Policy(min_runtime_s=0.0))
        self.passes.append(time.perf_counter() - t0)
        self.queue_sizes.append(sum(1 for j in self.jobs.values() if j.state is JobState.QUEUED))
        for p in d.preemptions:
            job = self.jobs[p.job_id]
            if job.id == self.paper_id and self.reservation.active(t):
                self.paper_preempted.append(f"at {clock(t)} for job {p.for_job}")
            self.jobs[job.id] = preempting(job, p.for_job, p.reservation)
            self.work[job.id] -= t - job.started_at  # it saves what it did until the signal
            self.preemptions += 1
            if p.reservation == "paper":
                self.drained.append(job.id)
            self.at(t + min(self.ckpt[job.id], job.spec.grace_s), "exit", job.id, job.attempt)
        for s in d.starts:
            job = running(placed(self.jobs[s.job_id], s.placement), t)
            self.jobs[job.id] = job
            for a in s.placement.allocations:
                for g in a.gpu_indices:
                    if (a.node, g) in self.owner:
                        self.problems.append(f"at {clock(t)} job {job.id} was given GPU {g} of {a.node}, "
                                             f"held by job {self.owner[(a.node, g)][0]}")
                    self.owner[(a.node, g)] = (job.id, t)
            if job.id == self.paper_id and self.paper_started is None:
                self.paper_started = t
            self.at(t + self.work[job.id], "end", job.id, job.attempt)
        r = self.reservation
        if r is not None and self.paper_id is not None and self.paper_started is None and r.active(t):
            for g in r.gpu_indices:  # the paper job waits: who is on its GPUs?
                held = self.owner.get((r.node, g))
                if held is not None:
                    self.waiting_intruders.add(held[0])

    def idle(self, gpu: tuple[str, int], a: float, b: float) -> float:
        busy = sum(max(0.0, min(e, b) - max(s, a)) for s, e, _ in self.busy[gpu])
        return (b - a) - busy


def clock(t: float) -> str:
    return f"{int(t // 3600):02d}:{int(t % 3600 // 60):02d}:{t % 60:04.1f}"


def one_day(seed: int, problems: list[str]) -> tuple[dict, dict]:
    """One simulated day: its figures, and its raw data."""
    start = time.perf_counter()
    day = Day(seed)
    day.run()
    wall = time.perf_counter() - start
    what = f"day of seed {seed}"
    problems.extend(f"{what}: {p}" for p in day.problems)
    capacity = SIM_NODES * 8
    offered = sum(spec.gpus * work for _, spec, work, _ in day.arrivals) / 3600
    used = sum(e - s for spans in day.busy.values() for s, e, _ in spans) / 3600
    fig: dict = {"seed": seed, "jobs_arrived": len(day.arrivals), "offered_load": offered / (capacity * DAY / 3600),
                 "utilization": used / (capacity * DAY / 3600), "queue_median": statistics.median(day.queue_sizes),
                 "jobs_completed": day.completed, "preemptions": day.preemptions, "wall_s": wall,
                 "passes": day.passes, "booking_tries": day.booking_tries}
    r = day.reservation
    if r is None:
        return fig, {"seed": seed, "booked": False}
    reserved = [(r.node, g) for g in r.gpu_indices]
    others = [gpu for gpu in day.busy if gpu not in reserved]
    booked = day.booked_at
    baseline = Day(seed, booking=False)  # the same arrivals, no reservation: what those GPUs idle anyway
    baseline.run()
    fig["wall_s"] = time.perf_counter() - start
    without = [baseline.idle(g, booked, RES_START) for g in reserved]
    before = [day.idle(g, booked, RES_START - GRACE_S) for g in reserved]
    last = [day.idle(g, RES_START - GRACE_S, RES_START) for g in reserved]
    borrowers = {j for g in reserved for s, e, j in day.busy[g] if s < RES_START and e > booked and j != day.paper_id}
    late = (day.paper_started - RES_START) if day.paper_started is not None else None
    fig |= {"booked_at_h": booked / 3600, "displaced_at_booking": len(day.displaced_at_booking),
            "drained": len(set(day.drained)), "borrowers": len(borrowers),
            "idle_before_drain": before, "idle_last_grace": last, "idle": [a + b for a, b in zip(before, last)],
            "idle_without": without, "extra_idle": [a + b - c for a, b, c in zip(before, last, without)],
            "other_idle": [day.idle(g, booked, RES_START) for g in others], "late_s": late,
            "paper_preemptions": len(day.paper_preempted)}
    if late is None:
        problems.append(f"{what}: the paper job never started")
    elif late > 0:
        problems.append(f"{what}: the paper job started {late:.0f} s after its reservation's start")
    if day.waiting_intruders:
        problems.append(f"{what}: jobs {sorted(day.waiting_intruders)} were on the reserved GPUs while the paper "
                        "job waited")
    if day.paper_preempted:
        problems.append(f"{what}: the paper job was preempted {len(day.paper_preempted)} times in its own "
                        f"reservation, first {day.paper_preempted[0]}, last {day.paper_preempted[-1]}")
    raw = {"seed": seed, "booked": True, "reserved_gpus": [f"{n}:{g}" for n, g in reserved],
           "booked_at_s": booked, "idle_before_drain_s": before, "idle_last_grace_s": last,
           "displaced_at_booking": day.displaced_at_booking, "drained": sorted(set(day.drained)),
           "borrowers": sorted(borrowers), "paper_started_s": day.paper_started,
           "paper_preempted": day.paper_preempted,
           "reserved_busy": {f"{n}:{g}": day.busy[(n, g)] for n, g in reserved}}
    return fig, raw


def part_days(seed: int, days: int, problems: list[str], raw: dict) -> dict:
    """``days`` simulated days (seeds ``seed``, ``seed + 1``, ...): figures pooled over them."""
    runs = []
    raw["raw_days"] = []
    for k in range(days):
        say(f"  simulated day {k + 1} of {days} (seed {seed + k})")
        fig, day_raw = one_day(seed + k, problems)
        runs.append(fig)
        raw["raw_days"].append(day_raw)
    booked = [f for f in runs if "idle" in f]
    passes = [p for f in runs for p in f["passes"]]
    fig = {"sim_days": days, "sim_gpus": SIM_NODES * 8,
           "sim_jobs_arrived_per_day": statistics.fmean(f["jobs_arrived"] for f in runs),
           "sim_offered_load": statistics.fmean(f["offered_load"] for f in runs),
           "sim_utilization": statistics.fmean(f["utilization"] for f in runs),
           "sim_queue_median": statistics.median(f["queue_median"] for f in runs),
           "sim_preemptions_per_day": statistics.fmean(f["preemptions"] for f in runs),
           "sim_days_booked": len(booked), "sim_booking_tries": sum(f["booking_tries"] for f in runs)}
    if booked:
        idle = [s for f in booked for s in f["idle"]]
        late = [f["late_s"] for f in booked]
        fig |= {"sim_booked_at_h_max": max(f["booked_at_h"] for f in booked),
                "sim_displaced_at_booking": sum(f["displaced_at_booking"] for f in booked),
                "sim_jobs_drained": sum(f["drained"] for f in booked),
                "sim_jobs_on_reserved_gpus_before_start": sum(f["borrowers"] for f in booked),
                "sim_reserved_idle_gpu_h_per_day": sum(idle) / 3600 / len(booked),
                "sim_reserved_idle_per_gpu_min": statistics.fmean(idle) / 60,
                "sim_reserved_idle_per_gpu_s": statistics.fmean(idle),
                "sim_same_gpus_idle_without_reservation_per_gpu_s": statistics.fmean(
                    s for f in booked for s in f["idle_without"]),
                "sim_extra_idle_per_gpu_s": statistics.fmean(s for f in booked for s in f["extra_idle"]),
                "sim_extra_idle_per_gpu_s_by_day": ", ".join(
                    f"{statistics.fmean(f['extra_idle']):.0f}" for f in booked),
                "sim_reserved_idle_per_gpu_s_by_day": ", ".join(f"{statistics.fmean(f['idle']):.0f}" for f in booked),
                "sim_reserved_idle_max_gpu_s": max(idle),
                "sim_reserved_idle_before_drain_per_gpu_s": statistics.fmean(
                    s for f in booked for s in f["idle_before_drain"]),
                "sim_reserved_idle_last_grace_per_gpu_s": statistics.fmean(
                    s for f in booked for s in f["idle_last_grace"]),
                "sim_other_idle_per_gpu_s": statistics.fmean(s for f in booked for s in f["other_idle"]),
                "sim_other_idle_per_gpu_s_by_day": ", ".join(
                    f"{statistics.fmean(f['other_idle']):.0f}" for f in booked),
                "sim_paper_start_late_max_s": max(late) if None not in late else "never",
                "sim_paper_preemptions": sum(f["paper_preemptions"] for f in booked)}
    return fig | {"sim_wall_s": sum(f["wall_s"] for f in runs), "sim_passes": len(passes),
                  "sim_pass_median_ms": ms(statistics.median(passes)), "sim_pass_max_ms": ms(max(passes))}


# -- the whole ---------------------------------------------------------------------------------------


def goals(fig: dict) -> list[tuple[str, str, float, bool]]:
    """(figure, the goal as shown, its limit, whether the figure must stay strictly below it)."""
    found = [("book_all_p95_ms", f"<= {BOOK_P95_GOAL_MS:g} ms", BOOK_P95_GOAL_MS, False),
             ("pure_book_all_p95_ms", f"<= {BOOK_P95_GOAL_MS:g} ms", BOOK_P95_GOAL_MS, False),
             ("sim_extra_idle_per_gpu_s", f"< {GRACE_S:g} s (a grace)", GRACE_S, True),
             ("month_displaced_over_best", "1 (the best pin)", 1.0, False),
             ("month_bookings_above_best", "0", 0, False),
             ("month_drained_idle_per_gpu_s", f"< {GRACE_S:g} s (a grace)", GRACE_S, True)]
    return [g for g in found if isinstance(fig.get(g[0]), (int, float))]


def met(fig: dict, name: str, limit: float, strict: bool) -> bool:
    return fig[name] < limit if strict else fig[name] <= limit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures and the raw samples as one JSON object")
    parser.add_argument("--keep", action="store_true", help="leave the temp folder (logs, data) in place")
    parser.add_argument("--seed", type=int, default=1, help="seed of the workloads and requests (default 1)")
    parser.add_argument("--days", type=int, default=DAYS,
                        help=f"simulated days, seeds SEED, SEED+1, ... (default {DAYS})")
    parser.add_argument("--month-days", type=int, default=MONTH_DAYS,
                        help=f"days of the simulated month of bookings (default {MONTH_DAYS})")
    parser.add_argument("--quick", action="store_true", help="2 simulated days and a 10-day month (about half the time)")
    parser.add_argument("--profile", action="store_true", help="profile book() even if the p95 goal is met")
    args = parser.parse_args(argv)
    if args.quick:
        args.days, args.month_days = min(args.days, 2), min(args.month_days, 10)
    if args.days < 1 or args.month_days < 2:
        parser.error("--days must be at least 1 and --month-days at least 2")
    began = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="labq-bench-reservations-"))
    fig: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    raw: dict = {}
    problems: list[str] = []
    profile: list[str] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("reservations benchmark: stopped by SIGTERM"))  # run the finally
    try:
        part, profile = part_booking(args, root, problems, raw)
        fig |= part
    except (RuntimeError, ApiError) as err:  # a wait gave up, or the leader failed: report what was measured
        problems.append(f"booking part: {err}")
    finally:
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    say(f"simulating {args.days} busy days on 4 x sim:dgx1, each with an 8-GPU reservation 14:00-20:00 booked "
        "at 08:00")
    fig |= part_days(args.seed, args.days, problems, raw)
    say(f"simulating a busy month ({args.month_days} days) on labq.sim with {MONTH_BOOKINGS_PER_DAY} bookings a day")
    fig |= part_month(args.seed, args.month_days, problems, raw)
    fig["wall_s"] = time.perf_counter() - began
    fig["goals_met"] = {name: met(fig, name, limit, strict) for name, _, limit, strict in goals(fig)}
    fig["problems"] = problems
    if args.json:
        print(json.dumps(fig | raw | {"profile": profile}))
    else:
        targets = {name: (shown, met(fig, name, limit, strict)) for name, shown, limit, strict in goals(fig)}
        print_figures(f"labq reservations benchmark (Python {fig['python']}, {fig['cpus']} CPUs, seed {args.seed}, "
                      f"{fig['wall_s']:.0f} s)", fig, targets,
                      skip=("python", "cpus", "goals_met", "wall_s", "problems"), digits=1)
    if profile:
        say("\n".join(profile))
    if problems:  # after the figures, which help to find the cause
        say("reservations benchmark: inconsistent:\n  " + "\n  ".join(problems))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
