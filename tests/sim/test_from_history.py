"""``labq sim --from-history``: the lab's own finished jobs replayed through the scheduler, beside what really
happened to them.

The history is recorded by a real leader (its queue, its scheduler passes, its store: TinyDB files) on a
stepped clock, with this test as its agents: each job placed is reported running at once and ends when its
work is done. The replay of that history with the same policy must reproduce what happened: within 1% on
mean queueing delay (the issue's bar), and the same work on the same GPUs.
"""

from __future__ import annotations

import heapq
from dataclasses import replace

import pytest

from labq.leader.auth import Principal
from labq.leader.config import LeaderConfig
from labq.leader.core import Leader
from labq.leader.state import AgentSession
from labq.models import JobState
from labq.models import transitions as t
from labq.protocol.requests import UserRequest, parse_submit
from labq.sim.engine import SimOptions, simulate
from labq.sim.history import REAL, workload_from_history
from labq.sim.report import make_report
from labq.sim.workload import generate
from labq.store import TinyDBStore
from tests.conftest import FakeClock, make_node

pytestmark = pytest.mark.timeout(120)

EPOCH = 1_790_000_000.0


def record_history(tmp_path, workload, nodes):
    """Run ``workload`` through a real leader on a stepped clock; its finished jobs (decoded) and the leader."""
    clock = FakeClock(EPOCH)
    store = TinyDBStore(tmp_path)
    leader = Leader(LeaderConfig(data_dir=tmp_path, min_runtime_s=0.0), store, clock=clock, monotonic=clock)
    state = leader.state
    for node in nodes:
        state.agents[node.name] = AgentSession(node.name, node, "x", None, None, last_seen=clock.now)
    events = [(EPOCH + job.submit, 0, i, "submit", job) for i, job in enumerate(workload.jobs)]
    heapq.heapify(events)
    work: dict[int, float] = {}
    order = len(events)
    while events:
        now = events[0][0]
        clock.now = now
        for session in state.agents.values():
            session.last_seen = now
        while events and events[0][0] == now:
            _, _, _, kind, what = heapq.heappop(events)
            if kind == "submit":
                who = Principal("user", what.user, admin=True)
                job = leader.queue.submit(who, parse_submit({
                    "command": ["train"], "gpus": what.gpus, "workdir": "/tmp", "priority": what.priority,
                    "preemptible": what.preemptible}))
                work[job.id] = what.duration
            else:
                with state.lock:
                    job = state.jobs[what]
                    state.apply([t.exited(job, 0, now)])
        leader.scheduling.schedule_pass()
        with state.lock:
            placed = [j for j in state.jobs.values() if j.state is JobState.STARTING]
            if placed:
                state.apply([t.running(j, now) for j in placed])
        for job in placed:
            order += 1
            heapq.heappush(events, (now + work[job.id], 1, order, "end", job.id))
    finished = store.history()
    from labq.protocol.codec import decode_job

    return [decode_job(doc) for doc in finished], leader


def test_a_replay_with_the_lab_own_policy_reproduces_what_happened(tmp_path):
    nodes = [make_node("ws1", "sim:ws-4x3090"), make_node("ws2", "sim:ws-4x3090")]
    # a week of 6 users: enough that fair share orders the queue (a leader that decayed the hours a job had
    # just spent, for the time since its last pass, served another user first here and was 21% off)
    generated = generate(seed=11, days=7, users=6, gpus=8, load=0.9, deadline_week=False)
    workload = replace(generated, jobs=tuple(replace(j, gpus=min(j.gpus, 4), priority=200, preemptible=False,
                                                     time_limit_s=None) for j in generated.jobs[:400]))
    jobs, leader = record_history(tmp_path, workload, nodes)
    assert len(jobs) == len(workload.jobs) and all(j.state is JobState.SUCCEEDED for j in jobs)

    replayed, real, notes = workload_from_history(jobs, EPOCH, EPOCH + 30 * 86400)
    assert notes == []
    assert [(j.gpus, j.user) for j in replayed.jobs] == [(j.gpus, j.user) for j in workload.jobs]
    assert [j.duration for j in replayed.jobs] == pytest.approx([j.duration for j in workload.jobs])
    real = replace(real, cluster="2xsim:ws-4x3090", gpus=8)
    sim = simulate(replayed, nodes, "labq", options=SimOptions.of(leader.config.policy()))
    what_happened, what_if = make_report(real), make_report(sim)
    assert what_happened.policy == REAL and what_happened.finished == what_if.finished == len(jobs)
    assert what_happened.queueing_delay.mean > 60, "the lab queued: the comparison says something"
    assert what_if.queueing_delay.mean == pytest.approx(what_happened.queueing_delay.mean, rel=0.01)
    assert what_if.jct.mean == pytest.approx(what_happened.jct.mean, rel=0.01)
    assert what_if.utilization == pytest.approx(what_happened.utilization, rel=0.01)
    leader.state.store.close()


def test_preempted_attempts_count_their_lost_work_once_and_unstarted_jobs_are_left_out(tmp_path, jobs):
    """A job preempted once (work lost since its checkpoint) and then finished: its work is what it ran less
    what it lost; a job cancelled before it started has no work to replay and is noted."""
    node = make_node("ws1", "sim:ws-4x3090")
    first = jobs.running(node, (0, 1), started_at=EPOCH + 100)
    first = replace(first, submitted_at=EPOCH + 50)
    preempted = t.exited(t.preempting(first, for_job=99), 0, EPOCH + 1100)  # ran 1000 s, checkpointed
    assert preempted.state is JobState.QUEUED
    resumed = t.running(t.placed(preempted, first.placement), EPOCH + 1500)
    done = t.exited(resumed, 0, EPOCH + 2000)
    never = t.cancelled(replace(jobs.queued(1), submitted_at=EPOCH + 60), EPOCH + 70)
    workload, real, notes = workload_from_history([done, never], EPOCH, EPOCH + 86400)
    lost = sum(a.work_lost_s for a in done.history)
    (traced,) = workload.jobs
    assert traced.duration == pytest.approx(1000 + 500 - lost)
    (outcome,) = real.outcomes
    assert (outcome.job.submit, outcome.start, outcome.end, outcome.preemptions) == (50, 100, 2000, 1)
    assert outcome.lost_gpu_s == pytest.approx(lost * 2)
    assert real.busy_gpu_s == pytest.approx((1000 + 500) * 2)
    assert notes == ["1 jobs that never started (cancelled while they waited) are left out"]


def test_labq_sim_from_history_puts_the_replay_beside_what_happened(tmp_path):
    """The command as an admin runs it, against the leader that recorded the history (over HTTP): the lab's
    nodes, the lab's jobs, 'real' first; a user who is not an admin is refused with a clear error."""
    import json
    import os
    import subprocess
    import sys
    import threading

    from labq.leader.http import serve

    nodes = [make_node("ws1", "sim:ws-4x3090"), make_node("ws2", "sim:ws-4x3090")]
    generated = generate(seed=3, days=2, users=3, gpus=8, load=0.9, deadline_week=False)
    workload = replace(generated, jobs=tuple(replace(j, gpus=min(j.gpus, 4), priority=200, preemptible=False,
                                                     time_limit_s=None) for j in generated.jobs[:60]))
    jobs, leader = record_history(tmp_path / "lab", workload, nodes)
    _, admin_token = leader.ensure_admin("root")
    _, alice = leader.users.add(Principal("user", "root", admin=True), UserRequest("alice", admin=False))
    server = serve(leader, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        def sim(token: str, *args: str) -> subprocess.CompletedProcess:
            env = {k: v for k, v in os.environ.items() if not k.startswith("LABQ_")}
            env |= {"LABQ_LEADER": url, "LABQ_TOKEN": token, "HOME": str(tmp_path)}
            return subprocess.run([sys.executable, "-m", "labq.cli", "sim", "--from-history", *args], env=env,
                                  capture_output=True, text=True, timeout=120)

        out = sim(admin_token, "--since", "2026-09-01", "--json")
        assert out.returncode == 0, out.stderr
        real, replay = json.loads(out.stdout)["reports"]
        assert (real["policy"], replay["policy"]) == ("real", "labq")
        assert real["jobs"] == replay["jobs"] == len(jobs) and real["gpus"] == replay["gpus"] == 8
        assert real["queueing_delay"]["mean"] > 60
        assert replay["queueing_delay"]["mean"] == pytest.approx(real["queueing_delay"]["mean"], rel=0.01)
        refused = sim(alice, "--since", "2026-09-01")
        assert refused.returncode != 0 and "admin" in refused.stderr and "Traceback" not in refused.stderr
        nothing = sim(admin_token, "--since", "2026-09-01", "--until", "2026-09-02")
        assert nothing.returncode != 0 and "no jobs to simulate" in nothing.stderr
    finally:
        server.shutdown()
        server.server_close()
        leader.state.store.close()


def test_the_lab_settings_travel_whole(tmp_path):
    """What ``GET /v1/history`` sends of the lab's settings is what the replay runs with."""
    import json

    from labq.leader.config_file import load_config
    from labq.protocol.history import encode_policy, policy_fields
    from labq.scheduler import Policy

    path = tmp_path / "leader.toml"
    path.write_text('[scheduling]\naging = "2h"\nmin_runtime = "10m"\nhold_depth = 4\nmax_preemptions_per_day = 3\n'
                    'may_preempt = { urgent = ["low", "normal"], high = ["low"] }\n'
                    '[quotas]\nmax_gpus_per_user = 6\nusers = { ana = 2 }\n')
    settings = load_config(path).policy()
    assert Policy(**policy_fields(json.loads(json.dumps(encode_policy(settings))))) == settings
