"""The symbolic algebra behind dimensions and parameter formulas."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compiler.elaborate.symbolic import Poly, format_int, format_poly, human

H, A, D, L = (Poly.sym(s) for s in "HADL")


def test_division_by_a_monomial_cancels():
    assert A * (H / A) == H
    assert (4 * A * (H / A) * H) == 4 * H * H


def test_formula_of_formal_gpt_collapses_with_derived_values():
    V, n, F = Poly.sym("V"), Poly.sym("n"), Poly.sym("F")
    total = V * H + n * H + L * (4 * A * D * H + 2 * H * F + 5 * H + F)
    expanded = total.subs({"D": H / A, "F": 4 * H})
    assert expanded == 12 * L * H * H + 9 * L * H + V * H + n * H
    assert format_poly(expanded) == "12*H^2*L + 9*H*L + H*n + H*V"


def test_opaque_division_still_evaluates_exactly():
    q = (H + 1) / A
    assert q.evaluate({"H": 11, "A": 4}) == 3
    assert Poly.apply("floor", L / 2).evaluate({"L": 7}) == 3
    assert Poly.apply("ceil", L / 2).evaluate({"L": 7}) == 4


def test_exact_integers_at_gpt3_scale():
    total = 12 * L * H * H
    assert total.evaluate({"L": 96, "H": 12288}) == 12 * 96 * 12288 ** 2


def test_printing():
    assert format_poly(Poly()) == "0"
    assert format_poly(H - 2 * A) == "-2*A + H"
    assert format_poly(H / A) == "H/A"
    assert format_int(116_497_920) == "116,497,920"
    assert human(124_439_808) == "124.4M"


small = st.integers(min_value=-50, max_value=50)


@given(small, small, small, small)
def test_arithmetic_agrees_with_integers(h, a, d, c):
    env = {"H": h, "A": a, "D": d}
    p = (H + c) * (A - D) + H * H * c
    assert p.evaluate(env) == (h + c) * (a - d) + h * h * c
    if a != 0:
        assert (p / A).evaluate(env) == Fraction(p.evaluate(env), a)


def test_zero_division_is_an_error():
    with pytest.raises(ZeroDivisionError):
        H / Poly()
