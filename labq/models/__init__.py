"""The lab's vocabulary as typed, immutable data. Pure: no I/O, no clock.

Names load on first use, so that a command needing only one module (``labq ls``
renders priority names) does not pay for importing all of them.
"""

from __future__ import annotations

_WHERE = {
    "Decisions": "decisions", "Pending": "decisions", "PendingReason": "decisions", "Preempt": "decisions",
    "Start": "decisions",
    "Job": "job", "JobSpec": "job", "JobState": "job", "Mount": "job", "Runtime": "job",
    "Gpu": "node", "Node": "node", "NodeHealth": "node",
    "NodeAllocation": "placement", "Placement": "placement",
    "PriorityClass": "priority", "parse_priority": "priority", "priority_name": "priority",
    "Alternative": "reservation", "BookingAnswer": "reservation", "Displaced": "reservation",
    "Reservation": "reservation",
    "NVLINK_WEIGHT": "topology", "PcieLevel": "topology", "Topology": "topology",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'labq.models' has no attribute {name!r}")
    # ``__import__`` with a from-list gives the submodule, as ``importlib.import_module`` would (not loaded: CLI start)
    value = getattr(__import__(f"labq.models.{_WHERE[name]}", fromlist=[name]), name)
    globals()[name] = value
    return value


TYPE_CHECKING = False  # typing's, without importing typing: 3 ms of the CLI's start (type checkers take it as true)
if TYPE_CHECKING:  # the same names, for type checkers  # noqa: F401 below: re-exports
    from labq.models.decisions import Decisions, Pending, PendingReason, Preempt, Start  # noqa: F401
    from labq.models.job import Job, JobSpec, JobState, Mount, Runtime  # noqa: F401
    from labq.models.node import Gpu, Node, NodeHealth  # noqa: F401
    from labq.models.placement import NodeAllocation, Placement  # noqa: F401
    from labq.models.priority import PriorityClass, parse_priority, priority_name  # noqa: F401
    from labq.models.reservation import Alternative, BookingAnswer, Displaced, Reservation  # noqa: F401
    from labq.models.topology import NVLINK_WEIGHT, PcieLevel, Topology  # noqa: F401
