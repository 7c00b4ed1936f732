"""Reservations end to end, with real processes: draining by checkpoint, backfill, lending, refusals, re-pinning."""

from __future__ import annotations

import json
import re
import shlex
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import Lab

pytestmark = pytest.mark.timeout(150)

TRAIN = str(Path(__file__).resolve().parents[2] / "examples" / "checkpointing" / "train.py")
LOOP = (sys.executable, TRAIN, "--steps", "1000000", "--step-time", "0.05")


def reserve(lab: Lab, *args: str) -> dict:
    out = lab.labq("reserve", *args, "--json", check=False)
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)


def gpus_of(job: dict) -> set[int]:
    return {g for a in job["placement"]["allocations"] for g in a["gpu_indices"]}


def test_a_reservation_drains_its_gpus_by_checkpoint_and_its_job_starts_on_time(running_lab):
    lab = running_lab  # 4 GPUs; test grace 2 s
    low = [lab.submit(*LOOP, **{"class": "low"}) for _ in range(4)]
    for job in low:
        lab.wait_state(job, "running")
    answer = reserve(lab, "--gpus", "2", "--start", "in 8s", "--for", "10m", "--name", "paper")
    assert answer["accepted"] and answer["booked"]
    booked = answer["reservation"]
    pinned = set(booked["gpu_indices"])
    displaced = {d["job_id"] for d in answer["displaced"]}
    assert displaced == {j for j in low if gpus_of(lab.job(j)) & pinned} and len(displaced) == 2
    member = lab.submit("sleep", "60", gpus=2, reservation="paper")
    assert lab.job(member)["state"] == "queued"

    running = lab.wait_state(member, "running", timeout=60)
    assert gpus_of(running) == pinned
    assert booked["start"] <= running["started_at"] <= booked["start"] + 3.0  # on time
    for job in displaced:
        first = lab.job(job)["attempts"][0]
        assert (first["ended"], first["drained_for"]) == ("checkpointed", "paper")
        assert first["ended_at"] <= booked["start"] + 0.5  # the GPUs were free by the start
        assert "checkpointed at step" in lab.labq("logs", str(job), "--attempt", "1").stdout
    for job in set(low) - displaced:
        assert lab.job(job)["attempt"] == 1 and lab.job(job)["state"] == "running"
    assert "reservation paper" in lab.labq("show", str(sorted(displaced)[0])).stdout
    for job in (*low, member):
        lab.labq("cancel", str(job))


def test_jobs_ending_before_the_start_are_backfilled_and_others_wait_with_the_reason(running_lab):
    lab = running_lab
    assert reserve(lab, "--gpus", "4", "--start", "in 10s", "--for", "10m", "--name", "deadline")["accepted"]
    short = lab.submit("sleep", "1", time="6s", no_preempt=True)
    endless = lab.submit("sleep", "60", no_preempt=True)
    assert lab.wait_state(short, "succeeded", timeout=30)["exit_code"] == 0
    why = lab.labq("why", str(endless)).stdout
    assert "deadline, starts in" in why and lab.job(endless)["state"] == "queued"
    lab.labq("cancel", str(endless))


def test_idle_reserved_gpus_are_lent_and_taken_back_and_its_jobs_stop_at_its_end(tmp_path):
    lab = Lab(tmp_path)
    try:
        lab.start_leader()
        lab.start_agent(gpus="sim:flat:2")
        assert reserve(lab, "--gpus", "2", "--start", "now", "--for", "25s", "--name", "now")["accepted"]
        borrower = lab.submit(*LOOP, gpus=2, **{"class": "urgent"})  # not a member; even urgent gives way
        lab.wait_state(borrower, "running")
        member = lab.submit("sh", "-c", "trap 'echo stopping; exit 0' USR1; while true; do sleep 0.1; done",
                            gpus=2, reservation="now", checkpoint_signal="SIGUSR1", **{"class": "low"})
        lab.wait_state(member, "running", timeout=30)
        back = lab.job(borrower)
        assert back["attempts"][0]["ended"] == "checkpointed" and back["attempts"][0]["preempted_for"] == member
        assert back["state"] == "queued"
        ended = lab.wait_state(member, "timeout", timeout=60)  # at the reservation's end, like a time limit
        assert "stopping" in lab.labq("logs", str(member)).stdout
        assert ended["attempts"][0]["ended"] == "checkpointed"
        lab.wait_state(borrower, "running", timeout=30)  # the GPUs are everyone's again
        lab.labq("cancel", str(borrower))
    finally:
        lab.close()


def test_an_overlapping_booking_is_refused_with_an_alternative_that_works(running_lab):
    lab = running_lab
    assert reserve(lab, "--gpus", "4", "--start", "in 2h", "--for", "3h", "--name", "first")["accepted"]
    out = lab.labq("reserve", "--gpus", "4", "--start", "in 3h", "--for", "2h", "--name", "second", check=False)
    assert out.returncode == 1
    assert "overlapping bookings: first" in out.stdout
    suggested = re.findall(r": (labq reserve .*)$", out.stdout, re.M)
    assert suggested, out.stdout
    again = lab.labq(*shlex.split(suggested[0])[1:], "--name", "second")
    assert again.stdout.startswith("booked second")
    listed = {r["name"]: r for r in lab.api("reservations")}
    first, second = listed["first"], listed["second"]
    assert set(first["gpu_indices"]) & set(second["gpu_indices"])
    assert second["start"] >= first["end"] or second["end"] <= first["start"]
    assert lab.api("reservations")  # and it lists as JSON
    lab.labq("reserve", "cancel", "first")
    assert [r["name"] for r in lab.api("reservations")] == ["second"]


def test_a_reservation_on_a_lost_node_is_repinned_and_its_owner_sees_it(lab):
    lab.start_leader()
    lab.start_agent("ws1", "sim:flat:2")
    lab.start_agent("ws2", "sim:flat:2")
    booked = reserve(lab, "--gpus", "2", "--start", "in 1h", "--for", "1h", "--name", "moving")["reservation"]
    gone = booked["node"]
    lab.kill(lab.agents[gone], signal.SIGKILL)
    other = "ws2" if gone == "ws1" else "ws1"

    def moved() -> bool:
        return {r["name"]: r for r in lab.api("reservations")}["moving"]["node"] == other

    lab.wait(moved, "the reservation to move", timeout=30)
    assert f"re-pinned from {gone} (lost) to {other}" in lab.labq("reservations").stdout
    time.sleep(0.1)


def test_a_job_that_can_never_fit_its_reservation_is_refused_at_submit_with_what_would(running_lab):
    lab = running_lab
    lab.labq("reserve", "--gpus", "1", "--start", "in 2m", "--for", "10m", "--name", "quick")
    for gpus in ("2", "3"):
        out = lab.labq("submit", "--reservation", "quick", "--gpus", gpus, "--", "true", check=False)
        assert out.returncode == 2, out.stderr  # the request can never be met: bad input, as for the lab
        assert (f"can never run in reservation 'quick': asks for {gpus} GPUs but reservation 'quick' holds 1; "
                "ask for --gpus 1 or fewer") in out.stderr
    out = lab.labq("submit", "--reservation", "quick", "--time", "1h", "--", "true", check=False)
    assert out.returncode == 2 and "runs past the end of reservation 'quick'" in out.stderr
    assert lab.api("ls", "--all") == []  # nothing refused was queued
    assert lab.submit("true", reservation="quick", time="5m") > 0  # what fits is taken


def test_jobs_still_waiting_when_a_booking_ends_go_to_the_normal_queue_or_are_cancelled_as_asked(running_lab):
    lab = running_lab
    assert reserve(lab, "--gpus", "1", "--start", "now", "--for", "10s", "--name", "quick")["accepted"]
    blocker = lab.submit("sleep", "14")  # an ordinary job that outlives the booking
    waiting = lab.submit("sleep", "1", reservation="quick", after=blocker)
    doomed = lab.submit("sleep", "1", reservation="quick", after=blocker, after_reservation="cancel")
    assert f"waits for job {blocker}" in lab.labq("why", str(waiting)).stdout

    cancelled = lab.wait_state(doomed, "cancelled", timeout=30)
    assert "reservation 'quick' ended before it started (--after-reservation cancel)" in cancelled["note"]
    released = lab.job(waiting)
    assert released["state"] == "queued" and released["spec"]["reservation"] is None
    assert "reservation 'quick' ended; released to the normal queue" in released["note"]
    why = lab.labq("why", str(waiting)).stdout
    assert "does not exist" not in why and "released to the normal queue" in why
    assert lab.wait_state(waiting, "succeeded", timeout=40)["exit_code"] == 0  # ran on the lab's GPUs

    assert "quick" not in lab.labq("reservations").stdout
    everything = json.loads(lab.labq("reservations", "--all", "--json").stdout)
    assert [r["name"] for r in everything] == ["quick"]
    assert re.search(r"quick .* ended", lab.labq("reservations", "--all").stdout)


def test_cancelling_a_booking_releases_its_waiting_jobs_at_once(running_lab):
    lab = running_lab
    assert reserve(lab, "--gpus", "2", "--start", "in 5m", "--for", "10m", "--name", "later")["accepted"]
    job = lab.submit("sleep", "30", gpus=2, reservation="later")
    assert "reservation 'later' starts in" in lab.labq("why", str(job)).stdout

    assert "cancelled later" in lab.labq("reserve", "cancel", "later").stdout
    running = lab.wait_state(job, "running", timeout=20)  # the GPUs were free all along
    assert "reservation 'later' was cancelled; released to the normal queue" in running["note"]
    assert "later" not in lab.labq("reservations").stdout
    assert re.search(r"later .* cancelled", lab.labq("reservations", "--all").stdout)
    again = lab.labq("reserve", "cancel", "later", check=False)
    assert again.returncode != 0 and "already cancelled" in again.stderr
    refused = lab.labq("submit", "--reservation", "later", "--", "true", check=False)
    assert refused.returncode == 2 and "reservation 'later' is cancelled" in refused.stderr
    lab.labq("cancel", str(job))


def test_booking_by_need_answers_the_earliest_and_latest_start_and_books_the_one_picked(running_lab):
    lab = running_lab  # 4 GPUs
    assert reserve(lab, "--gpus", "4", "--start", "in 3h", "--for", "1h", "--name", "first")["accepted"]
    first = json.loads(lab.labq("reservations", "--json").stdout)[0]

    asked = reserve(lab, "--gpus", "4", "--gpu-hours", "8", "--by", "in 6h", "--dry-run")  # 2 h of 4 GPUs
    assert asked["accepted"] and not asked["booked"]
    earliest, latest = asked["deadline"]["earliest"], asked["deadline"]["latest"]
    assert earliest["end"] <= first["start"] and earliest["end"] - earliest["start"] == 2 * 3600
    assert latest["start"] >= first["end"] and latest["end"] - latest["start"] == 2 * 3600
    assert asked["reservation"]["start"] == earliest["start"]  # the default pick

    text = lab.labq("reserve", "--gpus", "4", "--gpu-hours", "8", "--by", "in 6h", "--start", "latest",
                    "--name", "late").stdout
    assert text.startswith("booked late: 4 GPU(s)") and "--start earliest books the earliest window" in text
    late = {r["name"]: r for r in json.loads(lab.labq("reservations", "--json").stdout)}["late"]
    assert late["end"] - late["start"] == 2 * 3600 and late["start"] >= first["end"]
    assert late["start"] == pytest.approx(latest["start"], abs=5)  # "in 6h" read a second or two later

    refused = lab.labq("reserve", "--gpus", "4", "--for", "5h", "--by", "in 6h", check=False)
    assert refused.returncode == 1
    assert "cannot book it: no window of 4 GPU(s) for 5 h ends by the deadline" in refused.stdout
    assert "nothing of that size ends by the deadline" in refused.stdout
