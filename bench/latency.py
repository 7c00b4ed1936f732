"""Benchmark of labq as people feel it, over plain HTTP and TLS: command start-up, submit to running, submit rate.

What it measures, against a real ``labq leader`` and one ``labq agent`` (``sim:ws-4x3090``,
process runtime) started as processes in a temp folder with a temp HOME, once for a plain lab
and once for a TLS lab (``[leader] tls = "on"``: the credentials carry the lab's CA pin, the agent
reads it from the join token), each in a fresh temp folder, one after the other:
  * Submit to running on an idle GPU: 1-GPU ``sleep 30`` jobs, one at a time, through the API
    client, timed from just before the submit call to the ``running`` event on ``/v1/events``;
    on the way: the submit's answer, the ``starting`` event (the leader placed it), the agent's
    "starting job" log line and the job's own start time. Each job is cancelled and its
    ``cancelled`` event awaited, so the GPU is idle for the next; 2 warm-ups, 30 samples. Then
    3 jobs of ``sleep 0.1``: submit to ``succeeded`` (how soon a short job's end is known).
  * Wall time of ``labq submit -- true`` and ``labq ls`` as commands (2 warm-ups, then 20 runs
    each; median, p90), beside ``python -c pass`` and ``python -c "import labq.cli"`` with the
    same interpreter, so that interpreter start and labq's own cost are told apart. A 4-GPU
    ``sleep`` job fills the node from here on, so the submitted jobs queue. The TLS lab adds, in
    the same turns, ``labq ls`` with the kept CA removed first (a first call: it fetches the CA) and
    ``python -c "import labq.cli, labq.tls"`` (the imports a call to an ``https://`` leader adds); and, in this process, the time to build the pinned client context and a TCP
    connection with its TLS handshake alone (no request on it).
  * TCP connections and TLS handshakes of one ``labq submit -- true`` and one ``labq ls`` (and, over
    TLS, one first call), counted by running the CLI's ``main`` under a wrapper that counts
    ``socket.create_connection`` and ``SSLSocket.do_handshake`` calls (not timed).
  * Submits per second through the API: 32 threads, each with its own ``Client``, 25 submits
    each; submits/s, per-request median and p99. Cancelled afterwards (not timed).

What a CLI call costs over TLS (``labq/tls.py``, ``labq/client.py``, ``labq/transport.py``,
``labq/wire.py``): the process imports ``ssl`` (through ``labq.tls``; no ``http.client``: labq's own
small HTTP reader runs on the TLS socket as on a plain one), builds an ``SSLContext`` and loads the
lab's CA into it (``tls_context``), and makes its one request on a new TCP connection with a full TLS
handshake (TLS 1.3: one round trip; the leader's key is EC P-256; the client checks the chain against
the lab's CA and the name ``leader.labq``, not the address; ``tls_connect_and_handshake``). Every
request is a connection of its own and no TLS session is resumed (a fresh context in each process), so
``labq submit`` and ``labq ls``, one request each, make one connection and one full handshake each (the
``*_tcp_connections`` and ``*_tls_handshakes`` rows count them). The first call on a machine has no CA
yet: it first fetches it (``GET /v1/tls/ca`` on a connection that checks nothing: a second connection
and handshake), checks its SHA-256 against the pin, and keeps it next to the credentials; later calls
read it from there and make no extra request. The servers set ``TCP_NODELAY``: an answer written in two
pieces (headers, then body) would otherwise wait for the client's delayed ACK (about 40 ms on Linux),
which every TLS request paid before.

The same turns time ``labq submit -- true`` and ``labq ls`` through the agent's local socket
(``*_local_socket``: a person on the agent's machine with no credentials, ``LABQ_SOCKET``; the agent
vouches for them and forwards to the leader, over TLS in the TLS lab), to be no slower than loopback
HTTP to the leader (the plain lab's ``labq_submit`` and ``labq_ls``).

Goals (from the issue): median ``labq submit`` and ``labq ls`` within 150 ms; submit to
running p95 within 300 ms; TLS costs at most 20 ms per CLI call (median over TLS minus median over
plain HTTP, both labs run by the same invocation). Timings are reported, never asserted; the two
labs run one after the other on a noisy machine, so compare ``*_minus_python_pass_ms`` as well.
Consistency is checked in each lab (every submit got an id, ids are unique, every benchmark job
ends cancelled or succeeded, the counting wrapper saw each command's connection): a violation is
printed after the figures and exits with status 1. Progress goes to stderr.

``--json`` prints one object: with both transports ``{"transports", "plain": {...}, "tls": {...},
"tls_minus_plain": {...}, "goals_met": {"plain", "tls", "tls_cost"}, "problems", ...}``; with one,
its figures flat, as before, and ``"transport"``.

Run:  .venv/bin/python bench/latency.py [--transport plain|tls|both] [--json] [--keep] [--gpus sim:ws-4x3090]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

try:
    import labq  # noqa: F401
except ImportError:  # running from a checkout without an installed labq
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from figures import print_figures
from labq.client import Client
from labq.credentials import load_credentials
from labq.protocol.errors import ApiError

NEXT_TO_PYTHON = Path(sys.executable).with_name("labq")
LABQ = NEXT_TO_PYTHON if NEXT_TO_PYTHON.exists() else Path(__file__).resolve().parent.parent / ".venv/bin/labq"
COMMAND_RUNS, WARMUPS, START_SAMPLES, SHORT_SAMPLES, THREADS, EACH = 20, 2, 30, 3, 32, 25
COMMAND_GOAL_MS, START_P95_GOAL_MS, TLS_COST_GOAL_MS = 150.0, 300.0, 20.0
TRANSPORTS = ("plain", "tls")
#: how long a sample job runs before it is cancelled: the agent reports an exit at once only for
#: attempts its 0.25 s exit watcher saw running; an earlier end waits for the 20 s long poll
HOLD_S = 0.4
# the benchmarked lab lets its users ask for high (by default classes above normal are the admin's to grant)
CONFIG = '[leader]\nlisten = "127.0.0.1:0"\n[scheduling]\nmin_runtime = "0s"\nclass_grants = {high = ["*"]}\n[jobs]\ndefault_grace = "2s"\nallow_root = true\n'
TLS_CONFIG = CONFIG.replace('listen = "127.0.0.1:0"\n', 'listen = "127.0.0.1:0"\ntls = "on"\n')
#: runs the CLI's main as the ``labq`` script does, counting TCP connections and TLS handshakes (printed to
#: stderr at exit after COUNT_MARK): ``labq.wire`` and ``http.client`` both connect with
#: ``socket.create_connection``, looked up when they connect; ``ssl`` handshakes in ``SSLSocket.do_handshake``
COUNT_MARK = "labq-bench-count:"
COUNTING_MAIN = f"""
import atexit, json, socket, ssl, sys
seen = {{"tcp_connections": 0, "tls_handshakes": 0, "tls_resumed": 0, "tls_version": ""}}
connect, handshake = socket.create_connection, ssl.SSLSocket.do_handshake
def counted_connect(*args, **kwargs):
    seen["tcp_connections"] += 1
    return connect(*args, **kwargs)
def counted_handshake(self, *args, **kwargs):
    handshake(self, *args, **kwargs)
    seen["tls_handshakes"] += 1
    seen["tls_resumed"] += bool(self.session_reused)
    seen["tls_version"] = self.version() or ""
socket.create_connection, ssl.SSLSocket.do_handshake = counted_connect, counted_handshake
atexit.register(lambda: print("{COUNT_MARK}", json.dumps(seen), file=sys.stderr, flush=True))
from labq.cli import main
sys.argv[0] = "labq"
sys.exit(main())
"""


def ms(seconds: float) -> float:
    return seconds * 1000.0


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def summary(prefix: str, values: list[float], tails: bool = True) -> dict:
    """``PREFIX_n``, median and p95 of millisecond timings (and p99 and max with ``tails``)."""
    if not values:
        return {f"{prefix}_n": 0}
    fig = {f"{prefix}_n": len(values), f"{prefix}_median_ms": statistics.median(values),
           f"{prefix}_p95_ms": pct(values, 0.95)}
    if tails:
        fig |= {f"{prefix}_p99_ms": pct(values, 0.99), f"{prefix}_max_ms": max(values)}
    return fig


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Lab:
    """A leader and one agent as processes under ``root``; ``close`` ends them and their jobs.

    With ``tls`` the leader serves HTTPS (``tls = "on"``): ``pin`` is then the lab's CA pin from the first
    admin's credentials, and clients keep the CA next to the credentials, in ``ca_cache``, as the CLI does."""

    def __init__(self, root: Path, tls: bool = False) -> None:
        self.root, self.home, self.data = root, root / "home", root / "data"
        self.home.mkdir(parents=True)
        (root / "leader.toml").write_text(TLS_CONFIG if tls else CONFIG)
        self.tls = tls
        self.procs: list[subprocess.Popen] = []
        self.url = ""
        self.pin: str | None = None
        self.ca_cache = self.home / ".config" / "labq"
        self.client: Client | None = None
        self.socket = root / "agent.sock"  #: the agent's local socket: this machine's people need no token

    def local_env(self) -> dict:
        """A person on the agent's machine with no credentials: the CLI goes through the local socket."""
        nobody = self.root / "socket-home"
        nobody.mkdir(exist_ok=True)
        return self.env() | {"HOME": str(nobody), "XDG_CONFIG_HOME": str(nobody / ".config"),
                             "LABQ_SOCKET": str(self.socket)}

    def new_client(self, token: str) -> Client:
        """A client of this lab's leader with ``token`` (pinned to the lab's CA over TLS)."""
        return Client(self.url, token, pin=self.pin, ca_cache=self.ca_cache if self.pin else None)

    def forget_ca(self) -> None:
        """Remove the CA kept next to the credentials, so that the next CLI call is a first call."""
        for kept in self.ca_cache.glob("ca-*.pem"):
            kept.unlink(missing_ok=True)

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LABQ_")}
        return env | {"HOME": str(self.home), "XDG_CONFIG_HOME": str(self.home / ".config"), "PYTHONUNBUFFERED": "1"}

    def spawn(self, log: str, *args: str) -> subprocess.Popen:
        with open(self.root / log, "ab") as out:
            proc = subprocess.Popen([str(LABQ), *args], stdout=out, stderr=subprocess.STDOUT, env=self.env(),
                                    cwd=self.root, start_new_session=True)
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        path = self.root / name
        return path.read_text(errors="replace") if path.exists() else ""

    def wait(self, condition, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"gave up waiting for {what}; run with --keep and see the logs in {self.root}")
            time.sleep(0.02)

    def serve_leader(self) -> Client:
        """Starts the leader on ``leader.toml`` and returns a client with the first admin's token."""
        self.spawn("leader.log", "leader", "--no-mdns", "--config", str(self.root / "leader.toml"),
                   "--data-dir", str(self.data))
        served = re.compile(r"serving (https?://127\.0\.0\.1:\d+)")
        self.wait(lambda: served.search(self.log("leader.log")), "the leader to serve")
        self.url = served.search(self.log("leader.log"))[1]
        creds = self.ca_cache / "credentials"
        self.wait(lambda: creds.exists() and "token" in load_credentials(creds), "the first admin's token")
        saved = load_credentials(creds)
        self.pin = saved.get("pin")
        if self.url.startswith("https://") != bool(self.pin):
            raise RuntimeError(f"the leader serves {self.url}, its credentials have pin {self.pin!r}")
        if self.url.startswith("https://") != self.tls:
            raise RuntimeError(f"asked for a {'TLS' if self.tls else 'plain'} lab, the leader serves {self.url}")
        self.client = self.new_client(saved["token"])
        return self.client

    def start(self, gpus: str) -> Client:
        self.serve_leader()
        self.spawn("agent.log", "agent", "--leader", self.url, "--gpus", gpus, "--name", "ws1",
                   "--data-dir", str(self.data), "--local-socket", str(self.socket))
        self.wait(lambda: any(n["name"] == "ws1" and n["health"] == "up" for n in self.client.nodes()),
                  "the agent to join")
        say(f"leader {self.url} and agent ws1 ({gpus}) up in {self.root}")
        return self.client

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pid_file in self.data.glob("agents/*/runtime/attempts/*/pid.json"):  # jobs outlive agents by design
            try:
                os.killpg(json.loads(pid_file.read_text())["pid"], signal.SIGKILL)
            except (OSError, ValueError, KeyError, TypeError):
                pass


class Events:
    """Follows ``/v1/events``; remembers when each (job id, state) was first seen (``time.time()``)."""

    def __init__(self, client: Client) -> None:
        self.client, self.seen, self.cond, self.count = client, {}, threading.Condition(), 0
        threading.Thread(target=self._follow, name="events", daemon=True).start()

    def _follow(self) -> None:
        try:
            for event in self.client.events(after=0):
                now, data = time.time(), event["data"]
                with self.cond:
                    self.count += 1
                    if event["event"] == "job" and isinstance(data, dict) and "state" in data:
                        self.seen.setdefault((data["job_id"], data["state"]), now)
                    self.cond.notify_all()
        except ApiError:
            pass  # the leader went away at the end

    def wait(self, job_id: int | None, state: str, timeout: float = 30.0) -> float:
        """When ``job_id`` was first seen in ``state``; with ``job_id`` None, once any event came."""
        with self.cond:
            if not self.cond.wait_for(lambda: (job_id, state) in self.seen if job_id else self.count > 0, timeout):
                raise RuntimeError(f"no {state} event for job {job_id} within {timeout:g} s")
            return self.seen.get((job_id, state), 0.0)


def agent_starts(log: str) -> dict[int, float]:
    """When the agent logged "starting job N" (its local time, to the millisecond)."""
    found: dict[int, float] = {}
    for stamp, millis, job in re.findall(r"^(\S+ \S+),(\d{3}) labq\.agent INFO starting job (\d+) ", log, re.M):
        found.setdefault(int(job), datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp() + int(millis) / 1000)
    return found


def bench_start(lab: Lab, client: Client, events: Events, ids: list[int]) -> dict:
    rows = []
    for i in range(WARMUPS + START_SAMPLES):
        t0 = time.time()
        job = client.submit({"command": ["sleep", "30"], "gpus": 1, "workdir": str(lab.root)})
        answered = time.time()
        ids.append(job["id"])
        running = events.wait(job["id"], "running", 10.0)
        starting = events.wait(job["id"], "starting", 1.0)
        started_at = client.job(job["id"])[0]["started_at"]
        time.sleep(max(0.0, running + HOLD_S - time.time()))
        cancel = time.time()
        client.action(job["id"], "cancel")
        cancelled = events.wait(job["id"], "cancelled", 30.0)
        if i >= WARMUPS:
            rows.append((job["id"], t0, answered, starting, started_at, running, cancelled - cancel))
    ordered = agent_starts(lab.log("agent.log"))
    col = {name: [ms(r[k] - r[1]) for r in rows] for name, k in
           [("submit_answer", 2), ("starting", 3), ("process_started", 4), ("running", 5)]}
    col["agent_order"] = [ms(ordered[r[0]] - r[1]) for r in rows if r[0] in ordered]
    fig = {}
    for name in ("submit_answer", "starting", "agent_order", "process_started", "running"):
        if col[name]:  # agent_order is empty if the agent's log lines change
            fig |= {f"to_{name}_median_ms": statistics.median(col[name]), f"to_{name}_p95_ms": pct(col[name], 0.95)}
    fig["to_running_max_ms"] = max(col["running"])
    fig["cancel_to_cancelled_median_ms"] = ms(statistics.median(r[6] for r in rows))
    short = []
    say(f"short jobs: {SHORT_SAMPLES} x sleep 0.1, submit to succeeded")
    for _ in range(SHORT_SAMPLES):
        t0 = time.time()
        job = client.submit({"command": ["sleep", "0.1"], "gpus": 1, "workdir": str(lab.root)})
        ids.append(job["id"])
        short.append(ms(events.wait(job["id"], "succeeded", 60.0) - t0))
    return fig | {"short_job_to_succeeded_median_ms": statistics.median(short),
                  "short_job_to_succeeded_max_ms": max(short)}


def bench_commands(lab: Lab, ids: list[int]) -> dict:
    """The commands take turns, so that a change in the machine's load touches each alike."""
    commands = {"python_pass": [sys.executable, "-c", "pass"],
                "python_import_labq_cli": [sys.executable, "-c", "import labq.cli"],
                "labq_submit": [str(LABQ), "submit", "--", "true"], "labq_ls": [str(LABQ), "ls"],
                "labq_submit_local_socket": [str(LABQ), "submit", "--", "true"],
                "labq_ls_local_socket": [str(LABQ), "ls"]}
    if lab.pin:  # what TLS adds: its imports, and the first call's fetch of the CA
        commands |= {"python_import_labq_cli_tls": [sys.executable, "-c", "import labq.cli, labq.tls"],
                     "labq_ls_first_call": [str(LABQ), "ls"]}
    tls_turns = ", python -c 'import labq.cli, labq.tls', labq ls with no CA kept" if lab.pin else ""
    say(f"commands ({lab.url}), {WARMUPS}+{COMMAND_RUNS} turns: python -c pass, python -c 'import labq.cli', "
        f"labq submit -- true, labq ls{tls_turns}; then the same two API calls in this process")
    times: dict[str, list[float]] = {key: [] for key in commands}
    for i in range(WARMUPS + COMMAND_RUNS):
        for key, argv in commands.items():
            if key == "labq_ls_first_call":
                lab.forget_ca()
            start = time.perf_counter()
            env = lab.local_env() if key.endswith("_local_socket") else lab.env()
            out = subprocess.run(argv, env=env, cwd=lab.root, capture_output=True, text=True, timeout=60)
            elapsed = time.perf_counter() - start
            if out.returncode != 0:
                raise RuntimeError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip()}")
            if key.startswith("labq_submit"):
                ids.extend(int(n) for n in re.findall(r"submitted job (\d+)", out.stdout) or [0])
            if i >= WARMUPS:
                times[key].append(elapsed)
    for _ in range(COMMAND_RUNS):  # what the leader itself takes for the two
        start = time.perf_counter()
        ids.append(lab.client.submit({"command": ["true"], "gpus": 1, "workdir": str(lab.root)}).get("id"))
        middle = time.perf_counter()
        lab.client.jobs()
        times.setdefault("api_submit_call", []).append(middle - start)
        times.setdefault("api_ls_call", []).append(time.perf_counter() - middle)
    fig = {}
    for key, values in times.items():
        fig |= {f"{key}_median_ms": ms(statistics.median(values)), f"{key}_p90_ms": ms(pct(values, 0.9))}
    fig["ls_jobs_listed_at_end"] = len(lab.client.jobs())
    for key in ("labq_submit", "labq_ls"):
        fig[f"{key}_minus_python_pass_ms"] = fig[f"{key}_median_ms"] - fig["python_pass_median_ms"]
    if lab.pin:  # in this process: a CLI call's new SSLContext with the kept CA loaded, and a bare handshake
        fig |= bench_tls_parts(lab)
    return fig


def bench_tls_parts(lab: Lab) -> dict:
    """What a CLI process spends on its context (a new ``SSLContext``, the kept CA loaded into it), and a TCP
    connection with a full TLS handshake to the leader, closed before any request: the API calls above less
    these is the request itself."""
    import socket
    from urllib.parse import urlsplit

    from labq.tls import client_context

    pem = next(lab.ca_cache.glob("ca-*.pem")).read_text()
    address = (urlsplit(lab.url).hostname, urlsplit(lab.url).port)
    made, shaken = [], []
    for _ in range(WARMUPS + COMMAND_RUNS):
        start = time.perf_counter()
        context = client_context(pem)
        made.append(time.perf_counter() - start)
        start = time.perf_counter()
        with socket.create_connection(address, timeout=10) as sock, context.wrap_socket(sock):  # handshakes here
            shaken.append(time.perf_counter() - start)
    fig = {}
    for key, values in (("tls_context", made), ("tls_connect_and_handshake", shaken)):
        fig |= {f"{key}_median_ms": ms(statistics.median(values[WARMUPS:])),
                f"{key}_p90_ms": ms(pct(values[WARMUPS:], 0.9))}
    return fig


def count_connections(lab: Lab, ids: list[int], problems: list[str]) -> dict:
    """TCP connections and TLS handshakes of one ``labq submit -- true`` and one ``labq ls`` (and, over TLS, one
    ``labq ls`` with no CA kept). Reported, not judged; none counted at all is a problem (of the counting)."""
    runs = [("labq_submit", ["submit", "--", "true"]), ("labq_ls", ["ls"])]
    runs += [("labq_ls_first_call", ["ls"])] if lab.pin else []
    fig: dict = {}
    for key, args in runs:
        if key == "labq_ls_first_call":
            lab.forget_ca()
        out = subprocess.run([sys.executable, "-c", COUNTING_MAIN, *args], env=lab.env(), cwd=lab.root,
                             capture_output=True, text=True, timeout=60)
        if key == "labq_submit":
            ids.extend(int(n) for n in re.findall(r"submitted job (\d+)", out.stdout) or [0])
        counted = [line.split(COUNT_MARK, 1)[1] for line in out.stderr.splitlines() if COUNT_MARK in line]
        if out.returncode != 0 or not counted:
            raise RuntimeError(f"labq {' '.join(args)} (counted) exited {out.returncode}: {out.stderr.strip()}")
        seen = json.loads(counted[-1])
        fig |= {f"{key}_tcp_connections": seen["tcp_connections"], f"{key}_tls_handshakes": seen["tls_handshakes"],
                f"{key}_tls_resumed": seen["tls_resumed"]}
        if seen["tls_version"]:
            fig["tls_version"] = seen["tls_version"]
        if not seen["tcp_connections"] or bool(lab.pin) != bool(seen["tls_handshakes"]):
            problems.append(f"counting labq {' '.join(args)}: {seen['tcp_connections']} connections and "
                            f"{seen['tls_handshakes']} TLS handshakes seen (the counting wrapper missed them?)")
    return fig


def import_profile() -> list[str]:
    """The 5 largest cumulative times in ``python -X importtime -c "import labq.cli.jobs"``."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", "import labq.cli.jobs"], capture_output=True,
                         text=True).stderr
    rows = [(int(c), n.strip()) for c, n in re.findall(r"import time:\s+\d+ \|\s+(\d+) \|(.*)", err)]
    return [f"{c / 1000:7.1f} ms  {name}" for c, name in sorted(rows, reverse=True)[:5]]


def bench_throughput(lab: Lab, ids: list[int], problems: list[str]) -> dict:
    latencies: list[float] = []
    errors: list[str] = []
    gate, lock = threading.Barrier(THREADS + 1), threading.Lock()

    def submitter(n: int) -> None:
        client, mine, my_ids, my_errors = lab.new_client(lab.client.token), [], [], []
        gate.wait()
        for _ in range(EACH):
            t0 = time.perf_counter()
            try:
                job = client.submit({"command": ["sleep", "1"], "gpus": 1, "priority": "low", "name": f"t{n}",
                                     "workdir": str(lab.root)})
            except ApiError as err:
                my_errors.append(f"a submit in thread {n} failed after {ms(time.perf_counter() - t0):.0f} ms: {err}")
                continue
            mine.append(time.perf_counter() - t0)
            my_ids.append(job.get("id"))
        with lock:
            latencies.extend(mine)
            ids.extend(my_ids)
            errors.extend(my_errors)

    threads = [threading.Thread(target=submitter, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    gate.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    problems.extend(errors[:5] + ([f"... {len(errors) - 5} more failed submits"] if len(errors) > 5 else []))
    return {"api_submits": len(latencies), "api_submit_errors": len(errors), "api_submits_per_s": len(latencies) / wall,
            "api_submit_median_ms": ms(statistics.median(latencies)), "api_submit_p99_ms": ms(pct(latencies, 0.99))}


def finish_all(client: Client, ids: list[int], problems: list[str]) -> None:
    """Cancel the benchmark's unfinished jobs (the queued first, so none starts), wait, check each one's end."""
    def cancel(job_id: int) -> None:
        try:
            client.action(job_id, "cancel")
        except ApiError as err:
            if err.status not in (404, 409):  # finished meanwhile, or already being cancelled
                problems.append(f"cancelling job {job_id}: {err}")

    ours = set(ids)
    unfinished = [j for j in client.jobs(all=True) if j["id"] in ours]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(cancel, [j["id"] for j in unfinished if j["state"] in ("queued", "held")]))
        list(pool.map(cancel, [j["id"] for j in unfinished if j["state"] not in ("queued", "held")]))
    deadline = time.monotonic() + 120
    while any(j["id"] in ours for j in client.jobs(all=True)) and time.monotonic() < deadline:
        time.sleep(0.2)
    ended = {j["id"]: j["state"] for j in client.jobs(all=True, history=True)}
    wrong = sorted((i, ended.get(i, "missing")) for i in ours - {0, None}
                   if ended.get(i) not in ("cancelled", "succeeded"))
    if wrong:
        problems.append(f"{len(wrong)} benchmark jobs did not end cancelled or succeeded, e.g. {wrong[:3]}")
    if 0 in ours or None in ours:
        problems.append("a submit was answered without a job id")
    if len(ids) != len(ours):
        problems.append(f"{len(ids) - len(ours)} job ids were handed out twice")


def goals() -> list[tuple[str, str, float]]:
    return [("to_running_p95_ms", f"<= {START_P95_GOAL_MS:g} ms", START_P95_GOAL_MS),
            ("labq_submit_median_ms", f"<= {COMMAND_GOAL_MS:g} ms", COMMAND_GOAL_MS),
            ("labq_ls_median_ms", f"<= {COMMAND_GOAL_MS:g} ms", COMMAND_GOAL_MS)]


#: the local socket is no slower than loopback HTTP: its median within this ratio of plain HTTP's (noise)
LOCAL_SOCKET_SLACK = 1.05
#: what TLS may add to a CLI call: the median over TLS minus the median over plain HTTP
TLS_COST_GOALS = ("labq_submit_median_ms", "labq_ls_median_ms")
#: rows only the TLS lab has, and the plain row their difference is taken from
TLS_ONLY_BESIDE = {"labq_ls_first_call": "labq_ls", "python_import_labq_cli_tls": "python_import_labq_cli"}
SECTIONS = {"commands": "CLI commands: wall time of the process; API calls and the TLS context in this process",
            "connections": "one command's TCP connections and TLS handshakes (counted, not timed)",
            "start": "submit to running (API client, one job at a time)",
            "api": f"API submits: {THREADS} threads x {EACH}"}


def run_lab(transport: str, gpus: str, keep: bool) -> tuple[dict[str, dict], list[str]]:
    """One lab in a fresh temp folder, measured and closed: its figures by section, and its problems."""
    began = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix=f"labq-bench-latency-{transport}-"))
    ids: list[int] = []
    problems: list[str] = []
    lab = Lab(root, tls=transport == "tls")
    sections: dict[str, dict] = {}
    try:
        client = lab.start(gpus)
        events = Events(client)
        events.wait(None, "any", 10.0)  # the stream is connected
        say(f"{transport}: submit to running: {WARMUPS}+{START_SAMPLES} jobs, one at a time")
        sections["start"] = bench_start(lab, client, events, ids)
        blocker = client.submit({"command": ["sleep", "3600"], "gpus": len(client.nodes()[0]["gpus"]),
                                 "workdir": str(root)})
        ids.append(blocker["id"])
        events.wait(blocker["id"], "running", 30.0)
        sections["commands"] = bench_commands(lab, ids)
        sections["connections"] = count_connections(lab, ids, problems)
        say(f"{transport}: API submits: {THREADS} threads x {EACH}")
        sections["api"] = bench_throughput(lab, ids, problems)
        say(f"{transport}: cancelling the benchmark's {len(ids)} jobs")
        finish_all(client, ids, problems)
    finally:
        lab.close()
        if keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    sections["api"]["lab_wall_s"] = time.perf_counter() - began
    return sections, [f"{transport}: {problem}" for problem in problems]


def flat(sections: dict[str, dict]) -> dict:
    """One lab's figures in one dict, in the order the single-lab table has always shown them."""
    return {k: v for name in ("start", "commands", "connections", "api") for k, v in sections.get(name, {}).items()}


def tls_minus_plain(plain: dict, tls: dict) -> dict:
    """Each numeric figure of both labs, TLS minus plain (the TLS-only rows against their plain neighbours)."""
    diff = {}
    for key, value in tls.items():
        beside = key
        for only, other in TLS_ONLY_BESIDE.items():
            if key.startswith(only + "_") and key not in plain:
                beside = other + key[len(only):]
        other_value = plain.get(beside)
        if isinstance(value, (int, float)) and isinstance(other_value, (int, float)) and not isinstance(value, bool):
            diff[key] = value - other_value
    return diff


def print_table(fig: dict, imports: list[str]) -> None:
    targets = {name: (shown, fig[name] <= limit) for name, shown, limit in goals()}
    print_figures(f"labq latency benchmark over {fig['transport']} (Python {fig['python']}, {fig['cpus']} CPUs, "
                  f"agent {fig['gpus']}, {fig['wall_s']:.0f} s)", fig, targets,
                  skip=("python", "cpus", "gpus", "goals_met", "wall_s", "problems", "transport"), digits=1)
    print("\nslowest imports of labq.cli.jobs (cumulative, one run; a diagnostic):\n  " + "\n  ".join(imports))


def print_side_by_side(head: dict, labs: dict[str, dict[str, dict]], diff: dict, imports: list[str]) -> None:
    plain, tls = flat(labs["plain"]), flat(labs["tls"])
    names = [k for name in SECTIONS for sec in (labs["tls"], labs["plain"]) for k in sec.get(name, {})]
    width = max(map(len, names)) + 2

    def cell(value, signed: bool = False) -> str:
        if value is None:
            return f"{'-':>10}"
        if isinstance(value, float):
            return f"{value:+10.1f}" if signed else f"{value:10.1f}"
        return f"{value:+10d}" if signed and isinstance(value, int) else f"{value!s:>10}"

    print(f"labq latency benchmark, plain HTTP vs TLS (Python {head['python']}, {head['cpus']} CPUs, agent "
          f"{head['gpus']}, labs run one after the other, {head['wall_s']:.0f} s in all)")
    starred = False
    for name, title in SECTIONS.items():
        keys = list(dict.fromkeys(k for sec in (labs["tls"], labs["plain"]) for k in sec.get(name, {})))
        print(f"\n{title}\n{'figure':<{width}}  {'plain':>10}  {'tls':>10}  {'tls-plain':>10}")
        for key in keys:
            star = "*" if key not in plain and key in diff else ""
            starred |= bool(star)
            print(f"{key + star:<{width}}  {cell(plain.get(key))}  {cell(tls.get(key))}  "
                  f"{cell(diff.get(key), signed=True)}".rstrip())
    if starred:
        print("\n* TLS lab only; tls-plain is against the plain lab's "
              + ", ".join(f"{other} (for {only})" for only, other in TLS_ONLY_BESIDE.items()))
    print("\ngoals")
    rows = [(f"{key} {shown}", f"plain {plain[key]:.1f}: {'met' if plain[key] <= limit else 'MISSED'}; "
             f"tls {tls[key]:.1f}: {'met' if tls[key] <= limit else 'MISSED'}") for key, shown, limit in goals()]
    rows += [(f"{key} tls-plain <= {TLS_COST_GOAL_MS:g} ms", f"{diff[key]:+.1f}: "
              f"{'met' if diff[key] <= TLS_COST_GOAL_MS else 'MISSED'} (less python_pass: "
              f"{diff[key] - diff['python_pass_median_ms']:+.1f})") for key in TLS_COST_GOALS]
    for key in ("labq_submit_median_ms", "labq_ls_median_ms"):  # no slower than loopback HTTP (plain lab)
        local = plain[key.replace("_median_ms", "_local_socket_median_ms")]
        rows.append((f"{key.replace('_median_ms', '')} local socket vs loopback HTTP",
                     f"{local:.1f} vs {plain[key]:.1f} ms ({local / plain[key]:.2f}x): "
                     f"{'met' if local <= plain[key] * LOCAL_SOCKET_SLACK else 'MISSED'}"))
    goal_width = max(len(r[0]) for r in rows)
    for what, verdict in rows:
        print(f"  {what:<{goal_width}}  {verdict}")
    print("\nslowest imports of labq.cli.jobs (cumulative, one run; a diagnostic):\n  " + "\n  ".join(imports))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=("plain", "tls", "both"), default="both",
                        help="measure a plain-HTTP lab, a TLS lab, or both one after the other (default both)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--keep", action="store_true", help="leave the temp folders (logs, data) in place")
    parser.add_argument("--gpus", default="sim:ws-4x3090", help="the agent's simulated GPUs (default sim:ws-4x3090)")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    head: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "gpus": args.gpus}
    transports = TRANSPORTS if args.transport == "both" else (args.transport,)
    labs: dict[str, dict[str, dict]] = {}
    problems: list[str] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("latency benchmark: stopped by SIGTERM"))  # run the finally
    for transport in transports:  # one after the other: each lab has the machine to itself
        labs[transport], found = run_lab(transport, args.gpus, args.keep)
        problems += found
    imports = import_profile()
    head["wall_s"] = time.perf_counter() - began
    if len(transports) == 1:
        fig = head | {"transport": transports[0]} | flat(labs[transports[0]])
        fig["goals_met"] = {name: fig[name] <= limit for name, _, limit in goals()}
        fig["problems"] = problems
        if args.json:
            print(json.dumps(fig))
        else:
            print_table(fig, imports)
    else:
        plain, tls = flat(labs["plain"]), flat(labs["tls"])
        diff = tls_minus_plain(plain, tls)
        met = {t: {name: f[name] <= limit for name, _, limit in goals()} for t, f in (("plain", plain), ("tls", tls))}
        met["tls_cost"] = {f"{key}_tls_minus_plain": diff[key] <= TLS_COST_GOAL_MS for key in TLS_COST_GOALS}
        if args.json:
            print(json.dumps(head | {"transports": list(transports), "plain": plain, "tls": tls,
                                     "tls_minus_plain": diff, "goals_met": met, "problems": problems}))
        else:
            print_side_by_side(head, labs, diff, imports)
    if problems:  # after the figures, which help to find the cause
        say("latency benchmark: inconsistent:\n  " + "\n  ".join(problems))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
