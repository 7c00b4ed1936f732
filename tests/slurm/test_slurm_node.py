"""A Slurm partition as one more labq node, end to end: a real leader, a simulated workstation and an agent with
``--runtime slurm`` on a real one-node Slurm (``tests/slurm_cluster.py``). Jobs run on both; a low job on the Slurm
node is preempted through its checkpoint signal (``scancel --batch --signal``) and resumes from its checkpoint;
its log follows; a cancel ends the Slurm job."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import TEST_CONFIG, Lab

pytestmark = pytest.mark.timeout(180)

TRAIN = str(Path(__file__).resolve().parents[2] / "examples" / "checkpointing" / "train.py")


@pytest.fixture
def lab(tmp_path, slurm):
    yield from _lab(tmp_path, slurm)


@pytest.fixture
def patient_lab(tmp_path, slurm):
    """A lab whose jobs may take a minute to save (``--grace 1m``): a test holds a victim in its checkpoint."""
    yield from _lab(tmp_path, slurm, TEST_CONFIG.replace('max_grace = "5s"', 'max_grace = "1m"')
                    .replace('requeue_after = "25s"', 'requeue_after = "90s"'))


def _lab(tmp_path, slurm, config: str = TEST_CONFIG):
    made = Lab(tmp_path, config)
    made.start_leader()
    made.start_agent("ws1", "sim:ws-4x3090")
    made.agents["slurm1"] = made._spawn(["agent", "--leader", made.url, "--runtime", "slurm", "--partition",
                                         slurm.partition, "--name", "slurm1", "--data-dir", str(made.data)],
                                        "agent-slurm1.log", SLURM_CONF=str(slurm.conf))
    made.wait(lambda: any(n["name"] == "slurm1" and n["health"] == "up" for n in made.api("nodes")),
              "the Slurm node to join", detail=lambda: (tmp_path / "agent-slurm1.log").read_text()[-2000:])
    yield made
    made.close()
    slurm.run("scancel", "--full", "--partition", slurm.partition, check=False)


def slurm_jobs(slurm) -> list[str]:
    return slurm.run("squeue", "-h", "-o", "%j %T").stdout.split("\n")


def test_jobs_run_on_a_workstation_and_on_slurm_and_a_low_job_there_is_preempted_and_resumes(lab, slurm):
    nodes = {n["name"]: n for n in lab.api("nodes")}
    assert len(nodes["slurm1"]["gpus"]) == 8 and "a100" in nodes["slurm1"]["gpus"][0]["model"]
    said = f"jobs go to Slurm partition {slurm.partition} (node {slurm.host}) as their lab user's account"
    lab.wait(lambda: said in (lab.root / "agent-slurm1.log").read_text(),  # whose account Slurm charges, at start
             "the Slurm agent to say whose account its jobs go to Slurm as")
    # and that a preemptor waits for Slurm's tick here, which has no Epilog (the partition test's Slurm has one): said
    # after the line above, once ``scontrol show config`` answered
    lab.wait(lambda: "this Slurm runs no Epilog" in (lab.root / "agent-slurm1.log").read_text(),
             "the Slurm agent to say that this Slurm runs no Epilog")
    here = lab.submit("sh", "-c", "echo on the workstation", node="ws1")
    there = lab.submit("sh", "-c", "echo on slurm as job $SLURM_JOB_ID with $SLURM_GPUS_ON_NODE GPUs, labq job "
                       "$LABQ_JOB_ID", node="slurm1", gpus=2)
    lab.wait_state(here, "succeeded")
    lab.wait_state(there, "succeeded", timeout=60)
    assert re.fullmatch(rf"on slurm as job \d+ with 2 GPUs, labq job {there}\n", lab.labq("logs", str(there)).stdout)
    # -f follows a Slurm job's log as it grows, and ends when the job does
    slow = lab.submit("sh", "-c", "for i in 1 2 3; do echo line $i; sleep 0.5; done", node="slurm1")
    followed = lab.labq("logs", "-f", str(slow))
    assert followed.stdout == "line 1\nline 2\nline 3\n" and lab.job(slow)["state"] == "succeeded"

    low = lab.submit(sys.executable, TRAIN, "--steps", "100000", "--step-time", "0.05", "--save-every", "1",
                     node="slurm1", gpus=8, checkpoint_signal="SIGUSR1", **{"class": "low"})
    lab.wait_state(low, "running", timeout=60)
    assert any(line.startswith(f"labq-{low}.1 RUNNING") for line in slurm_jobs(slurm))
    lab.wait(lambda: "step" in lab.labq("logs", str(low)).stdout, "the low job to make progress")
    urgent = lab.submit("sh", "-c", "echo urgent; sleep 1", node="slurm1", gpus=8, **{"class": "urgent"})
    lab.wait_state(urgent, "succeeded", timeout=90)
    resumed = lab.wait_state(low, "running", timeout=90)
    (first,) = resumed["attempts"]
    assert (first["stop_reason"], first["ended"], first["preempted_for"]) == ("preempted", "checkpointed", urgent)
    assert resumed["attempt"] == 2
    lab.wait(lambda: "resumed" in lab.labq("logs", str(low)).stdout.lower(), "the second attempt to resume",
             detail=lambda: lab.labq("logs", str(low)).stdout[-500:])

    lab.labq("cancel", str(low))
    lab.wait_state(low, "cancelled", timeout=60)
    lab.wait(lambda: not any(line.startswith(f"labq-{low}.2 RUNNING") for line in slurm_jobs(slurm)),
             "Slurm to end the cancelled job")



def test_a_preemptor_is_handed_to_slurm_while_its_victim_checkpoints(patient_lab, slurm, tmp_path):
    """Slurm starts a job only once its GPUs are free, so labq hands it the preemptor with the victim's signal: it
    waits in Slurm's queue while the victim saves, and Slurm starts it the moment the victim ends (at once where the
    site runs an Epilog), instead of labq handing it over only after hearing of the end (then Slurm starts it on a
    tick of its own, seconds later)."""
    signalled, go = tmp_path / "signalled", tmp_path / "go"
    low = patient_lab.submit("bash", "-c", f"trap 'touch {signalled}; while [ ! -e {go} ]; do sleep 0.05; done; exit 0' USR1;"
                     " while true; do sleep 0.05; done", node="slurm1", gpus=8, checkpoint_signal="SIGUSR1",
                     grace="1m", **{"class": "low"})
    patient_lab.wait_state(low, "running", timeout=60)
    urgent = patient_lab.submit("sh", "-c", "echo urgent", node="slurm1", gpus=8, **{"class": "urgent"})
    patient_lab.wait(signalled.exists, "the low job to be signalled to save", timeout=60)
    try:
        patient_lab.wait(lambda: {f"labq-{low}.1 RUNNING", f"labq-{urgent}.1 PENDING"} <= set(slurm_jobs(slurm)),
                 "the urgent job to wait in Slurm's queue while the low job saves", detail=lambda: slurm_jobs(slurm))
        assert patient_lab.job(urgent)["state"] == "starting" and patient_lab.job(low)["state"] == "preempting"
        patient_lab.wait(lambda: "Slurm holds it: Resources" in patient_lab.labq("why", str(urgent)).stdout,
                 "labq to say Slurm holds the urgent job for the low job's GPUs",
                 detail=lambda: patient_lab.labq("why", str(urgent)).stdout)
    finally:
        go.touch()
    patient_lab.wait_state(urgent, "succeeded", timeout=60)
    assert patient_lab.labq("logs", str(urgent)).stdout == "urgent\n"
    requeued = patient_lab.wait_state(low, "running", "queued", "starting", timeout=60)
    (first,) = requeued["attempts"]
    assert (first["stop_reason"], first["ended"], first["preempted_for"]) == ("preempted", "checkpointed", urgent)
    patient_lab.labq("cancel", str(low))
    patient_lab.wait_state(low, "cancelled", timeout=60)

def test_a_job_slurm_holds_back_stays_starting_and_says_why(lab, slurm, tmp_path):
    outside = tmp_path / "outside.sbatch"  # someone on the cluster who does not go through labq takes every GPU
    outside.write_text("#!/bin/bash\n#SBATCH --gres=gpu:8\n#SBATCH --output=/dev/null\nsleep 120\n")
    taken = slurm.run("sbatch", "--parsable", str(outside)).stdout.strip()
    try:
        job = lab.submit("sh", "-c", "echo at last", node="slurm1")
        # Slurm's own reason once its scheduler has looked (before that, labq says it has not): the GPUs are taken
        # (Resources), or a job ahead of it waits for them (Priority)
        said = re.compile(rf"job {job} is starting on slurm1:0, handed to slurm1: Slurm holds it: "
                          r"(Resources|Priority)\n")
        lab.wait(lambda: "Priority" in (why := lab.labq("why", str(job)).stdout) or "Resources" in why,
                 "labq to give Slurm's reason for holding the job", detail=lambda: lab.labq("why", str(job)).stdout)
        why = lab.labq("why", str(job)).stdout
        assert said.fullmatch(why), why
        assert lab.job(job)["state"] == "starting"
    finally:
        slurm.run("scancel", taken, check=False)
    lab.wait_state(job, "succeeded", timeout=60)
    assert lab.labq("logs", str(job)).stdout == "at last\n"


def test_a_slurm_node_that_slurm_drains_takes_no_job_until_slurm_resumes_it(lab, slurm):
    """Slurm's admin drains the node: labq counts its GPUs busy outside labq, so a job waits in labq's queue (where
    it could go elsewhere) instead of being handed to a node that will not run it; resumed, the job runs."""
    drained = False
    try:
        slurm.run("scontrol", "update", f"NodeName={slurm.host}", "State=DRAIN", "Reason=disk swap")
        drained = True
        lab.wait(lambda: len(next(n for n in lab.api("nodes") if n["name"] == "slurm1")["unmanaged_busy"]) == 8,
                 "labq to see the Slurm node drained", timeout=30)
        job = lab.submit("sh", "-c", "echo after the disk swap", node="slurm1")
        # a pass has looked at it and left it waiting, for that reason
        lab.wait(lambda: "busy outside labq: 8 on slurm1" in lab.labq("why", str(job)).stdout,
                 "labq to say the job waits for GPUs busy outside labq",
                 detail=lambda: lab.labq("why", str(job)).stdout)
        assert lab.job(job)["state"] == "queued"
        assert not [line for line in slurm_jobs(slurm) if line.startswith(f"labq-{job}.")]  # not handed to Slurm
    finally:
        if drained:
            slurm.run("scontrol", "update", f"NodeName={slurm.host}", "State=RESUME")
    lab.wait_state(job, "succeeded", timeout=60)
    assert lab.labq("logs", str(job)).stdout == "after the disk swap\n"
    said = (lab.root / "agent-slurm1.log").read_text()
    # Slurm's reason, with who set it and when ("disk swap [root@...]")
    assert f"Slurm node {slurm.host} is IDLE+DRAIN (disk swap [" in said and "places jobs there again" in said
