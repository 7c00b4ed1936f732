"""A notice outlives a leader killed with SIGKILL: a real lab (``labq leader`` and ``labq agent`` processes), a job
that ends while the lab's webhook receiver is down, the leader killed before it could deliver, the receiver back,
the leader started again on the same data folder: the notice arrives, once.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import TEST_CONFIG, Lab
from tests.leader.receivers import WebhookReceiver

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def webhook():
    receiver = WebhookReceiver()
    yield receiver
    receiver.close()


def test_a_notice_outlives_a_leader_killed_before_delivering_it(tmp_path, webhook):
    webhook.down()  # its port is the URL's; nothing listens there until it is back
    lab = Lab(tmp_path, TEST_CONFIG + '[notify]\nretry_first = "0.2s"\nretry_max = "0.5s"\n'
                                      f'[notify.webhook]\nurl = "{webhook.url}"\n')
    try:
        lab.start_leader()
        lab.start_agent()
        job_id = lab.submit("true", name="short", notify="end")
        spec = lab.job(job_id)["spec"]
        assert spec["notify"] == ["end"]
        lab.wait_state(job_id, "succeeded")
        failing = {}

        def tried() -> bool:
            [found] = lab.api("admin", "notify", "status")
            failing.update(found)
            return found["failing"] and found["queued"] == 1

        lab.wait(tried, "the webhook's delivery to fail", detail=lambda: failing)
        assert "ConnectionRefusedError" in failing["last_error"]
        lab.kill(lab.leader)  # SIGKILL: the notice is only on disk now
        webhook.up()
        lab.start_leader()
        [posted] = webhook.wait_for(1, timeout=30)
        assert posted["text"] == f"{spec['user']}: job {job_id} (`short`) succeeded on ws1"
        assert posted["labq"]["key"] == f"job-{job_id}.end" and posted["labq"]["state"] == "succeeded"
        lab.wait(lambda: lab.api("admin", "notify", "status")[0]["queued"] == 0, "the outbox to be empty")
        assert len(webhook.bodies) == 1
    finally:
        lab.close()
