"""How a policy did on a workload: queueing delay, job completion time, utilization, preemptions.

``make_report`` turns a ``SimResult`` into a ``Report`` of plain figures; ``report_json`` and
``report_table`` show one report, ``compare_table`` puts several policies side by side. All of it
is pure: nothing here reads or writes files, and rich is imported only by the table functions, so
``labq sim --json`` never loads it.

Which jobs count where:

- *submitted* jobs are the simulated ones plus the skipped ones (jobs that can never fit);
  ``finished + unfinished + skipped == jobs``.
- queueing delay is first start − submit, over the jobs that started;
- job completion time (JCT) is end − submit, over the jobs that finished;
- makespan runs from the first submit to the last finish, over simulated jobs;
- the per-class and per-user breakdowns count simulated jobs only (skipped ones are in the summary).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from labq.models.priority import priority_name
from labq.render.tables import format_duration
from labq.sim.model import JobOutcome, SimResult

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, Group
    from rich.table import Table
    from rich.text import Text

TOP_USERS = 15  #: users shown in the per-user table; Philly has up to 15 virtual clusters as users


@dataclass(frozen=True)
class Stats:
    """A distribution of durations in seconds; all zeros when there were no values."""

    count: int = 0
    mean: float = 0.0
    p50: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    max: float = 0.0


def percentile(ordered: Sequence[float], p: int) -> float:
    """The nearest-rank ``p``-th percentile of sorted values: the smallest value with at least
    ``p`` % of the values at or below it, so it is always one of the values (p95 of 1..100 is 95)."""
    rank = max(1, -(-p * len(ordered) // 100))  # ceil(p/100 * n) in integers: no rounding surprises
    return float(ordered[rank - 1])


def stats(values: Iterable[float]) -> Stats:
    """Count, mean, p50/p95/p99 (nearest rank) and max; ``Stats()`` (all zeros) for no values,
    so a policy that started nothing still has a row in every table."""
    ordered = sorted(values)
    if not ordered:
        return Stats()
    return Stats(count=len(ordered), mean=math.fsum(ordered) / len(ordered),
                 p50=percentile(ordered, 50), p95=percentile(ordered, 95), p99=percentile(ordered, 99),
                 max=float(ordered[-1]))


@dataclass(frozen=True)
class Breakdown:
    """The figures for one priority class or one user."""

    jobs: int
    finished: int
    queueing_delay: Stats  #: first start − submit, over started jobs
    jct: Stats  #: end − submit, over finished jobs
    preemptions: int
    gpu_hours_lost: float


@dataclass(frozen=True)
class Report:
    policy: str
    cluster: str
    gpus: int
    jobs: int  #: submitted: simulated plus skipped
    finished: int
    unfinished: int  #: simulated but not finished when the simulation stopped
    skipped: int  #: can never fit the cluster
    skipped_reasons: dict[str, int]  #: why -> how many, most common first
    queueing_delay: Stats  #: in seconds: first start − submit, over started jobs
    jct: Stats  #: job completion time in seconds: end − submit, over finished jobs
    makespan_s: float  #: last finish − first submit; 0 if nothing finished
    utilization: float  #: busy GPU-seconds / (GPUs × makespan), 0..1
    preemptions: int
    gpu_hours_lost: float  #: work redone because of preemptions
    by_class: dict[str, Breakdown]  #: priority class name -> figures, highest class first
    by_user: dict[str, Breakdown]  #: user -> figures, most jobs first
    #: queue -> figures, with its share of the GPU-hours used; empty in a lab without queues
    by_queue: dict[str, Breakdown] = field(default_factory=dict)
    gpu_hours_by_queue: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    passes: int = 0
    meta: dict = field(default_factory=dict)


def _delays(outcomes: Iterable[JobOutcome]) -> list[float]:
    return [o.start - o.job.submit for o in outcomes if o.start is not None]


def _jcts(outcomes: Iterable[JobOutcome]) -> list[float]:
    return [o.end - o.job.submit for o in outcomes if o.end is not None]


def _breakdown(outcomes: Sequence[JobOutcome]) -> Breakdown:
    return Breakdown(jobs=len(outcomes), finished=sum(o.end is not None for o in outcomes),
                     queueing_delay=stats(_delays(outcomes)), jct=stats(_jcts(outcomes)),
                     preemptions=sum(o.preemptions for o in outcomes),
                     gpu_hours_lost=math.fsum(o.lost_gpu_s for o in outcomes) / 3600)


def _by_class(outcomes: Sequence[JobOutcome]) -> dict[str, Breakdown]:
    """Grouped by class name (250 is its own "250"), ordered by priority, highest first."""
    groups: dict[int, list[JobOutcome]] = defaultdict(list)
    for o in outcomes:
        groups[o.job.priority].append(o)
    by_name: dict[str, list[JobOutcome]] = {}
    for priority in sorted(groups, reverse=True):
        by_name.setdefault(priority_name(priority), []).extend(groups[priority])
    return {name: _breakdown(group) for name, group in by_name.items()}


def _by_user(outcomes: Sequence[JobOutcome]) -> dict[str, Breakdown]:
    """Grouped by user, the busiest first (then by name, so the order is stable)."""
    groups: dict[str, list[JobOutcome]] = defaultdict(list)
    for o in outcomes:
        groups[o.job.user].append(o)
    order = sorted(groups, key=lambda user: (-len(groups[user]), user))
    return {user: _breakdown(groups[user]) for user in order}


def _by_queue(outcomes: Sequence[JobOutcome]) -> dict[str, Breakdown]:
    groups: dict[str, list[JobOutcome]] = defaultdict(list)
    for o in outcomes:
        if o.job.queue is not None:
            groups[o.job.queue].append(o)
    return {q: _breakdown(groups[q]) for q in sorted(groups)}


def _gpu_hours_by_queue(result: SimResult) -> dict[str, float]:
    queue = {o.job.id: o.job.queue for o in result.outcomes}
    hours: dict[str, float] = defaultdict(float)
    for job_id, start, end, gpus in result.runs:
        if queue.get(job_id) is not None:
            hours[queue[job_id]] += gpus * (end - start) / 3600
    return {q: round(h, 3) for q, h in sorted(hours.items())}


def _makespan(outcomes: Sequence[JobOutcome]) -> float:
    ends = [o.end for o in outcomes if o.end is not None]
    if not ends:
        return 0.0
    return max(ends) - min(o.job.submit for o in outcomes)


def make_report(result: SimResult) -> Report:
    """The figures of one simulation. A job both skipped and in the outcomes counts as skipped."""
    skipped_ids = {job.id for job, _ in result.skipped}
    outcomes = [o for o in result.outcomes if o.job.id not in skipped_ids]
    finished = sum(o.end is not None for o in outcomes)
    makespan = _makespan(outcomes)
    capacity = result.gpus * makespan
    reasons = Counter(reason for _, reason in result.skipped)
    return Report(
        policy=result.policy, cluster=result.cluster, gpus=result.gpus,
        jobs=len(outcomes) + len(result.skipped), finished=finished, unfinished=len(outcomes) - finished,
        skipped=len(result.skipped),
        skipped_reasons=dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        queueing_delay=stats(_delays(outcomes)), jct=stats(_jcts(outcomes)), makespan_s=makespan,
        # busy_gpu_s also counts jobs still running after the last finish, hence the clamp
        utilization=min(1.0, result.busy_gpu_s / capacity) if capacity > 0 else 0.0,
        preemptions=sum(o.preemptions for o in outcomes),
        gpu_hours_lost=math.fsum(o.lost_gpu_s for o in outcomes) / 3600,
        by_class=_by_class(outcomes), by_user=_by_user(outcomes), by_queue=_by_queue(outcomes),
        gpu_hours_by_queue=_gpu_hours_by_queue(result),
        wall_s=result.wall_s, passes=result.passes, meta=dict(result.meta),
    )


# --- JSON -----------------------------------------------------------------------------------------

def _seconds(value: float) -> float:
    """Milliseconds are plenty on a virtual clock and keep the JSON diffable."""
    return round(float(value), 3)


def _stats_json(s: Stats) -> dict[str, Any]:
    return {"count": s.count, "mean": _seconds(s.mean), "p50": _seconds(s.p50), "p95": _seconds(s.p95),
            "p99": _seconds(s.p99), "max": _seconds(s.max)}


def _breakdown_json(b: Breakdown) -> dict[str, Any]:
    return {"jobs": b.jobs, "finished": b.finished, "queueing_delay": _stats_json(b.queueing_delay),
            "jct": _stats_json(b.jct), "preemptions": b.preemptions, "gpu_hours_lost": round(b.gpu_hours_lost, 3)}


def _plain(value: Any) -> Any:
    """``meta`` as JSON: tuples become lists, keys strings, anything else unknown its ``str``."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def report_json(report: Report) -> dict[str, Any]:
    """The report as plain JSON types; keys are the ``Report`` field names, durations in seconds."""
    return {
        "policy": report.policy, "cluster": report.cluster, "gpus": report.gpus,
        "jobs": report.jobs, "finished": report.finished, "unfinished": report.unfinished,
        "skipped": report.skipped, "skipped_reasons": dict(report.skipped_reasons),
        "queueing_delay": _stats_json(report.queueing_delay), "jct": _stats_json(report.jct),
        "makespan_s": _seconds(report.makespan_s), "utilization": round(report.utilization, 4),
        "preemptions": report.preemptions, "gpu_hours_lost": round(report.gpu_hours_lost, 3),
        "by_class": {name: _breakdown_json(b) for name, b in report.by_class.items()},
        "by_user": {name: _breakdown_json(b) for name, b in report.by_user.items()},
        **({"by_queue": {name: {**_breakdown_json(b), "gpu_hours": report.gpu_hours_by_queue.get(name, 0.0)}
                         for name, b in report.by_queue.items()}} if report.by_queue else {}),
        "wall_s": _seconds(report.wall_s), "passes": report.passes, "meta": _plain(report.meta),
    }


# --- tables ---------------------------------------------------------------------------------------

def _wall(seconds: float) -> str:
    """Wall time is often under a second, where ``format_duration`` would say ``0s``."""
    return f"{seconds:.2f}s" if seconds < 60 else format_duration(seconds)


def format_mean(seconds: float) -> str:
    """A mean: to the second under ten minutes (``format_duration`` says ``2m`` for 2 min 59 s), else as any
    duration."""
    return f"{seconds:.0f}s" if seconds < 600 else format_duration(seconds)


def _percent(fraction: float) -> str:
    return f"{fraction * 100:.1f}%"


def _spread(s: Stats) -> str:
    if not s.count:
        return "-"
    return (f"p50 {format_duration(s.p50)} · p95 {format_duration(s.p95)} · "
            f"p99 {format_duration(s.p99)} · mean {format_mean(s.mean)}")


def _skipped_text(report: Report, shown: int = 3) -> str:
    reasons = list(report.skipped_reasons.items())
    parts = [f"{reason}: {count:,}" for reason, count in reasons[:shown]]
    if len(reasons) > shown:
        parts.append(f"{len(reasons) - shown} more reasons")
    return f"{report.skipped:,}" + (f" ({'; '.join(parts)})" if parts else "")


@dataclass
class FittedTable:
    """A rich table that, on a console too narrow for all its columns, leaves out the least important
    ones and says which, rather than cutting every figure short with "…"."""

    title: str
    headers: list[str]  #: the first names the rows and is always shown; "\n" makes two-line headers
    rows: list[list[Text]]
    importance: list[int]  #: the other columns' indices, the one to keep longest first
    caption: str = ""

    def __rich_console__(self, console: Console, options: ConsoleOptions):
        yield self.table(options.max_width)

    def widths(self) -> list[int]:
        return [max([len(line) for line in header.split("\n")] + [row[i].cell_len for row in self.rows])
                for i, header in enumerate(self.headers)]

    def table(self, width: int) -> Table:
        """All the columns that fit in ``width`` characters, in their own order."""
        from rich.table import Table
        from rich.text import Text

        widths = self.widths()
        kept, used = [0], widths[0] + 4  # a column takes its padding and a rule: 3 more; the table's edge 1
        for i in self.importance:
            if used + widths[i] + 3 <= width:
                kept.append(i)
                used += widths[i] + 3
        kept.sort()
        notes = [self.caption] if self.caption else []
        if len(kept) < len(self.headers):
            left_out = [self.headers[i].replace("-\n", "").replace("\n", " ")
                        for i in range(len(self.headers)) if i not in kept]
            notes.append(f"left out to fit {width} characters: {', '.join(left_out)}")
        table = Table(title=Text(self.title, style="bold"), title_justify="left",
                      caption=Text("\n".join(notes)) if notes else None, caption_justify="left")
        for i in kept:
            table.add_column(self.headers[i], justify="left" if i == 0 else "right")
        for row in self.rows:
            table.add_row(*(row[i] for i in kept))
        return table


def summary_table(report: Report, *, title: str | None = None) -> Table:
    """One figure a row: what the lab would ask first about a policy."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(title or f"{report.policy} on {report.cluster} ({report.gpus} GPUs)", style="bold"),
                  show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("Jobs", f"{report.jobs:,}"),
        ("Finished", f"{report.finished:,}"),
        ("Unfinished", f"{report.unfinished:,}"),
        ("Skipped", _skipped_text(report)),
        ("Queueing delay", _spread(report.queueing_delay)),
        ("Job completion time", _spread(report.jct)),
        ("Makespan", format_duration(report.makespan_s)),
        ("Utilization", _percent(report.utilization)),
        ("Preemptions", f"{report.preemptions:,}"),
        ("GPU-hours lost", f"{report.gpu_hours_lost:,.1f}"),
        ("Wall time", f"{_wall(report.wall_s)} ({report.passes:,} scheduling passes)"),
    ]
    for name, value in rows:
        table.add_row(name, Text(value))  # Text: a skip reason may hold brackets, which are not markup
    return table


def breakdown_table(breakdowns: dict[str, Breakdown], *, what: str, top: int | None = None) -> FittedTable:
    """Per class or per user; with ``top``, only the first ``top`` rows and a caption for the rest."""
    from rich.text import Text

    shown = list(breakdowns.items())[:top] if top is not None else list(breakdowns.items())
    more = len(breakdowns) - len(shown)
    rows = [[Text(name), Text(f"{b.jobs:,}"), Text(f"{b.finished:,}"),
             *_durations(b.queueing_delay), *_durations(b.jct),
             Text(f"{b.preemptions:,}"), Text(f"{b.gpu_hours_lost:,.1f}")] for name, b in shown]
    return FittedTable(title=f"By {what}", rows=rows,
                       headers=[what, "jobs", "done", "delay\np50", "delay\np95", "delay\nmean",
                                "JCT\np50", "JCT\np95", "JCT\nmean", "pre-\nempted", "GPU-h\nlost"],
                       importance=[1, 2, 3, 4, 6, 7, 9, 10, 5, 8],
                       caption=f"and {more:,} more {_plural(what)}" if more > 0 else "")


def _plural(word: str) -> str:
    return word + ("es" if word.endswith("s") else "s")


def _durations(s: Stats) -> list[Text]:
    from rich.text import Text

    if not s.count:
        return [Text("-")] * 3
    return [Text(format_duration(s.p50)), Text(format_duration(s.p95)), Text(format_mean(s.mean))]


def report_table(report: Report, *, title: str | None = None) -> Group:
    """The summary, then per class and per user (the top ``TOP_USERS`` by jobs), for a console."""
    from rich.console import Group

    parts = [summary_table(report, title=title), breakdown_table(report.by_class, what="class")]
    if report.by_queue:
        parts.append(breakdown_table(report.by_queue, what="queue"))
    parts.append(breakdown_table(report.by_user, what="user", top=TOP_USERS))
    return Group(*parts)


@dataclass(frozen=True)
class _Column:
    header: str
    value: Callable[[Report], float]
    show: Callable[[float], str]
    better: str = "low"  #: "low" or "high": which end is marked best; "" marks none


_COMPARED = (
    _Column("jobs\ndone", lambda r: r.finished, lambda v: f"{int(v):,}", "high"),
    _Column("delay\np50", lambda r: r.queueing_delay.p50, format_duration),
    _Column("delay\np95", lambda r: r.queueing_delay.p95, format_duration),
    _Column("delay\nmean", lambda r: r.queueing_delay.mean, format_mean),
    _Column("JCT\np50", lambda r: r.jct.p50, format_duration),
    _Column("JCT\np95", lambda r: r.jct.p95, format_duration),
    _Column("JCT\nmean", lambda r: r.jct.mean, format_mean),
    _Column("make-\nspan", lambda r: r.makespan_s, format_duration),
    _Column("util.", lambda r: r.utilization, _percent, "high"),
    _Column("pre-\nempted", lambda r: r.preemptions, lambda v: f"{int(v):,}"),
    _Column("GPU-h\nlost", lambda r: r.gpu_hours_lost, lambda v: f"{v:,.1f}"),
    _Column("wall", lambda r: r.wall_s, _wall, ""),
)
_COMPARED_IMPORTANCE = [2, 3, 5, 6, 9, 10, 11, 1, 8, 4, 7, 12]  #: columns in the order a narrow console keeps them


def compare_table(reports: Sequence[Report], *, title: str | None = None) -> FittedTable:
    """One row per policy on the same workload; the best figure of each column is bold green."""
    from rich.text import Text

    best = [_best(c, reports) for c in _COMPARED]
    rows = []
    for r in reports:
        values = [c.value(r) for c in _COMPARED]
        rows.append([Text(r.policy, style="bold")] + [
            Text(c.show(v), style="bold green" if len(reports) > 1 and v == b else "")
            for c, v, b in zip(_COMPARED, values, best)])
    caption = ""
    if len({r.jobs for r in reports}) > 1:
        caption = "the policies saw different numbers of jobs: " + ", ".join(f"{r.policy} {r.jobs:,}" for r in reports)
    return FittedTable(title=title or "Policies compared", headers=["policy", *(c.header for c in _COMPARED)],
                       rows=rows, importance=_COMPARED_IMPORTANCE, caption=caption)


def _best(column: _Column, reports: Sequence[Report]) -> float | None:
    values = [column.value(r) for r in reports]
    if not values or not column.better:
        return None
    return max(values) if column.better == "high" else min(values)
