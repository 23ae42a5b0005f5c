"""float16 and bfloat16 against float32: how far `--dtype` moves a model's logits.

Two models, each compiled at every precision from one set of weights, fed the same ids:

  * GPT-2 small (specs/gpt2.fgpt, preset small, 124M parameters) with random weights:
    fgc's seeded initialisation (N(0, 0.02), what `fgc compile` gives without --weights)
    for the ONNX graphs, the module's own for the PyTorch one; 4 sequences of 128 random
    ids. Such logits are nearly uniform, so their top-1 agreement says little;
  * the formal GPT-2 that examples/train_tiny.py trains (L=2, H=64, bytes, 300 steps, a few
    seconds), on 16 windows of 64 bytes of its own text: logits that mean something, and
    the cross-entropy of the next byte at each precision.

For each model and form (the standard ONNX graph, the `--optimize ort` one, the PyTorch
module): the largest logit difference from float32 (absolute, and over the largest float32
logit), the mean one, and top-1 agreement (the share of positions whose most likely id is
float32's). ONNX runs on onnxruntime's CPU provider, where most float16 operators compute
in float32 between float16 tensors (onnxruntime inserts the casts); a GPU provider computes
more in float16 and may differ more.

    python benchmarks/precision.py [--quick]   # --quick: the trained model only
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
os.environ.setdefault("FGC_PROGRESS", "0")

import numpy as np  # noqa: E402

from benchmarks.readme import cpu_name  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def module(folder: Path, weights: Path | None = None):
    """build() of a compiled model.py (in its compiled dtype), with `weights` loaded."""
    import importlib.util

    from safetensors.torch import load_file
    spec = importlib.util.spec_from_file_location(f"fgc_precision_{folder.name}",
                                                  folder / "model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.build().eval()
    if weights is not None:
        model.load_state_dict(load_file(str(weights)))
    return model


def compare(ref: np.ndarray, got: np.ndarray) -> dict:
    got = got.astype(np.float64)
    diff = np.abs(got - ref)
    return {"max": diff.max(), "rel": diff.max() / np.abs(ref).max(), "mean": diff.mean(),
            "top1": (got.argmax(-1) == ref.argmax(-1)).mean()}


def cross_entropy(logits: np.ndarray, y: np.ndarray) -> float:
    z = logits.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-np.take_along_axis(logp, y[..., None], -1).mean())


def measure(spec: str, sets: dict | None, preset: str | None, weights: Path | None,
            x: np.ndarray, tmp: Path, torch_weights: Path | None) -> list[tuple]:
    """(form, dtype, logits) for every form at every precision, float32 first."""
    import torch

    from compiler.emit import compile_spec
    from runtime import load
    out = []
    for form, options in (("ONNX", {}), ("ONNX --optimize ort", {"optimize": "ort"})):
        for dtype in ("float32", "float16"):
            folder = tmp / f"{form.split()[-1]}-{dtype}"
            log(f"compiling {spec} to {form} in {dtype}")
            compile_spec(spec, str(folder), "onnx", preset, sets,
                         None if weights is None else str(weights), dtype=dtype, **options)
            model = load(folder, provider="cpu", cache=False, quiet=True)
            out.append((form, dtype, model.run({"x": x})["logits"]))
            del model
    log(f"compiling {spec} to PyTorch")
    compile_spec(spec, str(tmp / "torch"), "torch", preset, sets)
    torch.manual_seed(0)
    base = module(tmp / "torch", torch_weights)
    for dtype in ("float32", "float16", "bfloat16"):
        m = copy.deepcopy(base).to(getattr(torch, dtype))  # each rounded from float32
        with torch.inference_mode():
            out.append(("PyTorch", dtype, m.logits(torch.as_tensor(x)).float().numpy()))
    return out


def table(title: str, results: list[tuple], y: np.ndarray | None) -> list[str]:
    lines = [f"{title}", "",
             "| form | dtype | max abs diff | max diff / max logit | mean abs diff | top-1 "
             "agreement |" + (" cross-entropy |" if y is not None else ""),
             "|---|---|---:|---:|---:|---:|" + ("---:|" if y is not None else "")]
    ref = {}
    for form, dtype, logits in results:
        if dtype == "float32":
            ref[form] = logits.astype(np.float64)
            if y is not None:
                lines.append(f"| {form} | float32 | | | | | {cross_entropy(logits, y):.4f} |")
            continue
        c = compare(ref[form], logits)
        lines.append(f"| {form} | {dtype} | {c['max']:.2e} | {c['rel']:.2e} | {c['mean']:.2e} "
                     f"| {100 * c['top1']:.2f}% |"
                     + (f" {cross_entropy(logits, y):.4f} |" if y is not None else ""))
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the trained tiny model only")
    args = p.parse_args()
    import onnxruntime
    import torch
    from train_tiny import SIZE, batch_of, load_text, train
    print(f"CPU: {cpu_name()}; onnxruntime {onnxruntime.__version__}, torch "
          f"{torch.__version__}\n")
    with tempfile.TemporaryDirectory(prefix="fgc-precision-") as tmp:
        tmp = Path(tmp)
        log("training the tiny formal GPT-2 (examples/train_tiny.py)")
        train(out=tmp / "trained", log=log)
        x, y = batch_of(load_text(), 16, SIZE["n"], torch.Generator().manual_seed(1))
        weights = tmp / "trained" / "weights.safetensors"
        results = measure(str(ROOT / "specs" / "formal" / "gpt2.fgpt"), SIZE, None, weights,
                          x.numpy(), tmp / "tiny", weights)
        lines = table("The formal GPT-2 trained by examples/train_tiny.py (L=2, H=64, V=256), "
                      "16 windows of 64 bytes of its text", results, y.numpy())
        if not args.quick:
            ids = np.random.default_rng(0).integers(0, 50257, (4, 128))
            results = measure(str(ROOT / "specs" / "gpt2.fgpt"), None, "small", None, ids,
                              tmp / "small", None)
            lines += ["", *table("GPT-2 small (124M), random weights, 4 sequences of 128 "
                                 "random ids", results, None)]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
