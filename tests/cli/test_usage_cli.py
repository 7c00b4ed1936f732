"""``labq usage`` against a real leader on loopback over a real store (``tests/leader/usage_history.py``): the text
report fits 80 columns and says the hand-worked October figures, ``--csv`` and ``--json`` parse, ``--me`` works for
anyone, the whole lab is refused to a user with what to type instead, and bad times are refused before any request.
The figures themselves are checked at the API: ``tests/leader/test_usage_endpoint.py``."""

from __future__ import annotations

import csv
import io
import json

import pytest

from labq.cli import main
from labq.cli.errors import REFUSED, USAGE
from tests.leader.usage_history import start_usage_lab

pytestmark = pytest.mark.timeout(120)

MONTH = ["--month", "2026-10", "--tz", "UTC"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lb = start_usage_lab(tmp_path_factory.mktemp("usage-cli") / "data")
    yield lb
    lb.stop()


def labq(lab, monkeypatch, capsys, *argv: str, user: str | None = None) -> tuple[int, str, str]:
    """``labq ARGV`` in this process as the admin (or ``user``): (exit status, stdout, stderr)."""
    monkeypatch.setenv("LABQ_LEADER", f"http://127.0.0.1:{lab.port}")
    monkeypatch.setenv("LABQ_TOKEN", lab.tokens[user] if user else lab.admin_token)
    monkeypatch.setenv("NO_COLOR", "1")
    code = main(["usage", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def rows(text: str) -> dict[str, list[str]]:
    """The table's rows by their first cell."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] in (["USER", "GPU-H"], ["CLASS", "GPU-H"],
                                                                           ["NODE", "GPU-H"], ["MODEL", "GPU-H"]))
    table = lines[start + 1:lines.index("", start)]
    return {line.split("  ")[0].strip(): line.split("  ", 1)[1].split() for line in table}


@pytest.mark.parametrize("by", ["user", "class", "node", "model"])
def test_the_text_report_fits_80_columns(lab, monkeypatch, capsys, by):
    code, out, err = labq(lab, monkeypatch, capsys, *MONTH, "--by", by)
    assert (code, err) == (0, "")
    assert max(map(len, out.splitlines())) <= 80, out
    assert "2026-10-01 00:00 to 2026-11-01 00:00 (31d00h)" in out.splitlines()[0]
    assert out.splitlines()[1] == "capacity: 12 GPUs x 744.0 h = 8,928 GPU-h; used 111 GPU-h (1.2%)"


def test_the_text_report_says_octobers_figures(lab, monkeypatch, capsys):
    _, out, _ = labq(lab, monkeypatch, capsys, *MONTH)
    # GPU-H SHARE UTIL JOBS F/P/C WAIT P90 LOST (UTIL: no NVML measured these GPUs)
    assert rows(out) == {
        "bob": ["64.0", "0.7%", "-", "1", "0/1/1", "1h00m", "1h00m", "10.0"],
        "alice": ["38.0", "0.4%", "-", "2", "0/0/0", "2h00m", "2h00m", "0.0"],
        "dave": ["6.0", "0.1%", "-", "1", "0/0/1", "1h00m", "1h00m", "0.0"],
        "carol": ["3.0", "<0.1%", "-", "2", "1/0/0", "45m", "1h00m", "0.0"],
        "(all)": ["111", "1.2%", "-", "6", "1/1/2", "1h06m", "2h00m", "10.0"],
    }
    _, out, _ = labq(lab, monkeypatch, capsys, *MONTH, "--by", "model")
    assert {name: cells[0] for name, cells in rows(out).items()} == {"V100-SXM2-32GB": "90.0", "RTX 3090": "21.0",
                                                                     "(all)": "111"}


def test_csv_is_the_chosen_table_with_a_header(lab, monkeypatch, capsys):
    code, out, _ = labq(lab, monkeypatch, capsys, *MONTH, "--by", "node", "--csv")
    assert code == 0
    found = list(csv.DictReader(io.StringIO(out)))
    assert [(r["node"], float(r["gpu_hours"]), int(r["jobs"]), float(r["lost_gpu_hours"])) for r in found] == [
        ("dgx", 90.0, 3, 2.0), ("ws1", 21.0, 4, 8.0)]
    assert out.splitlines()[0] == ("node,gpu_hours,share,utilization,memory_gib,jobs,failed,preempted,cancelled,"
                                   "mean_wait_s,p90_wait_s,lost_gpu_hours")


def test_json_is_the_whole_report_in_one_object(lab, monkeypatch, capsys):
    code, out, _ = labq(lab, monkeypatch, capsys, *MONTH, "--by", "class", "--json")
    report = json.loads(out)
    assert code == 0 and set(report["by"]) == {"user", "group", "class", "node", "model"}
    assert (report["total"]["gpu_hours"], report["capacity_gpu_hours"]) == (111.0, 8928.0)


def test_me_is_anyones_own_usage_and_the_lab_is_for_admins(lab, monkeypatch, capsys):
    code, out, err = labq(lab, monkeypatch, capsys, *MONTH, "--me", user="carol")
    assert (code, err) == (0, "") and "GPU use of carol's jobs by user" in out
    assert set(rows(out)) == {"carol", "(all)"}
    code, out, err = labq(lab, monkeypatch, capsys, *MONTH, user="carol")
    assert code == REFUSED and out == ""
    assert "only admins may see the whole lab's usage" in err and "labq usage --me" in err
    code, _, err = labq(lab, monkeypatch, capsys, *MONTH, "--user", "bob", user="carol")
    assert code == REFUSED and "another user's usage" in err


def test_a_window_with_no_use_says_so(lab, monkeypatch, capsys):
    code, out, _ = labq(lab, monkeypatch, capsys, "--month", "2026-08", "--tz", "UTC")
    assert code == 0 and out.splitlines()[-1] == "no job ran, waited or ended in this window"


@pytest.mark.parametrize(("argv", "words"), [
    (["--since", "last tuesday-ish"], "--since: can't read 'last tuesday-ish' as a time; use e.g."),
    (["--until", "2026-02-30"], "--until: can't read '2026-02-30' as a time: no such date"),
    (["--month", "2026-13"], "--month: can't read '2026-13' as a month; use YYYY-MM"),
    (["--month", "2026-10", "--since", "7d"], "--month is a whole window"),
    (["--since", "2026-10-15", "--until", "2026-10-01"], "must be before --until"),
    (["--since", "2999-01-01"], "--since: '2999-01-01' begins 2999-01-01 00:00, which has not come yet"),
    (["--month", "2999-01"], "--month: '2999-01' begins 2999-01-01 00:00, which has not come yet"),
    (["--tz", "Mars/Olympus"], "--tz: unknown time zone"),
])
def test_bad_times_are_refused_before_any_request(monkeypatch, capsys, argv, words):
    monkeypatch.setenv("LABQ_LEADER", "http://127.0.0.1:9")  # nothing listens: a request would exit 4
    monkeypatch.setenv("LABQ_TOKEN", "t")
    code = main(["usage", "--tz", "UTC", *argv] if "--tz" not in argv else ["usage", *argv])
    err = capsys.readouterr().err
    assert code == USAGE and words in err, err


def test_the_text_report_ends_with_the_bookings_booked_and_used():
    from labq.cli.usage import usage_text

    row = {"name": "alice", "gpu_hours": 12.0, "share": 0.5, "jobs": 1, "failed": 0, "preempted": 0, "cancelled": 0,
           "mean_wait_s": 60.0, "p90_wait_s": 60.0, "lost_gpu_hours": 0.0}
    report = {"since": 0.0, "until": 86400.0, "hours": 24.0, "user": None, "gpus": 1, "capacity_gpu_hours": 24.0,
              "by": {"user": [row]}, "total": row | {"name": "total"},
              "reservations": [{"name": "paper-deadline-final-final", "owner": "alice", "node": "ws1", "start": 3600.0,
                                "end": 7200.0, "booked_gpu_hours": 16.0, "used_gpu_hours": 12.0},
                               {"name": "demo", "owner": "bob", "node": None, "start": 9000.0, "end": 9900.0,
                                "booked_gpu_hours": 0.0, "used_gpu_hours": 0.0}]}
    from datetime import timezone

    text = usage_text(report, "user", timezone.utc)
    tail = text.split("reservations (GPU-hours in the window", 1)[1].splitlines()
    assert tail[1].split() == ["BOOKING", "OWNER", "NODE", "FROM", "BOOKED", "USED", "USED%"]
    assert tail[2].split()[-3:] == ["16.0", "12.0", "75%"] and tail[2].startswith("paper-deadline-…")
    assert tail[3].split()[-1] == "-" and tail[4].split() == ["(all)", "16.0", "12.0", "75%"]
    assert all(len(line) <= 80 for line in text.splitlines())
