"""What people and agents may send, checked field by field before anything is stored.

Every check raises ``ApiError`` (400 bad_request) naming the field and saying
what is accepted. Unknown fields are refused rather than ignored, so a typo
never silently changes what runs.

Each request has its builder beside its parser, a matched pair: ``submit_request`` makes from plain
values (already-parsed durations, sizes, lists) the body that ``parse_submit`` reads back. The CLI and
the TUI both build their requests here. The models are imported inside the functions that need them,
and what a parser returns is defined in ``labq.protocol.checked`` (dataclasses), so ``labq submit`` can
build its body without loading either.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from labq.protocol.errors import ApiError, bad_request
from labq.protocol.names import MAX_NAME, check_name, check_user_name

TYPE_CHECKING = False  # typing's, without importing typing: 3 ms of the CLI's start (type checkers take it as true)
if TYPE_CHECKING:
    from labq.models.job import Mount
    from labq.protocol.checked import ActionRequest, JoinRequest, SubmitRequest, TokenRequest, UserRequest

#: what the parsers return, defined in ``labq.protocol.checked`` and loaded on first use (see ``__getattr__``)
CHECKED = ("ActionRequest", "JoinRequest", "SubmitRequest", "TokenRequest", "UserRequest")


def __getattr__(name: str):
    """``from labq.protocol.requests import SubmitRequest``, as before they moved to ``labq.protocol.checked``."""
    if name in CHECKED:
        from labq.protocol import checked

        return getattr(checked, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


MAX_BODY_BYTES = 1 << 20  #: a request body larger than this is refused with 413
MAX_PAGE = 5000  #: the most jobs one ``GET /v1/jobs`` may be asked for (``limit``)
PAGE = 100  #: the jobs of a page (``after``) that names no ``limit``
MAX_COMMAND_BYTES = 64 * 1024
MAX_ARGS = 4096
MAX_ENV_BYTES = 64 * 1024
MAX_GPUS = 64
MAX_ARRAY_TEXT = 4096  #: the longest ``array`` text, and each ``grid`` text
MAX_GRIDS = 16  #: the most grids of one submit
MAX_TIME_LIMIT_S = 366 * 86400
MAX_QUERY_INT = 2**53  #: the largest number a query parameter or path id may be
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,255}"  #: compiled (and kept by ``re``) on first use: `labq submit` sends it
#: the moments ``labq submit --notify`` may name (``labq.models.notify.JOB_EVENTS``, as words: the CLI loads no model)
NOTIFY_WORDS = ("start", "end", "fail", "preempt")


class Fields:
    """Typed access to a JSON object's fields; refuses unknown ones at ``done()``. Errors name the field by its
    ``path`` in the request (``node.gpus.memory_mib``) when the object is inside another."""

    def __init__(self, body: object, where: str, path: str = "") -> None:
        if not isinstance(body, Mapping):
            raise bad_request(f"{where} must be a JSON object", path.rstrip(".") or None)
        self.body = body
        self.where = where
        self.path = path
        self.seen: set[str] = set()

    def _get(self, name: str, required: bool):
        self.seen.add(name)
        if name not in self.body or self.body[name] is None:
            if required:
                raise bad_request(f"{self.where}: {name} is required", self.path + name)
            return None
        return self.body[name]

    def string(self, name: str, *, required: bool = False, max_len: int = MAX_NAME) -> str | None:
        """A short, printable string: no control characters (those are for commands and env values)."""
        value, field = self._get(name, required), self.path + name
        if value is None:
            return None
        if not isinstance(value, str):
            raise bad_request(f"{field} must be a string", field)
        if _utf8_len(field, value) > max_len:
            raise bad_request(f"{field} is longer than {max_len} bytes", field)
        if not value.isprintable():
            odd = next(c for c in value if not c.isprintable())
            raise bad_request(f"{field} {ascii(value[:64])} contains a control or unprintable character "
                              f"(U+{ord(odd):04X})", field)
        return value

    def name(self, name: str, what: str, *, required: bool = False) -> str | None:
        """A name of a job, node, reservation or group: ``labq.protocol.names``' one rule."""
        value = self._get(name, required)
        return None if value is None else check_name(value, what, self.path + name)

    def user_name(self, name: str, what: str = "user name", *, required: bool = False) -> str | None:
        value = self._get(name, required)
        return None if value is None else check_user_name(value, what, self.path + name)

    def integer(self, name: str, *, required: bool = False, low: int = 0, high: int = 2**31) -> int | None:
        value, field = self._get(name, required), self.path + name
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise bad_request(f"{field} must be an integer", field)
        if not low <= value <= high:
            raise bad_request(f"{field} must be between {low} and {high}, not {value}", field)
        return value

    def number(self, name: str, *, required: bool = False, low: float = 0.0, high: float = 1e12) -> float | None:
        value, field = self._get(name, required), self.path + name
        if value is None:
            return None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
            raise bad_request(f"{field} must be a number", field)
        if not low <= value <= high:
            raise bad_request(f"{field} must be between {low:g} and {high:g}, not {value:g}", field)
        return float(value)

    def boolean(self, name: str, *, default: bool) -> bool:
        value, field = self._get(name, False), self.path + name
        if value is None:
            return default
        if not isinstance(value, bool):
            raise bad_request(f"{field} must be true or false", field)
        return value

    def raw(self, name: str, *, required: bool = False):
        return self._get(name, required)

    def done(self) -> None:
        unknown = sorted(set(self.body) - self.seen)
        if unknown:
            shown = [u if u.isprintable() and len(u) <= 64 else ascii(u[:64]) for u in unknown[:5]]
            raise bad_request(f"{self.where}: unknown field{'s' if len(unknown) > 1 else ''} "
                              f"{', '.join(shown)}{', ...' if len(unknown) > 5 else ''}", self.path + shown[0])


def _utf8_len(name: str, value: str) -> int:
    """The length of ``value`` in UTF-8; 400 for a NUL or a lone surrogate (``labq.protocol.body`` refuses those
    already; this keeps the parse functions safe for any caller)."""
    if "\x00" in value:
        raise bad_request(f"{name} contains a NUL byte", name)
    try:
        return len(value.encode())
    except UnicodeEncodeError:
        raise bad_request(f"{name} contains a lone surrogate, which is not a character", name) from None


def _command(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise bad_request("command must be a non-empty list of strings (the program and its arguments)", "command")
    if len(value) > MAX_ARGS:
        raise bad_request(f"command has more than {MAX_ARGS} arguments", "command")
    total = 0
    for arg in value:
        if not isinstance(arg, str):
            raise bad_request("command must be a list of strings", "command")
        total += _utf8_len("command", arg) + 1
    if total > MAX_COMMAND_BYTES:
        raise bad_request(f"command is longer than {MAX_COMMAND_BYTES // 1024} KiB; put long inputs in a file",
                          "command")
    if not value[0]:
        raise bad_request("command must start with a program name", "command")
    return tuple(value)


def _env(value: object) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise bad_request("env must be an object of NAME: value strings", "env")
    total = 0
    for key, val in value.items():
        if not isinstance(key, str) or not re.fullmatch(ENV_NAME, key):
            raise bad_request(f"env name {key!r} is not valid: letters, digits and _, not starting with a digit",
                              "env")
        if not isinstance(val, str):
            raise bad_request(f"env {key} must be a string", "env")
        if key.startswith("LABQ_"):
            raise bad_request(f"env {key}: LABQ_ variables are set by labq itself", "env")
        total += len(key) + _utf8_len("env", val) + 2
    if total > MAX_ENV_BYTES:
        raise bad_request(f"env is larger than {MAX_ENV_BYTES // 1024} KiB", "env")
    return tuple(sorted(value.items()))


def _mounts(value: object) -> tuple[Mount, ...]:
    """The shape of bind mounts; where they may point is the leader's policy (labq.isolation)."""
    from labq.models.job import Mount

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


def _signal_name(value: str | None) -> str | None:
    if value is None:
        return None  # declared none: the job is stopped with TERM and its grace
    from labq.models.job import catchable_signal

    name = catchable_signal(value)
    if name is None:
        raise bad_request(f"checkpoint_signal {value!r} is not a signal a job can catch (e.g. SIGUSR1, SIGTERM)",
                          "checkpoint_signal")
    return name


def wire_priority(text: str) -> int | str:
    """A priority as people type it, as the API takes it: a class name (``High`` -> ``"high"``) or an integer
    0-1000 (``"250"`` -> 250). ValueError says what is accepted; ``+10`` is a change, not a priority."""
    from labq.models.priority import PriorityClass, parse_priority

    name = text.strip().lower()
    if name[:1] in ("+", "-"):
        raise ValueError(f"{text.strip()!r} is a change, not a priority: use low, normal, high, urgent or 0-1000")
    value = parse_priority(text)
    return name if name.upper() in PriorityClass.__members__ else value


def priority_change(text: str) -> int | None:
    """``+10`` -> 10, ``-50`` -> -50: a relative change as people type it; None for anything else."""
    word = text.strip()
    if word[:1] in ("+", "-") and word[1:].isdigit() and word[1:].isascii():
        return int(word)
    return None


def submit_request(command: Sequence[str], *, gpus: int | None = None, workdir: str | None = None,
                   name: str | None = None, min_gpu_memory_mib: int | None = None, gpu_model: str | None = None,
                   priority: int | str | None = None, preemptible: bool = True, time_limit_s: float | None = None,
                   requeue_on_timeout: bool = False, grace_s: float | None = None,
                   checkpoint_signal: str | None = None, env: Mapping[str, str] | None = None,
                   depends_on: Sequence[int] | None = None, after_any: bool = False, nodes: int | None = None,
                   node: str | None = None, reservation: str | None = None, after_reservation: str | None = None,
                   image: str | None = None, mounts: Sequence[Mount] = (), shm_size_mib: int | None = None,
                   queue: str | None = None, notify: Sequence[str] | None = None, array: str | None = None,
                   grid: Sequence[str] = (), share_mib: int | None = None) -> dict:
    """The ``POST /v1/jobs`` body that ``parse_submit`` reads back: only what differs from the defaults.

    Plain values: seconds, MiB, absolute paths. An ``image`` makes it a container job (``runtime`` docker).
    """
    body: dict = {"command": list(command)}
    optional = {"gpus": gpus, "workdir": workdir, "name": name, "min_gpu_memory_mib": min_gpu_memory_mib,
                "gpu_model": gpu_model, "priority": priority, "preemptible": None if preemptible else False,
                "time_limit_s": _seconds(time_limit_s), "requeue_on_timeout": requeue_on_timeout or None,
                "grace_s": _seconds(grace_s), "checkpoint_signal": checkpoint_signal,
                "env": dict(env) if env else None, "depends_on": list(depends_on) if depends_on else None,
                "after_any": after_any or None, "nodes": nodes, "node": node, "reservation": reservation, "after_reservation": after_reservation,
                "queue": queue, "notify": list(notify) if notify is not None else None, "array": array,
                "grid": list(grid) if grid else None, "share_mib": share_mib}
    body.update((key, value) for key, value in optional.items() if value is not None)
    if image is not None:
        body["runtime"], body["image"] = "docker", image
    if mounts:
        body["mounts"] = [{"source": m.source, "target": m.target, "read_only": m.read_only} for m in mounts]
    if shm_size_mib is not None:
        body["shm_size_mib"] = shm_size_mib
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


def _seconds(value: float | None) -> int | float | None:
    """A whole number of seconds goes out as an integer: ``5400``, not ``5400.0``."""
    return int(value) if value is not None and float(value).is_integer() else value


def parse_submit(body: object) -> SubmitRequest:
    from labq.protocol.checked import SubmitRequest

    f = Fields(body, "a job")
    out: dict = {"command": _command(f.raw("command", required=True))}
    out["gpus"] = f.integer("gpus", low=1, high=MAX_GPUS) or 1
    out["nodes"] = f.integer("nodes", low=1, high=MAX_GPUS) or 1
    out["name"] = f.name("name", "job name") or ""
    out["min_gpu_memory_mib"] = f.integer("min_gpu_memory_mib", low=0, high=10**7) or 0
    out["share_mib"] = f.integer("share_mib", low=1, high=10**7)
    if out["share_mib"] is not None and (out["gpus"] != 1 or out["nodes"] != 1):
        raise bad_request("a job that shares a GPU by memory (share_mib) runs on one GPU: gpus must be 1",
                          "share_mib")
    out["gpu_model"] = f.string("gpu_model")
    out["node"] = f.name("node", "node name")
    out["priority"] = _priority(f.raw("priority"))
    out["preemptible"] = f.boolean("preemptible", default=True)
    out["time_limit_s"] = f.number("time_limit_s", low=1, high=MAX_TIME_LIMIT_S)
    out["requeue_on_timeout"] = f.boolean("requeue_on_timeout", default=False)
    if out["requeue_on_timeout"] and out["time_limit_s"] is None:
        raise bad_request("requeue_on_timeout needs a time limit (time_limit_s)", "requeue_on_timeout")
    out["grace_s"] = f.number("grace_s", low=0, high=3600)
    out["checkpoint_signal"] = _signal_name(f.string("checkpoint_signal", max_len=16))
    out["env"] = _env(f.raw("env"))
    workdir = f.string("workdir", max_len=4096)
    if workdir is not None and not workdir.startswith("/"):
        raise bad_request("workdir must be an absolute path", "workdir")
    out["workdir"] = workdir
    out.update(_runtime(f))
    out["reservation"] = f.name("reservation", "reservation name")
    out["queue"] = f.name("queue", "queue name")
    out["after_reservation"] = _after_reservation(f.string("after_reservation", max_len=16), out["reservation"])
    after = f.raw("depends_on")
    if after is not None:
        if not isinstance(after, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i > 0
                                                  for i in after) or len(after) > 1000:
            raise bad_request("depends_on must be a list of job ids", "depends_on")
        out["depends_on"] = tuple(after)
    out["after_any"] = f.boolean("after_any", default=False) or None
    notify = f.raw("notify")
    if notify is not None:
        from labq.models.notify import JOB_EVENTS
        from labq.protocol.notify import events_of

        out["notify"] = events_of(notify, "notify", JOB_EVENTS)
    if out["after_any"] and not out.get("depends_on"):
        raise bad_request("after_any says how the jobs in depends_on must end; name them too", "after_any")
    sweep = _sweep(f.string("array", max_len=MAX_ARRAY_TEXT), f.raw("grid"))
    f.done()
    return SubmitRequest({k: v for k, v in out.items() if v is not None}, sweep)


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


def _after_reservation(text: str | None, reservation: str | None):
    from labq.models.job import AfterReservation

    if text is None:
        return None
    if reservation is None:
        raise bad_request("after_reservation says what happens when the job's reservation ends; name the "
                          "reservation too", "after_reservation")
    try:
        return AfterReservation(text)
    except ValueError:
        raise bad_request("after_reservation must be queue or cancel", "after_reservation") from None


def _runtime(f: Fields) -> dict:
    """One reading of where a job runs: an image means a container; what contradicts that is refused, so a job
    never runs as a plain process on the host when its sender asked for a container."""
    from labq.models.job import Runtime

    runtime = f.string("runtime", max_len=16)
    image = f.string("image", max_len=512)
    mounts = _mounts(f.raw("mounts"))
    shm = f.integer("shm_size_mib", low=64, high=1 << 20)
    if runtime is not None and runtime not in {r.value for r in Runtime}:
        raise bad_request(f"runtime must be process or docker, not {runtime!r}", "runtime")
    if image is not None and not image.strip():
        raise bad_request("image is empty", "image")
    if runtime == Runtime.PROCESS.value and image is not None:
        raise bad_request("runtime is process but an image is given: an image runs in a container; "
                          'send runtime "docker" (or leave it out) with the image, or no image', "runtime")
    if runtime == Runtime.DOCKER.value and image is None:
        raise bad_request("runtime docker needs an image", "image")
    docker = image is not None
    if not docker:
        extra = [name for name, value in (("mounts", mounts), ("shm_size_mib", shm)) if value]
        if extra:
            raise bad_request(f"{' and '.join(extra)} {'are' if len(extra) > 1 else 'is'} for container jobs: "
                              "give an image (--image); a process job runs on the host and sees its files", extra[0])
    return {"runtime": Runtime.DOCKER if docker else Runtime.PROCESS, "image": image, "mounts": mounts,
            "shm_size_mib": shm}


ACTIONS = ("cancel", "hold", "release", "prio", "top", "edit", "preempt", "restart")


def parse_action(body: object) -> ActionRequest:
    from labq.protocol.checked import ActionRequest

    f = Fields(body, "an action")
    action = f.string("action", required=True, max_len=16)
    if action not in ACTIONS:
        raise bad_request(f"action must be one of {', '.join(ACTIONS)}, not {action!r}", "action")
    fields: dict = {}
    if action in ("prio", "edit"):
        fields["priority"] = _priority(f.raw("priority"))
    if action == "prio":
        fields["by"] = f.integer("by", low=-1000, high=1000)
        if (fields["priority"] is None) == (fields["by"] is None):
            raise bad_request("prio needs priority (a value) or by (a change), one of them", "priority")
    if action == "edit":
        fields["gpus"] = f.integer("gpus", low=1, high=MAX_GPUS)
        fields["time_limit_s"] = f.number("time_limit_s", low=0, high=MAX_TIME_LIMIT_S)
        name = f.raw("name")
        fields["name"] = "" if name == "" else f.name("name", "job name")
        if all(value is None for value in fields.values()):
            raise bad_request("edit needs gpus or time_limit_s, or priority or name", "action")
    f.done()
    return ActionRequest(action, **fields)


def _priority(raw: object) -> int | None:
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


def parse_user(body: object) -> UserRequest:
    from labq.protocol.checked import UserRequest

    f = Fields(body, "a user")
    name = f.user_name("name", required=True)
    admin = f.boolean("admin", default=False)
    f.done()
    return UserRequest(name, admin)


MAX_TOKEN_S = 10 * 365 * 86400


def parse_token(body: object) -> TokenRequest:
    from labq.protocol.checked import TokenRequest

    f = Fields(body, "a token")
    user = f.user_name("user", required=True)
    name = f.name("name", "token name") or "api"
    expires = f.number("expires_s", low=60, high=MAX_TOKEN_S)
    f.done()
    return TokenRequest(user, name, expires)


DEFAULT_JOIN_S = 86400.0


def parse_join(body: object) -> JoinRequest:
    from labq.protocol.checked import JoinRequest

    f = Fields(body, "a join token")
    node = f.name("node", "node name")
    expires = f.number("expires_s", low=60, high=MAX_TOKEN_S)
    f.done()
    return JoinRequest(node, expires or DEFAULT_JOIN_S)


def require_int(value: str, what: str, *, low: int = 0, high: int = MAX_QUERY_INT) -> int:
    """A whole number from a query parameter or a path, written in ASCII digits, between ``low`` and ``high``."""
    if not isinstance(value, str) or not re.fullmatch(r"[0-9]{1,20}", value):
        raise bad_request(f"{what} must be a whole number, not {ascii(value)[:40]}", what)
    number = int(value)
    if not low <= number <= high:
        raise bad_request(f"{what} must be between {low} and {high}, not {number}", what)
    return number


__all__ = ["ACTIONS", "ActionRequest", "ApiError", "Fields", "MAX_BODY_BYTES", "MAX_PAGE", "NOTIFY_WORDS", "PAGE",
           "SubmitRequest", "UserRequest", "notify_words", "parse_action", "parse_submit", "parse_user",
           "priority_change", "require_int", "submit_request", "wire_priority"]
