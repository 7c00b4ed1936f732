"""Queues (teams) in one scheduling pass, as tables: guarantees served first, idle GPUs lent to preemptible
work, borrowed GPUs reclaimed by checkpoint, caps, and a maximum wait that preempts."""

from __future__ import annotations

from labq.models import PendingReason, PriorityClass
from labq.models.job import Attempt, AttemptEnd, StopReason
from labq.models.queues import QueueSpec
from labq.scheduler import Policy, schedule
from tests.conftest import NOW, make_node

LOW, NORMAL, HIGH, URGENT = (int(p) for p in PriorityClass)
HALF = (QueueSpec("a", ("ann",), guarantee_gpus=2), QueueSpec("b", ("bob",), guarantee_gpus=2))


def policy(queues=HALF, **kw) -> Policy:
    return Policy(queues=queues, **kw)


def test_idle_gpus_of_another_queue_are_lent_to_preemptible_jobs_only(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    mine = [jobs.queued(1, user="ann", queue="a") for _ in range(3)]
    firm = jobs.queued(1, user="ann", queue="a", preemptible=False)
    d = schedule([*mine, firm], [node], now=NOW, policy=policy())
    assert {s.job_id for s in d.starts} == {j.id for j in mine}  # two within the guarantee, one borrowed
    why = d.pending_for(firm.id)
    assert why.reason is PendingReason.BORROWED and "only preemptible jobs borrow" in why.detail


def test_a_queue_below_its_guarantee_is_served_before_one_over_it_whatever_the_priority(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    a_running = [jobs.running(node, (i,), user="ann", queue="a") for i in (0, 1, 2)]
    a_urgent = jobs.queued(1, user="ann", queue="a", priority=HIGH)
    b_low = jobs.queued(1, user="bob", queue="b", priority=LOW)
    d = schedule([*a_running, a_urgent, b_low], [node], now=NOW, policy=policy())
    assert d.started(b_low.id) is not None and d.started(a_urgent.id) is None


def test_a_lending_queue_reclaims_borrowed_gpus_by_preemption_whatever_their_priority(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    a = [jobs.running(node, (i,), user="ann", queue="a", priority=HIGH, started_at=NOW - 10) for i in range(4)]
    b = jobs.queued(2, user="bob", queue="b", priority=LOW)
    d = schedule([*a, b], [node], now=NOW, policy=policy())
    victims = {p.job_id for p in d.preemptions}
    assert len(victims) == 2 and victims <= {j.id for j in a}  # two, though high and just started
    assert all(p.for_job == b.id for p in d.preemptions)
    assert d.pending_for(b.id).reason is PendingReason.PREEMPTING


def test_a_cancelled_job_counts_for_no_queue_so_a_reclaim_leaves_its_queue_at_its_guarantee(jobs):
    """Its GPUs come back whatever happens: a reclaim counts on them rather than taking the queue below its
    guarantee, and they are the reclaiming queue's from now on."""
    node = make_node("ws", "sim:ws-4x3090")
    a = [jobs.running(node, (i,), user="ann", queue="a", priority=LOW) for i in (0, 1, 2)]
    cancelled = jobs.running(node, (3,), user="ann", queue="a", priority=LOW, stop_requested="cancel")
    b = [jobs.queued(1, user="bob", queue="b") for _ in range(2)]
    d = schedule([*a, cancelled, *b], [node], now=NOW, policy=policy())
    assert len(d.preemptions) == 1 and d.preemptions[0].job_id in {j.id for j in a}  # a keeps its guarantee of 2
    waits = {j.id: d.pending_for(j.id) for j in b}
    assert sorted((w.reason, w.waiting_for) for w in waits.values()) == sorted(
        [(PendingReason.RESOURCES, cancelled.id), (PendingReason.PREEMPTING, d.preemptions[0].job_id)])


def test_reclaim_never_takes_a_queue_below_its_guarantee(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    a = [jobs.running(node, (i,), user="ann", queue="a", priority=LOW) for i in (0, 1)]  # a at its guarantee
    free_b = [jobs.running(node, (i,), user="bob", queue="b", priority=LOW) for i in (2, 3)]
    b = jobs.queued(1, user="bob", queue="b", priority=URGENT)
    d = schedule([*a, *free_b, b], [node], now=NOW, policy=policy())
    # b is at its guarantee: it may take from its own queue by priority, never from a's guarantee
    assert {p.job_id for p in d.preemptions} <= {j.id for j in free_b}
    assert len(d.preemptions) == 1


def test_borrowed_work_is_taken_by_priority_only_from_what_is_borrowed(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    a = [jobs.running(node, (i,), user="ann", queue="a", priority=LOW) for i in (0, 1, 2)]  # one borrowed
    b_run = jobs.running(node, (3,), user="bob", queue="b", priority=LOW)
    c = jobs.queued(1, user="cy", queue="c", priority=URGENT)  # a queue with no guarantee
    queues = (*HALF, QueueSpec("c", ("cy",)))
    d = schedule([*a, b_run, c], [node], now=NOW, policy=policy(queues))
    assert [p.job_id for p in d.preemptions] != [b_run.id]  # b holds within its guarantee
    assert len(d.preemptions) == 1 and d.preemptions[0].job_id in {j.id for j in a}


def test_idle_guarantee_a_queue_waits_for_is_not_lent(jobs):
    nodes = [make_node("n1", "sim:ws-4x3090"), make_node("n2", "sim:ws-4x3090")]
    queues = (QueueSpec("a", ("ann",), guarantee_gpus=4), QueueSpec("b", ("bob",), guarantee_gpus=4))
    a_running = [jobs.running(n, (0, 1), user="ann", queue="a", preemptible=False) for n in nodes]
    b_big = jobs.queued(4, user="bob", queue="b")  # within b's guarantee, but no node has 4 GPUs free
    a_more = jobs.queued(1, user="ann", queue="a")  # a holds its guarantee: it would borrow b's
    d = schedule([*a_running, b_big, a_more], nodes, now=NOW, policy=policy(queues))
    assert not d.starts
    why = d.pending_for(a_more.id)
    assert why.reason is PendingReason.BORROWED and "queue b wants its idle guarantee of 4" in why.detail
    b_gone = schedule([*a_running, a_more], nodes, now=NOW, policy=policy(queues))
    assert b_gone.started(a_more.id) is not None  # with nothing of b waiting, its idle GPUs are lent


def test_a_queue_that_does_not_lend_keeps_its_idle_guarantee(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    queues = (QueueSpec("a", ("ann",), guarantee_gpus=2), QueueSpec("b", ("bob",), guarantee_gpus=2, lends=False))
    mine = [jobs.queued(1, user="ann", queue="a") for _ in range(4)]
    d = schedule(mine, [node], now=NOW, policy=policy(queues))
    assert len(d.starts) == 2
    why = d.pending_for(mine[2].id)
    assert why.reason is PendingReason.BORROWED and "queue b does not lend its idle guarantee of 2" in why.detail


def test_a_queue_at_its_cap_waits_with_the_queue_reason(jobs):
    node = make_node("ws", "sim:dgx1")
    queues = (QueueSpec("nlp", ("ann",), guarantee_gpus=2, cap=3), QueueSpec("cv", ("bob",), guarantee_gpus=2))
    mine = [jobs.queued(1, user="ann", queue="nlp") for _ in range(5)]
    d = schedule(mine, [node], now=NOW, policy=policy(queues))
    assert len(d.starts) == 3
    why = d.pending_for(mine[3].id)
    assert why.reason is PendingReason.QUEUE and why.detail.startswith("queue nlp is at its cap of 3 GPUs")


def test_a_queue_that_does_not_borrow_stays_within_its_guarantee(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    queues = (QueueSpec("a", ("ann",), guarantee_gpus=2, borrows=False), QueueSpec("b", ("bob",), guarantee_gpus=2))
    mine = [jobs.queued(1, user="ann", queue="a") for _ in range(3)]
    d = schedule(mine, [node], now=NOW, policy=policy(queues))
    assert len(d.starts) == 2
    assert d.pending_for(mine[2].id).reason is PendingReason.QUEUE


def test_a_grace_longer_than_the_reclaim_bound_does_not_borrow(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    mine = [jobs.queued(1, user="ann", queue="a", grace_s=600) for _ in range(3)]
    d = schedule(mine, [node], now=NOW, policy=policy(reclaim_grace_s=120))
    assert len(d.starts) == 2
    why = d.pending_for(mine[2].id)
    assert why.reason is PendingReason.BORROWED and "reclaim bound of 120s" in why.detail


def test_a_job_just_reclaimed_does_not_borrow_again_before_its_minimum_runtime(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    a = [jobs.running(node, (i,), user="ann", queue="a") for i in (0, 1)]
    back = jobs.queued(1, user="ann", queue="a")
    back = back.evolve(attempt=2, history=(Attempt(1, None, NOW - 900, NOW - 60, AttemptEnd.CHECKPOINTED,
                                                   stop_reason=StopReason.PREEMPTED),))
    d = schedule([*a, back], [node], now=NOW, policy=policy(min_runtime_s=300))
    assert d.started(back.id) is None and "borrows again after the minimum runtime" in d.pending_for(back.id).detail
    later = schedule([*a, back], [node], now=NOW + 300, policy=policy(min_runtime_s=300))
    assert later.started(back.id) is not None


def test_a_job_past_its_queues_maximum_wait_preempts_what_stands_in_its_way(jobs):
    node = make_node("ws", "sim:ws-4x3090")
    queues = (QueueSpec("a", ("ann", "bob"), guarantee_gpus=4, max_wait_s=3600),)
    others = [jobs.running(node, (i,), user="bob", queue="a", priority=NORMAL) for i in range(4)]
    patient = jobs.queued(1, user="ann", queue="a", priority=NORMAL, submitted_at=NOW - 1800)
    d = schedule([*others, patient], [node], now=NOW, policy=policy(queues))
    assert not d.preemptions  # equal priority, not waited long enough
    late = patient.evolve(submitted_at=NOW - 3601)
    d = schedule([*others, late], [node], now=NOW, policy=policy(queues))
    assert len(d.preemptions) == 1 and d.preemptions[0].for_job == late.id


def test_a_lab_with_one_queue_of_the_whole_lab_decides_as_a_lab_without_queues(jobs):
    nodes = [make_node("a", "sim:ws-4x3090"), make_node("b", "sim:dgx1")]
    running = [jobs.running(nodes[0], (0, 1), user="bob", priority=LOW, queue="all"),
               jobs.running(nodes[1], (0, 1, 2, 3), user="cy", priority=NORMAL, queue="all")]
    waiting = [jobs.queued(g, user=u, priority=p, queue="all", preemptible=p < HIGH)
               for g, u, p in [(4, "ann", URGENT), (2, "bob", LOW), (8, "cy", NORMAL), (1, "ann", HIGH), (2, "dee", LOW)]]
    plain = schedule([*running, *waiting], nodes, now=NOW, policy=Policy())
    one = schedule([*running, *waiting], nodes, now=NOW,
                   policy=policy((QueueSpec("all", ("*",), guarantee_percent=100),)))
    assert one == plain


def test_a_job_that_could_never_start_in_its_queue_is_named_at_submit():
    from labq.models.job import JobSpec
    from labq.scheduler.queues import why_never_in_queue

    queues = (QueueSpec("nlp", guarantee_gpus=2, cap=4), QueueSpec("cv", guarantee_percent=50, borrows=False))

    def why(gpus, queue, **kw):
        spec = JobSpec(user="ann", command=("train",), gpus=gpus, queue=queue, **kw)
        return why_never_in_queue(spec, queues, 8, 60.0, True)

    assert why(2, "nlp") is None and why(4, "nlp") is None and why(4, "cv") is None
    assert why(5, "nlp") == "it needs 5 GPUs and queue nlp's cap is 4"
    assert why(3, "nlp", preemptible=False).endswith("so it would borrow, and only preemptible jobs borrow")
    assert why(3, "nlp", grace_s=120).endswith("only jobs with a grace of at most 60s borrow")
    assert why(5, "cv").endswith("and queue cv does not borrow")
    assert why(1, None, preemptible=False) == ("it needs 1 GPUs and a job outside every queue is guaranteed 0, "
                                               "so it would borrow, and only preemptible jobs borrow")
    assert why_never_in_queue(JobSpec(user="a", command=("x",), gpus=9), (), 8, None, True) is None
