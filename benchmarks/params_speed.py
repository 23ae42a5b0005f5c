"""Counting GPT-3 175B: `fgc params` vs transformers on the meta device, as whole processes.

Both sides run as fresh processes, alternating, several times; the table reports median
wall time and peak resident memory of each, and their ratio. The peer builds
`GPT2Model(GPT2Config(n_layer=96, n_embd=12288, n_head=96, n_positions=2048))` under
`torch.device("meta")` (nothing is allocated) and sums `numel()`. fgc runs warm (its parse
cache filled, as on a user's second run) and cold (an empty cache folder and temporary
folder each run: the grammar's tables are built and the specs parsed). `--baseline DIR`
adds the same two rows for another checkout of fgc (e.g. `git worktree add /tmp/old REV`).

    python benchmarks/params_speed.py [--runs 7] [--baseline DIR] [--write-readme]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
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


def run(cmd: list[str], cwd: Path = ROOT, cold: bool = False) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of one child process; `cold`: with an empty
    cache folder and temporary folder of its own."""
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as fresh:
        if cold:
            env.update(XDG_CACHE_HOME=fresh, TMPDIR=fresh)
        return _run(cmd, cwd, env)


def _run(cmd: list[str], cwd: Path, env: dict) -> tuple[float, float, str]:
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env)
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
    ap.add_argument("--baseline", type=Path, metavar="DIR",
                    help="another checkout of fgc, timed the same way")
    ap.add_argument("--write-readme", action="store_true")
    args = ap.parse_args()

    fgc = [sys.executable, "-m", "compiler.cli", "params", "specs/formal/gpt3.fgpt",
           "--preset", "175b", "--format", "json"]
    peer = [sys.executable, "-c", PEER]
    sides = {"fgc": ROOT}
    if args.baseline:
        sides[f"fgc {_revision(args.baseline)}"] = args.baseline.resolve()
    # byte-compile fgc as an installed package is, and warm its stdlib and grammar caches and
    # the OS file cache, as a user's second run would find them
    for where in sides.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", "compiler", "runtime"],
                       cwd=where, check=True, stdout=subprocess.DEVNULL)
        run(fgc, where)
    run(peer)
    runs: dict[str, list] = {}
    for i in range(args.runs):
        for name, where in sides.items():
            runs.setdefault(f"{name} warm", []).append(run(fgc, where))
            runs.setdefault(f"{name} cold", []).append(run(fgc, where, cold=True))
        runs.setdefault("peer", []).append(run(peer))
        print(f"run {i + 1}/{args.runs}: " + ", ".join(
            f"{k} {v[-1][0]:.3f} s" for k, v in runs.items()), file=sys.stderr)
    fgc_total = json.loads(runs["fgc warm"][0][2])["total"]
    peer_total = int(runs["peer"][0][2].strip())
    wall = {k: statistics.median(r[0] for r in v) for k, v in runs.items()}
    mem = {k: max(r[1] for r in v) for k, v in runs.items()}
    from readme import cpu_name, publish
    machine = (f"{cpu_name()}, {platform.machine()}, {os.cpu_count()} cores, "
               f"Python {platform.python_version()}")
    lines = [
        f"Counting GPT-3 175B as whole processes ({args.runs} runs each, median; {machine}):",
        "",
        "| | wall time (median) | peak memory | parameters |",
        "|---|---:|---:|---:|",
    ]
    for name in sides:
        for kind, what in (("warm", "its cache warm"), ("cold", "empty cache")):
            key = f"{name} {kind}"
            label = "`fgc params specs/formal/gpt3.fgpt --preset 175b`" if name == "fgc" \
                else f"the same, {name}"
            lines.append(f"| {label}, {what} | {wall[key] * 1000:.0f} ms | {mem[key]:.0f} MiB | "
                         f"{fgc_total:,} |")
    lines += [
        f"| transformers `GPT2Model` on the meta device | {wall['peer'] * 1000:.0f} ms | "
        f"{mem['peer']:.0f} MiB | {peer_total:,} |",
        f"| **ratio, warm** | **{wall['peer'] / wall['fgc warm']:.1f}× faster** | "
        f"**{mem['peer'] / mem['fgc warm']:.1f}× less** | |",
        f"| ratio, cold | {wall['peer'] / wall['fgc cold']:.1f}× faster | "
        f"{mem['peer'] / mem['fgc cold']:.1f}× less | |",
        "",
        f"The counts differ by {peer_total - fgc_total:,} = 96 × 4 × 12,288: GPT2Model has "
        "attention biases (q, k, v and output), the formal GPT-3 box has none.",
    ]
    publish(MARK, lines, args.write_readme)


def _revision(folder: Path) -> str:
    r = subprocess.run(["git", "-C", str(folder), "log", "-1", "--format=%h"],
                       capture_output=True, text=True)
    return f"at {r.stdout.strip()}" if r.returncode == 0 and r.stdout.strip() else str(folder)


if __name__ == "__main__":
    main()
