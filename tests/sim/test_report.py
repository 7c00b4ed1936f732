"""The report and the plots of a simulation, on results small enough to work out by hand."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from rich.console import Console

from labq.models.priority import PriorityClass
from labq.sim.model import JobOutcome, Sample, SimResult, TraceJob
from labq.sim.plot import downsample, png_plot, terminal_plot
from labq.sim.report import (
    Stats,
    compare_table,
    make_report,
    report_json,
    report_table,
    stats,
)

HIGH, NORMAL, LOW = int(PriorityClass.HIGH), int(PriorityClass.NORMAL), int(PriorityClass.LOW)
EPOCH = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC


def job(id: int, submit: float, gpus: int = 1, *, user: str = "alice", priority: int = NORMAL) -> TraceJob:
    return TraceJob(id=id, submit=submit, duration=3600, gpus=gpus, user=user, priority=priority)


# Two GPUs, five jobs; every figure below follows from this timeline:
#   t=0     alice/1 and bob/2 start (delay 0)
#   t=1800  bob/2 ends (JCT 30m); alice/3, submitted at 600, starts (delay 20m)
#   t=3600  alice/1 ends (JCT 1h)
#   t=5400  alice/3 ends (JCT 1h20m, preempted once, 900 GPU-s lost); carol/4 (2 GPUs, submitted 1200) starts
#   t=9000  carol/4 ends (delay 1h10m, JCT 2h10m, preempted twice, 2700 GPU-s lost)
#   bob/5 (priority 250) is submitted at 3000 and never starts.
OUTCOMES = (
    JobOutcome(job(1, 0), start=0, end=3600),
    JobOutcome(job(2, 0, user="bob", priority=HIGH), start=0, end=1800),
    JobOutcome(job(3, 600), start=1800, end=5400, preemptions=1, lost_gpu_s=900),
    JobOutcome(job(4, 1200, 2, user="carol", priority=LOW), start=5400, end=9000, preemptions=2, lost_gpu_s=2700),
    JobOutcome(job(5, 3000, user="bob", priority=250), start=None, end=None),
)
TOO_BIG = "needs 4 GPUs, the largest node has 2"
SKIPPED = ((job(6, 0, 4, user="dave"), TOO_BIG), (job(7, 10, 4, user="dave"), TOO_BIG),
           (job(8, 20, user="erin"), "reservation [gone]"))
SAMPLES = (Sample(0, 0, 2, 2), Sample(600, 1, 2, 2), Sample(1200, 2, 2, 2), Sample(1800, 1, 2, 2),
           Sample(3000, 2, 2, 2), Sample(3600, 2, 1, 1), Sample(5400, 1, 1, 2), Sample(9000, 1, 0, 0))
BUSY_GPU_S = 2 * 3600 + 1 * 1800 + 2 * 3600  # the samples' busy GPUs over time: 16,200


def lab_result(policy: str = "labq", **kw) -> SimResult:
    fields = dict(policy=policy, cluster="1xsim:ws-2x3090", gpus=2, outcomes=OUTCOMES, skipped=SKIPPED,
                  samples=SAMPLES, busy_gpu_s=BUSY_GPU_S, wall_s=0.25, passes=42,
                  meta={"seed": 7, "window": (0, 9000)})
    return SimResult(**{**fields, **kw})


def rendered(renderable, width: int = 120) -> str:
    console = Console(record=True, width=width)
    console.print(renderable)
    return console.export_text()


# --- stats ----------------------------------------------------------------------------------------

def test_percentiles_are_nearest_rank():
    assert stats(range(1, 101)) == Stats(count=100, mean=50.5, p50=50, p95=95, p99=99, max=100)


@pytest.mark.parametrize(("values", "expected"), [
    ([], Stats(0, 0, 0, 0, 0, 0)),
    ([7], Stats(1, 7, 7, 7, 7, 7)),
    ([1, 2], Stats(2, 1.5, 1, 2, 2, 2)),
    ([3, 1, 2], Stats(3, 2, 2, 3, 3, 3)),  # sorted first
    ([0, 0, 1200, 4200], Stats(4, 1350, 0, 4200, 4200, 4200)),
    (list(range(1, 21)), Stats(20, 10.5, 10, 19, 20, 20)),  # p95 of 20 values is the 19th
])
def test_stats(values, expected):
    assert stats(values) == expected


# --- the report -----------------------------------------------------------------------------------

def test_summary_figures():
    r = make_report(lab_result())
    assert (r.policy, r.cluster, r.gpus) == ("labq", "1xsim:ws-2x3090", 2)
    assert (r.jobs, r.finished, r.unfinished, r.skipped) == (8, 4, 1, 3)
    assert r.skipped_reasons == {TOO_BIG: 2, "reservation [gone]": 1}
    assert list(r.skipped_reasons) == [TOO_BIG, "reservation [gone]"]  # most common first
    assert r.queueing_delay == Stats(count=4, mean=1350, p50=0, p95=4200, p99=4200, max=4200)
    assert r.jct == Stats(count=4, mean=4500, p50=3600, p95=7800, p99=7800, max=7800)
    assert r.makespan_s == 9000
    assert r.utilization == pytest.approx(16200 / (2 * 9000))  # 0.9
    assert r.preemptions == 3
    assert r.gpu_hours_lost == pytest.approx(1.0)
    assert (r.wall_s, r.passes, r.meta["seed"]) == (0.25, 42, 7)


def test_per_class_breakdown_highest_class_first():
    by_class = make_report(lab_result()).by_class
    assert list(by_class) == ["high", "250", "normal", "low"]
    normal = by_class["normal"]
    assert (normal.jobs, normal.finished, normal.preemptions) == (2, 2, 1)
    assert normal.queueing_delay == Stats(2, 600, 0, 1200, 1200, 1200)
    assert normal.jct == Stats(2, 4200, 3600, 4800, 4800, 4800)
    assert normal.gpu_hours_lost == pytest.approx(0.25)
    assert by_class["250"].finished == 0 and by_class["250"].queueing_delay == Stats()
    assert by_class["low"].jct.mean == 7800 and by_class["low"].gpu_hours_lost == pytest.approx(0.75)


def test_per_user_breakdown_busiest_first():
    by_user = make_report(lab_result()).by_user
    assert list(by_user) == ["alice", "bob", "carol"]  # alice and bob tie on jobs: by name
    bob = by_user["bob"]
    assert (bob.jobs, bob.finished) == (2, 1)
    assert bob.queueing_delay == Stats(1, 0, 0, 0, 0, 0)  # bob/5 never started
    assert by_user["alice"].jct == Stats(2, 4200, 3600, 4800, 4800, 4800)
    assert "dave" not in by_user  # skipped jobs count in the summary only


def test_nothing_finished_has_no_makespan_or_utilization():
    r = make_report(lab_result(outcomes=(OUTCOMES[4],), skipped=(), busy_gpu_s=0))
    assert (r.jobs, r.finished, r.unfinished, r.makespan_s, r.utilization) == (1, 0, 1, 0, 0)
    assert r.queueing_delay == Stats() and r.jct == Stats()


def test_a_skipped_job_also_in_the_outcomes_counts_once():
    r = make_report(lab_result(skipped=((OUTCOMES[4].job, "too big"),)))
    assert (r.jobs, r.finished, r.unfinished, r.skipped) == (5, 4, 0, 1)


def test_json_round_trip():
    doc = report_json(make_report(lab_result()))
    assert json.loads(json.dumps(doc)) == doc
    assert doc["queueing_delay"] == {"count": 4, "mean": 1350.0, "p50": 0.0, "p95": 4200.0, "p99": 4200.0,
                                     "max": 4200.0}
    assert (doc["makespan_s"], doc["utilization"], doc["gpu_hours_lost"]) == (9000.0, 0.9, 1.0)
    assert list(doc["by_class"]) == ["high", "250", "normal", "low"]
    assert doc["by_user"]["alice"]["jct"]["p95"] == 4800.0
    assert doc["meta"] == {"seed": 7, "window": [0, 9000]}
    assert doc["skipped_reasons"] == {TOO_BIG: 2, "reservation [gone]": 1}


def test_json_rounds_to_milliseconds():
    r = make_report(lab_result(outcomes=(JobOutcome(job(1, 0), start=1 / 3, end=10 / 3),), skipped=()))
    assert report_json(r)["queueing_delay"]["mean"] == 0.333


# --- tables ---------------------------------------------------------------------------------------

def test_table_shows_the_figures():
    text = rendered(report_table(make_report(lab_result())))
    assert "labq on 1xsim:ws-2x3090 (2 GPUs)" in text
    for figure in ("p50 0s · p95 1h10m · p99 1h10m · mean 22m",  # delay
                   "p50 1h00m · p95 2h10m · p99 2h10m · mean 1h15m",  # JCT
                   "2h30m", "90.0%", "0.25s (42 scheduling passes)"):
        assert figure in text
    assert f"3 ({TOO_BIG}: 2; reservation [gone]: 1)" in text  # brackets are text, not markup
    lines = text.splitlines()
    assert any(line.split()[:3] == ["│", "normal", "│"] and "1h00m" in line and "1h20m" in line for line in lines)
    assert any(line.split()[:3] == ["│", "carol", "│"] and "2h10m" in line for line in lines)


def test_table_title_can_be_given():
    assert "Deadline week" in rendered(report_table(make_report(lab_result()), title="Deadline week"))


def test_many_users_show_the_top_15():
    outcomes = tuple(JobOutcome(job(i, 0, user=f"vc{n:02d}"), start=0, end=60)
                     for i, n in enumerate(n for n in range(20) for _ in range(n + 1)))
    text = rendered(report_table(make_report(lab_result(outcomes=outcomes, skipped=()))))
    assert "vc19" in text and "vc05" in text and "vc04" not in text
    assert "and 5 more users" in text


def test_a_narrow_console_leaves_out_columns_rather_than_cutting_figures_short():
    reports = [make_report(lab_result(p)) for p in ("labq", "fifo", "sjf")]
    for width in (60, 80, 100):
        text = rendered(report_table(reports[0]), width) + rendered(compare_table(reports), width)
        assert "…" not in text and max(map(len, text.splitlines())) <= width
    narrow = rendered(compare_table(reports), 80)
    assert "left out to fit 80 characters: delay mean, JCT mean, makespan, wall" in narrow
    assert "delay" in narrow and "90.0%" in narrow and "span" not in narrow.split("left out")[0]


def test_compare_table_one_row_per_policy():
    reports = [make_report(lab_result(p, wall_s=w)) for p, w in (("labq", 0.5), ("fifo", 0.1), ("sjf", 65))]
    text = rendered(compare_table(reports))
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith("│")}
    assert set(rows) == {"labq", "fifo", "sjf"}
    assert "90.0%" in rows["fifo"] and "0.10s" in rows["fifo"] and "1m" in rows["sjf"]
    assert "different numbers of jobs" not in text


# --- plots ----------------------------------------------------------------------------------------

def test_downsample_weighs_busy_gpus_by_time():
    samples = [Sample(0, 3, 1, 2), Sample(5, 0, 0, 0), Sample(25, 0, 0, 0), Sample(30, 0, 0, 0)]
    b = downsample(samples, 3)
    assert b.width == 10
    assert b.busy == pytest.approx([1.0, 0.0, 0.0])  # 2 GPUs for half of the first slice
    assert b.queued == [3, 0, 0]


def test_downsample_keeps_what_holds_through_empty_slices():
    b = downsample([Sample(0, 3, 1, 4), Sample(25, 0, 0, 0), Sample(30, 0, 0, 0)], 3)
    assert b.queued == [3, 3, 3]  # 3 waited until 25, into the last slice
    assert b.busy == pytest.approx([4, 4, 2])


def test_downsample_keeps_a_short_burst():
    samples = [Sample(float(t), 5000 if t == 77_777 else 1, 0, 8) for t in range(120_000)]
    b = downsample(samples, 60)
    assert max(b.queued) == 5000 and b.queued.index(5000) == 77_777 * 60 // 119_999
    assert b.busy == pytest.approx([8] * 60)


@pytest.mark.parametrize(("width", "height"), [(72, 12), (40, 6), (120, 20), (73, 13)])
def test_terminal_plot_has_the_requested_size(width, height):
    lines = terminal_plot(SAMPLES, 2, width=width, height=height).split("\n")
    assert len(lines) == height
    assert {len(line) for line in lines} == {width}


def test_terminal_plot_marks_the_peak():
    lines = terminal_plot(SAMPLES, 2, width=72, height=12, epoch=EPOCH).split("\n")
    assert "▼ peak 2 at 2023-11-14 22:33 UTC" in lines[0]  # first reached at 1200
    mark = lines[0].index("▼")
    assert lines[1].startswith("     2 ┤") and lines[1][mark] == "█"  # the top of the queue panel
    assert lines[1][mark - 1] == " "  # one job waited just before
    assert lines[4].startswith("     0 ┤")
    assert "GPUs busy, of 2 · 90% on average" in lines[5]
    assert lines[6].startswith("  100% ┤█") and lines[9].startswith("    0% ┤")
    assert lines[11].split()[0] == "22:13" and lines[11].split()[-1] == "00:43"  # 9000 s later


def test_terminal_plot_without_a_calendar_shows_time_since_the_start():
    text = terminal_plot(SAMPLES, 2)
    assert "peak 2 at +20m" in text
    assert text.split("\n")[-1].split()[0] == "+0s" and text.split("\n")[-1].split()[-1] == "+2h30m"


def test_terminal_plot_with_too_few_samples_says_so():
    assert terminal_plot([], 8) == "no samples"
    one = terminal_plot([Sample(60, 3, 2, 4)], 8)
    assert "no samples over time" in one and "3 queued" in one and "4/8 GPUs busy" in one


def test_terminal_plot_of_many_samples():
    samples = [Sample(t * 60.0, (t // 1000) % 7, 1, t % 9) for t in range(100_000)]
    lines = terminal_plot(samples, 8, width=80, height=14, epoch=EPOCH).split("\n")
    assert len(lines) == 14 and "peak 6 at 2023-11-19 02:13 UTC" in lines[0]  # sample 6000: 100 hours in


def test_terminal_plot_refuses_a_tiny_size():
    with pytest.raises(ValueError, match="at least"):
        terminal_plot(SAMPLES, 2, width=10, height=3)


@pytest.mark.parametrize("epoch", [0.0, EPOCH])
def test_png_plot_writes_a_png(tmp_path, epoch):
    pytest.importorskip("matplotlib")
    samples = [Sample(t * 60.0, (t // 500) % 11, 1, t % 5) for t in range(20_000)]
    path = png_plot(samples, 4, tmp_path / "lab.png", title="labq on 1xsim:dgx1", epoch=epoch)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1024


def test_png_plot_of_no_samples(tmp_path):
    pytest.importorskip("matplotlib")
    data = png_plot([], 4, str(tmp_path / "empty.png")).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1024


def run_python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=True).stdout


def test_png_plot_without_matplotlib_says_what_to_install(tmp_path):
    out = run_python(
        "import sys; sys.modules['matplotlib'] = None\n"  # what a missing package looks like to import
        "from labq.sim.plot import png_plot\n"
        "try:\n"
        f"    png_plot([], 4, {str(tmp_path / 'x.png')!r})\n"
        "except RuntimeError as e:\n"
        "    print(e)\n")
    assert "pip install 'labq[plot]'" in out


def test_report_and_plot_load_neither_rich_nor_matplotlib():
    out = run_python("import sys, labq.sim.report, labq.sim.plot\n"
                     "print(sorted(m for m in ('rich', 'matplotlib') if m in sys.modules))")
    assert out.strip() == "[]"
