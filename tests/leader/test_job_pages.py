"""``GET /v1/jobs`` a page at a time (``limit`` and ``after``): every job exactly once, the filters before the
paging, ``total`` and ``next`` right, only the jobs sent encoded, and a 400 naming the parameter for bad ones.
A real leader on loopback (no scheduler thread: the jobs stay queued); ``labq ls``'s pages are
``tests/cli/test_ls_pages.py``."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from labq.leader import routes
from labq.protocol.requests import MAX_PAGE
from tests.leader.loopback_leader import start_loopback_leader

pytestmark = pytest.mark.timeout(120)

USERS = ("alice", "bob")
EACH = {"alice": 150, "bob": 100}  #: 250 jobs: three of alice's and one of bob's, 50 times, then 50 more of bob's


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A leader with 250 queued jobs (``lab.ids``: user -> ids) and the users' tokens (``lab.tokens``)."""
    lb = start_loopback_leader(tmp_path_factory.mktemp("leader"))
    lb.tokens = {user: lb.request("POST", "/v1/users", {"name": user})[2]["token"] for user in USERS}
    order = [user for n in range(EACH["bob"]) for user in ("alice",) * (3 if n < 50 else 0) + ("bob",)]
    assert sorted(order) == sorted(u for u in USERS for _ in range(EACH[u]))
    lb.ids = {user: [] for user in USERS}
    for user in order:  # one at a time, so that ids follow the order
        status, _, doc = lb.request("POST", "/v1/jobs", {"command": ["train"], "name": f"{user}-job"},
                                    token=lb.tokens[user])
        assert status == 201, doc
        lb.ids[user].append(doc["job"]["id"])
    yield lb
    lb.stop()


def listing(lab, token: str = "admin", **query) -> dict:
    status, _, doc = lab.request("GET", "/v1/jobs?" + urlencode(query, doseq=True), token=token)
    assert status == 200, doc
    return doc


def every_page(lab, token: str = "admin", limit: int = 100, most: int | None = None, **query) -> list[dict]:
    """The pages, following ``next`` from the start: at most as many as the jobs could fill (``most`` jobs, else
    the module's lab's), plus one."""
    pages, after = [], 0
    for _ in range((len(lab.ids["alice"]) + len(lab.ids["bob"]) if most is None else most) + 1):
        pages.append(listing(lab, token, after=after, limit=limit, **query))
        after = pages[-1]["next"]
        if after is None:
            return pages
    raise AssertionError(f"next never came back null: {[p['next'] for p in pages]}")


def ids_of(pages: list[dict]) -> list[int]:
    return [job["id"] for page in pages for job in page["jobs"]]


def test_everyones_jobs_in_three_pages_of_100_each_exactly_once(lab):
    pages = every_page(lab, all=1)
    everyone = sorted(lab.ids["alice"] + lab.ids["bob"])
    assert [len(p["jobs"]) for p in pages] == [100, 100, 50]
    assert ids_of(pages) == everyone  # in id order, each once
    assert [p["total"] for p in pages] == [250] * 3
    assert [p["next"] for p in pages] == [everyone[99], everyone[199], None]


def test_the_callers_own_jobs_are_filtered_before_the_paging(lab):
    pages = every_page(lab, token=lab.tokens["alice"])  # default: the caller's unfinished jobs
    assert [len(p["jobs"]) for p in pages] == [100, 50]
    assert ids_of(pages) == lab.ids["alice"]
    assert {p["total"] for p in pages} == {150}
    assert pages[0]["next"] == lab.ids["alice"][99]
    pages = every_page(lab, user="bob", limit=30)
    assert ids_of(pages) == lab.ids["bob"] and [len(p["jobs"]) for p in pages] == [30, 30, 30, 10]
    assert {p["total"] for p in pages} == {100}


def test_ids_and_states_are_filters_too(lab):
    wanted = lab.ids["bob"][:7] + lab.ids["alice"][-5:]
    pages = every_page(lab, id=wanted, limit=5)
    assert ids_of(pages) == sorted(wanted) and {p["total"] for p in pages} == {12}
    asked = wanted[::-1]  # in any order, the ids come by id, and with a user only theirs
    page = listing(lab, id=asked, after=sorted(wanted)[2], limit=4)
    assert [j["id"] for j in page["jobs"]] == sorted(wanted)[3:7] and page["next"] == sorted(wanted)[6]
    assert ids_of(every_page(lab, id=asked, user="alice", limit=2)) == lab.ids["alice"][-5:]
    assert [j["id"] for j in listing(lab, id=asked, limit=3)["jobs"]] == sorted(wanted)[-3:]
    assert every_page(lab, all=1, state="running") == [{"jobs": [], "total": 0, "next": None}]
    pages = every_page(lab, all=1, state=["running", "queued"], limit=MAX_PAGE)
    assert len(pages) == 1 and len(pages[0]["jobs"]) == 250


def test_a_page_from_anywhere_and_past_the_end(lab):
    everyone = sorted(lab.ids["alice"] + lab.ids["bob"])
    page = listing(lab, all=1, after=everyone[9], limit=5)
    assert [j["id"] for j in page["jobs"]] == everyone[10:15] and page["next"] == everyone[14]
    page = listing(lab, all=1, after=everyone[-3])  # no limit: a page of 100
    assert [j["id"] for j in page["jobs"]] == everyone[-2:] and (page["total"], page["next"]) == (250, None)
    assert listing(lab, all=1, after=everyone[-1] + 1000) == {"jobs": [], "total": 250, "next": None}
    page = listing(lab, all=1, after=0, limit=250)
    assert len(page["jobs"]) == 250 and page["next"] is None  # exactly filled: no empty page after it


def test_without_after_it_answers_as_before_with_total(lab):
    everyone = sorted(lab.ids["alice"] + lab.ids["bob"])
    page = listing(lab, all=1, limit=7)  # the last 7, as ``labq ls --limit 7`` always asked
    assert [j["id"] for j in page["jobs"]] == everyone[-7:] and (page["total"], page["next"]) == (250, None)
    page = listing(lab, all=1)  # everything, as ``Client.jobs`` and the TUI ask
    assert [j["id"] for j in page["jobs"]] == everyone and (page["total"], page["next"]) == (250, None)


def test_a_page_encodes_only_the_jobs_it_sends_and_their_reasons(lab, monkeypatch):
    real_encode, real_pending = routes.encode_job, routes.encode_pending
    lab.leader.scheduling.schedule_pass()  # every queued job gets its pending reason
    assert len(lab.leader.state.pending) == 250
    encoded, reasons = [], []
    monkeypatch.setattr(routes, "encode_job", lambda job: encoded.append(job.id) or real_encode(job))
    monkeypatch.setattr(routes, "encode_pending", lambda p: reasons.append(p) or real_pending(p))
    routes._JOB_TEXTS._texts.clear()  # nothing cached from the other tests
    page = listing(lab, all=1, after=0, limit=20, pending=1)
    assert sorted(encoded) == [j["id"] for j in page["jobs"]] and len(encoded) == 20
    assert len(reasons) == 20 and sorted(map(int, page["pending"])) == sorted(encoded)


def test_a_job_submitted_between_pages_comes_on_a_later_one_and_none_twice(tmp_path):
    lb = start_loopback_leader(tmp_path / "leader")
    try:
        for _ in range(12):
            lb.request("POST", "/v1/jobs", {"command": ["train"]})
        first = listing(lb, after=0, limit=5)
        lb.request("POST", "/v1/jobs", {"command": ["train"]})  # job 13
        status, _, doc = lb.request("POST", f"/v1/jobs/{first['jobs'][0]['id']}/actions", {"action": "cancel"})
        assert status == 200, doc
        second = listing(lb, after=first["next"], limit=5)
        third = listing(lb, after=second["next"], limit=5)
        assert (first["total"], second["total"], third["total"]) == (12, 12, 12)  # one more, one fewer
        assert ids_of([first, second, third]) == list(range(1, 14)) and third["next"] is None
    finally:
        lb.stop()


@pytest.mark.parametrize(("query", "field", "words"), [
    ("limit=0", "limit", "between 1 and 5000"),
    ("limit=-1", "limit", "whole number"),
    (f"limit={MAX_PAGE + 1}", "limit", "between 1 and 5000"),
    ("limit=ten", "limit", "whole number"),
    ("limit=1.5", "limit", "whole number"),
    ("after=-1", "after", "whole number"),
    ("after=x&limit=5", "after", "whole number"),
    ("after=" + "9" * 30, "after", "whole number"),
    ("after=0&finished=1", "after", "finished=1"),
])
def test_bad_paging_parameters_are_a_400_naming_the_parameter(lab, query, field, words):
    status, _, doc = lab.request("GET", f"/v1/jobs?{query}")
    assert status == 400, doc
    assert doc["error"]["code"] == "bad_request" and doc["error"]["field"] == field
    assert doc["error"]["message"].startswith(field) and words in doc["error"]["message"], doc


def test_a_persons_listing_follows_their_jobs_as_they_end_and_across_a_restart(tmp_path):
    """The leader keeps each person's unfinished jobs apart (what their ``labq ls`` reads, not the whole queue):
    their jobs and an array's tasks join it, a job that ends leaves it, and a restarted leader finds the same."""
    lb = start_loopback_leader(tmp_path / "leader")
    try:
        tokens = {user: lb.request("POST", "/v1/users", {"name": user})[2]["token"] for user in USERS}

        def submit(user: str, **extra) -> dict:
            status, _, doc = lb.request("POST", "/v1/jobs", {"command": ["train", "{index}"], **extra},
                                        token=tokens[user])
            assert status == 201, doc
            return doc

        alice = [submit("alice")["job"]["id"] for _ in range(3)]
        bob = [submit("bob")["job"]["id"] for _ in range(2)]
        array = submit("alice", array="0-3")["array"]
        alice += list(range(array["first"], array["last"] + 1))
        for ended in (alice[1], array["first"] + 2):
            status, _, doc = lb.request("POST", f"/v1/jobs/{ended}/actions", {"action": "cancel"})
            assert status == 200, doc
            alice.remove(ended)
        bob.append(submit("bob")["job"]["id"])
        admin = lb.admin_token

        def mine(leader, user: str) -> tuple[list[int], int]:
            """The person's default view, three at a time: the ids and the total."""
            pages = every_page(leader, tokens[user], limit=3, most=10)
            assert len({p["total"] for p in pages}) == 1
            return ids_of(pages), pages[0]["total"]

        assert mine(lb, "alice") == (alice, 5) and mine(lb, "bob") == (bob, 3)
        assert listing(lb, user="alice", after=alice[2], limit=2)["jobs"][0]["id"] == alice[3]
        assert [j["id"] for j in listing(lb, limit=2)["jobs"]] == []  # the admin's own: none
    finally:
        lb.stop()
    again = start_loopback_leader(tmp_path / "leader")
    again.admin_token = admin
    try:
        assert mine(again, "alice") == (alice, 5) and mine(again, "bob") == (bob, 3)
        assert again.leader.state.by_user == {"alice": set(alice), "bob": set(bob)}
    finally:
        again.stop()
