"""Aligned text tables and colour for the terminal (colour only when writing to one)."""

from __future__ import annotations

import os
import sys

STYLES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}


def use_color(stream=None) -> bool:
    stream = stream or sys.stdout
    return hasattr(stream, "isatty") and stream.isatty() and not os.environ.get("NO_COLOR") \
        and os.environ.get("TERM") != "dumb"


def paint(text: str, style: str, color: bool) -> str:
    return f"\033[{STYLES[style]}m{text}\033[0m" if color and text else text


def table(rows: list[tuple[str, ...]], right: set[int] = frozenset(), indent: str = "",
          header: bool = True, color: bool = False) -> list[str]:
    """Rows of cells as aligned lines; columns in `right` are right-aligned, the first row
    is a header (bold on a terminal) unless `header` is False."""
    if not rows:
        return []
    width = max(len(r) for r in rows)
    rows = [tuple(r) + ("",) * (width - len(r)) for r in rows]
    widths = [max(len(r[k]) for r in rows) for k in range(width)]
    out = []
    for i, row in enumerate(rows):
        cells = [c.rjust(widths[k]) if k in right else c.ljust(widths[k])
                 for k, c in enumerate(row)]
        line = (indent + "  ".join(cells)).rstrip()
        out.append(paint(line, "bold", color) if header and i == 0 else line)
    return out
