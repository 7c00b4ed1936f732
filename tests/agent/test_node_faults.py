"""A launch that fails for a reason of this machine, not of the job, is reported as one that could not start,
with the node's problem: the leader requeues the job instead of failing it, and keeps such jobs off the node.

A real agent with its real runtimes, driven by the replies a leader would send; the report is what its next
sync would carry.
"""

from __future__ import annotations

import time

import pytest

from labq.agent.daemon import Agent, AgentConfig
from labq.agent.inventory import open_inventory
from labq.agent.process_runtime import AttemptState, Launch, ProcessRuntime
from labq.models.job import JobSpec, Runtime
from labq.models.node import Account
from labq.protocol.agents import RunOrder, SyncReply

pytestmark = pytest.mark.timeout(60)

STRANGER = "nouser-5e7a1d"  #: a lab user with no account on this machine


@pytest.fixture
def agent(tmp_path):
    made = Agent(AgentConfig("http://127.0.0.1:9", "join", "ws1", tmp_path / "agent", run_as_job_user=True),
                 open_inventory("sim:ws-4x3090", "ws1"))
    made.runtime.set_policy((), (), allow_root=True)  # the suite runs as root
    yield made
    made.stop()


def order(job_id: int, user: str, *command: str, workdir: str = "/", **kw) -> RunOrder:
    """``kw``: more of the job's spec (``runtime="docker", image=...``)."""
    if "runtime" in kw:
        kw["runtime"] = Runtime(kw["runtime"])
    spec = JobSpec(user, command or ("true",), workdir=workdir, grace_s=2.0, **kw)
    return RunOrder(job_id, 1, spec, {}, (0,), ("SIM-0",), "SIGUSR1", simulated=True)


def run(agent: Agent, *orders: RunOrder) -> None:
    agent.apply(SyncReply(tuple(orders), (), 30.0, 600.0))


def test_a_job_whose_user_has_no_account_here_is_reported_as_the_nodes_fault_with_the_accounts(agent):
    agent.users = ("root", STRANGER)  # the leader named its users in its last reply
    run(agent, order(1, STRANGER))
    [status] = agent.runtime.attempts()
    assert status.state is AttemptState.EXITED and status.pid is None
    why = f"no account for {STRANGER} on ws1: no such user on this machine"
    assert status.node_fault == why
    assert agent.runtime.read_log(1, 1).decode() == f"labq: {why}\n"
    report = agent.report(0.0)
    assert [(a.job_id, a.running, a.cannot_start) for a in report.attempts] == [(1, False, why)]
    assert Account(STRANGER, problem="no such user on this machine") in report.accounts
    assert Account("root", "root", 0, 0) in report.accounts
    assert report.problems == ()  # a missing account is the accounts' to say


def test_a_job_the_node_could_start_but_that_fails_as_the_job_is_no_node_fault(agent):
    agent.users = ("root",)
    run(agent, order(1, "root", "/no/such/program"), order(2, "root", "true", workdir="/no/such/folder"))
    ended = {s.job_id: s for s in agent.runtime.attempts()}
    assert ended[1].exit_code == 127 and ended[2].exit_code == 126
    assert all(a.cannot_start is None for a in agent.report(0.0).attempts)


def test_a_container_job_where_docker_is_out_of_reach_marks_the_node_for_container_jobs(agent, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # how an admin points at the engine
    agent.users = ("nobody",)
    run(agent, order(1, "nobody", runtime="docker", image="busybox:1"))
    [status] = agent.runtime.attempts()
    assert status.node_fault is not None and status.node_fault.startswith("docker is not available on node ws1")
    [problem] = agent.report(0.0).problems
    assert (problem.runtime, problem.user, problem.image) == ("docker", None, None)
    assert problem.detail == status.node_fault


def test_a_leader_of_an_older_labq_hears_neither_accounts_nor_faults_it_would_not_understand(agent):
    assert agent.users is None  # no reply has named the lab's users
    run(agent, order(1, STRANGER))
    report = agent.report(0.0)
    assert report.accounts is None and report.problems is None
    assert [(a.exit_code, a.cannot_start) for a in report.attempts] == [(126, None)]  # a failure, as before


def test_the_user_map_picks_the_account_a_job_runs_as(agent):
    (agent.config.state_dir / "user-map.toml").write_text(f'[users]\n"{STRANGER}" = "nobody"\n')
    agent.users = (STRANGER,)
    run(agent, order(1, STRANGER, "id", "-un"))
    deadline = time.monotonic() + 20
    while any(s.state is AttemptState.RUNNING for s in agent.runtime.attempts()):
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.05)
    [status] = agent.runtime.attempts()
    assert (status.exit_code, status.node_fault) == (0, None)
    assert agent.runtime.read_log(1, 1) == b"nobody\n"
    assert "user map" in agent.runs_jobs_as()


def test_a_shim_that_cannot_start_is_the_nodes_fault_not_a_lost_job(tmp_path):
    runtime = ProcessRuntime(tmp_path / "runtime", python=str(tmp_path / "no-python-here"), allow_root=True)
    status = runtime.launch(Launch(1, 1, ("true",), {}))
    assert status.state is AttemptState.EXITED and status.exit_code is None
    assert status.node_fault == "cannot start the shim: No such file or directory"
    assert b"labq: cannot start the shim" in runtime.read_log(1, 1)
    assert [s.node_fault for s in ProcessRuntime(tmp_path / "runtime").attempts()] == [status.node_fault]


def test_a_refusal_for_the_nodes_fault_survives_an_agent_restart(tmp_path):
    first = ProcessRuntime(tmp_path / "runtime")
    first.refuse(3, 2, "docker is not available on node ws1: gone", node_fault=True)
    first.refuse(4, 1, "image x not allowed here")
    again = {s.job_id: s for s in ProcessRuntime(tmp_path / "runtime").attempts()}
    assert again[3].node_fault == "docker is not available on node ws1: gone" and again[4].node_fault is None
    assert (again[3].exit_code, again[4].exit_code) == (126, 126)
