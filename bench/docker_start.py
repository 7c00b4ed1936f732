"""Benchmark of a container job's start: labq submit to running, next to Docker's own ``docker run``.

What it measures, against a real ``labq leader`` and one ``labq agent`` (``sim:ws-4x3090``)
started as processes in a temp folder with a temp HOME (``Lab`` and ``Events`` of latency.py):
  * The engine: dockerd is started if none answers, and the test image ``labq-test-busybox:1``
    (a static busybox FROM scratch, tests/docker/image) built if missing; both times are figures.
  * Submit to running on an idle agent: 1-GPU container jobs ``sleep 30`` of the ordinary user
    ``nobody`` (containers never run as root), one at a time through the API client, timed from
    just before the submit call to the ``running`` event on ``/v1/events``; on the way: the
    ``starting`` event, the agent's "starting job" log line, and the container's Created and
    StartedAt times from the engine. Each job is cancelled and its ``cancelled`` event awaited
    before the next, so the GPU is idle each time. 2 warm-ups, 20 samples.
  * Taking turns with those samples: the wall time of ``docker run --rm IMAGE true`` (the CLI, as
    a subprocess), of the SDK's ``containers.run(IMAGE, "true", remove=True)``, and of the SDK's
    ``containers.run(IMAGE, "sleep 30", detach=True)`` (create and start only, as the agent does).

Goal (from the issue): labq adds at most 300 ms to Docker's own start, i.e. the median of submit
to running minus the median of ``docker run --rm IMAGE true``. Timings are reported, never
asserted. Consistency is checked (every submit got an id, every sample reached running, every
job ends cancelled, no container of the benchmark's agent is left): a violation is printed after
the figures and exits with status 1. Progress goes to stderr.

Run:  .venv/bin/python bench/docker_start.py [--json] [--keep] [--samples 20]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

from latency import Events, Lab, agent_starts, ms, pct, say

from figures import print_figures
from labq.client import Client
from labq.protocol.errors import ApiError

import docker

IMAGE = "labq-test-busybox:1"
BUSYBOX = "/bin/busybox"  # from Debian's busybox-static: static, so it runs in an empty image
DOCKERFILE = Path(__file__).resolve().parent.parent / "tests" / "docker" / "image" / "Dockerfile"
DOCKERD_LOG = Path(tempfile.gettempdir()) / "labq-dockerd.log"
WARMUPS, SAMPLES, ADDED_GOAL_MS = 2, 20, 300.0


def ping() -> docker.DockerClient | None:
    try:
        client = docker.from_env(timeout=30)
        client.ping()
        return client
    except docker.errors.DockerException:
        return None


def engine(fig: dict) -> docker.DockerClient:
    """A running engine with the image: dockerd started and the image built as in tests/docker/conftest.py."""
    start = time.perf_counter()
    client = ping()
    if client is None:
        if shutil.which("dockerd") is None or os.geteuid() != 0:
            raise RuntimeError("no Docker engine answers, and dockerd is missing or we are not root")
        say(f"starting dockerd (log: {DOCKERD_LOG})")
        with open(DOCKERD_LOG, "ab") as log:
            subprocess.Popen(["dockerd", "--host", "unix:///var/run/docker.sock", "--data-root", "/var/lib/docker"],
                             stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        while (client := ping()) is None:
            if time.perf_counter() - start > 60:
                raise RuntimeError(f"dockerd did not answer within 60 s; see {DOCKERD_LOG}")
            time.sleep(0.25)
    fig["dockerd_start_s"] = time.perf_counter() - start  # a ping only when one was running already
    start = time.perf_counter()
    try:
        client.images.get(IMAGE)
    except docker.errors.ImageNotFound:
        say(f"building {IMAGE}")
        with tempfile.TemporaryDirectory() as context:
            shutil.copy(DOCKERFILE, Path(context) / "Dockerfile")
            shutil.copy(BUSYBOX, Path(context) / "busybox")
            client.images.build(path=context, tag=IMAGE, rm=True)  # the API's legacy builder: no BuildKit
    fig["image_ready_s"] = time.perf_counter() - start
    return client


class DockerLab(Lab):
    """latency.py's Lab with an agent of its own name, so its containers are told from the tests'."""

    def start(self, gpus: str) -> Client:
        self.node = f"bench-{uuid.uuid4().hex[:8]}"
        served = re.compile(r"serving (http://127\.0\.0\.1:\d+)")
        self.spawn("leader.log", "leader", "--config", str(self.root / "leader.toml"), "--data-dir", str(self.data))
        self.wait(lambda: served.search(self.log("leader.log")), "the leader to serve")
        self.url = served.search(self.log("leader.log"))[1]
        creds = self.home / ".config" / "labq" / "credentials"
        self.wait(lambda: creds.exists() and "token" in creds.read_text(), "the first admin's token")
        from labq.credentials import load_credentials
        self.client = Client(self.url, load_credentials(creds)["token"])
        self.spawn("agent.log", "agent", "--leader", self.url, "--gpus", gpus, "--name", self.node,
                   "--data-dir", str(self.data))
        self.wait(lambda: any(n["name"] == self.node and n["health"] == "up" for n in self.client.nodes()),
                  "the agent to join")
        say(f"leader {self.url} and agent {self.node} ({gpus}) up in {self.root}")
        return self.client

    def containers(self, dock: docker.DockerClient) -> list:
        return dock.containers.list(all=True, filters={"label": [f"labq.agent={self.node}", "labq.managed=1"]})


def stamp(text: str) -> float:
    """The engine's RFC 3339 time (nanoseconds, Z) as ``time.time()``."""
    head, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").timestamp()


def summary(name: str, values: list[float]) -> dict:
    return {f"{name}_median_ms": statistics.median(values), f"{name}_p95_ms": pct(values, 0.95)} if values else {}


def bench(lab: DockerLab, dock: docker.DockerClient, user: Client, events: Events, samples: int,
          ids: list[int], problems: list[str]) -> dict:
    rows, cli, sdk, detached = [], [], [], []

    def labq_sample(keep: bool) -> None:
        t0 = time.time()
        job = user.submit({"command": ["sleep", "30"], "gpus": 1, "runtime": "docker", "image": IMAGE})
        answered = time.time()
        ids.append(job.get("id"))
        if not job.get("id"):
            problems.append("a submit was answered without a job id")
            return
        try:
            running = events.wait(job["id"], "running", 30.0)
        except RuntimeError as err:
            problems.append(str(err))
            running = None
        starting = events.seen.get((job["id"], "starting"))
        found = dock.containers.list(all=True, filters={"label": [f"labq.job={job['id']}", f"labq.agent={lab.node}"]})
        created = stamp(found[0].attrs["Created"]) if found else None
        started = stamp(found[0].attrs["State"]["StartedAt"]) if found else None
        cancel = time.time()
        try:
            user.action(job["id"], "cancel")
        except ApiError as err:  # it failed to start (see the agent's log), so it is over already
            problems.append(f"job {job['id']}: {err} (state {user.job(job['id'])[0]['state']})")
            return
        cancelled = events.wait(job["id"], "cancelled", 60.0)
        if keep and running is not None:
            rows.append((job["id"], t0, answered, starting, created, started, running, cancelled - cancel))

    def timed(fn, into: list[float], keep: bool) -> None:
        start = time.perf_counter()
        fn()
        if keep:
            into.append(ms(time.perf_counter() - start))

    def docker_cli() -> None:
        out = subprocess.run(["docker", "run", "--rm", IMAGE, "true"], capture_output=True, text=True, timeout=60)
        if out.returncode:
            raise RuntimeError(f"docker run exited {out.returncode}: {out.stderr.strip()}")

    def sdk_detached(keep: bool) -> None:
        start = time.perf_counter()
        container = dock.containers.run(IMAGE, ["sleep", "30"], detach=True, labels={"labq.bench": lab.node})
        if keep:
            detached.append(ms(time.perf_counter() - start))
        container.remove(force=True)

    for i in range(WARMUPS + samples):  # take turns, starting with a different one each round
        keep = i >= WARMUPS
        steps = [lambda keep=keep: labq_sample(keep), lambda keep=keep: timed(docker_cli, cli, keep),
                 lambda keep=keep: timed(lambda: dock.containers.run(IMAGE, "true", remove=True), sdk, keep),
                 lambda keep=keep: sdk_detached(keep)]
        for k in range(len(steps)):
            steps[(i + k) % len(steps)]()
        say(f"  round {i + 1}/{WARMUPS + samples}" + ("" if keep else " (warm-up)"))
    if len(rows) != samples:
        problems.append(f"only {len(rows)} of {samples} samples reached running")
    orders = agent_starts(lab.log("agent.log"))
    col = {"labq_to_submit_answer": [ms(r[2] - r[1]) for r in rows],
           "labq_to_starting": [ms(r[3] - r[1]) for r in rows if r[3]],
           "labq_to_agent_order": [ms(orders[r[0]] - r[1]) for r in rows if r[0] in orders],
           "labq_to_container_created": [ms(r[4] - r[1]) for r in rows if r[4]],
           "labq_to_container_started": [ms(r[5] - r[1]) for r in rows if r[5]],
           "labq_to_running": [ms(r[6] - r[1]) for r in rows],
           "container_started_to_running": [ms(r[6] - r[5]) for r in rows if r[5]],
           "docker_run_true": cli, "docker_sdk_run_true": sdk, "docker_sdk_run_detached": detached}
    fig = {}
    for name, values in col.items():
        fig |= summary(name, values)
    fig["cancel_to_cancelled_median_ms"] = ms(statistics.median(r[7] for r in rows)) if rows else None
    if rows and cli:
        fig["labq_added_ms"] = fig["labq_to_running_median_ms"] - fig["docker_run_true_median_ms"]
        fig["labq_added_p95_ms"] = fig["labq_to_running_p95_ms"] - fig["docker_run_true_p95_ms"]
        fig["labq_added_to_detached_run_ms"] = fig["labq_to_running_median_ms"] - statistics.median(detached)
    return fig


def check_end(lab: DockerLab, dock: docker.DockerClient, ids: list[int], problems: list[str]) -> None:
    ours = {i for i in ids if i}
    ended = {j["id"]: j["state"] for j in lab.client.jobs(all=True, history=True)}
    wrong = sorted((i, ended.get(i, "missing")) for i in ours if ended.get(i) != "cancelled")
    if wrong:
        problems.append(f"{len(wrong)} benchmark jobs did not end cancelled, e.g. {wrong[:3]}")
    deadline = time.monotonic() + 15  # the agent removes a container once the leader has its end
    while (left := lab.containers(dock)) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        problems.append(f"{len(left)} containers of agent {lab.node} left behind, e.g. {left[0].name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--keep", action="store_true", help="leave the temp folder (logs, data) in place")
    parser.add_argument("--samples", type=int, default=SAMPLES, help=f"timed rounds (default {SAMPLES})")
    parser.add_argument("--gpus", default="sim:ws-4x3090", help="the agent's simulated GPUs (default sim:ws-4x3090)")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    fig: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "gpus": args.gpus}
    ids: list[int] = []
    problems: list[str] = []
    dock = engine(fig)
    fig["docker_version"] = dock.version().get("Version", "?")
    root = Path(tempfile.mkdtemp(prefix="labq-bench-docker-"))
    lab = DockerLab(root)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("docker start benchmark: stopped by SIGTERM"))  # the finally
    try:
        admin = lab.start(args.gpus)
        user = Client(lab.url, admin.add_user("nobody")[1])  # an ordinary user with a Unix account here
        events = Events(admin)
        events.wait(None, "any", 10.0)  # the stream is connected
        say(f"{WARMUPS}+{args.samples} rounds: labq container job to running, docker run --rm, SDK run")
        fig |= bench(lab, dock, user, events, args.samples, ids, problems)
        check_end(lab, dock, ids, problems)
    finally:
        lab.close()
        for container in lab.containers(dock) if hasattr(lab, "node") else []:
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    fig["wall_s"] = time.perf_counter() - began
    met = fig.get("labq_added_ms") is not None and fig["labq_added_ms"] <= ADDED_GOAL_MS
    fig["goals_met"] = {"labq_added_ms": met}
    fig["problems"] = problems
    if args.json:
        print(json.dumps(fig))
    else:
        print_figures(f"labq container start benchmark (Python {fig['python']}, {fig['cpus']} CPUs, Docker "
                      f"{fig['docker_version']}, agent {fig['gpus']}, {fig['wall_s']:.0f} s)", fig,
                      {"labq_added_ms": (f"<= {ADDED_GOAL_MS:g} ms", met)},
                      skip=("python", "cpus", "gpus", "docker_version", "goals_met", "wall_s", "problems"), digits=1)
    if problems:
        say("docker start benchmark: inconsistent:\n  " + "\n  ".join(problems))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
