"""NodeMemo: a pass's answers are kept until a change makes them stale, and no longer."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from labq.scheduler.memo import NodeMemo


@dataclass(frozen=True)
class Node:
    name: str


class Asked:
    """A question whose answer on a node is the node's state, counting how often it is computed."""

    def __init__(self, state: dict[str, int]) -> None:
        self.state = state
        self.asked: list[str] = []

    def __call__(self, node: Node) -> int:
        self.asked.append(node.name)
        return self.state[node.name]


@pytest.fixture
def memo() -> NodeMemo:
    return NodeMemo({name: Node(name) for name in "abc"})


def named(*names: str):
    return lambda: [Node(name) for name in names]


def test_a_change_bumps_the_version_and_logs_each_node(memo):
    assert memo.version == 0 and memo.change_log == []
    memo.changed(["b"])
    memo.changed(["a", "c"])
    memo.changed([])
    assert memo.version == 3
    assert memo.change_log == ["b", "a", "c"]


def test_answers_about_the_lab_last_until_any_change(memo):
    memo.current["place"] = 1
    memo.settled["shape", 100] = ("resources", "detail", None, None)
    memo.changed([])  # a change on no node still makes whole-lab answers stale
    assert memo.current == {} and memo.settled == {}


def test_lasting_answers_survive_every_change(memo):
    memo.lasting["never", "shape"] = None
    memo.changed(["a", "b", "c"])
    assert memo.lasting == {("never", "shape"): None}


def test_answers_about_one_node_last_until_that_node_changes(memo):
    memo.on_node("a")["plan"] = "a's plan"
    memo.on_node("b")["plan"] = "b's plan"
    memo.changed(["b"])
    assert memo.on_node("a") == {"plan": "a's plan"}
    assert memo.on_node("b") == {}


def test_a_table_is_computed_on_every_node_the_first_time_only(memo):
    ask = Asked({"a": 1, "b": 2, "c": 3})
    assert memo.each_node("free", named("a", "b"), ask) == {"a": 1, "b": 2}
    assert memo.each_node("free", named("a", "b"), ask) == {"a": 1, "b": 2}
    assert ask.asked == ["a", "b"]


def test_a_table_recomputes_only_the_nodes_changed_since_it_was_read(memo):
    ask = Asked({"a": 1, "b": 2, "c": 3})
    memo.each_node("free", named("a", "b"), ask)
    ask.state.update(a=10, c=30)
    memo.changed(["a"])
    memo.changed(["a", "c"])  # twice on a, and on c, which this table does not cover
    ask.asked.clear()
    assert memo.each_node("free", named("a", "b"), ask) == {"a": 10, "b": 2}
    assert ask.asked == ["a"]  # once, however often it changed; c is not asked


def test_tables_of_different_questions_keep_in_step_on_their_own(memo):
    first, second = Asked({"a": 1, "b": 2, "c": 3}), Asked({"a": 1, "b": 2, "c": 3})
    memo.each_node("one", named("a", "b", "c"), first)
    memo.changed(["b"])
    memo.each_node("two", named("a", "b", "c"), second)  # built after the change: nothing stale
    memo.changed(["c"])
    first.asked.clear()
    second.asked.clear()
    memo.each_node("one", named("a", "b", "c"), first)
    memo.each_node("two", named("a", "b", "c"), second)
    assert sorted(first.asked) == ["b", "c"]
    assert second.asked == ["c"]


def test_the_node_list_is_asked_for_only_when_a_table_is_built(memo):
    calls = []

    def nodes() -> list[str]:
        calls.append(1)
        return [Node("a")]

    memo.each_node("free", nodes, lambda node: 0)
    memo.changed(["a"])
    memo.each_node("free", nodes, lambda node: 0)
    assert len(calls) == 1
