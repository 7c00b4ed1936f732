"""Preemption with checkpoint and resume, with real processes: the examples' training loop as the victims."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import TEST_CONFIG, Lab

pytestmark = pytest.mark.timeout(150)

TRAIN = str(Path(__file__).resolve().parents[2] / "examples" / "checkpointing" / "train.py")


def train(*extra: str) -> tuple[str, ...]:
    return (sys.executable, TRAIN, "--steps", "1000000", "--step-time", "0.05", *extra)


def gpus(job: dict) -> set[tuple[str, int]]:
    return {(a["node"], g) for a in job["placement"]["allocations"] for g in a["gpu_indices"]}


def attempt_gpus(attempt: dict) -> set[tuple[str, int]]:
    return {(a["node"], g) for a in attempt["placement"]["allocations"] for g in a["gpu_indices"]}


def log(lab: Lab, job: int, attempt: int) -> str:
    return lab.labq("logs", str(job), "--attempt", str(attempt)).stdout


def step_reached(lab: Lab, job: int) -> int:
    steps = [int(s) for s in re.findall(r"step (\d+)", log(lab, job, 1))]
    return max(steps, default=0)


def test_urgent_job_takes_exactly_enough_gpus_and_the_victims_resume_from_their_checkpoints(running_lab):
    lab = running_lab  # one workstation, 4 GPUs
    low = [lab.submit(*train("--save-every", "1"), **{"class": "low"}) for _ in range(4)]
    for job in low:
        lab.wait_state(job, "running")
    lab.wait(lambda: all(lab.job(j).get("last_checkpoint_at") for j in low), "the periodic checkpoints to be reported")
    lab.wait(lambda: all(step_reached(lab, j) >= 10 for j in low), "every low job to make progress")
    bystander = lab.submit("true", **{"class": "low"})  # queued: it must not get the urgent job's GPUs
    urgent = lab.submit("sh", "-c", "echo urgent on $CUDA_VISIBLE_DEVICES; sleep 3", gpus=2, **{"class": "urgent"})

    running = lab.wait_state(urgent, "running", "succeeded", timeout=60)
    by_id = {j: lab.job(j) for j in low}
    victims = [j for j in low if by_id[j]["attempt"] > 1 or by_id[j]["state"] == "preempting"]
    assert len(victims) == 2, {j: (d["state"], d["attempt"]) for j, d in by_id.items()}
    freed = set().union(*(attempt_gpus(by_id[j]["attempts"][0]) for j in victims))
    assert gpus(running) == freed  # the urgent job runs exactly where the victims were
    assert lab.job(bystander)["state"] == "queued"
    for j in victims:
        first = by_id[j]["attempts"][0]
        assert (first["ended"], first["stop_reason"], first["preempted_for"]) == ("checkpointed", "preempted", urgent)
        assert first["work_lost_s"] < 1.0  # it saved on the signal and said so
        assert by_id[j]["preemptions"] == 1
    for j in set(low) - set(victims):  # the others never heard the signal
        assert by_id[j]["attempt"] == 1 and by_id[j]["state"] == "running"
        assert "checkpointed" not in log(lab, j, 1)

    lab.wait_state(urgent, "succeeded", timeout=60)
    for j in victims:
        lab.wait(lambda j=j: lab.job(j)["state"] == "running" and lab.job(j)["attempt"] == 2, f"job {j} to resume")
        saved = re.search(r"checkpointed at step (\d+)", log(lab, j, 1))
        assert saved, log(lab, j, 1)
        lab.wait(lambda j=j: "resumed at" in log(lab, j, 2), f"job {j}'s second attempt to start its loop")
        assert f"attempt 2: resumed at step {saved.group(1)}" in log(lab, j, 2)
        assert int(saved.group(1)) >= 10  # it continued, not restarted
    shown = lab.labq("show", str(victims[0])).stdout
    assert "preempted for job" in shown and "checkpointed" in shown and "attempts" in shown
    for job in low:
        lab.labq("cancel", str(job))


def test_ignoring_crashing_protected_and_equal_jobs(running_lab):
    lab = running_lab
    usr1 = {"checkpoint_signal": "SIGUSR1"}  # these jobs declare the signal they answer
    ignores = lab.submit("sh", "-c", "trap '' USR1; echo ready; sleep 300", **usr1, **{"class": "low"})
    crashes = lab.submit("sh", "-c", "trap 'echo crashing; exit 3' USR1; echo ready; while true; do sleep 0.1; done",
                         **usr1, **{"class": "low"})
    protected = lab.submit("sh", "-c", "trap 'echo SIGNALLED' USR1; while true; do sleep 0.1; done",
                           no_preempt=True, **usr1, **{"class": "low"})
    equal = lab.submit("sh", "-c", "trap 'echo SIGNALLED' USR1; while true; do sleep 0.1; done", **usr1,
                       **{"class": "high"})
    for job in (ignores, crashes, protected, equal):
        lab.wait_state(job, "running")
    lab.wait(lambda: "ready" in log(lab, ignores, 1) and "ready" in log(lab, crashes, 1), "the traps to be set")
    high = lab.submit("sleep", "1", gpus=2, **{"class": "high"})

    lab.wait_state(high, "running", "succeeded", timeout=60)
    killed = lab.job(ignores)["attempts"][0]
    assert (killed["ended"], killed["stop_reason"]) == ("killed", "preempted")
    assert killed["ended_at"] - killed["started_at"] >= 2.0  # not before its grace (2 s)
    crashed = lab.job(crashes)["attempts"][0]
    assert (crashed["ended"], crashed["exit_code"], crashed["stop_reason"]) == ("preempted", 3, "preempted")
    for job in (ignores, crashes):
        assert lab.job(job)["state"] in ("queued", "starting", "running")  # requeued, not failed
    for job in (protected, equal):
        assert lab.job(job)["attempt"] == 1 and lab.job(job)["state"] == "running"
        assert "SIGNALLED" not in log(lab, job, 1)
    assert "killed after its grace" in lab.labq("show", str(ignores)).stdout
    for job in (ignores, crashes, protected, equal):
        lab.labq("cancel", str(job))


def test_minimum_runtime_is_respected(tmp_path):
    lab = Lab(tmp_path, TEST_CONFIG.replace('min_runtime = "0s"', 'min_runtime = "6s"'))
    try:
        lab.start_leader()
        lab.start_agent(gpus="sim:flat:1")
        low = lab.submit(*train(), **{"class": "low"})
        lab.wait_state(low, "running")
        urgent = lab.submit("true", **{"class": "urgent"})
        lab.wait_state(urgent, "succeeded", timeout=60)
        first = lab.job(low)["attempts"][0]
        assert first["ended_at"] - first["started_at"] >= 6.0
        lab.labq("cancel", str(low))
    finally:
        lab.close()


def test_time_limit_signals_a_grace_early_and_requeues_only_when_asked(running_lab):
    lab = running_lab
    ends = lab.submit(*train(), time="4s", grace="2s")
    again = lab.submit(*train(), time="4s", grace="2s", requeue_on_timeout=True)
    done = lab.wait_state(ends, "timeout", timeout=60)
    first = done["attempts"][0]
    assert (first["ended"], first["stop_reason"]) == ("checkpointed", "timeout")
    assert 1.5 <= first["ended_at"] - first["started_at"] < 4.0  # the signal came a grace before the limit
    lab.wait(lambda: lab.job(again)["attempt"] == 2, "the job asking for it to be requeued")
    lab.wait(lambda: "resumed at" in log(lab, again, 2), "its second attempt to resume")
    saved = re.search(r"checkpointed at step (\d+)", log(lab, again, 1)).group(1)
    assert f"resumed at step {saved}" in log(lab, again, 2)
    lab.labq("cancel", str(again))


def test_who_may_submit_jobs_that_cannot_be_preempted(running_lab):
    lab = running_lab
    added = lab.labq("admin", "user", "add", "carol", "--print")
    token = next(w.strip('"') for w in added.stdout.split() if w.strip('"').startswith("lqu_"))
    out = lab.labq("submit", "--no-preempt", "--", "true", token=token, check=False)
    assert out.returncode == 1 and "non_preemptible_users" in out.stderr
    assert lab.api("ls", "--all") == []  # refused whole


def test_an_agent_restarted_during_the_grace_neither_signals_again_nor_forgets_to_stop(running_lab):
    import signal as signals

    lab = running_lab
    stubborn = lab.submit("sh", "-c", "trap 'echo GOT $(date +%s.%N)' USR1; echo ready; while true; do sleep 0.1; done",
                          gpus=4, grace="4s", checkpoint_signal="SIGUSR1", **{"class": "low"})
    lab.wait_state(stubborn, "running")
    lab.wait(lambda: "ready" in log(lab, stubborn, 1), "the trap to be set")
    urgent = lab.submit("true", **{"class": "urgent"})
    lab.wait(lambda: "GOT" in log(lab, stubborn, 1), "the checkpoint signal")
    lab.kill(lab.agents["ws1"], signals.SIGKILL)
    lab.start_agent()  # the same node, the same data folder
    lab.wait_state(urgent, "succeeded", timeout=60)
    first = lab.job(stubborn)["attempts"][0]
    assert first["ended"] == "killed"
    assert log(lab, stubborn, 1).count("GOT") == 1  # signalled once, by the first agent
    signalled = float(re.search(r"GOT (\S+)", log(lab, stubborn, 1)).group(1))
    assert first["ended_at"] - signalled >= 3.9  # its whole grace, counted from that signal
    lab.labq("cancel", str(stubborn))


def test_a_job_that_declared_no_checkpoint_signal_is_stopped_with_term_and_its_grace(running_lab):
    lab = running_lab  # 4 GPUs
    cleans_up = "trap 'echo cleaning up on TERM; exit 0' TERM; echo ready; while true; do sleep 0.1; done"
    plain = lab.submit("sh", "-c", cleans_up, gpus=4, **{"class": "low"})  # no --checkpoint-signal
    lab.wait_state(plain, "running")
    lab.wait(lambda: "ready" in log(lab, plain, 1), "the job's trap to be set")
    assert "no checkpoint signal (a stop is TERM)" in lab.labq("show", str(plain)).stdout
    urgent = lab.submit("true", **{"class": "urgent"})
    lab.wait_state(urgent, "succeeded", timeout=60)
    first = lab.job(plain)["attempts"][0]
    assert (first["ended"], first["exit_code"]) == ("checkpointed", 0)  # it was asked as it expects, not killed
    assert "cleaning up on TERM" in log(lab, plain, 1)
    lab.labq("cancel", str(plain))


def test_a_job_that_declares_its_signal_with_labq_checkpoint_is_preempted_with_it_on_every_attempt(running_lab):
    lab = running_lab  # 4 GPUs
    saves = ("trap 'echo saved on USR1; exit 0' USR1; echo preempt signal $LABQ_PREEMPT_SIGNAL; "
             f"{sys.executable} -m labq.cli checkpoint --signal usr1 && echo ready; while true; do sleep 0.1; done")
    job = lab.submit("sh", "-c", saves, gpus=4, **{"class": "low"})  # no --checkpoint-signal at submit
    lab.wait_state(job, "running")
    lab.wait(lambda: lab.job(job).get("learned_signal") == "SIGUSR1", "the leader to hear the job's signal")
    assert "ready" in log(lab, job, 1) and "preempt signal SIGTERM" in log(lab, job, 1)  # declared after launch
    shown = lab.labq("show", str(job)).stdout
    assert "checkpoint signal SIGUSR1 (the job said with labq checkpoint --signal)" in shown
    urgent = lab.submit("true", **{"class": "urgent"})
    lab.wait_state(urgent, "succeeded", timeout=60)
    first = lab.job(job)["attempts"][0]
    assert (first["ended"], first["exit_code"]) == ("checkpointed", 0)  # USR1, as it asked, not TERM
    assert "saved on USR1" in log(lab, job, 1)
    lab.wait(lambda: "preempt signal SIGUSR1" in log(lab, job, 2), "the next attempt, told its signal")
    lab.labq("cancel", str(job))
