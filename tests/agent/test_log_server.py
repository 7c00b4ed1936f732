"""The agent serves job logs to its leader (``Agent.serve_log``), and the leader reads them with ``fetch_log``:
in-process through the transport seam for what the route answers, and once on a real socket."""

from __future__ import annotations

import threading

import pytest

from labq.agent.daemon import LOG_CHUNK, Agent, AgentConfig
from labq.agent.inventory import open_inventory
from labq.agent.process_runtime import AttemptState
from labq.leader.node_logs import fetch_log
from labq.protocol.errors import ApiError
from labq.transport import Request, in_process

pytestmark = pytest.mark.timeout(60)

URL = "http://ws1.invalid:1"


class Attempt:
    def __init__(self, job_id: int, attempt: int, state: AttemptState) -> None:
        self.job_id, self.attempt, self.state = job_id, attempt, state


class Logs:
    """A runtime's log side: job 7's attempt 1 ended with ``LOG``; attempt 2 runs."""

    LOG = b"epoch 1\nepoch 2\n"

    def attempts(self) -> list[Attempt]:
        return [Attempt(7, 1, AttemptState.EXITED), Attempt(7, 2, AttemptState.RUNNING)]

    def read_log(self, job_id: int, attempt: int, offset: int, limit: int) -> bytes:
        if (job_id, attempt) not in ((7, 1), (7, 2)):
            raise KeyError((job_id, attempt))
        return self.LOG[offset:offset + limit]


@pytest.fixture
def agent(tmp_path):
    made = Agent(AgentConfig("http://127.0.0.1:9", "join", "ws1", tmp_path / "agent"),
                 open_inventory("sim:ws-4x3090", "ws1"))
    made.logs_token = "logs-secret"
    made.runtime = Logs()
    yield made
    made._logs.server_close()


def test_the_leader_reads_a_log_from_an_offset_and_learns_when_it_ended(agent):
    node = in_process(agent.serve_log)
    assert fetch_log(URL, "logs-secret", 7, 1, 0, node) == (Logs.LOG, len(Logs.LOG), True)
    assert fetch_log(URL, "logs-secret", 7, 1, 8, node) == (b"epoch 2\n", len(Logs.LOG), True)
    assert fetch_log(URL, "logs-secret", 7, 2, 0, node) == (Logs.LOG, len(Logs.LOG), False)  # it still runs


@pytest.mark.parametrize("token, path, status, body", [
    ("wrong", "/v1/logs/7/1", 401, b"unknown token"),
    (None, "/v1/logs/7/1", 401, b"unknown token"),
    ("logs-secret", "/v1/logs/7", 404, b"no such path"),
    ("logs-secret", "/v1/logs/7/x", 404, b"no such path"),
    ("logs-secret", "/v1/logs/8/1", 404, b"no such log"),
    ("logs-secret", "/v1/logs/7/1?offset=-1", 400, b"offset must be a whole number of bytes"),
    ("logs-secret", "/v1/logs/7/1?offset=" + "9" * 19, 400, b"offset must be a whole number of bytes"),
])
def test_the_log_route_refuses_what_it_cannot_answer(agent, token, path, status, body):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = agent.serve_log(Request("GET", URL + path, headers))
    assert (response.status, response.read()) == (status, body)


def test_the_leader_says_why_it_has_no_log(agent):
    node = in_process(agent.serve_log)
    with pytest.raises(ApiError, match="the node answered 401 for the log") as caught:
        fetch_log(URL, "wrong", 7, 1, 0, node)
    assert (caught.value.status, caught.value.code) == (503, "unavailable")
    with pytest.raises(ApiError, match="the node has no log for job 8 attempt 1") as caught:
        fetch_log(URL, "logs-secret", 8, 1, 0, node)
    assert caught.value.status == 404
    agent.logs_token = None  # not registered yet: no token opens the logs
    with pytest.raises(ApiError, match="answered 401"):
        fetch_log(URL, "None", 7, 1, 0, node)


def test_a_log_is_read_at_most_a_chunk_at_a_time(agent):
    big = b"x" * (LOG_CHUNK + 10)
    agent.runtime.read_log = lambda job_id, attempt, offset, limit: big[offset:offset + limit]
    node = in_process(agent.serve_log)
    data, after, done = fetch_log(URL, "logs-secret", 7, 1, 0, node)
    assert (len(data), after, done) == (LOG_CHUNK, LOG_CHUNK, False)
    assert fetch_log(URL, "logs-secret", 7, 1, after, node) == (b"x" * 10, LOG_CHUNK + 10, True)


def test_the_log_server_answers_on_its_socket(agent):
    thread = threading.Thread(target=agent._logs.serve_forever, daemon=True)
    thread.start()
    try:
        assert fetch_log(agent.logs_url, "logs-secret", 7, 1, 0) == (Logs.LOG, len(Logs.LOG), True)
        with pytest.raises(ApiError, match="the node answered 401 for the log"):
            fetch_log(agent.logs_url, "wrong", 7, 1, 0)
    finally:
        agent._logs.shutdown()
        thread.join(5)


def test_an_unreachable_node_is_unavailable():
    with pytest.raises(ApiError, match="cannot reach the node for the log: ") as caught:
        fetch_log("http://127.0.0.1:9", "t", 7, 1, 0)
    assert caught.value.code == "unavailable"
