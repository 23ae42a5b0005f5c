"""Masks as data (compiler/lowering/masks.py): what each attention mask means is decided
once, and both backends print that decision — a causal mask as `is_causal`, no mask as
none, a bias plus a causal mask as one mask — with the same numbers as the mask's own
equations."""

from __future__ import annotations

import numpy as np
import pytest
from test_backend_constructs import both_backends
from test_torch_backend import import_model

from compiler.elaborate.ir import Loop
from compiler.emit import compile_spec
from compiler.lowering import prepare
from compiler.pipeline import load

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

# the same model three ways: the stdlib's causal mask, that mask written out as a spec's own
# module (which no backend reads by meaning), and a bias per head added to it
HEAD = """\
module Causal[n] -> R[n, n] {
  Causal[i, j] = -inf if j > i else 0
}
model M {
  hyper V = 11, n = 8, H = 8, A = 2, D = H / A
  input x: {1..V}^n
  param W_e: R[V, H]
  param W_i^Q: R[H, D] for i in 1..A
  param B_i: R[n, n] for i in 1..A
  X = OneHot(x) @ W_e
"""
STDLIB = HEAD + """\
  head_i = Attention(X @ W_i^Q, X @ W_i^Q, X @ W_i^Q, Mask^AR) for i in 1..A
  output y = Concat(head_1, ..., head_A) + 0 * Concat(B_1, ..., B_A)[:, 1 .. H]
}
"""
OWN = STDLIB.replace("Mask^AR) for", "Causal) for")
BIASED = STDLIB.replace("Mask^AR) for", "B_i + Mask^AR) for")
BIASED_OWN = STDLIB.replace("Mask^AR) for", "B_i + Causal) for")
# a mask read by arithmetic, not by attention: it becomes its tensor there
ARITHMETIC = HEAD + """\
  S_i = (X @ W_i^Q) @ (X @ W_i^Q)^T / sqrt(D) + Mask^AR for i in 1..A
  head_i = Softmax(S_i) @ (X @ W_i^Q) for i in 1..A
  output y = Concat(head_1, ..., head_A) + 0 * Concat(B_1, ..., B_A)[:, 1 .. H]
}
"""
ARITHMETIC_OWN = ARITHMETIC.replace("+ Mask^AR for", "+ Causal for")


def _lowered(tmp_path, text: str):
    path = tmp_path / "m.fgpt"
    path.write_text(text)
    cfg = load(str(path)).configure()
    model, functions = prepare(cfg.model, cfg.functions)
    eqns = [e for item in model.body for e in (item.body if isinstance(item, Loop) else [item])]
    return eqns, functions


def _torch_output(tmp_path, name: str, text: str, state=None, vocab: int = 11):
    path = tmp_path / f"{name}.fgpt"
    path.write_text(text)
    compile_spec(str(path), str(tmp_path / name), "torch")
    module = import_model(tmp_path / name / "model.py").build().eval()
    if state is not None:
        module.load_state_dict(state)
    x = torch.tensor(np.random.default_rng(0).integers(0, vocab, size=(2, 8)))
    with torch.no_grad():
        return module(x), module.state_dict(), (tmp_path / name / "model.py").read_text()


def test_a_causal_mask_is_attention_with_is_causal_in_both_backends(tmp_path):
    eqns, functions = _lowered(tmp_path, STDLIB)
    assert [e.attrs for e in eqns if e.op == "mask"] == [{"causal": True}]
    assert not [e for e in eqns if e.op == "mask_tensor"]
    assert functions["Attention"].mask_inputs == {"Mask": "causal"}
    got, state, code = _torch_output(tmp_path, "stdlib", STDLIB)
    assert "is_causal=True" in code and "CAUSAL" not in code and "mask_tensor" not in code
    want, _, own_code = _torch_output(tmp_path, "own", OWN, state)
    assert "is_causal" not in own_code  # the spec's own mask is a tensor like any other
    assert torch.allclose(got, want, atol=1e-6)
    assert max(both_backends(tmp_path, STDLIB, lengths=(8,))) <= 1e-5
    compile_spec(str(tmp_path / "stdlib.fgpt"), str(tmp_path / "onnx"), "onnx")
    graph = onnx.load(str(tmp_path / "onnx" / "model.onnx")).graph
    attention = [n for n in graph.node if n.op_type == "Attention"]
    assert attention and all(
        any(a.name == "is_causal" and a.i == 1 for a in n.attribute) for n in attention)


def test_a_bias_plus_a_causal_mask_is_one_mask(tmp_path):
    eqns, functions = _lowered(tmp_path, BIASED)
    (mask,) = [e for e in eqns if e.op == "mask"]
    assert mask.attrs == {"causal": True} and [o.name for o in mask.ins] == ["B"]
    assert functions["Attention"].mask_inputs == {"Mask": "causal+bias"}
    _, state, _ = _torch_output(tmp_path, "own", BIASED_OWN)
    torch.manual_seed(0)
    state = {k: torch.randn_like(v) for k, v in state.items()}  # a bias that is not zero
    got, _, code = _torch_output(tmp_path, "biased", BIASED, state)
    want, _, _ = _torch_output(tmp_path, "own", BIASED_OWN, state)
    assert "causal_mask(" in code and "CAUSAL" not in code
    assert torch.allclose(got, want, atol=1e-5)
    assert max(both_backends(tmp_path, BIASED, lengths=(8,))) <= 1e-5


def test_a_mask_in_arithmetic_becomes_its_tensor_there(tmp_path):
    eqns, _ = _lowered(tmp_path, ARITHMETIC)
    (made,) = [e for e in eqns if e.op == "mask_tensor"]  # the scores plus Mask^AR
    assert made.attrs == {"causal": True, "bias": True}
    (softmax,) = [e for e in eqns if e.op == "call" and e.attrs["module"] == "Softmax"]
    assert [o.name for o in softmax.ins] == [made.outs[0].name]
    got, state, _ = _torch_output(tmp_path, "arith", ARITHMETIC)
    want, _, _ = _torch_output(tmp_path, "own", ARITHMETIC_OWN, state)
    assert torch.allclose(got, want, atol=1e-6)
    assert max(both_backends(tmp_path, ARITHMETIC, lengths=(8,))) <= 1e-5


TWO = """\
module Zeros[n] -> R[n, n] {
  Zeros[i, j] = 0
}
module Causal[n] -> R[n, n] {
  Causal[i, j] = -inf if j > i else 0
}
model Two {
  hyper L = 2, V = 5, n = 6, H = 4, A = 2, D = H / A
  input x: {1..V}^n
  param W_e: R[V, H]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {
    S^(l) = MH(LN(H^(l-1)), Mask^AR) + H^(l-1)
    H^(l) = MH(LN(S^(l)), Mask^BD) + S^(l)
  }
  output probs = Softmax(LN(H^(L)) @ W_e^T)
}
"""
TWO_OWN = TWO.replace("Mask^AR)", "Causal)").replace("Mask^BD)", "Zeros)")


def test_a_module_given_different_masks_is_told_at_each_use(tmp_path):
    """One module given a causal mask at one use and none at another (an encoder and a
    decoder sharing an attention module): each use says which, and attention runs it."""
    eqns, functions = _lowered(tmp_path, TWO)
    assert functions["MH"].mask_inputs == {"Mask": "per_use"}
    assert functions["Attention"].mask_inputs == {"Mask": "per_use"}
    uses = [e.attrs["masks"] for e in eqns if e.op == "call" and e.attrs["module"] == "MH"]
    assert uses == [{"Mask": "causal"}, {"Mask": "none"}]
    (inner,) = [e for e in functions["MH"].eqns if e.op == "call" and
                e.attrs["module"] == "Attention"]
    assert inner.attrs["masks"] == {"Mask": "=Mask"}  # whatever this use of MH was given
    assert not [e for e in eqns if e.op == "mask_tensor"]
    got, state, code = _torch_output(tmp_path, "two", TWO.replace("n = 6", "n = 8"), vocab=5)
    assert "causal=True" in code and "causal=False" in code and "is_causal=True" in code
    want, _, _ = _torch_output(tmp_path, "own", TWO_OWN.replace("n = 6", "n = 8"), state,
                               vocab=5)
    assert torch.allclose(got, want, atol=1e-6)
    assert max(both_backends(tmp_path, TWO, lengths=(6, 3))) <= 1e-5


def test_a_module_given_a_tensor_at_some_use_takes_tensors(tmp_path):
    """When one use gives a module a mask that is a tensor (a spec's own causal mask),
    every use does: the masks by meaning become their tensors where they are passed."""
    text = TWO.replace("  output probs", "  Z = MH(LN(H^(L)), Causal) + H^(L)\n  output probs") \
        .replace("LN(H^(L)) @ W_e^T", "LN(Z) @ W_e^T")
    eqns, functions = _lowered(tmp_path, text)
    assert functions["MH"].mask_inputs == {} and functions["Attention"].mask_inputs == {}
    assert sorted(e.attrs["causal"] for e in eqns if e.op == "mask_tensor") == [False, True]
    assert max(both_backends(tmp_path, text, lengths=(6, 3))) <= 1e-5


def test_a_modules_own_zeros_are_no_mask(tmp_path):
    """A spec's own module that is zero everywhere (the Transformer's m x n `Mask^X` for
    cross-attention) means no mask, as Mask^BD does: attention runs without one."""
    spec = load("specs/transformer.fgpt")
    cfg = spec.configure(None, {})
    model, funcs = prepare(cfg.model, cfg.functions)
    assert funcs["MHA"].mask_inputs == {"Mask": "none"}
    assert max(both_backends(tmp_path, TWO_OWN, lengths=(6, 3))) <= 1e-5


# a sliding window (Mistral's): Mask^ST straight into every layer's attention
WINDOW = """\
module Band[n, w] -> R[n, n] {
  Band[i, j] = 0 if j <= i and j > i - w else -inf
}
model Sliding {
  hyper L = 2, V = 11, n = 8, H = 8, A = 2, D = H / A, w = 3
  input x: {1..V}^n
  param W_e: R[V, H]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {
    H^(l) = MH(LN(H^(l-1)), Mask^ST) + H^(l-1)
  }
  output y = Softmax(H^(L) @ W_e^T)
}
"""
WINDOW_OWN = WINDOW.replace("Mask^ST)", "Band)")


def test_a_window_is_a_mask_by_meaning_with_its_width_as_value(tmp_path):
    """Mask^ST is passed by meaning: its value is the window's width, attention builds the
    band from the queries' and keys' positions (aligned to cached keys), and no n x n
    table is made or passed; the numbers equal the spec's own banded module's, in both
    backends, the incremental form and the --kv-cache graph."""
    from test_differential import differential
    eqns, functions = _lowered(tmp_path, WINDOW)
    (mask,) = [e for e in eqns if e.op == "mask"]
    assert mask.attrs["causal"] is True and str(mask.attrs["window"]) == "3"
    assert not [e for e in eqns if e.op == "mask_tensor"]
    assert functions["MH"].mask_inputs == {"Mask": "window"}
    assert functions["Attention"].mask_inputs == {"Mask": "window"}
    got, state, code = _torch_output(tmp_path, "window", WINDOW)
    assert "window_mask(Q.shape[-2], K.shape[-2], Mask" in code and "class Mask_ST" not in code
    want, _, _ = _torch_output(tmp_path, "own", WINDOW_OWN, state)
    assert torch.allclose(got, want, atol=1e-6)
    path = tmp_path / "sliding.fgpt"
    path.write_text(WINDOW)
    assert differential(tmp_path / "diff", path)  # both backends, pieces, --kv-cache
    for optimize in ("none", "ort"):
        out = tmp_path / f"onnx-{optimize}"
        compile_spec(str(path), str(out), "onnx", optimize=optimize)
        ops = {n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node}
        assert "GreaterOrEqual" in ops  # the band, made from positions


def test_a_window_in_arithmetic_becomes_its_band_there(tmp_path):
    text = WINDOW.replace("MH(LN(H^(l-1)), Mask^ST)", "MH(LN(H^(l-1)), Mask^ST + 0)")
    eqns, _ = _lowered(tmp_path, text)
    (made,) = [e for e in eqns if e.op == "mask_tensor"]
    assert made.attrs == {"causal": True, "bias": False, "banded": True}
    got, state, _ = _torch_output(tmp_path, "arith", text)
    want, _, _ = _torch_output(tmp_path, "own", WINDOW_OWN, state)
    assert torch.allclose(got, want, atol=1e-6)
    assert max(both_backends(tmp_path, text, lengths=(8, 3))) <= 1e-5
