"""Rotary positions as intrinsics (compiler/lowering/rotary.py): RoPE, RoPE^partial,
RoPE^interleaved, RoPE^linear, RoPE^llama3 and RoPE^yarn, and logit soft-capping
(SoftCapping).

Each variant turns queries as transformers' own formula does (its inverse frequencies from
`ROPE_INIT_FUNCTIONS`, GPT-J's `rotate_every_two` for the interleaved convention), in the
PyTorch module's fused `rotary`, ONNX's RotaryEmbedding (opset 23), the equations (opset 18)
and onnxruntime's RotaryEmbedding (`--optimize ort`); Llama with Llama 3.1's, linear and
YaRN scaling gives transformers' probabilities and greedy generation; the released decoders'
logits agree across the three targets; the `--kv-cache` graph, stepped one token at a time,
gives the full recomputation's logits; and a width no convention turns is a located error.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, fgc, own_names, peaked_weights, set_args, tiny_sets, unpadded
from hf_parity import assert_greedy, assert_probabilities, module, tokens

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
safetensors_torch = pytest.importorskip("safetensors.torch")

from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

from compiler.elaborate.intrinsics import INTRINSICS  # noqa: E402
from compiler.lowering.rotary import Rotary, frequencies, magnitude  # noqa: E402

TARGETS = {"torch": ["--target", "torch"], "onnx": ["--target", "onnx"],
           "onnx18": ["--target", "onnx", "--opset", "18"],
           "ort": ["--target", "onnx", "--optimize", "ort"]}
# Llama 3.1's scaling at a context small enough for every kind of frequency: heads of 16 turn
# by wavelengths 2 pi * 10^(k/2), 6.3, 20, 63, ..., against n0 / high = 8 (kept below) and
# n0 / low = 32 (divided above), one of them in between (moved smoothly)
LLAMA3 = {"factor": 4.0, "low": 1.0, "high": 4.0, "n0": 32}
# YaRN's at a context of 32: heads of 16 keep their first frequencies (more than 4 turns
# over the 32 positions), divide their last by the factor (fewer than 1) and blend the
# ones between; beta_fast and beta_slow not the defaults, so that reading them matters
YARN = {"factor": 4.0, "n0": 32, "beta_fast": 4.0, "beta_slow": 0.5}


def _config(scaling: str, theta: float = 10000.0, D: int = 16):
    """A transformers config whose RoPE is this scaling, with our hyperparameters' values."""
    params = {"rope_type": "default" if scaling == "none" else scaling, "rope_theta": theta}
    if scaling == "linear":
        params["factor"] = 3.0
    if scaling == "llama3":
        params.update(factor=LLAMA3["factor"], low_freq_factor=LLAMA3["low"],
                      high_freq_factor=LLAMA3["high"],
                      original_max_position_embeddings=LLAMA3["n0"])
    if scaling == "yarn":
        params.update(factor=YARN["factor"], original_max_position_embeddings=YARN["n0"],
                      beta_fast=YARN["beta_fast"], beta_slow=YARN["beta_slow"])
    return transformers.LlamaConfig(hidden_size=2 * D, num_attention_heads=2,
                                    rope_parameters=params)


def _factors(scaling: str) -> tuple[float, ...]:
    if scaling == "llama3":
        return tuple(float(LLAMA3[k]) for k in ("factor", "low", "high", "n0"))
    if scaling == "yarn":
        return tuple(float(YARN[k]) for k in ("factor", "n0", "beta_fast", "beta_slow"))
    return (3.0,) if scaling == "linear" else ()


def _inv_freq(scaling: str, theta: float = 10000.0, D: int = 16):
    """transformers' inverse frequencies and attention scaling for this rope_type."""
    config = _config(scaling, theta, D)
    if scaling == "none":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[scaling](config, "cpu")


@pytest.mark.parametrize("scaling", ["none", "linear", "llama3", "yarn"])
@pytest.mark.parametrize("theta", [10000.0, 500000.0])
def test_frequencies_equal_transformers(scaling, theta, helpers):
    """The generated model's frequencies (torch) are transformers' inv_freq bit for bit,
    the ONNX lowering's (numpy, whose float32 power may round the other way) to within
    two units in the last place; cos and sin are scaled by transformers' attention factor
    (1.0 but for YaRN)."""
    want, scale = _inv_freq(scaling, theta)
    r = Rotary(16, False, theta, scaling, _factors(scaling))
    assert magnitude(r) == scale and (scale == 1.0) == (scaling != "yarn")
    got = frequencies(r)
    assert got.dtype == np.float32
    np.testing.assert_array_max_ulp(got, want.numpy(), maxulp=2)
    runtime = helpers.rotary_frequencies(16, theta, (scaling, *_factors(scaling))
                                         if scaling != "none" else None)
    assert torch.equal(runtime, want)


# ---------------------------------------------------------------- each variant, one module

TURN = """
model Turn {{
  hyper A = 2, D = 16, H = 6, V = 11, n = 12, theta = 10000.0, r = 4
  input x: {{1..V}}^n
  param W_e: R[V, H]
  param W_i: R[H, D] for i in 1..A
  X = OneHot(x) @ W_e
  h_i = {call}(X @ W_i) for i in 1..A
  output Y = Concat(h_1, ..., h_A)
}}
"""
VARIANTS = {
    "RoPE": ("RoPE", "none", False, None),
    "RoPE^partial": ("RoPE^partial", "none", False, 4),
    "RoPE^interleaved": ("RoPE^interleaved", "none", True, None),
    "RoPE^linear": ("RoPE^linear[factor = 3.0]", "linear", False, None),
    "RoPE^llama3": ("RoPE^llama3[theta = 10000.0, factor = 4.0, low = 1.0, high = 4.0, "
                    "n0 = 32]", "llama3", False, None),
    "RoPE^yarn": ("RoPE^yarn[factor = 4.0, n0 = 32, beta_fast = 4.0, beta_slow = 0.5]",
                  "yarn", False, None),
}


def _reference(X, scaling: str, interleaved: bool, width: int | None):
    """transformers' rotation of X (batch, heads, T, D) at positions 0..T-1: LlamaRotary's
    cos and sin for rotate-half (GPT-NeoX's over the first `width` features), GPT-J's
    for the interleaved convention."""
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama
    T, D = X.shape[-2], X.shape[-1]
    r = width or D
    inv_freq, scale = _inv_freq(scaling, D=r)
    angles = torch.arange(T).float()[:, None] * inv_freq[None, :]
    if interleaved:  # GPT-J's tables: sin and cos of each pair's angle, (B, T, r/2)
        sin, cos = angles.sin()[None], angles.cos()[None]
        return gptj(X.transpose(1, 2), sin * scale, cos * scale).transpose(1, 2)
    emb = torch.cat((angles, angles), dim=-1)
    turned, _ = llama(X[..., :r], X[..., :r], emb.cos()[None] * scale, emb.sin()[None] * scale)
    return torch.cat((turned, X[..., r:]), dim=-1)


@pytest.fixture(scope="module", params=list(VARIANTS))
def turned(request, tmp_path_factory):
    """A model that only turns, compiled to every target with the same weights."""
    name = request.param
    call = VARIANTS[name][0]
    folder = tmp_path_factory.mktemp("turn")
    spec = folder / "turn.fgpt"
    spec.write_text(TURN.format(call=call))
    torch.manual_seed(1)
    out = {}
    for target, args in TARGETS.items():
        r = fgc("compile", str(spec), *args, *(["--weights", str(folder / "torch" /
                                                                "weights.safetensors")]
                                               if target != "torch" else []),
                "-o", str(folder / target))
        assert r.returncode == 0, r.stderr
        if target == "torch":  # weights drawn large: a rotation by a small angle shows
            model = module(folder / "torch")
            peaked_weights(model)
            safetensors_torch.save_file(model.state_dict(),
                                        str(folder / "torch" / "weights.safetensors"))
        out[target] = folder / target
    return name, out


@pytest.fixture(scope="module")
def helpers(tmp_path_factory):
    """The runtime helpers of a generated model.py that turns (RoPE)."""
    folder = tmp_path_factory.mktemp("helpers")
    (folder / "turn.fgpt").write_text(TURN.format(call="RoPE"))
    r = fgc("compile", str(folder / "turn.fgpt"), "--target", "torch", "-o",
            str(folder / "torch"))
    assert r.returncode == 0, r.stderr
    spec = importlib.util.spec_from_file_location("fgc_rotary_helpers",
                                                  folder / "torch" / "model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_each_variant_turns_as_transformers(turned):
    """Every target's rotation is transformers' formula's to 1e-5: the fused forms (torch,
    RotaryEmbedding at opset 23 and onnxruntime's) and the equations (opset 18)."""
    name, out = turned
    _, scaling, interleaved, width = VARIANTS[name]
    model = module(out["torch"])
    state = model.state_dict()
    x = tokens(11, 12)
    with torch.no_grad():
        X = torch.stack([state["W_e"][x] @ state["W"][:, i] for i in range(2)], dim=1)
        want = _reference(X, scaling, interleaved, width).transpose(1, 2).flatten(-2)
        got = {"torch": model(x)}
    for target in ("onnx", "onnx18", "ort"):
        session = ort.InferenceSession(str(out[target] / "model.onnx"),
                                       providers=["CPUExecutionProvider"])
        got[target] = torch.from_numpy(session.run(None, unpadded(session, {"x": x.numpy()}))[0])
    for target, y in got.items():
        assert float((y - want).abs().max()) <= 1e-5, target
    assert float(want.abs().max()) > 0.5  # (a comparison of something)


def test_the_graphs_hold_the_fused_operators(turned):
    """RotaryEmbedding (ai.onnx) at opset 23, none at opset 18 (the equations), and
    onnxruntime's com.microsoft RotaryEmbedding under --optimize ort, which its CPU
    provider keeps as one kernel after its own graph optimisations."""
    name, out = turned
    ops = {t: [(n.domain or "ai.onnx", n.op_type) for n in onnx.load(
        str(out[t] / "model.onnx")).graph.node] for t in ("onnx", "onnx18", "ort")}
    # one node turns every head
    assert ops["onnx"].count(("ai.onnx", "RotaryEmbedding")) == 1
    assert not [op for op in ops["onnx18"] if op[1] == "RotaryEmbedding"]
    assert ops["ort"].count(("com.microsoft", "RotaryEmbedding")) == 1
    node = next(n for n in onnx.load(str(out["onnx"] / "model.onnx")).graph.node
                if n.op_type == "RotaryEmbedding")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    _, _, interleaved, width = VARIANTS[name]
    assert attrs.get("interleaved", 0) == int(interleaved)
    assert attrs.get("rotary_embedding_dim", 0) == (width or 0)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(out["ort"] / "optimized.onnx")
    ort.InferenceSession(str(out["ort"] / "model.onnx"), options,
                         providers=["CPUExecutionProvider"])
    kept = onnx.load(str(out["ort"] / "optimized.onnx")).graph.node
    assert sum(n.op_type == "RotaryEmbedding" for n in kept) == 1


def test_the_torch_tables_are_made_once(turned):
    """The generated `rotary` makes its cosines and sines once for every head, layer and
    call at a length, and again only for a longer run."""
    name, out = turned
    model = module(out["torch"])
    tables = type(model).forward.__globals__["ROTARY"]  # model.py's own
    tables.clear()
    with torch.no_grad():
        model(tokens(11, 12))
        first = dict(tables)
        model(tokens(11, 5))
    assert len(first) == 1 and tables == first  # the same tensors, not new ones
    (cos, _), = first.values()
    assert cos.shape[0] >= 12


# ---------------------------------------------------------------- Llama's scalings

# the standard library's GQA with a scaled RoPE, the spec's own module of that name, used
# in place of llama.fgpt's GQA^llama3 (which turns by Llama 3.1's rule through the spec's
# hyperparameters factor, low, high and n0)
SCALED_GQA = """
module GQA[A, G, D, theta = 10000.0](X: R[n, H], Mask: R[n, n]) -> R[n, H] {{
  GQA(X, Mask) = Concat(head_1, ..., head_A) @ W^O
    where k_j = {rope}(X @ W_j^K) for j in 1..G,
          v_j = X @ W_j^V for j in 1..G,
          head_i = Attention({rope}(X @ W_i^Q), k_{{floor((i - 1) * G / A) + 1}},
                             v_{{floor((i - 1) * G / A) + 1}}, Mask) for i in 1..A
  param W_i^Q: R[H, D] for i in 1..A
  param W_j^K: R[H, D] for j in 1..G
  param W_j^V: R[H, D] for j in 1..G
  param W^O: R[A * D, H]
}}
"""
SCALED = {
    "llama3": None,  # llama.fgpt itself, --set factor=4.0 low=1.0 high=4.0 n0=32
    "linear": "RoPE^linear[factor = 3.0]",
    "yarn": "RoPE^yarn[factor = 4.0, n0 = 32, beta_fast = 4.0, beta_slow = 0.5]",
}


def spec_text() -> str:
    return (ROOT / "specs" / "llama.fgpt").read_text()


@pytest.fixture(scope="module", params=list(SCALED))
def scaled_llama(request, tmp_path_factory):
    """specs/llama.fgpt with a scaled RoPE, against LlamaForCausalLM with that rope_type."""
    scaling = request.param
    folder = tmp_path_factory.mktemp(f"llama_{scaling}")
    spec = ROOT / "specs" / "llama.fgpt"
    sizes = dict(L=2, H=32, A=2, G=1, F=24, V=50, n=40, theta=10000.0)
    if SCALED[scaling] is None:
        sizes.update(factor=4.0, low=1.0, high=4.0, n0=32)
    else:
        spec = folder / "llama_scaled.fgpt"
        spec.write_text(SCALED_GQA.format(rope=SCALED[scaling]) + spec_text()
                        .replace("attn: GQA^llama3(", "attn: GQA("))
    config = _config(scaling)
    config = transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=40,
        rms_norm_eps=1e-5, tie_word_embeddings=False, rope_parameters=config.rope_parameters)
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(config).eval()
    peaked_weights(ref)
    weights = folder / "model.safetensors"
    safetensors_torch.save_file({k: v.contiguous() for k, v in ref.state_dict().items()},
                                str(weights))
    out = {}
    for target in ("torch", "onnx", "ort"):
        r = fgc("compile", str(spec), *set_args(sizes),
                "--weights", str(weights), *TARGETS[target], "-o", str(folder / target))
        assert r.returncode == 0, r.stderr
        out[target] = folder / target
    return ref, out


def test_scaled_llama_equals_transformers(scaled_llama):
    """Probabilities (the frequencies kept, moved and divided, by wavelength) and greedy
    generation through step() equal LlamaForCausalLM's with rope_type llama3 / linear /
    yarn."""
    ref, out = scaled_llama
    assert_probabilities(ref, out, V=50, lengths=(40, 7))
    assert_greedy(ref, out, V=50, new=12)


# ---------------------------------------------------------------- released decoders

DECODERS = ["llama", "phi3", "gpt_neox"]


def _compile_decoder(spec: str, folder: Path, *extra: str, sizes: dict | None = None) -> dict:
    sets = set_args({**tiny_sets(f"specs/{spec}.fgpt"), **(sizes or {})})
    path = own_names(spec, folder)
    out = {}
    r = fgc("compile", str(path), *sets, "--target", "torch", "-o", str(folder / "torch"))
    assert r.returncode == 0, r.stderr
    model = module(folder / "torch")
    torch.manual_seed(2)
    peaked_weights(model, norm_gain="gamma")
    safetensors_torch.save_file(model.state_dict(), str(folder / "weights.safetensors"))
    out["torch"] = model
    for target in ("onnx", "ort"):
        r = fgc("compile", str(path), *sets, *TARGETS[target], *extra,
                "--weights", str(folder / "weights.safetensors"), "-o", str(folder / target))
        assert r.returncode == 0, r.stderr
        out[target] = folder / target
    return out


@pytest.mark.parametrize("spec", DECODERS)
def test_decoders_agree_across_targets(spec, tmp_path):
    """The logits of torch, the standard graph and the --optimize ort graph agree to 1e-5,
    each graph with its rotary operator."""
    out = _compile_decoder(spec, tmp_path)
    x = tokens(50, 8)
    with torch.no_grad():
        want = out["torch"].logits(x).numpy()
    for target, domain in (("onnx", ""), ("ort", "com.microsoft")):
        graph = onnx.load(str(out[target] / "model.onnx")).graph
        assert any(n.op_type == "RotaryEmbedding" and n.domain == domain for n in graph.node)
        session = ort.InferenceSession(str(out[target] / "model.onnx"),
                                       providers=["CPUExecutionProvider"])
        got = session.run(["logits"], unpadded(session, {"x": x.numpy()}))[0]
        assert float(np.abs(got - want).max()) <= 1e-5, target


# heads wide enough for GroupQueryAttention to turn them itself (a multiple of 16, tables
# a multiple of 8 wide): grouped (Llama), 16 of 64 features turned (GPT-NeoX)
TURNED = {"llama": dict(H=64, A=4, G=2), "gpt_neox": dict(H=128, A=2, R=16)}


@pytest.mark.parametrize("spec", DECODERS)
@pytest.mark.parametrize("target", ["onnx", "ort"])
def test_the_kv_cache_graph_steps_as_the_full_recompute(spec, target, tmp_path):
    """Through the --kv-cache graph, a prompt and then one token at a time: each step's
    logits are those of the whole sequence recomputed (the rotation from the past's length
    on)."""
    _steps_as_the_full_recompute(_compile_decoder(spec, tmp_path, "--kv-cache"), target)


@pytest.mark.parametrize("spec", sorted(TURNED))
def test_group_query_attention_turns_queries_and_keys_itself(spec, tmp_path):
    """Under --optimize ort, onnxruntime's GroupQueryAttention takes the projections as
    they come and turns them itself (do_rotary, tables from position 0): no rotary
    operator is left, and the steps are the full recompute's."""
    out = _compile_decoder(spec, tmp_path, "--kv-cache", sizes=TURNED[spec])
    graph = onnx.load(str(out["ort"] / "model.onnx")).graph
    ops = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    assert len(ops) == 2 and not any(n.op_type == "RotaryEmbedding" for n in graph.node)
    assert all(onnx.helper.get_attribute_value(a) == 1 for n in ops for a in n.attribute
               if a.name == "do_rotary")
    # one product's Q | K | V given packed where no bias comes between (GPT-NeoX has them)
    assert all((n.input[1] == "") == (spec != "gpt_neox") for n in ops)
    _steps_as_the_full_recompute(out, "ort", relative=True)


@pytest.mark.parametrize("target", ["onnx", "ort"])
def test_the_kv_cache_graph_reads_its_rotations_from_stored_tables(target, tmp_path):
    """The incremental form turns its new positions by rows of cosines and sines stored for
    every position the context reaches (n rows), not by recomputing every position up to
    its own at each step: no Cos or Sin runs in the graph, and the steps are the full
    recompute's."""
    out = _compile_decoder("llama", tmp_path, "--kv-cache", sizes=TURNED["llama"])
    graph = onnx.load(str(out[target] / "model.onnx")).graph
    assert not any(n.op_type in ("Cos", "Sin") for n in graph.node)
    rows, width = tiny_sets("specs/llama.fgpt")["n"], TURNED["llama"]["H"] // \
        TURNED["llama"]["A"]
    assert {i.name: list(i.dims) for i in graph.initializer if i.name.startswith("rotary/")} \
        == {"rotary/cos": [rows, width // 2], "rotary/sin": [rows, width // 2]}
    _steps_as_the_full_recompute(out, target, relative=True)


def test_a_window_stays_with_the_standard_attention(tmp_path):
    """A window (Phi-3's Mask^ST) is never GroupQueryAttention's `local_window_size`, whose
    count differs between onnxruntime releases: the standard Attention with its band."""
    out = _compile_decoder("phi3", tmp_path, "--kv-cache", sizes=dict(H=32, A=2, G=2))
    graph = onnx.load(str(out["ort"] / "model.onnx")).graph
    assert not any(n.op_type == "GroupQueryAttention" for n in graph.node)
    assert sum(n.op_type == "Attention" and not n.domain for n in graph.node) == 2
    _steps_as_the_full_recompute(out, "ort", relative=True)


def _steps_as_the_full_recompute(out: dict, target: str, relative: bool = False) -> None:
    """Each step's logits within 1e-5 of the recompute's (times their largest magnitude,
    `relative`: wider heads' logits of 10 carry float32 rounding of 1e-5 in every
    backend)."""
    session = ort.InferenceSession(str(out[target] / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    past = {i.name: np.zeros([2 if d == "batch" else 0 if d == "past" else d
                              for d in i.shape], np.float32)
            for i in session.get_inputs() if i.name.startswith("past.")}
    x = tokens(50, 8).numpy()
    feed = x[:, :3]
    for t in range(3, 9):
        got = dict(zip(names, session.run(None, unpadded(session, {"x": feed, **past}))))
        past = {k: got[k.replace("past.", "present.", 1)] for k in past}
        with torch.no_grad():
            want = out["torch"].logits(torch.from_numpy(x[:, :t])).numpy()[:, -feed.shape[1]:]
        scale = max(1.0, float(np.abs(want).max())) if relative else 1.0
        assert float(np.abs(got["logits"] - want).max()) <= 1e-5 * scale, t
        feed = x[:, t:t + 1]


# ---------------------------------------------------------------- soft-capping


def test_soft_capping_is_c_tanh_x_over_c(tmp_path):
    """SoftCapping[c](X) = c tanh(X / c), in both backends."""
    spec = tmp_path / "cap.fgpt"
    spec.write_text("model Cap {\n  hyper V = 11, n = 6, H = 5\n  input x: {1..V}^n\n"
                    "  param W_e: R[V, H]\n  output Y = SoftCapping[c = 2.5](OneHot(x) @ W_e)\n}\n")
    for target in ("torch", "onnx"):
        extra = [] if target == "torch" else ["--weights", str(tmp_path / "torch" /
                                                                "weights.safetensors")]
        r = fgc("compile", str(spec), *TARGETS[target], *extra, "-o", str(tmp_path / target))
        assert r.returncode == 0, r.stderr
        if target == "torch":
            model = module(tmp_path / "torch")
            with torch.no_grad():
                model.W_e.mul_(300.0)  # past the cap
            safetensors_torch.save_file(model.state_dict(),
                                        str(tmp_path / "torch" / "weights.safetensors"))
    x = tokens(11, 6)
    want = 2.5 * torch.tanh(model.W_e.detach()[x] / 2.5)
    with torch.no_grad():
        assert float((model(x) - want).abs().max()) <= 1e-6
    session = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    got = session.run(None, unpadded(session, {"x": x.numpy()}))[0]
    assert float(np.abs(got - want.numpy()).max()) <= 1e-6
    assert float(np.abs(got).max()) <= 2.5 and float(np.abs(got).max()) > 2.0


CAPPED = """
module GQA^capped[A, G, D, c](X: R[n, H], Mask: R[n, n]) -> R[n, H] {
  GQA^capped(X, Mask) = Concat(head_1, ..., head_A) @ W^O
    where k_j = RoPE(X @ W_j^K) for j in 1..G,
          v_j = X @ W_j^V for j in 1..G,
          head_i = ATTENTION(RoPE(X @ W_i^Q), k_{floor((i - 1) * G / A) + 1},
                             v_{floor((i - 1) * G / A) + 1}, Mask) for i in 1..A
  param W_i^Q: R[H, D] for i in 1..A
  param W_j^K: R[H, D] for j in 1..G
  param W_j^V: R[H, D] for j in 1..G
  param W^O: R[A * D, H]
}

# Attention^capped's equations in a module of the spec's own, which no backend fuses
module Attention^written[c](Q: R[m, d], K: R[n, d], V: R[n, v], Mask: R[m, n]) -> R[m, v] {
  Attention^written(Q, K, V, Mask) = Softmax(SoftCapping[c]((Q @ K^T) / sqrt(d)) + Mask) @ V
}

model Capped {
  hyper L = 2, H = 32, A = 4, G = 2, D = 16, V = 50, n = 8, c = 0.5
  input x: {1..V}^n
  param W_e: R[V, H]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {
    H^(l) = attn: GQA^capped(ln: RMSNorm(H^(l-1)), Mask^AR) + H^(l-1)
  }
  output P = Softmax(ln_f: RMSNorm(H^(L)) @ W_e^T)
}
"""


def test_capped_attention_is_its_equations_in_every_target(tmp_path):
    """Attention^capped (Softmax(c tanh(Q K^T / (c sqrt(d))) + Mask) V) is fused: its cap
    is the `softcap` of onnxruntime's GroupQueryAttention under --optimize ort (and of
    ONNX's Attention in the standard graph); each target gives what the same equations
    give written in a module of the spec's own, which nothing fuses, whole and step by
    step through the cache."""
    written = tmp_path / "written.fgpt"
    written.write_text(CAPPED.replace("ATTENTION", "Attention^written[c]"))
    fused = tmp_path / "fused.fgpt"
    fused.write_text(CAPPED.replace("ATTENTION", "Attention^capped[c]"))
    r = fgc("compile", str(written), "--target", "torch", "-o", str(tmp_path / "written"))
    assert r.returncode == 0, r.stderr
    reference = module(tmp_path / "written")
    torch.manual_seed(3)
    peaked_weights(reference, norm_gain="gamma")
    weights = tmp_path / "weights.safetensors"
    safetensors_torch.save_file(reference.state_dict(), str(weights))
    out = {}
    for target in ("torch", "onnx", "ort"):
        extra = ["--kv-cache"] if target != "torch" else []
        r = fgc("compile", str(fused), *TARGETS[target], *extra, "--weights", str(weights),
                "-o", str(tmp_path / target))
        assert r.returncode == 0, r.stderr
        out[target] = tmp_path / target
    out["torch"] = module(tmp_path / "torch")
    x = tokens(50, 8)
    with torch.no_grad():
        want = reference.logits(x)
        assert float((out["torch"].logits(x) - want).abs().max()) <= 1e-5
    graph = onnx.load(str(out["ort"] / "model.onnx")).graph
    caps = [onnx.helper.get_attribute_value(a) for n in graph.node
            if n.op_type == "GroupQueryAttention" for a in n.attribute if a.name == "softcap"]
    assert caps == [0.5, 0.5]
    graph = onnx.load(str(out["onnx"] / "model.onnx")).graph
    assert [onnx.helper.get_attribute_value(a) for n in graph.node if n.op_type == "Attention"
            for a in n.attribute if a.name == "softcap"] == [0.5, 0.5]
    for target in ("onnx", "ort"):  # a prompt, then a token at a time, through the cache
        _steps_as_the_full_recompute(out, target)


# ---------------------------------------------------------------- widths no convention turns

BAD = TURN.replace("hyper A = 2, D = 16, H = 6", "hyper A = 2, D = {D}, H = 6")


@pytest.mark.parametrize("call, D, message", [
    ("RoPE^interleaved", 9, "`RoPE^interleaved`: the rotated width d = 9 is not an even "
                            "number"),
    ("RoPE^partial[r = 10]", 8, "`RoPE^partial`: the rotated width r = 10 is wider than "
                                "the rows it turns, of 8 features"),
    ("RoPE", 9, "the size d/2 is 9/2 here, not a whole number"),
])
def test_a_width_no_convention_turns_is_a_located_error(call, D, message, tmp_path):
    spec = tmp_path / "bad.fgpt"
    spec.write_text(BAD.format(call=call, D=D))
    for command in (["check", str(spec)], ["compile", str(spec), "--target", "onnx",
                                           "-o", str(tmp_path / "out")]):
        r = fgc(*command)
        assert r.returncode == 1, r.stderr
        assert "Traceback" not in r.stderr
        assert message in r.stderr, r.stderr
        line = 1 + next(k for k, text in enumerate(BAD.splitlines()) if "h_i =" in text)
        where = "bad.fgpt" if call != "RoPE" else "stdlib.fgpt"
        assert f"{where}:" in r.stderr
        if where == "bad.fgpt":
            assert f"bad.fgpt:{line}:" in r.stderr  # the use, line and column
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("call, message, why", [
    ("RoPE^yarn[factor = 0.0]", "`RoPE^yarn`: factor = 0 makes no rotary frequencies",
     "the scaling factor must be positive"),
    ("RoPE^yarn[factor = 4.0, beta_slow = 0.0]", "beta_slow = 0", "YaRN's beta_slow must"),
    ("RoPE^yarn[theta = 1.0, factor = 4.0]", "theta = 1",
     "YaRN's bounds divide by the logarithm of the rotary base"),
    ("RoPE^llama3[low = 2.0, high = 2.0]", "`RoPE^llama3`: high = 2",
     "high_freq_factor must exceed low_freq_factor = 2"),
    ("RoPE^linear[theta = -10.0]", "`RoPE^linear`: theta = -10", "the rotary base must"),
])
def test_a_base_or_scaling_with_no_frequencies_is_a_located_error(call, message, why,
                                                                   tmp_path):
    """A rotary base or scaling whose frequencies would be infinite or not numbers (a
    division by zero, the logarithm of 0 or of a negative number) is refused at the use,
    at check and at compile (a --set reaching it too), and nothing is written."""
    spec = tmp_path / "bad.fgpt"
    spec.write_text(BAD.format(call=call, D=16))
    line = 1 + next(k for k, text in enumerate(BAD.splitlines()) if "h_i =" in text)
    for command in (["check", str(spec)], ["compile", str(spec), "--target", "onnx",
                                           "-o", str(tmp_path / "out")]):
        r = fgc(*command)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert message in r.stderr and why in r.stderr, r.stderr
        assert f"bad.fgpt:{line}:" in r.stderr
    assert not (tmp_path / "out").exists()
    r = fgc("compile", "specs/qwen3.fgpt", *set_args(tiny_sets("specs/qwen3.fgpt")),
            "--set", "beta_fast=0.0", "--target", "torch", "-o", str(tmp_path / "set"))
    assert r.returncode == 1 and "beta_fast = 0 makes no rotary frequencies" in r.stderr
    assert not (tmp_path / "set").exists()


def test_every_rotary_intrinsic_is_documented():
    text = (ROOT / "docs" / "language.md").read_text()
    for name, i in INTRINSICS.items():
        if i.kind == "rotary":
            assert f"| `{name}` |" in text, name
    assert "| `SoftCapping` |" in text
