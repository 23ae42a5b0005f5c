"""Count a spec across a grid of sizes with fgc's Python API (no tensors are built).

    python examples/count_sweep.py [SPEC]
"""

from __future__ import annotations

import sys
from pathlib import Path

from compiler.pipeline import load

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else str(ROOT / "examples" / "parallel_block.fgpt")
    spec = load(path)
    errors, _ = spec.check()
    if errors:
        raise SystemExit(f"{path} does not check: {errors[0].message}")
    print(f"{'L':>4} {'H':>6} {'A':>4} {'parameters':>16}")
    for layers in (12, 24, 48):
        for width, heads in ((768, 12), (1024, 16), (2048, 16)):
            cfg = spec.configure(None, {"L": layers, "H": width, "A": heads})
            print(f"{layers:>4} {width:>6} {heads:>4} {cfg.total:>16,}")


if __name__ == "__main__":
    main()
