"""Writing a benchmark's table into README.md between its <!-- name --> markers."""

from __future__ import annotations

import platform
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


def cpu_name() -> str:
    """The processor's model name (/proc/cpuinfo on Linux), else the architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
