"""A real Prometheus (Debian's ``prometheus``, installed by install.sh) scrapes a real leader on loopback with
the lab's read-only scrape token, while a real agent runs a few jobs; the test then asks Prometheus's own HTTP
API for the job and GPU series, as a lab's dashboard would."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from tests.conftest import unavailable
from tests.e2e.conftest import TEST_CONFIG, Lab, stop_processes

pytestmark = pytest.mark.timeout(180)

SCRAPE_TOKEN = "e2e-scrape-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    """``prometheus`` as a process in ``root``, scraping ``target`` every second with the scrape token."""

    def __init__(self, root, target: str) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            unavailable("Prometheus",
                        "the prometheus binary is not installed (install.sh installs Debian's prometheus)")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = root / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: labq\n    metrics_path: /metrics\n"
            f"    authorization:\n      type: Bearer\n      credentials: {SCRAPE_TOKEN}\n"
            f"    static_configs:\n      - targets: ['{target}']\n")
        self.log = root / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={root / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}"], stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + 60
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                unavailable("Prometheus", f"prometheus did not start: {self.log.read_text()[-1500:]}")
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def query(self, expr: str) -> list[dict]:
        """An instant query's result vector."""
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}",
                                    timeout=10) as answer:
            doc = json.loads(answer.read())
        assert doc["status"] == "success", doc
        return doc["data"]["result"]

    def targets(self) -> list[dict]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as answer:
            return json.loads(answer.read())["data"]["activeTargets"]

    def stop(self) -> None:
        stop_processes([self.proc])


def test_prometheus_scrapes_the_leader_and_sees_the_jobs_and_the_gpus(tmp_path):
    lab = Lab(tmp_path / "lab", TEST_CONFIG + f'[metrics]\nscrape_token = "{SCRAPE_TOKEN}"\n')
    prometheus = None
    try:
        lab.start_leader()
        lab.start_agent("ws1", "sim:ws-4x3090")
        prometheus = Prometheus(tmp_path, lab.url.removeprefix("http://"))
        done = [lab.submit("true", gpus=2), lab.submit("true", gpus=1), lab.submit("false", gpus=1)]
        for job in done:
            lab.wait_state(job, "succeeded", "failed")
        running = lab.submit("sleep", "60", gpus=3)
        lab.wait_state(running, "running")

        def series(expr: str) -> dict[str, float]:
            return {json.dumps(r["metric"], sort_keys=True): float(r["value"][1]) for r in prometheus.query(expr)}

        wanted = {
            "labq_jobs_ended_total": lambda got: sorted(got.values()) == [1.0, 2.0],
            'labq_node_gpus{node="ws1",kind="allocated"}': lambda got: list(got.values()) == [3.0],
            'labq_jobs{state="running"}': lambda got: list(got.values()) == [1.0],
        }
        lab.wait(lambda: all(check(series(expr)) for expr, check in wanted.items()),
                 "Prometheus to scrape the jobs and GPUs", timeout=60,
                 detail=lambda: f"{ {expr: series(expr) for expr in wanted} } targets: {prometheus.targets()}")
        ended = prometheus.query("labq_jobs_ended_total")
        assert {r["metric"]["state"]: float(r["value"][1]) for r in ended} == {"succeeded": 2.0, "failed": 1.0}
        assert all(r["metric"]["job"] == "labq" for r in ended)
        total = prometheus.query('labq_node_gpus{kind="total"}')
        assert [(r["metric"]["node"], float(r["value"][1])) for r in total] == [("ws1", 4.0)]
        assert float(prometheus.query("labq_jobs_submitted_total")[0]["value"][1]) == 4.0
        assert float(prometheus.query('labq_agent_up{node="ws1"}')[0]["value"][1]) == 1.0
        waits = prometheus.query("labq_job_queue_wait_seconds_count")
        assert float(waits[0]["value"][1]) == 4.0  # every attempt that started
        (target,) = prometheus.targets()
        assert target["health"] == "up" and target["lastError"] == "", target
    finally:
        if prometheus is not None:
            prometheus.stop()
        lab.close()
