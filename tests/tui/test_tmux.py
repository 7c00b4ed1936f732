"""``labq tui`` in a real terminal: tmux runs the installed command at 80x24 against a real lab,
the test types keys with ``send-keys`` and reads the screen with ``capture-pane``.

The tmux server gets a socket of its own (``-L``), so the test never touches anyone's sessions.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

TMUX = shutil.which("tmux")
LABQ = Path(sys.executable).with_name("labq")

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _terminal_tools():
    """./install.sh installs both; a missing one fails the test rather than skipping it unseen."""
    assert TMUX is not None, "tmux is not installed (./install.sh installs it): the terminal test needs it"
    assert LABQ.exists(), f"no labq console script at {LABQ}: run ./install.sh (or pip install -e .)"


class Terminal:
    """One tmux session running one command, on a private tmux server."""

    def __init__(self, name: str, env: dict) -> None:
        self.socket, self.name = f"labq-test-{os.getpid()}-{name}", name
        self.env = {k: v for k, v in env.items() if k not in ("TMUX", "TMUX_PANE")}

    def tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([TMUX, "-L", self.socket, *args], capture_output=True, text=True, env=self.env,
                              timeout=20, check=check)

    def start(self, command: str) -> None:
        self.tmux("new-session", "-d", "-s", self.name, "-x", "80", "-y", "24", command)

    def screen(self) -> str:
        out = self.tmux("capture-pane", "-p", "-t", self.name, check=False)
        return out.stdout if out.returncode == 0 else f"(no pane: {out.stderr.strip()})"

    def keys(self, *keys: str, literal: bool = False) -> None:
        self.tmux("send-keys", "-t", self.name, *(["-l"] if literal else []), *keys)

    def alive(self) -> bool:
        return self.tmux("has-session", "-t", self.name, check=False).returncode == 0

    def wait_for(self, condition, what: str, timeout: float = 20) -> str:
        """The screen, once ``condition(screen)`` holds (polled every 0.1 s, at most ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            shown = self.screen()
            if condition(shown):
                return shown
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}; the screen:\n{shown}")
            time.sleep(0.1)

    def close(self) -> None:
        self.tmux("kill-session", "-t", self.name, check=False)
        self.tmux("kill-server", check=False)


def test_labq_tui_in_a_real_terminal(own_lab):
    lab = own_lab
    known = lab.submit("sleep", "300", gpus=4, name="tmux-known", no_preempt=True)
    lab.wait_state(known, "running")
    waiting = lab.submit("sleep", "300", gpus=1, name="tmux-wait")
    env = lab.env()
    term = Terminal("tui", env)
    passed = {k: env[k] for k in ("HOME", "XDG_CONFIG_HOME")}
    try:
        term.start(shlex.join(["env", *(f"{k}={v}" for k, v in passed.items()), str(LABQ), "tui"]))
        shown = term.wait_for(lambda s: "tmux-known" in s and "tmux-wait" in s and "Resources" in s,
                              "the queue with both jobs, and why one waits (80 columns leave room for the reason)")
        assert f"{lab.admin_user} (admin) | 2 jobs: 1 queued, 1 running" in shown
        assert "running" in next(line for line in shown.splitlines() if "tmux-known" in line)

        # all at once, as a paste or a slow link delivers them: the letters after / go to the filter box,
        # none of them is taken as a key of the queue (s would open the submit form)
        term.keys("/", "s", "t", "a", "t", "e", ":", "r", "u", "n", "Enter")
        shown = term.wait_for(lambda s: "tmux-wait" not in s, "the filter to hide the waiting job")
        assert "tmux-known" in shown and "1 of 2 jobs" in shown and "filter: state:run" in shown

        term.keys("Escape")
        shown = term.wait_for(lambda s: "tmux-wait" in s, "Esc to clear the filter")
        assert "filter:" not in shown

        term.keys("?")
        shown = term.wait_for(lambda s: "keys on this screen (queue):" in s, "the help")
        assert "cancel" in shown and "filter" in shown
        term.keys("Escape")
        term.wait_for(lambda s: "tmux-wait" in s and "keys on this screen" not in s, "the queue again")

        term.keys("q")
        deadline = time.monotonic() + 15
        while term.alive():
            assert time.monotonic() < deadline, f"q did not end labq tui; the screen:\n{term.screen()}"
            time.sleep(0.1)
        assert lab.job(waiting)["state"] == "queued"  # looking changed nothing
    finally:
        term.close()
