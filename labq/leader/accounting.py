"""``labq usage``: the lab's accounting over a window, from the finished jobs and the jobs on GPUs now.

Finished jobs never change, and a report of years needs hundreds of thousands of them: decoding the archive's job
documents for every report would take seconds a year of history, and keeping what a report needs of every one of
them (``labq.models.usage.JobUse``, a kilobyte and more a job in the leader's memory) would grow the leader with the
lab's history. So the leader keeps the months a report of the default window spans (from the month
``DEFAULT_WINDOW_S`` ago to now: two, or three), read once as it starts, and each job that finishes is added as
``LabState.apply`` commits it (``LabState.watchers``): the default report reads no file. A report that reaches
further back reads the older months it spans, each from its digest (``labq.leader.digests``, which the leader makes
of each closed month as it starts; a fifth of the time of its documents), and keeps none of them: its cost grows
with its window, and the leader's memory with the jobs of two or three months. The jobs that finish while the kept
months are being read are kept aside and added after, so a job is never lost between the two; a job read twice is
one entry, by id, and a job that a report saw running and then read finished is counted as it finished.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from labq.leader.auth import Principal
from labq.leader.bookings import Bookings
from labq.leader.digests import Digests
from labq.leader.state import LabState
from labq.leader.users import user_only
from labq.models.job import Job
from labq.models.usage import JobUse, UsageReport, job_use, node_gpu_models, report
from labq.protocol import errors
from labq.protocol.usage import DEFAULT_WINDOW_S, UsageQuery
from labq.store import collector_paused, month_at

log = logging.getLogger("labq.leader")


class Accounting:
    def __init__(self, state: LabState, bookings: Bookings) -> None:
        self.state, self.bookings = state, bookings
        #: what a report needs of the jobs of each month kept (``month_at``; None: a part of every month, which a
        #: memory store has), by job id (None: deleted in that month), once the kept months were read
        self._kept: dict[str | None, dict[int, JobUse | None]] | None = None
        self._kept_from = ""  #: the first month kept; "": every one (a store whose parts are of every month)
        self._while_reading: list[Job] | None = None  #: the jobs that finished while the kept months were read
        self._reading = threading.Lock()  #: one reading of the archive at a time
        self.digests = Digests(state.config.data_dir)  #: each closed month of the archive, as a report needs it
        state.watchers.append(self._watch)

    def usage(self, who: Principal, query: UsageQuery) -> UsageReport:
        """The report ``who`` asked for: their own jobs' use, or (admins) anyone's, or the whole lab's."""
        user_only(who)
        user = query.user
        if not who.admin and not self.state.config.usage_for_everyone:  # ([usage] everyone: no secret here)
            if user is None:
                raise errors.forbidden(f"only admins may see the whole lab's usage; yours is user={who.name} "
                                       "(`labq usage --me`)")
            if user != who.name:
                raise errors.forbidden(f"only admins may see another user's usage; yours is user={who.name} "
                                       "(`labq usage --me`)")
        self._read_archive()
        state = self.state
        with state.view:  # a job leaves ``jobs`` and enters the kept months under it: each is in one of the two
            now = state.clock()
            until = now if query.until is None else min(query.until, now)
            since = until - DEFAULT_WINDOW_S if query.since is None else query.since
            if not since < until:
                raise errors.bad_request("the window is empty: since must be before until, and before now", "since")
            self._forget_before(_keep_from(now))
            first = month_at(since, now)  # a job that ended before the window ran before it: its month is not read
            kept = [list(uses.items()) for month, uses in sorted(self._kept.items(), key=_in_order)
                    if month is None or month >= first]
            kept_from = self._kept_from
            live = [state.with_measure(job) for job in state.jobs.values() if user is None or job.spec.user == user]
            gpus = node_gpu_models(state.nodes())
            booked = [b for b in self.bookings.bookings() if user is None or b.owner == user]
        found = self._months(lambda month: first <= month < kept_from, now) if first < kept_from else {}
        for uses in kept:  # merged in order: the last version of a job wins
            found.update(uses)
        finished = [use for use in found.values() if use is not None and (user is None or use.user == user)]
        live = [job for job in live if job.id not in found]  # it finished since the view was let go: counted so
        groups: dict[str, list[str]] = {}
        for group, members in sorted(state.config.groups.items()):
            for member in members:
                groups.setdefault(member, []).append(group)
        return report([job_use(job, now) for job in live] + finished, since, until, gpus, now, user, booked, groups)

    def _watch(self, versions: list[tuple[Job | None, Job]]) -> None:
        """Jobs' new versions, committed (``LabState.watchers``; the lab's view is held): a finished one is kept."""
        for old, job in versions:
            if job.state.finished and (old is None or not old.state.finished):
                self._ended(job)

    def _ended(self, job: Job) -> None:
        """A job finished and is committed (the lab's view is held)."""
        if self._kept is not None:
            self._keep(job, self.state.clock())
        elif self._while_reading is not None:
            self._while_reading.append(job)

    def _keep(self, job: Job, now: float) -> None:
        """Keep what a report needs of a finished ``job`` when its month is kept (the lab's view is held)."""
        month = month_at(job.ended_at, now)
        if month not in self._kept:  # the first to end in a new month: the oldest one kept may go
            self._forget_before(_keep_from(now))
        if month >= self._kept_from:
            self._kept.setdefault(month, {})[job.id] = job_use(job, job.ended_at or now)

    def _forget_before(self, month: str) -> None:
        """Let go of the months before ``month``: the default report no longer spans them (the view is held)."""
        if self._kept_from and month > self._kept_from:
            self._kept_from = month
            for old in [m for m in self._kept if m is not None and m < month]:
                del self._kept[old]

    def _months(self, wanted: Callable[[str], bool], now: float) -> dict[int, JobUse | None]:
        """What a report needs of the jobs of the archive's months ``wanted`` picks, merged in order (each closed one
        from its digest when it has a fresh one), and of the parts of every month; outside the lab's view."""
        found: dict[int, JobUse | None] = {}
        with collector_paused():  # it makes many objects and frees none
            for part in self.state.store.history_parts():
                if part.month is None or wanted(part.month):
                    found.update(self.digests.uses(part, now))
        return found

    def warm_up(self) -> threading.Thread:
        """Read the kept months in the background now (the leader just started), so the first report is as quick as
        the later ones, and then make the digests of the older closed months that have none. A read that fails is
        logged; the first report then reads what it needs itself, and says why not."""

        def read() -> None:
            try:
                self._read_archive()
            except Exception:  # noqa: BLE001 - only a head start: the first report tries again and answers
                log.exception("reading the archive for labq usage failed; the first report will read it")

            try:  # the older months' digests, so that a report reaching back reads no job document
                self._months(lambda month: month < self._kept_from, self.state.clock())
            except Exception:  # noqa: BLE001 - only a head start: a report that needs a month reads it
                log.exception("making the usage digests of the archive's older months failed")

        thread = threading.Thread(target=read, name="labq-usage-warm-up", daemon=True)
        thread.start()
        return thread

    def _read_archive(self) -> None:
        """Read the kept months (``_keep_from``) the first time (outside the lab's view: it takes a while)."""
        if self._kept is not None:
            return
        state = self.state
        with self._reading:
            if self._kept is not None:
                return
            with state.view:
                self._while_reading = []
            try:
                now = state.clock()
                kept_from = _keep_from(now)
                kept: dict[str | None, dict[int, JobUse | None]] = {}
                every_month = False
                with collector_paused():  # it makes many objects and frees none
                    for part in state.store.history_parts():
                        every_month |= part.month is None
                        if part.month is None or part.month >= kept_from:
                            kept.setdefault(part.month, {}).update(self.digests.uses(part, now))
            except BaseException:
                with state.view:
                    self._while_reading = None
                raise
            with state.view:
                self._kept, self._kept_from = kept, "" if every_month else kept_from
                for job in self._while_reading:
                    self._keep(job, now)
                self._while_reading = None


def _keep_from(now: float) -> str:
    """The first month kept at ``now``: the one a report of the default window starts in."""
    return month_at(now - DEFAULT_WINDOW_S, now)


def _in_order(item: tuple[str | None, object]) -> str:
    """Parts of every month first (a memory store's one part), then the months in order."""
    return item[0] or ""
