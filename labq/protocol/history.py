"""The wire format of ``GET /v1/history`` (``labq sim --from-history``): the lab's scheduling settings beside its
finished jobs, so that a replay runs with the lab's own policy unless it is asked for another.

The settings travel as ``labq.scheduler.Policy``'s fields (this module knows the names, not the class: the
protocol sits beside the scheduler, not on it); ``policy_fields`` gives them back as ``Policy``'s arguments."""

from __future__ import annotations

#: the settings a replay needs; a lab's queues are not among them (``GET /v1/queues`` shows them)
FIELDS = ("max_gpus_per_user", "user_gpu_quota", "preemption", "min_runtime_s", "hold_depth", "may_preempt",
          "max_preemptions_per_day", "aging_s", "reclaim_grace_s", "cpus_per_gpu", "mem_per_gpu_mib")


def encode_policy(policy) -> dict:
    """A ``labq.scheduler.Policy``'s settings as JSON types."""
    doc = {name: getattr(policy, name) for name in FIELDS}
    doc["user_gpu_quota"] = dict(doc["user_gpu_quota"])
    if doc["may_preempt"] is not None:
        doc["may_preempt"] = {str(k): sorted(v) for k, v in doc["may_preempt"].items()}
    return doc


def policy_fields(doc: dict) -> dict:
    """``Policy(**policy_fields(doc))``: the settings ``encode_policy`` sent (absent ones keep their defaults)."""
    fields = {name: doc[name] for name in FIELDS if name in doc}
    if fields.get("may_preempt") is not None:
        fields["may_preempt"] = {int(k): frozenset(v) for k, v in fields["may_preempt"].items()}
    if "user_gpu_quota" in fields:
        fields["user_gpu_quota"] = dict(fields["user_gpu_quota"] or {})
    return fields
