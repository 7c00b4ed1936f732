"""Notifications end to end inside one process: a real leader on loopback (its TinyDB store in a temp folder, its
HTTP server, its channel threads), a real webhook receiver (``http.server``) and a real SMTP server (``aiosmtpd``),
both on loopback. The test is the agent: it registers a node, and reports the attempts the leader placed there as
running and then ended, through the API, as an agent's sync does.

What is checked: the mail of a job that ends (recipient, subject, body) and the webhook's JSON with its ``text``;
user text (a job's name) arrives escaped; a receiver that is down is retried and gets the notice once back; a
notice is given up after ``give_up_after``, its error kept in the admin's status, which survives a restart; the
outbox survives a restart; who may see and change whose settings; ``notify`` refused with a clear 400; a
reservation's start and end; the ``notify`` event reaches its owner's event stream alone.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from labq.cli import main
from labq.client import Client
from labq.leader.auth import Principal
from labq.leader.config import NotifyConfig
from labq.protocol.requests import SubmitRequest
from labq.topologies import parse_sim_spec
from tests.leader.loopback_leader import LoopbackLeader, start_loopback_leader
from tests.leader.receivers import SmtpReceiver, WebhookReceiver

pytestmark = pytest.mark.timeout(60)

def node_doc(name: str, sim: str = "sim:ws-4x3090") -> dict:
    """A registration's node, as an agent with simulated GPUs sends it."""
    inventory = parse_sim_spec(sim)
    return {"name": name, "gpus": [{"index": g.index, "uuid": g.uuid, "model": g.model, "memory_mib": g.memory_mib}
                                   for g in inventory.gpus(name)],
            "topology": {"pcie": [[int(v) for v in row] for row in inventory.topology.pcie],
                         "nvlinks": [list(row) for row in inventory.topology.nvlinks], "nvswitch_links": [],
                         "numa": []},
            "unmanaged_busy": [], "simulated": True, "labels": []}


HOSTILE = "x\nBcc: eve@evil.example\x1b[2J<!channel>`@all`&"  #: a job name as an old database may hold it


class Clock:
    """The leader's wall clock, stepped by the test."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Lab:
    """A loopback leader with users alice and bob, node n1, and the test as n1's agent."""

    def __init__(self, root: Path, notify: NotifyConfig, clock=None, threads: bool = True) -> None:
        self.root, self.notify_config, self.clock, self.threads = root, notify, clock, threads
        self.lb = self._start()
        self.tokens = {"admin": self.lb.admin_token}
        for user in ("alice", "bob"):
            doc = self.ok("POST", "/v1/users", {"name": user, "admin": False}, status=201)
            self.tokens[user] = doc["token"]
        doc = self.ok("POST", "/v1/agents/register", {"node": node_doc("n1"), "version": "0"}, token=self.lb.join_token)
        self.tokens["agent"] = doc["agent_token"]

    def _start(self) -> LoopbackLeader:
        lb = start_loopback_leader(self.root, notify=self.notify_config, auth_failures_per_minute=0,
                                   **({"clock": self.clock} if self.clock else {}))
        if self.threads:
            lb.leader.notify.start(lb.leader.workers)
        return lb

    def restart(self) -> None:
        self.lb.stop()
        self.lb = self._start()

    @property
    def outbox(self):
        return self.lb.leader.notify.outbox

    def ok(self, method: str, path: str, body=None, *, token: str | None = "admin", status: int = 200) -> dict:
        token = self.tokens.get(token, token) if token else None
        got, _, doc = self.lb.request(method, path, body, token=token)
        assert got == status, (method, path, got, doc)
        return doc

    def submit(self, user: str = "alice", **body) -> int:
        doc = self.ok("POST", "/v1/jobs", {"command": ["python", "train.py"], **body}, token=user, status=201)
        return doc["job"]["id"]

    def sync(self, *attempts: dict) -> None:
        self.ok("POST", "/v1/agents/n1/sync", {"attempts": list(attempts), "wait_s": 0}, token="agent")

    def run(self, job_id: int) -> None:
        """Placed by a scheduling pass, then reported running."""
        self.lb.leader.scheduling.schedule_pass()
        job = self.ok("GET", f"/v1/jobs/{job_id}")["job"]
        assert job["state"] == "starting", job
        self.sync({"job_id": job_id, "attempt": job["attempt"], "running": True})

    def end(self, job_id: int, exit_code: int = 0) -> None:
        job = self.ok("GET", f"/v1/jobs/{job_id}")["job"]
        self.sync({"job_id": job_id, "attempt": job["attempt"], "running": False, "exit_code": exit_code})

    def status(self, channel: str) -> dict:
        return next(c for c in self.ok("GET", "/v1/notify/status")["channels"] if c["channel"] == channel)

    def wait_status(self, channel: str, condition, what: str, timeout: float = 15.0) -> dict:
        """The channel's status once ``condition`` holds of it (asked again every 50 ms)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.status(channel)
            if condition(found):
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for the {channel} channel to be {what}: {found}")
            time.sleep(0.05)

    def close(self) -> None:
        self.lb.stop()


@pytest.fixture
def webhook():
    receiver = WebhookReceiver()
    yield receiver
    receiver.close()


@pytest.fixture
def smtp():
    receiver = SmtpReceiver()
    yield receiver
    receiver.close()


@pytest.fixture
def labs(tmp_path):
    made: list[Lab] = []

    def make(notify: NotifyConfig, **kwargs) -> Lab:
        lab = Lab(tmp_path / f"lab{len(made)}", notify, **kwargs)
        made.append(lab)
        return lab

    yield make
    for lab in made:
        lab.close()


def mail_config(smtp: SmtpReceiver, **extra) -> dict:
    return {"smtp_host": "127.0.0.1", "smtp_port": smtp.port, "smtp_starttls": False, "email_from": "labq@lab.org",
            **extra}


# -- delivered ------------------------------------------------------------------------------------

def test_a_job_that_ends_is_mailed_to_its_owner(labs, smtp):
    lab = labs(NotifyConfig(**mail_config(smtp)))
    settings = lab.ok("PUT", "/v1/notify", {"email": "alice@lab.org"}, token="alice")
    assert settings == {"user": "alice", "on": [], "email": "alice@lab.org", "webhook": True, "channels": ["email"]}
    job_id = lab.submit(name="resnet-50", notify=["end"])
    lab.run(job_id)
    lab.end(job_id, 0)
    [(sender, rcpt, mail)] = smtp.wait_for(1)
    assert (sender, rcpt, mail["To"], mail["From"]) == ("labq@lab.org", ["alice@lab.org"], "alice@lab.org",
                                                       "labq@lab.org")
    assert mail["Subject"] == f"labq: job {job_id} (resnet-50) succeeded"
    assert mail["Message-ID"] == f"<labq.job-{job_id}.end@lab.org>"  # the same if it is sent again
    body = mail.get_content().replace("\r\n", "\n")
    assert f"alice: job {job_id} (resnet-50) succeeded on n1" in body
    assert f"job: {job_id}\n" in body and "name: resnet-50\n" in body and "state: succeeded\n" in body
    status = lab.wait_status("email", lambda s: s["queued"] == 0 and s["last_success_at"], "delivered")
    assert (status["failing"], status["delivered"], status["target"]) == (False, 1, f"smtp://127.0.0.1:{smtp.port}")


def test_the_webhook_gets_json_with_a_line_of_text(labs, webhook):
    lab = labs(NotifyConfig(webhook_url=webhook.url))
    job_id = lab.submit(name="sweep-3", notify=["start", "fail"])
    lab.run(job_id)
    lab.end(job_id, 3)
    started, failed = webhook.wait_for(2)
    assert started["text"] == f"alice: job {job_id} (`sweep-3`) started running (attempt 1) on n1"
    assert failed["text"] == f"alice: job {job_id} (`sweep-3`) failed (exit 3) on n1"
    assert failed["labq"] == {"key": f"job-{job_id}.fail", "user": "alice", "event": "fail", "state": "failed",
                              "job_id": job_id, "job_name": "sweep-3", "attempt": 1, "exit_code": 3, "node": "n1",
                              "at": failed["labq"]["at"]}
    status = lab.status("webhook")
    assert status["target"] == f"http://127.0.0.1:{webhook.port}/..."  # the path of a webhook URL is its secret
    assert "secret-path" not in json.dumps(lab.ok("GET", "/v1/notify/status"))


def test_a_job_someone_else_cancels_tells_its_owner_and_their_own_cancel_does_not(labs, webhook):
    """``fail`` hears of a cancel by an admin, and by the lab (a job that waits for one that failed), not of the
    owner's own."""
    lab = labs(NotifyConfig(webhook_url=webhook.url))
    mine, theirs, first = (lab.submit(name=name, notify=["fail"], gpus=4) for name in ("mine", "theirs", "first"))
    then = lab.submit(name="then", notify=["fail"], depends_on=[first])
    lab.ok("POST", f"/v1/jobs/{mine}/actions", {"action": "cancel"}, token="alice")
    lab.ok("POST", f"/v1/jobs/{theirs}/actions", {"action": "cancel"}, token="admin")
    lab.run(first)
    lab.end(first, 1)
    lab.lb.leader.scheduling.schedule_pass()  # ``then`` can never start now: the pass cancels it
    told = webhook.wait_for(3)
    assert [t["text"] for t in told] == [
        f"alice: job {theirs} (`theirs`) was cancelled: by root",
        f"alice: job {first} (`first`) failed (exit 1) on n1",
        f"alice: job {then} (`then`) was cancelled: it can never start: job {first} ended failed (--after waits "
        "for success; --after-any for any end)"]
    assert [(t["labq"]["event"], t["labq"]["state"]) for t in told] == [("fail", "cancelled"), ("fail", "failed"),
                                                                         ("fail", "cancelled")]
    cancelled = lab.ok("GET", f"/v1/jobs/{theirs}")["job"]
    assert (cancelled["cancelled_by"], cancelled["note"]) == ("root", "cancelled by root")  # labq show says who
    assert "cancelled_by" not in lab.ok("GET", f"/v1/jobs/{mine}")["job"]
    lab.wait_status("webhook", lambda s: s["queued"] == 0, "empty")
    assert len(webhook.bodies) == 3  # and nothing for alice's own cancel


def test_an_array_notifies_once_when_its_last_task_ends(labs, webhook):
    """A sweep of many tasks is one message, not one a task: counted by how they ended."""
    lab = labs(NotifyConfig(webhook_url=webhook.url))
    arrays = []
    for name, codes in (("sweep", (0, 1, 0)), ("clean", (0, 0, 0))):
        doc = lab.ok("POST", "/v1/jobs", {"command": ["train", "{index}"], "array": "0-2", "name": name,
                                          "notify": ["start", "end", "fail"]}, token="alice", status=201)
        arrays.append((doc["array"]["id"], codes))
    for aid, codes in arrays:
        lab.lb.leader.scheduling.schedule_pass()  # n1 has 4 GPUs: the second array's tasks start once the first ended
        tasks = [aid + 1 + i for i in range(3)]
        lab.sync(*({"job_id": t, "attempt": 1, "running": True} for t in tasks))
        for task, code in zip(tasks[:2], codes):
            lab.end(task, code)
        lab.wait_status("webhook", lambda s: s["queued"] == 0, "nothing queued")
        assert len(webhook.bodies) == len(arrays[:arrays.index((aid, codes))])  # none until its last task ends
        lab.end(tasks[2], codes[2])
    first, second = webhook.wait_for(2)
    (sweep, _), (clean, _) = arrays
    assert first["text"] == f"alice: array {sweep} (`sweep`) ended: 2 succeeded, 1 failed"
    assert (first["labq"]["event"], first["labq"]["tasks"], first["labq"]["job_id"]) == ("fail", 3, sweep)
    assert second["text"] == f"alice: array {clean} (`clean`) ended: 3 succeeded"
    assert second["labq"]["event"] == "end"
    lab.wait_status("webhook", lambda s: s["queued"] == 0, "nothing queued")
    assert len(webhook.bodies) == 2  # no task's own start or end


def test_a_jobs_name_arrives_escaped_in_mail_and_chat(labs, smtp, webhook):
    """A name the API refuses today, as a database of an older labq may hold it: no header is injected into the
    mail, no control character reaches a terminal, and the chat cannot be made to page everyone."""
    lab = labs(NotifyConfig(webhook_url=webhook.url, **mail_config(smtp)))
    lab.ok("PUT", "/v1/notify", {"email": "alice@lab.org", "on": ["end"]}, token="alice")
    job = lab.lb.leader.queue.submit(Principal("user", "alice"), SubmitRequest({"command": ("x",), "name": HOSTILE}))
    lab.run(job.id)
    lab.end(job.id, 0)
    [(_, rcpt, mail)] = smtp.wait_for(1)
    assert rcpt == ["alice@lab.org"] and mail["Bcc"] is None and len(mail.get_all("Subject")) == 1
    subject, body = mail["Subject"], mail.get_content()
    assert "\n" not in subject and "\x1b" not in subject and "\\n" in subject and "\\x1b[2J" in subject
    assert "\x1b" not in body and "name: x\\nBcc: eve@evil.example\\x1b[2J" in body
    [posted] = webhook.wait_for(1)
    text = posted["text"]
    assert "<" not in text and ">" not in text and "\x1b" not in text and "\n" not in text
    assert "(`x\\nBcc: eve@evil.example\\x1b[2J&lt;!channel&gt;'@all'&amp;`)" in text  # one code span, no mention
    assert posted["labq"]["job_name"] == HOSTILE  # the structured field as it is: JSON escapes it


def test_the_owners_defaults_apply_unless_the_job_says_otherwise(labs, webhook):
    lab = labs(NotifyConfig(webhook_url=webhook.url))
    lab.ok("PUT", "/v1/notify", {"on": ["end"]}, token="alice")
    quiet = lab.submit(notify=[])  # --notify none
    loud = lab.submit()  # her defaults
    for job_id in (quiet, loud):
        lab.run(job_id)
        lab.end(job_id, 0)
    [only] = webhook.wait_for(1)
    lab.wait_status("webhook", lambda s: s["queued"] == 0 and s["delivered"] == 1, "idle")
    assert only["labq"]["job_id"] == loud and webhook.bodies == [only]
    lab.ok("PUT", "/v1/notify", {"webhook": False}, token="alice")  # out of the lab's chat: no channel reaches her
    third = lab.submit()
    lab.run(third)
    lab.end(third, 0)
    assert lab.status("webhook")["queued"] == 0
    assert not any(key.startswith(f"job-{third}.") for key in lab.outbox.lines["webhook"].pending)


# -- retried, given up, kept across a restart ---------------------------------------------------------

def test_a_receiver_that_is_down_gets_the_notice_once_it_is_back(labs, webhook):
    lab = labs(NotifyConfig(webhook_url=webhook.url, retry_first_s=0.1, retry_max_s=0.2))
    webhook.down()
    job_id = lab.submit(notify=["end"])
    lab.run(job_id)
    lab.end(job_id, 0)
    failing = lab.wait_status("webhook", lambda s: s["failing"] and s["failed_tries"] >= 3, "failing, and retried")
    assert failing["queued"] == 1 and failing["last_success_at"] is None
    assert "ConnectionRefusedError" in failing["last_error"], failing
    text = main_output(lab, ["admin", "notify", "status"])
    assert "FAILING" in text and "ConnectionRefusedError" in text
    webhook.up()
    [posted] = webhook.wait_for(1)
    assert posted["labq"]["job_id"] == job_id
    back = lab.wait_status("webhook", lambda s: not s["failing"] and s["queued"] == 0, "working again")
    assert back["last_success_at"] is not None and back["delivered"] == 1 and webhook.bodies == [posted]


def test_a_notice_is_given_up_after_a_day_and_its_error_kept(labs, webhook):
    clock = Clock()
    lab = labs(NotifyConfig(webhook_url=webhook.url), clock=clock, threads=False)  # the test steps the outbox
    webhook.answer, webhook.answer_text = 500, b"boom\x1b[31m"
    job_id = lab.submit(notify=["end"])
    lab.run(job_id)
    lab.end(job_id, 0)
    assert lab.outbox.step("webhook") == 5.0  # the first retry, 5 s on
    clock.now += 4.0
    assert lab.outbox.step("webhook") == pytest.approx(1.0)  # not due yet: nothing sent
    assert webhook.refused == 1
    clock.now += 1.0
    assert lab.outbox.step("webhook") == 10.0  # doubling
    status = lab.status("webhook")
    assert status["failing"] and status["queued"] == 1 and status["last_error"] == "the webhook answered HTTP 500: " \
        "boom\\x1b[31m"
    clock.now += 86400.0
    lab.outbox.step("webhook")
    gone = lab.status("webhook")
    assert (gone["queued"], gone["given_up"], webhook.refused) == (0, 1, 3)
    assert gone["last_given_up"]["key"] == f"job-{job_id}.end.webhook" and gone["last_given_up"]["user"] == "alice"
    assert gone["last_given_up"]["error"] == "the webhook answered HTTP 500: boom\\x1b[31m"
    lab.restart()  # what was given up is gone from the outbox, and the count stays
    again = lab.status("webhook")
    assert (again["queued"], again["given_up"], again["last_given_up"]) == (0, 1, gone["last_given_up"])


def test_the_outbox_outlives_a_restart(labs, webhook):
    lab = labs(NotifyConfig(webhook_url=webhook.url), threads=False)  # nothing delivers before the restart
    job_id = lab.submit(notify=["end"])
    lab.run(job_id)
    lab.end(job_id, 0)
    assert lab.status("webhook")["queued"] == 1
    lab.threads = True
    lab.restart()
    [posted] = webhook.wait_for(1)
    assert posted["labq"]["key"] == f"job-{job_id}.end"
    lab.restart()  # a leader that stops writes down what it delivered: nothing is sent twice
    assert not lab.outbox.lines["webhook"].pending and webhook.bodies == [posted]


# -- settings and refusals -----------------------------------------------------------------------

def test_users_set_their_own_defaults_and_admins_anyones(labs, webhook):
    lab = labs(NotifyConfig(webhook_url=webhook.url))
    mine = lab.ok("PUT", "/v1/notify", {"on": ["fail", "end", "fail"], "email": "alice@lab.org"}, token="alice")
    assert (mine["on"], mine["email"]) == (["end", "fail"], "alice@lab.org")
    _, _, refused = lab.lb.request("PUT", "/v1/notify", {"user": "alice", "on": ["start"]}, token=lab.tokens["bob"])
    assert refused["error"]["code"] == "forbidden" and "another user's" in refused["error"]["message"]
    assert lab.lb.request("GET", "/v1/notify?user=alice", token=lab.tokens["bob"])[0] == 403
    by_admin = lab.ok("PUT", "/v1/notify", {"user": "alice", "on": ["preempt"], "email": ""})
    assert (by_admin["on"], by_admin["email"]) == (["preempt"], None)
    assert lab.ok("GET", "/v1/notify", token="alice")["on"] == ["preempt"]
    lab.tokens["alice"] = lab.ok("POST", "/v1/users", {"name": "alice"}, status=201)["token"]  # keeps her settings
    assert lab.ok("GET", "/v1/notify?user=alice")["on"] == ["preempt"]
    for body, field in (({"email": "alice@lab.org\nBcc: eve@x.org"}, "email"), ({"email": "alice"}, "email"),
                        ({"on": ["ends"]}, "on"), ({"on": "end"}, "on"), ({}, "on"), ({"webhook": 1}, "webhook")):
        status, _, doc = lab.lb.request("PUT", "/v1/notify", body, token=lab.tokens["alice"])
        assert (status, doc["error"]["field"]) == (400, field), (body, doc)


@pytest.mark.parametrize(("value", "words"), [
    (["ends"], "notify: 'ends' is not one of start, end, fail, preempt"),
    (["reservation"], "'reservation' is not one of start, end, fail, preempt"),
    ("end", "notify must be a list of start, end, fail, preempt"),
    ([1], "notify: 1 is not one of"),
])
def test_a_submit_with_a_bad_notify_is_a_clear_400(labs, webhook, value, words):
    lab = labs(NotifyConfig(webhook_url=webhook.url))
    status, _, doc = lab.lb.request("POST", "/v1/jobs", {"command": ["x"], "notify": value}, token=lab.tokens["alice"])
    assert (status, doc["error"]["code"], doc["error"]["field"]) == (400, "bad_request", "notify")
    assert words in doc["error"]["message"]


def test_labq_submit_refuses_a_bad_notify_before_asking_the_leader(capsys):
    assert main(["submit", "--leader", "http://127.0.0.1:1", "--notify", "end,finish", "--", "true"]) == 2
    assert capsys.readouterr().err == ("labq: error: --notify 'finish' is not a moment of a job: use start, end, "
                                       "fail, preempt (several with commas: end,fail), or none\n")


def test_labq_notify_refuses_a_bad_moment_before_asking_the_leader(capsys):
    assert main(["notify", "--leader", "http://127.0.0.1:1", "--on", "end,finsh"]) == 2
    assert capsys.readouterr().err == ("labq: error: --on 'finsh' is not a moment: use start, end, fail, preempt, "
                                       "reservation (several with commas), or none\n")


def main_output(lab: Lab, argv: list[str], token: str = "admin") -> str:
    """``labq ARGV`` run in this process against the lab, as ``token``'s person: what it printed."""
    import contextlib
    import io
    import os

    out = io.StringIO()
    env = {"LABQ_TOKEN": lab.tokens[token], "LABQ_LEADER": f"http://127.0.0.1:{lab.lb.port}"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with contextlib.redirect_stdout(out):
            assert main(argv) == 0
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out.getvalue()


def test_labq_notify_shows_and_changes_ones_own(labs, webhook):
    lab = labs(NotifyConfig(webhook_url=webhook.url))
    assert main_output(lab, ["notify", "--on", "end,fail", "--email", "alice@lab.org"], "alice") == (
        "alice is told of: end, fail (for jobs submitted without --notify)\ne-mail: alice@lab.org\n"
        "the lab's webhook: yes\nthe lab's channels: webhook; and labq ls --watch\n"
        "note: this lab sends no e-mail (the admin sets [notify.email] in leader.toml)\n")
    assert json.loads(main_output(lab, ["notify", "--json"], "alice"))["on"] == ["end", "fail"]


# -- reservations and terminals --------------------------------------------------------------------

def test_a_reservations_owner_hears_of_its_start_and_end(labs, webhook):
    clock = Clock()
    lab = labs(NotifyConfig(webhook_url=webhook.url), clock=clock)
    lab.ok("PUT", "/v1/notify", {"on": ["reservation"]}, token="alice")
    start = clock.now + 3600
    lab.ok("POST", "/v1/reservations", {"name": "paper", "gpus": 1, "start": start, "end": start + 7200},
           token="alice", status=201)
    lab.lb.leader.scheduling.tick()
    clock.now = start + 1
    lab.lb.leader.scheduling.tick()
    lab.lb.leader.scheduling.tick()  # told once
    [started] = webhook.wait_for(1)
    assert started["text"] == "alice: reservation `paper` (1 GPU on n1) has started"
    clock.now = start + 7200
    lab.lb.leader.scheduling.tick()
    _, ended = webhook.wait_for(2)
    assert ended["text"] == "alice: reservation `paper` (1 GPU on n1) has ended"
    assert ended["labq"]["reservation"] == "paper" and ended["labq"]["key"] == f"reservation-paper.{start:.0f}.ended"
    lab.wait_status("webhook", lambda s: s["queued"] == 0, "idle")
    assert len(webhook.bodies) == 2


def test_the_notify_event_reaches_its_owners_stream_alone(labs, webhook):
    lab = labs(NotifyConfig(webhook_url=webhook.url))
    url = f"http://127.0.0.1:{lab.lb.port}"
    hub = lab.lb.leader.state.events
    after = hub.seq
    job_id = lab.submit(name="bert", notify=["end"])
    lab.run(job_id)
    lab.end(job_id, 0)
    hub.publish("job", {"marker": True})  # the end of what each stream is read to

    def read(user: str) -> list[dict]:
        with Client(url, lab.tokens[user], timeout=10) as client:
            stream = client.events(after=after)
            seen = []
            for event in stream:
                seen.append(event)
                if event["data"].get("marker"):
                    stream.close()
                    return seen
        raise AssertionError("the stream ended early")

    mine = [e["data"] for e in read("alice") if e["event"] == "notify"]
    assert mine == [{"user": "alice", "event": "end", "text": f"alice: job {job_id} (bert) succeeded on n1",
                     "key": f"job-{job_id}.end", "job_id": job_id}]
    assert [e for e in read("bob") if e["event"] == "notify"] == []
