"""Models to JSON and back, in matched pairs. The leader's store keeps jobs in this form too.

``decode_*`` trusts its input as far as types go (it comes from labq itself:
the store or the leader); requests from people go through ``labq.protocol.requests``.
"""

from __future__ import annotations

from labq.models.decisions import Pending
from labq.models.job import Attempt, AttemptEnd, Job, JobSpec, JobState, Mount, Runtime, SignalSource, StopReason
from labq.models.node import Gpu, Node, NodeHealth, cpu_list_text, parse_cpu_list
from labq.models.notify import NotifyEvent
from labq.models.placement import NodeAllocation, Placement
from labq.models.reservation import Reservation
from labq.models.spec import FIELDS
from labq.models.topology import PcieLevel, Topology

#: a shaped field's value to its JSON form and back, by kind (``labq.models.spec.KINDS``); the rest are JSON as they are
_TO_DOC = {
    "argv": list, "ids": list, "env": dict,
    "mounts": lambda mounts: [{"source": m.source, "target": m.target, "read_only": m.read_only} for m in mounts],
    "events": lambda events: [e.value for e in events], "choice": lambda choice: choice.value,
}
_FROM_DOC = {
    "argv": tuple, "ids": tuple, "env": lambda env: tuple(sorted(env.items())),
    "mounts": lambda docs: tuple(Mount(m["source"], m["target"], m.get("read_only", False)) for m in docs),
    "events": lambda values: tuple(NotifyEvent(e) for e in values),
}
#: an array's task keeps its four numbers in the document's ``array``
_ARRAY = {"array_id": "id", "array_index": "index", "array_cap": "cap", "array_tasks": "tasks"}


def encode_spec(spec: JobSpec) -> dict:
    """A spec as its stored document (and an agent's order has it): every field of ``labq.models.spec.FIELDS``
    that is stored ``always``, and the others only when they are not their default."""
    doc: dict = {}
    for f in FIELDS:
        value = getattr(spec, f.name)
        if f.stored == "array":
            if spec.array_id is not None:  # only for an array's tasks
                doc.setdefault("array", {})[_ARRAY[f.name]] = value
        elif f.stored == "always" or value != f.default:
            doc[f.name] = value if value is None or f.kind not in _TO_DOC else _TO_DOC[f.kind](value)
    return doc


def decode_spec(doc: dict) -> JobSpec:
    """A stored spec; a field it does not have (a document of an older labq) takes its default."""
    values = {}
    for f in FIELDS:
        value = doc["array"].get(_ARRAY[f.name]) if f.stored == "array" and doc.get("array") else doc.get(f.name)
        if value is None:
            continue
        if f.kind == "choice":
            value = f.choices(value)
        elif f.kind in _FROM_DOC:
            value = _FROM_DOC[f.kind](value)
        values[f.name] = value
    if doc.get("image"):  # an image always meant a container: a job stored before submit refused image + process
        values["runtime"] = Runtime.DOCKER
    return JobSpec(**values)


def encode_allocation(a: NodeAllocation) -> dict:
    """One node's part of a placement; its CPUs and memory only where it holds some (a CPU list: ``0-9``)."""
    doc = {"node": a.node, "gpu_indices": list(a.gpu_indices), "gpu_uuids": list(a.gpu_uuids), "score": a.score}
    if a.cpu_set:
        doc["cpu_set"] = cpu_list_text(a.cpu_set)
    if a.cpus is not None:
        doc["cpus"] = a.cpus
    if a.memory_mib is not None:
        doc["memory_mib"] = a.memory_mib
    if a.far_cpus:
        doc["far_cpus"] = a.far_cpus
    return doc


def decode_allocation(a: dict) -> NodeAllocation:
    return NodeAllocation(a["node"], tuple(a["gpu_indices"]), tuple(a["gpu_uuids"]), a["score"],
                          parse_cpu_list(a.get("cpu_set") or ""), a.get("cpus"), a.get("memory_mib"),
                          a.get("far_cpus", 0))


def encode_placement(placement: Placement | None) -> dict | None:
    if placement is None:
        return None
    return {"allocations": [encode_allocation(a) for a in placement.allocations]}


def decode_placement(doc: dict | None) -> Placement | None:
    if doc is None:
        return None
    return Placement(tuple(decode_allocation(a) for a in doc["allocations"]))


_JOB_SCALARS = ("attempt", "submitted_at", "started_at", "ended_at", "exit_code", "last_checkpoint_at",
                "preemptions", "work_lost_s", "preempted_for", "drained_for", "stop_requested", "note")
#: what its GPUs did (``Job.measured_gpu_s``...): only in the documents of jobs that were measured
_MEASURED = ("measured_gpu_s", "busy_gpu_s", "memory_mib_gpu_s")


def encode_attempt(a: Attempt) -> dict:
    return {"attempt": a.number, "placement": encode_placement(a.placement), "started_at": a.started_at,
            "ended_at": a.ended_at, "ended": a.ended.value, "exit_code": a.exit_code,
            "stop_reason": a.stop_reason.value if a.stop_reason else None, "preempted_for": a.preempted_for,
            "last_checkpoint_at": a.last_checkpoint_at, "work_lost_s": a.work_lost_s, "drained_for": a.drained_for}


def decode_attempt(doc: dict) -> Attempt:
    return Attempt(doc["attempt"], decode_placement(doc.get("placement")), doc.get("started_at"), doc["ended_at"],
                   AttemptEnd(doc["ended"]), doc.get("exit_code"),
                   StopReason(doc["stop_reason"]) if doc.get("stop_reason") else None, doc.get("preempted_for"),
                   doc.get("last_checkpoint_at"), doc.get("work_lost_s", 0.0), doc.get("drained_for"))


def encode_job(job: Job) -> dict:
    doc = {"id": job.id, "state": job.state.value, "spec": encode_spec(job.spec)}
    doc.update({name: getattr(job, name) for name in _JOB_SCALARS})
    if job.measured_gpu_s:
        doc.update({name: round(getattr(job, name), 1) for name in _MEASURED})
    if job.cancelled_by is not None:
        doc["cancelled_by"] = job.cancelled_by
    if job.gpu_mem_peak_mib is not None:
        doc["gpu_mem_peak_mib"] = job.gpu_mem_peak_mib
    if job.learned_signal is not None and job.learned_from is not None:
        doc["learned_signal"], doc["learned_from"] = job.learned_signal, job.learned_from.value
    doc["placement"] = encode_placement(job.placement)
    doc["attempts"] = [encode_attempt(a) for a in job.history]
    return doc


HIDDEN = "(hidden)"  #: an environment value shown to someone who is not the job's owner or an admin


#: the fields of a spec that hold variables (``--env``, and what ``--export`` took from the submitter's shell)
_ENVIRONMENTS = tuple(f.name for f in FIELDS if f.kind == "env")


def hide_env(doc: dict) -> dict:
    """An encoded job with its environment's values hidden (the names stay): secrets live there."""
    spec = doc["spec"]
    return {**doc, "spec": {**spec, **{name: dict.fromkeys(spec.get(name) or {}, HIDDEN) for name in _ENVIRONMENTS
                                       if name in spec or name == "env"}}}


def decode_job(doc: dict) -> Job:
    return Job(id=doc["id"], spec=decode_spec(doc["spec"]), state=JobState(doc["state"]),
               placement=decode_placement(doc.get("placement")),
               history=tuple(decode_attempt(a) for a in doc.get("attempts", ())),
               learned_signal=doc.get("learned_signal"), cancelled_by=doc.get("cancelled_by"),
               gpu_mem_peak_mib=doc.get("gpu_mem_peak_mib"),
               learned_from=SignalSource(doc["learned_from"]) if doc.get("learned_from") else None,
               **{name: doc[name] for name in _JOB_SCALARS + _MEASURED if name in doc})


def encode_topology(topology: Topology) -> dict:
    return {"pcie": [[int(level) for level in row] for row in topology.pcie],
            "nvlinks": [list(row) for row in topology.nvlinks],
            "nvswitch_links": list(topology.nvswitch_links), "numa": list(topology.numa)}


def decode_topology(doc: dict) -> Topology:
    return Topology(pcie=tuple(tuple(PcieLevel(v) for v in row) for row in doc["pcie"]),
                    nvlinks=tuple(tuple(row) for row in doc["nvlinks"]),
                    nvswitch_links=tuple(doc.get("nvswitch_links", ())), numa=tuple(doc.get("numa", ())))


def encode_gpu(gpu: Gpu) -> dict:
    doc = {"index": gpu.index, "uuid": gpu.uuid, "model": gpu.model, "memory_mib": gpu.memory_mib}
    if gpu.local_cpus:
        doc["local_cpus"] = cpu_list_text(gpu.local_cpus)
    return doc


def decode_gpu(doc: dict) -> Gpu:
    return Gpu(doc["index"], doc["uuid"], doc["model"], doc["memory_mib"], parse_cpu_list(doc.get("local_cpus") or ""))


def encode_node(node: Node) -> dict:
    doc = {"name": node.name, "health": node.health.value, "gpus": [encode_gpu(g) for g in node.gpus],
           "topology": encode_topology(node.topology), "unmanaged_busy": sorted(node.unmanaged_busy),
           "simulated": node.simulated, "labels": list(node.labels)}
    if node.unmanaged_mib:
        doc["unmanaged_mib"] = {str(index): mib for index, mib in node.unmanaged_mib}
    if not node.shares:
        doc["shares"] = False
    if node.hands_over:
        doc["hands_over"] = True
    if node.cpus:  # an agent of an older labq says neither: its jobs are placed by GPUs alone
        doc["cpus"] = cpu_list_text(node.cpus)
    if node.memory_mib is not None:
        doc["memory_mib"] = node.memory_mib
    return doc


def decode_node(doc: dict) -> Node:
    return Node(doc["name"], tuple(decode_gpu(g) for g in doc["gpus"]), decode_topology(doc["topology"]),
                NodeHealth(doc.get("health", "up")), frozenset(doc.get("unmanaged_busy", ())),
                doc.get("simulated", False), tuple(doc.get("labels", ())),
                unmanaged_mib=tuple(sorted((int(i), int(m)) for i, m in (doc.get("unmanaged_mib") or {}).items())),
                shares=doc.get("shares", True), hands_over=doc.get("hands_over", False),
                cpus=parse_cpu_list(doc.get("cpus") or ""), memory_mib=doc.get("memory_mib"))


def encode_pending(pending: Pending | None) -> dict | None:
    if pending is None:
        return None
    return {"reason": pending.reason.value, "detail": pending.detail, "waiting_for": pending.waiting_for,
            "estimated_start": pending.estimated_start}


def encode_reservation(r: Reservation) -> dict:
    return {"name": r.name, "owner": r.owner, "gpus": r.gpus, "start": r.start, "end": r.end,
            "users": sorted(r.users), "group": r.group, "node": r.node, "gpu_indices": list(r.gpu_indices),
            "gpu_model": r.gpu_model, "min_gpu_memory_mib": r.min_gpu_memory_mib, "score": r.score,
            "created_at": r.created_at, "note": r.note, "cancelled_at": r.cancelled_at,
            **({"told": list(r.told)} if r.told else {})}


def decode_reservation(doc: dict) -> Reservation:
    return Reservation(doc["name"], doc["owner"], doc["gpus"], doc["start"], doc["end"], frozenset(doc["users"]),
                       doc.get("group"), doc.get("node"), tuple(doc.get("gpu_indices", ())), doc.get("gpu_model"),
                       doc.get("min_gpu_memory_mib", 0), doc.get("score", 0), doc.get("created_at", 0.0),
                       doc.get("note", ""), doc.get("cancelled_at"), tuple(doc.get("told", ())))
