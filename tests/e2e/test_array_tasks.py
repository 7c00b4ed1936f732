"""An array end to end: real leader and agent processes (``sim:ws-4x3090``), its tasks real processes, driven by
the CLI. Each task runs with its own command and environment, no more than ``%N`` at once, and its log is
``labq logs 12.3``; a job submitted ``--after`` the array runs once every task succeeded."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(120)


def test_an_arrays_tasks_run_as_their_own_processes_within_the_cap(running_lab):
    lab = running_lab
    ran = lab.root / "ran"
    out = lab.labq("submit", "--array", "0-5%2", "--json", "--", "sh", "-c",
                   # each task notes when it ran, and says which it is
                   f"echo start $(date +%s.%N) >> {ran}; echo task {{index}} is $LABQ_ARRAY_INDEX of $LABQ_ARRAY_ID;"
                   f" sleep 0.5; echo end $(date +%s.%N) >> {ran}").stdout
    array = json.loads(out)["array"]
    aid = array["id"]
    after = lab.submit("sh", "-c", "echo all done", after=str(aid))
    lab.wait_state(after, "succeeded", timeout=60)
    shown = lab.api("show", str(aid))["array"]
    assert shown["counts"] == {"succeeded": 6}
    for index in (0, 3, 5):
        assert lab.labq("logs", f"{aid}.{index}").stdout == f"task {index} is {index} of {aid}\n"
    # never more than 2 at once: the starts and ends, in time order, never stand 3 deep
    events = sorted((float(t), +1 if what == "start" else -1)
                    for what, t in (line.split() for line in ran.read_text().splitlines()))
    depth, deepest = 0, 0
    for _, step in events:
        depth += step
        deepest = max(deepest, depth)
    assert len(events) == 12 and deepest <= 2
