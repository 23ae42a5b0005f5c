"""Writing a benchmark's table into README.md between its <!-- name --> markers."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def write_block(mark: str, table: str) -> None:
    text = README.read_text()
    block = f"<!-- {mark} -->\n{table}\n<!-- /{mark} -->"
    pattern = re.compile(rf"<!-- {mark} -->.*?<!-- /{mark} -->", re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md has no <!-- {mark} --> block")
    README.write_text(pattern.sub(lambda _: block, text))
