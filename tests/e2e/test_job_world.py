"""A job runs in the world its user submitted from: tried as a new user would, on a real leader and agent.

The submitting shell has a venv's ``bin`` and a folder of the user's own scripts first on its PATH, variables of
its own and credentials of its session. ``labq submit`` takes its environment as sbatch's ``--export=ALL`` does,
never the credentials; ``--export NONE`` gives the node's standard one. A program the job's node cannot find is
the job's reason where its user looks (``show``, ``why``, ``ls --json``), not a bare exit 127.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def shell(running_lab, tmp_path):
    """A user's shell: a venv active (its ``python``), a scripts folder on PATH, and session secrets set."""
    venv = tmp_path / "env"
    script(venv / "bin" / "python", 'echo "venv python: $0 VIRTUAL_ENV=$VIRTUAL_ENV MY_SETTING=$MY_SETTING"')
    script(tmp_path / "tools" / "mycmd", 'echo "mycmd ran with $*"')
    env = running_lab.env(PATH=f"{venv / 'bin'}:{tmp_path / 'tools'}:{os.environ['PATH']}", VIRTUAL_ENV=str(venv),
                          MY_SETTING="42", SSH_AUTH_SOCK="/tmp/ssh-secret/agent.1", DISPLAY=":7",
                          XDG_RUNTIME_DIR="/run/user/4242", DBUS_SESSION_BUS_ADDRESS="unix:path=/secret")
    return running_lab, env, venv


def submit(lab, env: dict, *argv: str) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-m", "labq.cli", "submit", "--json", *argv], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["id"], out.stderr


def test_a_venvs_python_and_a_script_on_the_users_path_run_as_submitted(shell):
    lab, env, venv = shell
    python, _ = submit(lab, env, "--", "python", "-c", "print(1)")
    mine, _ = submit(lab, env, "--", "mycmd", "a", "b")
    assert lab.wait_state(python, "succeeded", "failed")["state"] == "succeeded", lab.labq("logs", str(python)).stdout
    assert lab.labq("logs", str(python)).stdout == (f"venv python: {venv}/bin/python VIRTUAL_ENV={venv} "
                                                     "MY_SETTING=42\n")
    assert lab.wait_state(mine, "succeeded")["state"] == "succeeded"
    assert lab.labq("logs", str(mine)).stdout == "mycmd ran with a b\n"


def test_the_sessions_credentials_never_reach_the_job(shell):
    lab, env, _ = shell
    job, _ = submit(lab, env, "--", "sh", "-c", 'echo "${SSH_AUTH_SOCK:-none} ${DISPLAY:-none} '
                    '${XDG_RUNTIME_DIR:-none} ${DBUS_SESSION_BUS_ADDRESS:-none} $MY_SETTING"')
    lab.wait_state(job, "succeeded")
    assert lab.labq("logs", str(job)).stdout == "none none none none 42\n"
    stored = lab.job(job)["spec"]["environment"]
    assert "MY_SETTING" in stored and not {"SSH_AUTH_SOCK", "DISPLAY", "XDG_RUNTIME_DIR",
                                          "DBUS_SESSION_BUS_ADDRESS", "HOME", "LABQ_TOKEN"} & set(stored)


def test_export_none_gives_the_standard_environment_and_a_list_only_its_names(shell):
    lab, env, _ = shell
    bare, _ = submit(lab, env, "--export", "NONE", "--", "sh", "-c", 'echo "$PATH ${MY_SETTING:-unset}"')
    some, _ = submit(lab, env, "--export", "MY_SETTING,EXTRA=7", "--", "sh", "-c",
                     'echo "$PATH $MY_SETTING $EXTRA ${VIRTUAL_ENV:-unset}"')
    lab.wait_state(bare, "succeeded")
    lab.wait_state(some, "succeeded")
    assert lab.labq("logs", str(bare)).stdout == f"{STANDARD_PATH} unset\n"
    assert lab.labq("logs", str(some)).stdout == f"{STANDARD_PATH} 42 7 unset\n"


def test_a_program_the_node_cannot_find_is_the_jobs_reason_where_its_user_looks(shell):
    lab, env, _ = shell
    env = dict(env, PATH=f"/nonexistent/env/bin:{env['PATH']}")
    job, warned = submit(lab, env, "--", "nosuchprog-labq", "--lr", "3")
    assert "labq: note: 'nosuchprog-labq' is not on the job's PATH here" in warned
    done = lab.wait_state(job, "failed", "succeeded")
    assert (done["state"], done["exit_code"]) == ("failed", 127)
    why = "cannot start 'nosuchprog-labq' on ws1: not on PATH=/nonexistent/env/bin:"
    assert why in done["note"] and done["note"].endswith("; is /nonexistent/env/bin on ws1?")
    assert why in lab.labq("show", str(job)).stdout
    assert why in lab.labq("why", str(job)).stdout
    listed = {j["id"]: j for j in lab.api("ls", "--history")}
    assert why in listed[job]["note"]


def test_bad_export_is_refused_with_one_line_and_nothing_stored(shell):
    lab, env, _ = shell
    before = lab.api("ls", "--all", "--history")
    for flags, words in ((["--export", "SSH_AUTH_SOCK"], "never exported"),
                         (["--export", "NONE,PATH"], "takes no names"),
                         (["--export", "1BAD"], "not a variable's name"),
                         (["--image", "busybox:1", "--export", "ALL"], "for process jobs")):
        out = subprocess.run([sys.executable, "-m", "labq.cli", "submit", *flags, "--", "true"], capture_output=True,
                             text=True, env=env, timeout=60)
        assert out.returncode == 2 and words in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert lab.api("ls", "--all", "--history") == before


def test_each_job_has_a_temporary_folder_of_its_own_that_goes_with_it(shell):
    lab, env, _ = shell
    job, _ = submit(lab, env, "--", "sh", "-c", 'echo "$TMPDIR"; touch "$TMPDIR/scratch" && echo wrote')
    other, _ = submit(lab, env, "--", "sh", "-c", 'echo "$TMPDIR"')
    lab.wait_state(job, "succeeded")
    lab.wait_state(other, "succeeded")
    folder, wrote = lab.labq("logs", str(job)).stdout.splitlines()
    assert wrote == "wrote" and folder.endswith(f"/tmp/{job}.1") and Path(folder).is_absolute()
    assert lab.labq("logs", str(other)).stdout.strip().endswith(f"/tmp/{other}.1")
    lab.wait(lambda: not Path(folder).exists(), "the job's temporary folder removed once its end was recorded")


def test_a_job_past_its_memory_is_killed_by_the_kernel_and_says_so(shell):
    lab, env, _ = shell
    hog = f"{sys.executable} -c \"b = bytearray(256 << 20); print('allocated', len(b))\""
    job, _ = submit(lab, env, "--mem", "64M", "--", "sh", "-c", hog)
    done = lab.wait_state(job, "failed", "succeeded")
    assert done["state"] == "failed" and "allocated" not in lab.labq("logs", str(job)).stdout
    assert "out of memory (the kernel killed it)" in done["note"] and "of --mem 64 MiB" in done["note"], done["note"]
    assert "out of memory" in lab.labq("show", str(job)).stdout


@pytest.mark.parametrize(("flags", "words"), [
    (["--cpus", "0"], "cpus must be between"),
    (["--mem", "5X"], "--mem: '5X' is not a size"),
    (["--cpus", "1000"], "CPUs"),
])
def test_bad_cpus_or_memory_is_refused_with_one_line_and_nothing_stored(shell, flags, words):
    lab, env, _ = shell
    before = lab.api("ls", "--all", "--history")
    out = subprocess.run([sys.executable, "-m", "labq.cli", "submit", *flags, "--", "true"], capture_output=True,
                         text=True, env=env, timeout=60)
    assert out.returncode == 2 and words in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert lab.api("ls", "--all", "--history") == before
