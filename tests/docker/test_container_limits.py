"""A container job's kernel limits and its own /tmp, against a real engine: what ``docker inspect`` shows, what
the job sees, and Docker's word on an OOM kill.

Under CI an engine that cannot be had fails these tests (conftest.py's fixture skips elsewhere).
"""

from __future__ import annotations

import os
import pwd
import time
from pathlib import Path

import pytest

from labq.agent.docker_runtime import DockerLaunch, DockerRuntime
from labq.agent.process_runtime import AttemptState
from labq.models.job import JobSpec, Runtime
from tests.conftest import unavailable

IMAGE = "labq-test-busybox:1"  #: built by conftest.py
MIB = 1 << 20

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def make_runtime(request):
    """conftest.py's factory of runtimes on a real engine; under CI one that cannot be had fails the test."""
    try:
        request.getfixturevalue("docker_client")
    except pytest.skip.Exception as skipped:
        unavailable("a Docker engine", str(skipped))
    return request.getfixturevalue("make_runtime")


def launch(job_id: int, command: str, user: str | None, **kw) -> DockerLaunch:
    spec = JobSpec(user or "root", ("sh", "-c", command), runtime=Runtime.DOCKER, image=IMAGE)
    return DockerLaunch(job_id, 0, spec.command, {}, user=user, spec=spec, simulated=True, **kw)


def wait_for(runtime: DockerRuntime, job_id: int, state=AttemptState.EXITED, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for status in runtime.attempts():
            if status.job_id == job_id and status.state is state:
                return status
        time.sleep(0.1)
    raise AssertionError(f"attempt {job_id}.0 not {state.value} after {timeout} s: {runtime.attempts()}")


def own_folder(path: Path, user: str | None) -> str:
    """The job's temporary folder as the agent makes it: the job's user owns it."""
    path.mkdir()
    if user is not None:
        os.chown(path, pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
    return str(path)


def test_the_limits_are_dockers_and_the_tmpdir_is_the_containers_tmp(make_runtime, docker_client, job_ids,
                                                                       job_user, tmp_path):
    runtime = make_runtime()
    job, tmpdir = next(job_ids), own_folder(tmp_path / "job-tmp", job_user)
    status = runtime.launch(launch(job, "echo kept > /tmp/note; grep Cpus_allowed_list /proc/self/status", job_user,
                                   cpu_set=(0,), cpu_limit=0.5, memory_limit_mib=64, tmpdir=tmpdir))
    host = docker_client.api.inspect_container(status.container)["HostConfig"]
    assert (host["CpusetCpus"], host["NanoCpus"], host["Memory"], host["MemorySwap"]) == ("0", 500_000_000,
                                                                                         64 * MIB, 64 * MIB)
    tmp = [m for m in docker_client.api.inspect_container(status.container)["Mounts"] if m["Destination"] == "/tmp"]
    assert [(m["Type"], m["Source"]) for m in tmp] == [("bind", os.path.realpath(tmpdir))]
    ended = wait_for(runtime, job)
    assert (ended.exit_code, ended.oom, ended.memory_peak_mib) == (0, False, None)
    assert runtime.read_log(job, 0) == b"Cpus_allowed_list:\t0\n"
    assert (Path(tmpdir) / "note").read_text() == "kept\n"  # the job's /tmp is the folder on the node
    runtime.forget(job, 0)
    assert not Path(tmpdir).exists()  # and it goes with the attempt


def test_no_limits_asked_none_set(make_runtime, docker_client, job_ids, job_user):
    runtime = make_runtime()
    job = next(job_ids)
    status = runtime.launch(launch(job, "true", job_user))
    host = docker_client.api.inspect_container(status.container)["HostConfig"]
    assert (host["CpusetCpus"], host["NanoCpus"], host["Memory"]) == ("", 0, 0)
    assert all(m["Destination"] != "/tmp" for m in docker_client.api.inspect_container(status.container)["Mounts"])
    assert wait_for(runtime, job).exit_code == 0


def test_a_container_past_its_memory_limit_is_oom_killed_and_its_status_says_so(make_runtime, job_ids, job_user):
    runtime = make_runtime()
    big, small = next(job_ids), next(job_ids)
    # dd's buffer is one block, read into whole: 256 MiB of memory touched, in a container of 32
    runtime.launch(launch(big, "dd if=/dev/zero of=/dev/null bs=256M count=1", job_user, memory_limit_mib=32))
    runtime.launch(launch(small, "dd if=/dev/zero of=/dev/null bs=8M count=1", job_user, memory_limit_mib=32))
    killed, fits = wait_for(runtime, big), wait_for(runtime, small)
    assert (killed.oom, killed.exit_code) == (True, 137)
    assert b"oom=True" in runtime.read_log(big, 0)
    assert (fits.oom, fits.exit_code) == (False, 0)
