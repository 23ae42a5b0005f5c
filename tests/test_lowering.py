"""Decisions the lowering makes once for both backends: parameter initialisation from the
declaration, and what `fgc check` refuses because no backend can lower it."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import fgc
from test_torch_backend import import_model

from compiler.emit import compile_spec

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
    assert "(self.l % 2 == 1 or self.l == 2) and L > 5" in code
