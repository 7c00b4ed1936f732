"""Benchmark of what notifications cost a submit: ``POST /v1/jobs`` latency, p50 and p99, in a lab whose jobs keep
starting and ending, with notifications off, on with a channel that takes every notice at once (the outbox's own
cost), and on with a real webhook receiver.

What it measures: a real leader (``labq.leader``, its HTTP server on loopback in this process, a TinyDB store in a
temp folder, the scheduler thread and, with notifications on, the webhook channel's thread; the interpreter's
switch interval as ``labq leader`` sets it) with 4 ``sim:dgx1`` nodes registered through the API. A stand-in for
the agents (a thread) takes every placed job to running and, once it has run 20 ms, to succeeded, through
``LabState.apply`` as an agent's sync does. With notifications on, the owner asked for ``start,end``: each of those
commits carries the job's outbox record, the channel's thread sends each notice and commits the removals (one
commit a second). ``sink``: the channel takes each notice without a network (what the outbox, its commits and the
notices cost); ``webhook``: an HTTP POST to a real receiver on loopback (``http.server`` in a process of its own,
as a chat server is, but on this machine's cores). Meanwhile ``--submits`` 1-GPU jobs are submitted one after the
other over HTTP by the owner (one ``labq.client.Client``, kept connection), each timed from the call to its answer,
after ``--warmup`` untimed ones. A submit writes no outbox record itself (no moment of a job notifies at submit):
what notifications cost it is the work of the other threads beside it (under the leader's lock and the
interpreter's), and the commits that share the store's journal. Each job makes 2 notices, so the lab here notifies
hundreds of times a second: a busy lab's day in a minute.

Each mode runs ``--rounds`` times, in turn (off, sink, webhook, off, ...), each in a fresh folder; the samples of a
mode are pooled. Checked: every submit answered 201; with notifications on, every job that ended was notified
(2 notices a job) and the outbox is empty at the end; a violation is printed after the figures and exits 1.

Goal (issue: notifications when jobs end): the outbox's effect on a submit's latency is not measurable: the
``sink`` rows' ratios to ``off`` are within the spread between the ``off`` rounds themselves (``off_rounds_*_spread``:
the slowest round's p50 or p99 over the fastest's, the same lab measured again); the ``webhook`` rows add the HTTP
exchanges. Timings are printed, never asserted.

Run:  .venv/bin/python bench/notify.py [--submits 1000] [--warmup 50] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from figures import print_figures  # noqa: E402

from labq.client import Client  # noqa: E402
from labq.leader.config import NotifyConfig  # noqa: E402
from labq.leader.main import SWITCH_INTERVAL_S  # noqa: E402
from labq.models import transitions as t  # noqa: E402
from labq.models.job import JobState  # noqa: E402
from labq.topologies import parse_sim_spec  # noqa: E402
from tests.leader.loopback_leader import start_loopback_leader  # noqa: E402

#: the webhook's receiver, a process of its own as a chat server is: counts the POSTs, says how many at GET /count
RECEIVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
seen = 0
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        global seen
        json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        seen += 1
        self.answer(b"ok")
    def do_GET(self):
        self.answer(str(seen).encode())
    def answer(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""
NODES = 4
RUN_S = 0.02  #: how long the stand-in agents let a job run


def node_doc(name: str) -> dict:
    sim = parse_sim_spec("sim:dgx1")
    return {"name": name, "gpus": [{"index": g.index, "uuid": g.uuid, "model": g.model, "memory_mib": g.memory_mib}
                                   for g in sim.gpus(name)],
            "topology": {"pcie": [[int(v) for v in r] for r in sim.topology.pcie],
                         "nvlinks": [list(r) for r in sim.topology.nvlinks], "nvswitch_links": [], "numa": []},
            "unmanaged_busy": [], "simulated": True, "labels": []}


def agents(state, stop: threading.Event) -> None:
    """The nodes' agents, as far as the leader sees them: placed jobs run, and succeed RUN_S later."""
    while not stop.wait(0.005):
        with state.lock:
            now = state.clock()
            updates = [t.running(j, now) if j.state is JobState.STARTING else t.exited(j, 0, now)
                       for j in state.on_gpus.values()
                       if j.state is JobState.STARTING or (j.state is JobState.RUNNING and now - j.started_at >= RUN_S)]
            if updates:
                state.apply(updates)


class Receiver:
    """The webhook's receiver in a process of its own."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE, text=True)
        self.port = int(self.proc.stdout.readline())
        self.url = f"http://127.0.0.1:{self.port}/hooks/bench"

    def count(self) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/count")
            return int(conn.getresponse().read())
        finally:
            conn.close()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Sink:
    """A channel that takes every notice at once, without a network."""

    name, target = "webhook", "(a sink)"
    taken = 0

    def wants(self, email: str | None, webhook: bool) -> bool:
        return webhook

    def send(self, notice, to: str | None = None) -> None:
        self.taken += 1


MODES = ("off", "sink", "webhook")


def run_lab(mode: str, submits: int, warmup: int, problems: list[str]) -> dict:
    """One lab: the submit latencies (ms) and what was notified."""
    notify = mode != "off"
    receiver = Receiver() if mode == "webhook" else None
    sink = Sink() if mode == "sink" else None
    with tempfile.TemporaryDirectory(prefix="labq-bench-notify-") as folder:
        config = NotifyConfig(webhook_url=receiver.url if receiver else "http://127.0.0.1:9/") if notify \
            else NotifyConfig()
        lb = start_loopback_leader(Path(folder), notify=config)
        stop = threading.Event()
        try:
            status, _, doc = lb.request("POST", "/v1/users", {"name": "alice"})
            token = doc["token"]
            for i in range(NODES):
                status, _, doc = lb.request("POST", "/v1/agents/register", {"node": node_doc(f"n{i}"),
                                                                            "version": "0"}, token=lb.join_token)
                assert status == 200, doc
            if notify:
                status, _, doc = lb.request("PUT", "/v1/notify", {"on": ["start", "end"]}, token=token)
                assert status == 200, doc
            if sink is not None:
                lb.leader.notify.outbox.lines["webhook"].channel = sink
            lb.leader.start()
            driver = threading.Thread(target=agents, args=(lb.leader.state, stop), daemon=True)
            driver.start()
            times = []
            began = time.perf_counter()
            with Client(f"http://127.0.0.1:{lb.port}", token, timeout=30) as client:
                for n in range(warmup + submits):
                    sent = time.perf_counter()
                    client.submit({"command": ["train"], "gpus": 1, "workdir": "/tmp"})
                    if n >= warmup:
                        times.append((time.perf_counter() - sent) * 1000.0)
            took_s = time.perf_counter() - began
            state = lb.leader.state

            def taken() -> int:
                return receiver.count() if receiver else sink.taken if sink else 0

            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # every job ends, and (notifications on) every notice is delivered
                with state.lock:
                    left = len(state.jobs)
                    queued = sum(len(line.pending) for line in lb.leader.notify.outbox.lines.values())
                if not left and not queued and (not notify or taken() >= 2 * (warmup + submits)):
                    break
                time.sleep(0.05)
            ended = warmup + submits - left
            notices = taken()
            if left:
                problems.append(f"{left} jobs had not ended a minute after the last submit")
            if notify and (notices != 2 * ended or queued):
                problems.append(f"notifications on: {notices} notices for {ended} jobs ended, {queued} still queued")
        finally:
            stop.set()
            lb.stop()
            if receiver is not None:
                receiver.close()
    return {"times": times, "notices": notices, "ended": ended, "submits_per_s": (warmup + submits) / took_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submits", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    sys.setswitchinterval(SWITCH_INTERVAL_S)  # as ``labq leader`` runs (``labq.leader.main.start_leader``)
    problems: list[str] = []
    pooled: dict[str, list[float]] = {m: [] for m in MODES}
    rounds: dict[str, list[list[float]]] = {m: [] for m in MODES}  #: each round's samples, for the noise floor
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    notices = dict.fromkeys(MODES, 0)
    ended = dict.fromkeys(MODES, 0)
    for _ in range(args.rounds):
        for mode in MODES:
            got = run_lab(mode, args.submits, args.warmup, problems)
            pooled[mode] += got["times"]
            rounds[mode].append(got["times"])
            rates[mode].append(got["submits_per_s"])
            notices[mode] += got["notices"]
            ended[mode] += got["ended"]
    fig: dict[str, object] = {"submits_per_mode": len(pooled["off"])}
    for mode in MODES:
        fig[f"{mode}_p50_ms"] = statistics.median(pooled[mode])
        fig[f"{mode}_p99_ms"] = pct(pooled[mode], 0.99)
    for mode in MODES[1:]:
        fig[f"{mode}_p50_ratio"] = fig[f"{mode}_p50_ms"] / fig["off_p50_ms"]
        fig[f"{mode}_p99_ratio"] = fig[f"{mode}_p99_ms"] / fig["off_p99_ms"]
    for q, of in (("p50", statistics.median), ("p99", lambda xs: pct(xs, 0.99))):  # off against off: the noise
        per_round = [of(times) for times in rounds["off"]]
        fig[f"off_rounds_{q}_spread"] = max(per_round) / min(per_round)
    for mode in MODES:
        fig[f"{mode}_submits_per_s"] = statistics.mean(rates[mode])
    for mode in MODES[1:]:
        fig[f"{mode}_jobs_ended"], fig[f"{mode}_notices"] = ended[mode], notices[mode]
    if args.json:
        print(json.dumps(fig))
    else:
        goals = {f"sink_{q}_ratio": (f"<= off's spread ({fig[f'off_rounds_{q}_spread']:.3f})",
                                     fig[f"sink_{q}_ratio"] <= max(fig[f"off_rounds_{q}_spread"], 1.0))
                 for q in ("p50", "p99")}
        print_figures(f"labq submit latency with notifications off, to a sink, to a webhook ({NODES} nodes x 8 GPUs, "
                      f"jobs of {RUN_S * 1000:g} ms, {args.rounds} rounds, Python {sys.version.split()[0]})", fig,
                      goals)
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
