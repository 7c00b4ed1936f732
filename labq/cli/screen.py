"""A live screen of lines for ``labq ls --watch``, redrawn as curses does: only what changed.

The first frame (and any frame after the terminal changed size) clears the screen and writes every
line; later frames move the cursor to each line that differs from what the screen shows and rewrite
that line alone, then clear what is left below when the frame got shorter. So a change to one job of
5,000 costs one row of output instead of the whole table.

Cursor addressing only works on what the terminal shows: a frame is cut to the window's height (its
last line says how many more there are) and each line to one less than its width (a line that
filled the last column would wrap, or leave the cursor in its pending-wrap state, on some
terminals). Lines come escaped (``escape_controls``): the only escape sequences in them are the
table's own colors, which take no room.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

CLEAR = "\x1b[H\x1b[2J"
_SGR = re.compile(r"\x1b\[[0-9;]*m")


def clip(line: str, width: int) -> str:
    """``line`` cut to ``width`` visible characters (colors take none), ending in ``…`` when it was longer."""
    if width <= 0:
        return ""
    plain = _SGR.sub("", line)
    if len(plain) <= width:
        return line
    out, seen, pos = [], 0, 0
    for match in _SGR.finditer(line):
        text = line[pos:match.start()]
        if seen + len(text) >= width:
            break
        out += [text, match.group()]
        seen, pos = seen + len(text), match.end()
    out.append(line[pos:pos + width - 1 - seen])
    return "".join(out) + "…" + ("\x1b[0m" if _SGR.search(line) else "")


def fit(lines: Sequence[str], columns: int, rows: int, overflow: str = "… {n} more lines") -> list[str]:
    """The lines a ``columns`` x ``rows`` window can show: cut to its height (the last one saying how many more
    there are, as ``overflow`` with ``{n}``) and each cut to ``columns - 1``."""
    width, rows = max(1, columns - 1), max(1, rows)
    if len(lines) > rows:
        lines = [*lines[:rows - 1], overflow.format(n=f"{len(lines) - rows + 1:,}")]
    return [clip(line, width) for line in lines]


def changes(shown: Sequence[str], frame: Sequence[str]) -> str:
    """What turns a screen showing ``shown`` into one showing ``frame``: each changed line rewritten where it
    is (``ESC[row;1H`` line ``ESC[K``), and what is left below the new last line cleared (``ESC[J``)."""
    out = [f"\x1b[{row};1H{line}\x1b[K" for row, (line, old) in
           enumerate(zip(frame, [*shown, *[None] * (len(frame) - len(shown))]), start=1) if line != old]
    if len(frame) < len(shown):
        out.append(f"\x1b[{len(frame) + 1};1H\x1b[J")
    return "".join(out)


class Screen:
    """What the terminal shows now, and the one way it changes: ``draw``."""

    def __init__(self, write: Callable[[str], object], size: Callable[[], tuple[int, int]],
                 overflow: str = "… {n} more lines") -> None:
        self.write, self.size, self.overflow = write, size, overflow
        self.shown: list[str] | None = None  #: the lines on screen; None before the first frame
        self.shown_size: tuple[int, int] | None = None

    def draw(self, lines: Sequence[str]) -> int:
        """Shows ``lines``, writing only what changed; returns the bytes written."""
        columns, rows = self.size()
        frame = fit(lines, columns, rows, self.overflow)
        if self.shown is None or self.shown_size != (columns, rows):
            out = CLEAR + "\n".join(frame)
        else:
            out = changes(self.shown, frame)
        self.shown, self.shown_size = frame, (columns, rows)
        if out:
            self.write(out)
        return len(out.encode())

    def leave(self) -> None:
        """Puts the cursor on the line below the frame, for the shell's prompt."""
        if self.shown is not None:
            self.write(f"\x1b[{len(self.shown)};1H\n")
