"""The counts a fault run ends with: faults injected, acknowledged jobs checked, duplicates found.

Each test fills a ``FaultCounts`` (the ``fault_counts`` fixture) and leaves it in its report's
``user_properties``, which xdist carries from the workers to the controller. Who prints the
totals at the end of the run:

- without xdist, or when the controller loaded this folder's conftest (``pytest tests/faults
  -n auto``): the controller, as a section of its terminal summary;
- a whole-suite ``pytest -n auto`` loads this folder's conftest only in the workers (the
  controller does not collect), so the workers add their counts up in a file named after the
  run, and the last one to finish writes the totals to the run's stderr, which the workers
  share with the controller.
"""

from __future__ import annotations

import fcntl
import json
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

PROPERTY = "labq_fault_counts"
CONTROLLER_PRINTS = "labq_fault_counts_controller_prints"


@dataclass
class FaultCounts:
    faults_injected: int = 0
    acked_jobs_checked: int = 0
    duplicates_found: int = 0

    def add(self, other: dict) -> None:
        for name, value in other.items():
            setattr(self, name, getattr(self, name) + value)

    def line(self) -> str:
        return (f"faults injected {self.faults_injected}, acked jobs checked {self.acked_jobs_checked}, "
                f"duplicates found {self.duplicates_found}")


class Tally:
    """The counts of the tests this process saw reported."""

    def __init__(self) -> None:
        self.total = FaultCounts()
        self.tests = 0

    def report(self, report) -> None:
        if report.when != "teardown":
            return
        for name, value in report.user_properties:
            if name == PROPERTY:
                self.total.add(value)
                self.tests += 1

    def lines(self) -> list[str]:
        return [f"labq fault rounds: {self.tests} test(s): {self.total.line()}"]


def merge_and_maybe_print(tally: Tally, workerinput: dict, capman) -> None:
    """A worker's end: add its counts to the run's file; the last worker prints the totals."""
    path = Path(tempfile.gettempdir()) / f"labq-fault-counts-{workerinput['testrunuid']}.json"
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        doc = json.loads(path.read_text()) if path.exists() else {"workers": 0, "tests": 0, "total": {}}
        doc["workers"] += 1
        doc["tests"] += tally.tests
        total = FaultCounts(**doc["total"])
        total.add(vars(tally.total))
        doc["total"] = asdict(total)
        if doc["workers"] < workerinput["workercount"]:
            path.write_text(json.dumps(doc))
            return
        path.unlink(missing_ok=True)
        path.with_suffix(".lock").unlink(missing_ok=True)
    if doc["tests"]:
        with capman.global_and_fixture_disabled():
            sys.stderr.write(f"\nlabq fault rounds: {doc['tests']} test(s): {total.line()}\n")
            sys.stderr.flush()
