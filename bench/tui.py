"""Benchmark of ``labq tui`` with a full lab: first paint, filter keystrokes, memory, an update storm.

What it measures, against a real ``labq leader`` started as a process in a temp folder with a
temp HOME (``LeaderOnly`` of ``reservations.py``: no agent; 10 simulated ``sim:dgx1`` nodes
registered through the API with the join token, so they stay up and never sync). The lab holds
``--jobs`` unfinished jobs of 10 users ``u0``..``u9``: 80 1-GPU jobs on every GPU (they stay
``starting``) and the rest queued (1/2/4/8 GPUs, classes low/normal/high, names like
``llama-7b-ft-c4-123``), waiting with pending reasons. Submitting 10,000 jobs through the API
takes a quarter of an hour on 2 CPUs (the leader rewrites its whole database at every commit,
so a submit costs O(jobs)), so all but the last 40 are written into the leader's store in one
commit before it starts (``--api-fill`` submits them all, 8 threads); the 80 go in as urgent,
so that the scheduler places exactly them when the nodes join. The last 40 are submitted
through the API (8 threads) and timed, and so is the leader's answer to the TUI's load
(``GET /v1/jobs?all=1&pending=1``): setup figures, without goals.
  * First full paint, in a fresh process, as a user starting ``labq tui``, two ways:
    (a) ``python -c ...`` (so interpreter start and imports count) runs ``make_app()`` under
        ``App.run_test(size=(120, 36))``. The end is the first screen refresh
        (``Screen._compositor_refresh``) that sent the queue table's region with every job
        loaded. The headless driver writes nothing, so the hook encodes each frame as a
        terminal's driver would (``CompositorUpdate.render_segments``) to count that cost too.
        On the way, with time stamps: the script's first line, imports done, the load request
        sent and answered, the first row made (``make_row``), the table's view computed
        (``set_rows``); these steps add up to the total. 5 runs.
    (b) the real command in a real terminal: ``labq tui`` in a detached ``tmux`` session
        (120x36, a tmux server on its own socket), timed from the ``tmux new-session`` call until
        the pane (read every 5 ms through one control-mode client, ``tmux -C``) shows the banner
        with ``N jobs`` and a job row. 5 runs. Then one run of the same ``labq.cli.main(["tui"])``
        in a process with the time stamps of (a), for the steps under a real terminal.
  * Filter keystroke to updated table: in the loaded app of (a), ``/`` opens the filter, then
    ``user:u3``, ``llama`` and ``state:queued`` are typed one key at a time, each followed by as
    many backspaces (the last by Esc), 37 keys, 0.1 s apart. Each is timed from the key event
    given to the driver (as ``Pilot.press`` does, without its waits for an idle CPU, 40 ms and
    more a key) to the end of the first refresh that sent the table's region with the new filter
    (the filter box's echo of the key goes out a refresh earlier); the table's ids are checked
    against ``labq.tui.query.view``. The end of the filter handler is noted too, so that labq's
    work and Textual's repaint are told apart; ``view(...)`` over all rows for each filter, and
    ``make_row`` for every job, are timed alone. In the time-stamped tmux run of (b), the
    ``user:u3`` keys and their backspaces are sent with ``tmux send-keys`` and timed until the
    banner shows the new filter, each split into: to the app's terminal driver, the handling,
    to the refresh that sent the table, and from there to tmux's screen.
  * Memory: the TUI process's peak RSS (``VmHWM``; ``ru_maxrss`` would count the benchmark's own
    memory, which a child started by vfork inherits) with all the jobs loaded, in (a) at the
    paint and in (b) 1 s after it, and its RSS when the load request was sent; beside the peak
    RSS of ``python -c "import textual.app"`` and of ``import labq.tui.app``.
  * Update storm: while the app of (a) runs, 200 queued jobs are cancelled through the API (8
    threads); timed from the first cancel sent until all 200 show ``cancelled`` in ``app.rows``,
    and until the table has been sent after that; also from the last cancel's answer, which is
    the TUI's own share (the rest is the leader's, one commit per cancel).
With ``--profile``, or when a goal is missed, a further run of (a) and one of (b) are profiled
(cProfile, wall clock, so a thread waiting for the GIL shows in whatever it runs: the main thread
from ``make_app`` or ``labq.cli.main`` to the paint, the feed thread's load request, the
keystrokes; ``view`` and ``make_row`` alone) and the functions with the largest share of the time
are printed to stderr, with the slowest imports of ``labq.tui.app``.

Goals (from the issue): with 10,000 jobs in the queue, first full paint within 1.5 s; filter
keystroke to the updated table within 100 ms; memory of the TUI process is reported. Timings are
reported, never asserted. Consistency is checked (the lab holds 80 starting and N - 80 queued
jobs, each filtered table matches ``view``, the banner shows every job, each key under tmux
left its trace, the storm's 200 jobs all arrive): a violation is printed after the figures and
exits with status 1. Progress goes to stderr.

Run:  .venv/bin/python bench/tui.py [--json] [--keep] [--jobs 10000] [--profile] [--api-fill]
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

try:
    import labq  # noqa: F401
except ImportError:  # running from a checkout without an installed labq
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from figures import print_figures, profile_lines
from latency import LABQ, ms, pct, say
from reservations import LeaderOnly, dgx1
from labq.client import Client
from labq.protocol.errors import ApiError

NODES, FILL, USERS, THREADS = 10, 80, tuple(f"u{i}" for i in range(10)), 8
PAINT_RUNS, STORM, API_SAMPLE = 5, 200, 40
SIZE = (120, 36)
PAINT_GOAL_MS, KEY_GOAL_MS = 1500.0, 100.0
KEY_GAP_S = 0.1
MODELS = ("resnet50", "vit-b16", "llama-7b-ft", "bert-base", "whisper-small", "unet-sd")
DATASETS = ("imagenet", "c4", "librispeech", "coco", "wiki")
#: (key as Textual names it, the filter text after it); the Esc closes the box and clears it
TYPED = [("user:u3", "user"), ("llama", "text"), ("state:queued", "state")]


def key_sequence() -> list[tuple[str, str, str]]:
    """(key, filter text after it, kind) for the whole typing session."""
    seq = []
    for text, kind in TYPED:
        for i, ch in enumerate(text):
            seq.append((ch, text[:i + 1], kind))
        if kind != "state":
            seq += [("backspace", text[:i], "delete") for i in range(len(text) - 1, -1, -1)]
    seq.append(("escape", "", "delete"))
    return seq


# -- the TUI process of (a) --------------------------------------------------------------------------
#
# Run as ``python -c CHILD MODE EXPECT SEQ OUT_DIR GAP PROFILE`` (``child_args``). Mode "paint" prints
# one JSON line on stdout and exits; mode "full" prints a line {"ready": ...} after the keystrokes,
# reads the storm's job ids as a JSON line on stdin, and prints the last line (with PROFILE "1" it
# stops after the keystrokes and leaves profiles in OUT_DIR). Mode "terminal" runs the real
# ``labq tui`` (``labq.cli.main``) in the terminal it was started in, and leaves its time stamps in
# OUT_DIR/terminal.json (at the first full paint) and OUT_DIR/terminal_log.json (when it quits).
CHILD = r'''
import time
T = {"script": time.time()}
import asyncio, json, os, re, sys
MODE, EXPECT, SEQ, OUT_DIR = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
GAP, PROFILING = float(sys.argv[5]), sys.argv[6] == "1"
from labq.tui.app import make_app
import labq.tui.app as app_module
from labq.tui.job_table import JobTable
from labq.tui.query import parse_filter, view, make_row
from labq.client import Client
from textual import events
from textual.app import App
from textual.screen import Screen
from textual._compositor import CompositorUpdate
from textual.keys import REPLACED_KEYS, _character_to_key, _get_unicode_name_from_key
T["imported"] = time.time()
if PROFILING:
    import cProfile

def kb(field="VmRSS"):
    """From /proc: ru_maxrss would count the parent's memory, which a vfork()ed child inherits."""
    with open("/proc/self/status") as f:
        return int(re.search(field + r":\s+(\d+)", f.read())[1])

FRAMES = []  # (time, rows the table held, rows it showed, its filter text): refreshes that updated the table
TABLE = []  # the queue's JobTable, once it has drawn
NEW_FRAME = None
FILTERED = {}  # filter text -> when set_filter ended (the last time)
COUNTS = {"put_rows": 0, "set_rows": 0}

_render_lines = JobTable.render_lines
def render_lines(self, crop):
    if not TABLE:
        TABLE.append(self)
    return _render_lines(self, crop)
JobTable.render_lines = render_lines

_refresh = Screen._compositor_refresh
def compositor_refresh(self):
    """After a refresh that sent the table's region to the terminal: what the table showed then.

    A refresh may draw the table's lines and still send only other regions (the filter box's echo
    of a key comes a frame before the table's update), so the dirty regions decide."""
    table = TABLE[0] if TABLE and TABLE[0].screen is self else None
    updated = table is not None and any(r.overlaps(table.region) for r in self._compositor._dirty_regions)
    _refresh(self)
    if not updated:
        return
    FRAMES.append((time.time(), len(table.rows), len(table.shown), table.filter_text))
    if NEW_FRAME is not None:
        NEW_FRAME.set()
    if MODE == "terminal" and "painted" not in T and FRAMES[-1][1] == EXPECT and FRAMES[-1][2] == EXPECT:
        T["painted"] = FRAMES[-1][0]  # handed to the driver's writer thread
        if PROFILER:
            PROFILER.disable()
            PROFILER.dump_stats(os.path.join(OUT_DIR, "terminal_paint.prof"))
        with open(os.path.join(OUT_DIR, "terminal.json"), "w") as f:
            json.dump({"t": T, "peak_rss_painted_kb": kb("VmHWM")}, f)
Screen._compositor_refresh = compositor_refresh

_display = App._display
def display(self, screen, renderable):
    # the headless driver writes nothing: make the bytes of the frame as a terminal's driver would
    if (renderable is not None and self.is_headless and not self._batch_count
            and isinstance(renderable, CompositorUpdate)):
        renderable.render_segments(self.console)
    return _display(self, screen, renderable)
App._display = display

_queue = Client.queue
def queue(self, ids=()):
    ids = list(ids)
    first = not ids and "queue_start" not in T
    if not first:
        return _queue(self, ids)
    T["queue_start"] = time.time()
    T["rss_before_load_kb"] = kb()
    prof = cProfile.Profile() if PROFILING else None
    if prof:
        prof.enable()
    try:
        return _queue(self, ids)
    finally:
        if prof:
            prof.disable()
            prof.dump_stats(os.path.join(OUT_DIR, MODE + "_load_request.prof"))
        T["queue_end"] = time.time()
Client.queue = queue

_make_row = app_module.make_row
def first_make_row(*args):
    T.setdefault("rows_start", time.time())
    app_module.make_row = _make_row  # the other rows go straight to it
    return _make_row(*args)
app_module.make_row = first_make_row

_set_rows = JobTable.set_rows
def set_rows(self, rows):
    start = time.time()
    _set_rows(self, rows)
    COUNTS["set_rows"] += 1
    if len(rows) == EXPECT and "set_rows_end" not in T:
        T["set_rows_start"], T["set_rows_end"] = start, time.time()
JobTable.set_rows = set_rows

_put_rows = JobTable.put_rows
PUT = [0.0]  # when put_rows last ended
def put_rows(self, rows):
    COUNTS["put_rows"] += 1
    _put_rows(self, rows)
    PUT[0] = time.time()
JobTable.put_rows = put_rows

_set_filter = JobTable.set_filter
FILTER_LOG = []  # (when set_filter ended, its text)
def set_filter(self, text):
    _set_filter(self, text)
    FILTERED[text] = time.time()
    FILTER_LOG.append((FILTERED[text], text))
JobTable.set_filter = set_filter

from textual.driver import Driver
KEY_LOG = []  # (when the terminal's driver read a key, the key): in its input thread
_process_message = Driver.process_message
def process_message(self, message):
    if isinstance(message, events.Key):
        KEY_LOG.append((time.time(), message.key))
    return _process_message(self, message)
Driver.process_message = process_message


def key_event(app, key):
    """What Pilot.press sends, without its waits for an idle CPU (at least 40 ms a key)."""
    import unicodedata
    if len(key) == 1 and not key.isalnum():
        key = _character_to_key(key)
    original = REPLACED_KEYS.get(key, key)
    try:
        char = unicodedata.lookup(_get_unicode_name_from_key(original))
    except KeyError:
        char = key if len(key) == 1 else None
    event = events.Key(key, char)
    event.set_sender(app)
    app._driver.send_message(event)


async def frame_after(count, test, timeout):
    """The first of FRAMES after the first ``count`` for which ``test`` holds (waits for new ones)."""
    deadline = time.monotonic() + timeout
    while True:
        for frame in FRAMES[count:]:
            if test(frame):
                return frame
        count = len(FRAMES)
        NEW_FRAME.clear()
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            await asyncio.wait_for(NEW_FRAME.wait(), left)
        except asyncio.TimeoutError:
            return None


def peak_kb():
    return kb("VmHWM")


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main():
    global NEW_FRAME
    NEW_FRAME = asyncio.Event()
    prof = cProfile.Profile() if PROFILING else None
    if prof:
        prof.enable()
    app = make_app()
    out = {"t": T, "problems": []}
    async with app.run_test(size=(SIZE_W, SIZE_H)) as pilot:
        frame = await frame_after(0, lambda f: f[1] == EXPECT and f[2] == EXPECT, 120)
        if prof:
            prof.disable()
            prof.dump_stats(os.path.join(OUT_DIR, "paint.prof"))
        if frame is None:
            out["problems"].append(f"no frame drew the table with {EXPECT} jobs within 120 s (it has {len(app.rows)})")
            emit(out)
            os._exit(1)
        T["painted"] = frame[0]
        out["frames_before_paint"] = FRAMES.index(frame)
        out["peak_rss_painted_kb"] = peak_kb()
        out["counts"] = dict(COUNTS)
        if MODE == "paint":
            emit(out)
            os._exit(0)
        # -- filter keystrokes
        await pilot.press("slash")
        await pilot.pause()
        if app.focused is None or app.focused.id != "filter":
            out["problems"].append(f"/ did not focus the filter box but {app.focused!r}")
        table = app.screen.table
        keys = []
        if prof:
            prof = cProfile.Profile()
            prof.enable()
        for key, text, kind in SEQ:
            await asyncio.sleep(GAP)
            count = len(FRAMES)
            t0 = time.time()
            key_event(app, key)
            frame = await frame_after(count, lambda f: f[3] == text, 10)
            if frame is None:
                out["problems"].append(f"after key {key!r} no frame drew the table with filter {text!r} "
                                       f"(it has {table.filter_text!r})")
                continue
            applied = FILTERED.get(text, t0)
            keys.append({"key": key, "text": text, "kind": kind, "ms": (frame[0] - t0) * 1000,
                         "applied_ms": max(0.0, applied - t0) * 1000, "shown": frame[2]})
            wanted = None if prof or text != table.filter_text else view(
                table.rows, parse_filter(text), table.sort_column, table.sort_reverse)
            if wanted is not None and table.shown != wanted:
                out["problems"].append(f"with filter {text!r} the table shows other jobs than view() does")
        if prof:
            prof.disable()
            prof.dump_stats(os.path.join(OUT_DIR, "keys.prof"))
            prof = cProfile.Profile()
            now = time.time()
            prof.enable()
            [make_row(j, app.pending.get(i), now) for i, j in app.jobs.items()]
            prof.disable()
            prof.dump_stats(os.path.join(OUT_DIR, "make_rows.prof"))
            prof = cProfile.Profile()
            prof.enable()
            for text in dict.fromkeys(text for _, text, _ in SEQ):
                view(app.rows, parse_filter(text), 0, False)
            prof.disable()
            prof.dump_stats(os.path.join(OUT_DIR, "view.prof"))
            emit(out | {"keys": keys})
            os._exit(0)
        out["keys"] = keys
        # -- the pure parts alone, on the same rows
        pure = []
        for text in dict.fromkeys(text for _, text, _ in SEQ):
            predicate = parse_filter(text)
            runs = []
            for _ in range(3):
                t0 = time.perf_counter()
                view(app.rows, predicate, 0, False)
                runs.append((time.perf_counter() - t0) * 1000)
            pure.append({"text": text, "ms": sorted(runs)[1]})
        out["pure_view"] = pure
        now = time.time()
        t0 = time.perf_counter()
        [make_row(j, app.pending.get(i), now) for i, j in app.jobs.items()]
        out["pure_make_rows_ms"] = (time.perf_counter() - t0) * 1000
        out["peak_rss_after_keys_kb"] = peak_kb()
        # -- the update storm
        emit({"ready": True, "shown": len(table.shown)})
        line = await asyncio.to_thread(sys.stdin.readline)
        ids = json.loads(line)
        COUNTS["put_rows"] = 0
        deadline = time.monotonic() + STORM_WAIT
        while not all(i in app.rows and app.rows[i].state == "cancelled" for i in ids):
            if time.monotonic() > deadline:
                done = sum(app.rows[i].state == "cancelled" for i in ids if i in app.rows)
                out["problems"].append(f"the storm: only {done} of {len(ids)} jobs show cancelled after {STORM_WAIT} s")
                out["storm"] = {"seen": None, "painted": None, "batches": COUNTS["put_rows"]}
                emit(out)
                os._exit(1)
            await asyncio.sleep(0.005)
        seen, last_put = time.time(), PUT[0]
        frame = await frame_after(0, lambda f: f[0] >= last_put, 10)
        out["storm"] = {"seen": seen, "painted": frame[0] if frame else None, "batches": COUNTS["put_rows"]}
        out["peak_rss_end_kb"] = peak_kb()
        emit(out)
        os._exit(0)

PROFILER = None
if MODE == "terminal":  # the real command: labq tui, in the terminal it was started in
    from labq.cli import main as cli_main
    if PROFILING:
        PROFILER = cProfile.Profile()
        PROFILER.enable()
    code = cli_main(["tui"])
    with open(os.path.join(OUT_DIR, "terminal_log.json"), "w") as f:
        json.dump({"frames": FRAMES, "keys": KEY_LOG, "filters": FILTER_LOG}, f)
    sys.exit(code)
else:
    asyncio.run(main())
'''.replace("SIZE_W", str(SIZE[0])).replace("SIZE_H", str(SIZE[1])).replace("STORM_WAIT", "300")


class Children:
    """The benchmark's own processes besides the leader: killed (their process groups) at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], env: dict, cwd: Path, **kw) -> subprocess.Popen:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, start_new_session=True, **kw)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                proc.wait()


def child_args(mode: str, expect: int, out_dir: Path, profile: bool) -> list[str]:
    seq = [list(k) for k in key_sequence()] if mode != "terminal" else []
    return [mode, str(expect), json.dumps(seq), str(out_dir), str(KEY_GAP_S), "1" if profile else "0"]


def tui_child(lab: LeaderOnly, children: Children, mode: str, expect: int, out_dir: Path,
              stdin: bool = False, profile: bool = False) -> tuple[subprocess.Popen, float]:
    argv = [sys.executable, "-c", CHILD, *child_args(mode, expect, out_dir, profile)]
    with open(lab.root / f"tui-{mode}{'-profile' if profile else ''}.err", "ab") as err:
        started = time.time()
        proc = children.start(argv, lab.env(), lab.root, stdout=subprocess.PIPE,
                              stdin=subprocess.PIPE if stdin else None, stderr=err, text=True)
    return proc, started


def read_line(proc: subprocess.Popen, timeout: float, what: str) -> dict:
    """The next JSON line the child prints; a thread keeps a hung child from hanging the benchmark."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not box or not box[0]:
        raise RuntimeError(f"the TUI process gave no answer for {what} (exit status {proc.poll()})")
    return json.loads(box[0])


STEPS = ("interpreter", "imports", "to_load_request", "load_request", "load_to_rows", "make_rows", "table_view",
         "to_frame")


def paint_figures(t: dict, started: float) -> dict:
    """The paint of one run and its steps, which add up to it (``t``: the child's time stamps)."""
    marks = [started, t["script"], t["imported"], t["queue_start"], t["queue_end"], t["rows_start"],
             t["set_rows_start"], t["set_rows_end"], t["painted"]]
    return {"total_ms": ms(t["painted"] - started)} | {f"{name}_ms": ms(b - a)
                                                       for name, a, b in zip(STEPS, marks, marks[1:])}


def bench_paint(lab: LeaderOnly, children: Children, expect: int, profile_dir: Path, problems: list[str]) -> dict:
    runs = []
    for k in range(PAINT_RUNS):
        proc, started = tui_child(lab, children, "paint", expect, profile_dir)
        out = read_line(proc, 180, "the first paint")
        proc.wait(30)
        problems.extend(out["problems"])
        if "painted" not in out["t"]:
            continue
        run = paint_figures(out["t"], started) | {"peak_rss_kb": out["peak_rss_painted_kb"],
                                             "rss_before_load_kb": out["t"]["rss_before_load_kb"],
                                             "frames_before": out["frames_before_paint"]}
        runs.append(run)
        say(f"  run {k + 1}: {run['total_ms']:.0f} ms (imports {run['imports_ms']:.0f}, load request "
            f"{run['load_request_ms']:.0f}, rows {run['make_rows_ms']:.0f}, to frame {run['to_frame_ms']:.0f})")
    if not runs:
        return {"raw_paint": runs}
    total = [r["total_ms"] for r in runs]
    fig = {"paint_median_ms": statistics.median(total), "paint_max_ms": max(total)}
    for step in STEPS:
        fig[f"paint_{step}_median_ms"] = statistics.median(r[f"{step}_ms"] for r in runs)
    fig["tui_rss_before_load_mb"] = statistics.median(r["rss_before_load_kb"] for r in runs) / 1024
    fig["tui_peak_rss_mb"] = max(r["peak_rss_kb"] for r in runs) / 1024
    return fig | {"raw_paint": runs}


def bench_full(lab: LeaderOnly, children: Children, client: Client, expect: int, profile_dir: Path,
               problems: list[str]) -> dict:
    proc, started = tui_child(lab, children, "full", expect, profile_dir, stdin=True)
    ready = read_line(proc, 300, "the keystrokes")
    if "ready" not in ready:  # it gave up early: its problems say why
        problems.extend(ready.get("problems", []))
        return {}
    queued = sorted(j["id"] for j in client.jobs(all=True, states=["queued"]))
    ids = random.Random(7).sample(queued, min(STORM, len(queued)))
    say(f"update storm: cancelling {len(ids)} queued jobs while the TUI runs")
    proc.stdin.write(json.dumps(ids) + "\n")
    proc.stdin.flush()
    clients = [Client(lab.url, client.token) for _ in range(THREADS)]
    answered: list[float] = []
    cancel_took: list[float] = []

    def cancel(n: int) -> None:
        for job_id in ids[n::THREADS]:
            t0 = time.time()
            try:
                clients[n].action(job_id, "cancel")
            except ApiError as err:
                problems.append(f"cancelling job {job_id}: {err}")
            t1 = time.time()
            answered.append(t1)
            cancel_took.append(t1 - t0)

    sent = time.time()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(cancel, range(THREADS)))
    out = read_line(proc, 360, "the update storm")
    proc.wait(30)
    problems.extend(out["problems"])
    keys = out["keys"]
    fig: dict = {}
    if keys:
        took = [k["ms"] for k in keys]
        fig |= {"filter_keys": len(keys), "filter_key_median_ms": statistics.median(took),
                "filter_key_p95_ms": pct(took, 0.95), "filter_key_max_ms": max(took),
                "filter_key_handler_median_ms": statistics.median(k["applied_ms"] for k in keys),
                "filter_key_handler_p95_ms": pct([k["applied_ms"] for k in keys], 0.95)}
        for kind in ("user", "text", "state", "delete"):
            mine = [k["ms"] for k in keys if k["kind"] == kind]
            if mine:
                fig[f"filter_key_{kind}_median_ms"] = statistics.median(mine)
    pure = [p["ms"] for p in out["pure_view"]]
    fig |= {"pure_view_median_ms": statistics.median(pure), "pure_view_max_ms": max(pure),
            "pure_make_rows_ms": out["pure_make_rows_ms"],
            "tui_peak_rss_after_keys_mb": out["peak_rss_after_keys_kb"] / 1024}
    storm = out["storm"]
    fig |= {"storm_jobs": len(ids), "storm_cancels_s": max(answered) - sent,
            "storm_cancel_answer_median_ms": ms(statistics.median(cancel_took))}
    if storm["seen"]:
        fig |= {"storm_to_all_in_rows_ms": ms(storm["seen"] - sent),
                "storm_after_last_answer_ms": ms(storm["seen"] - max(answered))}
    if storm["painted"]:
        fig["storm_to_painted_ms"] = ms(storm["painted"] - sent)
    fig |= {"storm_table_updates": storm["batches"], "tui_peak_rss_end_mb": out["peak_rss_end_kb"] / 1024}
    return fig | {"raw_keys": keys, "raw_pure_view": out["pure_view"],
                  "raw_storm": {"sent": sent, "answered": sorted(answered), **storm}}


# -- (b): the real command under tmux -----------------------------------------------------------------


class Tmux:
    """A tmux server on its own socket, with the lab's HOME; ``close`` kills it and what runs in it.

    Screens are read and keys sent through one control-mode client (``tmux -C``), not a tmux
    process per poll, which would take a fifth of a CPU from the TUI and the leader.
    """

    def __init__(self, lab: LeaderOnly) -> None:
        self.socket, self.env, self.pids = f"labq-bench-{os.getpid()}", lab.env(), []
        self.started = False
        self.control: subprocess.Popen | None = None

    def __call__(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], env=self.env,
                             capture_output=True, text=True, timeout=20)
        if out.returncode != 0 and check:
            raise RuntimeError(f"tmux {' '.join(args[:2])} failed: {out.stderr.strip()}")
        return out.stdout

    def start(self) -> None:
        self.started = True  # before, so that close() runs even if this fails half-way
        self("new-session", "-d", "-s", "keep", "-x", str(SIZE[0]), "-y", str(SIZE[1]), "sleep 86400")
        self.control = subprocess.Popen(["tmux", "-L", self.socket, "-f", "/dev/null", "-C", "attach-session",
                                         "-t", "keep"], env=self.env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.marks = 0
        self.command("set -s escape-time 0")  # Esc at once, as in a terminal without tmux

    def command(self, line: str) -> str:
        """One command through the control client; its output. Each command is followed by a marker
        command, and the answer is the block before the marker's, so a stray block cannot shift answers."""
        self.marks += 1
        mark = f"labq-bench-mark-{self.marks}"
        self.control.stdin.write(f"{line}\ndisplay-message -p {mark}\n")
        self.control.stdin.flush()
        before: tuple[bool, list[str]] | None = None
        while True:
            block = self._block(line)
            if block == (False, [mark]):
                break
            before = block
        if before is None:
            raise RuntimeError(f"tmux gave no answer to {line!r}")
        if before[0]:
            raise RuntimeError(f"tmux {line!r} failed: {' '.join(before[1])}")
        return "\n".join(before[1])

    def _block(self, line: str) -> tuple[bool, list[str]]:
        """The next answer: (whether it is an error, its lines); notifications between answers are skipped."""
        inside, lines = False, []
        while True:
            text = self.control.stdout.readline()
            if not text:
                raise RuntimeError(f"the tmux control client ended (at {line!r})")
            text = text.rstrip("\n")
            if text.startswith("%begin"):
                inside, lines = True, []
            elif inside and text.startswith(("%end", "%error")):
                return text.startswith("%error"), lines
            elif inside:
                lines.append(text)

    def screen(self, name: str) -> str:
        return self.command(f"capture-pane -p -t {name}")

    def close(self) -> None:
        if self.control is not None:
            self.control.stdin.close()
        if self.started:
            subprocess.run(["tmux", "-L", self.socket, "kill-server"], env=self.env, capture_output=True, timeout=20)
        if self.control is not None:
            self.control.wait(10)
        for pid in self.pids:  # a TUI that did not end with its session; only if the pid is still one of ours
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    ours = b"tui" in f.read()
                if ours:
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(rf"{field}:\s+(\d+)", f.read())[1])


def banner(screen: str) -> str:
    return screen.splitlines()[0] if screen else ""


def tmux_paint(tmux: Tmux, name: str, command: str, expect: int) -> tuple[float, float, int]:
    """Start ``command`` in a new session; (when it was started, when its screen showed every job, its pid)."""
    loaded = re.compile(rf"\| {expect} jobs:")
    row = re.compile(r"^\s*\d+\s+u\d\s", re.M)
    started = time.time()
    tmux("new-session", "-d", "-s", name, "-x", str(SIZE[0]), "-y", str(SIZE[1]), command)
    pid = int(tmux("display-message", "-p", "-t", name, "#{pane_pid}"))
    tmux.pids.append(pid)
    deadline, screen = started + 120, ""
    while not (loaded.search(banner(screen)) and row.search(screen)):
        if time.time() > deadline:
            raise RuntimeError(f"{command[:40]} under tmux did not show {expect} jobs in 120 s; its screen:\n{screen}")
        time.sleep(0.005)
        screen = tmux.screen(name)
    return started, time.time(), pid


def bench_tmux(lab: LeaderOnly, expect: int, out_dir: Path, problems: list[str]) -> dict:
    tmux = Tmux(lab)
    runs, peaks = [], []
    fig: dict = {}
    try:
        tmux.start()
        for k in range(PAINT_RUNS):
            started, seen, pid = tmux_paint(tmux, f"tui{k}", f"exec {shlex.quote(str(LABQ))} tui", expect)
            runs.append(ms(seen - started))
            time.sleep(1.0)
            peaks.append(status_kb(pid, "VmHWM"))
            say(f"  run {k + 1}: {runs[-1]:.0f} ms, peak RSS {peaks[-1] / 1024:.0f} MB")
            tmux("kill-session", "-t", f"tui{k}")
        fig |= {"tmux_paint_median_ms": statistics.median(runs), "tmux_paint_max_ms": max(runs),
                "tmux_tui_peak_rss_mb": max(peaks) / 1024}
        fig |= tmux_steps(lab, tmux, expect, out_dir, "tui-stamped", False, problems)
    finally:
        tmux.close()
    return fig | {"raw_tmux_paint_ms": runs, "raw_tmux_peak_rss_kb": peaks}


def tmux_steps(lab: LeaderOnly, tmux: Tmux, expect: int, out_dir: Path, name: str, profile: bool,
               problems: list[str]) -> dict:
    """One more run under tmux, of labq tui's main() in a process with the time stamps of (a): where the
    time of the paint goes; then (unless profiling) the filter keys, each split in the same way."""
    script = lab.root / "tui_child.py"
    script.write_text(CHILD)
    stamps, log = out_dir / "terminal.json", out_dir / "terminal_log.json"
    stamps.unlink(missing_ok=True)
    log.unlink(missing_ok=True)
    argv = [sys.executable, str(script), *child_args("terminal", expect, out_dir, profile)]
    started, seen, _ = tmux_paint(tmux, name, "exec " + shlex.join(argv), expect)
    deadline = time.time() + 10
    while not stamps.exists() and time.time() < deadline:
        time.sleep(0.05)
    keys = [] if profile else tmux_keys(tmux, name, problems)
    tmux.command(f"send-keys -t {name} Escape")  # out of the filter box, so that q quits
    time.sleep(0.5)
    tmux.command(f"send-keys -t {name} q")  # quit, so that the profile and the log are written whole
    deadline = time.time() + 10
    while not log.exists() and time.time() < deadline:
        time.sleep(0.05)
    tmux("kill-session", "-t", name, check=False)  # it ended with the app, unless q did not reach it
    if not stamps.exists():
        raise RuntimeError("the time-stamped labq tui under tmux wrote no time stamps")
    out = json.loads(stamps.read_text())
    steps = paint_figures(out["t"], started)
    say(f"  time-stamped run: {ms(seen - started):.0f} ms to the screen, " + ", ".join(
        f"{k[:-3]} {v:.0f}" for k, v in steps.items() if k != "total_ms"))
    fig = {"tmux_stamped_paint_ms": ms(seen - started)} | {
        f"tmux_stamped_{k}": v for k, v in steps.items() if k != "total_ms"} | {
        "tmux_stamped_frame_to_screen_ms": ms(seen - out["t"]["painted"])}
    if keys:
        took = [k["ms"] for k in keys]
        fig |= {"tmux_filter_keys": len(keys), "tmux_filter_key_median_ms": statistics.median(took),
                "tmux_filter_key_p95_ms": pct(took, 0.95), "tmux_filter_key_max_ms": max(took)}
        if log.exists():
            fig |= key_steps(keys, json.loads(log.read_text()), problems)
        else:
            problems.append("the time-stamped labq tui did not write its log at the end (q did not quit it?)")
    return fig | {"raw_tmux_keys": keys}


def key_steps(keys: list[dict], log: dict, problems: list[str]) -> dict:
    """Each key of the tmux run split: tmux to the app's terminal driver, its handling, the frame, the screen."""
    parts: dict[str, list[float]] = {"to_driver": [], "handling": [], "to_frame": [], "frame_to_screen": []}
    for k in keys:
        read = next((t for t, _ in log["keys"] if t >= k["sent"]), None)
        handled = next((t for t, text in log["filters"] if t >= k["sent"] and text == k["text"]), None)
        frame = next((f[0] for f in log["frames"] if f[0] >= (handled or k["sent"]) and f[3] == k["text"]), None)
        if None in (read, handled, frame):
            problems.append(f"under tmux, key {k['key']!r} left no trace in the TUI's log")
            continue
        k |= {"read": read, "handled": handled, "frame": frame}
        for name, a, b in (("to_driver", k["sent"], read), ("handling", read, handled), ("to_frame", handled, frame),
                           ("frame_to_screen", frame, k["seen"])):
            parts[name].append(ms(b - a))
    return {f"tmux_filter_key_{name}_median_ms": statistics.median(v) for name, v in parts.items() if v}


def tmux_keys(tmux: Tmux, name: str, problems: list[str]) -> list[dict]:
    """``/``, then ``user:u3`` and its backspaces, each until the banner shows the new filter."""
    def shown_filter() -> str:
        found = re.search(r"\| filter: (.*?)\s*(\| \d+ tagged)?\s*$", banner(tmux.screen(name)))
        return found[1] if found else ""

    tmux.command(f"send-keys -t {name} /")
    time.sleep(0.3)
    keys = []
    for key, text, kind in key_sequence():
        if kind not in ("user", "delete") or len(keys) >= 14:
            continue
        time.sleep(KEY_GAP_S)
        started = time.time()
        tmux.command(f"send-keys -t {name} BSpace" if key == "backspace" else f"send-keys -t {name} -l -- {key}")
        deadline = started + 10
        while shown_filter() != text:
            if time.time() > deadline:
                problems.append(f"under tmux, the banner did not show filter {text!r} within 10 s")
                return keys
            time.sleep(0.002)
        seen = time.time()
        keys.append({"key": key, "text": text, "ms": ms(seen - started), "sent": started, "seen": seen})
    return keys


# -- the lab --------------------------------------------------------------------------------------


def job_body(rng: random.Random, root: Path, gpus: int, n: int, priority: str | None = None) -> tuple[str, dict]:
    """(user, the body of a submit)."""
    name = f"{rng.choice(MODELS)}-{rng.choice(DATASETS)}-{n}"
    b = {"command": ["python", "train.py", "--config", f"{name}.yaml"], "gpus": gpus, "name": name,
         "priority": priority or rng.choices(("low", "normal", "high"), (0.3, 0.5, 0.2))[0], "workdir": str(root)}
    if rng.random() < 0.3:
        b["time_limit_s"] = rng.choice((1, 4, 12, 24)) * 3600
    return rng.choice(USERS), b


def queued_size(rng: random.Random) -> int:
    return rng.choices((1, 2, 4, 8), (0.4, 0.3, 0.2, 0.1))[0]


def seed_store(data: Path, bodies: list[tuple[str, dict]]) -> float:
    """The jobs straight into the leader's store, one commit, before the leader starts; returns the seconds."""
    from labq.models.job import Job
    from labq.protocol.codec import encode_job
    from labq.protocol.requests import parse_submit
    from labq.store import TinyDBStore
    from labq.store.contract import PutJob

    start = time.perf_counter()
    now = time.time()
    changes = [PutJob(encode_job(Job(n, parse_submit(body).spec_for(user, default_grace_s=60.0),
                                     submitted_at=now - 0.5 * (len(bodies) - n))))
               for n, (user, body) in enumerate(bodies, 1)]
    store = TinyDBStore(data)
    try:
        store.commit(changes)
    finally:
        store.close()
    return time.perf_counter() - start


def fill(lab: LeaderOnly, jobs: int, api_fill: bool, problems: list[str]) -> dict:
    """The lab: FILL 1-GPU jobs on every GPU, the rest queued. Without ``api_fill`` all but the last
    API_SAMPLE jobs go into the store before the leader starts, the fill jobs first, as urgent, so that
    the scheduler places exactly them once the nodes join."""
    begin = time.perf_counter()
    rng = random.Random(1)
    fills = [job_body(rng, lab.root, 1, n, "high" if api_fill else "urgent") for n in range(FILL)]
    queued = [job_body(rng, lab.root, queued_size(rng), n) for n in range(FILL, jobs)]
    fig: dict = {}
    if not api_fill:
        seeded = fills + queued[:len(queued) - API_SAMPLE]
        fills, queued = [], queued[len(queued) - API_SAMPLE:]
        fig["setup_seeded_jobs"] = len(seeded)
        fig["setup_seed_store_s"] = seed_store(lab.data, seeded)
    admin = lab.start_leader()
    for i in range(NODES):
        lab.register(dgx1(f"n{i:02d}"))
    clients = {name: Client(lab.url, admin.add_user(name)[1]) for name in USERS}
    took: list[float] = []

    def submit(who_body: tuple[str, dict]) -> int | None:
        who, b = who_body
        t0 = time.perf_counter()
        try:
            job_id = clients[who].submit(b)["id"]
        except ApiError as err:
            problems.append(f"a submit failed: {err}")
            return None
        took.append(time.perf_counter() - t0)
        return job_id

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(submit, fills))
    lab.wait(lambda: len(admin.jobs(all=True, states=["starting"])) >= FILL, "the fill jobs to be placed", 120)
    took.clear()
    say(f"  {FILL} jobs placed; submitting {len(queued)} queued jobs through the API")
    with ThreadPoolExecutor(THREADS) as pool:
        for n, _ in enumerate(pool.map(submit, queued), 1):
            if n % 1000 == 0:
                say(f"  {n} of {len(queued)} submitted")
    fig["setup_s"] = time.perf_counter() - begin
    if took:
        fig |= {"setup_api_submits": len(took), "setup_api_submit_median_ms": ms(statistics.median(took)),
                "setup_api_submit_p95_ms": ms(pct(took, 0.95))}
    states: dict[str, int] = {}
    for job in admin.jobs(all=True):
        states[job["state"]] = states.get(job["state"], 0) + 1
    if states.get("starting") != FILL or states.get("queued") != jobs - FILL:
        problems.append(f"after the fill, jobs by state are {states}, not {FILL} starting and {jobs - FILL} queued")
    return fig


def leader_load(client: Client) -> dict:
    """What the TUI's load request costs the leader, seen from here (3 tries)."""
    took = []
    for _ in range(3):
        t0 = time.perf_counter()
        jobs, pending = client.queue()
        took.append(time.perf_counter() - t0)
    size = len(json.dumps({"jobs": jobs, "pending": pending}))
    return {"leader_load_answer_median_ms": ms(statistics.median(took)), "leader_load_answer_mb": size / 1e6,
            "pending_reasons": len(pending)}, len(jobs)


def rss_of(code: str) -> float:
    """Peak RSS (VmHWM) of ``python -c code``, in MB."""
    out = subprocess.run([sys.executable, "-c", code + "; print(open('/proc/self/status').read())"],
                         capture_output=True, text=True, timeout=60, check=True)
    return int(re.search(r"VmHWM:\s+(\d+)", out.stdout)[1]) / 1024


def slowest_imports() -> list[str]:
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", "import labq.tui.app"], capture_output=True,
                         text=True).stderr
    rows = [(int(c), n.strip()) for c, n in re.findall(r"import time:\s+\d+ \|\s+(\d+) \|(.*)", err)]
    return [f"{c / 1000:7.1f} ms  {name}" for c, name in sorted(rows, reverse=True)[:6]]


def profile_of(path: Path, what: str) -> list[str]:
    if not path.exists():
        return [f"(no profile of {what})"]
    return profile_lines(pstats.Stats(str(path)).stats, what, own=12, including=18, folders=2,
                         ours=r"/(tui|labq)/")


def profile_run(lab: LeaderOnly, children: Children, expect: int, out_dir: Path) -> list[str]:
    """A profiled run of (a), and one of the real command under tmux; the largest shares of each."""
    proc, _ = tui_child(lab, children, "full", expect, out_dir, profile=True)
    read_line(proc, 300, "the profiled run")
    proc.wait(30)
    if shutil.which("tmux"):
        tmux = Tmux(lab)
        try:
            tmux.start()
            tmux_steps(lab, tmux, expect, out_dir, "tui-profiled", True, [])
        finally:
            tmux.close()
    parts = [("paint.prof", "(a): the main thread from make_app() to the first full paint"),
             ("full_load_request.prof", "(a): the feed thread's load request (Client.queue)"),
             ("terminal_paint.prof", "(b) labq tui under tmux: the main thread from labq.cli.main to the first full "
                                     "frame"),
             ("terminal_load_request.prof", "(b) labq tui under tmux: the feed thread's load request"),
             ("keys.prof", f"(a): the main thread over {len(key_sequence())} filter keystrokes ({KEY_GAP_S:g} s "
                           "apart: the waits show as select/poll)"),
             ("view.prof", "view() alone, once for each filter typed"),
             ("make_rows.prof", f"make_row() alone, for each of the {expect} jobs")]
    lines = []
    for name, what in parts:
        lines += profile_of(out_dir / name, what)
    return lines + ["slowest imports of labq.tui.app (cumulative, one run):", *[f"  {x}" for x in slowest_imports()]]


# -- the whole ---------------------------------------------------------------------------------------


def goals(fig: dict) -> list[tuple[str, str, float]]:
    found = [(name, f"<= {PAINT_GOAL_MS:g} ms", PAINT_GOAL_MS) for name in
             ("paint_median_ms", "paint_max_ms", "tmux_paint_median_ms", "tmux_paint_max_ms")]
    found += [(name, f"<= {KEY_GOAL_MS:g} ms", KEY_GOAL_MS) for name in
              ("filter_key_median_ms", "filter_key_p95_ms", "tmux_filter_key_median_ms", "tmux_filter_key_p95_ms")]
    return [g for g in found if isinstance(fig.get(g[0]), float)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures and the raw samples as one JSON object")
    parser.add_argument("--keep", action="store_true", help="leave the temp folder (logs, data) in place")
    parser.add_argument("--jobs", type=int, default=10000, help="unfinished jobs in the lab (default 10000)")
    parser.add_argument("--profile", action="store_true", help="profile a run even if every goal is met")
    parser.add_argument("--api-fill", action="store_true",
                        help="submit every job through the API instead of seeding the store (slow: the leader "
                             "rewrites its whole database at each submit; 15 min for 10,000 on 2 CPUs)")
    args = parser.parse_args(argv)
    if args.jobs < FILL + STORM:
        parser.error(f"--jobs must be at least {FILL + STORM}")
    if not shutil.which("tmux"):
        say("tmux is not installed: the real-terminal runs (b) are left out")
    began = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="labq-bench-tui-"))
    profile_dir = root / "profiles"
    profile_dir.mkdir()
    fig: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "jobs": args.jobs, "nodes": NODES,
                 "load_avg_at_start": os.getloadavg()[0]}  # others' work on the machine skews every figure
    raw: dict = {}
    problems: list[str] = []
    profile: list[str] = []
    lab, children = LeaderOnly(root), Children()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("tui benchmark: stopped by SIGTERM"))  # run the finally
    try:
        say(f"a lab of {args.jobs} jobs: {FILL} on every GPU of {NODES} sim:dgx1 nodes, the rest queued, by "
            f"{len(USERS)} users" + ("" if args.api_fill else f"; all but {API_SAMPLE} seeded into the store"))
        fig |= fill(lab, args.jobs, args.api_fill, problems)
        client = lab.client
        part, expect = leader_load(client)
        fig |= part
        say(f"lab ready in {fig['setup_s']:.0f} s; the leader answers the TUI's load in "
            f"{fig['leader_load_answer_median_ms']:.0f} ms ({fig['leader_load_answer_mb']:.1f} MB)")
        fig |= {"python_import_textual_peak_rss_mb": rss_of("import textual.app"),
                "python_import_labq_tui_peak_rss_mb": rss_of("import labq.tui.app")}
        say(f"(a) first paint, {PAINT_RUNS} fresh processes under App.run_test {SIZE[0]}x{SIZE[1]}")
        part = bench_paint(lab, children, expect, profile_dir, problems)
        raw["raw_paint"] = part.pop("raw_paint")
        fig |= part
        if shutil.which("tmux"):
            say(f"(b) first paint, {PAINT_RUNS} x `labq tui` under tmux {SIZE[0]}x{SIZE[1]}; then 14 filter keys")
            part = bench_tmux(lab, expect, profile_dir, problems)
            raw |= {k: part.pop(k) for k in list(part) if k.startswith("raw_")}
            fig |= part
        say(f"filter keystrokes ({len(key_sequence())}, {KEY_GAP_S:g} s apart) in a fresh TUI process")
        part = bench_full(lab, children, client, expect, profile_dir, problems)
        raw |= {k: part.pop(k) for k in list(part) if k.startswith("raw_")}
        fig |= part
        missed = [name for name, _, limit in goals(fig) if fig[name] > limit]
        if args.profile or missed:
            say("profiling a further run" + (f" (missed: {', '.join(missed)})" if missed else ""))
            profile = profile_run(lab, children, len(client.queue()[0]), profile_dir)
    except (RuntimeError, ApiError, OSError, ValueError, KeyError, subprocess.SubprocessError) as err:
        problems.append(f"stopped early: {type(err).__name__}: {err}")
    finally:
        children.close()
        lab.close()
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    fig["load_avg_at_end"] = os.getloadavg()[0]
    fig["wall_s"] = time.perf_counter() - began
    fig["goals_met"] = {name: fig[name] <= limit for name, _, limit in goals(fig)}
    fig["problems"] = problems
    if args.json:
        print(json.dumps(fig | raw | {"profile": profile}))
    else:
        targets = {name: (shown, fig[name] <= limit) for name, shown, limit in goals(fig)}
        print_figures(f"labq tui benchmark (Python {fig['python']}, {fig['cpus']} CPUs, {args.jobs} jobs, "
                      f"{fig['wall_s']:.0f} s)", fig, targets,
                      skip=("python", "cpus", "goals_met", "wall_s", "problems"), digits=1)
    if profile:
        say("\n".join(profile))
    if problems:  # after the figures, which help to find the cause
        say("tui benchmark: inconsistent:\n  " + "\n  ".join(problems))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
