"""The lab's GPUs: the nodes, each GPU and who uses it (whole or shared by memory), and the queues that share
them out among teams."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from labq.render.tables import format_duration, format_mib, table
from labq.terminal_text import escape_controls


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
