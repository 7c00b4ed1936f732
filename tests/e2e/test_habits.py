"""The habits a new lab brings from Slurm and pueue, tried on a real lab: a leader and an agent as processes,
``labq`` as a process, jobs as real processes on simulated GPUs (issue 16)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

pytestmark = pytest.mark.timeout(150)


def add_user(lab, name: str) -> str:
    printed = lab.labq("admin", "user", "add", name, "--print").stdout
    return next(line.split('"')[1] for line in printed.splitlines() if line.startswith("token = "))


def test_logs_after_a_preemption_print_the_attempt_that_ran(running_lab):
    lab = running_lab  # one workstation, 4 GPUs
    low = lab.submit("sh", "-c", "echo attempt $LABQ_ATTEMPT starts; echo step 1; exec sleep 600", gpus=4,
                     **{"class": "low"})
    lab.wait_state(low, "running")
    lab.wait(lambda: "step 1" in lab.labq("logs", str(low)).stdout, "the low job's output")
    urgent = lab.submit("sleep", "600", gpus=4, **{"class": "urgent"})
    lab.wait_state(urgent, "running", timeout=60)
    job = lab.job(low)
    assert (job["state"], job["attempt"]) == ("queued", 2)

    out = lab.labq("logs", str(low))
    assert out.stdout == "attempt 1 starts\nstep 1\n"
    assert out.stderr == (f"labq: that was attempt 1; job {low} is queued for attempt 2 (`labq logs -f {low}` "
                          "follows it once it starts)\n")
    assert lab.labq("logs", "-n", "1", str(low)).stdout == "step 1\n"
    out = lab.labq("logs", str(low), "--attempt", "2", check=False)
    assert out.returncode == 1 and "has not started attempt 2 yet" in out.stderr


def test_logs_f_goes_on_across_a_leader_restart(running_lab):
    lab = running_lab
    job = lab.submit("sh", "-c", "for i in 1 2 3 4 5 6 7 8; do echo line $i; sleep 0.5; done")
    lab.wait_state(job, "running")
    follow = subprocess.Popen([sys.executable, "-m", "labq.cli", "logs", "-f", str(job), "--retry-for", "60s"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=lab.env())
    lab.wait(lambda: "line 1" in lab.labq("logs", str(job)).stdout, "the job's first line")
    said: list[str] = []
    retrying = threading.Event()

    def read_stderr() -> None:  # the CLI's own word that it noticed the leader gone, not a guess at how long
        for line in follow.stderr:
            said.append(line)
            if "retrying for up to" in line:
                retrying.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    lab.kill(lab.leader, signal.SIGTERM)
    assert retrying.wait(timeout=30), "".join(said)
    lab.start_leader()
    out = follow.stdout.read()
    follow.wait(timeout=60)
    reader.join(timeout=10)
    err = "".join(said)
    assert follow.returncode == 0, err
    assert out == "".join(f"line {i}\n" for i in range(1, 9))
    assert "retrying for up to 1m" in err and "the leader answers again" in err


def test_refusals_exit_1_and_a_bad_token_3(running_lab):
    lab = running_lab
    bob = add_user(lab, "bob")
    mine = lab.submit("sleep", "600")
    out = lab.labq("cancel", str(mine), token=bob, check=False)
    assert out.returncode == 1 and f"job {mine} belongs to root" in out.stderr
    out = lab.labq("submit", "--class", "urgent", "--", "true", token=bob, check=False)
    assert out.returncode == 1 and "urgent is for admins" in out.stderr
    out = lab.labq("edit", str(mine), "--class", "high", token=bob, check=False)
    assert out.returncode == 1
    out = lab.labq("cancel", "99999", check=False)
    assert out.returncode == 1 and "there is no unfinished job 99999" in out.stderr
    out = lab.labq("ls", token="lqu_not-a-token", check=False)
    assert out.returncode == 3 and "unknown token" in out.stderr


def test_dependencies_are_checked_at_submit_and_a_failed_one_ends_its_waiting_jobs(running_lab):
    lab = running_lab
    out = lab.labq("submit", "--after", "99999", "--", "true", check=False)
    assert out.returncode == 2 and "job 99999 does not exist" in out.stderr
    go = lab.root / "go"
    gate = lab.submit("sh", "-c", f"while [ ! -e {go} ]; do sleep 0.1; done; exit 3", name="gate")
    lab.wait_state(gate, "running")  # the reasons below name its state: starting, until the agent says it runs
    after = lab.submit("true", after=gate, name="after")
    then = lab.submit("true", after=after, name="then")
    anyway = lab.submit("true", after_any=gate, name="anyway")
    lab.wait(lambda: "pending" in {j["id"]: j for j in lab.api("ls")}[anyway], "a pass of the scheduler")
    rows = {line.split()[0]: line for line in lab.labq("ls").stdout.splitlines()[1:]}
    assert "Dependency: waits for job" in rows[str(after)] and "Dependency: waits for job" in rows[str(anyway)]
    pending = {j["id"]: j.get("pending") for j in lab.api("ls")}
    assert pending[after]["detail"] == f"waits for job {gate} (running) to succeed"
    assert pending[anyway]["detail"] == f"waits for job {gate} (running) to end"

    go.touch()
    out = lab.labq("wait", str(anyway), str(gate), str(after), check=False)
    assert out.returncode == 3  # the first failure in the order given: the gate's own exit code
    assert sorted(out.stdout.splitlines()) == sorted([  # printed as each ended
        f"job {anyway}: succeeded (exit 0)", f"job {gate}: failed (exit 3)", f"job {after}: cancelled"])
    assert lab.wait_state(then, "cancelled")["note"] == (
        f"cancelled: it can never start: job {after} ended cancelled (--after waits for success; "
        "--after-any for any end)")
    assert lab.job(after)["note"].endswith(f"job {gate} ended failed (--after waits for success; "
                                           "--after-any for any end)")
    out = lab.labq("submit", "--after", str(gate), "--", "true", check=False)
    assert out.returncode == 2 and f"job {gate} ended failed" in out.stderr
    out = lab.labq("ls", "--history", "--limit", "2")  # after and then ended in one pass; anyway ran after it
    assert [line.split()[0] for line in out.stdout.splitlines()[1:]] == [str(then), str(anyway)]


def test_ls_says_why_queued_jobs_wait_and_restart_and_clean_work_on_finished_ones(running_lab):
    lab = running_lab
    full = lab.submit("sleep", "600", gpus=4, name="full")
    lab.wait_state(full, "running")
    waits = lab.submit("true", gpus=2, name="waits")
    lab.wait(lambda: lab.job(waits).get("attempt") and "Resources" in lab.labq("ls").stdout, "a pending reason")
    row = next(line for line in lab.labq("ls").stdout.splitlines() if line.startswith(f"{waits} "))
    assert "Resources" in row
    listed = {j["id"]: j for j in lab.api("ls")}
    assert listed[waits]["pending"]["reason"] == "Resources" and "pending" not in listed[full]

    out = lab.labq("prio", str(waits), "-10")  # below the running job's: it must not preempt it
    assert out.stdout == f"job {waits}: priority 190, queued\n"
    lab.labq("cancel", str(waits))
    out = lab.labq("restart", str(waits))
    assert out.stdout.startswith(f"job {waits}: restarted as job ")
    again = int(out.stdout.split()[-1])
    assert lab.job(again)["spec"]["priority"] == 190 and lab.job(again)["note"] == f"restart of job {waits}"
    assert lab.labq("clean").stdout.startswith("hid 1 finished job of yours")
    assert lab.labq("ls", "--history").stdout == "no jobs\n"
    assert lab.job(waits)["state"] == "cancelled"  # still there for show


def test_cancel_by_filters_asks_for_yes_when_nobody_can_be_asked(running_lab):
    lab = running_lab
    sweeps = [lab.submit("sleep", "600", name=f"sweep-{i}", gpus=4) for i in range(5)]
    other = lab.submit("sleep", "600", name="train", gpus=4)
    lab.wait_state(sweeps[0], "running")
    out = lab.labq("cancel", "--name", "sweep-*", "--state", "queued", check=False)
    assert out.returncode == 2 and "add --yes" in out.stderr
    out = lab.labq("cancel", "--name", "sweep-*", "--state", "queued", "--yes")
    cancelled = {int(line.split()[1].rstrip(":")) for line in out.stdout.splitlines()}
    assert cancelled == set(sweeps[1:])  # the first runs; the queued four go
    assert lab.job(sweeps[0])["state"] == "running" and lab.job(other)["state"] == "queued"
