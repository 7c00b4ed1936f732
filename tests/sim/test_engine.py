"""The simulation on small workloads whose every time is computed by hand."""

from __future__ import annotations

import pytest

from labq.models.priority import PriorityClass
from labq.sim.cluster import parse_cluster
from labq.sim.engine import SimOptions, simulate
from labq.sim.model import TraceJob, TraceReservation, Workload

LOW, NORMAL, URGENT = int(PriorityClass.LOW), int(PriorityClass.NORMAL), int(PriorityClass.URGENT)
QUICK = SimOptions(checkpoint_every_s=300.0, grace_s=60.0, stop_s=10.0, min_runtime_s=0.0)


def times(result) -> dict[int, tuple[float | None, float | None]]:
    return {o.job.id: (o.start, o.end) for o in result.outcomes}


def jct(result) -> dict[int, float]:
    return {o.job.id: o.end - o.job.submit for o in result.outcomes}


# one node of 4 GPUs: J1 fills it until 10; then J2 (2 GPUs, 5 s), J3 (1 GPU, 1 s), J4 (4 GPUs, 2 s) wait
FOUR = (TraceJob(1, 0, 10, 4), TraceJob(2, 1, 5, 2), TraceJob(3, 2, 1, 1), TraceJob(4, 3, 2, 4))


def test_fifo_serves_in_submit_order_and_the_head_blocks_the_rest():
    result = simulate(Workload(FOUR), parse_cluster("sim:flat:4"), "fifo")
    # at 10: J2 and J3 start (3 GPUs); J4 needs 4, so it waits for J2's end at 15
    assert times(result) == {1: (0, 10), 2: (10, 15), 3: (10, 11), 4: (15, 17)}
    assert jct(result) == {1: 10, 2: 14, 3: 9, 4: 14}
    assert result.busy_gpu_s == 4 * 10 + 2 * 5 + 1 * 1 + 4 * 2 and result.skipped == ()


def test_sjf_serves_the_shortest_first_and_does_not_backfill():
    result = simulate(Workload(FOUR), parse_cluster("sim:flat:4"), "sjf")
    # at 10 the order is J3 (1 s), J4 (2 s), J2 (5 s): J3 starts, J4 cannot (3 free), J2 waits behind it
    assert times(result) == {1: (0, 10), 3: (10, 11), 4: (11, 13), 2: (13, 18)}
    assert jct(result) == {1: 10, 2: 17, 3: 9, 4: 10}


def test_reference_placement_best_fit_and_wide_jobs_take_whole_nodes():
    jobs = (TraceJob(1, 0, 100, 3), TraceJob(2, 0, 100, 1),  # J2 goes where J1 is (the fullest that fits)
            TraceJob(3, 1, 10, 6),  # 6 GPUs: a whole free node and 2 on another: J1's node has none left
            TraceJob(4, 2, 10, 2))  # behind J3, even though 2 GPUs... none are free: it waits for J3
    result = simulate(Workload(jobs), parse_cluster("3xsim:flat:4"), "fifo")
    assert times(result) == {1: (0, 100), 2: (0, 100), 3: (1, 11), 4: (2, 12)}
    blocked = (TraceJob(1, 0, 100, 3), TraceJob(2, 1, 10, 8), TraceJob(3, 2, 10, 1))
    result = simulate(Workload(blocked), parse_cluster("2xsim:flat:4"), "fifo")
    # J2 needs 8: both nodes whole, so it waits for J1; J3 would fit now but FIFO does not backfill
    assert times(result) == {1: (0, 100), 2: (100, 110), 3: (110, 120)}


def test_an_urgent_job_preempts_and_the_victim_resumes_from_its_checkpoint():
    jobs = (TraceJob(1, 0, 1000, 2, user="ana", priority=LOW),
            TraceJob(2, 500, 100, 2, user="ben", priority=URGENT, preemptible=False))
    result = simulate(Workload(jobs), parse_cluster("sim:flat:2"), "labq", options=QUICK)
    # at 500 J1 gets its signal; it saved at 300, so 200 s of its work on 2 GPUs are lost; it exits at 510
    assert times(result) == {1: (0, 1310), 2: (510, 610)}
    ana, ben = result.outcomes
    assert (ana.preemptions, ana.lost_gpu_s, ben.preemptions) == (1, 400.0, 0)
    # J1 ran 0-510 and 610-1310, J2 510-610
    assert result.busy_gpu_s == 2 * 510 + 2 * 700 + 2 * 100


def test_labq_backfills_where_fifo_blocks():
    # labq lets a job use GPUs held for a blocked one only if its time limit ends before they are due
    jobs = (TraceJob(1, 0, 100, 3, time_limit_s=100), TraceJob(2, 1, 10, 4), TraceJob(3, 2, 10, 1, time_limit_s=20))
    fifo = simulate(Workload(jobs), parse_cluster("sim:flat:4"), "fifo")
    labq = simulate(Workload(jobs), parse_cluster("sim:flat:4"), "labq", options=QUICK)
    assert times(fifo)[3] == (110, 120)
    assert times(labq)[3] == (2, 12)  # the free GPU is used; J2 starts no later for it
    assert times(labq)[2] == times(fifo)[2] == (100, 110)


def test_jobs_that_can_never_fit_are_skipped_and_say_why():
    jobs = (TraceJob(1, 0, 10, 1), TraceJob(2, 1, 10, 16), TraceJob(3, 2, 10, 1))
    for policy in ("labq", "fifo", "sjf"):
        result = simulate(Workload(jobs), parse_cluster("sim:flat:4"), policy, options=QUICK)
        assert [j.id for j, _ in result.skipped] == [2], policy
        assert "16" in result.skipped[0][1]
        assert times(result) == {1: (0, 10), 3: (2, 12)}, policy  # nothing waits behind it


def test_a_reservation_drains_its_gpus_and_its_job_starts_on_time():
    jobs = (TraceJob(1, 0, 10_000, 4, user="ana", priority=LOW),
            TraceJob(2, 1000, 500, 4, user="paper", reservation="paper"))
    booking = TraceReservation("paper", "paper", 4, start=1000, end=2000, booked=10)
    result = simulate(Workload(jobs, (booking,)), parse_cluster("sim:flat:4"), "labq", options=QUICK)
    ana, paper = result.outcomes
    assert paper.start == 1000 and paper.end == 1500
    assert ana.preemptions == 1 and ana.end is not None and ana.end > 1500
    assert "refused_reservations" not in result.meta


def test_the_same_input_gives_the_same_result():
    jobs = tuple(TraceJob(i, i * 7 % 50, 30 + i * 13 % 200, 1 + i % 3, user=f"u{i % 3}",
                          priority=(LOW, NORMAL, URGENT)[i % 3]) for i in range(1, 120))
    jobs = tuple(sorted(jobs, key=lambda j: j.submit))
    runs = [simulate(Workload(jobs), parse_cluster("2xsim:dgx1"), "labq", options=QUICK) for _ in range(2)]
    assert runs[0].outcomes == runs[1].outcomes and runs[0].samples == runs[1].samples
    assert all(o.end is not None for o in runs[0].outcomes)


def test_bad_policy_and_cluster_are_refused():
    with pytest.raises(ValueError, match="unknown policy"):
        simulate(Workload(FOUR), parse_cluster("sim:flat:4"), "random")
    with pytest.raises(ValueError, match="COUNTxsim|count|unknown simulated"):
        parse_cluster("0xsim:dgx1")


def test_a_job_still_waiting_when_its_reservation_ends_runs_on_the_lab_and_a_refused_bookings_jobs_are_skipped():
    jobs = (TraceJob(1, 100, 300, 2, user="ana", reservation="paper", preemptible=False),
            TraceJob(2, 110, 50, 2, user="ana", reservation="paper"),  # waits behind job 1 in the booking
            TraceJob(3, 120, 10, 1, user="ben", reservation="nope"))  # its booking was refused
    bookings = (TraceReservation("paper", "ana", 2, start=100, end=200, booked=10),
                TraceReservation("nope", "ben", 8, start=100, end=200, booked=10))
    result = simulate(Workload(jobs, bookings), parse_cluster("sim:flat:4"), "labq", options=QUICK)
    assert times(result) == {1: (100, 400), 2: (200, 250)}  # released at the end, to the two idle GPUs
    [(skipped, why)] = result.skipped
    assert skipped.id == 3 and why.startswith("its reservation 'nope' was refused: capacity: no node has 8")
    assert result.meta["refused_reservations"][0].startswith("nope: ")
    assert "never_started" not in result.meta


@pytest.mark.parametrize("seed", range(6))
def test_in_a_generated_lab_with_bookings_every_job_starts_or_says_why_naming_what_exists(seed):
    from labq.sim.workload import generate

    workload = generate(seed=seed, days=14, users=6, gpus=8)
    assert workload.reservations  # the deadline week books
    result = simulate(workload, parse_cluster("2xsim:ws-4x3090"), "labq")
    refused = {line.split(":", 1)[0] for line in result.meta.get("refused_reservations", ())}
    assert all(o.start is not None for o in result.outcomes), result.meta.get("never_started")
    for job, why in result.skipped:
        if job.reservation is not None:
            assert job.reservation in refused and why.startswith(f"its reservation {job.reservation!r} was refused")
