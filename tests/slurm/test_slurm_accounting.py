"""How a Slurm job ended when slurmctld no longer keeps it (an agent away longer than Slurm's ``MinJobAge``): read
from Slurm's accounting (``sacct``, slurmdbd on a real MariaDB of the test's own), with its real exit and end time;
without accounting, unknown. Real Slurm, a real runtime; slurmctld is started again with a clean state to make it
forget, as ``MinJobAge`` would."""

from __future__ import annotations

import time

import pytest

from tests.slurm.conftest import running
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.timeout(150)

JOBS = {1: "sleep 0.3; exit 3", 2: "sleep 0.3; exit 0", 3: "sleep 0.3; kill -TERM $$"}


@pytest.fixture(scope="module", params=[True, False], ids=["with-accounting", "without-accounting"])
def cluster(request, tmp_path_factory):
    yield from running(SlurmCluster(tmp_path_factory.mktemp("slurm"), accounting=request.param),
                       "Slurm with accounting" if request.param else "Slurm")


def test_an_end_slurmctld_forgot_is_read_from_the_accounting(cluster, tmp_path, monkeypatch):
    from labq.agent.process_runtime import AttemptState, Launch
    from labq.agent.slurm import SlurmRuntime, SlurmSite

    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    site = SlurmSite(cluster.partition, None, "agent")
    runtime = SlurmRuntime(tmp_path / "slurm", site, site.slurm_node())
    for job_id, script in JOBS.items():
        runtime.launch(Launch(job_id, 1, ("bash", "-c", script), {}, "/tmp", None, {"CUDA_VISIBLE_DEVICES": "0"}))
    # the agent is away (nobody asks Slurm) while the jobs run and end
    names = ",".join(f"labq-{job_id}.1" for job_id in JOBS)
    deadline = time.monotonic() + 60
    while cluster.run("squeue", "-h", "-n", names, "-t", "PENDING,RUNNING,COMPLETING", "-o", "%i").stdout.strip():
        assert time.monotonic() < deadline, "the jobs did not end"
        time.sleep(0.2)
    if cluster.accounting:  # until slurmctld has handed the three ends to slurmdbd
        ids = ",".join(runtime._slurm_id(job_id, 1) for job_id in JOBS)
        while len([row for row in cluster.run("sacct", "-n", "-P", "-X", "-j", ids, "-o", "State").stdout.splitlines()
                   if row and row.split()[0] not in ("PENDING", "RUNNING", "COMPLETING")]) < len(JOBS):
            assert time.monotonic() < deadline, "slurmdbd did not get the jobs' ends"
            time.sleep(0.2)
    forgotten_at = time.time()
    cluster.forget_jobs()
    for slurm_id in (runtime._slurm_id(job_id, 1) for job_id in JOBS):
        assert "Invalid job id" in cluster.run("scontrol", "show", "job", slurm_id, check=False).stderr

    ended = {s.job_id: s for s in runtime.attempts()}
    assert {job_id: s.state for job_id, s in ended.items()} == dict.fromkeys(JOBS, AttemptState.EXITED)
    codes = {job_id: (s.exit_code, s.signal) for job_id, s in ended.items()}
    if cluster.accounting:
        assert codes == {1: (3, None), 2: (0, None), 3: (143, 15)}
        # when each really ended (Slurm's seconds), not when the agent came back
        assert all(forgotten_at - 60 < s.ended_at < forgotten_at for s in ended.values())
    else:  # nobody knows any more: the attempt failed, its exit unknown
        assert codes == dict.fromkeys(JOBS, (None, None))
        assert all(s.ended_at >= forgotten_at for s in ended.values())
