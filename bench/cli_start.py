"""Benchmark of the CLI's start: wall time of ``labq submit -- true`` and ``labq ls`` on an idle lab.

What it measures, against a real ``labq leader`` (plain HTTP, no agent) started as a process in a temp
folder with a temp HOME (``Lab`` of ``bench/latency.py``; the commands read its first admin's credentials
file, as a person's would be read): the wall time of each command as a process, beside ``python -c pass``
and ``python -c "import labq.cli"`` with the same interpreter, so that the interpreter's own start and
labq's cost are told apart. The four take turns (2 warm-ups, then ``--runs`` turns), so that a change in
the machine's load touches each alike. The lab stays idle: each job ``labq submit`` queued is cancelled
through the API after its turn (not timed), so every ``labq ls`` lists an empty queue. The commands run
with bytecode caches written (``PYTHONDONTWRITEBYTECODE`` is dropped from their environment: the warm-ups
write what is stale), as an installed labq has them; compiling a module anew costs more than importing
it. ``*_minus_python_pass_ms`` is a command's median less ``python -c pass``'s: what labq itself costs
(its imports, its work, its one request; the leader's own time for it is in there too). ``*_cpu_median_ms``
is the CPU time (user and system) of the command's process: on a busy machine wall time counts the waits
for a core, CPU time does not, so it shows a change better there (the leader's time is not in it).

Once, not timed: the modules each command imports beyond ``python -c pass`` (``-X importtime``), their
count and the sum of their own import times (``*_imports_ms``, a diagnostic: importtime's clock adds to
it), and the five slowest of them.

``--baseline DIR`` times another checkout of labq (an older one: the figures before a change) in the same
turns, with DIR first on ``PYTHONPATH`` (the leader is this checkout's): ``baseline_*`` figures, measured
under the same load as the others, which matters on a busy machine.

``--python PY`` runs the commands with another interpreter, ``labq`` as ``PY -c 'from labq.cli import
main; ...'`` (what the ``labq`` script does): a venv where labq was installed another way, to compare. For
example setuptools' default editable install (``pip install -e .``) puts an import hook in the venv, which
loads ``pathlib``, ``re`` and ``urllib.parse`` at every start of that interpreter (about 10 ms);
``./install.sh``'s is a ``.pth`` file naming this checkout (``editable_mode=compat``), which costs nothing.

Goal (issue: the CLI starts fast): each command's median within 30 ms on an idle lab, that is about
10 ms over ``python -c pass``. Timings are reported, never asserted.

Run:  .venv/bin/python bench/cli_start.py [--runs 20] [--json] [--keep] [--baseline DIR] [--python PY]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # figures, latency: beside this file

from figures import print_figures  # noqa: E402
from latency import LABQ, Lab, ms, pct, say  # noqa: E402

WARMUPS = 2
GOAL_MS = 30.0
#: ``labq ARGS`` as the ``labq`` script runs it, for an interpreter that has no such script
LAUNCH = "import sys; from labq.cli import main; sys.argv[0] = 'labq'; sys.exit(main())"
LABQ_COMMANDS = ("python_import_labq_cli", "labq_submit", "labq_ls")  #: those a --baseline checkout runs too


def commands(python: str | None) -> dict[str, list[str]]:
    """The command lines that take turns: with this interpreter and its ``labq`` script, or with ``python``."""
    py = python or sys.executable
    labq = [str(LABQ)] if python is None else [python, "-c", LAUNCH]
    return {"python_pass": [py, "-c", "pass"], "python_import_labq_cli": [py, "-c", "import labq.cli"],
            "labq_submit": [*labq, "submit", "--", "true"], "labq_ls": [*labq, "ls"]}


def command_env(lab: Lab, checkout: Path | None = None) -> dict:
    """The lab's environment for a command, with bytecode caches written as an installed labq has them; with
    ``checkout``, that checkout's labq imported instead of this one."""
    env = {k: v for k, v in lab.env().items() if k != "PYTHONDONTWRITEBYTECODE"}
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(checkout), *filter(None, [env.get("PYTHONPATH")])])
    return env


def cancel_submitted(lab: Lab, stdout: str) -> None:
    for job_id in re.findall(r"submitted job (\d+)", stdout):
        lab.client.action(int(job_id), "cancel")  # the lab stays idle: ls lists nothing


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_turns(lab: Lab, runs: int, python: str | None, baseline: Path | None) -> dict[str, list[float]]:
    """Seconds of each command's process, ``runs`` turns after the warm-ups, as ``KEY`` (wall) and ``KEY_cpu``;
    queued jobs cancelled between."""
    lines = commands(python)
    turns = [(key, argv, None) for key, argv in lines.items()]
    if baseline is not None:
        turns += [(f"baseline_{key}", lines[key], baseline) for key in LABQ_COMMANDS]
    times: dict[str, list[float]] = {k: [] for key, _, _ in turns for k in (key, f"{key}_cpu")}
    for turn in range(WARMUPS + runs):
        for key, argv, checkout in turns:
            env = command_env(lab, checkout)
            cpu, start = cpu_of_children(), time.perf_counter()
            out = subprocess.run(argv, env=env, cwd=lab.root, capture_output=True, text=True, timeout=60)
            elapsed, cpu = time.perf_counter() - start, cpu_of_children() - cpu
            if out.returncode != 0:
                raise RuntimeError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr.strip()}")
            if turn >= WARMUPS:
                times[key].append(elapsed)
                times[f"{key}_cpu"].append(cpu)
            cancel_submitted(lab, out.stdout)
    return times


def imports_beyond_python(lab: Lab, python: str, code: str) -> list[tuple[str, int]]:
    """The modules ``python -c CODE`` imports that ``python -c pass`` does not, with their own import time in
    microseconds, in import order."""
    def modules(code: str) -> list[tuple[str, int]]:
        out = subprocess.run([python, "-X", "importtime", "-c", code], env=command_env(lab), cwd=lab.root,
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"{code} exited {out.returncode}: {out.stderr.strip()[-2000:]}")
        cancel_submitted(lab, out.stdout)
        return [(name, int(own)) for own, name in re.findall(r"^import time:\s+(\d+) \|\s+\d+ \| *(\S+)$",
                                                             out.stderr, re.M)]

    base = {name for name, _ in modules("pass")}
    return [(name, own) for name, own in modules(code) if name not in base]


def import_figures(lab: Lab, python: str | None) -> tuple[dict, dict[str, list[str]]]:
    """Per command: the count and summed own time of its imports beyond ``python -c pass``; and the five
    slowest of them (a diagnostic)."""
    fig, slowest = {}, {}
    for key, code in (("labq_submit", "from labq.cli import main; main(['submit', '--', 'true'])"),
                      ("labq_ls", "from labq.cli import main; main(['ls'])"),
                      ("python_import_labq_cli", "import labq.cli")):
        found = imports_beyond_python(lab, python or sys.executable, code)
        fig |= {f"{key}_modules_imported": len(found), f"{key}_imports_ms": ms(sum(own for _, own in found) / 1e6)}
        slowest[key] = [f"{own / 1000:6.2f} ms  {name}" for name, own in sorted(found, key=lambda r: -r[1])[:5]]
    return fig, slowest


def figures(times: dict[str, list[float]]) -> dict:
    """Wall median and p90 of each command, then CPU medians, then each less ``python -c pass``."""
    fig: dict = {}
    for key in (k for k in times if not k.endswith("_cpu")):
        values = [ms(v) for v in times[key]]
        fig |= {f"{key}_median_ms": statistics.median(values), f"{key}_p90_ms": pct(values, 0.9)}
    for key in (k for k in times if k.endswith("_cpu")):
        fig[f"{key}_median_ms"] = ms(statistics.median(times[key]))
    for key in (k for k in times if not k.startswith("python_pass")):
        fig[f"{key}_minus_python_pass_ms"] = (fig[f"{key}_median_ms"] - fig["python_pass_cpu_median_ms" if
                                              key.endswith("_cpu") else "python_pass_median_ms"])
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="timed turns of each command (default 20)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--keep", action="store_true", help="leave the temp folder (logs, data) in place")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="another labq checkout (holding labq/) to time in the same turns: the figures before")
    parser.add_argument("--python", metavar="PY", help="the interpreter that runs the commands (default: this "
                        "one, and its labq script); labq must be importable by it")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be 1 or more")
    if args.baseline is not None and not (args.baseline / "labq" / "cli").is_dir():
        parser.error(f"--baseline {args.baseline}: no labq/cli/ in it")
    began = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="labq-bench-cli-start-"))
    lab = Lab(root)
    try:
        lab.serve_leader()
        say(f"leader {lab.url} up in {root}; {WARMUPS}+{args.runs} turns of: python -c pass, "
            "python -c 'import labq.cli', labq submit -- true, labq ls"
            + (f"; the last three again from {args.baseline}" if args.baseline else ""))
        fig = figures(run_turns(lab, args.runs, args.python, args.baseline))
        imports, slowest = import_figures(lab, args.python)
        fig |= imports
    finally:
        lab.close()
        if args.keep:
            say(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    python = subprocess.run([args.python or sys.executable, "-c", "import sys; print(sys.version.split()[0])"],
                            capture_output=True, text=True).stdout.strip()
    head = {"python": python, "interpreter": args.python or sys.executable, "cpus": os.cpu_count(),
            "runs": args.runs, "baseline": str(args.baseline) if args.baseline else None,
            "wall_s": time.perf_counter() - began}
    goals = {f"{key}_median_ms": fig[f"{key}_median_ms"] <= GOAL_MS for key in ("labq_submit", "labq_ls")}
    if args.json:
        print(json.dumps(head | fig | {"goals_met": goals, "slowest_imports": slowest}))
        return 0
    print_figures(f"labq CLI start on an idle lab, plain HTTP (Python {python} at {head['interpreter']}, "
                  f"{head['cpus']} CPUs, {args.runs} runs each, {head['wall_s']:.0f} s"
                  + (f"; baseline_*: {args.baseline}" if args.baseline else "") + ")", fig,
                  {name: (f"<= {GOAL_MS:g} ms", met) for name, met in goals.items()}, digits=1)
    for key, rows in slowest.items():
        print(f"\nslowest imports of {key} beyond python -c pass (own time, one run; a diagnostic):\n  "
              + "\n  ".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
