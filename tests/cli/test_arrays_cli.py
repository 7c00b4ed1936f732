"""``labq submit --array/--grid`` and the commands that take an array (``12``) or one of its tasks (``12.3``), run
in this process against a real leader on loopback (TinyDB store, node n1 with 8 GPUs, its passes run by the test).
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from labq.cli import main
from tests.leader.loopback_leader import start_loopback_leader
from tests.leader.test_metrics import register

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def lab(tmp_path, monkeypatch):
    lb = start_loopback_leader(tmp_path / "data")
    register(lb, "n1", 8)
    status, _, doc = lb.request("POST", "/v1/users", {"name": "alice", "admin": False})
    monkeypatch.setenv("LABQ_TOKEN", doc["token"])
    monkeypatch.setenv("LABQ_LEADER", f"http://127.0.0.1:{lb.port}")
    monkeypatch.chdir(tmp_path)
    yield lb
    lb.stop()


def labq(*argv: str, code: int = 0) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            got = main(list(argv))
        except SystemExit as exit_:
            got = exit_.code
    assert got == code, (argv, got, out.getvalue(), err.getvalue())
    return out.getvalue(), err.getvalue()


def test_an_array_from_submit_to_cancel(lab):
    out, _ = labq("submit", "--array", "0-5%2", "--", "train", "--shard", "{index}")
    aid = lab.leader.state.next_job_id - 7
    assert out == f"submitted array {aid}: 6 tasks ({aid}.0 to {aid}.5), at most 2 at once\n"
    lab.leader.scheduling.schedule_pass()
    ls, _ = labq("ls")
    rows = [line.split()[0] for line in ls.splitlines()[1:]]
    assert rows == [f"{aid}.0", f"{aid}.1", f"{aid}.[2-5]"]  # the four that wait alike are one row
    assert "ArrayTaskLimit" in ls
    expanded, _ = labq("ls", "--expand")
    assert [line.split()[0] for line in expanded.splitlines()[1:]] == [f"{aid}.{i}" for i in range(6)]
    show, _ = labq("show", str(aid))
    assert show.splitlines()[0] == f"array {aid} of alice: 6 tasks, 2 starting, 4 queued; at most 2 on GPUs at once"
    why, _ = labq("why", str(aid))
    assert why.splitlines()[1] == (f"  4 wait: ArrayTaskLimit: 2 of array {aid}'s tasks are on GPUs, as many as its "
                                   "%2 allows")
    task, _ = labq("show", f"{aid}.3", "--json")
    assert json.loads(task)["job"]["spec"]["command"] == ["train", "--shard", "3"]
    out, _ = labq("hold", str(aid))
    assert out == f"array {aid}: 4 tasks: 4 held\n"
    out, _ = labq("cancel", f"{aid}.0")
    assert out.startswith(f"job {aid}.0: starting, stopping (cancel requested)")
    out, _ = labq("cancel", str(aid))
    assert out == f"array {aid}: 5 tasks: 1 stopping (cancel requested), 4 cancelled\n"


def test_a_grid_says_which_braces_it_leaves_as_typed(lab):
    out, err = labq("submit", "--grid", "lr=1e-3,3e-4", "--grid", "seed=0,1,2", "--", "echo", "--lr", "{lr}",
                    "--seed", "{seed}", "--tag", "{lrr}")
    assert "submitted array" in out and "6 tasks" in out
    assert err == "labq: note: {lrr} in the command is neither {index} nor a --grid name: it is passed as typed\n"


@pytest.mark.parametrize(("argv", "words"), [
    (["submit", "--array", "9-1", "--", "train"], "--array range 9-1 runs backwards: write 1-9"),
    (["submit", "--grid", "lr", "--", "train"], "--grid takes NAME=V1,V2"),
    (["submit", "--grid", "a=1", "--array", "0-3", "--", "train"], "give --array only a cap there"),
    (["show", "12.x"], "'12.x' is not a job id"),
])
def test_bad_arrays_and_task_ids_are_refused_before_the_leader_is_asked(lab, argv, words):
    before = lab.store._committed
    _, err = labq(*argv, code=2)
    assert words in err
    assert lab.store._committed == before


def test_after_an_array_waits_for_every_task_and_after_any_for_one(lab):
    out, _ = labq("submit", "--array", "0-2", "--", "train")
    aid = int(out.split()[2].rstrip(":"))
    job = json.loads(labq("submit", "--after", str(aid), "--json", "--", "eval")[0])
    assert job["spec"]["depends_on"] == [aid + 1, aid + 2, aid + 3]
    one = json.loads(labq("submit", "--after-any", f"{aid}.1", "--json", "--", "eval")[0])
    assert one["spec"]["depends_on"] == [aid + 2] and one["spec"]["after_any"] is True
    _, err = labq("submit", "--after", f"{aid}.7", "--", "eval", code=1)
    assert f"there is no task {aid}.7" in err
