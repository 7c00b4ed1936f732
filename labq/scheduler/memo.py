"""What a scheduling pass has worked out, and what a change to a node makes stale.

A pass asks the same questions many times over a long queue: the best free GPU set
for a job shape on each node, a preemption plan, the set that frees soonest. The
answers depend on the nodes' state, which changes only when the pass starts a job,
preempts one or holds GPUs, and each such change touches one or two nodes. This
memo keeps the answers and forgets exactly what a change makes stale:

* answers that depend on no node's state (``lasting``) last the whole pass;
* answers about the whole lab (``current``) and the verdicts that waiting jobs
  share (``settled``) last until the next change anywhere;
* answers about one node (``on_node``) last until that node changes;
* a table of one question's answer on every node (``each_node``) is brought up to
  date by asking again on only the nodes changed since it was last read.

It knows nothing of jobs or GPUs, only nodes by name: the pass says what changed and how to compute.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Generic, Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=Named)

#: what a table gives for a question not asked yet, where None is an answer (no GPU set, no plan)
UNKNOWN = object()
#: in a settled verdict's key, where the CPUs a job asks go: the verdict of a job that waits as it would by GPUs
#: alone, which every job of its GPU shape shares, whatever it asks of CPUs and memory
BY_GPUS = "by GPUs alone"


class _Table:
    """One question's answers by node name, and how much of the change log they reflect."""

    __slots__ = ("by_node", "seen")

    def __init__(self, by_node: dict[str, Any], seen: int) -> None:
        self.by_node = by_node
        self.seen = seen


class NodeMemo(Generic[N]):
    """Answers a pass remembers, and the log of node changes that makes them stale."""

    def __init__(self, nodes: Mapping[str, N]) -> None:
        self._nodes = nodes
        #: bumped on every change: an answer taken at one version holds while it stays the same
        self.version = 0
        #: the nodes changed, in order (a name once per change that touched it)
        self.change_log: list[str] = []
        #: answers about the whole lab, forgotten at every change
        self.current: dict[Hashable, Any] = {}
        #: verdicts that waiting jobs of one shape and priority share, forgotten at every change
        self.settled: dict[Hashable, tuple] = {}
        #: answers no change makes stale (which GPUs suit a job, whether it fits the lab at all)
        self.lasting: dict[Hashable, Any] = {}
        self._by_node: dict[str, dict[Hashable, Any]] = {name: {} for name in nodes}
        self._tables: dict[Hashable, _Table] = {}

    def changed(self, nodes: Iterable[str]) -> None:
        """Something changed on ``nodes`` (a start, a preemption, a hold): forget what that makes stale."""
        self.version += 1
        self.current.clear()
        self.settled.clear()
        for name in nodes:
            self.change_log.append(name)
            self._by_node[name].clear()

    def on_node(self, node: str) -> dict[Hashable, Any]:
        """Answers about ``node`` alone, kept until it changes: the caller reads and fills it."""
        return self._by_node[node]

    def each_node(self, key: Hashable, nodes: Callable[[], Iterable[N]], compute: Callable[[N], Any]) -> dict[str, Any]:
        """``compute(node)`` for each of ``nodes()``, by node name, for the question ``key``.

        The first time ``key`` is asked, every node is computed; later, only the nodes
        changed since it was last asked. ``nodes`` is called only the first time, so the
        question must always be asked of the same nodes.
        """
        table = self._tables.get(key)
        logged = len(self.change_log)
        if table is None:
            table = self._tables[key] = _Table({node.name: compute(node) for node in nodes()}, logged)
        elif table.seen < logged:
            by_node = table.by_node
            for name in set(self.change_log[table.seen:]):
                if name in by_node:
                    by_node[name] = compute(self._nodes[name])
            table.seen = logged
        return table.by_node
