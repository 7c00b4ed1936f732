"""What a user asks for (JobSpec) and what becomes of it (Job)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from functools import cached_property

from labq.models.placement import Placement
from labq.models.spec import FIELDS, AfterReservation, Runtime

__all__ = ["FAILED_NOTE", "AfterReservation", "Attempt", "AttemptEnd", "Job", "JobSpec", "JobState", "Mount", "Runtime",
           "SignalSource", "StopReason", "catchable_signal"]


class JobState(str, Enum):
    QUEUED = "queued"  #: waiting for GPUs (again, after a preemption)
    HELD = "held"  #: kept out of scheduling until released
    STARTING = "starting"  #: placed; the agent is launching it
    RUNNING = "running"  #: the agent reports it running
    PREEMPTING = "preempting"  #: told to checkpoint to make room for another job
    SUCCEEDED = "succeeded"  #: exited 0
    FAILED = "failed"  #: exited non-zero, or could not be launched
    CANCELLED = "cancelled"  #: stopped by its user or an admin
    TIMEOUT = "timeout"  #: stopped at its time limit

    @property
    def finished(self) -> bool:
        return self in _FINISHED

    @property
    def holds_gpus(self) -> bool:
        """The job occupies its placement's GPUs."""
        return self in _ON_GPUS


#: ``Job.cancelled_by`` of a job the lab itself cancelled (a dependency that can never be met, a reservation over)
CANCELLED_BY_LAB = "labq"
#: how a job's note begins what its node said of why an attempt ended (it could not start, the kernel killed it)
FAILED_NOTE = "ended: "
_FINISHED = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT})
_ON_GPUS = frozenset({JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING})


class AttemptEnd(str, Enum):
    """How one attempt ended."""

    SUCCEEDED = "succeeded"  #: ran to its end, exit 0
    FAILED = "failed"  #: ran to its end (or could not start), non-zero
    CHECKPOINTED = "checkpointed"  #: asked to stop (preemption, time limit), exited 0 within the grace
    PREEMPTED = "preempted"  #: asked to stop for a preemption, ended otherwise within the grace (a crash)
    KILLED = "killed"  #: asked to stop, still running when the grace ran out: TERM, then KILL
    TIMEOUT = "timeout"  #: asked to stop at its time limit, ended otherwise within the grace
    CANCELLED = "cancelled"  #: stopped by its user or an admin
    LOST = "lost"  #: its node went silent, or the node fenced it: requeued
    #: a job sharing its GPU (``--share``) used more GPU memory than it declared, was asked to stop and ended
    #: otherwise than by saving (a checkpoint exit is ``checkpointed``): requeued to run with what it used
    OVER_MEMORY = "over_memory"


class StopReason(str, Enum):
    """Why labq asked a running attempt to stop."""

    PREEMPTED = "preempted"
    TIMEOUT = "timeout"
    CANCELLED = "cancel"
    LOST = "lost"
    OVER_MEMORY = "over_memory"  #: it shares its GPU and used more memory than it declared (``--share --gpu-mem``)


@dataclass(frozen=True)
class Attempt:
    """One finished run of a job, for its history."""

    number: int
    placement: Placement | None
    started_at: float | None
    ended_at: float
    ended: AttemptEnd
    exit_code: int | None = None
    stop_reason: StopReason | None = None
    preempted_for: int | None = None
    last_checkpoint_at: float | None = None
    work_lost_s: float = 0.0  #: for an attempt that was requeued: seconds since its last checkpoint
    drained_for: str | None = None  #: the reservation whose GPUs it freed


class SignalSource(str, Enum):
    """Where a job's checkpoint signal was declared, when not at submit (``--checkpoint-signal``)."""

    IMAGE = "image"  #: its container image's label ``labq.checkpoint-signal``
    JOB = "job"  #: the job itself, with ``labq checkpoint --signal`` (the marker's content)

    @property
    def words(self) -> str:
        """Who declared it, for ``labq show`` and the leader's log."""
        if self is SignalSource.IMAGE:
            return "its image's label labq.checkpoint-signal says"
        return "the job said with labq checkpoint --signal"


def catchable_signal(text: str) -> str | None:
    """``SIGUSR1`` for ``usr1``, ``SIGUSR1`` or `` sigusr1\n``; None for what no job can catch (KILL, STOP) or no signal."""
    import signal

    name = text.strip().upper()
    name = name if name.startswith("SIG") else "SIG" + name
    if name not in signal.Signals.__members__ or name in ("SIGKILL", "SIGSTOP"):
        return None
    return name


@dataclass(frozen=True)
class Mount:
    source: str  #: host path, under one of the admin's allowed roots
    target: str  #: path inside the container
    read_only: bool = False


def _declared(cls: type) -> type:
    """``cls`` as a frozen dataclass whose fields are ``labq.models.spec.FIELDS``: their names, types and
    defaults, in that order."""
    cls.__annotations__ = {f.name: f.type for f in FIELDS}
    for f in FIELDS:
        if not f.required:
            setattr(cls, f.name, f.default)
    return dataclass(frozen=True)(cls)


@_declared
class JobSpec:
    """Everything a submission says, with the fields that ``labq.models.spec.FIELDS`` declares (``user``,
    ``command``, ``gpus``...). It never changes after submit, but for one thing: a job whose reservation is
    over leaves it (``reservation`` becomes None, and the job's ``note`` says so)."""

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError("a job needs at least one GPU")
        if self.nodes < 1:
            raise ValueError("nodes must be 1 or more")
        if self.gpus % self.nodes:
            raise ValueError(f"{self.gpus} GPUs cannot be split evenly over {self.nodes} nodes")
        if self.runtime is Runtime.DOCKER and not self.image:
            raise ValueError("a docker job needs an image")
        if self.share_mib is not None:
            if self.share_mib <= 0:
                raise ValueError("a job that shares a GPU declares the memory it uses (--gpu-mem 10G)")
            if self.gpus != 1:
                raise ValueError("a job that shares a GPU (--share) runs on one GPU: use --gpus 1")

    @property
    def task_ref(self) -> str | None:
        """``12.3`` for task 3 of array 12; None for a job of its own."""
        return None if self.array_id is None else f"{self.array_id}.{self.array_index}"

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    @cached_property
    def resource_shape(self) -> str:
        """What the job asks of the hardware and for how long: jobs of one shape place alike.

        A string because the scheduler looks it up once per queued job per pass,
        and a string's hash, unlike a tuple's, is computed only once.
        """
        return repr((self.gpus, self.nodes, self.min_gpu_memory_mib, self.gpu_model, self.node, self.reservation,
                     self.time_limit_s, self.preemptible, self.grace_s, self.share_mib))


@dataclass(frozen=True)
class Job:
    """A job as the leader tracks it: the spec plus its life so far."""

    id: int
    spec: JobSpec
    submitted_at: float
    state: JobState = JobState.QUEUED
    attempt: int = 1
    placement: Placement | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    last_checkpoint_at: float | None = None
    preemptions: int = 0
    work_lost_s: float = 0.0
    #: while PREEMPTING: the job whose room it is making
    preempted_for: int | None = None
    #: while PREEMPTING: the reservation whose GPUs it frees before its start
    drained_for: str | None = None
    #: why the agent was told to stop it while it still runs: "cancel", "timeout"
    stop_requested: str | None = None
    #: the attempts before this one, oldest first
    history: tuple[Attempt, ...] = ()
    #: what the lab did to it besides running it, for its user (``released from reservation 'paper' ...``)
    note: str = ""
    #: who cancelled it, when its owner did not: an admin's name, or ``CANCELLED_BY_LAB`` (its owner hears of it)
    cancelled_by: str | None = None
    #: the checkpoint signal its image or the job itself declared, when its spec declared none
    learned_signal: str | None = None
    learned_from: SignalSource | None = None
    #: what its GPUs did while it held them, as their agents measured (NVML): GPU-seconds measured, and over
    #: them the busy GPU-seconds (utilisation x time) and the memory used (MiB x GPU-seconds). Taken in when an
    #: attempt leaves its GPUs; ``labq usage`` shows "allocated but idle" from it
    measured_gpu_s: float = 0.0
    busy_gpu_s: float = 0.0
    memory_mib_gpu_s: float = 0.0
    #: a job that shares its GPU (``spec.share_mib``): the most GPU memory one of its attempts was seen using,
    #: when that was more than it declared; it is placed by this from then on (``labq.models.sharing.need_mib``)
    gpu_mem_peak_mib: int | None = None

    @property
    def user(self) -> str:
        return self.spec.user

    @property
    def priority(self) -> int:
        return self.spec.priority

    @property
    def checkpoint_signal(self) -> str | None:
        """The signal it checkpoints on: declared at submit, else by its image or itself; None: not declared."""
        return self.spec.checkpoint_signal or self.learned_signal

    @property
    def stop_signal(self) -> str:
        """What asks it to stop (a preemption, a time limit): its checkpoint signal, else TERM."""
        return self.checkpoint_signal or "SIGTERM"

    def expected_end(self) -> float | None:
        """When the time limit will stop it, if it is running and has one."""
        if self.started_at is None or self.spec.time_limit_s is None:
            return None
        return self.started_at + self.spec.time_limit_s

    def work_at_risk(self, now: float) -> float:
        """Seconds of work a preemption now would lose: since its last checkpoint or start."""
        since = self.last_checkpoint_at or self.started_at
        return max(0.0, now - since) if since is not None else 0.0

    def preemptions_since(self, since: float) -> int:
        """Attempts ended by a preemption after ``since`` (for the admin's cap per day)."""
        return sum(1 for a in self.history if a.stop_reason is StopReason.PREEMPTED and a.ended_at > since)

    def latest_run(self) -> int | None:
        """The latest attempt that ran, so has a log: this one once placed, else the last before it; None if none."""
        if self.placement is not None:
            return self.attempt
        return next((a.number for a in reversed(self.history) if a.placement is not None), None)

    def evolve(self, **changes) -> Job:
        return replace(self, **changes)
