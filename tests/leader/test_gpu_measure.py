"""What a job's GPUs did while it held them: the agents' NVML measurements (utilisation, memory free) in their
syncs, added up per job by the leader over the time each stands for, kept in the job when it leaves its GPUs,
and shown by ``labq usage`` per user ("allocated but idle"). A real leader on loopback with a TinyDB store and
a stepped clock; the agent is the test, speaking the sync protocol."""

from __future__ import annotations

import pytest

from labq.leader.state import MEASURE_GAP_S, MEASURE_SAVE_S
from tests.conftest import FakeClock
from tests.leader.loopback_leader import start_loopback_leader
from tests.leader.test_metrics import register

pytestmark = pytest.mark.timeout(60)

T0 = 1_790_000_000.0
MIB = 24576  #: each GPU's memory in tests.leader.test_metrics.node


@pytest.fixture
def lab(tmp_path):
    clock = FakeClock(T0)
    lb = start_loopback_leader(tmp_path, clock=clock, monotonic=clock)
    lb.clock = clock
    yield lb
    lb.stop()


def sync(lb, agent: str, attempts: list[dict], usage: dict[int, tuple[int | None, int | None]]) -> None:
    doc = {"attempts": attempts, "gpu_usage": {str(i): {"utilization_pct": u, "memory_free_mib": f}
                                               for i, (u, f) in usage.items()}}
    status, _, answer = lb.request("POST", "/v1/agents/n1/sync", doc, token=agent)
    assert status == 200, answer


def test_a_job_keeps_what_its_gpus_did_and_usage_shows_it_per_user(lab):
    agent = register(lab, "n1", 4)
    status, _, doc = lab.request("POST", "/v1/users", {"name": "alice", "admin": False})
    alice = doc["token"]
    status, _, doc = lab.request("POST", "/v1/jobs", {"command": ["train"], "gpus": 2, "workdir": "/tmp"},
                                 token=alice)
    job = doc["job"]["id"]
    lab.leader.scheduling.schedule_pass()
    gpus = lab.leader.state.jobs[job].placement.allocations[0].gpu_indices
    running = {"job_id": job, "attempt": 1, "running": True, "started_at": T0}
    idle = {i: (0, MIB) for i in range(4) if i not in gpus}
    sync(lab, agent, [running], {gpus[0]: (80, MIB - 8192), gpus[1]: (20, MIB - 4096), **idle})  # the first look
    lab.clock.now += 100
    sync(lab, agent, [running], {gpus[0]: (80, MIB - 8192), gpus[1]: (20, MIB - 4096), **idle})
    lab.clock.now += 50
    sync(lab, agent, [running], {gpus[0]: (None, None), gpus[1]: (100, MIB - 16384), **idle})  # GPU 0 unread
    lab.clock.now += 10 * MEASURE_GAP_S  # an agent away: its next look stands for MEASURE_GAP_S at most
    ended = running | {"running": False, "exit_code": 0, "ended_at": lab.clock.now}
    sync(lab, agent, [ended], {gpus[0]: (0, MIB), gpus[1]: (0, MIB), **idle})
    _, _, doc = lab.request("GET", f"/v1/jobs/{job}")
    seen = doc["job"]
    assert seen["state"] == "succeeded"
    # 100 s on both GPUs, 50 s on GPU 1 alone, then MEASURE_GAP_S on both, idle
    assert seen["measured_gpu_s"] == pytest.approx(2 * 100 + 50 + 2 * MEASURE_GAP_S)
    assert seen["busy_gpu_s"] == pytest.approx(0.8 * 100 + 0.2 * 100 + 1.0 * 50)
    assert seen["memory_mib_gpu_s"] == pytest.approx(8192 * 100 + 4096 * 100 + 16384 * 50)
    assert lab.leader.state.gpu_measure == {}
    status, _, report = lab.request("GET", f"/v1/usage?since={T0}&user=alice", token=alice)
    assert status == 200, report
    row = report["by"]["user"][0]
    assert row["utilization"] == pytest.approx(150 / seen["measured_gpu_s"], abs=1e-4)
    assert row["memory_gib"] == pytest.approx(seen["memory_mib_gpu_s"] / seen["measured_gpu_s"] / 1024, abs=1e-3)


def one_gpu_job_placed(lab) -> tuple[str, int, int, dict]:
    """Node n1 (2 GPUs) and a 1-GPU job placed on it: (its agent's token, the job, its GPU, its running report)."""
    agent = register(lab, "n1", 2)
    status, _, doc = lab.request("POST", "/v1/jobs", {"command": ["train"], "gpus": 1, "workdir": "/tmp"})
    job = doc["job"]["id"]
    lab.leader.scheduling.schedule_pass()
    (gpu,) = lab.leader.state.jobs[job].placement.allocations[0].gpu_indices
    return agent, job, gpu, {"job_id": job, "attempt": 1, "running": True, "started_at": T0}


def test_a_running_job_is_measured_so_far_and_an_unmeasured_one_says_nothing(lab):
    agent, job, gpu, running = one_gpu_job_placed(lab)
    sync(lab, agent, [running], {gpu: (5, MIB - 1024)})
    lab.clock.now += 600
    sync(lab, agent, [running], {gpu: (5, MIB - 1024)})
    _, _, report = lab.request("GET", f"/v1/usage?since={T0}")
    (row,) = report["by"]["user"]
    assert row["utilization"] == pytest.approx(0.05) and row["memory_gib"] == pytest.approx(1.0)
    assert row["measured_gpu_hours"] == pytest.approx(600 / 3600, abs=1e-3)
    _, _, doc = lab.request("GET", f"/v1/jobs/{job}")
    # kept in the job when it leaves its GPUs, and every MEASURE_SAVE_S while it runs (not yet: 600 s)
    assert "measured_gpu_s" not in doc["job"]


def test_a_running_jobs_measurement_so_far_outlives_a_leader_restart(tmp_path):
    clock = FakeClock(T0)
    lab = start_loopback_leader(tmp_path, clock=clock, monotonic=clock)
    try:
        agent, job, gpu, running = one_gpu_job_placed(lab)
        step = MEASURE_GAP_S / 2
        for _ in range(int(MEASURE_SAVE_S / step) + 1):
            sync(lab, agent, [running], {gpu: (50, MIB - 2048)})
            clock.now += step
        sync(lab, agent, [running], {gpu: (50, MIB - 2048)})
        lab.leader.scheduling.tick()  # MEASURE_SAVE_S since the leader started: saved with the job
        saved = lab.leader.state.jobs[job]
        assert saved.measured_gpu_s == pytest.approx(step * (int(MEASURE_SAVE_S / step) + 1))
        assert lab.leader.state.gpu_measure == {}
        clock.now += step
        sync(lab, agent, [running], {gpu: (50, MIB - 2048)})  # after the save: lost in the restart below
    finally:
        lab.stop()
    again = start_loopback_leader(tmp_path, clock=clock, monotonic=clock)
    try:
        job_now = again.leader.state.jobs[job]
        assert (job_now.measured_gpu_s, job_now.busy_gpu_s) == (saved.measured_gpu_s, saved.busy_gpu_s)
        assert job_now.busy_gpu_s == pytest.approx(saved.measured_gpu_s / 2)
        assert job_now.memory_mib_gpu_s == pytest.approx(2048 * saved.measured_gpu_s)
    finally:
        again.stop()
