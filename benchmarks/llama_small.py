"""A Llama-style small model on CPU: fgc's ONNX graphs against onnxruntime-genai's model
builder and against transformers, on the same weights.

The model: transformers' LlamaForCausalLM with L=12, H=768, A=12, G=4 (grouped-query
attention), F=2048, V=32000, random weights (seeded), saved with `save_pretrained` (a
word-level tokenizer beside it: the builder wants one). From that one folder:

  * fgc: `fgc compile specs/llama.fgpt --set ... --weights FOLDER/model.safetensors
    --target onnx --kv-cache --last-position --outputs logits --external-data` (the logits
    alone, as generation reads them and the builder writes them; the weights in
    model.onnx.data, which onnxruntime maps rather than parses: the session is made 2-3
    times faster than from one 500 MB model.onnx), standard and `--optimize ort`, run by
    fgc's runtime (`runtime.load`, `runtime.generate`: what `fgc generate` does), and the
    ort graph once more loaded with `huge_pages=True` (`fgc generate --huge-pages`: the
    session's memory on 2 MiB pages, runtime/pages.py), to show what that costs at load
    and gains in decoding;
  * the peer: `python -m onnxruntime_genai.models.builder -i FOLDER -p fp32 -e cpu`, run by
    onnxruntime-genai (`og.Generator`, greedy);
  * transformers: the LlamaForCausalLM itself, `generate(do_sample=False)`, PyTorch eager.

Measured in one run, the contenders alternating (each pass gives every contender, in
rotated order, its own block of warm-up and timed runs), medians reported; a speed-up
is the median over rounds of the ratio within each round (every contender ran once, one
after the other, within seconds, while a shared machine's speed drifts over minutes).
Decoding, fgc's two graphs and the builder's each run in a worker process of their own,
new ones for every pass: a process keeps one speed for its life, and the same graph runs
a few per cent faster or slower in another process (where its memory lies), so each
contender is measured in as many processes as there are passes:

  * decoding: tokens per second of greedy generation of N new ids after a P-id prompt
    (prompt included in the time), at batch 1 and 4; the new ids of all must agree;
  * prefill: one forward pass over a 1 x 128 prompt as generation starts, the last
    position's logits and the key/value cache, each contender as it prefills for
    generation (fgc's graphs, compiled with `--last-position`, through their onnxruntime
    session; the builder's graph, which computes every position's logits, through
    `append_tokens`; transformers' `model(input_ids, use_cache=True, logits_to_keep=1)`,
    as its `generate` calls it); the last position's logits are compared with
    transformers';
  * the graphs alone: the decoding steps of fgc's two graphs (and the ort graph on huge
    pages) and of the builder's graph, all in one process, sharing onnxruntime's thread
    pool, step k of every graph before step k + 1 of any: what the graphs cost, without
    genai's loop or fgc's runtime around them, and without the drift that separates two
    processes (several processes, each making the sessions in another order);
  * emit: wall time and peak memory (the process's maximum resident set) of `fgc compile`
    and of the builder, each as a whole process as a user runs it.

One thread count everywhere (`--threads`, default 2): onnxruntime's intra-op threads for
fgc and genai, torch's threads for transformers. Every table names the CPU.

Setup. onnxruntime-genai depends on the CPU `onnxruntime` wheel, whose files would
overwrite onnxruntime-gpu's in this environment; the benchmark therefore never installs it
into the environment. On first use it runs
    python -m pip install --no-deps --target ~/.cache/fgc/benchmarks/genai-0.18.0 \\
        onnxruntime-genai==0.18.0 onnx-ir==1.1.0
(onnx-ir: the builder needs it) and runs the builder and genai in subprocesses with that
folder on PYTHONPATH. genai's native library loads the environment's own onnxruntime
library (onnxruntime-gpu's libonnxruntime.so, CPU provider). Offline, install the same
wheels into a folder elsewhere and pass it with `--genai-site DIR`.

    python benchmarks/llama_small.py [--threads 2] [--quick] [--write-readme]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MARK = "llama-small"
AFTER = "onnx-latency"  # where the block goes when README lacks it
SPEC = ROOT / "specs" / "llama.fgpt"
SIZES = {"L": 12, "H": 768, "A": 12, "G": 4, "F": 2048, "V": 32000}
GENAI_VERSION = "0.18.0"
GENAI_PINS = (f"onnxruntime-genai=={GENAI_VERSION}", "onnx-ir==1.1.0")
STD, OPT, GENAI, HF = "fgc", "fgc ort", "genai", "transformers"
OPTHP = "fgc ort huge"  # the ort graph again, loaded with huge_pages=True (runtime/pages.py)
LABELS = {STD: "fgc ONNX, standard", OPT: "fgc ONNX, `--optimize ort`",
          GENAI: f"onnxruntime-genai {GENAI_VERSION} model builder",
          HF: "transformers"}
CLI = "import sys; from compiler.cli import main; sys.exit(main())"
TOL = 1e-3  # max abs difference allowed between any prefill's last logits and transformers'
COMPILE_TRIES, COMPILE_WAIT_S = 5, 30  # the compiler is edited concurrently: retry, not fail
REPLY = "@@ "  # the genai worker's protocol lines on its stdout; anything else is its noise


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- onnxruntime-genai, apart


def genai_site(given: str | None) -> Path:
    """A folder holding onnxruntime-genai and onnx-ir (no onnxruntime), installed on first
    use; the environment itself is never touched."""
    from runtime.files import cache_home
    site = Path(given) if given else cache_home() / "benchmarks" / f"genai-{GENAI_VERSION}"
    if not (site / "onnxruntime_genai").is_dir() or not (site / "onnx_ir").is_dir():
        if given:
            raise SystemExit(f"--genai-site {site}: no onnxruntime_genai and onnx_ir there")
        log(f"installing {' '.join(GENAI_PINS)} into {site} (--no-deps: not into this "
            "environment, whose onnxruntime-gpu the CPU onnxruntime wheel would overwrite)")
        site.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".genai-", dir=site.parent))
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps",
                               "--disable-pip-version-check", "--target", str(stage),
                               *GENAI_PINS], capture_output=True, text=True)
        if done.returncode != 0:
            shutil.rmtree(stage, ignore_errors=True)
            tail = "\n".join(done.stderr.strip().splitlines()[-3:])
            raise SystemExit(
                f"could not install {' '.join(GENAI_PINS)} (offline?):\n{tail}\n"
                "On a machine with the network: `pip download --no-deps -d WHEELS "
                f"{' '.join(GENAI_PINS)}`; here: `{sys.executable} -m pip install --no-deps "
                "--target DIR WHEELS/*.whl`, then pass `--genai-site DIR`.")
        shutil.rmtree(site, ignore_errors=True)
        stage.rename(site)
    if (site / "onnxruntime").exists():
        raise SystemExit(f"{site} holds an `onnxruntime` package: it would shadow this "
                         "environment's onnxruntime-gpu; remove it (only --no-deps installs)")
    return site


def genai_env(site: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def genai_worker(folder: str, threads: int) -> None:
    """The subprocess that runs the builder's model with onnxruntime-genai: one JSON request
    per stdin line, one `@@ {...}` reply per request on stdout; times taken here."""
    import numpy as np
    import onnxruntime
    import onnxruntime_genai as og

    t0 = time.perf_counter()
    config = og.Config(folder)
    config.clear_providers()  # the CPU provider
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
    model = og.Model(config)
    loaded = time.perf_counter() - t0

    def reply(obj: dict) -> None:
        print(REPLY + json.dumps(obj), flush=True)

    reply({"version": og.__version__, "onnxruntime": onnxruntime.__file__,
           "library": os.environ.get("ORT_LIB_PATH", "?"), "load": loaded})
    for line in sys.stdin:
        req = json.loads(line)
        ids = np.asarray(req["ids"], dtype=np.int32)
        batch, prompt = ids.shape
        new = req.get("new", 0)
        t0 = time.perf_counter()
        params = og.GeneratorParams(model)
        # min_length: all N ids even where the end-of-sequence id would come first (the
        # others run with no stop id); the ids check shows it if that changed a pick
        params.set_search_options(max_length=prompt + max(new, 1), min_length=prompt + new,
                                  do_sample=False, batch_size=batch)
        generator = og.Generator(model, params)
        generator.append_tokens(ids)
        if req["op"] == "prefill":
            seconds = time.perf_counter() - t0
            logits = np.asarray(generator.get_logits(), dtype=np.float32).reshape(batch, -1)
            np.save(req["save"], logits)
            reply({"s": seconds})
            continue
        while not generator.is_done():
            generator.generate_next_token()
        out = [list(map(int, generator.get_sequence(b)))[prompt:] for b in range(batch)]
        reply({"s": time.perf_counter() - t0, "ids": out})


def fgc_worker(folder: str, threads: int) -> None:
    """The subprocess that decodes with one of fgc's graphs (`runtime.load`,
    `runtime.generate`), in the genai worker's protocol; times taken here."""
    import onnxruntime  # noqa: F401 - imported before the clock starts, as genai's worker does

    from runtime import generate, load

    t0 = time.perf_counter()
    model = load(folder, provider="cpu", threads=threads, cache=False, quiet=True)
    print(REPLY + json.dumps({"provider": model.provider, "load": time.perf_counter() - t0,
                              "huge": model.huge_pages}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        t0 = time.perf_counter()
        out = generate(model, req["ids"], req["new"])
        print(REPLY + json.dumps({"s": time.perf_counter() - t0, "ids": out}), flush=True)


# ---------------------------------------------------------------- the graphs alone


class Graph:
    """How a decoding step feeds one graph, read from fgc's signature (its metadata) or
    from the builder's genai_config.json: the token and mask inputs, the (past, present)
    pairs and their shape, whether past and present share one buffer, the logits."""

    def __init__(self, folder: Path):
        from runtime.session import check_model_file
        from runtime.signature import from_metadata
        self.path = folder / "model.onnx"
        sig = from_metadata(check_model_file(self.path).metadata)
        if sig is not None:
            inc = sig.incremental
            self.tokens, self.logits = inc["tokens"], sig.logits["name"]
            self.mask = next(i["name"] for i in sig.inputs if i.get("pad"))
            self.pairs = [(c["past"], c["present"]) for c in inc["cache"]]
            self.heads, self.width = inc["cache"][0]["dims"][1], inc["cache"][0]["dims"][3]
            self.shared = bool(inc.get("share_buffer"))
            return
        config = json.loads((folder / "genai_config.json").read_text())
        dec, search = config["model"]["decoder"], config["search"]
        self.tokens, self.mask = dec["inputs"]["input_ids"], dec["inputs"]["attention_mask"]
        self.logits = dec["outputs"]["logits"]
        self.pairs = [(dec["inputs"][f"past_{k}_names"] % layer,
                       dec["outputs"][f"present_{k}_names"] % layer)
                      for layer in range(dec["num_hidden_layers"]) for k in ("key", "value")]
        self.heads, self.width = dec["num_key_value_heads"], dec["head_size"]
        self.shared = bool(search["past_present_share_buffer"])


def step_worker(request: str, threads: int) -> None:
    """The subprocess that times the graphs alone, one decoding step at a time: every
    graph in a session of this one process, all sharing onnxruntime's global thread pool
    (a pool per session would keep its threads spinning while another session runs),
    step k of every graph before step k + 1 of any, each step timed from binding its
    token to the argmax of its logits. A throwaway session is made first: the first
    session a process makes runs its steps 2-3 % slower, whatever graph it holds."""
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.capi import _pybind_state

    from runtime.pages import onto_huge_pages
    req = json.loads(request)
    ort.set_default_logger_severity(3)
    # (onnxruntime's process-wide pool, set before any session is made; its Python binding
    # has no public name for it)
    _pybind_state.set_global_thread_pool_sizes(threads, 1)

    def session(path: Path):
        opts = ort.SessionOptions()
        opts.use_per_session_threads = False
        opts.inter_op_num_threads = 1
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    graphs = [Graph(Path(g["folder"])) for g in req["graphs"]]
    throwaway = session(graphs[0].path)  # noqa: F841 - kept, idle
    sessions = []
    for graph, g in zip(graphs, req["graphs"]):
        if g["huge"]:
            with onto_huge_pages():
                sessions.append(session(graph.path))
        else:
            sessions.append(session(graph.path))
    batch, prompt, new, room = req["batch"], req["prompt"], req["new"], req["prompt"] + req["new"]
    ones = np.ones(batch * room, np.int64)
    rounds, same = [], True
    for r in range(req["rounds"]):
        ids = np.random.default_rng([batch, r]).integers(0, SIZES["V"], (batch, prompt))
        state = []
        for graph, sess in zip(graphs, sessions):  # the prompt, untimed
            bind = sess.io_binding()
            for past, present in graph.pairs:
                if graph.shared:
                    value = ort.OrtValue.ortvalue_from_numpy(
                        np.zeros((batch, graph.heads, room, graph.width), np.float32))
                    bind.bind_ortvalue_input(past, value)
                    bind.bind_ortvalue_output(present, value)
                else:
                    bind.bind_cpu_input(past, np.zeros((batch, graph.heads, 0, graph.width),
                                                       np.float32))
                    bind.bind_output(present)
            bind.bind_cpu_input(graph.tokens, ids)
            bind.bind_cpu_input(graph.mask, ones[:batch * prompt].reshape(batch, prompt))
            bind.bind_output(graph.logits)
            sess.run_with_iobinding(bind)
            outs = bind.get_outputs()
            pasts = None if graph.shared else outs[:len(graph.pairs)]
            picked = outs[-1].numpy()[:, -1].argmax(-1)
            logits = np.empty((batch, 1, SIZES["V"]), np.float32)
            bind.bind_ortvalue_output(graph.logits, ort.OrtValue.ortvalue_from_numpy(logits))
            state.append([bind, pasts, logits, picked])
        seconds = [0.0] * len(graphs)
        for k in range(new):
            order = range(len(graphs)) if (k + r) % 2 == 0 else reversed(range(len(graphs)))
            for j in order:
                graph, sess, (bind, pasts, logits, picked) = graphs[j], sessions[j], state[j]
                t0 = time.perf_counter()
                bind.bind_cpu_input(graph.tokens, picked[:, None].astype(np.int64))
                width = prompt + k + 1
                bind.bind_cpu_input(graph.mask, ones[:batch * width].reshape(batch, width))
                if pasts is not None:  # the last step's presents: this one's pasts
                    for (past, present), value in zip(graph.pairs, pasts):
                        bind.bind_ortvalue_input(past, value)
                        bind.bind_output(present)
                sess.run_with_iobinding(bind)
                if pasts is not None:
                    state[j][1] = bind.get_outputs()[:len(graph.pairs)]
                state[j][3] = logits[:, -1].argmax(-1)
                seconds[j] += time.perf_counter() - t0
            same &= all((s[3] == state[0][3]).all() for s in state)
        rounds.append([t / new for t in seconds])
    print(REPLY + json.dumps({"rounds": rounds, "same": bool(same)}), flush=True)


def graph_steps(folders: dict[str, Path], huge: tuple[str, str], threads: int, batch: int,
                prompt: int, new: int, passes: int, rounds: int
                ) -> tuple[list[dict[str, float]], bool]:
    """Each round's seconds per step of every graph, and `huge` = (name, of): a second
    session of graph `of` on huge pages; from `passes` worker processes, each making the
    sessions in another order; and whether all picked the same ids."""
    names = list(folders) + [huge[0]]
    out, same = [], True
    for p in range(passes):
        order = names[p % len(names):] + names[:p % len(names)]
        graphs = [{"folder": str(folders[huge[1] if n == huge[0] else n]),
                   "huge": n == huge[0]} for n in order]
        request = json.dumps({"graphs": graphs, "batch": batch, "prompt": prompt,
                              "new": new, "rounds": rounds})
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--step-worker",
                               request, "--threads", str(threads)], capture_output=True,
                              text=True, cwd=str(ROOT))
        reply = next((json.loads(line[len(REPLY):]) for line in done.stdout.splitlines()
                      if line.startswith(REPLY)), None)
        if reply is None:
            raise SystemExit(f"the step worker stopped (exit {done.returncode}):\n"
                             + "\n".join(done.stderr.strip().splitlines()[-6:]))
        out += [dict(zip(order, seconds)) for seconds in reply["rounds"]]
        same &= reply["same"]
    return out, same


class Worker:
    """A worker process seen from here: `ask(request)` answers its reply."""

    def __init__(self, flag: str, folder: Path, threads: int, env: dict | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), flag, str(folder),
             "--threads", str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env=env, cwd=str(ROOT))
        self.hello = self._read()

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                return json.loads(line[len(REPLY):])
        raise SystemExit(f"a worker stopped (exit {self.proc.wait()}): {self.proc.args}")

    def ask(self, req: dict) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


class Genai(Worker):
    """The genai worker: `ask({"op": "decode" | "prefill", ...})`."""

    def __init__(self, site: Path, folder: Path, threads: int):
        super().__init__("--genai-worker", folder, threads, genai_env(site))
        if not self.hello["onnxruntime"].startswith(sys.prefix):
            raise SystemExit(f"genai imported onnxruntime from {self.hello['onnxruntime']}, "
                             f"not from this environment ({sys.prefix})")


# ---------------------------------------------------------------- emitting, as processes


# A small process starts each emitting one and reads its resource usage: a child forked
# from this one would count this process's own memory (the model, torch) as its peak, which
# Linux takes from the forking process's address space when the child execs.
LAUNCHER = """import os, subprocess, sys, time
t0 = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=sys.stderr)
_, status, usage = os.wait4(proc.pid, 0)
print(time.perf_counter() - t0, usage.ru_maxrss * 1024, os.waitstatus_to_exitcode(status))
"""


def run_process(cmd: list[str], env: dict | None = None) -> tuple[float, int, int, str]:
    """(wall seconds, peak resident set in bytes, exit status, output tail) of `cmd`."""
    with tempfile.TemporaryFile("w+") as out:
        done = subprocess.run([sys.executable, "-c", LAUNCHER, *cmd], stdout=subprocess.PIPE,
                              stderr=out, env=env, cwd=str(ROOT), text=True)
        out.seek(0)
        tail = "\n".join(out.read().strip().splitlines()[-6:])
    try:
        seconds, peak, rc = done.stdout.split()
    except ValueError:
        return 0.0, 0, done.returncode or 1, tail
    return float(seconds), int(peak), int(rc), tail


def fgc_compile_cmd(weights: Path, out: Path, optimize: str | None) -> list[str]:
    sets = [a for k, v in SIZES.items() for a in ("--set", f"{k}={v}")]
    return ([sys.executable, "-c", CLI, "compile", str(SPEC), "--target", "onnx",
             "--kv-cache", "--last-position", "--outputs", "logits", "--external-data",
             "--weights", str(weights), "-o", str(out)]
            + sets
            + (["--optimize", optimize] if optimize else []))


def builder_cmd(hf: Path, out: Path, cache: Path) -> list[str]:
    return [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o",
            str(out), "-p", "fp32", "-e", "cpu", "-c", str(cache)]


def emit(name: str, cmd: list[str], env: dict | None = None,
         tries: int = 1) -> tuple[float, int]:
    """Runs one emitting command, retrying fgc's compile (other people edit the compiler
    while this runs: a failure may be theirs, half-way through an edit)."""
    for attempt in range(1, tries + 1):
        seconds, peak, rc, tail = run_process(cmd, env)
        if rc == 0:
            return seconds, peak
        log(f"{name} failed (exit {rc}, try {attempt} of {tries}):\n{tail}")
        if attempt < tries:
            time.sleep(COMPILE_WAIT_S)
    raise SystemExit(f"{name} failed {tries} times; command: {' '.join(cmd)}")


def graph_summary(folder: Path) -> str:
    """`N nodes: k × Op, ...` of folder/model.onnx, its most frequent operators first."""
    import collections

    import onnx
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    ops = collections.Counter(n.op_type for n in graph.node)
    return f"{len(graph.node)} nodes (" + ", ".join(
        f"{k} {v}" for k, v in ops.most_common(6)) + ", ...)"


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


# ---------------------------------------------------------------- the model and its folder


def make_model(folder: Path):
    """The seeded random LlamaForCausalLM, saved with a word-level tokenizer in `folder`."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=SIZES["L"], hidden_size=SIZES["H"],
                         num_attention_heads=SIZES["A"], num_key_value_heads=SIZES["G"],
                         intermediate_size=SIZES["F"], vocab_size=SIZES["V"],
                         max_position_embeddings=4096, rms_norm_eps=1e-5, rope_theta=10000.0,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(SIZES["V"])},
                                       unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t0",
                            bos_token="t1", eos_token="t2").save_pretrained(folder)
    if not (folder / "model.safetensors").is_file():
        raise SystemExit(f"save_pretrained wrote no single model.safetensors in {folder}")
    return model


# ---------------------------------------------------------------- timing


def alternate(runs: dict, passes: int, warm: int, reps: int, fresh=None
              ) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Median seconds of each run, and each round's own seconds: `passes` passes, in each
    every run (rotated order) is called `warm` times untimed, then `reps` rounds in which
    every run (rotated again) is timed once; a run returning a number of seconds (a worker
    times itself) is taken at its word. The runs of a round follow each other within
    seconds: a shared machine's speed drifts less between them than between blocks of one
    contender's runs. Each timed run starts after readme.settle()'s quiet. `fresh()`, where
    given, is called before each pass but the first (new worker processes)."""
    from readme import settle
    times: dict[str, list[float]] = {name: [] for name in runs}
    rounds: list[dict[str, float]] = []
    names = list(runs)
    for p in range(passes):
        if fresh is not None and p:
            fresh()
        for name in names[p % len(names):] + names[:p % len(names)]:
            for _ in range(warm):
                runs[name]()
        for r in range(reps):
            k = (p + r) % len(names)
            this: dict[str, float] = {}
            for name in names[k:] + names[:k]:
                settle()
                t0 = time.perf_counter()
                own = runs[name]()
                this[name] = own if isinstance(own, float) else time.perf_counter() - t0
                times[name].append(this[name])
            rounds.append(this)
    return {name: statistics.median(ts) for name, ts in times.items()}, rounds


def paired(rounds: list[dict[str, float]], a: str, b: str) -> float:
    """How many times faster `a` runs than `b`: the median over rounds of the ratio within
    each round, whose runs followed each other within seconds."""
    return statistics.median(p[b] / p[a] for p in rounds)


def spread(rounds: list[dict[str, float]], a: str, b: str) -> tuple[float, float]:
    """The first and third quartiles of the ratios `paired` takes the median of: how far a
    round's ratio strays on this machine."""
    ratios = [p[b] / p[a] for p in rounds]
    if len(ratios) < 2:  # --quick: one round
        return ratios[0], ratios[0]
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return q1, q3


def mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def decoding_arguments(doc: str, mark: str) -> argparse.ArgumentParser:
    """The command line of a decoding benchmark on this model (this one's, and
    benchmarks/quantize_decode.py's)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2,
                    help="onnxruntime intra-op / torch threads (default 2)")
    ap.add_argument("--quick", action="store_true",
                    help="fewer ids and repetitions, for trying the script")
    ap.add_argument("--prompt", type=int, default=16, help="decoding's prompt length P")
    ap.add_argument("--new", type=int, default=None, help="new ids N (default 64; 16 quick)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--prefill", type=int, default=128, help="prefill's prompt length")
    ap.add_argument("--genai-site", help="a folder with onnxruntime-genai and onnx-ir "
                    "installed (--no-deps); default: installed into fgc's cache folder")
    ap.add_argument("--write-readme", action="store_true",
                    help=f"write the tables into README.md's <!-- {mark} --> block")
    return ap


def main() -> None:
    ap = decoding_arguments(__doc__, MARK)
    ap.add_argument("--genai-worker", help=argparse.SUPPRESS)
    ap.add_argument("--fgc-worker", help=argparse.SUPPRESS)
    ap.add_argument("--step-worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.step_worker:
        return step_worker(args.step_worker, args.threads)
    if args.genai_worker:
        return genai_worker(args.genai_worker, args.threads)
    if args.fgc_worker:
        return fgc_worker(args.fgc_worker, args.threads)
    quick, threads = args.quick, args.threads
    new = args.new or (16 if quick else 64)
    # (passes, warm-up calls per block, timed calls per block)
    decode_plan, prefill_plan = ((1, 0, 1), (1, 1, 2)) if quick else ((8, 1, 2), (3, 1, 3))
    steps_plan = (1, 1) if quick else (8, 3)  # the graphs alone: (processes, rounds in each)
    emit_reps = 1 if quick else 3
    load_before, started = os.getloadavg()[0], time.perf_counter()
    if load_before > 0.5:
        log(f"warning: 1-minute load average {load_before:.2f}: other processes are using "
            "the CPU, timings will be noisy")

    site = genai_site(args.genai_site)
    import numpy as np
    import onnxruntime as ort
    import torch
    import transformers
    from readme import cpu_name, publish

    from runtime import load

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="fgc-llama-small-") as tmp_name:
        tmp = Path(tmp_name)
        hf_dir = tmp / "hf"
        log("making the random Llama and its folder ...")
        hf = make_model(hf_dir)
        weights = hf_dir / "model.safetensors"

        # -- emit: whole processes, alternating; the last output of each kept for the rest
        log("emitting (fgc compile, standard and --optimize ort; the model builder) ...")
        outs = {STD: tmp / "fgc-std", OPT: tmp / "fgc-ort", GENAI: tmp / "genai"}
        cmds = {STD: lambda o: fgc_compile_cmd(weights, o, None),
                OPT: lambda o: fgc_compile_cmd(weights, o, "ort"),
                GENAI: lambda o: builder_cmd(hf_dir, o, tmp / "builder-cache")}
        envs = {STD: None, OPT: None, GENAI: genai_env(site)}
        emitted: dict[str, list[tuple[float, int]]] = {k: [] for k in outs}
        for i in range(emit_reps):
            for name in list(outs)[i % 3:] + list(outs)[:i % 3]:
                shutil.rmtree(outs[name], ignore_errors=True)
                emitted[name].append(emit(LABELS[name], cmds[name](outs[name]), envs[name],
                                          COMPILE_TRIES if name != GENAI else 1))
        emit_s = {k: statistics.median(s for s, _ in v) for k, v in emitted.items()}
        emit_peak = {k: max(p for _, p in v) for k, v in emitted.items()}
        sizes = {k: folder_bytes(o) for k, o in outs.items()}
        graphs = {k: graph_summary(o) for k, o in outs.items()}
        log("emit: " + ", ".join(f"{k} {emit_s[k]:.2f} s, {mib(emit_peak[k])}" for k in outs))

        # -- the contenders
        fgc = {name: load(outs[name], provider="cpu", threads=threads, cache=False,
                          quiet=True, huge_pages=False) for name in (STD, OPT)}
        # fgc's defaults whatever this environment says, and the ort graph with huge pages
        small_pages, huge_pages = (dict(os.environ, FGC_HUGE_PAGES=v) for v in "01")
        loads: dict[str, list[float]] = {k: [] for k in (STD, OPT, OPTHP, GENAI)}
        collapsed: list[int] = []
        # decoding: each of fgc's graphs and the builder's in a worker process of its own,
        # new ones for every pass; a process keeps its speed for its life, which differs
        # from process to process (where its memory lies) by a few per cent
        workers: dict[str, Worker] = {}

        def fresh() -> None:
            for w in workers.values():
                w.close()
            workers.update({name: Worker("--fgc-worker", outs[name], threads, small_pages)
                            for name in (STD, OPT)})
            workers[OPTHP] = Worker("--fgc-worker", outs[OPT], threads, huge_pages)
            workers[GENAI] = Genai(site, outs[GENAI], threads)
            for name, w in workers.items():
                loads[name].append(w.hello["load"])
            collapsed.append(workers[OPTHP].hello["huge"])

        fresh()
        genai = workers[GENAI].hello
        log(f"genai {genai['version']} runs onnxruntime's library {genai['library']}")

        def hf_generate(x: np.ndarray, n: int) -> list[list[int]]:
            ids = torch.from_numpy(x)
            with torch.inference_mode():
                out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                  min_new_tokens=n, do_sample=False, pad_token_id=0,
                                  eos_token_id=None)
            return out[:, x.shape[1]:].tolist()

        def decode_runs(x: np.ndarray, last: dict) -> dict:
            """The four decoders on the prompts `x`, each keeping its new ids in `last`."""
            prompts = x.tolist()

            def worker_run(name):
                def run():
                    reply = workers[name].ask({"op": "decode", "ids": prompts, "new": new})
                    last[name] = reply["ids"]
                    return reply["s"]
                return run

            def hf_run():
                last[HF] = hf_generate(x, new)

            return {STD: worker_run(STD), OPT: worker_run(OPT), OPTHP: worker_run(OPTHP),
                    GENAI: worker_run(GENAI), HF: hf_run}

        decode_rows = []
        for batch in args.batches:
            x = np.random.default_rng(batch).integers(0, SIZES["V"], (batch, args.prompt))
            last: dict[str, list] = {}
            runs = decode_runs(x, last)
            if decode_rows:  # (the first batch's workers are new)
                fresh()
            for run in runs.values():  # the first call of each: warm-up, and the ids
                run()
            first = dict(last)
            med, rounds = alternate(runs, *decode_plan, fresh=fresh)
            same = all(ids == first[HF] for ids in list(first.values()) + list(last.values()))
            if not same:
                log(f"B={batch}: the new ids differ: " + ", ".join(
                    f"{k} {v[0][:8]}" for k, v in first.items()))
            rate = {k: batch * new / s for k, s in med.items()}
            speedup = {(a, b): paired(rounds, a, b) for a in (STD, OPT, OPTHP)
                       for b in (GENAI, HF)}
            speedup[OPTHP, OPT] = paired(rounds, OPTHP, OPT)
            quartiles = {a: spread(rounds, a, GENAI) for a in (STD, OPT, OPTHP)}
            decode_rows.append((batch, rate, speedup, same, quartiles))
            log(f"B={batch}: " + ", ".join(f"{k} {v:.1f} tok/s" for k, v in rate.items())
                + "; fgc / builder per round: " + ", ".join(
                    f"{p[GENAI] / p[STD]:.2f}" for p in rounds)
                + f"; same ids: {same}")

        # -- prefill: one forward pass, the last position's logits and the cache
        x = np.random.default_rng(7).integers(0, SIZES["V"], (1, args.prefill))
        with torch.inference_mode():
            ref = hf(input_ids=torch.from_numpy(x)).logits[:, -1].numpy()
        lastlog: dict[str, np.ndarray] = {}

        def fgc_prefill(name):
            model = fgc[name]
            feeds = model.check({model.incremental["tokens"]: x})  # empty pasts
            names = [model.signature.logits["name"]] + [
                c["present"] for c in model.incremental["cache"]]
            return lambda: lastlog.__setitem__(
                name, model.session.run(names, feeds)[0][:, -1])

        def hf_prefill():
            with torch.inference_mode():
                out = hf(input_ids=torch.from_numpy(x), use_cache=True, logits_to_keep=1)
            lastlog[HF] = out.logits[:, -1].numpy()

        saved = tmp / "genai-logits.npy"

        def genai_prefill():
            seconds = workers[GENAI].ask({"op": "prefill", "ids": x.tolist(),
                                          "save": str(saved)})["s"]
            lastlog[GENAI] = np.load(saved)
            return seconds

        runs = {STD: fgc_prefill(STD), OPT: fgc_prefill(OPT), GENAI: genai_prefill,
                HF: hf_prefill}
        for run in runs.values():
            run()
        diffs = {k: float(np.abs(v - ref).max()) for k, v in lastlog.items()}
        bad = {k: v for k, v in diffs.items() if not v <= TOL}
        if bad:
            raise SystemExit(f"prefill logits disagree with transformers' (> {TOL}): {bad}; "
                             "not timing different computations")
        pre, _ = alternate(runs, *prefill_plan)
        log(f"prefill 1 x {args.prefill}: " + ", ".join(
            f"{k} {v * 1000:.1f} ms (max |logit diff| {diffs[k]:.1e})" for k, v in pre.items()))
        for w in workers.values():
            w.close()

        # -- the graphs alone, step by step in one process
        step_rows = []
        for batch in args.batches:
            log(f"the graphs alone, batch {batch} ...")
            rounds, same = graph_steps({k: outs[k] for k in (STD, OPT, GENAI)}, (OPTHP, OPT),
                                       threads, batch, args.prompt, new, *steps_plan)
            step_rows.append((batch, rounds, same))
            log(f"B={batch}: " + ", ".join(
                f"{k} {statistics.median(r[k] for r in rounds) * 1000:.2f} ms"
                for k in rounds[0]) + f"; same ids: {same}")

    # -- report
    load_after = os.getloadavg()[0]
    log(f"whole run {time.perf_counter() - started:.0f} s; 1-minute load average "
        f"{load_before:.2f} before, {load_after:.2f} after")
    params = sum(p.numel() for p in hf.parameters())
    passes, _, reps = decode_plan
    machine = (f"{cpu_name()}, {os.cpu_count()} cores, {threads} threads; onnxruntime "
               f"{ort.__version__} CPUExecutionProvider, onnxruntime-genai "
               f"{genai['version']} on the same onnxruntime library; torch "
               f"{torch.__version__}, transformers {transformers.__version__}")
    lines = [f"Llama-style small ({', '.join(f'{k}={v}' for k, v in SIZES.items())}; "
             f"{params / 1e6:.1f} M parameters), random weights, float32, CPU ({machine}); "
             f"1-minute load average {load_before:.2f} before the run, {load_after:.2f} "
             "after.", "",
             f"Greedy decoding, {new} new ids after a {args.prompt}-id prompt, tokens per "
             f"second (the prompt's prefill included), median of {passes * reps}; each "
             f"ratio is the median over the {passes * reps} rounds of the ratio within a "
             "round (each contender once, in rotated order):",
             "",
             "| batch | fgc ONNX | fgc ONNX, `--optimize ort` | model builder + genai | "
             "transformers `generate` | fgc / builder | fgc ort / builder | "
             "fgc / transformers | fgc ort / transformers | same ids |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for batch, r, x, same, _ in decode_rows:
        lines.append(f"| {batch} | {r[STD]:.1f} | {r[OPT]:.1f} | {r[GENAI]:.1f} | {r[HF]:.1f} "
                     f"| **{x[STD, GENAI]:.2f}×** | **{x[OPT, GENAI]:.2f}×** | "
                     f"**{x[STD, HF]:.2f}×** | **{x[OPT, HF]:.2f}×** | "
                     f"{'yes' if same else 'NO'} |")
    lines += ["", "The ratios to the builder from round to round, first to third quartile: " +
              "; ".join(f"batch {batch}: fgc {q[STD][0]:.2f}–{q[STD][1]:.2f}, fgc ort "
                        f"{q[OPT][0]:.2f}–{q[OPT][1]:.2f}"
                        for batch, *_, q in decode_rows) + "."]
    load_s = {k: statistics.median(v) for k, v in loads.items()}
    lines += ["", "Loaded with `huge_pages=True` (`fgc generate --huge-pages`: the memory "
              "onnxruntime maps for the session, the packed weights, collapsed onto 2 MiB "
              f"pages, {mib(statistics.median(collapsed))}), the ort graph, a fifth contender "
              "in the same rounds: " +
              "; ".join(f"batch {batch}: {r[OPTHP]:.1f} tok/s, {x[OPTHP, GENAI]:.2f}× the "
                        f"builder (quartiles {q[OPTHP][0]:.2f}–{q[OPTHP][1]:.2f}), "
                        f"{x[OPTHP, OPT]:.2f}× the same graph on 4 KiB pages"
                        for batch, r, x, _, q in decode_rows) +
              f". Loading, median of {len(loads[OPT])} worker processes: fgc standard "
              f"{load_s[STD]:.2f} s, fgc ort {load_s[OPT]:.2f} s, fgc ort with huge pages "
              f"{load_s[OPTHP]:.2f} s (range {min(loads[OPTHP]):.2f}–{max(loads[OPTHP]):.2f} "
              f"s), the builder's graph in genai {load_s[GENAI]:.2f} s."]
    processes, reps = steps_plan
    alone = [STD, OPT, OPTHP]
    lines += ["", "The graphs alone, one decoding step (the same prompts and steps): every "
              "graph in an onnxruntime session of one process, all sessions sharing one "
              "thread pool, step k of every graph before step k + 1 of any, so that the "
              "machine's drift falls on all alike; neither genai's loop nor fgc's runtime "
              f"around them. Milliseconds per step, median of "
              f"{processes * reps} rounds in {processes} processes (each making the sessions "
              "in another order), and the builder's step over each graph's, the median of "
              "the ratios within a round (first to third quartile):", "",
              "| batch | fgc ONNX | fgc ONNX, `--optimize ort` | the same, huge pages | "
              "the builder's graph | builder / fgc | builder / fgc ort | "
              "builder / fgc ort, huge pages | same ids |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for batch, rounds, same in step_rows:
        ms = {k: statistics.median(r[k] for r in rounds) * 1000 for k in rounds[0]}
        ratio = {k: (paired(rounds, k, GENAI), *spread(rounds, k, GENAI)) for k in alone}
        lines.append(f"| {batch} | " + " | ".join(f"{ms[k]:.2f}" for k in alone + [GENAI])
                     + " | " + " | ".join(f"{m:.3f}× ({a:.3f}–{b:.3f})"
                                          for m, a, b in (ratio[k] for k in alone))
                     + f" | {'yes' if same else 'NO'} |")
    passes, _, reps = prefill_plan
    lines += ["", f"Prefill: one forward pass over 1 × {args.prefill} ids as generation "
              "starts, the last position's logits and the key/value cache (fgc's graphs "
              "compiled with `--last-position`, transformers given `logits_to_keep=1` as its "
              "`generate` does; the builder's graph computes every position's logits), "
              f"median of {passes * reps}:", "",
              "| | time | speed-up over transformers | max abs last-position logit "
              "difference vs transformers |", "|---|---:|---:|---:|"]
    what = {STD: "fgc ONNX, standard (onnxruntime session)",
            OPT: "fgc ONNX, `--optimize ort` (onnxruntime session)",
            GENAI: "model builder's graph (genai `append_tokens`)",
            HF: "transformers, PyTorch eager (`model(ids, use_cache=True, "
                "logits_to_keep=1)`)"}
    for name in (STD, OPT, GENAI, HF):
        lines.append(f"| {what[name]} | {pre[name] * 1000:.1f} ms | "
                     f"{pre[HF] / pre[name]:.2f}× | {diffs[name]:.1e} |")
    lines += ["", f"Emit from the saved folder, each a whole process (imports included), "
              f"median of {emit_reps}; peak memory is the process's maximum resident set:", "",
              "| | wall time | peak memory | written |", "|---|---:|---:|---:|"]
    what = {STD: "`fgc compile specs/llama.fgpt --target onnx --kv-cache --last-position "
                 "--outputs logits --external-data --weights ...`",
            OPT: "the same, `--optimize ort`",
            GENAI: "`python -m onnxruntime_genai.models.builder -p fp32 -e cpu`"}
    for name in (STD, OPT, GENAI):
        lines.append(f"| {what[name]} | {emit_s[name]:.2f} s | {mib(emit_peak[name])} | "
                     f"{mib(sizes[name])} |")
    for name, label in ((STD, "**builder / fgc, standard**"), (OPT, "builder / fgc, ort")):
        lines.append(f"| {label} | {emit_s[GENAI] / emit_s[name]:.2f}× | "
                     f"{emit_peak[GENAI] / emit_peak[name]:.2f}× | |")
    lines += ["", "The graphs: " + "; ".join(f"{LABELS[k]}, {graphs[k]}"
                                           for k in (STD, OPT, GENAI)) + "."]
    publish(MARK, lines, args.write_readme, after=AFTER)


if __name__ == "__main__":
    main()
