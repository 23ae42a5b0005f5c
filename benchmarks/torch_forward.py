"""Forward throughput: fgc's compiled released GPT-2 small vs transformers' GPT2LMHeadModel.

Same weights (the HF model's, imported through `--weights`), same dtype, same thread count,
same inputs; each point alternates the models, with warm-up, and reports the median time per
forward pass. Both return the logits (fgc's `logits()`). On the CPU in float32, model.py's
`project` times oneDNN's inner product against the plain `x @ w` on the first products
of each shape class (during the warm-up, which runs fgc until every class is decided:
readme.chosen) and keeps the faster; the table says which it kept
for each weight shape, and fgc is also timed with `ONEDNN = False` (the plain `x @ w`
everywhere, the GEMM transformers also runs). `--compile` adds both models under
torch.compile. Achieved FLOP/s count the weight products and attention's two products over
the causal half; against the peak where the GPU is one of PEAK_BF16's (bfloat16). Every
table names the CPU.

    python benchmarks/torch_forward.py [--threads N] [--reps 20] [--write-readme]
    python benchmarks/torch_forward.py --device cuda --dtype bfloat16 --compile --write-readme
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
# dense bfloat16 tensor-core peak, FLOP/s, by a substring of torch.cuda.get_device_name()
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "L4": 121e12}


def flops(batch: int, length: int, config) -> float:
    """GPT-2's forward FLOPs: 2 per multiply-add of the weight products (q, k, v, output, the
    feed-forward net's two, the projection onto the vocabulary) and of attention's Q K^T and
    its product with V over the causal half."""
    L, H, V = config.n_layer, config.n_embd, config.vocab_size
    F = config.n_inner or 4 * H
    tokens = batch * length
    weights = 2 * tokens * (L * (4 * H * H + 2 * H * F) + H * V)
    attention = 2 * 2 * batch * L * H * length * (length + 1) / 2
    return weights + attention


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--compile", action="store_true",
                    help="also time both models under torch.compile")
    ap.add_argument("--write-readme", action="store_true")
    ap.add_argument("--kernel-cache", action="store_true",
                    help="take model.py's kernel choices from fgc's per-machine cache, as "
                    "`fgc generate` does, and keep this run's there (default: measure afresh)")
    args = ap.parse_args()

    import torch
    from readme import chosen, cpu_name, kernel_cache, kernels, publish
    from safetensors.torch import load_file, save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    from compiler.emit import compile_spec

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config()).eval()  # GPT-2 small, random weights
    # kept for the whole run, and the module importable by name: torch.compile reads both
    tmp = tempfile.TemporaryDirectory()
    folder = Path(tmp.name)
    weights = folder / "gpt2.safetensors"
    save_file({k: v.contiguous().clone() for k, v in hf.state_dict().items()}, weights)
    compile_spec(str(ROOT / "specs" / "gpt2.fgpt"), str(folder), "torch", "small",
                 weights=str(weights))
    spec = importlib.util.spec_from_file_location("fgc_gpt2", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if args.kernel_cache:
        kernel_cache(module)
    ours = module.build().eval()
    ours.load_state_dict(load_file(folder / "weights.safetensors"))
    hf.to(device, dtype)
    ours.to(device, dtype)

    def plain(x):
        module.ONEDNN = False
        try:
            return ours.logits(x)
        finally:
            module.ONEDNN = True

    runs = {"fgc": ours.logits}
    if device.type == "cpu" and dtype == torch.float32:
        runs["fgc, `ONEDNN = False`"] = plain
    runs["transformers"] = lambda x: hf(x).logits
    if args.compile:
        compiled_hf = torch.compile(hf)
        runs["fgc, torch.compile"] = torch.compile(ours.logits)
        runs["transformers, torch.compile"] = lambda x: compiled_hf(x).logits
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    peak = None
    if device.type == "cuda":
        name = torch.cuda.get_device_name()
        machine = f"{name}, host CPU {cpu_name()}, torch {torch.__version__}, {args.dtype}"
        if dtype == torch.bfloat16:
            peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    else:
        machine = f"{cpu_name()}, {args.threads} threads, torch {torch.__version__}, " \
                  f"{args.dtype}"

    rows = []
    with torch.inference_mode():
        for batch, length in POINTS:
            x = torch.randint(0, 50257, (batch, length), device=device)
            ref = hf(x).logits.float()
            diff = max((f(x).float() - ref).abs().max().item() for f in runs.values())
            times = {k: [] for k in runs}
            for _ in range(3):  # warm-up (and, with --compile, compilation)
                for f in runs.values():
                    f(x)
            chosen(module, lambda: ours.logits(x))  # noqa: B023 - called here, in this round
            sync()
            for _ in range(args.reps):
                for k, f in runs.items():
                    t0 = time.perf_counter()
                    f(x)
                    sync()
                    times[k].append(time.perf_counter() - t0)
            median = {k: statistics.median(v) for k, v in times.items()}
            rows.append((batch, length, median, diff, kernels(module, batch * length)))
            print(f"B={batch} T={length}: " + ", ".join(
                f"{k} {v * 1000:.2f} ms" for k, v in median.items())
                + f"; {median['transformers'] / median['fgc']:.2f}x, max |logit diff| "
                f"{diff:.1e}", file=sys.stderr)

    pairs = [("fgc", "transformers", "speed-up")]
    if "fgc, `ONEDNN = False`" in runs:
        pairs.append(("fgc, `ONEDNN = False`", "transformers", "speed-up, `ONEDNN = False`"))
    if args.compile:
        pairs.append(("fgc, torch.compile", "transformers, torch.compile",
                      "speed-up, both compiled"))
    fast = "fgc, torch.compile" if args.compile else "fgc"
    unit = 1e12 if device.type == "cuda" else 1e9
    rate = f"{fast}, {'TFLOP/s' if unit == 1e12 else 'GFLOP/s'}"
    if peak:
        rate += f" (of {peak / 1e12:.0f} peak)"
    choice = "fgc, `ONEDNN = False`" in runs
    head = ["batch × length", *(f"{k}" for k in runs), *(p[2] for p in pairs), rate,
            "max abs logit difference", *(["fgc's kernel by weight shape"] if choice else [])]
    lines = [f"Forward pass of released GPT-2 small, logits, median of {args.reps} "
             f"({machine}):", "", "| " + " | ".join(head) + " |",
             "|---|" + "---:|" * (len(head) - 1 - choice) + "---|" * choice]
    for batch, length, median, diff, kept in rows:
        ratios = []
        for ours_k, theirs_k, label in pairs:
            r = f"{median[theirs_k] / median[ours_k]:.2f}×"
            ratios.append(f"**{r}**" if label == "speed-up" else r)
        achieved = flops(batch, length, hf.config) / median[fast]
        cell = f"{achieved / unit:.1f}"
        if peak:
            cell += f" ({achieved / peak:.0%})"
        lines.append(f"| {batch} × {length} | "
                     + " | ".join(f"{median[k] * 1000:.2f} ms" for k in runs)
                     + " | " + " | ".join(ratios) + f" | {cell} | {diff:.1e} |"
                     + (f" {kept} |" if choice else ""))
    mark = MARK if (device.type, args.dtype, args.compile) == ("cpu", "float32", False) \
        else f"{MARK}-{device.type}-{args.dtype}{'-compile' if args.compile else ''}"
    publish(mark, lines, args.write_readme, after=MARK)


if __name__ == "__main__":
    main()
