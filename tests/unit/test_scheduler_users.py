"""Scheduling passes where a node cannot run some users' jobs: no local account, or a problem of the node.

A job never goes to a node that has said it cannot start it; a job that only such nodes could run waits with
reason User ("no account for bob on ws1, ws2"); and the pass's fast path never hands one user's verdict to
another user's job of the same shape.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from labq.models import JobState, NodeHealth, PendingReason
from labq.models.job import Runtime
from labq.models.node import Account, Node, NodeProblem
from labq.scheduler import schedule
from tests.conftest import NOW, make_node

NO_SUCH_USER = "no such user on this machine"


def lacking(node: Node, *users: str, able: tuple[str, ...] = ("alice",)) -> Node:
    """``node`` as its agent reports it: no account for ``users``, an account for ``able``."""
    accounts = [Account(u, problem=NO_SUCH_USER) for u in users]
    accounts += [Account(u, u, 1000 + i, 1000) for i, u in enumerate(able)]
    return replace(node, accounts=tuple(accounts))


def where(decisions, job_id) -> list[str]:
    start = decisions.started(job_id)
    assert start is not None, f"job {job_id} did not start: {decisions.pending_for(job_id)}"
    return list(start.placement.nodes)


def test_a_job_never_goes_to_a_node_without_an_account_for_its_user(jobs):
    # ws1 is the better place (a job there leaves ws2 whole), but has no account for bob
    ws1, ws2 = lacking(make_node("ws1", "sim:ws-4x3090"), "bob"), make_node("ws2", "sim:ws-4x3090")
    busy = jobs.running(ws1, (0, 1), user="carol")
    job = jobs.queued(2, user="bob")
    assert where(schedule([busy, job], [ws1, ws2], now=NOW), job.id) == ["ws2"]
    alice = jobs.queued(2, user="alice")
    assert where(schedule([busy, alice], [ws1, ws2], now=NOW), alice.id) == ["ws1"]


@pytest.mark.parametrize(("lacking_on", "detail"), [
    (("ws1",), "no account for bob on ws1"),
    (("ws1", "ws2"), "no account for bob on ws1, ws2"),
])
def test_a_job_no_node_can_run_waits_with_reason_user_naming_the_nodes(jobs, lacking_on, detail):
    nodes = [lacking(make_node(n, "sim:ws-4x3090"), "bob") if n in lacking_on else make_node(n, "sim:ws-4x3090")
             for n in ("ws1", "ws2")]
    nodes = [n for n in nodes if n.name in lacking_on]  # only the nodes that lack bob are up in the lab
    job, other = jobs.queued(1, user="bob"), jobs.queued(1, user="alice")
    d = schedule([job, other], nodes, now=NOW)
    pending = d.pending_for(job.id)
    assert pending is not None and pending.reason is PendingReason.USER and pending.detail == detail
    assert where(d, other.id) == ["ws1"]  # the other user's job of the same shape is unaffected


def test_the_user_reason_names_only_nodes_that_are_up(jobs):
    ws1, ws2 = lacking(make_node("ws1", "sim:ws-4x3090"), "bob"), make_node("ws2", "sim:ws-4x3090")
    lost = replace(ws2, health=NodeHealth.LOST)  # the one node with bob's account is away
    job = jobs.queued(1, user="bob")
    pending = schedule([job], [ws1, lost], now=NOW).pending_for(job.id)
    assert (pending.reason, pending.detail) == (PendingReason.USER, "no account for bob on ws1")


def test_a_job_that_only_a_node_without_the_account_could_fit_waits_with_reason_user(jobs):
    dgx, ws = lacking(make_node("dgx", "sim:dgx1"), "bob"), make_node("ws", "sim:ws-4x3090")
    big, small = jobs.queued(8, user="bob"), jobs.queued(1, user="bob")
    d = schedule([big, small], [dgx, ws], now=NOW)
    pending = d.pending_for(big.id)
    assert (pending.reason, pending.detail) == (PendingReason.USER, "no account for bob on dgx")
    assert where(d, small.id) == ["ws"]


def test_a_long_queue_of_one_shape_gives_each_user_their_own_verdict(jobs):
    """The fast path: bob's waiting jobs settle a verdict that alice's jobs of the same shape must not take,
    and alice's starts must not let bob's jobs onto the node that has no account for bob."""
    ws1, ws2 = lacking(make_node("ws1", "sim:ws-4x3090"), "bob", "carol"), make_node("ws2", "sim:ws-4x3090")
    full = jobs.running(ws2, (0, 1, 2, 3), user="dave", preemptible=False)
    queue = [jobs.queued(1, user=user, submitted_at=NOW - 100 + i) for i, user in
             enumerate(["bob"] * 20 + ["carol"] * 5 + ["alice"] * 3 + ["bob"] * 20 + ["alice"] * 3)]
    d = schedule([full, *queue], [ws1, ws2], now=NOW)
    alice = [j.id for j in queue if j.user == "alice"]
    assert sorted(s.job_id for s in d.starts) == alice[:4]  # ws1's four GPUs, to alice alone
    for job in queue:
        if job.user == "alice":
            continue
        pending = d.pending_for(job.id)
        assert pending.reason is PendingReason.RESOURCES, (job.user, pending)
    alone = schedule([j for j in queue if j.user != "alice"], [ws1, replace(ws2, health=NodeHealth.DOWN)], now=NOW)
    for job in queue:
        if job.user != "alice":
            assert alone.pending_for(job.id).detail == f"no account for {job.user} on ws1"  # each names its own


def test_a_node_that_has_not_reported_accounts_runs_anyone(jobs):
    old = make_node("ws1", "sim:ws-4x3090")  # an agent of an older labq reports no accounts
    job = jobs.queued(1, user="bob")
    assert where(schedule([job], [old], now=NOW), job.id) == ["ws1"]
    silent = lacking(old, "carol")  # reports accounts, but not yet bob's
    assert where(schedule([job], [silent], now=NOW), job.id) == ["ws1"]


@pytest.mark.parametrize(("problem", "runs"), [
    (NodeProblem("docker is not available on node ws1: no daemon", runtime="docker"), {"process", "other-user"}),
    (NodeProblem("image lab/torch:2 not found on node ws1", runtime="docker", image="lab/torch:2"),
     {"process", "other-image", "other-user"}),
    (NodeProblem("as user 'bob': Operation not permitted", user="bob"), {"other-user"}),
    (NodeProblem("cannot start the shim on ws1: out of memory"), set()),
])
def test_a_node_problem_keeps_only_the_jobs_it_concerns_off_the_node(jobs, problem, runs):
    ws1 = replace(make_node("ws1", "sim:ws-4x3090"), problems=(problem,))
    kinds = {
        "process": jobs.queued(1, user="bob"),
        "docker": jobs.queued(1, user="bob", runtime=Runtime.DOCKER, image="lab/torch:2"),
        "other-image": jobs.queued(1, user="bob", runtime=Runtime.DOCKER, image="lab/jax:1"),
        "other-user": jobs.queued(1, user="alice"),
    }
    d = schedule(list(kinds.values()), [ws1], now=NOW)
    assert {k for k, job in kinds.items() if d.started(job.id)} == runs
    for kind, job in kinds.items():
        if kind not in runs:
            pending = d.pending_for(job.id)
            assert pending.reason is PendingReason.RESOURCES
            assert pending.detail == f"no node that is up can start it now: {problem.detail}"


def test_a_node_problem_and_a_missing_account_both_show(jobs):
    ws1 = lacking(make_node("ws1", "sim:ws-4x3090"), "bob")
    ws2 = replace(make_node("ws2", "sim:ws-4x3090"), problems=(NodeProblem("cannot start jobs on ws2: disk full"),))
    job = jobs.queued(1, user="bob")
    pending = schedule([job], [ws1, ws2], now=NOW).pending_for(job.id)
    assert (pending.reason, pending.detail) == (PendingReason.USER,
                                                "no account for bob on ws1; cannot start jobs on ws2: disk full")


def test_a_reserved_job_on_a_node_without_its_users_account_waits_with_reason_user(jobs):
    from labq.models import Reservation

    ws1 = lacking(make_node("ws1", "sim:ws-4x3090"), "bob")
    booking = Reservation("paper", "bob", 2, NOW - 60, NOW + 3600, node="ws1", gpu_indices=(0, 1))
    job = jobs.queued(1, user="bob", reservation="paper")
    pending = schedule([job], [ws1], now=NOW, reservations=[booking]).pending_for(job.id)
    assert (pending.reason, pending.detail) == (PendingReason.USER, "no account for bob on ws1")


def test_a_held_job_stays_held_whatever_the_accounts(jobs):
    ws1 = lacking(make_node("ws1", "sim:ws-4x3090"), "bob")
    job = jobs.queued(1, user="bob", state=JobState.HELD)
    assert schedule([job], [ws1], now=NOW).pending_for(job.id).reason is PendingReason.HELD
