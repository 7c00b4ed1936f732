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

from labq.cli.common import (
    FINISHED,
    STATES,
    Patience,
    command,
    emit,
    job_ref_arg,
    leader_client,
    patience,
    retry_option,
    use_color,
)
from labq.cli.errors import REFUSED, CliError
from labq.protocol.errors import ApiError
from labq.terminal_text import escape_controls

TYPE_CHECKING = False  # typing's, without importing typing: 3 ms of the CLI's start (type checkers take it as true)
if TYPE_CHECKING:
    from typing import BinaryIO

    from labq.client import Client, Page


LS_PAGE = 100  #: the jobs ``labq ls`` shows at once without --limit
NOTICES_SHOWN = 3  #: the notices ``labq ls --watch`` shows under its title, the latest


def _list_jobs(client: Client, args: argparse.Namespace) -> Page:
    """The jobs ``ls`` lists, why those that wait do and how many match in all: a page of ``LS_PAGE`` from the
    first (``--after ID``: from the first after job ID), ``--limit N`` the newest N, ``--limit 0`` every job;
    ``--history`` is finished jobs, the ``--limit`` that ended last (all of them without)."""
    states = [s for v in args.state for s in v.split(",") if s]
    wrong = [s for s in states if s not in STATES]
    if wrong:
        raise CliError(f"--state {wrong[0]!r} is not a state: use {', '.join(STATES)}")
    if args.history and set(states) - FINISHED:
        raise CliError(f"--history lists finished jobs; {sorted(set(states) - FINISHED)[0]} is not a finished "
                       f"state ({', '.join(sorted(FINISHED))})")
    if args.limit is not None and args.limit < 0:
        raise CliError("--limit must be 1 or more (0: every job)")
    if args.limit:
        from labq.protocol.requests import MAX_PAGE

        if args.limit > MAX_PAGE:
            raise CliError(f"--limit is at most {MAX_PAGE} (--limit 0 lists every job)")
    if args.after is not None:
        if args.history:
            raise CliError("--after pages through jobs by id; --history lists them by when they ended: use --limit")
        if args.after < 0 or args.limit == 0:
            raise CliError("--after ID is the page after job ID: a job id, with a --limit of 1 or more")
    limit, after = _window(args)
    return client.page(user=args.user, states=states, all=args.all, finished=args.history, limit=limit,
                       after=after, pending=not args.history)


def _window(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """The ``limit`` and ``after`` that ``ls`` asks for: ``after`` is None unless it asks for a page."""
    if args.limit == 0 or args.limit is None and (args.history or args.json and args.after is None):
        return None, None  # every job
    if args.after is not None:
        return args.limit or LS_PAGE, args.after
    if args.limit is not None:
        return args.limit, None  # the newest N, as --limit always was
    return LS_PAGE, 0


def _more_line(found: Page, args: argparse.Namespace) -> str:
    """The line under a page of the table when more jobs match than it shows, saying how to see them; "" when all
    are shown, and for what is not a page (--limit N alone, --history: as they always printed)."""
    shown, total = len(found.jobs), found.total
    if total <= shown or _window(args)[1] is None:
        return ""
    if found.next is not None:
        return f"showing {shown:,} of {total:,} jobs: --after {found.next} for the next page, --limit 0 for all"
    return f"showing {shown:,} of {total:,} jobs, those after job {args.after or 0}: --limit 0 for all"


def _ls_text(found: Page, args: argparse.Namespace) -> str:
    from labq.render.jobs import jobs_table

    more = _more_line(found, args)
    return jobs_table(found.jobs, time.time(), use_color(), found.pending, expand=args.expand) + (
        f"\n{more}" if more else "")


def _ls(args: argparse.Namespace) -> int:
    client = leader_client(args)
    if args.watch:
        if args.json:
            raise CliError("--watch redraws a table; leave out --json")
        return _watch(client, args)
    found = _list_jobs(client, args)
    pending = found.pending
    data = [{**j, "pending": pending[j["id"]]} if j["id"] in pending else j for j in found.jobs]
    return emit(args, data, lambda: _ls_text(found, args))


def _watch(client: Client, args: argparse.Namespace) -> int:
    """Redraws on every event (at most five times a second), every 10 s for the ages, and when the window
    changes size. On a terminal only the lines that changed are rewritten (``labq.cli.screen``); into a pipe
    or a file, each frame is written whole. A notice for you (``labq notify``, ``labq submit --notify``) rings the
    terminal's bell and shows as a line under the title, the latest ``NOTICES_SHOWN`` of them."""
    import signal
    import threading

    changed = threading.Event()
    failure: list[Exception] = []
    notices: list[str] = []  #: appended by the events' thread, escaped
    threading.Thread(target=_pump_events, args=(client, changed, failure, notices), daemon=True,
                     name="labq-ls-events").start()
    if hasattr(signal, "SIGWINCH"):
        signal.signal(signal.SIGWINCH, lambda *_: changed.set())
    args.interruptible = True
    draw = _frame_writer()
    rung = 0
    try:
        while True:
            heard = len(notices)
            if heard > rung:
                sys.stdout.write("\a")  # the bell, once for what came since the last frame
                rung = heard
            draw(_watch_lines(client, args, notices[max(0, heard - NOTICES_SHOWN):heard]))
            changed.wait(timeout=10)
            if failure:
                raise failure[0]
            time.sleep(0.2)
            changed.clear()
    finally:
        draw(None)


def _pump_events(client: Client, changed, failure: list[Exception], notices: list[str] | None = None) -> None:
    """The event stream, in a thread of its own: sets ``changed`` on each event, and keeps the text of each
    ``notify`` event (the leader sends a person their own alone) in ``notices``, escaped, with the time it came;
    reconnects after a restart, from the last event seen."""
    import signal

    # Ctrl-C must reach the main thread: a signal the kernel hands to this thread would only be
    # seen once the main thread next wakes, up to 10 s later
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGWINCH", 28)})
    last = None
    while True:
        try:
            stream = client.events(after=last)
            changed.set()  # open now: draw again, so a change between the last drawing and the opening shows
            for event in stream:
                last = event["id"] if event["id"] is not None else last
                data = event["data"]
                if event["event"] == "notify" and notices is not None and isinstance(data, dict):
                    notices.append(f"{time.strftime('%H:%M')} {escape_controls(data.get('text', ''))}")
                changed.set()
        except ApiError as err:
            if err.code != "unreachable":
                failure.append(err)
                changed.set()
                return
            time.sleep(2)
        except Exception as err:  # noqa: BLE001 - anything else ends the watch with a clear error, never silently
            failure.append(CliError(f"lost the leader's event stream: {escape_controls(err)}", REFUSED))
            changed.set()
            return
        else:
            time.sleep(0.5)  # the leader ended the stream (a restart): reconnect, without spinning


def _watch_lines(client: Client, args: argparse.Namespace, notices: list[str] = ()) -> list[str]:
    try:
        body = _ls_text(_list_jobs(client, args), args)
    except ApiError as err:
        if err.code != "unreachable":
            raise
        body = f"{escape_controls(err)}\nretrying..."
    heard = [f"notice: {line}" for line in notices]
    return [f"labq ls, live ({time.strftime('%H:%M:%S')}); Ctrl-C to stop", *heard, "", *body.split("\n")]


def _frame_writer():
    """A function that shows a frame of lines (None: the end): on a terminal, a ``Screen``; else whole frames."""
    import os
    import shutil

    out = sys.stdout
    if not out.isatty():
        def whole(lines: list[str] | None) -> None:
            if lines is not None:
                out.write("\x1b[H\x1b[2J" + "\n".join(lines) + "\n")
                out.flush()
        return whole

    from labq.cli.screen import Screen

    def size() -> tuple[int, int]:  # the window as it is now: $COLUMNS and $LINES go stale when it is resized
        try:
            return tuple(os.get_terminal_size(out.fileno()))
        except OSError:
            return tuple(shutil.get_terminal_size())

    screen = Screen(out.write, size,
                    overflow="… {n} more rows: narrow with --state or --user, or make the window taller")

    def changed(lines: list[str] | None) -> None:
        if lines is None:
            screen.leave()
        else:
            screen.draw(lines)
        out.flush()
    return changed


def _show(args: argparse.Namespace) -> int:
    from labq.render.job_detail import show_text
    from labq.render.jobs import array_text

    found = leader_client(args).lookup(args.id)
    if "array" in found:
        return emit(args, found, lambda: array_text(found["array"], time.time(), use_color()))
    job, pending = found["job"], found.get("pending")
    return emit(args, {"job": job, "pending": pending}, lambda: show_text(job, pending, time.time()))


def _why(args: argparse.Namespace) -> int:
    from labq.render.job_detail import why_text
    from labq.render.jobs import array_why_text

    found = leader_client(args).lookup(args.id)
    if "array" in found:
        array = found["array"]
        text = array_why_text(array, time.time())
        return emit(args, {"id": array["id"], "counts": array["counts"], "pending": array["pending"], "text": text},
                    lambda: text)
    job, pending = found["job"], found.get("pending")
    text = why_text(job, pending, time.time())
    return emit(args, {"id": job["id"], "state": job["state"], "pending": pending, "text": text}, lambda: text)


def _logs(args: argparse.Namespace) -> int:
    if args.lines is not None and args.lines < 0:
        raise CliError("--lines must be 0 or more")
    client, out = leader_client(args), sys.stdout.buffer
    tail = Tail(out, args.lines)
    if args.follow:
        args.interruptible = True
        return _follow(client, args.id, args.attempt, tail, patience(args))
    chunk = client.log(args.id, args.attempt, 0)
    attempt = chunk.attempt  # read on in the attempt the leader chose, whatever starts meanwhile
    tail.write(chunk.data)
    while not chunk.done and chunk.data:
        chunk = client.log(args.id, attempt, chunk.next_offset)
        tail.write(chunk.data)
    tail.flush()
    if args.attempt is None and attempt is not None:
        job, _ = client.job(args.id)
        if job["attempt"] != attempt and job["state"] not in FINISHED:
            print(f"labq: that was attempt {attempt}; job {args.id} is {escape_controls(job['state'])} for attempt "
                  f"{job['attempt']} (`labq logs -f {args.id}` follows it once it starts)", file=sys.stderr)
    return 0


class Tail:
    """Writes a log out; with ``lines``, only the last that many lines of what comes before ``flush`` (``-n``),
    then everything after it as it comes."""

    def __init__(self, out: BinaryIO, lines: int | None) -> None:
        self.out, self.lines, self.kept = out, lines, b""

    def write(self, data: bytes) -> None:
        if self.lines is None:
            self.out.write(data)
        else:
            self.kept = last_lines(self.kept + data, self.lines)

    def flush(self) -> None:
        if self.lines is not None:
            self.out.write(self.kept)
            self.lines, self.kept = None, b""
        self.out.flush()


def last_lines(data: bytes, n: int) -> bytes:
    """The last ``n`` lines of ``data``, as ``tail -n`` counts them (a last line without a newline is one)."""
    if n <= 0:
        return b""
    pos = len(data) - 1 if data.endswith(b"\n") else len(data)
    for _ in range(n):
        pos = data.rfind(b"\n", 0, pos)
        if pos < 0:
            return data
    return data[pos + 1:]


def latest_run(job: dict) -> int | None:
    """The latest attempt of ``job`` (as the API sends it) that ran: the one a log read without --attempt reads."""
    if job.get("placement"):
        return job["attempt"]
    return next((a["attempt"] for a in reversed(job.get("attempts") or []) if a.get("placement")), None)


def _follow(client: Client, job_id: int, attempt: int | None, tail: Tail, wait: Patience) -> int:
    """Prints an attempt's log as it grows. Without ``--attempt``: from the latest attempt that ran, then on to
    each next one after a preemption, until the job has finished. A leader that restarts is waited out."""
    pinned, offset, ended, said = attempt is not None, 0, 0, ""
    while True:
        if attempt is None:
            job, _ = wait.call(client.job, job_id)
            ran = latest_run(job)
            if ran is None or ran <= ended:  # nothing (new) has run yet
                if job["state"] in FINISHED:
                    if ended:
                        return 0
                    raise CliError(f"job {job_id} {escape_controls(job['state'])} without running: it has no log",
                                   REFUSED)
                if job["state"] != said:
                    print(f"labq: job {job_id} is {escape_controls(job['state'])}; waiting for it to start",
                          file=sys.stderr)
                    said = job["state"]
                time.sleep(1)
                continue
            attempt, offset = ran, 0
            if ended:
                print(f"labq: following attempt {attempt}", file=sys.stderr)
        try:
            data, offset, done, _ = wait.call(client.log, job_id, attempt, offset)
        except ApiError as err:
            if err.status != 404:
                raise
            data, done = b"", False  # the attempt has no log yet
            if pinned and wait.call(client.job, job_id)[0]["state"] in FINISHED:
                raise
        tail.write(data)
        if done or not data:
            tail.flush()  # caught up: -n's lines are out, the rest comes as it is written
        if done:
            if pinned:
                return 0
            ended, attempt, said = attempt, None, ""
        elif not data:
            time.sleep(0.5)


def _nodes(args: argparse.Namespace) -> int:
    from labq.render.nodes import nodes_table

    nodes, unadmitted, insecure = leader_client(args).nodes_report()
    if insecure:
        print("labq: warning: the leader serves plain HTTP to the network (insecure = true): tokens, job "
              "environments and logs cross it in clear", file=sys.stderr)
    # agents seen over mDNS but not admitted are listed too, as nodes that have not joined
    nodes += [{"name": u["node"], "health": "not admitted", "gpus": [], "found": "mDNS",
               "address": ", ".join(u.get("addresses") or ()), "last_seen": None} for u in unadmitted]
    return emit(args, nodes, lambda: nodes_table(nodes, time.time(), use_color()))


def _queues(args: argparse.Namespace) -> int:
    from labq.render.nodes import queues_table

    queues = leader_client(args).queues()
    return emit(args, queues, lambda: queues_table(queues))


def _gpus(args: argparse.Namespace) -> int:
    from labq.render.nodes import gpu_rows, gpus_table

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
    where = f"via the agent of {me['via']} ({client.url})" if me.get("via") else f"at {client.url}"
    print(escape_controls(f"{me['user']}{' (admin)' if me.get('admin') else ''} {where}"))
    return 0


# -- the parsers ----------------------------------------------------------------------------------

def add_views(sub: argparse._SubParsersAction, c: list) -> None:
    p = command(sub, "ls", "list jobs",
                "List your unfinished jobs (--all: everyone's), with why each waiting job waits (REASON; `labq why "
                f"ID` says more), by id, {LS_PAGE} at a time: when more match, the last line says how many and how to "
                "see the rest (--after ID, the next page; --limit 0, all). --json prints every job that matches, "
                "unless --limit or --after asks for a page. --history lists finished jobs instead, the one that ended "
                "last at the bottom.",
                "  labq ls\n  labq ls --all --state running\n"
                "  labq ls --after 100                 the next page: your jobs after job 100\n"
                "  labq ls --history --limit 5         the five jobs of yours that ended last\n"
                "  labq ls --json | jq '.[] | select(.pending) | [.id, .pending.reason]'\n"
                "  labq ls --all --watch               a live table; only what changes is redrawn", _ls, c)
    p.add_argument("--all", action="store_true", help="everyone's jobs")
    p.add_argument("--user", metavar="USER", help="this user's jobs")
    p.add_argument("--state", action="extend", nargs="+", default=[], metavar="STATE",
                   help=f"only these states: {', '.join(STATES)}")
    p.add_argument("--history", action="store_true", help="finished jobs (those `labq clean` hid are left out)")
    p.add_argument("--limit", type=int, metavar="N", help="at most N jobs (up to 5000): the newest (with --history, "
                   "the N that ended last; with --after, the page's size); 0: every job, unpaged")
    p.add_argument("--after", type=int, metavar="ID",
                   help=f"a page: the first jobs after job ID ({LS_PAGE}, or --limit)")
    p.add_argument("--json", action="store_true", help="print JSON: the jobs, each waiting one with its pending "
                   "reason; every job that matches (not paged) unless --limit or --after says otherwise")
    p.add_argument("--watch", action="store_true", help="redraw on every change until Ctrl-C")
    p.add_argument("--expand", action="store_true", help="a row for every task of an array (by default the tasks "
                   "that wait alike are one row: 12.[2-9])")

    p = command(sub, "show", "everything about a job, or an array's tasks",
                "Show a job: what it asked for, where it runs (GPU indices and UUIDs), why it waits. An array's id "
                "shows its tasks, one line each; ID.INDEX one task as a job.",
                "  labq show 12\n  labq show 12 --json\n  labq show 12.3          task 3 of array 12", _show, c)
    p.add_argument("id", type=job_ref_arg, metavar="ID")
    p.add_argument("--json", action="store_true", help="print {job, pending} as JSON")

    p = command(sub, "why", "why a job is not running yet",
                "Say why a job waits (the scheduler's reason) and when it should start; for an array, how many "
                "of its tasks wait for each reason.",
                "  labq why 12\n  labq why 12.3", _why, c)
    p.add_argument("id", type=job_ref_arg, metavar="ID")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = command(sub, "logs", "print a job's output",
                "Print what a job wrote to stdout and stderr: by default its latest attempt that ran (after a "
                "preemption, the one before it requeued). -f keeps printing as it grows, on to each next attempt, "
                "until the job ends, and waits out a leader that restarts (exit 4 if it stays away past "
                "--retry-for).",
                "  labq logs 12\n  labq logs -n 20 12               the last 20 lines, like tail -n\n"
                "  labq logs -f -n 0 12             only what it writes from now on\n"
                "  labq logs 12 --attempt 1         the run before a preemption\n"
                "  labq logs 12.3                   task 3 of array 12", _logs, c)
    p.add_argument("id", type=job_ref_arg, metavar="ID")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends (Ctrl-C stops)")
    p.add_argument("-n", "--lines", type=int, metavar="N", help="only the last N lines (with -f: then follow)")
    p.add_argument("--attempt", type=int, metavar="K", help="this attempt (default: the latest that ran)")
    retry_option(p)


def add_lab(sub: argparse._SubParsersAction, c: list) -> None:
    p = command(sub, "nodes", "list the workstations",
                "List the nodes: health, free GPUs, GPU models and when each last reported.",
                "  labq nodes\n  labq nodes --json", _nodes, c)
    p.add_argument("--json", action="store_true", help="print JSON")
    p = command(sub, "queues", "the lab's queues (teams) and their shares",
                "List the lab's queues: each one's guaranteed GPUs, what its jobs hold (USE), how much of that is "
                "beyond its guarantee (BORROWED: given back by checkpoint when the lender needs it), how much of "
                "its idle guarantee other queues use (LENT), its waiting jobs, and its members by fair share. "
                "The admin defines queues in the leader's [queues] settings; `labq submit --queue NAME` picks one.",
                "  labq queues\n  labq queues --json | jq '.[] | {name, use, guarantee}'", _queues, c)
    p.add_argument("--json", action="store_true", help="print JSON")
    p = command(sub, "gpus", "list every GPU and who uses it",
                "One line per GPU of the lab: its model and memory and the job on it, or busy outside labq.",
                "  labq gpus\n  labq gpus --json", _gpus, c)
    p.add_argument("--json", action="store_true", help="print JSON")
    command(sub, "whoami", "who the leader thinks you are", "Check your credentials: your labq user and "
            "the leader you talk to.", "  labq whoami\n  LABQ_LEADER=http://gpu1:7733 labq whoami", _whoami, c)
