"""One job at length: why it waits (or what it does), everything about it, and its attempts."""

from __future__ import annotations

from collections.abc import Mapping

from labq.models.priority import priority_name
from labq.render.jobs import FINISHED, placement_text, room_for
from labq.render.tables import format_clock, format_duration, format_mib, table
from labq.terminal_text import escape_controls


def estimate_text(estimated_start: float | None, now: float) -> str:
    """``starts in about 40m (est. 14:05)``, or ``""`` when the scheduler cannot tell."""
    if estimated_start is None:
        return ""
    if estimated_start <= now + 30:
        return "should start at the next scheduling pass"
    return f"starts in about {format_duration(estimated_start - now)} (est. {format_clock(estimated_start, now)})"


def why_text(job: Mapping, pending: Mapping | None, now: float) -> str:
    """The answer to "why is my job not running?" in a sentence or two."""
    return "\n".join(escape_controls(line) for line in _why_lines(job, pending, now))


def _why_lines(job: Mapping, pending: Mapping | None, now: float) -> list[str]:
    note = [f"  {job['note']}"] if job.get("note") else []
    if pending:
        lines = [f"job {job['id']} waits: {pending['reason']}: {pending['detail']}"]
        if pending.get("waiting_for"):
            lines.append(f"  waiting for job {pending['waiting_for']}")
        if estimate := estimate_text(pending.get("estimated_start"), now):
            lines.append(f"  {estimate}")
        return lines + note
    return [_why_sentence(job)] + note


def _why_sentence(job: Mapping) -> str:
    state, where = job["state"], placement_text(job)
    if state == "queued":
        return f"job {job['id']} is queued; the scheduler has not placed it yet"
    if state == "held":
        return f"job {job['id']} is held: `labq release {job['id']}` lets it run"
    if state in FINISHED:
        code = f" (exit {job['exit_code']})" if job.get("exit_code") is not None else ""
        return f"job {job['id']} {state}{code}"
    if state == "preempting":
        return (f"job {job['id']} is checkpointing on {where} to make room for {room_for(job)}; "
                "then it waits in the queue to resume")
    if state == "starting" and job.get("waiting_there"):  # handed to a node's own scheduler, which holds it
        return f"job {job['id']} is starting on {where}, handed to {job['waiting_there']}"
    return f"job {job['id']} is {state} on {where}"


def _when(t: float | None, now: float) -> str:
    if not t:
        return "-"
    rel = f"{format_duration(now - t)} ago" if t <= now else f"in {format_duration(t - now)}"
    return f"{format_clock(t, now)} ({rel})"


def show_text(job: Mapping, pending: Mapping | None, now: float) -> str:
    """Everything about one job, one fact a line."""
    spec = job["spec"]
    want = [f"{spec.get('gpus', 1)} GPU(s)"]
    if spec.get("nodes", 1) > 1:
        want.append(f"over {spec['nodes']} nodes")
    if spec.get("min_gpu_memory_mib"):
        want.append(f"at least {format_mib(spec['min_gpu_memory_mib'])} each")
    if spec.get("share_mib"):
        want[0] = f"part of one GPU: {format_mib(spec['share_mib'])} of its memory, shared"
        if job.get("gpu_mem_peak_mib"):
            want.append(f"placed by the {format_mib(job['gpu_mem_peak_mib'])} it was seen using")
    if spec.get("gpu_model"):
        want.append(f"model {spec['gpu_model']}")
    if spec.get("cpus") is not None:
        want.append(f"{spec['cpus']:g} CPUs")
    if spec.get("memory_mib") is not None:
        want.append(f"{format_mib(spec['memory_mib'])} of memory")
    if spec.get("node"):
        want.append(f"only on {spec['node']}")
    prio = spec.get("priority", 200)
    policy = [f"{priority_name(prio)} ({prio})", "preemptible" if spec.get("preemptible", True) else "not preemptible",
              _contract(job),
              f"grace {format_duration(spec.get('grace_s', 60))}"]
    facts = [("user", spec.get("user")), ("command", " ".join(spec.get("command") or [])),
             ("runtime", spec.get("runtime", "process") + (f" {spec['image']}" if spec.get("image") else "")),
             ("workdir", spec.get("workdir") or "-"), ("wants", ", ".join(want)), ("priority", ", ".join(policy)),
             ("time limit", format_duration(spec["time_limit_s"]) if spec.get("time_limit_s") else "none"),
             ("submitted", _when(job.get("submitted_at"), now))]
    facts += [(k, _when(job[k + "_at"], now)) for k in ("started", "ended") if job.get(k + "_at")]
    if spec.get("time_limit_s") and job.get("started_at") and job["state"] not in FINISHED:
        facts.append(("stops at", _when(job["started_at"] + spec["time_limit_s"], now)))
    if job.get("exit_code") is not None:
        facts.append(("exit code", job["exit_code"]))
    if spec.get("queue"):
        facts.append(("queue", spec["queue"]))
    if spec.get("depends_on"):
        facts.append(("after jobs", ", ".join(map(str, spec["depends_on"]))))
    if spec.get("reservation"):
        after = spec.get("after_reservation", "queue")
        facts.append(("reservation", f"{spec['reservation']} (if it ends first: "
                                     f"{'cancel' if after == 'cancel' else 'queue normally'})"))
    if spec.get("notify") is not None:
        facts.append(("notify", ", ".join(spec["notify"]) or "none"))
    if job.get("note"):
        facts.append(("note", job["note"]))
    if job.get("preemptions"):
        lost = format_duration(job.get("work_lost_s") or 0)
        facts.append(("preemptions", f"{job['preemptions']} (work lost {lost})"))
    if job.get("last_checkpoint_at"):
        facts.append(("checkpoint", f"last reported {_when(job['last_checkpoint_at'], now)}"))
    if spec.get("requeue_on_timeout"):
        facts.append(("at the limit", "checkpoint and requeue"))
    if job["state"] == "preempting":
        facts.append(("preempting", f"checkpointing to make room for {room_for(job)}"))
    if job.get("stop_requested"):
        facts.append(("stopping", job["stop_requested"]))
    for a in (job.get("placement") or {}).get("allocations") or []:
        gpus = ", ".join(f"{i} {u}" for i, u in zip(a["gpu_indices"], a["gpu_uuids"]))
        facts.append(("placement", f"{a['node']}: GPU {gpus} (score {a.get('score', 0)})"))
        if host := _host_text(a):
            facts.append(("CPUs", host))
    if pending:
        facts.append(("pending", f"{pending['reason']}: {pending['detail']}"))
        if estimate := estimate_text(pending.get("estimated_start"), now):
            facts.append(("estimate", estimate))
    for key, value in sorted((spec.get("env") or {}).items()):
        facts.append(("env", f"{key}={value}"))
    title = f"job {job['id']}" + (f" ({spec['name']})" if spec.get("name") else "")
    title += f": {job['state']}, attempt {job.get('attempt', 1)}"
    lines = [escape_controls(line) for line in [title] + [f"  {k:<12}{v}" for k, v in facts]]
    if job.get("attempts"):
        lines += ["  attempts", *("    " + line for line in attempts_table(job, now).splitlines())]
    return "\n".join(lines)


def _host_text(a: Mapping) -> str:
    """``ws1: 0-11 (12 cores), 64 GiB of memory``: what an allocation holds besides GPUs, where the node said."""
    said = []
    if a.get("cpu_set"):
        far = f", {a['far_cpus']} away from its GPUs' NUMA node" if a.get("far_cpus") else ""
        cores = f"{a['cpus']:g} cores" if a.get("cpus") is not None else "cores"
        said.append(f"{a['cpu_set']} ({cores}{far})")
    elif a.get("cpus") is not None:
        said.append(f"{a['cpus']:g} cores")
    if a.get("memory_mib") is not None:
        said.append(f"{format_mib(a['memory_mib'])} of memory")
    return f"{a['node']}: {', '.join(said)}" if said else ""


def _contract(job: Mapping) -> str:
    """The job's checkpoint contract, as ``labq show`` says it."""
    from labq.models.job import SignalSource  # dataclasses: 10 ms that `labq ls` need not pay

    if job["spec"].get("checkpoint_signal"):
        return f"checkpoint signal {job['spec']['checkpoint_signal']}"
    if job.get("learned_signal") and job.get("learned_from") in {s.value for s in SignalSource}:
        return f"checkpoint signal {job['learned_signal']} ({SignalSource(job['learned_from']).words})"
    return "no checkpoint signal (a stop is TERM)"

def attempt_end_text(a: Mapping) -> str:
    """``preempted for job 9: checkpointed``, ``time limit: killed``, ``failed (exit 3)``."""
    ended, code = a["ended"], a.get("exit_code")
    words = {"preempted": "crashed in its grace", "timeout": "ended in its grace",
             "killed": "killed after its grace"}.get(ended, ended)
    if code not in (0, None) and ended not in ("checkpointed",):
        words += f" (exit {code})"
    if a.get("stop_reason") == "preempted":
        return f"preempted for {room_for(a)}: {words}"
    if a.get("stop_reason") == "timeout":
        return f"time limit: {words}"
    return words


def attempts_table(job: Mapping, now: float) -> str:
    """One row per attempt, the current one last: where, when, how long, how it ended, work lost."""
    rows = []
    for a in job.get("attempts") or []:
        ran = format_duration(a["ended_at"] - a["started_at"]) if a.get("started_at") else "-"
        lost = format_duration(a["work_lost_s"]) if a.get("work_lost_s") else "-"
        rows.append([a["attempt"], placement_text(a), format_clock(a["started_at"], now) if a.get("started_at")
                     else "-", ran, attempt_end_text(a), lost])
    if job["state"] not in FINISHED:
        started = job.get("started_at")
        rows.append([job.get("attempt", 1), placement_text(job), format_clock(started, now) if started else "-",
                     format_duration(now - started) if started else "-", job["state"], "-"])
    return table(("#", "NODE:GPUS", "STARTED", "RAN", "ENDED", "WORK LOST"), rows)
