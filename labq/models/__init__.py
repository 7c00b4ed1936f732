"""The lab's vocabulary as typed, immutable data. Pure: no I/O, no clock."""

from labq.models.decisions import Decisions, Pending, PendingReason, Preempt, Start
from labq.models.job import Job, JobSpec, JobState, Mount, Runtime
from labq.models.node import Gpu, Node, NodeHealth
from labq.models.placement import NodeAllocation, Placement
from labq.models.priority import PriorityClass, parse_priority, priority_name
from labq.models.reservation import Reservation
from labq.models.topology import NVLINK_WEIGHT, PcieLevel, Topology

__all__ = [
    "Decisions", "Gpu", "Job", "JobSpec", "JobState", "Mount", "Node", "NodeAllocation",
    "NodeHealth", "NVLINK_WEIGHT", "PcieLevel", "Pending", "PendingReason", "Placement",
    "Preempt", "PriorityClass", "Reservation", "Runtime", "Start", "Topology",
    "parse_priority", "priority_name",
]
