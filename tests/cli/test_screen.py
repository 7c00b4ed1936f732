"""``labq ls --watch`` redraws only what changed, as a screen does, and what the terminal shows stays right.

A small terminal (``Terminal``) plays the output back (cursor moves, erases, text), so each test checks the
screen a person would see, not the bytes; and the real command runs in a pseudo-terminal against a
real server with 5,000 jobs.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest

from labq.cli.screen import Screen, changes, clip, fit
from labq.protocol.codec import encode_job
from tests.cli.fake_leader import ROOT, FakeLeader, environment

_SEQUENCE = re.compile(r"\x1b\[([0-9;]*)([A-Za-z])")


class Terminal:
    """Enough of a VT100 for the watch's output: CUP, ED, EL, SGR (ignored), CR and LF, printable text."""

    def __init__(self, columns: int, rows: int) -> None:
        self.columns, self.rows = columns, rows
        self.grid = [[" "] * columns for _ in range(rows)]
        self.row = self.col = 0

    def feed(self, text: str) -> None:
        pos = 0
        while pos < len(text):
            match = _SEQUENCE.match(text, pos)
            if match:
                self._control(match.group(1), match.group(2))
                pos = match.end()
                continue
            char = text[pos]
            pos += 1
            if char == "\n":
                self.row, self.col = self.row + 1, 0  # a tty's onlcr: a newline is CR LF
                if self.row == self.rows:
                    self.grid = self.grid[1:] + [[" "] * self.columns]
                    self.row -= 1
            elif char == "\r":
                self.col = 0
            else:
                assert self.col < self.columns - 1, f"a line reached the last column: {text[max(0, pos - 60):pos]!r}"
                self.grid[self.row][self.col] = char
                self.col += 1

    def _control(self, params: str, final: str) -> None:
        numbers = [int(p) for p in params.split(";") if p]
        if final == "H":
            self.row, self.col = (numbers[0] - 1, numbers[1] - 1) if numbers else (0, 0)
        elif final == "J":
            for r in range(self.row + (0 if numbers == [2] else 1), self.rows):
                self.grid[r] = [" "] * self.columns
            if numbers != [2]:
                self.grid[self.row][self.col:] = [" "] * (self.columns - self.col)
            else:
                self.grid[:] = [[" "] * self.columns for _ in range(self.rows)]
        elif final == "K":
            self.grid[self.row][self.col:] = [" "] * (self.columns - self.col)
        else:
            assert final == "m", f"unexpected sequence {params}{final}"

    def lines(self) -> list[str]:
        shown = ["".join(r).rstrip() for r in self.grid]
        while shown and not shown[-1]:
            shown.pop()
        return shown


def shown(frame: list[str]) -> list[str]:
    return [re.sub(r"\x1b\[[0-9;]*m", "", line).rstrip() for line in frame]


FRAMES = [
    ["header", "", "1  a  queued", "2  b  running", "3  c  queued"],
    ["header", "", "1  a  queued", "2  b  succeeded", "3  c  queued"],  # one row changes
    ["header", "", "1  a  queued", "3  c  queued"],  # a row goes: the rest move up, the last is erased
    ["header2", "", "1  a  \x1b[32mrunning\x1b[0m", "3  c  queued", "4  d  queued", "5  e  held"],  # rows come
    ["no jobs"],
    ["header", "", *[f"{i}  job-{i}  queued" for i in range(1, 40)]],  # more than the window: cut, then a count
]


def test_each_frame_shows_right_and_costs_only_its_changed_lines():
    term, out = Terminal(40, 8), []
    screen = Screen(out.append, lambda: (40, 8))
    for frame in FRAMES:
        out.clear()
        screen.draw(frame)
        term.feed("".join(out))
        assert term.lines() == shown(fit(frame, 40, 8)), frame
    assert term.lines()[-1] == "… 34 more lines"
    out.clear()
    assert screen.draw(FRAMES[-1]) == 0 and out == []  # nothing changed, nothing written
    screen.draw([*FRAMES[-1][:2], "1  job-1  running", *FRAMES[-1][3:]])
    assert out == ["\x1b[3;1H1  job-1  running\x1b[K"]


def test_a_new_window_size_redraws_the_whole_frame():
    size, out = [(40, 8)], []
    screen = Screen(out.append, lambda: size[0])
    screen.draw(FRAMES[0])
    size[0] = (30, 6)
    out.clear()
    screen.draw(FRAMES[0])
    assert out[0].startswith("\x1b[H\x1b[2J")


@pytest.mark.parametrize(("line", "width", "clipped"), [
    ("abcdef", 6, "abcdef"), ("abcdefg", 6, "abcde…"), ("ab\x1b[32mcdefg\x1b[0m", 6, "ab\x1b[32mcde…\x1b[0m"),
    ("\x1b[32mrunning\x1b[0m  x", 10, "\x1b[32mrunning\x1b[0m  x"), ("", 3, ""),
])
def test_lines_are_cut_by_what_shows_not_by_their_colors(line, width, clipped):
    assert clip(line, width) == clipped


def test_changes_between_frames_of_different_lengths():
    assert changes(["a", "b", "c"], ["a", "B"]) == "\x1b[2;1HB\x1b[K\x1b[3;1H\x1b[J"
    assert changes(["a"], ["a", "b"]) == "\x1b[2;1Hb\x1b[K"


# -- the real command in a pseudo-terminal --------------------------------------------------------

def test_ls_watch_with_5000_jobs_rewrites_one_row_for_one_change_and_the_screen_stays_right(jobs):
    docs = [encode_job(jobs.queued(name=f"job-{i}", submitted_at=time.time() - 5 * 3600)) for i in range(5000)]
    state = {"docs": docs}
    leader = FakeLeader()
    leader.routes[("GET", "/v1/jobs")] = lambda query: (200, {}, json.dumps({"jobs": state["docs"]}).encode())
    leader.routes[("GET", "/v1/events")] = (200, {"Content-Type": "text/event-stream", "Content-Length": None},
                                            b"id: 4\nevent: job\ndata: {\"job_id\": 3}\n\n")
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "labq.cli", "ls", "--all", "--watch"], stdin=slave, stdout=slave,
                            stderr=slave, env=environment(leader.env() | {"NO_COLOR": "1"}), cwd=ROOT)
    os.close(slave)
    term = Terminal(100, 30)

    def read_until(condition, what: str) -> str:
        text, deadline = b"", time.monotonic() + 60
        while not condition(term.lines()):
            assert time.monotonic() < deadline, f"{what}: {term.lines()}"
            if select.select([master], [], [], 0.1)[0]:
                chunk = os.read(master, 1 << 16)
                text += chunk
                term.feed(chunk.decode())  # the output is ASCII here: a chunk never splits a character
        return text.decode()

    more = "… 4,974 more rows: narrow with --state or --user, or make the window taller"
    try:
        first = read_until(lambda lines: lines and lines[-1] == more, "the first frame")
        assert first.startswith("\x1b[H\x1b[2J") and term.lines()[2].split()[:2] == ["ID", "NAME"]
        state["docs"] = [docs[0], {**docs[1], "state": "held"}, *docs[2:]]  # job 2 is held: its row changes
        later = read_until(lambda lines: lines[4].split()[3] == "held", "job 2 held")
        redraws = later.count("labq ls, live")  # each redraw rewrites the clock: at least one a second
        assert 0 < len(later.encode()) < 400 * max(1, redraws), (len(later.encode()), redraws)  # the table: ~500 kB
        assert term.lines()[4].split()[:4] == ["2", "job-1", "alice", "held"]
        assert term.lines()[3].split()[3] == term.lines()[5].split()[3] == "queued"
        assert term.lines()[-1] == more
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(20)
        os.close(master)
        leader.close()
    assert proc.returncode == 0
