"""Slurm's and pueue's habits in the CLI, as processes against a tiny real server (``fake_leader``): what each
command sends, prints and exits with. Against a real lab: ``tests/e2e/test_habits.py``."""

from __future__ import annotations

import json
import os
import pty
import select
import socket
import subprocess
import sys
import time

import pytest

from labq.cli.actions import wait_status
from labq.cli.views import last_lines
from labq.models import JobState
from labq.protocol.codec import encode_job
from tests.cli.fake_leader import ROOT, FakeLeader, environment, labq
from tests.conftest import NOW, make_node


@pytest.fixture
def leader():
    fake = FakeLeader()
    yield fake
    fake.close()


def job_doc(jobs, **kw) -> dict:
    return encode_job(jobs.queued(**kw))


# -- prio and edit --------------------------------------------------------------------------------

@pytest.mark.parametrize(("typed", "body"), [
    ("+10", {"action": "prio", "by": 10}), ("-50", {"action": "prio", "by": -50}),
])
def test_prio_plus_n_is_a_change_and_a_class_or_number_a_value(leader, jobs, typed, body):
    leader.json("POST", "/v1/jobs/6/actions", {"job": job_doc(jobs, priority=210)})
    out = labq(leader, "prio", "6", typed)
    assert (out.returncode, out.stdout) == (0, "job 6: priority 210, queued\n")
    assert leader.requests[0]["body"] == body


@pytest.mark.parametrize(("flags", "body"), [
    (["--gpus", "4", "--time", "2h", "--class", "high", "--name", "bert-2"],
     {"gpus": 4, "time_limit_s": 7200, "priority": "high", "name": "bert-2"}),
    (["--time", "none"], {"time_limit_s": 0}),
    (["--priority", "250"], {"priority": 250}),
    (["--name", ""], {"name": ""}),
])
def test_edit_sends_what_the_flags_say(leader, jobs, flags, body):
    leader.json("POST", "/v1/jobs/3/actions", {"job": job_doc(jobs, name="bert-2", time_limit_s=7200.0)})
    out = labq(leader, "edit", "3", *flags)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "job 3: name bert-2, 1 GPU(s), time limit 2h00m, priority normal (200), queued\n"
    assert leader.requests[0]["body"] == {"action": "edit", **body}


# -- cancel by filters ----------------------------------------------------------------------------

def mine(jobs) -> list[dict]:
    """Five unfinished jobs of alice: four queued sweeps and a running train."""
    docs = [job_doc(jobs, name=f"sweep-{i}") for i in range(4)]
    docs.append(encode_job(jobs.running(make_node("ws1", "sim:ws-4x3090"), (0,), user="alice", name="train")))
    return docs


def cancel_answers(leader: FakeLeader, docs: list[dict]) -> None:
    for doc in docs:
        leader.json("POST", f"/v1/jobs/{doc['id']}/actions", {"job": {**doc, "state": "cancelled"}})


def test_cancel_by_name_and_state_picks_only_the_jobs_that_match(leader, jobs):
    docs = mine(jobs)
    leader.json("GET", "/v1/jobs", {"jobs": docs})
    cancel_answers(leader, docs)
    out = labq(leader, "cancel", "--name", "sweep-[12]", "--state", "queued")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "job 2: cancelled\njob 3: cancelled\n"
    assert leader.requests[0]["query"] == {"state": ["queued"]}  # your jobs: no user, no all
    assert [r["path"] for r in leader.requests[1:]] == ["/v1/jobs/2/actions", "/v1/jobs/3/actions"]


def test_cancel_by_filters_of_more_than_a_few_jobs_refuses_without_a_terminal_unless_yes(leader, jobs):
    docs = mine(jobs)
    leader.json("GET", "/v1/jobs", {"jobs": docs})
    cancel_answers(leader, docs)
    out = labq(leader, "cancel", "--name", "sweep-*")
    assert out.returncode == 2
    assert out.stderr == ("labq: error: the filters match 4 jobs: stdin is not a terminal, so labq cannot ask; "
                          "add --yes to go ahead\n")
    assert leader.sent("POST", "/v1/jobs/1/actions") == []
    out = labq(leader, "cancel", "--name", "sweep-*", "--yes")
    assert out.returncode == 0 and out.stdout.count("cancelled") == 4
    out = labq(leader, "cancel", "--user", "alice", "--state", "running")
    assert (out.returncode, out.stdout) == (0, "job 5: cancelled\n")
    assert leader.requests[-2]["query"] == {"user": ["alice"], "state": ["running"]}


def answer_on_a_terminal(leader: FakeLeader, args: list[str], answer: bytes) -> tuple[int, str]:
    """``labq ARGS`` with a terminal for stdin, answering its question (on stderr) with ``answer``."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "labq.cli", *args], stdin=slave, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=environment(leader.env()), cwd=ROOT)
    os.close(slave)
    asked = b""
    deadline = time.monotonic() + 30
    while b"[y/N]" not in asked:
        assert time.monotonic() < deadline and proc.poll() is None, asked
        if select.select([proc.stderr], [], [], 0.5)[0]:
            asked += os.read(proc.stderr.fileno(), 1024)
    os.write(master, answer)
    out, err = proc.communicate(timeout=30)
    os.close(master)
    return proc.returncode, asked.decode() + err.decode() + out.decode()


def test_cancel_by_filters_asks_at_a_terminal_and_no_cancels_nothing(leader, jobs):
    docs = mine(jobs)
    leader.json("GET", "/v1/jobs", {"jobs": docs})
    cancel_answers(leader, docs)
    code, text = answer_on_a_terminal(leader, ["cancel", "--name", "sweep-*"], b"n\n")
    assert code == 1 and "cancel 4 jobs (jobs 1, 2, 3, 4)? [y/N]" in text
    assert [r for r in leader.requests if r["method"] == "POST"] == []
    code, text = answer_on_a_terminal(leader, ["cancel", "--name", "sweep-*"], b"y\n")
    assert code == 0 and text.count("cancelled") == 4


# -- restart, clean, wait -------------------------------------------------------------------------

def test_restart_prints_the_new_job_and_clean_says_what_it_hid(leader, jobs):
    leader.json("POST", "/v1/jobs/12/actions", {"job": job_doc(jobs)}, 201)
    out = labq(leader, "restart", "12")
    assert (out.returncode, out.stdout) == (0, "job 12: restarted as job 1\n")
    assert leader.requests[0]["body"] == {"action": "restart"}
    leader.json("DELETE", "/v1/history", {"cleaned_up_to": NOW, "hidden": 7})
    out = labq(leader, "clean")
    assert out.returncode == 0
    assert out.stdout == ("hid 7 finished jobs of yours from `labq ls --history`; `labq show ID` still shows any "
                          "of them\n")


@pytest.mark.parametrize(("ends", "status"), [
    ([("succeeded", 0), ("succeeded", 0)], 0),
    ([("succeeded", 0), ("failed", 3), ("failed", 9)], 3),
    ([("failed", None)], 1),
    ([("timeout", None), ("failed", 2)], 124),
    ([("cancelled", None)], 143),
    ([("failed", 137)], 137),
])
def test_wait_status_is_the_first_failures_in_the_order_given(ends, status):
    assert wait_status([{"state": s, "exit_code": c} for s, c in ends]) == status


def test_wait_blocks_until_the_jobs_end_and_exits_with_the_first_failures_status(leader, jobs):
    done = {1: job_doc(jobs, state=JobState.SUCCEEDED), 2: {**job_doc(jobs), "state": "failed", "exit_code": 3}}
    calls = {"n": 0}

    def queue(query: dict):
        calls["n"] += 1  # job 2 runs for the first two looks
        live = [done[2] | {"state": "running"}] if calls["n"] <= 2 and "2" in query.get("id", []) else []
        return 200, {}, json.dumps({"jobs": live, "pending": {}}).encode()

    leader.routes[("GET", "/v1/jobs")] = queue
    for job_id, doc in done.items():
        leader.json("GET", f"/v1/jobs/{job_id}", {"job": doc, "pending": None})
    out = labq(leader, "wait", "1", "2")
    assert (out.returncode, out.stdout) == (3, "job 1: succeeded\njob 2: failed (exit 3)\n")
    assert calls["n"] == 3
    out = labq(leader, "wait", "1", "-q")
    assert (out.returncode, out.stdout) == (0, "")


# -- logs -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("data", "n", "tail"), [
    (b"1\n2\n3\n4\n", 2, b"3\n4\n"), (b"1\n2\n3", 2, b"2\n3"), (b"1\n2\n", 5, b"1\n2\n"), (b"1\n2\n", 0, b""),
    (b"", 3, b""), (b"\n\n\n", 2, b"\n\n"),
])
def test_last_lines_count_as_tail_does(data, n, tail):
    assert last_lines(data, n) == tail


def serve_log(leader: FakeLeader, job_id: int, text: bytes, attempt: int = 1) -> None:
    def logs(query: dict):
        start = int(query["offset"][0])
        chunk = text[start:start + 7]  # a few bytes a read, as a long log comes
        return 200, {"Content-Type": "text/plain", "X-Labq-Offset": str(start + len(chunk)),
                     "X-Labq-Done": "1" if start + len(chunk) >= len(text) else "0",
                     "X-Labq-Attempt": str(attempt)}, chunk

    leader.routes[("GET", f"/v1/jobs/{job_id}/logs")] = logs


def test_logs_n_prints_the_last_lines_of_the_attempt_the_leader_chose_and_reads_on_in_it(leader, jobs):
    text = b"".join(b"step %d\n" % i for i in range(1, 31))
    serve_log(leader, 1, text)
    doc = job_doc(jobs) | {"attempt": 2}  # queued again after a preemption: attempt 1 is the one that ran
    leader.json("GET", "/v1/jobs/1", {"job": doc, "pending": None})
    out = labq(leader, "logs", "-n", "3", "1")
    assert (out.returncode, out.stdout) == (0, "step 28\nstep 29\nstep 30\n")
    reads = leader.sent("GET", "/v1/jobs/1/logs")
    assert "attempt" not in reads[0]["query"] and all(r["query"]["attempt"] == ["1"] for r in reads[1:])
    assert out.stderr == ("labq: that was attempt 1; job 1 is queued for attempt 2 (`labq logs -f 1` follows it "
                          "once it starts)\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_logs_f_waits_out_a_leader_that_restarts_and_exits_4_when_it_stays_away(jobs):
    port = free_port()
    env = environment({"LABQ_LEADER": f"http://127.0.0.1:{port}", "LABQ_TOKEN": "t"})
    proc = subprocess.Popen([sys.executable, "-m", "labq.cli", "logs", "-f", "1", "--attempt", "1",
                             "--retry-for", "30s"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    said, deadline = b"", time.monotonic() + 30
    while b"retrying" not in said:  # no leader yet: it says so, and retries
        assert proc.poll() is None and time.monotonic() < deadline, said
        if select.select([proc.stderr], [], [], 0.2)[0]:
            said += os.read(proc.stderr.fileno(), 4096)
    leader = FakeLeader(port)
    try:
        serve_log(leader, 1, b"epoch 1\nepoch 2\n")
        out, err = proc.communicate(timeout=30)
    finally:
        leader.close()
    err = (said + err).decode()
    assert (proc.returncode, out) == (0, b"epoch 1\nepoch 2\n")
    assert err.startswith(f"labq: cannot reach the leader at http://127.0.0.1:{port}")
    assert "retrying for up to 30s" in err and err.endswith("labq: the leader answers again\n")

    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "labq.cli", "logs", "-f", "1", "--retry-for", "2s"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert out.returncode == 4 and time.monotonic() - started >= 2
    assert out.stderr.splitlines()[-1].startswith("labq: error: gave up after 2s without the leader: cannot reach")


def test_logs_f_without_attempt_starts_with_the_last_attempt_that_ran_then_follows_the_next(leader, jobs):
    node = make_node("ws1", "sim:ws-4x3090")
    running = encode_job(jobs.running(node, (0,), user="alice"))
    preempted = {**running, "state": "queued", "attempt": 2, "placement": None,
                 "attempts": [{"attempt": 1, "placement": running["placement"], "started_at": NOW - 60,
                               "ended_at": NOW - 30, "ended": "checkpointed", "stop_reason": "preempted"}]}
    states = iter([preempted, preempted, {**preempted, "state": "running", "placement": running["placement"]},
                   {**preempted, "state": "succeeded", "placement": running["placement"]}])
    current = {}

    def show(query):
        current["job"] = next(states, current.get("job"))
        return 200, {}, json.dumps({"job": current["job"], "pending": None}).encode()

    def logs(query):
        attempt = query["attempt"][0]
        text = f"attempt {attempt}\n".encode()[int(query["offset"][0]):]
        return 200, {"Content-Type": "text/plain", "X-Labq-Offset": "10", "X-Labq-Done": "1",
                     "X-Labq-Attempt": attempt}, text

    leader.routes[("GET", "/v1/jobs/1")] = show
    leader.routes[("GET", "/v1/jobs/1/logs")] = logs
    out = labq(leader, "logs", "-f", "1")
    assert (out.returncode, out.stdout) == (0, "attempt 1\nattempt 2\n")
    assert out.stderr == "labq: job 1 is queued; waiting for it to start\nlabq: following attempt 2\n"


# -- ls -------------------------------------------------------------------------------------------

def test_ls_says_why_each_queued_job_waits_and_json_carries_the_reason(leader, jobs):
    queued, held = job_doc(jobs, gpus=4), job_doc(jobs, state=JobState.HELD)
    pending = {str(queued["id"]): {"reason": "Resources", "detail": "needs 4 GPUs; 2 free",
                                   "waiting_for": None, "estimated_start": None}}
    leader.json("GET", "/v1/jobs", {"jobs": [queued, held], "pending": pending})
    out = labq(leader, "ls")
    rows = out.stdout.splitlines()
    assert rows[1].split()[-6:] == ["Resources:", "needs", "4", "GPUs;", "2", "free"]
    assert leader.requests[0]["query"] == {"after": ["0"], "limit": ["100"], "pending": ["1"]}  # the first page
    assert "showing" not in out.stdout  # all there is
    out = labq(leader, "ls", "--json")
    assert leader.requests[1]["query"] == {"pending": ["1"]}  # every job: --json is not paged
    listed = json.loads(out.stdout)
    assert listed[0]["pending"] == pending[str(queued["id"])] and "pending" not in listed[1]


def test_ls_history_asks_for_the_finished_jobs_that_ended_last(leader, jobs):
    leader.json("GET", "/v1/jobs", {"jobs": [job_doc(jobs, state=JobState.FAILED)]})
    out = labq(leader, "ls", "--history", "--limit", "5")
    assert out.returncode == 0 and "failed" in out.stdout
    assert leader.requests[0]["query"] == {"finished": ["1"], "limit": ["5"]}
