"""Who is told of what: the moments that notify people, and what a notice says. Pure.

A job's owner asks to hear of some moments of its life: per job (``labq submit --notify end,fail``) or by
default for all their jobs (``labq notify --on end,fail``); a reservation's owner may hear of its start and
end. ``job_notices`` looks at one change of a job (its version before and after) and returns the notices it
causes. The leader writes each notice into its outbox in the same commit as the change itself
(``labq.leader.notify``), so a notice is never lost to a crash, and never sent for a change that did not happen.

A notice's ``key`` names the moment it tells of (job 12's end, attempt 3's start): the same moment never
makes two notices, whichever path took the change in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from labq.models.job import CANCELLED_BY_LAB, FAILED_NOTE, Job, JobState, StopReason
from labq.models.reservation import Reservation


class NotifyEvent(str, Enum):
    START = "start"  #: an attempt of the job started running
    END = "end"  #: the job succeeded
    #: the job failed, or was stopped at its time limit; or its node was lost (and the job requeued); or it was
    #: cancelled by someone else than its owner (an admin, or the lab: a dependency that failed, a reservation over)
    FAIL = "fail"
    #: an attempt was stopped and the job requeued: preempted, its node lost, or requeued at its time limit
    PREEMPT = "preempt"
    RESERVATION = "reservation"  #: a reservation of theirs started or ended (a person's default only)


#: what ``labq submit --notify`` may ask for; a reservation is no job's
JOB_EVENTS = (NotifyEvent.START, NotifyEvent.END, NotifyEvent.FAIL, NotifyEvent.PREEMPT)


@dataclass(frozen=True)
class NotifySettings:
    """A person's own choices (``labq notify``): what notifies them when a job does not say, and where."""

    #: the moments that notify them for a job submitted without ``--notify``, and of their reservations
    on: frozenset[NotifyEvent] = frozenset()
    #: where the lab's e-mail channel writes to them; None: no e-mail
    email: str | None = None
    #: whether their notices go to the lab's webhook (its chat channel) as well
    webhook: bool = True

    def wanted_for(self, job: Job) -> frozenset[NotifyEvent]:
        """The moments of ``job`` that notify its owner: what it was submitted with, else their defaults."""
        if job.spec.notify is not None:
            return frozenset(job.spec.notify)
        return self.on


@dataclass(frozen=True)
class Notice:
    """One thing to tell one person, with the facts a channel needs to say it (``headline``) and a program to
    read it (the webhook's structured fields)."""

    key: str  #: the moment it tells of (``job-12.end``): unique, so a change taken in twice notifies once
    user: str  #: whom it is for: the job's or the reservation's owner
    event: NotifyEvent
    at: float  #: when it happened (the lab's clock)
    state: str  #: the job's state then (``succeeded``), ``requeued``, or the reservation's (``started``)
    job_id: int | None = None
    job_name: str = ""  #: as its owner typed it: user text, escaped by whoever shows it
    attempt: int | None = None
    exit_code: int | None = None
    node: str | None = None  #: where the attempt ran
    reason: str = ""  #: why it was requeued or stopped, in the lab's words
    reservation: str | None = None
    gpus: int | None = None
    tasks: int | None = None  #: a notice of a whole array (``job_id`` its id): how many tasks it had

    def headline(self, quote: Callable[[str], str] = str) -> str:
        """The one-line message: ``job 12 (train) succeeded on ws1``. ``quote`` shows user text (the job's name,
        the reservation's) as the channel needs: escaped for a terminal, in a code span for a chat."""
        if self.reservation is not None:
            where = f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}" + (f" on {self.node}" if self.node else "")
            return f"{self.user}: reservation {quote(self.reservation)} ({where}) has {self.state}"
        name = f" ({quote(self.job_name)})" if self.job_name else ""
        if self.tasks is not None:
            return f"{self.user}: array {self.job_id}{name} ended: {self.reason}"
        what = {NotifyEvent.START: f"started running (attempt {self.attempt})", NotifyEvent.END: "succeeded",
                NotifyEvent.FAIL: self._failed(), NotifyEvent.PREEMPT: "was requeued"}[self.event]
        where = f" on {self.node}" if self.node else ""
        why = f": {self.reason}" if self.reason else ""
        return f"{self.user}: job {self.job_id}{name} {what}{where}{why}"

    def subject(self, quote: Callable[[str], str] = str) -> str:
        """A short title (an e-mail's subject): ``labq: job 12 (train) succeeded``."""
        if self.reservation is not None:
            return f"labq: reservation {quote(self.reservation)} has {self.state}"
        name = f" ({quote(self.job_name)})" if self.job_name else ""
        if self.tasks is not None:
            return f"labq: array {self.job_id}{name} ended" + (" with failures" if self.event is NotifyEvent.FAIL else "")
        what = {NotifyEvent.START: "started", NotifyEvent.END: "succeeded",
                NotifyEvent.FAIL: {"timeout": "timed out", "cancelled": "was cancelled"}.get(self.state, "failed"),
                NotifyEvent.PREEMPT: "was requeued"}[self.event]
        return f"labq: job {self.job_id}{name} {what}"

    def _failed(self) -> str:
        if self.state == "timeout":
            return "timed out (stopped at its time limit)"
        if self.state == "cancelled":
            return "was cancelled"
        return "failed" if self.exit_code is None else f"failed (exit {self.exit_code})"


def job_notices(old: Job | None, new: Job, wanted: Iterable[NotifyEvent]) -> list[Notice]:
    """The notices a change of a job from ``old`` (None: it was not known) to ``new`` causes, of the moments
    ``wanted`` by its owner."""
    wanted = frozenset(wanted)
    if not wanted:
        return []
    found = []
    if old is not None and new.attempt > old.attempt and new.history and not new.state.finished:
        lost = new.history[-1].stop_reason is StopReason.LOST  # a failure of the lab's: ``fail`` hears of it too
        if NotifyEvent.PREEMPT in wanted or (lost and NotifyEvent.FAIL in wanted):
            found.append(_requeued(new))
    if (NotifyEvent.START in wanted and new.state is JobState.RUNNING
            and (old is None or old.state is not JobState.RUNNING or old.attempt != new.attempt)):
        found.append(_of_job(new, NotifyEvent.START, f"job-{new.id}.{new.attempt}.start", new.started_at))
    if new.state.finished and (old is None or not old.state.finished):
        event = {JobState.SUCCEEDED: NotifyEvent.END, JobState.FAILED: NotifyEvent.FAIL,
                 JobState.TIMEOUT: NotifyEvent.FAIL}.get(new.state)
        if new.state is JobState.CANCELLED and new.cancelled_by is not None:  # not by its owner, who knows
            event = NotifyEvent.FAIL
        if event in wanted:
            found.append(_of_job(new, event, f"job-{new.id}.{event.value}", new.ended_at,
                                 _cancel_reason(new) or _end_reason(new)))
    return found


def array_notice(last: Job, ends: Mapping[str, int], wanted: Iterable[NotifyEvent]) -> Notice | None:
    """The one notice of an array whose ``last`` task just ended, its tasks' ends counted in ``ends`` (state ->
    how many): ``end`` when every one succeeded, else ``fail``; None when its owner wants neither. An array's tasks
    notify as one: a sweep of 10,000 tasks is one message, not 10,000."""
    event = NotifyEvent.END if set(ends) == {JobState.SUCCEEDED.value} else NotifyEvent.FAIL
    if event not in frozenset(wanted):
        return None
    told = ", ".join(f"{n:,} {state}" for state, n in sorted(ends.items(), key=lambda e: -e[1]))
    return Notice(f"array-{last.spec.array_id}.end", last.user, event, last.ended_at or last.submitted_at,
                  "succeeded" if event is NotifyEvent.END else "failed", last.spec.array_id, last.spec.name,
                  reason=told, tasks=last.spec.array_tasks)


def _of_job(job: Job, event: NotifyEvent, key: str, at: float | None, reason: str = "") -> Notice:
    last = job.history[-1] if job.history else None
    placement = job.placement or (last.placement if last is not None else None)
    return Notice(key, job.user, event, at if at is not None else job.submitted_at, job.state.value, job.id,
                  job.spec.name, job.attempt, job.exit_code, placement.nodes[0] if placement else None, reason)


def _cancel_reason(job: Job) -> str:
    """Why a job its owner did not cancel was cancelled: by whom, or the lab's reason (in its note)."""
    if job.state is not JobState.CANCELLED or job.cancelled_by is None:
        return ""
    if job.cancelled_by != CANCELLED_BY_LAB:
        return f"by {job.cancelled_by}"
    said = job.note.rfind("cancelled: ")  # ``labq.models.transitions``: the lab's cancels say why so
    return job.note[said + len("cancelled: "):] if said >= 0 else "by the lab"


def _end_reason(job: Job) -> str:
    """What its node said of why a failed job's last attempt ended (``transitions.exited``'s ``why``), if it did."""
    if job.state is not JobState.FAILED:
        return ""
    said = job.note.rfind(FAILED_NOTE)
    return job.note[said + len(FAILED_NOTE):] if said >= 0 else ""


def _requeued(job: Job) -> Notice:
    """The attempt that just ended, and why the job is back in the queue."""
    last = job.history[-1]
    if last.stop_reason is StopReason.PREEMPTED:
        reason = "preempted" + (f" for job {last.preempted_for}" if last.preempted_for is not None else "") \
            + (f" for reservation {last.drained_for}" if last.drained_for else "")
    elif last.stop_reason is StopReason.LOST:
        said = job.note.rfind("could not start on ")  # ``labq.leader.agents``: the node's own reason
        reason = job.note[said:].removesuffix("; requeued") if said >= 0 and last.started_at is None \
            else "its node was lost"
    elif last.stop_reason is StopReason.TIMEOUT:
        reason = "it reached its time limit (--requeue-on-timeout)"
    else:
        reason = f"its attempt ended {last.ended.value}"
    if last.work_lost_s >= 1:
        reason += f"; {_minutes(last.work_lost_s)} of work since its last checkpoint lost"
    node = last.placement.nodes[0] if last.placement is not None else None
    return Notice(f"job-{job.id}.{last.number}.requeue", job.user, NotifyEvent.PREEMPT, last.ended_at, "requeued",
                  job.id, job.spec.name, last.number, last.exit_code, node, reason)


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def reservation_notice(r: Reservation, moment: str, at: float) -> Notice:
    """``moment`` is ``started`` or ``ended``: its owner's notice of it."""
    return Notice(f"reservation-{r.name}.{r.start:.0f}.{moment}", r.owner, NotifyEvent.RESERVATION, at, moment,
                  node=r.node, reservation=r.name, gpus=r.gpus)


def reservation_moments(r: Reservation, now: float) -> tuple[str, ...]:
    """The moments of ``r`` that have come by ``now`` and that its owner has not been told of yet (``told``):
    its start while it runs, its end once it is over (a cancelled one ends without telling)."""
    due = []
    if "started" not in r.told and r.active(now):
        due.append("started")
    if "ended" not in r.told and r.cancelled_at is None and now >= r.end:
        due.append("ended")
    return tuple(due)


@dataclass(frozen=True)
class RetryPolicy:
    """How the leader retries a delivery that failed: after ``first_s``, doubling up to ``cap_s``, until the
    notice is ``give_up_s`` old."""

    first_s: float = 5.0
    cap_s: float = 600.0
    give_up_s: float = 86400.0

    def delay(self, tries: int) -> float:
        """The wait after the ``tries``-th failed try (1 for the first)."""
        return min(self.cap_s, self.first_s * 2.0 ** max(0, min(tries - 1, 60)))

    def gives_up(self, created_at: float, now: float) -> bool:
        return now - created_at >= self.give_up_s
