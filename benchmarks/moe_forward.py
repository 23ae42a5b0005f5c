"""A sparse mixture of experts against the dense model of the same active size.

specs/mixtral.fgpt with E experts choosing K (each expert a SwiGLU of width F) against
specs/llama.fgpt with one SwiGLU of width K·F: the same attention, the same parameters
active at each position (the router's H·E aside), so a sparse dispatch that computes only
the chosen experts should cost about as much as the dense net. Both are transformers
models (MixtralForCausalLM, seeded; LlamaForCausalLM with the Mixtral's embedding,
attention, norms and head, and a seeded feed-forward net) written with `save_pretrained`
and compiled by fgc with `--weights` to PyTorch and to ONNX (onnxruntime, CPU): both
backends run the same weights, so their positions choose the same experts. Each point
alternates the models with warm-up (each timed run after readme.settle()'s quiet, in which
the last model's onnxruntime threads stop spinning, and right after an untimed run of the
same model, which warms what the quiet let cool) and reports the median time of a forward
pass and the ratio Mixtral / dense (the target: at most 1.5×). A third column runs the same
MoE computing all E experts densely (its equations, `MoE` redefined in the spec), to show
what sparsity saves. The torch modules run twice: as built, and with PREPACK
(each weight kept reordered for oneDNN, `fgc generate --prepack`).

A forward pass of a few positions is bound by reading the weights, not by arithmetic, and
a sparse MoE reads every expert some position chose: at 1 position K experts, the dense
net's bytes, but at 16 positions nearly every expert (the router is seeded at random, as an
untrained one; a trained router spreads its positions over the experts too). The table
gives the experts the point's positions chose per layer (transformers' router logits on the
same weights) and the weights the MoE reads over those the dense model reads: no sparse
kernel can take less time than that ratio where the weights' bytes set the time.
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
PREPACKED = "torch, prepacked"  # model.py's PREPACK (fgc generate --prepack)
SIZES = dict(L=4, H=512, A=8, G=4, F=1024, E=8, K=2, V=32000, n=512)
THETA = 1e6

def dense_moe() -> str:
    """The standard library's MoE under another name: a spec's own module is never an
    intrinsic, so the backends run its equations, every expert at every position."""
    stdlib = (ROOT / "compiler" / "stdlib" / "stdlib.fgpt").read_text()
    start = stdlib.index("module MoE[")
    text = stdlib[start:stdlib.index("\n}\n", start) + 3]
    return re.sub(r"\bMoE\b", "MoEDense", text)


def make_models(folder: Path) -> tuple[Path, Path, object, int]:
    """The seeded MixtralForCausalLM and its dense LlamaForCausalLM (the Mixtral's weights
    outside the feed-forward nets), each saved in a folder of its own; the Mixtral too, and
    the dense model's parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    s = SIZES
    common = dict(num_hidden_layers=s["L"], hidden_size=s["H"], num_attention_heads=s["A"],
                  num_key_value_heads=s["G"], vocab_size=s["V"],
                  max_position_embeddings=s["n"], rope_theta=THETA, rms_norm_eps=1e-5,
                  tie_word_embeddings=False)
    torch.manual_seed(0)
    mixtral = MixtralForCausalLM(MixtralConfig(
        intermediate_size=s["F"], num_local_experts=s["E"], num_experts_per_tok=s["K"],
        sliding_window=None, **common)).eval()
    dense = LlamaForCausalLM(LlamaConfig(intermediate_size=s["K"] * s["F"], **common)).eval()
    shared = {k: v for k, v in mixtral.state_dict().items() if k in dense.state_dict()}
    dense.load_state_dict(shared, strict=False)
    out = folder / "mixtral", folder / "llama"
    mixtral.save_pretrained(out[0])
    dense.save_pretrained(out[1])
    return *out, mixtral, sum(p.numel() for p in dense.parameters())


def experts_read(mixtral, x) -> list[int]:
    """How many experts the positions of `x` chose, per layer (transformers' router)."""
    import torch
    with torch.inference_mode():
        logits = mixtral(x, output_router_logits=True).router_logits
    return [len(set(layer.topk(SIZES["K"], dim=-1).indices.flatten().tolist()))
            for layer in logits]


def weights_ratio(read: list[int], dense: int) -> float:
    """The weights a forward pass of the MoE reads over those the dense model (`dense`
    parameters) reads: the same attention, norms and head (the embedding table aside, of
    which each reads a few rows), then `read` experts a layer and the routers in place of
    one net of width K·F a layer."""
    s = SIZES
    expert = 3 * s["H"] * s["F"]
    dense -= s["V"] * s["H"]
    moe = dense - s["L"] * s["K"] * expert + sum(read) * expert + s["L"] * s["H"] * s["E"]
    return moe / dense


def build(folder: Path, name: str, spec: Path, sets: dict, target: str, weights: Path):
    """A forward pass to the logits: the torch module's logits() (PREPACK set for the
    target "torch, prepacked"), or the ONNX graph compiled with the logits alone
    (`--outputs logits`), its padding mask left at none."""
    from compiler.emit import compile_spec
    out = folder / name
    onnx = target == "onnx"
    compile_spec(str(spec), str(out), "onnx" if onnx else "torch", None, sets=sets,
                 weights=str(weights), outputs=["logits"] if onnx else None)
    if onnx:
        from runtime import load
        model = load(out, provider="cpu", threads=int(os.environ["FGC_BENCH_THREADS"]),
                     cache=False, quiet=True)
        feed = model.inputs[0]["name"]
        return lambda x: model.session.run(["logits"], model.check({feed: x.numpy()}))[0]
    from safetensors.torch import load_file
    found = importlib.util.spec_from_file_location(f"fgc_{name}", out / "model.py")
    module = importlib.util.module_from_spec(found)
    sys.modules[found.name] = module
    found.loader.exec_module(module)
    module.PREPACK = target == PREPACKED
    import torch
    with torch.inference_mode(False):  # parameters that keep a version (PREPACK needs it)
        model = module.build().eval()
        model.load_state_dict(load_file(str(out / "weights.safetensors")))
    return model.logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--write-readme", action="store_true")
    args = ap.parse_args()
    os.environ["FGC_BENCH_THREADS"] = str(args.threads)

    import torch
    from readme import chosen, cpu_name, publish, settle

    torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory()
    folder = Path(tmp.name)
    s = SIZES
    common = {k: s[k] for k in ("L", "H", "A", "G", "V", "n")}
    moe: dict = {**common, "F": s["F"], "E": s["E"], "K": s["K"]}
    dense: dict = {**common, "F": s["K"] * s["F"]}
    text = (ROOT / "specs" / "mixtral.fgpt").read_text()
    everything = folder / "mixtral_dense.fgpt"
    everything.write_text(dense_moe() + text.replace("moe: MoE(", "moe: MoEDense("))
    sparse_hf, dense_hf, mixtral, dense_size = make_models(folder)
    moe["theta"] = dense["theta"] = THETA
    inputs = {point: torch.randint(0, s["V"], point, generator=torch.Generator().manual_seed(i))
              for i, point in enumerate(POINTS)}
    read = {point: experts_read(mixtral, x) for point, x in inputs.items()}
    del mixtral
    rows = []
    with torch.inference_mode():
        for k, target in enumerate(("torch", PREPACKED, "onnx")):
            runs = {
                "dense SwiGLU of K·F": build(folder, f"llama_{k}", ROOT / "specs" /
                                             "llama.fgpt", dense, target,
                                             dense_hf / "model.safetensors"),
                "MoE, K of E": build(folder, f"mixtral_{k}", ROOT / "specs" /
                                     "mixtral.fgpt", moe, target,
                                     sparse_hf / "model.safetensors"),
                "MoE, every expert": build(folder, f"every_{k}", everything, moe,
                                           target, sparse_hf / "model.safetensors"),
            }
            for point, x in inputs.items():
                times = {k: [] for k in runs}
                for _ in range(3):
                    for f in runs.values():
                        f(x)
                for f in runs.values():  # the torch modules' kernels decided before timing
                    code = sys.modules.get(getattr(f, "__module__", ""))  # model.py, for torch
                    chosen(code, lambda: f(x))  # noqa: B023 - called here
                for _ in range(args.reps):
                    for k, f in runs.items():
                        settle()  # the last model's threads stop spinning,
                        f(x)  # and an untimed run warms this one's
                        t0 = time.perf_counter()
                        f(x)
                        times[k].append(time.perf_counter() - t0)
                median = {k: statistics.median(v) for k, v in times.items()}
                rows.append((target, point, median))
                print(f"{target} {point[0]} x {point[1]}: " + ", ".join(
                    f"{k} {v * 1000:.2f} ms" for k, v in median.items()), file=sys.stderr)
    machine = f"{cpu_name()}, {args.threads} threads, torch {torch.__version__}, float32"
    keys = list(rows[0][2])
    sizes = ", ".join(f"{k}={v}" for k, v in moe.items() if k != "theta")
    lines = [f"Forward pass, logits, median of {args.reps}: Mixtral-style layers ({sizes}) "
             f"against the dense model of K·F = {s['K'] * s['F']}, the same seeded weights "
             f"in both backends ({machine}):", "",
             "| backend | batch × length | experts chosen per layer | " + " | ".join(keys)
             + " | MoE / dense (target ≤ 1.5×) | weights read, MoE / dense |"
             " every expert / MoE |",
             "|---|---|---|" + "---:|" * (len(keys) + 3)]
    for target, point, median in rows:
        ratio = median["MoE, K of E"] / median["dense SwiGLU of K·F"]
        saved = median["MoE, every expert"] / median["MoE, K of E"]
        lines.append(f"| {target} | {point[0]} × {point[1]} | "
                     f"{', '.join(map(str, read[point]))} of {s['E']} | "
                     + " | ".join(f"{median[k] * 1000:.2f} ms" for k in keys)
                     + f" | **{ratio:.2f}×** | {weights_ratio(read[point], dense_size):.2f}× "
                     f"| {saved:.2f}× |")
    publish(MARK, lines, args.write_readme, after="torch-forward")


if __name__ == "__main__":
    main()
