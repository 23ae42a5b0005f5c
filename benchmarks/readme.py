"""Writing a benchmark's table into README.md between its <!-- name --> markers, what the
tables say about the machine, and the quiet a timed run starts after."""

from __future__ import annotations

import platform
import re
import time
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
# seconds of quiet before each timed run of contenders that alternate: after a run,
# onnxruntime's intra-op threads (and torch's OpenMP ones) spin for tens of milliseconds
# waiting for more work, taking a core from whatever runs next, in this process or another
# (on 2 cores a 1 x 128 prefill right after another session's took 1.4x as long; 50 ms of
# quiet was enough). After it the machine is cold (a torch forward pass of 8 ms took 16):
# a timed run of a few milliseconds follows the quiet and an untimed run of its own
# (moe_forward.py).
SETTLE_S = 0.1


def settle() -> None:
    """Quiet before a timed run: the last contender's threads stop spinning."""
    time.sleep(SETTLE_S)


def write_block(mark: str, table: str, after: str | None = None) -> None:
    """Replace the block `mark`; one README lacks goes in after the block `after`."""
    text = README.read_text()
    block = f"<!-- {mark} -->\n{table}\n<!-- /{mark} -->"
    pattern = re.compile(rf"<!-- {re.escape(mark)} -->.*?<!-- /{re.escape(mark)} -->", re.S)
    end_of_after = f"<!-- /{after} -->"
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    elif after is not None and end_of_after in text:
        end = text.index(end_of_after) + len(end_of_after)
        text = text[:end] + "\n\n" + block + text[end:]
    else:
        raise SystemExit(f"README.md has no <!-- {mark} --> block")
    README.write_text(text)


def publish(mark: str, lines: list[str], write: bool, after: str | None = None) -> None:
    """Print a benchmark's table, and with `write` put it into README.md as block `mark`."""
    table = "\n".join(lines)
    print(table)
    if write:
        write_block(mark, table, after)


def cpu_name() -> str:
    """The processor's model name (/proc/cpuinfo on Linux), else the architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def kernel_cache(module) -> None:
    """With --kernel-cache: `project`'s choices from runtime.kernels' per-machine cache, as
    `fgc generate` takes them, and this run's kept there at exit."""
    import atexit
    import sys

    from runtime.kernels import prefill, remember
    print(f"kernel cache: {prefill(module)} choices prefilled", file=sys.stderr)
    atexit.register(remember, module)


def chosen(module, call, limit: int = 12) -> None:
    """`call()` (a forward pass or a generation of the compiled model.py `module`) again
    until `project` has chosen a kernel for every shape class it met: it times its
    candidates on the products a pass makes (SAMPLES each), so a product made once a pass,
    as the projection onto the vocabulary, is decided after a few passes. At most `limit`
    calls; nothing where the module has no such choice (no `TRIALS`: other devices, dtypes)."""
    for _ in range(limit):
        if not getattr(module, "TRIALS", None):
            return
        call()


def kernels(module, rows: int) -> str:
    """Which kernel a compiled model.py's `project` kept for each weight shape at this many
    rows (its KERNELS, filled as the first products are timed), e.g. "oneDNN: 768 × 768;
    GEMM: ..."."""
    names = {getattr(module, kernel, None): name for kernel, name in (
        ("onednn", "oneDNN"), ("transposed", "GEMM of the rows"),
        ("prepacked", "oneDNN, prepacked"))}
    picks: dict[str, list[str]] = {}
    for (bucket, shape, _, _), kernel in module.KERNELS.items():
        if bucket == rows.bit_length():
            name = names.get(kernel, "GEMM")
            picks.setdefault(name, []).append(" × ".join(map(str, shape)))
    return "; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(picks.items(), reverse=True))
