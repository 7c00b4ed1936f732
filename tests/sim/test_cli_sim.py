"""``labq sim`` as people run it: a real process, its output, its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PHILLY = ROOT.parent / "shared" / "data" / "traces" / "philly.csv"

pytestmark = pytest.mark.timeout(120)


def labq(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labq.cli", "sim", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=110)


def report(*args: str) -> dict:
    out = labq(*args, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def without_wall(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "wall_s"}


def test_a_generated_lab_is_reported_and_the_same_seed_gives_the_same_report():
    first = report("--generate", "--days", "3", "--cluster", "1xsim:dgx1", "--seed", "4")
    assert first["policy"] == "labq" and first["gpus"] == 8 and first["jobs"] > 10
    assert first["finished"] + first["unfinished"] + first["skipped"] == first["jobs"]
    assert 0 < first["utilization"] <= 1 and first["jct"]["p50"] <= first["jct"]["p95"] <= first["jct"]["p99"]
    assert set(first["by_class"]) <= {"low", "normal", "high", "urgent"} and first["by_user"]
    again = report("--generate", "--days", "3", "--cluster", "1xsim:dgx1", "--seed", "4")
    assert without_wall(again) == without_wall(first)
    other = report("--generate", "--days", "3", "--cluster", "1xsim:dgx1", "--seed", "5")
    assert without_wall(other) != without_wall(first)


def test_policies_side_by_side_as_json_and_as_tables(tmp_path):
    doc = report("--generate", "--days", "2", "--cluster", "2xsim:ws-4x3090", "--policy", "labq,fifo,sjf")
    assert [r["policy"] for r in doc["reports"]] == ["labq", "fifo", "sjf"]
    assert len({r["jobs"] for r in doc["reports"]}) == 1  # the same workload for each
    assert all(r["preemptions"] == 0 for r in doc["reports"][1:])  # the reference policies never preempt
    png = tmp_path / "q.png"
    out = labq("--generate", "--days", "2", "--cluster", "2xsim:ws-4x3090", "--policy", "labq,fifo", "--png",
               str(png))
    assert out.returncode == 0, out.stderr
    assert "Policies compared" in out.stdout and "jobs waiting" in out.stdout and "GPUs busy" in out.stdout
    for policy in ("labq", "fifo"):
        drawn = tmp_path / f"q-{policy}.png"
        assert drawn.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and drawn.stat().st_size > 1000


def test_a_trace_with_a_job_that_never_fits_is_replayed_without_it(tmp_path):
    trace = tmp_path / "jobs.csv"
    trace.write_text("submit,duration,gpus,user,class\n0,100,4,ana,normal\n10,50,16,ben,high\n20,30,2,ana,low\n")
    doc = report("--trace", str(trace), "--cluster", "sim:ws-4x3090", "--policy", "fifo")
    assert (doc["jobs"], doc["finished"], doc["skipped"]) == (3, 2, 1)
    assert list(doc["skipped_reasons"].values()) == [1] and "16" in next(iter(doc["skipped_reasons"]))
    # fifo: ana's 2-GPU job waits for her 4-GPU one (100 s), so it ends at 130: JCT 110
    assert doc["jct"]["max"] == 110 and doc["queueing_delay"]["max"] == 80


def test_a_week_of_one_philly_virtual_cluster():
    doc = report("--trace", str(PHILLY), "--vc", "ed69ec", "--from", "2017-10-01", "--to", "2017-10-08",
                 "--cluster", "8xsim:dgx1", "--policy", "fifo,labq")
    fifo, labq_ = doc["reports"]
    assert fifo["jobs"] == labq_["jobs"] > 50 and fifo["skipped"] == 0
    assert fifo["finished"] == labq_["finished"] == fifo["jobs"]


def test_what_if_everyone_were_low_but_one_user():
    doc = report("--generate", "--days", "3", "--cluster", "1xsim:dgx1", "--class", "*=low", "--class", "ana=urgent")
    assert set(doc["by_class"]) == {"low", "urgent"} and doc["meta"]["classes"] == "*=low, ana=urgent"
    assert doc["by_class"]["urgent"]["jobs"] == doc["by_user"]["ana"]["jobs"]


def test_shares_tried_on_a_lab_of_two_queues_from_the_command_line_and_from_the_settings(tmp_path):
    doc = report("--generate", "--days", "3", "--cluster", "2xsim:dgx1", "--load", "1.5",
                 "--queue", "ana=nlp", "--queue", "ben=nlp", "--queue", "*=cv")
    assert doc["meta"]["queues"] == "cv 50%, nlp 50%"
    nlp, cv = doc["by_queue"]["nlp"], doc["by_queue"]["cv"]
    assert nlp["jobs"] == doc["by_user"]["ana"]["jobs"] + doc["by_user"]["ben"]["jobs"]
    assert nlp["jobs"] + cv["jobs"] == doc["jobs"] and nlp["gpu_hours"] > 0 and cv["gpu_hours"] > 0
    settings = tmp_path / "leader.toml"
    settings.write_text('[queues.nlp]\nmembers = ["ana", "ben"]\nguarantee = 12\n'
                        '[queues.cv]\nmembers = ["chen", "dara"]\nguarantee = 4\nborrow = false\n')
    capped = report("--generate", "--days", "3", "--cluster", "2xsim:dgx1", "--load", "1.5", "--queues", str(settings))
    assert capped["meta"]["queues"] == "nlp 12 GPUs, cv 4 GPUs"
    assert set(capped["by_queue"]) == {"nlp", "cv"}
    out = labq("--generate", "--days", "3", "--cluster", "2xsim:dgx1", "--queues", str(settings), "--queue", "ana=ml")
    assert out.returncode == 2 and "--queue names ml, which" in out.stderr and "its queues: cv, nlp" in out.stderr


@pytest.mark.parametrize(("args", "says"), [
    (["--generate", "--cluster", "1xsim:dgx1", "--queue", "ana"], "write USER=NAME"),
    (["--generate", "--cluster", "1xsim:dgx1", "--policy", "random"], "unknown policy random"),
    (["--generate", "--cluster", "3xsim:nope"], "unknown simulated inventory"),
    (["--generate", "--cluster", "0xsim:dgx1"], "the count must be 1 or more"),
    (["--trace", "/nonexistent/trace.csv", "--cluster", "1xsim:dgx1"], "no trace file"),
    (["--generate", "--cluster", "1xsim:dgx1", "--grace", "soon"], "soon"),
    (["--generate", "--cluster", "1xsim:dgx1", "--load", "0"], "--load"),
    (["--generate", "--cluster", "1xsim:dgx1", "--class", "ana"], "write USER=CLASS"),
    (["--generate", "--cluster", "1xsim:dgx1", "--class", "ana=vip"], "unknown priority"),
    (["--trace", str(PHILLY), "--cluster", "1xsim:dgx1", "--from", "last week"], "last week"),
    (["--trace", str(PHILLY), "--cluster", "1xsim:dgx1", "--from", "2017-11-01", "--to", "2017-10-01"],
     "--to must come after --from"),
])
def test_bad_input_is_one_clear_line_and_exit_2(args, says):
    out = labq(*args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.startswith("labq: error: ") and says in out.stderr and "Traceback" not in out.stderr


def test_a_bad_line_in_a_trace_is_named(tmp_path):
    trace = tmp_path / "jobs.csv"
    trace.write_text("submit,duration,gpus\n0,100,1\n5,ten,1\n")
    out = labq("--trace", str(trace), "--cluster", "1xsim:dgx1")
    assert out.returncode == 2 and "jobs.csv" in out.stderr and "line 3" in out.stderr, out.stderr


def test_help_teaches_the_formats_and_examples():
    out = subprocess.run([sys.executable, "-m", "labq.cli", "sim", "--help"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 0
    for words in ("--cluster", "16xsim:dgx1", "philly", "jsonl", "fifo", "sjf", "--png"):
        assert words in out.stdout


def test_per_vc_runs_each_virtual_cluster_on_a_cluster_of_its_own(tmp_path):
    trace = tmp_path / "two-vcs.csv"
    rows = ["submit,duration,gpus,user,class,preemptible,time_limit,vc"]
    rows += [f"{60 * i},{600 + 30 * i},{1 + i % 2},u{i % 3},normal,true,,{'vision' if i % 3 else 'nlp'}"
             for i in range(12)]
    trace.write_text("\n".join(rows) + "\n")
    doc = report("--trace", str(trace), "--per-vc", "--cluster", "1xsim:ws-4x3090", "--policy", "labq,fifo")
    reports = doc["reports"]
    assert [r["policy"] for r in reports] == ["labq (nlp)", "fifo (nlp)", "labq (vision)", "fifo (vision)"]
    assert [r["jobs"] for r in reports] == [4, 4, 8, 8] and all(r["gpus"] == 4 for r in reports)
    assert {r["meta"]["vc"] for r in reports} == {"nlp", "vision"}
    refused = labq("--trace", str(trace), "--per-vc", "--vc", "nlp", "--cluster", "1xsim:ws-4x3090")
    assert refused.returncode == 2 and "leave out --vc" in refused.stderr
    plain = tmp_path / "no-vcs.csv"
    plain.write_text("submit,duration,gpus\n0,60,1\n")
    refused = labq("--trace", str(plain), "--per-vc", "--cluster", "1xsim:ws-4x3090")
    assert refused.returncode == 2 and "no virtual clusters" in refused.stderr


def test_the_summary_shows_short_means_to_the_second():
    from labq.sim.report import format_mean

    assert [format_mean(s) for s in (0.4, 59.6, 179.0, 599.4, 600.0, 3725.0)] == [
        "0s", "60s", "179s", "599s", "10m", "1h02m"]
