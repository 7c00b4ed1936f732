"""A change lets go of the lab's locks once its commit is written, and waits for the disk outside them: while
one is on its way to disk, whoever only looks is answered at once (listings, a job, tokens, the GPUs, a scrape,
usage), the next change is decided and written meanwhile, and works from its result, and nothing leaves the
leader that a commit not yet on disk made (a change's answer, an agent's orders). A commit lost on the way
after the leader had taken it in stops changes until a restart, which reads what is on disk.

A leader on a real TinyDB store whose fsync the test holds or fails (``HeldDisk``), and a fake clock."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable

import pytest

from labq.leader.auth import Principal
from labq.leader.core import Leader
from labq.leader.state import AgentSession
from labq.models import JobState, Node
from labq.protocol import errors
from labq.protocol.agents import SyncReport
from labq.protocol.requests import parse_action, parse_submit
from labq.protocol.usage import UsageQuery
from labq.store import TinyDBStore
from labq.store.files import Disk
from labq.topologies import parse_sim_spec
from tests.leader import answers
from tests.leader.answers import WAIT_S, in_thread
from tests.leader.labs import leader_with_ws1

ALICE = Principal("user", "alice")
ADMIN = Principal("user", "root", admin=True)
WS1 = Principal("agent", "ws1")
CANCEL = parse_action({"action": "cancel"})


class HeldDisk(Disk):
    """fsync as the OS does it, except while the test holds it (then it waits until let go) or fails it (EIO, as
    a dying disk does)."""

    def __init__(self) -> None:
        self.holding = False
        self.failing = False
        self.entered = threading.Event()  #: an fsync is waiting
        self.go = threading.Event()

    def fsync(self, fd: int) -> None:
        if self.holding:
            self.entered.set()
            assert self.go.wait(30), "the test never let the disk go"
        if self.failing:
            raise OSError(errno.EIO, "Input/output error")
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


def let_go(disk: HeldDisk, *threads) -> None:
    """The disk goes on, and ``threads``, which waited for it, end."""
    disk.holding = False
    disk.go.set()
    for thread in threads:
        thread.join(WAIT_S)
        assert not thread.is_alive(), "a call still waits for the disk it was let go"


def submit(leader: Leader) -> int:
    return leader.queue.submit(ALICE, parse_submit({"command": ["train"], "gpus": 1})).id


def test_looks_are_answered_while_a_change_waits_for_the_disk_whose_answer_waits_for_it(lab):
    leader, disk = lab
    job = submit(leader)
    admin, token = leader.users.ensure_admin("root")
    disk.holding = True
    cancel, cancelled = in_thread(lambda: leader.queue.act(ALICE, job, CANCEL))
    assert disk.entered.wait(WAIT_S), "the cancel never reached the disk"

    # written: a crash of the leader keeps it (only a lost sync takes it back, and stops changes: see below)
    for history, shown in ((False, []), (True, [(job, JobState.CANCELLED)])):
        listing = answered(lambda: leader.queue.visible(ALICE, user=None, states=(), everyone=True, history=history,
                                                        limit=None))
        assert [(j.id, j.state) for j in listing.jobs] == shown
    assert answered(lambda: leader.queue.job(ALICE, job))[0].state is JobState.CANCELLED
    who = answered(lambda: leader.users.authenticate(token))
    assert (who.kind, who.name, who.admin) == ("user", admin, True)
    assert [n["name"] for n in answered(lambda: leader.agents.view(ALICE))] == ["ws1"]
    assert answered(lambda: leader.users.still_valid(who)) is True
    assert b"labq_jobs" in answered(leader.metrics.exposition)
    assert answered(lambda: leader.accounting.usage(ADMIN, UsageQuery(None, None, None))).user is None
    cancel.join(0.5)
    assert cancel.is_alive(), "the cancel was answered before its commit was on disk"

    let_go(disk, cancel)
    assert cancelled["value"].state is JobState.CANCELLED


def test_the_next_change_is_decided_and_written_while_one_waits_for_the_disk(lab):
    leader, disk = lab
    first_job, second_job = submit(leader), submit(leader)
    disk.holding = True
    first, first_out = in_thread(lambda: leader.queue.act(ALICE, first_job, CANCEL))
    assert disk.entered.wait(WAIT_S)
    second, second_out = in_thread(lambda: leader.queue.act(ALICE, second_job, CANCEL))
    # the second cancel is taken in while the first one's fsync is still held: no lock waits for the disk
    answers.wait_until(lambda: leader.queue.job(ALICE, second_job)[0].state is JobState.CANCELLED,
                       "a change waited for another's commit on its way to disk")
    second.join(0.5)
    assert first.is_alive() and second.is_alive(), "a change was answered before its commit was on disk"

    let_go(disk, first, second)
    assert first_out["value"].state is second_out["value"].state is JobState.CANCELLED


def test_a_second_change_to_the_same_job_works_from_the_first_and_answers_once_it_is_on_disk(lab):
    leader, disk = lab
    job = submit(leader)
    disk.holding = True
    first, first_out = in_thread(lambda: leader.queue.act(ALICE, job, CANCEL))
    assert disk.entered.wait(WAIT_S)
    second, second_out = in_thread(lambda: leader.queue.act(ALICE, job, CANCEL))
    second.join(0.5)
    assert second.is_alive(), "a change that read another's commit was answered before that commit was on disk"
    let_go(disk, first, second)
    assert first_out["value"].state is JobState.CANCELLED
    # it read the job after the first cancel was taken in: there is nothing left to cancel
    assert second_out["error"].status == 404


def test_an_agent_is_sent_the_orders_of_a_change_only_once_it_is_on_disk(lab):
    leader, disk = lab
    job = submit(leader)
    leader.agents.sync(WS1, "ws1", SyncReport((), None, 0.0))  # what it should run now (nothing) is delivered
    poll, polled = in_thread(lambda: leader.agents.sync(WS1, "ws1", SyncReport((), None, WAIT_S)))
    assert answers.wait_until(lambda: leader.state.changed._waiters, "the agent's long poll never waited")
    disk.holding = True
    placing, _ = in_thread(leader.scheduling.schedule_pass)
    assert disk.entered.wait(WAIT_S), "the pass never committed its start"
    assert answered(lambda: leader.queue.job(ALICE, job))[0].state is JobState.STARTING
    poll.join(0.5)
    assert poll.is_alive(), "the agent was sent an order whose commit was not on disk"
    let_go(disk, poll, placing)
    assert [order.job_id for order in polled["value"].run] == [job]


def test_a_change_lost_on_its_way_to_disk_stops_changes_until_a_restart_reads_the_disk(tmp_path):
    disk = HeldDisk()
    store = TinyDBStore(tmp_path / "data", disk=disk)
    leader, _ = leader_with_ws1(tmp_path, store=store)
    job, kept = submit(leader), submit(leader)
    disk.failing = True
    with pytest.raises(errors.ApiError) as lost:
        leader.queue.act(ALICE, job, CANCEL)
    assert lost.value.status == 503 and "lost on its way to disk" in lost.value.message
    assert "refuses changes until it is restarted" in lost.value.message
    disk.failing = False
    for change in (lambda: leader.queue.act(ALICE, kept, parse_action({"action": "hold"})), lambda: submit(leader)):
        with pytest.raises(errors.ApiError) as refused:
            change()
        assert refused.value.status == 503 and "until the leader restarts" in refused.value.message
    # nothing the leader decides from now on goes out: no orders, no answer that may come of the lost change
    for call in (lambda: leader.agents.sync(WS1, "ws1", SyncReport((), None, 0.0)),
                 lambda: leader.queue.act(ALICE, job, CANCEL)):
        with pytest.raises(errors.ApiError) as refused:
            call()
        assert refused.value.status == 503 and "until the leader restarts" in refused.value.message
    # looks go on, with the lab as the leader took it in
    assert answered(lambda: leader.queue.job(ALICE, kept))[0].state is JobState.QUEUED
    leader.stop()
    store.close()

    with TinyDBStore(tmp_path / "data") as again:
        restarted = Leader(leader.config, again)
        inv = parse_sim_spec("sim:ws-4x3090")
        restarted.state.agents["ws1"] = AgentSession("ws1", Node("ws1", inv.gpus("ws1"), inv.topology,
                                                                 simulated=True), "x", None, None, last_seen=0.0)
        assert {j.id: j.state for j in restarted.state.jobs.values()} == {job: JobState.QUEUED,
                                                                          kept: JobState.QUEUED}
        assert restarted.queue.act(ALICE, job, CANCEL).state is JobState.CANCELLED
        restarted.stop()


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
