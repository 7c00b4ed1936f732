"""``labq submit``, and the family of job commands: views (``labq.cli.views``) and actions (``labq.cli.actions``).

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
from collections.abc import Mapping

from labq.cli.common import (
    command,
    emit,
    leader_client,
    leader_option,
    parse_duration,
    parse_ids,
    parse_priority_arg,
    parse_signal,
    parse_size_mib,
)
from labq.cli.errors import CliError
from labq.terminal_text import escape_controls

CLASSES = ("low", "normal", "high", "urgent")


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
        min_gpu_memory_mib=parse_size_mib(args.gpu_mem) if args.gpu_mem and not args.share else None,
        share_mib=_share(args),
        gpu_model=args.gpu_model or None,
        priority=args.klass or (parse_priority_arg(args.priority) if args.priority else None),
        preemptible=not args.no_preempt,
        time_limit_s=_time_limit(args.time),
        requeue_on_timeout=_requeue_on_timeout(args),
        grace_s=parse_duration(args.grace, "--grace", bare_seconds=True) if args.grace else None,
        checkpoint_signal=parse_signal(args.checkpoint_signal) if args.checkpoint_signal else None,
        env=parse_env(args.env, os.environ if environ is None else environ) if args.env else None,
        depends_on=_dependencies(args), after_any=bool(args.after_any),
        nodes=_node_count(args), node=args.node or None, reservation=args.reservation or None,
        queue=args.queue or None,
        after_reservation=_after_reservation(args),
        notify=_notify(args.notify),
        image=args.image or None,
        mounts=[parse_mount(m, cwd) for m in _container_only(args, "mount")],
        shm_size_mib=parse_size_mib(args.shm_size, "--shm-size") if _container_only(args, "shm_size") else None)


def _share(args: argparse.Namespace) -> int | None:
    """``--share --gpu-mem 10G``: the GPU memory the job declares it uses, sharing one GPU; None without --share."""
    if not args.share:
        return None
    if not args.gpu_mem:
        raise CliError("--share needs --gpu-mem SIZE: the most GPU memory the job uses (e.g. --share --gpu-mem 10G); "
                       "it shares a GPU with jobs whose memory fits beside it")
    if args.gpus != 1 or args.nodes not in (None, 1):
        raise CliError("--share runs a job on part of one GPU: leave out --gpus (or give --gpus 1)")
    return parse_size_mib(args.gpu_mem)


def _notify(texts: list[str]) -> list[str] | None:
    """``--notify end,fail`` as the body's list; ``none``: no notification, not even the defaults of
    ``labq notify``; not given: those defaults."""
    if not texts:
        return None
    from labq.protocol.requests import notify_words

    try:
        return notify_words(texts)
    except ValueError as err:
        raise CliError(str(err)) from None


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


def _dependencies(args: argparse.Namespace) -> list[int | str] | None:
    """The jobs ``--after`` (or ``--after-any``) names: ids (an array's id waits for all its tasks) and tasks
    (``12.3``, found by their job id before the submit)."""
    if args.after and args.after_any:
        raise CliError("--after waits for success, --after-any for any end: use one of them")
    if args.after_any:
        return parse_ids(args.after_any, "job id for --after-any")
    return parse_ids(args.after, "job id for --after") if args.after else None


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


# -- running commands -----------------------------------------------------------------------------

def _submit(args: argparse.Namespace) -> int:
    body = build_submit_body(args)
    if any(isinstance(ref, str) for ref in body.get("depends_on", ())):  # an array's task (12.3): its job id
        client = leader_client(args)
        body["depends_on"] = [client.job(ref)[0]["id"] if isinstance(ref, str) else ref for ref in body["depends_on"]]
    if args.array is not None or args.grid:
        return _submit_sweep(args, body)
    job = leader_client(args).submit(body)
    name = job["spec"].get("name")
    return emit(args, job, lambda: f"submitted job {job['id']}" + (f" ({escape_controls(name)})" if name else ""))


def _submit_sweep(args: argparse.Namespace, body: dict) -> int:
    """An array or a grid: checked here first (a clear error before the leader is asked), then one submit."""
    from labq.models.arrays import sweep, unknown_placeholders

    try:
        tasks = sweep(args.array, args.grid)
    except ValueError as err:
        raise CliError(str(err)) from None
    typos = unknown_placeholders(body["command"], tasks.names)
    if typos:
        print(f"labq: note: {', '.join('{' + t + '}' for t in typos)} in the command is neither {{index}} nor a "
              "--grid name: it is passed as typed", file=sys.stderr)
    body["array"] = args.array
    if args.grid:
        body["grid"] = list(args.grid)
    answer = leader_client(args).submit_sweep(body)
    array = answer["array"]
    first, last = tasks.tasks[0].index, tasks.tasks[-1].index
    cap = f", at most {array['cap']} at once" if array.get("cap") else ""
    return emit(args, answer, lambda: f"submitted array {array['id']}: {array['tasks']} task"
                f"{'s' if array['tasks'] != 1 else ''} ({array['id']}.{first} to {array['id']}.{last}){cap}")


# -- the parsers ----------------------------------------------------------------------------------

def add_commands(sub: argparse._SubParsersAction) -> None:
    """Registers the job commands on ``labq``'s subparsers (called from ``labq.cli``)."""
    c = [leader_option()]
    _add_submit(sub, c)
    if getattr(sub, "only", None) == "submit":  # built alone: the views and actions are not even imported
        return
    from labq.cli import actions, views

    views.add_views(sub, c)
    actions.add_actions(sub, c)
    views.add_lab(sub, c)


def _add_submit(sub: argparse._SubParsersAction, c: list) -> None:
    p = command(sub, "submit", "queue a command to run on GPUs",
                "Queue a command to run as you, in --workdir (default: here), on the GPUs labq picks once they "
                "are free. Put labq's options first, then -- and the command. To make room for higher-priority "
                "work labq sends a job its checkpoint signal, waits the grace, stops it and requeues it to "
                "resume: the job sees LABQ_CHECKPOINT_DIR, LABQ_RESUMED and LABQ_PREEMPT_SIGNAL (README: "
                "Checkpoint and resume).",
                "  labq submit --gpus 2 --gpu-mem 40G --time 6h -- python train.py --lr 3e-4\n"
                "  labq submit --class low --name sweep-1 --env WANDB_API_KEY -- ./sweep.sh 1\n"
                "  labq submit --after 12 -- python eval.py        runs once job 12 has succeeded\n"
                "  labq submit --after-any 12 -- ./cleanup.sh      runs once job 12 has ended, however\n"
                "  labq submit --notify end,fail -- python train.py  e-mail or chat when it ends\n"
                "  labq submit --array 0-99%8 -- python train.py --shard {index}   100 tasks, 8 at a time\n"
                "  labq submit --grid lr=1e-3,3e-4 --grid seed=0,1,2 -- python train.py --lr {lr} --seed {seed}\n"
                "  labq submit --share --gpu-mem 10G -- python eval.py   shares a GPU with jobs that fit beside it",
                _submit, c)
    p.add_argument("--gpus", type=int, default=1, metavar="N", help="GPUs the job needs (default 1)")
    p.add_argument("--gpu-mem", metavar="SIZE", help="least memory per GPU: 40G, 24GiB, 8000M (plain number: GiB); "
                   "with --share, the most GPU memory the job uses")
    p.add_argument("--share", action="store_true",
                   help="share one GPU with other jobs by memory: placed where --gpu-mem fits beside the jobs there "
                        "(and beside programs outside labq), and stopped through its checkpoint signal, then "
                        "requeued, if it uses more than that by over the margin (5%% of the GPU, at least 512 MiB)")
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
                   help="start only after these jobs have succeeded (if one fails, this job is cancelled)")
    p.add_argument("--after-any", action="append", default=[], metavar="ID[,ID]",
                   help="start after these jobs have ended, however they ended")
    p.add_argument("--nodes", type=int, metavar="N", help="spread the GPUs evenly over N nodes")
    p.add_argument("--node", metavar="NAME", help="run only on this node")
    p.add_argument("--queue", metavar="NAME", help="the lab queue (team) to serve it in (default: your only "
                   "queue, or the lab's default; `labq queues` lists them)")
    p.add_argument("--reservation", metavar="NAME", help="run on a reservation's GPUs (you must be one of its "
                   "users); waits for its start")
    p.add_argument("--after-reservation", choices=("queue", "cancel"),
                   help="if the reservation ends (or is cancelled) before the job starts: queue it normally "
                   "on any GPUs (default) or cancel it")
    p.add_argument("--grace", metavar="DURATION", help="time to checkpoint before a stop (default 60s)")
    p.add_argument("--checkpoint-signal", metavar="SIGNAL", help="signal the job saves and exits 0 on "
                   "(e.g. SIGUSR1; default: what its image's label labq.checkpoint-signal or the job's own "
                   "`labq checkpoint --signal` declares, else a stop is TERM and the grace)")
    p.add_argument("--notify", action="append", default=[], metavar="WHEN[,WHEN]",
                   help="tell you when it starts, ends (succeeds), fails (times out, its node is lost, or someone "
                   "else or the lab cancels it) or is preempted (requeued): start, end, fail, preempt; several with "
                   "commas; none: not at all (default: what `labq notify` set)")
    p.add_argument("--array", metavar="INDICES", help="many tasks of this job, one per index: 0-99, 1-9:2 (a step), "
                   "1,5,9; %%N runs at most N at once (0-99%%8); {index} in the command and LABQ_ARRAY_INDEX in the "
                   "environment are each task's own. With --grid: only %%N")
    p.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2",
                   help="a task per combination of the grids' values (several --grid: every combination, the first "
                   "slowest); {NAME} in the command and LABQ_PARAM_NAME in the environment are each task's own; a "
                   'value with a comma in double quotes')
    p.add_argument("--json", action="store_true", help="print the job as JSON")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments, after --")


