"""GPUs booked for a window of time, for a user or a group."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reservation:
    name: str
    owner: str
    gpus: int
    start: float
    end: float  #: exclusive: [start, end)
    users: frozenset[str] = frozenset()  #: who may run in it, besides the owner
    group: str | None = None
    node: str | None = None  #: the node it is pinned to, once booked
    gpu_indices: tuple[int, ...] = ()  #: the GPUs it pins on that node
    gpu_model: str | None = None
    min_gpu_memory_mib: int = 0
    score: int = 0  #: the interconnect score of the pinned set
    created_at: float = 0.0
    #: what happened to it since booking, for its owner (``re-pinned from ws1 (lost) to ws3``)
    note: str = ""
    #: when it was cancelled; a cancelled booking stays listed a while, like an ended one, and pins nothing
    cancelled_at: float | None = None
    #: the moments of it (``started``, ``ended``) the leader has told its owner of, or decided not to
    #: (``labq.models.notify.reservation_moments``)
    told: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValueError(f"reservation {self.name}: end must be after start")

    def admits(self, user: str) -> bool:
        return user == self.owner or user in self.users

    def active(self, now: float) -> bool:
        return self.start <= now < self.end and self.cancelled_at is None

    def live(self, now: float) -> bool:
        """Still to be honoured: not cancelled and not yet ended."""
        return self.cancelled_at is None and now < self.end

    def state(self, now: float) -> str:
        """``upcoming``, ``active``, ``ended`` or ``cancelled``: what the lab's lists show."""
        if self.cancelled_at is not None:
            return "cancelled"
        return "upcoming" if now < self.start else ("active" if now < self.end else "ended")

    def over_at(self) -> float:
        """When it stopped being honoured: its cancellation or its end."""
        return self.end if self.cancelled_at is None else min(self.end, self.cancelled_at)

    def overlaps(self, start: float, end: float) -> bool:
        """Whether [start, end) meets this reservation's [start, end): windows that only touch do not."""
        return self.start < end and start < self.end

    @property
    def gpu_hours(self) -> float:
        return self.gpus * (self.end - self.start) / 3600.0


# -- the answer to a booking --------------------------------------------------------


@dataclass(frozen=True)
class Displaced:
    """A running job on the pinned GPUs that will be asked to checkpoint before the start.

    What it costs is defined once, in ``labq.scheduler.booking``: the job leaves whole, so all of
    its GPUs times the work it risks at ``signal_at`` (since its last checkpoint or start) plus its grace.
    """

    job_id: int
    user: str
    signal_at: float
    gpus: int = 0  #: all of the job's GPUs, on every node: a displaced job leaves whole
    gpu_seconds_lost: int = 0  #: the expected cost, in whole GPU-seconds


@dataclass(frozen=True)
class Alternative:
    start: float
    end: float
    gpus: int
    node: str
    gpu_indices: tuple[int, ...]
    score: int


@dataclass(frozen=True)
class BookingAnswer:
    accepted: bool
    reservation: Reservation | None = None  #: pinned, when accepted
    displaced: tuple[Displaced, ...] = ()  #: every job the pinned GPUs take from, by job id
    reasons: tuple[str, ...] = ()
    alternatives: tuple[Alternative, ...] = ()

    @property
    def gpu_seconds_lost(self) -> int:
        """What the displaced jobs are expected to lose, in all."""
        return sum(d.gpu_seconds_lost for d in self.displaced)


# -- the answer to a booking by need ----------------------------------------------------


@dataclass(frozen=True)
class Window:
    start: float
    end: float


@dataclass(frozen=True)
class DeadlineWindows:
    """The two ends of what fits before a deadline; both None when nothing does."""

    earliest: Window | None
    latest: Window | None
