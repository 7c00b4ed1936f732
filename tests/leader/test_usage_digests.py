"""``labq usage`` keeps a digest of each closed month of the archive (``labq.leader.digests``): a leader that
starts again reads those instead of the month's job documents, and its reports are the same to the last field.
A digest whose month changed (a job archived late), or that is damaged, is not used: the month is read again.
Real TinyDB stores and leaders on loopback over ``tests.leader.usage_history`` (September to November 2026)."""

from __future__ import annotations

from pathlib import Path

import pytest

from labq.leader.auth import Principal
from labq.leader.digests import CACHE_DIR
from labq.models import transitions as t
from labq.protocol.codec import encode_job
from labq.protocol.usage import UsageQuery, decode_use, encode_usage, use_of_row, use_row
from labq.store import PutJob, TinyDBStore
from tests.conftest import FakeClock
from tests.leader.loopback_leader import start_loopback_leader
from tests.leader.usage_history import NOW, at, on, ran, store_history, submitted, WS1

pytestmark = pytest.mark.timeout(60)


def report_of(data: Path) -> tuple[dict, int, dict]:
    """A leader on ``data`` as it starts: its whole-history report, how many archive files it read (no fresh
    digest), and what a report needs of each finished job (the months it keeps, the others from their digests)."""
    lb = start_loopback_leader(data, clock=FakeClock(NOW))
    try:
        accounting = lb.leader.accounting
        accounting.warm_up().join(timeout=30)
        doc = encode_usage(accounting.usage(Principal("user", "root", admin=True), UsageQuery(0.0, None, None)))
        read = accounting.digests.read_again
        assert sorted(accounting._kept) == ["2026-10", "2026-11"]  # a default report's: from 3 October, NOW's 30 days
        every = accounting._months(lambda month: True, NOW)
        return doc, read, {job_id: use for job_id, use in every.items() if use is not None}
    finally:
        lb.stop()


def digests(data: Path) -> list[str]:
    return sorted(p.name for p in (data / CACHE_DIR).iterdir())


def test_a_leader_reads_each_closed_month_from_its_digest_and_reports_the_same(tmp_path):
    data = tmp_path / "data"
    store_history(data)
    first, read, kept = report_of(data)
    assert read == 3  # September, October and November: no digest yet
    assert digests(data) == ["jobs-2026-09.jsonl.usage", "jobs-2026-10.jsonl.usage"]  # not the newest month
    with TinyDBStore(data) as store:
        from_archive = {doc["id"]: decode_use(doc, NOW) for doc in store.history()}
    assert kept == from_archive

    again, read, kept = report_of(data)
    assert read == 1  # the newest month alone
    assert again == first and kept == from_archive


def test_a_month_that_changed_or_a_damaged_digest_is_read_again(tmp_path):
    data = tmp_path / "data"
    store_history(data)
    before, _, _ = report_of(data)
    late = submitted(20, "dave", 1, 0, at(3, 0, 9))
    with TinyDBStore(data) as store:  # a job that ended in September, archived now: into September's file
        store.commit([PutJob(encode_job(late))])
        store.commit([PutJob(encode_job(t.exited(ran(late, on(WS1, 1), at(3, 1, 9)), 0, at(3, 3, 9))))])
    (data / CACHE_DIR / "jobs-2026-10.jsonl.usage").write_text('{"format": 1, "of": "jobs-2026-10.js')
    after, read, kept = report_of(data)
    assert read == 3  # September changed, October's digest is damaged, November is the newest
    assert 20 in kept and after["total"]["jobs"] == before["total"]["jobs"] + 1
    assert after["total"]["gpu_hours"] == pytest.approx(before["total"]["gpu_hours"] + 2.0)
    _, read, again = report_of(data)
    assert read == 1 and again == kept  # both digests made again


@pytest.fixture
def started(tmp_path):
    """A leader on the history at ``NOW`` that has read it as a leader does as it starts (``warm_up``)."""
    store_history(tmp_path / "data")
    lb = start_loopback_leader(tmp_path / "data", clock=FakeClock(NOW))
    try:
        lb.leader.accounting.warm_up().join(timeout=30)
        yield lb
    finally:
        lb.stop()


def gpu_hours_by_user(lb, since: float, until: float | None = None) -> dict[str, float]:
    """The whole lab's GPU-hours from ``since``, by user, as the admin's report has them."""
    admin = Principal("user", "root", admin=True)
    doc = encode_usage(lb.leader.accounting.usage(admin, UsageQuery(since, until, None)))
    return {row["name"]: row["gpu_hours"] for row in doc["by"]["user"]}


def test_the_leader_keeps_the_default_windows_months_and_a_report_reaching_back_reads_the_others(started, tmp_path):
    lb, read = started, []
    accounting, state = lb.leader.accounting, lb.leader.state
    assert sorted(accounting._kept) == ["2026-10", "2026-11"]  # NOW's 30 days start on 3 October
    assert {i for uses in accounting._kept.values() for i in uses} == {1, 2, 3, 5, 7, 8}  # 6 ended in September
    # and the closed months have their digests: a report reaching back reads no job document
    assert digests(tmp_path / "data") == ["jobs-2026-09.jsonl.usage", "jobs-2026-10.jsonl.usage"]
    documents_read = accounting.digests.read_again
    parts = state.store.history_parts
    state.store.history_parts = lambda: read.append(1) or parts()
    # the default window: job 4's 28 h x 8, and no file read
    assert gpu_hours_by_user(lb, NOW - 30 * 86400)["alice"] == 224.0 and read == []
    # from 1 September: job 6's 24 h x 2 in September too, and job 1's hour there, read from September's file
    since_september = {"alice": 8.0 + 48.0 + 224.0, "bob": 64.0, "carol": 4.0, "dave": 6.0}
    assert gpu_hours_by_user(lb, at(1, 0, 9)) == since_september and read == [1]
    assert accounting.digests.read_again == documents_read

    state.clock.now = at(5, 0, 12)  # a month on: job 4 ends in December, and October is no longer kept
    with state.lock:
        state.apply([t.exited(state.jobs[4], 0, at(4, 0, 12))])
    assert sorted(accounting._kept) == ["2026-11", "2026-12"]
    assert gpu_hours_by_user(lb, at(1, 0, 9), NOW) == since_september and read == [1, 1]  # October from its file now
    # the default window, 5 November to 5 December: job 4's 29 days x 8 until it ended, and no file read
    assert gpu_hours_by_user(lb, at(5, 0, 12) - 30 * 86400) == {"alice": 29 * 24 * 8.0} and read == [1, 1]


def test_a_job_a_report_saw_running_and_then_read_finished_in_an_older_month_is_counted_once(started):
    state = started.leader.state
    state.clock.now = at(20, 0, 12)  # November and December are kept now
    parts = state.store.history_parts

    def job_4_ends_meanwhile():  # its node, silent for weeks, says it ended on 31 October: October's file
        with state.lock:
            state.apply([t.exited(state.jobs[4], 0, at(31, 23))])
        return parts()

    state.store.history_parts = job_4_ends_meanwhile
    # jobs 1 (8) and 6 (48), and 4 as it ended: 3 h x 8, not also as it ran until now
    assert gpu_hours_by_user(started, at(1, 0, 9))["alice"] == 8.0 + 48.0 + 24.0


def test_a_job_use_survives_its_row_through_json():
    import json

    from tests.leader.usage_history import history

    for life in history():
        use = decode_use(encode_job(life[-1]), NOW)
        assert use_of_row(json.loads(json.dumps(use_row(use)))) == use
