"""Every primitive, lowered by both backends, computes the same values.

One table: each row is a tiny model spec that exercises one primitive (some a primitive in
a second situation: matmul with a vector, index by a range or by a tensor, iota through a
comprehension, integer arithmetic on token ids, ...). Each row is compiled once to PyTorch
(`compile_spec(..., "torch")`), its parameters drawn afresh from a seeded generator, and
the same tensors are given to the ONNX lowering (`Lowerer`) at opset 23, opset 18 and with
`optimize="ort"`; onnxruntime's outputs must match torch's: reals within 1e-5, integers
exactly, and torch's must have the spec's types (a sum of ids is real). Inputs are a batch
of 2 sequences of T = 5 tokens where the spec allows n = 8, so the dynamic axes are
exercised. Outputs are never a final Softmax, so each primitive's own values are compared.

Both backends give integer outputs as the spec's values (argmax, argsort and invperm
1-based), so integer outputs are compared as they come; an output that is an input is the
input as it was fed (0-based ids), in both (row `output-input`). Rows that reveal a backend
bug are xfail(strict=True), the bug in the reason.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_torch_backend import import_model

from compiler.elaborate import ir
from compiler.elaborate.primitives import PRIMITIVES
from compiler.elaborate.symbolic import Poly
from compiler.emit import compile_spec
from compiler.pipeline import load
from compiler.weights import parameter_keys

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from compiler.backends.onnx.lower import Lowerer  # noqa: E402  (needs onnx)

BATCH, T = 2, 5  # the spec's n is 8: shorter sequences exercise the dynamic axes
ATOL = 1e-5
VARIANTS = {"opset23": {"opset": 23}, "opset18": {"opset": 18},
            "ort": {"opset": 23, "optimize": "ort"}}


def spec(*outputs: str, body: str = "", params: str = "", inputs: str = "x: {1..V}^n",
         hyper: str = "n = 8, H = 4, V = 50", modules: str = "") -> str:
    """A model with tokens x, embeddings X = OneHot(x) @ W_e (n x H), `body` and outputs."""
    param_line = "W_e: R[V, H]" + (f", {params}" if params else "")
    outs = "\n".join(f"  output {o}" for o in outputs)
    return f"""{modules}
model P {{
  hyper {hyper}
  input {inputs}
  param {param_line}
  X = OneHot(x) @ W_e
{body}
{outs}
}}
"""


def row(name: str, text: str, sets: dict | None = None, xfail: str | None = None):
    marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
    return pytest.param(text, sets or {}, id=name, marks=marks)


W = "W: R[H, H]"
B = "b: R[H]"
WV = "w: R[H]"
V_BODY = "  v = X @ w"  # a real vector, one entry per position

# module texts used by some rows
GATE = """
module Gate(X: R[n, H], x: {1..V}^n) -> R[n, H] {
  Gate(X, x)[i, j] = X[i, j] if x[i] > 25 else -X[i, j]
}"""
RAMP = """
module Ramp[n, H] -> R[n, H] {
  Ramp[i, j] = i * 10 + j
}"""
TRI = """
module Tri[n] -> R[n, n] {
  Tri[i, j] = 1 if j <= i else 0
}"""
HALF = """
module Half[n, H] -> R[n, H] {
  Half[i, j] = 0.5
}"""
STRIPE = """
module Stripe[n, H] -> R[n, H] {
  Stripe[i, j] = 1 if (i - 1) % 3 == 0 or j % 2 == 0 else 0
}"""
GATHER = """
module Gather(X: R[n, H], z: Perm[n]) -> R[n, H] {
  Gather(X, z)[i, j] = X[z[i], j]
}"""
SAMEID = """
module SameId(x: {1..V}^n) -> R[n, n] {
  SameId(x)[i, j] = 1 if x[i] % 3 == x[j] % 3 else 0
}"""
SHIFT = """
module Shift(X: R[n, k]) -> R[n, k] {
  Shift(X)[i, j] = X[i, 1 + max(0, j - 2)]
}"""
IDROW = """
module IdRow[H](x: {1..V}^n) -> R[n, H] {
  IdRow(x)[i, j] = x[i] + j
}"""
EMBED = """
module Embed(W: R[V, H], x: {1..V}^n) -> R[n, H] {
  Embed(W, x)[i, j] = W[x[i], j]
}"""
PARITY = """
module Parity(X: R[n, H], x: {1..V}^n) -> R[n, H] {
  Parity(X, x)[i, j] = X[i, j] if x[i] % 2 == 0 else -X[i, j]
}"""

# Rows that found a bug are xfail, strict: a fix shows up as XPASS and the mark must go.
ROWS = [
    # ---------------------------------------------------------------- arithmetic
    row("add", spec("Y = X + b", params=B)),
    row("add-matrix", spec("Y = X + X @ W", params=W)),
    row("add-scalar", spec("Y = X + 0.5")),
    row("sub", spec("Y = X - b", params=B)),
    row("sub-scalar-left", spec("Y = 1 - X")),
    row("mul", spec("Y = X * b", params=B)),
    row("mul-scalar", spec("Y = 3 * X")),
    row("div", spec("Y = X / (abs(b) + 1)", params=B)),
    row("div-scalar-left", spec("Y = 1 / (abs(X) + 1)")),
    row("neg", spec("Y = -X")),
    row("max-clamp", spec("Y = max(0, X)")),
    row("max-tensor", spec("Y = max(X, X @ W)", params=W)),
    row("min-clamp", spec("Y = min(X, 0.25)")),
    row("min-tensor", spec("Y = min(X, X @ W)", params=W)),
    row("pow", spec("Y = pow(abs(X) + 0.5, 1.5)")),
    row("pow-integer-exponent", spec("Y = pow(X, 3)")),
    row("pow-tensor-exponent", spec("Y = pow(abs(X) + 0.5, X)")),
    row("exp", spec("Y = exp(X)")),
    row("log", spec("Y = log(abs(X) + 0.5)")),
    row("sqrt", spec("Y = sqrt(abs(X) + 0.1)")),
    row("tanh", spec("Y = tanh(2 * X)")),
    row("sigmoid", spec("Y = sigmoid(2 * X)")),
    row("erf", spec("Y = erf(X)")),
    row("sin", spec("Y = sin(3 * X)")),
    row("cos", spec("Y = cos(3 * X)")),
    row("abs", spec("Y = abs(X)")),
    row("floor", spec("Y = floor(4 * X)")),
    row("ceil", spec("Y = ceil(4 * X)")),
    row("floor-log-ids", spec("Y = floor(log(x / 3) / log(5) * 4)")),
    # ---------------------------------------------------------------- integers (token ids)
    row("mod-ids", spec("Y = x % 7")),
    row("add-ids", spec("Y = x + 1")),
    row("sub-ids", spec("Y = x - 1")),
    row("mul-ids", spec("Y = x * 2")),
    row("neg-ids", spec("Y = -x")),
    row("max-ids", spec("Y = max(x, 25)")),
    row("min-ids", spec("Y = min(x, 25)")),
    row("div-ids", spec("Y = x / 4")),
    row("abs-ids", spec("Y = abs(x - 25)")),
    row("sum-ids", spec("Y = sum(x)")),
    row("amax-ids", spec("Y = amax(x)")),
    row("mean-ids", spec("Y = mean(x)")),
    row("sum-segment-ids", spec("Y = sum(t)", inputs="x: {1..V}^n, t: {0, 1}^n")),
    row("index-ids", spec("Y = x[2..3]")),
    row("index-input-ids", spec("Y = X[j, :] * j", inputs="x: {1..V}^n, j: {1..n}")),
    row("concat-ids", spec("Y = concat(x, argmax(X))")),
    row("ids-to-real", spec("Y = v * (x % 5)", body=V_BODY, params=WV)),
    row("segment-ids", spec("Y = X + diag(t) @ Stack[n](b) + diag(1 - t) @ X",
                            inputs="x: {1..V}^n, t: {0, 1}^n", params=B)),
    row("onehot-segment", spec("Y = OneHot(t) @ W_t", inputs="x: {1..V}^n, t: {0, 1}^n",
                               params="W_t: R[2, H]")),
    row("ids-in-comprehension", spec("Y = IdRow(x) * X", modules=IDROW)),
    # ---------------------------------------------------------------- comparisons and logic
    row("eq", spec("Y = v if x % 2 == 0 else -v", body=V_BODY, params=WV)),
    row("ne", spec("Y = v if x % 3 != 0 else 0", body=V_BODY, params=WV)),
    row("lt", spec("Y = v if x < 25 else 2 * v", body=V_BODY, params=WV)),
    row("le", spec("Y = v if x <= 25 else 2 * v", body=V_BODY, params=WV)),
    row("gt", spec("Y = X if X > 0.1 else 0")),
    row("ge", spec("Y = X if X >= -0.1 else X * X")),
    row("and", spec("Y = v if x > 10 and x < 40 else 0", body=V_BODY, params=WV)),
    row("or", spec("Y = v if x < 10 or v > 0 else 0", body=V_BODY, params=WV)),
    row("not", spec("Y = v if not x > 25 else 0", body=V_BODY, params=WV)),
    row("select-ints", spec("Y = 1 if x > 25 else 0")),
    row("select-ids", spec("Y = x if x > 25 else 0")),
    row("select-comprehension", spec("Y = Gate(X, x)", modules=GATE)),
    # ---------------------------------------------------------------- reductions
    row("sum", spec("Y = sum(X)")),
    row("mean", spec("Y = X - mean(X)")),
    row("amax", spec("Y = amax(X)")),
    row("sum-over-positions", spec("Y = sum(v)", body=V_BODY, params=WV)),
    row("amax-over-positions", spec("Y = v - amax(v)", body=V_BODY, params=WV)),
    # ---------------------------------------------------------------- structure
    row("matmul", spec("Y = X @ W", params=W)),
    row("matmul-vector", spec("Y = X @ w", params=WV)),
    row("matmul-row-vector", spec("Y = X[2, :] @ W", params=W)),
    row("matmul-positions", spec("Y = X @ X^T")),
    row("matmul-contract-positions", spec("Y = X^T @ X")),
    row("transpose", spec("Y = (X @ W)^T", params=W)),
    row("concat", spec("Y = concat(X, -X, sum(X))")),
    row("concat-family", spec("Y = concat(y_1, ..., y_A) @ W^O",
                              body="  y_i = tanh(X @ W_i^P) for i in 1..A",
                              params="W_i^P: R[H, D] for i in 1..A, W^O: R[A * D, H]",
                              hyper="n = 8, H = 4, V = 50, A = 2, D = H / A")),
    row("Concat-family", spec("Y = Concat(y_1, ..., y_A)",
                              body="  y_i = X @ W_i^P for i in 1..A",
                              params="W_i^P: R[H, D] for i in 1..A",
                              hyper="n = 8, H = 4, V = 50, A = 2, D = 3")),
    row("concat-parameter", spec("Y = concat(X, W_p)", params="W_p: R[n, H]")),
    row("sum_members", spec("Y = sum(y_1, ..., y_A)",
                            body="  y_i = tanh(X @ W_i^P) for i in 1..A",
                            params="W_i^P: R[H, H] for i in 1..A",
                            hyper="n = 8, H = 4, V = 50, A = 3")),
    row("members-kept-axis", spec("Y = sum(y_1, ..., y_A)",
                                  body="  g = X @ W^g\n"
                                       "  y_i = g[:, i .. i] * (X @ W_i^P) for i in 1..A",
                                  params="W^g: R[H, A], W_i^P: R[H, H] for i in 1..A",
                                  hyper="n = 8, H = 4, V = 50, A = 3")),
    row("keeptopk", spec("Y = exp(keeptopk(X @ W, 2))", params=W)),
    row("keeptopk-softmax", spec("Y = Softmax(keeptopk(X @ W, K)) @ W",
                                 params=W, hyper="n = 8, H = 4, V = 50, K = 3")),
    row("vconcat", spec("Y = vconcat(M, X)", params="M: R[3, H]")),
    row("vconcat-positions", spec("Y = vconcat(X, tanh(X)) @ W", params=W)),
    row("stopgrad", spec("Y = stopgrad(X) * 2")),
    row("index-entry", spec("Y = X[2, 3] * X")),
    row("index-row", spec("Y = X[2, :]")),
    row("index-column-range", spec("Y = X[:, 2..3]")),
    row("index-row-range", spec("Y = X[2..4, :]")),
    row("index-by-input", spec("Y = X[j, :]", inputs="x: {1..V}^n, j: {1..n}")),
    row("index-positions", spec("Y = X + W_p[1..n, :]", params="W_p: R[n, H]")),
    row("positions-broadcast", spec("Y = X + W_p", params="W_p: R[n, H]")),
    row("index-gather", spec("Y = Gather(X, z)", inputs="x: {1..V}^n, z: Perm[n]",
                             modules=GATHER)),
    row("Perm", spec("Y = Perm(X, z)", inputs="x: {1..V}^n, z: Perm[n]")),
    row("index-ids-comprehension", spec("Y = SameId(x) @ X", modules=SAMEID)),
    row("index-computed", spec("Y = Shift(X)", modules=SHIFT)),
    row("iota", spec("Y = X + Ramp", modules=RAMP)),
    row("iota-mask", spec("Y = Tri @ X", modules=TRI)),
    row("iota-mod", spec("Y = Stripe * X", modules=STRIPE)),
    row("broadcast_to-constant", spec("Y = X * Half", modules=HALF)),
    row("broadcast_to-Stack", spec("Y = Stack[n](b)", params=B)),
    row("diag", spec("Y = diag(v)", body=V_BODY, params=WV)),
    row("argmax", spec("Y = argmax(X)")),
    row("argmax-onehot", spec("Y = OneHot(argmax(X)) @ W", params=W)),
    row("onehot-perm", spec("Y = OneHot(invperm(z)) @ X", inputs="x: {1..V}^n, z: Perm[n]")),
    row("argsort-vector", spec("Y = argsort(v)", body=V_BODY, params=WV)),
    row("argsort-matrix", spec("Y = argsort(X)")),
    row("argsort-gather", spec("Y = Perm(X, argsort(v))", body=V_BODY, params=WV)),
    row("invperm", spec("Y = invperm(z)", inputs="x: {1..V}^n, z: Perm[n]")),
    row("invperm-argsort", spec("Y = invperm(argsort(v))", body=V_BODY, params=WV)),
    row("PermMask", spec("Y = PermMask(X @ X^T, z)", inputs="x: {1..V}^n, z: Perm[n]")),
    row("two-outputs", spec("Y = X @ W", "Z = argmax(X)", params=W)),
    # ---------------------------------------------------------------- standard modules
    row("LN", spec("Y = LN(X)")),
    row("Softmax-inner", spec("Y = Softmax(X) @ W", params=W)),
    row("GELU", spec("Y = GELU(X)")),
    row("GELU^tanh", spec("Y = GELU^tanh(X)")),
    row("GELU^erf", spec("Y = GELU^erf(X)")),
    row("FF^ReLU", spec("Y = FF^ReLU(X)", hyper="n = 8, H = 4, V = 50, F = 6")),
    row("MH-causal", spec("Y = MH(X, Mask^AR)", hyper="n = 8, H = 4, V = 50, A = 2, D = 2")),
    row("MH-bidirectional", spec("Y = MH(X, Mask^BD)",
                                 hyper="n = 8, H = 4, V = 50, A = 2, D = 2")),
    row("MHA-banded", spec("Y = MHA(X, tanh(X), X, Mask^ST)",
                           hyper="n = 8, H = 4, V = 50, A = 2, D = 2, w = 2")),
    row("layers", spec("Y = H^(L)", body="""  H^(0) = X * 2
  layers l in 1..L {
    G^(l) = tanh(H^(l-1)) if l is odd else sigmoid(H^(l-1))
    H^(l) = G^(l) + H^(l-1)
  }""", hyper="n = 8, H = 4, V = 50, L = 3")),
    row("layers-module", spec("Y = H^(L)", body="""  H^(0) = X * 2
  layers l in 1..L {
    H^(l) = LN(FF^ReLU(H^(l-1)) + H^(l-1))
  }""", hyper="n = 8, H = 4, V = 50, L = 2, F = 6")),
    row("output-input", spec("Y = z", inputs="x: {1..V}^n, z: Perm[n]")),
    row("layers-model-param", spec("Y = H^(L)", body="""  H^(0) = X * 2
  layers l in 1..L {
    H^(l) = tanh(H^(l-1) @ W) + H^(l-1)
  }""", params=W, hyper="n = 8, H = 4, V = 50, L = 2")),
    row("layers-alias", spec("Y = H^(L)", body="""  H^(0) = X
  layers l in 1..L {
    H^(l) = tanh(H^(l-1)) + H^(l-1)
  }""", hyper="n = 8, H = 4, V = 50, L = 2")),
    row("layers-alias-param", spec("Y = H^(L)", body="""  H^(0) = W_p
  layers l in 1..L {
    H^(l) = tanh(H^(l-1)) + X
  }""", params="W_p: R[n, H]", hyper="n = 8, H = 4, V = 50, L = 2")),
    row("layers-ids", spec("Y = H^(L)", body="""  H^(0) = X
  layers l in 1..L {
    H^(l) = Parity(H^(l-1), x) + OneHot(argmax(H^(l-1))) @ W
  }""", params=W, hyper="n = 8, H = 4, V = 50, L = 2", modules=PARITY)),
    row("sets", spec("Y = X @ W", params=W), {"H": 6, "V": 30}),
]


# ---------------------------------------------------------------- helpers

def inputs_for(cfg, symbolic, seed: int = 0) -> list:
    """Inputs of the spec's types with n = T: tokens 0-based, permutations of 0..T-1, one
    index per sequence below T."""
    gen = torch.Generator().manual_seed(seed)
    env = {k: v.const_value() for k, v in cfg.values.items() if isinstance(v, Poly)}
    env["n"] = T
    out = []
    for v in symbolic.model.inputs:
        t = v.type
        shape = [int(d.evaluate(env)) for d in t.shape]
        if t.perm:
            out.append(torch.stack([torch.randperm(shape[0], generator=gen)
                                    for _ in range(BATCH)]))
        else:
            size = int(t.hi.evaluate(env)) - int(t.lo.evaluate(env)) + 1
            out.append(torch.randint(0, size, (BATCH, *shape), generator=gen))
    return out


class Compiled:
    def __init__(self, tmp: Path, text: str, sets: dict):
        self.path = tmp / "p.fgpt"
        self.path.write_text(text)
        compile_spec(str(self.path), str(tmp / "torch"), "torch", None, sets)
        self.model = import_model(tmp / "torch" / "model.py").build().eval()
        gen = torch.Generator().manual_seed(1234)
        with torch.no_grad():
            for p in self.model.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        self.spec = load(str(self.path))
        self.cfg = self.spec.configure(None, sets)
        self.inputs = inputs_for(self.cfg, self.spec.symbolic())
        with torch.no_grad():
            out = self.model(*self.inputs)
        self.torch_out = [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]
        state = self.model.state_dict()
        self.weights = {onnx: state[name].numpy() for name, onnx in parameter_keys(self.cfg)}

    def onnx(self, **options) -> list:
        model, _ = Lowerer(self.spec, self.spec.symbolic(), self.cfg.values,
                           weights=self.weights, **options).lower()
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        feeds = {v.name: x.numpy() for v, x in zip(self.cfg.model.inputs, self.inputs)}
        names = [o.name for o in self.cfg.model.outputs]
        return sess.run(names, feeds)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """compiled(text, sets) -> Compiled, once per row for the module (a failure too)."""
    cache: dict = {}

    def get(text: str, sets: dict) -> Compiled:
        key = (text, tuple(sorted(sets.items())))
        if key not in cache:
            try:
                cache[key] = Compiled(tmp_path_factory.mktemp("prim"), text, sets)
            except Exception as e:  # re-raised for every variant of the row
                cache[key] = e
        if isinstance(cache[key], Exception):
            raise cache[key]
        return cache[key]

    return get


def assert_same(torch_out: list, onnx_out: list) -> None:
    assert len(torch_out) == len(onnx_out)
    for k, (t, o) in enumerate(zip(torch_out, onnx_out)):
        assert t.shape == o.shape, f"output {k}: torch {t.shape}, onnx {o.shape}"
        t_int, o_int = t.dtype.kind in "iub", o.dtype.kind in "iub"
        assert t_int == o_int, f"output {k}: torch {t.dtype}, onnx {o.dtype}"
        if t_int:
            if not np.array_equal(t.astype(np.int64), o.astype(np.int64)):
                pytest.fail(f"output {k}:\ntorch {t.tolist()}\nonnx  {o.tolist()}")
        else:
            assert np.all(np.isfinite(t)), f"output {k}: torch gives {t.tolist()}"
            diff = float(np.max(np.abs(t.astype(np.float64) - o.astype(np.float64)))) \
                if t.size else 0.0
            if not diff <= ATOL:  # NaN from ONNX fails too
                pytest.fail(f"output {k}: max |diff| {diff:.3g}\ntorch {t.tolist()}\n"
                            f"onnx  {o.tolist()}")


# ---------------------------------------------------------------- the table


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("text,sets", ROWS)
def test_backends_agree(text, sets, variant, compiled):
    c = compiled(text, sets)
    for k, (o, t) in enumerate(zip(c.cfg.model.outputs, c.torch_out)):
        kinds = {"real": "f", "int": "iu", "bool": "b"}[o.type.dtype]
        assert t.dtype.kind in kinds, f"output {k}: the spec says {o.type}, torch gives {t.dtype}"
    assert_same(c.torch_out, c.onnx(**VARIANTS[variant]))


def ops_of(cfg) -> set[str]:
    """Every op the elaborated IR uses, in the model, its layers and the spec's own modules.
    Standard-library bodies are not followed: the backends replace several of them whole
    (OneHot @ W is a row lookup, LN one layer_norm), so their primitives may never be
    lowered."""
    ops: set[str] = set()
    seen: set[str] = set()

    def walk(eqns) -> None:
        for item in eqns:
            if isinstance(item, ir.Loop):
                walk(item.body)
                continue
            ops.add(item.op)
            module = item.attrs.get("module") if item.op == "call" else None
            fn = cfg.functions.get(module) if module is not None else None
            if fn is not None and not fn.builtin and module not in seen:
                seen.add(module)
                walk(fn.eqns)

    walk(cfg.model.body)
    return ops


def test_every_primitive_has_a_row(tmp_path):
    """... and a row that passes: rows marked xfail do not count."""
    used: set[str] = set()
    for k, param in enumerate(ROWS):
        if param.marks:
            continue
        text, sets = param.values
        path = tmp_path / f"row{k}.fgpt"
        path.write_text(text)
        used |= ops_of(load(str(path)).configure(None, sets))
    missing = sorted(set(PRIMITIVES) - used)
    assert not missing, f"no row of the table uses {missing}"
