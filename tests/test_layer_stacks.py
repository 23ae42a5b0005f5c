"""Every layer's value after the layers (`X^(1..L)`, `X^(0..L-1)`), state outputs (`Mem'`)
and sizes that take max/min of run lengths: the language's rules and both backends.

A tiny model returns stacks, a non-carried last-layer value and a slice whose start depends
on the run's length; the PyTorch module and the ONNX graph must give the same tensors, and
those tensors must be what the stacks mean (layer k of `H^(1..L)` is layer k+1's input).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from conftest import fgc

from compiler.backends.onnx.lower import Lowerer
from compiler.emit import compile_spec
from compiler.pipeline import load
from compiler.weights import parameter_keys

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

STACKS = """
model Stacks {
  hyper L = 3, H = 4, V = 7, n = 5, F = 8
  input x: {1..V}^n
  param W_e: R[V, H]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {
    G^(l) = H^(l-1) * 2
    H^(l) = LN(FF^ReLU(H^(l-1)) + H^(l-1))
  }
  output outs = H^(1..L)
  output ins = H^(0..L-1)
  output twice = G^(1..L)
  output last = G^(L)
  output tail = H^(L)[max(1, n - 1)..n, :]
}
"""


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stacks")
    spec = folder / "stacks.fgpt"
    spec.write_text(STACKS)
    compile_spec(str(spec), str(folder / "torch"), "torch", None, {})
    compile_spec(str(spec), str(folder / "onnx"), "onnx", None, {})
    module_spec = importlib.util.spec_from_file_location("stacks_model",
                                                         folder / "torch" / "model.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.build().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model, folder / "onnx" / "model.onnx"


@pytest.mark.parametrize("T", [1, 3, 5])
def test_stacks_mean_every_layer(compiled, T):
    model, _ = compiled
    x = torch.randint(0, 7, (2, T), generator=torch.Generator().manual_seed(T))
    with torch.no_grad():
        outs, ins, twice, last, tail = model(x)
    assert outs.shape == ins.shape == twice.shape == (2, 3, T, 4)
    torch.testing.assert_close(outs[:, :-1], ins[:, 1:])  # layer k's result, layer k+1's input
    torch.testing.assert_close(twice, 2 * ins)
    torch.testing.assert_close(last, twice[:, -1])
    torch.testing.assert_close(tail, outs[:, -1, -2:])  # the last two rows, or the one there is


@pytest.mark.parametrize("T", [1, 3, 5])
def test_onnx_stacks_equal_torch(compiled, T):
    model, path = compiled
    x = torch.randint(0, 7, (2, T), generator=torch.Generator().manual_seed(T))
    with torch.no_grad():
        want = model(x)
    # the graph with the module's weights
    parsed = load(str(path.parent.parent / "stacks.fgpt"))
    cfg = parsed.configure(None, {})
    state = model.state_dict()
    weights = {o: state[t].numpy() for t, o in parameter_keys(cfg)}
    graph, _ = Lowerer(parsed, parsed.symbolic(), cfg.values, weights=weights).lower()
    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x.numpy()})
    assert [o.name for o in session.get_outputs()] == ["outs", "ins", "twice", "G^(L)", "tail"]
    for w, g in zip(want, got):
        assert g.shape == tuple(w.shape)
        np.testing.assert_allclose(g, w.numpy(), atol=1e-6)


@pytest.mark.parametrize("line, message", [
    ("output bad = H^(2..L)", "a stack runs over all the layers"),
    ("output bad = G^(0..L-1)", "a stack runs over all the layers"),
    ("output bad = Q^(1..L)", "no `layers` block before it defines `Q^(l)`"),
])
def test_stack_errors(tmp_path, line, message):
    spec = tmp_path / "bad.fgpt"
    spec.write_text(STACKS.replace("  output tail", f"  {line}\n  output tail"))
    r = fgc("check", str(spec))
    assert r.returncode == 1, r.stdout
    assert message in r.stdout + r.stderr
    assert "Traceback" not in r.stderr


def test_stack_inside_the_layers_is_an_error(tmp_path):
    spec = tmp_path / "bad.fgpt"
    spec.write_text(STACKS.replace("    G^(l) = H^(l-1) * 2", "    G^(l) = H^(l-1) * 2\n"
                                   "    K^(l) = H^(1..L)"))
    r = fgc("check", str(spec))
    assert r.returncode == 1
    assert "it belongs after the layers" in r.stdout + r.stderr


STATE = """
model Recurrent {
  hyper L = 2, H = 4, V = 7, n = 3, m = 4, p = m
  input x: {1..V}^n
  input S: R[L, p, H]
  param W_e: R[V, H]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {
    Ht^(l) = vconcat(S[l, :, :], H^(l-1))
    N^(l) = Ht^(l)[p + n - min(m, p + n) + 1..p + n, :]
    H^(l) = LN(H^(l-1))
  }
  output y = H^(L) @ W_e^T
  output S' = N^(1..L)
}
"""


def test_state_output_must_fit_its_input(tmp_path):
    spec = tmp_path / "state.fgpt"
    spec.write_text(STATE)
    assert fgc("check", str(spec)).returncode == 0
    spec.write_text(STATE.replace("output S' = N^(1..L)", "output S' = Ht^(1..L)"))
    r = fgc("check", str(spec))
    assert r.returncode == 1
    assert "output `S'` is the next `S`, but it is R[2, 7, 4] and `S` is R[2, 4, 4]" in \
        r.stdout + r.stderr


def test_run_segments_needs_a_state(tmp_path):
    from runtime import RuntimeError_, load, run_segments
    spec = tmp_path / "stateless.fgpt"
    spec.write_text(STATE.replace("output S' = N^(1..L)", "output N = N^(1..L)"))
    compile_spec(str(spec), str(tmp_path / "onnx"), "onnx", None, {})
    with pytest.raises(RuntimeError_, match="no state output"):
        run_segments(load(tmp_path / "onnx", provider="cpu", cache=False),
                     {"x": np.zeros((1, 5), np.int64)})


def test_run_segments_carries_the_state(tmp_path):
    """Segments of 3, 3 and 1 tokens: the state grows to 3, then 4 = m rows, and holds the
    last inputs of each layer."""
    from runtime import load, run_segments
    spec = tmp_path / "state.fgpt"
    spec.write_text(STATE)
    compile_spec(str(spec), str(tmp_path / "onnx"), "onnx", None, {})
    model = load(tmp_path / "onnx", provider="cpu", cache=False)
    x = np.array([[1, 2, 3, 4, 5, 6, 0]], np.int64)
    out, state = run_segments(model, {"x": x})
    assert out["y"].shape == (1, 7, 7)
    assert state["S"].shape == (1, 2, 4, 4)
    # layer 1 reads the embedding: its memory is the last four tokens' embedding rows
    W_e = next(v for k, v in _initializers(tmp_path / "onnx" / "model.onnx").items()
               if k == "W_e")
    np.testing.assert_allclose(state["S"][0, 0], W_e[x[0, -4:]], atol=1e-6)
    _, short = run_segments(model, {"x": x[:, :2]}, segment=1)
    assert short["S"].shape == (1, 2, 2, 4)


def _initializers(path) -> dict:
    import onnx
    from onnx import numpy_helper
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
