"""``labq demo`` as a new lab runs it: a real ``python -m labq.cli demo`` process with a fresh HOME and its own
TMPDIR. It tells the truth about how long it takes, shows two lab users, ends cleanly and leaves nothing behind.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

LOOKS_WRONG = ("cannot sync", "Traceback", "No such file", "error", "warning", "refused")


def _env(tmp_path: Path) -> dict:
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LABQ_", "XDG_"))}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local" / "share"),
               TMPDIR=str(tmp), PYTHONUNBUFFERED="1")
    return env


def _processes_of(tmp_path: Path) -> list[str]:
    """Processes, other than this one, that name the test's folder in their command line or environment: the
    demo's leader and agent, its jobs' shims, the jobs (their $LABQ_CHECKPOINT_DIR is in the demo's folder)."""
    mark = str(tmp_path).encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            if mark in cmdline or mark in (proc / "environ").read_bytes():
                found.append(f"{proc.name}: {cmdline.replace(bytes(1), b' ').decode(errors='replace')}")
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _nothing_left(tmp_path: Path) -> None:
    deadline = time.monotonic() + 5  # a shim that has written its job's exit may still be on its way out
    while (left := _processes_of(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], left
    assert list((tmp_path / "tmp").iterdir()) == []


def _users_in_tables(out: str) -> set[str]:
    """The USER column of every jobs table the demo prints."""
    users, column = set(), None
    for line in out.splitlines():
        words = line.split()
        if words[:3] == ["ID", "NAME", "USER"]:
            column = 2
        elif column is not None and words and words[0].isdigit():
            users.add(words[column])
        else:
            column = None
    return users


def test_the_demo_shows_two_lab_users_says_how_long_it_took_and_ends_cleanly(tmp_path):
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "labq.cli", "demo"], capture_output=True, text=True,
                         env=_env(tmp_path), timeout=150)
    took = time.monotonic() - started
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stderr == ""
    for wrong in LOOKS_WRONG:
        assert wrong.lower() not in out.stdout.lower(), out.stdout
    users = _users_in_tables(out.stdout)
    assert len(users) == 2, out.stdout
    said = re.search(r"took (\d+) s\b", out.stdout)
    assert said and 1 <= int(said.group(1)) <= took + 1, out.stdout
    _nothing_left(tmp_path)


def test_the_demo_says_what_it_takes_in_its_help(tmp_path):
    for args in (["--help"], ["demo", "--help"]):
        text = subprocess.run([sys.executable, "-m", "labq.cli", *args], capture_output=True, text=True,
                              env=_env(tmp_path), timeout=60).stdout
        assert "demo" in text and "two-minute" not in text and "two minutes" not in text
        assert re.search(r"about\s+\d+\s+seconds", text), text
