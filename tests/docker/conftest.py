"""A real Docker engine for the container tests: found, or started when we are root.

The engine is shared by the whole machine (and both xdist workers), so every test
uses its own node name and job ids, and removes the containers of its nodes at the end.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import random
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

docker = pytest.importorskip("docker")

IMAGE = "labq-test-busybox:1"
LABELLED_IMAGE = "labq-test-busybox-usr1:1"
BUSYBOX = "/bin/busybox"  # from Debian's busybox-static: static, so it runs in an empty image
DOCKERFILE = Path(__file__).parent / "image" / "Dockerfile"
ENGINE_LOCK = Path(tempfile.gettempdir()) / "labq-docker-tests.lock"
DOCKERD_LOG = Path(tempfile.gettempdir()) / "labq-dockerd.log"
START_TIMEOUT_S = 60.0


def _ping() -> docker.DockerClient | None:
    try:
        client = docker.from_env(timeout=10)
        client.ping()
        return client
    except docker.errors.DockerException:
        return None


def _start_dockerd() -> docker.DockerClient:
    """Start dockerd in its own session (it outlives the tests, for the next run) and wait for it."""
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        pytest.skip("no Docker engine answers and dockerd is not installed")
    if os.geteuid() != 0:
        pytest.skip("no Docker engine answers and only root can start dockerd")
    with open(DOCKERD_LOG, "ab") as log:
        subprocess.Popen([dockerd, "--host", "unix:///var/run/docker.sock", "--data-root", "/var/lib/docker"],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if (client := _ping()) is not None:
            return client
        time.sleep(0.25)
    pytest.skip(f"dockerd did not answer within {START_TIMEOUT_S:.0f} s; see {DOCKERD_LOG}")


def _build_image(client: docker.DockerClient) -> None:
    if not os.path.exists(BUSYBOX):
        pytest.skip(f"{BUSYBOX} is missing: install busybox-static to build the test image")
    with tempfile.TemporaryDirectory() as context:
        shutil.copy(DOCKERFILE, Path(context) / "Dockerfile")
        shutil.copy(BUSYBOX, Path(context) / "busybox")
        client.images.build(path=context, tag=IMAGE, rm=True)  # the API's legacy builder: no BuildKit


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    """A client of a running engine with the test image, or the docker tests are skipped."""
    with open(ENGINE_LOCK, "w") as lock:  # the xdist workers take turns starting and building
        fcntl.flock(lock, fcntl.LOCK_EX)
        client = _ping()
        if client is None:
            client = _start_dockerd()
        try:
            client.images.get(IMAGE)
        except docker.errors.ImageNotFound:
            _build_image(client)
    yield client
    client.close()


@pytest.fixture(scope="session")
def labelled_image(docker_client) -> str:
    """The test image with the label that declares its jobs checkpoint on SIGUSR1 (built from it, offline)."""
    import io

    dockerfile = f"FROM {IMAGE}\nLABEL labq.checkpoint-signal=SIGUSR1\n".encode()
    docker_client.images.build(fileobj=io.BytesIO(dockerfile), tag=LABELLED_IMAGE, rm=True)
    return LABELLED_IMAGE


@pytest.fixture
def job_ids() -> Iterator[int]:
    """Fresh job ids: container names are global to the engine, shared with the other worker."""
    return itertools.count(random.randrange(10**6, 10**9, 1000))


@pytest.fixture
def make_runtime(docker_client, tmp_path: Path):
    """Builds DockerRuntimes on fresh node names; removes every container of those nodes afterwards."""
    from labq.agent.docker_runtime import DockerRuntime

    nodes: set[str] = set()

    def make(root: Path | None = None, node: str | None = None, **kw) -> DockerRuntime:
        node = node or f"labq-test-{uuid.uuid4().hex[:10]}"
        nodes.add(node)
        return DockerRuntime(root or tmp_path / "runtime", node, client=docker_client, **kw)

    yield make
    for node in nodes:
        for container in docker_client.containers.list(all=True, filters={"label": f"labq.agent={node}"}):
            try:
                container.remove(force=True)
            except docker.errors.NotFound:
                pass


@pytest.fixture
def job_user() -> str | None:
    """A non-root user for the container: ``nobody`` when the tests run as root, else the agent's own."""
    return "nobody" if os.geteuid() == 0 else None


@contextlib.contextmanager
def container_lab(client, root: Path, config: str) -> Iterator:
    """A real leader and an agent of its own name (tests in parallel must not clean up each other), with
    user nobody's token as ``lab.token``: containers never run as root, so jobs come from an ordinary user
    with a Unix account here. The agent's containers are removed afterwards."""
    import secrets

    import docker.errors

    from tests.e2e.conftest import Lab

    lab = Lab(root, config)
    try:
        lab.start_leader()
        lab.node = f"ws-{secrets.token_hex(3)}"
        lab.start_agent(lab.node)
        added = lab.labq("admin", "user", "add", "nobody", "--print").stdout
        lab.token = next(w.strip('"') for w in added.split() if w.strip('"').startswith("lqu_"))
        yield lab
    finally:
        lab.close()
        node = getattr(lab, "node", None)
        for container in client.containers.list(all=True, filters={"label": f"labq.agent={node}"}) if node else ():
            with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):  # the agent may be removing it
                container.remove(force=True)
