"""Quantized decoding on CPU: fgc's `--quantize int4` graph against its float32 graph and
against onnxruntime-genai's model builder `-p int4 -e cpu`, on the same weights.

The model and its folder are benchmarks/llama_small.py's (a seeded random Llama with
L=12, H=768, A=12, G=4, F=2048, V=32000, saved with `save_pretrained` beside a word-level
tokenizer), and so are the setup of onnxruntime-genai (installed with --no-deps into fgc's
cache folder, run in a subprocess) and the timing (rounds of one run each in rotated
order, medians, a ratio as the median over rounds of the ratio within a round). From that
one folder:

  * fgc float32: `fgc compile specs/llama.fgpt --set ... --weights FOLDER/model.safetensors
    --target onnx --kv-cache --last-position --outputs logits --external-data`; fgc int4:
    the same with `--quantize int4`, standard and `--optimize ort`; run by
    `runtime.generate` (what `fgc generate` does);
  * the peer: `python -m onnxruntime_genai.models.builder -i FOLDER -p int4 -e cpu`, run by
    `og.Generator`, greedy.

Both int4 graphs are symmetric blocks of 32 with onnxruntime's MatMulNBits at accuracy
level 4 (the builder's defaults for CPU): the script checks that fgc's codes are the
builder's, byte for byte (a product fgc joins, gate and up, the builder's two one after
the other), and compares the prefill's last logits of the two, and each with float32's.

Measured: greedy decoding tokens per second (N new ids after a P-id prompt, the prefill
included) at batch 1 and 4; the size of the weights on disk (model.onnx and its data
file); the emitting process's wall time and peak memory (one run each).

    python benchmarks/quantize_decode.py [--threads 2] [--quick] [--write-readme]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
MARK = "quantize-decode"
AFTER = "llama-small"
F32, Q4, Q4ORT, GENAI = "fgc float32", "fgc int4", "fgc int4 ort", "builder int4"
LABELS = {F32: "fgc ONNX, float32", Q4: "fgc ONNX, `--quantize int4`",
          Q4ORT: "fgc ONNX, `--quantize int4 --optimize ort`",
          GENAI: "model builder `-p int4 -e cpu`"}


def onnx_bytes(folder: Path) -> int:
    """The graph and its weights: model.onnx and any .onnx.data beside it."""
    return sum(p.stat().st_size for p in folder.iterdir()
               if p.name.endswith((".onnx", ".onnx.data")))


def same_codes(ours: Path, theirs: Path) -> tuple[int, int]:
    """How many of fgc's code tensors (uint8 initializers) hold bytes the builder wrote, of
    how many: the whole of one of the builder's, a slice of one along N, or several of
    them side by side (codes are laid out N first, so a slice along N is a run of bytes;
    fgc joins the products of one input, gate and up, which the builder makes apart)."""
    import onnx
    from onnx import numpy_helper

    def codes(folder: Path) -> list[bytes]:
        graph = onnx.load(str(folder / "model.onnx")).graph
        return [numpy_helper.to_array(t).tobytes() for t in graph.initializer
                if t.data_type == onnx.TensorProto.UINT8]

    def held(a: bytes) -> bool:
        if any(a in b for b in known):
            return True
        while a:  # the builder's tensors whole, one after another
            b = next((b for b in known if a.startswith(b)), None)
            if b is None:
                return False
            a = a[len(b):]
        return True
    known = codes(theirs)
    mine = codes(ours)
    return sum(held(a) for a in mine), len(mine)


def main() -> None:
    import llama_small as ls

    ap = ls.decoding_arguments(__doc__, MARK)
    args = ap.parse_args()
    quick, threads = args.quick, args.threads
    new = args.new or (16 if quick else 64)
    decode_plan = (1, 0, 1) if quick else (5, 1, 2)  # passes, warm-ups, timed rounds
    load_before, started = os.getloadavg()[0], time.perf_counter()
    if load_before > 0.5:
        ls.log(f"warning: 1-minute load average {load_before:.2f}: other processes are "
               "using the CPU, timings will be noisy")

    site = ls.genai_site(args.genai_site)
    import numpy as np
    import onnxruntime as ort
    from readme import cpu_name, publish

    from runtime import generate, load

    with tempfile.TemporaryDirectory(prefix="fgc-quantize-decode-") as tmp_name:
        tmp = Path(tmp_name)
        hf_dir = tmp / "hf"
        ls.log("making the random Llama and its folder ...")
        hf = ls.make_model(hf_dir)
        params = sum(p.numel() for p in hf.parameters())
        del hf
        weights = hf_dir / "model.safetensors"

        ls.log("emitting (fgc compile, float32 and int4; the model builder, int4) ...")
        outs = {F32: tmp / "fgc-f32", Q4: tmp / "fgc-int4", Q4ORT: tmp / "fgc-int4-ort",
                GENAI: tmp / "genai"}
        builder = ls.builder_cmd(hf_dir, outs[GENAI], tmp / "builder-cache")
        builder[builder.index("fp32")] = "int4"
        cmds = {F32: ls.fgc_compile_cmd(weights, outs[F32], None),
                Q4: ls.fgc_compile_cmd(weights, outs[Q4], None) + ["--quantize", "int4"],
                Q4ORT: ls.fgc_compile_cmd(weights, outs[Q4ORT], "ort") + ["--quantize",
                                                                           "int4"],
                GENAI: builder}
        emitted = {name: ls.emit(LABELS[name], cmd, ls.genai_env(site) if name == GENAI
                                 else None, 1 if name == GENAI else ls.COMPILE_TRIES)
                   for name, cmd in cmds.items()}
        sizes = {k: onnx_bytes(o) for k, o in outs.items()}
        identical, codes = same_codes(outs[Q4], outs[GENAI])
        ls.log(f"{identical} of fgc's {codes} int4 code tensors are the builder's bytes")
        graphs = {k: ls.graph_summary(o) for k, o in outs.items()}
        ls.log("emit: " + ", ".join(f"{k} {s:.2f} s, {ls.mib(p)}, {ls.mib(sizes[k])} written"
                                    for k, (s, p) in emitted.items()))

        fgc = {name: load(outs[name], provider="cpu", threads=threads, cache=False,
                          quiet=True) for name in (F32, Q4, Q4ORT)}
        genai = ls.Genai(site, outs[GENAI], threads)

        # -- the prefill's last logits: how far each graph is from float32 and the builder
        x = np.random.default_rng(7).integers(0, ls.SIZES["V"], (1, args.prefill))
        last = {}
        for name, model in fgc.items():
            feeds = model.check({model.incremental["tokens"]: x})
            last[name] = model.session.run([model.signature.logits["name"]], feeds)[0][:, -1]
        saved = tmp / "genai-logits.npy"
        genai.ask({"op": "prefill", "ids": x.tolist(), "save": str(saved)})
        last[GENAI] = np.load(saved)
        spread = float(np.linalg.norm(last[F32] - last[F32].mean()))
        from_f32 = {k: float(np.linalg.norm(v - last[F32])) / spread for k, v in last.items()}
        from_builder = {k: float(np.linalg.norm(v - last[GENAI])) / spread
                        for k, v in last.items()}
        ls.log("prefill logits' distance (relative) from float32's: " + ", ".join(
            f"{k} {v:.3f}" for k, v in from_f32.items()) + "; from the builder's: " +
            ", ".join(f"{k} {v:.3f}" for k, v in from_builder.items()))

        def decode_runs(prompts: list) -> dict:
            """The four decoders on `prompts` (genai's worker times itself)."""
            def fgc_run(name):
                return lambda: generate(fgc[name], prompts, new)

            def genai_run():
                return genai.ask({"op": "decode", "ids": prompts, "new": new})["s"]
            return {F32: fgc_run(F32), Q4: fgc_run(Q4), Q4ORT: fgc_run(Q4ORT),
                    GENAI: genai_run}

        rows = []
        for batch in args.batches:
            runs = decode_runs(np.random.default_rng(batch).integers(
                0, ls.SIZES["V"], (batch, args.prompt)).tolist())
            for run in runs.values():
                run()
            med, rounds = ls.alternate(runs, *decode_plan)
            rate = {k: batch * new / s for k, s in med.items()}
            ratio = {k: ls.paired(rounds, k, GENAI) for k in (Q4, Q4ORT)}
            speedup = ls.paired(rounds, Q4, F32)
            rows.append((batch, rate, ratio, speedup))
            ls.log(f"B={batch}: " + ", ".join(f"{k} {v:.1f} tok/s" for k, v in rate.items())
                   + "; fgc int4 / builder int4 per round: " + ", ".join(
                       f"{p[GENAI] / p[Q4]:.2f}" for p in rounds))
        genai.close()

    load_after = os.getloadavg()[0]
    ls.log(f"whole run {time.perf_counter() - started:.0f} s; 1-minute load average "
           f"{load_before:.2f} before, {load_after:.2f} after")
    passes, _, reps = decode_plan
    lines = [f"The same Llama-style small ({', '.join(f'{k}={v}' for k, v in ls.SIZES.items())}"
             f"; {params / 1e6:.1f} M parameters, random weights), int4 against float32, CPU "
             f"({cpu_name()}, {os.cpu_count()} cores, {threads} threads; onnxruntime "
             f"{ort.__version__} CPUExecutionProvider, onnxruntime-genai "
             f"{genai.hello['version']} on the same library); 1-minute load average "
             f"{load_before:.2f} before the run, {load_after:.2f} after.", "",
             f"Greedy decoding, {new} new ids after a {args.prompt}-id prompt, tokens per "
             f"second (the prefill included), median of {passes * reps}; each ratio is the "
             f"median over the {passes * reps} rounds of the ratio within a round (each "
             "contender once, in rotated order):", "",
             "| batch | fgc float32 | fgc int4 | fgc int4, `--optimize ort` | builder int4 "
             "| fgc int4 / fgc float32 | fgc int4 / builder int4 | fgc int4 ort / builder "
             "int4 |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for batch, r, x, up in rows:
        lines.append(f"| {batch} | {r[F32]:.1f} | {r[Q4]:.1f} | {r[Q4ORT]:.1f} | "
                     f"{r[GENAI]:.1f} | {up:.2f}× | **{x[Q4]:.2f}×** | {x[Q4ORT]:.2f}× |")
    lines += ["", "Weights on disk (model.onnx and model.onnx.data); the prefill's last "
              f"logits (1 × {args.prefill} ids) as a distance from float32's and from the "
              "builder's (the norm of the difference over the norm of float32's centred "
              "logits); the emitting process (one run each; peak: its maximum resident set):",
              "", "| | weights on disk | logits: from float32 | from builder int4 | emit "
              "wall time | emit peak memory |", "|---|---:|---:|---:|---:|---:|"]
    for name in (F32, Q4, Q4ORT, GENAI):
        seconds, peak = emitted[name]
        lines.append(f"| {LABELS[name]} | {ls.mib(sizes[name])} | {from_f32[name]:.3f} | "
                     f"{from_builder[name]:.3f} | {seconds:.2f} s | {ls.mib(peak)} |")
    lines += ["", f"{identical} of fgc's {codes} int4 weight tensors hold the builder's bytes "
              "(fgc's gate and up products, one by their weights side by side: the builder's "
              "two, one after the other). "
              "The graphs: " + "; ".join(f"{LABELS[k]}, {graphs[k]}"
                                         for k in (Q4, Q4ORT, GENAI)) + "."]
    publish(MARK, lines, args.write_readme, after=AFTER)


if __name__ == "__main__":
    main()
