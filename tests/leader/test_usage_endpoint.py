"""``GET /v1/usage`` of a real leader on loopback over a real TinyDB store, whose history (``usage_history``)
spans three archive months, with a job preempted twice, a running job and jobs that straddle the window's ends.
Every expected figure below was worked out by hand from the history's docstring, not by the code's formula:
GPU-hours are GPUs x hours inside the window, shares are over 12 GPUs x the window's hours.
"""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from tests.leader.usage_history import NOW, OCTOBER, at, start_usage_lab

pytestmark = pytest.mark.timeout(120)

H, M = 3600.0, 60.0
OCTOBER_HOURS = 31 * 24  # 744 h; capacity 12 x 744 = 8,928 GPU-h

#: October, by hand. name: (GPU-hours, jobs run, failed, preempted, cancelled, mean wait s, p90 wait s, lost GPU-h)
BY_USER = {
    # job 1: 1 Oct 00:00-03:00 x 2 GPUs = 6 (its hour in September is not October's); job 4: 31 Oct 20:00-24:00 x 8
    # = 32; job 4 waited 2 h (job 1 first started in September: no wait in October); job 9 never ran
    "alice": (38.0, 2, 0, 0, 0, 2 * H, 2 * H, 0.0),
    # job 2: 4 GPUs x (4 h on dgx + 2 h on ws1 + 10 h on dgx) = 64, preempted twice (one job), lost 4 x (0.5 + 2)
    # = 10; waited 1 h; job 5 cancelled before it ran
    "bob": (64.0, 1, 0, 1, 1, 1 * H, 1 * H, 10.0),
    # job 8: 6 h x 1, cancelled while running, waited 1 h
    "dave": (6.0, 1, 0, 0, 1, 1 * H, 1 * H, 0.0),
    # job 3: 2 h x 1, failed, waited 30 min; job 7: 31 Oct 23:00-24:00 x 1 (its hour in November is not October's),
    # waited 1 h: mean 45 min, p90 is the 2nd of 2 (rank ceil(1.8))
    "carol": (3.0, 2, 1, 0, 0, 45 * M, 1 * H, 0.0),
}
BY_CLASS = {
    "low": (64.0, 1, 0, 1, 0, 1 * H, 1 * H, 10.0),  # job 2
    # jobs 1 (6), 4 (32), 7 (1), 8 (6) and the cancelled 5; waits 2 h, 1 h, 1 h: p90 is the 3rd of 3
    "normal": (45.0, 4, 0, 0, 2, 80 * M, 2 * H, 0.0),
    "high": (2.0, 1, 1, 0, 0, 30 * M, 30 * M, 0.0),  # job 3
}
BY_NODE = {
    # job 2's 1st and 3rd attempts (16 + 40), job 3 (2), job 4 (32); job 2 waited 1 h (its first attempt ran here),
    # job 3 30 min, job 4 2 h; job 2 lost 4 x 0.5 here
    "dgx": (90.0, 3, 1, 1, 0, 70 * M, 2 * H, 2.0),
    # job 1 (6), job 2's 2nd attempt (8), job 7 (1), job 8 (6); waits of jobs 7 and 8; job 2 lost 4 x 2 here
    "ws1": (21.0, 4, 0, 1, 1, 1 * H, 1 * H, 8.0),
}
BY_MODEL = {"Tesla V100-SXM2-32GB": BY_NODE["dgx"], "NVIDIA GeForce RTX 3090": BY_NODE["ws1"]}
#: jobs 1, 2, 3, 4, 7, 8 ran; waits 1 h, 30 min, 2 h, 1 h, 1 h: mean 66 min, p90 the 5th of 5
TOTAL = (111.0, 6, 1, 1, 2, 66 * M, 2 * H, 10.0)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lb = start_usage_lab(tmp_path_factory.mktemp("usage") / "data")
    assert sorted(p.name for p in (lb.data_dir / "archive").iterdir()) == [
        "jobs-2026-09.jsonl", "jobs-2026-10.jsonl", "jobs-2026-11.jsonl"]
    yield lb
    lb.stop()


def usage(lab, token: str = "admin", expect: int = 200, **query) -> dict:
    status, _, doc = lab.request("GET", "/v1/usage?" + urlencode(query), token=token)
    assert status == expect, doc
    return doc


def figures(row: dict) -> tuple:
    return (row["gpu_hours"], row["jobs"], row["failed"], row["preempted"], row["cancelled"], row["mean_wait_s"],
            row["p90_wait_s"], row["lost_gpu_hours"])


def table(rows: list[dict]) -> dict[str, tuple]:
    return {row["name"]: figures(row) for row in rows}


def test_october_per_user_class_node_and_model_as_worked_out_by_hand(lab):
    report = usage(lab, since=OCTOBER[0], until=OCTOBER[1])
    assert (report["since"], report["until"], report["hours"]) == (OCTOBER[0], OCTOBER[1], OCTOBER_HOURS)
    assert (report["gpus"], report["capacity_gpu_hours"], report["user"]) == (12, 8928.0, None)
    assert table(report["by"]["user"]) == BY_USER
    assert [row["name"] for row in report["by"]["user"]] == ["bob", "alice", "dave", "carol"]  # most GPU-h first
    assert table(report["by"]["class"]) == BY_CLASS
    assert table(report["by"]["node"]) == BY_NODE
    assert table(report["by"]["model"]) == BY_MODEL
    assert figures(report["total"]) == TOTAL
    shares = {row["name"]: row["share"] for row in report["by"]["user"]}
    assert shares == {"bob": pytest.approx(64 / 8928, abs=1e-6), "alice": pytest.approx(38 / 8928, abs=1e-6),
                      "dave": pytest.approx(6 / 8928, abs=1e-6), "carol": pytest.approx(3 / 8928, abs=1e-6)}
    assert report["total"]["share"] == pytest.approx(111 / 8928, abs=1e-6)


def test_a_window_up_to_now_counts_the_running_job_so_far_across_two_archive_months(lab):
    report = usage(lab, since=at(31))  # 31 Oct 00:00 to now, 2 Nov 00:00: October's file and November's
    assert (report["until"], report["hours"], report["capacity_gpu_hours"]) == (NOW, 48.0, 12 * 48.0)
    # job 4: 8 GPUs from 31 Oct 20:00 to now = 28 h x 8; job 7: 31 Oct 23:00 - 1 Nov 01:00 x 1
    assert table(report["by"]["user"]) == {"alice": (224.0, 1, 0, 0, 0, 2 * H, 2 * H, 0.0),
                                           "carol": (2.0, 1, 0, 0, 0, 1 * H, 1 * H, 0.0)}
    assert table(report["by"]["node"]) == {"dgx": (224.0, 1, 0, 0, 0, 2 * H, 2 * H, 0.0),
                                           "ws1": (2.0, 1, 0, 0, 0, 1 * H, 1 * H, 0.0)}
    assert usage(lab, since=at(31), until=NOW + 30 * 86400)["until"] == NOW  # the future has no use yet


def test_windows_that_tile_the_history_split_straddling_attempts_and_add_up_to_the_whole(lab):
    september = usage(lab, since=at(1, 0, 9), until=OCTOBER[0])
    # job 6: 24 h x 2; job 1: 30 Sep 23:00-24:00 x 2
    assert table(september["by"]["user"]) == {"alice": (50.0, 2, 0, 0, 0, 1 * H, 1 * H, 0.0)}
    november = usage(lab, since=OCTOBER[1])  # to now: job 4 24 h x 8, job 7 1 h x 1
    assert {r["name"]: r["gpu_hours"] for r in november["by"]["user"]} == {"alice": 192.0, "carol": 1.0}
    # every attempt whole: 8 + 64 + 2 + 28 x 8 + 48 + 2 + 6
    assert september["total"]["gpu_hours"] + TOTAL[0] + november["total"]["gpu_hours"] == 354.0
    assert usage(lab, since=at(1, 0, 9))["total"]["gpu_hours"] == 354.0


def test_a_user_sees_their_own_usage_and_only_admins_see_the_lab_or_another_user(lab):
    alice = lab.tokens["alice"]
    mine = usage(lab, alice, since=OCTOBER[0], until=OCTOBER[1], user="alice")
    assert mine["user"] == "alice" and table(mine["by"]["user"]) == {"alice": BY_USER["alice"]}
    assert table(mine["by"]["node"]) == {"dgx": (32.0, 1, 0, 0, 0, 2 * H, 2 * H, 0.0),
                                         "ws1": (6.0, 1, 0, 0, 0, None, None, 0.0)}
    assert mine["capacity_gpu_hours"] == 8928.0  # her share is of the whole lab
    refused = usage(lab, alice, 403, since=OCTOBER[0])
    assert refused["error"]["code"] == "forbidden"
    assert "only admins may see the whole lab's usage" in refused["error"]["message"]
    assert "labq usage --me" in refused["error"]["message"]
    assert "another user's" in usage(lab, alice, 403, user="bob")["error"]["message"]
    assert table(usage(lab, since=OCTOBER[0], until=OCTOBER[1], user="bob")["by"]["user"]) == {"bob": BY_USER["bob"]}


@pytest.mark.parametrize(("query", "field", "words"), [
    ({"since": "last week"}, "since", "must be a Unix time"),
    ({"until": "nan"}, "until", "between 0 and"),
    ({"since": at(10), "until": at(5)}, "since", "must be before until"),
    ({"since": NOW + 3600}, "since", "the window is empty"),
    ({"user": "no body"}, "user", ""),
])
def test_a_bad_query_is_a_400_naming_the_parameter(lab, query, field, words):
    doc = usage(lab, expect=400, **query)
    assert doc["error"]["field"] == field and words in doc["error"]["message"], doc


def test_a_job_that_finishes_after_the_first_report_is_in_the_next(tmp_path):
    """The first report reads the archive; from then on the leader adds each job as it finishes (its running
    version leaves the hot state), so the next report counts it whole, without reading the archive again."""
    from labq.models import transitions as t

    lb = start_usage_lab(tmp_path / "data")
    try:
        alice = lambda: {r["name"]: r["gpu_hours"] for r in usage(lb, since=at(31))["by"]["user"]}  # noqa: E731
        assert alice()["alice"] == 224.0  # job 4: 28 h x 8 so far
        state = lb.leader.state
        state.clock.now = NOW + 2 * H
        with state.lock:
            state.apply([t.exited(state.jobs[4], 0, NOW + H)])
        assert 4 not in state.jobs
        assert alice()["alice"] == 232.0  # 29 h x 8: it ended an hour after the last report
    finally:
        lb.stop()


def test_a_leader_reads_the_archive_for_usage_as_it_starts_so_the_first_report_reads_no_file(tmp_path):
    from tests.conftest import FakeClock
    from tests.leader.usage_history import NOW, store_history
    from tests.leader.loopback_leader import start_loopback_leader

    store_history(tmp_path / "data")
    lb = start_loopback_leader(tmp_path / "data", clock=FakeClock(NOW))
    try:
        accounting = lb.leader.accounting
        assert accounting._kept is None
        accounting.warm_up().join(timeout=30)  # what Leader.start does
        assert accounting._kept is not None and sorted(accounting._kept) == ["2026-10", "2026-11"]
        read = []
        store = lb.leader.state.store
        for name in ("history", "history_parts"):
            real = getattr(store, name)
            setattr(store, name, lambda *a, _real=real, **k: read.append(1) or _real(*a, **k))
        assert usage(lb)["total"]["jobs"] > 0 and read == []
    finally:
        lb.stop()


def test_where_the_admin_says_so_every_user_sees_the_whole_lab(lab):
    from dataclasses import replace

    alice = lab.tokens["alice"]
    leader = lab.leader
    before = leader.config
    leader.config = leader.state.config = replace(before, usage_for_everyone=True)
    try:
        whole = usage(lab, alice, since=OCTOBER[0], until=OCTOBER[1])
        assert whole["user"] is None and set(table(whole["by"]["user"])) == set(BY_USER)
        assert table(usage(lab, alice, since=OCTOBER[0], until=OCTOBER[1], user="bob")["by"]["user"]) == {
            "bob": BY_USER["bob"]}
    finally:
        leader.config = leader.state.config = before
    assert usage(lab, alice, 403, since=OCTOBER[0])["error"]["code"] == "forbidden"


def test_the_setting_is_read_from_the_leader_toml(tmp_path):
    from labq.leader.config_file import load_config

    path = tmp_path / "leader.toml"
    path.write_text("[usage]\neveryone = true\n")
    assert load_config(path).usage_for_everyone and not load_config(None).usage_for_everyone


def test_a_group_row_adds_up_its_members_and_a_user_in_two_groups_counts_in_both(lab):
    from dataclasses import replace

    leader = lab.leader
    before = leader.config
    leader.config = leader.state.config = replace(before, groups={"vision": ("alice", "bob"), "nlp": ("bob",)})
    try:
        found = table(usage(lab, since=OCTOBER[0], until=OCTOBER[1])["by"]["group"])
    finally:
        leader.config = leader.state.config = before
    alice, bob, carol, dave = (BY_USER[u] for u in ("alice", "bob", "carol", "dave"))
    assert found["vision"][:5] == (alice[0] + bob[0], alice[1] + bob[1], 0, 1, 1)
    assert found["nlp"] == bob
    assert found["(none)"][:2] == (carol[0] + dave[0], carol[1] + dave[1])
