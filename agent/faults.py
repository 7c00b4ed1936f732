"""Launches that fail for a reason of this machine, not of the job, and what the node reports of them.

No account for the job's user here, no Docker daemon, the image missing on this node, a failure
before the job's program ran: none of that is the job's fault, so the job must not fail for it. The
agent records such an attempt as one that could not start (the leader requeues the job) and reports
the problem with each sync, so that the scheduler keeps the jobs it concerns off this node. A problem
is reported until ``PROBLEM_RETRY_S`` after it was last met. Then the agent looks whether it is still
there where it can tell (is the Docker daemon reachable, is the image there now): if so it is reported
on, if not it is dropped; where it cannot tell, such a job may be tried here again, and a problem that
is still there is met, and reported, again. A bad node never drains a queue: each problem costs at most
one attempt per retry period, and the attempt is requeued.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

from labq.models.node import NodeProblem
from labq.protocol.agents import MAX_DETAIL, MAX_PROBLEMS

PROBLEM_RETRY_S = 60.0


class NodeFault(ValueError):
    """A launch failed for a reason of this machine, not of the job.

    ``problem`` is what keeps such jobs off this node meanwhile; None for a missing account, which
    the node's accounts report says. A ValueError, as every refused launch is.
    """

    def __init__(self, message: str, problem: NodeProblem | None = None) -> None:
        super().__init__(message)
        self.problem = problem


def sentence(text: object) -> str:
    """``text`` as one printable line short enough for the wire: errors from Docker span lines."""
    line = " ".join(str(text).split())
    line = "".join(c if c.isprintable() else "?" for c in line)
    return line if len(line.encode()) <= MAX_DETAIL else line.encode()[:MAX_DETAIL - 3].decode(errors="ignore") + "..."


class ProblemBook:
    """The node problems this agent has met lately, by when each was last met (monotonic seconds)."""

    def __init__(self, retry_s: float = PROBLEM_RETRY_S) -> None:
        self.retry_s = retry_s
        self._met: dict[NodeProblem, float] = {}
        self._lock = threading.Lock()

    def met(self, problem: NodeProblem, now: float) -> None:
        problem = replace(problem, detail=sentence(problem.detail))  # the wire takes one printable line
        with self._lock:
            self._met.pop(problem, None)
            self._met[problem] = now
            while len(self._met) > MAX_PROBLEMS:  # the oldest go first
                del self._met[next(iter(self._met))]

    def current(self, now: float, still_there: Callable[[NodeProblem], bool | None] = lambda p: None
                ) -> tuple[NodeProblem, ...]:
        """The problems met within the retry period, oldest first. One older than that is asked about:
        ``still_there`` says True (it is met again now), False (gone), or None (cannot tell: gone, and the
        next job of its kind finds out)."""
        with self._lock:
            due = [problem for problem, at in self._met.items() if now - at >= self.retry_s]
        for problem in due:  # outside the lock: a look may take a moment
            if still_there(problem):
                self.met(problem, now)
            else:
                with self._lock:
                    if now - self._met.get(problem, now) >= self.retry_s:
                        del self._met[problem]
        with self._lock:
            return tuple(self._met)
