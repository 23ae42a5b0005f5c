"""What `--quantize` costs in quality: a small model trained on the shipped example text,
compiled to ONNX in float32 and quantized, scored on held-out text.

The model is examples/train_tiny.py's: specs/formal/gpt2.fgpt (its output head tied to the
embedding) over bytes (V=256), here at L=4, H=128, A=4, n=64, trained with AdamW on the
first 90% of each of examples/data/'s two texts; the last 10% of each is held out. The
trained weights go back through `fgc compile --target onnx --weights` in float32 and with
each quantization; onnxruntime (CPU) scores every held-out byte after the bytes before it
in windows of n:

  * perplexity: exp of the mean negative log-likelihood of the next byte;
  * top-1 agreement: how often the quantized graph's most likely next byte is float32's;
  * file: the size of model.onnx.

    python benchmarks/quantize_quality.py [--steps 1200] [--seed 0] [--threads 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SIZE = {"L": 4, "H": 128, "A": 4, "V": 256, "n": 64}
HELD_OUT = 0.1  # the last tenth of each text
# (label, compile options): float32 first, the reference of the agreement column
VARIANTS = [("float32", {}),
            ("int8", {"quantize": "int8"}),
            ("int4", {"quantize": "int4"}),
            ("int4, blocks of 128", {"quantize": "int4", "block_size": 128}),
            ("int4, embeddings too", {"quantize": "int4", "quantize_embeddings": True})]


def example():
    """examples/train_tiny.py as a module (its spec, text and batching)."""
    path = ROOT / "examples" / "train_tiny.py"
    spec = importlib.util.spec_from_file_location("train_tiny", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def texts(tiny) -> tuple[bytes, bytes]:
    """(training, held-out) bytes: each text split at 90%."""
    train, held = [], []
    for name in ("founding.txt", "arithmetic.txt"):
        data = (tiny.DATA / name).read_bytes()
        cut = int(len(data) * (1 - HELD_OUT))
        train.append(data[:cut])
        held.append(data[cut:])
    return b"\n\n".join(train), b"\n\n".join(held)


def train(tiny, text: bytes, steps: int, seed: int, out: Path, log) -> float:
    """Train the spec at SIZE on `text`; the weights in out/weights.safetensors. Returns the
    last steps' mean loss."""
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file

    from compiler.emit import compile_spec
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    compile_spec(str(tiny.SPEC), str(out / "torch"), target="torch", sets=SIZE)
    spec = importlib.util.spec_from_file_location("gpt2_quality", out / "torch" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build()
    ids = torch.tensor(list(text), dtype=torch.long)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.99),
                                  weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    losses: list[float] = []
    start = time.perf_counter()
    for step in range(1, steps + 1):
        x, y = tiny.batch_of(ids, 16, SIZE["n"], gen)
        loss = F.cross_entropy(model.logits(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if step % 250 == 0 or step == steps:
            log(f"step {step}: loss {sum(losses[-50:]) / len(losses[-50:]):.3f} "
                f"({time.perf_counter() - start:.0f} s)")
    save_file(model.state_dict(), str(out / "weights.safetensors"))
    return sum(losses[-50:]) / len(losses[-50:])


def windows(held: bytes, n: int):
    """Inputs and next bytes, windows of n (the last one shorter)."""
    import numpy as np
    ids = np.frombuffer(held, np.uint8).astype(np.int64)
    for start in range(0, len(ids) - 1, n):
        x = ids[start: start + n + 1]
        yield x[:-1][None], x[1:]


def score(folder: Path, held: bytes, threads: int):
    """(next-byte log-probabilities of every held-out byte, most likely bytes)."""
    import numpy as np
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    session = ort.InferenceSession(str(folder / "model.onnx"), opts,
                                   providers=["CPUExecutionProvider"])
    logp, top = [], []
    for x, y in windows(held, SIZE["n"]):
        logits = session.run(["logits"], {"x": x})[0][0].astype(np.float64)
        shifted = logits - logits.max(-1, keepdims=True)
        lp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        logp.append(lp[np.arange(len(y)), y])
        top.append(logits.argmax(-1))
    return np.concatenate(logp), np.concatenate(top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1200, help="training steps (default 1200)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch and onnxruntime threads")
    args = ap.parse_args()

    import numpy as np
    import onnxruntime
    import torch
    from readme import cpu_name

    from compiler.emit import compile_spec

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    torch.set_num_threads(args.threads)
    tiny = example()
    train_text, held = texts(tiny)
    with tempfile.TemporaryDirectory(prefix="fgc-quantize-quality-") as tmp_name:
        tmp = Path(tmp_name)
        log(f"training {', '.join(f'{k}={v}' for k, v in SIZE.items())} on "
            f"{len(train_text):,} bytes for {args.steps} steps ...")
        loss = train(tiny, train_text, args.steps, args.seed, tmp, log)
        results = {}
        for label, options in VARIANTS:
            out = tmp / label.replace(" ", "_").replace(",", "")
            compile_spec(str(tiny.SPEC), str(out), "onnx", sets=SIZE,
                         weights=str(tmp / "weights.safetensors"), **options)
            logp, top = score(out, held, args.threads)
            results[label] = (logp, top, (out / "model.onnx").stat().st_size)
    ref_logp, ref_top, ref_size = results["float32"]
    ref_ppl = math.exp(-ref_logp.mean())
    lines = [f"{tiny.SPEC.relative_to(ROOT)} at {', '.join(f'{k}={v}' for k, v in SIZE.items())}"
             f" (head tied to the embedding), trained {args.steps} steps on the first 90% of "
             f"examples/data/ (training loss {loss:.3f}); scored on the held-out last 10%, "
             f"{len(ref_top):,} bytes, by onnxruntime {onnxruntime.__version__} "
             f"CPUExecutionProvider on {cpu_name()}:", "",
             "| graph | perplexity | change | top-1 agreement with float32 | model.onnx |",
             "|---|---:|---:|---:|---:|"]
    for label, (logp, top, size) in results.items():
        ppl = math.exp(-logp.mean())
        agree = float(np.mean(top == ref_top))
        lines.append(f"| {label} | {ppl:.3f} | {100 * (ppl / ref_ppl - 1):+.2f}% | "
                     f"{100 * agree:.2f}% | {size / 2**10:,.0f} KiB |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
