"""RMSNorm (LLaMA's and Gemma's), SiLU, SwiGLU and GeGLU: standard-library modules whose
equations are their meaning and which both backends fuse.

- The parameters count exactly: RMSNorm has H, SwiGLU and GeGLU 3·H·F.
- PyTorch (rms_norm, silu) and every ONNX graph (RMSNormalization at opset 23, the
  equations at 18, Swish at 24; onnxruntime's SkipSimplifiedLayerNormalization after a
  residual sum and QuickGelu under --optimize ort) agree, with the same weights, on a
  small pre-norm decoder and on each module alone, and every graph passes onnx.checker
  (so onnxruntime's SimplifiedLayerNormalization, which it registers in the ONNX domain,
  is never emitted).
- The PyTorch module matches a reference written here in plain torch (LLaMA's RMSNorm and
  MLP, Gemma's (1 + w) RMSNorm) and, where transformers is installed, its own modules.
- A spec's own `RMSNorm` replaces the standard library's and is not fused.
"""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
from conftest import fgc
from test_onnx_parity import random_inputs, session, torch_with_weights
from test_torch_backend import import_model

from compiler.backends.onnx.lower import Lowerer
from compiler.elaborate.intrinsics import INTRINSICS, intrinsic
from compiler.emit import compile_spec
from compiler.pipeline import load

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

EPS = 1e-5  # not the module's default (1e-6), so the model's `eps` must reach every norm

DECODER = f"""\
model TinyLlama {{
  hyper L = 2, H = 16, A = 2, D = H / A, F = 24, V = 11, n = 8, eps = {EPS}
  input x: {{1..V}}^n
  param W_e: R[V, H], W_out: R[H, V]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {{
    Hh^(l) = attn: MH(input_norm: RMSNorm(H^(l-1)), Mask^AR) + H^(l-1)
    H^(l) = mlp: SwiGLU(post_norm: RMSNorm(Hh^(l))) + Hh^(l)
  }}
  output logits = norm: RMSNorm(H^(L)) @ W_out
}}
"""

PIECES = f"""\
model Pieces {{
  hyper n = 8, H = 16, F = 24, eps = {EPS}
  input X: R[n, H]
  output y_rms = rms: RMSNorm(X)
  output y_gemma = gemma: RMSNorm^gemma(X)
  output y_silu = SiLU(X)
  output y_swiglu = swiglu: SwiGLU(X)
  output y_geglu = geglu: GeGLU(X)
}}
"""

# a spec's own RMSNorm (a different eps placement: inside the root) replaces the stdlib's
OWN = """\
module RMSNorm[eps = 1e-6](X: R[..., H]) -> R[..., H] {
  RMSNorm(X) = gamma * X / (sqrt(mean(X * X)) + eps)
  param gamma: R[H] = 1
}

model Own {
  hyper n = 8, H = 16, eps = 0.5
  input X: R[n, H]
  output y = rms: RMSNorm(X)
}
"""

# (label, opset, optimize)
GRAPHS = [("opset23", 23, None), ("opset18", 18, None), ("opset24", 24, None),
          ("ort", 23, "ort"), ("ort18", 18, "ort")]


def write(tmp_path, text: str, name: str = "spec.fgpt"):
    path = tmp_path / name
    path.write_text(text)
    return path


def graph(spec, cfg, weights, opset: int, optimize: str | None):
    model, _ = Lowerer(spec, spec.symbolic(), cfg.values, opset=opset, optimize=optimize,
                       weights=weights).lower()
    return model


def op_types(model) -> set[str]:
    return {n.op_type for n in model.graph.node}


def rms(x, w, eps=EPS):
    """LLaMA's RMSNorm (transformers' LlamaRMSNorm in float32)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def mlp(x, gate, up, down, act=torch.nn.functional.silu):
    """LLaMA's MLP: down(act(gate(x)) * up(x)), the weights stored [in, out]."""
    return (act(x @ gate) * (x @ up)) @ down


def decoder_reference(sd: dict, x, L: int = 2, A: int = 2):
    """TinyLlama in plain torch from the module's own state dict."""
    h = sd["W_e"][x]
    B, T, H = h.shape
    causal = torch.full((T, T), -math.inf).triu(1)
    for l in range(L):
        p = {k.split(".", 2)[2]: v for k, v in sd.items() if k.startswith(f"layers.{l}.")}
        a = rms(h, p["input_norm.gamma"])
        q, k, v = ((a @ p[f"attn.W_{w}"].reshape(H, -1)).view(B, T, A, -1).transpose(1, 2)
                   for w in "QKV")
        s = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + causal, -1)
        h = h + (s @ v).transpose(1, 2).reshape(B, T, -1) @ p["attn.W_O"]
        h = h + mlp(rms(h, p["post_norm.gamma"]),
                    p["mlp.W_gate"], p["mlp.W_up"], p["mlp.W_down"])
    return rms(h, sd["norm.gamma"]) @ sd["W_out"]


# ---------------------------------------------------------------- the standard library


def test_the_new_modules_are_intrinsics():
    assert {INTRINSICS[m].kind for m in ("RMSNorm", "RMSNorm^gemma", "SiLU")} == \
        {"rms_norm", "silu"}
    assert INTRINSICS["RMSNorm^gemma"].offset == 1.0 and INTRINSICS["RMSNorm"].offset == 0.0


def test_check_and_exact_counts(tmp_path):
    path = write(tmp_path, DECODER)
    assert fgc("check", str(path)).returncode == 0
    out = fgc("params", str(path), "--format", "json", "--by-module")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    L, H, A, D, F, V = 2, 16, 2, 8, 24, 11
    assert report["total"] == 2 * V * H + H + L * (2 * H + 4 * A * D * H + 3 * H * F)
    per_copy = {m["name"]: (m["module"], m["per_copy"], m.get("formula"))
                for m in report["modules"]}
    for norm in ("input_norm", "post_norm", "norm"):
        assert per_copy[norm] == ("RMSNorm", H, "H")
    assert per_copy["mlp"] == ("SwiGLU", 3 * H * F, "3*F*H")


# ---------------------------------------------------------------- numbers


def test_decoder_torch_matches_the_reference_and_every_onnx_graph(tmp_path):
    path = write(tmp_path, DECODER)
    spec, cfg, model, weights = torch_with_weights(path, tmp_path / "torch")
    code = (tmp_path / "torch" / "model.py").read_text()
    # (the weight's gradient summed over the ranks of sequence parallelism: tp_shared)
    assert "rms_norm(X, self.gamma.shape, tp_shared(self.gamma, self.sp), self.eps)" in code
    assert "return silu(X)" in code
    sd = model.state_dict()
    graphs = {label: graph(spec, cfg, weights, opset, optimize)
              for label, opset, optimize in GRAPHS}
    ops = {label: op_types(g) for label, g in graphs.items()}
    assert "RMSNormalization" in ops["opset23"] and "Sigmoid" in ops["opset23"]
    assert "Swish" in ops["opset24"]
    assert not {"RMSNormalization", "SimplifiedLayerNormalization"} & ops["opset18"]
    # under ort every norm that reads a residual sum takes it in; the first reads the
    # lookup: RMSNormalization where the opset has it, else its equations
    assert {"SkipSimplifiedLayerNormalization", "RMSNormalization", "QuickGelu"} <= ops["ort"]
    assert "SkipSimplifiedLayerNormalization" in ops["ort18"]
    assert not {"RMSNormalization", "SimplifiedLayerNormalization"} & ops["ort18"]
    for g in graphs.values():
        onnx.checker.check_model(g, full_check=True)
    worst = {label: 0.0 for label in [*graphs, "reference"]}
    for T in (8, 3):
        inputs = random_inputs(cfg, T, 2, T)
        with torch.no_grad():
            got = model(*inputs.values())
            ref = decoder_reference(sd, inputs["x"])
        worst["reference"] = max(worst["reference"], float((got - ref).abs().max()))
        feed = {k: v.numpy() for k, v in inputs.items()}
        for label, g in graphs.items():
            for level in ("all", "off"):
                out = session(g, level).run(None, feed)[0]
                worst[label] = max(worst[label], float(np.abs(out - got.numpy()).max()))
    assert max(worst.values()) <= 1e-5, worst


def test_each_module_alone_matches_its_reference_in_both_backends(tmp_path):
    """Inputs as small as eps (the norm then depends on it), and as large as usual."""
    path = write(tmp_path, PIECES)
    spec, cfg, model, weights = torch_with_weights(path, tmp_path / "torch")
    code = (tmp_path / "torch" / "model.py").read_text()
    assert "rms_norm(X, self.gamma.shape, 1.0 + self.gamma, self.eps)" in code
    sd = model.state_dict()
    graphs = {label: graph(spec, cfg, weights, opset, optimize)
              for label, opset, optimize in GRAPHS}
    for onnx_model in graphs.values():
        onnx.checker.check_model(onnx_model, full_check=True)
    worst = {label: 0.0 for label in [*graphs, "reference"]}
    g = torch.Generator().manual_seed(0)
    for scale in (1.0, 3e-3):
        X = torch.randn(2, 8, 16, generator=g) * scale
        with torch.no_grad():
            got = model(X)
            gelu = lambda z: torch.nn.functional.gelu(z, approximate="tanh")  # noqa: E731
            ref = (rms(X, sd["rms.gamma"]), rms(X, 1 + sd["gemma.gamma"]),
                   X * torch.sigmoid(X),
                   mlp(X, *(sd[f"swiglu.W_{w}"] for w in ("gate", "up", "down"))),
                   mlp(X, *(sd[f"geglu.W_{w}"] for w in ("gate", "up", "down")), act=gelu))
        for a, b in zip(got, ref):
            worst["reference"] = max(worst["reference"], float((a - b).abs().max()))
        for label, onnx_model in graphs.items():
            for level in ("all", "off"):
                outs = session(onnx_model, level).run(None, {"X": X.numpy()})
                for a, b in zip(outs, got):
                    worst[label] = max(worst[label], float(np.abs(a - b.numpy()).max()))
    assert max(worst.values()) <= 1e-5, worst


def test_gemma_starts_at_the_identity_scale(tmp_path):
    """gamma starts at 0, so the scale 1 + gamma starts at 1 (as GemmaRMSNorm's)."""
    path = write(tmp_path, PIECES)
    compile_spec(str(path), str(tmp_path / "torch"), "torch")
    model = import_model(tmp_path / "torch" / "model.py").build()
    sd = model.state_dict()
    assert torch.equal(sd["gemma.gamma"], torch.zeros(16))
    assert torch.equal(sd["rms.gamma"], torch.ones(16))
    X = torch.randn(1, 8, 16)
    with torch.no_grad():
        y_rms, y_gemma = model(X)[:2]
    torch.testing.assert_close(y_rms, y_gemma)


def test_transformers_modules_agree(tmp_path):
    """LlamaRMSNorm, GemmaRMSNorm, LlamaMLP (silu) and GemmaMLP (gelu_pytorch_tanh) with
    the compiled module's weights ([in, out] here, nn.Linear's [out, in] there)."""
    pytest.importorskip("transformers")
    from transformers import GemmaConfig, LlamaConfig
    from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm
    path = write(tmp_path, PIECES)
    _, _, model, _ = torch_with_weights(path, tmp_path / "torch")
    sd = model.state_dict()
    llama_norm, gemma_norm = LlamaRMSNorm(16, eps=EPS), GemmaRMSNorm(16, eps=EPS)
    sizes = dict(hidden_size=16, intermediate_size=24, num_attention_heads=2,
                 num_key_value_heads=2, head_dim=8)
    llama = LlamaMLP(LlamaConfig(**sizes, hidden_act="silu"))
    gemma = GemmaMLP(GemmaConfig(**sizes, hidden_activation="gelu_pytorch_tanh"))
    with torch.no_grad():
        llama_norm.weight.copy_(sd["rms.gamma"])
        gemma_norm.weight.copy_(sd["gemma.gamma"])
        for hf, ours in ((llama, "swiglu"), (gemma, "geglu")):
            for w in ("gate", "up", "down"):
                getattr(hf, f"{w}_proj").weight.copy_(sd[f"{ours}.W_{w}"].T)
        X = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1))
        got = model(X)
        want = (llama_norm(X), gemma_norm(X), None, llama(X), gemma(X))
    for a, b in zip(got, want):
        if b is not None:
            assert float((a - b).abs().max()) <= 1e-5


# ---------------------------------------------------------------- a spec's own RMSNorm


def test_a_spec_that_defines_rmsnorm_replaces_it_and_is_not_fused(tmp_path):
    path = write(tmp_path, OWN)
    functions = load(str(path)).symbolic().functions
    assert intrinsic(functions["RMSNorm"]) is None
    spec, cfg, model, weights = torch_with_weights(path, tmp_path / "torch")
    code = (tmp_path / "torch" / "model.py").read_text()
    assert "rms_norm(" not in code
    X = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = model(X)
    gamma = model.state_dict()["rms.gamma"]
    want = gamma * X / (X.pow(2).mean(-1, keepdim=True).sqrt() + 0.5)
    assert float((got - want).abs().max()) <= 1e-5
    for label, opset, optimize in GRAPHS:
        onnx_model = graph(spec, cfg, weights, opset, optimize)
        assert not {"RMSNormalization", "SimplifiedLayerNormalization"} & op_types(onnx_model)
        out = session(onnx_model).run(None, {"X": X.numpy()})[0]
        assert float(np.abs(out - got.numpy()).max()) <= 1e-5, label
