"""A checkout serves labq from a plain path entry: agent/, store/ and tui/ beside labq/ are labq.agent, labq.store
and labq.tui without an import hook, which would cost every Python start in the venv (install.sh's editable
install is a .pth file naming the checkout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(code: str, *flags: str, env: dict | None = None) -> str:
    out = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, timeout=60,
                         env=env, cwd="/")
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_checkout_on_a_plain_path_imports_labqs_parts_from_beside_labq():
    # -S: no site-packages, so neither the venv's .pth nor any import hook: only PYTHONPATH names the checkout
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {"PYTHONPATH": str(ROOT)}
    found = json.loads(run("import json, labq.agent, labq.store, labq.tui, labq.store.tinydb_store as t; "
                           "print(json.dumps([labq.agent.__file__, labq.store.__file__, labq.tui.__file__, "
                           "t.TinyDBStore.__module__]))", "-S", env=env))
    assert found == [str(ROOT / "agent" / "__init__.py"), str(ROOT / "store" / "__init__.py"),
                     str(ROOT / "tui" / "__init__.py"), "labq.store.tinydb_store"]


def test_the_venvs_python_starts_without_an_import_hook_for_labq():
    finders = json.loads(run("import json, sys; print(json.dumps([type(f).__module__ for f in sys.meta_path]))"))
    hooks = [f for f in finders if "editable" in f]
    assert not hooks, f"{sys.executable} loads {hooks} at every start: install labq with ./install.sh"
    where = run("import labq.store; print(labq.store.__file__)").strip()
    assert where == str(ROOT / "store" / "__init__.py")
