"""What keeps a job waiting before the pass looks at any GPU for it.

Its array's ``%N`` cap, a dependency that has not ended as asked, a reservation that is
not open to it, its user's GPU quota, or a lab it can never run in (no node that is up
fits it, or those that would cannot start its user's jobs). A job none of these stops,
with no reservation, preemption in flight or quota of its own, is ``plain``: its verdict
is that of any other job of its shape and priority.
"""

from __future__ import annotations

from labq.models.decisions import PendingReason
from labq.models.job import Job, JobState
from labq.scheduler.fit import why_kept_off, why_never_fits
from labq.scheduler.guarantees import Guarantees
from labq.scheduler.verdicts import span


class Gates(Guarantees):
    """The checks a job passes before placement; each that stops it records why it waits."""

    def _capped(self, array_id: int, cap: int) -> tuple:
        """Why a task of an array at its cap waits: the rest of a ``Pending``, one for all its tasks."""
        why = self.memo.lasting.get(("capped", array_id))
        if why is None:
            why = self.memo.lasting[("capped", array_id)] = (
                PendingReason.ARRAY_LIMIT, f"{cap} of array {array_id}'s tasks are on GPUs, as many as its %{cap} "
                "allows", None, None)
        return why

    def _dependencies_met(self, job: Job) -> bool:
        """``--after``: each job in depends_on has succeeded; ``--after-any``: each has ended, however."""
        any_end = job.spec.after_any
        for dep in job.spec.depends_on:
            state = self.states.get(dep)
            if state is JobState.SUCCEEDED or (any_end and state is not None and state.finished):
                continue
            if state is None:
                detail = f"depends on job {dep}, which does not exist; it can never start"
            elif state.finished:
                detail = f"depends on job {dep}, which ended {state.value}; it can never start"
            else:
                detail = f"waits for job {dep} ({state.value}) to {'end' if any_end else 'succeed'}"
            self._wait(job, PendingReason.DEPENDENCY, detail, dep)
            return False
        return True

    def _reservation_open(self, job: Job) -> bool:
        name = job.spec.reservation
        r = self.reservations.get(name)
        if r is None:
            detail = f"reservation {name!r} does not exist"
        elif not r.admits(job.user):
            detail = f"{job.user} may not use reservation {name!r} (booked by {r.owner})"
        elif self.now >= r.end:
            detail = f"reservation {name!r} has ended"
        elif r.node is None or not r.gpu_indices:
            detail = f"reservation {name!r} has no GPUs pinned yet"
        elif self.now < r.start:
            self._wait(job, PendingReason.RESERVATION, f"reservation {name!r} starts in {span(r.start - self.now)}",
                       estimated_start=r.start)
            return False
        else:
            return True
        self._wait(job, PendingReason.RESERVATION, detail)
        return False

    def _within_quota(self, job: Job) -> bool:
        quota = self.policy.quota_for(job.user)
        used = self.in_use.get(job.user, 0)
        if quota is None or used + job.spec.gpus <= quota:
            return True
        self._wait(job, PendingReason.QUOTA,
                   f"{job.user} holds {used} of a quota of {quota} GPUs; this job needs {job.spec.gpus}")
        return False

    def _never_runs(self, job: Job, barred: frozenset[str]) -> tuple[PendingReason, str] | None:
        """Why ``job`` can never start on the nodes that are up, if so: it fits none of them, or it would
        fit only nodes that cannot start its user's jobs (``barred``)."""
        spec = job.spec
        nodes = self._candidate_nodes(job)
        why = why_never_fits(spec, nodes)
        if barred and (why is not None or not nodes):
            everywhere = self._candidate_nodes(job, barred=False)
            kept_off = [n for n in everywhere if n.name in barred]
            if kept_off and why_never_fits(spec, everywhere) is None:
                return why_kept_off(spec.user, spec.runtime.value, spec.image, kept_off)
        return None if why is None else (PendingReason.RESOURCES, f"no node that is up can run it: {why}")

    def _plain(self, job: Job) -> bool:
        """Nothing personal decides this job's fate: no reservation, no preemption in flight, no quota."""
        if job.spec.reservation is not None or job.id in self.inflight:
            return False
        if self.book is not None and (job.history or self._overdue(job)):
            return False  # a job preempted lately borrows later; an overdue one preempts more
        if self._quotas:
            quota = self.policy.quota_for(job.user)
            return quota is None or self.in_use.get(job.user, 0) + job.spec.gpus <= quota
        return True
