"""An agent started before its leader (a workstation that boots first) waits for it instead of exiting,
and one whose join token is wrong stops at once with why: real processes on loopback."""

from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.timeout(90)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_agent_started_before_its_leader_joins_when_the_leader_comes_up(lab, tmp_path):
    lab.url = f"http://127.0.0.1:{_free_port()}"
    token = tmp_path / "join-token"
    lab.start_leader()  # once, to make the lab and its join token
    token.write_text((lab.data / "join-token").read_text())
    lab.kill(lab.leader)
    agent = lab._spawn(["agent", "--leader", lab.url, "--gpus", "sim:ws-4x3090", "--name", "ws1", "--no-mdns",
                        "--join-token-file", str(token), "--state-dir", str(tmp_path / "ws1")], "agent-ws1.log")
    lab.wait(lambda: "keeps trying" in (tmp_path / "agent-ws1.log").read_text(), "the agent to say it waits")
    lab.wait(lambda: "cannot sync with the leader" in (tmp_path / "agent-ws1.log").read_text(),
             "the agent's sync loop to fail against no leader")
    assert agent.poll() is None, (tmp_path / "agent-ws1.log").read_text()
    lab.start_leader()
    lab.wait(lambda: any(n["name"] == "ws1" and n["health"] == "up" for n in lab.api("nodes")), "ws1 to join", 30)
    job = lab.submit("/bin/true")
    assert lab.wait_state(job, "succeeded", timeout=20)["state"] == "succeeded"


def test_an_agent_with_a_wrong_join_token_stops_at_once_with_why(lab, tmp_path):
    lab.start_leader()
    token = tmp_path / "join-token"
    token.write_text("labq-join-not-this-lab")
    agent = lab._spawn(["agent", "--leader", lab.url, "--gpus", "sim:ws-4x3090", "--name", "ws1", "--no-mdns",
                        "--join-token-file", str(token), "--state-dir", str(tmp_path / "ws1")], "agent-ws1.log")
    assert agent.wait(timeout=30) != 0
    assert "refused this agent" in (tmp_path / "agent-ws1.log").read_text()


def test_an_agent_whose_node_name_has_a_control_character_is_refused_before_it_starts(lab):
    out = lab.labq("agent", "--gpus", "sim:ws-4x3090", "--name", "ws1\n", "--leader", "http://127.0.0.1:9",
                   "--no-mdns", check=False)
    assert out.returncode == 2 and "the node name 'ws1\\n' contains a control character" in out.stderr
