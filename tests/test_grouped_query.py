"""A member picked by an expression in the family index (`k_{floor((i - 1) * G / A) + 1}`):
grouped- and multi-query attention at any ratio A / G, checked by `fgc check`, lowered
once (`gather_members`) and equal in both backends, the incremental form and the
--kv-cache graph."""

from __future__ import annotations

import contextlib
import io

import pytest
from conftest import fgc
from test_differential import differential

from compiler.cli import main
from compiler.elaborate.symbolic import Poly
from compiler.lowering import prepare
from compiler.pipeline import load

pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

GQA = """\
module GQA[A, G, D](X: R[n, H], Mask: R[n, n]) -> R[n, H] {
  GQA(X, Mask) = Concat(head_1, ..., head_A) @ W^O
    where k_j = X @ W_j^K for j in 1..G,
          v_j = X @ W_j^V for j in 1..G,
          head_i = Attention(X @ W_i^Q, k_{floor((i - 1) * G / A) + 1},
                             v_{floor((i - 1) * G / A) + 1}, Mask) for i in 1..A
  param W_i^Q: R[H, D] for i in 1..A
  param W_j^K: R[H, D] for j in 1..G
  param W_j^V: R[H, D] for j in 1..G
  param W^O: R[A * D, H]
}
model Grouped {
  hyper L = 2, V = 11, n = 8, H = 12, A = 6, G = 2, D = H / A
  input x: {1..V}^n
  param W_e: R[V, H]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {
    H^(l) = GQA(LN(H^(l-1)), Mask^AR) + H^(l-1)
  }
  output y = Softmax(H^(L) @ W_e^T)
}
"""


def _check(tmp_path, text: str) -> tuple[int, str]:
    path = tmp_path / "m.fgpt"
    path.write_text(text)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check", str(path)])
    return code, out.getvalue() + err.getvalue()


@pytest.mark.parametrize("groups", [2, 1, 3, 6])  # A / G = 3, multi-query, 2, one per head
def test_grouped_query_attention_agrees_everywhere(tmp_path, groups):
    path = tmp_path / "gqa.fgpt"
    path.write_text(GQA.replace("G = 2", f"G = {groups}"))
    assert differential(tmp_path, path)


def test_the_lowering_groups_the_keys_and_values(tmp_path):
    """Attention reads the G keys and values whole with the map as `groups`; a member
    picked by an expression elsewhere is a gather (`gather_members`)."""
    path = tmp_path / "gqa.fgpt"
    path.write_text(GQA)
    cfg = load(str(path)).configure()
    _, functions = prepare(cfg.model, cfg.functions)
    assert not [e for e in functions["GQA"].eqns if e.op == "gather_members"]
    (head,) = [e for e in functions["GQA"].eqns if e.op == "call" and
               e.attrs["module"] == "Attention"]
    assert [(o.name, o.whole_family) for o in head.ins[1:3]] == [("k", True), ("v", True)]
    index = head.attrs["groups"]
    picks = [index.subs({"i": Poly.const(i), "A": Poly.const(6), "G": Poly.const(2)})
             for i in range(1, 7)]
    assert [str(p) for p in picks] == ["1", "1", "1", "2", "2", "2"]
    text = GQA.replace("k_{floor((i - 1) * G / A) + 1}", "k_{G + 1 - floor((i - 1) * G / A) - 1}")
    path.write_text(text)  # keys and values picked differently: a gather each
    cfg = load(str(path)).configure()
    _, functions = prepare(cfg.model, cfg.functions)
    gathers = [e for e in functions["GQA"].eqns if e.op == "gather_members"]
    assert [e.ins[0].name for e in gathers] == ["k", "v"]
    assert differential(tmp_path / "reversed", path)


def test_the_cache_holds_the_key_value_heads(tmp_path):
    """step()'s cache and the --kv-cache graph's past hold G heads, not A."""
    import onnx
    import torch
    from test_torch_backend import import_model

    from compiler.emit import compile_spec
    path = tmp_path / "gqa.fgpt"
    path.write_text(GQA)
    compile_spec(str(path), str(tmp_path / "torch"), "torch")
    model = import_model(tmp_path / "torch" / "model.py").build().eval()
    with torch.no_grad():
        _, past = model.step(torch.randint(0, 11, (2, 3)))
    assert tuple(past[0][0].shape) == (2, 2, 3, 2)  # B, G, P, D
    compile_spec(str(path), str(tmp_path / "onnx"), "onnx", kv_cache=True)
    graph = onnx.load(str(tmp_path / "onnx" / "model.onnx")).graph
    past_in = [i for i in graph.input if i.name.startswith("past")]
    assert past_in and all(i.type.tensor_type.shape.dim[1].dim_value == 2 for i in past_in)


def test_a_member_out_of_range_is_a_located_error(tmp_path):
    code, report = _check(tmp_path, GQA.replace("floor((i - 1) * G / A) + 1},\n",
                                                "floor((i - 1) * G / A) + 2},\n"))
    assert code == 1
    assert "m.fgpt:5:" in report and "member 4 reads member 3 of a family of 2" in report


def test_a_parameter_family_is_read_through_a_value(tmp_path):
    text = GQA.replace("k_{floor((i - 1) * G / A) + 1}", "X @ W_{floor((i - 1) * G / A) + 1}^K")
    code, report = _check(tmp_path, text)
    assert code == 1, report
    text = GQA.replace("Attention(X @ W_i^Q, k_{", "Attention(X @ W_i^Q, Wk_{")
    code, report = _check(tmp_path, text)
    assert code == 1 and "`Wk` is not a family" in report


def test_an_index_map_outside_a_family_is_a_member_by_number(tmp_path):
    text = GQA.replace("output y = Softmax(H^(L) @ W_e^T)",
                       "h_j = H^(L) * j for j in 1..2\n  output y = Softmax(h_{G} @ W_e^T)")
    code, report = _check(tmp_path, text)
    assert code == 0, report


def test_the_index_is_exact_integer_arithmetic_in_torch(tmp_path):
    from compiler.backends.torch.codegen import py_poly
    from compiler.elaborate.symbolic import Atom
    i, g, a = (Poly.sym(s) for s in "iGA")
    floor = Poly.sym(Atom("floor", ((i - 1) * g / a,)))
    text = py_poly(floor, {"i": "i", "G": "G", "A": "A"}).text
    for A, G in ((6, 2), (4, 2), (8, 1), (9, 3)):
        want = [((k - 1) * G) // A for k in range(1, A + 1)]
        got = [eval(text, {}, {"i": k, "G": G, "A": A}) for k in range(1, A + 1)]
        assert got == want, text
    ceil = Poly.sym(Atom("ceil", (i / 2,)))
    text = py_poly(ceil, {"i": "i"}).text
    assert [eval(text, {}, {"i": k}) for k in range(1, 6)] == [1, 1, 2, 2, 3]


def test_grouped_query_attention_under_optimize_ort(tmp_path):
    import numpy as np
    import torch
    from test_onnx_parity import random_inputs, session, torch_with_weights

    from compiler.backends.onnx.lower import Lowerer
    path = tmp_path / "gqa.fgpt"
    path.write_text(GQA)
    spec, cfg, model, weights = torch_with_weights(path, tmp_path / "torch")
    inputs = random_inputs(cfg, 8, 2, 8)
    with torch.no_grad():
        want = model(*inputs.values()).numpy()
    graph, _ = Lowerer(spec, spec.symbolic(), cfg.values, optimize="ort",
                       weights=weights).lower()
    assert "Gather" in {n.op_type for n in graph.graph.node}
    got = session(graph).run(None, {k: v.numpy() for k, v in inputs.items()})[0]
    assert float(np.abs(got - want).max()) <= 1e-5


def test_heads_that_do_not_split_into_the_groups_are_a_located_error(tmp_path):
    code, report = _check(tmp_path, GQA.replace("G = 2", "G = 4"))
    assert code == 1
    assert "m.fgpt:5:" in report and "6 query heads do not split evenly into 4" in report


def test_an_odd_rotary_width_is_a_located_error_at_its_use(tmp_path):
    """RoPE turns pairs of features: a head of 5 leaves `d / 2` no whole number. The error
    is where RoPE says so, with the use that gave it the size."""
    r = fgc("compile", "specs/llama.fgpt", *(x for kv in dict(
        L=1, H=15, A=3, G=3, F=8, V=11).items() for x in ("--set", f"{kv[0]}={kv[1]}")),
        "-o", str(tmp_path / "out"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "stdlib.fgpt:" in r.stderr and "the size d/2 is 5/2" in r.stderr
    assert "d = 5, from the use at specs/llama.fgpt:" in r.stderr
    assert not (tmp_path / "out").exists()
