"""The people's commands: submit, ls, show, why, logs, cancel/hold/release/prio, nodes, gpus, whoami.

Each command parses, makes one ``labq.client.Client`` and prints. Nothing heavy is
imported at module level: ``labq submit`` and ``labq ls`` start in tens of milliseconds,
and the HTTP client is loaded only by a command that talks to the leader. Errors and
exit codes: ``labq.cli.errors``.

Whatever a command prints that came from a user (names, the leader's error messages that
echo them) goes through ``escape_controls``; the tables of ``labq.render`` escape their own.
A job's log (``labq logs``) is the job's own output and is written as it is, like ``docker logs``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, BinaryIO

from labq.cli.common import (
    command,
    emit,
    leader_client,
    leader_option,
    parse_duration,
    parse_ids,
    parse_priority_arg,
    parse_size_mib,
    use_color,
)
from labq.cli.errors import CliError, exit_code
from labq.protocol.errors import ApiError
from labq.terminal_text import escape_controls

if TYPE_CHECKING:
    from labq.client import Client

CLASSES = ("low", "normal", "high", "urgent")
STATES = ("queued", "held", "starting", "running", "preempting", "succeeded", "failed", "cancelled", "timeout")
FINISHED = frozenset(STATES[5:])


# -- labq submit: flags to the request body -------------------------------------------------------

def parse_env(items: list[str], environ: Mapping[str, str]) -> dict[str, str]:
    """``K=V`` sets K; a bare ``K`` copies K from this shell."""
    env = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            if key not in environ:
                raise CliError(f"--env {key}: {key} is not set in this shell (use --env {key}=VALUE)")
            value = environ[key]
        env[key] = value
    return env


def build_submit_body(args: argparse.Namespace, environ: Mapping[str, str] | None = None,
                      cwd: str | None = None) -> dict:
    """The ``POST /v1/jobs`` body for ``labq submit``'s arguments; only what the user chose besides defaults.

    The flags are read here into plain values, checked in the order given below, and the body is built by
    ``labq.protocol.requests.submit_request``."""
    from labq.protocol.requests import submit_request

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise CliError("name the command to run after --, e.g. labq submit --gpus 2 -- python train.py")
    if args.gpus < 1:
        raise CliError("--gpus must be 1 or more")
    here = cwd or os.getcwd()
    workdir = os.path.abspath(os.path.join(here, os.path.expanduser(args.workdir or ".")))
    return submit_request(
        command, gpus=args.gpus,
        workdir=(args.workdir or None) if args.image else workdir,  # a container starts in its image's folder
        name=args.name or None,
        min_gpu_memory_mib=parse_size_mib(args.gpu_mem) if args.gpu_mem else None,
        gpu_model=args.gpu_model or None,
        priority=args.klass or (parse_priority_arg(args.priority) if args.priority else None),
        preemptible=not args.no_preempt,
        time_limit_s=_time_limit(args.time),
        requeue_on_timeout=_requeue_on_timeout(args),
        grace_s=parse_duration(args.grace, "--grace", bare_seconds=True) if args.grace else None,
        checkpoint_signal=_signal(args.checkpoint_signal) if args.checkpoint_signal else None,
        env=parse_env(args.env, os.environ if environ is None else environ) if args.env else None,
        depends_on=parse_ids(args.after, "job id for --after") if args.after else None,
        nodes=_node_count(args), node=args.node or None, reservation=args.reservation or None,
        after_reservation=_after_reservation(args),
        image=args.image or None,
        mounts=[parse_mount(m, cwd) for m in _container_only(args, "mount")],
        shm_size_mib=parse_size_mib(args.shm_size, "--shm-size") if _container_only(args, "shm_size") else None)


def _time_limit(text: str | None) -> float | None:
    if not text:
        return None
    seconds = parse_duration(text, "--time")
    if seconds <= 0:
        raise CliError("--time must be longer than 0")
    return seconds


def _requeue_on_timeout(args: argparse.Namespace) -> bool:
    if args.requeue_on_timeout and not args.time:
        raise CliError("--requeue-on-timeout needs --time: the limit at which the job is requeued")
    return args.requeue_on_timeout


def _after_reservation(args: argparse.Namespace) -> str | None:
    if args.after_reservation and not args.reservation:
        raise CliError("--after-reservation says what happens when the job's reservation ends; "
                       "give --reservation NAME too")
    return args.after_reservation


def _node_count(args: argparse.Namespace) -> int | None:
    if args.nodes is not None and (args.nodes < 1 or args.gpus % args.nodes):
        raise CliError(f"--nodes {args.nodes}: the {args.gpus} GPUs must split evenly over the nodes")
    return args.nodes


def _container_only(args: argparse.Namespace, option: str):
    """``--mount`` and ``--shm-size``'s value; refused without ``--image``."""
    value = getattr(args, option)
    if value and not args.image:
        raise CliError(f"--{option.replace('_', '-')} is for container jobs: add --image IMAGE")
    return value or ()


def parse_mount(text: str, cwd: str | None = None):
    """``/data/imagenet:/data:ro`` -> a ``Mount``; a relative host path is taken from the current folder."""
    from labq.models.job import Mount

    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise CliError(f"--mount {text!r}: use HOST_PATH:CONTAINER_PATH[:ro]")
    source = os.path.abspath(os.path.join(cwd or os.getcwd(), os.path.expanduser(parts[0])))
    if not parts[1].startswith("/"):
        raise CliError(f"--mount {text!r}: the container path must be absolute")
    return Mount(source, parts[1], len(parts) == 3 and parts[2] == "ro")


def _signal(text: str) -> str:
    import signal

    name = text.strip().upper()
    name = name if name.startswith("SIG") else "SIG" + name
    if name not in signal.Signals.__members__ or name in ("SIGKILL", "SIGSTOP"):
        raise CliError(f"--checkpoint-signal: {text!r} is not a signal a job can catch (e.g. SIGUSR1, SIGTERM)")
    return name


# -- running commands -----------------------------------------------------------------------------

def _submit(args: argparse.Namespace) -> int:
    body = build_submit_body(args)
    job = leader_client(args).submit(body)
    name = job["spec"].get("name")
    return emit(args, job, lambda: f"submitted job {job['id']}" + (f" ({escape_controls(name)})" if name else ""))


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

def add_commands(sub: argparse._SubParsersAction) -> None:
    """Registers the job commands on ``labq``'s subparsers (called from ``labq.cli``)."""
    c = [leader_option()]
    _add_submit(sub, c)
    _add_views(sub, c)
    _add_actions(sub, c)
    _add_lab(sub, c)


def _add_submit(sub: argparse._SubParsersAction, c: list) -> None:
    p = command(sub, "submit", "queue a command to run on GPUs",
                "Queue a command to run as you, in --workdir (default: here), on the GPUs labq picks once they "
                "are free. Put labq's options first, then -- and the command. To make room for higher-priority "
                "work labq sends a job its checkpoint signal, waits the grace, stops it and requeues it to "
                "resume: the job sees LABQ_CHECKPOINT_DIR, LABQ_RESUMED and LABQ_PREEMPT_SIGNAL (README: "
                "Checkpoint and resume).",
                "  labq submit --gpus 2 --gpu-mem 40G --time 6h -- python train.py --lr 3e-4\n"
                "  labq submit --class low --name sweep-1 --env WANDB_API_KEY -- ./sweep.sh 1\n"
                "  labq submit --after 12 -- python eval.py        runs once job 12 has succeeded", _submit, c)
    p.add_argument("--gpus", type=int, default=1, metavar="N", help="GPUs the job needs (default 1)")
    p.add_argument("--gpu-mem", metavar="SIZE", help="least memory per GPU: 40G, 24GiB, 8000M (plain number: GiB)")
    p.add_argument("--gpu-model", metavar="MODEL", help="part of the GPU model name: A100, 3090")
    prio = p.add_mutually_exclusive_group()
    prio.add_argument("--class", dest="klass", choices=CLASSES, help="priority class (default normal)")
    prio.add_argument("--priority", metavar="INT|NAME", help="priority 0-1000 or a class name (normal is 200)")
    p.add_argument("--time", metavar="DURATION", help="time limit: 90m, 2h, 1d, 1:30:00; the checkpoint signal "
                   "comes a grace before it")
    p.add_argument("--requeue-on-timeout", action="store_true",
                   help="at the time limit, checkpoint and requeue (resume later) instead of ending")
    p.add_argument("--name", help="a name to find the job by")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="set a variable; --env K copies K from this shell (repeatable)")
    p.add_argument("--workdir", metavar="DIR", help="where it runs (default: the current folder)")
    p.add_argument("--no-preempt", action="store_true", help="never stop this job for a higher-priority one "
                   "(admins, and users the admin allows)")
    p.add_argument("--image", metavar="IMAGE", help="run in a container from IMAGE (present on the nodes)")
    p.add_argument("--mount", action="append", metavar="SRC:DST[:ro]",
                   help="bind a host folder into the container (under the admin's allowed roots); repeatable")
    p.add_argument("--shm-size", metavar="SIZE", help="the container's /dev/shm (default 1G)")
    p.add_argument("--after", action="append", default=[], metavar="ID[,ID]",
                   help="start only after these jobs have succeeded")
    p.add_argument("--nodes", type=int, metavar="N", help="spread the GPUs evenly over N nodes")
    p.add_argument("--node", metavar="NAME", help="run only on this node")
    p.add_argument("--reservation", metavar="NAME", help="run on a reservation's GPUs (you must be one of its "
                   "users); waits for its start")
    p.add_argument("--after-reservation", choices=("queue", "cancel"),
                   help="if the reservation ends (or is cancelled) before the job starts: queue it normally "
                   "on any GPUs (default) or cancel it")
    p.add_argument("--grace", metavar="DURATION", help="time to checkpoint before a stop (default 60s)")
    p.add_argument("--checkpoint-signal", metavar="SIGNAL", help="signal asking the job to checkpoint "
                   "(default SIGUSR1)")
    p.add_argument("--json", action="store_true", help="print the job as JSON")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments, after --")


def _add_views(sub: argparse._SubParsersAction, c: list) -> None:
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


def _add_actions(sub: argparse._SubParsersAction, c: list) -> None:
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


def _add_lab(sub: argparse._SubParsersAction, c: list) -> None:
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
