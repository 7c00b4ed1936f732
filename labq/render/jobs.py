"""Jobs in a table: ``labq ls``'s rows, the waiting tasks of an array folded into one, and an array's tasks."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence

from labq.models.priority import priority_name
from labq.render.tables import format_duration, table
from labq.terminal_text import escape_controls

FINISHED = frozenset({"succeeded", "failed", "cancelled", "timeout"})
JOB_HEADERS = ("ID", "NAME", "USER", "STATE", "CLASS", "GPUS", "NODE:GPUS", "AGE/RUNTIME", "REASON")
JOB_WIDTHS = {"NAME": 24, "NODE:GPUS": 24, "REASON": 40}


def placement_text(job: Mapping) -> str:
    """``ws1:0,1`` per node the job holds, or ``-``."""
    allocations = (job.get("placement") or {}).get("allocations") or []
    return " ".join(f"{a['node']}:{','.join(map(str, a['gpu_indices']))}" for a in allocations) or "-"


def job_name(job: Mapping) -> str:
    spec = job["spec"]
    return spec.get("name") or " ".join(spec.get("command") or [])


def age_or_runtime(job: Mapping, now: float) -> str:
    """How long it has waited (queued, held) or run (running, finished)."""
    if job.get("started_at") and job["state"] not in ("queued", "held"):
        return format_duration((job.get("ended_at") or now) - job["started_at"])
    return format_duration(now - job["submitted_at"])


def job_note(job: Mapping) -> str:
    """What ``ls`` can say about a job from the job alone (the pending reason needs ``labq why``)."""
    state = job["state"]
    if job.get("stop_requested") and state not in FINISHED:
        return f"stopping: {job['stop_requested']}"
    if state == "preempting":
        return f"making room for {room_for(job)}"
    if state in FINISHED and job.get("exit_code") is not None:
        return f"exit {job['exit_code']}"
    if state == "queued" and job.get("preemptions"):
        return f"requeued after {job['preemptions']} preemption(s)"
    if state == "queued" and job["spec"].get("depends_on"):
        return "after " + ",".join(map(str, job["spec"]["depends_on"]))
    if state in FINISHED and job.get("note"):
        return job["note"]  # e.g. why labq cancelled it
    return ""


def reason_text(job: Mapping, pending: Mapping | None, now: float) -> str:
    """The REASON column: why a waiting job waits (the scheduler's reason, and when it should start), else
    ``job_note``."""
    if not pending:
        return job_note(job)
    estimate = pending.get("estimated_start")
    when = f" (est. {format_duration(max(0, estimate - now))})" if estimate else ""
    return f"{pending['reason']}{when}: {pending['detail']}"


def job_ref(job: Mapping) -> str:
    """How people name a job: ``12``, or ``12.3`` for task 3 of array 12."""
    array = job["spec"].get("array")
    return f"{array['id']}.{array['index']}" if array else str(job["id"])


def job_row(job: Mapping, now: float, pending: Mapping | None = None) -> list[object]:
    spec = job["spec"]
    return [job_ref(job), job_name(job), spec.get("user"), job["state"], priority_name(spec.get("priority", 200)),
            spec.get("gpus", 1), placement_text(job), age_or_runtime(job, now), reason_text(job, pending, now)]


def jobs_table(jobs: Sequence[Mapping], now: float, color: bool = False,
               pending: Mapping[int, Mapping] | None = None, expand: bool = False) -> str:
    """``labq ls``: one row a job; ``pending`` (job id -> PENDING) fills the REASON of the jobs that wait. The
    waiting tasks of an array that wait alike (one state, one reason) are one row, ``12.[2-5]``, as Slurm's squeue
    folds them; tasks on GPUs and finished ones have a row each. ``expand``: every task its own row."""
    if not jobs:
        return "no jobs"
    waits = pending or {}
    rows = [job_row(j, now, waits.get(j["id"])) for j in jobs] if expand else _folded_rows(jobs, now, waits)
    return table(JOB_HEADERS, rows, color=color, color_column="STATE", max_width=JOB_WIDTHS)


def _folded_rows(jobs: Sequence[Mapping], now: float, waits: Mapping[int, Mapping]) -> list[list[object]]:
    rows = [(job, job_row(job, now, waits.get(job["id"]))) for job in jobs]
    shown, folded = fold_alike(rows, lambda pair: wait_alike(pair[0]["spec"].get("array"), pair[0]["state"],
                                                             pair[1][-1]))
    for members in folded:  # the first row stands for them all: 12.[2-5]
        arrays = [job["spec"]["array"] for job, _ in members]
        members[0][1][0] = f"{arrays[0]['id']}.[{index_ranges([a['index'] for a in arrays])}]"
    return [row for _, row in shown]


def wait_alike(array: Mapping | None, state: str, reason: str) -> tuple | None:
    """What an array's task that waits shares with the tasks folded with it: its array, its state and its reason;
    None for a job of its own, or a task past waiting (each has a row)."""
    return None if array is None or state not in ("queued", "held") else (array["id"], state, reason)


def fold_alike(items: Sequence, key: Callable[[object], Hashable | None]) -> tuple[list, list[list]]:
    """``items`` with those of one ``key`` (not None) standing as one, at the first of them (``labq ls`` and the
    TUI fold an array's tasks that wait alike): the items to show, and each group of several, its first first."""
    shown, groups = [], {}
    for item in items:
        k = key(item)
        if k is None:
            shown.append(item)
            continue
        members = groups.setdefault(k, [])
        if not members:
            shown.append(item)
        members.append(item)
    return shown, [members for members in groups.values() if len(members) > 1]


def index_ranges(indices: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 7, 9, 10]`` -> ``0-3,7,9-10``."""
    parts, ordered = [], sorted(indices)
    start = prev = ordered[0]
    for i in ordered[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def array_text(array: Mapping, now: float, color: bool = False) -> str:
    """``labq show 12`` for an array: who, its cap, its tasks by state, and a row for each task."""
    head = f"array {array['id']} of {array['user']}: {_counts_text(array)}"
    if array.get("cap"):
        head += f"; at most {array['cap']} on GPUs at once"
    pending = {int(i): p for i, p in array.get("pending", {}).items()}
    return escape_controls(head) + "\n" + jobs_table(array["tasks"], now, color, pending, expand=True)


def array_why_text(array: Mapping, now: float) -> str:
    """``labq why 12`` for an array: how many of its tasks wait, for each reason, and how many are past waiting."""
    reasons: dict[str, int] = {}
    for p in array.get("pending", {}).values():
        line = f"{p['reason']}: {p['detail']}"
        reasons[line] = reasons.get(line, 0) + 1
    lines = [f"array {array['id']}: {_counts_text(array)}"]
    lines += [f"  {n} wait{'s' if n == 1 else ''}: {line}" for line, n in sorted(reasons.items(), key=lambda r: -r[1])]
    if not reasons and array["counts"].keys() & {"queued"}:
        lines.append("  the scheduler has not looked at its waiting tasks yet")
    return "\n".join(escape_controls(line) for line in lines)


def _counts_text(array: Mapping) -> str:
    total = sum(array["counts"].values())
    return f"{total} task{'s' if total != 1 else ''}, " + ", ".join(f"{n} {s}" for s, n in array["counts"].items())


def room_for(job: Mapping) -> str:
    """``job 12`` or ``reservation paper``: what a preemption makes room for."""
    if job.get("drained_for"):
        return f"reservation {job['drained_for']}"
    return f"job {job.get('preempted_for') or '?'}"
