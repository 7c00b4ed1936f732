"""Benchmark of ``labq ls --watch`` with a long queue: bytes written to the terminal per change.

What it measures, against a real ``labq leader`` (no agent: the jobs stay queued) started as a process
in a temp folder with a temp HOME: ``--jobs`` jobs (default 5,000) are submitted through the API, then
``labq ls --all --watch`` runs as a process in a pseudo-terminal of ``--size`` (default 120x40). Once it
has drawn its first frame, one job at a time is held (``hold``, then the next change ``release``):
each change is one event, one redraw. The bytes the terminal receives from the change until the output
has been quiet for 0.8 s are that change's cost. Figures: the first frame's bytes, and per change the
median, p90 and largest.

A change rewrites the changed job's row and the header's clock; ages tick every 10 s. Run this file on
an older labq (``PYTHONPATH=/path/to/old/checkout``) to compare: up to issue 16 every change redrew
the whole table, every row.

Run:  .venv/bin/python bench/ls_watch.py [--jobs 5000] [--changes 20] [--size 120x40] [--json]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

try:
    import labq  # noqa: F401
except ImportError:  # running from a checkout without an installed labq
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from figures import print_figures
from labq.client import Client
from labq.credentials import load_credentials

QUIET_S = 0.8  #: a redraw is over when the terminal has had nothing for this long


def start_leader(root: Path, env: dict) -> tuple[subprocess.Popen, Client]:
    (root / "leader.toml").write_text('[leader]\nlisten = "127.0.0.1:0"\n[jobs]\nallow_root = true\n')
    log = open(root / "leader.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "labq.cli", "leader", "--no-mdns", "--config",
                             str(root / "leader.toml"), "--data-dir", str(root / "data")], stdout=log,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 30
    creds = Path(env["XDG_CONFIG_HOME"]) / "labq" / "credentials"
    while time.monotonic() < deadline:
        found = re.search(r"serving (http://127\.0\.0\.1:\d+)", (root / "leader.log").read_text(errors="replace"))
        if found and creds.exists() and "token" in load_credentials(creds):
            return proc, Client(found.group(1), load_credentials(creds)["token"])
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise SystemExit(f"the leader did not start:\n{(root / 'leader.log').read_text(errors='replace')}")


def read_until_quiet(fd: int, quiet_s: float = QUIET_S, at_most_s: float = 30.0) -> bytes:
    data, deadline = b"", time.monotonic() + at_most_s
    while time.monotonic() < deadline:
        if not select.select([fd], [], [], quiet_s)[0]:
            if data:
                return data
            continue
        try:
            chunk = os.read(fd, 1 << 16)
        except OSError:
            return data
        if not chunk:
            return data
        data += chunk
    return data


def measure(args: argparse.Namespace, root: Path) -> dict:
    home = root / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABQ_")}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), PYTHONUNBUFFERED="1")
    leader, client = start_leader(root, env)
    try:
        print(f"submitting {args.jobs} jobs...", file=sys.stderr)
        with ThreadPoolExecutor(16) as pool:
            ids = list(pool.map(lambda i: client.submit({"command": ["sleep", "60"], "name": f"job-{i}"})["id"],
                                range(args.jobs)))
        columns, rows = map(int, args.size.split("x"))
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        env.update(LABQ_LEADER=client.url, LABQ_TOKEN=client.token, TERM="xterm-256color")
        watch = subprocess.Popen([sys.executable, "-m", "labq.cli", "ls", "--all", "--watch"], stdin=slave,
                                 stdout=slave, stderr=slave, env=env, start_new_session=True)
        os.close(slave)
        try:
            first = read_until_quiet(master, at_most_s=120)
            costs = []
            for n in range(args.changes):
                job = ids[(n // 2) % len(ids)]
                client.action(job, "hold" if n % 2 == 0 else "release")
                costs.append(len(read_until_quiet(master)))
        finally:
            watch.send_signal(signal.SIGINT)
            deadline = time.monotonic() + 30
            while watch.poll() is None and time.monotonic() < deadline:
                read_until_quiet(master, 0.2, 1)  # a watch blocked writing to a full terminal must get to the signal
            watch.kill()
            watch.wait(30)
            os.close(master)
    finally:
        leader.terminate()
        leader.wait(30)
    return {"jobs": args.jobs, "terminal": args.size, "first frame bytes": len(first),
            "bytes per change, median": statistics.median(costs),
            "bytes per change, p90": sorted(costs)[int(0.9 * (len(costs) - 1))],
            "bytes per change, max": max(costs), "changes": len(costs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--size", default="120x40", help="the terminal, COLUMNSxROWS")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (logs)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="labq-bench-watch-"))
    try:
        fig = measure(args, root)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(fig))
    else:
        print_figures(f"labq ls --all --watch, {args.jobs} jobs, a {args.size} terminal", fig, {}, digits=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
