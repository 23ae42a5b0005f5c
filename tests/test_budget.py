"""Work that cannot finish is refused up front, with the estimate; constant tables are not
materialised.

GPT-2 with 100,000 layers of width 8 once ran `fgc compile --target onnx` for ten minutes
toward 17 GB: the ONNX graph unrolls the layers. `compiler.passes.budget` estimates the graph from
the IR (each module's equations counted once, times the layers) and refuses past its limit,
in well under a second and a small address space. An element-wise table over a size
(`Row[j] = j`) at K = 10^9 once built a 7.45 GiB constant; the ONNX lowering now makes
large index tables with `Range` when the model runs, so model.onnx stays small, and gives
the same numbers as the materialised constant.
"""

from __future__ import annotations

import glob
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from compiler.errors import FgcError
from compiler.passes import budget
from compiler.pipeline import load

ROOT = Path(__file__).resolve().parent.parent
HUGE_GPT2 = ["--set", "L=100000", "--set", "H=8", "--set", "A=2", "--set", "n=8",
             "--set", "V=16"]

ROW = """
module Row[K] -> R[K] {
  Row[j] = j
}

model P {
  hyper n = 8, H = 1, V = 11, K = 4
  input x: {1..V}^n
  param W_e: R[V, H]
  X = OneHot(x) @ W_e
  output Y = X + sum(Row[K]) + Tab[n, K] @ W_k
  param W_k: R[K, H]
}

module Tab[n, K] -> R[n, K] {
  Tab[i, j] = (i * j) % 7 - 3
}
"""


def fgc_limited(*args: str, limit: int = 2 * 10**9, timeout: int = 60):
    """`fgc ARGS` with its address space capped at `limit` bytes."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return subprocess.run([sys.executable, "-m", "compiler.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=cap,
                          stdin=subprocess.DEVNULL)


def row_spec(tmp_path: Path, text: str = ROW) -> str:
    path = tmp_path / "row.fgpt"
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------- the layer count


def test_onnx_of_100000_layers_is_refused_with_the_estimate(tmp_path):
    out = tmp_path / "out"
    r = fgc_limited("compile", "specs/gpt2.fgpt", "--target", "onnx", *HUGE_GPT2,
                    "-o", str(out), timeout=30)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert "gpt2.fgpt:" in r.stderr  # located at the layer loop
    assert "the ONNX graph would have about 6,500,030 nodes and initializers" in r.stderr
    assert "× 100,000 layers" in r.stderr and f"limit is {budget.MAX_ONNX_ENTRIES:,}" in r.stderr
    assert "--set L=" in r.stderr  # says how many layers fit
    assert not out.exists() or not any(out.iterdir())


def test_torch_of_100000_layers_compiles(tmp_path):
    """model.py loops over the layers: it does not grow with their number."""
    r = fgc_limited("compile", "specs/gpt2.fgpt", "--target", "torch", *HUGE_GPT2,
                    "-o", str(tmp_path / "out"), timeout=30)
    assert r.returncode == 0, r.stderr
    assert len((tmp_path / "out" / "model.py").read_text().splitlines()) < 2000


@pytest.mark.parametrize("command", [["check", "specs/gpt2.fgpt"],
                                     ["params", "specs/gpt2.fgpt", *HUGE_GPT2, "--by-module"],
                                     ["ir", "specs/gpt2.fgpt", *HUGE_GPT2]])
def test_front_half_does_not_unroll(command):
    r = fgc_limited(*command, timeout=30)
    assert r.returncode == 0, r.stderr


def test_estimate_is_refused_in_process_before_lowering(monkeypatch):
    """compile_spec raises FgcError from the budget: the lowering is never entered."""
    from compiler.backends.onnx import lower
    from compiler.emit import compile_spec

    def boom(*a, **k):
        raise AssertionError("lowered")
    monkeypatch.setattr(lower.Lowerer, "lower", boom)
    sets = {"L": 100000, "H": 8, "A": 2, "n": 8, "V": 16}
    with pytest.raises(FgcError, match="nodes and initializers"):
        compile_spec(str(ROOT / "specs/gpt2.fgpt"), "/nonexistent/out", "onnx", None, sets)


def test_every_shipped_spec_and_preset_fits():
    """With room to spare: every preset of every spec, to ONNX (with and without the
    cache's inputs; under --optimize ort, where a mixture of experts is one operator) and
    to torch. The standard ONNX graph of Qwen3-235B-A22B, 128 experts lowered one by one in
    each of 94 layers, is the one preset past the limit, refused with --optimize ort named."""
    past = []
    for path in sorted(glob.glob(str(ROOT / "specs/**/*.fgpt"), recursive=True)):
        spec = load(path)
        for preset in spec.presets() or [None]:
            cfg = spec.configure(preset, {})
            for target, kv, optimize in (("onnx", False, "ort"), ("onnx", True, "ort"),
                                         ("torch", False, None)):
                est = budget.estimate(cfg, target, kv, optimize)
                # (the estimate is within a factor of two of the graph: room for five more)
                assert est.total * 10 < est.limit, (path, preset, target, est.message())
                budget.check_budget(spec, cfg, target, kv, optimize)
            for kv in (False, True):
                try:
                    budget.check_budget(spec, cfg, "onnx", kv)
                except FgcError as e:
                    assert "--optimize ort makes each one onnxruntime's MoE" in \
                        e.diagnostics[0].hint
                    past.append((Path(path).name, preset, kv))
    assert past == [("qwen3_moe.fgpt", "235b_a22b", False), ("qwen3_moe.fgpt", "235b_a22b", True)]


def test_estimate_follows_the_graph():
    """Within a factor of two of the graph the lowering builds (counted, not timed)."""
    pytest.importorskip("onnx")
    from compiler.backends.onnx.lower import Lowerer
    spec = load(str(ROOT / "specs/gpt2.fgpt"))
    for layers in (2, 20):
        cfg = spec.configure(None, {"L": layers, "H": 8, "A": 2, "n": 8, "V": 16})
        model, blobs = Lowerer(spec, spec.symbolic(), cfg.values).lower(None, stream=True)
        actual = len(model.graph.node) + len(model.graph.initializer) + len(blobs)
        est = budget.estimate(cfg, "onnx").total
        assert actual / 2 <= est <= actual * 2, (layers, est, actual)


def test_the_estimate_of_a_mixture_of_experts_follows_its_graph():
    """A sparse MoE in standard operators grows with its E experts (each lowered on its
    own), under --optimize ort not at all (onnxruntime's MoE): the estimate grows as the
    graph built does, from E = 8 to E = 64, and stays near it (under --optimize ort the
    attention's equations fuse into fewer operators than the estimate counts, so there it
    is an overestimate, refusing early rather than late)."""
    pytest.importorskip("onnx")
    from compiler.backends.onnx.lower import Lowerer
    spec = load(str(ROOT / "specs/qwen3_moe.fgpt"))
    for optimize in (None, "ort"):
        sizes = {}
        for experts in (8, 64):
            cfg = spec.configure(None, {"L": 1, "H": 16, "A": 2, "G": 1, "D": 8, "F": 8,
                                        "V": 20, "n": 8, "E": experts, "K": 2})
            model, blobs = Lowerer(spec, spec.symbolic(), cfg.values, optimize=optimize
                                   ).lower(None, stream=True)
            actual = len(model.graph.node) + len(model.graph.initializer) + len(blobs)
            sizes[experts] = actual, budget.estimate(cfg, "onnx", optimize=optimize).total
            assert actual / 2 <= sizes[experts][1] <= actual * 2.5, (optimize, sizes)
        (a8, e8), (a64, e64) = sizes[8], sizes[64]
        if optimize == "ort":
            assert a64 == a8 and e64 == e8, sizes
        else:
            assert abs((e64 - e8) - (a64 - a8)) <= 0.1 * (a64 - a8), sizes


def test_torch_lines_refused_past_the_limit(monkeypatch):
    monkeypatch.setattr(budget, "MAX_TORCH_LINES", 10)
    spec = load(str(ROOT / "specs/gpt2.fgpt"))
    cfg = spec.configure("small", {})
    with pytest.raises(FgcError, match=r"model.py would have about [\d,]+ lines; fgc's limit "
                       r"is 10"):
        budget.check_budget(spec, cfg, "torch")


# ---------------------------------------------------------------- constant tables


def test_table_of_a_billion_is_computed_at_run_time(tmp_path):
    """K = 10^9: compiled in a 2 GB address space, to a model.onnx of a few KB."""
    spec = row_spec(tmp_path, ROW.replace(" + Tab[n, K] @ W_k", "").replace(
        "  param W_k: R[K, H]\n", ""))
    out = tmp_path / "out"
    r = fgc_limited("compile", spec, "--target", "onnx", "--set", "K=1000000000",
                    "-o", str(out), timeout=30)
    assert r.returncode == 0, r.stderr
    assert (out / "model.onnx").stat().st_size < 16_000
    onnx = pytest.importorskip("onnx")
    ops = {n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node}
    assert "Range" in ops
    r = fgc_limited("compile", spec, "--target", "torch", "--set", "K=1000000000",
                    "-o", str(tmp_path / "torch"), timeout=30)
    assert r.returncode == 0, r.stderr
    assert "torch.arange(K, " in (tmp_path / "torch" / "model.py").read_text()  # positions 0-based


@pytest.mark.parametrize("limit", [0, 88])
def test_range_gives_the_materialised_values(tmp_path, monkeypatch, limit):
    """The same model with its tables as constants and as Range (the threshold forced
    down): the same outputs."""
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from compiler.backends.onnx import lower
    from compiler.emit import compile_spec
    spec = row_spec(tmp_path)
    sets = {"K": 12}
    compile_spec(spec, str(tmp_path / "const"), "onnx", None, sets)
    monkeypatch.setattr(lower, "CONST_LIMIT", limit)
    compile_spec(spec, str(tmp_path / "range"), "onnx", None, sets)
    x = np.array([[1, 5, 11, 2, 3], [4, 4, 4, 4, 10]], np.int64) - 1
    outs = []
    for name in ("const", "range"):
        path = str(tmp_path / name / "model.onnx")
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        outs.append(session.run(None, {"x": x})[0])
    def ranges(name: str) -> int:
        graph = onnx.load(str(tmp_path / name / "model.onnx")).graph
        return sum(n.op_type == "Range" for n in graph.node)
    # at 88 bytes (11 entries) the OneHot's table over V = 11 stays a constant, K = 12 not
    assert ranges("range") > ranges("const")
    np.testing.assert_array_equal(outs[0], outs[1])
    assert outs[0].shape == (2, 5, 1)
