"""The lab's own steps in the event log (``labq events``): what the scheduler and the agents did to a job, beside
the requests people made; reservations begun and over. A real leader on loopback (TinyDB store, real audit file)."""

from __future__ import annotations

import pytest

from labq.leader.audit import AuditQuery
from labq.leader.auth import Principal
from labq.models import JobState
from labq.models import transitions as t
from labq.models.story import Step, step_of
from tests.conftest import NOW, make_node
from tests.leader.loopback_leader import start_loopback_leader
from tests.leader.test_metrics import register

pytestmark = pytest.mark.timeout(60)


def test_each_step_of_a_job_is_told_once_in_the_lab_words(jobs):
    ws = make_node("ws1", "sim:ws-4x3090")
    queued = jobs.queued(2)
    assert step_of(None, queued) is None  # the submit is the person's request, told as such
    running = jobs.running(ws, (0, 1), started_at=NOW)
    placed = t.placed(queued, running.placement)
    assert step_of(queued, placed) == Step("placed", "ws1 GPUs 0,1")
    started = t.running(placed, NOW)
    assert step_of(placed, started) == Step("started", "attempt 1 on ws1 GPUs 0,1")
    assert step_of(started, started.evolve(last_checkpoint_at=NOW + 5)) is None
    asked = t.preempting(started, for_job=99)
    assert step_of(started, asked) == Step("preempting", "for job 99")
    requeued = t.exited(asked, 0, NOW + 600)
    assert requeued.state is JobState.QUEUED
    step = step_of(asked, requeued)
    assert step.action == "requeued" and step.detail.startswith("attempt 1 checkpointed")
    again = t.running(t.placed(requeued, running.placement), NOW + 700)
    failed = t.exited(again, 3, NOW + 800)
    assert step_of(again, failed) == Step("failed", "exit 3")
    assert step_of(failed, failed) is None


def test_a_job_story_in_the_log_as_its_owner_and_an_admin_see_it(tmp_path):
    lb = start_loopback_leader(tmp_path)
    try:
        agent = register(lb, "n1", 2)
        tokens = {}
        for user in ("alice", "bob"):
            status, _, doc = lb.request("POST", "/v1/users", {"name": user, "admin": False})
            assert status == 201, doc
            tokens[user] = doc["token"]
        status, _, doc = lb.request("POST", "/v1/jobs", {"command": ["train"], "gpus": 1, "workdir": "/tmp"},
                                    token=tokens["alice"])
        assert status == 201, doc
        job = doc["job"]["id"]
        lb.leader.scheduling.schedule_pass()
        attempt = {"job_id": job, "attempt": 1, "running": True, "started_at": lb.leader.state.clock()}
        assert lb.request("POST", "/v1/agents/n1/sync", {"attempts": [attempt]}, token=agent)[0] == 200
        ended = attempt | {"running": False, "exit_code": 0, "ended_at": lb.leader.state.clock()}
        assert lb.request("POST", "/v1/agents/n1/sync", {"attempts": [ended]}, token=agent)[0] == 200

        def story(token: str, **query) -> list[tuple]:
            params = "&".join(f"{k}={v}" for k, v in query.items())
            status, _, doc = lb.request("GET", f"/v1/audit?{params}", token=token)
            assert status == 200, doc
            return [(e["kind"], e["action"]) for e in doc["events"]]

        whole = [("user", "submit"), ("lab", "placed"), ("lab", "started"), ("lab", "succeeded")]
        assert story("admin", job=job) == whole
        assert story(tokens["alice"], job=job) == whole  # her job: the lab's steps are hers to see
        assert story(tokens["bob"], job=job) == []
        assert story("admin", job=job, kind="lab") == whole[1:]
        status, _, doc = lb.request("GET", "/v1/audit?kind=robot")
        assert status == 400 and doc["error"]["code"] == "bad_request"
    finally:
        lb.stop()


def test_reservations_begun_and_over_are_told_once_and_not_again_after_a_restart(tmp_path):
    """The scheduler's timers find a booking's start and end; each is told once, and a leader started again over
    the same store does not tell them again (the booking keeps what was told)."""
    from labq.leader.config import LeaderConfig
    from labq.leader.core import Leader
    from labq.leader.state import AgentSession
    from labq.protocol.bookings import parse_reserve
    from labq.store import TinyDBStore
    from tests.conftest import FakeClock

    clock = FakeClock(NOW)

    def leader() -> Leader:
        made = Leader(LeaderConfig(data_dir=tmp_path), TinyDBStore(tmp_path), clock=clock)
        made.state.agents["ws1"] = AgentSession("ws1", make_node("ws1", "sim:ws-4x3090"), "x", None, None,
                                                last_seen=clock.now)
        return made

    def tick(lab: Leader, at: float) -> None:
        clock.now = at
        lab.state.agents["ws1"].last_seen = at
        lab.scheduling.tick()

    first = leader()
    _, booked, _ = first.bookings.reserve(Principal("user", "alice"), parse_reserve(
        {"name": "paper", "gpus": 2, "start": NOW + 60, "end": NOW + 3600}))
    assert booked
    for at in (NOW + 30, NOW + 60, NOW + 61, NOW + 1800):
        tick(first, at)
    first.stop()
    first.state.store.close()
    again = leader()
    for at in (NOW + 1900, NOW + 3600, NOW + 4000):
        tick(again, at)
    told = [(e["action"], e["target"], e["owner"]) for e in again.audit.find(AuditQuery(kind="lab", limit=100),
                                                                              lambda e: True)]
    assert told == [("reservation started", "paper", "alice"), ("reservation ended", "paper", "alice")]
    again.stop()
    again.state.store.close()
