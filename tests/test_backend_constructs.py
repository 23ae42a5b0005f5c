"""Constructs both backends lower and agree on (specs/reformer.fgpt uses each of them).

- A model input that is a family (`G_r: R[2, H] for r in 1..N`): one tensor, fed with the
  members' axis right after the batch.
- A size computed from the run's length with `%` (a length padded to a multiple of c).
- A module table (a mask) used under a layer condition: it is made once for the whole
  model, and a conditional expression keeps its brackets when its line is wrapped.
- `not` of a condition on sizes alone.
- Ties: `argsort` is stable and `argmax` takes the first maximum.
- `--set` for a hyperparameter whose name has a superscript.
Each small spec is compiled to PyTorch and to ONNX with the same weights and run on the same
inputs, at two lengths.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import fgc
from test_onnx_parity import random_inputs, session, torch_with_weights
from test_torch_backend import import_model

from compiler.backends.onnx.lower import Lowerer
from compiler.emit import compile_spec
from compiler.pipeline import load

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

INPUT_FAMILIES = """\
model Families {
  hyper V = 11, n = 8, H = 4, N = 3, c = 3
  input x: {1..V}^n
  input G_r: R[2, H] for r in 1..N   # matrices: fed (batch, N, 2, H)
  input u_r: R[H] for r in 1..N      # vectors: fed (batch, N, H)
  param W_e: R[V, H]
  X = OneHot(x) @ W_e
  z_r = (X + u_r) @ G_r^T for r in 1..N
  output y = concat(z_1, ..., z_N) * (n + (c - n % c) % c)   # n padded to a multiple of c
}
"""

LAYER_CONDITION = """\
# causal, and a band of c positions once the run is longer than c
module Mask^Band[n, c] -> R[n, n] {
  Mask^Band[i, j] = 0 if j <= i and (j > i - c or not (n > c)) else -inf
}

model Alternating {
  hyper L = 3, H = 8, A = 2, D = H / A, F = 4 * H, V = 11, n = 8, w^band = 3
  input x: {1..V}^n
  param W_e: R[V, H]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {
    H^(l) = H^(l-1) + (attention_in_a_band: MH(LN(H^(l-1)), Mask^Band[n, w^band]) if l is odd
                       else feed_forward_network: FF^GELU(LN(H^(l-1))))
  }
  output probs = Softmax(H^(L) @ W_e^T)
}
"""


def both_backends(tmp_path, text: str, lengths=(8, 2)) -> list[float]:
    """Worst differences between the PyTorch module and every ONNX graph, one per length."""
    path = tmp_path / "spec.fgpt"
    path.write_text(text)
    spec, cfg, model, weights = torch_with_weights(path, tmp_path / "torch")
    worst = []
    for T in lengths:
        inputs = random_inputs(cfg, T, 2, T)
        with torch.no_grad():
            ref = model(*inputs.values()).numpy()
        diff = 0.0
        for opset in (23, 18):
            onnx_model, _ = Lowerer(spec, spec.symbolic(), cfg.values, opset=opset,
                                    weights=weights).lower()
            got = session(onnx_model).run(None, {k: v.numpy() for k, v in inputs.items()})[0]
            assert got.shape == ref.shape
            diff = max(diff, float(np.abs(got - ref).max()))
        worst.append(diff)
    return worst


def test_input_families_and_padded_lengths(tmp_path):
    assert max(both_backends(tmp_path, INPUT_FAMILIES)) <= 1e-5
    spec = load(str(tmp_path / "spec.fgpt"))
    onnx_model, _ = Lowerer(spec, spec.symbolic(), spec.configure(None, {}).values).lower()
    fed = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
           for i in onnx_model.graph.input}
    assert fed == {"x": ["batch", "T"], "G": ["batch", 3, 2, 4], "u": ["batch", 3, 4]}


def test_module_tables_under_a_layer_condition(tmp_path):
    """The band, which odd layers use, is made once for the whole model."""
    assert max(both_backends(tmp_path, LAYER_CONDITION)) <= 1e-5
    code = (tmp_path / "torch" / "model.py").read_text()
    assert "self.Mask_Band = Mask_Band()\n" in code.split("class Alternating(")[1]


TIES = """\
model Ties {
  hyper V = 3, n = 12
  input x: {1..V}^n
  output s = argsort(x)
  output a = argmax(concat(OneHot(x), OneHot(x)))
}
"""


def test_ties_sort_stably_and_take_the_first_maximum(tmp_path):
    """Three values over twelve positions: argsort keeps equal ids in position order and
    argmax takes the first of two equal maxima, in PyTorch and in ONNX alike."""
    path = tmp_path / "ties.fgpt"
    path.write_text(TIES)
    compile_spec(str(path), str(tmp_path / "torch"), "torch")
    model = import_model(tmp_path / "torch" / "model.py").build()
    spec = load(str(path))
    onnx_model, _ = Lowerer(spec, spec.symbolic(), spec.configure(None, {}).values).lower()
    x = torch.randint(0, 3, (4, 12), generator=torch.Generator().manual_seed(0))
    stable = np.argsort(x.numpy(), axis=-1, kind="stable") + 1  # 1-based, as the spec's
    for s, a in (model(x), session(onnx_model).run(None, {"x": x.numpy()})):
        assert np.array_equal(np.asarray(s), stable)
        assert np.array_equal(np.asarray(a), x.numpy() + 1)


def test_set_takes_names_with_a_superscript(tmp_path):
    path = tmp_path / "spec.fgpt"
    path.write_text(LAYER_CONDITION)
    r = fgc("params", str(path), "--set", "w^band=2", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total"] > 0
    r = fgc("params", str(path), "--set", "w^^band=2")
    assert r.returncode == 2 and "not a hyperparameter name" in r.stderr


RATIO_OF_SIZES = """\
model Ratio {
  hyper V = 11, n = 8, H = 6, D = 6, D^att = 10, E = 4
  input x: {1..V}^n
  param W_e: R[V, H]
  X = OneHot(x) @ W_e
  output y = X * sqrt(D / D^att) + X * (E / D^att) - X * (H * E / (D^att * D))
}
"""


def test_a_ratio_of_sizes_is_a_real_number_in_both_backends(tmp_path):
    """`D / D^att` where a value is computed is the real ratio (0.6 for 6 / 10), as ONNX
    computes it, not Python's integer division of the sizes (0) in the PyTorch module."""
    assert max(both_backends(tmp_path, RATIO_OF_SIZES)) <= 1e-5
    _, _, model, _ = torch_with_weights(tmp_path / "spec.fgpt", tmp_path / "torch")
    x = torch.randint(0, 11, (1, 8), generator=torch.Generator().manual_seed(0))  # 0-based
    with torch.no_grad():
        want = model.W_e[x] * (0.6 ** 0.5 + 0.4 - 0.4)
        assert float((model(x) - want).abs().max()) <= 1e-6
