"""A job submitted into a reservation must be able to run in it: a table of what can never fit, and why."""

from __future__ import annotations

import pytest

from labq.models import JobSpec, Reservation
from labq.scheduler import why_never_fits_reservation
from tests.conftest import NOW, make_node

H = 3600.0
WS = make_node("ws1", "sim:ws-4x3090")
QUICK = Reservation("quick", "alice", 2, NOW + 120, NOW + 120 + 10 * 60, node="ws1", gpu_indices=(0, 1))


def spec(**kw) -> JobSpec:
    return JobSpec(**{"user": "alice", "command": ("train",), "reservation": "quick", **kw})


@pytest.mark.parametrize(("job", "words"), [
    (spec(gpus=3), "asks for 3 GPUs but reservation 'quick' holds 2; ask for --gpus 2 or fewer"),
    (spec(gpus=2, nodes=2), "holds GPUs on one node; this job asks for 2 nodes"),
    (spec(gpus=1, gpu_model="a100"), "0 of its GPUs match this job's model and memory filter"),
    (spec(gpus=1, min_gpu_memory_mib=40 * 1024), "holds NVIDIA GeForce RTX 3090 24 GiB"),
    (spec(gpus=1, time_limit_s=H), "its time limit (1h00m) runs past the end of reservation 'quick'"),
])
def test_a_job_that_can_never_fit_its_reservation_is_told_why_and_what_would(job, words):
    why = why_never_fits_reservation(job, QUICK, WS, now=NOW, stops_at_end=True)
    assert why is not None and words in why


def test_what_fits_is_let_through():
    for job in (spec(gpus=2), spec(gpus=1, gpu_model="3090"), spec(gpus=2, time_limit_s=10 * 60),
                spec(gpus=2, time_limit_s=None)):
        assert why_never_fits_reservation(job, QUICK, WS, now=NOW, stops_at_end=True) is None


def test_the_time_left_counts_from_now_once_the_booking_runs_and_only_when_the_lab_stops_jobs_at_its_end():
    running_since = NOW + 120 + 5 * 60  # 5 of its 10 minutes are left
    why = why_never_fits_reservation(spec(time_limit_s=6 * 60), QUICK, WS, now=running_since, stops_at_end=True)
    assert "ask for --time 5m or less" in why
    assert why_never_fits_reservation(spec(time_limit_s=H), QUICK, WS, now=NOW, stops_at_end=False) is None


def test_an_ended_booking_takes_no_jobs():
    why = why_never_fits_reservation(spec(), QUICK, WS, now=QUICK.end, stops_at_end=True)
    assert "reservation 'quick' has ended" in why
