"""The leader and its agents' word on the lab's users: a real leader over loopback HTTP and TinyDB.

Agents speak the sync protocol here as the test writes it (one speaks like an agent of an older labq); a
real agent (threads in this process, real sockets) joins in the first test.
"""

from __future__ import annotations

import time

import pytest

from labq.agent.daemon import Agent, AgentConfig
from labq.agent.inventory import open_inventory
from labq.leader.users import ACCOUNTS_WAIT_S
from labq.protocol.agents import (
    AttemptReport, Registration, SyncReport, encode_registration, encode_sync,
)
from labq.topologies import parse_sim_spec
from labq.models import Node
from tests.leader.loopback_leader import start_loopback_leader

pytestmark = pytest.mark.timeout(60)

STRANGER = "nouser-77c0de"
NO_SUCH_USER = {"user": STRANGER, "login": None, "uid": None, "gid": None, "problem": "no such user on this machine"}


@pytest.fixture
def lb(tmp_path):
    made = start_loopback_leader(tmp_path / "leader")
    yield made
    made.stop()


def join(lb, name: str) -> str:
    inv = parse_sim_spec("sim:ws-4x3090")
    node = Node(name, inv.gpus(name), inv.topology, simulated=True)
    status, _, reply = lb.request("POST", "/v1/agents/register", encode_registration(Registration(node, None, "t")),
                                  token=lb.join_token)
    assert status == 200, reply
    return reply["agent_token"]


def sync(lb, name: str, token: str, *attempts: dict, **fields) -> dict:
    status, _, reply = lb.request("POST", f"/v1/agents/{name}/sync",
                                  {"attempts": list(attempts), "wait_s": 0, **fields}, token=token)
    assert status == 200, reply
    return reply


def node(lb, name: str) -> dict:
    return {n["name"]: n for n in lb.request("GET", "/v1/nodes")[2]["nodes"]}[name]


def test_adding_a_user_waits_for_the_agents_and_names_the_nodes_without_one(lb, tmp_path):
    agent = Agent(AgentConfig(f"http://127.0.0.1:{lb.port}", lb.join_token, "ws1", tmp_path / "ws1",
                              run_as_job_user=True), open_inventory("sim:ws-4x3090", "ws1"))
    agent.start()
    older = join(lb, "ws-old")  # an agent of an older labq: it never reports accounts
    sync(lb, "ws-old", older)
    try:
        deadline = time.monotonic() + 20
        # the agent joined, heard the users and said how it maps them (it joins from its own thread: not yet, at first)
        while not {n["name"]: n for n in lb.request("GET", "/v1/nodes")[2]["nodes"]}.get("ws1", {}).get("accounts"):
            assert time.monotonic() < deadline, "the agent never reported its accounts"
            time.sleep(0.05)
        asked = time.monotonic()
        status, _, doc = lb.request("POST", "/v1/users", {"name": STRANGER, "admin": False})
        took = time.monotonic() - asked
        assert status == 201, doc
        assert doc["user"]["no_account_on"] == {"ws1": "no such user on this machine"}
        assert doc["user"]["not_heard_from"] == ["ws-old"]
        assert took < ACCOUNTS_WAIT_S / 2, "the leader waited for an agent that never reports accounts"
        assert NO_SUCH_USER in node(lb, "ws1")["accounts"]
        assert node(lb, "ws-old")["accounts"] == []
        status, _, doc = lb.request("POST", "/v1/users", {"name": "root", "admin": False})
        assert (doc["user"]["no_account_on"], doc["user"]["not_heard_from"]) == ({}, ["ws-old"])
    finally:
        agent.stop()


def test_the_leader_names_its_users_in_each_sync_reply_and_wakes_agents_when_they_change(lb):
    token = join(lb, "ws1")
    assert sync(lb, "ws1", token)["users"] == ["root"]
    lb.request("POST", "/v1/users", {"name": STRANGER, "admin": False})  # no agent reports accounts: no wait
    assert sync(lb, "ws1", token)["users"] == [STRANGER, "root"]
    lb.request("DELETE", f"/v1/users/{STRANGER}")
    assert sync(lb, "ws1", token)["users"] == ["root"]


def test_an_attempt_the_node_could_not_start_is_requeued_and_the_node_keeps_it_off(lb):
    token = join(lb, "ws1")
    sync(lb, "ws1", token, accounts=[], problems=[])
    status, _, doc = lb.request("POST", "/v1/jobs", {"command": ["true"], "gpus": 1})
    job_id = doc["job"]["id"]
    lb.leader.scheduling.schedule_pass()
    assert lb.request("GET", f"/v1/jobs/{job_id}")[2]["job"]["state"] == "starting"
    why = "docker is not available on node ws1: no daemon"
    problem = {"detail": why, "user": None, "runtime": None, "image": None}
    report = encode_sync(SyncReport((AttemptReport(job_id, 1, False, 126, None, 10.0, 10.0, cannot_start=why),),
                                    None, 0.0))
    sync(lb, "ws1", token, *report["attempts"], problems=[problem], accounts=[])
    job = lb.request("GET", f"/v1/jobs/{job_id}")[2]["job"]
    assert (job["state"], job["attempt"], job["exit_code"]) == ("queued", 2, None)
    assert job["attempts"][0]["ended"] == "lost"
    assert job["note"] == f"could not start on ws1: {why}; requeued"
    assert node(lb, "ws1")["problems"] == [problem]
    lb.leader.scheduling.schedule_pass()
    status, _, doc = lb.request("GET", f"/v1/jobs/{job_id}")
    assert doc["job"]["state"] == "queued", "the job went back to the node that could not start it"
    assert doc["pending"]["detail"] == f"no node that is up can start it now: {why}"
    sync(lb, "ws1", token, problems=[], accounts=[])  # the node says it is well again
    lb.leader.scheduling.schedule_pass()
    assert lb.request("GET", f"/v1/jobs/{job_id}")[2]["job"]["state"] == "starting"


def test_a_cancelled_job_whose_attempt_could_not_start_ends_cancelled_not_requeued(lb):
    token = join(lb, "ws1")
    status, _, doc = lb.request("POST", "/v1/jobs", {"command": ["true"], "gpus": 1})
    job_id = doc["job"]["id"]
    lb.leader.scheduling.schedule_pass()
    lb.request("POST", f"/v1/jobs/{job_id}/actions", {"action": "cancel"})
    report = encode_sync(SyncReport((AttemptReport(job_id, 1, False, 126, None, 10.0, 10.0,
                                                   cannot_start="no account for root on ws1: gone"),), None, 0.0))
    sync(lb, "ws1", token, *report["attempts"], accounts=[], problems=[])
    status, _, doc = lb.request("GET", f"/v1/jobs/{job_id}")
    assert doc["job"]["state"] == "cancelled"
