"""The primitive table: every op has a shape rule, and the rules say what they should."""

from __future__ import annotations

import pytest

from compiler.elaborate.elaborator import Hypers
from compiler.elaborate.ir import Ell, TensorType
from compiler.elaborate.primitives import CALLABLE, PRIMITIVES, ShapeError
from compiler.elaborate.symbolic import Poly

n, H, D, A = (Poly.sym(s) for s in ("n", "H", "D", "A"))
dims = Hypers(values={}, derived={"D": H / A})


def R(*shape):
    return TensorType(shape=tuple(shape))


def rule(op, *types, **attrs):
    return PRIMITIVES[op].rule(dims, list(types), attrs, op)


def test_every_primitive_has_a_rule_and_a_doc():
    for name, prim in PRIMITIVES.items():
        assert prim.doc, name
        assert prim.rule is not None or name == "index", name  # index is elaborated inline
    assert CALLABLE <= PRIMITIVES.keys()


def test_matmul_message_names_both_shapes():
    with pytest.raises(ShapeError) as e:
        rule("matmul", R(n, H), R(D, H))
    assert e.value.message == ("cannot multiply R[n×H] by R[D×H]: inner dimensions H and D "
                               "differ")


def test_matmul_uses_derived_values():
    out = rule("matmul", R(n, A * D), R(H, H))
    assert out.shape == (n, H)


def test_broadcasting_and_ellipsis():
    assert rule("add", R(n, H), R(H)).shape == (n, H)
    assert rule("mul", R(Ell("e"), H), R(H)).shape == (Ell("e"), H)
    with pytest.raises(ShapeError):
        rule("add", R(n, H), R(n, D))


def test_reductions_keep_the_axis():
    assert rule("sum", R(n, H)).shape == (n, Poly.const(1))


def test_concat_of_a_family():
    out = PRIMITIVES["concat"].rule(dims, [R(n, D)], {"counts": [A]}, "concat")
    assert out.shape == (n, A * D)


def test_transpose_needs_two_axes():
    assert rule("transpose", R(n, H)).shape == (H, n)
    with pytest.raises(ShapeError):
        rule("transpose", R(H))
