"""The job commands and the HTTP client, tested without a leader.

Parsing is tested as tables; the client and the CLI as real code against real sockets:
a closed port on 127.0.0.1 for "unreachable", and a tiny ``http.server`` on 127.0.0.1
that answers canned responses (the API's shapes, built with ``labq.protocol.codec``).
"""

from __future__ import annotations

import json
import re
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from labq.cli import _parser
from labq.cli.common import parse_duration, parse_ids, parse_size_mib
from labq.cli.errors import CliError, exit_code
from labq.cli.common import FINISHED, STATES
from labq.cli.jobs import build_submit_body
from labq.client import Client, parse_event_stream
from labq.credentials import credentials_path, load_credentials, save_credentials
from labq.http_server import serve_app
from labq.models import JobState, Node
from labq.protocol.codec import encode_job, encode_node
from labq.protocol.errors import ApiError
from labq.protocol.requests import parse_submit
from labq.render import estimate_text, jobs_table, show_text, why_text
from labq.transport import Request, Response

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_000_000.0


# -- durations and sizes --------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "seconds"), [
    ("90m", 5400), ("2h", 7200), ("1d", 86400), ("45s", 45), ("1h30m", 5400), ("1:30:00", 5400),
    ("36:00:00", 129600), ("1.5h", 5400), ("2H", 7200), (" 10m ", 600), ("1d 2h", 93600),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["3 hours", "90", "", "h", "1:30", "1:60:00", "2x", "-5m", "1h-30m"])
def test_a_bad_duration_says_what_works(text):
    with pytest.raises(CliError, match=r"--time: .* is not a duration: use 90m, 2h, 1d or H:MM:SS"):
        parse_duration(text)


def test_grace_takes_bare_seconds_but_time_does_not():
    assert parse_duration("60", "--grace", bare_seconds=True) == 60
    assert parse_duration("2m", "--grace", bare_seconds=True) == 120
    with pytest.raises(CliError, match="--grace: 'soon'"):
        parse_duration("soon", "--grace", bare_seconds=True)


@pytest.mark.parametrize(("text", "mib"), [
    ("40G", 40960), ("40", 40960), ("24GiB", 24576), ("24gb", 24576), ("8000M", 8000), ("8000MiB", 8000),
    ("7.5G", 7680), ("1T", 1048576), ("512m", 512),
])
def test_sizes_in_mib(text, mib):
    assert parse_size_mib(text) == mib


@pytest.mark.parametrize("text", ["forty", "40X", "G", "", "-1G", "40 gigs"])
def test_a_bad_size_says_what_works(text):
    with pytest.raises(CliError, match="--gpu-mem: .* is not a size: use 40G, 24GiB or 8000M"):
        parse_size_mib(text)


def test_job_ids_take_spaces_and_commas():
    assert parse_ids(["12", "13,14"]) == [12, 13, 14]
    with pytest.raises(CliError, match="'x' is not a job id"):
        parse_ids(["12,x"])


# -- labq submit: arguments to the request body ---------------------------------------------------

def submit_body(*argv: str, environ: dict | None = None) -> dict:
    args = _parser().parse_args(["submit", *argv])
    return build_submit_body(args, environ=environ or {}, cwd="/home/alice/proj")


@pytest.mark.parametrize(("argv", "expected"), [
    (["--", "python", "train.py"], {"command": ["python", "train.py"], "gpus": 1, "workdir": "/home/alice/proj"}),
    (["python", "train.py", "--gpus", "3"], {"command": ["python", "train.py", "--gpus", "3"], "gpus": 1,
                                             "workdir": "/home/alice/proj"}),
    (["--gpus", "2", "--gpu-mem", "40G", "--gpu-model", "A100", "--", "x"],
     {"gpus": 2, "min_gpu_memory_mib": 40960, "gpu_model": "A100"}),
    (["--class", "high", "--", "x"], {"priority": "high"}),
    (["--priority", "250", "--", "x"], {"priority": 250}),
    (["--priority", "Urgent", "--", "x"], {"priority": "urgent"}),
    (["--time", "1:30:00", "--grace", "90s", "--", "x"], {"time_limit_s": 5400, "grace_s": 90}),
    (["--name", "bert", "--no-preempt", "--", "x"], {"name": "bert", "preemptible": False}),
    (["--time", "6h", "--requeue-on-timeout", "--", "x"], {"time_limit_s": 21600, "requeue_on_timeout": True}),
    (["--env", "A=1", "--env", "B=x=y", "--env", "HOME", "--", "x"],
     {"env": {"A": "1", "B": "x=y", "HOME": "/home/alice"}}),
    (["--workdir", "data", "--", "x"], {"workdir": "/home/alice/proj/data"}),
    (["--workdir", "/scratch/run", "--", "x"], {"workdir": "/scratch/run"}),
    (["--after", "3,4", "--after", "7", "--", "x"], {"depends_on": [3, 4, 7]}),
    (["--gpus", "4", "--nodes", "2", "--node", "ws1", "--", "x"], {"gpus": 4, "nodes": 2, "node": "ws1"}),
    (["--checkpoint-signal", "usr2", "--", "x"], {"checkpoint_signal": "SIGUSR2"}),
    (["--", "--weird-program", "-v"], {"command": ["--weird-program", "-v"]}),
    (["--reservation", "paper", "--after-reservation", "cancel", "--", "x"],
     {"reservation": "paper", "after_reservation": "cancel"}),
])
def test_submit_arguments_become_the_request_body(argv, expected):
    body = submit_body(*argv, environ={"HOME": "/home/alice"})
    assert {k: body[k] for k in expected} == expected
    parse_submit(body).spec_for("alice")  # the leader's own validator takes it


def test_submit_sends_only_what_was_chosen():
    assert submit_body("--", "x") == {"command": ["x"], "gpus": 1, "workdir": "/home/alice/proj"}


@pytest.mark.parametrize(("argv", "words"), [
    ([], "name the command to run after --"),
    (["--"], "name the command to run after --"),
    (["--gpus", "0", "--", "x"], "--gpus must be 1 or more"),
    (["--time", "3 hours", "--", "x"], "--time: '3 hours' is not a duration"),
    (["--time", "0m", "--", "x"], "--time must be longer than 0"),
    (["--requeue-on-timeout", "--", "x"], "--requeue-on-timeout needs --time"),
    (["--gpu-mem", "lots", "--", "x"], "--gpu-mem: 'lots' is not a size"),
    (["--priority", "9000", "--", "x"], "out of range 0-1000"),
    (["--env", "NOPE", "--", "x"], "--env NOPE: NOPE is not set in this shell"),
    (["--after", "a", "--", "x"], "'a' is not a job id"),
    (["--gpus", "3", "--nodes", "2", "--", "x"], "must split evenly"),
    (["--nodes", "0", "--", "x"], "must split evenly"),
    (["--checkpoint-signal", "KILL", "--", "x"], "not a signal a job can catch"),
    (["--after-reservation", "cancel", "--", "x"], "give --reservation NAME too"),
])
def test_bad_submit_arguments_are_refused_before_any_request(argv, words):
    with pytest.raises(CliError, match=words):
        submit_body(*argv)


def test_the_cli_knows_every_job_state():
    assert tuple(s.value for s in JobState) == STATES
    assert {s.value for s in JobState if s.finished} == FINISHED


def test_class_and_priority_are_exclusive():
    out = labq("submit", "--class", "high", "--priority", "3", "--", "x")
    assert out.returncode == 2 and "not allowed with argument" in out.stderr


# -- credentials ----------------------------------------------------------------------------------

@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    for name in ("LABQ_LEADER", "LABQ_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def test_credentials_round_trip_with_private_permissions(home):
    path = save_credentials("gpu1:7733", 'tok"en\\with\nodd', owner_uid=None)
    assert path == home / ".config" / "labq" / "credentials" == credentials_path()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_credentials() == {"leader": "http://gpu1:7733", "token": 'tok"en\\with\nodd'}
    save_credentials("http://gpu2:7733/", "second")
    assert load_credentials() == {"leader": "http://gpu2:7733", "token": "second"}
    assert [p.name for p in path.parent.iterdir()] == ["credentials"]  # no temp file left behind
    client = Client.from_environment()
    assert (client.url, client.token) == ("http://gpu2:7733", "second")


def test_xdg_config_home_and_environment_win(home, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    save_credentials("http://gpu1:7733", "from-file")
    assert (tmp_path / "xdg" / "labq" / "credentials").is_file()
    monkeypatch.setenv("LABQ_TOKEN", "from-env")
    client = Client.from_environment()
    assert (client.url, client.token) == ("http://gpu1:7733", "from-env")
    monkeypatch.setenv("LABQ_LEADER", "http://gpu9:1")
    assert Client.from_environment().url == "http://gpu9:1"
    assert Client.from_environment(leader="gpu3:7733").url == "http://gpu3:7733"


@pytest.fixture
def nobody_home():
    """A home folder in /tmp owned by ``nobody``, as root would find another user's."""
    if os.geteuid() != 0:
        pytest.skip("writing credentials for another user needs root")
    folder = Path(tempfile.mkdtemp(prefix="labq-nobody-", dir="/tmp"))
    os.chown(folder, 65534, 65534)
    yield folder
    shutil.rmtree(folder)


def test_root_writes_another_users_credentials_as_that_user(nobody_home):
    path = save_credentials("http://gpu1:7733", "bobs", nobody_home / ".config/labq/credentials", 65534, 65534)
    for p, mode in ((path, 0o600), (path.parent, 0o700)):
        st = p.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, mode)
    assert stat.S_IMODE((nobody_home / ".config").stat().st_mode) & 0o022 == 0
    assert load_credentials(path) == {"leader": "http://gpu1:7733", "token": "bobs"}


def test_a_planted_symlink_cannot_aim_roots_write(nobody_home, tmp_path):
    secret = tmp_path / "root-only"
    secret.mkdir(mode=0o700)
    (nobody_home / ".config").symlink_to(secret)
    with pytest.raises(ApiError, match="could not write .* as uid 65534: .*Permission denied"):
        save_credentials("http://gpu1:7733", "t", nobody_home / ".config/labq/credentials", 65534, 65534)
    assert list(secret.iterdir()) == []


def test_credentials_for_another_home_ignore_our_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert credentials_path("/home/bob") == Path("/home/bob/.config/labq/credentials")


def test_no_credentials_says_how_to_get_them(home):
    with pytest.raises(ApiError) as caught:
        Client.from_environment()
    assert caught.value.code == "no_credentials" and exit_code(caught.value) == 3
    assert "labq admin user add" in str(caught.value) and "labq up" in str(caught.value)


def test_a_broken_credentials_file_is_named(home):
    path = credentials_path()
    path.parent.mkdir(parents=True)
    path.write_text("leader = \n")
    with pytest.raises(ApiError, match=f"cannot read {path}"):
        Client.from_environment()


# -- the wire: a closed port and a tiny real server -----------------------------------------------

def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def labq(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("LABQ_")} | (env or {})
    return subprocess.run([sys.executable, "-m", "labq.cli", *args], capture_output=True, text=True, timeout=60,
                          env=full, cwd=ROOT)


def test_a_closed_port_is_unreachable():
    port = closed_port()
    with pytest.raises(ApiError) as caught:
        Client(f"http://127.0.0.1:{port}", "t").whoami()
    assert (caught.value.status, caught.value.code) == (0, "unreachable")
    assert f"cannot reach the leader at http://127.0.0.1:{port}" in str(caught.value)
    out = labq("ls", env={"LABQ_LEADER": f"http://127.0.0.1:{port}", "LABQ_TOKEN": "t"})
    assert out.returncode == 4
    assert out.stderr.startswith("labq: error: cannot reach the leader") and "Traceback" not in out.stderr


class FakeLeader:
    """Canned answers by (method, path); records every request it gets."""

    def __init__(self) -> None:
        #: an answer, or a function of the query that returns one
        self.routes: dict[tuple[str, str], tuple[int, dict, bytes] | Callable] = {}
        self.requests: list[dict] = []
        self.server = serve_app(self._answer, ("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _answer(self, request: Request) -> Response:
        """The app the shared server helper serves: record the request, answer from ``routes``."""
        self.requests.append({"method": request.method, "path": request.path, "query": request.query,
                              "auth": request.header("Authorization"),
                              "body": json.loads(request.body) if request.body else None})
        route = self.routes.get((request.method, request.path),
                                (404, {}, b'{"error": {"code": "not_found", "message": "no route"}}'))
        status, headers, body = route(request.query) if callable(route) else route
        headers = {"Content-Type": "application/json"} | headers
        return Response(status, {k: v for k, v in headers.items() if v is not None}, body)

    def json(self, method: str, path: str, answer: object, status: int = 200) -> None:
        self.routes[(method, path)] = (status, {}, json.dumps(answer).encode())

    def error(self, method: str, path: str, status: int, code: str, message: str) -> None:
        self.json(method, path, {"error": {"code": code, "message": message}}, status)

    def env(self) -> dict:
        return {"LABQ_LEADER": self.url, "LABQ_TOKEN": "secret"}


@pytest.fixture
def leader():
    fake = FakeLeader()
    fake.thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()
    fake.thread.join(5)
    assert not fake.thread.is_alive()


STREAM = (b": connected\n\n"
          b"id: 7\nevent: job\ndata: {\"job_id\": 12, \"state\": \"running\"}\n\n"
          b": keepalive\n\n"
          b"id: 8\r\nevent: node\r\ndata: {\"node\":\r\ndata:  \"ws1\"}\r\n\r\n"
          b"id: 9\ndata: not json\n\n"
          b"event: job\n")  # an unfinished event at the end is dropped


def test_events_parse_a_real_event_stream(leader):
    leader.routes[("GET", "/v1/events")] = (200, {"Content-Type": "text/event-stream", "Content-Length": None},
                                            STREAM)
    events = list(Client(leader.url, "secret").events(after=6))
    assert events == [{"id": 7, "event": "job", "data": {"job_id": 12, "state": "running"}},
                      {"id": 8, "event": "node", "data": {"node": "ws1"}},
                      {"id": 9, "event": "message", "data": "not json"}]
    assert leader.requests[0]["query"] == {"after": ["6"]} and leader.requests[0]["auth"] == "Bearer secret"


def test_event_stream_parser_follows_the_spec():
    lines = ["data:a", "data: b", ":comment", "", "id", "data", "", "retry: 5", "event:x", "data:{}", ""]
    assert list(parse_event_stream(lines)) == [{"id": None, "event": "message", "data": "a\nb"},
                                               {"id": "", "event": "message", "data": ""},
                                               {"id": "", "event": "x", "data": {}}]


def test_a_4xx_answer_becomes_the_leaders_api_error(leader):
    leader.json("POST", "/v1/jobs/5/actions", {"error": {"code": "conflict", "message": "job 5 already ended",
                                                         "field": "action"}}, 409)
    with pytest.raises(ApiError) as caught:
        Client(leader.url, "secret").action(5, "hold")
    assert caught.value == ApiError(409, "conflict", "job 5 already ended", "action")
    assert leader.requests[0]["body"] == {"action": "hold"}


def test_an_answer_without_an_error_body_still_fails_clearly(leader):
    leader.routes[("GET", "/v1/whoami")] = (502, {"Content-Type": "text/html"}, b"<h1>Bad Gateway</h1>")
    with pytest.raises(ApiError) as caught:
        Client(leader.url, "secret").whoami()
    assert (caught.value.status, caught.value.code) == (502, "bad_response")


def test_queries_and_log_offsets(leader):
    leader.json("GET", "/v1/jobs", {"jobs": []})
    leader.routes[("GET", "/v1/jobs/3/logs")] = (200, {"Content-Type": "text/plain", "X-Labq-Offset": "105",
                                                       "X-Labq-Done": "1"}, b"epoch 1\n")
    client = Client(leader.url + "/", "secret")
    assert client.jobs(user="bob", states=("queued", "held"), all=True, history=True, limit=5) == []
    assert leader.requests[0]["query"] == {"user": ["bob"], "state": ["queued", "held"], "all": ["1"],
                                           "history": ["1"], "limit": ["5"]}
    assert client.logs(3, attempt=2, offset=97) == (b"epoch 1\n", 105, True)
    assert leader.requests[1]["query"] == {"offset": ["97"], "attempt": ["2"]}


# -- the CLI against the tiny server --------------------------------------------------------------

def sample_jobs(jobs, node: Node) -> list[dict]:
    running = jobs.running(node, (0, 1), user="bob", name="bert", priority=300, started_at=NOW - 3700)
    queued = jobs.queued(2, user="alice", submitted_at=NOW - 300, depends_on=(running.id,))
    failed = jobs.queued(1, user="alice", state=JobState.FAILED).evolve(exit_code=3, started_at=NOW - 50,
                                                                        ended_at=NOW - 20)
    return [encode_job(j) for j in (running, queued, failed)]


@pytest.fixture
def node() -> Node:
    from tests.conftest import make_node

    return make_node("ws1", "sim:ws-4x3090")


def test_ls_table_and_json(leader, jobs, node):
    docs = sample_jobs(jobs, node)
    leader.json("GET", "/v1/jobs", {"jobs": docs})
    table = jobs_table(docs, NOW).splitlines()
    assert table[0].split() == ["ID", "NAME", "USER", "STATE", "CLASS", "GPUS", "NODE:GPUS", "AGE/RUNTIME", "REASON"]
    assert table[1].split() == ["1", "bert", "bob", "running", "high", "2", "ws1:0,1", "1h01m"]
    assert table[2].split() == ["2", "train", "alice", "queued", "normal", "2", "-", "5m", "after", "1"]
    assert table[3].split()[3:] == ["failed", "normal", "1", "-", "30s", "exit", "3"]
    out = labq("ls", "--all", "--json", env=leader.env())
    assert out.returncode == 0 and json.loads(out.stdout) == docs
    assert leader.requests[0]["query"] == {"all": ["1"], "pending": ["1"]}
    out = labq("ls", "--state", "running,queued", env=leader.env())
    assert out.returncode == 0 and "ws1:0,1" in out.stdout
    assert leader.requests[1]["query"] == {"state": ["running", "queued"], "pending": ["1"], "after": ["0"],
                                           "limit": ["100"]}  # the table: its first page


def test_actions_report_per_job_and_exit_1_on_partial_failure(leader, jobs):
    held = encode_job(jobs.queued(state=JobState.HELD))
    leader.json("POST", "/v1/jobs/1/actions", {"job": held})
    leader.error("POST", "/v1/jobs/2/actions", 409, "conflict", "job 2 has already ended")
    out = labq("hold", "1", "2", env=leader.env())
    assert out.returncode == 1
    assert out.stdout == "job 1: held\n"
    assert out.stderr == "labq: error: job 2: job 2 has already ended\n"
    out = labq("hold", "2", env=leader.env())
    assert out.returncode == 1


@pytest.mark.parametrize(("status", "code", "exit_status"), [
    (400, "bad_request", 2), (422, "unprocessable", 2), (401, "unauthorized", 3), (403, "forbidden", 1),
    (503, "unavailable", 1), (500, "internal", 1),
])
def test_submit_exit_codes(leader, status, code, exit_status):
    leader.error("POST", "/v1/jobs", status, code, f"the leader says {code}")
    out = labq("submit", "--gpus", "2", "--", "python", "train.py", env=leader.env())
    assert out.returncode == exit_status
    assert out.stderr == f"labq: error: the leader says {code}\n"
    assert leader.requests[0]["body"]["command"] == ["python", "train.py"]


def test_submit_prints_the_new_job(leader, jobs):
    job = encode_job(jobs.queued(name="bert"))
    leader.json("POST", "/v1/jobs", {"job": job}, 201)
    out = labq("submit", "--name", "bert", "--", "x", env=leader.env())
    assert (out.returncode, out.stdout) == (0, "submitted job 1 (bert)\n")


def test_admin_user_add_saves_your_own_token_and_prints_anyone_elses(leader, tmp_path):
    leader.json("POST", "/v1/users", {"user": {"name": "someone", "admin": False}, "token": "tok-1"}, 201)
    env = leader.env() | {"HOME": str(tmp_path), "XDG_CONFIG_HOME": ""}
    me = pwd.getpwuid(os.getuid()).pw_name
    path = tmp_path / ".config/labq/credentials"
    out = labq("admin", "user", "add", me, env=env)
    assert out.returncode == 0 and f"saved the token to {path}" in out.stdout
    assert load_credentials(path) == {"leader": leader.url, "token": "tok-1"}
    assert leader.requests[-1]["body"] == {"name": me, "admin": False}
    path.unlink()
    for argv in ([me, "--print"], ["no-such-account-here", "--admin"]):
        out = labq("admin", "user", "add", *argv, env=env)
        assert out.returncode == 0 and f'leader = "{leader.url}"\ntoken = "tok-1"\n' in out.stdout
        assert not path.exists()
    assert leader.requests[-1]["body"] == {"name": "no-such-account-here", "admin": True}
    if os.geteuid() == 0:  # nobody's home, /nonexistent, cannot be made: the token is printed, not lost
        out = labq("admin", "user", "add", "nobody", env=env)
        assert out.returncode == 0 and "could not save the token" in out.stderr and "tok-1" in out.stdout


def test_why_says_the_reason_and_the_estimate(jobs):
    job = encode_job(jobs.queued())
    pending = {"reason": "Resources", "detail": "2 GPUs asked, 1 free", "waiting_for": None,
               "estimated_start": NOW + 2400}
    text = why_text(job, pending, NOW)
    assert text.startswith("job 1 waits: Resources: 2 GPUs asked, 1 free\n  starts in about 40m (est. ")
    assert estimate_text(None, NOW) == ""
    assert why_text(job, None, NOW) == "job 1 is queued; the scheduler has not placed it yet"


def test_show_names_the_gpus_by_uuid_and_the_estimate(jobs, node):
    running = encode_job(jobs.running(node, (2, 3), name="bert", time_limit_s=7200, started_at=NOW - 600))
    text = show_text(running, None, NOW)
    assert text.startswith("job 1 (bert): running, attempt 1\n")
    assert "  placement   ws1: GPU 2 SIM-ws1-ws-4x3090-2, 3 SIM-ws1-ws-4x3090-3" in text
    assert "  stops at    " in text and "(in 1h50m)" in text and "ended" not in text
    queued = encode_job(jobs.queued(min_gpu_memory_mib=40960, gpu_model="A100", env=(("K", "v"),)))
    pending = {"reason": "Resources", "detail": "no A100 is free", "waiting_for": None, "estimated_start": NOW + 90}
    text = show_text(queued, pending, NOW)
    assert "  wants       1 GPU(s), at least 40 GiB each, model A100\n" in text
    assert "  pending     Resources: no A100 is free\n  estimate    starts in about 1m (est. " in text
    assert text.endswith("  env         K=v")


def test_nodes_and_gpus_say_who_is_on_each_gpu(leader, jobs, node):
    doc = encode_node(node) | {"gpus_in_use": {"0": 1, "1": 1}, "last_seen": 0}
    doc["unmanaged_busy"] = [3]
    running = jobs.running(node, (0, 1), user="bob")
    leader.json("GET", "/v1/nodes", {"nodes": [doc]})
    leader.json("GET", "/v1/jobs", {"jobs": [encode_job(running)]})
    out = labq("gpus", env=leader.env())
    assert out.returncode == 0
    using = [re.split(r"\s{2,}", line.strip())[-1] for line in out.stdout.splitlines()[1:]]  # the last column
    assert using == ["job 1 (bob)", "job 1 (bob)", "free", "busy (not labq)"]
    out = labq("nodes", env=leader.env())
    assert out.stdout.splitlines()[1].split()[:3] == ["ws1", "up", "1/4"]


def run_until(leader: FakeLeader, path: str, count: int, *args: str) -> subprocess.Popen:
    """Starts ``labq ARGS`` and returns once the leader has had ``count`` requests for ``path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABQ_")} | leader.env()
    proc = subprocess.Popen([sys.executable, "-m", "labq.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    deadline = time.monotonic() + 20
    while sum(r["path"] == path for r in leader.requests) < count:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    return proc


def test_ls_watch_redraws_on_events_and_ctrl_c_exits_0(leader, jobs):
    leader.json("GET", "/v1/jobs", {"jobs": [encode_job(jobs.queued())]})
    leader.routes[("GET", "/v1/events")] = (200, {"Content-Type": "text/event-stream", "Content-Length": None},
                                            b"id: 4\nevent: job\ndata: {\"job_id\": 1}\n\n")
    # a third listing request means the second listing was drawn (each draw comes before the next request)
    proc = run_until(leader, "/v1/jobs", 3, "ls", "--watch")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert (proc.returncode, err) == (0, "")
    assert out.count("\x1b[H\x1b[2J") >= 2 and "queued" in out


def test_ls_watch_rings_and_shows_a_notice_escaped(leader, jobs):
    """A ``notify`` event (the leader streams a person their own): the bell, and one line under the title with
    the notice's text escaped (a name from an old database could hold anything)."""
    leader.json("GET", "/v1/jobs", {"jobs": [encode_job(jobs.queued())]})
    notice = {"user": "alice", "event": "end", "text": "alice: job 1 (x\x1b[2J\x07) succeeded on ws1"}

    def events(query: dict) -> tuple[int, dict, bytes]:
        body = b": keepalive\n\n" if "after" in query else f"id: 5\nevent: notify\ndata: {json.dumps(notice)}\n\n".encode()
        return 200, {"Content-Type": "text/event-stream", "Content-Length": None}, body

    leader.routes[("GET", "/v1/events")] = events
    proc = run_until(leader, "/v1/jobs", 3, "ls", "--watch")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert (proc.returncode, err) == (0, "")
    assert out.count("\a") == 1 and "x\x1b[2J" not in out
    [line] = {line for line in out.splitlines() if line.startswith("notice: ")}
    assert re.fullmatch(r"notice: \d\d:\d\d alice: job 1 \(x\\x1b\[2J\\x07\) succeeded on ws1", line), line


def test_logs_follow_prints_new_bytes_once_and_ctrl_c_exits_0(leader):
    text = b"epoch 1\nepoch 2\n"

    def logs(query: dict) -> tuple[int, dict, bytes]:
        offset = int(query["offset"][0])
        return 200, {"Content-Type": "text/plain", "X-Labq-Offset": str(len(text))}, text[offset:]

    leader.routes[("GET", "/v1/jobs/7/logs")] = logs
    proc = run_until(leader, "/v1/jobs/7/logs", 3, "logs", "-f", "7", "--attempt", "2")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert (proc.returncode, out, err) == (0, "epoch 1\nepoch 2\n", "")
    assert [r["query"]["offset"] for r in leader.requests[:2]] == [["0"], ["16"]]


def test_logs_follow_goes_on_to_the_next_attempt_and_ends_with_the_job(leader, jobs, node):
    """Attempt 1 ends (preempted), attempt 2 runs and ends, the job succeeds: -f prints both and exits 0."""
    job = jobs.running(node, (0,))
    states = iter([job.evolve(attempt=1), job.evolve(attempt=2), job.evolve(attempt=2, state=JobState.SUCCEEDED)])
    current = {"job": None}

    def show(query: dict) -> tuple[int, dict, bytes]:
        current["job"] = next(states, current["job"])
        return 200, {}, json.dumps({"job": encode_job(current["job"]), "pending": None}).encode()

    def logs(query: dict) -> tuple[int, dict, bytes]:
        text = f"attempt {query['attempt'][0]}\n".encode()[int(query["offset"][0]):]
        return 200, {"Content-Type": "text/plain", "X-Labq-Offset": str(10), "X-Labq-Done": "1"}, text

    leader.routes[("GET", f"/v1/jobs/{job.id}")] = show
    leader.routes[("GET", f"/v1/jobs/{job.id}/logs")] = logs
    out = labq("logs", "-f", str(job.id), env=leader.env())
    assert (out.returncode, out.stdout) == (0, "attempt 1\nattempt 2\n")
    assert out.stderr == "labq: following attempt 2\n"


# -- starting fast --------------------------------------------------------------------------------

PROBE = """
import contextlib, io, json, sys
{code}
print(json.dumps(sorted(m for m in ("textual", "rich", "http.client", "socket", "_socket") if m in sys.modules)))
"""


def loaded_after(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(code=code)], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_importing_the_job_commands_loads_no_network_or_ui_library():
    assert loaded_after("import labq.cli.jobs") == []


def test_submit_help_loads_neither_textual_nor_rich():
    code = ("from labq.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['submit', '--help'])\n    except SystemExit:\n        pass")
    assert loaded_after(code) == []


def test_ls_json_loads_neither_textual_nor_rich(leader):
    code = (f"import os\nos.environ.update({leader.env()!r})\nfrom labq.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    assert main(['ls', '--json']) == 0")
    leader.json("GET", "/v1/jobs", {"jobs": []})
    assert loaded_after(code) == ["_socket"]  # not even socket: labq.wire speaks HTTP on _socket


def test_gpus_shows_free_memory_and_utilization_when_the_node_measures_them(leader, node):
    usage = {"0": {"memory_free_mib": 1024, "utilization_pct": 87}, "1": {"memory_free_mib": None,
                                                                          "utilization_pct": None}}
    leader.json("GET", "/v1/nodes", {"nodes": [encode_node(node) | {"gpus_in_use": {}, "last_seen": 0,
                                                                    "gpu_usage": usage}]})
    leader.json("GET", "/v1/jobs", {"jobs": []})
    out = labq("gpus", env=leader.env())
    assert out.returncode == 0
    header, first, second = out.stdout.splitlines()[:3]
    assert "FREE" in header and "UTIL" in header
    assert "87%" in first and "1 GiB" in first
    assert re.split(r"\s{2,}", second.strip())[4:6] == ["-", "-"]  # unknown is shown as unknown


def test_container_jobs_map_image_mounts_and_shared_memory():
    body = submit_body("--image", "pytorch/pytorch:2.4", "--mount", "data:/data:ro", "--mount", "/scratch/a:/out",
                       "--shm-size", "8G", "--", "python", "train.py")
    assert (body["runtime"], body["image"], body["shm_size_mib"]) == ("docker", "pytorch/pytorch:2.4", 8192)
    assert body["mounts"] == [{"source": "/home/alice/proj/data", "target": "/data", "read_only": True},
                              {"source": "/scratch/a", "target": "/out", "read_only": False}]
    assert "workdir" not in body  # a container starts where its image says, unless asked
    assert parse_submit(body).spec_for("alice").mounts[0].read_only  # and the leader reads it back


@pytest.mark.parametrize(("args", "words"), [
    (("--mount", "/a:/b", "--", "true"), "--mount is for container jobs"),
    (("--shm-size", "8G", "--", "true"), "--shm-size is for container jobs"),
    (("--image", "x", "--mount", "/a", "--", "true"), "use HOST_PATH:CONTAINER_PATH"),
    (("--image", "x", "--mount", "/a:b", "--", "true"), "container path must be absolute"),
    (("--image", "x", "--mount", "/a:/b:rx", "--", "true"), "use HOST_PATH:CONTAINER_PATH"),
])
def test_bad_container_options_are_named(args, words):
    with pytest.raises(CliError, match=words):
        submit_body(*args)


def test_nodes_show_topology_where_found_and_agents_not_admitted(leader, node):
    doc = encode_node(node) | {"gpus_in_use": {}, "last_seen": 0, "found": "mDNS", "address": "10.0.0.11"}
    leader.json("GET", "/v1/nodes", {"nodes": [doc], "unadmitted": [
        {"node": "rogue", "url": "http://10.0.0.66:41000", "addresses": ["10.0.0.66"], "cluster": "c1"}]})
    out = labq("nodes", env=leader.env())
    assert out.returncode == 0
    header, row, stranger = out.stdout.splitlines()[:3]
    assert "TOPOLOGY" in header and "FOUND" in header
    assert "mDNS 10.0.0.11" in row
    assert re.split(r"\s{2,}", stranger.strip())[:2] == ["rogue", "not admitted"]
    listed = json.loads(labq("nodes", "--json", env=leader.env()).stdout)
    assert [n["name"] for n in listed] == [node.name, "rogue"]  # one list for scripts, whatever is seen


# -- labq reserve -----------------------------------------------------------------------------------

def reserve_args(*argv: str):
    return _parser().parse_args(["reserve", *argv])


BERLIN_FRIDAY_8AM = 1795762800.0  # Fri 27 Nov 2026 08:00 CET


def test_reserve_reads_times_in_the_users_zone():
    from labq.cli.reserve import build_reserve_body

    body = build_reserve_body(reserve_args("--gpus", "4", "--start", "fri 09:00", "--for", "48h", "--name", "paper",
                                           "--users", "alice,bob", "--min-gpu-mem", "40G"),
                              BERLIN_FRIDAY_8AM, "Europe/Berlin")
    assert body == {"gpus": 4, "start": BERLIN_FRIDAY_8AM + 3600, "end": BERLIN_FRIDAY_8AM + 3600 + 48 * 3600,
                    "name": "paper", "users": ["alice", "bob"], "min_gpu_memory_mib": 40960}
    tokyo = build_reserve_body(reserve_args("--gpus", "1", "--start", "2026-11-28 09:00", "--end",
                                            "2026-11-28 10:00", "--dry-run"), BERLIN_FRIDAY_8AM, "Asia/Tokyo")
    assert tokyo["end"] - tokyo["start"] == 3600 and tokyo["dry_run"] is True
    assert tokyo["start"] == BERLIN_FRIDAY_8AM + 17 * 3600  # Saturday 09:00 JST is 01:00 CET


@pytest.mark.parametrize(("argv", "words"), [
    (["--start", "fri 09:00", "--for", "2h"], "say how many GPUs and when"),
    (["--gpus", "2", "--start", "fri 09:00"], "--for DURATION"),
    (["--gpus", "2", "--start", "fri 09:00", "--for", "2h", "--end", "sat"], "--for DURATION"),
    (["--gpus", "2", "--start", "fryday", "--for", "2h"], "--start: can't read 'fryday'"),
    (["--gpus", "2", "--start", "fri 09:00", "--for", "0m"], "--for:"),
    (["--gpus", "2", "--start", "fri 09:00", "--for", "2h", "--users", "a", "--group", "g"], "not both"),
    (["--gpus", "2", "--start", "fri 10:00", "--end", "fri 09:00"], "--end must be after --start"),
    (["--gpus", "2", "--start", "latest", "--for", "2h"], "--start latest picks a window that ends by a deadline"),
    (["--gpus", "2", "--by", "sat", "--end", "sat"], "not --end"),
    (["--gpus", "2", "--by", "sat"], "--gpu-hours H"),
    (["--gpus", "2", "--by", "sat", "--for", "2h", "--gpu-hours", "4"], "--gpu-hours H"),
    (["--gpus", "2", "--by", "sat", "--gpu-hours", "0"], "--gpu-hours must be more than 0"),
    (["--gpus", "2", "--by", "someday", "--gpu-hours", "4"], "--by: can't read 'someday'"),
])
def test_reserve_mistakes_are_named(argv, words):
    from labq.cli.reserve import build_reserve_body

    with pytest.raises(CliError, match=re.escape(words)):
        build_reserve_body(reserve_args(*argv), BERLIN_FRIDAY_8AM, "Europe/Berlin")


@pytest.mark.parametrize(("argv", "body", "pick"), [
    (["--gpus", "4", "--gpu-hours", "200", "--by", "fri 18:00"],
     {"gpus": 4, "by": BERLIN_FRIDAY_8AM + 10 * 3600, "length": 50 * 3600.0}, "earliest"),
    (["--gpus", "4", "--for", "48h", "--by", "fri 18:00", "--start", "latest"],
     {"gpus": 4, "start": "latest", "by": BERLIN_FRIDAY_8AM + 10 * 3600, "length": 48 * 3600.0}, "latest"),
    (["--gpus", "3", "--gpu-hours", "10", "--by", "fri 18:00", "--start", "fri 09:00"],  # 3 h 20 m
     {"gpus": 3, "start": BERLIN_FRIDAY_8AM + 3600, "by": BERLIN_FRIDAY_8AM + 10 * 3600, "length": 200 * 60.0},
     None),
    (["--gpus", "2", "--gpu-hours", "4", "--start", "fri 09:00"],  # how much, without a deadline: 2 h
     {"gpus": 2, "start": BERLIN_FRIDAY_8AM + 3600, "end": BERLIN_FRIDAY_8AM + 3 * 3600}, None),
])
def test_reserve_by_need_sends_a_length_and_a_deadline(argv, body, pick):
    from labq.cli.reserve import build_reserve_body
    from labq.protocol.bookings import parse_reserve

    sent = build_reserve_body(reserve_args(*argv), BERLIN_FRIDAY_8AM, "Europe/Berlin")
    assert sent == body
    request = parse_reserve(sent)  # the leader's own validator takes it
    assert (request.by, request.length, request.pick) == (body.get("by"), body.get("length"), pick)


def test_a_booking_by_need_answer_shows_both_windows_and_how_to_pick_the_other():
    from labq.render import deadline_text

    hour = 3600
    answer = {"accepted": True, "reservation": {"start": BERLIN_FRIDAY_8AM + hour},
              "deadline": {"earliest": {"start": BERLIN_FRIDAY_8AM + hour, "end": BERLIN_FRIDAY_8AM + 3 * hour},
                           "latest": {"start": BERLIN_FRIDAY_8AM + 8 * hour, "end": BERLIN_FRIDAY_8AM + 10 * hour}}}
    assert deadline_text(answer, BERLIN_FRIDAY_8AM, "Europe/Berlin").splitlines() == [
        "  earliest start Fri 27 Nov 09:00 CET (ends Fri 27 Nov 11:00 CET)",
        "  latest start   Fri 27 Nov 16:00 CET (ends Fri 27 Nov 18:00 CET)",
        "  --start latest books the latest window instead; a --start between them works too"]
    none = {"accepted": False, "deadline": {"earliest": None, "latest": None}}
    assert deadline_text(none, BERLIN_FRIDAY_8AM, "Europe/Berlin") == "  nothing of that size ends by the deadline"


def test_reserve_answers_for_people():
    from labq.render import answer_text

    booked = {"accepted": True, "booked": True, "reasons": [], "alternatives": [],
              "reservation": {"name": "paper", "gpus": 2, "node": "ws1", "gpu_indices": [0, 1], "score": 4002,
                              "start": BERLIN_FRIDAY_8AM + 3600, "end": BERLIN_FRIDAY_8AM + 7200},
              "displaced": [{"job_id": 7, "user": "bob", "signal_at": BERLIN_FRIDAY_8AM + 3540}]}
    text = answer_text(booked, BERLIN_FRIDAY_8AM, "Europe/Berlin")
    assert text.splitlines()[0] == ("booked paper: 2 GPU(s) on ws1 (GPUs 0,1, topology score 4002), "
                                    "Fri 27 Nov 09:00 CET to Fri 27 Nov 10:00 CET")
    assert "job 7 (bob) at Fri 27 Nov 08:59 CET" in text
    refused = {"accepted": False, "booked": False, "reasons": ["capacity: overlapping bookings: thesis"],
               "displaced": [], "reservation": None,
               "alternatives": [{"gpus": 2, "node": "ws1", "score": 4002, "gpu_indices": [0, 1],
                                 "start": BERLIN_FRIDAY_8AM + 7200, "end": BERLIN_FRIDAY_8AM + 3 * 3600}]}
    text = answer_text(refused, BERLIN_FRIDAY_8AM, "Europe/Berlin")
    assert text.splitlines()[0] == "cannot book it: capacity: overlapping bookings: thesis"
    assert text.endswith('labq reserve --gpus 2 --start "2026-11-27 10:00" --for 1h')


def test_events_reads_since_and_until_as_times_in_the_past():
    """``labq events --since`` looks back: a date, yesterday's morning, a clock time that has come today or
    yesterday, a duration; never a time to come."""
    from datetime import datetime

    from labq.cli.errors import CliError
    from labq.cli.events import _when

    now = datetime(2026, 11, 26, 12, 0).timestamp()  # local time, as the command reads it
    assert _when("2026-10-01", "--since", now) == datetime(2026, 10, 1).timestamp()
    assert _when("yesterday 9:00", "--since", now) == datetime(2026, 11, 25, 9, 0).timestamp()
    assert _when("14:00", "--since", now) == datetime(2026, 11, 25, 14, 0).timestamp()
    assert _when("2h", "--since", now) == now - 7200
    assert _when(None, "--since", now) is None
    with pytest.raises(CliError, match="--since"):
        _when("next tuesday-ish", "--since", now)


def test_events_shows_the_lab_own_steps_in_one_escaped_line():
    from labq.cli.events import line

    text = line({"seq": 9, "at": 0, "kind": "lab", "action": "preempting", "job": 12, "owner": "alice",
                 "detail": "for job 14\x1b[2J"})
    assert "  labq  preempting job 12 (alice's): for job 14" in text and "\x1b" not in text
    booked = line({"seq": 10, "at": 0, "kind": "lab", "action": "reservation started", "target": "paper",
                   "owner": "bob", "detail": "ws1 GPUs 0,1"})
    assert booked.endswith("labq  reservation started paper (bob's): ws1 GPUs 0,1")
