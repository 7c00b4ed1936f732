"""Jobs never run as uid 0 unless the admin allows it, and a lab started by root names a real first admin.

Real `labq leader`/`labq up`/`labq agent` processes started as root (this suite runs as root in CI).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.e2e.conftest import TEST_CONFIG, Lab

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"), reason="starts labq as root")]

NO_ROOT = TEST_CONFIG.replace("allow_root = true", "allow_root = false")


def _up(lab: Lab, *args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labq.cli", "up", "--gpus", "sim:ws-4x3090", "--name", "ws1",
                           "--config", str(lab.config), "--data-dir", str(lab.data), *args],
                          capture_output=True, text=True, env=lab.env(**env), timeout=60)


def test_labq_up_as_root_without_an_admin_stops_before_creating_anything(tmp_path):
    lab = Lab(tmp_path, NO_ROOT)
    out = _up(lab)
    assert out.returncode != 0
    assert "--admin NAME" in out.stderr and "allow_root = true" in out.stderr and "nothing was created" in out.stderr
    assert not lab.data.exists() or not any(lab.data.iterdir())
    out = _up(lab, "--admin", "root")
    assert out.returncode != 0 and "uid 0" in out.stderr and not lab.data.exists()


def test_the_first_admin_is_sudo_user_and_jobs_say_which_account_they_run_as(tmp_path):
    lab = Lab(tmp_path, NO_ROOT)
    lab._spawn(["up", "--gpus", "sim:ws-4x3090", "--name", "ws1", "--config", str(lab.config),
                "--data-dir", str(lab.data)], "leader.log", SUDO_USER="ada")
    try:
        lab.wait(lambda: "is ready" in (tmp_path / "leader.log").read_text(), "labq up to be ready")
        text = (tmp_path / "leader.log").read_text()
        assert "ada is its first admin" in text
        assert "jobs run as their lab user's Unix account here (uid 0 refused" in text
        lab.url = re.search(r"serving (http://127\.0\.0\.1:\d+)", text).group(1)
        assert lab.labq("whoami").stdout.split()[0] == "ada"
    finally:
        lab.close()


def test_a_lab_user_named_root_gets_no_job_run_as_uid_0(tmp_path):
    lab = Lab(tmp_path, NO_ROOT)
    lab._spawn(["leader", "--no-mdns", "--config", str(lab.config), "--data-dir", str(lab.data), "--admin", "ada"],
               "leader.log")
    try:
        lab.wait(lambda: "serving" in (tmp_path / "leader.log").read_text(), "the leader to serve")
        lab.url = re.search(r"serving (http://127\.0\.0\.1:\d+)", (tmp_path / "leader.log").read_text()).group(1)
        lab.start_agent()
        added = lab.labq("admin", "user", "add", "root", "--print").stdout
        token = next(w.strip('"') for w in added.split() if w.strip('"').startswith("lqu_"))
        job = lab.submit("id", "-u", token=token)
        done = lab.wait_state(job, "failed", "succeeded", timeout=30)
        log = lab.labq("logs", str(job)).stdout
        assert done["state"] == "failed" and done["exit_code"] == 126, log
        assert "jobs never run as root (uid 0) here" in log and "allow_root = true" in log
    finally:
        lab.close()
