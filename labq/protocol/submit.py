"""A submission on the wire, as a matched pair derived from the one declaration of a job's fields
(``labq.models.spec.FIELDS``): ``submit_request`` makes the ``POST /v1/jobs`` body from plain values (seconds,
MiB, absolute paths), and ``parse_submit`` reads it back, field by field, each error naming its field.

Each field is read by its kind (``_READ``); then the rules between fields (``_rules``). A new field of a kind
already here needs nothing in this module. The models are loaded only by the parser (``labq submit`` builds
its body without ``dataclasses``), and what it returns is defined in ``labq.protocol.checked``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from labq.models.spec import BY_NAME, CONTAINER_ONLY, SENT, Field, Runtime
from labq.protocol.errors import bad_request
from labq.protocol.fields import Fields, utf8_len

TYPE_CHECKING = False  # typing's, without importing typing (type checkers take it as true)
if TYPE_CHECKING:
    from labq.models.job import Mount
    from labq.protocol.checked import SubmitRequest

MAX_COMMAND_BYTES = 64 * 1024
MAX_ARGS = 4096
MAX_ENV_BYTES = 64 * 1024
MAX_ARRAY_TEXT = 4096  #: the longest ``array`` text, and each ``grid`` text
MAX_GRIDS = 16  #: the most grids of one submit
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,255}"  #: compiled (and kept by ``re``) on first use: `labq submit` sends it
#: the moments ``labq submit --notify`` may name (``labq.models.notify.JOB_EVENTS``, as words: the CLI loads no model)
NOTIFY_WORDS = ("start", "end", "fail", "preempt")
#: a field whose default the lab's settings give (``[jobs] grace``): left out of a request, it is not filled in
LAB_DEFAULTS = ("grace_s",)
#: what ``--export`` never takes from the submitter's shell: credentials of that session (``LABQ_TOKEN``, the SSH
#: and GPG agents, Kerberos), its display and desktop session, what belongs to the node's account (its home, its
#: names), what labq sets itself (``LABQ_*``, the GPUs, ``TMPDIR``) and the shell's own bookkeeping
NEVER_EXPORTED = frozenset({
    "SSH_AUTH_SOCK", "SSH_AGENT_PID", "SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY", "SSH_ASKPASS", "GPG_AGENT_INFO",
    "KRB5CCNAME", "DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY", "XDG_RUNTIME_DIR", "XDG_SESSION_ID",
    "XDG_SESSION_TYPE", "XDG_SESSION_CLASS", "XDG_SEAT", "XDG_VTNR", "HOME", "USER", "LOGNAME", "MAIL", "HOSTNAME",
    "PWD", "OLDPWD", "SHLVL", "_", "TMPDIR", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "TERM_SESSION_ID",
})
NEVER_EXPORTED_PREFIXES = ("LABQ_", "DBUS_", "BASH_FUNC_")


def never_exported(name: str) -> bool:
    return name in NEVER_EXPORTED or name.startswith(NEVER_EXPORTED_PREFIXES)


def exported(text: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` (the submitting shell's) that ``--export`` ``text`` gives a job, as sbatch's
    ``--export``: ``ALL`` (also None) every one, ``NONE`` none, ``A,B`` only those, ``ALL,A=1`` all and A set to 1;
    never those of ``never_exported``, nor a name that is no variable's (a shell function's). ValueError says
    what is wrong with ``text``."""
    if text is not None and not text.replace(",", "").strip():
        raise ValueError("--export needs ALL, NONE or names (A,B or A=value)")
    words = [w for w in (text or "ALL").split(",") if w.strip()]
    named: dict[str, str] = {}
    every = False
    for word in words:
        key, eq, value = word.partition("=")
        key = key.strip()
        if not eq and key.upper() in ("ALL", "NONE"):
            if key.upper() == "NONE" and len(words) > 1:
                raise ValueError("--export NONE exports nothing: it takes no names with it")
            every = every or key.upper() == "ALL"
            continue
        if not re.fullmatch(ENV_NAME, key):
            raise ValueError(f"--export {key!r} is not a variable's name: letters, digits and _")
        if never_exported(key):
            raise ValueError(f"--export {key}: never exported (a credential, the session's own, or labq's)")
        if not eq:
            if key not in environ:
                raise ValueError(f"--export {key}: {key} is not set in this shell (use {key}=VALUE)")
            value = environ[key]
        named[key] = value
    taken = {k: v for k, v in environ.items() if re.fullmatch(ENV_NAME, k) and not never_exported(k)} if every else {}
    return {**taken, **named}


# -- the body ------------------------------------------------------------------------------------

def _seconds(value: float) -> int | float:
    """A whole number of seconds goes out as an integer: ``5400``, not ``5400.0``."""
    return int(value) if float(value).is_integer() else value


#: a plain value to its form in a body, by kind; the rest go as they are
_TO_BODY = {
    "duration": _seconds, "env": dict, "ids": list, "events": list, "argv": list,
    "mounts": lambda mounts: [{"source": m.source, "target": m.target, "read_only": m.read_only} for m in mounts],
    "choice": lambda choice: getattr(choice, "value", choice),
}


def submit_request(command: Sequence[str], *, image: str | None = None, array: str | None = None,
                   grid: Sequence[str] = (), **values) -> dict:
    """The ``POST /v1/jobs`` body that ``parse_submit`` reads back: only what was chosen. ``values`` are fields of
    ``labq.models.spec.FIELDS`` by name, as plain values; None, an empty list and a switch at its default are
    left out. An ``image`` makes it a container job (``runtime`` docker); ``array``/``grid`` make it many."""
    body: dict = {"command": list(command)}
    for name, value in values.items():
        field = BY_NAME.get(name)
        if field is None or not field.sent or name in ("command", "image", "runtime"):
            raise TypeError(f"submit_request() got an unexpected keyword argument {name!r}")
        if value is None or (field.kind == "switch" and value == field.default) or (
                field.kind in ("env", "ids", "mounts") and not value):
            continue
        body[name] = _TO_BODY[field.kind](value) if field.kind in _TO_BODY else value
    if image is not None:
        body["runtime"], body["image"] = "docker", image
    if array is not None:
        body["array"] = array
    if grid:
        body["grid"] = list(grid)
    return body


def notify_words(texts: Sequence[str]) -> list[str]:
    """``--notify`` as typed, repeatable and comma-separated (``["end,preempt", "fail"]``), as the body's list of
    moments (``["end", "preempt", "fail"]``); ``none`` alone asks for none (``[]``: not even the owner's defaults).
    ValueError says what is accepted."""
    words = [w.strip().lower() for text in texts for w in text.split(",") if w.strip()]
    if words == ["none"]:
        return []
    wrong = [w for w in words if w not in NOTIFY_WORDS]
    if wrong or not words:
        shown = repr(wrong[0]) if wrong else "nothing"
        raise ValueError(f"--notify {shown} is not a moment of a job: use {', '.join(NOTIFY_WORDS)} (several "
                         "with commas: end,fail), or none")
    return list(dict.fromkeys(words))


# -- reading it back, field by field -------------------------------------------------------------

def _command(f: Fields, field: Field) -> tuple[str, ...]:
    value = f.raw(field.name, required=True)
    if not isinstance(value, list) or not value:
        raise bad_request("command must be a non-empty list of strings (the program and its arguments)", "command")
    if len(value) > MAX_ARGS:
        raise bad_request(f"command has more than {MAX_ARGS} arguments", "command")
    total = 0
    for arg in value:
        if not isinstance(arg, str):
            raise bad_request("command must be a list of strings", "command")
        total += utf8_len("command", arg) + 1
    if total > MAX_COMMAND_BYTES:
        raise bad_request(f"command is longer than {MAX_COMMAND_BYTES // 1024} KiB; put long inputs in a file",
                          "command")
    if not value[0]:
        raise bad_request("command must start with a program name", "command")
    return tuple(value)


def _env(f: Fields, field: Field) -> tuple[tuple[str, str], ...]:
    value, name = f.raw(field.name), field.name
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise bad_request(f"{name} must be an object of NAME: value strings", name)
    total = 0
    for key, val in value.items():
        if not isinstance(key, str) or not re.fullmatch(ENV_NAME, key):
            raise bad_request(f"{name} name {key!r} is not valid: letters, digits and _, not starting with a digit",
                              name)
        if not isinstance(val, str):
            raise bad_request(f"{name} {key} must be a string", name)
        if key.startswith("LABQ_"):
            raise bad_request(f"{name} {key}: LABQ_ variables are set by labq itself", name)
        total += len(key) + utf8_len(name, val) + 2
    if total > MAX_ENV_BYTES:
        raise bad_request(f"{name} is larger than {MAX_ENV_BYTES // 1024} KiB", name)
    return tuple(sorted(value.items()))


def _mounts(f: Fields, field: Field) -> tuple[Mount, ...]:
    """The shape of bind mounts; where they may point is the leader's policy (labq.isolation)."""
    from labq.models.job import Mount

    value = f.raw(field.name)
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > 64:
        raise bad_request("mounts must be a list of {source, target, read_only}", "mounts")
    mounts = []
    for item in value:
        m = Fields(item, "a mount", "mounts.")
        source = m.string("source", required=True, max_len=4096)
        target = m.string("target", required=True, max_len=4096)
        read_only = m.boolean("read_only", default=False)
        m.done()
        if not source.startswith("/") or not target.startswith("/"):
            raise bad_request(f"mount {source}:{target}: both paths must be absolute", "mounts")
        mounts.append(Mount(source, target, read_only))
    return tuple(mounts)


def _signal(f: Fields, field: Field) -> str | None:
    value = f.string(field.name, max_len=field.max_len)
    if value is None:
        return None  # declared none: the job is stopped with TERM and its grace
    from labq.models.job import catchable_signal

    name = catchable_signal(value)
    if name is None:
        raise bad_request(f"{field.name} {value!r} is not a signal a job can catch (e.g. SIGUSR1, SIGTERM)",
                          field.name)
    return name


def priority_value(raw: object) -> int | None:
    """A priority as a body sends it (a class name or 0-1000) as its number; 400 for anything else."""
    from labq.models.priority import parse_priority

    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, str)) or (isinstance(raw, str) and raw.strip()[:1] in "+-"
                                                                     and raw.strip()):
        raise bad_request("priority must be low, normal, high, urgent or an integer 0-1000 (a change such as "
                          "+10 goes in by)", "priority")
    try:
        return parse_priority(raw)
    except ValueError as err:
        raise bad_request(str(err), "priority") from None


def _ids(f: Fields, field: Field) -> tuple[int, ...] | None:
    value = f.raw(field.name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i > 0
                                              for i in value) or len(value) > 1000:
        raise bad_request(f"{field.name} must be a list of job ids", field.name)
    return tuple(value)


def _events(f: Fields, field: Field):
    value = f.raw(field.name)
    if value is None:
        return None
    from labq.models.notify import JOB_EVENTS
    from labq.protocol.notify import events_of

    return events_of(value, field.name, JOB_EVENTS)


def _choice(f: Fields, field: Field):
    value = f.string(field.name, max_len=16)
    if value is None:
        return None
    try:
        return field.choices(value)
    except ValueError:
        allowed = " or ".join(c.value for c in field.choices)
        raise bad_request(f"{field.name} must be {allowed}, not {value!r}", field.name) from None


def _path(f: Fields, field: Field) -> str | None:
    value = f.string(field.name, max_len=field.max_len)
    if value is not None and not value.startswith("/"):
        raise bad_request(f"{field.name} must be an absolute path", field.name)
    return value


#: how each kind of field is read from a body (``labq.models.spec.KINDS``)
_READ = {
    "count": lambda f, field: f.integer(field.name, low=int(field.low), high=int(field.high)),
    "size": lambda f, field: f.integer(field.name, low=int(field.low), high=int(field.high)),
    "number": lambda f, field: f.number(field.name, low=field.low, high=field.high),
    "duration": lambda f, field: f.number(field.name, low=field.low, high=field.high),
    "text": lambda f, field: f.string(field.name, max_len=field.max_len),
    "name": lambda f, field: f.name(field.name, field.what),
    "switch": lambda f, field: f.boolean(field.name, default=field.default),
    "path": _path, "choice": _choice, "signal": _signal, "argv": _command, "env": _env, "mounts": _mounts,
    "priority": lambda f, field: priority_value(f.raw(field.name)), "ids": _ids, "events": _events,
}


def parse_submit(body: object) -> SubmitRequest:
    """A submit body as the fields of a spec (each one sent, else its default; the lab's defaults stay out) and
    the tasks of its array or grid; 400 naming the field for anything else."""
    from labq.protocol.checked import SubmitRequest

    f = Fields(body, "a job")
    out: dict = {}
    sent: set[str] = set()
    for field in SENT:
        value = _READ[field.kind](f, field)
        if field.name in f.body and f.body[field.name] is not None:
            sent.add(field.name)
        elif value is None and field.name not in LAB_DEFAULTS:
            value = field.default
        if value is not None:
            out[field.name] = value
    _rules(out, sent)
    sweep = _sweep(f.string("array", max_len=MAX_ARRAY_TEXT), f.raw("grid"))
    f.done()
    return SubmitRequest(out, sweep)


def _rules(out: dict, sent: set[str]) -> None:
    """What one field says of another (``sent``: the fields the body gave): 400 naming the field that needs
    the other."""
    if out.get("share_mib") is not None and (out["gpus"] != 1 or out["nodes"] != 1):
        raise bad_request("a job that shares a GPU by memory (share_mib) runs on one GPU: gpus must be 1",
                          "share_mib")
    if out["requeue_on_timeout"] and out.get("time_limit_s") is None:
        raise bad_request("requeue_on_timeout needs a time limit (time_limit_s)", "requeue_on_timeout")
    _where(out, sent)
    if "after_reservation" in sent and out.get("reservation") is None:
        raise bad_request("after_reservation says what happens when the job's reservation ends; name the "
                          "reservation too", "after_reservation")
    if out["after_any"] and not out["depends_on"]:
        raise bad_request("after_any says how the jobs in depends_on must end; name them too", "after_any")
    refused = sorted(name for name, _ in out["environment"] if never_exported(name))
    if refused:
        raise bad_request(f"environment {', '.join(refused)}: never exported (a credential, the session's own, or "
                          "labq's)", "environment")
    if out.get("export") is not None:
        try:
            exported(out["export"], dict(out["environment"]))
        except ValueError as err:
            raise bad_request(str(err).replace("--export", "export"), "export") from None
    if out["environment"] and out["runtime"] is Runtime.DOCKER:
        raise bad_request("environment is for process jobs: a container job gets its image's environment and "
                          "env", "environment")


def _where(out: dict, sent: set[str]) -> None:
    """One reading of where a job runs: an image means a container; what contradicts that is refused, so a job
    never runs as a plain process on the host when its sender asked for a container."""
    image, runtime = out.get("image"), out["runtime"]
    if image is not None and not image.strip():
        raise bad_request("image is empty", "image")
    if runtime is Runtime.PROCESS and image is not None and "runtime" in sent:
        raise bad_request("runtime is process but an image is given: an image runs in a container; "
                          'send runtime "docker" (or leave it out) with the image, or no image', "runtime")
    if runtime is Runtime.DOCKER and image is None:
        raise bad_request("runtime docker needs an image", "image")
    if image is None:
        extra = [f.name for f in CONTAINER_ONLY if f.name in sent and out[f.name]]
        if extra:
            raise bad_request(f"{' and '.join(extra)} {'are' if len(extra) > 1 else 'is'} for container jobs: "
                              "give an image (--image); a process job runs on the host and sees its files", extra[0])
    out["runtime"] = Runtime.DOCKER if image is not None else Runtime.PROCESS


def _sweep(array: str | None, grid: object):
    """``array`` (``0-99%8``) and ``grid`` (``["lr=1e-3,3e-4", ...]``) as the tasks they make; None for one job."""
    if grid is not None and (not isinstance(grid, list) or not all(isinstance(g, str) and len(g) <= MAX_ARRAY_TEXT
                                                                  for g in grid) or len(grid) > MAX_GRIDS):
        raise bad_request(f"grid must be a list of at most {MAX_GRIDS} NAME=V1,V2,... texts", "grid")
    if array is None and not grid:
        return None
    from labq.models.arrays import sweep

    try:
        return sweep(array, grid or ())
    except ValueError as err:
        raise bad_request(str(err), "grid" if grid else "array") from None
