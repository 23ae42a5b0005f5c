"""Counting GPT-3 175B: `fgc params` vs transformers on the meta device, as whole processes.

Both sides run as fresh processes, alternating, several times; the table reports median
wall time and peak resident memory of each, and their ratio. The peer builds
`GPT2Model(GPT2Config(n_layer=96, n_embd=12288, n_head=96, n_positions=2048))` under
`torch.device("meta")` (nothing is allocated) and sums `numel()`.

    python benchmarks/params_speed.py [--runs 7] [--write-readme]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MARK = "params-speed"

PEER = """
import torch
from transformers import GPT2Config, GPT2Model
with torch.device("meta"):
    model = GPT2Model(GPT2Config(n_layer=96, n_embd=12288, n_head=96, n_positions=2048))
print(sum(p.numel() for p in model.parameters()))
"""


def run(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    out = proc.stdout.read().decode()
    err = proc.stderr.read().decode()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err}")
    return wall, usage.ru_maxrss / 1024, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--write-readme", action="store_true")
    args = ap.parse_args()

    fgc = [sys.executable, "-m", "compiler.cli", "params", "specs/formal/gpt3.fgpt",
           "--preset", "175b", "--format", "json"]
    peer = [sys.executable, "-c", PEER]
    # byte-compile fgc as an installed package is, and warm its stdlib and grammar caches and
    # the OS file cache, as a user's second run would find them
    subprocess.run([sys.executable, "-m", "compileall", "-q", "compiler"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    run(fgc)
    run(peer)
    fgc_runs, peer_runs = [], []
    for i in range(args.runs):
        fgc_runs.append(run(fgc))
        peer_runs.append(run(peer))
        print(f"run {i + 1}/{args.runs}: fgc {fgc_runs[-1][0]:.3f} s, "
              f"transformers {peer_runs[-1][0]:.3f} s", file=sys.stderr)
    fgc_total = json.loads(fgc_runs[0][2])["total"]
    peer_total = int(peer_runs[0][2].strip())
    f_wall = statistics.median(r[0] for r in fgc_runs)
    p_wall = statistics.median(r[0] for r in peer_runs)
    f_mem = max(r[1] for r in fgc_runs)
    p_mem = max(r[1] for r in peer_runs)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    lines = [
        f"Counting GPT-3 175B as whole processes ({args.runs} runs each, median; {machine}):",
        "",
        "| | wall time (median) | peak memory | parameters |",
        "|---|---:|---:|---:|",
        f"| `fgc params specs/formal/gpt3.fgpt --preset 175b` | {f_wall * 1000:.0f} ms | "
        f"{f_mem:.0f} MiB | {fgc_total:,} |",
        f"| transformers `GPT2Model` on the meta device | {p_wall * 1000:.0f} ms | "
        f"{p_mem:.0f} MiB | {peer_total:,} |",
        f"| **ratio** | **{p_wall / f_wall:.1f}× faster** | **{p_mem / f_mem:.1f}× less** | |",
        "",
        f"The counts differ by {peer_total - fgc_total:,} = 96 × 4 × 12,288: GPT2Model has "
        "attention biases (q, k, v and output), the formal GPT-3 box has none.",
    ]
    from readme import publish
    publish(MARK, lines, args.write_readme)

if __name__ == "__main__":
    main()
