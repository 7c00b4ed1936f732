"""What people and agents may send, checked field by field before anything is stored.

Every check raises ``ApiError`` (400 bad_request) naming the field and saying
what is accepted. Unknown fields are refused rather than ignored, so a typo
never silently changes what runs.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from labq.models.job import JobSpec, Mount, Runtime
from labq.models.priority import parse_priority
from labq.protocol.errors import ApiError, bad_request

MAX_BODY_BYTES = 1 << 20  #: a request body larger than this is refused with 413
MAX_COMMAND_BYTES = 64 * 1024
MAX_ARGS = 4096
MAX_ENV_BYTES = 64 * 1024
MAX_GPUS = 64
MAX_TIME_LIMIT_S = 366 * 86400
MAX_NAME = 128
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")
USER_NAME = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$")


class Fields:
    """Typed access to a JSON object's fields; refuses unknown ones at ``done()``."""

    def __init__(self, body: object, where: str) -> None:
        if not isinstance(body, Mapping):
            raise bad_request(f"{where} must be a JSON object")
        self.body = body
        self.where = where
        self.seen: set[str] = set()

    def _get(self, name: str, required: bool):
        self.seen.add(name)
        if name not in self.body or self.body[name] is None:
            if required:
                raise bad_request(f"{self.where}: {name} is required", name)
            return None
        return self.body[name]

    def string(self, name: str, *, required: bool = False, max_len: int = MAX_NAME,
               pattern: re.Pattern | None = None, what: str = "") -> str | None:
        value = self._get(name, required)
        if value is None:
            return None
        if not isinstance(value, str):
            raise bad_request(f"{name} must be a string", name)
        _no_nul(name, value)
        if len(value.encode()) > max_len:
            raise bad_request(f"{name} is longer than {max_len} bytes", name)
        if pattern is not None and not pattern.match(value):
            raise bad_request(f"{name} {value!r} is not valid{': ' + what if what else ''}", name)
        return value

    def integer(self, name: str, *, required: bool = False, low: int = 0, high: int = 2**31) -> int | None:
        value = self._get(name, required)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise bad_request(f"{name} must be an integer", name)
        if not low <= value <= high:
            raise bad_request(f"{name} must be between {low} and {high}, not {value}", name)
        return value

    def number(self, name: str, *, required: bool = False, low: float = 0.0, high: float = 1e12) -> float | None:
        value = self._get(name, required)
        if value is None:
            return None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
            raise bad_request(f"{name} must be a number", name)
        if not low <= value <= high:
            raise bad_request(f"{name} must be between {low:g} and {high:g}, not {value:g}", name)
        return float(value)

    def boolean(self, name: str, *, default: bool) -> bool:
        value = self._get(name, False)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise bad_request(f"{name} must be true or false", name)
        return value

    def raw(self, name: str, *, required: bool = False):
        return self._get(name, required)

    def done(self) -> None:
        unknown = sorted(set(self.body) - self.seen)
        if unknown:
            raise bad_request(f"{self.where}: unknown field{'s' if len(unknown) > 1 else ''} "
                              f"{', '.join(unknown)}", unknown[0])


def _no_nul(name: str, value: str) -> None:
    if "\x00" in value:
        raise bad_request(f"{name} contains a NUL byte", name)


def _command(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise bad_request("command must be a non-empty list of strings (the program and its arguments)", "command")
    if len(value) > MAX_ARGS:
        raise bad_request(f"command has more than {MAX_ARGS} arguments", "command")
    total = 0
    for arg in value:
        if not isinstance(arg, str):
            raise bad_request("command must be a list of strings", "command")
        _no_nul("command", arg)
        total += len(arg.encode()) + 1
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
        if not isinstance(key, str) or not ENV_NAME.match(key):
            raise bad_request(f"env name {key!r} is not valid: letters, digits and _, not starting with a digit",
                              "env")
        if not isinstance(val, str):
            raise bad_request(f"env {key} must be a string", "env")
        _no_nul("env", val)
        if key.startswith("LABQ_"):
            raise bad_request(f"env {key}: LABQ_ variables are set by labq itself", "env")
        total += len(key) + len(val.encode()) + 2
    if total > MAX_ENV_BYTES:
        raise bad_request(f"env is larger than {MAX_ENV_BYTES // 1024} KiB", "env")
    return tuple(sorted(value.items()))


def _mounts(value: object) -> tuple[Mount, ...]:
    """The shape of bind mounts; where they may point is the leader's policy (labq.isolation)."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > 64:
        raise bad_request("mounts must be a list of {source, target, read_only}", "mounts")
    mounts = []
    for item in value:
        m = Fields(item, "a mount")
        source = m.string("source", required=True, max_len=4096)
        target = m.string("target", required=True, max_len=4096)
        read_only = m.boolean("read_only", default=False)
        m.done()
        if not source.startswith("/") or not target.startswith("/"):
            raise bad_request(f"mount {source}:{target}: both paths must be absolute", "mounts")
        mounts.append(Mount(source, target, read_only))
    return tuple(mounts)


def _signal_name(value: str | None) -> str:
    if value is None:
        return "SIGUSR1"
    name = value.upper() if value.upper().startswith("SIG") else "SIG" + value.upper()
    if name not in signal.Signals.__members__ or name in ("SIGKILL", "SIGSTOP"):
        raise bad_request(f"checkpoint_signal {value!r} is not a signal a job can catch (e.g. SIGUSR1, SIGTERM)",
                          "checkpoint_signal")
    return name


@dataclass(frozen=True)
class SubmitRequest:
    """A submission before the leader adds who sent it."""

    fields: dict

    def spec_for(self, user: str, *, default_grace_s: float = 60.0) -> JobSpec:
        try:
            return JobSpec(user=user, **{"grace_s": default_grace_s, **self.fields})
        except ValueError as err:
            raise bad_request(str(err)) from None


def parse_submit(body: object) -> SubmitRequest:
    f = Fields(body, "a job")
    out: dict = {"command": _command(f.raw("command", required=True))}
    out["gpus"] = f.integer("gpus", low=1, high=MAX_GPUS) or 1
    out["nodes"] = f.integer("nodes", low=1, high=MAX_GPUS) or 1
    out["name"] = f.string("name", pattern=NAME, what="letters, digits and ._@+-, up to 128") or ""
    out["min_gpu_memory_mib"] = f.integer("min_gpu_memory_mib", low=0, high=10**7) or 0
    out["gpu_model"] = f.string("gpu_model")
    out["node"] = f.string("node", pattern=NAME, what="a node name")
    priority = f.raw("priority")
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, (int, str)):
            raise bad_request("priority must be low, normal, high, urgent or an integer", "priority")
        try:
            out["priority"] = parse_priority(priority)
        except ValueError as err:
            raise bad_request(str(err), "priority") from None
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
    runtime = f.string("runtime", max_len=16) or "process"
    try:
        out["runtime"] = Runtime(runtime)
    except ValueError:
        raise bad_request(f"runtime must be process or docker, not {runtime!r}", "runtime") from None
    out["image"] = f.string("image", max_len=512)
    out["mounts"] = _mounts(f.raw("mounts"))
    out["shm_size_mib"] = f.integer("shm_size_mib", low=64, high=1 << 20)
    if out["mounts"] and out["runtime"] is not Runtime.DOCKER:
        raise bad_request("mounts are for docker jobs (--image); a process job sees the host's files", "mounts")
    out["reservation"] = f.string("reservation", pattern=NAME, what="a reservation name")
    after = f.raw("depends_on")
    if after is not None:
        if not isinstance(after, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i > 0
                                                  for i in after) or len(after) > 1000:
            raise bad_request("depends_on must be a list of job ids", "depends_on")
        out["depends_on"] = tuple(after)
    f.done()
    return SubmitRequest({k: v for k, v in out.items() if v is not None})


ACTIONS = ("cancel", "hold", "release", "prio", "top", "edit", "preempt")


@dataclass(frozen=True)
class ActionRequest:
    action: str
    priority: int | None = None
    gpus: int | None = None  #: edit: the new GPU count (queued jobs only)
    time_limit_s: float | None = None  #: edit: the new time limit; 0 removes it


def parse_action(body: object) -> ActionRequest:
    f = Fields(body, "an action")
    action = f.string("action", required=True, max_len=16)
    if action not in ACTIONS:
        raise bad_request(f"action must be one of {', '.join(ACTIONS)}, not {action!r}", "action")
    priority = None
    if action == "prio":
        raw = f.raw("priority", required=True)
        if isinstance(raw, bool) or not isinstance(raw, (int, str)):
            raise bad_request("priority must be low, normal, high, urgent or an integer", "priority")
        try:
            priority = parse_priority(raw)
        except ValueError as err:
            raise bad_request(str(err), "priority") from None
    gpus = limit = None
    if action == "edit":
        gpus = f.integer("gpus", low=1, high=MAX_GPUS)
        limit = f.number("time_limit_s", low=0, high=MAX_TIME_LIMIT_S)
        if gpus is None and limit is None:
            raise bad_request("edit needs gpus or time_limit_s", "action")
    f.done()
    return ActionRequest(action, priority, gpus, limit)


@dataclass(frozen=True)
class UserRequest:
    name: str
    admin: bool


def parse_user(body: object) -> UserRequest:
    f = Fields(body, "a user")
    name = f.string("name", required=True, max_len=32, pattern=USER_NAME,
                    what="a Unix-style name: lower-case letters, digits, _ . -")
    admin = f.boolean("admin", default=False)
    f.done()
    return UserRequest(name, admin)


def require_int(value: str, what: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise bad_request(f"{what} must be an integer, not {value!r}") from None
    if number < 0:
        raise bad_request(f"{what} must not be negative")
    return number


__all__ = ["ACTIONS", "ActionRequest", "ApiError", "Fields", "MAX_BODY_BYTES", "SubmitRequest", "UserRequest",
           "parse_action", "parse_submit", "parse_user", "require_int"]
