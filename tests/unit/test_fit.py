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


def _accounts(node, **problems):
    """``node`` reporting an account for each user given None, and no account for each given a problem."""
    from dataclasses import replace

    from labq.models.node import Account

    return replace(node, accounts=tuple(Account(u, None if p else u, None if p else 1000, None if p else 1000, p)
                                        for u, p in problems.items()))


@pytest.mark.parametrize(
    ("nodes", "refusal"),
    [
        ([], None),  # no nodes yet: nothing to go by
        ([_accounts(LAB[0], bob="no such user on this machine")], "no account for bob on ws1"),
        ([_accounts(LAB[1], bob="no such user on this machine"), _accounts(LAB[0], bob="not in the user map")],
         "no account for bob on dgx, ws1"),
        ([_accounts(LAB[0], bob="no such user on this machine"), _accounts(LAB[1], bob=None)], None),
        ([_accounts(LAB[0], bob="no such user on this machine"), LAB[1]], None),  # dgx has not said (older agent)
        ([_accounts(LAB[0], bob="no such user on this machine"), _accounts(LAB[1], alice=None)], None),  # not yet
        ([_accounts(LAB[0], alice="no such user on this machine")], None),  # another user's account
    ],
)
def test_a_submit_is_refused_only_when_every_node_has_said_it_has_no_account(nodes, refusal):
    from labq.scheduler.fit import why_no_node_runs_user

    assert why_no_node_runs_user("bob", nodes) == refusal
