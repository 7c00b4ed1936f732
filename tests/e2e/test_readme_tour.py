"""The README's short tour, word for word: every command of its console blocks, run in order against a real
``labq up`` lab (simulated GPUs), prints what the README shows, times, ages and estimates aside.

What the test adds, and only that: ``labq up`` gets ``--name ws1 --listen 127.0.0.1:0`` (this machine's
name and a free port; the README's port is then read as the one given), the job scripts the tour runs
(train.py waits for the test to let it end, eval.py likewise per job, sweep.py runs until cancelled), and
waits between commands for what the tour takes for granted (job 1 has started before ``labq ls``). When the
suite runs as root, ``labq up`` names its admin ``alice`` (``--admin``, as root must) and maps her to the
account ``nobody``, so the two lines of ``labq up`` that say whose lab it is are not compared then.
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

README = Path(__file__).resolve().parents[2] / "README.md"
LABQ = str(Path(sys.executable).with_name("labq"))
AS_ROOT = os.geteuid() == 0
SCRIPTS = {
    "train.py": "import os, time\nwhile not os.path.exists('bert.done'):\n    time.sleep(0.05)\n",
    "eval.py": "import os, time\nwhile not os.path.exists(f\"eval-{os.environ['LABQ_JOB_ID']}.done\"):\n"
               "    time.sleep(0.05)\n",
    "sweep.py": "import signal\nsignal.pause()  # until cancelled\n",
}
#: lines of ``labq up`` that say whose lab it is: for the user the README speaks to, not for root
WHOSE = ("a new lab:", "labq up: node ws1 is ready;")


def tour_steps() -> list[tuple[str, list[str]]]:
    """(command, the lines the README shows after it) for each ``$`` line of the tour's console blocks."""
    text = README.read_text()
    tour = text[text.index("## A short tour"):]
    tour = tour[:tour.index("\n## ", 1)]
    steps: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", tour, re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                steps[-1][1].append(line)
    return steps


def normal(line: str) -> str:
    """A line with its clock times, dates, ages and estimates masked and its spaces collapsed (columns fit
    their content)."""
    line = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+", "<stamp>", line)
    # a clock time, with the weekday or date that ``format_clock`` puts before one that is not today's (an
    # estimate past midnight says ``Fri 01:30``)
    line = re.sub(r"\b(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) |\d{4}-\d\d-\d\d )?\d{1,2}:\d\d\b", "<clock>", line)
    line = re.sub(r"\b\d+(?:h\d+m|m\d+s|[smhd])\b", "<time>", line)
    return " ".join(line.split())


class Tour:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.home, self.work = root / "home", root / "work"
        self.user = "alice" if AS_ROOT else getpass.getuser()
        self.up: subprocess.Popen | None = None
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("LABQ_", "XDG_"))}
        self.env.update(HOME=str(self.home), XDG_CONFIG_HOME=str(self.home / ".config"),
                        XDG_DATA_HOME=str(self.home / ".local" / "share"), PYTHONUNBUFFERED="1")

    def expected(self, lines: list[str], port: str | None) -> list[str]:
        out = [line.replace("~/", f"{self.home}/").replace("alice", self.user) for line in lines]
        return [normal(line.replace(":7733", f":{port}") if port else line) for line in out]

    def run(self, command: str) -> tuple[int, list[str]]:
        argv = shlex.split(command)
        done = subprocess.run([LABQ, *argv[1:]], cwd=self.work, env=self.env, capture_output=True, text=True,
                              timeout=60)
        return done.returncode, [normal(line) for line in (done.stdout + done.stderr).splitlines()]

    def start(self, command: str) -> list[str]:
        """``labq up``, in the background; the lines it printed once it says where to submit."""
        extra = ["--name", "ws1", "--listen", "127.0.0.1:0"] + (["--admin", "alice"] if AS_ROOT else [])
        log = open(self.root / "up.log", "w+")
        self.up = subprocess.Popen([LABQ, *shlex.split(command)[1:], *extra], cwd=self.work, env=self.env,
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.wait(lambda: "submit with" in (self.root / "up.log").read_text(), "labq up to be ready")
        return (self.root / "up.log").read_text().splitlines()

    def jobs(self) -> dict[int, str]:
        import json

        listed = subprocess.run([LABQ, "ls", "--all", "--json"], env=self.env, capture_output=True, text=True,
                                timeout=60, check=True)
        return {job["id"]: job["state"] for job in json.loads(listed.stdout)}

    def wait(self, ready: Callable[[], bool], what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            assert time.monotonic() < deadline, f"waited {timeout:.0f} s for {what}"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.up is None or self.up.poll() is not None:
            return
        running = [str(j) for j, state in self.jobs().items() if state not in
                   ("succeeded", "failed", "cancelled", "timeout")]
        if running:  # jobs outlive their agent by design: end them first
            subprocess.run([LABQ, "cancel", "--yes", *running], env=self.env, capture_output=True, timeout=60)
            subprocess.run([LABQ, "wait", "--timeout", "30s", *running], env=self.env, capture_output=True,
                           timeout=60)
        os.killpg(self.up.pid, signal.SIGTERM)
        self.up.wait(timeout=30)


@pytest.fixture
def tour() -> Iterator[Tour]:
    # the jobs run as nobody when the suite is root: their folder must be open to it, so not under tmp_path
    root = Path(tempfile.mkdtemp(prefix="labq-tour-"))
    made = Tour(root)
    made.work.mkdir(parents=True)
    for name, text in SCRIPTS.items():
        (made.work / name).write_text(text)
    if AS_ROOT:
        user_map = made.home / ".local" / "share" / "labq" / "agents" / "ws1" / "user-map.toml"
        user_map.parent.mkdir(parents=True)
        user_map.write_text('[users]\nalice = "nobody"\n')
        os.chmod(root, 0o755)
    try:
        yield made
    finally:
        made.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_the_readme_tour_prints_what_the_readme_shows(tour):
    steps = tour_steps()
    assert [c.split()[:2] for c, _ in steps][:3] == [["labq", "up"], ["labq", "submit"], ["labq", "submit"]]
    port = None

    def end_bert_and_eval() -> None:
        (tour.work / "bert.done").touch()
        (tour.work / "eval-3.done").touch()

    before: dict[str, Callable[[], None]] = {
        "labq ls": lambda: tour.wait(lambda: tour.jobs().get(1) == "running", "job 1 to start"),
        "labq wait 1 3": end_bert_and_eval,
        "labq cancel --name sweep --state queued running":
            lambda: tour.wait(lambda: tour.jobs().get(2) == "running", "job 2, now on 2 GPUs, to start"),
    }
    for command, shown in steps:
        if command.split()[1] == "logs":  # labq logs -f 1: it follows the running job, silent as the job, until ^C
            follow = subprocess.Popen([LABQ, *shlex.split(command)[1:]], cwd=tour.work, env=tour.env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            with pytest.raises(subprocess.TimeoutExpired):
                follow.communicate(timeout=1.0)
            follow.send_signal(signal.SIGINT)
            out, _ = follow.communicate(timeout=30)
            assert (follow.returncode, out.splitlines()) == (0, shown), command
        elif command.startswith("labq up"):
            printed = tour.start(command)
            port = re.search(r"serving http://127\.0\.0\.1:(\d+)", "\n".join(printed)).group(1)
            # whether this machine lets the agent make cgroups is its own fact: said only where it cannot
            want, got = tour.expected(shown, port), [normal(line) for line in printed
                                                     if "limits are not enforced here" not in line]
            if AS_ROOT:
                want, got = ([line for line in lines if not line.startswith(WHOSE)] for lines in (want, got))
            assert got == want, command
        else:
            if command in before:
                before[command]()
            code, got = tour.run(command)
            assert got == tour.expected(shown, port), command
            assert code == (2 if "99999" in command else 0), command
    assert len(steps) >= 15  # the tour was found whole: up, a dozen everyday commands, topo and place
