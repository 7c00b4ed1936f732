"""The leader's listing reuses each unfinished job's JSON while the job is unchanged."""

from __future__ import annotations

import json
from dataclasses import replace

from labq.leader.routes import _JobTexts
from labq.models.job import JobState
from labq.protocol.codec import encode_job


def test_a_listing_is_the_jobs_encoded_and_follows_every_change(jobs):
    texts = _JobTexts()
    queue = [jobs.queued(), jobs.queued(gpus=2, user="bob")]
    live = {j.id: j for j in queue}
    assert json.loads(texts.listing(queue, live)) == [encode_job(j) for j in queue]
    held = replace(queue[1], state=JobState.HELD)
    live[held.id] = held
    assert json.loads(texts.listing([queue[0], held], live))[1]["state"] == "held"
    finished = jobs.queued()  # from the history: not live, not kept
    assert json.loads(texts.listing([finished], live)) == [encode_job(finished)]
    assert finished.id not in texts._texts and set(texts._texts) == set(live)


def test_texts_of_jobs_that_left_the_queue_are_dropped_when_they_pile_up(jobs):
    texts = _JobTexts()
    gone = [jobs.queued() for _ in range(1010)]
    texts.listing(gone, {j.id: j for j in gone})
    assert len(texts._texts) == 1010
    one = jobs.queued()
    texts.listing([one], {one.id: one})
    assert set(texts._texts) == {one.id}
