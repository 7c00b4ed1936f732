"""``labq ls`` a page at a time, as a process against a real leader on loopback: the default view is the first 100
of the caller's unfinished jobs, with a last line saying how many match and how to see the rest only when it
shows fewer than match; ``--after``, ``--limit`` and ``--json`` as their help says. The API's pages:
``tests/leader/test_job_pages.py``."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from tests.cli.fake_leader import ROOT, environment, labq
from tests.leader.loopback_leader import start_loopback_leader

pytestmark = pytest.mark.timeout(180)

MINE, BOBS = 130, 3  #: the admin's jobs (ids 1-130), then bob's (131-133)
NEXT_PAGE = "showing 100 of 130 jobs: --after 100 for the next page, --limit 0 for all"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lb = start_loopback_leader(tmp_path_factory.mktemp("leader"))
    url = f"http://127.0.0.1:{lb.port}"
    bob = lb.request("POST", "/v1/users", {"name": "bob"})[2]["token"]
    for n in range(MINE + BOBS):
        status, _, doc = lb.request("POST", "/v1/jobs", {"command": ["train"], "name": f"run-{n}"},
                                    token="admin" if n < MINE else bob)
        assert status == 201, doc
    lb.env = {"LABQ_LEADER": url, "LABQ_TOKEN": lb.admin_token, "NO_COLOR": "1"}
    lb.bob_env = lb.env | {"LABQ_TOKEN": bob}
    yield lb
    lb.stop()


def ls(lab, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    out = labq(None, "ls", *args, env=env or lab.env)
    assert out.returncode == 0, out.stderr
    return out


def rows(out: subprocess.CompletedProcess) -> list[int]:
    """The ids of the table's rows."""
    return [int(line.split()[0]) for line in out.stdout.splitlines() if line.split()[0].isdigit()]


def test_ls_shows_the_first_100_and_says_how_to_see_the_rest(lab):
    out = ls(lab)
    assert rows(out) == list(range(1, 101))
    assert out.stdout.splitlines()[-1] == NEXT_PAGE
    out = ls(lab, "--after", "100")
    assert rows(out) == list(range(101, 131))
    assert out.stdout.splitlines()[-1] == "showing 30 of 130 jobs, those after job 100: --limit 0 for all"
    out = ls(lab, "--after", "20", "--limit", "5")
    assert rows(out) == list(range(21, 26))
    assert out.stdout.splitlines()[-1] == "showing 5 of 130 jobs: --after 25 for the next page, --limit 0 for all"


def test_no_last_line_when_all_that_match_are_shown(lab):
    out = ls(lab, env=lab.bob_env)  # bob's own: three jobs
    assert rows(out) == [131, 132, 133] and "showing" not in out.stdout
    out = ls(lab, "--limit", "0")
    assert rows(out) == list(range(1, 131)) and "showing" not in out.stdout
    out = ls(lab, "--user", "bob")
    assert rows(out) == [131, 132, 133] and "showing" not in out.stdout
    out = ls(lab, "--all", "--state", "running")
    assert out.stdout == "no jobs\n"


def test_limit_is_still_the_newest_n_and_prints_as_it_did(lab):
    out = ls(lab, "--limit", "3")
    assert rows(out) == [128, 129, 130] and len(out.stdout.splitlines()) == 4  # the header and three rows
    out = ls(lab, "--all", "--limit", "3")
    assert rows(out) == [131, 132, 133] and len(out.stdout.splitlines()) == 4


def test_json_is_every_job_unless_a_page_is_asked_for(lab):
    listed = json.loads(ls(lab, "--json").stdout)
    assert [j["id"] for j in listed] == list(range(1, 131))
    listed = json.loads(ls(lab, "--json", "--after", "100", "--limit", "10").stdout)
    assert [j["id"] for j in listed] == list(range(101, 111))
    listed = json.loads(ls(lab, "--json", "--after", "120").stdout)
    assert [j["id"] for j in listed] == list(range(121, 131))


@pytest.mark.parametrize(("args", "words"), [
    (["--limit", "5001"], "--limit is at most 5000"),
    (["--limit", "-1"], "--limit must be 1 or more"),
    (["--after", "-5"], "--after ID"),
    (["--after", "5", "--limit", "0"], "--after ID"),
    (["--after", "5", "--history"], "--history lists them by when they ended"),
])
def test_bad_paging_options_are_refused_before_asking(lab, args, words):
    out = labq(None, "ls", *args, env=lab.env)
    assert out.returncode == 2 and words in out.stderr and out.stdout == ""


def test_watch_draws_the_first_page_with_its_last_line(lab):
    proc = subprocess.Popen([sys.executable, "-m", "labq.cli", "ls", "--watch"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=environment(lab.env), cwd=ROOT)
    shown, deadline = b"", time.monotonic() + 60
    try:
        while NEXT_PAGE.encode() not in shown:  # into a pipe, each frame is written whole
            assert time.monotonic() < deadline and proc.poll() is None, shown[-500:]
            if select.select([proc.stdout], [], [], 0.2)[0]:
                shown += os.read(proc.stdout.fileno(), 1 << 16)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    frame = shown.decode().split("\x1b[H\x1b[2J")[1]
    assert proc.returncode == 0, err
    assert frame.startswith("labq ls, live") and frame.rstrip("\n").endswith(NEXT_PAGE)
    assert [line.split()[0] for line in frame.splitlines()[3:5]] == ["1", "2"]
