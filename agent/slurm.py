"""A Slurm partition as one more labq node: ``labq agent --runtime slurm --partition gpu``.

The agent runs on a Slurm submit host. Its node's GPUs are one Slurm node's GPUs in the partition, read from
``scontrol show node`` (GRES ``gpu:TYPE:N``). labq keeps deciding what starts when: a job is handed to Slurm
with ``sbatch`` only when labq places it, pinned with ``--nodelist`` to that node and with ``--gres=gpu:K``
(Slurm picks which K and sets ``CUDA_VISIBLE_DEVICES``), and labq's own contract variables in its
environment. The agent follows it with ``squeue`` (and ``scontrol show job`` for how it ended), signals it with
``scancel --batch --signal`` (the batch shell ``exec``s the job, so the job gets it), and stops it with
``scancel``, which Slurm turns into TERM and, after its ``KillWait``, KILL. The log is the job's ``--output``
file in the agent's folder (a folder the submit host and the compute node share).

Slurm holding a job back (its own priorities, a node drained) is reported as the attempt waiting there
(``AttemptReport.waiting``): labq shows the job starting, not running, until Slurm runs it.

How a job gets to Slurm as its user (``SlurmSite.submit``, ``labq agent --slurm-submit``):

- ``uid``: ``sbatch --uid=USER``, for an agent run as root (the default then);
- ``sudo``: ``sudo -n -u USER sbatch``, and ``scancel`` likewise, for an agent run as a service account that
  the site's sudoers lets run those two as the lab's users. Such an agent cannot ``chown``: it gives the job's
  user its attempt folder, its log and its checkpoint folder by POSIX ACL (``labq.agent.acl``). A user sudo
  refuses is kept off this node, said as the node's problem for that user alone;
- ``agent``: every job as the agent's own account (the default for an agent not run as root), said at start.

The script goes to ``sbatch`` on its standard input: the job's user never needs to read the agent's files. A
container job is not run here: the node says so, and labq places such jobs elsewhere.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from labq.agent import acl
from labq.agent.faults import NodeFault
from labq.agent.inventory import GpuMemory, Inventory
from labq.agent.process_runtime import AttemptState, AttemptStatus, Launch, Start
from labq.models.node import Gpu, NodeProblem
from labq.models.topology import PcieLevel, Topology
from labq.protocol.agents import RunOrder

#: Slurm is asked about the attempts at most this often (the agent looks every 0.1 s): often while an attempt
#: waits to start or has been asked to stop (its start or its end is news), seldom while they just run
POLL_S, POLL_BUSY_S = 1.0, 0.1
log = logging.getLogger("labq.agent")
BUSY_AFTER_SIGNAL_S = 60.0  #: how long after a signal its end is looked for often
COMMAND_TIMEOUT_S = 30.0
_GRES = re.compile(r"gpu(?::([A-Za-z0-9_.-]+))?:(\d+)")
#: Slurm's job states that mean it has ended, and those that mean it waits to start
_ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
          "OUT_OF_MEMORY"}
_WAITING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED"}


class SlurmError(RuntimeError):
    """A Slurm command failed, or Slurm is out of reach."""


class SudoRefused(SlurmError):
    """``sudo -n -u USER`` would not run a Slurm command as that user."""


@dataclass(frozen=True)
class SlurmSite:
    """Where the agent's jobs go: ``partition``, on its Slurm node ``node`` (None: the partition's only node)."""

    partition: str
    node: str | None = None
    #: how jobs go to Slurm as their users (``labq agent --slurm-submit``): ``uid`` (sbatch --uid, as root),
    #: ``sudo`` (sudo -n -u USER) or ``agent`` (all as the agent's own account)
    submit: str = "agent"

    def run(self, *argv: str, check: bool = True, as_user: str | None = None, stdin: str | None = None) -> str:
        """Run a Slurm command (``as_user``: through ``sudo -n -u``); its output. ``SudoRefused`` when sudo will
        not, ``SlurmError`` when the command fails or does not answer."""
        if shutil.which(argv[0]) is None:
            raise SlurmError(f"{argv[0]} is not installed on this machine (Slurm's client commands are needed)")
        command = list(argv)
        if as_user is not None:
            if shutil.which("sudo") is None:
                raise SlurmError("--slurm-submit sudo: sudo is not installed on this machine")
            command = ["sudo", "-n", "-u", as_user, "--", shutil.which(argv[0]), *argv[1:]]
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, input=stdin)
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{argv[0]} did not answer in {COMMAND_TIMEOUT_S:g} s") from None
        said = out.stderr.strip() or out.stdout.strip()
        if as_user is not None and out.returncode != 0 and said.startswith("sudo:"):
            raise SudoRefused(f"sudo -n -u {as_user} {argv[0]} was refused ({said}): the site's sudoers must let "
                              f"this agent's account run sbatch and scancel as {as_user} without a password")
        if check and out.returncode != 0:
            raise SlurmError(f"{' '.join(argv[:3])} failed: {said}")
        return out.stdout

    def epilog(self) -> str | None:
        """The site's ``Epilog`` (``scontrol show config``), or None where it runs none."""
        for line in self.run("scontrol", "show", "config").splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "Epilog":
                value = value.strip()
                return None if value in ("", "(null)") else value
        return None

    def start_note(self) -> str | None:
        """What an admin should know of how this Slurm starts what labq hands it, for the agent's start; None when
        nothing (or Slurm does not say)."""
        try:
            epilog = self.epilog()
        except SlurmError:
            return None
        if epilog is not None:
            return None
        return ("this Slurm runs no Epilog: a job it holds for GPUs being freed (a preemptor) then starts only on "
                "its scheduler's next tick (SchedulerParameters batch_sched_delay, 3 s by default), where with an "
                "Epilog, even Epilog=/bin/true in slurm.conf, Slurm starts it the moment the GPUs are free")

    def slurm_nodes(self) -> list[str]:
        """The partition's nodes, by name."""
        return sorted(set(self.run("sinfo", "-h", "-p", self.partition, "-N", "-o", "%N").split()))

    def slurm_node(self) -> str:
        """The Slurm node this agent offers: the one named, or the partition's only node."""
        names = self.slurm_nodes()
        if not names:
            raise SlurmError(f"Slurm partition {self.partition!r} has no nodes (sinfo -p {self.partition})")
        if self.node is not None:
            if self.node not in names:
                raise SlurmError(f"node {self.node!r} is not in partition {self.partition!r}: "
                                 f"{', '.join(names)}")
            return self.node
        if len(names) > 1:
            raise SlurmError(f"partition {self.partition!r} has nodes {', '.join(names)}: name the one this node "
                             "offers (--slurm-node NAME)")
        return names[0]


def gres_gpus(gres: str) -> tuple[str | None, int]:
    """``gpu:a100:8(S:0-1)`` -> ("a100", 8); several GPU entries add up (the first type names them)."""
    found = _GRES.findall(gres)
    kind = next((t for t, _ in found if t), None)
    return kind, sum(int(n) for _, n in found)


def not_running_jobs(state: str) -> bool:
    """Whether a Slurm node in ``state`` (``scontrol``'s ``IDLE+DRAIN``, ``DOWN*``, ``MIXED``...) takes no new job:
    down, drained or draining, failing, in a maintenance reservation, not responding (``*``), or not known yet."""
    base, *flags = state.rstrip("*$~#!%@^-").split("+")
    return (state.endswith("*") or base in ("DOWN", "FUTURE", "ERROR", "UNKNOWN")
            or bool({"DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "MAINT", "NOT_RESPONDING"} & set(flags)))


class SlurmInventory:
    """The GPUs of one Slurm node, by GRES. Their wiring Slurm does not say: a flat topology (one host bridge).

    While Slurm takes no new job on the node (drained, down), its GPUs are reported busy outside labq, so that
    labq places nothing there meanwhile and its jobs wait in labq's queue, where they may go elsewhere.

    Slurm does not say how much memory its GPUs have: ``gpu_memory_mib`` is what the admin declares (0: unknown,
    and jobs that ask for GPU memory do not come here). Jobs never share these GPUs: Slurm hands out whole ones,
    and per-process memory is not read through it."""

    def __init__(self, site: SlurmSite, gpu_memory_mib: int = 0) -> None:
        self.site = site
        self.node = site.slurm_node()
        self.gpu_memory_mib = gpu_memory_mib
        self._closed_said: str | None = None  #: the state last said to take no jobs, once

    def read(self, managed_pids: frozenset[int] = frozenset()) -> Inventory:
        line = self.site.run("scontrol", "show", "node", "-o", self.node)
        gres = re.search(r"\bGres=(\S+)", line)
        kind, count = gres_gpus(gres.group(1) if gres else "")
        if count == 0:
            raise SlurmError(f"Slurm node {self.node} has no GPUs as GRES (Gres={gres.group(1) if gres else ''})")
        model = f"Slurm GRES gpu:{kind}" if kind else "Slurm GRES gpu"
        gpus = tuple(Gpu(i, f"SLURM-{self.node}-{i}", model, self.gpu_memory_mib) for i in range(count))
        pcie = {(i, j): PcieLevel.HOST_BRIDGE for i in range(count) for j in range(i + 1, count)}
        notes = ["GPU links are not known to Slurm: none assumed"]
        if not self.gpu_memory_mib:
            notes.append("GPU memory is not known to Slurm: jobs that ask for GPU memory do not come here "
                         "(labq agent --slurm-gpu-memory declares it)")
        found = re.search(r"\bState=(\S+)", line)
        state = found.group(1) if found else "UNKNOWN"
        closed = not_running_jobs(state)
        if closed:
            said = re.search(r"\bReason=(.*?)(?= \w+=|$)", line)
            why = f"Slurm node {self.node} is {state}" + (f" ({said.group(1).strip()})" if said else "")
            notes.append(f"{why}: its GPUs count as busy outside labq until Slurm runs jobs there again")
            if self._closed_said != state:
                log.warning("%s: labq places no job there until Slurm runs jobs on it again", why)
        elif self._closed_said is not None:
            log.info("Slurm node %s is %s: labq places jobs there again", self.node, state)
        self._closed_said = state if closed else None
        return Inventory(gpus, Topology.from_pairs(count, pcie, {}), True,
                         frozenset(range(count)) if closed else frozenset(),
                         f"Slurm partition {self.site.partition}, node {self.node}", tuple(notes), shares=False,
                         hands_over=True)

    def memory(self, managed_pids: frozenset[int] = frozenset()) -> GpuMemory:
        return GpuMemory({}, {})  # no per-process reading through Slurm

    def close(self) -> None:
        pass


class SlurmRuntime:
    """Attempts run as Slurm batch jobs; what the agent knows of each is a small folder under ``root``."""

    def __init__(self, root: Path, site: SlurmSite, node: str) -> None:
        self.root, self.site, self.node = root, site, node
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._seen: dict[tuple[int, int], AttemptStatus] = {}
        #: each attempt handed to Slurm through sudo: the user it went as (its scancel goes as that user too)
        self._sudo: dict[tuple[int, int], str] = {}
        #: each attempt handed to Slurm: (its Slurm job id, when it was submitted); on disk in its folder for an
        #: agent started again, read from there once
        self._known: dict[tuple[int, int], tuple[str, float]] = self._load()
        #: why Slurm has not started an attempt yet, as it said at the last look
        self._waiting: dict[tuple[int, int], str] = {}
        self._asked_at = 0.0
        self._busy_until = 0.0  #: until then, ask often: an attempt was signalled

    def _folder(self, job_id: int, attempt: int) -> Path:
        return self.root / f"{job_id}.{attempt}"

    def _load(self) -> dict[tuple[int, int], tuple[str, float]]:
        known = {}
        for folder in self.root.iterdir():
            meta = folder / "slurm.json"
            if not meta.exists():
                continue
            try:
                job_id, attempt = (int(x) for x in folder.name.split("."))
                doc = json.loads(meta.read_text())
                known[(job_id, attempt)] = (str(doc["slurm_id"]), float(doc["submitted_at"]))
                if doc.get("sudo_user"):
                    self._sudo[(job_id, attempt)] = str(doc["sudo_user"])
            except (OSError, ValueError, KeyError, TypeError) as err:  # one damaged folder never stops the others
                log.warning("cannot read %s (%s): that attempt is not followed", meta, err)
        return known

    def owns(self, job_id: int, attempt: int) -> bool:
        return (job_id, attempt) in self._known

    def launch_of(self, order: RunOrder, start: Start) -> Launch:
        return Launch.of(order, start)

    def launch(self, launch: Launch) -> AttemptStatus:
        folder = self._folder(launch.job_id, launch.attempt)
        if folder.exists():
            raise ValueError(f"attempt {launch.job_id}.{launch.attempt} already exists on this agent")
        user = launch.user if self.site.submit != "agent" else None
        ids = _ids(user) if user is not None else None
        sudo = user if self.site.submit == "sudo" and ids is not None and ids[0] != os.geteuid() else None
        folder.mkdir(parents=True, mode=0o700 if sudo else 0o755)
        visible = launch.gpu_env.get("CUDA_VISIBLE_DEVICES", "")
        gpus = len([g for g in visible.split(",") if g]) or 1
        log = folder / "log"
        log.touch(mode=0o600 if sudo else 0o644)
        if sudo is not None:
            self._give(folder, log, ids[0])
        lines = ["#!/bin/bash", f"#SBATCH --job-name=labq-{launch.job_id}.{launch.attempt}",
                 f"#SBATCH --partition={self.site.partition}", f"#SBATCH --nodelist={self.node}",
                 f"#SBATCH --gres=gpu:{gpus}", f"#SBATCH --output={log}", "#SBATCH --open-mode=append",
                 "#SBATCH --no-requeue"]  # labq requeues a stopped job itself, as its next attempt
        if launch.workdir:
            lines.append(f"#SBATCH --chdir={launch.workdir}")
        env = {**launch.env, "LABQ_JOB_ID": str(launch.job_id), "LABQ_ATTEMPT": str(launch.attempt)}
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items())]
        lines.append("exec " + shlex.join(launch.command))
        text = "\n".join(lines) + "\n"
        script = folder / "job.sbatch"  # what was handed to Slurm, for whoever looks into the folder
        script.write_text(text)
        argv = ["sbatch", "--parsable"]
        if self.site.submit == "uid" and ids is not None:
            argv.append(f"--uid={user}")
            os.chown(log, *ids)
        try:
            answer = self.site.run(*argv, stdin=text, as_user=sudo)
        except SudoRefused as err:  # that user's jobs, not the node's: others still run here
            shutil.rmtree(folder, ignore_errors=True)
            why = f"cannot hand {user}'s jobs to Slurm on {self.node}: {err}"
            raise NodeFault(why, NodeProblem(why, user=user)) from None
        except SlurmError as err:
            shutil.rmtree(folder, ignore_errors=True)
            why = f"Slurm refused the job on {self.node}: {err}"
            raise NodeFault(why, NodeProblem(why)) from None
        slurm_id = answer.strip().split(";")[0]
        now = time.time()
        (folder / "slurm.json").write_text(json.dumps({"slurm_id": slurm_id, "submitted_at": now,
                                                       "sudo_user": sudo}))
        key = (launch.job_id, launch.attempt)
        status = AttemptStatus(*key, AttemptState.RUNNING, None, None, None, now, None, str(log))
        with self._lock:
            if sudo is not None:
                self._sudo[key] = sudo
            self._known[key] = (slurm_id, now)
            self._waiting[key] = "Slurm holds it: submitted"  # until Slurm says it runs
            self._seen[key] = status
            self._asked_at = 0.0  # ask Slurm at the next look
        return status

    def _give(self, folder: Path, log: Path, uid: int) -> None:
        """Let user ``uid`` (a job's, through sudo) reach ``folder`` and write its Slurm ``log``, by ACL."""
        try:
            stopped = acl.let_reach(folder, uid)
            acl.grant(folder, uid, 1)
            acl.grant(log, uid, 6)
        except OSError as err:
            shutil.rmtree(folder, ignore_errors=True)
            why = (f"cannot give a job's user its folder {folder} by ACL ({err.strerror or err}): an agent that "
                   "submits through sudo needs a file system that takes POSIX ACLs there (--state-dir)")
            raise NodeFault(why, NodeProblem(why)) from None
        if stopped is not None:
            shutil.rmtree(folder, ignore_errors=True)
            why = (f"the jobs' users cannot reach {folder}: {stopped} is not this agent's and others may not pass "
                   "it (choose a --state-dir they can reach)")
            raise NodeFault(why, NodeProblem(why))

    def attempts(self) -> list[AttemptStatus]:
        """Every attempt handed to Slurm and not forgotten, as Slurm last said (asked at most every POLL_S)."""
        with self._lock:
            now = time.monotonic()
            busy = now < self._busy_until or bool(self._waiting)
            if now - self._asked_at >= (POLL_BUSY_S if busy else POLL_S):
                self._asked_at = now
                self._ask()
            return sorted(self._seen.values(), key=lambda s: (s.job_id, s.attempt))

    def _ask(self) -> None:
        """Take in Slurm's word on every attempt still running here (one squeue; scontrol for those that ended)."""
        self._seen = {k: v for k, v in self._seen.items() if k in self._known}
        ids = {slurm_id: key for key, (slurm_id, _) in self._known.items()
               if key not in self._seen or self._seen[key].state is AttemptState.RUNNING}
        if not ids:
            return
        try:
            table = self.site.run("squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T|%r|%S",
                                  check=False)
        except SlurmError:
            return  # Slurm out of reach: as last seen
        states = {}
        for row in table.splitlines():
            parts = row.split("|")
            if len(parts) == 4:
                states[parts[0]] = parts[1:]
        for slurm_id, key in ids.items():
            log_path = str(self._folder(*key) / "log")
            submitted = self._known[key][1]
            state, reason, start = states.get(slurm_id, ("GONE", "", ""))
            if state in _ENDED or state == "GONE":
                code, sig, ended = self._ending(slurm_id)
                self._seen[key] = AttemptStatus(*key, AttemptState.EXITED, None, code, sig, submitted, ended, log_path)
                self._waiting.pop(key, None)
                continue
            began = _slurm_time(start) if state == "RUNNING" else None
            self._seen[key] = AttemptStatus(*key, AttemptState.RUNNING, None, None, None, began or submitted, None,
                                            log_path)
            if state in _WAITING:
                # Slurm's reason, once its scheduler has looked at the job ("None" until then)
                said = reason if reason and reason != "None" else "not yet looked at by Slurm's scheduler"
                self._waiting[key] = f"Slurm holds it: {said}"
            else:
                self._waiting.pop(key, None)

    def waiting(self, job_id: int, attempt: int) -> str | None:
        """Why Slurm has not started the attempt yet, as it said at the last look; None once it runs."""
        return self._waiting.get((job_id, attempt))

    def _ending(self, slurm_id: str) -> tuple[int | None, int | None, float]:
        """(exit code, signal, end) of an ended job: from ``scontrol show job`` while slurmctld still keeps it
        (``MinJobAge``, 5 minutes by default), else from the accounting (``sacct``), which keeps it for good where
        the site runs slurmdbd; else unknown (None: the attempt failed, its exit not known), ended now."""
        now = time.time()
        try:
            line = self.site.run("scontrol", "show", "job", "-o", slurm_id, check=False)
        except SlurmError:
            line = ""
        found = re.search(r"\bExitCode=(\d+):(\d+)", line)
        end = re.search(r"\bEndTime=(\S+)", line)
        if found is None:
            return self._accounted(slurm_id) or (None, None, now)
        code, sig = int(found.group(1)), int(found.group(2))
        ended = (_slurm_time(end.group(1)) if end else None) or now
        return (128 + sig, sig, ended) if sig else (code, None, ended)

    def _accounted(self, slurm_id: str) -> tuple[int | None, int | None, float] | None:
        """How Slurm's accounting says the job ended; None where there is no accounting or it has no record."""
        try:
            table = self.site.run("sacct", "-n", "-P", "-X", "-j", slurm_id, "-o", "JobID,State,ExitCode,End",
                                  check=False)
        except SlurmError:
            return None
        found = None
        for row in table.splitlines():  # oldest first: a later record of the same id (a requeue) wins
            parts = row.split("|")
            if len(parts) != 4 or parts[0] != slurm_id or parts[1].split()[0] not in _ENDED:
                continue
            code, _, sig = parts[2].partition(":")
            if code.isdigit() and sig.isdigit():
                ended = _slurm_time(parts[3]) or time.time()
                found = (128 + int(sig), int(sig), ended) if int(sig) else (int(code), None, ended)
        return found

    def signal(self, job_id: int, attempt: int, sig: int) -> bool:
        slurm_id = self._slurm_id(job_id, attempt)
        if slurm_id is None:
            return False
        try:
            self.site.run("scancel", "--batch", f"--signal={int(sig)}", slurm_id,
                          as_user=self._sudo.get((job_id, attempt)))
        except SlurmError as err:
            log.warning("could not signal job %d attempt %d (Slurm job %s): %s", job_id, attempt, slurm_id, err)
            return False
        self._busy_until = time.monotonic() + BUSY_AFTER_SIGNAL_S
        return True

    def stop(self, job_id: int, attempt: int, grace_s: float) -> None:
        """``scancel``: Slurm sends TERM, and KILL after its KillWait."""
        slurm_id = self._slurm_id(job_id, attempt)
        if slurm_id is not None:
            try:
                self.site.run("scancel", slurm_id, check=False, as_user=self._sudo.get((job_id, attempt)))
            except SlurmError as err:
                log.warning("could not stop job %d attempt %d (Slurm job %s): %s", job_id, attempt, slurm_id, err)
            self._busy_until = time.monotonic() + BUSY_AFTER_SIGNAL_S

    def forget(self, job_id: int, attempt: int) -> None:
        folder = self._folder(job_id, attempt)
        logs = self.root / "logs"
        logs.mkdir(exist_ok=True)
        if (folder / "log").exists():
            if (job_id, attempt) in self._sudo:  # the job's user wrote it while the job ran; not after
                acl.revoke_all(folder / "log")
            os.replace(folder / "log", logs / f"{job_id}.{attempt}.log")
        shutil.rmtree(folder, ignore_errors=True)
        with self._lock:
            for book in (self._seen, self._known, self._waiting, self._sudo):
                book.pop((job_id, attempt), None)

    def read_log(self, job_id: int, attempt: int, offset: int = 0, limit: int = 1 << 20) -> bytes:
        for path in (self._folder(job_id, attempt) / "log", self.root / "logs" / f"{job_id}.{attempt}.log"):
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    return f.read(limit)
            except FileNotFoundError:
                continue
        raise KeyError((job_id, attempt))

    def _slurm_id(self, job_id: int, attempt: int) -> str | None:
        known = self._known.get((job_id, attempt))
        return known[0] if known is not None else None


def _slurm_time(text: str) -> float | None:
    """Slurm's ``2026-11-26T23:44:43`` (this machine's zone) as a timestamp; None for ``N/A`` and the like."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _ids(user: str) -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid
