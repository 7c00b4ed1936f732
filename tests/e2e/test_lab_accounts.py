"""Jobs of a user without a Unix account on some node: real leader and agent processes on loopback.

The agents report which of the lab's users they can run, and as which account; ``labq admin user add``
warns about the nodes that cannot; the scheduler keeps each user's jobs off those nodes, and a job no
node that is up can run waits with reason User. A launch that fails for a reason of the node (the
account gone, no Docker daemon) requeues the job and marks the node: a bad node never drains a queue.

Two agents run on this machine under different names. ``ws2`` maps the test's user, who has no Unix
account here, to ``nobody`` in its user map (``user-map.toml`` in its state folder), as an admin would
for a lab user whose account on a workstation has another name; ``ws1`` has no such map.
"""

from __future__ import annotations

import json
import pwd
import secrets
import signal

import pytest

from labq.client import Client
from tests.e2e.conftest import Lab

pytestmark = pytest.mark.timeout(180)


def unknown_user() -> str:
    """A user name with no Unix account on this machine."""
    while True:
        name = f"nouser-{secrets.token_hex(3)}"
        try:
            pwd.getpwnam(name)
        except KeyError:
            return name


def map_user(lab: Lab, node: str, user: str, account: str | None) -> None:
    """Write ``node``'s user map: ``user`` runs as ``account`` there (None: no entry, the default rule)."""
    folder = lab.data / "agents" / node
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "user-map.toml").write_text("[users]\n" + (f'"{user}" = "{account}"\n' if account is not None else ""))


def start_agent(lab: Lab, name: str, **env: str) -> None:
    """``lab.start_agent`` with more in the agent's environment."""
    lab.agents[name] = lab._spawn(["agent", "--leader", lab.url, "--gpus", "sim:ws-4x3090", "--name", name,
                                   "--data-dir", str(lab.data)], f"agent-{name}.log", **env)
    lab.wait(lambda: any(n["name"] == name and n["health"] == "up" for n in lab.api("nodes")), f"agent {name} to join")


def add_user(lab: Lab, name: str) -> tuple[str, str]:
    """``labq admin user add NAME --print``: its warnings (stderr, exit 0) and the new user's token."""
    out = lab.labq("admin", "user", "add", name, "--print")
    token = next(w.strip('"') for w in out.stdout.split() if w.strip('"').startswith("lqu_"))
    return out.stderr, token


def nodes_of(lab: Lab, job: dict) -> list[str]:
    return [a["node"] for a in (job["placement"] or {"allocations": []})["allocations"]]


def test_a_user_only_one_node_can_run_is_warned_about_and_their_jobs_go_there(lab):
    user = unknown_user()
    lab.start_leader()
    lab.start_agent("ws1")
    map_user(lab, "ws2", user, "nobody")
    lab.start_agent("ws2")
    warned, token = add_user(lab, user)
    assert f"warning: no account for {user} on ws1: {user}'s jobs will not run there" in warned
    assert "ws1: no such user on this machine" in warned and "ws2" not in warned
    nodes = {n["name"]: n for n in lab.api("nodes")}
    assert {"user": user, "login": None, "uid": None, "gid": None,
            "problem": "no such user on this machine"} in nodes["ws1"]["accounts"]
    nobody = pwd.getpwnam("nobody")
    assert {"user": user, "login": "nobody", "uid": nobody.pw_uid, "gid": nobody.pw_gid,
            "problem": None} in nodes["ws2"]["accounts"]
    jobs = [lab.submit("id", "-un", token=token) for _ in range(12)]  # three times ws2's GPUs
    for job_id in jobs:
        done = lab.wait_state(job_id, "succeeded", "failed", timeout=60)
        assert (done["state"], done["attempt"], nodes_of(lab, done)) == ("succeeded", 1, ["ws2"]), done
    assert lab.labq("logs", str(jobs[0])).stdout == "nobody\n"


def test_a_submit_no_node_can_run_is_refused_with_the_sentence(lab):
    user = unknown_user()
    lab.start_leader()
    lab.start_agent("ws1")
    _, token = add_user(lab, user)
    out = lab.labq("submit", "--", "true", token=token, check=False)
    assert out.returncode != 0 and f"no account for {user} on ws1" in out.stderr, out
    assert lab.api("ls", "--all") == []  # refused whole


def test_a_job_that_only_a_node_without_the_account_could_run_waits_with_reason_user(lab):
    user = unknown_user()
    lab.start_leader()
    lab.start_agent("ws1")
    map_user(lab, "ws2", user, "nobody")
    lab.start_agent("ws2")
    _, token = add_user(lab, user)
    lab.kill(lab.agents.pop("ws2"))  # the one node with an account for the user goes away
    lab.wait(lambda: {n["name"]: n["health"] for n in lab.api("nodes")}["ws2"] == "lost", "ws2 to be lost")
    job = lab.submit("true", token=token)
    admins = lab.submit("true")  # another user's job of the same shape runs on ws1
    lab.wait_state(admins, "succeeded")
    lab.wait(lambda: "User" in lab.labq("why", str(job)).stdout, "the job to wait for a node with the account")
    why = json.loads(lab.labq("why", str(job), "--json").stdout)
    assert f"no account for {user} on ws1" in json.dumps(why)
    assert lab.job(job)["state"] == "queued"
    lab.start_agent("ws2")  # back: the job runs there
    done = lab.wait_state(job, "succeeded", "failed", timeout=60)
    assert (done["state"], nodes_of(lab, done)) == ("succeeded", ["ws2"])


def test_a_launch_that_fails_on_a_node_for_want_of_the_account_requeues_and_drains_nothing(lab):
    """ws1 had an account for the user, then lost it (its user map changed) while the leader still
    thought it could run them: the jobs placed there fail to start there, and go to ws2 instead."""
    user = unknown_user()
    lab.start_leader()
    map_user(lab, "ws1", user, "nobody")
    map_user(lab, "ws2", user, "nobody")
    lab.start_agent("ws1")
    lab.start_agent("ws2")
    warned, token = add_user(lab, user)
    assert "warning" not in warned
    client = Client(lab.url, token)
    lab.agents["ws1"].send_signal(signal.SIGSTOP)  # ws1 cannot tell the leader before the jobs come
    try:
        map_user(lab, "ws1", user, None)  # the mapping is gone: no account for the user on ws1
        jobs = [client.submit({"command": ["sleep", "1"], "gpus": 1})["id"] for _ in range(8)]  # 4 go to ws1
        lab.wait(lambda: sum(nodes_of(lab, client.job(j)[0]) == ["ws1"] for j in jobs) >= 4, "jobs placed on ws1", 10)
    finally:
        lab.agents["ws1"].send_signal(signal.SIGCONT)
    ended = [lab.wait_state(j, "succeeded", "failed", timeout=90) for j in jobs]
    assert [j["state"] for j in ended] == ["succeeded"] * 8  # none failed for the node's fault
    bounced = [j for j in ended if j["attempt"] > 1]
    assert len(bounced) >= 4
    for job in bounced:
        first = job["attempts"][0]
        assert first["ended"] == "lost" and first["placement"]["allocations"][0]["node"] == "ws1", job
        assert f"could not start on ws1: no account for {user} on ws1: no such user on this machine" in job["note"]
        assert nodes_of(lab, job) == ["ws2"]
    assert all(j["attempt"] <= 2 for j in ended), "a job went back to the node that could not start it"
    ws1 = {n["name"]: n for n in lab.api("nodes")}["ws1"]
    assert {"user": user, "login": None, "uid": None, "gid": None,
            "problem": "no such user on this machine"} in ws1["accounts"]


def test_container_jobs_on_a_node_without_a_docker_daemon_are_requeued_and_wait_with_why(lab):
    lab.start_leader()
    start_agent(lab, "ws1", DOCKER_HOST="unix:///nonexistent/docker.sock")
    jobs = [lab.submit("true", image="busybox:1") for _ in range(6)]
    # every job has been through the passes that bounced it and then kept it off the node: none failed
    lab.wait(lambda: all("docker is not available on node ws1" in lab.labq("why", str(j)).stdout for j in jobs),
             "the container jobs to wait for a node with docker", 60)
    for job_id in jobs:
        job = lab.job(job_id)
        assert job["state"] == "queued", job
        assert all(a["ended"] == "lost" for a in job["attempts"])
    assert sum(len(lab.job(j)["attempts"]) for j in jobs) <= 6  # one bounce each at most, not a drained queue
    problems = {n["name"]: n for n in lab.api("nodes")}["ws1"]["problems"]
    assert [(p["runtime"], p["user"], p["image"]) for p in problems] == [("docker", None, None)]
    process = lab.submit("true")  # the node's problem concerns container jobs only
    assert lab.wait_state(process, "succeeded", "failed")["state"] == "succeeded"
