"""The closed set of primitive operations and their shape rules, one table entry per op.

Shape rules receive the operand types and the op's attributes and return the result
type, or raise `ShapeError`. Dimension equality goes through `Dims.same`, which knows
the derived hyperparameters (so `A*D` equals `H` where `D = H/A`). Backends add their
own tables keyed by the same names; `tests/test_primitives.py` checks they agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from .ir import Ell, TensorType, format_dim, format_type
from .symbolic import Poly


class ShapeError(Exception):
    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class Dims(Protocol):
    def same(self, a: Poly, b: Poly) -> bool: ...


ONE = Poly.const(1)


def fmt(t: TensorType) -> str:
    return format_type(t)


def fmt_shape(shape) -> str:
    def one(d) -> str:
        text = format_dim(d)
        return f"({text})" if " " in text else text
    return "R[" + "×".join(one(d) for d in shape) + "]"


def _dtype(*types: TensorType) -> str:
    if any(t.dtype == "real" for t in types):
        return "real"
    if all(t.dtype == "bool" for t in types):
        return "bool"
    return "int"


def broadcast_shapes(dims: Dims, a: tuple, b: tuple, what: str) -> tuple:
    """numpy broadcasting, right-aligned; a leading `...` must be the same run on both sides."""
    ea = a[:1] if a and isinstance(a[0], Ell) else ()
    eb = b[:1] if b and isinstance(b[0], Ell) else ()
    ra, rb = a[len(ea):], b[len(eb):]
    out = []
    for i in range(1, max(len(ra), len(rb)) + 1):
        da = ra[-i] if i <= len(ra) else None
        db = rb[-i] if i <= len(rb) else None
        if da is None:
            if ea:
                raise ShapeError(f"cannot {what} {fmt_shape(a)} and {fmt_shape(b)}: the leading "
                                 "dimensions of the first are not known")
            out.append(db)
        elif db is None:
            if eb:
                raise ShapeError(f"cannot {what} {fmt_shape(a)} and {fmt_shape(b)}: the leading "
                                 "dimensions of the second are not known")
            out.append(da)
        elif dims.same(da, db):
            out.append(da)
        elif dims.same(da, ONE):
            out.append(db)
        elif dims.same(db, ONE):
            out.append(da)
        else:
            raise ShapeError(
                f"cannot {what} {fmt_shape(a)} and {fmt_shape(b)}: dimensions "
                f"{format_dim(da)} and {format_dim(db)} differ",
                "shapes combine element by element when each dimension is equal or 1")
    if ea and eb and ea != eb:
        raise ShapeError(f"cannot {what} {fmt_shape(a)} and {fmt_shape(b)}")
    return (ea or eb) + tuple(reversed(out))


# ---------------------------------------------------------------- rule helpers

_WHAT = {"add": "add", "sub": "subtract", "mul": "multiply element-wise", "div": "divide",
         "max": "take the maximum of", "min": "take the minimum of", "pow": "raise",
         "eq": "compare", "ne": "compare", "lt": "compare", "le": "compare", "gt": "compare",
         "ge": "compare", "and": "combine", "or": "combine"}


def elementwise(dtype: str | None = None) -> Callable:
    def rule(dims: Dims, types: list[TensorType], attrs: dict, op: str) -> TensorType:
        shape = types[0].shape
        for t in types[1:]:
            shape = broadcast_shapes(dims, shape, t.shape, _WHAT.get(op, op))
        out = TensorType(dtype=dtype or _dtype(*types), shape=shape)
        if out.dtype == "int" and op in ("add", "sub") and len(types) == 2:
            a, b = types
            if a.lo is not None and b.shape == () and b.lo is not None and b.lo == b.hi:
                sign = 1 if op == "add" else -1
                out = out.model_copy(update={"lo": a.lo + sign * b.lo, "hi": a.hi + sign * b.lo})
        return out
    return rule


def unary(dtype: str | None = None) -> Callable:
    def rule(dims: Dims, types: list[TensorType], attrs: dict, op: str) -> TensorType:
        t = types[0]
        return TensorType(dtype=dtype or ("real" if t.dtype != "bool" else "bool"), shape=t.shape)
    return rule


def neg_rule(dims, types, attrs, op):
    t = types[0]
    if t.dtype == "int" and t.lo is not None:
        return TensorType(dtype="int", shape=t.shape, lo=-t.hi, hi=-t.lo)
    return TensorType(dtype=t.dtype, shape=t.shape)


def abs_rule(dims, types, attrs, op):
    """|a| keeps integers integers (range unknown in general: the bounds are symbolic)."""
    t = types[0]
    if t.dtype == "int":
        return TensorType(dtype="int", shape=t.shape)
    return TensorType(dtype="real" if t.dtype != "bool" else "bool", shape=t.shape)


def reduction(dims, types, attrs, op):
    t = types[0]
    if not t.shape:
        raise ShapeError(f"{op} reduces the last axis, but its operand is a scalar")
    if isinstance(t.shape[-1], Ell):
        raise ShapeError(f"{op} reduces the last axis, whose size is not known here")
    return TensorType(dtype="real", shape=t.shape[:-1] + (ONE,))


def matmul_rule(dims, types, attrs, op):
    a, b = types
    sa, sb = a.shape, b.shape
    if len(sa) == 0 or len(sb) == 0:
        raise ShapeError(f"cannot multiply {fmt_shape(sa)} by {fmt_shape(sb)}: @ needs matrices "
                         "or vectors", "use * to scale by a scalar")
    if isinstance(sb[-1], Ell) or isinstance(sa[-1], Ell) or (
            len(sb) > 1 and isinstance(sb[-2], Ell)):
        raise ShapeError(f"cannot multiply {fmt_shape(sa)} by {fmt_shape(sb)}: the contracted "
                         "dimension is not known")
    inner_a = sa[-1]
    inner_b = sb[-2] if len(sb) >= 2 else sb[-1]
    if not dims.same(inner_a, inner_b):
        raise ShapeError(
            f"cannot multiply {fmt_shape(sa)} by {fmt_shape(sb)}: inner dimensions "
            f"{format_dim(inner_a)} and {format_dim(inner_b)} differ",
            "the last dimension of the left operand must equal the first of the right")
    if len(sb) == 1:
        return TensorType(shape=sa[:-1])
    batch_b = sb[:-2]
    lead_a = sa[:-1]
    if batch_b:
        # batched: the leading dimensions must agree
        if len(lead_a) < 1:
            raise ShapeError(f"cannot multiply {fmt_shape(sa)} by {fmt_shape(sb)}")
        batch = broadcast_shapes(dims, lead_a[:-1], batch_b, "multiply")
        return TensorType(shape=batch + (lead_a[-1], sb[-1]))
    return TensorType(shape=lead_a + (sb[-1],))


def transpose_rule(dims, types, attrs, op):
    t = types[0]
    s = t.shape
    if len(s) < 2 or isinstance(s[-1], Ell) or isinstance(s[-2], Ell):
        if len(s) == 1 and not isinstance(s[0], Ell):
            raise ShapeError(f"cannot transpose the vector {fmt_shape(s)}",
                             "a vector has one axis; ^T swaps the last two")
        raise ShapeError(f"cannot transpose {fmt_shape(s)}: it needs two known trailing axes")
    return t.with_shape(s[:-2] + (s[-1], s[-2]))


def concat_rule(dims, types, attrs, op):
    counts = attrs.get("counts") or [None] * len(types)
    first = types[0]
    if not first.shape or isinstance(first.shape[-1], Ell):
        raise ShapeError("concat joins along the last axis, which is not known here")
    total = Poly.const(0)
    for t, count in zip(types, counts):
        if len(t.shape) != len(first.shape):
            raise ShapeError(f"cannot concatenate {fmt(first)} and {fmt(t)}: ranks differ")
        for da, db in zip(first.shape[:-1], t.shape[:-1]):
            if not (da == db if isinstance(da, Ell) or isinstance(db, Ell) else dims.same(da, db)):
                raise ShapeError(f"cannot concatenate {fmt(first)} and {fmt(t)}: leading "
                                 f"dimensions {format_dim(da)} and {format_dim(db)} differ")
        total = total + (t.shape[-1] * count if count is not None else t.shape[-1])
    return TensorType(dtype=_dtype(*types), shape=first.shape[:-1] + (total,))


def select_rule(dims, types, attrs, op):
    cond, a, b = types
    shape = broadcast_shapes(dims, cond.shape, a.shape, "select between")
    shape = broadcast_shapes(dims, shape, b.shape, "select between")
    return TensorType(dtype=_dtype(a, b), shape=shape)


def iota_rule(dims, types, attrs, op):
    size, axis, rank = attrs["size"], attrs["axis"], attrs["rank"]
    shape = tuple(size if k == axis else ONE for k in range(rank))
    return TensorType(dtype="int", shape=shape, lo=ONE, hi=size)


def broadcast_to_rule(dims, types, attrs, op):
    target = attrs["shape"]
    got = broadcast_shapes(dims, types[0].shape, target, "broadcast")
    if len(got) != len(target) or not all(
            (x == y) if isinstance(x, Ell) or isinstance(y, Ell) else dims.same(x, y)
            for x, y in zip(got, target)):
        raise ShapeError(f"the value has shape {fmt_shape(types[0].shape)}, which does not fit "
                         f"the declared {fmt_shape(target)}")
    return types[0].with_shape(target).model_copy(update={"lo": None, "hi": None, "perm": False})


def invperm_rule(dims, types, attrs, op):
    t = types[0]
    if not t.perm:
        raise ShapeError(f"invperm needs a permutation, got {fmt(t)}")
    return t


def vconcat_rule(dims, types, attrs, op):
    first = types[0]
    if len(first.shape) < 1 or any(isinstance(d, Ell) for d in first.shape):
        raise ShapeError("vconcat stacks rows of matrices of known shape")
    rows = Poly.const(0)
    for t in types:
        if len(t.shape) != len(first.shape) or not all(
                dims.same(a, b) for a, b in zip(first.shape[1:], t.shape[1:])):
            raise ShapeError(f"cannot stack the rows of {fmt(first)} and {fmt(t)}: "
                             "the other dimensions differ")
        rows = rows + t.shape[0]
    return TensorType(dtype=_dtype(*types), shape=(rows,) + tuple(first.shape[1:]))


def arg_rule(dims, types, attrs, op):
    t = types[0]
    if not t.shape or isinstance(t.shape[-1], Ell):
        raise ShapeError(f"{op} works along the last axis, which is not known here")
    k = t.shape[-1]
    if op == "argmax":
        return TensorType(dtype="int", shape=t.shape[:-1], lo=ONE, hi=k)
    return TensorType(dtype="int", shape=t.shape, lo=ONE, hi=k, perm=len(t.shape) == 1)


def identity_rule(dims, types, attrs, op):
    return types[0]


def keeptopk_rule(dims, types, attrs, op):
    """KeepTopK(v, k) of Shazeer et al. (2017): along the last axis, the k largest entries
    kept and the others -inf (a softmax of it is zero there)."""
    t = types[0]
    if t.dtype != "real" or not t.shape or isinstance(t.shape[-1], Ell):
        raise ShapeError("keeptopk keeps the largest reals along the last axis, which is not "
                         "known here" if t.shape else "keeptopk needs reals along an axis")
    return TensorType(dtype="real", shape=t.shape, neg_inf=True)


def pow_rule(dims, types, attrs, op):
    return elementwise("real")(dims, types, attrs, op)


@dataclass(frozen=True)
class Primitive:
    name: str
    arity: int | None  # None: variadic
    rule: Callable
    doc: str
    # elementwise: each entry from the same entry of the operands (broadcasting);
    # last_axis: along the last axis only (each row alone); structure: anything else.
    # The incremental analysis keeps positions apart through the first two.
    family: str = "structure"
    commutative: bool = False  # f(a, b) == f(b, a): `fgc diff` compares operands as a set


def _p(name: str, arity: int | None, rule: Callable, doc: str, family: str = "structure",
       commutative: bool = False) -> tuple[str, Primitive]:
    return name, Primitive(name, arity, rule, doc, family, commutative)


PRIMITIVES: dict[str, Primitive] = dict([
    # arithmetic, element by element with broadcasting
    _p("add", 2, elementwise(), "a + b", "elementwise", commutative=True),
    _p("sub", 2, elementwise(), "a - b", "elementwise"),
    _p("mul", 2, elementwise(), "a * b (the seed's ⊙)", "elementwise", commutative=True),
    _p("div", 2, elementwise("real"), "a / b", "elementwise"),
    _p("neg", 1, neg_rule, "-a", "elementwise"),
    _p("max", 2, elementwise(), "max(a, b), element-wise", "elementwise", commutative=True),
    _p("min", 2, elementwise(), "min(a, b), element-wise", "elementwise", commutative=True),
    _p("pow", 2, pow_rule, "pow(a, p)", "elementwise"),
    _p("mod", 2, elementwise("int"), "a % b on integers", "elementwise"),
    _p("exp", 1, unary("real"), "e^a", "elementwise"),
    _p("log", 1, unary("real"), "natural logarithm", "elementwise"),
    _p("sqrt", 1, unary("real"), "square root", "elementwise"),
    _p("tanh", 1, unary("real"), "hyperbolic tangent", "elementwise"),
    _p("sigmoid", 1, unary("real"), "1 / (1 + e^-a)", "elementwise"),
    _p("erf", 1, unary("real"), "the error function", "elementwise"),
    _p("sin", 1, unary("real"), "sine (sinusoidal positions)", "elementwise"),
    _p("cos", 1, unary("real"), "cosine", "elementwise"),
    _p("abs", 1, abs_rule, "|a|", "elementwise"),
    _p("floor", 1, unary("int"), "the largest integer not above a (T5's log buckets)",
       "elementwise"),
    _p("ceil", 1, unary("int"), "the smallest integer not below a", "elementwise"),
    # comparisons and logic (used by masks and comprehensions)
    _p("eq", 2, elementwise("bool"), "a == b", "elementwise", commutative=True),
    _p("ne", 2, elementwise("bool"), "a != b", "elementwise", commutative=True),
    _p("lt", 2, elementwise("bool"), "a < b", "elementwise"),
    _p("le", 2, elementwise("bool"), "a <= b", "elementwise"),
    _p("gt", 2, elementwise("bool"), "a > b", "elementwise"),
    _p("ge", 2, elementwise("bool"), "a >= b", "elementwise"),
    _p("and", 2, elementwise("bool"), "a and b", "elementwise", commutative=True),
    _p("or", 2, elementwise("bool"), "a or b", "elementwise", commutative=True),
    _p("not", 1, unary("bool"), "not a", "elementwise"),
    _p("select", 3, select_rule, "a if cond else b, element-wise", "elementwise"),
    # reductions over the last axis, keeping it with size 1
    _p("sum", 1, reduction, "sum over the last axis", "last_axis"),
    _p("mean", 1, reduction, "mean over the last axis", "last_axis"),
    _p("amax", 1, reduction, "maximum over the last axis", "last_axis"),
    _p("keeptopk", 1, keeptopk_rule, "keeptopk(X, k): the k largest entries of the last axis, "
       "the others -inf (attrs.k)", "last_axis"),
    # families
    _p("sum_members", 1, identity_rule, "sum(y_1, ..., y_E): the members of a family added "
       "together (its operand a whole family)", "elementwise"),
    # structure
    _p("matmul", 2, matmul_rule, "a @ b"),
    _p("transpose", 1, transpose_rule, "a^T: swap the last two axes"),
    _p("concat", None, concat_rule, "join along the last axis", "last_axis"),
    _p("index", None, None, "X[i, j], X[z[i], j], X[j, :], X[a..b, :] (1-based)"),
    _p("iota", 0, iota_rule, "the index i of a comprehension, 1..size along one axis"),
    _p("broadcast_to", 1, broadcast_to_rule, "a comprehension's value at its declared shape",
        "elementwise"),
    _p("invperm", 1, invperm_rule, "the inverse of a permutation: rank of each position"),
    _p("vconcat", None, vconcat_rule, "[A; B]: stack rows (Transformer-XL's memory)"),
    _p("argmax", 1, arg_rule, "1-based position of the maximum along the last axis"),
    _p("argsort", 1, arg_rule, "1-based positions that sort the last axis (stable)"),
    _p("stopgrad", 1, identity_rule, "the value, with no gradient flowing back through it",
        "elementwise"),
])

# what keeps positions apart (the incremental form, sequence parallelism): each entry from
# the same entries of the operands, and along the last axis only
ELEMENTWISE = frozenset(name for name, p in PRIMITIVES.items() if p.family == "elementwise")
LAST_AXIS = frozenset(name for name, p in PRIMITIVES.items() if p.family == "last_axis")

# Primitives a spec calls by name; the rest come from operators and comprehensions.
CALLABLE = {"max", "min", "pow", "exp", "log", "sqrt", "tanh", "sigmoid", "erf", "sin", "cos",
            "abs", "floor", "ceil", "sum",
            "mean", "keeptopk", "amax", "concat", "invperm", "vconcat", "argmax", "argsort",
            "stopgrad"}

BINARY_OPS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "@": "matmul", "%": "mod"}
COMPARE_OPS = {"==": "eq", "!=": "ne", "<": "lt", "<=": "le", ">": "gt", ">=": "ge"}
