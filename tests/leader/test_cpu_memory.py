"""CPUs and memory through the real leader's API: a submit no node could hold is refused, a job's order carries the
CPUs and memory the scheduler placed, and a node of an older agent that reports neither still runs jobs. A real
leader on loopback with a TinyDB store; the agent is the test, speaking the registration and sync protocol."""

from __future__ import annotations

import pytest

from labq.models.node import cpu_list_text, parse_cpu_list
from labq.protocol.codec import encode_node
from labq.topologies import parse_sim_spec
from tests.leader.loopback_leader import start_loopback_leader

pytestmark = pytest.mark.timeout(60)

GIB = 1024


@pytest.fixture
def lab(tmp_path):
    lb = start_loopback_leader(tmp_path)
    yield lb
    lb.stop()


def register(lb, name: str, inventory: str = "sim:ws-4x3090", *, facts: bool = True) -> str:
    """A real (not simulated) workstation of that machine joins; without ``facts``, as an agent of an older labq:
    its GPUs, and neither its CPUs nor its memory."""
    doc = encode_node(parse_sim_spec(inventory).node(name))
    doc["simulated"] = False
    if not facts:
        doc.pop("cpus"), doc.pop("memory_mib")
        for gpu in doc["gpus"]:
            gpu.pop("local_cpus")
    status, _, answer = lb.request("POST", "/v1/agents/register", {"node": doc, "version": "0"}, token=lb.join_token)
    assert status == 200, answer
    return answer["agent_token"]


def submit(lb, **fields) -> tuple[int, dict]:
    status, _, doc = lb.request("POST", "/v1/jobs", {"command": ["train"], "workdir": "/tmp", **fields})
    return status, doc


def order_of(lb, agent: str, node: str, job: int) -> dict:
    lb.leader.scheduling.schedule_pass()
    status, _, reply = lb.request("POST", f"/v1/agents/{node}/sync", {"attempts": []}, token=agent)
    assert status == 200, reply
    (run,) = [r for r in reply["run"] if r["job_id"] == job]
    return run


@pytest.mark.parametrize(("fields", "said"), [
    ({"cpus": 64}, "this job can never run here: asks for 64 CPUs but the largest node that has its GPUs (ws1) "
                   "has 48; ask for --cpus 48 or fewer"),
    ({"memory_mib": 512 * GIB}, "this job can never run here: asks for 512 GiB of memory but the largest node that "
                                "has its GPUs (ws1) has 256 GiB; ask for --mem 256G or less"),
    ({"cpus": 8, "gpus": 2, "nodes": 2}, None),  # two nodes with a GPU and 8 CPUs each: it fits
])
def test_a_submit_asking_more_cpus_or_memory_than_any_node_has_is_refused(lab, fields, said):
    register(lab, "ws1")
    register(lab, "ws2", "sim:flat:1")  # 4 CPUs, 64 GiB
    status, doc = submit(lab, **fields)
    if said is None:
        assert status == 201, doc
        return
    assert status == 422, doc
    assert doc["error"]["message"] == said and "\n" not in said
    assert not lab.leader.state.jobs  # nothing was queued


def test_a_jobs_order_carries_its_cpu_set_cores_and_memory(lab):
    agent = register(lab, "ws1")
    status, doc = submit(lab, cpus=5.5, memory_mib=16 * GIB)
    assert status == 201, doc
    run = order_of(lab, agent, "ws1", doc["job"]["id"])
    assert len(parse_cpu_list(cpu_list_text(run["cpu_set"]))) == 6  # whole CPUs to itself
    assert run["cpu_limit"] == 5.5 and run["memory_limit_mib"] == 16 * GIB
    placed = lab.leader.state.jobs[doc["job"]["id"]].placement.allocations[0]
    assert tuple(run["cpu_set"]) == placed.cpu_set and placed.far_cpus == 0


def test_a_job_that_asks_nothing_gets_its_gpus_share_of_the_node(lab):
    agent = register(lab, "ws1")  # 48 CPUs and 256 GiB over 4 GPUs
    status, doc = submit(lab, gpus=2)
    run = order_of(lab, agent, "ws1", doc["job"]["id"])
    assert len(run["cpu_set"]) == 24 and run["cpu_limit"] == 24 and run["memory_limit_mib"] == 128 * GIB


def test_the_labs_defaults_per_gpu_are_what_a_job_that_asks_nothing_gets(tmp_path):
    lb = start_loopback_leader(tmp_path, cpus_per_gpu=4.0, mem_per_gpu_mib=10 * GIB)
    try:
        agent = register(lb, "ws1")
        status, doc = submit(lb, gpus=2)
        run = order_of(lb, agent, "ws1", doc["job"]["id"])
        assert len(run["cpu_set"]) == 8 and run["cpu_limit"] == 8 and run["memory_limit_mib"] == 20 * GIB
    finally:
        lb.stop()


def test_a_job_waiting_for_cpus_says_so(lab):
    register(lab, "ws1")
    first, second = submit(lab, cpus=40)[1]["job"]["id"], submit(lab, cpus=16)[1]["job"]["id"]
    lab.leader.scheduling.schedule_pass()
    assert lab.leader.state.jobs[first].placement is not None
    assert str(lab.leader.state.pending[second]) == "Resources: needs 16 CPUs; ws1 has 8 free"


def test_a_node_of_an_older_agent_runs_jobs_by_gpus_alone(lab):
    agent = register(lab, "old", facts=False)
    node = lab.leader.state.agents["old"].node
    assert node.cpus == () and node.memory_mib is None
    status, doc = submit(lab, gpus=2, cpus=100, memory_mib=GIB)  # no node says it has less: not refused
    assert status == 201, doc
    run = order_of(lab, agent, "old", doc["job"]["id"])
    assert run["gpu_indices"] == [0, 1] and not run.get("cpu_set")
    assert run["cpu_limit"] == 100 and run["memory_limit_mib"] == GIB  # what it asked, for the node to enforce
