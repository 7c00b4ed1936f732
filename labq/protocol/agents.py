"""What agents and the leader say to each other: register once, then sync level-triggered.

An agent reports every attempt it knows (running, or exited and not yet
acknowledged) and gets back the attempts that should run on it and those it
must stop. The leader holds a sync open (a long poll) until something changes
for that agent or ``wait_s`` passes, so a submit reaches an idle agent at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from labq.models.job import JobSpec, SignalSource, catchable_signal
from labq.models.node import Account, Gpu, Node, NodeHealth, NodeProblem, parse_cpu_list
from labq.models.topology import PcieLevel, Topology
from labq.protocol.codec import decode_spec, encode_node, encode_spec
from labq.protocol.errors import bad_request
from labq.protocol.fields import Fields

MAX_WAIT_S = 60.0
MAX_NODE_GPUS = 128
MAX_CPU_LIST = 65536  #: characters of a CPU list (``0-63,128-191``) a node may send
MAX_USERS = 4096  #: the lab users a sync reply names, and an agent's report maps to accounts
MAX_PROBLEMS = 64
MAX_DETAIL = 1000  #: bytes of a sentence saying why a node cannot start a job
#: a job touches this file in LABQ_CHECKPOINT_DIR after each finished save; its mtime is the checkpoint's time
CHECKPOINT_MARKER = ".labq-checkpoint"
#: a container image's label naming the signal its jobs checkpoint on (``LABEL labq.checkpoint-signal=SIGUSR1``)
CHECKPOINT_LABEL = "labq.checkpoint-signal"
MARKER_READ_BYTES = 64  #: the most a marker that names a signal (``labq checkpoint --signal``) may hold
#: how an agent stops a job, which the leader's timings rely on: after the grace, TERM; this long after, KILL
KILL_AFTER_TERM_S = 10.0
#: how often a job's shim or container watchdog looks at the agent's heartbeat
FENCE_LOOK_EVERY_S = 1.0


@dataclass(frozen=True)
class Registration:
    node: Node
    logs_url: str | None
    version: str
    csr: str | None = None  #: the agent's certificate signing request (PEM), for a TLS lab's CA to sign


MAX_CSR = 8192


def encode_registration(reg: Registration) -> dict:
    doc = {"node": encode_node(reg.node), "logs_url": reg.logs_url, "version": reg.version}
    if reg.csr is not None:
        doc["csr"] = reg.csr
    return doc


def parse_registration(body: object) -> Registration:
    f = Fields(body, "a registration")
    node_doc = f.raw("node", required=True)
    logs_url = f.string("logs_url", max_len=512)
    version = f.string("version", required=True, max_len=64)
    csr = f.raw("csr")
    f.done()
    if csr is not None and not (isinstance(csr, str) and len(csr) <= MAX_CSR and csr.isascii()
                                and csr.lstrip().startswith("-----BEGIN CERTIFICATE REQUEST-----")):
        raise bad_request(f"csr must be a PEM certificate signing request of at most {MAX_CSR} ASCII characters",
                          "csr")
    return Registration(parse_node(node_doc), logs_url, version, csr)


def parse_node(doc: object) -> Node:
    """An agent's inventory, field by field: ``decode_node`` trusts the store, this does not trust the network."""
    f = Fields(doc, "node", "node.")
    name = f.name("name", "node name", required=True)
    gpus = _items(f.raw("gpus", required=True), "node.gpus", MAX_NODE_GPUS)
    topology = Fields(f.raw("topology", required=True), "node.topology", "node.topology.")
    health = f.string("health", max_len=16) or NodeHealth.UP.value
    busy = _ints(f.raw("unmanaged_busy") or [], "node.unmanaged_busy", high=MAX_NODE_GPUS)
    simulated = f.boolean("simulated", default=False)
    shares = f.boolean("shares", default=True)
    hands_over = f.boolean("hands_over", default=False)
    labels = _items(f.raw("labels") or [], "node.labels", 64)
    cpus = _cpu_list(f.string("cpus", max_len=MAX_CPU_LIST), "node.cpus")
    memory_mib = f.integer("memory_mib", low=1, high=1 << 40)  # absent from an agent of an older labq
    f.done()
    if health not in {h.value for h in NodeHealth}:
        raise bad_request(f"node.health must be one of {', '.join(h.value for h in NodeHealth)}", "node.health")
    if not all(isinstance(label, str) and label.isprintable() and len(label) <= 128 for label in labels):
        raise bad_request("node.labels must be short printable strings", "node.labels")
    parsed = []
    for item in gpus:
        g = Fields(item, "a GPU", "node.gpus.")
        parsed.append(Gpu(g.integer("index", required=True, high=MAX_NODE_GPUS), g.string("uuid", required=True),
                          g.string("model", required=True), g.integer("memory_mib", required=True, high=1 << 30),
                          _cpu_list(g.string("local_cpus", max_len=MAX_CPU_LIST), "node.gpus.local_cpus")))
        g.done()
    n = len(parsed)
    pcie = _rows(topology.raw("pcie", required=True), "node.topology.pcie", n, {int(v) for v in PcieLevel})
    nvlinks = _rows(topology.raw("nvlinks", required=True), "node.topology.nvlinks", n, range(64))
    nvswitch = _ints(topology.raw("nvswitch_links") or [], "node.topology.nvswitch_links", high=64)
    numa = _items(topology.raw("numa") or [], "node.topology.numa", MAX_NODE_GPUS)
    topology.done()
    if not all(v is None or isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1024 for v in numa):
        raise bad_request("node.topology.numa must list a NUMA node (or null) per GPU", "node.topology.numa")
    try:
        return Node(name, tuple(parsed), Topology(tuple(tuple(PcieLevel(v) for v in row) for row in pcie),
                                                  tuple(tuple(row) for row in nvlinks), tuple(nvswitch), tuple(numa)),
                    NodeHealth(health), frozenset(busy), simulated, tuple(labels), shares=shares,
                    hands_over=hands_over, cpus=cpus, memory_mib=memory_mib)
    except ValueError as err:
        raise bad_request(f"node is not a valid inventory: {err}", "node") from None


def _cpu_list(text: str | None, what: str) -> tuple[int, ...]:
    """A CPU list as Linux writes it (``0-31,64-95``); () where the agent did not send one."""
    try:
        return parse_cpu_list(text or "")
    except ValueError as err:
        raise bad_request(f"{what}: {err}", what) from None


def _items(value: object, what: str, most: int) -> list:
    if not isinstance(value, list) or len(value) > most:
        raise bad_request(f"{what} must be a list of at most {most}", what)
    return value


def _ints(value: object, what: str, high: int) -> list[int]:
    items = _items(value, what, MAX_NODE_GPUS)
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= high for v in items):
        raise bad_request(f"{what} must be a list of whole numbers from 0 to {high}", what)
    return items


def _rows(value: object, what: str, n: int, allowed) -> list[list[int]]:
    """A square table of ``n`` rows of ``n`` values from ``allowed``."""
    rows = _items(value, what, MAX_NODE_GPUS)
    if len(rows) != n or not all(isinstance(row, list) and len(row) == n and all(
            isinstance(v, int) and not isinstance(v, bool) and v in allowed for v in row) for row in rows):
        raise bad_request(f"{what} must be a {n}x{n} table, one row per GPU", what)
    return rows


@dataclass(frozen=True)
class AttemptReport:
    job_id: int
    attempt: int
    running: bool
    exit_code: int | None = None
    signal: int | None = None
    started_at: float | None = None
    ended_at: float | None = None
    fenced: bool = False  #: stopped on the node because its agent lost the leader
    escalated: bool = False  #: asked to stop, it was still running when its grace ran out
    checkpoint_at: float | None = None  #: the last checkpoint the job reported (its marker's time)
    #: why the node could not start it, for a reason of the node's (no account, no docker daemon, image
    #: missing there, a failure before the program ran), not the job's: the leader requeues the job
    cannot_start: str | None = None
    #: the signal the job declared it checkpoints on, when it did, and where: its marker's content (the job's
    #: ``labq checkpoint --signal``) or its image's label
    checkpoint_signal: str | None = None
    signal_from: SignalSource | None = None
    #: a job that shares its GPU: the GPU memory its processes use now, and the most seen this attempt (MiB)
    gpu_mem_mib: int | None = None
    gpu_mem_peak_mib: int | None = None
    #: handed to another scheduler (a Slurm node) that has not started it yet, and why ("Slurm holds it: Priority")
    waiting: str | None = None
    #: why it could not start, for a reason of the job's (a program not on its PATH, a policy): it fails so
    refused: str | None = None
    #: the kernel killed it for want of memory (its ``--mem``), and the most memory it was seen using (MiB)
    oom: bool = False
    memory_peak_mib: int | None = None


@dataclass(frozen=True)
class SyncReport:
    """What an agent tells the leader at each sync.

    ``accounts`` and ``problems`` come only from agents that heard ``users`` in a reply (the leader
    understands them), and are the whole truth each time: what is not reported any more is gone.
    """

    attempts: tuple[AttemptReport, ...]
    unmanaged_busy: frozenset[int] | None
    wait_s: float
    #: per GPU index: {"memory_free_mib": int|None, "utilization_pct": int|None}, when the node can tell
    gpu_usage: dict[int, dict] | None = None
    #: how this node maps each of the lab's users (``SyncReply.users``) to a local account, or why it cannot
    accounts: tuple[Account, ...] | None = None
    #: what keeps jobs from starting on this node now
    problems: tuple[NodeProblem, ...] | None = None
    #: per GPU index: the GPU memory processes outside labq use (MiB), where NVML says
    unmanaged_mib: dict[int, int] | None = None


def encode_sync(report: SyncReport) -> dict:
    doc = {
        "attempts": [_encode_attempt(a) for a in report.attempts],
        "unmanaged_busy": sorted(report.unmanaged_busy) if report.unmanaged_busy is not None else None,
        "wait_s": report.wait_s,
        "gpu_usage": ({str(i): u for i, u in report.gpu_usage.items()} if report.gpu_usage is not None else None),
    }
    if report.accounts is not None:  # absent, not null, for a leader of an older labq, which refuses the field
        doc["accounts"] = [encode_account(a) for a in report.accounts]
    if report.problems is not None:
        doc["problems"] = [encode_problem(p) for p in report.problems]
    if report.unmanaged_mib is not None:
        doc["unmanaged_mib"] = {str(i): mib for i, mib in report.unmanaged_mib.items()}
    return doc


def _encode_attempt(a: AttemptReport) -> dict:
    doc = {"job_id": a.job_id, "attempt": a.attempt, "running": a.running, "exit_code": a.exit_code,
           "signal": a.signal, "started_at": a.started_at, "ended_at": a.ended_at, "fenced": a.fenced,
           "escalated": a.escalated, "checkpoint_at": a.checkpoint_at}
    if a.cannot_start is not None:
        doc["cannot_start"] = a.cannot_start
    if a.checkpoint_signal is not None and a.signal_from is not None:
        doc["checkpoint_signal"], doc["signal_from"] = a.checkpoint_signal, a.signal_from.value
    if a.gpu_mem_mib is not None:  # only for jobs that share their GPU
        doc["gpu_mem_mib"], doc["gpu_mem_peak_mib"] = a.gpu_mem_mib, a.gpu_mem_peak_mib
    if a.waiting is not None:  # only from a node that hands its jobs to Slurm
        doc["waiting"] = a.waiting
    if a.refused is not None:
        doc["refused"] = a.refused
    if a.oom:
        doc["oom"] = True
    if a.memory_peak_mib is not None:
        doc["memory_peak_mib"] = a.memory_peak_mib
    return doc


def _declared(a: Fields) -> tuple[str | None, SignalSource | None]:
    """An attempt's declared checkpoint signal and its source, both or neither."""
    text, source = a.string("checkpoint_signal", max_len=16), a.string("signal_from", max_len=16)
    if text is None and source is None:
        return None, None
    signal = catchable_signal(text) if text is not None else None
    if signal is None:
        raise bad_request(f"attempts.checkpoint_signal {text!r} is not a signal a job can catch",
                          "attempts.checkpoint_signal")
    try:
        return signal, SignalSource(source)
    except ValueError:
        raise bad_request(f"attempts.signal_from must be one of {', '.join(s.value for s in SignalSource)}",
                          "attempts.signal_from") from None


def encode_account(a: Account) -> dict:
    return {"user": a.user, "login": a.login, "uid": a.uid, "gid": a.gid, "problem": a.problem}


def encode_problem(p: NodeProblem) -> dict:
    return {"detail": p.detail, "user": p.user, "runtime": p.runtime, "image": p.image}


def parse_sync(body: object) -> SyncReport:
    f = Fields(body, "a sync")
    raw_attempts = f.raw("attempts", required=True)
    busy = f.raw("unmanaged_busy")
    wait_s = f.number("wait_s", high=MAX_WAIT_S) or 0.0
    usage = _gpu_usage(f.raw("gpu_usage"))
    accounts = _accounts(f.raw("accounts"))
    problems = _problems(f.raw("problems"))
    unmanaged_mib = _per_gpu_mib(f.raw("unmanaged_mib"), "unmanaged_mib")
    f.done()
    if not isinstance(raw_attempts, list):
        raise bad_request("attempts must be a list", "attempts")
    attempts = []
    for item in raw_attempts:
        a = Fields(item, "an attempt", "attempts.")
        attempts.append(AttemptReport(
            a.integer("job_id", required=True, low=1), a.integer("attempt", required=True, low=1),
            a.boolean("running", default=False), a.integer("exit_code", low=-1, high=1 << 16),
            a.integer("signal", low=1, high=128), a.number("started_at"), a.number("ended_at"),
            a.boolean("fenced", default=False), a.boolean("escalated", default=False), a.number("checkpoint_at"),
            a.string("cannot_start", max_len=MAX_DETAIL), *_declared(a),
            a.integer("gpu_mem_mib", high=1 << 30), a.integer("gpu_mem_peak_mib", high=1 << 30),
            a.string("waiting", max_len=MAX_DETAIL), a.string("refused", max_len=MAX_DETAIL),
            a.boolean("oom", default=False), a.integer("memory_peak_mib", high=1 << 40)))
        a.done()
    if busy is not None and (not isinstance(busy, list) or len(busy) > MAX_NODE_GPUS or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_NODE_GPUS for i in busy)):
        raise bad_request("unmanaged_busy must be a list of GPU indices", "unmanaged_busy")
    return SyncReport(tuple(attempts), frozenset(busy) if busy is not None else None, wait_s, usage, accounts,
                      problems, unmanaged_mib)


def _per_gpu_mib(raw: object, what: str) -> dict[int, int] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) > MAX_NODE_GPUS or not all(
            isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 3 and isinstance(v, int)
            and not isinstance(v, bool) and 0 <= v <= 1 << 30 for k, v in raw.items()):
        raise bad_request(f"{what} must map GPU indices to MiB", what)
    return {int(k): v for k, v in raw.items()}


def _accounts(raw: object) -> tuple[Account, ...] | None:
    if raw is None:
        return None
    accounts = []
    for item in _items(raw, "accounts", MAX_USERS):
        a = Fields(item, "an account", "accounts.")
        accounts.append(Account(a.string("user", required=True, max_len=128), a.string("login", max_len=128),
                                a.integer("uid", high=2**32 - 1), a.integer("gid", high=2**32 - 1),
                                a.string("problem", max_len=MAX_DETAIL)))
        a.done()
    return tuple(accounts)


def _problems(raw: object) -> tuple[NodeProblem, ...] | None:
    if raw is None:
        return None
    problems = []
    for item in _items(raw, "problems", MAX_PROBLEMS):
        p = Fields(item, "a problem", "problems.")
        problems.append(NodeProblem(p.string("detail", required=True, max_len=MAX_DETAIL),
                                    p.string("user", max_len=128), p.string("runtime", max_len=16),
                                    p.string("image", max_len=512)))
        p.done()
    return tuple(problems)


def _gpu_usage(raw: object) -> dict[int, dict] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) > MAX_NODE_GPUS or not all(
            isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 3 for k in raw):
        raise bad_request("gpu_usage must map GPU indices to usage", "gpu_usage")
    usage = {}
    for key, item in raw.items():
        u = Fields(item, "a GPU's usage", "gpu_usage.")
        usage[int(key)] = {"memory_free_mib": u.integer("memory_free_mib", high=1 << 30),
                           "utilization_pct": u.integer("utilization_pct", high=100)}
        u.done()
    return usage


@dataclass(frozen=True)
class RunOrder:
    """An attempt the agent must be running: the job's spec, and what the leader adds to it (where it is
    placed, its environment with the ``LABQ_`` contract, its checkpoint signal and folder)."""

    job_id: int
    attempt: int
    spec: JobSpec
    env: dict[str, str]  #: the job's env plus the LABQ_ contract and the GPU variables
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    checkpoint_signal: str | None  #: None: the job has not declared one yet (its image's label may)
    simulated: bool = False
    #: LABQ_CHECKPOINT_DIR when the lab keeps checkpoints on shared storage; None: the agent's own folder
    checkpoint_dir: str | None = None
    #: a job that shares its GPU: past this much GPU memory (MiB) it is stopped (``labq.models.sharing``)
    gpu_mem_limit_mib: int | None = None
    #: the CPUs it may run on here (near its GPUs), the cores of CPU time it may use, and the memory past which
    #: the kernel kills it (MiB); () and None: not limited
    cpu_set: tuple[int, ...] = ()
    cpu_limit: float | None = None
    memory_limit_mib: int | None = None

    @property
    def user(self) -> str:
        return self.spec.user


@dataclass(frozen=True)
class StopOrder:
    """An attempt the agent must stop: send ``signal``, wait ``grace_s``, then TERM and KILL."""

    job_id: int
    attempt: int
    signal: str
    grace_s: float
    reason: str


@dataclass(frozen=True)
class SyncReply:
    run: tuple[RunOrder, ...]
    stop: tuple[StopOrder, ...]
    lease_s: float
    fence_after_s: float
    #: the order in which one leader process made its replies, and that process: an agent that has two
    #: syncs open (a long poll and an exit report) applies a reply only if no later one was applied
    seq: int = 0
    epoch: str = ""
    #: the lab's users, for the agent to map to local accounts and report (None: a leader of an older labq)
    users: tuple[str, ...] | None = None

    def older_than(self, other: SyncReply | None) -> bool:
        return other is not None and bool(self.epoch) and self.epoch == other.epoch and self.seq <= other.seq


def encode_reply(reply: SyncReply) -> dict:
    return {
        "run": [{"job_id": r.job_id, "attempt": r.attempt, "spec": encode_spec(r.spec), "env": r.env,
                 "gpu_indices": list(r.gpu_indices), "gpu_uuids": list(r.gpu_uuids),
                 "checkpoint_signal": r.checkpoint_signal, "simulated": r.simulated, "checkpoint_dir": r.checkpoint_dir,
                 **({"gpu_mem_limit_mib": r.gpu_mem_limit_mib} if r.gpu_mem_limit_mib is not None else {}),
                 **({"cpu_set": list(r.cpu_set)} if r.cpu_set else {}),
                 **({"cpu_limit": r.cpu_limit} if r.cpu_limit is not None else {}),
                 **({"memory_limit_mib": r.memory_limit_mib} if r.memory_limit_mib is not None else {})}
                for r in reply.run],
        "stop": [{"job_id": s.job_id, "attempt": s.attempt, "signal": s.signal, "grace_s": s.grace_s,
                  "reason": s.reason} for s in reply.stop],
        "lease_s": reply.lease_s, "fence_after_s": reply.fence_after_s, "seq": reply.seq, "epoch": reply.epoch,
        **({"users": list(reply.users)} if reply.users is not None else {}),
    }


def decode_reply(doc: dict) -> SyncReply:
    return SyncReply(
        tuple(RunOrder(r["job_id"], r["attempt"], decode_spec(r["spec"]), dict(r["env"]), tuple(r["gpu_indices"]),
                       tuple(r["gpu_uuids"]), r["checkpoint_signal"], r.get("simulated", False),
                       r.get("checkpoint_dir"), r.get("gpu_mem_limit_mib"), tuple(r.get("cpu_set", ())),
                       r.get("cpu_limit"), r.get("memory_limit_mib"))
              for r in doc["run"]),
        tuple(StopOrder(s["job_id"], s["attempt"], s["signal"], s["grace_s"], s["reason"]) for s in doc["stop"]),
        doc["lease_s"], doc["fence_after_s"], int(doc.get("seq", 0)), str(doc.get("epoch", "")),
        tuple(str(u) for u in doc["users"]) if doc.get("users") is not None else None)
