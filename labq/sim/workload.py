"""A generated workload of a typical small lab, for ``labq sim`` when no trace fits the question.

A handful of users submit more in working hours than at night and on weekends (a non-homogeneous
Poisson process, drawn by thinning), mostly normal jobs with some low-priority scavenger sweeps, some
high and rare urgent ones, mostly on one or two GPUs. In the last week one or two users face a
deadline: they book a reservation a day or more ahead, submit more, and run high-priority jobs in it.

Everything comes from one ``random.Random(seed)``: the same arguments give the same workload on every
machine, and the clock starts on a Monday so weekdays mean what they say.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

from labq.models.priority import PriorityClass
from labq.sim.model import TraceJob, TraceReservation, Workload
from labq.sim.traces import to_jsonl

HOUR = 3600.0
DAY = 24 * HOUR
EPOCH = 1767571200.0
"""Monday 2026-01-05 00:00 UTC: virtual time 0 of every generated workload."""

NAMES = ("ana", "ben", "chen", "dara", "eli", "fay", "gus", "hana", "ivo", "jun", "kai", "lea",
         "mo", "nia", "omar", "pia", "raj", "sol", "tao", "uma", "vik", "wen", "yara", "zoe")

LOW, NORMAL, HIGH, URGENT = (int(c) for c in PriorityClass)
#: How often each class is submitted: an ordinary week, and a user's deadline week.
CLASS_MIX = {LOW: 0.18, NORMAL: 0.68, HIGH: 0.12, URGENT: 0.02}
DEADLINE_CLASS_MIX = {LOW: 0.08, NORMAL: 0.52, HIGH: 0.38, URGENT: 0.02}
#: The share of each class that may be preempted: scavenger work always, urgent work seldom (~80% overall).
PREEMPTIBLE_SHARE = {LOW: 1.0, NORMAL: 0.85, HIGH: 0.65, URGENT: 0.3}
#: Median run time by class, in seconds: sweeps run long, urgent fixes are short.
MEDIAN_DURATION = {LOW: 3 * HOUR, NORMAL: HOUR, HIGH: HOUR, URGENT: 20 * 60.0}
DURATION_SIGMA = 1.5  #: of the log-normal run time: minutes to a day
MIN_DURATION, MAX_DURATION = 120.0, DAY
#: GPUs a job asks for, and how often: mostly one or two.
SIZE_MIX = {1: 0.56, 2: 0.22, 4: 0.12, 8: 0.10}
TIME_LIMIT_SHARE = 0.3  #: jobs that set a time limit (always above their run time)
DEADLINE_BOOST = 2.5  #: how much more a user submits in their deadline week
DEADLINE_RESERVATION_FILL = (0.6, 0.9)  #: the share of a reservation's GPU-hours its jobs ask for


def generate(*, seed: int = 0, days: int = 14, users: int = 6, gpus: int = 32, load: float = 0.8,
             deadline_week: bool = True) -> Workload:
    """``days`` of a lab of ``users`` sharing ``gpus`` GPUs, offering about ``load`` times their capacity.

    The offered load is the jobs' GPU-seconds over ``gpus * days`` days; run times are scaled at
    the end so it lands within a percent or so of ``load`` whatever the draw."""
    _check(days=days, users=users, gpus=gpus, load=load)
    rng = random.Random(seed)
    names = user_names(users)
    period = days * DAY
    weights = {name: rng.lognormvariate(0.0, 0.5) for name in names}
    deadline_users: list[str] = []
    reservations: list[TraceReservation] = []
    if deadline_week and days >= 7:
        deadline_users = rng.sample(names, 1 if users == 1 else rng.choice((1, 2)))
        reservations = _book_deadline_reservations(rng, deadline_users, names, days, gpus)
    reserved = [job for r in reservations for job in _reservation_jobs(rng, r)]
    target = load * gpus * period
    sizes = {g: p for g, p in SIZE_MIX.items() if g <= gpus}
    rate = _base_rate(target - _gpu_seconds(reserved), weights, deadline_users, days, sizes)
    ordinary = [job for name in names
                for job in _user_jobs(rng, name, rate * weights[name], name in deadline_users, days, sizes)]
    ordinary = _scaled(ordinary, target - _gpu_seconds(reserved))
    ordinary = [_with_time_limit(rng, job) for job in ordinary]
    jobs = sorted(ordinary + reserved, key=lambda job: job["submit"])
    source = f"generated: seed {seed}, {days} days, {users} users, {gpus} GPUs, load {load:g}"
    return Workload(tuple(TraceJob(id=i, **job) for i, job in enumerate(jobs, 1)), tuple(reservations),
                    EPOCH, source)


def user_names(count: int) -> list[str]:
    """``ana``, ``ben``, ``chen``, ...; past the list, ``ana2``, ``ben2``, ..."""
    return [NAMES[i % len(NAMES)] + (str(i // len(NAMES) + 1) if i >= len(NAMES) else "") for i in range(count)]


def submission_rate(t: float) -> float:
    """How busy submitting the lab is at virtual time ``t``, from 1.0 (a weekday 9–19) down to 0.06
    (a weekend night); virtual 0 is a Monday midnight."""
    day, hour = divmod(int(t // HOUR) % (7 * 24), 24)
    if day >= 5:
        return 0.25 if 10 <= hour < 20 else 0.06
    if 9 <= hour < 19:
        return 1.0
    if 7 <= hour < 9 or 19 <= hour < 23:
        return 0.4
    return 0.1


def offered_load(workload: Workload, gpus: int, seconds: float) -> float:
    """The GPU-seconds the jobs ask for over what ``gpus`` GPUs give in ``seconds``."""
    return sum(job.gpus * job.duration for job in workload.jobs) / (gpus * seconds)


def write_jsonl(workload: Workload, path: str | Path) -> Path:
    """Writes the workload as JSON lines that ``traces.load_trace`` reads back unchanged; returns the path."""
    path = Path(path)
    path.write_text(to_jsonl(workload), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------- ordinary jobs


def _user_jobs(rng: random.Random, user: str, rate: float, has_deadline: bool, days: int,
               sizes: dict[int, float]) -> list[dict]:
    """One user's jobs: arrivals at ``rate * submission_rate(t)`` a second (more in their deadline
    week), drawn by thinning a homogeneous process at the peak rate."""
    period, week_start = days * DAY, (days - 7) * DAY
    peak = rate * (DEADLINE_BOOST if has_deadline else 1.0)
    jobs: list[dict] = []
    t = 0.0
    while peak > 0:
        t += rng.expovariate(peak)
        if t >= period:
            break
        in_deadline_week = has_deadline and t >= week_start
        boost = DEADLINE_BOOST if in_deadline_week else 1.0
        if rng.random() * peak < rate * boost * submission_rate(t):
            jobs.append(_ordinary_job(rng, user, float(int(t)), in_deadline_week, sizes))
    return jobs


def _ordinary_job(rng: random.Random, user: str, submit: float, in_deadline_week: bool,
                  sizes: dict[int, float]) -> dict:
    priority = _pick(rng, DEADLINE_CLASS_MIX if in_deadline_week else CLASS_MIX)
    duration = math.exp(rng.gauss(math.log(MEDIAN_DURATION[priority]), DURATION_SIGMA))
    return {
        "submit": submit,
        "duration": min(max(duration, MIN_DURATION), MAX_DURATION),
        "gpus": _pick(rng, sizes) if priority != URGENT else rng.choice([g for g in (1, 2) if g in sizes]),
        "user": user,
        "priority": priority,
        "preemptible": rng.random() < PREEMPTIBLE_SHARE[priority],
    }


def _with_time_limit(rng: random.Random, job: dict) -> dict:
    """Some users set a time limit: their run time with headroom, rounded up to the half hour."""
    if job.get("reservation") is None and rng.random() < TIME_LIMIT_SHARE:
        return {**job, "time_limit_s": math.ceil(job["duration"] * rng.uniform(1.2, 3.0) / 1800) * 1800.0}
    return job


def _base_rate(target_gpu_s: float, weights: dict[str, float], deadline_users: list[str], days: int,
               sizes: dict[int, float]) -> float:
    """Submissions a second at rate 1.0 for a user of weight 1, so the expected GPU-seconds meet the target."""
    hours = [submission_rate(h * HOUR) for h in range(int(days * 24))]
    week_start = max(0, (days - 7) * 24)
    ordinary = sum(hours) * HOUR
    deadline = ordinary + (DEADLINE_BOOST - 1) * sum(hours[week_start:]) * HOUR
    busy = sum(w * (deadline if name in deadline_users else ordinary) for name, w in weights.items())
    mean_gpus = sum(g * p for g, p in sizes.items()) / sum(sizes.values())
    mean_duration = sum(p * _clipped_lognormal_mean(MEDIAN_DURATION[c]) for c, p in CLASS_MIX.items())
    return max(target_gpu_s, 0.0) / (busy * mean_gpus * mean_duration)


def _clipped_lognormal_mean(median: float) -> float:
    """E[min(max(X, MIN_DURATION), MAX_DURATION)] for log-normal X: so the first draw is already close."""
    mu, s = math.log(median), DURATION_SIGMA

    def cdf(x: float) -> float:
        return 0.5 * (1 + math.erf(x / math.sqrt(2)))

    lo, hi = (math.log(MIN_DURATION) - mu) / s, (math.log(MAX_DURATION) - mu) / s
    middle = math.exp(mu + s * s / 2) * (cdf(hi - s) - cdf(lo - s))
    return MIN_DURATION * cdf(lo) + middle + MAX_DURATION * (1 - cdf(hi))


def _scaled(jobs: list[dict], target_gpu_s: float) -> list[dict]:
    """Run times scaled so the jobs offer ``target_gpu_s``, then whole seconds. A few rounds, because
    jobs held at a day by the clip cannot take their share of a scale-up."""
    durations = [job["duration"] for job in jobs]
    for _ in range(4):
        offered = sum(job["gpus"] * d for job, d in zip(jobs, durations))
        if offered <= 0:
            break
        factor = max(target_gpu_s, 0.0) / offered
        durations = [min(max(d * factor, 60.0), MAX_DURATION) for d in durations]
    return [{**job, "duration": float(round(d))} for job, d in zip(jobs, durations)]


# -------------------------------------------------------------------------------------- deadline week


def _book_deadline_reservations(rng: random.Random, owners: list[str], names: list[str], days: int,
                                gpus: int) -> list[TraceReservation]:
    """For each deadline user, 4–8 GPUs (at most half the lab) for 24–48 h from a weekday morning of
    the last week, booked one to three days ahead; windows never overlap, so both always fit."""
    booked: list[TraceReservation] = []
    for owner in owners:
        hours = rng.choice((24, 30, 36, 42, 48))
        starts = [d * DAY + 9 * HOUR for d in range(max(days - 7, 1), days)
                  if d % 7 < 5 and d * DAY + 9 * HOUR + hours * HOUR <= days * DAY]
        starts = [s for s in starts if all(s + hours * HOUR <= r.start or r.end <= s for r in booked)]
        if not starts:
            continue
        start = rng.choice(starts)
        ahead = rng.uniform(1.0, min(3.0, start / DAY))
        others = [n for n in names if n != owner]
        users = (rng.choice(others),) if others and rng.random() < 0.5 else ()
        booked.append(TraceReservation(
            name=f"{owner}-deadline", user=owner, gpus=min(rng.choice((4, 6, 8)), max(1, gpus // 2)),
            start=start, end=start + hours * HOUR, booked=math.floor((start - ahead * DAY) / 60) * 60.0,
            users=users,
        ))
    return booked


def _reservation_jobs(rng: random.Random, reservation: TraceReservation) -> list[dict]:
    """High-priority jobs submitted in the reservation's window by its users, sized to fit it and to end
    by its end, until they ask for 60–90% of its GPU-hours."""
    r = reservation
    target = rng.uniform(*DEADLINE_RESERVATION_FILL) * r.gpus * (r.end - r.start)
    sizes = {g: p for g, p in {1: 0.35, 2: 0.3, 4: 0.25, 8: 0.1}.items() if g <= r.gpus} or {r.gpus: 1.0}
    jobs: list[dict] = []
    while _gpu_seconds(jobs) < target:
        submit = float(int(rng.uniform(r.start, r.end - HOUR)))
        duration = math.exp(rng.gauss(math.log(2 * HOUR), 0.8))
        jobs.append({
            "submit": submit,
            "duration": float(round(min(max(duration, 600.0), r.end - submit))),
            "gpus": _pick(rng, sizes),
            "user": r.users[0] if r.users and rng.random() < 0.3 else r.user,
            "priority": HIGH,
            "preemptible": rng.random() < 0.3,
            "reservation": r.name,
        })
    return jobs


# ------------------------------------------------------------------------------------------- helpers


def _pick(rng: random.Random, mix: dict[int, float]) -> int:
    return rng.choices(list(mix), weights=list(mix.values()))[0]


def _gpu_seconds(jobs: list[dict]) -> float:
    return sum(job["gpus"] * job["duration"] for job in jobs)


def _check(*, days: int, users: int, gpus: int, load: float) -> None:
    if not isinstance(days, int) or days < 1:
        raise ValueError(f"days must be a whole number of 1 or more, not {days!r}")
    if users < 1:
        raise ValueError(f"users must be 1 or more, not {users!r}")
    if gpus < 1:
        raise ValueError(f"gpus must be 1 or more, not {gpus!r}")
    if not 0 < load < math.inf:
        raise ValueError(f"load must be above 0, not {load!r}")
