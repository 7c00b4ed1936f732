"""A Slurm node whose agent is not root: it submits each job as its user through ``sudo -n -u USER sbatch``
(``--slurm-submit sudo``), on a real one-node Slurm that every account here may use, with real Unix accounts and a
real sudoers rule made by the test (removed after).

The agent's side runs in a child process that has become the service account (as an agent started by a service
manager would be): it hands a job to Slurm as the job's user, whose job writes its checkpoint in the folder the
agent gave it by ACL, gets its checkpoint signal through ``sudo -u USER scancel``, and ends; the agent reads its
log. A user the sudoers rule does not name is refused with a problem kept to that user alone.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.timeout(150)

JOB = ("id -un; echo first > \"$LABQ_CHECKPOINT_DIR/first\"; "
       "trap 'echo got USR1; echo saved > \"$LABQ_CHECKPOINT_DIR/ckpt\"; exit 0' USR1; "
       "while true; do sleep 0.05; done")


@pytest.fixture(scope="module")
def site():
    """Three accounts (the agent's service account, a job's user it may submit as, one it may not), the sudoers
    rule, and a Slurm they all may use."""
    needs = [tool for tool in ("useradd", "sudo", "visudo") if shutil.which(tool) is None]
    if os.geteuid() != 0 or needs:
        unavailable("root, useradd and sudo", f"missing: {', '.join(needs) or 'root'} (./install.sh installs sudo)")
    tag = secrets.token_hex(3)
    names = {"agent": f"lqsvc{tag}", "job": f"lqjob{tag}", "other": f"lqoth{tag}"}
    made, rule = [], Path(f"/etc/sudoers.d/labq-test-{tag}")
    root = Path(tempfile.mkdtemp(prefix="labq-slurm-sudo-"))
    root.chmod(0o755)
    cluster = SlurmCluster(root / "slurm", open_to_all=True)
    try:
        for name in names.values():
            subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                           capture_output=True, timeout=30)
            made.append(name)
        text = (f'Defaults:{names["agent"]} env_keep += "SLURM_CONF"\n'
                f'{names["agent"]} ALL=({names["job"]}) NOPASSWD: {shutil.which("sbatch")}, {shutil.which("scancel")}\n')
        candidate = root / "rule"
        candidate.write_text(text)
        subprocess.run(["visudo", "-cf", str(candidate)], check=True, capture_output=True, timeout=30)
        rule.write_text(text)
        rule.chmod(0o440)
        try:
            cluster.start()
        except RuntimeError as err:
            unavailable("Slurm", str(err))
        yield cluster, {role: pwd.getpwnam(name) for role, name in names.items()}, root
    finally:
        cluster.stop()
        rule.unlink(missing_ok=True)
        for name in made:
            subprocess.run(["userdel", name], capture_output=True, timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def as_agent(account: pwd.struct_passwd, work) -> dict:
    """``work()`` in a child process that is ``account``; what it returns (JSON), or the child's failure."""
    import _strptime  # noqa: F401 - what the child uses, imported while it may still read every library folder
    import shlex  # noqa: F401

    time.strptime("2026-01-01T00:00:00", "%Y-%m-%dT%H:%M:%S")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
            answer = {"ok": work()}
            code = 0
        except BaseException as err:  # noqa: BLE001 - the child says what went wrong, then exits
            answer = {"error": f"{type(err).__name__}: {err}"}
        finally:
            os.write(write, json.dumps(answer, default=str).encode())
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = json.loads(pipe.read() or b'{"error": "the child said nothing"}')
    os.waitpid(pid, 0)
    assert "ok" in said, said["error"]
    return said["ok"]


def test_a_service_account_agent_submits_as_the_jobs_user_through_sudo(site, monkeypatch):
    from labq.agent import acl
    from labq.agent.launches import own_job_folder
    from labq.agent.faults import NodeFault
    from labq.agent.process_runtime import AttemptState, Launch
    from labq.agent.slurm import SlurmRuntime, SlurmSite

    cluster, accounts, root = site
    agent, job_user, other = accounts["agent"], accounts["job"], accounts["other"]
    state = root / "agent-state"
    state.mkdir(mode=0o700)
    os.chown(state, agent.pw_uid, agent.pw_gid)
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))

    def work() -> dict:
        slurm_site = SlurmSite(cluster.partition, None, "sudo")
        runtime = SlurmRuntime(state / "slurm", slurm_site, slurm_site.slurm_node())
        checkpoints = state / "checkpoints" / "7"
        own_job_folder(checkpoints, job_user.pw_name)
        env = {"LABQ_CHECKPOINT_DIR": str(checkpoints)}
        runtime.launch(Launch(7, 1, ("bash", "-c", JOB), env, "/tmp", job_user.pw_name, {"CUDA_VISIBLE_DEVICES": "0"}))
        log_path = state / "slurm" / "7.1" / "log"
        deadline = time.monotonic() + 60
        while job_user.pw_name not in log_path.read_text():  # it runs, and says as whom
            assert time.monotonic() < deadline, f"the job did not start: {runtime.waiting(7, 1)}"
            runtime.attempts()
            time.sleep(0.1)
        slurm_user = cluster.run("squeue", "-h", "-o", "%u", "-n", "labq-7.1").stdout.strip()
        log_mode = os.stat(log_path).st_mode
        others_on_log = acl.granted(log_path, other.pw_uid)
        assert runtime.signal(7, 1, signal.SIGUSR1)
        while (status := next(s for s in runtime.attempts() if s.job_id == 7)).state is not AttemptState.EXITED:
            assert time.monotonic() < deadline, "the job did not end on its checkpoint signal"
            time.sleep(0.1)
        log = runtime.read_log(7, 1).decode()
        owners = {p.name: p.stat().st_uid for p in checkpoints.iterdir()}
        folder = checkpoints.stat()
        try:
            runtime.launch(Launch(8, 1, ("true",), {}, "/tmp", other.pw_name, {"CUDA_VISIBLE_DEVICES": "0"}))
            refused = None
        except NodeFault as fault:
            refused = {"message": str(fault), "user": fault.problem.user if fault.problem else None}
        runtime.forget(7, 1)
        kept_log = state / "slurm" / "logs" / "7.1.log"
        return {"kept_log_grant": acl.granted(kept_log, job_user.pw_uid),
                "kept_log_mode": stat.S_IMODE(os.stat(kept_log).st_mode), "slurm_user": slurm_user, "log": log,
                "exit": status.exit_code, "owners": owners,
                "folder": [folder.st_uid, stat.S_IMODE(folder.st_mode)], "log_other_bits": log_mode & 0o007,
                "others_on_log": others_on_log, "refused": refused,
                "folders_left": sorted(p.name for p in (state / "slurm").iterdir())}

    seen = as_agent(agent, work)
    assert seen["slurm_user"] == job_user.pw_name  # Slurm has it as the job's user, not the agent's
    assert seen["log"].splitlines() == [job_user.pw_name, "got USR1"], seen["log"]  # the agent read the job's log
    assert seen["exit"] == 0
    # the checkpoint folder stays the agent's (mode 0700, the job's user let in by ACL); what the job wrote is the
    # job user's
    assert seen["folder"] == [agent.pw_uid, 0o700 | 0o070 & (0o070 if seen["folder"][1] & 0o070 else 0)]
    assert seen["owners"] == {"first": job_user.pw_uid, "ckpt": job_user.pw_uid}
    assert seen["log_other_bits"] == 0 and seen["others_on_log"] is None  # nobody else reads or writes the log
    refused = seen["refused"]
    assert refused is not None and refused["user"] == other.pw_name, refused
    assert "sudo" in refused["message"] and "sudoers" in refused["message"] and other.pw_name in refused["message"]
    assert seen["folders_left"] == ["logs"]  # the refused attempt left nothing; the ended one was tidied
    assert seen["kept_log_grant"] is None and seen["kept_log_mode"] == 0o600  # the log kept is the agent's alone


def test_slurm_submit_is_checked_before_the_agent_starts(tmp_path):
    labq = str(Path(sys.executable).with_name("labq"))
    env = os.environ | {"LABQ_JOIN_TOKEN": "not-used"}
    out = subprocess.run([labq, "agent", "--leader", "http://127.0.0.1:9", "--slurm-submit", "sudo", "--gpus",
                          "sim:ws-4x3090", "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=60,
                         env=env)
    assert out.returncode != 0
    assert "--partition, --slurm-node, --slurm-submit and --slurm-gpu-memory are for --runtime slurm" in out.stderr


def test_an_agent_that_is_not_root_submits_as_itself_unless_told_sudo_and_never_with_uid(site):
    from argparse import Namespace

    from labq.cli.daemons import _slurm_site
    from labq.cli.errors import CliError

    cluster, accounts, _ = site

    def work() -> dict:
        def options(submit):
            return Namespace(partition=cluster.partition, gpus=None, slurm_node=None, slurm_submit=submit)

        try:
            _slurm_site(options("uid"))
            refused = None
        except CliError as err:
            refused = str(err)
        return {"default": _slurm_site(options(None)).submit, "sudo": _slurm_site(options("sudo")).submit,
                "uid": refused}

    seen = as_agent(accounts["agent"], work)
    assert seen["default"] == "agent" and seen["sudo"] == "sudo"
    assert seen["uid"] is not None and "--uid only permitted by root user" in seen["uid"]
    assert "--slurm-submit sudo" in seen["uid"]
