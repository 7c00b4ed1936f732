"""What a lab's queues let a job do in a pass: start within its queue's cap and guarantee, borrow beyond it.

In a lab with queues (teams), each queue is guaranteed some GPUs and may be capped.
A job that would take its queue beyond its guarantee borrows idle GPUs, and only as a
loan its queue may take (``QueueBook.may_borrow``); no job takes the idle guarantee of
another queue that wants it or does not lend it. A job within its guarantee reclaims
what other queues borrowed, and one that waited past its queue's maximum wait preempts
more. The accounts themselves (what each queue holds, its surplus, its loans) are the
``QueueBook``'s (``labq.scheduler.queues``); this part asks them the pass's questions.
"""

from __future__ import annotations

from labq.models.decisions import PendingReason
from labq.models.job import Job
from labq.scheduler.policy import served_priority, waiting_since
from labq.scheduler.verdicts import Verdicts

#: what a job within its queue's guarantee waits for when it waits for GPUs: its queue's idle guarantee is not lent
_WANTING = frozenset({PendingReason.RESOURCES, PendingReason.PRIORITY, PendingReason.PREEMPTING,
                      PendingReason.BORROWED})


class Guarantees(Verdicts):
    """The rules of a lab's queues, as the pass asks them of ``QueueBook`` (``self.book``; None without queues)."""

    def _free_total(self) -> int:
        current = self.memo.current
        total = current.get("free total")
        if total is None:
            total = current["free total"] = sum(self.free[n.name].bit_count() for n in self.up)
        return total

    def _would_borrow(self, job: Job) -> bool:
        """Starting now would take its queue beyond its guarantee: it borrows idle GPUs, and holds none (GPUs kept
        idle for a loan would be idle GPUs no one may use)."""
        book = self.book
        if book is None:
            return False
        q = book.queue_of(job)
        return (book.before(job) + job.spec.gpus > book.guarantee[q]
                and book.guarantee[q] < self.lab_gpus)

    def _loan_problem(self, job: Job) -> str | None:
        """Why ``job`` may not go beyond its queue's guarantee, when starting would take it there, in a lab where
        there is anything to borrow (a queue guaranteed the whole lab borrows nothing)."""
        book, p = self.book, self.policy
        q = book.queue_of(job)
        if book.before(job) + job.spec.gpus <= book.guarantee[q] or book.guarantee[q] >= self.lab_gpus:
            return None
        return book.loan_problem(job, self.now, p.min_runtime_s, p.reclaim_grace_s, p.preemption)

    def _queue_allows(self, job: Job, free_used: int, own_freed: int) -> bool:
        """Whether its queue lets ``job`` start taking ``free_used`` free GPUs, its own queue's jobs giving back
        ``own_freed``: within its cap, beyond its guarantee only as a loan it may take, and no free GPU that is
        another queue's idle guarantee which that queue wants or does not lend."""
        book, spec = self.book, job.spec
        q = book.queue_of(job)
        net = book.before(job) - own_freed + spec.gpus
        queue = book.specs.get(q)
        if queue is not None and queue.cap is not None and net > queue.cap:
            return False
        if net > book.guarantee[q] and not book.may_borrow(job, self.now, self.policy.min_runtime_s,
                                                          self.policy.reclaim_grace_s, self.policy.preemption):
            return False
        return free_used <= max(0, self._free_total() - book.kept_from(q))

    def _may_make_room(self, job: Job) -> bool:
        """Whether preemption might make room for ``job`` within its queue's rules (its own queue's lower jobs,
        or, once it waited past its queue's maximum wait, what stands in its way)."""
        return self.policy.preemption and (job.priority > self.lowest_victim or self._overdue(job))

    def _overdue(self, job: Job) -> bool:
        book = self.book
        return book is not None and book.waits_bounded and book.overdue(job, self.now - waiting_since(job))

    def _queue_mode(self, job: Job) -> tuple:
        """What a job's preemption plan depends on in a lab with queues: its queue, whether it reclaims (it stays
        within its guarantee), its priority if overdue, and what each queue may give up (its surplus over its
        guarantee, as far as it can matter: no more than its jobs hold on one node)."""
        book = self.book
        q = book.queue_of(job)
        key = book.surplus_key()
        # it reclaims if it stays within its guarantee and another queue holds GPUs beyond its own
        reclaims = book.before(job) + job.spec.gpus <= book.guarantee[q] and any(key)
        # past its queue's maximum wait, it preempts preemptible jobs of its served priority too, not only lower ones
        # (any below high would pass the classes' intent, and in a busy lab each overdue start would make the
        # next overdue job of its victims)
        aging = self.policy.aging_s
        overdue = ((job.spec.priority if aging is None else served_priority(job, self.now, aging))
                   if self._overdue(job) else None)
        return (q, reclaims, overdue, key)

    def _note_wanted(self, job: Job, q: str) -> None:
        """A job within its queue's guarantee that waits for GPUs: its queue's idle guarantee is lent to no one."""
        book = self.book
        if (q and q not in book.wanted and self.pending and self.pending[-1].job_id == job.id
                and self.pending[-1].reason in _WANTING and book.before(job) + job.spec.gpus <= book.guarantee[q]):
            book.wanted.add(q)
            self.memo.settled.clear()  # verdicts of borrowers counted on those GPUs
