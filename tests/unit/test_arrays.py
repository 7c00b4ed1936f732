"""Arrays and grids as typed (``labq.models.arrays``): ranges, steps, lists, ``%N``, grids, quoting, the
tasks' commands and environments; and the clear refusal of everything else."""

from __future__ import annotations

import pytest

from labq.models.arrays import (
    MAX_TASKS, Sweep, Task, parse_array, parse_grid, sweep, task_command, task_env, task_jobs, task_specs,
    unknown_placeholders,
)


@pytest.mark.parametrize(("text", "indices", "cap"), [
    ("0-3", (0, 1, 2, 3), None),
    ("0-99%8", tuple(range(100)), 8),
    ("5", (5,), None),
    ("1-9:2", (1, 3, 5, 7, 9), None),
    ("1-10:3", (1, 4, 7, 10), None),
    ("1,5,9", (1, 5, 9), None),
    ("1-3,10-12", (1, 2, 3, 10, 11, 12), None),
    ("9,1,5", (9, 1, 5), None),  # in the order typed
    (" 0-2 %1 ", (0, 1, 2), 1),
    ("0-9999", tuple(range(MAX_TASKS)), None),
])
def test_array_texts(text, indices, cap):
    assert parse_array(text) == (indices, cap)


@pytest.mark.parametrize(("text", "words"), [
    ("", "is none of them"),
    ("a-b", "is none of them"),
    ("-3", "is none of them"),
    ("1-", "is none of them"),
    ("5-1", "runs backwards: write 1-5"),
    ("0-9:0", "step must be 1 or more"),
    ("1,2,1", "names index 1 twice"),
    ("0-3,2", "names index 2 twice"),
    ("0-10000", f"at most {MAX_TASKS:,} tasks"),
    ("0-9%0", "N is a whole number, 1 or more"),
    ("0-9%x", "N is a whole number, 1 or more"),
    ("0-9%", "N is a whole number, 1 or more"),
    ("1;rm -rf /", "is none of them"),
])
def test_bad_array_texts_say_what_is_accepted(text, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        parse_array(text)


@pytest.mark.parametrize(("items", "grids"), [
    (["lr=1e-3,3e-4"], (("lr", ("1e-3", "3e-4")),)),
    (["lr=1e-3", "seed=0,1,2"], (("lr", ("1e-3",)), ("seed", ("0", "1", "2")))),
    (['opt="adam,0.9",sgd'], (("opt", ("adam,0.9", "sgd")),)),
    (['tag=""'], (("tag", ("",)),)),  # an empty string, quoted
    (["model=gpt2 small,bert"], (("model", ("gpt2 small", "bert")),)),
    (["x_1=a=b"], (("x_1", ("a=b",)),)),  # the first = splits
])
def test_grid_texts(items, grids):
    assert parse_grid(items) == grids


@pytest.mark.parametrize(("items", "words"), [
    (["lr"], "NAME=V1,V2"),
    (["=1,2"], "NAME=V1,V2"),
    (["1lr=1"], "NAME=V1,V2"),
    (["l-r=1"], "NAME=V1,V2"),
    (["lr=1,,2"], "an empty value"),
    (["lr=1,"], "an empty value"),
    (["lr="], "an empty value"),
    (['lr="1,2'], "not closed"),
    (["lr=1,1"], "lists a value twice"),
    (["lr=1", "LR=2"], "has lr and LR"),
    (["index=1,2"], "each task's index already"),
])
def test_bad_grids_say_what_is_wrong(items, words):
    with pytest.raises(ValueError, match=words):
        parse_grid(items)


def test_a_grid_is_the_cartesian_product_first_grid_slowest():
    s = sweep(grids=["lr=1e-3,3e-4", "seed=0,1,2"])
    assert s.names == ("lr", "seed") and s.cap is None
    assert [t.params for t in s.tasks] == [
        (("lr", "1e-3"), ("seed", "0")), (("lr", "1e-3"), ("seed", "1")), (("lr", "1e-3"), ("seed", "2")),
        (("lr", "3e-4"), ("seed", "0")), (("lr", "3e-4"), ("seed", "1")), (("lr", "3e-4"), ("seed", "2"))]
    assert [t.index for t in s.tasks] == list(range(6))


def test_a_sweep_takes_an_array_or_a_grid_with_a_cap():
    assert sweep("0-2%2") == Sweep((Task(0), Task(1), Task(2)), 2)
    assert sweep("%4", ["seed=0,1"]).cap == 4
    with pytest.raises(ValueError, match="give --array only a cap there"):
        sweep("0-3", ["seed=0,1"])
    with pytest.raises(ValueError, match="needs --array or --grid"):
        sweep()
    with pytest.raises(ValueError, match="10,100 combinations"):
        sweep(grids=[f"a={','.join(map(str, range(101)))}", f"b={','.join(map(str, range(100)))}"])


def test_each_task_has_its_own_command_and_environment():
    task = Task(7, (("lr", "3e-4"), ("seed", "1")))
    command = ("python", "train.py", "--shard", "{index}", "--lr={lr}", "--seed", "{seed}", "${HOME}", '{"a": 1}',
               "{lrr}")
    assert task_command(command, task) == ("python", "train.py", "--shard", "7", "--lr=3e-4", "--seed", "1",
                                           "${HOME}", '{"a": 1}', "{lrr}")
    assert unknown_placeholders(command, ("lr", "seed")) == ["lrr"]
    assert task_env(12, task) == {"LABQ_ARRAY_ID": "12", "LABQ_ARRAY_INDEX": "7", "LABQ_PARAM_LR": "3e-4",
                                  "LABQ_PARAM_SEED": "1"}
    assert task_env(12, Task(0)) == {"LABQ_ARRAY_ID": "12", "LABQ_ARRAY_INDEX": "0"}
    home = Task(0, (("HOME", "/x"),))  # a grid named as a shell variable: the shell's ${HOME} stays the shell's
    assert task_command(("cd", "${HOME}", "{HOME}"), home) == ("cd", "${HOME}", "/x")


def test_a_tasks_spec_keeps_its_array_and_a_plain_one_stores_none():
    from labq.models import JobSpec
    from labq.protocol.codec import decode_spec, encode_spec

    task = JobSpec(user="alice", command=("train",), array_id=12, array_index=3, array_cap=4, array_tasks=10)
    assert encode_spec(task)["array"] == {"id": 12, "index": 3, "cap": 4, "tasks": 10}
    assert decode_spec(encode_spec(task)) == task and task.task_ref == "12.3"
    plain = JobSpec(user="alice", command=("train",))
    assert "array" not in encode_spec(plain) and decode_spec(encode_spec(plain)) == plain and plain.task_ref is None


def test_a_tasks_spec_and_document_are_what_replace_and_encode_job_make():
    from dataclasses import replace

    from labq.models import Job, JobSpec
    from labq.protocol.codec import encode_job
    from labq.store.contract import task_doc

    spec = JobSpec(user="alice", command=("train", "--lr={lr}", "{index}"), env=(("B", "1"), ("Z", "2")), gpus=2,
                   time_limit_s=3600.0)
    shape = spec.resource_shape  # cached: the tasks share it
    tasks = sweep("%3", ["lr=1e-3,3e-4"]).tasks
    made = task_specs(spec, 40, tasks, 3, len(tasks))
    assert made == [replace(spec, command=task_command(spec.command, t),
                            env=tuple(sorted({**dict(spec.env), **task_env(40, t)}.items())), array_id=40,
                            array_index=t.index, array_cap=3, array_tasks=2) for t in tasks]
    assert made[1].command == ("train", "--lr=3e-4", "1") and made[1].resource_shape == shape
    jobs = [Job(41 + k, s, submitted_at=5.0) for k, s in enumerate(made)]
    assert task_jobs(41, made, 5.0) == jobs and task_jobs(41, [], 5.0) == []
    # a grid's value wins over the same name in the submitted environment, as task_env's entries do
    both = JobSpec(user="alice", command=("train",), env=(("LABQ_PARAM_LR", "mine"), ("A", "1")))
    grid = sweep(None, ["lr=1e-3,3e-4", "seed=0,1"]).tasks
    assert [s.env for s in task_specs(both, 7, grid, None, len(grid))] == [
        tuple(sorted({**dict(both.env), **task_env(7, t)}.items())) for t in grid]
    first = encode_job(jobs[0])  # what the store makes of a task told as its differences (PutTasks)
    assert [task_doc(first, j.id, j.spec.command, dict(j.spec.env), j.spec.array_index) for j in jobs] == [
        encode_job(j) for j in jobs]
