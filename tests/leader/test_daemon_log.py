"""The daemons' log escapes what users and peers wrote: one line a record, no terminal control sequence."""

from __future__ import annotations

import subprocess
import sys

CODE = """
import logging
from labq.leader.main import configure_logging
configure_logging("info")
logging.getLogger("labq.leader").warning("job %s of user %s", "evil\\nFAKE 12:00 labq.leader INFO all is well", "\\x1b[2Jbob")
"""


def test_a_log_line_with_a_users_newline_and_escape_sequence_stays_one_escaped_line():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=30, check=True)
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert "\x1b" not in out.stderr and "evil\\nFAKE" in lines[0] and "\\x1b[2Jbob" in lines[0]
