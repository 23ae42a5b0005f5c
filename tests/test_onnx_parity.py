"""Differential tests: the ONNX graph against the PyTorch backend, and against transformers.

Every spec in specs/ at a tiny size, with the same random weights: onnxruntime on CPU runs
the standard graph (opset 23 with the Attention op, and opset 18 without it) and the
`--optimize ort` graph, each with onnxruntime's graph optimisations on and off, on seeded
random inputs shorter than the context (T < n) with a batch of 2; every output agrees with
the PyTorch module to 1e-4 (float32). The released specs are also compiled with a
transformers checkpoint's own tensors and compared with transformers directly.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import ROOT, TINY, TINY_EXTRA, all_specs, unpadded
from test_torch_backend import import_model

from compiler.backends.onnx.lower import Lowerer
from compiler.emit import compile_spec
from compiler.pipeline import load
from compiler.weights import parameter_keys

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

TOL = 1e-4
SPECS = [p.relative_to(ROOT).as_posix() for p in all_specs()]
EXTRA = TINY_EXTRA
VARIANTS = [("opset23", 23, None), ("opset18", 18, None), ("ort", 23, "ort")]
LEVELS = {"all": "ORT_ENABLE_ALL", "off": "ORT_DISABLE_ALL"}


def session(model, level: str = "all"):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def random_inputs(cfg, T: int, B: int, seed: int) -> dict:
    """0-based ids, permutations of 0..T-1, one position < T per sequence, and reals; no
    padding masks."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    symbolic = load(cfg.model.span.file).symbolic().model.inputs
    tokens = {s for v in symbolic if v.type.dtype != "real" for d in v.type.shape
              for s in d.symbols()}  # the token length: T in this run
    for v, sv in zip(cfg.model.inputs, symbolic):
        t = v.type
        if t.pad:  # no padding: the graph is given all ones (unpadded)
            continue
        if t.perm:
            out[v.name] = torch.stack([torch.randperm(T, generator=g) for _ in range(B)])
        elif not t.shape:
            out[v.name] = torch.randint(0, T, (B,), generator=g)
        elif t.dtype == "real":  # a real input (a memory, a target mapping): the token
            # length is T, other sizes as configured
            dims = [T if d.symbols() & tokens else int(c.const_value())
                    for d, c in zip(sv.type.shape, t.shape)]
            if t.family is not None:  # a family: one tensor, the members' axis first
                dims = [int(t.family.const_value()), *dims]
            out[v.name] = torch.randn((B, *dims), generator=g)
        else:
            size = int(t.hi.const_value()) - int(t.lo.const_value()) + 1
            out[v.name] = torch.randint(0, size, (B, T), generator=g)
    return out


@pytest.fixture(scope="module")
def torch_model(tmp_path_factory):
    """(cfg, torch module with strong random weights, those weights by ONNX name)."""
    cache: dict = {}

    def get(spec: str):
        if spec not in cache:
            sets = {**TINY, **EXTRA.get(spec, {})}
            cfg = load(str(ROOT / spec)).configure(None, sets)
            out = tmp_path_factory.mktemp("torch")
            compile_spec(str(ROOT / spec), str(out), "torch", None, sets)
            mod = import_model(out / "model.py")
            torch.manual_seed(0)
            model = mod.build().eval()
            with torch.no_grad():  # std 0.02 would make every output nearly uniform
                for p in model.parameters():
                    p.normal_(0.0, 0.4) if p.dim() >= 2 else p.normal_(0.5, 0.3)
            state = model.state_dict()
            weights = {o: state[t].numpy() for t, o in parameter_keys(cfg)}
            cache[spec] = (cfg, model, weights, sets)
        return cache[spec]
    return get


@pytest.mark.parametrize("variant", [v[0] for v in VARIANTS])
@pytest.mark.parametrize("spec", SPECS)
def test_onnx_matches_torch(spec, variant, torch_model):
    cfg, model, weights, sets = torch_model(spec)
    _, opset, optimize = next(v for v in VARIANTS if v[0] == variant)
    parsed = load(str(ROOT / spec))
    onnx_model, _ = Lowerer(parsed, parsed.symbolic(), cfg.values, opset=opset,
                            optimize=optimize, weights=weights).lower()
    for T, B, seed in ((5, 2, 1), (8, 1, 2)):
        inputs = random_inputs(cfg, T, B, seed)
        with torch.no_grad():
            ref = model(*inputs.values())
        refs = ref if isinstance(ref, tuple) else (ref,)
        feeds = {k: v.numpy() for k, v in inputs.items()}
        for level in LEVELS:
            run = session(onnx_model, level)
            got = run.run(None, unpadded(run, feeds))
            for r, o in zip(refs, got):
                r = r.numpy()
                assert o.shape == r.shape
                assert not np.isnan(o).any() and not np.isnan(r).any()
                diff = float(np.abs(o - r).max())
                assert diff <= TOL, f"{spec} {variant} level={level} T={T}: {diff:.2e}"


def test_comparisons_are_not_blind(torch_model):
    """Strong weights give peaked probabilities: a wrong graph could not pass by accident."""
    cfg, model, _, _ = torch_model("specs/gpt2.fgpt")
    with torch.no_grad():
        p = model(*random_inputs(cfg, 5, 2, 1).values())
    assert p.max().item() > 5.0 / TINY["V"]


# ---------------------------------------------------------------- against transformers

transformers = pytest.importorskip("transformers")
from test_torch_parity import CASES, PREFIX, _hf_model, _inputs, _reference  # noqa: E402

HF_CASES = list(CASES)


@pytest.mark.slow
@pytest.mark.parametrize("optimize", [None, "ort"], ids=["standard", "ort"])
@pytest.mark.parametrize("case", HF_CASES, ids=[c.id for c in HF_CASES])
def test_onnx_matches_transformers(case, optimize, tmp_path):
    from safetensors.torch import save_file
    hf = _hf_model(case)
    state = {k: v.detach().clone().contiguous() for k, v in hf.state_dict().items()}
    weights = tmp_path / "hf.safetensors"
    save_file(state, str(weights))
    sets = {"L": case.L, "H": case.H, "A": case.A, "V": case.V, "n": case.n}
    if case.F is not None:
        sets["F"] = case.F
    if case.eps is not None:
        sets["eps"] = case.eps
    out = tmp_path / "onnx"
    compile_spec(str(ROOT / f"specs/{case.spec}.fgpt"), str(out), "onnx", None, sets,
                 str(weights), optimize=optimize)
    import onnx
    model = onnx.load(str(out / "model.onnx"))
    inputs = _inputs(case)
    ref = _reference(hf, case, inputs).numpy()
    run = session(model)
    got = run.run(None, unpadded(run, {k: v.numpy() for k, v in inputs.items()}))[0]
    assert got.shape == ref.shape
    assert float(np.abs(got - ref).max()) <= 1e-5
    assert PREFIX[case.spec]  # the file holds the prefixed names transformers saves


# ---------------------------------------------------------------- known traps


def _ops(model) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in model.graph.node]


def test_tanh_gelu_is_never_the_erf_kernel(torch_model):
    """GPT-2's GELU is the tanh form: the ort graph uses FastGelu (tanh), never BiasGelu or
    com.microsoft Gelu (both erf), and the standard graph says approximate="tanh". The two
    forms differ by far more than the tolerance here, so a swap could not pass."""
    cfg, _, weights, _ = torch_model("specs/gpt2.fgpt")
    spec = load(str(ROOT / "specs/gpt2.fgpt"))
    fused, _ = Lowerer(spec, spec.symbolic(), cfg.values, optimize="ort",
                       weights=weights).lower()
    ops = _ops(fused)
    assert ("com.microsoft", "FastGelu") in ops
    assert ("com.microsoft", "BiasGelu") not in ops and ("com.microsoft", "Gelu") not in ops
    standard, _ = Lowerer(spec, spec.symbolic(), cfg.values, weights=weights).lower()
    gelus = [n for n in standard.graph.node if n.op_type == "Gelu"]
    assert gelus and all(a.s == b"tanh" for n in gelus for a in n.attribute
                         if a.name == "approximate")
    x = np.linspace(-4, 4, 101)
    erf_form = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    tanh_form = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    assert np.abs(erf_form - tanh_form).max() > 1e-4


def test_erf_gelu_uses_the_erf_kernel(torch_model):
    cfg, _, weights, _ = torch_model("specs/bert.fgpt")
    spec = load(str(ROOT / "specs/bert.fgpt"))
    fused, _ = Lowerer(spec, spec.symbolic(), cfg.values, optimize="ort",
                       weights=weights).lower()
    ops = _ops(fused)
    assert ("com.microsoft", "BiasGelu") in ops and ("com.microsoft", "FastGelu") not in ops


def test_graphs_do_not_rely_on_pattern_fusion(torch_model):
    """The ort graph already holds the fused operators; onnxruntime's optimiser has nothing
    left to fuse that changes numbers: results with optimisations off equal those on."""
    cfg, _, weights, _ = torch_model("specs/gpt2.fgpt")
    spec = load(str(ROOT / "specs/gpt2.fgpt"))
    fused, _ = Lowerer(spec, spec.symbolic(), cfg.values, optimize="ort",
                       weights=weights).lower()
    ops = {op for _, op in _ops(fused)}
    assert {"Attention", "SkipLayerNormalization", "FastGelu"} <= ops
    feeds = {k: v.numpy() for k, v in random_inputs(cfg, 6, 2, 3).items()}
    on_session, off_session = session(fused, "all"), session(fused, "off")
    on = on_session.run(None, unpadded(on_session, feeds))[0]
    off = off_session.run(None, unpadded(off_session, feeds))[0]
    assert float(np.abs(on - off).max()) <= 1e-6


SHORT_QUERY = """\
module Late[m, n] -> R[m, n] {
  Late[i, j] = -inf if j > i + n - m else 0
}

model ShortQuery {
  hyper H = 16, A = 2, D = H / A, V = 50, n = 8
  input x: {1..V}^n
  param W_e: R[V, H]
  X = OneHot(x) @ W_e
  Y = MHA(X[2..n, :], X, X, Late[n - 1, n])
  output ShortQuery = Y
}
"""


def torch_with_weights(path, out, seed: int = 0):
    """A spec file's default configuration compiled to PyTorch with N(0, 0.5) weights:
    (spec, cfg, module, the same weights by ONNX name)."""
    compile_spec(str(path), str(out), "torch")
    torch.manual_seed(seed)
    model = import_model(out / "model.py").build().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    spec = load(str(path))
    cfg = spec.configure(None, {})
    state = model.state_dict()
    return spec, cfg, model, {o: state[t].numpy() for t, o in parameter_keys(cfg)}


@pytest.mark.parametrize("variant", [v[0] for v in VARIANTS])
def test_causal_mask_with_a_shorter_query(variant, tmp_path):
    """Queries for the last n-1 positions over all n keys: the mask is aligned to the end
    (query i is position i+1); every graph and onnxruntime level agrees with PyTorch."""
    path = tmp_path / "short.fgpt"
    path.write_text(SHORT_QUERY)
    spec, cfg, model, weights = torch_with_weights(path, tmp_path / "t", seed=1)
    _, opset, optimize = next(v for v in VARIANTS if v[0] == variant)
    onnx_model, _ = Lowerer(spec, spec.symbolic(), cfg.values, opset=opset, optimize=optimize,
                            weights=weights).lower()
    for T in (8, 4):
        x = torch.randint(0, 50, (2, T), generator=torch.Generator().manual_seed(T))
        with torch.no_grad():
            ref = model(x).numpy()
        for level in LEVELS:
            run = session(onnx_model, level)
            got = run.run(None, unpadded(run, {"x": x.numpy()}))[0]
            assert got.shape == ref.shape == (2, T - 1, 16)
            assert float(np.abs(got - ref).max()) <= TOL
