"""Which onnxruntime release reads which ONNX graphs, and what to say when the one installed
is older than a graph needs (`runtime.load` says it in place of onnxruntime's own error)."""

from __future__ import annotations

import re

# release -> the highest (ONNX IR version, ai.onnx opset) it reads, until the next row; source:
# onnxruntime.ai/docs/reference/compatibility.html to 1.20, then measured (docs/onnx.md)
READS: dict[tuple[int, int], tuple[int, int]] = {
    (1, 14): (8, 18),
    (1, 15): (8, 19),
    (1, 16): (9, 19),
    (1, 17): (9, 20),
    (1, 18): (10, 21),
    (1, 21): (10, 22),
    (1, 23): (11, 23),
    (1, 24): (13, 25),
    (1, 25): (13, 26),
}


def plain(error: str) -> str:
    """onnxruntime's error without the C++ source location and signature it starts with,
    which would crowd out the cause."""
    error = re.sub(r"Load model from \S+ failed:", "", error)
    return re.sub(r"\S+\.(?:cc|h):\d+ [^(]*\([^()]*\) ", "", error)


def release(version: str) -> tuple[int, int]:
    """(major, minor) of an onnxruntime version string: "1.22.1", "1.24.0.dev20250610"."""
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise ValueError(f"not an onnxruntime version: {version!r}")
    return int(m[1]), int(m[2])


def oldest_reader(ir_version: int, opset: int) -> tuple[int, int] | None:
    """The oldest release that reads a graph of this IR version and ai.onnx opset; None when
    the graph is newer than every release above."""
    return next((r for r, (ir, op) in READS.items() if ir_version <= ir and opset <= op), None)


def too_old(ir_version: int, opsets: dict[str, int], installed: str) -> str | None:
    """Why onnxruntime `installed` cannot read a graph of this IR version and these opset
    imports (domain -> version), worded for the user; None when it can, or when the table
    does not say which release could."""
    opset = opsets.get("", opsets.get("ai.onnx", 0))
    needed = oldest_reader(ir_version, opset)
    try:
        mine = release(installed)
    except ValueError:
        return None
    if needed is None or mine >= needed:
        return None
    reads = [v for r, v in READS.items() if r <= mine]
    limit = (f"it reads IR versions up to {reads[-1][0]} and opsets up to {reads[-1][1]}"
             if reads else "it is older than every release fgc lists")
    return (f"the graph is ONNX IR version {ir_version} with opset {opset}, which onnxruntime "
            f"{installed} cannot read ({limit}): install onnxruntime {needed[0]}.{needed[1]} "
            "or newer, or compile with a lower --opset (docs/onnx.md, \"Opsets and onnxruntime "
            "versions\", gives the oldest onnxruntime for each)")
