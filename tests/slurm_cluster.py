"""A real one-node Slurm in a temp folder, from Debian's ``slurm-wlm`` and ``munge``: its own munge daemon (key and
socket of its own), ``slurmctld``, and with ``slurmd`` the node that runs jobs. The node has 8 GPUs as GRES, type
``a100``, backed by files (``select/cons_tres``), so ``--gres=gpu:a100:N`` means what it does on a GPU cluster.
A second node like it is powered down (``State=CLOUD``, last by weight): Slurm plans a two-node job
(``sbatch --test-only``) across both, while jobs run on the first.

Used by the tests (``tests/conftest.py``'s ``slurm`` fixture) and ``bench/scale.py``. Nothing is sent anywhere but
127.0.0.1.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

TOOLS = ("sbatch", "slurmctld", "slurmd", "scontrol", "munged")
GPUS = 8
GRES_TYPE = "a100"

SLURM_CONF = """ClusterName=labqtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={port}
SlurmdPort={slurmd_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
MpiDefault=none
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
KillWait=5
SuspendProgram=/bin/true
ResumeProgram=/bin/true
SuspendTime=3600
ResumeTimeout=60
MaxJobCount=200000
{scheduler_parameters}NodeName={host} NodeAddr=127.0.0.1 CPUs=16 RealMemory=64000 Gres=gpu:{gres_type}:{gpus} State=UNKNOWN
NodeName={host}-b NodeAddr=127.0.0.1 CPUs=16 RealMemory=64000 Gres=gpu:{gres_type}:{gpus} State=CLOUD Weight=100
PartitionName={partition} Nodes={host},{host}-b Default=YES MaxTime=INFINITE State=UP
"""


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """``start()`` brings it up (``RuntimeError`` saying why when it cannot); ``env`` is what a Slurm command needs;
    ``stop()`` ends every daemon it started."""

    def __init__(self, root: Path, *, partition: str = "gpu", with_slurmd: bool = True,
                 scheduler_parameters: str | None = None, open_to_all: bool = False) -> None:
        """``scheduler_parameters``: Slurm's ``SchedulerParameters`` (e.g. ``batch_sched_delay=0``), else its
        defaults. ``open_to_all``: every account here may use it (its folder, config and munge socket may be
        reached), as on a cluster; else only this one."""
        self.root, self.partition, self.with_slurmd = root, partition, with_slurmd
        self.scheduler_parameters, self.open_to_all = scheduler_parameters, open_to_all
        self.host = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.env = os.environ | {"SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen] = []

    def start(self, timeout: float = 30.0) -> SlurmCluster:
        missing = missing_tools()
        if missing:
            raise RuntimeError(f"slurm-wlm and munge are not installed here ({', '.join(missing)} not on PATH): "
                               "./install.sh installs them")
        root = self.root
        for sub in ("state", "spool", "munge", "gpus"):
            (root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.open_to_all:
            for folder in (root, root / "munge"):
                folder.chmod(0o755)
        for i in range(GPUS):  # the GRES files: slurmd only checks they exist
            (root / "gpus" / f"gpu{i}").touch()
        key, sock = root / "munge" / "munge.key", root / "munge" / "munge.socket"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.conf.write_text(SLURM_CONF.format(
            host=self.host, port=free_port(), slurmd_port=free_port(), user=getpass.getuser(), munge_socket=sock,
            root=root, gres_type=GRES_TYPE, gpus=GPUS, partition=self.partition,
            scheduler_parameters=f"SchedulerParameters={self.scheduler_parameters}\n" if self.scheduler_parameters
            else ""))
        (root / "gres.conf").write_text(
            f"NodeName={self.host} Name=gpu Type={GRES_TYPE} File={root}/gpus/gpu[0-{GPUS - 1}]\n")
        self._spawn("munged", ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={sock}",
                               f"--pid-file={root / 'munge' / 'munged.pid'}",
                               f"--log-file={root / 'munge' / 'munged.log'}",
                               f"--seed-file={root / 'munge' / 'munged.seed'}"])
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        if self.with_slurmd:
            self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf), "-N", self.host])
        deadline = time.monotonic() + timeout
        while True:
            if self._ready():
                return self
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = ", ".join(f"{d} exited" for d in dead) or f"not ready in {timeout:g} s"
                raise RuntimeError(f"Slurm did not start ({why}): {self.logs()}")
            time.sleep(0.3)

    def _ready(self) -> bool:
        up = self.run("scontrol", "ping", check=False)
        if "UP" not in up.stdout:
            return False
        if not self.with_slurmd:
            return True
        node = self.run("scontrol", "show", "node", self.host, check=False).stdout
        return "State=IDLE" in node or "State=MIXED" in node or "State=ALLOCATED" in node

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.root / f"{name}.out", "wb") as out:
            self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                               cwd=self.root, start_new_session=True))

    def run(self, *argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
        out = subprocess.run(list(argv), env=self.env, cwd=self.root, capture_output=True, text=True,
                             timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip()}")
        return out

    def logs(self) -> str:
        return " | ".join(f"{name}: " + (self.root / name).read_text(errors="replace").strip()[-400:]
                          for name in ("munged.out", "slurmctld.out", "slurmctld.log", "slurmd.out", "slurmd.log")
                          if (self.root / name).exists())

    def stop(self) -> None:
        if self.with_slurmd:
            self.run("scancel", "--full", "--partition", self.partition, check=False)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
