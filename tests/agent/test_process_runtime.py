"""The process runtime with real processes: exits, logs, signals to whole groups, agent restarts.

Every job a test starts carries ``LABQ_TEST_ROOT=<its tmp_path>`` in its environment and
every shim has the tmp_path in its argv, so an autouse fixture can find whatever a test
left running, kill it, and fail the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labq.agent import cgroups
from labq.agent.process_runtime import AttemptState, AttemptStatus, Launch, ProcessRuntime
from labq.agent.shim import read_stat

pytestmark = pytest.mark.timeout(60)

MARK = "LABQ_TEST_ROOT"
EXITED, RUNNING = AttemptState.EXITED, AttemptState.RUNNING


def _processes_of(marker: str) -> dict[int, str]:
    """Live processes (not zombies) whose argv or environment names this test's tmp_path."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = read_stat(int(entry.name))
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if stat and stat[0] != "Z" and (marker.encode() in cmdline or f"{MARK}={marker}".encode() in environ):
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found


@pytest.fixture(autouse=True)
def no_stray_processes(tmp_path):
    """Fail a test that leaves a process running; a few seconds to finish exiting is fine."""
    yield
    deadline = time.monotonic() + 5
    while (stray := _processes_of(str(tmp_path))) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in stray:
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)
    assert not stray, f"the test left processes running: {stray}"


class Runtimes:
    """Opens runtimes on the test's agent folder; at the end kills what they still run."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path / "agent"
        self.opened: list[ProcessRuntime] = []

    def open(self, allow_root: bool = os.geteuid() == 0) -> ProcessRuntime:
        # the suite may run as root (CI does): these jobs then run as root on purpose, as allow_root = true allows
        self.opened.append(ProcessRuntime(self.root, allow_root=allow_root))
        return self.opened[-1]

    def close(self) -> None:
        for rt in self.opened:
            for status in rt.attempts():
                if status.state is RUNNING:
                    rt.signal(status.job_id, status.attempt, signal.SIGKILL)
                    wait_for(rt, status.job_id, status.attempt)


@pytest.fixture
def runtimes(tmp_path):
    factory = Runtimes(tmp_path)
    yield factory
    factory.close()


@pytest.fixture
def job(tmp_path):
    """Builds a Launch whose processes the stray check can recognise."""

    def build(job_id: int, *command: str, env: dict[str, str] | None = None, **kw) -> Launch:
        return Launch(job_id, kw.pop("attempt", 1), command, {MARK: str(tmp_path), **(env or {})}, **kw)

    return build


def wait_for(rt: ProcessRuntime, job_id: int, attempt: int = 1, state: AttemptState = EXITED,
             timeout: float = 15) -> AttemptStatus:
    deadline = time.monotonic() + timeout
    while True:
        status = next((s for s in rt.attempts() if (s.job_id, s.attempt) == (job_id, attempt)), None)
        if status is not None and status.state is state:
            return status
        assert time.monotonic() < deadline, f"attempt {job_id}.{attempt} is not {state.value}: {status}"
        time.sleep(0.02)


def wait_for_log(rt: ProcessRuntime, job_id: int, text: bytes, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while text not in rt.read_log(job_id, 1):
        assert time.monotonic() < deadline, f"no {text!r} in the log: {rt.read_log(job_id, 1)!r}"
        time.sleep(0.02)


def group_is_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


# --- running a command ------------------------------------------------------------------------


@pytest.mark.parametrize("command, code, output", [
    (("true",), 0, b""),
    (("sh", "-c", "echo hi; exit 3"), 3, b"hi\n"),
])
def test_exit_code_and_output_are_recorded(runtimes, job, command, code, output):
    rt = runtimes.open()
    launched = rt.launch(job(1, *command))
    assert launched.pid is not None and launched.log_path.startswith(str(rt.root))
    status = wait_for(rt, 1)
    assert (status.exit_code, status.signal, status.pid) == (code, None, launched.pid)
    assert status.started_at <= status.ended_at
    assert rt.read_log(1, 1) == output


def test_stdout_and_stderr_share_one_log_in_order_and_read_from_an_offset(runtimes, job):
    rt = runtimes.open()
    rt.launch(job(1, "sh", "-c", "echo out1; echo err1 >&2; echo out2"))
    wait_for(rt, 1)
    assert rt.read_log(1, 1) == b"out1\nerr1\nout2\n"
    assert rt.read_log(1, 1, offset=5) == b"err1\nout2\n"
    assert rt.read_log(1, 1, offset=0, limit=4) == b"out1"
    assert rt.read_log(1, 1, offset=100) == b""
    with pytest.raises(KeyError):
        rt.read_log(9, 1)


def test_the_job_sees_its_env_gpus_and_workdir_and_nothing_of_the_agent(runtimes, job, tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    rt = runtimes.open()
    script = "echo $CUDA_VISIBLE_DEVICES $FOO; echo $LABQ_JOB_ID $LABQ_ATTEMPT; echo ${PYTEST_CURRENT_TEST:-unset}; pwd"
    rt.launch(job(4, "sh", "-c", script, attempt=2, env={"FOO": "bar", "CUDA_VISIBLE_DEVICES": "7"},
                  gpu_env={"CUDA_VISIBLE_DEVICES": "0,1"}, workdir=str(workdir)))
    assert wait_for(rt, 4, 2).exit_code == 0
    assert rt.read_log(4, 2).decode().splitlines() == ["0,1 bar", "4 2", "unset", str(workdir)]


def test_the_default_workdir_is_the_users_home(runtimes, job):
    home = pwd.getpwuid(os.geteuid()).pw_dir
    rt = runtimes.open()
    rt.launch(job(1, "sh", "-c", 'pwd; echo "$HOME"'))
    wait_for(rt, 1)
    expected = home if os.path.isdir(home) else "/"
    assert rt.read_log(1, 1).decode().splitlines() == [expected, home]


# --- commands that cannot start ---------------------------------------------------------------


def test_a_command_that_is_not_there_exits_127_with_a_reason(runtimes, job):
    rt = runtimes.open()
    launched = rt.launch(job(1, "no-such-command-labq"))
    assert (launched.state, launched.exit_code, launched.pid) == (EXITED, 127, None)
    assert rt.read_log(1, 1) == b"labq: cannot start 'no-such-command-labq': No such file or directory\n"


def test_a_file_that_is_not_executable_exits_126(runtimes, job, tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("echo never\n")
    script.chmod(0o644)
    rt = runtimes.open()
    assert rt.launch(job(1, str(script))).exit_code == 126
    assert rt.read_log(1, 1) == f"labq: cannot start '{script}': Permission denied\n".encode()


def test_a_missing_workdir_exits_126_and_names_the_workdir(runtimes, job, tmp_path):
    missing = tmp_path / "missing"
    rt = runtimes.open()
    assert rt.launch(job(1, "pwd", workdir=str(missing))).exit_code == 126
    assert rt.read_log(1, 1) == f"labq: cannot start 'pwd': workdir '{missing}': No such file or directory\n".encode()


# --- signals and stop -------------------------------------------------------------------------

GROUP_JOB = r"""
import os, signal
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # held until sigwait: no race with the sender
pid = os.fork()
who = "child" if pid == 0 else "parent"
print(who, "ready", flush=True)
signal.sigwait({signal.SIGUSR1})
print(who, "got USR1", flush=True)
if pid:
    os.waitpid(pid, 0)
"""


def test_a_signal_reaches_every_process_of_the_group(runtimes, job):
    rt = runtimes.open()
    rt.launch(job(1, sys.executable, "-c", GROUP_JOB))
    wait_for_log(rt, 1, b"child ready")
    wait_for_log(rt, 1, b"parent ready")
    assert rt.signal(1, 1, signal.SIGUSR1)
    assert wait_for(rt, 1).exit_code == 0
    assert sorted(rt.read_log(1, 1).decode().splitlines()) == [
        "child got USR1", "child ready", "parent got USR1", "parent ready"]
    assert not rt.signal(1, 1, signal.SIGUSR1)  # exited
    assert not rt.signal(2, 1, signal.SIGUSR1)  # unknown


def test_stop_terminates_the_whole_group(runtimes, job):
    rt = runtimes.open()
    pid = rt.launch(job(1, "sh", "-c", "sleep 300 & echo ready; wait")).pid
    wait_for_log(rt, 1, b"ready")
    rt.stop(1, 1, grace_s=10)
    status = wait_for(rt, 1)
    assert (status.exit_code, status.signal) == (143, signal.SIGTERM)
    assert group_is_gone(pid)


def test_stop_kills_a_job_that_ignores_term_once_the_grace_is_over(runtimes, job):
    rt = runtimes.open()
    rt.launch(job(1, "sh", "-c", 'trap "" TERM; echo ready; sleep 300'))
    wait_for_log(rt, 1, b"ready")
    asked, clock = time.time(), time.monotonic()
    rt.stop(1, 1, grace_s=0.5)
    rt.stop(1, 1, grace_s=0.5)  # idempotent: one TERM, one timer
    assert time.monotonic() - clock < 0.3, "stop must not wait for the grace"
    status = wait_for(rt, 1)
    assert (status.exit_code, status.signal) == (137, signal.SIGKILL)
    assert status.ended_at >= asked + 0.45
    rt.stop(1, 1, grace_s=0.5)  # and harmless once it has exited


def test_what_the_job_leaves_in_its_group_dies_with_it(runtimes, job):
    rt = runtimes.open()
    pid = rt.launch(job(1, "sh", "-c", "sleep 300 & echo $!")).pid
    assert wait_for(rt, 1).exit_code == 0
    orphan = int(rt.read_log(1, 1))
    assert group_is_gone(pid)
    with pytest.raises(ProcessLookupError):
        os.kill(orphan, 0)  # killed and reaped, not a zombie


def test_what_the_job_leaves_outside_its_group_dies_with_it_too(runtimes, job):
    """A process that left the job's group (setsid) and whose parent ended (a daemon's double fork) is the shim's
    child, the shim being a subreaper: it is the job's too, and must not keep the GPUs after the job."""
    rt = runtimes.open()
    rt.launch(job(1, "sh", "-c", "setsid sh -c 'sleep 300 & echo $!' ; sleep 0.2"))
    assert wait_for(rt, 1).exit_code == 0
    escaped = int(rt.read_log(1, 1))
    with pytest.raises(ProcessLookupError):
        os.kill(escaped, 0)  # killed and reaped, not left to init


def test_an_attempts_processes_include_what_it_left_outside_its_group(runtimes, job):
    """What the memory watch and the inventory count as the job's: its group, its descendants, and its orphans
    that left the group (the shim's children), but not the shim's once the shim is no longer the job's parent."""
    from dataclasses import replace

    from labq.agent.gpu_watch import attempt_roots, processes_of
    from labq.agent.procfs import process_table

    rt = runtimes.open()
    pid = rt.launch(job(1, "sh", "-c", "setsid sh -c 'sleep 300 & echo $!' ; exec sleep 300")).pid
    deadline = time.monotonic() + 10
    while not rt.read_log(1, 1).strip():
        assert time.monotonic() < deadline, "the job did not start its daemon"
        time.sleep(0.02)
    escaped = int(rt.read_log(1, 1))
    (status,) = rt.attempts()
    table = process_table()
    assert table[escaped][1] != pid  # it left the job's group, and its parent ended: the shim's child now
    mine = processes_of(attempt_roots([status], table), table)[(1, 1)]
    assert {pid, escaped} <= mine and os.getpid() not in mine
    # a tree_pid that is not the job's parent (a shim that is gone, its pid reused) is not followed
    stale = replace(status, tree_pid=os.getpid())
    assert processes_of(attempt_roots([stale], table), table)[(1, 1)] == {pid}
    rt.stop(1, 1, grace_s=0.1)
    wait_for(rt, 1)
    with pytest.raises(ProcessLookupError):
        os.kill(escaped, 0)


def test_the_shim_passes_term_on_to_the_job(runtimes, job):
    rt = runtimes.open()
    pid = rt.launch(job(1, "sleep", "300")).pid
    shim = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])  # the job's parent
    os.kill(shim, signal.SIGTERM)
    assert wait_for(rt, 1).exit_code == 143


def test_a_fenced_job_gets_the_signal_it_named_in_its_marker_and_term_if_it_named_none(runtimes, job, tmp_path):
    """The agent lost its leader: the shim stops the job itself, with the signal the job declared after launch
    (``labq checkpoint --signal``), never one it did not ask for."""
    rt = runtimes.open()
    rt.heartbeat()  # and never again: the fence comes after fence_after_s
    handler = ("trap 'echo saved on USR1; exit 0' USR1; trap 'echo stopped on TERM; exit 3' TERM; {declare}"
               "echo ready; while true; do sleep 0.05; done")
    for job_id, declare, said, code in (
            (1, 'echo usr1 > "$LABQ_CHECKPOINT_DIR/.labq-checkpoint"; ', b"saved on USR1", 0),
            (2, "", b"stopped on TERM", 3)):
        folder = tmp_path / f"checkpoints-{job_id}"
        folder.mkdir()
        rt.launch(job(job_id, "sh", "-c", handler.format(declare=declare), env={"LABQ_CHECKPOINT_DIR": str(folder)},
                      fence_after_s=1.0, grace_s=5.0))
        wait_for_log(rt, job_id, b"ready")
        ended = wait_for(rt, job_id)
        assert (ended.fenced, ended.exit_code) == (True, code)
        assert said in rt.read_log(job_id, 1)


# --- restarts, re-adoption and recycled pids ---------------------------------------------------

AGENT = r"""
import json, sys, time
from pathlib import Path
from labq.agent.process_runtime import Launch, ProcessRuntime
rt = ProcessRuntime(Path(sys.argv[1]), allow_root=True)
pids = [rt.launch(Launch(job_id, 1, tuple(command), {"LABQ_TEST_ROOT": sys.argv[2]}, workdir=sys.argv[2])).pid
        for job_id, command in json.loads(sys.argv[3])]
print(json.dumps(pids), flush=True)
time.sleep(300)
"""
GATE = "while [ ! -e {0} ]; do sleep 0.02; done; exit {1}"


def test_a_restarted_agent_readopts_running_jobs_and_learns_how_others_ended(runtimes, tmp_path):
    jobs = [[1, ["sh", "-c", GATE.format("go1", 7)]], [2, ["sh", "-c", GATE.format("go2", 5)]]]
    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(runtimes.root), str(tmp_path), json.dumps(jobs)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = agent.stdout.readline()
    finally:
        agent.kill()  # SIGKILL: no cleanup of any kind
        _, err = agent.communicate(timeout=30)
    assert line, f"the agent failed:\n{err}"
    pids = json.loads(line)
    # job 2 ends while no agent runs at all
    (tmp_path / "go2").touch()
    deadline = time.monotonic() + 15
    while not (runtimes.root / "attempts" / "2.1" / "exit.json").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)

    rt = runtimes.open()  # the new agent
    found = {s.job_id: s for s in rt.attempts()}
    assert (found[1].state, found[1].pid) == (RUNNING, pids[0])
    assert not group_is_gone(pids[0])
    assert (found[2].state, found[2].exit_code, found[2].pid) == (EXITED, 5, pids[1])
    (tmp_path / "go1").touch()
    assert wait_for(rt, 1).exit_code == 7


def _forge_attempt(root: Path, pid: int, start_time: int) -> None:
    """An attempt whose shim died (SIGKILL) after recording the job's pid."""
    folder = root / "attempts" / "1.1"
    folder.mkdir(parents=True)
    (folder / "spec.json").write_text(json.dumps({"created_at": time.time()}))
    (folder / "pid.json").write_text(json.dumps({"pid": pid, "start_time": start_time, "started_at": time.time()}))
    (folder / "lock").touch()
    (folder / "log").touch()


def test_a_recycled_pid_is_neither_adopted_nor_signalled(runtimes, tmp_path):
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True, env={MARK: str(tmp_path)})
    try:
        _forge_attempt(runtimes.root, stranger.pid, read_stat(stranger.pid)[1] - 1)  # same pid, other process
        rt = runtimes.open()
        [status] = rt.attempts()
        assert (status.state, status.exit_code) == (EXITED, None)
        assert not rt.signal(1, 1, signal.SIGKILL)
        assert stranger.poll() is None
        assert b"exit status lost" in rt.read_log(1, 1)
    finally:
        stranger.kill()
        stranger.wait()


def test_a_job_whose_shim_died_is_adopted_until_it_ends(runtimes, tmp_path):
    orphan = subprocess.Popen(["sleep", "30"], start_new_session=True, env={MARK: str(tmp_path)})
    try:
        _forge_attempt(runtimes.root, orphan.pid, read_stat(orphan.pid)[1])
        rt = runtimes.open()
        assert [(s.state, s.pid) for s in rt.attempts()] == [(RUNNING, orphan.pid)]
        assert rt.signal(1, 1, signal.SIGTERM)
        assert orphan.wait(timeout=10) == -signal.SIGTERM
        status = wait_for(rt, 1)
        assert (status.exit_code, status.pid) == (None, orphan.pid)  # nobody was left to learn the code
    finally:
        orphan.kill()
        orphan.wait()


# --- bookkeeping ------------------------------------------------------------------------------


def test_forget_drops_the_attempt_but_keeps_its_log(runtimes, job):
    rt = runtimes.open()
    rt.launch(job(1, "echo", "bye"))
    wait_for(rt, 1)
    rt.forget(1, 1)
    rt.forget(1, 1)  # twice is fine
    assert rt.attempts() == []
    assert rt.read_log(1, 1) == b"bye\n"
    assert (rt.root / "logs" / "1.1.log").read_bytes() == b"bye\n"
    with pytest.raises(ValueError, match="already exists"):
        rt.launch(job(1, "true"))  # an attempt number is never reused


def test_an_attempt_is_launched_once_and_not_forgotten_while_running(runtimes, job):
    rt = runtimes.open()
    rt.launch(job(1, "sleep", "300"))
    with pytest.raises(ValueError, match="already exists"):
        rt.launch(job(1, "true"))
    with pytest.raises(ValueError, match="still running"):
        rt.forget(1, 1)
    assert [s.state for s in runtimes.open().attempts()] == [RUNNING]


# --- users ------------------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"), reason="needs an agent running as root")
def test_no_job_runs_as_uid_0_unless_the_admin_allows_it(runtimes, job):
    rt = runtimes.open(allow_root=False)
    for job_id, user in ((1, None), (2, "root")):  # the agent's own user, and a lab user named root
        with pytest.raises(ValueError, match="jobs never run as root .uid 0. here") as refused:
            rt.launch(job(job_id, "id", "-u", user=user))
        assert "allow_root = true" in str(refused.value)
    assert rt.attempts() == []  # refused before anything ran
    allowed = runtimes.open(allow_root=True)
    allowed.launch(job(3, "id", "-u", user="root"))
    assert wait_for(allowed, 3, 1).exit_code == 0 and allowed.read_log(3, 1).strip() == b"0"


@pytest.mark.skipif(os.geteuid() != 0, reason="only an agent running as root can start jobs as another user")
def test_as_root_a_job_runs_as_the_user_it_names(runtimes, job, tmp_path):
    nobody = pwd.getpwnam("nobody")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    rt = runtimes.open()
    rt.launch(job(1, "sh", "-c", 'id -u; id -g; echo "$USER $HOME"', user="nobody", workdir="/"))
    assert wait_for(rt, 1).exit_code == 0
    assert rt.read_log(1, 1).decode().splitlines() == [str(nobody.pw_uid), str(nobody.pw_gid),
                                                      f"nobody {nobody.pw_dir}"]
    # the workdir is entered as the user, so root's permissions do not leak to the job
    assert rt.launch(job(2, "pwd", user="nobody", workdir=str(private))).exit_code == 126
    assert b"is not accessible to user 'nobody'" in rt.read_log(2, 1)


DROPPED = r"""
import os, sys
from pathlib import Path
from labq.agent.process_runtime import Launch, ProcessRuntime
rt = ProcessRuntime(Path(sys.argv[1]))
os.setgroups([]); os.setgid(65534); os.setuid(65534)  # from here on, an agent that is not root
try:
    rt.launch(Launch(1, 1, ("id",), {}, user="root"))
except ValueError as exc:
    print(exc)
"""


def test_an_agent_that_is_not_root_refuses_another_user(runtimes, job):
    if os.geteuid() == 0:  # drop root in a child process, after it has imported labq
        message = subprocess.run([sys.executable, "-c", DROPPED, str(runtimes.root)], capture_output=True,
                                 text=True, timeout=30).stdout
    else:
        with pytest.raises(ValueError) as raised:
            runtimes.open().launch(job(1, "id", user="root"))
        message = str(raised.value)
    assert "cannot run a job as user 'root'" in message
    assert "only an agent running as root can start jobs as other users" in message


# --- the kernel's limits and the job's own temporary folder -------------------------------------------------

ALLOCATE = "import sys; x = b'1' * (int(sys.argv[1]) << 20); print('allocated', flush=True)"


def confined(rt: ProcessRuntime) -> ProcessRuntime:
    """``rt``, which must make a cgroup for each job here (root, cgroupfs writable); under CI it fails if not."""
    if not rt.confinement.enforced:
        from tests.conftest import unavailable

        unavailable("cgroups", rt.confinement.sentence)
    return rt


def test_a_job_past_its_memory_limit_is_oom_killed_and_its_status_says_so_after_a_restart(runtimes, job):
    rt = confined(runtimes.open())
    rt.launch(job(1, sys.executable, "-c", ALLOCATE, "256", memory_limit_mib=64))
    rt.launch(job(2, sys.executable, "-c", ALLOCATE, "100", memory_limit_mib=512))
    killed, fits = wait_for(rt, 1, timeout=30), wait_for(rt, 2, timeout=30)
    assert (killed.oom, killed.signal, killed.exit_code) == (True, signal.SIGKILL, 137)
    assert killed.memory_peak_mib is not None and killed.memory_peak_mib <= 64
    assert b"for lack of memory" in rt.read_log(1, 1) and b"allocated" not in rt.read_log(1, 1)
    assert (fits.oom, fits.exit_code) == (False, 0) and fits.memory_peak_mib >= 100
    again = {s.job_id: s for s in runtimes.open().attempts()}  # exit.json has it: a new agent learns it too
    assert (again[1].oom, again[1].memory_peak_mib, again[2].oom) == (True, killed.memory_peak_mib, False)
    assert rt.cgroup(1, 1) is None and rt.cgroup(2, 1) is None  # the shims removed them


BUSY = "for i in 1 2 3 4; do (while :; do :; done) & done; echo busy; wait"


@pytest.fixture
def favoured_parent():
    """A cgroup parent of the test's own, weighted far above the machine's other work (each process at the top
    of a hierarchy weighs as much as all of labq's jobs): only the quota then keeps the job from two cores."""
    parent = f"labq-test-{os.urandom(4).hex()}"
    host = cgroups.probe(parent=parent).host
    if host is not None:
        weight = (host.mounts["cpu"] / parent / "cpu.shares", "262144") if host.version == 1 else \
            (host.base / "cpu.weight", "10000")
        weight[0].write_text(weight[1])
    yield parent
    folders = [host.base] if host and host.version == 2 else [m / parent for m in set(host.mounts.values())] \
        if host else []
    for folder in folders:
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def test_a_cpu_limit_of_one_core_holds_four_busy_processes_to_about_one_core(runtimes, job, favoured_parent):
    rt = confined(ProcessRuntime(runtimes.root, allow_root=os.geteuid() == 0, cgroup_parent=favoured_parent))
    runtimes.opened.append(rt)
    rt.launch(job(1, "sh", "-c", BUSY, cpu_limit=1.0))
    wait_for_log(rt, 1, b"busy\n")
    cgroup = rt.cgroup(1, 1)
    assert cgroup is not None
    seen = cores_used(cgroup, lambda cores: cores >= 0.7)
    rt.stop(1, 1, grace_s=1)
    wait_for(rt, 1)
    assert all(cores <= 1.3 for cores in seen) and max(seen) >= 0.7, \
        f"cores used per 2 s under a limit of 1 (unlimited: up to {len(os.sched_getaffinity(0))}): {seen}"


def cores_used(cgroup, enough, windows: int = 5, window_s: float = 2.0) -> list[float]:
    """The cores a cgroup used in each ``window_s``, from its own counter, until ``enough`` of one: other work on
    the machine (other tests, other people's) can take the CPU a window, never push a job past its quota."""
    seen: list[float] = []
    time.sleep(0.3)
    while len(seen) < windows and not (seen and enough(seen[-1])):
        used, began = cgroup.cpu_usage_s(), time.monotonic()
        time.sleep(window_s)
        seen.append((cgroup.cpu_usage_s() - used) / (time.monotonic() - began))
    return seen


@pytest.mark.parametrize("cgroup_parent", ["labq", None], ids=["cgroup", "affinity"])
def test_a_cpu_set_keeps_the_job_on_its_cpus_with_a_cgroup_or_without(runtimes, job, cgroup_parent):
    if len(os.sched_getaffinity(0)) < 2:
        from tests.conftest import unavailable

        unavailable("two CPUs", "on one CPU, a set of CPU 0 looks like no set at all")
    rt = ProcessRuntime(runtimes.root, allow_root=os.geteuid() == 0, cgroup_parent=cgroup_parent)
    runtimes.opened.append(rt)
    if cgroup_parent:
        confined(rt)
    rt.launch(job(1, "grep", "Cpus_allowed_list", "/proc/self/status", cpu_set=(0,)))
    rt.launch(job(2, "grep", "Cpus_allowed_list", "/proc/self/status"))
    assert wait_for(rt, 1).exit_code == 0 and wait_for(rt, 2).exit_code == 0
    assert rt.read_log(1, 1) == b"Cpus_allowed_list:\t0\n"
    assert rt.read_log(2, 1) != b"Cpus_allowed_list:\t0\n"
    assert os.sched_getaffinity(0) != {0}


def test_a_job_runs_in_its_own_cgroup_from_the_start_and_its_shim_does_not(runtimes, job):
    rt = confined(runtimes.open())
    launched = rt.launch(job(1, "sh", "-c", "cat /proc/self/cgroup; echo .; exec sleep 300", memory_limit_mib=256))
    wait_for_log(rt, 1, b".\n")
    cgroup = rt.cgroup(1, 1)
    assert cgroup is not None and cgroup.pids() == {launched.pid}
    assert f"/labq/{cgroup.name}\n".encode() in rt.read_log(1, 1)  # the shell's first read saw its cgroup
    assert cgroup.name.encode() not in Path(f"/proc/{launched.tree_pid}/cgroup").read_bytes()  # the shim stepped out
    rt.stop(1, 1, grace_s=1)
    wait_for(rt, 1)
    assert rt.cgroup(1, 1) is None


@pytest.mark.parametrize("cgroup_parent", ["labq", None], ids=["cgroup", "affinity"])
def test_a_cpu_this_machine_lacks_is_a_node_fault_not_a_job_run_elsewhere(runtimes, job, cgroup_parent):
    rt = ProcessRuntime(runtimes.root, allow_root=os.geteuid() == 0, cgroup_parent=cgroup_parent)
    runtimes.opened.append(rt)
    if cgroup_parent:
        confined(rt)
    rt.launch(job(1, "echo", "ran", cpu_set=(4095,)))
    status = wait_for(rt, 1)
    assert status.exit_code == 126 and status.pid is None
    assert status.node_fault is not None and "4095" in status.node_fault
    assert b"ran\n" not in rt.read_log(1, 1)


def test_tmpdir_is_the_jobs_own_and_goes_when_the_attempt_is_forgotten(runtimes, job, tmp_path):
    rt = runtimes.open()
    tmpdir = tmp_path / "job-tmp"
    tmpdir.mkdir()
    rt.launch(job(1, "sh", "-c", 'echo "$TMPDIR"; mkdir "$TMPDIR/scratch"; echo x > "$TMPDIR/scratch/file"',
                  env={"TMPDIR": "/somewhere/else"}, tmpdir=str(tmpdir)))
    assert wait_for(rt, 1).exit_code == 0
    assert rt.read_log(1, 1) == f"{tmpdir}\n".encode()
    assert (tmpdir / "scratch" / "file").read_text() == "x\n"
    rt.launch(job(2, "sh", "-c", 'echo "${TMPDIR-unset}"'))
    assert wait_for(rt, 2).exit_code == 0 and rt.read_log(2, 1) == b"unset\n"  # none given: none set
    rt.forget(1, 1)
    assert not tmpdir.exists()
    rt.forget(2, 1)
