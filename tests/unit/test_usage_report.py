"""``labq.models.usage`` on the odd ends of a job's life, with figures worked out by hand; and the archive's
documents read straight into ``JobUse`` (``labq.protocol.usage.decode_use``) as the whole job would be.
The report of a whole lab over a real store: ``tests/leader/test_usage_endpoint.py``."""

from __future__ import annotations

import json

import pytest

from labq.models import transitions as t
from labq.models.usage import Grouping, job_use, nearest_rank, node_gpu_models, usage_report
from labq.protocol.codec import decode_job, encode_job
from labq.protocol.usage import decode_use
from tests.leader.usage_history import DGX, NODES, NORMAL, WS1, history, on, ran, submitted

H = 3600.0
T0 = 1_800_000_000.0
GPUS = node_gpu_models(NODES)


def odd_ends() -> list:
    """Jobs that end in the less common ways, each between T0 and T0 + 10 h."""
    lost = t.lost(ran(submitted(1, "ana", 2, NORMAL, T0), on(WS1, 0, 1), T0 + H), T0 + 3 * H,
                  checkpoint_at=T0 + 2.5 * H)  # its node went silent: requeued, 2 x 0.5 h lost; waits again
    silent = t.cancelled(ran(submitted(2, "ben", 1, NORMAL, T0), on(DGX, 5), T0 + 2 * H), T0 + 4 * H)
    never_launched = t.exited(t.placed(submitted(3, "ana", 1, NORMAL, T0), on(DGX, 6)), 1, T0 + H)
    requeued = t.exited(t.preempting(ran(submitted(4, "ben", 4, NORMAL, T0), on(DGX, 0, 1, 2, 3), T0 + H), 9),
                        0, T0 + 2 * H)
    gave_up = t.cancelled(requeued, T0 + 5 * H)  # cancelled while waiting after its preemption
    return [lost, silent, never_launched, gave_up]


def test_the_odd_ends_of_a_job_as_worked_out_by_hand():
    jobs = odd_ends()
    report = usage_report([j for j in jobs if j.state.finished], [j for j in jobs if not j.state.finished],
                          T0, T0 + 10 * H, GPUS, T0 + 10 * H)
    rows = {g: {r.name: (r.gpu_hours, r.jobs_run, r.failed, r.preempted, r.cancelled, r.mean_wait_s,
                         r.lost_gpu_hours) for r in report.rows[g]} for g in Grouping}
    # ana: job 1's lost attempt 2 h x 2 GPUs, 1 h lost x 2; job 3 failed before it ran: no GPU-hours, no wait,
    # and no node (it never held one). ben: job 2 ran 2 h on 1 GPU until its node went silent and it was
    # cancelled there; job 4 1 h x 4 GPUs, preempted, then cancelled while queued (no node for that end)
    assert rows[Grouping.USER] == {"ana": (4.0, 1, 1, 0, 0, 1 * H, 1.0), "ben": (6.0, 2, 0, 1, 2, 1.5 * H, 0.0)}
    assert rows[Grouping.NODE] == {"dgx": (6.0, 2, 0, 1, 1, 1.5 * H, 0.0), "ws1": (4.0, 1, 0, 0, 0, 1 * H, 1.0)}
    assert rows[Grouping.MODEL] == {"Tesla V100-SXM2-32GB": rows[Grouping.NODE]["dgx"],
                                    "NVIDIA GeForce RTX 3090": rows[Grouping.NODE]["ws1"]}


def test_a_report_before_and_after_a_job_ends_splits_nothing_and_counts_it_once():
    running = ran(submitted(1, "ana", 2, NORMAL, T0), on(WS1, 2, 3), T0 + H)
    so_far = usage_report([], [running], T0, T0 + 10 * H, GPUS, T0 + 3 * H)  # until is clipped to now
    assert (so_far.until, so_far.total.gpu_hours, so_far.total.jobs_run) == (T0 + 3 * H, 4.0, 1)
    done = t.exited(running, 0, T0 + 5 * H)
    both = usage_report([done], [running], T0, T0 + 10 * H, GPUS, T0 + 10 * H)  # ended between the two looks
    assert (both.total.gpu_hours, both.total.jobs_run) == (8.0, 1)


def test_no_capacity_without_nodes_and_no_rows_for_jobs_outside_the_window():
    report = usage_report([t.exited(ran(submitted(1, "ana", 1, NORMAL, T0), on(WS1, 0), T0 + H), 0, T0 + 2 * H)],
                          [submitted(2, "ben", 1, NORMAL, T0)], T0 + 5 * H, T0 + 6 * H, {}, T0 + 9 * H)
    assert (report.gpus, report.capacity_gpu_hours, report.total.share) == (0, None, None)
    assert all(rows == () for rows in report.rows.values()) and report.total.jobs_run == 0
    with pytest.raises(ValueError, match="the window is empty"):
        usage_report([], [], T0 + H, T0 + 2 * H, GPUS, T0)


@pytest.mark.parametrize(("values", "p90"), [
    ([], None), ([5.0], 5.0), ([1.0, 2.0], 2.0), ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 9.0),
    ([float(i) for i in range(1, 21)], 18.0), ([float(i) for i in range(1, 12)], 10.0),
])
def test_the_90th_percentile_is_by_nearest_rank(values, p90):
    assert nearest_rank(values, 90) == p90


def test_a_document_reads_into_what_the_whole_job_reduces_to():
    versions = [v for life in history() for v in life] + odd_ends()
    for job in versions:
        doc = json.loads(json.dumps(encode_job(job)))  # as the archive holds it
        assert decode_use(doc, T0 + 20 * H) == job_use(decode_job(doc), T0 + 20 * H), job.id
