"""``labq show`` says the CPUs and memory a job asked for and those it holds on each node."""

from __future__ import annotations

from labq.models import Job, JobSpec, NodeAllocation, Placement
from labq.models.transitions import placed, running
from labq.protocol.codec import encode_job
from labq.render import show_text
from labq.scheduler import schedule
from labq.topologies import parse_sim_spec
from tests.conftest import make_node


def shown(job: Job, node) -> list[str]:
    start = schedule([job], [node], now=10.0).started(job.id)
    return show_text(encode_job(running(placed(job, start.placement), 10.0)), None, 20.0).splitlines()


def test_show_says_the_cpus_and_memory_a_job_holds_near_its_gpus():
    node = parse_sim_spec("sim:pcie-2socket").node("ws1")
    lines = shown(Job(1, JobSpec(user="a", command=("train",), gpus=2, cpus=5.5, memory_mib=20480), 0.0), node)
    assert "  wants       2 GPU(s), 5.5 CPUs, 20 GiB of memory" in lines
    assert "  CPUs        ws1: 0-5 (5.5 cores), 20 GiB of memory" in lines


def test_show_says_how_many_cpus_are_away_from_the_gpus():
    job = Job(7, JobSpec(user="a", command=("x",), gpus=1), 0.0, placement=Placement((
        NodeAllocation("ws1", (0,), ("G0",), 0, (24, 25, 26, 27), 4.0, 8192, 4),)))
    assert "  CPUs        ws1: 24-27 (4 cores, 4 away from its GPUs' NUMA node), 8 GiB of memory" in show_text(
        encode_job(job), None, 0.0).splitlines()


def test_show_has_no_cpus_on_a_node_that_did_not_report_them():
    lines = shown(Job(1, JobSpec(user="a", command=("train",), gpus=1), 0.0), make_node("old", "sim:ws-4x3090"))
    assert not any(line.startswith("  CPUs") for line in lines)
