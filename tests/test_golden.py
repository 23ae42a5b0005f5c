"""Golden files: the printed IR of reference specs and `fgc check`'s output on curated mistakes.

tests/golden/ir/*.txt         `fgc ir` (and `fgc ir --lowered`) of specs/formal/gpt.fgpt and
                              tests/golden/specs/*.fgpt
tests/golden/errors/X.fgpt    a small spec with one typical mistake
tests/golden/errors/X.out     what `fgc check tests/golden/errors/X.fgpt` prints, and its exit code
tests/golden/torch/*.py       the model.py `fgc compile --target torch` writes for released specs
                              (tests/test_torch_backend.py keeps gpt2_formal_tiny.py)
tests/golden/onnx/*.txt       the nodes of the graph `fgc compile --target onnx` writes, one a
                              line: op type, node name, doc string (tab-separated)

Goldens change only on purpose: `pytest tests/test_golden.py --update-golden` rewrites them from
fgc's current output; review the diff before committing it. fgc runs from the repository root
with relative paths, so the files hold no machine-specific paths.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest
from conftest import GOLDEN, ROOT, fgc

TIMEOUT = 60

# name -> fgc ir arguments
IR_CASES = {
    "gpt": ["specs/formal/gpt.fgpt"],
    "gpt_paper": ["specs/formal/gpt.fgpt", "--preset", "paper"],
    "gpt3": ["tests/golden/specs/gpt3.fgpt"],
    "gpt3_small": ["tests/golden/specs/gpt3.fgpt", "--preset", "small"],
    "xlnet": ["tests/golden/specs/xlnet.fgpt"],
    # the program both backends print: lookups, masks by meaning, what each use is given
    "gpt_lowered": ["specs/formal/gpt.fgpt", "--lowered"],
    "xlnet_lowered": ["tests/golden/specs/xlnet.fgpt", "--lowered"],
}

ERRORS = sorted((GOLDEN / "errors").glob("*.fgpt"))


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def compare_or_update(golden: Path, actual: str, update: bool) -> None:
    if update:
        golden.parent.mkdir(parents=True, exist_ok=True)
        if not golden.exists() or golden.read_text(encoding="utf-8") != actual:
            golden.write_text(actual, encoding="utf-8")
        return
    if not golden.exists():
        pytest.fail(f"{_rel(golden)} does not exist; run pytest with --update-golden")
    expected = golden.read_text(encoding="utf-8")
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            f"{_rel(golden)} (expected)", "fgc (actual)"))
        pytest.fail(f"output differs from {_rel(golden)}; if the change is intended, rerun "
                    f"with --update-golden and review the diff\n{diff}")


# ---------------------------------------------------------------- (a) printed IR


@pytest.mark.parametrize("name", sorted(IR_CASES))
def test_ir_golden(name, update_golden):
    args = IR_CASES[name]
    r = fgc("ir", *args, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert str(ROOT) not in r.stdout, "the IR names an absolute path"
    compare_or_update(GOLDEN / "ir" / f"{name}.txt", r.stdout, update_golden)


def test_ir_golden_inputs_are_present():
    for args in IR_CASES.values():
        assert (ROOT / args[0]).is_file(), args[0]


# ---------------------------------------------------------------- (b) curated mistakes


def render_check(path: Path) -> tuple[str, int, str, str]:
    rel = _rel(path)
    r = fgc("check", rel, timeout=TIMEOUT)
    text = (f"$ fgc check {rel}\n"
            f"exit {r.returncode}\n"
            f"--- stdout\n{r.stdout}"
            f"--- stderr\n{r.stderr}")
    return text, r.returncode, r.stdout, r.stderr


def test_there_are_enough_curated_mistakes():
    assert len(ERRORS) >= 12
    outs = {p.stem for p in (GOLDEN / "errors").glob("*.out")}
    orphans = outs - {p.stem for p in ERRORS}
    assert not orphans, f".out files without a spec: {sorted(orphans)}"


@pytest.mark.parametrize("path", ERRORS, ids=lambda p: p.stem)
def test_error_golden(path, update_golden):
    text, code, out, err = render_check(path)
    # whatever the golden says, the contract holds: located diagnostics, no crash
    assert "Traceback" not in text and "internal error" not in text, text
    assert code in (0, 1), text
    rel = _rel(path)
    if code == 1:
        assert re.search(rf"^{re.escape(rel)}:\d+:\d+: error: ", err, re.M), text
        assert re.search(r"^ *\| *\^+", err, re.M), text
    assert str(ROOT) not in text, "the output names an absolute path"
    compare_or_update(path.with_suffix(".out"), text, update_golden)


def test_approximate_expectation_is_a_warning_not_an_error():
    text, code, out, err = render_check(GOLDEN / "errors" / "approx_expectation.fgpt")
    assert code == 0, text
    assert ": warning: " in err and ": error: " not in err
    assert "116,497,920" in err and "110M" in err


@pytest.mark.parametrize("stem,needle", [
    ("unknown_name", "did you mean `W_e`?"),
    ("unknown_module", "did you mean `Softmax`?"),
    ("matmul_mismatch", "cannot multiply R[n×H] by R[D×H]: inner dimensions H and D differ"),
    ("parse_error_expected", "expected ':'"),
    ("heads_do_not_divide", "uneven"),
])
def test_error_golden_says_what_matters(stem, needle):
    """The point of each curated case, independent of the exact golden text."""
    text, code, out, err = render_check(GOLDEN / "errors" / f"{stem}.fgpt")
    assert code == 1
    assert needle in err, err


# ---------------------------------------------------------------- (c) emitted model.py

# name -> fgc compile arguments: released specs at a released preset (model.py's text does
# not grow with the sizes, which are Config's defaults)
TORCH_CASES = {
    "gpt2_small": ["specs/gpt2.fgpt", "--preset", "small"],
    "bert_base": ["specs/bert.fgpt", "--preset", "base"],
    "transformer_base": ["specs/transformer.fgpt", "--preset", "base"],
}


@pytest.mark.parametrize("name", sorted(TORCH_CASES))
def test_torch_golden(name, tmp_path, update_golden):
    out = tmp_path / "out"
    r = fgc("compile", *TORCH_CASES[name], "--target", "torch", "-o", str(out), timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    text = (out / "model.py").read_text(encoding="utf-8")
    assert str(ROOT) not in text and str(tmp_path) not in text, "model.py names a path"
    compare_or_update(GOLDEN / "torch" / f"{name}.py", text, update_golden)


# ---------------------------------------------------------------- (d) ONNX nodes

# name -> fgc compile arguments, at sizes small enough to write the graph quickly (the node
# list does not depend on the widths; it grows with the layers)
ONNX_CASES = {
    "gpt2_tiny": ["specs/gpt2.fgpt", *[a for kv in ("L=2", "H=16", "A=2", "V=50", "n=8")
                                         for a in ("--set", kv)]],
    "transformer_defaults": ["specs/transformer.fgpt"],  # the encoder-decoder, 2 + 2 layers
}


def onnx_nodes(path: Path) -> str:
    """The graph's nodes, one a line: op type, name and doc string, tab-separated (a line
    break inside a doc string written as `\\n`)."""
    onnx = pytest.importorskip("onnx")
    graph = onnx.load(str(path), load_external_data=False).graph
    return "".join("\t".join((n.op_type, n.name, n.doc_string)).replace("\n", "\\n") + "\n"
                   for n in graph.node)


@pytest.mark.parametrize("name", sorted(ONNX_CASES))
def test_onnx_nodes_golden(name, tmp_path, update_golden):
    out = tmp_path / "out"
    r = fgc("compile", *ONNX_CASES[name], "--target", "onnx", "-o", str(out), timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    text = onnx_nodes(out / "model.onnx")
    assert text and str(ROOT) not in text and str(tmp_path) not in text
    compare_or_update(GOLDEN / "onnx" / f"{name}.txt", text, update_golden)
