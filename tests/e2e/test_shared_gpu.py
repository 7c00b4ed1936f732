"""Sharing a GPU by memory end to end: real leader and agent processes on ``sim:ws-4x3090`` (24 GiB GPUs), the jobs
real processes whose simulated GPU memory their environment declares (``SIM_GPU_MEM``), as NVML would report it.

Two jobs that declare 8 GiB each share one GPU. One of them grows past its declaration: it alone is asked to
stop through its checkpoint signal, saves, and is requeued with the reason and what it used; its neighbour runs
on untouched; its next attempt is placed by what it used.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(150)

TRAIN = str(Path(__file__).resolve().parents[2] / "examples" / "checkpointing" / "train.py")
LOOP = f"{sys.executable} {TRAIN} --steps 1000000 --step-time 0.05"


def gpu_of(job: dict) -> tuple[str, int]:
    (alloc,) = job["placement"]["allocations"]
    (gpu,) = alloc["gpu_indices"]
    return alloc["node"], gpu


def test_the_job_over_its_declaration_is_the_only_one_stopped(running_lab):
    lab = running_lab
    steady = lab.submit("sh", "-c", f"exec env SIM_GPU_MEM=6G {LOOP}", share=True, gpu_mem="8G")
    # declares 8 GiB; a second into its run it uses 12 (past 8 and the 1.2 GiB margin)
    grows = lab.submit("sh", "-c", f"sleep 1; exec env SIM_GPU_MEM=12G {LOOP}", share=True, gpu_mem="8G")
    first = lab.wait_state(steady, "running")
    assert gpu_of(lab.wait_state(grows, "running")) == gpu_of(first)  # filled before another GPU is opened

    lab.wait(lambda: lab.job(grows)["attempt"] == 2, "the job over its declaration to be requeued", timeout=60,
             detail=lambda: lab.job(grows))
    stopped = lab.job(grows)
    (ended,) = stopped["attempts"]
    assert (ended["stop_reason"], ended["ended"]) == ("over_memory", "checkpointed")  # it saved on the signal
    assert stopped["gpu_mem_peak_mib"] == 12 * 1024
    assert "it used 12 GiB of GPU memory, more than the 8 GiB it declared" in stopped["note"]
    assert "requeued to run with 12 GiB" in lab.labq("show", str(grows)).stdout

    neighbour = lab.job(steady)
    assert (neighbour["state"], neighbour["attempt"], neighbour["attempts"]) == ("running", 1, [])

    # placed by what it used: 8 + 12 GiB and the margin still fit the 24 GiB GPU, and this time it stays
    again = lab.wait_state(grows, "running", timeout=60)
    assert gpu_of(again) == gpu_of(first)
    rows = lab.api("gpus")

    def shared_row():
        row = next(r for r in lab.api("gpus") if (r["node"], r["index"]) == gpu_of(first))
        return row if len(row["sharing"]) == 2 and all(s["used_mib"] for s in row["sharing"]) else None

    lab.wait(lambda: shared_row() is not None and shared_row()["sharing"][-1]["used_mib"] == 12 * 1024,
             "both jobs' memory to be measured", detail=lambda: rows)
    row = shared_row()
    assert {s["job_id"]: (s["need_mib"], s["used_mib"]) for s in row["sharing"]} == {
        steady: (8 * 1024, 6 * 1024), grows: (12 * 1024, 12 * 1024)}
    assert row["share_free_mib"] == 24 * 1024 - 1228 - 20 * 1024
    assert row["job"] is None
    table = lab.labq("gpus").stdout
    assert f"shared: job {steady} " in table and "8 GiB/6 GiB" in table and "12 GiB/12 GiB" in table
    assert lab.job(steady)["attempt"] == 1


def test_a_whole_gpu_job_never_lands_on_a_shared_gpu(running_lab):
    lab = running_lab
    shared = [lab.submit("sh", "-c", f"exec env SIM_GPU_MEM=1G {LOOP}", share=True, gpu_mem="2G")
              for _ in range(2)]
    where = {gpu_of(lab.wait_state(j, "running")) for j in shared}
    assert len(where) == 1  # both on one GPU
    whole = [lab.submit("sleep", "30") for _ in range(3)]
    taken = {gpu_of(lab.wait_state(j, "running")) for j in whole}
    assert len(taken) == 3 and not taken & where
    fourth = lab.submit("sleep", "30")
    lab.wait(lambda: (lab.api("show", str(fourth)).get("pending") or {}).get("reason") == "Resources",
             "the fourth job to wait for GPUs", detail=lambda: lab.api("show", str(fourth)))
    assert lab.job(fourth)["state"] == "queued"
