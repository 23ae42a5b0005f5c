"""Compiling a large checkpoint: peak memory, wall time and MB/s of `fgc compile --weights
FOLDER` to ONNX and to torch, against `cp -r` of the same folder.

The model: Llama-3-8B's sizes (L=32, H=4096, A=32, G=8, F=14336, V=128256; 8.0 billion
parameters, 16 GB in bfloat16), random bfloat16 weights written as a sharded model folder
(`model-0000k-of-0000n.safetensors`, `model.safetensors.index.json`, a LlamaForCausalLM
config.json), with numpy alone. Both outputs are float32, twice the folder's bytes, and
are written one after the other, each removed before the next; where the disk cannot hold
the folder and one output (`df`), fewer layers at the same widths (`--layers`), and the
table says which. Each command runs as its own process; its peak resident memory is that
process's maximum resident set (`os.wait4`'s rusage), set against a tiny compile's (the
interpreter, numpy and onnx: the baseline) and against the model's largest tensor.
MB/s counts the folder's bytes read (the rate `cp` gives is the disk's). fgc reads the
sizes from the folder's config.json (no `--set`). onnxruntime-genai's model builder
(`python -m onnxruntime_genai.models.builder -i FOLDER -p fp32 -e cpu`, installed apart as
benchmarks/llama_small.py installs it) runs on the same folder where the model in float32
takes at most a third of the machine's memory: it loads the whole model through
transformers first; past that the table says it was not run, and why.

    python benchmarks/compile_large.py [--layers 32] [--dir /tmp] [--genai-site DIR]
        [--write-readme]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MARK = "compile-large"

LLAMA3_8B = {"L": 32, "H": 4096, "A": 32, "G": 8, "F": 14336, "V": 128256}
SHARD = 5 * 10**9  # bytes per shard at most, as save_pretrained's default


def llama_tensors(L: int, H: int, A: int, G: int, F: int, V: int) -> list[tuple[str, tuple]]:
    """A LlamaForCausalLM state dict's names and shapes, in its own order."""
    D = H // A
    out = [("model.embed_tokens.weight", (V, H))]
    for layer in range(L):
        p = f"model.layers.{layer}."
        out += [(p + "input_layernorm.weight", (H,)),
                (p + "self_attn.q_proj.weight", (A * D, H)),
                (p + "self_attn.k_proj.weight", (G * D, H)),
                (p + "self_attn.v_proj.weight", (G * D, H)),
                (p + "self_attn.o_proj.weight", (H, A * D)),
                (p + "post_attention_layernorm.weight", (H,)),
                (p + "mlp.gate_proj.weight", (F, H)),
                (p + "mlp.up_proj.weight", (F, H)),
                (p + "mlp.down_proj.weight", (H, F))]
    return out + [("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]


def config_json(L: int, H: int, A: int, G: int, F: int, V: int) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "num_hidden_layers": L, "hidden_size": H, "num_attention_heads": A,
            "num_key_value_heads": G, "head_dim": H // A, "intermediate_size": F,
            "vocab_size": V, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "hidden_act": "silu", "attention_bias": False,
            "mlp_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def write_folder(folder: Path, sizes: dict, shard: int = SHARD, seed: int = 0) -> int:
    """A sharded bfloat16 model folder of random weights (bits of small, finite values),
    written with numpy a tensor at a time; returns its bytes of tensors. Norm weights are
    ones. The random bits come from one pool, each tensor a slice of it at a random offset:
    what the compile reads costs the same as any other bits, and making 16 GB of fresh
    random numbers would take longer than compiling them."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 1 << 16, 1 << 26, dtype=np.uint16)  # 128 MiB of bits
    pool &= 0x807F  # sign and mantissa; the exponent set below: |x| in [2^-7, 2^-6)
    pool |= 0x3C00
    tensors = llama_tensors(**sizes)
    shards: list[list[tuple[str, tuple]]] = [[]]
    used = 0
    for name, shape in tensors:
        nbytes = 2 * math.prod(shape)
        if shards[-1] and used + nbytes > shard:
            shards.append([])
            used = 0
        shards[-1].append((name, shape))
        used += nbytes
    weight_map, total = {}, 0
    one = np.uint16(0x3F80)  # bfloat16 1.0
    for k, names in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {}, 0
        for name, shape in names:
            n = 2 * math.prod(shape)
            header[name] = {"dtype": "BF16", "shape": list(shape),
                            "data_offsets": [offset, offset + n]}
            offset += n
            weight_map[name] = file
        header["__metadata__"] = {"format": "pt"}
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(folder / file, "wb") as f:
            f.write(len(text).to_bytes(8, "little") + text)
            for _, shape in names:
                n = math.prod(shape)
                if len(shape) == 1:
                    f.write(np.full(n, one, np.uint16).tobytes())
                    continue
                at = int(rng.integers(0, pool.size))
                while n:  # the pool from `at`, wrapping round
                    part = pool[at: at + n]
                    f.write(memoryview(part).cast("B"))
                    n -= part.size
                    at = 0
        total += offset
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (folder / "config.json").write_text(json.dumps(config_json(**sizes), indent=2))
    return total


def run_measured(cmd: list[str], env: dict | None = None) -> tuple[float, int, str]:
    """(wall seconds, peak resident bytes, stderr's tail) of `cmd` as its own process, its
    peak read with os.wait4 (that child's own rusage, not a maximum over all children)."""
    import threading
    start = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         env=env)
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.append(p.stderr.read()))
    reader.start()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - start
    reader.join()
    p.returncode = os.waitstatus_to_exitcode(status)
    tail = b"".join(err).decode(errors="replace")[-3000:]
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{tail}")
    return wall, usage.ru_maxrss * 1024, tail


def fgc_compile(folder: Path, out: Path, target: str) -> list[str]:
    """The compile a user runs on the folder: every size from its config.json."""
    return [sys.executable, "-m", "compiler.cli", "compile", "specs/llama.fgpt", "--weights",
            str(folder), "--target", target, "-o", str(out)]


def add_tokenizer(folder: Path, vocab: int) -> None:
    """A word-level tokenizer beside the weights: the builder saves one with its model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t0",
                            bos_token="t1", eos_token="t2").save_pretrained(folder)


def memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    from readme import cpu_name, publish

    from runtime.progress import human_size

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=None,
                    help="layers (default 32, fewer where the disk is short)")
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where the files go")
    ap.add_argument("--genai-site", help="a folder with onnxruntime-genai and onnx-ir "
                    "installed (--no-deps); default: installed on first use, as "
                    "benchmarks/llama_small.py does")
    ap.add_argument("--write-readme", action="store_true")
    args = ap.parse_args()

    gib = 2**30
    skipped = ""
    work = Path(tempfile.mkdtemp(prefix="fgc-compile-large-", dir=args.dir))
    sizes = dict(LLAMA3_8B)
    per_layer = sum(math.prod(s) for _, s in llama_tensors(**{**sizes, "L": 1})) - \
        sum(math.prod(s) for _, s in llama_tensors(**{**sizes, "L": 0}))
    fixed = sum(math.prod(s) for _, s in llama_tensors(**{**sizes, "L": 0}))
    free = shutil.disk_usage(work).free - 2 * 2**30  # room left for everyone else
    fits = (free // 6 - fixed) // per_layer  # bf16 folder (2 B) + a float32 output (4 B)
    sizes["L"] = args.layers or min(32, max(1, fits))
    params = fixed + per_layer * sizes["L"]
    which = "Llama-3-8B's sizes" if sizes["L"] == 32 else \
        f"Llama-3-8B's widths with {sizes['L']} of its 32 layers"
    try:
        folder = work / "llama"
        t = time.perf_counter()
        nbytes = write_folder(folder, sizes)
        print(f"wrote {folder}: {params:,} parameters, {human_size(nbytes)} in bfloat16 "
              f"({time.perf_counter() - t:.0f} s)", file=sys.stderr)
        largest = 4 * max(math.prod(s) for _, s in llama_tensors(**sizes))

        env = {**os.environ, "FGC_PROGRESS": "1"}
        tiny = work / "tiny"
        _, base, _ = run_measured([sys.executable, "-m", "compiler.cli", "compile",
                                   "specs/llama.fgpt", "--set", "L=1", "--set", "H=64",
                                   "--set", "A=4", "--set", "G=2", "--set", "F=128",
                                   "--set", "V=256", "--set", "n=64", "--target", "onnx",
                                   "-o", str(tiny)], env)
        shutil.rmtree(tiny)
        rows = []
        copy = work / "copy"
        wall, rss, _ = run_measured(["cp", "-r", str(folder), str(copy)])
        shutil.rmtree(copy)
        rows.append(("`cp -r` (the disk)", wall, rss, du(folder)))
        for target in ("onnx", "torch"):
            out = work / f"out-{target}"
            wall, rss, log = run_measured(fgc_compile(folder, out, target), env)
            print(log, file=sys.stderr)
            rows.append((f"fgc compile --target {target}", wall, rss, du(out)))
            shutil.rmtree(out)
        builder = "`python -m onnxruntime_genai.models.builder -p fp32 -e cpu`"
        if 4 * params * 3 <= memory_bytes():
            from llama_small import builder_cmd, genai_env, genai_site
            add_tokenizer(folder, sizes["V"])
            out = work / "out-genai"
            wall, rss, log = run_measured(builder_cmd(folder, out, work / "builder-cache"),
                                          genai_env(genai_site(args.genai_site)))
            rows.append((builder, wall, rss, du(out)))
            shutil.rmtree(out)
        else:
            skipped = (f"{builder} was not run: it loads the whole model through "
                       f"transformers first, {4 * params / gib:.0f} GiB in float32, on a "
                       f"machine of {memory_bytes() / gib:.0f} GiB.")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    lines = [f"Compiling {which}: L={sizes['L']}, H={sizes['H']}, A={sizes['A']}, "
             f"G={sizes['G']}, F={sizes['F']}, V={sizes['V']} ({params / 1e9:.2f} billion "
             f"parameters), random bfloat16 weights in a sharded folder of "
             f"{nbytes / 1e9:.1f} GB, to float32 outputs. CPU: {cpu_name()}, "
             f"{os.cpu_count()} cores. Peak RSS: the process's maximum resident set; a tiny "
             f"compile's is {base / gib:.2f} GiB, the largest tensor in float32 "
             f"{largest / gib:.2f} GiB. MB/s: the folder's bytes over the wall time; fgc "
             "reads every size from the folder's config.json.", "",
             "| | wall | MB/s | peak RSS | over tiny compile + largest tensor | written |",
             "|---|---:|---:|---:|---:|---:|"]
    for what, wall, rss, written in rows:
        over = f"{(rss - base - largest) / gib:+.2f} GiB" if what.startswith("fgc") else ""
        lines.append(f"| {what} | {wall:.1f} s | {nbytes / wall / 1e6:,.0f} | "
                     f"{rss / gib:.2f} GiB | {over} | {written / 1e9:.1f} GB |")
    if skipped:
        lines += ["", skipped]
    publish(MARK, lines, args.write_readme, after="llama-small")


if __name__ == "__main__":
    main()
