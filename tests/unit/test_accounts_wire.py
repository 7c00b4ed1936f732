"""The wire format of accounts and node problems: agents report which lab users they can run, and as which
uid:gid, and what keeps jobs from starting on their node; the leader names its users in each sync reply.

Round-trips, what a peer of an older labq sends and gets, and what the leader refuses from the network.
"""

from __future__ import annotations

import json

import pytest

from labq.models.node import Account, NodeProblem
from labq.protocol.agents import (
    MAX_PROBLEMS, AttemptReport, SyncReply, SyncReport, decode_reply, encode_reply, encode_sync, parse_sync,
)
from labq.protocol.errors import ApiError
from tests.conftest import make_node

ACCOUNTS = (Account("alice", "asmith", 1001, 1001), Account("bob", problem="no such user on this machine"),
            Account("root", "root", 0, 0))
PROBLEMS = (NodeProblem("docker is not available on node ws1: no daemon", runtime="docker"),
            NodeProblem("image lab/torch:2 not found on node ws1", runtime="docker", image="lab/torch:2"),
            NodeProblem("cannot start bob's jobs on ws1: as user 'bob': Operation not permitted", user="bob"))


def on_the_wire(doc: dict) -> dict:
    return json.loads(json.dumps(doc))


def test_a_sync_report_with_accounts_problems_and_an_attempt_that_could_not_start_round_trips():
    report = SyncReport((AttemptReport(7, 2, False, 126, None, 10.0, 10.0,
                                       cannot_start="no account for bob on ws1: no such user on this machine"),
                         AttemptReport(8, 1, True, started_at=5.0)),
                        frozenset({1}), 5.0, None, ACCOUNTS, PROBLEMS)
    assert parse_sync(on_the_wire(encode_sync(report))) == report


def test_an_agent_that_was_not_asked_sends_nothing_an_older_leader_would_refuse():
    report = SyncReport((AttemptReport(7, 2, False, 1, None, 10.0, 10.0),), None, 0.0)
    doc = encode_sync(report)
    assert {"accounts", "problems"}.isdisjoint(doc) and "cannot_start" not in doc["attempts"][0]
    assert parse_sync(on_the_wire(doc)) == report  # and an agent of an older labq is still understood


def test_an_empty_report_of_accounts_and_problems_says_there_are_none():
    report = SyncReport((), None, 0.0, None, (), ())
    doc = encode_sync(report)
    assert doc["accounts"] == [] and doc["problems"] == []
    assert parse_sync(on_the_wire(doc)) == report


def test_a_reply_names_the_labs_users_and_a_reply_of_an_older_leader_names_none():
    reply = SyncReply((), (), 30.0, 600.0, 3, "e1", ("alice", "bob"))
    assert decode_reply(on_the_wire(encode_reply(reply))) == reply
    older = on_the_wire(encode_reply(SyncReply((), (), 30.0, 600.0, 3, "e1")))
    assert "users" not in older and decode_reply(older).users is None
    assert decode_reply(on_the_wire(encode_reply(SyncReply((), (), 30.0, 600.0, users=())))).users == ()


@pytest.mark.parametrize(("field", "value", "words"), [
    ("accounts", {"alice": 1001}, "accounts must be a list"),
    ("accounts", [{"user": "bob", "uid": -1}], "accounts.uid must be between"),
    ("accounts", [{"user": "bob", "uid": 2**32}], "accounts.uid must be between"),
    ("accounts", [{"login": "bob"}], "user is required"),
    ("accounts", [{"user": "bob", "problem": "no\naccount"}], "control or unprintable"),
    ("accounts", [{"user": "bob", "shell": "/bin/sh"}], "unknown field shell"),
    ("problems", [{"detail": "x" * 1001}], "longer than 1000 bytes"),
    ("problems", [{"detail": "disk full"}] * (MAX_PROBLEMS + 1), f"a list of at most {MAX_PROBLEMS}"),
    ("problems", [{"runtime": "docker"}], "detail is required"),
])
def test_the_leader_refuses_accounts_and_problems_it_cannot_trust(field, value, words):
    with pytest.raises(ApiError) as refused:
        parse_sync({"attempts": [], "wait_s": 0, field: value})
    assert refused.value.status == 400 and words in refused.value.message


def test_an_attempt_that_could_not_start_says_why_in_a_printable_sentence():
    attempt = {"job_id": 1, "attempt": 1, "running": False, "cannot_start": "bad\x1b[2Jnews"}
    with pytest.raises(ApiError) as refused:
        parse_sync({"attempts": [attempt], "wait_s": 0})
    assert "attempts.cannot_start" in refused.value.message


@pytest.mark.parametrize(("problem", "user", "runtime", "image", "concerned"), [
    (NodeProblem("x"), "bob", "process", None, True),  # node-wide
    (NodeProblem("x", user="bob"), "bob", "docker", "a:1", True),
    (NodeProblem("x", user="bob"), "alice", "process", None, False),
    (NodeProblem("x", runtime="docker"), "bob", "process", None, False),
    (NodeProblem("x", runtime="docker", image="a:1"), "bob", "docker", "a:1", True),
    (NodeProblem("x", runtime="docker", image="a:1"), "bob", "docker", "b:1", False),
])
def test_a_node_problem_concerns_the_jobs_it_names(problem, user, runtime, image, concerned):
    assert problem.concerns(user, runtime, image) is concerned


def test_a_node_refuses_a_user_it_has_no_account_for_and_jobs_its_problems_concern():
    from dataclasses import replace

    node = replace(make_node("ws1", "sim:ws-4x3090"), accounts=ACCOUNTS, problems=PROBLEMS[:1])
    assert node.refuses("bob") == "no account for bob on ws1: no such user on this machine"
    assert node.refuses("alice") is None and node.refuses("carol") is None  # carol: not reported, so not refused
    assert node.refuses("alice", "docker", "a:1") == PROBLEMS[0].detail
    assert node.account_problem("bob") == "no such user on this machine" and node.account_problem("alice") is None
