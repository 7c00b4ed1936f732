"""Which GPUs a booking pins, end to end: a leader, an agent on a 4x3090 workstation, the CLI as a process.

A booking takes an idle GPU before a running job's, and when it must displace a job, it takes the one
that loses the least work and says so: the job, its GPUs and the GPU-minutes it is expected to lose.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.e2e.conftest import Lab

pytestmark = pytest.mark.timeout(120)


def reserve(lab: Lab, *args: str) -> dict:
    out = lab.labq("reserve", *args, "--json")
    return json.loads(out.stdout)


def gpus_of(job: dict) -> set[int]:
    return {g for a in job["placement"]["allocations"] for g in a["gpu_indices"]}


def test_a_booking_takes_the_idle_gpu_then_the_job_that_loses_least_and_names_its_cost(running_lab):
    lab = running_lab  # sim:ws-4x3090: NVLink pairs 0,1 and 2,3; test grace 2 s
    pair = lab.submit("sleep", "300", gpus=2)
    pair_gpus = gpus_of(lab.wait_state(pair, "running"))
    single = lab.submit("sleep", "300")
    single_gpus = gpus_of(lab.wait_state(single, "running"))
    idle = {0, 1, 2, 3} - pair_gpus - single_gpus
    assert len(pair_gpus) == 2 and len(single_gpus) == 1 and len(idle) == 1

    first = reserve(lab, "--gpus", "1", "--start", "in 2m", "--for", "10m", "--name", "first")
    assert first["accepted"] and first["booked"]
    assert set(first["reservation"]["gpu_indices"]) == idle  # the running pair keeps its GPUs
    assert first["displaced"] == []

    # Every GPU is now busy or booked: the 1-GPU job started last and holds one GPU, so it loses least.
    second = reserve(lab, "--gpus", "1", "--start", "in 2m", "--for", "10m", "--name", "second")
    assert set(second["reservation"]["gpu_indices"]) == single_gpus
    job = lab.job(single)
    [displaced] = second["displaced"]
    expected = round(1 * (displaced["signal_at"] - job["started_at"] + job["spec"]["grace_s"]))
    assert (displaced["job_id"], displaced["gpus"], displaced["gpu_seconds_lost"]) == (single, 1, expected)
    assert displaced["signal_at"] == second["reservation"]["start"] - job["spec"]["grace_s"]

    # The same question for people (a dry run): the job, its GPUs and about what it loses.
    text = lab.labq("reserve", "--gpus", "1", "--start", "in 2m", "--for", "10m", "--dry-run").stdout
    assert text.startswith("would book (dry run)"), text
    named = re.search(r"^    job (\d+) \((.+)\) at .*: (\d) GPUs?, about (\d+) GPU-min lost$", text, re.M)
    assert named, text
    job_id, user, gpus, minutes = named.groups()
    pair_job = lab.job(pair)
    assert (int(job_id), user, int(gpus)) == (pair, pair_job["spec"]["user"], 2)  # the only GPUs left
    assert abs(int(minutes) - 2 * 2) <= 1  # 2 GPUs x about the 2 minutes to the start
    for job_id in (pair, single):
        lab.labq("cancel", str(job_id))
