"""A sparse mixture of experts against the dense model of the same active size.

specs/mixtral.fgpt with E experts choosing K (each expert a SwiGLU of width F) against
specs/llama.fgpt with one SwiGLU of width K·F: the same attention, the same parameters
active at each position (the router's H·E aside), so a sparse dispatch that computes only
the chosen experts should cost about as much as the dense net. Both are compiled by fgc
from random weights, to PyTorch and to ONNX (onnxruntime, CPU); each point alternates the
models with warm-up (each timed run after readme.settle()'s quiet, in which the last
model's onnxruntime threads stop spinning, and right after an untimed run of the same
model, which warms what the quiet let cool) and reports the median time of a forward pass
and the ratio Mixtral / dense (the target: at most 1.5×). A third column runs the same MoE
computing all E experts densely (its equations, `MoE` redefined in the spec), to show what
sparsity saves.
The table names the CPU.

    python benchmarks/moe_forward.py [--threads N] [--reps 20] [--write-readme]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MARK = "moe-forward"
POINTS = [(1, 1), (1, 16), (4, 128), (1, 512)]
SIZES = dict(L=4, H=512, A=8, G=4, F=1024, E=8, K=2, V=32000, n=512)

def dense_moe() -> str:
    """The standard library's MoE under another name: a spec's own module is never an
    intrinsic, so the backends run its equations, every expert at every position."""
    stdlib = (ROOT / "compiler" / "stdlib" / "stdlib.fgpt").read_text()
    start = stdlib.index("module MoE[")
    text = stdlib[start:stdlib.index("\n}\n", start) + 3]
    return re.sub(r"\bMoE\b", "MoEDense", text)


def build(folder: Path, name: str, spec: Path, sets: dict, target: str):
    """A forward pass to the logits: the torch module's logits(), or the ONNX graph
    compiled with the logits alone (`--outputs logits`), its padding mask left at none."""
    from compiler.emit import compile_spec
    out = folder / name
    onnx = target == "onnx"
    compile_spec(str(spec), str(out), target, None, sets=sets,
                 outputs=["logits"] if onnx else None)
    if onnx:
        from runtime import load
        model = load(out, provider="cpu", threads=int(os.environ["FGC_BENCH_THREADS"]),
                     cache=False, quiet=True)
        feed = model.inputs[0]["name"]
        return lambda x: model.session.run(["logits"], model.check({feed: x.numpy()}))[0]
    found = importlib.util.spec_from_file_location(f"fgc_{name}", out / "model.py")
    module = importlib.util.module_from_spec(found)
    sys.modules[found.name] = module
    found.loader.exec_module(module)
    model = module.build().eval()
    return model.logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--write-readme", action="store_true")
    args = ap.parse_args()
    os.environ["FGC_BENCH_THREADS"] = str(args.threads)

    import torch
    from readme import cpu_name, publish, settle

    torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory()
    folder = Path(tmp.name)
    s = SIZES
    common = {k: s[k] for k in ("L", "H", "A", "G", "V", "n")}
    moe = {**common, "F": s["F"], "E": s["E"], "K": s["K"]}
    dense = {**common, "F": s["K"] * s["F"]}
    text = (ROOT / "specs" / "mixtral.fgpt").read_text()
    everything = folder / "mixtral_dense.fgpt"
    everything.write_text(dense_moe() + text.replace("moe: MoE(", "moe: MoEDense("))
    rows = []
    with torch.inference_mode():
        for target in ("torch", "onnx"):
            runs = {
                "dense SwiGLU of K·F": build(folder, f"llama_{target}", ROOT / "specs" /
                                             "llama.fgpt", dense, target),
                "MoE, K of E": build(folder, f"mixtral_{target}", ROOT / "specs" /
                                     "mixtral.fgpt", moe, target),
                "MoE, every expert": build(folder, f"every_{target}", everything, moe,
                                           target),
            }
            for batch, length in POINTS:
                x = torch.randint(0, s["V"], (batch, length))
                times = {k: [] for k in runs}
                for _ in range(3):
                    for f in runs.values():
                        f(x)
                for _ in range(args.reps):
                    for k, f in runs.items():
                        settle()  # the last model's threads stop spinning,
                        f(x)  # and an untimed run warms this one's
                        t0 = time.perf_counter()
                        f(x)
                        times[k].append(time.perf_counter() - t0)
                median = {k: statistics.median(v) for k, v in times.items()}
                rows.append((target, batch, length, median))
                print(f"{target} B={batch} T={length}: " + ", ".join(
                    f"{k} {v * 1000:.2f} ms" for k, v in median.items()), file=sys.stderr)
    machine = f"{cpu_name()}, {args.threads} threads, torch {torch.__version__}, float32"
    keys = list(rows[0][3])
    sizes = ", ".join(f"{k}={v}" for k, v in moe.items())
    lines = [f"Forward pass, logits, median of {args.reps}: Mixtral-style layers ({sizes}) "
             f"against the dense model of K·F = {s['K'] * s['F']} ({machine}):", "",
             "| backend | batch × length | " + " | ".join(keys)
             + " | MoE / dense (target ≤ 1.5×) | every expert / MoE |",
             "|---|---|" + "---:|" * (len(keys) + 2)]
    for target, batch, length, median in rows:
        ratio = median["MoE, K of E"] / median["dense SwiGLU of K·F"]
        saved = median["MoE, every expert"] / median["MoE, K of E"]
        lines.append(f"| {target} | {batch} × {length} | "
                     + " | ".join(f"{median[k] * 1000:.2f} ms" for k in keys)
                     + f" | **{ratio:.2f}×** | {saved:.2f}× |")
    publish(MARK, lines, args.write_readme, after="torch-forward")


if __name__ == "__main__":
    main()
