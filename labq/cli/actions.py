"""The people's actions on jobs: cancel, hold, release, prio.

One request per job; each job's answer is printed on its line, escaped. The exit status is the
common one of the failures (``labq.cli.errors``), or 1 when they differ.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from labq.cli.common import FINISHED, command, leader_client, parse_ids, parse_priority_arg
from labq.cli.errors import exit_code
from labq.protocol.errors import ApiError
from labq.terminal_text import escape_controls


def _action(action: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        priority = parse_priority_arg(args.priority, "priority") if action == "prio" else None
        ids = parse_ids(args.ids)
        client, codes = leader_client(args), []
        for job_id in ids:
            try:
                job = client.action(job_id, action, priority)
            except ApiError as err:
                if err.code == "unreachable" or err.status == 401:
                    raise
                print(f"labq: error: job {job_id}: {escape_controls(err)}", file=sys.stderr)
                codes.append(exit_code(err))
                continue
            codes.append(0)
            print(f"job {job_id}: {escape_controls(_state_phrase(job, action))}")
        failed = [c for c in codes if c]
        if not failed:
            return 0
        return failed[0] if len(failed) == len(codes) and len(set(failed)) == 1 else 1

    return run


def _state_phrase(job: dict, action: str) -> str:
    from labq.models.priority import priority_name

    phrase = job["state"]
    if job.get("stop_requested") and job["state"] not in FINISHED:
        phrase += f", stopping ({job['stop_requested']} requested)"
    if action == "prio":
        value = job["spec"]["priority"]
        phrase = f"priority {priority_name(value)} ({value}), {phrase}"
    return phrase


def add_actions(sub: argparse._SubParsersAction, c: list) -> None:
    for name, summary, description in (
            ("cancel", "cancel jobs", "Cancel jobs; a running job is asked to stop (its checkpoint signal, "
             "then TERM after the grace time)."),
            ("hold", "keep queued jobs from starting", "Hold queued jobs: they keep their place but do not start."),
            ("release", "let held jobs start", "Release held jobs back into the queue.")):
        p = command(sub, name, summary, description, f"  labq {name} 12\n  labq {name} 12 13 14", _action(name), c)
        p.add_argument("ids", nargs="+", metavar="ID")

    p = command(sub, "prio", "change jobs' priority",
                "Change the priority of jobs: a class (low, normal, high, urgent) or an integer 0-1000.",
                "  labq prio 12 high\n  labq prio 12 13 250", _action("prio"), c)
    p.add_argument("ids", nargs="+", metavar="ID")
    p.add_argument("priority", metavar="CLASS|INT")


