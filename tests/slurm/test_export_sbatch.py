"""A real Slurm takes every exported script (``sbatch --test-only``), and one of them runs for real: the checkpoint
contract's variables come from Slurm's own (the same job id, one more restart after a requeue)."""

from __future__ import annotations

import time

import pytest

from labq.export import SlurmOptions, to_sbatch
from labq.models.job import JobSpec
from tests.unit.test_export import SPECS

pytestmark = pytest.mark.timeout(120)

#: how each container spec is exported here: pyxis is a plugin this Slurm lacks, so its flags would be unknown
SITES = [SlurmOptions(partition="gpu", containers="apptainer"), SlurmOptions(containers="oci",
                                                                               oci_bundle="/srv/oci/train")]


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("site", range(len(SITES)))
def test_slurm_accepts_every_exported_script(slurm, tmp_path, name, site):
    spec = SPECS[name]
    if spec.workdir:  # the folder must exist where sbatch runs it
        spec = JobSpec(**{**spec.__dict__, "workdir": str(tmp_path)}) if spec.runtime.value == "process" else spec
    script = tmp_path / "job.sbatch"
    script.write_text(to_sbatch(spec, 12, SITES[site]))
    out = slurm.run("sbatch", "--test-only", str(script), check=False)
    assert out.returncode == 0 and "to start at" in out.stderr, out.stderr


def test_a_request_slurm_cannot_meet_is_refused_so_the_test_above_means_something(slurm, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(to_sbatch(JobSpec(user="alice", command=("true",), gpus=9), 1))  # 8 GPUs on the node
    out = slurm.run("sbatch", "--test-only", str(script), check=False)
    assert out.returncode != 0, out.stderr


def test_the_checkpoint_contract_comes_from_slurm_across_a_requeue(slurm, tmp_path):
    record = tmp_path / "seen"
    spec = JobSpec(user="alice", command=("sh", "-c", f'echo "$LABQ_JOB_ID $LABQ_ATTEMPT $LABQ_RESUMED '
                                                       f'$LABQ_CHECKPOINT_DIR $CUDA_VISIBLE_DEVICES" >> {record}; '
                                                       "sleep 60"),
                   gpus=2, workdir=str(tmp_path), checkpoint_signal="SIGUSR1", grace_s=5)
    script = tmp_path / "job.sbatch"
    script.write_text(to_sbatch(spec, 3, SlurmOptions(checkpoint_root=str(tmp_path / "ckpt"))))
    job = slurm.run("sbatch", "--parsable", str(script)).stdout.strip().split(";")[0]
    try:
        wait_for(lambda: record.exists() and len(record.read_text().splitlines()) == 1, "the first run")
        slurm.run("scontrol", "requeue", job)
        # Slurm holds a requeued job back two minutes (BeginTime): once it waits, let it go at once
        wait_for(lambda: slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "PENDING", "the requeue")
        slurm.run("scontrol", "update", f"jobid={job}", "starttime=now")
        wait_for(lambda: len(record.read_text().splitlines()) == 2, "the run after the requeue", timeout=60)
    finally:
        slurm.run("scancel", job, check=False)
    first, second = (line.split() for line in record.read_text().splitlines())
    assert first[:4] == [job, "1", "0", str(tmp_path / "ckpt" / job)]
    assert second[:4] == [job, "2", "1", str(tmp_path / "ckpt" / job)]
    assert (tmp_path / "ckpt" / job).is_dir()


def wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
