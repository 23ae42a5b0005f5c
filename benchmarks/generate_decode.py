"""Decoding speed: greedy generation with the key/value cache, fgc (PyTorch and ONNX) vs
transformers' `generate` on GPT2LMHeadModel.

Released GPT-2 small's architecture and sizes (GPT2Config()), with random weights: the
transformers model's, imported into both fgc backends through `--weights`. Same dtype
(float32), same thread count, same prompts; every run makes exactly N new ids after a
P-id prompt (no stop id), and all must produce the same ids. The torch module runs twice:
as built, and with PREPACK (its weights kept reordered for oneDNN, `fgc generate
--prepack`). Tokens per second are batch × N over the wall time of the whole call (the
prompt's prefill included), median of the repetitions, the runs alternating, after
untimed runs (in which the torch module's `project` times its CPU kernels on the products
of each new shape class and keeps the fastest; the table says which it kept per token, at
one row per sequence). Every table names the CPU.

    python benchmarks/generate_decode.py [--threads N] [--new 64] [--reps 3] [--write-readme]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MARK = "generate-decode"
BATCHES = [1, 8]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--prompt", type=int, default=16, help="prompt length P")
    ap.add_argument("--new", type=int, default=64, help="new ids N")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batches", type=int, nargs="+", default=BATCHES)
    ap.add_argument("--write-readme", action="store_true")
    ap.add_argument("--kernel-cache", action="store_true",
                    help="take model.py's kernel choices from fgc's per-machine cache, as "
                    "`fgc generate` does, and keep this run's there (default: measure afresh)")
    args = ap.parse_args()

    import onnxruntime
    import torch
    from readme import chosen, cpu_name, kernel_cache, kernels, publish
    from safetensors.torch import load_file, save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    from compiler.emit import compile_spec
    from runtime import generate, load

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config()).eval()  # GPT-2 small, random weights
    tmp = tempfile.TemporaryDirectory()
    weights = Path(tmp.name) / "gpt2.safetensors"
    save_file({k: v.contiguous().clone() for k, v in hf.state_dict().items()}, weights)
    spec = str(ROOT / "specs" / "gpt2.fgpt")
    compile_spec(spec, f"{tmp.name}/torch", "torch", "small", weights=str(weights))
    compile_spec(spec, f"{tmp.name}/onnx", "onnx", "small", weights=str(weights),
                 kv_cache=True)
    import importlib.util

    def torch_module(name: str, prepack: bool):
        """model.py imported as a module of its own (its own KERNELS), PREPACK as asked,
        and the model built with the weights."""
        mspec = importlib.util.spec_from_file_location(name, f"{tmp.name}/torch/model.py")
        module = importlib.util.module_from_spec(mspec)
        mspec.loader.exec_module(module)
        module.PREPACK = prepack
        if args.kernel_cache:
            kernel_cache(module)
        model = module.build().eval()
        model.load_state_dict(load_file(f"{tmp.name}/torch/weights.safetensors"))
        return module, model

    module, ours = torch_module("fgc_gpt2", False)
    packed_module, packed = torch_module("fgc_gpt2_prepacked", True)
    onnx_model = load(f"{tmp.name}/onnx", threads=args.threads)
    print(f"onnx provider: {onnx_model.provider} ({onnx_model.reason})", file=sys.stderr)

    def run_hf(x):
        with torch.inference_mode():
            out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.new,
                              min_new_tokens=args.new, do_sample=False, pad_token_id=50256,
                              eos_token_id=None)
        return out[:, x.shape[1]:].tolist()

    runs = {"fgc torch": lambda x: generate(ours, x.tolist(), args.new),
            "fgc torch, prepacked": lambda x: generate(packed, x.tolist(), args.new),
            "fgc onnx": lambda x: generate(onnx_model, x.tolist(), args.new),
            "transformers": run_hf}
    rows = []
    for batch in args.batches:
        x = torch.randint(0, 50257, (batch, args.prompt), generator=torch.Generator()
                          .manual_seed(batch))
        ids = {name: fn(x) for name, fn in runs.items()}  # warm-up, and the ids to compare
        chosen(module, lambda: runs["fgc torch"](x))  # noqa: B023 - called here
        chosen(packed_module, lambda: runs["fgc torch, prepacked"](x))  # noqa: B023
        same = len({str(v) for v in ids.values()}) == 1
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.reps):
            for name, fn in runs.items():
                t0 = time.perf_counter()
                fn(x)
                times[name].append(time.perf_counter() - t0)
        rate = {name: batch * args.new / statistics.median(t) for name, t in times.items()}
        rows.append((batch, rate, same, kernels(module, batch),
                     kernels(packed_module, batch)))
        print(f"B={batch}: " + ", ".join(f"{k} {v:.1f} tok/s" for k, v in rate.items())
              + f", same ids: {same}", file=sys.stderr)
    tmp.cleanup()

    machine = (f"{cpu_name()}, {args.threads} threads, torch {torch.__version__}, "
               f"onnxruntime {onnxruntime.__version__} ({onnx_model.provider}), float32")
    lines = [f"Greedy generation of {args.new} ids after a {args.prompt}-id prompt, GPT-2 "
             f"small, tokens per second, median of {args.reps} ({machine}):", "",
             "| batch | fgc torch | fgc torch, `--prepack` | fgc ONNX | transformers generate "
             "| torch vs transformers | torch `--prepack` vs transformers | ONNX vs "
             "transformers | same ids | fgc torch's kernel by weight shape, per token | the "
             "same, `--prepack` |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|:---:|---|---|"]
    for batch, r, same, kernel, packed_kernel in rows:
        t, p, o, h = (r["fgc torch"], r["fgc torch, prepacked"], r["fgc onnx"],
                      r["transformers"])
        lines.append(f"| {batch} | {t:.1f} | {p:.1f} | {o:.1f} | {h:.1f} | **{t / h:.2f}×** | "
                     f"**{p / h:.2f}×** | **{o / h:.2f}×** | {'yes' if same else 'no'} | "
                     f"{kernel} | {packed_kernel} |")
    publish(MARK, lines, args.write_readme)


if __name__ == "__main__":
    main()
