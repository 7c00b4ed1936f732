"""Jobs, nodes, GPUs and reservations as text for people: tables, durations, sentences.

Pure functions of API dicts (``labq.protocol.codec`` shapes) and ``now``, so every
output is testable without a leader. Tables are plain aligned text, colored with
ANSI codes only on a terminal: no table library, so ``labq ls`` starts fast.

Names, commands, reasons and the rest come from users: every table cell and every
line goes out through ``escape_controls``, so no row splits and no escape sequence
reaches the terminal. Lines are escaped before they are joined, so the only line
breaks in the output are ours.

One module an idea: ``tables`` (aligned columns, durations, clock times, sizes), ``jobs``
(``labq ls``'s rows, arrays), ``job_detail`` (why, show, attempts), ``nodes`` (nodes, GPUs,
queues), ``reservations`` and ``notify``. The names below load their module on first use,
so that ``labq ls`` pays only for the job table.
"""

from __future__ import annotations

_WHERE = {
    "format_clock": "tables", "format_duration": "tables", "format_mib": "tables", "table": "tables",
    "JOB_HEADERS": "jobs", "JOB_WIDTHS": "jobs", "age_or_runtime": "jobs", "array_text": "jobs",
    "array_why_text": "jobs", "fold_alike": "jobs", "index_ranges": "jobs", "job_name": "jobs", "job_note": "jobs",
    "job_ref": "jobs", "job_row": "jobs", "jobs_table": "jobs", "placement_text": "jobs", "reason_text": "jobs",
    "wait_alike": "jobs",
    "attempt_end_text": "job_detail", "attempts_table": "job_detail", "estimate_text": "job_detail",
    "show_text": "job_detail", "why_text": "job_detail",
    "gpu_rows": "nodes", "gpus_table": "nodes", "models_text": "nodes", "nodes_table": "nodes",
    "queues_table": "nodes", "sharing_text": "nodes", "topology_text": "nodes",
    "answer_text": "reservations", "deadline_text": "reservations", "reservations_table": "reservations",
    "notify_status_table": "notify",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'labq.render' has no attribute {name!r}")
    # ``__import__`` with a from-list gives the submodule, as ``importlib.import_module`` would (not loaded: CLI start)
    value = getattr(__import__(f"labq.render.{_WHERE[name]}", fromlist=[name]), name)
    globals()[name] = value
    return value


TYPE_CHECKING = False  # typing's, without importing typing: the CLI's start (type checkers take it as true)
if TYPE_CHECKING:  # the same names, for type checkers  # noqa: F401 below: re-exports
    from labq.render.job_detail import (  # noqa: F401
        attempt_end_text, attempts_table, estimate_text, show_text, why_text,
    )
    from labq.render.jobs import (  # noqa: F401
        JOB_HEADERS, JOB_WIDTHS, age_or_runtime, array_text, array_why_text, fold_alike, index_ranges,
        job_name, job_note, job_ref, job_row, jobs_table, placement_text, reason_text, wait_alike,
    )
    from labq.render.nodes import (  # noqa: F401
        gpu_rows, gpus_table, models_text, nodes_table, queues_table, sharing_text, topology_text,
    )
    from labq.render.notify import notify_status_table  # noqa: F401
    from labq.render.reservations import answer_text, deadline_text, reservations_table  # noqa: F401
    from labq.render.tables import format_clock, format_duration, format_mib, table  # noqa: F401
