"""A job's environment values are its owner's (and the admins'): secrets live there (API keys), so another
user who lists or shows the job sees the names, not the values. A real leader on loopback."""

from __future__ import annotations

import json

import pytest

from tests.leader.loopback_leader import start_loopback_leader

pytestmark = pytest.mark.timeout(60)
SECRET = "wandb-s3cret-9f1e"


@pytest.fixture
def lab(tmp_path):
    lb = start_loopback_leader(tmp_path / "leader")
    yield lb
    lb.stop()


def raw(lab, path: str, token: str) -> bytes:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", lab.port, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        answer = conn.getresponse()
        assert answer.status == 200
        return answer.read()
    finally:
        conn.close()


def test_another_user_sees_the_names_of_a_jobs_environment_and_not_its_values(lab):
    tokens = {}
    for user in ("alice", "bob"):
        tokens[user] = lab.request("POST", "/v1/users", {"name": user})[2]["token"]
    status, _, doc = lab.request("POST", "/v1/jobs", {"command": ["train"], "env": {"WANDB_API_KEY": SECRET,
                                                                                    "SEED": "1"}},
                                 token=tokens["alice"])
    assert status == 201 and doc["job"]["spec"]["env"]["WANDB_API_KEY"] == SECRET  # her own answer
    job = doc["job"]["id"]
    for path in (f"/v1/jobs/{job}", "/v1/jobs?all=1", f"/v1/jobs?id={job}"):
        bobs = raw(lab, path, tokens["bob"])
        assert SECRET.encode() not in bobs, path
        seen = json.loads(bobs)
        spec = (seen["job"] if "job" in seen else seen["jobs"][0])["spec"]
        assert spec["env"] == {"WANDB_API_KEY": "(hidden)", "SEED": "(hidden)"}, path
        for owner in (tokens["alice"], lab.admin_token):  # the owner and the admins see it whole
            assert SECRET.encode() in raw(lab, path, owner), path
    # the cached text of one viewer is never served to another
    assert SECRET.encode() not in raw(lab, "/v1/jobs?all=1", tokens["bob"])
    assert SECRET.encode() in raw(lab, "/v1/jobs?all=1", tokens["alice"])
