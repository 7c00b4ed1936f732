"""The first end-to-end labq: real leader and agent processes on loopback, driven by the CLI."""

from __future__ import annotations

import json
import os
import signal

import pytest

pytestmark = pytest.mark.timeout(120)


def attempt_folder(lab, job: int, attempt: int = 1, node: str = "ws1"):
    return lab.data / "agents" / node / "runtime" / "attempts" / f"{job}.{attempt}"


def job_process_alive(lab, job: int, attempt: int = 1) -> bool:
    """Whether the attempt's process group (named in its pid.json) still exists."""
    pid = json.loads((attempt_folder(lab, job, attempt) / "pid.json").read_text())["pid"]
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def log_size(lab, name: str) -> int:
    path = lab.root / name
    return path.stat().st_size if path.exists() else 0


def logged_since(lab, name: str, start: int) -> str:
    path = lab.root / name
    return path.read_bytes()[start:].decode(errors="replace") if path.exists() else ""


def test_submit_runs_and_records_exit_code_and_logs(running_lab):
    lab = running_lab
    ok = lab.submit("sh", "-c", "echo hello from $LABQ_JOB_ID on $CUDA_VISIBLE_DEVICES", gpus=2)
    bad = lab.submit("sh", "-c", "echo oops >&2; exit 7")
    assert lab.wait_state(ok, "succeeded")["exit_code"] == 0
    failed = lab.wait_state(bad, "failed")
    assert failed["exit_code"] == 7
    assert lab.labq("logs", str(ok)).stdout == f"hello from {ok} on 0,1\n"
    assert "oops" in lab.labq("logs", str(bad)).stdout
    history = lab.api("ls", "--history")
    assert {j["id"]: j["state"] for j in history} .get(ok) == "succeeded"


def test_cancel_hold_release(running_lab):
    lab = running_lab
    long = lab.submit("sleep", "300", gpus=4)  # takes the whole workstation
    lab.wait_state(long, "running")
    waiting = lab.submit("true", gpus=1)
    lab.labq("hold", str(waiting))
    assert lab.job(waiting)["state"] == "held"
    lab.labq("release", str(waiting))
    assert lab.job(waiting)["state"] == "queued"
    lab.labq("cancel", str(long))
    assert lab.wait_state(long, "cancelled")["exit_code"] is not None
    lab.wait_state(waiting, "succeeded")
    lab.labq("cancel", str(waiting), check=False)  # finished: refused, nothing changes
    assert lab.job(waiting)["state"] == "succeeded"


def test_higher_priority_runs_first(running_lab):
    lab = running_lab
    blocker = lab.submit("sleep", "2", gpus=4, no_preempt=True)
    lab.wait_state(blocker, "running")
    low = lab.submit("sh", "-c", "date +%s.%N", gpus=4, **{"class": "low"})
    high = lab.submit("sh", "-c", "date +%s.%N", gpus=4, **{"class": "high"})
    lab.wait_state(low, "succeeded", timeout=60)
    lab.wait_state(high, "succeeded", timeout=60)
    assert lab.job(high)["started_at"] < lab.job(low)["started_at"]


def test_quota_keeps_a_user_waiting(lab):
    lab.config.write_text(lab.config.read_text() + "[quotas]\nmax_gpus_per_user = 2\n")
    lab.start_leader()
    lab.start_agent()
    first = lab.submit("sleep", "300", gpus=2)
    lab.wait_state(first, "running")
    second = lab.submit("true", gpus=1)
    lab.wait(lambda: "Quota" in json.dumps(lab.api("why", str(second))), "the quota to keep job 2 waiting")
    assert lab.job(second)["state"] == "queued"
    lab.labq("cancel", str(first))
    lab.wait_state(second, "succeeded")


def test_leader_killed_while_jobs_run_loses_and_duplicates_nothing(running_lab):
    lab = running_lab
    job = lab.submit("sh", "-c", "echo start; sleep 4; echo end")
    lab.wait_state(job, "running")
    start = log_size(lab, "agent-ws1.log")
    lab.kill(lab.leader, signal.SIGKILL)  # returns once the leader is gone
    lab.wait(lambda: "cannot sync with the leader" in logged_since(lab, "agent-ws1.log", start),
             "the agent to find the leader gone")
    assert job_process_alive(lab, job), "the job died with the leader"
    lab.start_leader()  # same port, same data
    done = lab.wait_state(job, "succeeded", timeout=60)
    assert done["attempt"] == 1
    assert lab.labq("logs", str(job)).stdout == "start\nend\n"  # one run, not two


def test_agent_killed_while_jobs_run_readopts_them(running_lab):
    lab = running_lab
    job = lab.submit("sh", "-c", "echo start; sleep 4; echo end")
    lab.wait_state(job, "running")
    lab.kill(lab.agents["ws1"], signal.SIGKILL)  # returns once the agent is gone
    assert job_process_alive(lab, job), "the job died with its agent"
    lab.start_agent()
    done = lab.wait_state(job, "succeeded", timeout=60)
    assert done["attempt"] == 1 and done["exit_code"] == 0
    assert lab.labq("logs", str(job)).stdout == "start\nend\n"


def test_other_users_cannot_touch_my_job_and_bad_tokens_get_401(running_lab):
    lab = running_lab
    added = lab.labq("admin", "user", "add", "mallory", "--print")
    token = next(word.strip('"') for word in added.stdout.split() if word.strip('"').startswith("lqu_"))
    mine = lab.submit("sleep", "300")
    refused = lab.labq("cancel", str(mine), token=token, check=False)
    assert refused.returncode == 1 and "belongs to" in refused.stderr
    assert lab.job(mine)["state"] in ("starting", "running")
    bad = lab.labq("ls", token="lqu_not-a-token", check=False)
    assert bad.returncode == 3 and "unknown token" in bad.stderr
    lab.labq("cancel", str(mine))


def test_an_agent_cut_off_from_the_leader_fences_its_jobs_and_they_are_requeued(running_lab):
    lab = running_lab
    job = lab.submit("sh", "-c", "echo attempt $LABQ_ATTEMPT; sleep 300")
    lab.wait_state(job, "running")
    lab.leader.send_signal(signal.SIGSTOP)  # the leader is unreachable; the agent's heartbeat ages
    ended = attempt_folder(lab, job) / "exit.json"
    try:  # past fence_after (6 s): the job's shim stops it and says so in exit.json
        lab.wait(ended.exists, "the shim to fence attempt 1", timeout=60)
    finally:
        lab.leader.send_signal(signal.SIGCONT)
    assert json.loads(ended.read_text())["fenced"] is True
    assert not job_process_alive(lab, job)
    back = lab.wait_state(job, "running", timeout=60)
    lab.wait(lambda: lab.job(job)["attempt"] == 2, "the fenced job to run again as attempt 2")
    assert "attempt 2" in lab.labq("logs", str(job)).stdout
    assert back["preemptions"] == 0
    lab.labq("cancel", str(job))


def test_a_lost_agents_jobs_move_only_after_requeue_after(lab):
    lab.start_leader()
    lab.start_agent("ws1")
    job = lab.submit("sleep", "300", node="ws1")
    lab.wait_state(job, "running")
    lab.kill(lab.agents["ws1"], signal.SIGKILL)  # gone for good; its shim fences the job at 6 s
    lab.wait(lambda: any(n["name"] == "ws1" and n["health"] == "lost" for n in lab.api("nodes")),
             "ws1 to be marked lost")
    assert lab.job(job)["attempt"] == 1  # not yet: the job may still be running there
    requeued = lab.wait_state(job, "queued", timeout=60)  # after requeue_after (25 s)
    assert requeued["attempt"] == 2
    # and by then the first attempt's process on ws1 is gone: the job never runs twice
    pid_files = list(lab.data.glob(f"agents/ws1/runtime/attempts/{job}.1/pid.json"))
    assert pid_files, "attempt 1 left no pid.json"
    pid = json.loads(pid_files[0].read_text())["pid"]
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
