"""What a simulation takes and gives: pure data, times in seconds on the virtual clock."""

from __future__ import annotations

from dataclasses import dataclass, field

from labq.models.priority import PriorityClass


@dataclass(frozen=True)
class TraceJob:
    """One job of a workload: when it is submitted, what it asks for and how long it works."""

    id: int  #: 1, 2, ... in submit order
    submit: float  #: seconds on the virtual clock (0 is the workload's ``epoch``)
    duration: float  #: seconds of work it needs to finish (a resumed job needs only what is left)
    gpus: int
    user: str = "user"
    vc: str = ""  #: the trace's virtual cluster, if it has any
    priority: int = int(PriorityClass.NORMAL)
    preemptible: bool = True
    time_limit_s: float | None = None
    reservation: str | None = None  #: the name of the reservation it runs in
    queue: str | None = None  #: the lab queue (team) it is served in
    #: CPU cores and memory (MiB) it needs on each node; None: the lab's default for its GPUs
    cpus: float | None = None
    memory_mib: int | None = None


@dataclass(frozen=True)
class TraceReservation:
    """A booking made at ``booked`` for ``gpus`` GPUs from ``start`` to ``end``."""

    name: str
    user: str
    gpus: int
    start: float
    end: float
    booked: float = 0.0
    users: tuple[str, ...] = ()


@dataclass(frozen=True)
class Workload:
    jobs: tuple[TraceJob, ...]
    reservations: tuple[TraceReservation, ...] = ()
    epoch: float = 0.0  #: the Unix time of virtual time 0, for showing dates
    source: str = ""  #: where it came from, in words


@dataclass(frozen=True)
class JobOutcome:
    job: TraceJob
    start: float | None  #: first start; None if it never started
    end: float | None  #: when it finished; None if it had not when the simulation stopped
    preemptions: int = 0
    lost_gpu_s: float = 0.0  #: GPU-seconds of work redone because of preemptions


@dataclass(frozen=True)
class Sample:
    """The lab at one moment: jobs waiting, jobs running, GPUs busy."""

    t: float
    queued: int
    running: int
    busy_gpus: int


@dataclass(frozen=True)
class SimResult:
    policy: str
    cluster: str  #: the cluster spec, e.g. "16xsim:dgx1"
    gpus: int  #: GPUs in the cluster
    outcomes: tuple[JobOutcome, ...]
    skipped: tuple[tuple[TraceJob, str], ...] = ()  #: jobs that can never fit, with why
    samples: tuple[Sample, ...] = ()
    busy_gpu_s: float = 0.0  #: GPU-seconds with a job on them (work, and work later lost)
    wall_s: float = 0.0
    passes: int = 0  #: scheduling passes run
    epoch: float = 0.0
    meta: dict = field(default_factory=dict)  #: seed, window, virtual cluster, ...
    #: every attempt that ended: (job id, start, end, GPUs), for shares of GPU-time over any window
    runs: tuple[tuple[int, float, float, int], ...] = ()
