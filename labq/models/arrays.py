"""Job arrays and parameter grids: one submit, many tasks of one shape.

``--array 0-99%8`` makes tasks 0 to 99, at most 8 running at once (Slurm's syntax: ranges ``a-b``, steps
``a-b:s``, lists ``1,5,9``, and a ``%N`` cap); ``--grid lr=1e-3,3e-4 --grid seed=0,1,2`` makes one task per
combination, the first grid varying slowest, as nested loops do (a value may hold a comma inside double quotes:
``opt="adam,0.9",sgd``). Each task's command has ``{index}`` and each grid's ``{name}`` replaced by its own
value; other braces (the shell's ``${HOME}``, a JSON argument) are left as they are. Its environment says which task it is
(``task_env``).

Pure: the text a person typed, checked and expanded. Bad text raises ``ValueError`` saying what is accepted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product

from labq.models.job import Job, JobSpec

MAX_TASKS = 10_000  #: the most tasks one submit makes
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
_PIECE = re.compile(r"(\d{1,9})(?:-(\d{1,9})(?::(\d{1,9}))?)?")
_PLACEHOLDER = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\}")  #: ``{lr}``, not the shell's ``${lr}``


@dataclass(frozen=True)
class Task:
    """One task of a sweep: its index, and its value of each grid (none for a plain array)."""

    index: int
    params: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Sweep:
    """What ``--array`` and ``--grid`` asked for: the tasks, in order, and how many may run at once."""

    tasks: tuple[Task, ...]
    cap: int | None = None  #: at most this many of its tasks hold GPUs at once; None: no cap

    @property
    def names(self) -> tuple[str, ...]:
        """The grids' names (empty for a plain array)."""
        return tuple(name for name, _ in self.tasks[0].params) if self.tasks else ()


def parse_array(text: str) -> tuple[tuple[int, ...], int | None]:
    """``"0-99%8"`` -> (0..99, 8); ``"1-9:2,20"`` -> (1, 3, 5, 7, 9, 20), None. Indices in the order typed,
    each once."""
    body, capped, cap_text = text.strip().partition("%")
    cap = _cap(cap_text) if capped else None
    indices: list[int] = []
    seen: set[int] = set()
    for piece in body.split(","):
        m = _PIECE.fullmatch(piece.strip())
        if m is None:
            raise ValueError(f"--array takes indices, ranges and steps like 0-99, 1-9:2 or 1,5,9, with %N for at most "
                             f"N at once (0-99%8); {piece.strip()!r} is none of them")
        first, last, step = int(m[1]), int(m[2] or m[1]), int(m[3] or 1)
        if last < first:
            raise ValueError(f"--array range {piece.strip()} runs backwards: write {last}-{first}")
        if step < 1:
            raise ValueError(f"--array step must be 1 or more, not {step}")
        if (last - first) // step + 1 + len(indices) > MAX_TASKS:
            raise ValueError(f"--array makes at most {MAX_TASKS:,} tasks")
        for index in range(first, last + 1, step):
            if index in seen:
                raise ValueError(f"--array names index {index} twice")
            seen.add(index)
            indices.append(index)
    return tuple(indices), cap


def _cap(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"%N caps how many tasks run at once: N is a whole number, 1 or more, not {text!r}")
    return int(text)


def parse_grid(items: Sequence[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``["lr=1e-3,3e-4", "seed=0,1,2"]`` -> (("lr", ("1e-3", "3e-4")), ("seed", ("0", "1", "2")))."""
    grids: list[tuple[str, tuple[str, ...]]] = []
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip()
        if not sep or not _NAME.fullmatch(name):
            raise ValueError(f"--grid takes NAME=V1,V2,... with a NAME of letters, digits and _ (lr=1e-3,3e-4), not "
                             f"{item!r}")
        if name == "index":
            raise ValueError("--grid: {index} is each task's index already: choose another name")
        same = next((other for other, _ in grids if other.upper() == name.upper()), None)
        if same is not None:
            raise ValueError(f"--grid has {same} and {name}: one LABQ_PARAM_{name.upper()} cannot hold both (names are "
                             "told apart without case)")
        grids.append((name, _values(name, values)))
    return tuple(grids)


def _values(name: str, text: str) -> tuple[str, ...]:
    """``a,"b,c",d`` -> ("a", "b,c", "d"): commas split, except inside double quotes."""
    values, current, quoted, was_quoted = [], [], False, False
    for char in text + ",":
        if char == '"':
            quoted, was_quoted = not quoted, True
        elif char == "," and not quoted:
            value = "".join(current)
            if not value and not was_quoted:
                raise ValueError(f"--grid {name}: an empty value (two commas, or one at an end); quote it to mean "
                                 'an empty string: ""')
            values.append(value)
            current, was_quoted = [], False
        else:
            current.append(char)
    if quoted:
        raise ValueError(f"--grid {name}: a double quote is not closed")
    if len(set(values)) != len(values):
        raise ValueError(f"--grid {name} lists a value twice")
    return tuple(values)


def sweep(array: str | None = None, grids: Sequence[str] = ()) -> Sweep:
    """The tasks of ``--array TEXT`` or of ``--grid`` items (a cap on a grid: ``--array %N`` with it)."""
    parsed = parse_grid(grids)
    cap = None
    if parsed and array is not None:
        if not array.strip().startswith("%"):
            raise ValueError("--array with --grid: the grid's combinations are the tasks (0, 1, ...); give --array "
                             "only a cap there (--array %4)")
        cap = _cap(array.strip()[1:])
    if parsed:
        combos = 1
        for _, values in parsed:
            combos *= len(values)
        if combos > MAX_TASKS:
            raise ValueError(f"--grid makes {combos:,} combinations; at most {MAX_TASKS:,}")
        names = [name for name, _ in parsed]
        tasks = tuple(Task(i, tuple(zip(names, combo))) for i, combo in enumerate(product(*(v for _, v in parsed))))
    elif array is not None:
        indices, cap = parse_array(array)
        tasks = tuple(Task(i) for i in indices)
    else:
        raise ValueError("a sweep needs --array or --grid")
    return Sweep(tasks, cap)


def task_command(command: Sequence[str], task: Task) -> tuple[str, ...]:
    """``command`` with ``{index}`` and each ``{name}`` of the task's grids replaced; other braces as they are."""
    return _fill(_command_parts(command), {"index": str(task.index), **dict(task.params)})


def _command_parts(command: Sequence[str]) -> tuple[list[str], list[tuple[int, str]]]:
    """``command`` made ready for many tasks: its words, and where a word has placeholders, its place and the word
    as a format string (its other braces doubled). Made once for all of an array's tasks."""
    words, formats = list(command), []
    for at, word in enumerate(command):
        pieces = _PLACEHOLDER.split(word)
        if len(pieces) > 1:  # literal text at even places, a placeholder's name at odd ones
            formats.append((at, "".join(piece.replace("{", "{{").replace("}", "}}") if i % 2 == 0 else
                                        "{" + piece + "}" for i, piece in enumerate(pieces))))
    return words, formats


class _Values(dict):
    """A task's values by placeholder; a name with none is kept as typed."""

    def __missing__(self, name: str) -> str:
        return "{" + name + "}"


def _fill(parts: tuple[list[str], list[tuple[int, str]]], values: dict[str, str]) -> tuple[str, ...]:
    words, formats = parts
    if not formats:
        return tuple(words)
    words = words.copy()
    values = _Values(values)
    for at, form in formats:
        words[at] = form.format_map(values)
    return tuple(words)


def unknown_placeholders(command: Sequence[str], names: Sequence[str]) -> list[str]:
    """The ``{word}`` in ``command`` that are neither ``{index}`` nor a grid's name: a typo, most likely (the CLI
    says so; the command keeps them as typed)."""
    known = {"index", *names}
    return sorted({m[1] for word in command for m in _PLACEHOLDER.finditer(word) if m[1] not in known})


def task_specs(spec: JobSpec, array_id: int, chosen: Sequence[Task], cap: int | None, tasks: int) -> list[JobSpec]:
    """The specs of the ``chosen`` tasks of array ``array_id`` (of ``tasks`` in all): ``spec`` with each task's
    command, environment and place in the array. Made without ``dataclasses.replace``, which checks the whole spec
    again (a third of the submit of a 10,000-task array): only the command, the environment and the array differ,
    and none of them is checked there; what is cached of ``spec`` (its shape) holds for every task. What all the
    tasks share (the command split around its placeholders, the environment but the task's own entries) is made
    once."""
    parts = _command_parts(spec.command)
    # the environment's entries in their order, the task's own (its index, its grids' values) at known places
    own_env = task_env(array_id, chosen[0]) if chosen else {}
    names = list(own_env)[2:]  # after LABQ_ARRAY_ID and LABQ_ARRAY_INDEX, each grid's, in the task's order
    env = {**dict(spec.env), **own_env}
    order = sorted(env)
    base = [(key, env[key]) for key in order]
    at_index, at_param = order.index("LABQ_ARRAY_INDEX"), [order.index(name) for name in names]
    shared = {**spec.__dict__, "array_id": array_id, "array_cap": cap, "array_tasks": tasks}
    made = []
    for task in chosen:
        index = str(task.index)
        own = base.copy()
        own[at_index] = ("LABQ_ARRAY_INDEX", index)
        values = {"index": index}
        for at, key, (name, value) in zip(at_param, names, task.params):
            own[at] = (key, value)
            values[name] = value
        one = object.__new__(JobSpec)
        one.__dict__.update(shared)
        one.__dict__.update(command=_fill(parts, values), env=tuple(own), array_index=task.index)
        made.append(one)
    return made


def task_jobs(first_id: int, specs: Sequence[JobSpec], submitted_at: float) -> list[Job]:
    """A new job for each of an array's task ``specs``, ids from ``first_id`` on. Made as ``task_specs`` makes the
    specs: the first as any job, the others its copies but for their id and spec, not through the dataclass's
    checks again, which would cost a 10,000-task submit a tenth of what it may take."""
    if not specs:
        return []
    first = Job(first_id, specs[0], submitted_at=submitted_at)
    shared = first.__dict__
    made = [first]
    for k, spec in enumerate(specs[1:], first_id + 1):
        one = object.__new__(Job)
        fields = one.__dict__
        fields.update(shared)
        fields["id"], fields["spec"] = k, spec
        made.append(one)
    return made


def task_env(array_id: int, task: Task) -> dict[str, str]:
    """What a task's environment says of it: ``LABQ_ARRAY_ID``, ``LABQ_ARRAY_INDEX`` and ``LABQ_PARAM_<NAME>`` of
    each of its grids, in that order."""
    env = {"LABQ_ARRAY_ID": str(array_id), "LABQ_ARRAY_INDEX": str(task.index)}
    env.update((f"LABQ_PARAM_{name.upper()}", value) for name, value in task.params)
    return env
