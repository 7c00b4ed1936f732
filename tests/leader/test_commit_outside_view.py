"""A change's commit waits for the disk outside the lab's view: while one is on its way to disk, whoever only
looks is answered at once (listings, a job, tokens, the GPUs, a scrape, usage), and sees the lab as it is on
disk; another change waits for it and then works from its result, never from the version before.

A leader on a real TinyDB store whose fsync the test holds (``HeldDisk``), and a fake clock."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from labq.leader.auth import Principal
from labq.models import JobState
from labq.protocol.requests import parse_action, parse_submit
from labq.protocol.usage import UsageQuery
from labq.store import TinyDBStore
from labq.store.files import Disk
from tests.leader import answers
from tests.leader.answers import WAIT_S, in_thread
from tests.leader.labs import leader_with_ws1

ALICE = Principal("user", "alice")
ADMIN = Principal("user", "root", admin=True)


class HeldDisk(Disk):
    """fsync as the OS does it, except while the test holds it: then it waits until let go."""

    def __init__(self) -> None:
        self.holding = False
        self.entered = threading.Event()  #: an fsync is waiting
        self.go = threading.Event()

    def fsync(self, fd: int) -> None:
        if self.holding:
            self.entered.set()
            assert self.go.wait(30), "the test never let the disk go"
        super().fsync(fd)


@pytest.fixture
def lab(tmp_path):
    disk = HeldDisk()
    store = TinyDBStore(tmp_path / "data", disk=disk)
    leader, clock = leader_with_ws1(tmp_path, store=store)
    yield leader, disk
    disk.go.set()
    leader.stop()
    store.close()


def answered(call: Callable[[], object]) -> object:
    return answers.answered(call, "a look waited for a commit on its way to disk")


def test_looks_are_answered_while_a_change_waits_for_the_disk_and_show_the_lab_as_on_disk(lab):
    leader, disk = lab
    job = leader.queue.submit(ALICE, parse_submit({"command": ["train"], "gpus": 1})).id
    admin, token = leader.users.ensure_admin("root")
    disk.holding = True
    cancel, cancelled = in_thread(lambda: leader.queue.act(ALICE, job, parse_action({"action": "cancel"})))
    assert disk.entered.wait(WAIT_S), "the cancel never reached the disk"

    listing = answered(lambda: leader.queue.visible(ALICE, user=None, states=(), everyone=True, history=False,
                                                    limit=None))
    assert [(j.id, j.state) for j in listing.jobs] == [(job, JobState.QUEUED)]  # not on disk: not shown
    assert answered(lambda: leader.queue.job(ALICE, job))[0].state is JobState.QUEUED
    who = answered(lambda: leader.users.authenticate(token))
    assert (who.kind, who.name, who.admin) == ("user", admin, True)
    assert [n["name"] for n in answered(lambda: leader.agents.view(ALICE))] == ["ws1"]
    assert answered(lambda: leader.users.still_valid(who)) is True
    assert b"labq_jobs" in answered(leader.metrics.exposition)
    assert answered(lambda: leader.accounting.usage(ADMIN, UsageQuery(None, None, None))).user is None
    assert cancel.is_alive(), "the cancel came back before its commit was on disk"

    disk.holding = False
    disk.go.set()
    cancel.join(WAIT_S)
    assert cancelled["value"].state is JobState.CANCELLED
    assert leader.queue.job(ALICE, job)[0].state is JobState.CANCELLED


def test_a_second_change_waits_for_the_first_and_works_from_its_result(lab):
    leader, disk = lab
    job = leader.queue.submit(ALICE, parse_submit({"command": ["train"], "gpus": 1})).id
    disk.holding = True
    first, first_out = in_thread(lambda: leader.queue.act(ALICE, job, parse_action({"action": "cancel"})))
    assert disk.entered.wait(WAIT_S)
    second, second_out = in_thread(lambda: leader.queue.act(ALICE, job, parse_action({"action": "cancel"})))
    second.join(0.5)
    assert second.is_alive(), "a second change to the same job did not wait for the first one's commit"
    disk.holding = False
    disk.go.set()
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert first_out["value"].state is JobState.CANCELLED
    # it read the job after the first cancel was taken in: there is nothing left to cancel
    assert second_out["error"].status == 404


def test_a_look_may_not_start_a_change_and_a_change_may_not_wait_for_news(lab):
    leader, _ = lab
    state = leader.state
    with state.view, pytest.raises(RuntimeError, match="may not start a change"):
        with state.lock:
            pass
    with state.lock, pytest.raises(RuntimeError, match="would stop every other change"):
        state.lock.wait(0.01)
    with state.view, pytest.raises(RuntimeError, match="only a change"):
        state.commit([])
