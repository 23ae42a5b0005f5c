"""The released specs' PyTorch modules on a CUDA GPU, against transformers on the same GPU.

The test suite checks every released decoder spec (and T5) against transformers on CPU;
this runs the same tiny models (the suite's own cases: tests/test_llama.py,
test_qwen_gemma.py, test_phi3_neox.py, test_mixtral.py, test_granite.py, test_cohere.py,
test_t5.py) on a GPU, where the generated model.py has to keep every tensor it makes on
the weights' device:

  * float32 (TF32 off): the module's probabilities on the GPU against transformers' on the
    CPU (the suite's reference) and on the GPU, max |difference|;
  * greedy generation on the GPU through `runtime.generate` (step() and its cache): the
    ids of transformers' `generate` on the CPU;
  * bfloat16: the module and transformers both cast to bfloat16 on the GPU, max
    |difference| of their probabilities (two bfloat16 computations, reported, not held to
    float32's bound).

Then speed on the GPU: the llama-small model of benchmarks/llama_small.py (L=12, H=768,
A=12, G=4, F=2048, V=32000, seeded random weights, compiled with `--weights` from the
transformers checkpoint) in bfloat16 and float32, eager PyTorch both: greedy decoding of
64 new ids after a 16-id prompt at batch 1 and 4 (`runtime.generate` on the module against
transformers' `generate`), and a 1 x 128 prefill (the module's `step` against transformers'
forward with `use_cache=True, logits_to_keep=1`), medians of timed runs after warm-ups.

Needs torch with CUDA, transformers, tokenizers and safetensors beside fgc's own
dependencies; `--device cpu` runs it all on the CPU (slowly) to try it without a GPU.

    python benchmarks/cuda_parity.py [--device cuda] [--json FILE] [--skip-speed] [--quick]
        [--write-readme]
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
TOL = 1e-5  # float32 probabilities, as the suite holds them on CPU
MARK, AFTER = "cuda-parity", "llama-small"  # README's block, and the one it follows
DECODER_TESTS = ("test_llama", "test_qwen_gemma", "test_phi3_neox", "test_mixtral",
                 "test_granite", "test_cohere")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cases():
    """(label, spec, transformers model on CPU, fgc's --set arguments) of each suite case;
    a test module without `_sets` (test_granite) compiles with the folder's config.json
    alone."""
    for name in DECODER_TESTS:
        test = importlib.import_module(name)
        for case, label in zip(test.CASES, test.IDS):
            # a case names its spec first where a test file covers several
            spec = case[0] if isinstance(case[0], str) else name.removeprefix("test_")
            sets = test._sets(*case) if hasattr(test, "_sets") else []
            yield (label if label.startswith(spec) else f"{spec}-{label}", spec,
                   test._reference(*case), sets)
    t5 = importlib.import_module("test_t5")
    yield "t5-H24-A3-D5", "t5", t5._reference(), t5.SETS


def compile_torch(spec: str, sets: list[str], ref, folder: Path) -> Path:
    """`fgc compile specs/<spec>.fgpt --weights ... --target torch` of the model as
    `save_pretrained` writes it (the released tensor names)."""
    from conftest import fgc
    ref.save_pretrained(str(folder / "hf"))
    # with no --set, the folder: its config.json gives the sizes
    weights = folder / "hf" if not sets else folder / "hf" / "model.safetensors"
    r = fgc("compile", f"specs/{spec}.fgpt", *sets, "--weights", str(weights), "--target",
            "torch", "-o", str(folder / "torch"), timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"fgc compile {spec} failed:\n{r.stderr}")
    return folder / "torch"


def probabilities(model, ref, spec: str, V: int, T: int, device):
    """(fgc's, transformers') probabilities of one input on `device`."""
    import torch
    from hf_parity import tokens
    x = tokens(V, T).to(device)
    with torch.no_grad():
        if spec == "t5":
            y = tokens(V, max(1, T // 2)).to(device)
            return model(x, y).float(), torch.softmax(
                ref(input_ids=x, decoder_input_ids=y).logits.float(), -1)
        return model(x).float(), torch.softmax(ref(x).logits.float(), -1)


def greedy(model, ref, spec: str, V: int, device) -> tuple[list, list]:
    """(the module's ids on `device` through runtime.generate, transformers' on the CPU)."""
    import torch
    from hf_parity import tokens

    from runtime import generate
    new = 12
    if spec == "t5":
        source = tokens(V, 9)
        start = [[0, 3, 5, 7], [0, 2, 4, 6]]
        with torch.no_grad():
            want = ref.generate(input_ids=source, attention_mask=torch.ones_like(source),
                                decoder_input_ids=torch.tensor(start), max_new_tokens=new,
                                do_sample=False, eos_token_id=None, use_cache=False)
        want = want[:, len(start[0]):].tolist()
        return generate(model, start, new, inputs={"x": source.numpy()}), want
    prompt = tokens(V, 4)
    with torch.no_grad():
        want = ref.generate(prompt, max_new_tokens=new, do_sample=False, pad_token_id=0,
                            attention_mask=torch.ones_like(prompt))[:, 4:].tolist()
    return generate(model, prompt.tolist(), new), want


def parity(device: str) -> list[dict]:
    import copy

    import torch
    from hf_parity import module
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    with tempfile.TemporaryDirectory(prefix="fgc-cuda-") as tmp:
        for k, (label, spec, ref, sets) in enumerate(cases()):
            V = ref.config.vocab_size
            T = min(16, getattr(ref.config, "max_position_embeddings", 16))
            folder = Path(tmp) / f"{k}"
            folder.mkdir()
            try:
                model = module(compile_torch(spec, sets, ref, folder))
                _, want_cpu = probabilities(model, ref, spec, V, T, "cpu")
                gpu, ref_gpu = model.to(device), copy.deepcopy(ref).to(device)
                got, want_gpu = probabilities(gpu, ref_gpu, spec, V, T, device)
                ids, want_ids = greedy(gpu, ref, spec, V, device)  # transformers' on the CPU
                half, ref_half = gpu.to(torch.bfloat16), ref_gpu.to(torch.bfloat16)
                if hasattr(ref_half, "set_experts_implementation"):  # MoE: transformers'
                    ref_half.set_experts_implementation("eager")  # grouped_mm wants 16-byte rows
                got_bf, want_bf = probabilities(half, ref_half, spec, V, T, device)
                row = dict(case=label,
                           fp32_vs_cpu=float((got.cpu() - want_cpu).abs().max()),
                           fp32_vs_gpu=float((got - want_gpu).abs().max()),
                           greedy_equal=ids == want_ids,
                           bf16_vs_gpu=float((got_bf - want_bf).abs().max()))
            except Exception as e:  # noqa: BLE001 - one case's failure is that case's row
                row = dict(case=label, error=f"{type(e).__name__}: {e}"[:300])
            rows.append(row)
            log(f"{label}: {row}")
    return rows


def timed(fn, sync, warm: int = 2, reps: int = 5) -> float:
    """Median seconds of `fn()` after `warm` untimed calls."""
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def decode_rates(m, h, prompt, new: int, sync, reps: int) -> dict:
    """Tokens per second of greedy decoding: fgc's module through runtime.generate, and
    transformers' generate, from the same prompt; and whether their ids agree."""
    import torch

    from runtime import generate
    on = prompt.to(h.device)
    batch, length = prompt.shape
    got: dict[str, list] = {}

    def ours():
        got["fgc"] = generate(m, prompt.tolist(), new)

    def theirs():
        with torch.no_grad():
            out = h.generate(on, attention_mask=torch.ones_like(on), max_new_tokens=new,
                             min_new_tokens=new, do_sample=False, pad_token_id=0)
        got["hf"] = out[:, length:].tolist()

    t_ours, t_theirs = timed(ours, sync, reps=reps), timed(theirs, sync, reps=reps)
    return dict(fgc_tok_s=batch * new / t_ours, hf_tok_s=batch * new / t_theirs,
                ratio=t_theirs / t_ours, same_ids=got["fgc"] == got["hf"])


def prefill_times(m, h, x, sync, reps: int) -> dict:
    """Milliseconds of one prefill: the module's step() (the last position's logits and the
    cache) against transformers' forward as its generate calls it."""
    import torch

    def ours():
        with torch.inference_mode():
            m.step(x)

    def theirs():
        with torch.inference_mode():
            h(x, use_cache=True, logits_to_keep=1)

    t_ours, t_theirs = timed(ours, sync, reps=reps), timed(theirs, sync, reps=reps)
    return dict(fgc_ms=t_ours * 1e3, hf_ms=t_theirs * 1e3, ratio=t_theirs / t_ours)


def speed(device: str, prompt_len: int = 16, new: int = 64, prefill: int = 128,
          reps: int = 5) -> list[dict]:
    import llama_small
    import torch
    from conftest import fgc
    from hf_parity import module
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    rows = []
    with tempfile.TemporaryDirectory(prefix="fgc-cuda-speed-") as tmp:
        hf = Path(tmp) / "hf"
        hf.mkdir()
        ref = llama_small.make_model(hf)
        sets = [a for k, v in llama_small.SIZES.items() for a in ("--set", f"{k}={v}")]
        r = fgc("compile", "specs/llama.fgpt", *sets, "--weights", str(hf / "model.safetensors"),
                "--target", "torch", "-o", str(Path(tmp) / "torch"), timeout=600)
        if r.returncode != 0:
            raise SystemExit(f"fgc compile llama-small failed:\n{r.stderr}")
        model = module(Path(tmp) / "torch")
        V = llama_small.SIZES["V"]
        for dtype in (torch.bfloat16, torch.float32):
            m, h = model.to(device, dtype), ref.to(device, dtype)
            name = str(dtype).removeprefix("torch.")
            for batch in (1, 4):
                prompt = torch.randint(3, V, (batch, prompt_len),
                                       generator=torch.Generator().manual_seed(batch))
                rows.append(dict(what=f"decode {batch} x {prompt_len} + {new}", dtype=name,
                                 **decode_rates(m, h, prompt, new, sync, reps)))
                log(str(rows[-1]))
            x = torch.randint(3, V, (1, prefill), generator=torch.Generator().manual_seed(0))
            rows.append(dict(what=f"prefill 1 x {prefill}", dtype=name,
                             **prefill_times(m, h, x.to(device), sync, reps)))
            log(str(rows[-1]))
    return rows


def machine(device: str) -> str:
    import torch
    import transformers
    from readme import cpu_name
    gpu = torch.cuda.get_device_name(device) if device.startswith("cuda") else "no GPU"
    return (f"{gpu} (host: {cpu_name()}); torch {torch.__version__}, transformers "
            f"{transformers.__version__}, Python {platform.python_version()}")


def table(parity_rows: list[dict], speed_rows: list[dict], where: str) -> list[str]:
    lines = [f"Machine: {where}.", "",
             "| case | float32 vs CPU | float32 vs transformers on GPU | greedy ids | "
             "bfloat16 vs transformers bfloat16 |",
             "|---|---:|---:|---|---:|"]
    for r in parity_rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['error']} | | | |")
            continue
        lines.append(f"| {r['case']} | {r['fp32_vs_cpu']:.1e} | {r['fp32_vs_gpu']:.1e} | "
                     f"{'equal' if r['greedy_equal'] else 'DIFFER'} | {r['bf16_vs_gpu']:.1e} |")
    if speed_rows:
        lines += ["", "| llama-small | dtype | fgc | transformers | fgc / transformers |",
                  "|---|---|---:|---:|---:|"]
        for r in speed_rows:
            if "fgc_tok_s" in r:
                lines.append(f"| {r['what']} | {r['dtype']} | {r['fgc_tok_s']:.0f} tok/s | "
                             f"{r['hf_tok_s']:.0f} tok/s | {r['ratio']:.2f}x"
                             f"{'' if r['same_ids'] else ' (ids differ)'} |")
            else:
                lines.append(f"| {r['what']} | {r['dtype']} | {r['fgc_ms']:.1f} ms | "
                             f"{r['hf_ms']:.1f} ms | {r['ratio']:.2f}x |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--quick", action="store_true", help="4 new ids, one timed run: a trial")
    ap.add_argument("--write-readme", action="store_true",
                    help=f"write the tables into README.md's <!-- {MARK} --> block")
    args = ap.parse_args()
    import torch
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device (torch.cuda.is_available() is False); "
                         "--device cpu runs the checks on the CPU")
    parity_rows = parity(args.device)
    speed_rows = ([] if args.skip_speed else
                  speed(args.device, new=4, prefill=16, reps=1) if args.quick else
                  speed(args.device))
    where = machine(args.device)
    lines = table(parity_rows, speed_rows, where)
    print("\n".join(lines))
    if args.write_readme:
        from readme import write_block
        write_block(MARK, "\n".join(lines), after=AFTER)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(machine=where, parity=parity_rows,
                                                   speed=speed_rows), indent=1))
    bad = [r["case"] for r in parity_rows if "error" in r or not r["greedy_equal"]
           or max(r["fp32_vs_cpu"], r["fp32_vs_gpu"]) > TOL]
    if bad:
        log(f"not at parity: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
