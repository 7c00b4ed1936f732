"""Queues (teams) end to end, with real processes: a leader, one agent on ``sim:ws-4x3090`` (4 GPUs), the CLI.

Two teams share the workstation: queue ``a`` (ann) and queue ``b`` (bob), each guaranteed 2 GPUs. Ann's
preemptible training jobs borrow b's idle GPUs; when bob submits, exactly the borrowed GPUs come back by
checkpoint, bob runs on them, and ann's reclaimed jobs resume from their checkpoints once bob is done.
Then the refusals at submit (no such queue, not a member), a job outside every queue, and ``labq queues``;
then two reclaims in flight at once (whose freed GPU goes to whom) and the LENT count of a job outside every
queue.

The lab users ann, bob and carol have no Unix account here: the agent's user map runs their jobs as root
(the suite runs as root, and TEST_CONFIG allows jobs as root), as an admin would map them to an account.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sys
import time
import tomllib
from pathlib import Path

import pytest

from labq.client import Client
from tests.e2e.conftest import TEST_CONFIG, Lab

pytestmark = pytest.mark.timeout(180)

TRAIN = str(Path(__file__).resolve().parents[2] / "examples" / "checkpointing" / "train.py")


def settings(extra: str) -> str:
    """TEST_CONFIG (min_runtime "0s", default_grace 2 s) with a longer grace allowed: without queues.reclaim_grace,
    jobs.max_grace is the reclaim bound, and the victims below are held in their grace (30 s) while the test looks
    at the reclaim, however slow a loaded machine is. requeue_after must stay past max_grace and the rest."""
    base = TEST_CONFIG.replace('max_grace = "5s"', 'max_grace = "30s"').replace('requeue_after = "25s"',
                                                                               'requeue_after = "60s"')
    assert 'max_grace = "30s"' in base and 'requeue_after = "60s"' in base, TEST_CONFIG
    return base + extra


TEAMS = settings("""\
[queues.a]
members = ["ann"]
guarantee = 2
[queues.b]
members = ["bob"]
guarantee = 2
""")

# for the listing: a share as a percentage, a cap and a maximum wait, and no default queue
LISTED = settings("""\
[queues.a]
members = ["ann"]
guarantee = 2
[queues.b]
members = ["bob"]
guarantee = "50%"
cap = 3
max_wait = "2h"
""")


def train(*extra: str) -> tuple[str, ...]:
    return (sys.executable, TRAIN, "--steps", "1000000", "--step-time", "0.1", *extra)


def start(lab: Lab, users: tuple[str, ...]) -> dict[str, str]:
    """A leader and agent ws1 (4 GPUs) whose user map runs ``users``' jobs as root; each user's token."""
    lab.start_leader()
    folder = lab.data / "agents" / "ws1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "user-map.toml").write_text("[users]\n" + "".join(f'{u} = "root"\n' for u in users))
    lab.start_agent("ws1", "sim:ws-4x3090")
    tokens = {}
    for user in users:
        out = lab.labq("admin", "user", "add", user, "--print")
        tokens[user] = next(w.strip('"') for w in out.stdout.split() if w.strip('"').startswith("lqu_"))
    return tokens


def queues(lab: Lab, token: str | None = None) -> dict:
    return {q["name"]: q for q in lab.api("queues", token=token)}


def counts(row: dict) -> tuple[int, int, int, int]:
    return row["use"], row["borrowed"], row["lent"], row["waiting_jobs"]


def gpus(placement: dict | None) -> set[tuple[str, int]]:
    return {(a["node"], g) for a in (placement or {"allocations": []})["allocations"] for g in a["gpu_indices"]}


def group_of(lab: Lab, job: int, attempt: int = 1) -> int:
    """The process group of a job's attempt on ws1 (its pid.json, as ``kill_job_processes`` reads it)."""
    pid_file = lab.data / "agents" / "ws1" / "runtime" / "attempts" / f"{job}.{attempt}" / "pid.json"
    return json.loads(pid_file.read_text())["pid"]


def admin(lab: Lab) -> Client:
    """The API in this process, as the lab's first admin: quick looks while the test holds jobs in their grace."""
    return Client(lab.url, tomllib.loads((lab.home / ".config" / "labq" / "credentials").read_text())["token"])


def pending_reason(api: Client, job: int) -> str | None:
    _, pending = api.job(job)
    return pending and pending["reason"]


def waits_for_gate(gate: Path, before: str = "") -> str:
    """A shell job that runs until ``gate`` exists (at most a minute), so a test ends it when it has looked."""
    return f"{before}for i in $(seq 600); do [ -e {shlex.quote(str(gate))} ] && exit 0; sleep 0.1; done"


def log(lab: Lab, job: int, attempt: int) -> str:
    return lab.labq("logs", str(job), "--attempt", str(attempt)).stdout


def step_reached(lab: Lab, job: int) -> int:
    return max((int(s) for s in re.findall(r"step (\d+)", log(lab, job, 1))), default=0)


def test_a_team_gets_its_lent_gpus_back_by_checkpoint_and_the_borrowers_resume(lab):
    lab.config.write_text(TEAMS)
    tokens = start(lab, ("ann", "bob"))
    ann, bob = tokens["ann"], tokens["bob"]
    mine = [lab.submit(*train("--save-every", "1"), queue="a", grace="30s", token=ann) for _ in range(4)]
    for job in mine:
        assert lab.wait_state(job, "running", timeout=30)["spec"]["queue"] == "a"
    lab.wait(lambda: all(lab.job(j).get("last_checkpoint_at") for j in mine), "the periodic checkpoints")
    lab.wait(lambda: all(step_reached(lab, j) >= 10 for j in mine), "every training job to make progress")

    listed = queues(lab, ann)
    assert counts(listed["a"]) == (4, 2, 0, 0)  # all four run: two on b's idle guarantee
    assert counts(listed["b"]) == (0, 0, 2, 0)
    assert listed["a"]["guarantee"] == listed["b"]["guarantee"] == 2
    assert {(m["user"], m["holds"]) for m in listed["a"]["fair_share"]} == {("ann", 4)}

    # Ann's jobs are frozen (SIGSTOP) while bob submits, so that the reclaim stays in flight while we look at
    # it: the checkpoint signal waits for SIGCONT, well within their grace of 30 s. Bob's jobs run until the
    # test opens their gate.
    api, gate = admin(lab), lab.root / "bob-may-end"
    bobs = waits_for_gate(gate, "echo bob on $CUDA_VISIBLE_DEVICES; ")
    frozen = [group_of(lab, j) for j in mine]
    for group in frozen:
        os.killpg(group, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        theirs = [lab.submit("sh", "-c", bobs, queue="b", token=bob)]
        lab.wait(lambda: pending_reason(api, theirs[0]) == "Preempting", "bob's first job to reclaim a GPU",
                 timeout=10)
        why = lab.labq("why", str(theirs[0]), token=bob).stdout
        theirs.append(lab.submit("sh", "-c", bobs, token=bob))  # his only queue: b
        lab.wait(lambda: pending_reason(api, theirs[1]) == "Preempting", "bob's second job to reclaim a GPU",
                 timeout=10)
        saving = [j for j in mine if api.job(j)[0]["state"] == "preempting"]
        victim_why = lab.labq("why", str(saving[0]), token=ann).stdout if saving else ""
    finally:
        for group in frozen:
            os.killpg(group, signal.SIGCONT)
        frozen_for = time.monotonic() - stopped_at  # under their grace, or they are killed rather than saved
    # the estimate line is there while the pass that made the preemption is the latest (its victims' grace)
    said = re.match(rf"job {theirs[0]} waits: Preempting: job (\d+) is checkpointing; then it runs on GPUs? \d on ws1\n"
                    r"  waiting for job (\d+)(\n  (should start at the next scheduling pass|starts in about .+))?$",
                    why.strip())
    assert said and said.group(1) == said.group(2) and int(said.group(1)) in mine, why  # one of ann's jobs
    assert len(saving) == 2, saving  # exactly the two borrowed GPUs are reclaimed
    assert re.match(rf"job {saving[0]} is checkpointing on ws1:\d to make room for job ({theirs[0]}|{theirs[1]})"
                    r"; then it waits in the queue to resume$", victim_why.strip()), victim_why
    for job in theirs:
        assert lab.wait_state(job, "running", timeout=60)["spec"]["queue"] == "b"

    by_id = {j: lab.job(j) for j in mine}
    victims = sorted(j for j in mine if by_id[j]["attempt"] > 1 or by_id[j]["state"] == "preempting")
    assert len(victims) == 2, {j: (d["state"], d["attempt"]) for j, d in by_id.items()}
    for j in victims:
        first = by_id[j]["attempts"][0]
        assert (first["ended"], first["stop_reason"]) == ("checkpointed", "preempted"), (first, frozen_for)
        assert first["preempted_for"] in theirs
        assert by_id[j]["preemptions"] == 1
    assert sorted(by_id[j]["attempts"][0]["preempted_for"] for j in victims) == sorted(theirs)  # one each
    freed = set().union(*(gpus(by_id[j]["attempts"][0]["placement"]) for j in victims))
    assert set().union(*(gpus(lab.job(j)["placement"]) for j in theirs)) == freed
    for j in set(mine) - set(victims):  # the jobs within a's guarantee never heard the signal
        assert (by_id[j]["attempt"], by_id[j]["state"]) == (1, "running")
        assert "checkpointed" not in log(lab, j, 1)
        assert gpus(by_id[j]["placement"]).isdisjoint(freed)

    listed = queues(lab)  # both teams at their guarantee; a's reclaimed jobs wait
    assert counts(listed["a"]) == (2, 0, 0, 2) and counts(listed["b"]) == (2, 0, 0, 0), listed
    assert listed["a"]["waiting_gpus"] == 2
    assert [(m["user"], m["holds"], m["waiting"]) for m in listed["a"]["fair_share"]] == [("ann", 2, 2)]
    assert [(m["user"], m["holds"], m["waiting"]) for m in listed["b"]["fair_share"]] == [("bob", 2, 0)]
    assert "bob on " in lab.labq("logs", str(theirs[0]), token=bob).stdout

    gate.touch()
    for job in theirs:
        assert lab.wait_state(job, "succeeded", timeout=60)["exit_code"] == 0
    for j in victims:
        lab.wait(lambda j=j: (lab.job(j)["state"], lab.job(j)["attempt"]) == ("running", 2), f"job {j} to resume",
                 timeout=30, detail=lambda j=j: lab.job(j))
        saved = re.search(r"checkpointed at step (\d+)", log(lab, j, 1))
        assert saved, log(lab, j, 1)
        lab.wait(lambda j=j: "resumed at" in log(lab, j, 2), f"job {j}'s second attempt to start its loop")
        assert f"attempt 2: resumed at step {saved.group(1)}" in log(lab, j, 2)
        assert int(saved.group(1)) >= 10  # it continued, not restarted
    for j in set(mine) - set(victims):
        assert lab.job(j)["attempt"] == 1
    lab.wait(lambda: counts(queues(lab)["a"]) == (4, 2, 0, 0) and counts(queues(lab)["b"]) == (0, 0, 2, 0),
             "a to borrow b's idle GPUs again", timeout=30, detail=lambda: queues(lab))
    for job in mine:
        lab.labq("cancel", str(job))
    for job in mine:
        lab.wait_state(job, "cancelled", timeout=30)


def test_submit_refusals_a_job_outside_every_queue_and_the_listing(lab):
    lab.config.write_text(LISTED)
    tokens = start(lab, ("ann", "bob", "carol"))
    ann, bob, carol = tokens["ann"], tokens["bob"], tokens["carol"]

    out = lab.labq("submit", "--queue", "nosuch", "--", "true", token=ann, check=False)
    assert out.returncode == 2, (out.returncode, out.stderr)  # bad input, like any value labq cannot use
    assert "there is no queue 'nosuch'; queues: a, b" in out.stderr
    out = lab.labq("submit", "--queue", "b", "--", "true", token=ann, check=False)
    assert out.returncode == 1, (out.returncode, out.stderr)  # refused: ann may not
    assert "ann is not a member of queue b; ann's queues: a" in out.stderr
    out = lab.labq("submit", "--queue", "a", "--", "true", token=carol, check=False)
    assert out.returncode == 1 and "carol is not a member of queue a; carol's queues: none" in out.stderr
    assert lab.api("ls", "--all") == []  # nothing refused was queued

    outside = lab.submit("sleep", "120", token=carol)  # carol is in no queue, and there is no default
    running = lab.wait_state(outside, "running", timeout=30)  # on an idle GPU
    assert running["spec"]["queue"] is None
    in_a = lab.submit("sleep", "120", token=ann)  # ann's only queue
    assert lab.wait_state(in_a, "running", timeout=30)["spec"]["queue"] == "a"
    waits = lab.submit("sleep", "120", gpus=3, token=bob)  # 3 GPUs: only 2 are free
    assert lab.job(waits)["spec"]["queue"] == "b"
    lab.wait(lambda: lab.job(waits)["state"] == "queued" and lab.api("show", str(waits))["pending"],
             "bob's job to wait with a reason")

    def settled() -> bool:
        listed = queues(lab)
        return None in listed and listed["b"]["waiting_jobs"] == 1 and listed["a"]["use"] == 1

    lab.wait(settled, "the listing to show the three jobs", timeout=10, detail=lambda: queues(lab))
    rows = lab.api("queues", token=carol)
    assert [r["name"] for r in rows] == ["a", "b", None]
    a, b, nobody = rows
    fields = {"name", "guarantee", "use", "borrowed", "lent", "waiting_jobs", "waiting_gpus", "members", "cap",
              "lends", "borrows", "max_wait_s", "default", "fair_share"}
    for row in rows:
        assert fields <= set(row), fields - set(row)
    # LENT: see test_a_gpu_borrowed_by_a_job_outside_every_queue_is_shown_as_lent
    assert {k: a[k] for k in fields - {"fair_share", "lent"}} == {
        "name": "a", "guarantee": 2, "use": 1, "borrowed": 0, "waiting_jobs": 0, "waiting_gpus": 0,
        "members": ["ann"], "cap": None, "lends": True, "borrows": True, "max_wait_s": None, "default": False}
    assert {k: b[k] for k in fields - {"fair_share", "lent"}} == {
        "name": "b", "guarantee": 2, "use": 0, "borrowed": 0, "waiting_jobs": 1, "waiting_gpus": 3,
        "members": ["bob"], "cap": 3, "lends": True, "borrows": True, "max_wait_s": 7200.0, "default": False}
    assert b["guarantee_asked"] == "50%" and a["guarantee_asked"] == "2 GPUs"
    assert [(m["user"], m["holds"], m["waiting"]) for m in a["fair_share"]] == [("ann", 1, 0)]
    assert [(m["user"], m["holds"], m["waiting"]) for m in b["fair_share"]] == [("bob", 0, 1)]
    assert [(m["user"], m["holds"], m["waiting"]) for m in nobody["fair_share"]] == [("carol", 1, 0)]
    assert all(isinstance(m["gpu_hours"], (int, float)) and m["gpu_hours"] >= 0
               for r in rows for m in r["fair_share"])
    assert (nobody["guarantee"], nobody["use"], nobody["borrowed"]) == (0, 1, 1)  # all it holds is borrowed
    assert nobody["members"] == [] and nobody["cap"] is None and nobody["default"] is False

    text = lab.labq("queues", token=carol).stdout
    header = text.splitlines()[0].split()
    assert header == ["QUEUE", "GUARANTEE", "CAP", "USE", "BORROWED", "LENT", "WAITING", "RULES"], text
    assert re.search(rf"^a +2 +- +1 +0 +{a['lent']} +0 +-$", text, re.M), text
    assert re.search(rf"^b +2 \(50%\) +3 +0 +0 +{b['lent']} +1 \(3 GPUs\) +max wait 2h00m$", text, re.M), text
    assert re.search(r"^\(no queue\) +0 +- +1 +1 +0 +0 +-$", text, re.M), text
    assert "fair share within each queue (decayed GPU-hours; the least is served first):" in text
    assert re.search(r"^  a: ann \d+\.\d GPU-h, holds 1$", text, re.M), text
    assert re.search(r"^  b: bob \d+\.\d GPU-h, 1 waiting$", text, re.M), text
    assert re.search(r"^  \(no queue\): carol \d+\.\d GPU-h, holds 1$", text, re.M), text

    for job in (outside, in_a, waits):
        lab.labq("cancel", str(job))
    for job in (outside, in_a, waits):
        lab.wait_state(job, "cancelled", timeout=30)


def test_each_gpu_a_reclaim_frees_goes_to_the_job_it_was_freed_for(lab):
    """Two reclaims in flight at once; the first one's victim saves, the second's is still saving: the GPU the
    first victim gave back is the first job's, which runs at once, and the second job waits for its own victim.
    (The second job's hold must not take the GPU freed for the job before it in b's order.) Each victim saves
    when the test opens its gate, within its grace of 30 s."""
    lab.config.write_text(TEAMS)
    tokens = start(lab, ("ann", "bob"))
    ann, bob = tokens["ann"], tokens["bob"]
    api, gates = admin(lab), {n: lab.root / f"save-{n}" for n in ("quick", "slow")}

    def saves(gate: Path) -> str:
        saved = shlex.quote(f"until [ -e {shlex.quote(str(gate))} ]; do sleep 0.1; done; echo saved; exit 0")
        return f"trap {saved} USR1; echo ready; while true; do sleep 0.1; done"

    usr1 = {"checkpoint_signal": "SIGUSR1", "grace": "30s", "token": ann}
    # the victims are the cheapest: the low job first, then, of the normal ones, the one with least work to lose
    quick = lab.submit("sh", "-c", saves(gates["quick"]), **usr1, **{"class": "low"})
    placeholder = lab.submit("sleep", "600", token=ann)
    older = [lab.submit("sleep", "600", token=ann) for _ in range(2)]
    for job in (quick, placeholder, *older):
        lab.wait_state(job, "running")
    lab.labq("cancel", str(placeholder))
    slow = lab.submit("sh", "-c", saves(gates["slow"]), **usr1)  # on the placeholder's GPU, the newest normal job
    lab.wait_state(slow, "running", timeout=30)
    lab.wait(lambda: all("ready" in log(lab, j, 1) for j in (quick, slow)), "the traps to be set")
    assert gpus(lab.job(quick)["placement"]) == {("ws1", 0)} and gpus(lab.job(slow)["placement"]) == {("ws1", 1)}
    # slow, submitted while the cancelled placeholder may still hold its GPU, waited for that GPU: it preempted nothing
    assert (lab.job(quick)["state"], lab.job(quick)["preemptions"]) == ("running", 0), lab.job(quick)

    first = lab.submit("sleep", "600", token=bob)
    second = lab.submit("sleep", "600", token=bob)
    since, seen = time.monotonic(), []  # (seconds, first's reason, second's reason, quick's state, slow's state)

    def both_reclaim() -> bool:
        jobs = {j: api.job(j) for j in (first, second, quick, slow)}
        now = (*((jobs[b][1] or {}).get("reason") for b in (first, second)),
               *(jobs[v][0]["state"] for v in (quick, slow)))
        if not seen or seen[-1][1:] != now:
            seen.append((round(time.monotonic() - since, 1), *now))
        return now[:2] == ("Preempting", "Preempting")

    lab.wait(both_reclaim, "both reclaims",
             detail=lambda: ({j: (api.job(j)[0]["state"], api.job(j)[1]) for j in (first, second, quick, slow)},
                             seen))
    assert (api.job(quick)[0]["preempted_for"], api.job(slow)[0]["preempted_for"]) == (first, second)

    gates["quick"].touch()  # the first victim saves; the second is still saving
    lab.wait(lambda: api.job(quick)[0]["state"] != "preempting", "the first victim to save")
    lab.wait(lambda: any(api.job(b)[0]["state"] in ("starting", "running") for b in (first, second)),
             "one of bob's jobs to start on the GPU it gave back", timeout=30)
    jobs = {j: api.job(j)[0] for j in (first, second, quick, slow)}
    said = {b: lab.labq("why", str(b), token=bob).stdout.strip() for b in (first, second)}
    assert jobs[quick]["attempts"][0]["ended"] == "checkpointed" and jobs[slow]["state"] == "preempting"
    started = {j: (jobs[j]["state"], sorted(gpus(jobs[j]["placement"]))) for j in (first, second)}
    assert started[first][1] == [("ws1", 0)] and started[second] == ("queued", []), (started, said)
    assert said[second].startswith(f"job {second} waits: Preempting: job {slow} is checkpointing"), said

    gates["slow"].touch()
    assert lab.wait_state(second, "running", timeout=30) and gpus(lab.job(second)["placement"]) == {("ws1", 1)}
    for job in (first, second, quick, slow, *older):
        lab.labq("cancel", str(job))


def test_a_gpu_borrowed_by_a_job_outside_every_queue_is_shown_as_lent(lab):
    """Every GPU of the lab is a queue's guarantee (2 + 2 of 4): a job outside every queue borrows all it holds,
    and some queue lent it; `labq queues` counts it in LENT as it does for a queue's borrowed GPUs."""
    lab.config.write_text(TEAMS)
    carol = start(lab, ("carol",))["carol"]
    outside = lab.submit("sleep", "120", token=carol)
    lab.wait_state(outside, "running", timeout=30)
    listed = queues(lab)
    text = lab.labq("queues").stdout
    lab.labq("cancel", str(outside))
    assert counts(listed[None]) == (1, 1, 0, 0)
    assert listed["a"]["use"] == listed["b"]["use"] == 0
    assert listed["a"]["lent"] + listed["b"]["lent"] == 1, text
