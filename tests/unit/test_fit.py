"""A job that can never fit is refused with why, and what would fit."""

from __future__ import annotations

import pytest

from labq.models import JobSpec
from labq.scheduler import why_never_fits
from tests.conftest import make_node

LAB = [make_node("ws1", "sim:ws-4x3090"), make_node("dgx", "sim:dgx1")]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"gpus": 12}, "largest suitable node (dgx) has 8; ask for --gpus 8 or fewer, or spread it with --nodes"),
        ({"gpus": 1, "min_gpu_memory_mib": 48 * 1024}, "GPUs with 48 GiB but the largest GPU has 32 GiB"),
        ({"gpus": 1, "gpu_model": "H100"}, "no GPU model matches 'H100'; the lab has: NVIDIA GeForce RTX 3090"),
        ({"gpus": 8, "gpu_model": "3090"}, "largest suitable node (ws1) has 4"),
        ({"gpus": 2, "node": "ws9"}, "there is no node 'ws9'; nodes: dgx, ws1"),
        ({"gpus": 8, "node": "ws1"}, "largest suitable node (ws1) has 4"),
        ({"gpus": 16, "nodes": 2}, "8 GPUs on each of 2 nodes but only 1 node(s)"),
        ({"gpus": 8, "min_gpu_memory_mib": 30 * 1024, "nodes": 2}, "only 1 node(s)"),
    ],
)
def test_never_fits_says_why(kwargs, words):
    reason = why_never_fits(JobSpec(user="alice", command=("x",), **kwargs), LAB)
    assert reason is not None and words in reason


@pytest.mark.parametrize(
    "kwargs",
    [{"gpus": 8}, {"gpus": 4, "gpu_model": "3090"}, {"gpus": 8, "nodes": 2}, {"gpus": 1, "node": "ws1"},
     {"gpus": 2, "min_gpu_memory_mib": 32 * 1024}],
)
def test_jobs_that_fit_an_idle_lab_pass(kwargs):
    assert why_never_fits(JobSpec(user="alice", command=("x",), **kwargs), LAB) is None


def test_an_empty_lab_says_to_start_an_agent():
    assert "start an agent" in why_never_fits(JobSpec(user="alice", command=("x",)), [])
