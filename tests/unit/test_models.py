"""The domain model refuses nonsense with messages that say what is accepted."""

from __future__ import annotations

import pytest

from labq.models import JobSpec, JobState, PcieLevel, PriorityClass, Reservation, Runtime, Topology
from labq.models.priority import parse_priority, priority_name


@pytest.mark.parametrize(
    ("text", "value"),
    [("low", 100), ("normal", 200), ("HIGH", 300), (" urgent ", 400), ("250", 250), (0, 0), (1000, 1000)],
)
def test_priorities_parse_from_names_and_integers(text, value):
    assert parse_priority(text) == value


@pytest.mark.parametrize(("text", "words"), [("top", "use low, normal, high, urgent"), ("-1", "out of range"),
                                             ("1001", "out of range"), ("", "unknown priority")])
def test_bad_priorities_say_what_is_accepted(text, words):
    with pytest.raises(ValueError, match=words):
        parse_priority(text)


def test_priority_names_round_trip():
    for cls in PriorityClass:
        assert parse_priority(priority_name(int(cls))) == cls
    assert priority_name(250) == "250"


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"gpus": 0}, "at least one GPU"),
        ({"gpus": 3, "nodes": 2}, "cannot be split evenly"),
        ({"nodes": 0}, "nodes must be 1 or more"),
        ({"runtime": Runtime.DOCKER}, "needs an image"),
    ],
)
def test_job_spec_validation(kwargs, words):
    with pytest.raises(ValueError, match=words):
        JobSpec(user="alice", command=("x",), **kwargs)


def test_job_states_know_which_are_finished_and_which_hold_gpus():
    assert {s for s in JobState if s.finished} == {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
                                                  JobState.TIMEOUT}
    assert {s for s in JobState if s.holds_gpus} == {JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING}


def test_topology_must_be_square_and_symmetric():
    with pytest.raises(ValueError, match="square"):
        Topology(pcie=((PcieLevel.BOARD,),), nvlinks=((0, 0), (0, 0)))
    with pytest.raises(ValueError, match="not symmetric between GPU 0 and GPU 1"):
        Topology(pcie=((PcieLevel.BOARD, PcieLevel.SYSTEM), (PcieLevel.SWITCH, PcieLevel.BOARD)),
                 nvlinks=((0, 0), (0, 0)))


def test_pcie_levels_rank_closer_links_higher():
    order = [PcieLevel.BOARD, PcieLevel.SWITCH, PcieLevel.MULTI_SWITCH, PcieLevel.HOST_BRIDGE, PcieLevel.NUMA,
             PcieLevel.SYSTEM]
    assert [level.score for level in order] == [5, 4, 3, 2, 1, 0]
    assert [level.short for level in order] == ["BRD", "PIX", "PXB", "PHB", "NODE", "SYS"]


def test_reservation_windows_are_half_open():
    r = Reservation(name="paper", owner="alice", gpus=4, start=100.0, end=200.0, users=frozenset({"bob"}))
    assert r.active(100.0) and not r.active(200.0)
    assert r.overlaps(199.0, 300.0) and not r.overlaps(200.0, 300.0) and not r.overlaps(0.0, 100.0)
    assert r.admits("alice") and r.admits("bob") and not r.admits("carol")
    with pytest.raises(ValueError, match="end must be after start"):
        Reservation(name="x", owner="alice", gpus=1, start=5.0, end=5.0)


def test_a_stored_job_with_an_image_is_a_container_job_whatever_its_runtime_says():
    from labq.models.job import Runtime
    from labq.protocol.codec import decode_spec

    # written before submit refused an image with runtime "process": it must not run on the host
    old = {"user": "alice", "command": ["python", "train.py"], "image": "pytorch/pytorch:2.4", "runtime": "process"}
    assert decode_spec(old).runtime is Runtime.DOCKER
    assert decode_spec({"user": "alice", "command": ["true"]}).runtime is Runtime.PROCESS
