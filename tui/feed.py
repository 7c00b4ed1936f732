"""The TUI's link to the leader: one thread loads the lab, then follows the event stream.

It never polls every row: after the first load it reads ``/v1/events`` and fetches only the
jobs an event names, in batches (every ``BATCH_S``), plus the nodes or reservations when an
event says they changed. A job that starts, stops or moves changes who holds which GPUs, so its
event fetches the nodes too. An agent's report (its lease, its GPUs' memory and use) comes with no
event: the nodes are also asked for every ``NODES_POLL_S``, one small request. When the leader
cannot be reached it posts ``Connection(False)``, waits, and starts over with a full load, so the
screen heals by itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from textual.message import Message

from labq.client import Client
from labq.protocol.errors import ApiError

BATCH_S = 0.1
NODES_POLL_S = 2.0  #: how old the nodes' lease ages and GPU use may get
RETRY_S = (0.5, 1, 2, 4, 5)
FINISHED = {"succeeded", "failed", "cancelled", "timeout"}


@dataclass
class LabLoaded(Message):
    """Everything at once: after the start and after every reconnect."""

    jobs: list[dict]
    pending: dict[int, dict]
    nodes: list[dict]
    reservations: list[dict]
    whoami: dict


@dataclass
class JobsChanged(Message):
    """Jobs that changed (their new docs; a finished job's doc says so) and their pending reasons."""

    jobs: list[dict]
    pending: dict[int, dict]
    finished: dict[int, str]  #: job id -> its final state: the leader keeps finished jobs only in its history


@dataclass
class NodesChanged(Message):
    nodes: list[dict]

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, NodesChanged)


@dataclass
class ReservationsChanged(Message):
    reservations: list[dict]

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ReservationsChanged)


@dataclass
class Connection(Message):
    up: bool
    detail: str = ""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, Connection)


@dataclass
class JobEvent(Message):
    """One event about one job, for the job detail screen's event list."""

    job_id: int
    at: float
    data: dict


@dataclass
class Notice(Message):
    """A notice for the person at the TUI (``labq notify``, ``labq submit --notify``): its one line of text."""

    text: str


class LeaderFeed:
    def __init__(self, client: Client, post: Callable[[Message], object]) -> None:
        self.client = client
        self.post = post
        self.stop = threading.Event()
        self._dirty: set[int] = set()
        self._finished: dict[int, dict] = {}
        self._nodes_dirty = False
        self._nodes_sent: list[dict] | None = None
        self._lock = threading.Lock()
        #: one flush at a time: a flush's answer posted after a later flush's would show a job as it was before
        self._flushing = threading.Lock()

    def close(self) -> None:
        """Stop following: ends the blocked read of the event stream, so the thread ends now."""
        self.stop.set()
        self.client.close_events()

    def run(self) -> None:
        attempt = 0
        while not self.stop.is_set():
            try:
                self._follow()
                attempt = 0
            except ApiError as err:
                if self.stop.is_set():
                    return
                if err.status in (401, 403):
                    self.post(Connection(False, str(err)))
                    return
                self.post(Connection(False, str(err)))
                self.stop.wait(RETRY_S[min(attempt, len(RETRY_S) - 1)])
                attempt += 1

    def _follow(self) -> None:
        client = self.client
        stream = client.events()  # open before the load: what changes after the load is in the stream
        try:
            whoami = client.whoami()
            jobs, pending = client.queue()
            nodes, reservations = client.nodes(), client.reservations()
        except BaseException:
            stream.close()
            raise
        self._nodes_sent = nodes
        self.post(LabLoaded(jobs, pending, nodes, reservations, whoami))
        self.post(Connection(True))
        done = threading.Event()  #: this follow ended: its flusher ends too, before the next follow starts one
        threading.Thread(target=self._flush_loop, args=(done,), name="labq-tui-batches", daemon=True).start()
        try:
            for event in stream:
                if self.stop.is_set():
                    return
                self._take(event)
        finally:
            stream.close()
            done.set()
            self._flush()

    def _take(self, event: dict) -> None:
        data, kind = event["data"], event["event"]
        if kind == "job" and isinstance(data, dict) and "job_id" in data:
            self.post(JobEvent(data["job_id"], time.time(), data))
            with self._lock:
                if data.get("state") in FINISHED:
                    self._finished[data["job_id"]] = data
                    self._dirty.discard(data["job_id"])
                else:
                    self._dirty.add(data["job_id"])
                if "state" in data:  # started, stopped, moved: the GPUs it holds changed
                    self._nodes_dirty = True
        elif kind == "node":
            with self._lock:
                self._nodes_dirty = True
        elif kind == "reservation":
            self.post(ReservationsChanged(self.client.reservations()))
        elif kind == "notify" and isinstance(data, dict) and isinstance(data.get("text"), str):
            self.post(Notice(data["text"]))  # the leader sends a person their own notices alone

    def _flush_loop(self, done: threading.Event) -> None:
        polled = time.monotonic()
        while not done.wait(BATCH_S) and not self.stop.is_set():
            if time.monotonic() - polled >= NODES_POLL_S:
                polled = time.monotonic()
                with self._lock:
                    self._nodes_dirty = True
            try:
                self._flush()
            except Exception:  # noqa: BLE001 - any failure: start over with a full load, never follow without batches
                self.client.close_events()
                return

    def _flush(self) -> None:
        with self._flushing:
            self._flush_now()

    def _ended(self, job_id: int, ended: dict[int, str]) -> list[dict]:
        """The final doc of a job that left the queue (the leader's history has it), else ``ended`` marks it."""
        try:
            return [self.client.job(job_id)[0]]
        except ApiError as err:
            if err.status != 404:
                raise
            ended[job_id] = "finished"
            return []

    def _flush_now(self) -> None:
        with self._lock:
            ids, self._dirty = sorted(self._dirty), set()
            finished, self._finished = self._finished, {}
            nodes_dirty, self._nodes_dirty = self._nodes_dirty, False
        jobs: list[dict] = []
        pending: dict[int, dict] = {}
        for start in range(0, len(ids), 500):
            got, waits = self.client.queue(ids[start:start + 500])
            jobs += got
            pending.update(waits)
        seen = {j["id"] for j in jobs}
        ended = {i: data["state"] for i, data in finished.items()}
        for i in ids:
            if i not in seen and i not in ended:  # it ended after its event: its end's own event may not be read yet
                jobs += self._ended(i, ended)
        if jobs or ended:
            self.post(JobsChanged(jobs, pending, ended))
        if nodes_dirty:
            nodes = self.client.nodes()
            if nodes != self._nodes_sent:
                self._nodes_sent = nodes
                self.post(NodesChanged(nodes))
