"""Which onnxruntime reads what fgc writes (docs/onnx.md, "Opsets and onnxruntime versions").

- The default graph's IR version and opset are read by the oldest onnxruntime that
  pyproject.toml allows, by the table in runtime/compat.py.
- Every opset `--opset` takes is written with the oldest IR version that carries it, the
  table covers it, and the installed onnxruntime loads and runs it (LLaMA: Attention,
  RotaryEmbedding, RMSNormalization and SiLU all change form with the opset).
- docs/onnx.md's table is the one the code computes.
- An onnxruntime too old for a graph gets a message naming the graph's IR version and
  opset and the release that reads it, not onnxruntime's error.
"""

from __future__ import annotations

import re
import tomllib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import ROOT, tiny_sets, unpadded
from onnx import helper

from compiler.backends.onnx.lower import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET
from compiler.emit import compile_spec
from runtime import RuntimeError_, compat, load

SPEC = "specs/llama.fgpt"
OPSETS = range(MIN_OPSET, MAX_OPSET + 1)


def floor() -> str:
    """The oldest onnxruntime-gpu pyproject.toml allows."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [re.fullmatch(r"onnxruntime-gpu\s*>=\s*([\d.]+)", d.split(";")[0].strip())
            for d in project["dependencies"]]
    found = [m[1] for m in pins if m]
    assert len(found) == 1, f"no single `onnxruntime-gpu>=X` in {project['dependencies']}"
    return found[0]


def compiled(tmp_path, opset: int | None = None, optimize: str | None = None):
    out = tmp_path / f"{opset}-{optimize}"
    compile_spec(str(ROOT / SPEC), str(out), "onnx", None, tiny_sets(SPEC), opset=opset,
                 optimize=optimize)
    return out


def stamp(model: onnx.ModelProto) -> tuple[int, int]:
    return model.ir_version, next(o.version for o in model.opset_import if o.domain == "")


@pytest.mark.parametrize("optimize", [None, "ort"])
def test_the_floor_reads_the_default_graph(tmp_path, optimize):
    ir_version, opset = stamp(onnx.load(compiled(tmp_path, None, optimize) / "model.onnx"))
    assert opset == DEFAULT_OPSET
    needed = compat.oldest_reader(ir_version, opset)
    assert needed is not None, f"no onnxruntime in runtime/compat.py reads IR {ir_version}"
    assert compat.release(floor()) >= needed, (
        f"pyproject.toml allows onnxruntime-gpu {floor()}, but the default graph (IR "
        f"{ir_version}, opset {opset}) needs {needed}")


@pytest.mark.parametrize("opset", OPSETS)
def test_each_opset_has_its_oldest_ir_version_and_loads(tmp_path, opset):
    folder = compiled(tmp_path, opset)
    model = onnx.load(folder / "model.onnx")
    ir_version, stamped = stamp(model)
    assert stamped == opset
    assert ir_version == helper.find_min_ir_version_for(list(model.opset_import), True)
    assert compat.oldest_reader(ir_version, opset) is not None
    session = ort.InferenceSession(str(folder / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    (probs, *_) = session.run(None, unpadded(session, {"x": np.array([[0, 3, 1]], np.int64)}))
    assert probs.shape == (1, 3, tiny_sets(SPEC)["V"])
    assert np.allclose(probs.sum(-1), 1, atol=1e-5)


def test_the_docs_table_is_the_code_table():
    text = (ROOT / "docs" / "onnx.md").read_text(encoding="utf-8")
    section = text.split("## Opsets and onnxruntime versions", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+)[^|]*\| (\d+) \| (\d+)\.(\d+) \|$", section, re.M)
    documented = {int(o): (int(ir), (int(a), int(b))) for o, ir, a, b in rows}
    computed = {}
    for opset in OPSETS:
        ir_version = helper.find_min_ir_version_for([helper.make_opsetid("", opset)], True)
        computed[opset] = (ir_version, compat.oldest_reader(ir_version, opset))
    assert documented == computed


def test_a_runtime_too_old_is_told_which_release_reads_the_graph():
    why = compat.too_old(11, {"": 23, "com.microsoft": 1}, "1.22.1")
    assert why is not None
    for words in ("IR version 11", "opset 23", "onnxruntime 1.22.1", "up to 10",
                  "up to 22", "onnxruntime 1.23 or newer", "--opset"):
        assert words in why
    assert "onnxruntime 1.21 or newer" in compat.too_old(10, {"": 22}, "1.20.1")
    assert compat.too_old(11, {"": 23}, "1.23.2") is None
    assert compat.too_old(8, {"ai.onnx": 18}, "1.14.0") is None
    assert compat.too_old(99, {"": 23}, "1.22.1") is None  # no release known: theirs says


def test_load_says_so_in_place_of_onnxruntimes_error(tmp_path, monkeypatch):
    folder = compiled(tmp_path)
    model = onnx.load(folder / "model.onnx")
    model.ir_version = 99  # past what the installed onnxruntime reads
    onnx.save(model, folder / "model.onnx")
    with pytest.raises(RuntimeError_) as plain:
        load(folder, provider="cpu", cache=False, quiet=True)
    assert "IR version" in str(plain.value)
    # a release that reads it: onnxruntime's error gives way to which one
    monkeypatch.setitem(compat.READS, (99, 0), (99, MAX_OPSET))
    with pytest.raises(RuntimeError_) as told:
        load(folder, provider="cpu", cache=False, quiet=True)
    message = str(told.value)
    assert f"the graph is ONNX IR version 99 with opset {DEFAULT_OPSET}" in message
    assert f"onnxruntime {ort.__version__} cannot read" in message
    assert "install onnxruntime 99.0 or newer" in message
    assert "ONNXRuntimeError" not in message
