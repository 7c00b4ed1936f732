"""Container jobs end to end: labq submit --image through a real leader and agent onto a real dockerd."""

from __future__ import annotations


import pytest

from tests.docker.conftest import IMAGE, container_lab
from tests.e2e.conftest import TEST_CONFIG

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def docker_lab(docker_client, tmp_path):
    allowed = tmp_path / "datasets"
    (allowed / "imagenet").mkdir(parents=True)
    (allowed / "imagenet" / "labels.txt").write_text("cat\ndog\n")
    config = TEST_CONFIG.replace("[jobs]\n", f'[jobs]\nallowed_mount_roots = ["{allowed}"]\n')
    with container_lab(docker_client, tmp_path / "lab", config) as lab:
        lab.allowed = allowed
        yield lab


def test_a_container_job_runs_with_its_mount_and_exit_code(docker_lab):
    lab = docker_lab
    job = lab.submit("sh", "-c", "cat /data/imagenet/labels.txt; echo gpus=$NVIDIA_VISIBLE_DEVICES; id -u; exit 3",
                     image=IMAGE, mount=f"{lab.allowed}:/data:ro", gpus=2, token=lab.token)
    done = lab.wait_state(job, "failed", timeout=90)
    assert done["exit_code"] == 3
    log = lab.labq("logs", str(job)).stdout
    assert "cat\ndog\n" in log and "gpus=0,1" in log
    assert "65534" in log  # nobody's uid, not root


@pytest.mark.parametrize(
    ("mount", "words"),
    [("/etc:/x", "not allowed here"), ("/var/run/docker.sock:/s", "not allowed here"),
     ("/:/host", "not allowed here"), ("{allowed}/../..:/x", "not allowed here")],
)
def test_hostile_mounts_are_refused_by_the_leader(docker_lab, mount, words):
    lab = docker_lab
    out = lab.labq("submit", "--image", IMAGE, "--mount", mount.format(allowed=lab.allowed), "--", "true",
                   check=False, token=lab.token)
    assert out.returncode == 1 and words in out.stderr
    assert lab.api("ls", "--all") == []


def test_user_set_gpu_variables_are_refused(docker_lab):
    out = docker_lab.labq("submit", "--image", IMAGE, "--env", "NVIDIA_VISIBLE_DEVICES=all", "--", "true",
                          check=False, token=docker_lab.token)
    assert out.returncode != 0 and "NVIDIA_VISIBLE_DEVICES" in out.stderr


def test_an_image_missing_on_the_node_requeues_the_job_and_says_why(docker_lab):
    """A missing image is the node's problem, not the job's: the job waits (it would run on a node that has
    the image), its first attempt ended lost, and its note, why and that attempt's log say what is missing."""
    lab = docker_lab
    job = lab.submit("true", image="labq-no-such-image:0", token=lab.token)
    lab.wait(lambda: lab.job(job, token=lab.token)["attempts"], "the first attempt to end", 60)
    doc = lab.job(job, token=lab.token)
    assert doc["state"] in ("queued", "starting") and doc["attempts"][0]["ended"] == "lost"
    missing = f"not found on node {lab.node}"
    assert missing in doc["note"]
    assert missing in lab.labq("why", str(job), token=lab.token).stdout
    assert missing in lab.labq("logs", str(job), "--attempt", "1", token=lab.token).stdout
    lab.labq("cancel", str(job), token=lab.token)


@pytest.mark.parametrize("extra", [{"privileged": True}, {"cap_add": ["SYS_ADMIN"]}, {"network_mode": "host"},
                                   {"pid_mode": "host"}, {"user": "0:0"}, {"devices": ["/dev/nvidia0"]}])
def test_asking_for_host_powers_is_refused_by_name(docker_lab, extra):
    import http.client
    import json
    import urllib.parse

    parts = urllib.parse.urlsplit(docker_lab.url)
    body = json.dumps({"command": ["true"], "runtime": "docker", "image": IMAGE, **extra}).encode()
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("POST", "/v1/jobs", body=body, headers={"Authorization": f"Bearer {docker_lab.token}",
                                                         "Content-Length": str(len(body))})
    response = conn.getresponse()
    doc = json.loads(response.read())
    assert response.status == 400 and f"unknown field {next(iter(extra))}" in doc["error"]["message"]


def test_a_container_job_of_root_is_refused_on_the_node(docker_lab):
    lab = docker_lab
    job = lab.submit("id", image=IMAGE)  # the lab's first admin is root here
    assert lab.wait_state(job, "failed", timeout=60)["exit_code"] == 126
    assert "may not run as root" in lab.labq("logs", str(job)).stdout


def test_container_jobs_checkpoint_on_preemption_and_resume(docker_lab):
    """Low-priority containers fill the node; an urgent job takes two GPUs; the victims resume where they saved."""
    import re
    import shutil
    from pathlib import Path

    lab = docker_lab
    script = lab.allowed / "train.sh"
    shutil.copy(Path(__file__).resolve().parents[2] / "examples" / "checkpointing" / "train.sh", script)
    script.chmod(0o644)

    def log(job: int, attempt: int) -> str:
        return lab.labq("logs", str(job), "--attempt", str(attempt)).stdout

    low = [lab.submit("sh", "/data/train.sh", "1000000", "0.05", image=IMAGE, mount=f"{lab.allowed}:/data:ro",
                      token=lab.token, **{"class": "low"}) for _ in range(4)]
    for job in low:
        lab.wait_state(job, "running", timeout=90)
    lab.wait(lambda: all("step 10" in log(j, 1) for j in low), "every container to make progress", timeout=60)
    urgent = lab.submit("sleep", "2", gpus=2, **{"class": "urgent"})  # the admin's process job
    lab.wait_state(urgent, "running", "succeeded", timeout=60)
    victims = [j for j in low if lab.job(j)["attempt"] > 1 or lab.job(j)["state"] == "preempting"]
    assert len(victims) == 2
    lab.wait_state(urgent, "succeeded", timeout=60)
    for j in victims:
        lab.wait(lambda j=j: lab.job(j)["attempt"] == 2 and "resumed at" in log(j, 2), f"job {j} to resume",
                 timeout=60)
        first = lab.job(j)["attempts"][0]
        assert (first["ended"], first["preempted_for"]) == ("checkpointed", urgent)
        saved = re.search(r"checkpointed at step (\d+)", log(j, 1)).group(1)
        assert int(saved) >= 10 and f"resumed at step {saved}" in log(j, 2)
    for j in set(low) - set(victims):
        assert lab.job(j)["attempt"] == 1 and "checkpointed" not in log(j, 1)
    for job in low:
        lab.labq("cancel", str(job), token=lab.token)


def test_an_image_that_declares_its_checkpoint_signal_by_label_is_preempted_with_it(docker_lab, labelled_image):
    lab = docker_lab
    saves = "trap 'echo saved on USR1; exit 0' USR1; echo ready; while true; do sleep 0.1; done"
    job = lab.submit("sh", "-c", saves, image=labelled_image, gpus=4, token=lab.token, **{"class": "low"})
    lab.wait_state(job, "running", timeout=90)
    lab.wait(lambda: lab.job(job).get("learned_from") == "image", "the leader to hear the image's label")
    assert "checkpoint signal SIGUSR1 (its image's label labq.checkpoint-signal says)" in lab.labq(
        "show", str(job), token=lab.token).stdout
    lab.wait(lambda: "ready" in lab.labq("logs", str(job), token=lab.token).stdout, "the job's trap to be set")
    urgent = lab.submit("true", **{"class": "urgent"})
    lab.wait_state(urgent, "succeeded", timeout=60)
    first = lab.job(job)["attempts"][0]
    assert (first["ended"], first["exit_code"]) == ("checkpointed", 0)  # USR1, as its image says, not TERM
    assert "saved on USR1" in lab.labq("logs", str(job), "--attempt", "1", token=lab.token).stdout
    lab.labq("cancel", str(job), token=lab.token)
