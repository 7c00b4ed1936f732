"""Every command that talks to the leader exits as the README's table says: 0 ok, 1 refused, 2 bad input,
3 authentication, 4 leader unreachable.

A table over the commands and the leader's answers: each command runs as a process against a real HTTP
server on 127.0.0.1 that answers every request with one error, against a closed port, and with no token.
"""

from __future__ import annotations

import json
import re
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from labq.http_server import serve_app
from labq.transport import Request, Response

ROOT = Path(__file__).resolve().parents[2]

#: every command that talks to the leader, with arguments it accepts
COMMANDS = [
    ("submit", "--", "true"), ("ls",), ("ls", "--history"), ("show", "1"), ("why", "1"), ("logs", "1"),
    ("logs", "-f", "1", "--retry-for", "1s"), ("cancel", "1"), ("cancel", "--name", "sweep-*", "--yes"),
    ("hold", "1"), ("release", "1"), ("prio", "1", "high"), ("prio", "1", "+10"), ("edit", "1", "--gpus", "2"),
    ("restart", "1"), ("wait", "1", "--retry-for", "1s"), ("clean",), ("nodes",), ("gpus",), ("whoami",),
    ("reservations",), ("reserve", "--gpus", "1", "--start", "in 1h", "--for", "1h"), ("reserve", "cancel", "paper"),
    ("admin", "user", "add", "bob", "--print"), ("admin", "user", "ls"), ("admin", "user", "rm", "bob"),
    ("usage", "--me", "--since", "7d"), ("usage", "--month", "2026-10", "--by", "node", "--csv"),
]

#: the leader's answer -> the exit status (README: "Exit codes")
ANSWERS = [
    (400, "bad_request", 2), (413, "too_large", 2), (422, "unprocessable", 2), (401, "unauthorized", 3),
    (403, "forbidden", 1), (404, "not_found", 1), (409, "conflict", 1), (503, "unavailable", 1),
    (500, "internal", 1),
]


class ErrorLeader:
    """A real HTTP server that answers every request with one error."""

    def __init__(self) -> None:
        self.answer = (500, "internal")
        self.server = serve_app(self._answer, ("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _answer(self, request: Request) -> Response:
        status, code = self.answer
        body = json.dumps({"error": {"code": code, "message": f"the leader says {code}"}}).encode()
        return Response(status, {"Content-Type": "application/json"}, body)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture(scope="module")
def leader():
    made = ErrorLeader()
    yield made
    made.close()


def labq(*args: str, env: dict) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("LABQ_")} | env
    return subprocess.run([sys.executable, "-m", "labq.cli", *args], capture_output=True, text=True, timeout=60,
                          env=full, cwd=ROOT, stdin=subprocess.DEVNULL)


def run_all(env: dict) -> dict[str, tuple[int, str]]:
    """Every command at once (each is a process; together they take a second, not a minute)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("LABQ_")} | env
    procs = {" ".join(args): subprocess.Popen([sys.executable, "-m", "labq.cli", *args], stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True, env=full, cwd=ROOT,
                                              stdin=subprocess.DEVNULL)
             for args in COMMANDS}
    return {name: (proc.wait(60), proc.communicate()[1]) for name, proc in procs.items()}


@pytest.mark.parametrize(("status", "code", "expected"), ANSWERS, ids=[a[1] for a in ANSWERS])
def test_every_command_exits_as_the_readme_says_for_each_answer_of_the_leader(leader, status, code, expected):
    leader.answer = (status, code)
    results = run_all({"LABQ_LEADER": leader.url, "LABQ_TOKEN": "t"})
    wrong = {name: got for name, got in results.items() if got[0] != expected}
    assert wrong == {}, f"expected exit {expected} for {status} {code}"
    assert all(f"the leader says {code}" in err and "Traceback" not in err for _, err in results.values())


def test_every_command_exits_4_when_the_leader_cannot_be_reached_and_3_without_a_token(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = run_all({"LABQ_LEADER": f"http://127.0.0.1:{port}", "LABQ_TOKEN": "t"})
    assert {name: got[0] for name, got in results.items() if got[0] != 4} == {}
    assert all("cannot reach the leader" in err for _, err in results.values())
    results = run_all({"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / ".config")})
    assert {name: got[0] for name, got in results.items() if got[0] != 3} == {}
    assert all("no labq token" in err for _, err in results.values())


@pytest.mark.parametrize(("args", "words"), [
    (("edit", "1", "--time", "30"), "--time: '30' is not a duration"),
    (("edit", "1"), "say what to change"),
    (("ls", "--history", "--state", "queued"), "--history lists finished jobs"),
    (("logs", "1", "-n", "-3"), "--lines must be 0 or more"),
    (("cancel",), "name the jobs to cancel"),
    (("cancel", "--state", "succeeded"), "cancel takes unfinished states"),
    (("submit", "--after", "1", "--after-any", "2", "--", "x"), "use one of them"),
    (("wait", "x"), "is not a job id"),
    (("restart", "0"), "is not a job id"),
])
def test_bad_input_exits_2_before_any_request(leader, args, words):
    out = labq(*args, env={"LABQ_LEADER": leader.url, "LABQ_TOKEN": "t"})
    assert out.returncode == 2 and words in out.stderr, out.stderr


def test_the_readmes_table_names_the_codes_the_cli_uses():
    from labq.cli import errors

    text = (ROOT / "README.md").read_text()
    table = dict(re.findall(r"^\| (\d+) \| ([^|]+?)(?::| \(| \|)", text, re.M))
    assert table == {"0": "ok", "1": "refused", "2": "bad input", "3": "authentication", "4": "leader unreachable"}
    assert (errors.OK, errors.REFUSED, errors.USAGE, errors.CREDENTIALS, errors.UNREACHABLE) == (0, 1, 2, 3, 4)
