"""The people's actions on jobs: cancel (by id or by scancel's filters), hold, release, prio, edit, restart,
wait and clean.

One request per job; each job's answer is printed on its line, escaped. The exit status is the
common one of the failures (``labq.cli.errors``), or 1 when they differ; ``labq wait`` exits with
the status of the jobs it waited for (``wait_status``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from labq.cli.common import (
    FINISHED,
    STATES,
    ask,
    command,
    leader_client,
    parse_duration,
    parse_ids,
    parse_priority_arg,
    patience,
    retry_option,
)
from labq.cli.errors import REFUSED, CliError, exit_code
from labq.protocol.errors import ApiError
from labq.terminal_text import escape_controls

TYPE_CHECKING = False  # typing's, without importing typing: 3 ms of the CLI's start (type checkers take it as true)
if TYPE_CHECKING:
    from labq.client import Client

#: a cancel by filters that matches more jobs than this asks first (or needs --yes)
FEW = 3


def _each(client: Client, ids: Sequence[int], act: Callable[[int], dict], phrase: Callable[[dict], str]) -> int:
    """``act`` on each job, its answer or error on its own line; the exit status of them all."""
    codes = []
    for job_id in ids:
        try:
            job = act(job_id)
        except ApiError as err:
            if err.code == "unreachable" or err.status == 401:
                raise
            print(f"labq: error: job {job_id}: {escape_controls(err)}", file=sys.stderr)
            codes.append(exit_code(err))
            continue
        codes.append(0)
        if "array" in job:  # the whole array's answer: {array, jobs}
            print(f"array {job_id}: {escape_controls(_array_phrase(job))}")
            continue
        print(f"job {job_id}: {escape_controls(phrase(job))}")
    failed = [c for c in codes if c]
    if not failed:
        return 0
    return failed[0] if len(failed) == len(codes) and len(set(failed)) == 1 else REFUSED


def _action(action: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        ids = parse_ids(args.ids)
        client = leader_client(args)
        return _each(client, ids, lambda i: client.action(i, action), lambda job: _state_phrase(job, action))

    return run


def _prio(args: argparse.Namespace) -> int:
    """``labq prio ID... P``: P is a class or 0-1000; ``+N``/``-N`` changes each job's priority by N."""
    from labq.protocol.requests import priority_change

    by = priority_change(args.priority)
    fields = {"by": by} if by is not None else {"priority": parse_priority_arg(args.priority, "priority")}
    client = leader_client(args)
    return _each(client, parse_ids(args.ids), lambda i: client.action(i, "prio", **fields),
                 lambda job: _state_phrase(job, "prio"))


def _array_phrase(answer: dict) -> str:
    """``4 tasks: 3 cancelled, 1 stopping (cancel requested)``."""
    counts: dict[str, int] = {}
    for job in answer["jobs"]:
        state = job["state"]
        if job.get("stop_requested") and state not in FINISHED:
            state = f"stopping ({job['stop_requested']} requested)"
        counts[state] = counts.get(state, 0) + 1
    changed = answer["array"]["changed"]
    return f"{changed} task{'s' if changed != 1 else ''}: " + ", ".join(f"{n} {s}" for s, n in counts.items())


def _state_phrase(job: dict, action: str) -> str:
    from labq.models.priority import priority_name
    from labq.render import format_duration

    phrase = job["state"]
    if job.get("stop_requested") and job["state"] not in FINISHED:
        phrase += f", stopping ({job['stop_requested']} requested)"
    if action in ("prio", "edit"):
        value, name = job["spec"]["priority"], priority_name(job["spec"]["priority"])
        phrase = f"priority {name}{f' ({value})' if name != str(value) else ''}, {phrase}"
    if action == "edit":
        spec, limit = job["spec"], job["spec"].get("time_limit_s")
        name = f"name {spec['name']}, " if spec.get("name") else ""
        limit_text = format_duration(limit) if limit else "none"
        phrase = f"{name}{spec.get('gpus', 1)} GPU(s), time limit {limit_text}, {phrase}"
    return phrase


# -- cancel, by id or by filters ------------------------------------------------------------------

def _cancel(args: argparse.Namespace) -> int:
    filters = bool(args.user or args.name or args.state)
    if not args.ids and not filters:
        raise CliError("name the jobs to cancel: IDs, or filters (--user, --name, --state)")
    client = leader_client(args)
    ids = parse_ids(args.ids) if args.ids else []
    if filters:
        ids = _matching(client, args, ids)
        if not ids:
            print("labq: no unfinished job matches; nothing cancelled", file=sys.stderr)
            return 0
        if len(ids) > FEW and not ask(f"cancel {len(ids)} jobs ({_few(ids)})?", args.yes,
                                      f"the filters match {len(ids)} jobs"):
            print("labq: nothing cancelled", file=sys.stderr)
            return REFUSED
    return _each(client, ids, lambda i: client.action(i, "cancel"), lambda job: _state_phrase(job, "cancel"))


def _matching(client: Client, args: argparse.Namespace, ids: list[int]) -> list[int]:
    """The unfinished jobs that pass ``--user``, ``--name`` and ``--state`` (and are among ``ids``, if given); your
    own unless ``--user`` says whose."""
    import fnmatch

    states = [s for v in args.state for s in v.split(",") if s]
    wrong = [s for s in states if s not in STATES or s in FINISHED]
    if wrong:
        raise CliError(f"--state {wrong[0]!r}: cancel takes unfinished states: "
                       f"{', '.join(s for s in STATES if s not in FINISHED)}")
    if ids:
        jobs, _ = client.queue(ids)
        jobs = [j for j in jobs if j["spec"]["user"] == args.user] if args.user else jobs
    else:
        jobs = client.jobs(user=args.user, states=states)
    return [j["id"] for j in jobs if (not states or j["state"] in states)
            and (not args.name or fnmatch.fnmatchcase(j["spec"].get("name") or "", args.name))]


def _few(ids: Sequence[int]) -> str:
    shown = ", ".join(map(str, ids[:8]))
    return f"jobs {shown}" + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")


# -- edit, restart, clean -------------------------------------------------------------------------

def _edit(args: argparse.Namespace) -> int:
    fields = edit_fields(args)
    client = leader_client(args)
    return _each(client, parse_ids(args.ids), lambda i: client.action(i, "edit", **fields),
                 lambda job: _state_phrase(job, "edit"))


def edit_fields(args: argparse.Namespace) -> dict:
    """The edit action's fields from ``labq edit``'s flags, each read as ``labq submit`` reads it; ``--time none``
    removes the limit (sent as 0) and ``--name ''`` the name."""
    from labq.cli.spec_flags import dest, flag_value
    from labq.models.spec import FIELDS

    fields: dict = {}
    for field in (f for f in FIELDS if f.edit is not None):
        raw = getattr(args, dest(field))
        if field.kind == "duration" and isinstance(raw, str) and raw.strip().lower() == "none":
            fields[field.name] = 0
        elif field.kind == "name" and raw == "":
            fields[field.name] = ""
        elif (value := getattr(args, "klass", None) if field.kind == "priority" and args.klass
              else flag_value(args, field, {})) is not None:
            fields[field.name] = value
    if not fields:
        raise CliError("say what to change: --gpus, --time, --class/--priority or --name")
    return fields


def _restart(args: argparse.Namespace) -> int:
    client = leader_client(args)
    return _each(client, parse_ids(args.ids), client.restart, lambda job: f"restarted as job {job['id']}")


def _clean(args: argparse.Namespace) -> int:
    answer = leader_client(args).clean()
    n = answer["hidden"]
    print(f"hid {n} finished job{'s' * (n != 1)} of yours from `labq ls --history`; "
          "`labq show ID` still shows any of them")
    return 0


# -- wait -----------------------------------------------------------------------------------------

#: ``labq wait``'s status for a job that ended without an exit code of its own
TIMEOUT_STATUS, CANCELLED_STATUS = 124, 143


def wait_status(jobs: Sequence[Mapping]) -> int:
    """0 if every job succeeded, else the first failure's (in the order given): a failed job's own exit code
    (1 if it has none, e.g. it could not start), 124 for a time limit (as timeout(1)), 143 for a cancel (128 +
    SIGTERM, as a shell reports a process stopped so)."""
    for job in jobs:
        state = job["state"]
        if state == "succeeded":
            continue
        if state == "timeout":
            return TIMEOUT_STATUS
        if state == "cancelled":
            return CANCELLED_STATUS
        code = job.get("exit_code")
        return code if isinstance(code, int) and 0 < code < 256 else 1
    return 0


def _wait(args: argparse.Namespace) -> int:
    ids, client, wait = parse_ids(args.ids), leader_client(args), patience(args)
    timeout = parse_duration(args.timeout, "--timeout", bare_seconds=True) if args.timeout else None
    deadline = None if timeout is None else time.monotonic() + timeout
    ended: dict[int, dict] = {}
    while True:
        waiting = [i for i in ids if i not in ended]
        live = {j["id"] for k in range(0, len(waiting), 1000) for j in wait.call(client.queue, waiting[k:k + 1000])[0]}
        for job_id in [i for i in waiting if i not in live]:  # finished, or no such job (an error, exit 1)
            job, _ = wait.call(client.job, job_id)
            if job["state"] not in FINISHED:
                continue
            ended[job_id] = job
            if not args.quiet:
                code = f" (exit {job['exit_code']})" if job.get("exit_code") is not None else ""
                print(f"job {job_id}: {escape_controls(job['state'])}{code}", flush=True)
        if len(ended) == len(ids):
            return wait_status([ended[i] for i in ids])
        if deadline is not None and time.monotonic() >= deadline:
            left = ", ".join(str(i) for i in ids if i not in ended)
            raise CliError(f"--timeout: still unfinished after {args.timeout}: job(s) {left}", REFUSED)
        time.sleep(1)


# -- the parsers ----------------------------------------------------------------------------------

def add_actions(sub: argparse._SubParsersAction, c: list) -> None:
    _add_cancel(sub, c)
    for name, summary, description in (
            ("hold", "keep queued jobs from starting", "Hold queued jobs: they keep their place but do not start."),
            ("release", "let held jobs start", "Release held jobs back into the queue.")):
        p = command(sub, name, summary, description, f"  labq {name} 12\n  labq {name} 12 13 14", _action(name), c)
        p.add_argument("ids", nargs="+", metavar="ID")

    p = command(sub, "prio", "change jobs' priority",
                "Set the priority of jobs: a class (low 100, normal 200, high 300, urgent 400) or an integer "
                "0-1000; or change it: +N raises it by N, -N lowers it by N. Users may go up to the lab's highest "
                "class for users (normal, unless the admin says otherwise).",
                "  labq prio 12 high\n  labq prio 12 13 250\n  labq prio 12 +10        from normal (200) to 210\n"
                "  labq prio 12 -50        from 200 to 150", _prio, c)
    p.add_argument("ids", nargs="+", metavar="ID")
    p.add_argument("priority", metavar="CLASS|INT|+N|-N")
    _add_edit(sub, c)
    _add_restart_wait_clean(sub, c)


def _add_cancel(sub: argparse._SubParsersAction, c: list) -> None:
    p = command(sub, "cancel", "cancel jobs, by id or by filters",
                "Cancel jobs; a running job is asked to stop (its checkpoint signal, then TERM after the grace "
                "time). Pick them by id, or by filters as scancel does: your unfinished jobs (--user: that "
                f"user's, for admins) with the --name and in the --state given. When filters pick more than {FEW} "
                "jobs labq lists them and asks first; --yes does not ask (and is needed when stdin is not a "
                "terminal).",
                "  labq cancel 12\n  labq cancel 12 13 14\n"
                "  labq cancel --name 'sweep-*' --state queued     your queued sweep jobs\n"
                "  labq cancel --user bob --state held --yes         (admins) all of bob's held jobs", _cancel, c)
    p.add_argument("ids", nargs="*", metavar="ID")
    p.add_argument("--user", metavar="USER", help="this user's jobs (default: yours)")
    p.add_argument("--name", metavar="NAME", help="jobs with this name; a shell pattern such as 'sweep-*'")
    p.add_argument("--state", action="extend", nargs="+", default=[], metavar="STATE",
                   help="only jobs in these states (queued, held, starting, running, preempting)")
    p.add_argument("-y", "--yes", action="store_true", help=f"do not ask, however many jobs (more than {FEW}) "
                   "the filters pick")


def _add_edit(sub: argparse._SubParsersAction, c: list) -> None:
    from labq.cli.spec_flags import add_flag
    from labq.models.spec import FIELDS

    p = command(sub, "edit", "change a job's GPUs, time limit, class or name",
                "Change what jobs asked for: GPUs and the time limit while they wait (queued or held), the class "
                "(or priority) and the name until they end. The leader checks the change as it checks a submit.",
                "  labq edit 12 --gpus 4\n  labq edit 12 --time 6h --class high\n"
                "  labq edit 12 --time none             no time limit\n  labq edit 12 13 --name sweep-2",
                _edit, c)
    p.add_argument("ids", nargs="+", metavar="ID")
    for field in FIELDS:
        if field.edit is not None:
            add_flag(p, field, field.edit)


def _add_restart_wait_clean(sub: argparse._SubParsersAction, c: list) -> None:
    p = command(sub, "restart", "submit finished jobs again",
                "Submit a finished job (succeeded, failed, cancelled or timed out) again as a new job with the "
                "same command, GPUs, limits and everything else, and print the new job's id. Only its submitter "
                "may: the new job runs as them.",
                "  labq restart 12                  prints: job 12: restarted as job 31\n  labq restart 12 13",
                _restart, c)
    p.add_argument("ids", nargs="+", metavar="ID")

    p = command(sub, "wait", "wait for jobs to end; exit with their status",
                "Block until every job named has ended, printing each as it ends, then exit 0 if all succeeded, "
                "else with the first failure's status, in the order given: a failed job's own exit code, 124 for "
                "a time limit, 143 for a cancel. Scripts chain on it like on the command itself. A leader that "
                "restarts is waited out (exit 4 if it stays away past --retry-for).",
                "  labq wait 12 && labq submit -- python3 eval.py\n"
                "  labq wait 12 13 14 || echo \"a job failed: $?\"\n"
                "  labq wait --timeout 2h 12       exit 1 if it is still running then", _wait, c)
    p.add_argument("ids", nargs="+", metavar="ID")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing; only the exit status tells")
    p.add_argument("--timeout", metavar="DURATION", help="give up after this long (exit 1)")
    retry_option(p)

    command(sub, "clean", "hide your finished jobs from listings",
            "Hide every job of yours that has finished by now from `labq ls --history` (and from the TUI), as "
            "pueue clean does. Nothing is deleted: the leader remembers the time you cleaned at, `labq show ID` "
            "still finds any job, and jobs that finish later are listed as usual.",
            "  labq clean\n  labq ls --history        only what finished since", _clean, c)
