"""Which JSON library labq should use: the standard library's ``json``, ``msgspec.json`` or ``orjson``,
measured on labq's own job documents.

Records: unfinished jobs built with labq's models (``Job``, ``JobSpec``, ``Placement``) and encoded with
labq's codec (``encode_job``): a command of a few words, four environment variables, a docker image for
most, running and starting jobs placed on 2 GPUs with GPU UUIDs, a third with one or two earlier attempts
(preempted, lost), timestamps with fractions of a second, and a non-ASCII job name now and then.

What it measures (time: median over ``--repeats`` runs of the mean per call, the libraries taking turns
within each run, garbage collector on as in the leader; ``x json``: json's time over the library's, above
1 is faster; ``same``: ``yes`` when the bytes equal json's, ``json-equal`` when they differ but parse to
the same value, ``NO`` otherwise; for a decode, ``yes`` when the value parsed from json's bytes equals
json's own, types included for a journal record):

  1. journal: one commit's record with 1, 8 and 64 changed jobs, as ``TinyDBStore._write`` makes it
     (each job in canonical JSON on its own, the texts the snapshot keeps, joined into one compact
     object with the commit's numbers and a record change), and its decode (replay parses each record);
  2. snapshot, at 1,000, 10,000 and 30,000 unfinished jobs: the whole hot database encoded in one call
     as ``store/tinydb_store.py`` ``encode()`` does (canonical JSON: sorted keys, compact, not
     ASCII-escaped; its sha256 spliced into ``_meta``), and its parse on load. A compaction joins the
     job texts its commits kept (``store/hot.py``), so this is its worst case: no job changed since the
     load. orjson sorts with ``OPT_SORT_KEYS``, msgspec with ``order="sorted"``. The json encodings are
     checked once against the store's own (``encode()``, ``journal.dumps``). ``dec-gc``: the parse with
     the cyclic garbage collector paused, since at 30,000 jobs its full collections cost more than the
     parse itself;
  3. listing: a list of N job documents, compact, keys unsorted, as ``GET /v1/jobs`` makes it for jobs
     not in its per-job text cache (json there escapes non-ASCII, the libraries write UTF-8).

Also: labq's own ``encode_job``/``decode_job`` per job (paid whatever the library), the values whose bytes
differ between the libraries, and for each library its version, import time (``-X importtime``, best of
9 fresh interpreters, alone and after labq's codec), wheel tags and installed size. A library that is
not installed is reported as such. The machine's load average is printed: timings on a busy machine vary.

Run:  .venv/bin/python bench/encoders.py [--json] [--quick] [--repeats N]
      (``.venv/bin/pip install msgspec orjson`` first; neither is a labq dependency)
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.metadata
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

try:
    import labq  # noqa: F401
except ImportError:  # running from a checkout without an installed labq
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from labq.models.job import Attempt, AttemptEnd, Job, JobSpec, JobState, Runtime, StopReason
from labq.models.placement import NodeAllocation, Placement
from labq.models.reservation import Reservation
from labq.protocol.codec import decode_job, encode_job, encode_reservation

SIZES = (1_000, 10_000, 30_000)
SLOW_S = 0.25  #: a call slower than this is timed 3 times, not ``--repeats``
CHANGE_SETS = (1, 8, 64)
NOW = 1_730_000_000.0
USERS = [f"u{i:02d}" for i in range(20)]
NODES = [f"ws{i:02d}" for i in range(12)]
META_PREFIX = b'{"_meta":{"1":{'  # as in store/tinydb_store.py: the checksum is spliced in after it


@dataclass
class Library:
    """One JSON library's four operations, each bytes in or out."""

    name: str
    compact: Callable[[object], bytes]  #: compact, UTF-8 (the edge values)
    canonical: Callable[[object], bytes] | None  #: journal and snapshot: sorted keys, compact, UTF-8
    listing: Callable[[object], bytes]  #: API listing: compact, keys as they come
    loads: Callable[[bytes], object]


def stdlib() -> Library:
    def compact(o):
        return json.dumps(o, separators=(",", ":"), ensure_ascii=False).encode()

    def canonical(o):  # store/journal.py dumps, which store/tinydb_store.py encode() uses
        return json.dumps(o, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    def listing(o):  # labq/leader/routes.py: json.dumps(..., separators=(",", ":"))
        return json.dumps(o, separators=(",", ":")).encode()

    return Library("json", compact, canonical, listing, lambda raw: json.loads(raw.decode("utf-8")))


def libraries() -> tuple[list[Library], list[str]]:
    """The libraries to compare, and the names of those not installed."""
    found, missing = [stdlib()], []
    try:
        import msgspec.json
        plain = msgspec.json.Encoder()
        try:
            ordered = msgspec.json.Encoder(order="sorted")
        except TypeError:  # msgspec before 0.18 cannot sort
            ordered = None
        decoder = msgspec.json.Decoder()
        found.append(Library("msgspec", plain.encode, ordered.encode if ordered else None, plain.encode,
                             decoder.decode))
    except ImportError:
        missing.append("msgspec")
    try:
        import orjson
        found.append(Library("orjson", orjson.dumps, lambda o: orjson.dumps(o, option=orjson.OPT_SORT_KEYS),
                             orjson.dumps, orjson.loads))
    except ImportError:
        missing.append("orjson")
    return found, missing


# -- labq's records --------------------------------------------------------------------------------

def make_job(job_id: int, rng: random.Random) -> Job:
    """An unfinished job as the leader holds it: ~45% running, 40% queued, the rest held/starting/preempting."""
    user = USERS[job_id % len(USERS)]
    roll = rng.random()
    state = (JobState.RUNNING if roll < 0.45 else JobState.QUEUED if roll < 0.85 else
             JobState.HELD if roll < 0.90 else JobState.STARTING if roll < 0.95 else JobState.PREEMPTING)
    placed = state.holds_gpus
    docker = job_id % 4 != 0
    name = f"expérience-{job_id % 50}" if job_id % 25 == 0 else f"sweep-lr{rng.choice((1, 3, 10))}e-4-{job_id % 13}"
    spec = JobSpec(
        user=user, name=name, gpus=2 if placed else rng.choice((1, 1, 2, 4, 8)),
        command=("python", "train.py", "--config", f"configs/run{job_id % 97}.yaml", "--seed", str(job_id % 7)),
        runtime=Runtime.DOCKER if docker else Runtime.PROCESS,
        image="ghcr.io/lab/pytorch:2.4.1-cuda12.4" if docker else None,
        env=(("HF_HOME", f"/scratch/{user}/hf"), ("OMP_NUM_THREADS", "8"), ("WANDB_API_KEY", f"{job_id:040x}"),
             ("WANDB_PROJECT", f"{user}-exp")),
        workdir=f"/home/{user}/proj" if not docker else None, priority=rng.choice((0, 10, 20)),
        time_limit_s=rng.choice((None, 14400.0, 86400.0)), checkpoint_signal="SIGUSR1" if job_id % 3 else None,
        queue=rng.choice(("vision", "nlp", None)))
    submitted = NOW - rng.uniform(60, 86400 * 3)
    history = []
    for number in range(1, 1 + (rng.choice((1, 2)) if job_id % 3 == 0 else 0)):
        start = submitted + number * rng.uniform(100, 3000)
        history.append(Attempt(number, placement(rng), start, start + rng.uniform(600, 7200),
                               rng.choice((AttemptEnd.CHECKPOINTED, AttemptEnd.LOST)), exit_code=0,
                               stop_reason=StopReason.PREEMPTED, preempted_for=job_id + rng.randint(1, 500),
                               last_checkpoint_at=start + rng.uniform(60, 600), work_lost_s=rng.uniform(0, 600)))
    started = NOW - rng.uniform(10, 3600) if placed else None
    return Job(job_id, spec, submitted, state=state, attempt=len(history) + 1,
               placement=placement(rng) if placed else None, started_at=started,
               last_checkpoint_at=started + 30.5 if started and job_id % 2 else None,
               preemptions=len(history), history=tuple(history),
               preempted_for=job_id + 1 if state is JobState.PREEMPTING else None,
               note="released from reservation 'thèse'" if job_id % 40 == 0 else "")


def placement(rng: random.Random) -> Placement:
    node, first = rng.choice(NODES), rng.choice((0, 2, 4, 6))
    indices = (first, first + 1)
    return Placement((NodeAllocation(node, indices, tuple(f"GPU-{rng.getrandbits(128):032x}" for _ in indices),
                                     score=rng.choice((0, 10, 40))),))


def hot_database(docs: list[dict]) -> dict:
    """What TinyDBStore keeps in memory (TinyDB's JSON layout): tables of documents by string id."""
    last = docs[-1]["id"]
    tables = {"_meta": {"1": {"schema": 1, "seq": 123_456, "next_job_id": last + 1, "ids_reserved_until": last + 1001}},
              "jobs": {str(d["id"]): d for d in docs}}
    records = {
        "users": {u: {"admin": u == "u00", "groups": ["lab"], "token_ids": [f"t{u}"]} for u in USERS},
        "usage": {u: {"gpu_hours": 1234.5 + i, "at": NOW} for i, u in enumerate(USERS)},
        "agents": {n: {"session": f"{i:032x}", "address": f"10.0.0.{i + 10}:7421", "seen": NOW - i}
                   for i, n in enumerate(NODES)},
        "reservations": {f"paper{i}": encode_reservation(Reservation(
            f"paper{i}", USERS[i], 4, NOW + i * 86400, NOW + (i + 2) * 86400, frozenset(USERS[i + 1:i + 3]),
            node=NODES[i], gpu_indices=(0, 1, 2, 3), created_at=NOW - 3600)) for i in range(5)},
    }
    for table, by_key in records.items():
        tables[table] = {str(n): {"key": key, "record": rec} for n, (key, rec) in enumerate(by_key.items(), 1)}
    return tables


def journal_record(canonical: Callable[[object], bytes], docs: list[dict]) -> bytes:
    """One commit's journal payload as ``TinyDBStore._write`` makes it: each changed job encoded on its
    own (the snapshot keeps these texts), joined into ``{"jobs":{..},"next_job_id":..,"records":..,..}``."""
    texts = {d["id"]: canonical(d) for d in docs}
    records = [["usage", USERS[0], {"at": NOW, "gpu_hours": 12.5}]]
    return (b'{"jobs":{' + b",".join(b'"%d":%s' % (job_id, text) for job_id, text in texts.items())
            + b'},"next_job_id":%d,"records":%s,"reserved":%d,"seq":%d}'
            % (100_000, canonical(records), 101_000, 123_457))


def snapshot(canonical: Callable[[object], bytes], data: dict) -> bytes:
    """The file's bytes as ``encode()`` in store/tinydb_store.py makes them, with another serializer."""
    body = canonical(data)
    digest = hashlib.sha256(body).hexdigest().encode()
    return META_PREFIX + b'"checksum":"' + digest + b'",' + body[len(META_PREFIX):]


# -- measuring -------------------------------------------------------------------------------------

def first_run(fn: Callable[[], object], min_run_s: float = 0.02) -> tuple[int, float | None, object]:
    """How many calls make one timed run last ``min_run_s``; the time of one call when a single call
    does (that run is then the first sample); and what ``fn`` returned."""
    number = 1
    while True:
        gc.collect()
        start = time.perf_counter()
        for _ in range(number):
            out = fn()
        took = time.perf_counter() - start
        if took >= min_run_s:
            return number, took if number == 1 else None, out
        number *= max(2, min(100, int(min_run_s / max(took, 1e-7)) + 1))


def per_call_s(fns: list[Callable[[], object]], repeats: int) -> tuple[list[float], list[object]]:
    """For each function, the median over ``repeats`` runs of the mean time of one call (3 runs
    where a call takes over ``SLOW_S``), and what it returned.

    The functions take turns within each repeat, so a burst of load from elsewhere on the
    machine slows all of them alike instead of one.
    """
    firsts = [first_run(fn) for fn in fns]
    times = [[t] if t is not None else [] for _, t, _ in firsts]
    if any(t and t[0] > SLOW_S for t in times):
        repeats = min(repeats, 3)
    for r in range(repeats):
        for fn, (number, _, _), samples in zip(fns, firsts, times):
            if len(samples) > r:
                continue
            gc.collect()
            start = time.perf_counter()
            for _ in range(number):
                fn()
            samples.append((time.perf_counter() - start) / number)
    return [statistics.median(t) for t in times], [out for _, _, out in firsts]


def same_bytes(out: bytes, ref: bytes) -> str:
    if out == ref:
        return "yes"
    return "json-equal" if json.loads(out) == json.loads(ref) else "NO"


def same_value(got: object, ref: object) -> str:
    """Equal values of equal types (``1`` is not ``1.0``): for a journal record."""
    return "yes" if repr(got) == repr(ref) else "NO"


def equal_value(got: object, ref: object) -> str:
    """Equal values (``==``): for a snapshot, whose ``repr`` would take a second."""
    return "yes" if got == ref else "NO"


def gc_paused(loads: Callable[[bytes], object]) -> Callable[[bytes], object]:
    """``loads`` with the cyclic garbage collector off while it runs (``gc.disable()`` around the load)."""
    def run(raw: bytes) -> object:
        gc.disable()
        try:
            return loads(raw)
        finally:
            gc.enable()
    return run


def row(case: str, op: str, n: int, libs: list[Library], pick: Callable[[Library], Callable | None],
        arg: object, repeats: int, check: Callable[[object, object], str]) -> dict:
    """Time one operation for every library; ``check`` compares each output with json's (the first)."""
    able = [(lib.name, fn) for lib in libs if (fn := pick(lib)) is not None]
    seconds, outs = per_call_s([lambda fn=fn: fn(arg) for _, fn in able], repeats)
    results = {lib.name: {"ms": None, "ratio": None, "same": "cannot"} for lib in libs}
    for (name, _), s, out in zip(able, seconds, outs):
        results[name] = {"ms": s * 1000, "ratio": seconds[0] / s, "same": check(out, outs[0])}
    return {"case": case, "op": op, "n": n, "results": results}


def edge_values(libs: list[Library]) -> list[dict]:
    """Values whose compact bytes differ from json's (ensure_ascii=False), or that a library refuses."""
    probes = {"1e16": 1e16, "1e-7": 1e-7, "1.5e300": 1.5e300, "0.1+0.2": 0.1 + 0.2, "1730000000.0": NOW,
              "nan": float("nan"), "2**64": 2 ** 64, "-2**63-1": -2 ** 63 - 1, "'é'": "é", "'😀'": "😀",
              "U+2028": "\u2028", "DEL": "\x7f", "'</'": "</", "{1: 'int key'}": {1: "int key"},
              "True key": {True: 1}}
    rows = []
    for label, value in probes.items():
        outs = {}
        for lib in libs:
            try:
                outs[lib.name] = lib.compact(value).decode()
            except Exception as err:  # noqa: BLE001 (a refusal is what we report)
                outs[lib.name] = f"error: {type(err).__name__}"
        if len(set(outs.values())) > 1:
            rows.append({"value": label, **outs})
    return rows


def library_facts(name: str) -> dict:
    """Version, import time, wheel tags and installed size of ``name`` (``json``: the standard library)."""
    module = {"msgspec": "msgspec.json"}.get(name, name)
    facts: dict = {"name": name}
    if name != "json":
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            return {**facts, "installed": False}
        wheel = dist.read_text("WHEEL") or ""
        files = [f.locate() for f in dist.files or ()]
        facts |= {"version": dist.version, "wheel": [ln.split(": ", 1)[1] for ln in wheel.splitlines()
                                                     if ln.startswith("Tag: ")],
                  "installed_kib": round(sum(p.stat().st_size for p in files if p.is_file()) / 1024)}
    alone = import_ms(module, name)
    if alone is None:
        return {**facts, "installed": False}
    return facts | {"installed": True, "import_ms": alone, "import_after_labq_ms": import_ms(module, name, AFTER)}


AFTER = "labq.protocol.codec"  #: what a labq process has imported before it needs JSON


def import_ms(module: str, top: str, before: str | None = None) -> float | None:
    """Best of 9 fresh interpreters' ``-X importtime`` for ``module`` (after ``before``); None if it fails.
    The best, not the median: on a shared machine another process's burst only ever adds."""
    times = []
    for _ in range(9):
        code = f"import {before}; import {module}" if before else f"import {module}"
        run = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent.parent)
        if run.returncode:
            return None
        total = 0
        for line in run.stderr.splitlines():  # "import time: self | cumulative | name", indented by depth
            parts = line.split("|")
            if len(parts) == 3 and not parts[2].startswith("  ") and parts[2].strip().split(".")[0] == top:
                total += int(parts[1])
        times.append(total / 1000)
    return min(times)


# -- the run ---------------------------------------------------------------------------------------

def measure(sizes: tuple[int, ...], repeats: int) -> dict:
    load_before = os.getloadavg()[0]
    libs, missing = libraries()
    rng = random.Random(7)
    jobs = [make_job(i, rng) for i in range(1, max(sizes) + 1)]
    docs = [encode_job(j) for j in jobs]
    rows = []
    gc.freeze()  # the inputs outlive every run: keep the collector's passes (one before each run) short

    jobs_k, docs_k = jobs[:1000], docs[:1000]
    (enc_s, dec_s), _ = per_call_s([lambda: [encode_job(j) for j in jobs_k], lambda: [decode_job(d) for d in docs_k]],
                                   repeats)
    codec = {"encode_job_us": enc_s * 1e6 / len(jobs_k), "decode_job_us": dec_s * 1e6 / len(docs_k),
             "doc_bytes_median": statistics.median(len(stdlib().compact(d)) for d in docs_k)}

    for k in CHANGE_SETS:
        raw = journal_record(stdlib().canonical, docs[:k])
        rows.append(row("journal", "encode", k, libs,
                        lambda lib: (lambda d, c=lib.canonical: journal_record(c, d)) if lib.canonical else None,
                        docs[:k], repeats, same_bytes))
        rows.append(row("journal", "decode", k, libs, lambda lib: lib.loads, raw, repeats, same_value))

    for n in sizes:
        data = hot_database(docs[:n])
        raw = snapshot(stdlib().canonical, data)
        gc.freeze()
        rows.append(row("snapshot", "encode", n, libs,
                        lambda lib: (lambda d, c=lib.canonical: snapshot(c, d)) if lib.canonical else None,
                        data, repeats, same_bytes))
        rows.append(row("snapshot", "decode", n, libs, lambda lib: lib.loads, raw, repeats, equal_value))
        rows.append(row("snapshot", "dec-gc", n, libs, lambda lib: gc_paused(lib.loads), raw, repeats, equal_value))
        rows.append(row("listing", "encode", n, libs, lambda lib: lib.listing, docs[:n], repeats, same_bytes))
        sha_ms = per_call_s([lambda: hashlib.sha256(raw).hexdigest()], repeats)[0][0] * 1000
        del data, raw
        gc.unfreeze()

    facts = [library_facts(n) for n in ("json", "msgspec", "orjson")]
    return {"python": sys.version.split()[0], "cpus": os.cpu_count(),
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)], "missing": missing,
            "codec": codec, "rows": rows, "store_check": store_check(docs[:1000]), "edges": edge_values(libs),
            "sha256_ms_at_largest": sha_ms, "libraries": facts}


def store_check(docs: list[dict]) -> str:
    """Whether this file's json encodings are byte for byte the store's: ``encode()`` of the snapshot,
    ``dumps`` of each job in a journal record."""
    try:
        from labq.store.journal import dumps
        from labq.store.tinydb_store import encode
    except Exception as err:  # noqa: BLE001 (others edit the store; say so and go on)
        return f"not checked: the store did not import ({type(err).__name__}: {err})"
    same = (encode(hot_database(docs)) == snapshot(stdlib().canonical, hot_database(docs))
            and all(dumps(d) == stdlib().canonical(d) for d in docs))
    return "identical" if same else "DIFFERENT (update this benchmark)"


def print_report(fig: dict) -> None:
    names = [f["name"] for f in fig["libraries"]]
    print(f"JSON libraries on labq job documents (Python {fig['python']}, {fig['cpus']} CPUs, load average "
          f"{fig['load_average'][0]} at start, {fig['load_average'][1]} at end; time: median ms per call)\n")
    header = f"{'case':<9} {'op':<6} {'n':>6}  " + "  ".join(
        f"{n + ' ms':>11} {'x json':>6} {'same':<10}" if n != "json" else f"{'json ms':>10}" for n in names)
    print(header.rstrip())
    print("-" * len(header))
    for r in fig["rows"]:
        cells = []
        for name in names:
            res = r["results"].get(name)
            if res is None or res["ms"] is None:
                text = "not installed" if res is None else "cannot sort"
                cells.append(f"{text:>30}" if name != "json" else f"{text:>10}")
                continue
            ms = f"{res['ms']:.4f}" if res["ms"] < 1 else f"{res['ms']:.1f}"
            cells.append(f"{ms:>10}" if name == "json" else f"{ms:>11} {res['ratio']:5.1f}x {res['same']:<10}")
        print((f"{r['case']:<9} {r['op']:<6} {r['n']:>6,}  " + "  ".join(cells)).rstrip())
    c = fig["codec"]
    print(f"\nlabq's codec, paid whatever the library: encode_job {c['encode_job_us']:.1f} us, decode_job "
          f"{c['decode_job_us']:.1f} us per job (a job document is ~{c['doc_bytes_median']:.0f} bytes of JSON)")
    print(f"sha256 of the largest snapshot (in its encode time above): {fig['sha256_ms_at_largest']:.1f} ms")
    print(f"json encodings vs the store's own (tinydb_store.encode, journal.dumps): {fig['store_check']}")
    if fig["edges"]:
        print("\nValues whose compact bytes differ from json's (ensure_ascii=False), or that a library refuses:")
        for e in fig["edges"]:
            print(f"  {e['value']:<16} " + "   ".join(f"{n}: {e.get(n, '-')}" for n in names))
    print("\nLibraries:")
    for f in fig["libraries"]:
        if not f["installed"]:
            print(f"  {f['name']:<8} not installed")
        elif f["name"] == "json":
            print(f"  {'json':<8} standard library; import {f['import_ms']:.1f} ms alone, "
                  f"{f['import_after_labq_ms']:.1f} ms after {AFTER}")
        else:
            print(f"  {f['name']:<8} {f['version']}: import {f['import_ms']:.1f} ms alone, "
                  f"{f['import_after_labq_ms']:.1f} ms after {AFTER}; installed {f['installed_kib']} KiB; "
                  f"wheel {', '.join(f['wheel'])}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--quick", action="store_true", help="1,000 jobs only, 3 repeats (smoke run)")
    parser.add_argument("--repeats", type=int, default=7,
                        help=f"runs per figure, the median is reported (default 7; 3 for calls over {SLOW_S} s)")
    args = parser.parse_args(argv)
    sizes = SIZES[:1] if args.quick else SIZES
    fig = measure(sizes, 3 if args.quick else args.repeats)
    if args.json:
        print(json.dumps(fig, indent=2, ensure_ascii=False))
    else:
        print_report(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
