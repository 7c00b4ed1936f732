"""The one table every benchmark prints: figure, value, goal, and whether the goal was met."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


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
