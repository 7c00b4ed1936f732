"""What every benchmark prints: the table of figures against goals, and profiles' largest shares."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path


def print_figures(title: str, fig: Mapping[str, object], targets: Mapping[str, tuple[str, bool]],
                  skip: Iterable[str] = (), digits: int = 3) -> None:
    """``targets`` maps a figure to (the goal as shown, whether it was met)."""
    skip = set(skip)
    width = max(map(len, fig))
    print(f"{title}\n")
    print(f"{'figure':<{width}}  {'value':>12}  {'goal':<18}  verdict")
    for name, value in fig.items():
        if name in skip:
            continue
        shown, met = targets.get(name, ("", None))
        text = f"{value:12.{digits}f}" if isinstance(value, float) else f"{value!s:>12}"
        verdict = "" if met is None else ("met" if met else "MISSED")
        print(f"{name:<{width}}  {text}  {shown:<18}  {verdict}".rstrip())


def profile_lines(stats: dict, what: str, *, own: int = 10, including: int = 14, folders: int = 1,
                  ours: str | None = None) -> list[str]:
    """The largest shares of a profile (``pstats.Stats(...).stats``): by own time, by time including
    callees, and (``ours``: a pattern of file paths) labq's own functions by time including callees."""
    total = sum(tt for _, _, tt, _, _ in stats.values()) or 1e-9

    def name(key) -> str:
        path, line, func = key
        return f"{func} ({'/'.join(Path(path).parts[-folders:])}:{line})" if line else func

    def ranked(items, column: int, top: int) -> list[str]:
        return [f"    {kv[1][column] / total:6.1%}  {kv[1][1]:>9} calls  {name(kv[0])}"
                for kv in sorted(items, key=lambda kv: -kv[1][column])[:top]]

    lines = [f"cProfile of {what}: {total * 1000:.0f} ms in all (with the profiler's overhead)",
             "  by own time (tottime), share of the total:", *ranked(stats.items(), 2, own),
             "  by time including callees (cumtime), share of the total:", *ranked(stats.items(), 3, including)]
    mine = [kv for kv in stats.items() if ours and re.search(ours, kv[0][0])]
    if mine:
        lines += ["  labq's own functions by cumtime, share of the total:", *ranked(mine, 3, 8)]
    return lines
