"""``labq up`` and ``labq leader`` on a new lab's home: input they cannot take is refused with one clear line and
exit 2 before anything is created, so that a failed start leaves the home exactly as it was.

Real ``python -m labq.cli`` processes, each with a fresh HOME and XDG folders in the test's folder.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)


def _env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LABQ_", "XDG_"))}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local" / "share"),
               PYTHONUNBUFFERED="1")
    return env


def _labq(home: Path, *args: str) -> subprocess.CompletedProcess:
    """A command a new lab would type; ``--admin`` names the first admin, as root must (the suite runs as root)."""
    return subprocess.run([sys.executable, "-m", "labq.cli", *args, "--admin", "ada"], capture_output=True,
                          text=True, env=_env(home), timeout=60)


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _refused(out: subprocess.CompletedProcess) -> str:
    """Exit 2 with one ``labq: error:`` line, no traceback, no new lab announced; the line."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith("labq: error: "), out.stderr
    assert "a new lab" not in out.stderr and "serving" not in out.stderr
    return lines[0]


@pytest.fixture
def home(tmp_path) -> Path:
    made = tmp_path / "home"
    made.mkdir()
    return made


@pytest.mark.parametrize("spec", ["sim:nosuch", "4"])
def test_up_with_a_bad_gpu_spec_leaves_a_new_home_as_it_was(home, spec):
    before = _files(home)
    line = _refused(_labq(home, "up", "--gpus", spec, "--name", "ws1", "--listen", "127.0.0.1:0"))
    assert "--gpus" in line and spec in line and "sim:ws-4x3090" in line
    assert line.count("--gpus") == 1
    assert _files(home) == before == []


@pytest.mark.parametrize("command", [["up", "--gpus", "sim:ws-4x3090", "--name", "ws1"], ["leader", "--no-mdns"]])
def test_a_port_past_65535_is_one_clear_line_not_a_traceback(home, command):
    out = _labq(home, *command, "--listen", "127.0.0.1:99999")
    line = _refused(out)
    assert "Traceback" not in out.stderr + out.stdout
    assert "127.0.0.1:99999" in line and "0 to 65535" in line
    assert _files(home) == []


def test_a_port_in_use_is_named_and_nothing_is_created(home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _refused(_labq(home, "up", "--gpus", "sim:ws-4x3090", "--name", "ws1", "--listen", f"127.0.0.1:{port}"))
    assert f"127.0.0.1:{port}" in line and "in use" in line and "--listen" in line
    assert _files(home) == []


@pytest.mark.parametrize("below", ["", "lab"])
def test_a_data_folder_that_is_a_file_is_refused_before_anything_is_made(tmp_path, home, below):
    afile = tmp_path / "notes.txt"
    afile.write_text("not a folder\n")
    data = afile / below if below else afile
    out = _labq(home, "up", "--gpus", "sim:ws-4x3090", "--name", "ws1", "--listen", "127.0.0.1:0",
                "--data-dir", str(data))
    line = _refused(out)
    assert str(data) in line and "not a folder" in line
    assert _files(home) == [] and afile.read_text() == "not a folder\n"
