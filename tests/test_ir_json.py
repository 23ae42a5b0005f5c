"""The IR's JSON form (`fgc ir --format json`, `ir.Document`): it reads back as the same IR.

Every shipped spec, symbolic and at each preset, goes to JSON and back: the IR read back
equals the one elaborated (pydantic's `==`, which compares every field, so a tuple that
came back a list or a Poly that came back different fails), dumps to the same text, and
prints the same. Sizes travel as their canonical text; a property test pins
`parse_poly(format_poly(p)) == p` beyond the polynomials the specs happen to contain.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, all_specs, fgc
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from compiler.elaborate import ir
from compiler.elaborate.symbolic import Poly, format_poly, parse_poly
from compiler.errors import Span
from compiler.lowering import prepare
from compiler.pipeline import load
from compiler.tools.printer import format_model

TIMEOUT = 60


def _configs(path):
    """The symbolic configuration and every preset's (the defaults when there is none)."""
    spec = load(str(path))
    if not spec.file.models:
        return []
    out = [spec.symbolic()]
    out += [spec.configure(p) for p in spec.presets()] or [spec.configure(None)]
    return out


@pytest.mark.parametrize("path", all_specs(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_spec_round_trips(path):
    configs = _configs(path)
    if not configs:
        pytest.skip("modules only")
    for cfg in configs:  # as elaborated, and as lowered (`fgc ir --lowered`)
        for name, (model, functions) in ((cfg.name, (cfg.model, cfg.functions)),
                                         (f"{cfg.name}, lowered",
                                          prepare(cfg.model, cfg.functions))):
            doc = ir.Document.of(model, functions)
            text = doc.model_dump_json()
            back = ir.Document.model_validate_json(text)
            assert back == doc, f"{name}: the IR read back differs"
            assert back.model_dump_json() == text, name
            assert format_model(back.model, back.functions) == \
                format_model(model, functions), name


def test_cli_json_prints_what_the_text_form_prints():
    args = ["ir", "specs/gpt2.fgpt", "--preset", "small"]
    text, js = fgc(*args, timeout=TIMEOUT), fgc(*args, "--format", "json", timeout=TIMEOUT)
    assert text.returncode == 0 and js.returncode == 0, js.stderr
    raw = json.loads(js.stdout)
    assert (raw["format"], raw["version"]) == ("fgc-ir", 1)
    assert list(raw["functions"])[-1] == "FF^GELU"  # callees first, as the text form
    doc = ir.Document.model_validate_json(js.stdout)
    assert format_model(doc.model, doc.functions) == text.stdout


def test_the_shape_of_values():
    """A size is its text, an Ell {"ell": name}, a real a number or "inf"/"-inf", a span
    its fields, a set a sorted list, a fixed family member {"size": ...}."""
    H, n = Poly.sym("H"), Poly.sym("n")
    t = ir.TensorType(shape=(ir.Ell("b"), n, H / 2), lo=Poly.const(1), hi=H,
                      taint=frozenset({"y", "x"}), family=Poly.const(3))
    eqn = ir.Eqn(outs=[ir.Value(name="z", type=t)], op="add",
                 ins=[ir.Operand(const=float("-inf")), ir.Operand(const=0.5),
                      ir.Operand(const=2 * H), ir.Operand(name="W", member="i"),
                      ir.Operand(name="W", member=Poly.const(1))],
                 attrs={"shape": (n, H), "counts": [None, H]}, family=("i", Poly.const(3)),
                 span=Span("a.fgpt", 3, 5, 3, 9))
    out = json.loads(eqn.model_dump_json())
    assert out["outs"][0]["type"]["shape"] == [{"ell": "b"}, "n", "H/2"]
    assert out["outs"][0]["type"]["taint"] == ["x", "y"]
    assert [o["const"] for o in out["ins"][:3]] == ["-inf", 0.5, "2*H"]
    assert [o["member"] for o in out["ins"][3:]] == ["i", {"size": "1"}]
    assert out["attrs"] == {"shape": ["n", "H"], "counts": [None, "H"]}
    assert out["family"] == ["i", "3"]
    assert out["span"] == {"file": "a.fgpt", "line": 3, "column": 5, "end_line": 3,
                           "end_column": 9}
    assert ir.Eqn.model_validate_json(eqn.model_dump_json()) == eqn
    fn = ir.Function(name="f", hypers=[], inputs=[], params=[], eqns=[eqn], outputs=[],
                     mask_products={"y": Span("a.fgpt", 1, 1), "x": Span("a.fgpt", 2, 1)})
    assert list(json.loads(fn.model_dump_json())["mask_products"]) == ["x", "y"]
    # in Python the values stay what they are
    assert eqn.model_dump()["outs"][0]["type"]["hi"] is H


@pytest.mark.parametrize("bad", [
    {"version": 2},
    {"model": {"name": "M", "inputs": [], "params": [], "body": [], "outputs": [],
               "hypers": [{"name": "H", "default": "2*"}]}},
    {"model": {"name": "M", "inputs": [], "params": [], "body": [], "outputs": [],
               "typo": 1}},
])
def test_a_bad_document_is_refused(bad):
    good = {"format": "fgc-ir", "version": 1,
            "model": {"name": "M", "inputs": [], "params": [], "body": [], "outputs": []}}
    ir.Document.model_validate_json(json.dumps(good))
    with pytest.raises(ValidationError):
        ir.Document.model_validate_json(json.dumps(good | bad))


def test_json_schema_is_printed():
    r = fgc("ir", "--format", "json-schema", timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr
    schema = json.loads(r.stdout)
    assert {"Model", "Function", "Eqn", "Loop", "TensorType", "Span"} <= set(schema["$defs"])
    assert schema["properties"]["version"]["const"] == 1
    r = fgc("ir", timeout=TIMEOUT)
    assert r.returncode == 2 and "FILE" in r.stderr


def test_params_builds_no_pydantic_schema():
    """The JSON form's validators and serializers are built on first use, never on the
    way to a parameter count (they cost more than the count)."""
    code = ("import io, contextlib\n"
            "from compiler import cli\n"
            "from compiler.elaborate import ir\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    assert cli.main(['params', 'specs/gpt2.fgpt']) == 0\n"
            "built = [c.__name__ for c in vars(ir).values()\n"
            "         if isinstance(c, type) and issubclass(c, ir._Base) and c is not ir._Base\n"
            "         and c.__pydantic_complete__]\n"
            "assert not built, built\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------- sizes as text

_symbols = st.sampled_from(["H", "A", "n", "d_k", "c^loc", "H'", "[l is even]"])
_leaf = st.one_of(st.integers(-5, 12).map(Poly.const), _symbols.map(Poly.sym))


def _combine(op: str, a: Poly, b: Poly) -> Poly:
    try:
        if op in ("+", "-", "*", "/"):
            return {"+": a + b, "-": a - b, "*": a * b}[op] if op != "/" else a / b
        if op == "^":
            return a ** 2
        return Poly.apply(op, a) if op in ("floor", "ceil") else Poly.apply(op, a, b)
    except ZeroDivisionError:
        return a


def _extend(inner):
    ops = st.sampled_from(["+", "-", "*", "/", "^", "floor", "ceil", "mod", "max", "min"])
    return st.builds(_combine, ops, inner, inner)


@given(st.recursive(_leaf, _extend, max_leaves=8))
def test_size_text_round_trips(p):
    assert parse_poly(format_poly(p)) == p, format_poly(p)


@pytest.mark.parametrize("text", ["2*", "H +", "(H", "H^", "floor(H", "H $ 2", "[H"])
def test_size_text_that_is_not_one(text):
    with pytest.raises(ValueError, match="not a size"):
        parse_poly(text)
