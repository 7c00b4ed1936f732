"""Starting what the leader says should run here: the job's checkpoint folder, its account on this machine,
its environment, and the runtime its spec names (``labq.agent.runtimes``). A launch that fails is recorded as
an attempt that could not start, for the job's fault (it fails) or this machine's (the leader requeues it, and
the node reports what keeps such jobs off it)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from labq.agent.accounts import Accounts
from labq.agent.faults import NodeFault, ProblemBook, sentence
from labq.agent.process_runtime import Start
from labq.agent.runtimes import Runtimes
from labq.agent.stops import NotesBook
from labq.models.job import Runtime
from labq.models.node import NodeProblem
from labq.models.spec import STANDARD_PATH
from labq.protocol.agents import RunOrder

log = logging.getLogger("labq.agent")
GPU_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")  #: merged last for a process, a container's own


class Launcher:
    def __init__(self, node: str, runtime: Runtimes, accounts: Accounts, notes: NotesBook, problems: ProblemBook,
                 checkpoints: Path, tmp_root: Path, *, run_as_job_user: bool, monotonic: Callable[[], float]) -> None:
        self.node, self.runtime, self.accounts, self.notes, self.problems = node, runtime, accounts, notes, problems
        self.checkpoints = checkpoints  #: the agent's own folder of checkpoint folders (no shared storage)
        #: each attempt's own temporary folder (its TMPDIR, a container's /tmp) is made in here; the runtime
        #: removes it when it forgets the attempt
        self.tmp_root = tmp_root
        self.run_as_job_user = run_as_job_user
        self.monotonic = monotonic

    def launch(self, order: RunOrder, fence_after_s: float | None) -> None:
        """Start the attempt an order asks for, in its checkpoint folder, as its user's account here; an attempt
        that cannot start is recorded as refused: for the job's fault (it fails), or this machine's (requeued,
        and the node reports the problem). ``fence_after_s``: the lease the job's shim keeps to."""
        folder = Path(order.checkpoint_dir) if order.checkpoint_dir else self.checkpoints / str(order.job_id)
        account = self.accounts.resolve(order.user)
        if account.problem is not None:
            self.not_started(order, NodeFault(f"no account for {order.user} on {self.node}: "
                                               f"{account.problem}"))
            return
        user = account.login if self.run_as_job_user else None
        try:
            own_job_folder(folder, user)
        except (OSError, ValueError) as err:
            why = f"cannot make the checkpoint folder {folder} on {self.node}: " + (
                (err.strerror or str(err)) if isinstance(err, OSError) else str(err))
            if isinstance(err, OSError):  # the node's disk or shared storage, not the job
                self.not_started(order, NodeFault(why, NodeProblem(why)))
            else:
                self.refuse(order, why)
            return
        tmpdir = self.tmp_root / f"{order.job_id}.{order.attempt}"
        try:
            own_job_folder(tmpdir, user)
        except (OSError, ValueError) as err:
            why = f"cannot make the job's temporary folder {tmpdir} on {self.node}: " + (
                (err.strerror or str(err)) if isinstance(err, OSError) else str(err))
            self.not_started(order, NodeFault(why, NodeProblem(why)))
            return
        self.notes.update(order.job_id, order.attempt, checkpoint_dir=str(folder))
        env = dict(order.env, LABQ_CHECKPOINT_DIR=str(folder))  # TMPDIR: the runtime's (a container's is its /tmp)
        gpu_env = {k: env.pop(k) for k in GPU_VARIABLES if k in env}
        if order.spec.runtime is Runtime.PROCESS and self.runtime.slurm is None:  # a Slurm node's PATH is not here
            missing = missing_program(order.spec.command[0], env.get("PATH") or STANDARD_PATH,
                                      order.spec.workdir or "/", self.node)
            if missing is not None:
                self.refuse(order, missing, exit_code=127)
                return
        log.info("starting job %d attempt %d on GPUs %s", order.job_id, order.attempt, order.gpu_indices)
        here = len(os.sched_getaffinity(0))
        if order.cpu_limit is not None and order.cpu_limit > here:  # a simulated node's model has more than this
            order = replace(order, cpu_limit=float(here))
        try:
            status = self.runtime.launch(order, Start(env, user, gpu_env, fence_after_s, str(folder), str(tmpdir)))
        except NodeFault as fault:  # this machine's fault: the job is requeued, the node says what is wrong
            self.not_started(order, fault)
        except ValueError as err:  # the job's fault (a policy, a bad command): the attempt fails, not the agent
            self.refuse(order, f"cannot start on {self.node}: {err}")
        else:
            if status.node_fault is not None:  # it failed before the job's program ran (the shim says)
                why = f"cannot start {order.user}'s jobs on {self.node}: {status.node_fault}"
                log.warning("job %d attempt %d cannot start: %s", order.job_id, order.attempt, why)
                self.problems.met(NodeProblem(sentence(why), user=order.user), self.monotonic())

    def refuse(self, order: RunOrder, why: str, exit_code: int = 126) -> None:
        """The attempt cannot start, for a reason of the job's: it ends at once with ``why`` in its log, and the
        leader hears ``why`` as the job's reason (``labq show``, its notice)."""
        log.warning("job %d attempt %d cannot start: %s", order.job_id, order.attempt, why)
        self.notes.update(order.job_id, order.attempt, refused=why)
        self.runtime.refuse(order.job_id, order.attempt, why, exit_code)

    def not_started(self, order: RunOrder, fault: NodeFault) -> None:
        """A launch failed for a reason of this machine: record the attempt as one that could not start, which
        the leader requeues, and report what keeps such jobs off this node (an account is looked up again)."""
        log.warning("job %d attempt %d cannot start here, not for a fault of the job: %s", order.job_id,
                    order.attempt, fault)
        if fault.problem is not None:
            self.problems.met(fault.problem, self.monotonic())
        else:
            self.accounts.forget(order.user)
        self.runtime.refuse(order.job_id, order.attempt, sentence(fault), node_fault=True)


def missing_program(program: str, path: str, workdir: str, node: str) -> str | None:
    """Why ``program`` cannot start here, in the words its user needs (None: it can): not on the PATH the job
    gets (naming a folder of that PATH this node lacks: a venv made on another machine), or no such file."""
    if "/" in program:
        where = os.path.join(workdir, program)
        if os.path.isfile(where) and os.access(where, os.X_OK):
            return None
        return f"cannot start {program!r} on {node}: {where} is not an executable file there"
    folders = [f for f in path.split(":") if f]
    if any(os.path.isfile(os.path.join(f, program)) and os.access(os.path.join(f, program), os.X_OK)
           for f in folders):
        return None
    shown = path if len(path) <= 300 else path[:300] + "..."
    absent = next((f for f in folders if not os.path.isdir(f)), None)
    hint = f"; is {absent} on {node}?" if absent is not None else ""
    return f"cannot start {program!r} on {node}: not on PATH={shown}{hint}"


def own_job_folder(folder: Path, user: str | None) -> None:
    """Make the job's checkpoint folder its user's alone (mode 0700), refusing one that is not a plain folder.

    On shared checkpoint storage someone may have put a symlink where a job's folder goes, to
    have the job write elsewhere or mount another folder: such a folder is refused.
    """
    folder.mkdir(parents=True, exist_ok=True)
    if folder.is_symlink() or not folder.is_dir():
        raise ValueError("it is not a plain folder (a symlink?); remove it and requeue the job")
    entry = None
    if user is not None:
        import pwd

        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            pass  # the launch refuses the job for want of the account, with a clearer message
    me = os.geteuid()
    if entry is None or entry.pw_uid == me:
        os.chmod(folder, 0o700)
    elif me == 0:
        os.chown(folder, entry.pw_uid, entry.pw_gid)
        os.chmod(folder, 0o700)
    else:
        # an agent that is not root runs jobs as their users (a Slurm node submitting through sudo): it cannot give
        # the folder away, so it keeps it and gives the job's user rwx by ACL, and whatever the job makes in it
        # stays the agent's to clean up (a default ACL)
        from labq.agent import acl

        owner = folder.stat().st_uid
        if owner != me:
            raise ValueError(f"it belongs to uid {owner}, not to this agent; remove it and requeue the job")
        os.chmod(folder, 0o700)
        acl.grant(folder, entry.pw_uid, 7, inherit_to=(entry.pw_uid, me))
        stopped = acl.let_reach(folder, entry.pw_uid)
        if stopped is not None:
            raise OSError(f"{user} cannot reach it: {stopped} is not this agent's and others may not pass it")
