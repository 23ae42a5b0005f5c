"""Generation with the incremental (key/value cache) form, in both backends.

The compiler derives the incremental form from the IR (compiler/passes/incremental.py): which
attentions keep keys and values, and that nothing else mixes positions. These tests hold
it to the full model: run in pieces with a cache, every spec that has the form gives the
logits of one full run; greedy generation with the cache gives the ids of generation that
recomputes the whole prefix, in torch and in ONNX; and for released GPT-2 it gives the ids
of transformers' `generate` with the same weights.
"""

from __future__ import annotations

import importlib.util
import itertools
import json

import numpy as np
import pytest
from conftest import ROOT, fgc, peaked_weights, unpadded

from compiler.backends.onnx.lower import Lowerer
from compiler.elaborate.symbolic import Poly
from compiler.emit import compile_spec, prepare_output, write_onnx
from compiler.errors import FgcError
from compiler.passes.incremental import NotIncremental, derive
from compiler.pipeline import load
from compiler.weights import parameter_keys
from runtime import RuntimeError_, Sampler, generate
from runtime import load as load_onnx
from runtime.segments import read_signature

torch = pytest.importorskip("torch")

TOL = 1e-5

# (spec, --set values): every shipped spec with an autoregressive attention, tiny
CASES = {
    "gpt2": ("specs/gpt2.fgpt", dict(L=2, H=24, A=3, V=37, n=24)),
    "gpt1": ("specs/gpt1.fgpt", dict(L=2, H=16, A=2, V=29, n=20)),
    "formal_gpt3": ("specs/formal/gpt3.fgpt", dict(L=3, H=16, A=4, D=6, V=31, n=24, w=3)),
    "t_d": ("specs/t_d.fgpt", dict(L=2, H=8, A=2, V=11, n=16)),
    "transformer": ("specs/transformer.fgpt", dict(L=2, H=8, A=2, V=13, n=6, m=16)),
}
SOURCE = {"transformer": "x"}  # an encoder's input: the same at every step
# weights whose greedy runs are not one id repeated (tiny random post-norm models often are)
WEIGHT_SEED = {"transformer": 10}


def _import(path, tag: str):
    spec = importlib.util.spec_from_file_location(f"gen_{tag}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Per case: the torch module, with peaked random weights."""
    out = {}
    for name, (spec, sets) in CASES.items():
        d = tmp_path_factory.mktemp(name)
        compile_spec(spec, str(d / "torch"), "torch", sets=sets)
        model = _import(d / "torch" / "model.py", name).build().eval()
        torch.manual_seed(WEIGHT_SEED.get(name, len(name)))
        peaked_weights(model, norm_gain="gamma")
        out[name] = {"torch": model, "dir": d}
    return out


def _onnx(built, name: str, kv_cache: bool):
    """The case's ONNX graph (with or without the cache) holding the torch module's
    weights, loaded for the CPU provider."""
    entry = built[name]
    key = "kv" if kv_cache else "full"
    if key not in entry:
        path, sets = CASES[name]
        entry[key] = _onnx_with(entry["torch"], path, sets, entry["dir"] / key,
                                kv_cache=kv_cache)
    return entry[key]


def _onnx_with(module, path: str, sets: dict, folder, **options):
    """The spec at `sets` lowered to ONNX with the torch module's weights (Lowerer
    `options`), written to `folder` and loaded for the CPU provider."""
    spec = load(path)
    cfg = spec.configure(None, sets)
    state = module.state_dict()
    weights = {o: state[t].numpy() for t, o in parameter_keys(cfg)}
    graph, blobs = Lowerer(spec, spec.symbolic(), cfg.values, weights=weights,
                           **options).lower(stream=True)
    out = prepare_output(str(folder))
    write_onnx(graph, blobs, out, external=False)
    return load_onnx(out, provider="cpu")


def _in_pieces(model, ids: np.ndarray, fixed: dict) -> np.ndarray:
    """The logits of an incremental ONNX graph run on PIECES of `ids`, the presents of
    each call fed back as the next call's pasts."""
    cache = model.incremental["cache"]
    past = {c["past"]: np.zeros([ids.shape[0] if d == "batch" else 0 if d == "past" else d
                                 for d in c["dims"]], np.float32) for c in cache}
    parts = []
    for a, b in PIECES:
        feeds = {**fixed, model.incremental["tokens"]: ids[:, a:b], **past}
        values = model.session.run(["logits"] + [c["present"] for c in cache],
                                   unpadded(model.session, feeds))
        parts.append(values[0])
        past = {c["past"]: v for c, v in zip(cache, values[1:])}
    return np.concatenate(parts, 1)


def _tokens(name: str, batch: int, length: int, seed: int = 0) -> dict:
    spec, sets = CASES[name]
    g = torch.Generator().manual_seed(seed)
    out = {}
    if name in SOURCE:
        out[SOURCE[name]] = torch.randint(0, sets["V"], (batch, sets["n"] - 1), generator=g)
    out["ids"] = torch.randint(0, sets["V"], (batch, length), generator=g)
    return out


# ---------------------------------------------------------------- the analysis


def test_which_specs_have_an_incremental_form():
    found = {}
    for path in sorted((ROOT / "specs").rglob("*.fgpt")):
        sym = load(str(path)).symbolic()
        try:
            found[path.relative_to(ROOT).as_posix()] = derive(sym.model, sym.functions)
        except NotIncremental:
            pass
    assert set(found) == {"specs/gpt1.fgpt", "specs/gpt2.fgpt", "specs/formal/gpt.fgpt",
                          "specs/formal/gpt2.fgpt", "specs/formal/gpt3.fgpt", "specs/t_d.fgpt",
                          "specs/transformer.fgpt", "specs/llama.fgpt", "specs/mistral.fgpt",
                          "specs/qwen2.fgpt", "specs/qwen3.fgpt", "specs/gemma.fgpt",
                          "specs/phi3.fgpt", "specs/gpt_neox.fgpt", "specs/t5.fgpt",
                          "specs/mixtral.fgpt", "specs/granite.fgpt",
                          "specs/cohere.fgpt",
                          "specs/gemma2.fgpt", "specs/gemma3.fgpt",
                          "specs/olmo2.fgpt", "specs/qwen3_moe.fgpt"}
    # T5's decoder: its relative position bias plus Mask^AR is causal
    assert [s.path for s in found["specs/t5.fgpt"].sites] == [("dec_attn", "Attention^unscaled")]
    # grouped-query attention keeps its G key/value heads
    assert [s.heads for s in found["specs/llama.fgpt"].sites] == [Poly.sym("G")]
    assert [s.heads for s in found["specs/granite.fgpt"].sites] == [Poly.sym("G")]
    # the Transformer generates its target; its encoder's self-attention and the decoder's
    # cross-attention keep nothing
    tr = found["specs/transformer.fgpt"]
    assert (tr.tokens, tr.length) == ("y", "m")
    assert [s.path for s in tr.sites] == [("dec_self_attn", "Attention")]
    assert [s.path for s in found["specs/gpt2.fgpt"].sites] == [("attn", "Attention")]


def test_cache_dims_follow_the_key_and_value_types(tmp_path):
    """Keys of width Dk and values of width Dv: each cache tensor has its own, in the
    torch signature and in the ONNX graph."""
    spec = tmp_path / "kv.fgpt"
    spec.write_text("""
module SplitMH[A, Dk, Dv](X: R[n, H], Mask: R[n, n]) -> R[n, H] {
  SplitMH(X, Mask) = Concat(head_1, ..., head_A) @ W^O
    where head_i = Attention(X @ W_i^Q, X @ W_i^K, X @ W_i^V, Mask) for i in 1..A
  param W_i^Q: R[H, Dk] for i in 1..A
  param W_i^K: R[H, Dk] for i in 1..A
  param W_i^V: R[H, Dv] for i in 1..A
  param W^O: R[A * Dv, H]
}
model KV {
  hyper L = 2, H = 12, A = 3, Dk = 5, Dv = 7, V = 17, n = 10
  input x: {1..V}^n
  param W_e: R[V, H]
  param W_p: R[n, H]
  H^(0) = OneHot(x) @ W_e + W_p
  layers l in 1..L {
    H^(l) = attn: SplitMH[A, Dk, Dv](LN(H^(l-1)), Mask^AR) + H^(l-1)
  }
  output probs = Softmax(H^(L) @ W_e^T)
}
""")
    compile_spec(str(spec), str(tmp_path / "t"), "torch")
    compile_spec(str(spec), str(tmp_path / "o"), "onnx", kv_cache=True)
    module = _import(tmp_path / "t" / "model.py", "kv").build()
    assert module.signature()["incremental"]["cache"] == [  # one entry per site and kind
        {"past": f"past.{{l}}.{kind}", "present": f"present.{{l}}.{kind}", "kind": kind,
         "block": 1, "layers": 2, "dims": ["batch", 3, "past", 5 if kind == "key" else 7]}
        for kind in ("key", "value")]
    assert read_signature(module).incremental["cache"] == [  # expanded: one per tensor
        {"past": f"past.{k}.{kind}", "present": f"present.{k}.{kind}", "layer": k + 1,
         "kind": kind, "dims": ["batch", 3, "past", 5 if kind == "key" else 7]}
        for k in range(2) for kind in ("key", "value")]
    m = load_onnx(tmp_path / "o", provider="cpu")
    dims = {i.name: i.shape for i in m.session.get_inputs()}
    assert dims["past.1.key"] == ["batch", 3, "past", 5]
    assert dims["past.1.value"] == ["batch", 3, "past", 7]
    outs = {o.name: o.shape for o in m.session.get_outputs()}
    assert outs["present.0.value"] == ["batch", 3, "past+T", 7]
    assert [c["past"] for c in m.incremental["cache"]] == [
        "past.0.key", "past.0.value", "past.1.key", "past.1.value"]


MIXING = {
    # a mean over the positions: position 1's output would change with every new token
    "mean over positions": ("  Z = H^(L) - mean(H^(L)^T)^T\n", "Z"),
    # attention over every position, without a causal mask
    "bidirectional": ("  Z = MH[A, D](H^(L), Mask^BD) + H^(L)\n", "Z"),
}


@pytest.mark.parametrize("case", sorted(MIXING))
def test_a_spec_that_mixes_positions_has_no_incremental_form(tmp_path, case):
    extra, out = MIXING[case]
    spec = tmp_path / "mix.fgpt"
    spec.write_text(f"""model Mix {{
  hyper L = 1, H = 8, A = 2, D = H / A, V = 11, n = 6
  input x: {{1..V}}^n
  param W_e: R[V, H]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {{
    H^(l) = MH[A, D](H^(l-1), Mask^AR) + H^(l-1)
  }}
{extra}  output probs = Softmax({out} @ W_e^T)
}}
""")
    with pytest.raises(FgcError) as err:
        compile_spec(str(spec), str(tmp_path / "o"), "onnx", kv_cache=True)
    d = err.value.diagnostics[0]
    assert "no incremental form" in d.message and d.span is not None
    assert d.span.line == 9  # the line that mixes them
    r = fgc("compile", str(spec), "--target", "onnx", "--kv-cache", "-o", str(tmp_path / "c"))
    assert r.returncode == 1 and "mix.fgpt:9" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "c" / "model.onnx").exists()


def test_kv_cache_of_a_model_that_is_not_autoregressive_is_an_error(tmp_path):
    r = fgc("compile", "specs/bert.fgpt", "--target", "onnx", "--kv-cache", "--set", "L=1",
            "--set", "H=8", "--set", "A=2", "--set", "V=11", "-o", str(tmp_path / "o"))
    assert r.returncode == 1
    assert "no incremental form" in r.stderr and "bert.fgpt" in r.stderr


# ---------------------------------------------------------------- pieces == one run


PIECES = [(0, 5), (5, 9), (9, 10), (10, 11), (11, 12)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_step_by_step_equals_one_run(built, name):
    model = built[name]["torch"]
    t = _tokens(name, 3, PIECES[-1][1])
    ids, src = t["ids"], [t[SOURCE[name]]] if name in SOURCE else []
    with torch.no_grad():
        full = model.logits(*src, ids)
        past, parts = None, []
        for a, b in PIECES:
            logits, past = model.step(*src, ids[:, a:b], past=past)
            parts.append(logits)
    assert (torch.cat(parts, 1) - full).abs().max().item() <= TOL
    sites = model.cache_sites()
    assert len(past) == len(sites) and all(k.shape[-2] == PIECES[-1][1] for k, _ in past)
    assert all(site.cache is None for site in sites)  # nothing left behind


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_step_by_step_equals_one_run(built, name):
    full_model, inc = _onnx(built, name, False), _onnx(built, name, True)
    t = _tokens(name, 2, PIECES[-1][1])
    ids = t["ids"].numpy()
    fixed = {SOURCE[name]: t[SOURCE[name]].numpy()} if name in SOURCE else {}
    full = full_model.session.run(["logits"], unpadded(full_model.session, {
        **fixed, inc.incremental["tokens"]: ids}))[0]
    assert np.abs(_in_pieces(inc, ids, fixed) - full).max() <= TOL
    # the same weights as the torch module: the backends agree too
    src = [t[SOURCE[name]]] if name in SOURCE else []
    with torch.no_grad():
        ref = built[name]["torch"].logits(*src, t["ids"]).numpy()
    assert np.abs(full - ref).max() <= 1e-4


# ---------------------------------------------------------------- generation


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_with_the_cache_equals_recomputing_the_prefix(built, name):
    t = _tokens(name, 2, 3, seed=5)
    fixed = {SOURCE[name]: t[SOURCE[name]].numpy()} if name in SOURCE else {}
    prompt = t["ids"].tolist()
    new = CASES[name][1]["m" if name == "transformer" else "n"] - 3
    ref = generate(built[name]["torch"], prompt, new, inputs=fixed, cache=False)
    assert generate(built[name]["torch"], prompt, new, inputs=fixed) == ref
    assert generate(_onnx(built, name, True), prompt, new, inputs=fixed) == ref
    assert generate(_onnx(built, name, False), prompt, new, inputs=fixed) == ref
    assert all(len(row) == new for row in ref)
    assert len({tuple(row) for row in ref}) > 1 or len(set(ref[0])) > 1  # not one id


def test_sampling_is_seeded_and_the_same_with_the_cache(built):
    model = built["gpt2"]["torch"]
    onnx_model = _onnx(built, "gpt2", True)
    prompt = [[1, 2, 3], [4, 5, 6]]
    kw = dict(temperature=1.3, top_k=8, top_p=0.9, seed=11)
    a = generate(model, prompt, 12, **kw)
    assert a == generate(model, prompt, 12, cache=False, **kw)
    assert a == generate(onnx_model, prompt, 12, **kw)
    assert a != generate(model, prompt, 12, **{**kw, "seed": 12})
    # top-k 1, and a top-p below the likeliest id's probability, are greedy
    greedy = generate(model, prompt, 12)
    assert generate(model, prompt, 12, top_k=1, seed=3) == greedy
    assert generate(model, prompt, 12, top_p=1e-6, seed=3) == greedy


def test_sampler_cuts():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    picks = {int(Sampler(top_k=2, seed=s)(logits)[0]) for s in range(200)}
    assert picks == {0, 1}
    picks = {int(Sampler(top_p=0.75, seed=s)(logits)[0]) for s in range(200)}
    assert picks == {0, 1}  # 0.5 falls short of 0.75, 0.5 + 0.3 reaches it: the rest are cut
    picks = [int(Sampler(temperature=1.0, seed=s)(logits)[0]) for s in range(4000)]
    freq = np.bincount(picks, minlength=4) / len(picks)
    assert np.abs(freq - [0.5, 0.3, 0.15, 0.05]).max() < 0.03
    with pytest.raises(RuntimeError_):
        Sampler(greedy=True, temperature=0.5)
    with pytest.raises(RuntimeError_):
        Sampler(top_p=1.5)


def test_stop_ids_and_max_length(built):
    model = built["gpt2"]["torch"]
    prompt = [[1, 2, 3]]
    (free,) = generate(model, prompt, 10)
    stop = free[3]
    (cut,) = generate(model, prompt, 10, stop=[stop])
    assert cut == free[:free.index(stop) + 1]
    (short,) = generate(model, prompt, 10, max_length=7)
    assert short == free[:4]
    with pytest.raises(RuntimeError_, match="exceed the model's 24 positions"):
        generate(model, prompt, 30)
    with pytest.raises(RuntimeError_, match="0..36"):
        generate(model, [[1, 99]], 3)


def test_generate_with_a_module_built_at_other_sizes(built):
    """build(L=3, n=40) of GPT-2's model.py compiled at n = 24: its signature() holds its
    own context and cache (3 layers), which generate reads: past the compiled 24 positions,
    the cache as the prefix recomputed and as the ONNX graph compiled at those sizes, and
    refused past its own 40."""
    path, sets = CASES["gpt2"]
    sizes = {"L": 3, "n": 40}
    model = _import(built["gpt2"]["dir"] / "torch" / "model.py", "gpt2_other").build(**sizes)
    model = model.eval()
    torch.manual_seed(7)
    peaked_weights(model, norm_gain="gamma")
    sig = read_signature(model)
    assert sig.max_length == {"T": 40}
    assert len(sig.incremental["cache"]) == 2 * len(model.cache_sites()) == 6
    prompt = [[1, 2, 3], [4, 5, 6]]
    ref = generate(model, prompt, 37, cache=False)
    assert generate(model, prompt, 37) == ref
    onnx_model = _onnx_with(model, path, {**sets, **sizes}, built["gpt2"]["dir"] / "other",
                            kv_cache=True)
    assert generate(onnx_model, prompt, 37) == ref
    assert len({tuple(row) for row in ref}) > 1 or len(set(ref[0])) > 1  # not one id
    with pytest.raises(RuntimeError_, match="exceed the model's 40 positions"):
        generate(model, prompt, 38)


# ---------------------------------------------------------------- against transformers


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import save_file
    cfg = transformers.GPT2Config(n_layer=2, n_embd=40, n_head=5, vocab_size=53,
                                  n_positions=32, bos_token_id=52, eos_token_id=52,
                                  attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    peaked_weights(hf)
    d = tmp_path_factory.mktemp("hf_gpt2")
    save_file({k: v.detach().clone().contiguous() for k, v in hf.state_dict().items()},
              str(d / "gpt2.safetensors"))
    return hf, d


def test_greedy_equals_transformers_generate(hf_gpt2):
    hf, d = hf_gpt2
    sets = dict(L=2, H=40, A=5, V=53, n=32)
    w = str(d / "gpt2.safetensors")
    compile_spec("specs/gpt2.fgpt", str(d / "t"), "torch", sets=sets, weights=w)
    compile_spec("specs/gpt2.fgpt", str(d / "o"), "onnx", sets=sets, weights=w, kv_cache=True)
    from safetensors.torch import load_file
    ours = _import(d / "t" / "model.py", "hf").build().eval()
    ours.load_state_dict(load_file(str(d / "t" / "weights.safetensors")))
    onnx_model = load_onnx(d / "o", provider="cpu")
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 52, (3, 4), generator=g)
    with torch.no_grad():
        ref = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20,
                          do_sample=False, pad_token_id=52, eos_token_id=None)
    expected = ref[:, 4:].tolist()
    assert len({t for row in expected for t in row}) > 3  # not one id repeated
    assert generate(ours, prompt.tolist(), 20) == expected
    assert generate(onnx_model, prompt.tolist(), 20) == expected


# ---------------------------------------------------------------- the command line


def test_fgc_generate_prints_the_ids_last(tmp_path):
    sets = list(itertools.chain.from_iterable(
        ("--set", f"{k}={v}") for k, v in CASES["gpt2"][1].items()))
    r = fgc("generate", "specs/gpt2.fgpt", *sets, "--prompt-ids", "1,2,3",
            "--max-new-tokens", "6", "--provider", "cpu")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("provider: CPUExecutionProvider")
    assert "incremental form" in r.stdout
    ids = [int(x) for x in lines[-1].split(",")]
    assert len(ids) == 6 and all(0 <= i < 37 for i in ids)
    # a compiled folder, with and without the cache: the same ids
    assert fgc("compile", "specs/gpt2.fgpt", *sets, "--target", "onnx", "--kv-cache", "-o",
               str(tmp_path / "kv")).returncode == 0
    r2 = fgc("generate", str(tmp_path / "kv"), "--prompt-ids", "1,2,3", "--max-new-tokens",
             "6", "--provider", "cpu", "--no-cache")
    assert r2.returncode == 0, r2.stderr
    assert r2.stdout.strip().splitlines()[-1] == lines[-1]
    meta = load_onnx(tmp_path / "kv", provider="cpu").incremental
    assert json.dumps(meta["cache"][0]["dims"]) == '["batch", 3, "past", 8]'


def test_fgc_generate_torch_folder_and_sampling(tmp_path):
    sets = list(itertools.chain.from_iterable(
        ("--set", f"{k}={v}") for k, v in CASES["t_d"][1].items()))
    assert fgc("compile", "specs/t_d.fgpt", *sets, "--target", "torch", "-o",
               str(tmp_path / "t")).returncode == 0
    args = ["generate", str(tmp_path / "t"), "--prompt-ids", "1,2;3,4", "--max-new-tokens",
            "5", "--temperature", "0.8", "--top-k", "4", "--seed", "7"]
    r = fgc(*args)
    assert r.returncode == 0, r.stderr
    assert "random weights" in r.stdout  # no weights.safetensors in the folder
    rows = r.stdout.strip().splitlines()[-2:]
    assert all(len(row.split(",")) == 5 for row in rows)


@pytest.mark.parametrize("args, message", [
    (["--prompt-ids", "1,x"], "not a comma-separated list"),
    (["--prompt-ids", "1,99"], "0..36"),
    (["--prompt-ids", "1", "--max-new-tokens", "40"], "exceed the model's 24 positions"),
    (["--prompt-ids", "1", "--greedy", "--top-k", "3"], "--greedy takes no"),
    (["--prompt-ids", "1", "--top-p", "2"], "top-p 2.0"),
])
def test_fgc_generate_bad_input(args, message):
    """(Prompts of different lengths: test_padding.py.)"""
    sets = list(itertools.chain.from_iterable(
        ("--set", f"{k}={v}") for k, v in CASES["gpt2"][1].items()))
    if "--max-new-tokens" not in args:
        args = [*args, "--max-new-tokens", "3"]
    r = fgc("generate", "specs/gpt2.fgpt", *sets, "--provider", "cpu", *args)
    assert r.returncode in (1, 2) and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("opset, optimize", [(18, None), (23, "ort")])
def test_onnx_variants_of_the_incremental_form(built, opset, optimize):
    """Opset 18 (attention as equations) and onnxruntime's fused operators: the same
    logits in pieces as the torch module in one run."""
    module = built["gpt2"]["torch"]
    model = _onnx_with(module, *CASES["gpt2"], built["gpt2"]["dir"] / f"v{opset}{optimize}",
                       opset=opset, optimize=optimize, kv_cache=True)
    # onnxruntime's GroupQueryAttention (--optimize ort) takes several new positions
    # after a past at batch 1 only: the runtime says so before it would fail
    batch = model.incremental.get("chunk_batch", 2)
    assert (batch == 1) == (optimize == "ort")
    ids = _tokens("gpt2", batch, PIECES[-1][1], seed=3)["ids"]
    with torch.no_grad():
        ref = module.logits(ids).numpy()
    assert np.abs(_in_pieces(model, ids.numpy(), {}) - ref).max() <= 1e-4
    if optimize == "ort":
        past = {c["past"]: np.zeros([2 if d == "batch" else 1 if d == "past" else d
                                     for d in c["dims"]], np.float32)
                for c in model.incremental["cache"]}
        with pytest.raises(RuntimeError_, match="only at batch 1"):
            model.check({"x": np.zeros((2, 3), np.int64), **past})


def test_text_example_with_a_trained_tokenizer():
    """examples/generate_text.py end to end, without downloads: a byte-level BPE trained
    on the bundled text, the model at a tiny size with random weights."""
    import subprocess
    import sys
    pytest.importorskip("tokenizers")
    r = subprocess.run([sys.executable, "examples/generate_text.py", "--train-tokenizer",
                        "examples/data/founding.txt", "--set", "L=1", "--set", "H=16", "--set",
                        "A=2", "--set", "n=32", "--prompt", "We the People",
                        "--max-new-tokens", "6", "--temperature", "1.0", "--seed", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("We the People")
    new = r.stderr.split("new ids:")[1].strip()
    assert len(json.loads(new)) == 6


def test_transformer_xl_generates_with_its_memory(tmp_path):
    """Transformer-XL has no key/value cache but its own state: one token per call with the
    memory the last call returned gives, while the memory holds every earlier position,
    the ids of recomputing the whole prefix in one segment; torch and ONNX agree."""
    sets = dict(n=16, m=16)
    compile_spec("specs/transformer_xl.fgpt", str(tmp_path / "t"), "torch", sets=sets)
    model = _import(tmp_path / "t" / "model.py", "txl").build().eval()
    torch.manual_seed(4)
    peaked_weights(model, norm_gain="gamma")
    onnx_model = _onnx_with(model, "specs/transformer_xl.fgpt", sets, tmp_path / "o")
    prompt = [[1, 2, 3, 4], [5, 6, 7, 8]]
    ref = generate(model, prompt, 12, cache=False)
    assert generate(model, prompt, 12) == ref
    assert generate(onnx_model, prompt, 12) == ref
    assert len({t for row in ref for t in row}) > 2


@pytest.mark.parametrize("name", ["gpt2", "transformer"])
def test_incremental_graph_passes_the_checker_and_strict_shape_inference(built, name):
    """The incremental graph passes ONNX's checker and strict shape inference, and the
    cache's declared shapes are the ones it computes: the present keys and values (batch,
    heads, past + T, D) from a past of 3 positions and 2 new tokens."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    _onnx(built, name, True)
    path = built[name]["dir"] / "kv" / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path))
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def size(d) -> int:  # the batch and every run length 2, the past 3
        return d.dim_value or (3 if d.dim_param == "past" else
                               5 if d.dim_param.startswith("past+") else 2)
    feed = {}
    for i in model.graph.input:
        shape = [size(d) for d in i.type.tensor_type.shape.dim]
        feed[i.name] = np.ones(shape, np.int64) if \
            i.type.tensor_type.elem_type == onnx.TensorProto.INT64 else np.zeros(shape, np.float32)
    ran = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    checked = 0
    for o in model.graph.output:
        if o.name.startswith("present."):
            dims = o.type.tensor_type.shape.dim
            assert dims[2].dim_param in ("past+T", "past+T_m"), dims
            assert list(ran[o.name].shape) == [size(d) for d in dims], o.name
            checked += 1
    assert checked == sum(i.name.startswith("past.") for i in model.graph.input) > 0


def test_runtime_checks_the_past_it_is_given(built):
    """runtime.Model.run with the incremental form: no past is the prompt; a past is
    checked against the graph's dims before onnxruntime sees it."""
    model = _onnx(built, "gpt2", True)
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    first = model.run({"x": ids})  # no past: the prefill form
    past = {c["past"]: first[c["present"]] for c in model.incremental["cache"]}
    nxt = model.run({"x": ids[:, :1], **past})
    assert nxt["present.0.key"].shape == (2, 3, 4, 8)
    with pytest.raises(RuntimeError_, match="give every past key"):
        model.run({"x": ids, "past.0.key": past["past.0.key"]})
    bad = dict(past, **{"past.1.value": past["past.1.value"][:, :, :2]})
    with pytest.raises(RuntimeError_, match="past.1.value has shape"):
        model.run({"x": ids[:, :1], **bad})
    with pytest.raises(RuntimeError_, match="exceed the model's 24"):
        model.run({"x": np.zeros((2, 22), np.int64), **past})


def test_a_hyperparameter_named_past_is_refused_with_the_cache(tmp_path):
    spec = tmp_path / "past.fgpt"
    spec.write_text((ROOT / "specs" / "t_d.fgpt").read_text().replace(
        "n = 8,", "n = 8, past = 3,"))
    r = fgc("compile", str(spec), "--target", "onnx", "--kv-cache", "-o", str(tmp_path / "o"))
    assert r.returncode == 1 and "named `past`" in r.stderr and "Traceback" not in r.stderr
    assert fgc("compile", str(spec), "--target", "onnx", "-o", str(tmp_path / "p")).returncode == 0
