"""The whole house keeps DESIGN's dependency direction: every import arrow between labq's parts is allowed.

import-linter (grimp) only sees ``labq/`` on disk: ``labq.agent``, ``labq.tui`` and ``labq.store`` are
installed from ``agent/``, ``tui/`` and ``store/`` through ``package-dir``, so this test reads the source of
every folder the import system maps into ``labq`` and checks each ``import`` statement against ``PARTS`` and
``MAY_IMPORT`` below. ARCHITECTURE.md draws the same table; change both together.

An import is one of three kinds:
- ``module``: runs when the module is imported (top level, class bodies, ``try`` blocks);
- ``lazy``: inside a function, runs only when it is called (``labq leader`` loads the leader, ``labq ls`` not);
- ``typing``: under ``if TYPE_CHECKING:``, never runs, but is an arrow all the same.

Rules: ``module`` and ``typing`` arrows must be in ``MAY_IMPORT``; a ``lazy`` arrow in ``MAY_IMPORT`` or
``MAY_IMPORT_LAZILY``. No cycle among the modules through ``module`` arrows. Every module has a part.
"""

from __future__ import annotations

import ast
import importlib.util
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROOT_PACKAGE = "labq"

#: part -> the modules it holds. A name covers its submodules, and the longest matching name wins;
#: ``labq`` alone is only the package's ``__init__`` (``__version__``), so a new ``labq.x`` needs a place.
PARTS: dict[str, tuple[str, ...]] = {
    # Pure: no I/O, no clock.
    "core": ("labq", "labq.models", "labq.scheduler", "labq.protocol", "labq.topologies"),
    # Pure helpers for people's words: durations, dates, escaping, tables; a job as another scheduler's script.
    "text": ("labq.units", "labq.when", "labq.terminal_text", "labq.log_text", "labq.render", "labq.export",
             "labq.spec_text"),
    # Helpers a daemon uses on its machine: data folder, supervised threads, container policy, mDNS.
    "host": ("labq.paths", "labq.workers", "labq.isolation", "labq.discovery"),
    # The one HTTP seam: Request/Response and transports, the socket-level connection, the hardened server,
    # and trusting a leader by its pinned CA.
    "http": ("labq.transport", "labq.wire", "labq.http_server", "labq.tls"),
    # The one client of the leader's API, for the CLI and the TUI; the credentials file it reads, in plain TOML.
    "client": ("labq.client", "labq.credentials", "labq.plain_toml"),
    # What the leader asks a store to record, and the rules every store keeps.
    "store-contract": ("labq.store.contract",),
    # Durable persistence (TinyDB), and the in-memory store.
    "store": ("labq.store",),
    # The leader daemon: services over one state, the HTTP server and its routes.
    "leader": ("labq.leader",),
    # The workstation daemon: inventory, runtimes, reconcile loop.
    "agent": ("labq.agent",),
    # The simulator: the real scheduler over simulated time.
    "sim": ("labq.sim",),
    # The Textual app.
    "tui": ("labq.tui",),
    # ``labq ...``: the package labq/cli/ (while it moves there, labq/cli.py and labq/cli_*.py).
    "cli": ("labq.cli",),
    # ``labq demo``: a leader and an agent on simulated GPUs, wired together like ``labq up``.
    "demo": ("labq.demo",),
}

#: part -> the other parts it may import at module level (and so lazily too). Nothing may import ``cli``.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "text": frozenset({"core"}),
    "host": frozenset({"core"}),
    "http": frozenset({"core"}),
    "client": frozenset({"core", "http"}),
    "store-contract": frozenset({"core"}),
    "store": frozenset({"core", "store-contract"}),
    "leader": frozenset({"core", "text", "host", "http", "store-contract", "store"}),
    "agent": frozenset({"core", "text", "host", "http"}),
    "sim": frozenset({"core", "text", "store-contract"}),
    "tui": frozenset({"core", "text", "client"}),
    "cli": frozenset({"core", "text", "client"}),
    "demo": frozenset({"core", "text", "host", "client", "leader", "agent"}),
}

#: part -> the parts it may import only inside a function: the CLI loads a daemon, the store, the
#: simulator or the TUI only for the command that needs it, so ``labq ls`` starts fast.
MAY_IMPORT_LAZILY: dict[str, frozenset[str]] = {
    "cli": frozenset({"host", "http", "store-contract", "store", "leader", "agent", "sim", "tui", "demo"}),
}


@dataclass(frozen=True)
class Import:
    importer: str  #: the module with the import statement
    imported: str  #: the labq module it names (a submodule when ``from pkg import submodule``)
    kind: str  #: ``module``, ``lazy`` or ``typing``
    where: str  #: ``path:line``

    @property
    def key(self) -> tuple[str, str, str]:
        return self.importer, self.imported, self.kind


# ---------------------------------------------------------------------------------------------
# Reading the house


def installed_roots(root: Path = ROOT) -> dict[str, Path]:
    """The folders the import system maps into ``labq``: ``labq/`` and each ``package-dir`` folder."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {}
    for package in setuptools["package-dir"]:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, f"{package} is not installed as a package"
        roots[package] = Path(next(iter(spec.submodule_search_locations))).resolve()
    for package in setuptools["packages"]:  # every installed package lies under one of the roots
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, f"{package} is not installed as a package"
        folder = Path(next(iter(spec.submodule_search_locations))).resolve()
        assert any(folder.is_relative_to(r) for r in roots.values()), f"{package} at {folder} is not read"
    return roots


def modules_under(roots: Mapping[str, Path]) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` file under the roots (a folder mapped elsewhere is skipped)."""
    mapped = set(roots.values())
    modules = {}
    for package, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            if any(parent in mapped and parent != folder for parent in path.parents):
                continue  # e.g. labq/agent/ if it ever existed next to the mapped agent/
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join([package, *parts])] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, kind
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _statements(child, "lazy")
        elif isinstance(child, ast.If) and kind == "module" and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _statements(ast.Module(body=[stmt], type_ignores=[]), "typing")
            for stmt in child.orelse:
                yield from _statements(ast.Module(body=[stmt], type_ignores=[]), kind)
        else:
            yield from _statements(child, kind)


def imports_of(modules: Mapping[str, Path]) -> list[Import]:
    """Every import of a labq module by a labq module, with its kind."""
    found = []
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for stmt, kind in _statements(ast.parse(path.read_text(), str(path)), "module"):
            where = f"{path}:{stmt.lineno}"
            if isinstance(stmt, ast.Import):
                targets = [alias.name for alias in stmt.names]
            else:
                base = stmt.module or ""
                if stmt.level:  # relative: from the module's own package, one level up per extra dot
                    package = name.split(".") if is_package else name.split(".")[:-1]
                    package = package[:len(package) - (stmt.level - 1)]
                    base = ".".join(package + ([stmt.module] if stmt.module else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in stmt.names]
            for target in targets:
                if target == "labq" or target.startswith("labq."):
                    found.append(Import(name, _known_module(target, modules), kind, where))
    return found


def _known_module(name: str, modules: Mapping[str, Path]) -> str:
    """``labq.protocol.errors.ApiError`` named as a module -> ``labq.protocol.errors``."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


# ---------------------------------------------------------------------------------------------
# Checking it


def part_of(module: str, parts: Mapping[str, Iterable[str]] = PARTS) -> str | None:
    best, best_len = None, -1
    for part, names in parts.items():
        for prefix in names:
            covers = module == prefix or (module.startswith(prefix + ".") and prefix != ROOT_PACKAGE)
            if covers and len(prefix) > best_len:
                best, best_len = part, len(prefix)
    return best


def violations(imports: Iterable[Import]) -> list[Import]:
    """The imports whose arrow between two parts the table does not allow."""
    wrong = []
    for imp in imports:
        source, target = part_of(imp.importer), part_of(imp.imported)
        if source == target:
            continue
        allowed = MAY_IMPORT[source]
        if imp.kind == "lazy":
            allowed = allowed | MAY_IMPORT_LAZILY.get(source, frozenset())
        if target not in allowed:
            wrong.append(imp)
    return wrong


def cycles(imports: Iterable[Import]) -> list[list[str]]:
    """Groups of modules that import each other, through ``module`` arrows only (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.kind == "module" and imp.importer != imp.imported:
            graph.setdefault(imp.importer, set()).add(imp.imported)
            graph.setdefault(imp.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def describe(imps: Iterable[Import]) -> str:
    return "\n".join(f"  {i.importer} -> {i.imported} ({i.kind}; {part_of(i.importer)} -> "
                     f"{part_of(i.imported)}) at {i.where}" for i in imps)


# ---------------------------------------------------------------------------------------------
# The house


class House(tuple):
    """(modules, imports), short in a failure report."""

    def __repr__(self) -> str:
        return f"<{len(self[0])} modules, {len(self[1])} imports>"


@pytest.fixture(scope="module")
def house() -> House:
    modules = modules_under(installed_roots())
    return House((modules, imports_of(modules)))


def test_the_agent_tui_and_store_folders_are_read(house):
    modules, imports = house
    for package in ("labq.agent", "labq.tui", "labq.store", "labq.leader", "labq.models"):
        assert any(m.startswith(package + ".") for m in modules), package
    assert len(imports) > 200  # a scan that finds (almost) nothing checks nothing


def test_every_module_has_a_part(house):
    modules, _ = house
    assert [m for m in sorted(modules) if part_of(m) is None] == []


def test_a_new_module_at_the_top_of_labq_needs_a_place_in_the_table():
    assert part_of("labq") == "core" and part_of("labq.models.job") == "core"
    assert part_of("labq.something_new") is None
    assert part_of("labq.store.contract") == "store-contract" and part_of("labq.store.memory") == "store"


def test_the_table_names_only_parts():
    for table in (MAY_IMPORT, MAY_IMPORT_LAZILY):
        for part, allowed in table.items():
            assert part in PARTS and allowed <= set(PARTS) - {part}, part
    assert set(MAY_IMPORT) == set(PARTS)
    assert not any("cli" in allowed for allowed in MAY_IMPORT.values())
    arrows = [Import(part, other, "module", "table") for table in (MAY_IMPORT, MAY_IMPORT_LAZILY)
              for part, allowed in table.items() for other in allowed]
    assert cycles(arrows) == []  # the parts form layers, even through lazy imports


def test_every_arrow_goes_the_way_of_design(house):
    _, imports = house
    wrong = violations(imports)
    assert not wrong, "imports against DESIGN's direction (see the table in tests/unit/test_layers.py):\n" + describe(wrong)


def test_no_module_level_import_cycles(house):
    _, imports = house
    assert cycles(imports) == []


def test_no_import_cycles_even_through_lazy_imports(house):
    """A module that imports another inside a function is as tied to it as one that imports it at the top."""
    _, imports = house
    run = [Import(i.importer, i.imported, "module", i.where) for i in imports if i.kind in ("module", "lazy")]
    assert cycles(run) == []


MAX_LINES = 600  #: past this a module holds more than one idea (STYLE.md: split by idea, past ~500)


def test_no_module_is_over_600_lines():
    long = {str(path.relative_to(ROOT)): n for root in installed_roots().values() for path in Path(root).rglob("*.py")
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


# ---------------------------------------------------------------------------------------------
# The checker catches what it must (a tree written here, with one wrong arrow at a time)


def write_tree(tmp_path: Path, files: Mapping[str, str]) -> dict[str, Path]:
    """A small house on disk: ``labq/...`` plus ``agent/``, ``tui/`` mapped like package-dir does."""
    roots = {"labq": tmp_path / "labq", "labq.agent": tmp_path / "agent", "labq.tui": tmp_path / "tui"}
    base = {
        "labq/__init__.py": '__version__ = "0"\n',
        "labq/models/__init__.py": "",
        "labq/models/job.py": "class Job: ...\n",
        "labq/leader/core.py": "from labq.models.job import Job\n",
        "labq/client.py": "from labq.models import job\n",
        "labq/render.py": "from labq.models.job import Job\n",
        "labq/cli/__init__.py": "from labq.client import *\n\ndef leader():\n    from labq.leader import core\n",
        "agent/__init__.py": "",
        "agent/daemon.py": "from labq import __version__\nfrom .inventory import read\n",
        "agent/inventory.py": "from labq.models.job import Job\ndef read(): ...\n",
        "tui/__init__.py": "",
        "tui/app.py": "from labq.client import *\nfrom labq.render import *\n",
    }
    for rel, text in {**base, **files}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules_under(roots)


def test_a_clean_small_house_passes(tmp_path):
    imports = imports_of(write_tree(tmp_path, {}))
    assert violations(imports) == [] and cycles(imports) == []
    assert Import("labq.agent.daemon", "labq.agent.inventory", "module",
                  f"{tmp_path / 'agent' / 'daemon.py'}:2") in imports  # relative import, package-dir folder


@pytest.mark.parametrize(("rel", "text", "arrow"), [
    ("agent/daemon.py", "from labq.leader.core import Job\n", ("labq.agent.daemon", "labq.leader.core", "module")),
    ("agent/daemon.py", "def f():\n    import labq.cli\n", ("labq.agent.daemon", "labq.cli", "lazy")),
    ("tui/app.py", "from labq.cli import main\n", ("labq.tui.app", "labq.cli", "module")),
    ("tui/app.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from labq.leader.core import X\n",
     ("labq.tui.app", "labq.leader.core", "typing")),
    ("labq/models/job.py", "from labq import render\n", ("labq.models.job", "labq.render", "module")),
    ("labq/cli/__init__.py", "from labq.leader import core\n", ("labq.cli", "labq.leader.core", "module")),
    ("labq/client.py", "class C:\n    from labq.agent import daemon\n", ("labq.client", "labq.agent.daemon", "module")),
])
def test_one_wrong_arrow_is_reported(tmp_path, rel, text, arrow):
    wrong = violations(imports_of(write_tree(tmp_path, {rel: text})))
    assert [imp.key for imp in wrong] == [arrow]


def test_the_cli_may_load_a_daemon_inside_a_function_only(tmp_path):
    lazy = imports_of(write_tree(tmp_path, {}))
    assert ("labq.cli", "labq.leader.core", "lazy") in {imp.key for imp in lazy}
    assert violations(lazy) == []


def test_a_module_level_cycle_is_reported(tmp_path):
    imports = imports_of(write_tree(tmp_path, {"labq/models/job.py": "from labq.models import topology\n",
                                               "labq/models/topology.py": "from labq.models.job import x\n"}))
    assert cycles(imports) == [["labq.models.job", "labq.models.topology"]]
    lazy = imports_of(write_tree(tmp_path, {"labq/models/job.py": "from labq.models import topology\n",
                                            "labq/models/topology.py": "def f():\n    from labq.models import job\n"}))
    assert cycles(lazy) == []
