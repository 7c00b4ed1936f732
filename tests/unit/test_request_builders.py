"""The request builders of ``labq.protocol`` and their parsers are a matched pair: what a builder makes from
plain values, the leader's parser reads back as those values. The CLI and the TUI build through them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from labq.models.job import Mount, Runtime
from labq.protocol.bookings import parse_reserve, reserve_request
from labq.protocol.errors import ApiError
from labq.protocol.requests import parse_submit, submit_request, wire_priority


def round_trip_submit(**values) -> dict:
    body = submit_request(values.pop("command", ["python", "train.py"]), **values)
    return parse_submit(json.loads(json.dumps(body))).fields  # through JSON, as on the wire


def test_the_smallest_submit_is_a_command_and_reads_back_with_the_defaults():
    assert submit_request(["true"]) == {"command": ["true"]}
    fields = round_trip_submit(command=["true"])
    assert (fields["command"], fields["gpus"], fields["nodes"], fields["preemptible"]) == (("true",), 1, 1, True)
    assert fields["runtime"] is Runtime.PROCESS and "time_limit_s" not in fields


@pytest.mark.parametrize(("values", "read_back"), [
    ({"gpus": 2, "workdir": "/home/a/p"}, {"gpus": 2, "workdir": "/home/a/p"}),
    ({"name": "bert", "gpu_model": "A100", "min_gpu_memory_mib": 40960},
     {"name": "bert", "gpu_model": "A100", "min_gpu_memory_mib": 40960}),
    ({"priority": "high"}, {"priority": 300}),
    ({"priority": 250}, {"priority": 250}),
    ({"preemptible": False}, {"preemptible": False}),
    ({"time_limit_s": 5400.0, "requeue_on_timeout": True, "grace_s": 90.0},
     {"time_limit_s": 5400.0, "requeue_on_timeout": True, "grace_s": 90.0}),
    ({"checkpoint_signal": "SIGUSR2"}, {"checkpoint_signal": "SIGUSR2"}),
    ({"env": {"A": "1", "B": "x=y"}}, {"env": (("A", "1"), ("B", "x=y"))}),
    ({"depends_on": [3, 4]}, {"depends_on": (3, 4)}),
    ({"gpus": 4, "nodes": 2, "node": "ws1", "reservation": "paper"},
     {"gpus": 4, "nodes": 2, "node": "ws1", "reservation": "paper"}),
    ({"image": "pytorch/pytorch:2.4", "mounts": [Mount("/data", "/data", True)], "shm_size_mib": 8192},
     {"runtime": Runtime.DOCKER, "image": "pytorch/pytorch:2.4", "mounts": (Mount("/data", "/data", True),),
      "shm_size_mib": 8192}),
])
def test_submit_values_read_back_as_given(values, read_back):
    fields = round_trip_submit(**values)
    assert {key: fields[key] for key in read_back} == read_back


def test_the_builder_checks_nothing_the_parser_checks():
    """Validation is the parser's alone: a builder passes a wrong value through and the leader refuses it."""
    with pytest.raises(ApiError, match="time_limit_s"):
        round_trip_submit(time_limit_s=0.5)
    with pytest.raises(ApiError, match="for container jobs"):
        round_trip_submit(mounts=[Mount("/a", "/b")])


def test_whole_seconds_go_out_as_integers():
    body = submit_request(["x"], time_limit_s=5400.0, grace_s=60.0)
    assert (body["time_limit_s"], body["grace_s"]) == (5400, 60)
    assert isinstance(body["time_limit_s"], int) and submit_request(["x"], grace_s=1.5)["grace_s"] == 1.5


def test_defaults_are_left_out_of_the_body():
    body = submit_request(["x"], preemptible=True, requeue_on_timeout=False, env={}, depends_on=[], mounts=())
    assert body == {"command": ["x"]}


@pytest.mark.parametrize(("text", "sent"), [("high", "high"), (" Urgent ", "urgent"), ("250", 250), ("0", 0)])
def test_priority_as_typed_becomes_a_class_name_or_an_integer(text, sent):
    assert wire_priority(text) == sent


@pytest.mark.parametrize("text", ["9000", "soon", ""])
def test_a_priority_that_is_none_is_refused(text):
    with pytest.raises(ValueError):
        wire_priority(text)


def test_a_reservation_reads_back_as_given():
    body = reserve_request(4, 1000.0, 1000.0 + 48 * 3600, name="paper", node="ws1", gpu_model="A100",
                           min_gpu_memory_mib=40960, users=["alice", "bob"], owner="carol", dry_run=True)
    read = parse_reserve(json.loads(json.dumps(body)))
    assert (read.gpus, read.start, read.end, read.name, read.node, read.gpu_model, read.min_gpu_memory_mib,
            read.users, read.owner, read.dry_run) == (4, 1000.0, 1000.0 + 48 * 3600, "paper", "ws1", "A100", 40960,
                                                      ("alice", "bob"), "carol", True)


def test_a_reservation_sends_only_what_was_given():
    assert reserve_request(1, 10.0, 20.0) == {"gpus": 1, "start": 10.0, "end": 20.0}
    read = parse_reserve(reserve_request(1, 10.0, 20.0, group="vision"))
    assert (read.group, read.users, read.dry_run, read.name) == ("vision", (), False, None)


def test_the_submit_builder_loads_only_the_declaration_of_the_fields():
    """``labq submit`` builds its body with it: it must stay as light to import as the CLI's fast path. It reads
    the fields' declaration (``labq.models.spec``, plain classes) and no model, nor ``dataclasses``."""
    code = ("import sys\nfrom labq.protocol.requests import submit_request\nsubmit_request(['x'], gpus=2)\n"
            "print(sorted(m for m in sys.modules if m.startswith('labq.models') or m in ('signal', 'textual', "
            "'dataclasses', 'typing')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['labq.models', 'labq.models.priority', 'labq.models.spec']"
