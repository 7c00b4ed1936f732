"""``labq export``: a table of job specs as sbatch scripts and Kubernetes Jobs. Each Kubernetes Job deserializes into
the ``kubernetes`` client's models and serializes back to the same document (no field unknown to the API, none of
the wrong type); ``tests/slurm/test_export_sbatch.py`` has a real Slurm accept every script."""

from __future__ import annotations

import json

import pytest
import yaml
from kubernetes.client import ApiClient

from labq.export import K8sOptions, SlurmOptions, to_k8s, to_sbatch
from labq.export.k8s import to_documents
from labq.models.job import JobSpec, Mount, Runtime
from labq.models.notify import NotifyEvent

BASE = {"user": "alice", "command": ("python", "train.py", "--lr", "3e-4")}
#: name -> spec: the shapes a lab submits
SPECS = {
    "one GPU": JobSpec(**BASE),
    "a checkpointing job": JobSpec(**BASE, gpus=2, name="bert", time_limit_s=5400, checkpoint_signal="SIGUSR1",
                                   grace_s=90, env=(("WANDB_PROJECT", "it's \"mine\""),), workdir="/home/alice/bert",
                                   cpus=8, memory_mib=32000, notify=(NotifyEvent.END, NotifyEvent.FAIL)),
    "a model and two nodes": JobSpec(**BASE, gpus=8, nodes=2, gpu_model="A100", time_limit_s=3600,
                                     preemptible=False),
    "everything Slurm cannot say": JobSpec(**BASE, priority=300, depends_on=(3, 4), after_any=True, node="ws1",
                                           min_gpu_memory_mib=40960, reservation="paper", queue="nlp",
                                           requeue_on_timeout=True, time_limit_s=600),
    "a container": JobSpec(**BASE, runtime=Runtime.DOCKER, image="ghcr.io/lab/train:1.4", workdir="/work",
                           mounts=(Mount("/data/imagenet", "/data", True),), shm_size_mib=8192,
                           checkpoint_signal="SIGUSR2", grace_s=30),
    "a sharing task of an array": JobSpec(**BASE, share_mib=10240, array_id=12, array_index=3, array_cap=4,
                                          array_tasks=10, env=(("LABQ_ARRAY_ID", "12"), ("LABQ_ARRAY_INDEX", "3"))),
}


def sbatch_lines(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_a_checkpointing_job_keeps_its_gpus_time_signal_and_environment_on_slurm():
    script = to_sbatch(SPECS["a checkpointing job"], 12, SlurmOptions(partition="gpu"))
    assert script.startswith("#!/bin/bash\n# labq job 12, exported")
    assert sbatch_lines(script) == ["--job-name=bert", "--partition=gpu", "--nodes=1", "--ntasks-per-node=1",
                                    "--gres=gpu:2", "--cpus-per-task=8", "--mem=32000M", "--time=0-01:30:00",
                                    "--signal=B:USR1@90", "--requeue", "--chdir=/home/alice/bert",
                                    "--mail-type=END,FAIL"]
    assert "export WANDB_PROJECT='it'\"'\"'s \"mine\"'" in script  # the shell's quoting, not ours
    assert 'export LABQ_JOB_ID="$SLURM_JOB_ID"' in script
    assert 'export LABQ_ATTEMPT="$(( ${SLURM_RESTART_COUNT:-0} + 1 ))"' in script
    assert "export LABQ_PREEMPT_SIGNAL=SIGUSR1" in script
    assert 'export LABQ_CHECKPOINT_DIR="$HOME/labq-checkpoints/$SLURM_JOB_ID"' in script
    assert script.endswith("exec python train.py --lr 3e-4\n")


def test_two_nodes_run_through_srun_with_the_model_as_gres_type_and_no_requeue():
    script = to_sbatch(SPECS["a model and two nodes"], 7)
    assert {"--nodes=2", "--gres=gpu:a100:4", "--no-requeue", "--time=0-01:00:00"} <= set(sbatch_lines(script))
    assert script.endswith("exec srun --kill-on-bad-exit=1 python train.py --lr 3e-4\n")
    assert "GRES type 'a100' here: check your site's type names" in script


def test_what_slurm_cannot_say_is_listed_never_dropped():
    script = to_sbatch(SPECS["everything Slurm cannot say"], 9)
    notes = script.split("# not translated")[1].split("# the checkpoint contract")[0]
    for words in ("--dependency=afterany:<their Slurm ids>", "labq jobs 3, 4", "--nodelist", "40960 MiB",
                  "priority high (300)", "reservation 'paper'", "queue 'nlp'", "requeue at the time limit",
                  "no checkpoint signal declared"):
        assert words in notes, words


@pytest.mark.parametrize(("containers", "expected", "command"), [
    ("pyxis", ["--container-image=ghcr.io/lab/train:1.4", "--container-mounts=/data/imagenet:/data:ro",
               "--container-workdir=/work"], "exec python train.py --lr 3e-4"),
    ("apptainer", [], "exec apptainer exec --nv --bind /data/imagenet:/data:ro --pwd /work "
                      "docker://ghcr.io/lab/train:1.4 python train.py --lr 3e-4"),
    ("oci", ["--container=/srv/oci/train"], "exec python train.py --lr 3e-4"),
])
def test_a_container_job_runs_its_image_the_sites_way(containers, expected, command):
    script = to_sbatch(SPECS["a container"], 5, SlurmOptions(containers=containers, oci_bundle="/srv/oci/train"))
    lines = sbatch_lines(script)
    for line in expected:
        assert line in lines
    assert not any(line.startswith("--chdir") for line in lines)  # the image's own folder, or --container-workdir
    assert script.rstrip().endswith(command)


def test_a_value_slurm_would_cut_at_a_space_is_refused_not_mangled():
    with pytest.raises(ValueError, match="cannot be written on an #SBATCH line"):
        to_sbatch(JobSpec(**BASE, workdir="/home/alice/my runs"))


# -- Kubernetes -------------------------------------------------------------------------------------

def round_trip(doc: dict) -> dict:
    """``doc`` through the kubernetes client's V1Job model and back: what the API would keep of it."""
    api = ApiClient()
    return api.sanitize_for_serialization(api.deserialize(json.dumps(doc), "V1Job", "application/json"))


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("scheduler", ["kueue", "volcano"])
def test_every_exported_job_is_a_valid_v1_job_with_nothing_unknown(name, scheduler):
    text = to_k8s(SPECS[name], 12, K8sOptions(scheduler=scheduler, image="python:3.11", namespace="lab"))
    docs = [d for d in yaml.safe_load_all(text) if d]
    job = docs[0]
    assert job == round_trip(job)
    assert (job["apiVersion"], job["kind"], job["metadata"]["namespace"]) == ("batch/v1", "Job", "lab")
    assert docs == to_documents(SPECS[name], 12, K8sOptions(scheduler=scheduler, image="python:3.11",
                                                          namespace="lab"))[0]  # the YAML says what was meant


def test_kueue_gets_its_queue_and_priority_labels_and_a_suspended_job():
    job, = to_documents(SPECS["everything Slurm cannot say"], 9, K8sOptions(image="python:3.11"))[0]
    labels = job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "nlp" and labels["kueue.x-k8s.io/priority-class"] == "labq-high"
    assert job["spec"]["suspend"] is True and job["spec"]["activeDeadlineSeconds"] == 600


def test_a_gang_on_volcano_is_a_podgroup_of_all_its_pods():
    options = K8sOptions(scheduler="volcano", image="python:3.11")
    job, group = to_documents(SPECS["a model and two nodes"], 7, options)[0]
    pod = job["spec"]["template"]
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == group["metadata"]["name"]
    assert (job["spec"]["completions"], job["spec"]["parallelism"], job["spec"]["completionMode"]) == (2, 2, "Indexed")
    assert group["spec"]["minMember"] == 2
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}


def test_the_checkpoint_contract_on_kubernetes():
    job, = to_documents(SPECS["a container"], 5, K8sOptions())[0]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["terminationGracePeriodSeconds"] == 30
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sh", "-c", "kill -s USR2 1; sleep 30"]
    env = {e["name"]: e for e in container["env"]}
    assert env["LABQ_CHECKPOINT_DIR"]["value"] == "/labq/checkpoint"
    assert env["LABQ_PREEMPT_SIGNAL"]["value"] == "SIGUSR2"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["checkpoints"]["subPathExpr"] == "$(LABQ_JOB_ID)"
    assert mounts["mount-0"] == {"name": "mount-0", "mountPath": "/data", "readOnly": True}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8192Mi"}
    assert container["image"] == "ghcr.io/lab/train:1.4"


def test_a_job_that_runs_on_the_host_needs_an_image_to_go_to_kubernetes():
    with pytest.raises(ValueError, match="--image"):
        to_k8s(SPECS["one GPU"], 1, K8sOptions())
