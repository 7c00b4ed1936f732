"""``labq export`` as people run it: a job of the lab (a real leader on loopback), an array's task, a spec file, and
the clear errors for what cannot be exported."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.cli.test_arrays_cli import lab, labq  # noqa: F401 - the fixture, and the CLI in this process

pytestmark = pytest.mark.timeout(60)


def test_a_submitted_job_exports_as_it_was_asked(lab):  # noqa: F811
    out, _ = labq("submit", "--json", "--gpus", "2", "--time", "90m", "--checkpoint-signal", "SIGUSR1", "--grace",
                  "45s", "--name", "bert", "--env", "SEED=7", "--", "python", "train.py")
    job = json.loads(out)["id"]
    script, _ = labq("export", str(job), "--to", "slurm", "--partition", "gpu")
    assert f"# labq job {job}, exported" in script
    for line in ("#SBATCH --job-name=bert", "#SBATCH --gres=gpu:2", "#SBATCH --time=0-01:30:00",
                 "#SBATCH --signal=B:USR1@45", "#SBATCH --partition=gpu", "export SEED=7",
                 "exec python train.py"):
        assert line in script
    text, _ = labq("export", str(job), "--to", "k8s", "--image", "python:3.11")
    (doc,) = yaml.safe_load_all(text)
    assert doc["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}


def test_an_arrays_task_exports_with_its_own_command(lab):  # noqa: F811
    out, _ = labq("submit", "--json", "--array", "0-2", "--", "python", "train.py", "--shard", "{index}")
    array = json.loads(out)["array"]["id"]
    script, _ = labq("export", f"{array}.2", "--to", "slurm")
    assert "exec python train.py --shard 2" in script and "export LABQ_ARRAY_INDEX=2" in script
    assert f"task 2 of labq array {array}" in script
    _, err = labq("export", str(array), "--to", "slurm", code=2)
    assert "is an array" in err


def test_a_spec_file_exports_without_a_leader(tmp_path, monkeypatch):
    monkeypatch.delenv("LABQ_LEADER", raising=False)
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"command": ["python", "eval.py"], "gpus": 1, "image": "ghcr.io/lab/eval:2",
                                "runtime": "docker"}))
    text, _ = labq("export", "--from-spec", str(spec), "--to", "k8s")
    (doc,) = yaml.safe_load_all(text)
    assert doc["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/lab/eval:2"


@pytest.mark.parametrize(("body", "words"), [
    ("not json", "not JSON"),
    (json.dumps({"command": ["x"], "gpus": 0}), "gpus"),
    (json.dumps({"command": ["x"], "array": "0-3"}), "one task at a time"),
])
def test_a_bad_spec_file_is_a_clear_error(tmp_path, body, words):
    spec = tmp_path / "job.json"
    spec.write_text(body)
    _, err = labq("export", "--from-spec", str(spec), "--to", "slurm", code=2)
    assert words in err


def test_a_host_job_needs_an_image_for_kubernetes(tmp_path):
    spec = tmp_path / "job.json"
    spec.write_text(json.dumps({"command": ["python", "eval.py"]}))
    _, err = labq("export", "--from-spec", str(spec), "--to", "k8s", code=2)
    assert "--image" in err
    _, err = labq("export", "--from-spec", str(tmp_path / "missing.json"), "--to", "k8s", code=2)
    assert "No such file" in err
