"""The generated lab workload: the same seed gives the same jobs, and they look like a lab's —
the load asked for, working hours, small jobs, a deadline week with reservations."""

from __future__ import annotations

import statistics
import time
from collections import Counter

import pytest

from labq.models.priority import PriorityClass
from labq.sim.traces import load_trace
from labq.sim.workload import DAY, EPOCH, HOUR, generate, offered_load, submission_rate, user_names, write_jsonl

SEEDS = range(4)


@pytest.fixture(scope="module")
def labs():
    """Four two-week labs of six users on 32 GPUs, one per seed."""
    return {seed: generate(seed=seed) for seed in SEEDS}


def test_the_same_seed_gives_the_same_workload():
    assert generate(seed=7) == generate(seed=7)
    assert generate(seed=7).jobs != generate(seed=8).jobs
    assert generate(seed=7, days=8, gpus=8) == generate(seed=7, days=8, gpus=8)


def test_the_clock_starts_on_a_monday_midnight(labs):
    monday = time.gmtime(EPOCH)
    assert (monday.tm_wday, monday.tm_hour, monday.tm_min) == (0, 0, 0)
    assert all(w.epoch == EPOCH for w in labs.values())
    assert labs[0].source == "generated: seed 0, 14 days, 6 users, 32 GPUs, load 0.8"


def test_jobs_are_numbered_in_submit_order_within_the_period(labs):
    for w in labs.values():
        assert [j.id for j in w.jobs] == list(range(1, len(w.jobs) + 1))
        assert all(a.submit <= b.submit for a, b in zip(w.jobs, w.jobs[1:]))
        assert w.jobs[0].submit >= 0 and w.jobs[-1].submit < 14 * DAY


@pytest.mark.parametrize(("gpus", "load", "users"), [(32, 0.8, 6), (8, 0.4, 3), (64, 1.3, 10)])
def test_the_offered_load_is_the_one_asked_for(labs, gpus, load, users):
    for seed in SEEDS:
        w = labs[seed] if (gpus, load, users) == (32, 0.8, 6) else generate(seed=seed, gpus=gpus, load=load,
                                                                             users=users)
        assert offered_load(w, gpus, 14 * DAY) == pytest.approx(load, rel=0.03)


def test_users_are_named_and_each_submits(labs):
    assert user_names(3) == ["ana", "ben", "chen"]
    assert user_names(26)[-2:] == ["ana2", "ben2"]
    for w in labs.values():
        assert {j.user for j in w.jobs} == set(user_names(6))


def test_more_jobs_in_working_hours_than_at_night_and_on_weekdays_than_weekends(labs):
    for w in labs.values():
        hours = Counter(int(j.submit // HOUR) % 24 for j in w.jobs)
        working, night = sum(hours[h] for h in range(9, 19)), sum(hours[h] for h in range(0, 6))
        assert working > 5 * night
        weekday = Counter(int(j.submit // DAY) % 7 for j in w.jobs)
        assert min(weekday[d] for d in range(5)) > max(weekday[5], weekday[6])
    assert submission_rate(10 * HOUR) == 1.0 and submission_rate(3 * HOUR) < 0.2
    assert submission_rate(5 * DAY + 12 * HOUR) < 0.5  # Saturday noon


def test_mostly_small_normal_preemptible_jobs_of_minutes_to_a_day(labs):
    jobs = [j for w in labs.values() for j in w.jobs]
    sizes = Counter(j.gpus for j in jobs)
    assert set(sizes) == {1, 2, 4, 8}
    assert (sizes[1] + sizes[2]) / len(jobs) > 0.7
    classes = Counter(j.priority for j in jobs)
    assert classes.most_common(1)[0][0] == PriorityClass.NORMAL
    assert classes[PriorityClass.LOW] > classes[PriorityClass.URGENT] > 0
    assert classes[PriorityClass.HIGH] > classes[PriorityClass.URGENT]
    assert 0.7 < sum(j.preemptible for j in jobs) / len(jobs) < 0.9
    assert all(60 <= j.duration <= DAY for j in jobs)
    assert 10 * 60 < statistics.median(j.duration for j in jobs) < 4 * HOUR
    limited = [j for j in jobs if j.time_limit_s is not None]
    assert 0.15 < len(limited) / len(jobs) < 0.45
    assert all(j.time_limit_s >= j.duration for j in limited)


def test_a_small_lab_asks_for_no_more_gpus_than_it_has():
    w = generate(seed=1, gpus=4, users=2, days=10)
    assert max(j.gpus for j in w.jobs) == 4
    assert all(r.gpus <= 2 for r in w.reservations)


def test_the_deadline_week_has_booked_reservations_and_high_priority_jobs_in_them(labs):
    for w in labs.values():
        assert 1 <= len(w.reservations) <= 2
        for r in w.reservations:
            assert 7 * DAY <= r.start < r.end <= 14 * DAY
            assert 24 * HOUR <= r.end - r.start <= 48 * HOUR
            assert 4 <= r.gpus <= 8
            assert 0 <= r.booked <= r.start - DAY
            inside = [j for j in w.jobs if j.reservation == r.name]
            assert len(inside) >= 5
            assert all(j.priority == PriorityClass.HIGH for j in inside)
            assert all(r.start <= j.submit and j.submit + j.duration <= r.end for j in inside)
            assert all(j.gpus <= r.gpus and j.user in (r.user, *r.users) for j in inside)
            mine = [j for j in w.jobs if j.user == r.user and j.reservation is None]
            first_week = sum(j.submit < 7 * DAY for j in mine)
            assert len(mine) - first_week > 1.5 * first_week  # they submit more as the deadline nears
        starts = sorted((r.start, r.end) for r in w.reservations)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(starts, starts[1:]))


def test_no_deadline_week_when_not_asked_or_too_short():
    assert generate(seed=0, deadline_week=False).reservations == ()
    assert all(j.reservation is None for j in generate(seed=0, deadline_week=False).jobs)
    assert generate(seed=0, days=6).reservations == ()


@pytest.mark.parametrize(("kwargs", "what"), [
    ({"days": 0}, "days"), ({"users": 0}, "users"), ({"gpus": 0}, "gpus"), ({"load": 0}, "load"),
])
def test_bad_arguments_say_which(kwargs, what):
    with pytest.raises(ValueError, match=what):
        generate(**kwargs)


def test_written_json_lines_read_back_unchanged(labs, tmp_path):
    w = labs[2]
    path = write_jsonl(w, tmp_path / "lab.jsonl")
    back, notes = load_trace(path)
    assert (back.jobs, back.reservations, back.epoch) == (w.jobs, w.reservations, w.epoch)
    assert notes == []
    assert path.read_text().startswith("# generated: seed 2, 14 days")


def test_a_loaded_trace_also_round_trips(tmp_path):
    csv = tmp_path / "jobs.csv"
    csv.write_text("submit,duration,gpus,user,class,preemptible,time_limit,vc,reservation\n"
                   "1700000100,3600,2,ana,250,false,7200.5,a,r1\n"
                   "1700000000.25,0,1,ben,urgent,true,,,\n")
    w, _ = load_trace(csv)
    back, _ = load_trace(write_jsonl(w, tmp_path / "jobs.jsonl"))
    assert (back.jobs, back.epoch) == (w.jobs, w.epoch)
