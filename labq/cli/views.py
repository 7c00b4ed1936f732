"""The people's views of the lab: ls (and --watch), show, why, logs, nodes, gpus, whoami.

Each command parses, makes one ``labq.client.Client`` and prints; nothing heavy is imported at
module level. Whatever a command prints that came from a user goes through ``escape_controls``;
the tables of ``labq.render`` escape their own. A job's log (``labq logs``) is the job's own
output and is written as it is, like ``docker logs``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, BinaryIO

from labq.cli.common import FINISHED, STATES, command, emit, leader_client, use_color
from labq.cli.errors import CliError
from labq.protocol.errors import ApiError
from labq.terminal_text import escape_controls

if TYPE_CHECKING:
    from labq.client import Client


def _list_jobs(client: Client, args: argparse.Namespace) -> list[dict]:
    states = [s for v in args.state for s in v.split(",") if s]
    wrong = [s for s in states if s not in STATES]
    if wrong:
        raise CliError(f"--state {wrong[0]!r} is not a state: use {', '.join(STATES)}")
    return client.jobs(user=args.user, states=states, all=args.all, history=args.history, limit=args.limit)


def _ls(args: argparse.Namespace) -> int:
    from labq.render import jobs_table

    client = leader_client(args)
    if args.watch:
        if args.json:
            raise CliError("--watch redraws a table; leave out --json")
        return _watch(client, args)
    jobs = _list_jobs(client, args)
    return emit(args, jobs, lambda: jobs_table(jobs, time.time(), use_color()))


def _watch(client: Client, args: argparse.Namespace) -> int:
    """Redraws on every event (at most five times a second) and every 10 s for the ages."""
    import signal
    import threading

    from labq.render import jobs_table

    changed = threading.Event()
    failure: list[ApiError] = []

    def pump() -> None:
        # Ctrl-C must reach the main thread: a signal the kernel hands to this thread would only be
        # seen once the main thread next wakes, up to 10 s later
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        last = None
        while True:
            try:
                for event in client.events(after=last):
                    last = event["id"] if event["id"] is not None else last
                    changed.set()
            except ApiError as err:
                if err.code != "unreachable":
                    failure.append(err)
                    changed.set()
                    return
                time.sleep(2)
            else:
                time.sleep(0.5)  # the leader ended the stream (a restart): reconnect, without spinning

    threading.Thread(target=pump, daemon=True, name="labq-ls-events").start()
    args.interruptible = True
    while True:
        try:
            body = jobs_table(_list_jobs(client, args), time.time(), use_color())
        except ApiError as err:
            if err.code != "unreachable":
                raise
            body = f"{escape_controls(err)}\nretrying..."
        stamp = time.strftime("%H:%M:%S")
        sys.stdout.write(f"\x1b[H\x1b[2Jlabq ls, live ({stamp}); Ctrl-C to stop\n\n{body}\n")
        sys.stdout.flush()
        changed.wait(timeout=10)
        if failure:
            raise failure[0]
        time.sleep(0.2)
        changed.clear()


def _show(args: argparse.Namespace) -> int:
    from labq.render import show_text

    job, pending = leader_client(args).job(args.id)
    return emit(args, {"job": job, "pending": pending}, lambda: show_text(job, pending, time.time()))


def _why(args: argparse.Namespace) -> int:
    from labq.render import why_text

    job, pending = leader_client(args).job(args.id)
    text = why_text(job, pending, time.time())
    return emit(args, {"id": job["id"], "state": job["state"], "pending": pending, "text": text}, lambda: text)


def _logs(args: argparse.Namespace) -> int:
    client, out = leader_client(args), sys.stdout.buffer
    if not args.follow:
        offset, done = 0, False
        while not done:
            data, offset, done = client.logs(args.id, args.attempt, offset)
            out.write(data)
            done = done or not data
        out.flush()
        return 0
    args.interruptible = True
    return _follow(client, args.id, args.attempt, out)


def _follow(client: Client, job_id: int, attempt: int | None, out: BinaryIO) -> int:
    """Prints an attempt's log as it grows; without ``--attempt``, goes on to the next attempt
    after a preemption, and ends when the job has finished."""
    pinned, offset, ended, said = attempt is not None, 0, 0, ""
    while True:
        if attempt is None:
            job, _ = client.job(job_id)
            if job["state"] in FINISHED and job["attempt"] <= ended:
                return 0
            if job["state"] in ("queued", "held") or job["attempt"] <= ended:  # else the leader is yet to hear
                if job["state"] in ("queued", "held") and job["state"] != said:
                    print(f"labq: job {job_id} is {escape_controls(job['state'])}; waiting for it to start",
                          file=sys.stderr)
                    said = job["state"]
                time.sleep(1)
                continue
            attempt, offset = job["attempt"], 0
            if ended:
                print(f"labq: following attempt {attempt}", file=sys.stderr)
        try:
            data, offset, done = client.logs(job_id, attempt, offset)
        except ApiError as err:
            if err.status != 404:
                raise
            data, done = b"", False  # the attempt has no log yet
            if pinned and client.job(job_id)[0]["state"] in FINISHED:
                raise
        out.write(data)
        out.flush()
        if done:
            if pinned:
                return 0
            ended, attempt = attempt, None
        elif not data:
            time.sleep(0.5)


def _nodes(args: argparse.Namespace) -> int:
    from labq.render import nodes_table

    nodes, unadmitted = leader_client(args).nodes_report()
    # agents seen over mDNS but not admitted are listed too, as nodes that have not joined
    nodes += [{"name": u["node"], "health": "not admitted", "gpus": [], "found": "mDNS",
               "address": ", ".join(u.get("addresses") or ()), "last_seen": None} for u in unadmitted]
    return emit(args, nodes, lambda: nodes_table(nodes, time.time(), use_color()))


def _gpus(args: argparse.Namespace) -> int:
    from labq.render import gpu_rows, gpus_table

    client = leader_client(args)
    nodes = client.nodes()
    try:  # who runs each job: one more request, worth it for "who is on GPU 3?"
        users = {j["id"]: j["spec"]["user"] for j in client.jobs(all=True)}
    except ApiError as err:
        if err.status != 403:
            raise
        users = {}
    rows = gpu_rows(nodes, users)
    return emit(args, rows, lambda: gpus_table(rows))


def _whoami(args: argparse.Namespace) -> int:
    client = leader_client(args)
    me = client.whoami()
    print(escape_controls(f"{me['user']}{' (admin)' if me.get('admin') else ''} at {client.url}"))
    return 0


# -- the parsers ----------------------------------------------------------------------------------

def add_views(sub: argparse._SubParsersAction, c: list) -> None:
    p = command(sub, "ls", "list jobs",
                "List your unfinished jobs (--all: everyone's). `labq why ID` says why one waits.",
                "  labq ls\n  labq ls --all --state running\n  labq ls --history --limit 20\n"
                "  labq ls --all --watch               redraws on every change", _ls, c)
    p.add_argument("--all", action="store_true", help="everyone's jobs")
    p.add_argument("--user", metavar="USER", help="this user's jobs")
    p.add_argument("--state", action="extend", nargs="+", default=[], metavar="STATE",
                   help=f"only these states: {', '.join(STATES)}")
    p.add_argument("--history", action="store_true", help="include finished jobs")
    p.add_argument("--limit", type=int, metavar="N", help="at most N jobs")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--watch", action="store_true", help="redraw on every change until Ctrl-C")

    p = command(sub, "show", "everything about a job",
                "Show a job: what it asked for, where it runs (GPU indices and UUIDs), why it waits.",
                "  labq show 12\n  labq show 12 --json", _show, c)
    p.add_argument("id", type=int, metavar="ID")
    p.add_argument("--json", action="store_true", help="print {job, pending} as JSON")

    p = command(sub, "why", "why a job is not running yet",
                "Say why a job waits (the scheduler's reason) and when it should start.",
                "  labq why 12", _why, c)
    p.add_argument("id", type=int, metavar="ID")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = command(sub, "logs", "print a job's output",
                "Print what a job wrote to stdout and stderr. -f keeps printing as it grows, across "
                "preemptions, until the job ends.",
                "  labq logs 12\n  labq logs -f 12\n  labq logs 12 --attempt 1     the run before a preemption",
                _logs, c)
    p.add_argument("id", type=int, metavar="ID")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends (Ctrl-C stops)")
    p.add_argument("--attempt", type=int, metavar="K", help="this attempt (default: the latest)")


def add_lab(sub: argparse._SubParsersAction, c: list) -> None:
    p = command(sub, "nodes", "list the workstations",
                "List the nodes: health, free GPUs, GPU models and when each last reported.",
                "  labq nodes\n  labq nodes --json", _nodes, c)
    p.add_argument("--json", action="store_true", help="print JSON")
    p = command(sub, "gpus", "list every GPU and who uses it",
                "One line per GPU of the lab: its model and memory and the job on it, or busy outside labq.",
                "  labq gpus\n  labq gpus --json", _gpus, c)
    p.add_argument("--json", action="store_true", help="print JSON")
    command(sub, "whoami", "who the leader thinks you are", "Check your credentials: your labq user and "
            "the leader you talk to.", "  labq whoami\n  LABQ_LEADER=http://gpu1:7733 labq whoami", _whoami, c)
