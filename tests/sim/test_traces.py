"""Reading traces: exact values from small hand-written files of each format, the window and
virtual-cluster filters, errors that name file and line, and the real Philly trace."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from labq.sim.model import TraceJob, TraceReservation
from labq.sim.traces import PHILLY_VC_NODES, TraceError, guess_format, load_trace, parse_when

PHILLY = Path("/work/shared/data/traces/philly.csv")
OCT_1, DEC_1 = 1506816000.0, 1512086400.0  # 2017-10-01 and 2017-12-01, 00:00 UTC

PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"
SMALL_PHILLY = PHILLY_HEADER + (
    "2017-10-09 07:01:55,66.0,1,66.0,11cb48\n"
    "2017-10-09 06:13:03,2951.0,2,5902.0,6214e9\n"
    "2017-10-09 07:01:55,0.0,4,0.0,6214e9\n"
    "2017-10-09 06:20:00,10.0,0,0.0,6214e9\n"
    "2017-10-10 00:00:00,1.5,8,12.0,b436b2\n"
)


@pytest.fixture
def trace_file(tmp_path):
    """Writes a trace file under tmp_path and returns its path."""

    def write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write


# ---------------------------------------------------------------------------------------------- philly


def test_philly_rows_sorted_by_submit_with_ties_in_file_order(trace_file):
    workload, notes = load_trace(trace_file("small.csv", SMALL_PHILLY))
    first = parse_when("2017-10-09T06:13:03")
    assert workload.epoch == first
    assert workload.jobs == (
        TraceJob(1, 0.0, 2951.0, 2, "vc-6214e9", "6214e9"),
        TraceJob(2, 2932.0, 66.0, 1, "vc-11cb48", "11cb48"),
        TraceJob(3, 2932.0, 0.0, 4, "vc-6214e9", "6214e9"),  # zero-duration jobs are kept
        TraceJob(4, parse_when("2017-10-10") - first, 1.5, 8, "vc-b436b2", "b436b2"),
    )
    assert all(j.priority == 200 and j.preemptible and j.time_limit_s is None for j in workload.jobs)
    assert notes == ["dropped 1 row with num_gpus 0"]
    assert workload.source == "small.csv (philly)"


def test_philly_window_and_virtual_cluster(trace_file):
    path = trace_file("small.csv", SMALL_PHILLY)
    start, end = parse_when("2017-10-09T07:00:00"), parse_when("2017-10-10")
    workload, notes = load_trace(path, start=start, end=end)  # end is exclusive, start inclusive
    assert [(j.id, j.submit, j.vc) for j in workload.jobs] == [(1, 115.0, "11cb48"), (2, 115.0, "6214e9")]
    assert workload.epoch == start
    assert notes == ["dropped 1 row with num_gpus 0",
                     "left out 2 jobs submitted outside 2017-10-09 07:00 UTC to 2017-10-10 00:00 UTC"]

    workload, notes = load_trace(path, vc="6214e9")
    assert [(j.id, j.submit, j.gpus) for j in workload.jobs] == [(1, 0.0, 2), (2, 2932.0, 4)]
    assert notes[-1] == "left out 2 jobs of virtual clusters other than 6214e9"

    workload, _ = load_trace(path, start=parse_when("2017-10-09T07:00:00"), vc="b436b2")
    assert [(j.id, j.vc) for j in workload.jobs] == [(1, "b436b2")]


def test_a_virtual_cluster_the_trace_lacks_is_named_with_those_it_has(trace_file):
    with pytest.raises(TraceError, match=r"small.csv: no virtual cluster 'abc'.*11cb48, 6214e9, b436b2"):
        load_trace(trace_file("small.csv", SMALL_PHILLY), vc="abc")


def test_philly_vc_sizes_are_the_helios_ones():
    assert len(PHILLY_VC_NODES) == 11
    assert sum(PHILLY_VC_NODES.values()) == 352
    assert PHILLY_VC_NODES["6214e9"] == 64 and PHILLY_VC_NODES["ed69ec"] == 8


@pytest.fixture(scope="module")
def philly_oct_nov():
    started = time.process_time()
    loaded = load_trace(PHILLY, start=OCT_1, end=DEC_1)
    return loaded, time.process_time() - started


def test_the_philly_trace_loads_whole_and_fast():
    started = time.process_time()
    workload, notes = load_trace(PHILLY)
    seconds = time.process_time() - started
    assert len(workload.jobs) == 82_247 and notes == []
    assert seconds < 2.0, f"loading philly.csv took {seconds:.2f} s of CPU"
    assert workload.epoch == parse_when("2017-09-04T10:30:41")
    assert workload.jobs[0].submit == 0.0
    assert [j.id for j in workload.jobs] == list(range(1, 82_248))
    assert all(a.submit <= b.submit for a, b in zip(workload.jobs, workload.jobs[1:]))
    assert max(j.gpus for j in workload.jobs) == 128
    assert sum(j.gpus == 1 for j in workload.jobs) == 76_627


def test_philly_october_and_november(philly_oct_nov):
    (workload, notes), seconds = philly_oct_nov
    assert seconds < 2.0
    assert len(workload.jobs) == 68_510
    assert notes == ["left out 13,737 jobs submitted outside 2017-10-01 00:00 UTC to 2017-12-01 00:00 UTC"]
    assert workload.epoch == OCT_1
    assert workload.jobs[0].submit >= 0 and workload.jobs[-1].submit < DEC_1 - OCT_1
    vcs = Counter(j.vc for j in workload.jobs)
    assert vcs == {"6214e9": 33_950, "11cb48": 11_897, "6c71a0": 9_383, "b436b2": 7_222, "103959": 1_450,
                   "0e4a51": 1_269, "ed69ec": 1_096, "ee9e8c": 1_053, "7f04ca": 604, "2869ce": 315,
                   "e13805": 264, "795a4c": 3, "51b7ef": 2, "925e2b": 2}
    assert set(PHILLY_VC_NODES) <= set(vcs)


def test_philly_one_virtual_cluster_in_october_and_november():
    workload, notes = load_trace(PHILLY, start=OCT_1, end=DEC_1, vc="6214e9")
    assert len(workload.jobs) == 33_950
    assert {j.user for j in workload.jobs} == {"vc-6214e9"}
    assert notes[-1] == "left out 34,560 jobs of virtual clusters other than 6214e9"
    assert workload.source == ("philly.csv (philly), 2017-10-01 00:00 UTC to 2017-12-01 00:00 UTC, "
                               "virtual cluster 6214e9")


# ----------------------------------------------------------------------------------------- generic csv


def test_generic_csv_values(trace_file):
    path = trace_file("jobs.csv", (
        "submit,duration,gpus,user,class,preemptible,time_limit,vc,reservation,note\n"
        "1700000100,3600,2,ana,high,false,7200,a,ana-deadline,first\n"
        "2023-11-14T22:13:20Z,60.5,1,,,,,,,\n"
        "2023-11-14 22:15:00,0,4,ben,250,1,,b,,\n"
        "1700000000.5,10,8,chen,LOW,yes,,,,\n"
    ))
    workload, notes = load_trace(path)
    assert workload.epoch == 1700000000.0  # 2023-11-14T22:13:20Z, the first job
    assert workload.jobs == (
        TraceJob(1, 0.0, 60.5, 1, "user", "", 200, True, None, None),
        TraceJob(2, 0.5, 10.0, 8, "chen", "", 100, True, None, None),
        TraceJob(3, 100.0, 3600.0, 2, "ana", "a", 300, False, 7200.0, "ana-deadline"),
        TraceJob(4, 100.0, 0.0, 4, "ben", "b", 250, True, None, None),
    )
    assert notes == ["ignored unknown column(s) note",
                     "1 job name reservations the trace does not list: ana-deadline"]
    assert guess_format("jobs.csv", "submit,duration,gpus\n") == "csv"
    assert guess_format("x.txt", PHILLY_HEADER) == "philly"


def test_generic_csv_window(trace_file):
    rows = "".join(f"{1000 + 10 * i},5,1,u{i % 2}\n" for i in range(10))
    path = trace_file("jobs.csv", "submit,duration,gpus,vc\n" + rows)
    workload, notes = load_trace(path, start=1020, end=1070)
    assert [(j.id, j.submit, j.vc) for j in workload.jobs] == [
        (1, 0.0, "u0"), (2, 10.0, "u1"), (3, 20.0, "u0"), (4, 30.0, "u1"), (5, 40.0, "u0")]
    assert notes == ["left out 5 jobs submitted outside 1970-01-01 00:17 UTC to 1970-01-01 00:17:50 UTC"]
    workload, _ = load_trace(path, end=1070, vc="u1")
    assert workload.epoch == 1010.0 and [j.submit for j in workload.jobs] == [0.0, 20.0, 40.0]


# ---------------------------------------------------------------------------------------------- jsonl


def test_json_lines_jobs_and_reservations(trace_file):
    path = trace_file("lab.jsonl", (
        "# a deadline week\n"
        "\n"
        '{"reservation": {"name": "icml", "user": "ana", "gpus": 8, "start": "2026-01-12T09:00:00",'
        ' "end": "2026-01-13T09:00:00", "booked": 1767571200, "users": ["ben"]}}\n'
        '{"reservation": {"name": "late", "user": "ben", "gpus": 2, "start": 1768300000, "end": 1768400000}}\n'
        '{"submit": 1767575000, "duration": 3600, "gpus": 1, "user": "ben", "class": "low"}\n'
        '{"submit": "2026-01-05T01:00:00+00:00", "duration": 7200.0, "gpus": 2, "user": "ana"}\n'
        '{"submit": 1768208400, "duration": 600, "gpus": 8, "user": "ana", "class": "high",'
        ' "preemptible": false, "time_limit": 900, "reservation": "icml"}\n'
    ))
    workload, notes = load_trace(path)
    epoch = 1767574800.0  # 2026-01-05 01:00 UTC, the first job
    assert workload.epoch == epoch
    assert workload.jobs == (
        TraceJob(1, 0.0, 7200.0, 2, "ana"),
        TraceJob(2, 200.0, 3600.0, 1, "ben", priority=100),
        TraceJob(3, 1768208400 - epoch, 600.0, 8, "ana", "", 300, False, 900.0, "icml"),
    )
    assert workload.reservations == (
        TraceReservation("icml", "ana", 8, 1768208400 - epoch, 1768294800 - epoch, 1767571200 - epoch, ("ben",)),
        TraceReservation("late", "ben", 2, 1768300000 - epoch, 1768400000 - epoch, 0.0),
    )
    assert notes == []

    workload, notes = load_trace(path, start=1768200000, end=1768250000)
    assert [r.name for r in workload.reservations] == ["icml"] and len(workload.jobs) == 1
    assert notes == ["left out 2 jobs submitted outside 2026-01-12 06:40 UTC to 2026-01-12 20:33:20 UTC",
                     "left out 1 reservation outside 2026-01-12 06:40 UTC to 2026-01-12 20:33:20 UTC"]


def test_the_format_is_guessed_or_given(trace_file):
    path = trace_file("trace.txt", '{"submit": 5, "duration": 1, "gpus": 1}\n')
    assert len(load_trace(path)[0].jobs) == 1
    assert len(load_trace(trace_file("p.data", SMALL_PHILLY), "philly")[0].jobs) == 4
    with pytest.raises(ValueError, match="unknown trace format 'xml'"):
        load_trace(path, "xml")


# --------------------------------------------------------------------------------------------- errors

BAD = [
    ("a.csv", "submit,gpus\n1,1\n", 1, "missing column(s) duration"),
    ("a.csv", "submit,duration,gpus\n1,10,1\n2,ten,1\n", 3, "duration 'ten' is not a number of seconds"),
    ("a.csv", "submit,duration,gpus\n1,-5,1\n", 2, "duration '-5' is negative"),
    ("a.csv", "submit,duration,gpus\n1,5,0\n", 2, "gpus '0' is less than 1"),
    ("a.csv", "submit,duration,gpus\n1,5,1.5\n", 2, "gpus '1.5' is not a whole number"),
    ("a.csv", "submit,duration,gpus,class\n1,5,1,vip\n", 2, "class: unknown priority 'vip'"),
    ("a.csv", "submit,duration,gpus\n2017-13-40,5,1\n", 2, "submit '2017-13-40' is not a time"),
    ("a.csv", "submit,duration,gpus\n1,5\n", 2, "2 fields, expected 3"),
    ("a.csv", "submit,duration,gpus,preemptible\n1,5,1,maybe\n", 2, "preemptible 'maybe' is not true/false"),
    ("a.csv", "submit,duration,gpus\n,5,1\n", 2, "submit is empty"),
    ("p.csv", PHILLY_HEADER + "2017-10-09 07:01:55,66.0,1,66.0,a\n2017-10-09 07:61:55,6,1,6,a\n", 3,
     "timestamp '2017-10-09 07:61:55' is not a time"),
    ("p.csv", PHILLY_HEADER + "2017-10-09 07:01:55,x,1,66.0,a\n", 2, "duration 'x' is not a number of seconds"),
    ("p.csv", PHILLY_HEADER + "2017-10-09 07:01:55,-1,1,66.0,a\n", 2, "duration '-1' is negative"),
    ("p.csv", PHILLY_HEADER + "2017-10-09 07:01:55,1,-2,66.0,a\n", 2, "num_gpus '-2' is negative"),
    ("p.csv", PHILLY_HEADER + "2017-10-09 07:01:55,1\n", 2, "2 fields, expected 5"),
    ("a.jsonl", '{"submit": 1, "duration": 5, "gpus": 1}\n\n{"submit": 1, "gpus": 1}\n', 3, "duration is missing"),
    ("a.jsonl", '# c\n{"submit": 1, "duration": 5, "gpus": 1,}\n', 2, "not JSON"),
    ("a.jsonl", '[1, 2]\n', 1, "expected a JSON object"),
    ("a.jsonl", '{"submit": 1, "duration": 5, "gpus": true}\n', 1, "gpus True is not a whole number"),
    ("a.jsonl", '{"reservation": {"name": "r", "user": "u", "gpus": 1, "start": 10, "end": 5}}\n', 1,
     "reservation end must be after its start"),
]


@pytest.mark.parametrize(("name", "text", "line", "what"), BAD, ids=[f"{b[0]}-{b[3][:24]}" for b in BAD])
def test_bad_input_names_file_line_and_problem(trace_file, name, text, line, what):
    path = trace_file(name, text)
    fmt = "philly" if name == "p.csv" else None
    with pytest.raises(TraceError) as caught:
        load_trace(path, fmt)
    assert caught.value.path == str(path) and caught.value.line == line
    assert str(caught.value).startswith(f"{path}, line {line}: ")
    assert what in str(caught.value)


def test_philly_accepts_what_its_fast_path_does_not(trace_file):
    path = trace_file("p.csv", PHILLY_HEADER + "2017-10-09T07:01:55+00:00,66,2.0,66.0,a\n")
    workload, _ = load_trace(path, "philly")
    assert [(j.gpus, j.duration) for j in workload.jobs] == [(2, 66.0)]
    assert workload.epoch == parse_when("2017-10-09T07:01:55")


def test_a_reservation_listed_twice_is_an_error(trace_file):
    line = '{"reservation": {"name": "r", "user": "u", "gpus": 1, "start": 0, "end": 5}}\n'
    with pytest.raises(TraceError, match="reservation.s. r listed more than once"):
        load_trace(trace_file("a.jsonl", line + line))


# ---------------------------------------------------------------------------------------------- times


@pytest.mark.parametrize(("text", "unix"), [
    ("2017-10-01", 1506816000.0),
    ("2017-10-01T00:00:00+00:00", 1506816000.0),
    ("2017-10-01 02:00", 1506823200.0),
    ("2017-10-01T02:00:00+02:00", 1506816000.0),
    ("2017-10-01T00:00:00Z", 1506816000.0),
])
def test_parse_when(text, unix):
    assert parse_when(text) == unix


@pytest.mark.parametrize("text", ["", "yesterday", "2017-10-32", "1506816000", "10/01/2017"])
def test_parse_when_says_what_it_takes(text):
    with pytest.raises(ValueError, match="ISO date or date-time such as 2017-10-01"):
        parse_when(text)


def test_traces_and_workload_load_no_ui_or_container_libraries():
    code = ("import sys, labq.sim.traces, labq.sim.workload; "
            "print(sorted(m for m in ('textual', 'rich', 'docker', 'pynvml', 'zeroconf') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_spreadsheet_export_with_bom_and_crlf_reads_the_same(tmp_path):
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufeffsubmit,duration,gpus\r\n10,5,1\r\n20,5,2\r\n".encode())
    workload, notes = load_trace(path)
    assert [(j.submit, j.gpus) for j in workload.jobs] == [(0.0, 1), (10.0, 2)] and notes == []
