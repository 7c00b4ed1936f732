"""Which states of a Slurm node take no new job (``labq.agent.slurm.not_running_jobs``), as ``scontrol show node``
spells them: a node in one of them has its GPUs counted busy outside labq."""

from __future__ import annotations

import pytest

from labq.agent.slurm import gres_gpus, not_running_jobs


@pytest.mark.parametrize(("state", "closed"), [
    ("IDLE", False), ("MIXED", False), ("ALLOCATED", False), ("ALLOCATED+COMPLETING", False),
    ("IDLE+CLOUD+POWERED_DOWN", False),  # Slurm powers it up for a job
    ("IDLE+RESERVED", False),  # a reservation's users may run there
    ("IDLE+DRAIN", True), ("MIXED+DRAIN", True), ("ALLOCATED+DRAIN", True), ("DOWN", True), ("DOWN+DRAIN", True),
    ("DOWN*", True), ("IDLE*", True),  # * : not responding
    ("IDLE+MAINT", True), ("IDLE+FAIL", True), ("UNKNOWN", True), ("FUTURE", True),
])
def test_the_states_that_take_no_new_job(state, closed):
    assert not_running_jobs(state) is closed


def test_gres_gives_the_gpu_count_and_type():
    assert gres_gpus("gpu:a100:8(S:0-1)") == ("a100", 8)
    assert gres_gpus("gpu:4,gpu:v100:2") == ("v100", 6)
    assert gres_gpus("(null)") == (None, 0)
