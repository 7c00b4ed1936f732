"""Who is told of what (``labq.models.notify``), as tables: the notices each change of a job causes, a reservation's
moments, the retry schedule; and the wire (``labq.protocol.notify``, the ``notify`` field of a job, ``--notify``)."""

from __future__ import annotations

import pytest

from labq.models import transitions as t
from labq.models import Job, JobSpec, JobState, NodeAllocation, Placement
from labq.models.job import AfterReservation
from labq.models.notify import (
    NotifyEvent as E, NotifySettings, RetryPolicy, job_notices, reservation_moments, reservation_notice,
)
from labq.models.reservation import Reservation
from labq.protocol.codec import decode_job, decode_reservation, encode_job, encode_reservation
from labq.protocol.errors import ApiError
from labq.protocol.notify import decode_notice, email_problem, encode_notice, parse_settings
from labq.protocol.requests import notify_words, parse_submit, submit_request

PLACE = Placement((NodeAllocation("ws1", (0,), ("u0",)),))
ALL = frozenset(E)


def job(**spec) -> Job:
    return Job(7, JobSpec(user="alice", command=("train",), name="bert", **spec), submitted_at=100.0)


QUEUED = job()
STARTING = t.placed(QUEUED, PLACE)
RUNNING = t.running(STARTING, 200.0)
SUCCEEDED = t.exited(RUNNING, 0, 300.0)
FAILED = t.exited(RUNNING, 2, 300.0)
TIMED_OUT = t.exited(RUNNING.evolve(stop_requested="timeout"), 143, 300.0)
CANCELLED = t.exited(RUNNING.evolve(stop_requested="cancel"), 143, 300.0)
PREEMPTED = t.exited(t.preempting(RUNNING.evolve(last_checkpoint_at=250.0), for_job=9), 0, 290.0)
LOST = t.lost(RUNNING, 400.0)
BY_ADMIN = t.exited(RUNNING.evolve(stop_requested="cancel", cancelled_by="root"), 143, 300.0)
NEVER = t.out_of_dependencies([job(depends_on=(3,))], {3: JobState.FAILED}, 300.0)[0]
BOOKING_OVER = t.leave_reservation(job(reservation="paper", after_reservation=AfterReservation.CANCEL),
                                   "reservation 'paper' ended", 300.0)
RUNNING_AGAIN = t.running(t.placed(PREEMPTED, PLACE), 500.0)


@pytest.mark.parametrize(("old", "new", "wanted", "keys"), [
    (QUEUED, STARTING, ALL, []),  # placed is not started
    (STARTING, RUNNING, ALL, ["job-7.1.start"]),
    (RUNNING, RUNNING.evolve(last_checkpoint_at=250.0), ALL, []),  # still running: no second start
    (RUNNING, SUCCEEDED, ALL, ["job-7.end"]),
    (RUNNING, SUCCEEDED, {E.FAIL}, []),
    (RUNNING, FAILED, ALL, ["job-7.fail"]),
    (RUNNING, TIMED_OUT, {E.FAIL}, ["job-7.fail"]),
    (RUNNING, CANCELLED, ALL, []),  # a cancel is its owner's own doing
    (RUNNING, BY_ADMIN, ALL, ["job-7.fail"]),  # someone else's is not: who hears of failures hears of it
    (RUNNING, BY_ADMIN, {E.END, E.START, E.PREEMPT}, []),
    (QUEUED, NEVER, {E.FAIL}, ["job-7.fail"]),  # the lab cancelled it: it can never start
    (QUEUED, BOOKING_OVER, {E.FAIL}, ["job-7.fail"]),
    (RUNNING, PREEMPTED, ALL, ["job-7.1.requeue"]),
    (RUNNING, PREEMPTED, {E.END, E.FAIL}, []),
    (RUNNING, LOST, {E.PREEMPT}, ["job-7.1.requeue"]),
    (RUNNING, LOST, {E.FAIL}, ["job-7.1.requeue"]),  # the lab's failure: who hears of failures hears of it
    (RUNNING, PREEMPTED, {E.FAIL}, []),
    (STARTING.evolve(attempt=2), RUNNING_AGAIN, {E.START}, ["job-7.2.start"]),  # each attempt starts anew
    (None, SUCCEEDED, ALL, ["job-7.end"]),  # ended before anyone saw it
    (SUCCEEDED, SUCCEEDED, ALL, []),
    (RUNNING, SUCCEEDED, frozenset(), []),
])
def test_the_notices_a_change_of_a_job_causes(old, new, wanted, keys):
    found = job_notices(old, new, wanted)
    assert [n.key for n in found] == keys
    assert all(n.user == "alice" and n.job_id == 7 and n.job_name == "bert" for n in found)


@pytest.mark.parametrize(("old", "new", "line"), [
    (STARTING, RUNNING, "alice: job 7 (bert) started running (attempt 1) on ws1"),
    (RUNNING, SUCCEEDED, "alice: job 7 (bert) succeeded on ws1"),
    (RUNNING, FAILED, "alice: job 7 (bert) failed (exit 2) on ws1"),
    (RUNNING, TIMED_OUT, "alice: job 7 (bert) timed out (stopped at its time limit) on ws1"),
    (RUNNING, PREEMPTED, "alice: job 7 (bert) was requeued on ws1: preempted for job 9; 40 s of work since its "
                         "last checkpoint lost"),
    (RUNNING, LOST, "alice: job 7 (bert) was requeued on ws1: its node was lost; 3 min of work since its last "
                    "checkpoint lost"),
    (RUNNING, BY_ADMIN, "alice: job 7 (bert) was cancelled on ws1: by root"),
    (QUEUED, NEVER, "alice: job 7 (bert) was cancelled: it can never start: job 3 ended failed (--after waits for "
                    "success; --after-any for any end)"),
    (QUEUED, BOOKING_OVER, "alice: job 7 (bert) was cancelled: reservation 'paper' ended before it started "
                           "(--after-reservation cancel)"),
])
def test_what_a_notice_says(old, new, line):
    [notice] = job_notices(old, new, ALL)
    assert notice.headline() == line
    assert decode_notice(encode_notice(notice)) == notice
    assert notice.headline(quote=lambda s: f"[{s}]") == line.replace("(bert)", "([bert])")


def test_a_node_that_could_not_start_the_job_says_why():
    refused = t.lost(STARTING, 210.0).evolve(note="could not start on ws1: no account for alice; requeued")
    [notice] = job_notices(STARTING, refused, {E.FAIL})
    assert notice.reason == "could not start on ws1: no account for alice"


def test_a_job_says_what_notifies_else_its_owners_defaults():
    mine = NotifySettings(on=frozenset({E.END}))
    assert mine.wanted_for(job()) == {E.END}
    assert mine.wanted_for(job(notify=(E.FAIL, E.START))) == {E.FAIL, E.START}
    assert mine.wanted_for(job(notify=())) == frozenset()  # --notify none


def test_a_jobs_notify_is_stored_only_when_asked_and_old_jobs_load():
    plain = encode_job(job())
    assert "notify" not in plain["spec"] and decode_job(plain).spec.notify is None  # as a job stored before
    asked = job(notify=(E.END, E.PREEMPT))
    assert encode_job(asked)["spec"]["notify"] == ["end", "preempt"]
    assert decode_job(encode_job(asked)) == asked
    assert decode_job(encode_job(job(notify=()))).spec.notify == ()
    assert "cancelled_by" not in plain  # stored only for a job someone else cancelled
    assert decode_job(encode_job(BY_ADMIN)) == BY_ADMIN and encode_job(BY_ADMIN)["cancelled_by"] == "root"


def booking(**kw) -> Reservation:
    return Reservation("paper", "alice", 2, 1000.0, 2000.0, node="ws1", **kw)


@pytest.mark.parametrize(("r", "now", "due"), [
    (booking(), 999.0, ()),
    (booking(), 1000.0, ("started",)),
    (booking(told=("started",)), 1500.0, ()),
    (booking(told=("started",)), 2000.0, ("ended",)),
    (booking(), 2500.0, ("ended",)),  # the leader was down all along: its end alone
    (booking(told=("started", "ended")), 2500.0, ()),
    (booking(cancelled_at=1200.0, told=("started",)), 2500.0, ()),  # cancelled: no end to tell of
])
def test_a_reservations_moments(r, now, due):
    assert reservation_moments(r, now) == due


def test_a_reservations_notice_and_what_it_stores():
    assert reservation_notice(booking(), "started", 1000.0).headline() == \
        "alice: reservation paper (2 GPUs on ws1) has started"
    told = booking(told=("started",))
    assert decode_reservation(encode_reservation(told)) == told
    assert "told" not in encode_reservation(booking())  # a booking stored before reads as one not told of


@pytest.mark.parametrize(("tries", "wait"), [(1, 5.0), (2, 10.0), (3, 20.0), (7, 320.0), (8, 600.0), (500, 600.0)])
def test_retries_double_up_to_their_cap(tries, wait):
    assert RetryPolicy().delay(tries) == wait


def test_a_notice_is_given_up_after_a_day():
    retry = RetryPolicy()
    assert not retry.gives_up(0.0, 86399.0) and retry.gives_up(0.0, 86400.0)


# -- the wire ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("typed", "words"), [
    (["end"], ["end"]), (["end,preempt"], ["end", "preempt"]), (["end", "fail,end"], ["end", "fail"]),
    ([" End , FAIL "], ["end", "fail"]), (["none"], []),
])
def test_notify_flags_as_the_cli_sends_them(typed, words):
    assert notify_words(typed) == words
    body = submit_request(["x"], notify=words)
    assert body["notify"] == words
    assert set(parse_submit(body).fields["notify"]) == {E(w) for w in words}


@pytest.mark.parametrize("typed", [["ends"], ["end,reservation"], ["none,end"], [","], [""]])
def test_a_bad_notify_flag_says_what_works(typed):
    with pytest.raises(ValueError, match="--notify .* use start, end, fail, preempt"):
        notify_words(typed)


def test_submit_without_notify_keeps_the_owners_defaults():
    assert "notify" not in submit_request(["x"])
    assert "notify" not in parse_submit(submit_request(["x"])).fields


@pytest.mark.parametrize(("address", "good"), [
    ("alice@lab.org", True), ("a.b+tag@sub.lab-1.org", True), ("alice@localhost", True),
    ("alice", False), ("alice@", False), ("@lab.org", False), ("alice@lab..org", False), ("a b@lab.org", False),
    ("alice@lab.org\nBcc: eve@x.org", False), ("Alice <alice@lab.org>", False), ("alice@lab.org,eve@x.org", False),
    ("a" * 65 + "@lab.org", False), ("alice@-lab.org", False), (".alice@lab.org", False), ("alíce@lab.org", False),
])
def test_email_addresses_are_plain(address, good):
    assert (email_problem(address) is None) == good


def test_settings_requests_are_checked_field_by_field():
    request = parse_settings({"on": ["reservation", "end"], "email": "", "webhook": False})
    assert (request.on, request.email, request.webhook, request.user) == ((E.END, E.RESERVATION), "", False, None)
    with pytest.raises(ApiError, match="unknown field mail"):
        parse_settings({"mail": "alice@lab.org"})
    with pytest.raises(ApiError, match="user name"):
        parse_settings({"user": "Alice Smith", "on": []})
