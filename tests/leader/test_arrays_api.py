"""Arrays through the API: one submit makes every task in one commit, a task is ``12.3`` everywhere a job id
goes, ``%N`` holds back the rest, and ``12`` acts on the whole array. A real leader on loopback with a TinyDB
store; node n1 (8 GPUs) registered through the API; the scheduler's passes run by the test."""

from __future__ import annotations

import pytest

from tests.leader.loopback_leader import start_loopback_leader
from tests.leader.test_metrics import register

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def lab(tmp_path):
    lb = start_loopback_leader(tmp_path / "data")
    register(lb, "n1", 8)
    status, _, doc = lb.request("POST", "/v1/users", {"name": "alice", "admin": False})
    lb.alice = doc["token"]
    yield lb
    lb.stop()


def ok(lab, method: str, path: str, body=None, *, token="admin", status: int = 200) -> dict:
    got, _, doc = lab.request(method, path, body, token=token)
    assert got == status, (method, path, got, doc)
    return doc


def submit(lab, token="alice", **body) -> dict:
    return ok(lab, "POST", "/v1/jobs", {"command": ["train", "--shard", "{index}"], "workdir": "/tmp", **body},
              token=lab.alice if token == "alice" else token, status=201)


def test_an_array_is_one_commit_of_tasks_each_with_its_own_command_and_environment(lab):
    before = lab.store._committed
    doc = submit(lab, array="0-5%2", env={"WANDB_PROJECT": "x"})
    assert lab.store._committed == before + 1  # six tasks, one commit
    array = doc["array"]
    assert (array["tasks"], array["cap"], array["last"] - array["first"]) == (6, 2, 5)
    aid = array["id"]
    assert array["first"] == aid + 1 and doc["job"]["id"] == aid + 1
    task = ok(lab, "GET", f"/v1/jobs/{aid}.3", token=lab.alice)["job"]
    assert task["spec"]["command"] == ["train", "--shard", "3"]
    assert task["spec"]["env"] == {"LABQ_ARRAY_ID": str(aid), "LABQ_ARRAY_INDEX": "3", "WANDB_PROJECT": "x"}
    assert task["spec"]["array"] == {"id": aid, "index": 3, "cap": 2, "tasks": 6}
    lab.leader.scheduling.schedule_pass()
    whole = ok(lab, "GET", f"/v1/jobs/{aid}", token=lab.alice)["array"]
    assert whole["counts"] == {"starting": 2, "queued": 4} and whole["cap"] == 2
    assert [t["spec"]["array"]["index"] for t in whole["tasks"]] == list(range(6))
    waiting = lab.leader.state.pending[aid + 3]
    assert waiting.reason.value == "ArrayTaskLimit"


def test_a_grid_makes_a_task_per_combination(lab):
    doc = submit(lab, command=["train", "--lr={lr}", "--seed={seed}"], grid=["lr=1e-3,3e-4", "seed=0,1"],
                 array="%1")
    aid = doc["array"]["id"]
    assert (doc["array"]["tasks"], doc["array"]["cap"]) == (4, 1)
    last = ok(lab, "GET", f"/v1/jobs/{aid}.3")["job"]["spec"]
    assert last["command"] == ["train", "--lr=3e-4", "--seed=1"]
    assert last["env"]["LABQ_PARAM_LR"] == "3e-4" and last["env"]["LABQ_PARAM_SEED"] == "1"


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"array": "5-1"}, "array", "runs backwards"),
    ({"array": "0-3%0"}, "array", "N is a whole number"),
    ({"grid": ["lr"]}, "grid", "NAME=V1,V2"),
    ({"grid": "lr=1"}, "grid", "a list of at most 16"),
    ({"grid": ["a=1"], "array": "0-3"}, "grid", "give --array only a cap there"),
    ({"array": "0-10000"}, "array", "at most 10,000 tasks"),
])
def test_a_bad_array_or_grid_is_a_clear_400_and_makes_nothing(lab, body, field, words):
    before = lab.store._committed
    got, _, doc = lab.request("POST", "/v1/jobs", {"command": ["train"], **body}, token=lab.alice)
    assert got == 400 and doc["error"]["field"] == field and words in doc["error"]["message"], doc
    assert lab.store._committed == before


def test_the_array_id_acts_on_every_task_it_applies_to(lab):
    aid = submit(lab, array="0-3%2")["array"]["id"]
    lab.leader.scheduling.schedule_pass()  # tasks 0 and 1 start
    held = ok(lab, "POST", f"/v1/jobs/{aid}/actions", {"action": "hold"}, token=lab.alice)
    assert held["array"] == {"id": aid, "changed": 2} and [j["state"] for j in held["jobs"]] == ["held", "held"]
    got, _, refused = lab.request("POST", f"/v1/jobs/{aid}/actions", {"action": "hold"}, token=lab.alice)
    assert got == 409 and f"no task of array {aid} could be changed so" in refused["error"]["message"]
    ok(lab, "POST", f"/v1/jobs/{aid}/actions", {"action": "release"}, token=lab.alice)
    ok(lab, "POST", f"/v1/jobs/{aid}/actions", {"action": "prio", "priority": "low"}, token=lab.alice)
    assert {j.priority for j in lab.leader.state.jobs.values()} == {100}
    got, _, doc = lab.request("POST", f"/v1/jobs/{aid}/actions", {"action": "edit", "gpus": 2}, token=lab.alice)
    assert got == 400 and "one task at a time" in doc["error"]["message"]
    ok(lab, "POST", f"/v1/jobs/{aid}.2/actions", {"action": "cancel"}, token=lab.alice)  # one task
    assert ok(lab, "GET", f"/v1/jobs/{aid}")["array"]["counts"] == {"starting": 2, "queued": 1, "cancelled": 1}
    cancelled = ok(lab, "POST", f"/v1/jobs/{aid}/actions", {"action": "cancel"}, token=lab.alice)
    assert cancelled["array"]["changed"] == 3  # the queued one ends; the two on GPUs are asked to stop
    assert [j["stop_requested"] for j in cancelled["jobs"] if j["state"] == "starting"] == ["cancel", "cancel"]


def test_another_user_may_not_act_on_an_array_and_an_admin_may(lab):
    aid = submit(lab, array="0-1")["array"]["id"]
    status, _, doc = lab.request("POST", "/v1/users", {"name": "bob", "admin": False})
    got, _, refused = lab.request("POST", f"/v1/jobs/{aid}/actions", {"action": "cancel"}, token=doc["token"])
    assert got == 403 and f"array {aid} belongs to alice" in refused["error"]["message"]
    done = ok(lab, "POST", f"/v1/jobs/{aid}/actions", {"action": "cancel"})
    assert {j["state"] for j in done["jobs"]} == {"cancelled"} and {j["cancelled_by"] for j in done["jobs"]} == {"root"}


def test_tasks_and_arrays_are_found_after_a_restart_and_once_they_ended(lab, tmp_path):
    aid = submit(lab, array="0-2")["array"]["id"]
    ok(lab, "POST", f"/v1/jobs/{aid}.0/actions", {"action": "cancel"}, token=lab.alice)
    kept = {i: lab.leader.state.jobs[i] for i in (aid + 2, aid + 3)}
    lab.stop()
    again = start_loopback_leader(tmp_path / "data")
    try:
        again.admin_token = lab.admin_token
        # the store's journal told them as their differences from the first task: they are whole again
        assert {i: again.leader.state.jobs[i] for i in kept} == kept
        whole = ok(again, "GET", f"/v1/jobs/{aid}")["array"]
        assert whole["counts"] == {"cancelled": 1, "queued": 2}
        assert ok(again, "GET", f"/v1/jobs/{aid}.0")["job"]["state"] == "cancelled"  # from the archive
        ok(again, "POST", f"/v1/jobs/{aid}/actions", {"action": "cancel"})
        assert ok(again, "GET", f"/v1/jobs/{aid}")["array"]["counts"] == {"cancelled": 3}
        got, _, doc = again.request("GET", f"/v1/jobs/{aid}.7")
        assert got == 404 and f"there is no task {aid}.7" in doc["error"]["message"]
        got, _, doc = again.request("GET", f"/v1/jobs/{aid}.x")
        assert got == 404  # not a route: a task is ARRAY.INDEX
    finally:
        again.stop()
        lab.stop = lambda: None


def test_a_big_arrays_events_are_the_last_the_streams_keep_and_count_every_task(lab):
    """Past the events a stream that fell behind may read (the hub keeps 4,096), a big array's tasks are counted in
    the events' numbers, and only the last ones are made: what a stream can read is the same either way."""
    hub = lab.leader.state.events
    before = hub.seq
    array = submit(lab, array="0-4999")["array"]
    assert hub.seq == before + 5000
    events = hub.after(before, 0)
    assert len(events) == hub.keep == 4096
    assert [e.seq for e in events] == list(range(hub.seq - 4095, hub.seq + 1))
    assert [e.data["job_id"] for e in events] == list(range(array["last"] - 4095, array["last"] + 1))
    assert {(e.kind, e.data["state"], e.data["user"]) for e in events} == {("job", "queued", "alice")}
