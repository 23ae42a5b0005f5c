"""Forward throughput: fgc's compiled released GPT-2 small vs transformers' GPT2LMHeadModel.

Same weights (the HF model's, imported through `--weights`), same dtype (float32), same
thread count, same inputs; each point alternates the models, with warm-up, and reports the
median time per forward pass. Both return the logits (fgc's `logits()`). fgc is timed as
generated (weight products through oneDNN in CPU inference, see `project` in model.py) and
with `ONEDNN = False`, the plain `x @ w` that transformers also runs.

    python benchmarks/torch_forward.py [--threads N] [--reps 20] [--write-readme]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MARK = "torch-forward"
POINTS = [(1, 16), (8, 128), (4, 512)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--write-readme", action="store_true")
    args = ap.parse_args()

    import torch
    from readme import cpu_name, write_block
    from safetensors.torch import load_file, save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    from compiler.emit import compile_spec

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config()).eval()  # GPT-2 small, random weights
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "gpt2.safetensors"
        save_file({k: v.contiguous().clone() for k, v in hf.state_dict().items()}, weights)
        compile_spec(str(ROOT / "specs" / "gpt2.fgpt"), tmp, "torch", "small",
                     weights=str(weights))
        spec = importlib.util.spec_from_file_location("fgc_gpt2", Path(tmp) / "model.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        ours = module.build().eval()
        ours.load_state_dict(load_file(Path(tmp) / "weights.safetensors"))

    def plain(x):
        module.ONEDNN = False
        try:
            return ours.logits(x)
        finally:
            module.ONEDNN = True

    runs = {"fgc": ours.logits, "plain": plain, "hf": lambda x: hf(x).logits}
    rows = []
    with torch.inference_mode():
        for batch, length in POINTS:
            x = torch.randint(0, 50257, (batch, length))
            ref = hf(x).logits
            diff = max((runs[k](x) - ref).abs().max().item() for k in ("fgc", "plain"))
            times = {k: [] for k in runs}
            for _ in range(3):  # warm-up
                for f in runs.values():
                    f(x)
            for _ in range(args.reps):
                for k, f in runs.items():
                    t0 = time.perf_counter()
                    f(x)
                    times[k].append(time.perf_counter() - t0)
            f, p, h = (statistics.median(times[k]) for k in runs)
            rows.append((batch, length, f, p, h, diff))
            print(f"B={batch} T={length}: fgc {f * 1000:.2f} ms, plain products "
                  f"{p * 1000:.2f} ms, transformers {h * 1000:.2f} ms: {h / f:.2f}x "
                  f"({h / p:.2f}x plain), max |logit diff| {diff:.1e}", file=sys.stderr)

    machine = (f"{cpu_name()}, {args.threads} threads, torch {torch.__version__}, float32")
    lines = [f"Forward pass of released GPT-2 small, logits, median of {args.reps} "
             f"({machine}):", "",
             "| batch × length | fgc (compiled) | fgc, `ONEDNN = False` | transformers "
             "GPT2LMHeadModel | speed-up | speed-up, `ONEDNN = False` | max abs logit "
             "difference |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for batch, length, f, p, h, diff in rows:
        lines.append(f"| {batch} × {length} | {f * 1000:.2f} ms | {p * 1000:.2f} ms | "
                     f"{h * 1000:.2f} ms | **{h / f:.2f}×** | {h / p:.2f}× | {diff:.1e} |")
    table = "\n".join(lines)
    print(table)
    if args.write_readme:
        write_block(MARK, table)


if __name__ == "__main__":
    main()
