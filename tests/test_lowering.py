"""Decisions the lowering makes once for both backends: parameter initialisation from the
declaration, what `fgc check` refuses because no backend can lower it, lookups (OneHot(x)
@ W), what a layer body computes alike in every layer, and the names of the run lengths."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import fgc
from test_torch_backend import import_model

from compiler.backends.onnx.lower import Lowerer
from compiler.emit import compile_spec
from compiler.pipeline import load

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

INIT = """\
model Init {
  hyper V = 7, n = 4, H = 8
  input x: {1..V}^n
  param W_e: R[V, H]
  param bias: R[H] = 0, gain: R[H] = 1
  param beta: R[H]   # a name LayerNorm uses, declared without a start: random
  output y = (OneHot(x) @ W_e) * gain + bias + beta
}
"""


def test_parameters_start_where_they_are_declared_in_both_backends(tmp_path):
    path = tmp_path / "init.fgpt"
    path.write_text(INIT)
    compile_spec(str(path), str(tmp_path / "torch"), "torch")
    state = import_model(tmp_path / "torch" / "model.py").build().state_dict()
    compile_spec(str(path), str(tmp_path / "onnx"), "onnx")
    graph = onnx.load(str(tmp_path / "onnx" / "model.onnx")).graph
    onnx_state = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    for values in ({k: v.numpy() for k, v in state.items()}, onnx_state):
        assert np.all(values["bias"] == 0) and np.all(values["gain"] == 1)
        assert 0.0 < float(np.std(values["beta"])) < 0.1  # N(0, 0.02²), not zeros
        assert 0.0 < float(np.std(values["W_e"])) < 0.1


def test_a_start_other_than_0_or_1_is_located(tmp_path):
    path = tmp_path / "bad.fgpt"
    path.write_text(INIT.replace("gain: R[H] = 1", "gain: R[H] = 2"))
    r = fgc("check", str(path))
    assert r.returncode == 1
    assert "bad.fgpt:5:" in r.stderr and "starts at 0 or 1" in r.stderr


GROUPED = """\
module GQA[A, G, D](X: R[n, H], Mask: R[n, n]) -> R[n, H] {
  GQA(X, Mask) = Concat(head_1, ..., head_A) @ W^O
    where head_i = Attention(X @ W_i^Q, X @ W^K[:, (i - 1) * D + 1 .. i * D], X @ W^V,
                             Mask) for i in 1..A
  param W_i^Q: R[H, D] for i in 1..A
  param W^K: R[H, A * D], W^V: R[H, D], W^O: R[A * D, H]
}
model Grouped {
  hyper V = 11, n = 8, H = 8, A = 2, G = 1, D = H / A
  input x: {1..V}^n
  param W_e: R[V, H]
  output y = GQA(OneHot(x) @ W_e, Mask^AR)
}
"""


def test_check_refuses_a_slice_that_moves_with_the_member_index(tmp_path):
    """Neither backend batches a slice whose bounds depend on the head: check says so at
    the slice, with help, instead of compile failing at the model line."""
    path = tmp_path / "gqa.fgpt"
    path.write_text(GROUPED)
    r = fgc("check", str(path))
    assert r.returncode == 1
    assert "gqa.fgpt:3:" in r.stderr and "depends on the member index `i`" in r.stderr
    assert "help:" in r.stderr
    r = fgc("compile", str(path), "--target", "onnx", "-o", str(tmp_path / "out"))
    assert r.returncode == 1 and "gqa.fgpt:3:" in r.stderr
    assert not (tmp_path / "out").exists()


GROUPED_CONDITION = """\
model Grouped {
  hyper L = 3, H = 8, A = 2, D = H / A, F = 4 * H, V = 11, n = 6
  input x: {1..V}^n
  param W_e: R[V, H]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {
    H^(l) = H^(l-1) + (attn: MH(LN(H^(l-1)), Mask^AR) if (l is odd or l == 2) and L > 5
                       else ffn: FF^GELU(LN(H^(l-1))))
  }
  output probs = Softmax(H^(L) @ W_e^T)
}
"""


def test_a_grouped_layer_condition_means_the_same_in_both_backends(tmp_path):
    """`(a or b) and c` keeps its grouping from the elaborator's text to both backends:
    with L = 3 no layer has attention (read as `a or (b and c)`, the odd ones would)."""
    from test_backend_constructs import both_backends
    assert max(both_backends(tmp_path, GROUPED_CONDITION, lengths=(6, 3))) <= 1e-5
    code = (tmp_path / "torch" / "model.py").read_text()
    assert "(self.l % 2 == 1 or self.l == 2) and self.config.L > 5" in code


# ---------------------------------------------------------------- lookups (lowering/lookups.py)

LOOKUPS = """\
model Lookups {
  hyper V = 7, n = 6, H = 8, A = 2, D = H / A
  input x: {1..V}^n
  input t: {0..1}^n
  param W_e: R[V, H]
  param W_t: R[2, H]
  param W_i^f: R[V, H] for i in 1..A
  param W_i^h: R[H, D] for i in 1..A
  O = OneHot(x)
  E = O @ W_e + OneHot(t) @ W_t + OneHot(x) @ W_2^f + OneHot(x) @ (W_e * 2)
  z_i = OneHot(x) @ W_i^f for i in 1..A
  h_i = OneHot(x) @ W_e @ W_i^h for i in 1..A
  output y = E + z_1 + z_2 + sum(O) + (h_1 @ W_1^h^T + h_2 @ W_2^h^T)
}
"""


def _prepared(tmp_path, text: str):
    from compiler.lowering import prepare
    path = tmp_path / "spec.fgpt"
    path.write_text(text)
    cfg = load(str(path)).symbolic()
    return prepare(cfg.model, cfg.functions)


def _eqns(model):
    from compiler.elaborate import ir
    return [e for item in model.body
            for e in (item.body if isinstance(item, ir.Loop) else [item])]


def test_a_one_hot_times_a_table_is_a_lookup_with_the_ids_offset(tmp_path):
    """A table the whole batch shares (a parameter, a fixed member of a family, a value
    computed from parameters) is read by row; the offset of the ids (1-based x, 0-based t)
    is the lookup's own, and each lookup is located at its product."""
    model, _ = _prepared(tmp_path, LOOKUPS)
    eqns = _eqns(model)
    lookups = [e for e in eqns if e.op == "lookup"]
    tables = [(e.ins[0].name, str(e.ins[1]), str(e.attrs["lo"])) for e in lookups]
    assert tables[:3] == [("x", "W_e", "1"), ("t", "W_t", "0"), ("x", "W^f[2]", "1")]
    [twice] = [e for e in eqns if e.outs[0].name == tables[3][1]]
    assert tables[3][::2] == ("x", "1") and twice.op == "mul"  # W_e * 2
    assert all(e.span.line == 10 for e in lookups[:4])
    # inside a family, a table shared by every member is looked up too (h_i's first product)
    assert ("x", "W_e", "1") == tables[4] and lookups[4].span.line == 12
    assert lookups[4].family is not None
    # O is read elsewhere (sum(O)): it stays, and so does the OneHot a family multiplies
    calls = [e for e in eqns if e.op == "call" and e.attrs["module"] == "OneHot"]
    assert [e.outs[0].name for e in calls if e.family is None] == ["O"]
    [z] = [e for e in eqns if e.outs[0].name == "z"]
    assert z.op == "matmul" and str(z.ins[1]) == "W^f[i]"  # a member per member: no lookup


def test_lookups_compute_what_the_one_hot_products_did(tmp_path):
    from test_backend_constructs import both_backends
    assert max(both_backends(tmp_path, LOOKUPS, lengths=(6, 3))) <= 1e-5
    code = (tmp_path / "torch" / "model.py").read_text()
    # the token table's lookup, split along the vocabulary under parallelize() (tp_lookup)
    # (its rows summed over the ranks, or reduce-scattered along the positions, -2)
    assert "tp_lookup(x, local(self.W_e), self.tp, self.sp, -2)" in code
    assert "embedding(t, self.W_t)" in code
    assert "embedding(x - 1, " not in code  # x is held 0-based: it is the row as it is


LOOKUPS_IN_LAYERS = """\
module Embed[H](x: {a..b}^n) -> R[n, H] {
  Embed(x) = OneHot(x) @ W
  param W: R[b - a + 1, H]
}
model Layered {
  hyper L = 2, H = 8, A = 2, D = H / A, F = 4 * H, V = 11, n = 6
  input x: {1..V}^n
  param W_e: R[V, H]
  O = OneHot(x)
  H^(0) = O @ W_e + emb: Embed[H](x)
  layers l in 1..L {
    H^(l) = H^(l-1) + MH(LN(H^(l-1)), Mask^AR) + O @ W_e
  }
  output probs = Softmax(H^(L) @ W_e^T)
}
"""


def test_a_lookup_reads_through_bodies_and_modules(tmp_path):
    """O, made before the layers, is a lookup inside them and then goes; a module's own
    product with its parameter is a lookup in the module, from its first id a."""
    from compiler.elaborate import ir
    model, functions = _prepared(tmp_path, LOOKUPS_IN_LAYERS)
    assert not any(e.op == "call" and e.attrs["module"] == "OneHot" and e.family is None
                   and e.outs[0].name == "O" for e in _eqns(model))
    [loop] = [item for item in model.body if isinstance(item, ir.Loop)]
    inside = [e for e in loop.body if e.op == "lookup"]
    assert [(e.ins[0].name, str(e.ins[1])) for e in inside] == [("x", "W_e")]
    [embed] = [e for e in functions["Embed"].eqns if e.op == "lookup"]
    assert embed.ins[0].name == "x" and str(embed.attrs["lo"]) == "a"
    from test_backend_constructs import both_backends
    assert max(both_backends(tmp_path, LOOKUPS_IN_LAYERS, lengths=(6, 3))) <= 1e-5


# ---------------------------------------------------------------- layers (lowering/layers.py)

HOISTED = """\
module Mask^Band[n, c] -> R[n, n] {
  Mask^Band[i, j] = 0 if j <= i and (j > i - c or not (n > c)) else -inf
}
model Hoisted {
  hyper L = 3, H = 8, A = 2, D = H / A, F = 4 * H, V = 11, n = 8, c = 3
  input x: {1..V}^n
  param W_e: R[V, H]
  param W_p: R[n, H]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {
    H^(l) = H^(l-1) + MH(LN(H^(l-1)), Mask^Band[n, c]) + W_p * 2 + W_p * l + OneHot(x) @ W_e
  }
  output probs = Softmax(H^(L) @ W_e^T)
}
"""


def test_what_every_layer_computes_alike_is_computed_once_in_both_backends(tmp_path):
    """The mask, W_p * 2 and the lookup of x do not change from layer to layer; W_p * l,
    the modules with parameters and what reads H^(l-1) do. The torch module computes the
    first before its loop, the ONNX graph at layer 1 only, with the same numbers."""
    from compiler.elaborate import ir
    from compiler.lowering.layers import invariant
    model, functions = _prepared(tmp_path, HOISTED)
    [loop] = [item for item in model.body if isinstance(item, ir.Loop)]
    once = invariant(loop, functions)
    assert [(e.op, e.attrs.get("module"), [str(o) for o in e.ins]) for e in once] == [
        ("call", "Mask^Band", []), ("mul", None, ["W_p", "2"]), ("lookup", None, ["x", "W_e"])]
    from test_backend_constructs import both_backends
    assert max(both_backends(tmp_path, HOISTED)) <= 1e-5
    code = (tmp_path / "torch" / "model.py").read_text()
    layer, model_class = code.split("class HoistedLayer(")[1].split("class Hoisted(")
    assert "embedding(" not in layer and "W_p * 2" not in layer and "W_p * self.l" in layer
    assert model_class.count("tp_lookup(x, local(self.W_e), self.tp") == 2
    spec = load(str(tmp_path / "spec.fgpt"))
    graph, _ = Lowerer(spec, spec.symbolic(), spec.configure(None, {}).values).lower()
    gathers = [n for n in graph.graph.node if n.op_type == "Gather" and "W_e" in n.input]
    assert len(gathers) == 2  # H^(0)'s and the layers' one
    assert sum(n.op_type == "Mul" and n.name.startswith("layer") for n in graph.graph.node) \
        == 1 + 3  # W_p * 2 once, W_p * l in each layer


# ---------------------------------------------------------------- run lengths

LENGTHS = """\
model Lengths {
  hyper V = 11, n^src = 6, T_m = 2, m = 5, H = 4
  input x: {1..V}^n^src
  input y: {1..V}^m
  param W_e: R[V, H]
  X = OneHot(x) @ W_e
  Y = OneHot(y) @ W_e
  output z = Y @ X^T @ X * T_m
}
"""


def test_both_backends_call_each_run_length_the_same(tmp_path):
    """One name per length read off the inputs: `T` alone, `T_<symbol>` for several, the
    symbol spelled as an identifier and clear of the hyperparameters' names (`T_m` is one
    here), in the torch module's variables and the ONNX graph's axes alike."""
    from compiler.lowering.signature import run_lengths
    model, functions = _prepared(tmp_path, LENGTHS)
    assert run_lengths(model, functions) == {"m": "T_m_", "n^src": "T_n_src"}
    from test_backend_constructs import both_backends
    assert max(both_backends(tmp_path, LENGTHS, lengths=(5, 2))) <= 1e-5
    code = (tmp_path / "torch" / "model.py").read_text()
    assert "T_n_src = x.shape[1]" in code and "T_m_ = y.shape[1]" in code
    spec = load(str(tmp_path / "spec.fgpt"))
    graph, _ = Lowerer(spec, spec.symbolic(), spec.configure(None, {}).values).lower()
    axes = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in graph.graph.input}
    assert axes == {"x": ["batch", "T_n_src"], "y": ["batch", "T_m_"]}


# ---------------------------------------------------------------- layouts

SHIFTS = """\
model Shifts {
  hyper V = 9, n = 5, H = 4
  input x: {1..V}^n
  param W_e: R[V, H]
  param W_p: R[n, H]
  output y = OneHot(x - 1 + 1) @ W_e + OneHot(argmax(OneHot(x) @ W_e @ W_e^T)) @ W_e
}
"""


def _layouts(model, functions):
    from compiler.elaborate.ir import Loop
    bodies = [fn.eqns for fn in functions.values()]
    bodies += [item.body if isinstance(item, Loop) else [item] for item in model.body]
    return [(e, v) for eqns in bodies for e in eqns for v in e.outs]


@pytest.mark.parametrize("path", sorted(str(p) for p in __import__("pathlib").Path(
    "specs").glob("*.fgpt")))
def test_every_lowered_value_carries_its_layout(path):
    """After the lowering every value says where its axes are: as many own axes as its
    type, a family axis exactly where the family rule puts one, integers held as given."""
    from compiler.lowering import prepare
    spec = load(path)
    cfg = spec.configure(spec.presets()[0] if spec.presets() else None, {})
    for e, v in _layouts(*prepare(cfg.model, cfg.functions)):
        lay = v.layout
        assert lay is not None, f"{e.op} -> {v.name} has no layout"
        shape = v.type.member().shape
        assert lay.rank is None or lay.rank == len(shape), (v.name, lay)
        assert lay.held is None or v.type.dtype == "int", (v.name, lay)


def test_integers_are_held_where_the_lowering_says_in_both_backends(tmp_path):
    """Ids from 1 are held 0-based, `x - 1 + 1` is the same entries with the offset moved
    (nothing computed), positions from argmax are held 0-based into a lookup; both
    backends compute the spec's numbers."""
    from compiler.lowering import prepare
    path = tmp_path / "shifts.fgpt"
    path.write_text(SHIFTS)
    cfg = load(str(path)).configure(None, {})
    model, functions = prepare(cfg.model, cfg.functions)
    held = {e.op: v.layout.held for e, v in _layouts(model, functions)
            if v.type.dtype == "int"}
    assert str(held["argmax"]) == "1" and held["add"] is not None
    assert str(held["add"]) == "1"  # x (held 1) - 1 + 1: held 1 again, no Add in the graph
    from test_backend_constructs import both_backends
    assert max(both_backends(tmp_path, SHIFTS, lengths=(5, 3))) <= 1e-5


JOINED = """\
model Joined {
  hyper V = 9, n = 5, H = 4
  input x: {1..V}^n
  output y = concat(x, x - 1) * 1.0
}
"""


def test_ids_held_differently_are_joined_as_the_spec_values(tmp_path):
    """concat of ids held 0-based (x) and of ids held as they are (x - 1): the join holds
    the spec's values, so each side is moved to them first, in both backends."""
    from test_backend_constructs import both_backends

    from compiler.lowering import prepare
    path = tmp_path / "joined.fgpt"
    path.write_text(JOINED)
    cfg = load(str(path)).configure(None, {})
    model, functions = prepare(cfg.model, cfg.functions)
    (join,) = [v for e, v in _layouts(model, functions) if e.op == "concat"]
    assert join.layout.held is None
    assert max(both_backends(tmp_path, JOINED, lengths=(5, 3))) <= 1e-5
