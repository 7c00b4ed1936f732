"""The CLI prints names from an old database escaped: every row on one line, nothing for the terminal to act on.

The lab (``hostile_lab``) is a real leader whose TinyDB store was given names with newlines, escape
sequences, bidi overrides and markup; the commands run as processes, as a user runs them.
"""

from __future__ import annotations

import re

import pytest

from labq.render import answer_text
from labq.terminal_text import escape_controls
from tests.cli.hostile_lab import (
    ARCHIVED, COMMAND, ENV_VALUE, GPU_MODEL, NAME, NODE, RESERVATION, USER, WORKDIR, make_hostile, raw_controls,
)
from tests.e2e.conftest import Lab

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    lab = Lab(tmp_path_factory.mktemp("hostile"))
    try:
        lab.start_leader()
        printed = lab.labq("admin", "user", "add", "bob", "--print").stdout
        lab.bob = next(line.split('"')[1] for line in printed.splitlines() if line.startswith("token = "))
        lab.jobs = make_hostile(lab)
        yield lab
    finally:
        lab.close()


def shown(lab: Lab, *args: str, token: str | None = None, check: bool = True) -> str:
    """What ``labq ARGS`` printed (stdout and stderr), checked to carry no raw control character."""
    out = lab.labq(*args, token=token, check=check)
    text = out.stdout + out.stderr
    assert raw_controls(text) == [], text
    return text


def test_ls_keeps_each_job_on_its_line(hostile):
    jobs = hostile.jobs
    lines = shown(hostile, "ls", "--all").splitlines()
    assert [line.split()[0] for line in lines] == ["ID", str(jobs.running), str(jobs.waiting)]
    assert escape_controls(NAME)[:23] + "…" in lines[1]  # clipped to the column, after escaping
    assert escape_controls(USER) in lines[1] and escape_controls(USER) in lines[2]

    lines = shown(hostile, "ls", "--all", "--history").splitlines()  # finished jobs: the archived one
    assert [line.split()[0] for line in lines] == ["ID", str(jobs.finished)]
    assert lines[1].startswith(f"{jobs.finished} ") and escape_controls(ARCHIVED) in lines[1]


def test_show_prints_every_fact_escaped_on_its_own_line(hostile):
    text = shown(hostile, "show", str(hostile.jobs.running))
    lines = text.splitlines()
    assert lines[0].startswith(f"job {hostile.jobs.running} ({escape_controls(NAME)}): ")
    assert "[red]boom[/red]" in lines[0]  # markup is text to a terminal
    facts = {line[2:14].strip(): line[14:] for line in lines[1:] if line.startswith("  ") and line[2] != " "}
    assert facts["user"] == escape_controls(USER)
    assert facts["command"] == escape_controls(" ".join(COMMAND))
    assert facts["workdir"] == escape_controls(WORKDIR)
    assert facts["env"] == "FOO=" + escape_controls(ENV_VALUE)
    assert facts["placement"].startswith(escape_controls(NODE) + ": GPU 0 ")


def test_why_quotes_the_user_escaped(hostile):
    text = shown(hostile, "why", str(hostile.jobs.waiting))
    assert len(text.splitlines()) == 1, text
    assert f"waits: Reservation: {escape_controls(USER)} may not use reservation" in text


def test_nodes_gpus_and_reservations_escape_names_from_agents_and_bookings(hostile):
    nodes = shown(hostile, "nodes").splitlines()
    assert len(nodes) == 2 and nodes[1].startswith(escape_controls(NODE) + " ")
    gpus = shown(hostile, "gpus").splitlines()
    assert len(gpus) == 5
    assert escape_controls(GPU_MODEL.removeprefix("NVIDIA ")) in gpus[1]
    assert f"job {hostile.jobs.running} ({escape_controls(USER)})" in gpus[1]
    reservations = shown(hostile, "reservations").splitlines()
    assert len(reservations) == 2
    assert reservations[1].startswith(escape_controls(RESERVATION) + " ")
    # NODE:GPU (the pin moves off the running job's GPU 0 once the leader's timer sees GPU 1 idle)
    assert re.search(re.escape(escape_controls(NODE)) + r":[01] ", reservations[1])
    assert f"re-pinned from {escape_controls(NODE)}" in reservations[1]


def test_users_are_listed_escaped(hostile):
    lines = shown(hostile, "admin", "user", "ls").splitlines()
    assert escape_controls(USER) in [line.split()[0] for line in lines]


def test_an_error_that_echoes_a_name_is_escaped(hostile):
    text = shown(hostile, "cancel", str(hostile.jobs.running), token=hostile.bob, check=False)
    assert text == f"labq: error: job {hostile.jobs.running}: job {hostile.jobs.running} belongs to " \
                   f"{escape_controls(USER)}; only they or an admin may change it\n"


def test_a_booking_answer_quoting_a_node_or_a_user_is_escaped(hostile):
    text = shown(hostile, "reserve", "--gpus", "1", "--start", "in 3d", "--for", "1h", "--node", "nope", check=False)
    assert text == f"cannot book it: there is no node 'nope'; nodes: {escape_controls(NODE)}\n"


def test_booking_answers_name_nodes_reservations_and_users_escaped():
    booked = {"accepted": True, "booked": True, "displaced": [{"job_id": 7, "user": USER, "signal_at": 100.0}],
              "reservation": {"name": RESERVATION, "gpus": 1, "node": NODE, "gpu_indices": [0], "score": 0,
                              "start": 200.0, "end": 300.0}}
    refused = {"accepted": False, "reasons": [f"capacity: {NODE} is down"],
               "alternatives": [{"gpus": 1, "node": NODE, "score": 0, "start": 200.0, "end": 300.0}]}
    for answer, lines in ((booked, 4), (refused, 3)):
        text = answer_text(answer, 0.0, "UTC")
        assert raw_controls(text) == [] and len(text.splitlines()) == lines, text
        assert escape_controls(NODE) in text
    assert escape_controls(RESERVATION) in answer_text(booked, 0.0, "UTC")
    assert f"job 7 ({escape_controls(USER)})" in answer_text(booked, 0.0, "UTC")
