"""The core does no I/O: importing it in a fresh interpreter loads no I/O library."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FORBIDDEN = ["textual", "rich", "docker", "pynvml", "zeroconf", "tinydb",
             "http", "http.client", "http.server", "urllib.request", "aiohttp", "requests", "httpx", "socket",
             "labq.agent", "labq.tui", "labq.store"]

PROBE = """
import json, sys
{imports}
print(json.dumps(sorted(m for m in {forbidden!r} if m in sys.modules)))
"""


def loaded_after(*statements: str) -> list[str]:
    code = PROBE.format(imports="\n".join(statements), forbidden=FORBIDDEN)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("module", ["labq.models", "labq.scheduler", "labq.topologies", "labq.protocol",
                                    "labq.protocol.requests", "labq.protocol.agents", "labq.protocol.names",
                                    "labq.protocol.body"])
def test_core_module_imports_no_io_library(module):
    assert loaded_after(f"import {module}") == []


def test_a_whole_scheduling_pass_stays_pure():
    assert loaded_after(
        "from labq.scheduler import schedule",
        "from labq.models import Job, JobSpec, Node",
        "from labq.topologies import parse_sim_spec",
        "inv = parse_sim_spec('sim:dgx1')",
        "node = Node('a', inv.gpus('a'), inv.topology)",
        "schedule([Job(1, JobSpec(user='u', command=('x',), gpus=2), 0.0)], [node], now=1.0)",
    ) == []


def test_cli_fast_path_does_not_load_the_tui_or_io_libraries():
    loaded = loaded_after(
        "import contextlib, io",
        "from labq.cli import main",
        "with contextlib.redirect_stdout(io.StringIO()): main(['place', 'sim:dgx1', '--gpus', '2'])",
    )
    assert loaded == []


def test_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint is None:
        pytest.fail("lint-imports (import-linter) is missing: run ./install.sh")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([lint, "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
