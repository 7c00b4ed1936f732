"""The shim: the one process between the agent and a job, so that a job outlives its agent.

The process runtime starts ``python -m labq.agent.shim <attempt dir> [<ready fd>]`` in a
session of its own, stdout and stderr on the attempt's log. The shim inherits the attempt's
``lock`` file, already flock'ed, and holds it until it exits: a held lock means "the shim
lives", which no recycled pid can fake.

The shim starts the job as its child in a new session (the job's pid is its process group
id), records that pid and its kernel start time in ``pid.json``, closes the ready fd
(``launch`` returns then), waits, and records the exit in ``exit.json``. Only the job's
parent can learn its exit status; writing it down lets an agent that restarted learn it too.

Where ``spec.json`` names a cgroup, the shim makes it with the job's limits (``labq.agent.cgroups``)
and forks the job from inside it, so the job is confined from its first instruction while the shim
steps back out (its own memory and CPU are not the job's). When the job has ended the shim records
whether the kernel OOM-killed anything in it and its peak memory in ``exit.json``, then removes it.
With no cgroup, the job's CPU set is still kept, by affinity.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from labq.agent.cgroups import Cgroup, CgroupError, Limits, cpu_list, open_host
from labq.agent.procfs import below, children_of, process_table
from labq.agent.stops import marker_signal
from labq.protocol.agents import FENCE_LOOK_EVERY_S, KILL_AFTER_TERM_S

PR_SET_CHILD_SUBREAPER = 36
LEFTOVER_GRACE_S = 5.0
WATCH_EVERY_S = FENCE_LOOK_EVERY_S
_job: list[int] = []  # the job's pid (= its group) once it runs
_pending: list[int] = []  # signals that came before it did


def write_json_atomically(path: Path, record: dict[str, Any]) -> None:
    """Temp file, fsync, rename, fsync the folder: a reader sees no file or a whole one."""
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
        f.write(json.dumps(record).encode())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def read_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) from /proc/<pid>/stat, or None if there is no such process.

    The start time (field 22, clock ticks after boot) and the pid together name one process
    for the life of the machine, so a recycled pid is told apart from the job.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:  # gone, or went between open and read (ESRCH)
        return None
    fields = stat.rsplit(b")", 1)[1].split()  # the command name may hold spaces and parentheses
    return fields[0].decode(), int(fields[19])


def _killpg(pgid: int, signum: int) -> bool:
    """False once no process is left in the group."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


def _forward(signum: int, frame: object) -> None:
    """SIGTERM/SIGINT sent to the shim go on to the job's group, or wait for the job to exist."""
    if _job:
        _killpg(_job[0], signum)
    else:
        _pending.append(signum)


def _kill_leftovers(pgid: int, cgroup: Cgroup | None) -> None:
    """The job's main process ended: kill what it left, so nothing keeps the GPUs: its group, and whatever left
    the group (``setsid``) and outlived its parent, as a daemon's double fork does.

    The shim is a child subreaper, so the job's orphans are its children (and theirs descend from them): every
    process below the shim is the job's. It kills and reaps them, which frees their pids and makes the group
    vanish before ``exit.json`` says "exited". It kills whatever is in the job's cgroup too.
    """
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while time.monotonic() < deadline:
        left = _killpg(pgid, signal.SIGKILL)
        for pid in _descendants(os.getpid()) | (cgroup.pids() - {os.getpid()} if cgroup else set()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            left = True
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        if not left:
            return
        time.sleep(0.01)


def _descendants(root: int) -> set[int]:
    """Every process below ``root``, as /proc has them now (none if /proc cannot be read: the group is still
    killed, and exit.json still written)."""
    try:
        return below([root], children_of(process_table())) - {root}
    except OSError:
        return set()


def _why_not_started(exc: Exception, spec: dict[str, Any]) -> tuple[int, str]:
    """Shell convention: 127 for a command that is not there, 126 for one that cannot run."""
    if isinstance(exc, subprocess.SubprocessError):  # only our preexec chdir raises this
        return 126, f"workdir {spec['workdir']!r} is not accessible to user {spec['user']!r}"
    assert isinstance(exc, OSError)
    if exc.filename == spec["workdir"] != spec["command"][0]:  # chdir, before exec
        return 126, f"workdir {spec['workdir']!r}: {exc.strerror}"
    if exc.filename is None:  # setgroups/setgid/setuid, before exec
        return 126, f"as user {spec['user']!r}: {exc.strerror}"
    return (127 if isinstance(exc, FileNotFoundError) else 126), str(exc.strerror)


def _cgroup(spec: dict[str, Any]) -> Cgroup | None:
    """The job's own cgroup, made with its limits, where the runtime asked for one; CgroupError if it cannot be."""
    where = spec.get("cgroup")
    if not where:
        return None
    limits = Limits(tuple(spec.get("cpu_set") or ()), spec.get("cpu_limit"), spec.get("memory_limit_mib"))
    return open_host(where["root"], where["parent"]).create(where["name"], limits)


@contextlib.contextmanager
def _confined(spec: dict[str, Any], cgroup: Cgroup | None) -> Iterator[None]:
    """The shim as the job must start: in its cgroup, else on its CPUs; a child forked now inherits that."""
    cpus = spec.get("cpu_set")
    if cgroup is not None or not cpus:
        with cgroup.inside() if cgroup is not None else contextlib.nullcontext():
            yield
        return
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        raise CgroupError(f"cannot keep the job on CPUs {cpu_list(tuple(cpus))}: {exc.strerror}") from None
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _start(spec: dict[str, Any], cgroup: Cgroup | None) -> subprocess.Popen[bytes]:
    workdir, switch = spec["workdir"], spec["uid"] is not None
    if switch and not os.path.isdir(workdir):
        raise FileNotFoundError(2, os.strerror(2), workdir)
    with _confined(spec, cgroup):
        return subprocess.Popen(
            spec["command"], env=spec["env"], stdin=subprocess.DEVNULL, start_new_session=True,
            # as another user, enter the workdir after setuid, so the user's permissions apply, not root's
            cwd=None if switch else workdir, preexec_fn=(lambda: os.chdir(workdir)) if switch else None,
            user=spec["uid"], group=spec["gid"], extra_groups=spec["groups"])


def _used(cgroup: Cgroup, spec: dict[str, Any]) -> dict[str, Any]:
    """What the job's cgroup says it used, for exit.json; a line in the log if the kernel OOM-killed in it."""
    used = {"oom": cgroup.oom_killed(), "memory_peak_mib": cgroup.memory_peak_mib(), "cpu_s": cgroup.cpu_usage_s()}
    if used["oom"]:
        limit = spec.get("memory_limit_mib")
        print(f"labq: the kernel killed the job's processes for lack of memory "
              f"({f'its limit: {limit} MiB' if limit else 'the machine ran out'}; oom=True)",
              file=sys.stderr, flush=True)
    return used


def _heartbeat_age(path: Path) -> float | None:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return None


def _wait_or_fence(job: subprocess.Popen[bytes], spec: dict[str, Any], heartbeat: Path,
                   tick: Callable[[], None] = lambda: None) -> tuple[int, bool]:
    """Wait for the job; if the agent has not reached its leader for ``fence_after_s``, stop it.

    This fence lives in the shim, not the agent, so it holds even when the agent
    process is gone: the leader requeues a lost node's jobs only after a longer time,
    and must never find the old attempt still running. ``tick`` runs once a look (the cgroup's memory sample).
    """
    fence_after = spec.get("fence_after_s")
    while True:
        try:
            return job.wait(timeout=WATCH_EVERY_S), False
        except subprocess.TimeoutExpired:
            pass
        tick()
        age = _heartbeat_age(heartbeat) if fence_after else None
        if age is None or age < fence_after:
            continue
        print(f"labq: no contact with the leader for {age:.0f} s: stopping the job (fenced)", file=sys.stderr,
              flush=True)
        steps = ((_fence_signal(spec), spec.get("grace_s", 30.0)), (signal.SIGTERM, KILL_AFTER_TERM_S),
                 (signal.SIGKILL, None))
        for signum, wait_s in steps:
            _killpg(job.pid, signum)
            try:
                return job.wait(timeout=wait_s), True
            except subprocess.TimeoutExpired:
                continue


def _fence_signal(spec: dict[str, Any]) -> signal.Signals:
    """The signal the job checkpoints on: declared at submit (or known at launch), else named by the job in
    its marker since, else TERM: never a signal it did not ask for."""
    name = spec.get("checkpoint_signal") or marker_signal(spec.get("env", {}).get("LABQ_CHECKPOINT_DIR"))
    return getattr(signal, name or "SIGTERM", signal.SIGTERM)


def main(argv: list[str]) -> int:
    folder, ready_fd = Path(argv[1]), int(argv[2]) if len(argv) > 2 else None
    spec = json.loads((folder / "spec.json").read_text())
    for forwarded in (signal.SIGTERM, signal.SIGINT):
        signal.signal(forwarded, _forward)
    with contextlib.suppress(OSError, AttributeError):  # Linux only; elsewhere init reaps orphans
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    ended: dict[str, Any] = {"pid": None, "signal": None, "started_at": time.time()}
    cgroup = None
    try:
        cgroup = _cgroup(spec)
        job = _start(spec, cgroup)
    except CgroupError as exc:  # this machine's: the leader requeues it
        ended["exit_code"], ended["node_fault"] = 126, f"cannot confine the job: {exc}"
        print(f"labq: {ended['node_fault']}", file=sys.stderr, flush=True)
    except (OSError, subprocess.SubprocessError) as exc:
        ended["exit_code"], why = _why_not_started(exc, spec)
        print(f"labq: cannot start {spec['command'][0]!r}: {why}", file=sys.stderr, flush=True)
        if isinstance(exc, OSError) and exc.filename is None:  # fork, setgroups/setgid/setuid: before exec
            ended["node_fault"] = why  # this machine's, not the job's: the leader requeues it
    else:
        stat = read_stat(job.pid)  # the job is our unreaped child, so /proc still has it
        write_json_atomically(folder / "pid.json", {"pid": job.pid, "start_time": stat[1] if stat else None,
                                                    "shim_pid": os.getpid(), "started_at": ended["started_at"]})
        if ready_fd is not None:
            os.close(ready_fd)  # launch() returns now
        _job.append(job.pid)
        for signum in _pending:
            _killpg(job.pid, signum)
        returncode, ended["fenced"] = _wait_or_fence(job, spec, folder.parent.parent / "heartbeat",
                                                     cgroup.sample if cgroup else lambda: None)
        _kill_leftovers(job.pid, cgroup)
        ended["pid"], ended["signal"] = job.pid, -returncode if returncode < 0 else None
        ended["exit_code"] = 128 - returncode if returncode < 0 else returncode
        if cgroup is not None:
            ended.update(_used(cgroup, spec))
    if cgroup is not None and not cgroup.remove():
        print(f"labq: cgroup {cgroup.name} is left behind: processes are still in it", file=sys.stderr, flush=True)
    ended["ended_at"] = time.time()
    write_json_atomically(folder / "exit.json", ended)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
