"""The audit trail end to end: a real TLS lab; who did what to which job, from where and how, read back with
``labq events`` by an admin and by a user; nothing secret written, nothing unescaped printed."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request

import pytest

from tests.e2e.conftest import TEST_CONFIG, Lab

pytestmark = pytest.mark.timeout(120)

TLS_CONFIG = TEST_CONFIG.replace('listen = "127.0.0.1:0"\n', 'listen = "127.0.0.1:0"\ntls = "on"\n')
SECRET = "audit-env-secret-71c4"


@pytest.fixture
def lab(tmp_path):
    made = Lab(tmp_path / "lab", TLS_CONFIG)
    yield made
    made.close()


def labq(lab: Lab, *args: str, token: str | None = None) -> subprocess.CompletedProcess:
    """``labq ARGS`` as the admin, or with ``token`` (and the lab's pin) as its user."""
    if token is None:
        return lab.labq(*args, check=False)
    pin = tomllib.loads((lab.home / ".config" / "labq" / "credentials").read_text())["pin"]
    return subprocess.run([sys.executable, "-m", "labq.cli", *args], capture_output=True, text=True, timeout=60,
                          env=lab.env(LABQ_TOKEN=token, LABQ_LEADER=lab.url, LABQ_PIN=pin))


def events(lab: Lab, *args: str, token: str | None = None) -> list[dict]:
    out = labq(lab, "events", "--json", *args, token=token)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def submit(lab: Lab, *command: str, token: str | None = None, env: str | None = None) -> int:
    out = labq(lab, "submit", "--json", *(["--env", env] if env else []), "--", *command, token=token)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["id"]


def test_who_did_what_to_which_job_from_where_and_how(lab):
    lab.start_leader()
    folder = lab.data / "agents" / "ws1"
    folder.mkdir(parents=True)
    (folder / "user-map.toml").write_text('[users]\nbob = "nobody"\n')  # bob has no account of his own here
    lab.start_agent()
    admin = tomllib.loads((lab.home / ".config" / "labq" / "credentials").read_text())
    bob = lab.labq("admin", "user", "add", "bob", "--print").stdout.split("--token ")[1].split()[0]
    bobs_job = submit(lab, "sleep", "60", token=bob, env=f"KEY={SECRET}")
    mine = submit(lab, "sleep", "60")
    refused = labq(lab, "cancel", str(mine), token=bob)
    assert refused.returncode == 1, refused.stderr
    lab.labq("cancel", str(bobs_job))

    seen = events(lab)
    by_action = {(e["action"], e.get("job")): e for e in seen}
    joined = next(e for e in seen if e["action"] == "join")
    assert joined["kind"] == "join" and joined["target"] == "ws1" and joined["status"] == 200
    added = next(e for e in seen if e["action"] == "add user")
    assert added["user"] == "root" and added["target"] == "bob" and added["from"] == "127.0.0.1"
    submitted = by_action[("submit", bobs_job)]
    assert submitted["user"] == "bob" and submitted["owner"] == "bob" and submitted["status"] == 201
    assert submitted["token"] and submitted["token"] != added.get("token")  # which of bob's tokens
    attempt = by_action[("cancel", mine)]
    assert attempt["user"] == "bob" and attempt["status"] == 403 and "belongs to" in attempt["error"]
    cancelled = by_action[("cancel", bobs_job)]
    assert cancelled["user"] == "root" and cancelled["owner"] == "bob" and cancelled["status"] == 200
    assert [e["seq"] for e in seen] == sorted(e["seq"] for e in seen)

    # bob sees what he did and what was done to his jobs, nothing else
    his = events(lab, "--since", "1d", token=bob)
    assert {(e["action"], e.get("job")) for e in his if e["kind"] != "lab"} == {
        ("submit", bobs_job), ("cancel", mine), ("cancel", bobs_job)}
    # and the lab's own steps of his job (its placement at least; its end once the agent reports it), of no other
    lab_steps = [e for e in his if e["kind"] == "lab"]
    assert {e["job"] for e in lab_steps} == {bobs_job} and all(e["owner"] == "bob" for e in lab_steps)
    assert "placed" in [e["action"] for e in lab_steps]
    assert set(e["action"] for e in lab_steps) <= {"placed", "started", "cancelled"}
    assert labq(lab, "events", "--user", "root", token=bob).returncode == 1
    assert [e["job"] for e in events(lab, "--job", str(bobs_job), "--kind", "user")] == [bobs_job, bobs_job]
    assert [e["action"] for e in events(lab, "--user", "bob", "--action", "submit")] == ["submit"]

    text = lab.labq("events", "--job", str(mine)).stdout
    assert f"bob (token {submitted['token']}) from 127.0.0.1  cancel job {mine}  refused (403)" in text

    trail = (lab.data / "audit.jsonl").read_text()
    assert SECRET not in trail and bob not in trail and admin["token"] not in trail  # no body, no token
    for daemon in ("leader.log", "agent-ws1.log"):  # nor do the daemons' logs
        text = (lab.root / daemon).read_text()
        assert SECRET not in text and bob not in text and admin["token"] not in text, daemon


def test_what_a_caller_put_in_a_path_is_printed_escaped(lab):
    lab.start_leader()
    admin = tomllib.loads((lab.home / ".config" / "labq" / "credentials").read_text())
    context = ssl.create_default_context(cadata=(lab.data / "tls" / "ca.pem").read_text())
    context.check_hostname = False
    request = urllib.request.Request(f"{lab.url}/v1/users/%1b%5b2J%1b%5b31mevil", method="DELETE",
                                     headers={"Authorization": f"Bearer {admin['token']}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, context=context, timeout=10)
    assert refused.value.code == 400
    out = subprocess.run([sys.executable, "-m", "labq.cli", "events", "--action", "remove user"],
                         capture_output=True, text=True, env=lab.env(), timeout=60)
    assert out.returncode == 0 and "remove user" in out.stdout and "refused (400)" in out.stdout, out
    assert "\x1b" not in out.stdout and "\\x1b" in out.stdout
