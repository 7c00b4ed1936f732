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
    parse_ids,
)
from labq.cli.errors import CliError
from labq.cli.spec_flags import FLAGGED, add_flag, flag_value
from labq.models.spec import BY_NAME, STANDARD_PATH, Field
from labq.terminal_text import escape_controls

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

    Each field with a flag (``labq.models.spec.FIELDS``) is read by its kind (``labq.spec_text``), or by a
    reader of its own here (``_OWN``) where flags work together; then the rules between flags. The body is built
    by ``labq.protocol.requests.submit_request``."""
    from labq.protocol.requests import submit_request

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise CliError("name the command to run after --, e.g. labq submit --gpus 2 -- python3 train.py")
    _rules(args)
    context = {"environ": os.environ if environ is None else environ, "cwd": cwd or os.getcwd()}
    values = {field.name: _OWN.get(field.name, flag_value)(args, field, context) for field in FLAGGED}
    values["environment"] = _environment(args, context)
    return submit_request(command, image=args.image or None, **{k: v for k, v in values.items() if k != "image"})


def _export(args: argparse.Namespace, field: Field, context: dict) -> str | None:
    if args.export and args.image:
        raise CliError("--export is for process jobs: a container job gets its image's environment, and --env")
    return args.export or None


def _environment(args: argparse.Namespace, context: dict) -> dict[str, str] | None:
    """What of this shell's environment the job takes (``--export``; ALL when not given, unless the lab's
    settings say NONE); a container job takes none."""
    if args.image:
        return None
    from labq.protocol.submit import MAX_ENV_BYTES, exported

    try:
        taken = exported(args.export, context["environ"])
    except ValueError as err:
        raise CliError(str(err)) from None
    size = sum(len(k) + len(v.encode(errors="replace")) + 2 for k, v in taken.items())
    if size > MAX_ENV_BYTES:
        raise CliError(f"this shell's environment is {size // 1024} KiB, more than a job takes "
                       f"({MAX_ENV_BYTES // 1024} KiB): name what the job needs (--export PATH,VIRTUAL_ENV) or "
                       "--export NONE")
    return taken


def _unknown_program(body: dict, cwd: str) -> str | None:
    """A note when the program is not found here on the PATH the job gets: it may still be on its node."""
    program = body["command"][0]
    if body.get("image"):
        return None
    if "/" in program:
        where = os.path.join(body.get("workdir") or cwd, program)
        return None if os.access(where, os.X_OK) else f"{program} is not an executable file here"
    path = body.get("environment", {}).get("PATH") or STANDARD_PATH
    if any(os.access(os.path.join(folder, program), os.X_OK) for folder in path.split(":") if folder):
        return None
    return f"{program!r} is not on the job's PATH here; it runs only if its node has it"


def _rules(args: argparse.Namespace) -> None:
    """What one flag says of another, refused before any request."""
    if args.share:
        if not args.gpu_mem:
            raise CliError("--share needs --gpu-mem SIZE: the most GPU memory the job uses (e.g. --share --gpu-mem "
                           "10G); it shares a GPU with jobs whose memory fits beside it")
        if args.gpus != 1 or args.nodes not in (None, 1):
            raise CliError("--share runs a job on part of one GPU: leave out --gpus (or give --gpus 1)")
    if args.nodes is not None and (args.nodes < 1 or args.gpus % args.nodes):
        raise CliError(f"--nodes {args.nodes}: the {args.gpus} GPUs must split evenly over the nodes")
    if args.requeue_on_timeout and not args.time:
        raise CliError("--requeue-on-timeout needs --time: the limit at which the job is requeued")
    if args.after_reservation and not args.reservation:
        raise CliError("--after-reservation says what happens when the job's reservation ends; "
                       "give --reservation NAME too")
    if args.after and args.after_any:
        raise CliError("--after waits for success, --after-any for any end: use one of them")


def _gpu_memory(args: argparse.Namespace, field: Field, context: dict) -> int | None:
    """``--gpu-mem``: the least memory per GPU, unless ``--share`` makes it the memory the job declares."""
    return None if args.share else flag_value(args, field, context)


def _share(args: argparse.Namespace, field: Field, context: dict) -> int | None:
    """``--share --gpu-mem 10G``: the GPU memory the job declares it uses, sharing one GPU; None without --share."""
    return flag_value(args, BY_NAME["min_gpu_memory_mib"], context) if args.share else None


def _priority(args: argparse.Namespace, field: Field, context: dict) -> int | str | None:
    return args.klass or flag_value(args, field, context)


def _workdir(args: argparse.Namespace, field: Field, context: dict) -> str | None:
    """Where it runs: the current folder, or one from there (``~`` expanded); a container starts in its image's
    folder unless told."""
    if args.image:
        return args.workdir or None
    return os.path.abspath(os.path.join(context["cwd"], os.path.expanduser(args.workdir or ".")))


def _env(args: argparse.Namespace, field: Field, context: dict) -> dict[str, str] | None:
    return parse_env(args.env, context["environ"]) if args.env else None


def _mounts(args: argparse.Namespace, field: Field, context: dict) -> list:
    if args.mount and not args.image:
        raise CliError(f"{field.flag} is for container jobs: add --image IMAGE")
    return [parse_mount(m, context["cwd"]) for m in args.mount or ()]


def _dependencies(args: argparse.Namespace, field: Field, context: dict) -> list[int | str] | None:
    """The jobs ``--after`` (or ``--after-any``) names: ids (an array's id waits for all its tasks) and tasks
    (``12.3``, found by their job id before the submit)."""
    if args.after_any:
        return parse_ids(args.after_any, "job id for --after-any")
    return parse_ids(args.after, "job id for --after") if args.after else None


def _notify(args: argparse.Namespace, field: Field, context: dict) -> list[str] | None:
    """``--notify end,fail`` as the body's list; ``none``: no notification, not even the defaults of
    ``labq notify``; not given: those defaults."""
    if not args.notify:
        return None
    from labq.protocol.requests import notify_words

    try:
        return notify_words(args.notify)
    except ValueError as err:
        raise CliError(str(err)) from None


#: the fields whose flags work together, or whose text is not one value, with their readers
_OWN = {"min_gpu_memory_mib": _gpu_memory, "share_mib": _share, "priority": _priority, "workdir": _workdir,
        "env": _env, "mounts": _mounts, "depends_on": _dependencies,
        "after_any": lambda args, field, context: bool(args.after_any) or None, "notify": _notify,
        "export": _export}


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
    unknown = _unknown_program(body, os.getcwd())
    if unknown is not None:
        print(f"labq: note: {escape_controls(unknown)}", file=sys.stderr)
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
                "are free, with this shell's environment (its PATH: an active venv's or conda's python runs; "
                "--export says otherwise; a container job gets its image's environment and --env instead), and a "
                "TMPDIR of its own. Put labq's options first, then -- and the command. To make room for higher-priority "
                "work labq sends a job its checkpoint signal, waits the grace, stops it and requeues it to "
                "resume: the job sees LABQ_CHECKPOINT_DIR, LABQ_RESUMED and LABQ_PREEMPT_SIGNAL (README: "
                "Checkpoint and resume).",
                "  labq submit --gpus 2 --gpu-mem 40G --time 6h -- python3 train.py --lr 3e-4\n"
                "  labq submit --class low --name sweep-1 --env WANDB_API_KEY -- ./sweep.sh 1\n"
                "  labq submit --after 12 -- python3 eval.py       runs once job 12 has succeeded\n"
                "  labq submit --after-any 12 -- ./cleanup.sh      runs once job 12 has ended, however\n"
                "  labq submit --notify end,fail -- python3 train.py  e-mail or chat when it ends\n"
                "  labq submit --array 0-99%8 -- python3 train.py --shard {index}   100 tasks, 8 at a time\n"
                "  labq submit --grid lr=1e-3,3e-4 --grid seed=0,1,2 -- python3 train.py --lr {lr} --seed {seed}\n"
                "  labq submit --share --gpu-mem 10G -- python3 eval.py   shares a GPU with jobs that fit beside it\n"
                "  labq submit --cpus 8 --mem 64G -- python3 train.py  8 cores near its GPU, killed past 64 GiB\n"
                "  labq submit --export NONE -- ./run.sh     the node's standard environment, not this shell's",
                _submit, c)
    for field in FLAGGED:
        add_flag(p, field, field.help)
    p.set_defaults(gpus=1)  # the body always says how many GPUs, and the rules between flags read it
    p.add_argument("--array", metavar="INDICES", help="many tasks of this job, one per index: 0-99, 1-9:2 (a step), "
                   "1,5,9; %%N runs at most N at once (0-99%%8); {index} in the command and LABQ_ARRAY_INDEX in the "
                   "environment are each task's own. With --grid: only %%N")
    p.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2",
                   help="a task per combination of the grids' values (several --grid: every combination, the first "
                   "slowest); {NAME} in the command and LABQ_PARAM_NAME in the environment are each task's own; a "
                   'value with a comma in double quotes')
    p.add_argument("--json", action="store_true", help="print the job as JSON")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program and its arguments, after --")


