"""``labq usage``: the lab's accounting over a window, from the finished jobs and the jobs on GPUs now.

Finished jobs never change, and a report of years needs hundreds of thousands of them: reading and decoding the
archive for every report would take seconds a year of history. So the first report reads the archive once (each
closed month from its digest, ``labq.leader.digests``, when it has a fresh one), into
what a report needs of each job (``labq.models.usage.JobUse``, about half a kilobyte a job), and from then on
each job that finishes is added as ``LabState.apply`` commits it (``LabState.watchers``); a later report reads no file.
The jobs that finish while the archive is being read are kept aside and added after it, so a job is never lost
between the two; a job read twice is one entry, by id.
"""

from __future__ import annotations

import logging
import threading

from labq.leader.auth import Principal
from labq.leader.bookings import Bookings
from labq.leader.digests import Digests
from labq.leader.state import LabState
from labq.leader.users import user_only
from labq.models.job import Job
from labq.models.usage import JobUse, UsageReport, job_use, node_gpu_models, report
from labq.protocol import errors
from labq.protocol.usage import DEFAULT_WINDOW_S, UsageQuery
from labq.store import collector_paused

log = logging.getLogger("labq.leader")


class Accounting:
    def __init__(self, state: LabState, bookings: Bookings) -> None:
        self.state, self.bookings = state, bookings
        self._finished: dict[int, JobUse] | None = None  #: by job id, once the archive was read
        self._while_reading: list[Job] | None = None  #: the jobs that finished while it was read
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
        with state.view:  # a job leaves ``jobs`` and enters ``_finished`` under it: each is in one of the two
            now = state.clock()
            live = [state.with_measure(job) for job in state.jobs.values() if user is None or job.spec.user == user]
            finished = list(self._finished.values())
            gpus = node_gpu_models(state.nodes())
            booked = [b for b in self.bookings.bookings() if user is None or b.owner == user]
        until = now if query.until is None else min(query.until, now)
        since = until - DEFAULT_WINDOW_S if query.since is None else query.since
        if not since < until:
            raise errors.bad_request("the window is empty: since must be before until, and before now", "since")
        if user is not None:
            finished = [use for use in finished if use.user == user]
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
        if self._finished is not None:
            self._finished[job.id] = job_use(job, job.ended_at or self.state.clock())
        elif self._while_reading is not None:
            self._while_reading.append(job)

    def warm_up(self) -> threading.Thread:
        """Read the archive in the background now (the leader just started), so the first report is as quick as
        the later ones. A read that fails is logged; the first report then reads it itself, and says why not."""

        def read() -> None:
            try:
                self._read_archive()
            except Exception:  # noqa: BLE001 - only a head start: the first report tries again and answers
                log.exception("reading the archive for labq usage failed; the first report will read it")

        thread = threading.Thread(target=read, name="labq-usage-warm-up", daemon=True)
        thread.start()
        return thread

    def _read_archive(self) -> None:
        """Read the archive into ``_finished``, the first time (outside the lab's lock: it takes a while)."""
        if self._finished is not None:
            return
        state = self.state
        with self._reading:
            if self._finished is not None:
                return
            with state.view:
                self._while_reading = []
            try:
                now = state.clock()
                found: dict[int, JobUse | None] = {}
                with collector_paused():  # it makes many objects and frees none
                    for part in state.store.history_parts():  # merged in order: the last version of a job wins
                        found.update(self.digests.uses(part, now))
                found = {job_id: use for job_id, use in found.items() if use is not None}
            except BaseException:
                with state.view:
                    self._while_reading = None
                raise
            with state.view:
                for job in self._while_reading:
                    found[job.id] = job_use(job, job.ended_at or now)
                self._finished, self._while_reading = found, None
