"""The job's checkpoint marker, read by an agent that may be root: a name at most, never a hang or a leak."""

from __future__ import annotations

import os
import threading

import pytest

from labq.agent.stops import marker_signal
from labq.cli import main as labq
from labq.protocol.agents import CHECKPOINT_MARKER

pytestmark = pytest.mark.timeout(30)


def test_the_marker_names_the_signal_labq_checkpoint_wrote_and_keeps_it_on_later_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setenv("LABQ_CHECKPOINT_DIR", str(tmp_path))
    assert marker_signal(str(tmp_path)) is None  # no marker yet
    assert labq(["checkpoint"]) == 0
    assert marker_signal(str(tmp_path)) is None  # a checkpoint, no signal named
    assert labq(["checkpoint", "--signal", "usr2"]) == 0
    assert marker_signal(str(tmp_path)) == "SIGUSR2"
    before = os.stat(tmp_path / CHECKPOINT_MARKER).st_mtime_ns
    assert labq(["checkpoint"]) == 0  # the next save: a newer time, the same signal
    assert os.stat(tmp_path / CHECKPOINT_MARKER).st_mtime_ns >= before
    assert marker_signal(str(tmp_path)) == "SIGUSR2"
    assert sorted(os.listdir(tmp_path)) == [CHECKPOINT_MARKER]  # no partial file left behind


def test_labq_checkpoint_refuses_a_signal_no_job_can_catch_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LABQ_CHECKPOINT_DIR", str(tmp_path))
    assert labq(["checkpoint", "--signal", "KILL"]) == 2
    assert "--signal: 'KILL' is not a signal a job can catch" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("content", [b"SIGKILL\n", b"", b"\n", b"hello", b"\xff\xfe", b"SIGUSR1" + b" " * 100 + b"x"])
def test_junk_in_the_marker_names_no_signal(tmp_path, content):
    (tmp_path / CHECKPOINT_MARKER).write_bytes(content)
    assert marker_signal(str(tmp_path)) is None


def test_a_marker_that_is_a_symlink_or_a_fifo_is_not_read(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("SIGUSR1\n")  # stands for a file the job's user may not read, but root may
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / CHECKPOINT_MARKER).symlink_to(secret)
    assert marker_signal(str(folder)) is None
    (folder / CHECKPOINT_MARKER).unlink()
    os.mkfifo(folder / CHECKPOINT_MARKER)  # opening a FIFO to read would wait for a writer forever
    done = threading.Event()
    found: list[str | None] = []
    reader = threading.Thread(target=lambda: (found.append(marker_signal(str(folder))), done.set()), daemon=True)
    reader.start()
    assert done.wait(5), "reading a FIFO marker blocked"
    assert found == [None]
    assert marker_signal(None) is None and marker_signal(str(tmp_path / "missing")) is None
