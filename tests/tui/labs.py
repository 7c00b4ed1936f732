"""What the TUI tests share: a real lab to drive the app against, a canned leader (answered in-process)
for snapshots, and bounded waits.

The fixtures (``lab``, ``own_lab``, ``canned_leader``) reach the test modules through ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from labq.client import Client
from labq.credentials import load_credentials
from labq.transport import Request, Response, Transport, socket_transport
from labq.tui.app import LabqApp, make_app
from tests.e2e.conftest import Lab

SIZE = (80, 24)
DATA = Path(__file__).with_name("data")


# -- a real lab -------------------------------------------------------------------------------------

class TuiLab(Lab):
    """A leader and one simulated 4-GPU agent (``ws1``), the admin's token, and a user ``bob``."""

    def start(self) -> TuiLab:
        self.start_leader()
        # bob has no Unix account here: the admin maps him to nobody, as a lab would (README: Users and accounts)
        user_map = self.data / "agents" / "ws1" / "user-map.toml"
        user_map.parent.mkdir(parents=True, exist_ok=True)
        user_map.write_text('[users]\nbob = "nobody"\n')
        self.start_agent("ws1", "sim:ws-4x3090")
        self.token = load_credentials(self.home / ".config/labq/credentials")["token"]
        self.admin_user = self.client().whoami()["user"]
        self._bob: str | None = None
        return self

    def agent_log(self, name: str = "ws1", chars: int = 4000) -> str:
        return (self.root / f"agent-{name}.log").read_text(errors="replace")[-chars:]

    def client(self, token: str | None = None) -> Client:
        return Client(self.url, token or self.token)

    @property
    def bob(self) -> str:
        """The token of ``bob``, a user who is not an admin (made on first use)."""
        if self._bob is None:
            printed = self.labq("admin", "user", "add", "bob", "--print").stdout
            self._bob = next(line.split('"')[1] for line in printed.splitlines() if line.startswith("token = "))
        return self._bob

    def app(self, token: str | None = None, *, readonly: bool = False, **options) -> LabqApp:
        """The app as ``labq tui`` makes it (``options``: ``make_app``'s, e.g. ``keep_finished_s``), with a client
        that tells the test what the feed did."""
        feed = FeedWatch()

        def client_factory() -> Client:
            return Client(self.url, token or self.token, transport=feed.watching(socket_transport))

        app = make_app(client_factory=client_factory, readonly=readonly, **options)
        app.feed_watch = feed
        app.notices = []
        notify = app.notify

        def remember(message, *args, **kwargs):
            app.notices.append(str(message))
            return notify(message, *args, **kwargs)

        app.notify = remember
        return app

    def clean(self) -> None:
        """Cancels every unfinished job and waits until none is left, so the next test starts empty."""
        client = self.client()
        jobs, _ = client.queue()
        for job in jobs:
            if not job.get("stop_requested"):
                try:
                    client.action(job["id"], "cancel")
                except Exception:  # noqa: BLE001 - it may have ended meanwhile
                    pass
        self.wait(lambda: not client.queue()[0], "every job to end", timeout=30,
                  detail=lambda: client.queue()[0])


class FeedWatch:
    """What the TUI's client did: full loads of the queue, and whether the event stream is open."""

    def __init__(self) -> None:
        self.full_loads = 0
        self.subscribed = threading.Event()

    def watching(self, transport: Transport) -> Transport:
        """``transport``, telling this watch what goes through it."""

        def watched(request: Request) -> Response:
            query = request.query
            if request.path == "/v1/jobs" and query.get("pending") == ["1"] and "id" not in query:
                self.full_loads += 1  # the whole queue, as Client.queue() with no ids asks for it
            answer = transport(request)
            if request.path == "/v1/events":
                # the leader has taken the stream's starting point once its headers are here
                self.subscribed.set()
            return answer

        return watched


@pytest.fixture(scope="module")
def shared_lab(tmp_path_factory):
    made = TuiLab(tmp_path_factory.mktemp("lab"))
    try:
        yield made.start()
    finally:
        made.close()


@pytest.fixture
def lab(shared_lab):
    """The module's lab, empty at the start of each test."""
    shared_lab.clean()
    yield shared_lab


@pytest.fixture
def own_lab(tmp_path):
    """A lab for this test alone (for tests that kill its processes)."""
    made = TuiLab(tmp_path)
    try:
        yield made.start()
    finally:
        made.close()


# -- driving the app ---------------------------------------------------------------------------------

def drive(app: LabqApp, scenario: Callable) -> None:
    """Runs ``scenario(pilot)`` against the app at 80x24, once its queue is loaded and following."""

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.connected and app.feed_watch.subscribed.is_set(),
                        "the app to load the queue and follow the event stream", lambda: app.status)
            await scenario(pilot)

    asyncio.run(main())


async def until(pilot, condition: Callable[[], object], what: str, detail: Callable[[], object] = lambda: "",
                timeout: float = 20) -> None:
    """Waits (in 0.1 s steps, at most ``timeout``) until ``condition()`` holds; fails saying what it waited for."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}: {detail()}")
        await pilot.pause(0.1)


async def type_text(pilot, text: str) -> None:
    """Types ``text`` into the focused input, a key per character."""
    await pilot.press(*["space" if c == " " else c for c in text])


async def point_at(pilot, job_id: int) -> None:
    """Moves the table's cursor to ``job_id`` with the arrow keys."""
    table = pilot.app.screen.table
    await until(pilot, lambda: job_id in table.shown, f"job {job_id} in the table", lambda: table.shown)
    await pilot.press("home", *["down"] * table.shown.index(job_id))
    assert table.cursor_job() == job_id


# -- a canned leader, for snapshots -------------------------------------------------------------------

class CannedLeader:
    """The leader as an app the TUI's client calls in-process (``labq.transport``), answering from
    ``data/lab.json``.

    ``/v1/events`` stays open and sends only keepalives, as a quiet leader does, until ``close()``.
    """

    url = "http://canned-leader.invalid:7733"  #: never resolved: requests go to ``__call__``

    def __init__(self, state: dict) -> None:
        self.state = state
        self.requests: list[str] = []
        self.closing = threading.Event()

    def __call__(self, request: Request) -> Response:
        self.requests.append(request.path)
        if request.path == "/v1/events":
            return Response(200, {"Content-Type": "text/event-stream"}, Keepalives(self.closing))
        body = self.answer(request.path, request.query)
        if body is None:
            return Response.json(404, {"error": {"code": "not_found", "message": f"no route {request.path}"}})
        return Response.json(200, body)

    def answer(self, path: str, query: dict) -> dict | None:
        state = self.state
        if path == "/v1/whoami":
            return state["whoami"]
        if path == "/v1/jobs":
            ids = {int(i) for i in query.get("id", [])}
            jobs = [j for j in state["jobs"] if not ids or j["id"] in ids]
            return {"jobs": jobs, "pending": {k: v for k, v in state["pending"].items() if int(k) in {
                j["id"] for j in jobs}}}
        if path == "/v1/nodes":
            return {"nodes": state["nodes"], "unadmitted": []}
        if path == "/v1/reservations":
            return {"reservations": state["reservations"]}
        return None

    def app(self, readonly: bool = False) -> LabqApp:
        return make_app(client_factory=lambda: Client(self.url, "canned-token", transport=self),
                        clock=lambda: self.state["now"], readonly=readonly)

    def close(self) -> None:
        self.closing.set()


class Keepalives:
    """An event stream's body: a keepalive now and then once a second, until the leader closes or the reader
    closes or interrupts it."""

    def __init__(self, closing: threading.Event) -> None:
        self.closing, self.ended = closing, threading.Event()
        self.first = True
        self.queued: list[bytes] = []

    def readline(self) -> bytes:
        if not self.queued:
            if not self.first:
                self.ended.wait(1)
            self.first = False
            if self.ended.is_set() or self.closing.is_set():
                return b""
            self.queued = [b"\n", b": keepalive\n"]
        return self.queued.pop()

    def read(self) -> bytes:
        return b""

    def close(self) -> None:
        self.ended.set()

    interrupt = close


@pytest.fixture
def canned_leader():
    made = CannedLeader(json.loads((DATA / "lab.json").read_text()))
    try:
        yield made
    finally:
        made.close()


# -- a canned lab with bookings that overlap, for the timeline ------------------------------------------

def overlapping_bookings(now: float) -> list[dict]:
    """Bookings on ``ws1`` (4 GPUs) that overlap and that touch, one that began before ``now``, one with a
    long name, and one on ``ws9``, a node that went away: as ``GET /v1/reservations`` lists them."""
    h = 3600.0

    def booking(name: str, node: str, gpus: list[int], start_h: float, end_h: float) -> dict:
        return {"name": name, "owner": "alice", "gpus": len(gpus), "start": now + start_h * h, "end": now + end_h * h,
                "users": [], "group": None, "node": node, "gpu_indices": gpus, "gpu_model": None,
                "min_gpu_memory_mib": 0, "score": 0, "created_at": now - 86400.0, "note": "", "cancelled_at": None}

    return [booking("paper-deadline", "ws1", [0, 1], -6, 20),  # began before now
            booking("bert-large-pretraining-sweep", "ws1", [2, 3], 4, 30),  # overlaps paper-deadline
            booking("eval", "ws1", [0, 1], 20, 26),  # right after paper-deadline, on its GPUs
            booking("demo", "ws1", [0], 40, 42),  # too short for its name at 80 columns
            booking("old-node-reservation", "ws9", [0], 10, 40)]  # ws9 went away


def busy_gpus(state: dict) -> dict:
    """``state`` (``data/lab.json``) with what real agents report: ws1's GPUs' memory and use (one GPU not
    measured), an 8-GPU node whose GPU 5 runs a process labq did not start, and a node that was lost."""
    ws1 = state["nodes"][0]
    ws1["gpu_usage"] = {"0": {"memory_free_mib": 3900, "utilization_pct": 97},
                        "1": {"memory_free_mib": 12300, "utilization_pct": 45},
                        "2": {"memory_free_mib": 24000, "utilization_pct": 0},
                        "3": {"memory_free_mib": None, "utilization_pct": None}}
    gpus = [{"index": i, "uuid": f"GPU-a100-{i}", "model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920}
            for i in range(8)]
    dgx = {**ws1, "name": "dgx1", "gpus": gpus, "gpus_in_use": {}, "unmanaged_busy": [5], "topology": None,
           "gpu_usage": {str(i): {"memory_free_mib": 81920 - 11000 * i, "utilization_pct": 14 * i} for i in range(8)}}
    lost = {**ws1, "name": "ws2", "health": "lost", "gpus_in_use": {}, "gpu_usage": {}}
    state["nodes"] = [ws1, dgx, lost]
    return state


def booked_canned_leader() -> CannedLeader:
    """The canned leader of ``data/lab.json`` with ``overlapping_bookings`` (close it after use)."""
    state = json.loads((DATA / "lab.json").read_text())
    state["reservations"] = overlapping_bookings(state["now"])
    return CannedLeader(state)


# -- how data/lab.json was made -------------------------------------------------------------------------

FIXED_NOW = 1_767_261_600.0  #: 2026-01-01 10:00 UTC: the canned lab's "now"


def capture(root: Path) -> dict:
    """Builds a small busy lab on a real leader and returns what the TUI loads from it, its times moved so
    that "now" is ``FIXED_NOW`` and the admin renamed ``alice`` (bob's jobs only wait: he has no account
    here to run them). ``python -m tests.tui.labs`` rewrites ``data/lab.json``; the snapshots then need
    ``--snapshot-update``."""
    lab = TuiLab(root).start()
    try:
        bob = lab.bob
        bert = lab.submit("sleep", "300", gpus=2, name="bert-large", time="6h", **{"class": "high"})
        resnet = lab.submit("sleep", "300", gpus=1, name="resnet50")
        llama = lab.submit("sleep", "300", gpus=1, name="llama-ft")
        for job in (bert, resnet, llama):
            lab.wait_state(job, "running")
        lab.client().action(llama, "preempt")
        lab.wait(lambda: lab.job(llama)["attempt"] == 2 and lab.job(llama)["state"] == "running", "llama to rerun")
        lab.submit("python", "sweep.py", "--trials", "64", gpus=4, name="sweep")
        held = lab.submit("python", "eval.py", gpus=1, name="eval", token=bob)
        lab.labq("hold", str(held), token=bob)
        lab.submit("python", "scavenge.py", gpus=1, **{"class": "low"}, token=bob)
        client = lab.client()
        lab.wait(lambda: len(client.queue()[1]) == 3, "the reasons the three waiting jobs wait")
        now = time.time()
        jobs, pending = client.queue()
        state = {"now": now, "whoami": client.whoami(), "jobs": jobs, "nodes": client.nodes(),
                 "pending": {str(k): v for k, v in pending.items()}, "reservations": client.reservations()}
    finally:
        lab.close()
    text = json.dumps(state).replace(f'"{lab.admin_user}"', '"alice"').replace(str(Path.cwd()), "/home/alice/bert")
    return _shift_times(json.loads(text), FIXED_NOW - now)


def _shift_times(doc, delta: float):
    if isinstance(doc, dict):
        return {k: (v + delta if isinstance(v, float) and (k.endswith("_at") or k in ("now", "estimated_start",
                                                                                       "last_seen")) else
                    _shift_times(v, delta)) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_shift_times(v, delta) for v in doc]
    return doc


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        DATA.mkdir(exist_ok=True)
        (DATA / "lab.json").write_text(json.dumps(capture(Path(tmp)), indent=1) + "\n")
