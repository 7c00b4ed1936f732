"""``GET /metrics``: what a real leader on loopback (TinyDB store) says of its lab in Prometheus's text format,
read back with ``prometheus_client``'s own parser; who may scrape it (any person, or the read-only scrape token,
which opens nothing else); and what the counters count as jobs go through their lives."""

from __future__ import annotations

import http.client

import pytest
from prometheus_client.parser import text_string_to_metric_families

from labq.leader.metrics import Metrics
from labq.models import JobState
from tests.conftest import NOW, JobFactory, make_node
from tests.leader.loopback_leader import start_loopback_leader

pytestmark = pytest.mark.timeout(60)

SCRAPE_TOKEN = "scrape-" + "k" * 30


def node(name: str, gpus: int) -> dict:
    return {"name": name, "gpus": [{"index": i, "uuid": f"SIM-{name}-{i}", "model": "RTX 3090", "memory_mib": 24576}
                                   for i in range(gpus)],
            "topology": {"pcie": [[0] * gpus for _ in range(gpus)], "nvlinks": [[0] * gpus for _ in range(gpus)],
                         "nvswitch_links": [], "numa": []},
            "unmanaged_busy": [], "simulated": True, "labels": []}


@pytest.fixture
def lab(tmp_path):
    lb = start_loopback_leader(tmp_path, metrics_scrape_token=SCRAPE_TOKEN)
    yield lb
    lb.stop()


def scrape(lb, token: str | None) -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", lb.port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
        answer = conn.getresponse()
        return answer.status, answer.getheader("Content-Type", ""), answer.read().decode()
    finally:
        conn.close()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample as (name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def register(lb, name: str, gpus: int) -> str:
    status, _, doc = lb.request("POST", "/v1/agents/register", {"node": node(name, gpus), "version": "0"},
                                token=lb.join_token)
    assert status == 200, doc
    return doc["agent_token"]


def test_a_scrape_shows_the_jobs_the_gpus_and_what_the_api_answered(lab):
    agent = register(lab, "n1", 4)
    for gpus in (2, 1, 4):
        status, _, doc = lab.request("POST", "/v1/jobs", {"command": ["train"], "gpus": gpus, "workdir": "/tmp"})
        assert status == 201, doc
    lab.leader.scheduling.schedule_pass()  # the 2- and 1-GPU jobs start; the 4-GPU one waits
    status, _, doc = lab.request("POST", "/v1/agents/n1/sync", {
        "attempts": [], "gpu_usage": {"0": {"memory_free_mib": 20480, "utilization_pct": 87},
                                      "1": {"memory_free_mib": None, "utilization_pct": None}}}, token=agent)
    assert status == 200, doc
    status, content_type, text = scrape(lab, lab.admin_token)
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    got = samples(text)
    assert got[("labq_jobs", (("class", "normal"), ("state", "starting")))] == 2
    assert got[("labq_jobs", (("class", "normal"), ("state", "queued")))] == 1
    assert got[("labq_jobs_submitted_total", ())] == 3
    kinds = {kind: got[("labq_node_gpus", (("kind", kind), ("node", "n1")))]
             for kind in ("total", "allocated", "reserved", "unmanaged_busy")}
    assert kinds == {"total": 4, "allocated": 3, "reserved": 0, "unmanaged_busy": 0}
    assert got[("labq_agent_up", (("node", "n1"),))] == 1
    assert 0 <= got[("labq_agent_last_seen_seconds", (("node", "n1"),))] < 10
    gpu0 = (("gpu", "0"), ("model", "RTX 3090"), ("node", "n1"))
    assert got[("labq_gpu_utilization_ratio", gpu0)] == pytest.approx(0.87)
    assert got[("labq_gpu_memory_used_bytes", gpu0)] == 4096 * 1024 * 1024
    assert ("labq_gpu_utilization_ratio", (("gpu", "1"), ("model", "RTX 3090"), ("node", "n1"))) not in got
    assert got[("labq_api_requests_total", (("method", "POST"), ("route", "/v1/jobs"), ("status", "201")))] == 3
    assert got[("labq_api_requests_total",
                (("method", "POST"), ("route", "/v1/agents/{}/sync"), ("status", "200")))] == 1
    assert got[("labq_scheduling_pass_seconds_count", ())] == 1
    assert got[("labq_store_commit_seconds_count", ())] >= 5  # the registration, three submits, the pass
    assert got[("labq_job_queue_wait_seconds_count", ())] == 0  # placed, not yet started: no wait ends there
    assert "alice" not in text and "root" not in text  # no label names a person



def test_a_gpu_a_preemptor_waits_for_in_slurm_counts_once_and_shows_the_job_still_on_it(tmp_path):
    """On a node that hands jobs over (Slurm), the preemptor is placed on its victim's GPUs while the victim saves:
    those GPUs are allocated once, not twice, and ``labq gpus`` shows the victim on them until it has gone."""
    lab = start_loopback_leader(tmp_path, min_runtime_s=0.0)
    try:
        _preemptor_waits_in_slurm(lab)
    finally:
        lab.stop()


def _preemptor_waits_in_slurm(lab) -> None:
    status, _, doc = lab.request("POST", "/v1/agents/register", {"node": node("s1", 4) | {
        "shares": False, "hands_over": True}, "version": "0"}, token=lab.join_token)
    assert status == 200, doc
    agent = doc["agent_token"]
    status, _, low = lab.request("POST", "/v1/jobs", {"command": ["train"], "gpus": 4, "workdir": "/tmp",
                                                      "priority": "low"})
    assert status == 201, low
    low = low["id"] if "id" in low else low["job"]["id"]
    lab.leader.scheduling.schedule_pass()
    status, _, doc = lab.request("POST", "/v1/agents/s1/sync", {
        "attempts": [{"job_id": low, "attempt": 1, "running": True}]}, token=agent)
    assert status == 200, doc
    status, _, urgent = lab.request("POST", "/v1/jobs", {"command": ["train"], "gpus": 4, "workdir": "/tmp",
                                                         "priority": "urgent"})
    assert status == 201, urgent
    urgent = urgent["id"] if "id" in urgent else urgent["job"]["id"]
    lab.leader.scheduling.schedule_pass()
    states = {j: lab.request("GET", f"/v1/jobs/{j}")[2] for j in (low, urgent)}
    states = {j: doc.get("job", doc)["state"] for j, doc in states.items()}
    assert states == {low: "preempting", urgent: "starting"}
    got = samples(scrape(lab, lab.admin_token)[2])
    assert got[("labq_node_gpus", (("kind", "allocated"), ("node", "s1")))] == 4
    status, _, doc = lab.request("GET", "/v1/nodes")
    (s1,) = [n for n in doc["nodes"] if n["name"] == "s1"]
    assert s1["gpus_in_use"] == {str(g): low for g in range(4)}

def test_the_scrape_token_reads_the_metrics_and_nothing_else(lab):
    agent = register(lab, "n1", 1)
    assert scrape(lab, SCRAPE_TOKEN)[0] == 200
    for token, status in ((None, 401), ("scrape-" + "x" * 30, 401), (agent, 403), (lab.join_token, 403)):
        assert scrape(lab, token)[0] == status, token
    status, _, doc = lab.request("GET", "/v1/jobs", token=SCRAPE_TOKEN)
    assert status == 401 and doc["error"]["code"] == "unauthorized"


def test_the_counters_follow_a_job_through_preemption_loss_and_its_end():
    """``Metrics.watch`` on the versions a leader takes in: a submit, a start after waiting, a preemption, a
    requeue that lost work, an end."""
    from labq.leader.config import LeaderConfig
    from labq.leader.core import Leader
    from labq.store import MemoryStore

    leader = Leader(LeaderConfig(), MemoryStore(), clock=lambda: NOW)
    metrics: Metrics = leader.metrics
    ws = make_node("ws1", "sim:ws-4x3090")
    jobs = JobFactory()
    queued = jobs.queued(2, submitted_at=NOW - 600)
    metrics.watch([(None, queued)])
    running = jobs.running(ws, (0, 1), started_at=NOW)
    running = running.evolve(id=queued.id, spec=queued.spec, submitted_at=queued.submitted_at)
    metrics.watch([(queued, running)])
    preempting = running.evolve(state=JobState.PREEMPTING, preempted_for=99)
    metrics.watch([(running, preempting)])
    requeued = preempting.evolve(state=JobState.QUEUED, work_lost_s=120.0)
    metrics.watch([(preempting, requeued)])
    ended = requeued.evolve(state=JobState.SUCCEEDED)
    metrics.watch([(requeued, ended)])
    got = samples(metrics.exposition().decode())
    assert got[("labq_jobs_submitted_total", ())] == 1
    assert got[("labq_job_queue_wait_seconds_count", ())] == 1
    assert got[("labq_job_queue_wait_seconds_sum", ())] == 600
    assert got[("labq_preemptions_total", ())] == 1
    assert got[("labq_work_lost_gpu_seconds_total", ())] == 240  # 120 s on 2 GPUs
    assert got[("labq_jobs_ended_total", (("state", "succeeded"),))] == 1


def test_one_change_of_many_jobs_counts_each_of_them():
    """The versions one change took in come together (an array's tasks, a pass's starts): each counts."""
    from labq.leader.config import LeaderConfig
    from labq.leader.core import Leader
    from labq.store import MemoryStore

    leader = Leader(LeaderConfig(), MemoryStore(), clock=lambda: NOW)
    metrics: Metrics = leader.metrics
    jobs = JobFactory()
    tasks = [jobs.queued(1, submitted_at=NOW - 60) for _ in range(5)]
    metrics.watch([(None, task) for task in tasks])
    ended = [task.evolve(state=JobState.FAILED) for task in tasks[:2]]
    metrics.watch([(task, end) for task, end in zip(tasks, ended)])
    got = samples(metrics.exposition().decode())
    assert got[("labq_jobs_submitted_total", ())] == 5
    assert got[("labq_jobs_ended_total", (("state", "failed"),))] == 2
