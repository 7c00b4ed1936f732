"""The leader's Prometheus metrics (``GET /metrics``), with ``prometheus_client``.

Two kinds, in one registry of the leader's own (two leaders in one process keep theirs apart):

* what the lab *is*, read from ``LabState`` at each scrape (``LabCollector``): jobs by state and class,
  each node's GPUs (total, allocated, reserved, busy with processes labq does not manage), what the agents
  last measured of each GPU (utilisation, memory used), whether each agent is up and how long since it
  was heard from;
* what *happened*, counted as it happens: jobs submitted and ended, preemptions, GPU-time lost to them,
  the queue wait of each start, scheduling pass durations, store commit latencies, API requests by route,
  method and status.

No label carries a user's name: a scrape is for the lab's health, and ``labq usage`` answers who used what.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Iterator
from operator import attrgetter

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

#: the answer's Content-Type: the text format every Prometheus reads (Debian 12's 2.42 too); labq's names and
#: labels are all plain ones, so the text is the same in both versions of the format
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

from labq.leader.bookings import Bookings
from labq.leader.state import LabState
from labq.models.job import Job, JobState
from labq.models.node import NodeHealth
from labq.models.priority import priority_name
from labq.scheduler.policy import waiting_since

_STATE, _SPEC, _PRIORITY = attrgetter("state"), attrgetter("spec"), attrgetter("priority")
#: queue waits: from seconds (an idle lab) to days (a deadline week)
WAIT_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400)
#: a pass: milliseconds on a small queue, about a second on a very long one
PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: a durable commit: an fsync, from a fast SSD to a busy disk
COMMIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    """The leader's registry, its counters, and the hooks that feed them (``watch``)."""

    def __init__(self, state: LabState, bookings: Bookings) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.submitted = Counter("labq_jobs_submitted", "Jobs submitted", registry=r)
        self.ended = Counter("labq_jobs_ended", "Jobs that ended, by how", ["state"], registry=r)
        self.preemptions = Counter("labq_preemptions", "Jobs asked to make room (checkpoint and stop)", registry=r)
        self.work_lost = Counter("labq_work_lost_gpu_seconds", "GPU-seconds of work lost since the last "
                                 "checkpoint of preempted or lost attempts", registry=r)
        self.wait = Histogram("labq_job_queue_wait_seconds", "Time from joining the queue to an attempt's start",
                              buckets=WAIT_BUCKETS, registry=r)
        self.passes = Histogram("labq_scheduling_pass_seconds", "Duration of a scheduling pass",
                                buckets=PASS_BUCKETS, registry=r)
        self.commits = Histogram("labq_store_commit_seconds", "Latency of a durable store commit (group commit "
                                 "and fsync included)", buckets=COMMIT_BUCKETS, registry=r)
        self.requests = Counter("labq_api_requests", "API requests, by route, method and status",
                                ["route", "method", "status"], registry=r)
        r.register(LabCollector(state, bookings))

    def watch(self, versions: list[tuple[Job | None, Job]]) -> None:
        """The (old or None, new) versions of jobs one change took in (``LabState.watchers``): count what changed.
        A submit's jobs count in one step: an array's 10,000 tasks are one increment, not 10,000."""
        submitted = 0
        for old, new in versions:
            if old is None and new.state is JobState.QUEUED and new.attempt == 1 and not new.history:
                submitted += 1
            if new.state.finished and (old is None or not old.state.finished):
                self.ended.labels(new.state.value).inc()
            if new.state is JobState.PREEMPTING and (old is None or old.state is not JobState.PREEMPTING):
                self.preemptions.inc()
            lost = new.work_lost_s - (old.work_lost_s if old is not None else 0.0)
            if lost > 0:
                self.work_lost.inc(lost * new.spec.gpus)
            if new.started_at is not None and (old is None or old.started_at != new.started_at):
                self.wait.observe(max(0.0, new.started_at - waiting_since(new)))
        if submitted:
            self.submitted.inc(submitted)

    def request(self, route: str, method: str, status: int) -> None:
        self.requests.labels(route, method, str(status)).inc()

    def exposition(self) -> bytes:
        """The whole registry in Prometheus's text format."""
        return generate_latest(self.registry)


class TimedStore:
    """The leader's store, with each commit's latency observed (everything else passes through)."""

    def __init__(self, store, histogram: Histogram) -> None:
        self._store, self._histogram = store, histogram

    def commit(self, changes):
        began = time.perf_counter()
        try:
            return self._store.commit(changes)
        finally:
            self._histogram.observe(time.perf_counter() - began)

    def stage(self, changes):
        began = time.perf_counter()
        return _TimedCommit(self._store.stage(changes), began, self._histogram)

    def __getattr__(self, name: str):
        return getattr(self._store, name)


class _TimedCommit:
    """A staged commit whose latency, from its turn to write to its sync, is observed when it is first waited for
    (what the change did meanwhile, holding the lock, is in it too)."""

    def __init__(self, staged, began: float, histogram: Histogram) -> None:
        self._staged, self._began, self._histogram = staged, began, histogram

    @property
    def taken_in(self) -> bool:  # asked at the time: a commit lost with one taken in counts as taken in
        return self._staged.taken_in

    def wait(self) -> int:
        try:
            return self._staged.wait()
        finally:
            if self._histogram is not None:
                self._histogram.observe(time.perf_counter() - self._began)
                self._histogram = None


class LabCollector:
    """What the lab is at the moment of a scrape, from ``LabState`` (taken under its lock, briefly)."""

    def __init__(self, state: LabState, bookings: Bookings) -> None:
        self.state, self.bookings = state, bookings

    def describe(self) -> list:
        return []  # built at each scrape: nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self.state
        with state.view:
            now = state.clock()
            jobs = list(state.jobs.values())
            on_gpus = list(state.on_gpus.values())
            sessions = [(s.node, s.last_seen, dict(s.gpu_usage or {})) for s in state.agents.values()]
            reservations = [r for r in self.bookings.current(now) if r.start <= now and r.node is not None]
        # counted by (state, priority) at C speed, named per kind, not per job: a scrape of a long queue
        counts = Tally(zip(map(_STATE, jobs), map(_PRIORITY, map(_SPEC, jobs))))
        taken: dict[str, set[int]] = {}  # a GPU counts once: jobs share it, or a preemptor waits there in Slurm
        for job in on_gpus:
            for allocation in job.placement.allocations if job.placement is not None else ():
                taken.setdefault(allocation.node, set()).update(allocation.gpu_indices)
        allocated = {name: len(gpus) for name, gpus in taken.items()}
        named: dict[tuple[str, str], int] = {}
        for (job_state, priority), n in counts.items():
            key = (job_state.value, priority_name(priority))
            named[key] = named.get(key, 0) + n
        by_state = GaugeMetricFamily("labq_jobs", "Unfinished jobs, by state and priority class",
                                     labels=["state", "class"])
        for (job_state, klass), n in sorted(named.items()):
            by_state.add_metric([job_state, klass], n)
        yield by_state

        reserved: dict[str, int] = {}
        for r in reservations:
            reserved[r.node] = reserved.get(r.node, 0) + len(r.gpu_indices)
        gpus = GaugeMetricFamily("labq_node_gpus", "Each node's GPUs: total, allocated to jobs, reserved by a "
                                 "booking in effect, busy with processes labq does not manage", labels=["node", "kind"])
        up = GaugeMetricFamily("labq_agent_up", "1 while the node's agent is up (heard from within its lease)",
                               labels=["node"])
        silent = GaugeMetricFamily("labq_agent_last_seen_seconds", "Seconds since the node's agent was last heard "
                                   "from", labels=["node"])
        utilisation = GaugeMetricFamily("labq_gpu_utilization_ratio", "A GPU's utilisation as its agent last "
                                        "measured it (0 to 1)", labels=["node", "gpu", "model"])
        memory = GaugeMetricFamily("labq_gpu_memory_used_bytes", "A GPU's memory in use as its agent last measured "
                                   "it", labels=["node", "gpu", "model"])
        for node, last_seen, usage in sorted(sessions, key=lambda s: s[0].name):
            name = node.name
            gpus.add_metric([name, "total"], node.gpu_count)
            gpus.add_metric([name, "allocated"], allocated.get(name, 0))
            gpus.add_metric([name, "reserved"], reserved.get(name, 0))
            gpus.add_metric([name, "unmanaged_busy"], len(node.unmanaged_busy))
            up.add_metric([name], 1 if node.health is NodeHealth.UP else 0)
            silent.add_metric([name], max(0.0, now - last_seen))
            for gpu in node.gpus:
                measured = usage.get(gpu.index) or usage.get(str(gpu.index)) or {}
                labels = [name, str(gpu.index), gpu.model]
                if measured.get("utilization_pct") is not None:
                    utilisation.add_metric(labels, measured["utilization_pct"] / 100.0)
                if measured.get("memory_free_mib") is not None:
                    memory.add_metric(labels, max(0, gpu.memory_mib - measured["memory_free_mib"]) * 1024 * 1024)
        yield from (gpus, up, silent, utilisation, memory)
