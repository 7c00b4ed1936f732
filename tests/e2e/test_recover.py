"""A damaged database stops the leader untouched; ``labq leader --recover`` goes back and starts."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def test_leader_refuses_a_damaged_database_then_recovers_it(lab):
    lab.start_leader()
    lab.start_agent()
    first = lab.submit("true")
    lab.wait_state(first, "succeeded")
    second = lab.submit("sleep", "300", gpus=4)
    lab.wait_state(second, "running")
    lab.kill(lab.leader, signal.SIGTERM)
    database = lab.data / "labq.json"
    database.write_bytes(database.read_bytes()[:-40])  # torn by something outside labq
    damaged = database.read_bytes()

    refused = subprocess.run([sys.executable, "-m", "labq.cli", "leader", "--no-mdns", "--config", str(lab.config),
                              "--data-dir", str(lab.data)], capture_output=True, text=True, env=lab.env(),
                             timeout=60)
    assert refused.returncode == 2
    assert "not valid JSON" in refused.stderr and "labq leader --recover" in refused.stderr
    assert database.read_bytes() == damaged

    lab.config.write_text(lab.config.read_text())  # same settings
    proc = lab._spawn(["leader", "--no-mdns", "--config", str(lab.config), "--data-dir", str(lab.data),
                       "--recover", "--yes",
                       "--listen", lab.url.removeprefix("http://")], "recover.log")
    lab.leader = proc
    lab.wait(lambda: "serving http://" in (lab.root / "recover.log").read_text(), "the recovered leader to serve")
    text = (lab.root / "recover.log").read_text()
    assert "The last sound state (labq.json.prev, commit" in text and "Job ids continue from" in text
    assert list(lab.data.glob("labq.json.damaged-*"))[0].read_bytes() == damaged
    lab.wait(lambda: lab.job(second)["state"] in ("running", "starting"), "job 2 to be known again")
    third = lab.submit("true")
    assert third > second  # no id handed out before is reused
