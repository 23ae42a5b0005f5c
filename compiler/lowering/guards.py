"""Guards as conditions, not text: what a layer condition means is its syntax tree, which
the elaborator evaluates (`guard_holds`, for the ONNX backend's unrolled layers) and which
this module prints as Python (for the torch backend's loop) — one reading for both."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from ..elaborate.elaborator import guard_tree
from ..errors import FgcError
from ..names import ident
from ..syntax import nodes as S

# Python's binding strengths for what a condition may hold
_PRECEDENCE = {"or": 1, "and": 2, "not": 3, "compare": 4, "+": 5, "-": 5, "*": 6, "/": 6,
               "%": 6, "neg": 7}
_FLIP = {"==": "!=", "!=": "=="}


def python(text: str, names: dict[str, str]) -> str:
    """A guard's condition as a Python expression; each name as `names` spells it (a
    hyperparameter's constant, `self.l`), any other through `ident`."""
    return _py(guard_tree(text), names, 0)


def _py(e: S.Expr, names: dict[str, str], parent: int) -> str:
    if isinstance(e, S.Not) and isinstance(e.operand, S.Parity):  # `l is even`, not `not`
        return _py(replace(e.operand, even=not e.operand.even), names, parent)
    if isinstance(e, S.Not) and isinstance(e.operand, S.Compare) and e.operand.op in _FLIP:
        return _py(replace(e.operand, op=_FLIP[e.operand.op]), names, parent)
    if isinstance(e, S.Name):
        return names.get(e.name) or ident(e.name)
    if isinstance(e, S.Num):
        return _number(e.value)
    if isinstance(e, S.BoolOp):
        prec = _PRECEDENCE[e.op]
        text = f"{_py(e.left, names, prec)} {e.op} {_py(e.right, names, prec + 1)}"
    elif isinstance(e, S.Not):
        prec = _PRECEDENCE["not"]
        text = f"not {_py(e.operand, names, prec)}"
    elif isinstance(e, S.Parity):
        prec = _PRECEDENCE["compare"]
        text = f"{_py(e.operand, names, _PRECEDENCE['%'] + 1)} % 2 == {0 if e.even else 1}"
    elif isinstance(e, S.Compare):
        prec = _PRECEDENCE["compare"]
        text = f"{_py(e.left, names, prec + 1)} {e.op} {_py(e.right, names, prec + 1)}"
    elif isinstance(e, S.BinOp) and e.op in _PRECEDENCE:
        prec = _PRECEDENCE[e.op]
        text = f"{_py(e.left, names, prec)} {e.op} {_py(e.right, names, prec + 1)}"
    elif isinstance(e, S.Neg):
        prec = _PRECEDENCE["neg"]
        text = f"-{_py(e.operand, names, prec)}"
    else:
        raise FgcError("a layer condition holds sizes, comparisons, `is even`/`is odd` and "
                       "and/or/not only", e.span)
    return f"({text})" if prec < parent else text


def _number(v: Fraction) -> str:
    return str(v.numerator) if v.denominator == 1 else repr(float(v))
