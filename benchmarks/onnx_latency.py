"""ONNX latency on CPU: fgc's graphs of released GPT-2 small under onnxruntime, with peers.

One run, one set of weights (a seeded, randomly initialised transformers GPT2LMHeadModel,
imported into fgc through `weights=`), float32, the same thread count everywhere:

  * fgc's ONNX graph, standard and `optimize="ort"`, under onnxruntime's CPU provider;
  * (a) fgc's PyTorch backend, eager (`model.logits(x)` under `torch.inference_mode()`);
  * (b) the same GPT2LMHeadModel exported with `torch.onnx.export` at opsets 18 and 23,
    under exactly the same onnxruntime SessionOptions as fgc's graphs
    (ORT_ENABLE_ALL, `threads` intra-op threads, 1 inter-op thread, CPUExecutionProvider).

Every contender's logits are compared with transformers' eager logits before any timing
(the run stops if one differs by more than 1e-3). Each shape is timed in passes; in a
pass every contender (in rotated order) gets its own block of warm-up runs then timed runs,
so that one contender's idle threads (onnxruntime's spin, OpenMP's) are not billed to the
next; the median of all timed runs is reported. Also measured: start-up of the optimised
graph through fgc's runtime (first load, which optimises and writes the session cache,
against the second, which reads it), and how long `compile_spec(target="onnx",
weights=...)` takes next to just reading the weights file.

    python benchmarks/onnx_latency.py [--threads 2] [--quick] [--readme]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MARK = "onnx-latency"
SPEC = ROOT / "specs" / "gpt2.fgpt"
TOL = 1e-3  # max abs logit difference allowed between any contender and transformers
# (batch, length): (warm-up runs per block, timed runs per block), full and --quick
POINTS = {(1, 16): ((3, 10), (1, 5)), (8, 128): ((1, 3), (1, 2))}
PASSES = (3, 1)  # full, --quick
OPSETS = (18, 23)
STD, OPT, EAGER = "fgc ONNX, standard", "fgc ONNX, optimize=ort", "fgc PyTorch, eager"
OPT_FLAG = "ort"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def ort_session(path: Path, threads: int):
    """The one SessionOptions every ONNX contender runs under."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def opset_of(path: Path) -> int:
    import onnx
    proto = onnx.load(str(path), load_external_data=False)
    return next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))


def export_hf(hf, opset: int, path: Path) -> tuple[str | None, str]:
    """transformers' model as ONNX at `opset`: (exporter that worked or None, notes).

    The dynamo exporter (torch's default) is tried first when onnxscript is installed, then
    the TorchScript exporter (`dynamo=False`)."""
    import torch

    class Logits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, x):
            # An explicit all-ones mask: without one, transformers looks for packed
            # sequences in the position ids with torch.diff, which the TorchScript
            # exporter cannot lower. Same computation (causal attention, no padding).
            return self.model(input_ids=x, attention_mask=torch.ones_like(x),
                              use_cache=False).logits

    wrapper = Logits(hf).eval()  # eval: the exporter restores the wrapper's mode afterwards
    example = (torch.randint(0, hf.config.vocab_size, (2, 16)),)
    tries = []
    if importlib.util.find_spec("onnxscript") is not None:
        dim = torch.export.Dim.DYNAMIC
        tries.append(("dynamo", dict(dynamo=True, dynamic_shapes=({0: dim, 1: dim},))))
    else:
        tries.append(("dynamo", None))
    tries.append(("torchscript", dict(
        dynamo=False, dynamic_axes={"x": {0: "batch", 1: "T"}, "logits": {0: "batch", 1: "T"}})))
    notes = []
    for name, kwargs in tries:
        if kwargs is None:
            notes.append(f"{name}: needs onnxscript, not installed")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(wrapper, example, str(path), input_names=["x"],
                                  output_names=["logits"], opset_version=opset, **kwargs)
            got = opset_of(path)
            if got != opset:
                notes.append(f"{name}: wrote opset {got}, not {opset}")
                continue
            return name, "; ".join(notes)
        except Exception as e:  # noqa: BLE001 - any exporter failure is reported, not raised
            first = (str(e).strip().splitlines() or [""])[0][:160]
            notes.append(f"{name}: {type(e).__name__}: {first}")
        finally:
            hf.eval()
    return None, "; ".join(notes)


def load_fgc_torch(folder: Path):
    import torch  # noqa: F401 - the generated module needs it importable
    from safetensors.torch import load_file
    spec = importlib.util.spec_from_file_location("fgc_gpt2_onnx_latency", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build().eval()
    model.load_state_dict(load_file(folder / "weights.safetensors"))
    return model


def startup(folder: Path, threads: int, reps: int, feeds: dict) -> tuple[float, float, bool]:
    """fgc's runtime on the optimised graph: median first load (optimises, writes the cache
    in the user's cache folder) and second load (reads it); the cache, in a temporary
    cache folder of this run, is cleared between rounds."""
    from runtime import load
    from runtime.session import clear_cache
    firsts, seconds, cached = [], [], True
    previous = os.environ.get("XDG_CACHE_HOME")
    with tempfile.TemporaryDirectory() as home:
        os.environ["XDG_CACHE_HOME"] = home
        try:
            for _ in range(reps):
                clear_cache()
                t, m = timed(lambda: load(folder, provider="cpu", threads=threads, quiet=True))
                if m.cached:
                    raise SystemExit("fgc runtime: the first load found a cache already")
                firsts.append(t)
                m.run(feeds)
                del m
                t, m = timed(lambda: load(folder, provider="cpu", threads=threads, quiet=True))
                seconds.append(t)
                cached = cached and m.cached
                del m
        finally:
            if previous is None:
                os.environ.pop("XDG_CACHE_HOME", None)
            else:
                os.environ["XDG_CACHE_HOME"] = previous
    return statistics.median(firsts), statistics.median(seconds), cached


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--readme", action="store_true",
                    help=f"write the table into README.md's <!-- {MARK} --> block")
    args = ap.parse_args()
    threads, quick = args.threads, args.quick
    load_before, started = os.getloadavg()[0], time.perf_counter()
    if load_before > 0.5:
        log(f"warning: 1-minute load average {load_before:.2f}: other processes are using "
            "the CPU, timings will be noisy")

    import numpy as np
    import onnxruntime as ort
    import torch
    from readme import cpu_name, publish
    from safetensors.torch import save_file
    from transformers import GPT2Config, GPT2LMHeadModel

    from compiler.emit import compile_spec
    from compiler.weights import read_safetensors

    ort.set_default_logger_severity(3)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config()).eval()  # GPT-2 small, random weights
    vocab = hf.config.vocab_size
    emit_reps, startup_reps = (2, 1) if quick else (5, 3)

    with tempfile.TemporaryDirectory(prefix="fgc-onnx-latency-") as tmp_name:
        tmp = Path(tmp_name)
        weights = tmp / "gpt2.safetensors"
        # lm_head.weight is wte.weight (tied): left out, the importer would only ignore it
        save_file({k: v.contiguous().clone() for k, v in hf.state_dict().items()
                   if k != "lm_head.weight"}, str(weights))
        weights_mib = weights.stat().st_size / 2**20

        # -- emit time, and the part of it that is reading the weights file. The first call
        # in the process is reported apart: it also pays compile_spec's lazy imports (the
        # ONNX backend, onnx) and, after a spec or stdlib edit, the parse cache's miss.
        log("compiling (emit time) ...")

        def emit(optimize, out):
            return timed(lambda: compile_spec(str(SPEC), str(out), target="onnx",
                                              preset="small", weights=str(weights),
                                              optimize=optimize))[0]

        dirs = {STD: tmp / "onnx-std", OPT: tmp / "onnx-ort"}
        cold_s = emit(None, dirs[STD])
        emit(OPT_FLAG, dirs[OPT])
        emit_times = {STD: [], OPT: [], "read": []}
        for i in range(emit_reps):
            for key, optimize in ((STD, None), (OPT, OPT_FLAG)):
                out = tmp / f"emit-{i}"
                emit_times[key].append(emit(optimize, out))
                shutil.rmtree(out)
            emit_times["read"].append(timed(lambda: read_safetensors(str(weights)))[0])
        emit_s = {k: statistics.median(v) for k, v in emit_times.items()}
        read_s = emit_s["read"]
        fgc_opset = opset_of(dirs[STD] / "model.onnx")
        compile_spec(str(SPEC), str(tmp / "torch"), target="torch", preset="small",
                     weights=str(weights))
        ours = load_fgc_torch(tmp / "torch")

        # -- the peer: transformers exported to ONNX
        exported, export_notes = {}, {}
        for opset in OPSETS:
            log(f"exporting transformers' model at opset {opset} ...")
            path = tmp / f"hf-opset{opset}.onnx"
            exporter, notes = export_hf(hf, opset, path)
            export_notes[opset] = (exporter, notes)
            if exporter:
                exported[opset] = path
            log(f"  opset {opset}: {exporter or 'NOT EXPORTED'}" + (f" ({notes})" if notes
                                                                     else ""))

        # -- start-up of the optimised graph through fgc's runtime
        log("timing fgc runtime start-up ...")
        small = {"x": np.zeros((1, 4), dtype=np.int64)}
        first_s, second_s, cached = startup(dirs[OPT], threads, 1 if quick else startup_reps,
                                            small)

        # -- the contenders
        sessions = {STD: ort_session(dirs[STD] / "model.onnx", threads),
                    OPT: ort_session(dirs[OPT] / "model.onnx", threads)}
        for opset, path in exported.items():
            sessions[f"transformers ONNX, opset {opset}"] = ort_session(path, threads)

        def onnx_run(sess):
            return lambda x: sess.run(["logits"], {"x": x.numpy()})[0]

        def eager(x):
            with torch.inference_mode():
                return ours.logits(x).numpy()

        runs = {name: onnx_run(sess) for name, sess in sessions.items()}
        runs[EAGER] = eager
        peers = [k for k in runs if k.startswith("transformers")]

        results = {}  # (B, T) -> {name: median seconds}, max diff, timed runs
        passes = PASSES[quick]
        gen = torch.Generator().manual_seed(1)
        for (batch, length), (full, fast) in POINTS.items():
            warm, reps = fast if quick else full
            x = torch.randint(0, vocab, (batch, length), generator=gen)
            with torch.inference_mode():
                ref = hf(input_ids=x).logits.numpy()
            diffs = {name: float(np.abs(run(x) - ref).max()) for name, run in runs.items()}
            log(f"B={batch} T={length}: max |logit diff| vs transformers eager: " +
                ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
            bad = {k: v for k, v in diffs.items() if not v <= TOL}
            if bad:
                raise SystemExit(f"logits disagree (> {TOL}) at {batch} x {length}: {bad}; "
                                 "not timing different computations")
            times = {name: [] for name in runs}
            names = list(runs)
            for p in range(passes):
                for name in names[p % len(names):] + names[:p % len(names)]:
                    for _ in range(warm):
                        runs[name](x)
                    for _ in range(reps):
                        t0 = time.perf_counter()
                        runs[name](x)
                        times[name].append(time.perf_counter() - t0)
            med = {name: statistics.median(ts) for name, ts in times.items()}
            results[(batch, length)] = (med, max(diffs.values()), passes * reps)
            log(f"B={batch} T={length}: " + ", ".join(f"{k} {v * 1000:.1f} ms"
                                                      for k, v in med.items()))

    # -- report
    load_after = os.getloadavg()[0]
    log(f"whole run {time.perf_counter() - started:.0f} s; 1-minute load average "
        f"{load_before:.2f} before, {load_after:.2f} after")
    def ratio(slow: float | None, fast: float) -> str:
        return "n/a" if slow is None else f"{slow / fast:.2f}×"

    shapes = list(results)
    head = "| | " + " | ".join(f"{b} × {t}" for b, t in shapes) + " |"
    rule = "|---|" + "---:|" * len(shapes)
    labels = {STD: "fgc ONNX graph, standard (onnxruntime)",
              OPT: "fgc ONNX graph, `optimize=\"ort\"` (onnxruntime)",
              EAGER: "fgc PyTorch backend, eager"}
    for opset in OPSETS:
        labels[f"transformers ONNX, opset {opset}"] = (
            f"transformers GPT2LMHeadModel, `torch.onnx.export` opset {opset} (onnxruntime)")
    lines = [f"Released GPT-2 small, logits, float32, CPU ({cpu_name()}, {threads} "
             f"threads; onnxruntime {ort.__version__} ORT_ENABLE_ALL, {threads} intra-op / 1 "
             f"inter-op threads; torch {torch.__version__}); fgc's graphs are opset {fgc_opset}; "
             "median of " + " / ".join(f"{r[2]} ({b} × {t})" for (b, t), r in results.items())
             + ":", "", head, rule]
    order = [OPT, STD, EAGER] + [f"transformers ONNX, opset {o}" for o in OPSETS]
    for name in order:
        if name in runs:
            cells = [f"{results[s][0][name] * 1000:.1f} ms" for s in shapes]
        else:
            cells = ["not exported"] * len(shapes)
        lines.append(f"| {labels[name]} | " + " | ".join(cells) + " |")

    def best_peer(med):
        return min((med[p] for p in peers), default=None)

    def best_onnx(med):
        name = min((k for k in med if k != EAGER), key=med.get)
        short = {STD: "fgc standard", OPT: "fgc optimised"}.get(
            name, name.replace("transformers ONNX, ", "transformers "))
        return f"{med[EAGER] / med[name]:.2f}× ({short})"

    rows = [("**speed-up, fgc optimised over the best transformers export**",
             lambda m: f"**{ratio(best_peer(m), m[OPT])}**"),
            ("speed-up, fgc optimised over fgc PyTorch eager",
             lambda m: ratio(m[EAGER], m[OPT])),
            ("speed-up, fgc standard over the best transformers export",
             lambda m: ratio(best_peer(m), m[STD])),
            ("speed-up, fastest ONNX contender over PyTorch eager", best_onnx)]
    for label, fn in rows:
        lines.append(f"| {label} | " + " | ".join(fn(results[s][0]) for s in shapes) + " |")
    lines.append("| max abs logit difference, any contender vs transformers eager | " +
                 " | ".join(f"{results[s][1]:.1e}" for s in shapes) + " |")
    exports = "; ".join(
        f"opset {o}: " + (f"{export_notes[o][0]} exporter" if export_notes[o][0] else
                          "not exported") + (f" ({export_notes[o][1]})" if export_notes[o][1]
                                             else "") for o in OPSETS)
    lines += ["",
              f"transformers' exports: {exports}. The fgc graphs also output the probabilities "
              "(`GPT`); every contender is asked for the logits only. 1-minute load average "
              f"{load_before:.2f} before the run, {load_after:.2f} after "
              f"({os.cpu_count()} cores).",
              "",
              f"Start-up of the optimised graph through `runtime.load(folder, provider=\"cpu\")`"
              f": first load {first_s:.2f} s (onnxruntime optimises the graph and writes it "
              f"in the user's cache folder), second load {second_s:.2f} s (cache used: "
              f"{'yes' if cached else 'NO'}), {first_s / second_s:.1f}× faster.",
              "",
              f"Emit: `compile_spec(..., target=\"onnx\", preset=\"small\", weights=...)` takes "
              f"{emit_s[STD]:.2f} s (standard) and {emit_s[OPT]:.2f} s (`optimize=\"ort\"`), "
              f"median of {emit_reps} (the first call in the process, which also pays lazy "
              f"imports, took {cold_s:.2f} s); reading the {weights_mib:.0f} MiB weights file "
              f"alone (`read_safetensors`) takes {read_s:.2f} s, so emitting without weight "
              f"I/O takes {emit_s[STD] - read_s:.2f} s / {emit_s[OPT] - read_s:.2f} s."]
    publish(MARK, lines, args.readme)


if __name__ == "__main__":
    main()
