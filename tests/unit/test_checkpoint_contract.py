"""Which signal asks a job to checkpoint: declared at submit, by its image's label, or by the job itself."""

from __future__ import annotations

import pytest

from labq.models import transitions as t
from labq.models import Job, JobSpec, NodeAllocation, Placement
from labq.models.job import SignalSource, catchable_signal
from labq.protocol.agents import AttemptReport, SyncReport, encode_sync, parse_sync
from labq.protocol.codec import decode_job, encode_job
from labq.protocol.errors import ApiError
from labq.render import show_text

PLACE = Placement((NodeAllocation("ws1", (0,), ("u0",)),))
IMAGE, JOB = SignalSource.IMAGE, SignalSource.JOB


def job(signal: str | None = None) -> Job:
    spec = JobSpec(user="alice", command=("train",), checkpoint_signal=signal)
    return t.running(t.placed(Job(7, spec, submitted_at=100.0), PLACE), 200.0)


@pytest.mark.parametrize(("text", "name"), [("usr1", "SIGUSR1"), ("SIGUSR2\n", "SIGUSR2"), (" term ", "SIGTERM"),
                                            ("KILL", None), ("sigstop", None), ("", None), ("USR1; rm", None)])
def test_only_a_signal_a_job_can_catch_is_taken(text, name):
    assert catchable_signal(text) == name


def test_a_job_declared_by_its_image_or_itself_is_stopped_with_that_signal_from_then_on():
    plain = job()
    assert (plain.checkpoint_signal, plain.stop_signal) == (None, "SIGTERM")
    by_image = t.declared(plain, "SIGUSR1", IMAGE)
    assert (by_image.stop_signal, by_image.learned_from) == ("SIGUSR1", IMAGE)
    assert t.declared(by_image, "SIGUSR1", IMAGE) is by_image  # nothing new: no commit, no event
    by_job = t.declared(by_image, "SIGUSR2", JOB)
    assert (by_job.stop_signal, by_job.learned_from) == ("SIGUSR2", JOB)
    assert t.declared(by_job, "SIGUSR1", IMAGE) is by_job  # the job's own word beats its image's label
    assert t.declared(by_job, "SIGINT", JOB).stop_signal == "SIGINT"  # from one source, the latest
    requeued = t.lost(by_job, 300.0)
    assert (requeued.attempt, requeued.stop_signal) == (2, "SIGUSR2")  # it holds for the next attempt
    assert t.declared(plain, None, None) is plain


def test_a_signal_given_at_submit_wins_over_any_later_declaration():
    submitted = job("SIGUSR2")
    assert t.declared(submitted, "SIGUSR1", JOB) is submitted
    assert submitted.stop_signal == "SIGUSR2"


def test_the_learned_signal_survives_the_store_and_labq_show_says_who_declared_it():
    for source, words in ((IMAGE, "its image's label labq.checkpoint-signal says"),
                          (JOB, "the job said with labq checkpoint --signal")):
        learned = t.declared(job(), "SIGUSR1", source)
        assert decode_job(encode_job(learned)) == learned
        assert f"checkpoint signal SIGUSR1 ({words})" in show_text(encode_job(learned), None, 300.0)
    assert "no checkpoint signal (a stop is TERM)" in show_text(encode_job(job()), None, 300.0)
    assert "learned_signal" not in encode_job(job())  # a job that declared nothing stores nothing new


def _report(**fields) -> dict:
    doc = encode_sync(SyncReport((AttemptReport(7, 1, True),), None, 0.0))
    doc["attempts"][0].update(fields)
    return doc


def test_an_agent_reports_the_declared_signal_and_its_source_and_nothing_else():
    report = SyncReport((AttemptReport(7, 1, True, checkpoint_signal="SIGUSR1", signal_from=JOB),), None, 0.0)
    assert parse_sync(encode_sync(report)) == report
    assert parse_sync(_report()).attempts[0].checkpoint_signal is None
    for bad, field in (({"checkpoint_signal": "SIGKILL", "signal_from": "job"}, "attempts.checkpoint_signal"),
                       ({"checkpoint_signal": "SIGUSR1", "signal_from": "leader"}, "attempts.signal_from"),
                       ({"checkpoint_signal": "SIGUSR1"}, "attempts.signal_from"),
                       ({"signal_from": "job"}, "attempts.checkpoint_signal"),
                       ({"checkpoint_signal": "USR1\x1b[2J", "signal_from": "job"}, "attempts.checkpoint_signal")):
        with pytest.raises(ApiError) as refused:
            parse_sync(_report(**bad))
        assert refused.value.status == 400 and refused.value.field == field, bad
