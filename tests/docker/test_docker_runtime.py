"""The Docker runtime against a real engine: exits, logs, stops, agent restarts, isolation."""

from __future__ import annotations

import os
import pwd
import signal
import time
from pathlib import Path

import pytest

from labq.agent.docker_runtime import DockerLaunch, DockerRuntime
from labq.agent.process_runtime import AttemptState
from labq.models.job import JobSpec, Mount, Runtime
IMAGE = "labq-test-busybox:1"  #: built by conftest.py

pytestmark = pytest.mark.timeout(120)

EXITED, RUNNING = AttemptState.EXITED, AttemptState.RUNNING


def launch(job_id: int, command: str, user: str | None, attempt: int = 0, **kw) -> DockerLaunch:
    """An attempt of a container job; ``image``, ``mounts`` and ``shm_size_mib`` go into the job's spec."""
    spec = JobSpec(user or "root", ("sh", "-c", command), runtime=Runtime.DOCKER, image=kw.pop("image", IMAGE),
                   **{key: kw.pop(key) for key in ("mounts", "shm_size_mib") if key in kw})
    return DockerLaunch(job_id, attempt, spec.command, kw.pop("env", {}), user=user, spec=spec,
                        simulated=kw.pop("simulated", True), **kw)


def wait_for(runtime: DockerRuntime, job_id: int, attempt: int = 0, state=EXITED, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for status in runtime.attempts():
            if (status.job_id, status.attempt) == (job_id, attempt) and status.state is state:
                return status
        time.sleep(0.1)
    raise AssertionError(f"attempt {job_id}.{attempt} not {state.value} after {timeout} s: {runtime.attempts()}")


def wait_for_log(runtime: DockerRuntime, job_id: int, text: bytes, attempt: int = 0, timeout: float = 30.0) -> None:
    """Until the attempt's log holds ``text``: the job has got that far."""
    deadline = time.monotonic() + timeout
    while text not in runtime.read_log(job_id, attempt):
        if time.monotonic() >= deadline:
            raise AssertionError(f"attempt {job_id}.{attempt} did not log {text!r} in {timeout} s: "
                                 f"{runtime.read_log(job_id, attempt)!r}")
        time.sleep(0.1)


def test_exit_code_log_and_env(make_runtime, job_ids, job_user) -> None:
    runtime = make_runtime()
    job = next(job_ids)
    started = runtime.launch(launch(job, 'echo hi; echo "seed=$SEED job=$LABQ_JOB_ID"; echo oops >&2; exit 3',
                                    job_user, env={"SEED": "42"}))
    assert started.container == runtime.container_name(job, 0)
    assert started.container.startswith(f"labq-{runtime.node}-") and started.container.endswith(f"-{job}-0")
    status = wait_for(runtime, job)
    assert (status.exit_code, status.signal, status.oom) == (3, None, False)
    assert status.ended_at >= status.started_at
    log = runtime.read_log(job, 0)
    assert log.replace(b"oops\n", b"") == f"hi\nseed=42 job={job}\n".encode()  # stderr: in no order with stdout
    assert b"oops\n" in log
    assert runtime.read_log(job, 0, offset=2, limit=4) == log[2:6]
    runtime.forget(job, 0)
    assert runtime.attempts() == []
    assert runtime.read_log(job, 0) == log  # the log outlives the container
    with pytest.raises(ValueError, match="already exists"):
        runtime.launch(launch(job, "true", job_user))
    with pytest.raises(KeyError):
        runtime.read_log(job, 1)


def test_stop_a_sleeping_job(make_runtime, job_ids, job_user) -> None:
    runtime = make_runtime()
    job = next(job_ids)
    runtime.launch(launch(job, "echo up; sleep 300", job_user))
    assert wait_for(runtime, job, state=RUNNING).pid
    wait_for_log(runtime, job, b"up\n")  # the shell runs: the stop below ends a job that is under way
    assert runtime.signal(job, 0, signal.SIGCONT) is True  # running, and harmless
    t0 = time.monotonic()
    runtime.stop(job, 0, grace_s=5)
    assert time.monotonic() - t0 < 1.0  # returns at once
    status = wait_for(runtime, job, timeout=20)
    assert status.exit_code in (137, 143) and status.signal in (signal.SIGKILL, signal.SIGTERM)
    assert runtime.read_log(job, 0) == b"up\n"
    assert runtime.signal(job, 0, signal.SIGTERM) is False


def test_a_new_runtime_adopts_the_running_container(make_runtime, job_ids, job_user, docker_client,
                                                    tmp_path: Path) -> None:
    first = make_runtime()
    job = next(job_ids)
    first.launch(launch(job, "echo before; sleep 2; echo after; exit 5", job_user))
    wait_for(first, job, state=RUNNING)
    wait_for_log(first, job, b"before\n")  # the new runtime takes over a log already under way
    second = DockerRuntime(first.root, first.node, client=docker_client)  # the agent restarted
    [status] = second.attempts()
    assert (status.job_id, status.state) == (job, RUNNING)
    assert len(docker_client.containers.list(filters={"label": f"labq.job={job}"})) == 1
    with pytest.raises(ValueError, match="already"):
        second.launch(launch(job, "true", job_user))
    ended = wait_for(second, job)
    assert ended.exit_code == 5
    assert second.read_log(job, 0) == b"before\nafter\n"  # no line lost or copied twice
    assert len(docker_client.containers.list(all=True, filters={"label": f"labq.job={job}"})) == 1


def test_a_missing_image_fails_at_once(make_runtime, job_ids, job_user) -> None:
    runtime = make_runtime()
    job = next(job_ids)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=f"image labq-test-missing:0 not found on node {runtime.node}"):
        runtime.launch(launch(job, "true", job_user, image="labq-test-missing:0"))
    assert time.monotonic() - t0 < 5
    refused = runtime.refuse(job, 0, "image labq-test-missing:0 not found")
    assert (refused.state, refused.exit_code) == (EXITED, 126)
    assert runtime.read_log(job, 0) == b"labq: image labq-test-missing:0 not found\n"
    assert [s.job_id for s in runtime.attempts()] == [job]
    runtime.forget(job, 0)
    assert runtime.attempts() == []


def test_a_command_that_does_not_exist_is_an_exit_not_a_hang(make_runtime, job_ids, job_user) -> None:
    runtime = make_runtime()
    job = next(job_ids)
    spec = JobSpec(job_user, ("/no/such/program",), runtime=Runtime.DOCKER, image=IMAGE)
    runtime.launch(DockerLaunch(job, 0, spec.command, {}, user=job_user, spec=spec))
    assert wait_for(runtime, job, timeout=10).exit_code == 127  # the container's init cannot exec it
    assert b"/no/such/program" in runtime.read_log(job, 0)
    runtime.forget(job, 0)


def test_two_attempts_of_one_job_never_run_at_once(make_runtime, job_ids, job_user) -> None:
    runtime = make_runtime()
    job = next(job_ids)
    runtime.launch(launch(job, "sleep 300", job_user))
    with pytest.raises(ValueError, match=f"job {job} already has a container"):
        runtime.launch(launch(job, "true", job_user, attempt=1))
    other_node = make_runtime(runtime.root.parent / "other")  # not even from another agent of the lab
    with pytest.raises(ValueError, match=f"job {job} already has a container"):
        other_node.launch(launch(job, "true", job_user, attempt=1))
    other_lab = make_runtime(runtime.root.parent / "other-lab", lab="another-lab")  # its job numbers are its own
    other_lab.launch(launch(job, "true", job_user, attempt=1))
    assert wait_for(other_lab, job, attempt=1).exit_code == 0
    runtime.stop(job, 0, 0)
    wait_for(runtime, job)
    runtime.launch(launch(job, "exit 0", job_user, attempt=1))  # the exited one is no obstacle
    assert wait_for(runtime, job, attempt=1).exit_code == 0


def test_policy_is_checked_again_before_launch(make_runtime, job_ids, job_user, tmp_path: Path) -> None:
    runtime = make_runtime(allowed_roots=(str(tmp_path),), allowed_images=("labq-test-*",))
    job = next(job_ids)
    with pytest.raises(ValueError, match="not allowed"):
        runtime.launch(launch(job, "true", job_user, image="busybox:1"))
    with pytest.raises(ValueError, match="system path"):
        runtime.launch(launch(job, "true", job_user, mounts=(Mount("/etc", "/host-etc"),)))
    with pytest.raises(ValueError, match="may not set NVIDIA_VISIBLE_DEVICES"):
        runtime.launch(launch(job, "true", job_user, env={"NVIDIA_VISIBLE_DEVICES": "all"}))
    assert runtime.attempts() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="the agent's own user is not root here")
def test_root_jobs_are_refused(make_runtime, job_ids) -> None:
    runtime = make_runtime()
    with pytest.raises(ValueError, match="non-root user"):
        runtime.launch(launch(next(job_ids), "true", None))
    with pytest.raises(ValueError, match="root"):
        runtime.launch(launch(next(job_ids), "true", "root"))


def test_the_container_is_isolated(make_runtime, job_ids, job_user, docker_client, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("dataset\n")
    data.chmod(0o755)
    tmp_path.chmod(0o755)
    runtime = make_runtime(allowed_roots=(str(tmp_path),))
    job = next(job_ids)
    runtime.launch(launch(job, "id -u; cat /data/in.txt; touch /data/x || echo read-only; "
                               "echo gpus=$NVIDIA_VISIBLE_DEVICES; sleep 300", job_user,
                          mounts=(Mount(str(data), "/data", read_only=True),), shm_size_mib=96,
                          gpu_uuids=("1", "3")))
    wait_for(runtime, job, state=RUNNING)
    attrs = docker_client.containers.get(runtime.container_name(job, 0)).attrs
    host = attrs["HostConfig"]
    uid = pwd.getpwnam(job_user).pw_uid if job_user else os.geteuid()
    assert attrs["Config"]["User"].split(":")[0] == str(uid) != "0"
    assert attrs["Config"]["Labels"] == {"labq.job": str(job), "labq.attempt": "0", "labq.agent": runtime.node,
                                         "labq.lab": runtime.lab, "labq.managed": "1"}
    assert host["CapDrop"] == ["ALL"] and host["SecurityOpt"] == ["no-new-privileges"]
    assert host["Privileged"] is False and host["Init"] is True
    assert host["NetworkMode"] != "host" and host["PidMode"] != "host" and host["IpcMode"] != "host"
    assert host["ShmSize"] == 96 * 1024 * 1024
    [mount] = attrs["Mounts"]
    assert (mount["Source"], mount["Destination"], mount["RW"]) == (str(data), "/data", False)
    deadline = time.monotonic() + 10
    while b"gpus=" not in runtime.read_log(job, 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = runtime.read_log(job, 0).splitlines()  # stdout and stderr: no order between the two
    assert sorted(lines) == sorted([str(uid).encode(), b"dataset", b"touch: /data/x: Read-only file system",
                                    b"read-only", b"gpus=1,3"])
    assert not (data / "x").exists()
    runtime.stop(job, 0, 0)
    wait_for(runtime, job)


def test_a_same_named_container_of_another_lab_does_not_block_a_job(make_runtime, docker_client, job_ids,
                                                                     job_user) -> None:
    runtime = make_runtime()
    job = next(job_ids)
    stranger = docker_client.containers.create(IMAGE, "true", name=f"labq-{job}-0")  # what another lab might leave
    try:
        runtime.launch(launch(job, "exit 0", job_user))
        assert wait_for(runtime, job).exit_code == 0
    finally:
        stranger.remove(force=True)


def test_an_image_label_declares_the_checkpoint_signal_the_watchdog_and_the_job_use(make_runtime, job_ids, job_user,
                                                                                      labelled_image) -> None:
    runtime = make_runtime()
    runtime.heartbeat()  # and never again: the watchdog fences after 2 s
    handler = ("trap 'echo saved on USR1; exit 0' USR1; trap 'echo stopped on TERM; exit 3' TERM; "
               "echo preempt signal $LABQ_PREEMPT_SIGNAL; while true; do sleep 0.05; done")
    for image, said, code, label in ((labelled_image, "saved on USR1", 0, "SIGUSR1"),
                                     (IMAGE, "stopped on TERM", 3, None)):
        job = next(job_ids)
        env = {"LABQ_PREEMPT_SIGNAL": "SIGTERM"}  # as the leader says before it heard of the label
        started = runtime.launch(launch(job, handler, job_user, image=image, env=env, fence_after_s=2.0, grace_s=5.0))
        assert started.image_signal == label  # reported to the leader with the attempt
        ended = wait_for(runtime, job)
        assert (ended.fenced, ended.exit_code, ended.image_signal) == (True, code, label)
        log = runtime.read_log(job, 0).decode()
        assert said in log and f"preempt signal {label or 'SIGTERM'}" in log


def test_a_container_is_fenced_by_its_watchdog_when_the_heartbeat_goes_stale(make_runtime, job_ids,
                                                                             job_user) -> None:
    runtime = make_runtime()
    runtime.heartbeat()
    fresh, stale = next(job_ids), next(job_ids)
    runtime.launch(launch(stale, "sleep 300", job_user, fence_after_s=2.0, grace_s=1.0))
    wait_for(runtime, stale, state=RUNNING)
    # nobody touches the heartbeat: after 2 s the watchdog signals, then stops the container
    fenced = wait_for(runtime, stale, timeout=30)
    assert fenced.fenced and fenced.exit_code is not None

    runtime.heartbeat()
    runtime.launch(launch(fresh, "sleep 300", job_user, fence_after_s=2.0, grace_s=1.0))
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:  # a live heartbeat keeps it running
        runtime.heartbeat()
        time.sleep(0.5)
    status = next(s for s in runtime.attempts() if s.job_id == fresh)
    assert status.state is RUNNING and not status.fenced
    runtime.stop(fresh, 0, 1)
    wait_for(runtime, fresh)
