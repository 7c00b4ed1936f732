"""Dependencies: ``--after`` (each job must succeed) and ``--after-any`` (each must end, however), and the jobs
whose dependencies can never be met, cancelled with the reason (Slurm's DependencyNeverSatisfied, ended)."""

from __future__ import annotations

import pytest

from labq.models import JobState
from labq.models.decisions import PendingReason
from labq.models.transitions import out_of_dependencies
from labq.scheduler import schedule
from tests.conftest import NOW, make_node


@pytest.mark.parametrize(("after_any", "ended", "starts"), [
    (False, JobState.SUCCEEDED, True), (False, JobState.FAILED, False), (False, JobState.CANCELLED, False),
    (True, JobState.SUCCEEDED, True), (True, JobState.FAILED, True), (True, JobState.TIMEOUT, True),
    (True, JobState.CANCELLED, True),
])
def test_after_any_starts_once_its_jobs_end_however_they_end(jobs, after_any, ended, starts):
    job = jobs.queued(1, depends_on=(900,), after_any=after_any)
    d = schedule([job], [make_node("a", "sim:dgx1")], now=NOW, finished={900: ended})
    assert (d.started(job.id) is not None) is starts


def test_after_any_waits_for_a_job_still_running_and_says_it_waits_for_its_end(jobs):
    first = jobs.queued(1, state=JobState.RUNNING)
    job = jobs.queued(1, depends_on=(first.id,), after_any=True)
    d = schedule([first, job], [make_node("a", "sim:dgx1")], now=NOW)
    pending = d.pending_for(job.id)
    assert pending.reason is PendingReason.DEPENDENCY
    assert pending.detail == f"waits for job {first.id} (running) to end"


def test_a_job_whose_dependency_failed_is_cancelled_with_the_reason_and_so_is_a_chain_on_it(jobs):
    running = jobs.queued(1, state=JobState.RUNNING)
    after_failed = jobs.queued(1, depends_on=(running.id, 901))
    chained = jobs.queued(1, depends_on=(after_failed.id,), state=JobState.HELD)
    after_any = jobs.queued(1, depends_on=(901,), after_any=True)
    after_missing = jobs.queued(1, depends_on=(999,), after_any=True)
    waits = jobs.queued(1, depends_on=(running.id,))
    done = out_of_dependencies([running, after_failed, chained, after_any, after_missing, waits],
                               {901: JobState.FAILED}, NOW)
    by_id = {j.id: j for j in done}
    assert set(by_id) == {after_failed.id, chained.id, after_missing.id}
    assert all(j.state is JobState.CANCELLED and j.ended_at == NOW for j in done)
    assert by_id[after_failed.id].note == ("cancelled: it can never start: job 901 ended failed "
                                           "(--after waits for success; --after-any for any end)")
    assert by_id[chained.id].note == (f"cancelled: it can never start: job {after_failed.id} ended cancelled "
                                      "(--after waits for success; --after-any for any end)")
    assert by_id[after_missing.id].note == "cancelled: it can never start: job 999 does not exist"


def test_nothing_is_cancelled_while_every_dependency_can_still_succeed(jobs):
    running = jobs.queued(1, state=JobState.RUNNING)
    waits = jobs.queued(1, depends_on=(running.id, 900))
    assert out_of_dependencies([running, waits], {900: JobState.SUCCEEDED}, NOW) == []
