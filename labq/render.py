"""Jobs, nodes and GPUs as text for people: tables, durations, sentences.

Pure functions of API dicts (``labq.protocol.codec`` shapes) and ``now``, so every
output is testable without a leader. Tables are plain aligned text, colored with
ANSI codes only on a terminal: no table library, so ``labq ls`` starts fast.

Names, commands, reasons and the rest come from users: every table cell and every
line goes out through ``escape_controls``, so no row splits and no escape sequence
reaches the terminal. Lines are escaped before they are joined, so the only line
breaks in the output are ours.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence

from labq.models.priority import priority_name
from labq.terminal_text import escape_controls

_COLORS = {"running": "32", "starting": "32", "queued": "33", "held": "35", "preempting": "35",
           "failed": "31", "timeout": "31", "cancelled": "2", "succeeded": "34",
           "up": "32", "draining": "33", "down": "2", "lost": "31"}
_FINISHED = frozenset({"succeeded", "failed", "cancelled", "timeout"})


def format_duration(seconds: float) -> str:
    """``45s``, ``12m``, ``1h05m``, ``3d04h``: short and exact enough for a table."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def format_clock(t: float, now: float) -> str:
    """``14:05`` today, ``Tue 14:05`` within a week, else ``2024-05-03 14:05``."""
    when, today = time.localtime(t), time.localtime(now)
    if when[:3] == today[:3]:
        return time.strftime("%H:%M", when)
    if abs(t - now) < 6 * 86400:
        return time.strftime("%a %H:%M", when)
    return time.strftime("%Y-%m-%d %H:%M", when)


def format_mib(mib: int | float | None) -> str:
    if not mib:
        return "-"
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib:g} MiB"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, color: bool = False,
          color_column: str | None = None, max_width: Mapping[str, int] | None = None) -> str:
    """Left-aligned columns two spaces apart; ``color`` paints ``color_column``'s state words.

    Every cell is escaped (``escape_controls``), then clipped to its ``max_width``."""
    limits = max_width or {}
    cells = [[_clip(escape_controls(v) if v is not None else "-", limits.get(h)) for h, v in zip(headers, row)]
             for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    painted = headers.index(color_column) if color and color_column in headers else -1
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for row in cells:
        parts = [v.ljust(w) for v, w in zip(row, widths)]
        if painted >= 0 and row[painted] in _COLORS:
            parts[painted] = f"\x1b[{_COLORS[row[painted]]}m{parts[painted]}\x1b[0m"
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _clip(text: str, limit: int | None) -> str:
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


# -- jobs -----------------------------------------------------------------------------------------

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
    if job.get("stop_requested") and state not in _FINISHED:
        return f"stopping: {job['stop_requested']}"
    if state == "preempting":
        return f"making room for {_room_for(job)}"
    if state in _FINISHED and job.get("exit_code") is not None:
        return f"exit {job['exit_code']}"
    if state == "queued" and job.get("preemptions"):
        return f"requeued after {job['preemptions']} preemption(s)"
    if state == "queued" and job["spec"].get("depends_on"):
        return "after " + ",".join(map(str, job["spec"]["depends_on"]))
    if state in _FINISHED and job.get("note"):
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
    if state in _FINISHED:
        code = f" (exit {job['exit_code']})" if job.get("exit_code") is not None else ""
        return f"job {job['id']} {state}{code}"
    if state == "preempting":
        return (f"job {job['id']} is checkpointing on {where} to make room for {_room_for(job)}; "
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
    if spec.get("time_limit_s") and job.get("started_at") and job["state"] not in _FINISHED:
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
        facts.append(("preempting", f"checkpointing to make room for {_room_for(job)}"))
    if job.get("stop_requested"):
        facts.append(("stopping", job["stop_requested"]))
    for a in (job.get("placement") or {}).get("allocations") or []:
        gpus = ", ".join(f"{i} {u}" for i, u in zip(a["gpu_indices"], a["gpu_uuids"]))
        facts.append(("placement", f"{a['node']}: GPU {gpus} (score {a.get('score', 0)})"))
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


def _contract(job: Mapping) -> str:
    """The job's checkpoint contract, as ``labq show`` says it."""
    from labq.models.job import SignalSource  # dataclasses: 10 ms that `labq ls` need not pay

    if job["spec"].get("checkpoint_signal"):
        return f"checkpoint signal {job['spec']['checkpoint_signal']}"
    if job.get("learned_signal") and job.get("learned_from") in {s.value for s in SignalSource}:
        return f"checkpoint signal {job['learned_signal']} ({SignalSource(job['learned_from']).words})"
    return "no checkpoint signal (a stop is TERM)"


def _room_for(job: Mapping) -> str:
    """``job 12`` or ``reservation paper``: what a preemption makes room for."""
    if job.get("drained_for"):
        return f"reservation {job['drained_for']}"
    return f"job {job.get('preempted_for') or '?'}"


def attempt_end_text(a: Mapping) -> str:
    """``preempted for job 9: checkpointed``, ``time limit: killed``, ``failed (exit 3)``."""
    ended, code = a["ended"], a.get("exit_code")
    words = {"preempted": "crashed in its grace", "timeout": "ended in its grace",
             "killed": "killed after its grace"}.get(ended, ended)
    if code not in (0, None) and ended not in ("checkpointed",):
        words += f" (exit {code})"
    if a.get("stop_reason") == "preempted":
        return f"preempted for {_room_for(a)}: {words}"
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
    if job["state"] not in _FINISHED:
        started = job.get("started_at")
        rows.append([job.get("attempt", 1), placement_text(job), format_clock(started, now) if started else "-",
                     format_duration(now - started) if started else "-", job["state"], "-"])
    return table(("#", "NODE:GPUS", "STARTED", "RAN", "ENDED", "WORK LOST"), rows)


# -- nodes and GPUs -------------------------------------------------------------------------------

def _in_use(node: Mapping) -> dict[int, int]:
    """``gpus_in_use`` with int keys: JSON object keys arrive as strings."""
    return {int(k): v for k, v in (node.get("gpus_in_use") or {}).items()}


def _shared(node: Mapping) -> dict[int, list[Mapping]]:
    """``gpus_shared`` with int keys: the jobs sharing each GPU by memory."""
    return {int(k): v for k, v in (node.get("gpus_shared") or {}).items()}


def models_text(gpus: Sequence[Mapping]) -> str:
    """``8x A100-SXM4-80GB`` or ``2x RTX 3090, 1x A6000``; the ``NVIDIA`` prefix says nothing."""
    counts: dict[str, int] = {}
    for g in gpus:
        model = g["model"].removeprefix("NVIDIA ")
        counts[model] = counts.get(model, 0) + 1
    return ", ".join(f"{n}x {m}" for m, n in counts.items()) or "-"


def topology_text(topology: Mapping | None) -> str:
    """``NVSwitch``, ``NVLink: 4 pairs``, or ``PCIe``: what a GPU set on this node can hope for."""
    if not topology:
        return "-"
    if any(topology.get("nvswitch_links") or ()):
        return "NVSwitch"
    links = topology.get("nvlinks") or []
    pairs = sum(1 for i, row in enumerate(links) for j, n in enumerate(row) if j > i and n)
    return f"NVLink: {pairs} pair{'s' * (pairs != 1)}" if pairs else "PCIe"


def nodes_table(nodes: Sequence[Mapping], now: float, color: bool = False) -> str:
    if not nodes:
        return "no nodes: start `labq agent` on a workstation (or `labq up`)"
    rows = []
    for n in nodes:
        busy = set(_in_use(n)) | set(_shared(n)) | set(n.get("unmanaged_busy") or ())
        seen = f"{format_duration(now - n['last_seen'])} ago" if n.get("last_seen") else "never"
        found = " ".join(x for x in (n.get("found"), n.get("address")) if x) or "-"
        free = f"{len(n['gpus']) - len(busy)}/{len(n['gpus'])}" if n["gpus"] else "-"
        rows.append([n["name"], n["health"], free, models_text(n["gpus"]), topology_text(n.get("topology")), seen,
                     found])
    text = table(("NODE", "HEALTH", "GPUS FREE", "MODEL", "TOPOLOGY", "LAST SEEN", "FOUND"), rows, color=color,
                 color_column="HEALTH")
    if any(n["health"] == "not admitted" for n in nodes):
        text += "\n(not admitted: they need this lab's join token, e.g. labq agent --join-token-file FILE)"
    return text


def queues_table(queues: Sequence[Mapping]) -> str:
    """``labq queues``: one line per queue, then each queue's members by fair share (served first first)."""
    if not queues:
        return "no queues: the lab is one queue for everyone ([queues] in the leader's settings makes teams)"
    rows = []
    for q in queues:
        asked = q.get("guarantee_asked")
        guarantee = f"{q['guarantee']}" + (f" ({asked})" if asked and asked.endswith("%") else "")
        flags = [w for w, on in (("default", q.get("default")), ("no lend", not q.get("lends", True) and q["name"]),
                                 ("no borrow", not q.get("borrows", True))) if on]
        if q.get("max_wait_s"):
            flags.append(f"max wait {format_duration(q['max_wait_s'])}")
        rows.append([q["name"] or "(no queue)", guarantee, "-" if q.get("cap") is None else str(q["cap"]),
                     str(q["use"]), str(q["borrowed"]), str(q["lent"]),
                     f"{q['waiting_jobs']} ({q['waiting_gpus']} GPUs)" if q["waiting_jobs"] else "0",
                     ", ".join(flags) or "-"])
    text = table(("QUEUE", "GUARANTEE", "CAP", "USE", "BORROWED", "LENT", "WAITING", "RULES"), rows)
    lines = [escape_controls(f"  {q['name'] or '(no queue)'}: " + ", ".join(
        f"{m['user']} {m['gpu_hours']:.1f} GPU-h" + (f", holds {m['holds']}" if m["holds"] else "")
        + (f", {m['waiting']} waiting" if m["waiting"] else "") for m in q["fair_share"]))
        for q in queues if q.get("fair_share")]
    if lines:
        text += "\n\nfair share within each queue (decayed GPU-hours; the least is served first):\n" + "\n".join(lines)
    return text


def gpu_rows(nodes: Sequence[Mapping], users: Mapping[int, str]) -> list[dict]:
    """One dict per GPU of every node, with the job on it and that job's user where known."""
    from labq.models.sharing import room_mib

    out = []
    for n in nodes:
        in_use, shared, unmanaged = _in_use(n), _shared(n), set(n.get("unmanaged_busy") or ())
        unmanaged_mib = {int(k): v for k, v in (n.get("unmanaged_mib") or {}).items()}
        for g in n["gpus"]:
            job = in_use.get(g["index"])
            usage = (n.get("gpu_usage") or {}).get(str(g["index"]), {})
            sharers = shared.get(g["index"], [])
            row = {"node": n["name"], "index": g["index"], "uuid": g["uuid"], "model": g["model"],
                   "memory_mib": g["memory_mib"], "job": job, "user": users.get(job) if job else None,
                   "busy_outside_labq": g["index"] in unmanaged and job is None,
                   "memory_free_mib": usage.get("memory_free_mib"),
                   "utilization_pct": usage.get("utilization_pct"),
                   "unmanaged_mib": unmanaged_mib.get(g["index"]), "sharing": sharers}
            if sharers or g["index"] in unmanaged_mib:  # what one more sharing job could declare there
                row["share_free_mib"] = max(0, room_mib(g["memory_mib"], sum(s["need_mib"] for s in sharers),
                                                        unmanaged_mib.get(g["index"], 0)))
            out.append(row)
    return out


def sharing_text(row: Mapping) -> str:
    """A shared GPU's jobs, each with its declared / measured memory, and what is left to declare:
    ``shared: job 12 (alice) 10G/8.1G, job 13 (bob) 6G/-; 52G left``."""
    from labq.models.sharing import mib_text

    jobs = [f"job {s['job_id']} ({s['user']}) {mib_text(s['need_mib'])}/"
            + ("-" if s.get("used_mib") is None else mib_text(s["used_mib"])) for s in row["sharing"]]
    if row.get("unmanaged_mib"):
        jobs.append(f"not labq {mib_text(row['unmanaged_mib'])}")
    return f"shared: {', '.join(jobs)}; {mib_text(row.get('share_free_mib') or 0)} left"


def gpus_table(rows: Sequence[Mapping]) -> str:
    if not rows:
        return "no GPUs: no node has registered yet"

    def using(r: Mapping) -> str:
        if r["job"] is not None:
            return f"job {r['job']}" + (f" ({r['user']})" if r["user"] else "")
        if r.get("sharing"):
            return sharing_text(r)
        return "busy (not labq)" if r["busy_outside_labq"] else "free"

    def measured(value, text) -> str:
        return "-" if value is None else text

    return table(("NODE", "IDX", "MODEL", "MEM", "FREE", "UTIL", "JOB/USER"),
                 [[r["node"], r["index"], r["model"].removeprefix("NVIDIA "), format_mib(r["memory_mib"]),
                   measured(r.get("memory_free_mib"), format_mib(r.get("memory_free_mib"))),
                   measured(r.get("utilization_pct"), f"{r.get('utilization_pct')}%"), using(r)]
                  for r in rows])


# -- reservations (times in the user's zone ``tz``) -----------------------------------------------

def answer_text(answer: Mapping, now: float, tz) -> str:
    """What a booking's answer says: booked (or would book) where, whom it displaces; or why not and what works."""
    return "\n".join(escape_controls(line) for line in _answer_lines(answer, now, tz))


def _answer_lines(answer: Mapping, now: float, tz) -> list[str]:
    from labq.when import format_when

    if answer["accepted"]:
        r = answer["reservation"]
        verb = "booked" if answer["booked"] else "would book (dry run)"
        lines = [f"{verb} {r['name']}: {r['gpus']} GPU(s) on {r['node']} (GPUs "
                 f"{','.join(map(str, r['gpu_indices']))}, topology score {r['score']}), "
                 f"{format_when(r['start'], now, tz)} to {format_when(r['end'], now, tz)}"]
        if answer["displaced"]:
            lines.append("  jobs asked to checkpoint and requeued before it starts:")
            for d in answer["displaced"]:
                line = f"    job {d['job_id']} ({d['user']}) at {format_when(d['signal_at'], now, tz)}"
                if "gpu_seconds_lost" in d:  # an older leader sends no cost
                    minutes = d["gpu_seconds_lost"] / 60
                    lost = f"{minutes / 60:.1f} GPU-h" if minutes >= 120 else f"{minutes:.0f} GPU-min"
                    line += f": {d['gpus']} GPU{'' if d['gpus'] == 1 else 's'}, about {lost} lost"
                lines.append(line)
        if answer["booked"]:
            lines.append(f"  run jobs in it with: labq submit --reservation {r['name']} ...")
        return lines
    lines = ["cannot book it: " + "; ".join(answer["reasons"])]
    if answer["alternatives"]:
        lines.append("  what would work:")
        for a in answer["alternatives"]:
            hours = (a["end"] - a["start"]) / 3600
            lines.append(f"    {a['gpus']} GPU(s) on {a['node']} (score {a['score']}), "
                         f"{format_when(a['start'], now, tz)} to {format_when(a['end'], now, tz)}: "
                         f"labq reserve --gpus {a['gpus']} --start \"{_iso(a['start'], tz)}\" --for {hours:g}h")
    return lines


def notify_status_table(channels: Sequence[Mapping], now: float) -> str:
    """The notification channels for admins: where each sends, what waits, and its last success and error."""
    rows = []
    for c in channels:
        health = "FAILING" if c.get("failing") else ("not configured" if not c.get("configured") else "ok")
        error = c.get("last_error")
        if error and c.get("last_error_at"):
            error = f"{_ago(c['last_error_at'], now)}: {error}"
        rows.append([c["channel"], health, c.get("target"), c.get("queued", 0), _ago(c.get("oldest_queued_at"), now),
                     _ago(c.get("last_success_at"), now), c.get("given_up", 0), error])
    text = table(("CHANNEL", "HEALTH", "TARGET", "QUEUED", "OLDEST", "LAST SUCCESS", "GAVE UP", "LAST ERROR"), rows,
                 max_width={"LAST ERROR": 100})
    gone = [(c["channel"], c["last_given_up"]) for c in channels if c.get("last_given_up")]
    for channel, g in gone:
        text += escape_controls(f"\n{channel}: last given up {_ago(g.get('at'), now)}: {g.get('key')} for "
                                f"{g.get('user')} after {g.get('tries', '?')} tries: {g.get('error')}")
    return text


def _ago(t: float | None, now: float) -> str | None:
    return None if t is None else f"{format_duration(now - t)} ago"


def reservations_table(reservations: Sequence[Mapping], now: float, tz) -> str:
    from labq.when import format_when

    if not reservations:
        return "no reservations"
    rows = []
    for r in reservations:
        if r.get("cancelled_at") is not None:
            state = "cancelled"
        else:
            state = "active" if r["start"] <= now < r["end"] else ("ended" if r["end"] <= now else "upcoming")
        users = ",".join(sorted({r["owner"], *r.get("users", ())}))
        if r.get("group"):
            users = f"group {r['group']}"
        rows.append([r["name"], r["owner"], r["gpus"], f"{r['node']}:{','.join(map(str, r['gpu_indices']))}",
                     format_when(r["start"], now, tz), format_when(r["end"], now, tz), state, users,
                     r.get("note") or ""])
    return table(("NAME", "OWNER", "GPUS", "NODE:GPUS", "START", "END", "STATE", "USERS", "NOTE"), rows)


def _iso(t: float, tz) -> str:
    from datetime import datetime

    from labq.when import time_zone

    return datetime.fromtimestamp(t, time_zone(tz)).strftime("%Y-%m-%d %H:%M")


def deadline_text(answer: Mapping, now: float, tz) -> str:
    """For a booking by need: the earliest and the latest window that end by the deadline, and how to pick."""
    from labq.when import format_when

    windows = answer["deadline"]
    earliest, latest = windows.get("earliest"), windows.get("latest")
    if earliest is None:
        return "  nothing of that size ends by the deadline"
    lines = [f"  earliest start {format_when(earliest['start'], now, tz)} (ends {format_when(earliest['end'], now, tz)})",
             f"  latest start   {format_when(latest['start'], now, tz)} (ends {format_when(latest['end'], now, tz)})"]
    r = answer.get("reservation") or {}
    if answer.get("accepted") and latest["start"] != earliest["start"]:
        other = "latest" if r.get("start") == earliest["start"] else "earliest"
        lines.append(f"  --start {other} books the {other} window instead; a --start between them works too")
    return "\n".join(escape_controls(line) for line in lines)
