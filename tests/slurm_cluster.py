"""A real one-node Slurm in a temp folder, from Debian's ``slurm-wlm`` and ``munge``: its own munge daemon (key and
socket of its own), ``slurmctld``, and with ``slurmd`` the node that runs jobs. The node has 8 GPUs as GRES, type
``a100``, backed by files (``select/cons_tres``), so ``--gres=gpu:a100:N`` means what it does on a GPU cluster.
A second node like it is powered down (``State=CLOUD``, last by weight): Slurm plans a two-node job
(``sbatch --test-only``) across both, while jobs run on the first; with ``two_nodes`` it is up too (a slurmd of
its own, on a port of its own), and the partition has two nodes that run jobs.

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
#: what a cluster with accounting (``sacct``) needs besides: slurmdbd and a MariaDB of its own
ACCOUNTING_TOOLS = ("slurmdbd", "sacctmgr", "sacct", "mariadbd", "mariadb-install-db", "mariadb")
NO_ACCOUNTING = "AccountingStorageType=accounting_storage/none\n"
#: (``AccountingStoragePass`` names the munge socket for slurmdbd's side, as a site with a second munge does)
WITH_ACCOUNTING = ("AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n"
                   "AccountingStoragePort={dbd_port}\nAccountingStoragePass={munge_socket}\n")
SLURMDBD_CONF = """AuthType=auth/munge
AuthInfo=socket={munge_socket}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={dbd_port}
SlurmUser={user}
PidFile={root}/slurmdbd.pid
LogFile={root}/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser=slurm
StoragePass={db_password}
StorageLoc=slurm_acct
"""
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
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
MpiDefault=none
ReturnToService=2
{accounting}JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
KillWait=5
SuspendProgram=/bin/true
ResumeProgram=/bin/true
SuspendTime=3600
ResumeTimeout=60
MaxJobCount=200000
{scheduler_parameters}{epilog}NodeName={host} NodeAddr=127.0.0.1 CPUs=16 RealMemory=64000 Gres=gpu:{gres_type}:{gpus} State=UNKNOWN
NodeName={host}-b NodeAddr=127.0.0.1 {second_node} CPUs=16 RealMemory=64000 Gres=gpu:{gres_type}:{gpus}
PartitionName={partition} Nodes={host},{host}-b Default=YES MaxTime=INFINITE State=UP
"""


def missing_tools(accounting: bool = False) -> list[str]:
    return [tool for tool in TOOLS + (ACCOUNTING_TOOLS if accounting else ()) if shutil.which(tool) is None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """``start()`` brings it up (``RuntimeError`` saying why when it cannot); ``env`` is what a Slurm command needs;
    ``stop()`` ends every daemon it started."""

    def __init__(self, root: Path, *, partition: str = "gpu", with_slurmd: bool = True,
                 scheduler_parameters: str | None = None, open_to_all: bool = False,
                 accounting: bool = False, two_nodes: bool = False, epilog: bool = False) -> None:
        """``scheduler_parameters``: Slurm's ``SchedulerParameters`` (e.g. ``batch_sched_delay=0``), else its
        defaults. ``open_to_all``: every account here may use it (its folder, config and munge socket may be
        reached), as on a cluster; else only this one. ``accounting``: with slurmdbd on a MariaDB of its own
        (``sacct`` answers), as most sites run Slurm. ``two_nodes``: the second node runs jobs too. ``epilog``: with an
        ``Epilog`` (one that does nothing), as most sites have: Slurm 22.05 schedules at once when a node's epilog
        completes, and without one only on its next tick (``batch_sched_delay``)."""
        self.root, self.partition, self.with_slurmd = root, partition, with_slurmd
        self.scheduler_parameters, self.open_to_all = scheduler_parameters, open_to_all
        self.accounting, self.two_nodes, self.epilog = accounting, two_nodes, epilog
        self.host = socket.gethostname().split(".")[0]
        self.nodes = [self.host, f"{self.host}-b"] if two_nodes else [self.host]  #: the nodes that run jobs
        self.conf = root / "slurm.conf"
        self.env = os.environ | {"SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen] = []

    def start(self, timeout: float = 30.0) -> SlurmCluster:
        missing = missing_tools(self.accounting)
        if missing:
            raise RuntimeError(f"slurm-wlm, munge (and for accounting slurmdbd and mariadb-server) are not installed "
                               f"here ({', '.join(missing)} not on PATH): ./install.sh installs them")
        root = self.root
        for sub in ("state", "munge", "gpus"):
            (root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.open_to_all:
            for folder in (root, root / "munge"):
                folder.chmod(0o755)
        for i in range(GPUS):  # the GRES files: slurmd only checks they exist
            (root / "gpus" / f"gpu{i}").touch()
        key, sock = root / "munge" / "munge.key", root / "munge" / "munge.socket"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        dbd_port = free_port()
        accounting = WITH_ACCOUNTING.format(dbd_port=dbd_port, munge_socket=sock) if self.accounting else NO_ACCOUNTING
        self.conf.write_text(SLURM_CONF.format(
            host=self.host, port=free_port(), slurmd_port=free_port(), user=getpass.getuser(), munge_socket=sock,
            root=root, gres_type=GRES_TYPE, gpus=GPUS, partition=self.partition, accounting=accounting,
            second_node=f"Port={free_port()} State=UNKNOWN" if self.two_nodes else "State=CLOUD Weight=100",
            scheduler_parameters=f"SchedulerParameters={self.scheduler_parameters}\n" if self.scheduler_parameters
            else "", epilog="Epilog=/bin/true\n" if self.epilog else ""))
        (root / "gres.conf").write_text("".join(  # both nodes' GPUs are the same files: slurmd only checks they exist
            f"NodeName={node} Name=gpu Type={GRES_TYPE} File={root}/gpus/gpu[0-{GPUS - 1}]\n"
            for node in (self.host, f"{self.host}-b")))
        self._spawn("munged", ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={sock}",
                               f"--pid-file={root / 'munge' / 'munged.pid'}",
                               f"--log-file={root / 'munge' / 'munged.log'}",
                               f"--seed-file={root / 'munge' / 'munged.seed'}"])
        if self.accounting:
            self._start_accounting(sock, dbd_port, timeout)
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        if self.with_slurmd:
            for node in self.nodes:
                (root / f"spool-{node}").mkdir(mode=0o700, exist_ok=True)
                self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-f", str(self.conf), "-N", node])
        deadline = time.monotonic() + timeout
        while True:
            if self._ready():
                return self
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = ", ".join(f"{d} exited" for d in dead) or f"not ready in {timeout:g} s"
                raise RuntimeError(f"Slurm did not start ({why}): {self.logs()}")
            time.sleep(0.3)

    def _start_accounting(self, munge_socket: Path, dbd_port: int, timeout: float) -> None:
        """A MariaDB of its own (on 127.0.0.1, a database and a user for slurmdbd), slurmdbd, and this cluster
        registered in it."""
        root, db = self.root, self.root / "db"
        user = getpass.getuser()
        installed = subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={db}", f"--user={user}",
                                    "--auth-root-authentication-method=socket"], capture_output=True, text=True,
                                   timeout=120)
        if installed.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed: {installed.stderr.strip()[-400:]}")
        db_port, socket_path = free_port(), root / "db.sock"
        self._spawn("mariadbd", ["mariadbd", "--no-defaults", f"--datadir={db}", f"--user={user}",
                                 f"--port={db_port}", "--bind-address=127.0.0.1", f"--socket={socket_path}",
                                 f"--pid-file={root / 'mariadbd.pid'}", f"--log-error={root / 'mariadbd.log'}",
                                 "--skip-log-bin", "--innodb-buffer-pool-size=16M"])
        password = os.urandom(12).hex()
        setup = (f"CREATE DATABASE slurm_acct; CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
                 "GRANT ALL ON slurm_acct.* TO 'slurm'@'127.0.0.1';")
        self._until(lambda: self.run("mariadb", "--no-defaults", f"--socket={socket_path}", "-u", "root", "-e",
                                     "SELECT 1", check=False).returncode == 0, "MariaDB", timeout)
        self.run("mariadb", "--no-defaults", f"--socket={socket_path}", "-u", "root", "-e", setup)
        dbd_conf = root / "slurmdbd.conf"  # beside slurm.conf, where slurmdbd looks for it
        dbd_conf.write_text(SLURMDBD_CONF.format(munge_socket=munge_socket, dbd_port=dbd_port, user=user, root=root,
                                                 db_port=db_port, db_password=password))
        dbd_conf.chmod(0o600)
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        self._until(lambda: self.run("sacctmgr", "-i", "add", "cluster", "labqtest", check=False).returncode == 0,
                    "slurmdbd", timeout)

    def _until(self, ready, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = ", ".join(f"{d} exited" for d in dead) or f"not ready in {timeout:g} s"
                raise RuntimeError(f"{what} did not start ({why}): {self.logs()}")
            time.sleep(0.3)

    def forget_jobs(self, timeout: float = 30.0) -> None:
        """Start slurmctld again with a clean state: it no longer knows any job, as after ``MinJobAge`` has passed
        for jobs that ended (the accounting, when there is one, still does)."""
        (controller,) = [p for p in self.procs if p.args[0] == "slurmctld"]
        controller.send_signal(signal.SIGTERM)
        controller.wait(timeout=20)
        self.procs.remove(controller)
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        self._until(self._ready, "slurmctld, started again", timeout)

    def _ready(self) -> bool:
        up = self.run("scontrol", "ping", check=False)
        if "UP" not in up.stdout:
            return False
        if not self.with_slurmd:
            return True
        for name in self.nodes:
            node = self.run("scontrol", "show", "node", name, check=False).stdout
            if not ("State=IDLE" in node or "State=MIXED" in node or "State=ALLOCATED" in node):
                return False
        return True

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
        names = ["munged.out", "mariadbd.log", "slurmdbd.log", "slurmctld.out", "slurmctld.log"]
        names += [f"slurmd-{node}.{end}" for node in self.nodes for end in ("out", "log")]
        return " | ".join(f"{name}: " + (self.root / name).read_text(errors="replace").strip()[-400:]
                          for name in names if (self.root / name).exists())

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
