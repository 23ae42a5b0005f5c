"""Elaboration: syntax to typed IR, resolving names and checking every shape.

One pass walks a module or model box, resolves each name (values, parameters,
families `W_i^Q`, layer values `H^(l-1)`, hyperparameters, modules), emits flat IR
equations and infers each value's type with the rules in `primitives.py`.

The same pass runs in two modes. Symbolic: hyperparameters stay symbols and derived
ones (`D = H/A`) are substituted only to compare dimensions, so a check holds for
every size. Numeric: a preset's values are plugged in, which also catches what only
numbers show (a divisibility, a non-positive size, an index range that does not fit).

Module bodies are checked once, generically, over their own signature symbols; a call
only unifies the arguments with the signature and records the bindings, which is
what parameter counting instantiates.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from ..errors import Diagnostic, FgcError, Span
from ..syntax import nodes as S
from ..syntax.nodes import MAX_MAGNITUDE
from . import ir
from .intrinsics import intrinsic
from .ir import Ell, Eqn, Guard, Operand, TensorType, Value, format_dim
from .primitives import (
    BINARY_OPS,
    CALLABLE,
    COMPARE_OPS,
    ONE,
    PRIMITIVES,
    ShapeError,
    broadcast_shapes,
    fmt,
    fmt_shape,
)
from .symbolic import Poly, format_int, format_poly

MAX_DIM = 2**48  # a dimension beyond this is certainly a mistake
MAX_LAYERS = 100_000

_MEMBER = re.compile(r"^(?P<base>[A-Za-z][A-Za-z0-9_]*?)_(?P<sub>[A-Za-z0-9]+)"
                     r"(?P<sup>'*\^[A-Za-z][A-Za-z0-9_]*)?$")
_CONSTANTS = {"pi": math.pi}


class Poisoned(Exception):
    """Raised when an expression uses a value whose definition already failed."""


@dataclass
class Ref:
    op: Operand
    type: TensorType


POISON = object()


def _span_of(node) -> Span | None:
    return getattr(node, "span", None)


def _int_const(value: Poly) -> TensorType:
    return TensorType(dtype="int", shape=(), lo=value, hi=value)


def member_key(name: str) -> tuple[str, str] | None:
    """`W_i^Q` -> ("W^Q", "i"); `head_1` -> ("head", "1"); `W_e` -> ("W", "e")."""
    m = _MEMBER.match(name)
    if not m:
        return None
    return m.group("base") + (m.group("sup") or ""), m.group("sub")


# ---------------------------------------------------------------- static expressions


class Statics:
    """Evaluates hyperparameter expressions to `Poly` (exact) or float."""

    def __init__(self, names: dict[str, Poly | float], file: str,
                 conditions: Conditions | None = None):
        self.names = names
        self.file = file
        self.conditions = conditions  # where a symbolic model's checks are recorded

    def eval(self, e: S.Expr, extra: dict[str, Poly | float] | None = None) -> Poly | float:
        names = {**self.names, **extra} if extra else self.names  # no copy per call: a
        return self._eval(e, names)  # spec of thousands of hyperparameters evaluates each

    def _eval(self, e, names):
        if isinstance(e, S.Num):
            return Poly.const(e.value)
        if isinstance(e, S.Name):
            if e.name in names:
                return names[e.name]
            if e.name in _CONSTANTS:
                return _CONSTANTS[e.name]
            raise FgcError(f"unknown name `{e.name}` in a size expression", e.span,
                           _suggest(e.name, names))
        if isinstance(e, S.Neg):
            v = self._eval(e.operand, names)
            return -v
        if isinstance(e, S.BinOp):
            a, b = self._eval(e.left, names), self._eval(e.right, names)
            if isinstance(a, float) or isinstance(b, float):
                for side, v in ((e.left, a), (e.right, b)):
                    if isinstance(v, Poly) and not v.is_const():
                        other = e.right if side is e.left else e.left
                        raise FgcError(f"`{_show_expr(other)}` is a real number, so "
                                       f"`{_show_expr(e)}` cannot be a size", e.span,
                                       "sizes are whole numbers")
                a, b = _to_float(a), _to_float(b)
                return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else math.inf,
                        "%": a % b if b else math.nan}.get(e.op, math.nan)
            if e.op == "+":
                return self._in_range(a + b, e)
            if e.op == "-":
                return self._in_range(a - b, e)
            if e.op == "*":
                if a.degree() + b.degree() > 64:
                    raise FgcError("size expression too large", e.span)
                return self._in_range(a * b, e)
            if e.op == "/":
                if b.is_const() and b.const_value() == 0:
                    raise FgcError("division by zero in a size expression", e.span)
                self._require("not zero", b)
                return self._in_range(a / b, e)
            if e.op == "%":
                if b.is_const() and b.const_value() == 0:
                    raise FgcError("modulo by zero in a size expression", e.span)
                self._require("not zero", b)
                return Poly.apply("mod", a, b)
            raise FgcError(f"`{e.op}` cannot appear in a size expression", e.span)
        if isinstance(e, S.Call) and e.func in ("floor", "ceil", "max", "min") and e.args:
            args = [self._eval(a, names) for a in e.args]
            if any(isinstance(a, float) for a in args):
                real = next(x for x, v in zip(e.args, args) if isinstance(v, float))
                if any(isinstance(v, Poly) and not v.is_const() for v in args):
                    raise FgcError(f"`{_show_expr(real)}` is a real number, so "
                                   f"`{_show_expr(e)}` cannot be a size", e.span,
                                   "sizes are whole numbers")
                fn = {"floor": math.floor, "ceil": math.ceil, "max": max, "min": min}[e.func]
                return float(fn(*[_to_float(a) for a in args]))
            return Poly.apply(e.func, *args)
        if isinstance(e, S.Inf):
            return math.inf
        if isinstance(e, S.IfExp):
            # decided when the sizes are known; else `[cond]` times one branch plus
            # `[not (cond)]` times the other, as parameter counts write an instance that
            # exists only under a condition on sizes
            try:
                holds = _eval_condition(e.cond, names, None)
            except _Undecided:
                holds = None
                if self.conditions is not None:
                    self.conditions.give_up("a size depends on a condition on sizes")
            if holds is not None:
                return self._eval(e.then if holds else e.orelse, names)
            text = _cond_text(e.cond)
            then, orelse = self._eval(e.then, names), self._eval(e.orelse, names)
            if isinstance(then, float) or isinstance(orelse, float):
                raise FgcError("a size that depends on a condition must be whole", e.span)
            return Poly.sym(f"[{ir.Guard(text=text)}]") * then + \
                Poly.sym(f"[{ir.Guard(text=text, positive=False)}]") * orelse
        raise FgcError("expected a size expression (numbers, hyperparameters, + - * /)",
                       _span_of(e))

    def _in_range(self, p: Poly, e: S.BinOp) -> Poly:
        self._require("in range", p)
        return _in_range(p, e)

    def _require(self, kind: str, size: Poly) -> None:
        if self.conditions is not None:
            self.conditions.require(kind, size)


def _in_range(p: Poly, e: S.BinOp) -> Poly:
    """`p` when every coefficient lies within what a float holds and exact arithmetic stays
    cheap at (1e-300 to 1e300, as for literals); else a located error, where a later float
    conversion would overflow (`F = 1e300 * 1e300`) or big integers would keep growing."""
    for c in p.terms.values():
        if abs(c) > MAX_MAGNITUDE or c.denominator > MAX_MAGNITUDE:
            # the order of magnitude from bit lengths: str() of a huge int is slow (and capped)
            digits = round((abs(c.numerator).bit_length() - c.denominator.bit_length())
                           * 0.30103)
            raise FgcError(f"`{_show_expr(e)}` is about 1e{digits}, beyond the numbers fgc "
                           "computes with", e.span,
                           "sizes and hyperparameters lie between 1e-300 and 1e300")
    return p


def _foldable(a: Ref, b: Ref) -> bool:
    """Constants fold unless a float meets a symbolic size (1.0 / N stays an operation)."""
    ca, cb = a.op.const, b.op.const
    if isinstance(ca, float) or isinstance(cb, float):
        return all(isinstance(c, float) or c.is_const() for c in (ca, cb))
    return True


def _to_float(x: Poly | float) -> float:
    if isinstance(x, float):
        return x
    if x.is_const():
        return float(x.const_value())
    raise ShapeError(f"{x} is not a number here")


def _suggest(name: str, candidates: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(name, [c for c in candidates if not c.startswith("%")], n=3)
    if close:
        return "did you mean " + " or ".join(f"`{c}`" for c in close) + "?"
    return None


# ---------------------------------------------------------------- the environment


@dataclass
class Hypers:
    """The hyperparameters in force: symbols or numbers, and derived definitions."""

    values: dict[str, Poly | float]
    derived: dict[str, Poly] = field(default_factory=dict)
    numeric: bool = False
    preset: str | None = None
    reals: set[str] = field(default_factory=set)  # symbols that stand for real numbers
    conditions: Conditions | None = None  # gathered by a symbolic model elaboration

    def expand(self, p: Poly) -> Poly:
        for _ in range(16):
            if not (p.symbols() & self.derived.keys()):
                return p
            p = p.subs(self.derived)
        return p

    def same(self, a: Poly, b: Poly) -> bool:
        if a == b:
            return True
        return self.expand(a) == self.expand(b)


@dataclass
class Conditions:
    """What the numeric checks of a model ask of its hyperparameters, gathered while the
    model is elaborated with them symbolic.

    Elaborating a model for a preset checks what only numbers show: a size that must be a
    positive whole number, an index that must fit, a divisor that must not be zero. Where
    the symbolic elaboration meets such a check on a size that is still a symbol, it
    records the check here. Values that pass every recorded check elaborate exactly as the
    symbolic model with the values put in, without an error, so `fgc check` need not
    elaborate each of a file's presets (9,000 of them took a minute). A check that cannot
    be written as a condition on one size sets `undecided`; every preset is then
    elaborated, as are those that fail a condition (their elaboration says why)."""

    symbols: frozenset[str]  # the hyperparameters, numbers in every preset
    checks: dict[tuple[str, Poly], None] = field(default_factory=dict)  # (kind, size)
    undecided: str | None = None  # why the conditions cannot speak for a preset

    def require(self, kind: str, size: Poly) -> None:
        """`size` must be `kind` (a key of `_KINDS`) once the hyperparameters are numbers.
        A size with a symbol that stays one (a layer or family index) is not checked by the
        numeric elaboration either; a constant is decided now."""
        if size.is_const():
            if not _KINDS[kind](size.const_value()):
                self.give_up(f"{format_poly(size)} is not {kind}")
        elif size.symbols() <= self.symbols:
            self.checks[(kind, size)] = None

    def depends(self, size: Poly, why: str) -> None:
        """A check whose outcome turns on `size` in a way no condition says: undecided when
        the size becomes a number in a preset."""
        if not size.is_const() and size.symbols() <= self.symbols:
            self.give_up(why)

    def give_up(self, why: str) -> None:
        if self.undecided is None:
            self.undecided = why

    def hold(self, env: dict[str, int | Fraction]) -> bool:
        """Whether the values in `env` pass every check (False when one cannot be
        evaluated: a real number, a division by zero)."""
        if self.undecided is not None:
            return False
        try:
            return all(_KINDS[kind](size.evaluate(env)) for kind, size in self.checks)
        except (KeyError, ZeroDivisionError):
            return False


_KINDS = {
    "a size": lambda v: v.denominator == 1 and 0 < v <= MAX_DIM,
    "a bound": lambda v: v.denominator == 1 and abs(v) <= MAX_DIM,  # of a range, may be <= 0
    "whole": lambda v: v.denominator == 1,
    "not negative": lambda v: v >= 0,
    "positive": lambda v: v > 0,
    "not zero": lambda v: v != 0,
    "zero": lambda v: v == 0,
    "a number of layers": lambda v: v <= MAX_LAYERS,
    "in range": lambda v: abs(v) <= MAX_MAGNITUDE and v.denominator <= MAX_MAGNITUDE,
}


@dataclass
class Scope:
    values: dict[str, Ref] = field(default_factory=dict)
    families: dict[str, Ref] = field(default_factory=dict)  # key -> whole family
    params: dict[str, ir.Param] = field(default_factory=dict)  # declared name -> param
    param_families: dict[str, ir.Param] = field(default_factory=dict)  # key -> param
    symbols: dict[str, Poly | float] = field(default_factory=dict)
    real_symbols: set[str] = field(default_factory=set)


@dataclass
class LoopCtx:
    var: str
    hi: Poly
    defined_later: set[str]
    carried: dict[str, ir.Carried] = field(default_factory=dict)


@dataclass
class FamilyCtx:
    var: str
    size: Poly


# ---------------------------------------------------------------- the elaborator


class Elaborator:
    """Elaborates the modules and the model of one file under one set of hyperparameters."""

    def __init__(self, modules: dict[str, S.Module], file: str):
        self.modules = modules
        self.file = file
        self.functions: dict[str, ir.Function] = {}
        self._checking: list[str] = []
        self.diagnostics: list[Diagnostic] = []
        self.warnings: list[Diagnostic] = []
        self._counter = 0

    # ------------------------------------------------------------ bookkeeping
    def _fresh(self) -> str:
        self._counter += 1
        return f"%{self._counter}"

    def _error(self, message: str, span: Span | None, hint: str | None = None) -> None:
        self.diagnostics.append(Diagnostic("error", message, span, hint))

    def emit(self, op: str, ins: list[Ref], out: TensorType, span: Span | None,
             attrs: dict | None = None, name: str | None = None) -> Ref:
        family = (self.family.var, self.family.size) if self.family else None
        key = None
        if name is None and op not in ("iota",):
            key = (op, tuple(str(r.op) for r in ins), repr(sorted((attrs or {}).items())),
                   repr(family), tuple(str(g) for g in self.guards), id(self.block))
            seen = self._cse.get(key)
            if seen is not None:
                return seen
        value = Value(name=name or self._fresh(), type=out)
        eqn = Eqn(outs=[value], op=op, ins=[r.op for r in ins], attrs=attrs or {},
                  family=family, guards=list(self.guards), span=span)
        self.block.append(eqn)
        ref = Ref(Operand(name=value.name), out)
        if key is not None:
            self._cse[key] = ref
        return ref

    def apply(self, op: str, ins: list[Ref], span: Span | None, attrs: dict | None = None) -> Ref:
        prim = PRIMITIVES[op]
        for r in ins:
            if r.type.family is not None:
                raise FgcError(f"`{r.op}` is a whole family of {r.type.family} values; use one "
                               "member, or pass the family with `x_1, ..., x_N`", span)
        try:
            out = prim.rule(self.hypers, [r.type for r in ins], attrs or {}, op)
        except ShapeError as e:
            raise FgcError(e.message, span, e.hint) from None
        self._check_dims(out, span)
        for r in ins:
            if r.type.lo is not None and r.type.hi is not None and r.type.lo != r.type.hi:
                # a rule may take a range lo..hi of one value as that value (`x + 1`)
                self._require("not zero", r.type.hi - r.type.lo)
        masks = [r for r in ins if r.type.neg_inf]
        if op == "mul":
            if masks:
                self._warn_mask_product(span)
            for r in ins:
                for name in r.type.taint:
                    self.mask_products.setdefault(name, span)
        if op in _KEEPS_NEG_INF:
            carried = ins[1:] if op == "select" else ins
            out = out.model_copy(update={
                "neg_inf": any(r.type.neg_inf for r in carried),
                "taint": frozenset().union(*(r.type.taint for r in carried))})
        return self.emit(op, ins, out, span, attrs)

    def _warn_mask_product(self, span: Span | None) -> None:
        if self.top._checking_builtin():
            return
        self.top.warnings.append(Diagnostic(
            "warning", "multiplying by a mask with -inf entries: -inf times a negative score "
            "is +inf, and times 0 is NaN", span,
            "fgc's masks are additive (0 where attention is allowed, -inf where it is not): add "
            "the mask to the scores instead"))

    def _check_dims(self, t: TensorType, span: Span | None) -> None:
        if not self.hypers.numeric:
            for d in t.shape:
                if isinstance(d, Poly):
                    self._require("a size", d)
            return
        for d in t.shape:
            if isinstance(d, Poly) and d.is_const():
                v = d.const_value()
                if v.denominator != 1:
                    raise FgcError(f"dimension {format_poly(d)} is not a whole number", span,
                                   self._values_hint(d))
                if v <= 0:
                    raise FgcError(f"dimension {v} is not positive", span, self._values_hint(d))
                if v > MAX_DIM:
                    raise FgcError(f"dimension {format_int(v)} is absurdly large", span)

    def _values_hint(self, d) -> str | None:
        if self.hypers.preset:
            return f"with {self.hypers.preset}"
        return None

    # ------------------------------------------------------------ types from syntax
    def type_of(self, t, statics: Statics, ell: str = "...") -> TensorType | list[TensorType]:
        if isinstance(t, S.TupleType):
            return [self.type_of(x, statics, ell) for x in t.items]
        if isinstance(t, S.RealType):
            shape = tuple(Ell(ell) if isinstance(d, S.Ellipsis_) else self._dim(d, statics)
                          for d in t.dims)
            self._ellipsis_first(shape, t.span)
            return TensorType(dtype="real", shape=shape)
        if isinstance(t, S.IntType):
            if t.values is not None:
                vals = [self._dim(v, statics, positive=False) for v in t.values]
                lo, hi = vals[0], vals[-1]
                for v in vals:
                    self._depends(v, "a set of integers has a member that is a size")
                if all(v.is_const() for v in vals):
                    consts = sorted(v.const_value() for v in vals)
                    if consts != list(range(int(consts[0]), int(consts[0]) + len(consts))):
                        raise FgcError("a set of integers must be consecutive, like {0, 1}",
                                       t.span, "write the range as {lo..hi}")
                    lo, hi = Poly.const(consts[0]), Poly.const(consts[-1])
            else:
                lo = self._dim(t.lo, statics, positive=False)
                hi = self._dim(t.hi, statics, positive=False)
            if lo.is_const() and hi.is_const() and hi.const_value() < lo.const_value():
                raise FgcError(f"empty range {format_poly(lo)}..{format_poly(hi)}", t.span,
                               "a range lo..hi needs lo <= hi")
            self._require("not negative", hi - lo)
            shape = tuple(Ell(ell) if isinstance(d, S.Ellipsis_) else self._dim(d, statics)
                          for d in t.dims)
            return TensorType(dtype="int", shape=shape, lo=lo, hi=hi)
        if isinstance(t, S.PermType):
            n = self._dim(t.n, statics)
            return TensorType(dtype="int", shape=(n,), lo=ONE, hi=n, perm=True)
        if isinstance(t, S.PadType):
            n = self._dim(t.n, statics)
            return TensorType(dtype="int", shape=(n,), lo=Poly.const(0), hi=ONE, pad=True)
        raise FgcError("unknown type", getattr(t, "span", None))

    def _ellipsis_first(self, shape: tuple, span: Span) -> None:
        for k, d in enumerate(shape):
            if isinstance(d, Ell) and k != 0:
                raise FgcError("`...` may only stand first in a shape", span)

    def _dim(self, e: S.Expr, statics: Statics, positive: bool = True) -> Poly:
        v = statics.eval(e)
        if isinstance(v, float):
            raise FgcError("a dimension must be a whole number", e.span)
        if v.is_const():
            c = v.const_value()
            if c.denominator != 1:
                raise FgcError(f"dimension {_show_expr(e)} = {c} is not a whole number", e.span,
                               self._divisibility_hint(e, statics))
            if positive and c <= 0:
                raise FgcError(f"dimension {_show_expr(e)} = {c} is not positive", e.span,
                               self._values_hint(v))
            if abs(c) > MAX_DIM:
                raise FgcError(f"dimension {_show_expr(e)} = {format_int(c)} is absurdly large",
                               e.span,
                               f"dimensions above {MAX_DIM:,} are rejected")
        else:
            self._require("a size" if positive else "a bound", v)
        return v

    def _divisibility_hint(self, e: S.Expr, statics: Statics) -> str | None:
        if isinstance(e, S.BinOp) and e.op == "/":
            return f"{_show_expr(e.right)} must divide {_show_expr(e.left)}"
        return None

    # ------------------------------------------------------------ modules
    def function(self, name: str, span: Span | None) -> ir.Function:
        """The checked IR of a module, elaborated generically on first use."""
        if name in self.functions:
            return self.functions[name]
        if name in self._checking:
            cycle = " -> ".join(self._checking[self._checking.index(name):] + [name])
            raise FgcError(f"module `{name}` is defined in terms of itself ({cycle})", span,
                           "module definitions may not be recursive")
        mod = self.modules[name]
        self._checking.append(name)
        saved, self._counter = self._counter, 0  # temporaries are numbered per module
        try:
            fn = _ModuleElaborator(self, mod).run()
        finally:
            self._checking.pop()
            self._counter = saved
        self.functions[name] = fn
        return fn

    def _checking_builtin(self) -> bool:
        return bool(self._checking) and self.modules[self._checking[-1]].span.file.endswith(
            "stdlib.fgpt")


def _walk(items: list) -> Iterable[Eqn]:
    for item in items:
        if isinstance(item, ir.Loop):
            yield from item.body
        else:
            yield item


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "@": 2, "%": 2}


def _show_expr(e: S.Expr, parent: int = 0) -> str:
    """Source-like text of a (size) expression, parenthesised only where needed."""
    if isinstance(e, S.Name):
        return e.name
    if isinstance(e, S.Num):
        return e.text
    if isinstance(e, S.BinOp):
        prec = _PRECEDENCE[e.op]
        left = _show_expr(e.left, prec)
        right = _show_expr(e.right, prec + 1)  # left-associative
        # products and quotients tight, as formulas print them (A*D*H); `%` spaced, as
        # specs write it (l % 6 == 0)
        spaced = prec == 1 or e.op == "%"
        text = f"{left} {e.op} {right}" if spaced else f"{left}{e.op}{right}"
        return f"({text})" if prec < parent else text
    if isinstance(e, S.Neg):
        return f"-{_show_expr(e.operand, 3)}"
    if isinstance(e, S.Call):
        return f"{e.func}({', '.join(_show_expr(a) for a in e.args)})"
    if isinstance(e, S.Inf):
        return "inf"
    return "…"


class _Body:
    """Shared machinery for elaborating equations, in a module or in a model."""

    file: str

    def __init__(self, top: Elaborator, hypers: Hypers):
        self.top = top
        self.hypers = hypers
        self.block: list = []
        self.family: FamilyCtx | None = None
        self.guards: list[Guard] = []
        self.loop: LoopCtx | None = None
        self.scope = Scope()
        self.statics = Statics({}, top.file)
        self.param_uses: dict[str, set[str]] = {}
        self.section = "body"
        self.mask_products: dict[str, Span | None] = {}
        self._cse: dict[tuple, Ref] = {}
        self._stacks: dict[str, tuple[ir.Loop, int]] = {}  # unnamed X^(1..L) -> its entry
        # values the numeric elaboration folds to constants, though sizes here are symbols
        self._constant_in_presets: set[str] = set()

    # bookkeeping delegated to the elaborator
    def _fresh(self) -> str:
        return self.top._fresh()

    emit = Elaborator.emit
    apply = Elaborator.apply
    _warn_mask_product = Elaborator._warn_mask_product
    _check_dims = Elaborator._check_dims
    _values_hint = Elaborator._values_hint
    type_of = Elaborator.type_of
    _ellipsis_first = Elaborator._ellipsis_first
    _dim = Elaborator._dim
    _divisibility_hint = Elaborator._divisibility_hint

    # what a symbolic model's numeric checks will ask (see `Conditions`)
    def _require(self, kind: str, size: Poly) -> None:
        if self.hypers.conditions is not None:
            self.hypers.conditions.require(kind, size)

    def _depends(self, size: Poly, why: str) -> None:
        if self.hypers.conditions is not None:
            self.hypers.conditions.depends(size, why)

    def _folds_in_presets(self, refs: list[Ref]) -> bool:
        """Whether the numeric elaboration folds what is computed from `refs`, where this
        one cannot: each is a constant once the hyperparameters are numbers (`sqrt(H)`)."""
        conditions = self.hypers.conditions
        if conditions is None:
            return False
        later = False
        for r in refs:
            if r.op.name is not None:
                if r.op.name not in self._constant_in_presets:
                    return False
                later = True
            elif isinstance(r.op.const, Poly) and not r.op.const.is_const():
                if not r.op.const.symbols() <= conditions.symbols:
                    return False
                later = True
        return later

    def _give_up(self, why: str) -> None:
        if self.hypers.conditions is not None:
            self.hypers.conditions.give_up(why)

    # ------------------------------------------------------------ constants
    def const(self, value: Poly | float, real: bool = False) -> Ref:
        if real and isinstance(value, Poly) and not (
                value.is_const() and value.const_value().denominator == 1):
            self._depends(value, "a quotient of sizes is real here but whole in a preset")
            return Ref(Operand(const=value), TensorType(dtype="real", shape=()))
        if isinstance(value, float):
            return Ref(Operand(const=value), TensorType(dtype="real", shape=(),
                                                        neg_inf=value == -math.inf))
        if value.is_const() and value.const_value().denominator != 1:
            return Ref(Operand(const=value), TensorType(dtype="real", shape=()))
        if not value.is_const() and any(s in self.scope.real_symbols for s in value.symbols()):
            return Ref(Operand(const=value), TensorType(dtype="real", shape=()))
        self._require("whole", value)  # else a real number in the preset
        return Ref(Operand(const=value), _int_const(value))

    @staticmethod
    def is_const(r: Ref) -> bool:
        return r.op.name is None

    # ------------------------------------------------------------ statements
    def statement(self, stmt, handler) -> None:
        """Run one statement, turning its failure into one diagnostic."""
        try:
            handler(stmt)
        except Poisoned:  # an input failed, and said so: what this defines fails silently too
            for name in self._targets(stmt):
                self.scope.values[name] = POISON  # type: ignore[assignment]
        except FgcError as e:
            self.top.diagnostics.extend(e.diagnostics)
            for name in self._targets(stmt):
                self.scope.values[name] = POISON  # type: ignore[assignment]

    def _targets(self, stmt) -> list[str]:
        if isinstance(stmt, S.Equation):
            out = []
            for lhs in stmt.lhs:
                if isinstance(lhs, S.LhsName):
                    out.append(lhs.name)
                elif isinstance(lhs, S.LhsLayer):
                    out.append(self._layer_name(lhs.name, lhs.layer, lhs.span, define=True,
                                                quiet=True) or lhs.name)
            for w in stmt.where:
                out.append(w.name)
            return out
        if isinstance(stmt, S.ArgDecl) and stmt.family is None:  # an input that failed
            return [stmt.name]
        return []

    def bind(self, name: str, ref: Ref, span: Span | None) -> Ref:
        """Give a computed value a name; a fresh temporary is renamed in place."""
        if ref.op.name in self._stacks and not name.startswith("%"):
            loop, k = self._stacks.pop(ref.op.name)
            loop.stacks[k] = (loop.stacks[k][0], name)
            ref = Ref(Operand(name=name), ref.type)
        elif self.block and isinstance(self.block[-1], Eqn) and ref.op.name is not None \
                and ref.op.name.startswith("%") and \
                any(v.name == ref.op.name for v in self.block[-1].outs):
            # the last equation's result, or one of them (`a, b = M(...)` binds each)
            old = ref.op.name
            next(v for v in self.block[-1].outs if v.name == old).name = name
            ref = Ref(Operand(name=name), ref.type)
            for key, seen in self._cse.items():
                if seen.op.name == old:
                    self._cse[key] = ref
            if old in self._constant_in_presets:
                self._constant_in_presets.add(name)
        self.scope.values[name] = ref
        return ref

    def several(self, eq: S.Equation) -> list[Ref]:
        """`a, b = M(...)`: the values of a module call with as many results as names."""
        if not isinstance(eq.rhs, S.Call):
            raise FgcError("several names on the left need a module call returning as many "
                           "values", eq.span)
        refs = self.call(eq.rhs)
        if len(refs) != len(eq.lhs):
            raise FgcError(f"`{eq.rhs.func}` returns {len(refs)} values but {len(eq.lhs)} "
                           "names are given", eq.span)
        return refs

    def where_eq(self, w: S.WhereEq) -> None:
        if w.name in self.scope.values or w.name in self.scope.families:
            raise FgcError(f"`{w.name}` is defined twice", w.span, "choose another name")
        if w.family is not None:
            self.family_eq(w.name, w.value, w.family, w.span)
        else:
            self.bind(w.name, self.expr(w.value), w.span)

    def family_eq(self, name: str, value: S.Expr, fam: S.Family, span: Span) -> None:
        key = member_key(name)
        if key is None or key[1] != fam.var:
            raise FgcError(f"`{name}` is defined for each {fam.var} in a range, so its name "
                           f"ends in _{fam.var}", span,
                           f"write it as `{_family_spelling(name, fam.var)}`")
        size = self._family_size(fam)
        if self.family is not None:
            raise FgcError("families cannot be nested", fam.span)
        self.family = FamilyCtx(fam.var, size)
        shadowed = self.scope.symbols.get(fam.var)
        self.scope.symbols[fam.var] = Poly.sym(fam.var)  # the member's index, 1..size
        try:
            ref = self.expr(value)
            if self._folds_in_presets([ref]):
                self._give_up("a family is a constant in a preset")
            if not self.is_const(ref) and not (
                    self.block and self.block[-1].outs[0].name == ref.op.name):
                # the member is an existing value: give the family its own equation
                ref = self.apply("broadcast_to", [ref], span, {"shape": ref.type.shape})
        finally:
            self.family = None
            if shadowed is None:
                del self.scope.symbols[fam.var]
            else:
                self.scope.symbols[fam.var] = shadowed
        if self.is_const(ref):
            raise FgcError("a family must be computed from other values", span)
        whole = Ref(Operand(name=key[0], whole_family=True),
                    ref.type.model_copy(update={"family": size}))
        # the last equation computed the member; it now names the family
        last = self.block[-1]
        if last.outs[0].name == ref.op.name:
            last.outs[0].name = key[0]
            last.outs[0].type = whole.type
            for k in [k for k, seen in self._cse.items() if seen.op.name == ref.op.name]:
                del self._cse[k]  # a family member is not a plain value any more
        self.scope.families[key[0]] = whole

    def _family_size(self, fam: S.Family) -> Poly:
        lo = self.statics.eval(fam.lo, self.scope.symbols)
        if not (isinstance(lo, Poly) and lo == Poly.const(1)):
            raise FgcError("a family's range must start at 1", fam.lo.span,
                           f"write `for {fam.var} in 1..N`")
        return self._dim(fam.hi, self._statics())

    def _statics(self) -> Statics:
        return Statics(self.scope.symbols, self.top.file, self.hypers.conditions)

    # ------------------------------------------------------------ expressions
    def expr(self, e: S.Expr) -> Ref:
        method = getattr(self, "e_" + type(e).__name__)
        return method(e)

    def e_Num(self, e: S.Num) -> Ref:
        if "." in e.text or "e" in e.text.lower():
            if e.value.denominator == 1 and e.text[-1] in "KMBT":
                return self.const(Poly.const(e.value))
            return self.const(float(e.value))
        return self.const(Poly.const(e.value))

    def e_Inf(self, e: S.Inf) -> Ref:
        return self.const(math.inf)

    def e_Name(self, e: S.Name) -> Ref:
        return self.name(e.name, e.span)

    def e_Neg(self, e: S.Neg) -> Ref:
        r = self.expr(e.operand)
        if self.is_const(r):
            c = r.op.const
            return self.const(-c)
        out = self.apply("neg", [r], e.span)
        if self._folds_in_presets([r]):
            self._constant_in_presets.add(out.op.name)
        return out

    def e_BinOp(self, e: S.BinOp) -> Ref:
        a, b = self.expr(e.left), self.expr(e.right)
        if self.is_const(a) and self.is_const(b) and e.op != "@" and _foldable(a, b):
            value = self._fold(e.op, a.op.const, b.op.const, e.span)
            return self.const(value, real=e.op == "/" or a.type.dtype == "real"
                              or b.type.dtype == "real")
        if e.op != "@" and self._folds_in_presets([a, b]):
            self._give_up("arithmetic on constants that fold only in a preset")
        return self.apply(BINARY_OPS[e.op], [a, b], e.span)

    def _fold(self, op: str, a, b, span):
        if isinstance(a, float) or isinstance(b, float):
            a, b = _to_float(a), _to_float(b)
            if op == "/" and b == 0:
                raise FgcError("division by zero", span)
            if op == "%" and b == 0:
                raise FgcError("modulo by zero", span)
            return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else 0.0,
                    "%": a % b if b else 0.0}[op]
        if op in "/%" and b.is_const() and b.const_value() == 0:
            raise FgcError("division by zero" if op == "/" else "modulo by zero", span)
        if op in "/%":
            self._require("not zero", b)
        if op == "%":
            return Poly.apply("mod", a, b)
        return {"+": a.__add__, "-": a.__sub__, "*": a.__mul__, "/": a.__truediv__}[op](b)

    def e_Compare(self, e: S.Compare) -> Ref:
        return self.apply(COMPARE_OPS[e.op], [self.expr(e.left), self.expr(e.right)], e.span)

    def e_BoolOp(self, e: S.BoolOp) -> Ref:
        return self.apply(e.op, [self.expr(e.left), self.expr(e.right)], e.span)

    def e_Not(self, e: S.Not) -> Ref:
        return self.apply("not", [self.expr(e.operand)], e.span)

    def e_Parity(self, e: S.Parity) -> Ref:
        r = self.expr(e.operand)
        m = self.apply("mod", [r, self.const(Poly.const(2))], e.span)
        return self.apply("eq", [m, self.const(Poly.const(0 if e.even else 1))], e.span)

    def e_IfExp(self, e: S.IfExp) -> Ref:
        static = self.static_condition(e.cond)
        if static is None:
            cond = self.expr(e.cond)
            return self.apply("select", [cond, self.expr(e.then), self.expr(e.orelse)], e.span)
        if isinstance(static, bool):
            return self.expr(e.then if static else e.orelse)
        text = static
        self.guards.append(Guard(text=text, positive=True))
        try:
            a = self.expr(e.then)
        finally:
            self.guards.pop()
        self.guards.append(Guard(text=text, positive=False))
        try:
            b = self.expr(e.orelse)
        finally:
            self.guards.pop()
        if a.type.dtype != b.type.dtype or len(a.type.shape) != len(b.type.shape) or not all(
                (x == y) if isinstance(x, Ell) or isinstance(y, Ell) else
                self.hypers.same(x, y) or self._same_where_equal(e.cond, x, y)
                for x, y in zip(a.type.shape, b.type.shape)):
            raise FgcError(f"the two branches of this conditional differ: {fmt(a.type)} when "
                           f"`{text}`, {fmt(b.type)} otherwise", e.span,
                           "both branches must have the same shape")
        # the result has the shape of a branch taken for any sizes: the `else` of `p == q`
        taken = b if isinstance(e.cond, S.Compare) and e.cond.op == "==" else a
        out = taken.type.model_copy(update={"neg_inf": a.type.neg_inf or b.type.neg_inf})
        return self.emit("cond", [a, b], out, e.span, {"guard": text})

    def _same_where_equal(self, cond: S.Expr, x: Poly, y: Poly) -> bool:
        """Whether two sizes agree in the branch where a condition `p == q` (or the `else`
        of `p != q`) holds: `X @ W if E != H else X` is R[n, H] either way, since the `else`
        is taken only when E equals H. Only such equalities of sizes are used."""
        if not isinstance(cond, S.Compare) or cond.op not in ("==", "!="):
            return False
        try:
            p = Statics(dict(self.scope.symbols), "").eval(cond.left)
            q = Statics(dict(self.scope.symbols), "").eval(cond.right)
        except FgcError:
            return False
        if not (isinstance(p, Poly) and isinstance(q, Poly)):
            return False
        p, q = self.hypers.expand(p), self.hypers.expand(q)
        for lhs, rhs in ((p, q), (q, p)):
            name = next(iter(lhs.symbols()), None)
            if name is not None and lhs == Poly.sym(name) and name not in rhs.symbols():
                return self.hypers.expand(x).subs({name: rhs}) == \
                    self.hypers.expand(y).subs({name: rhs})
        return False

    def static_condition(self, cond: S.Expr) -> bool | str | None:
        """True/False when decidable now, the condition's text when it depends on the
        layer index or on symbolic sizes, None when it depends on tensor values."""
        names = set(_names_in(cond))
        dynamic = {n for n in names if n in self.scope.values or n in self.scope.params}
        if dynamic:
            return None
        env = dict(self.scope.symbols)
        layer_dependent = self.loop is not None and self.loop.var in names
        try:
            value = _eval_condition(cond, env, self.loop.var if self.loop else None)
        except _Undecided:
            if not layer_dependent:
                self._give_up("a condition on sizes, decided in each preset")
            return _cond_text(cond)
        except FgcError:
            raise
        if layer_dependent:
            return _cond_text(cond)
        return value

    def e_Superscript(self, e: S.Superscript) -> Ref:
        if e.name == "T":
            return self.apply("transpose", [self.expr(e.base)], e.span)
        raise FgcError(f"`^{e.name}` after an expression: only ^T (transpose) is allowed there",
                       e.span, "superscripts other than T belong to names, like W^Q")

    def e_Tuple_(self, e: S.Tuple_) -> Ref:
        raise FgcError("a tuple can only be the result of a module", e.span)

    def e_Ellipsis_(self, e: S.Ellipsis_) -> Ref:
        raise FgcError("`...` stands only between two members of a family, as in "
                       "`head_1, ..., head_A`", e.span)

    def e_FullSlice(self, e) -> Ref:
        raise FgcError("`:` is only allowed inside brackets", e.span)

    e_RangeSlice = e_FullSlice
    e_Kwarg = e_FullSlice

    def e_LayerRef(self, e: S.LayerRef) -> Ref:
        if not isinstance(e.base, S.Name):
            raise FgcError("a layer index ^(l) follows a name, as in H^(l-1)", e.span)
        if isinstance(e.layer, S.RangeSlice):
            return self._layer_stack(e.base.name, e.layer, e.span)
        name = self._layer_name(e.base.name, e.layer, e.span, define=False)
        ref = self.scope.values.get(name)
        if ref is POISON:
            raise Poisoned()
        if ref is None:
            raise FgcError(f"`{name}` is not defined", e.span, self._layer_hint(e.base.name, name))
        return ref

    def _layer_stack(self, base: str, rng: S.RangeSlice, span: Span) -> Ref:
        """`X^(1..L)`, after a block over 1..L: every layer's X^(l), stacked on a new first
        axis; `X^(0..L-1)`: what a carried X is as each layer starts."""
        written = f"{base}^({_show_expr(rng.lo)}..{_show_expr(rng.hi)})"
        if self.loop is not None:
            raise FgcError(f"`{written}` reads every layer's value: it belongs after the "
                           "layers", span)
        lo = self.statics.eval(rng.lo, self.scope.symbols)
        hi = self.statics.eval(rng.hi, self.scope.symbols)
        for loop, top in reversed(self.finished_loops):
            var = loop.var
            defined = {inner: outer for inner, outer in loop.results}
            carried = {c.name: c for c in loop.carried}
            if f"{base}^({var})" not in defined and base not in carried:
                continue
            if isinstance(lo, Poly) and isinstance(hi, Poly) and self.hypers.same(lo, ONE) \
                    and self.hypers.same(hi, loop.hi) and f"{base}^({var})" in defined:
                inner = f"{base}^({var})"
            elif isinstance(lo, Poly) and isinstance(hi, Poly) and \
                    self.hypers.same(lo, Poly.const(0)) and base in carried and \
                    self.hypers.same(hi, loop.hi - ONE):
                inner = carried[base].inner
            else:
                raise FgcError(
                    f"`{written}`: a stack runs over all the layers", span,
                    f"`{base}^(1..{top})` stacks each layer's `{base}^({var})`" +
                    (f"; `{base}^(0..{top}-1)` what each layer starts from" if base in carried
                     else ""))
            last = self.scope.values.get(defined.get(f"{base}^({var})", ""))
            if last is POISON:
                raise Poisoned()
            t = last.type if last is not None else None
            if t is None or t.family is not None:
                raise FgcError(f"`{written}`: only a single value can be stacked, not a family",
                               span)
            tmp = self._fresh()
            loop.stacks.append((inner, tmp))
            self._stacks[tmp] = (loop, len(loop.stacks) - 1)
            return Ref(Operand(name=tmp), t.with_shape((loop.hi, *t.shape)))
        raise FgcError(f"`{written}`: no `layers` block before it defines `{base}^(l)`", span,
                       "X^(1..L) stacks the values a layers block gives X^(l), after the block")

    def _layer_hint(self, base: str, name: str) -> str | None:
        known = [k for k in self.scope.values if k.startswith(base + "^(")]
        if known:
            return "defined here: " + ", ".join(f"`{k}`" for k in sorted(known))
        return None

    def _layer_name(self, base: str, layer: S.Expr, span: Span, define: bool,
                    quiet: bool = False) -> str | None:
        """The IR name of X^(expr): X^(0), X^(l), X^(l-1) or X^(L)."""
        loop = self.loop
        extra = {loop.var: Poly.sym(loop.var)} if loop else {}
        try:
            value = self.statics.eval(layer, {**self.scope.symbols, **extra})
        except FgcError:
            if quiet:
                return None
            raise
        finished = self._finished_layer(base, layer, value)
        if loop is not None:
            lvar = Poly.sym(loop.var)
            if value == lvar:
                return f"{base}^({loop.var})"
            if value == lvar - 1 and not define:
                return self._carried(base, span)
            if finished is not None and not define:
                return finished
            if quiet:
                return None
            raise FgcError(f"inside the layers, `{base}` can be indexed by ({loop.var}) or "
                           f"({loop.var}-1), not ({_show_expr(layer)})", span)
        if isinstance(value, Poly) and value == Poly.const(0):
            return f"{base}^(0)"
        if isinstance(value, Poly):
            self._require("not zero", value)  # a preset's 0 would name X^(0)
        if finished is not None:
            return finished
        if quiet:
            return None
        if define:
            raise FgcError(f"before the layers, a layer value is defined at (0): `{base}^(0)`",
                           span)
        raise FgcError(f"`{base}^({_show_expr(layer)})`: outside the layers, use ^(0) or the "
                       "last layer", span)

    def _finished_layer(self, base: str, layer: S.Expr, value) -> str | None:
        """`X^(N)` after a block over 1..N: prefer the bound as written, then by value."""
        written = f"{base}^({_show_expr(layer)})"
        if written in self.scope.values:
            return written
        for hi_text, hi in self.loop_results:
            name = f"{base}^({hi_text})"
            if name in self.scope.values and isinstance(value, Poly):
                if self.hypers.same(value, hi):
                    return name
                self._require("not zero", value - hi)  # else a preset finds this block
        return None

    loop_results: list[tuple[str, Poly]] = []
    finished_loops: list[tuple[ir.Loop, str]] = []  # each block, with its bound as written

    def _carried(self, base: str, span: Span) -> str:
        loop = self.loop
        inner = f"{base}^({loop.var}-1)"
        if base in loop.carried:
            return inner
        init = f"{base}^(0)"
        init_ref = self.scope.values.get(init)
        if init_ref is POISON:
            raise Poisoned()
        if base not in loop.defined_later:
            raise FgcError(f"`{inner}` is used but the layers never define `{base}^({loop.var})`",
                           span)
        if init_ref is None:
            raise FgcError(f"`{inner}` at the first layer is `{init}`, which is not defined",
                           span, f"define `{init} = ...` before the layers")
        if init_ref.op.name is not None and init_ref.op.member is None and \
                not init_ref.op.whole_family:
            init = init_ref.op.name  # `X^(0) = Y` names Y: the value that holds X^(0)
        loop.carried[base] = ir.Carried(name=base, init=init, inner=inner,
                                        result=f"{base}^({loop.var})")
        self.scope.values[inner] = Ref(Operand(name=inner), init_ref.type)
        return inner

    # ------------------------------------------------------------ names
    def name(self, name: str, span: Span) -> Ref:
        scope = self.scope
        if name in scope.values:
            ref = scope.values[name]
            if ref is POISON:
                raise Poisoned()
            return ref
        if name in scope.params:
            p = scope.params[name]
            self.param_uses.setdefault(p.name, set()).add(self.section)
            return Ref(Operand(name=p.name), p.type)
        if name.endswith("^T") and len(name) > 2:
            base = self.name(name[:-2], span)
            return self.apply("transpose", [base], span)
        member = self._member(name, span)
        if member is not None:
            return member
        if name in scope.families:
            raise FgcError(f"`{name}` is a family; name one member (`{name}_1`) or all of "
                           f"them (`{name}_1, ..., {name}_N`)", span)
        if self.loop is not None and name == self.loop.var:
            return self.const(Poly.sym(name))
        if name in scope.symbols:
            return self.const(scope.symbols[name])
        if name in _CONSTANTS:
            return self.const(_CONSTANTS[name])
        if name in self.top.modules:
            return self.call_module(S.Call(span, name, span, []))
        candidates = (list(scope.values) + list(scope.params) + list(scope.symbols)
                      + list(self.top.modules) + list(scope.families))
        raise FgcError(f"unknown name `{name}`", span, _suggest(name, candidates))

    def _member(self, name: str, span: Span) -> Ref | None:
        key = member_key(name)
        if key is None:
            return None
        base, sub = key
        family = self.scope.families.get(base)
        param = self.scope.param_families.get(base)
        if family is None and param is None:
            return None
        if family is POISON:
            raise Poisoned()
        size = family.type.family if family is not None else param.type.family
        if self.family is not None and sub == self.family.var:
            index: str | Poly = sub
        elif sub.isdigit():
            index = Poly.const(int(sub))
        elif sub in self.scope.symbols:
            index = self.scope.symbols[sub]
        else:
            raise FgcError(f"`{name}`: `{sub}` is not a family index in scope", span,
                           f"members are written {base.split('^')[0]}_1 .. "
                           f"{base.split('^')[0]}_{format_poly(size)}, or with the index of "
                           "a `for` clause")
        return self._pick(base, family, param, index, name, span)

    def e_MemberAt(self, e: S.MemberAt) -> Ref:
        """`k_{(i - 1) / 2 + 1}`: inside `for i in 1..A`, member i reads the member of `k`
        the expression gives (grouped-query attention's keys); elsewhere a member by a
        size expression."""
        family = self.scope.families.get(e.family)
        param = self.scope.param_families.get(e.family)
        name = f"{e.family}_{{...}}"
        if family is None and param is None:
            raise FgcError(f"`{e.family}` is not a family", e.span,
                           _suggest(e.family, list(self.scope.families)))
        if family is POISON:
            raise Poisoned()
        index = self.statics.eval(e.index, self.scope.symbols)
        if not isinstance(index, Poly):
            raise FgcError(f"`{name}`: a member's index is a whole number", e.index.span)
        var = self.family.var if self.family is not None else None
        if var is not None and index == Poly.sym(var):
            return self._pick(e.family, family, param, var, name, e.span)
        if var is not None and var in index.symbols() and param is not None:
            raise FgcError(f"`{name}`: a parameter family's member is read by the member "
                           "index itself or a number", e.span,
                           "read it through a value family (`k_j = X @ W_j for j in "
                           "1..G`), then pick its members with `k_{...}`")
        # an index map (`k_{floor((i - 1) * G / A) + 1}`) is checked at each configuration,
        # through every module use: lowering.families.index_maps
        return self._pick(e.family, family, param, index, name, e.span)

    def _pick(self, base: str, family, param, index: str | Poly, name: str,
              span: Span) -> Ref:
        """Member `index` of a family: the member index itself (a str), a number or a size."""
        size = family.type.family if family is not None else param.type.family
        if isinstance(index, str) and not self.hypers.same(size, self.family.size):
            raise FgcError(f"`{name}`: the family has {format_poly(size)} members but "
                           f"{index} runs over 1..{format_poly(self.family.size)}", span)
        if isinstance(index, Poly) and index.is_const() and size.is_const():
            k = index.const_value()
            if not 1 <= k <= size.const_value():
                raise FgcError(f"`{name}`: member {k} of a family of {size.const_value()}", span)
        elif isinstance(index, Poly) and (self.family is None or
                                          self.family.var not in index.symbols()):
            self._require("not negative", index - 1)
            self._require("not negative", size - index)
        if param is not None:
            self.param_uses.setdefault(param.name, set()).add(self.section)
            t = param.type.member()
        else:
            t = family.type.member()
        return Ref(Operand(name=base, member=index), t)

    # ------------------------------------------------------------ indexing
    def e_Index(self, e: S.Index) -> Ref:
        if isinstance(e.base, S.Name) and e.base.name in self.top.modules \
                and e.base.name not in self.scope.values:
            return self.call_module(S.Call(e.span, e.base.name, e.base.span, [],
                                           hyper_args=e.items))
        base = self.expr(e.base)
        t = base.type
        shape = t.shape
        if any(isinstance(d, Ell) for d in shape):
            raise FgcError("cannot index a value whose leading dimensions are not known", e.span)
        if len(e.items) != len(shape):
            raise FgcError(f"{fmt(t)} has {len(shape)} ax{'is' if len(shape) == 1 else 'es'} "
                           f"but is indexed with {len(e.items)}", e.span)
        ins = [base]
        kinds = []
        out_dims: list = []
        tensor_shapes = []
        for item, dim in zip(e.items, shape):
            if isinstance(item, S.FullSlice):
                kinds.append(":")
                out_dims.append(dim)
                continue
            if isinstance(item, S.RangeSlice):
                lo = self._dim(item.lo, self._statics())
                hi = self._dim(item.hi, self._statics())
                self._check_range(lo, hi, dim, item.span)
                ins.append(self.const(lo))
                ins.append(self.const(hi))
                kinds.append("range")
                out_dims.append(hi - lo + 1)
                continue
            if isinstance(item, S.Kwarg):
                raise FgcError("`name=value` is for a module's hyperparameters", item.span)
            idx = self.expr(item)
            if idx.type.dtype != "int":
                raise FgcError(f"an index must be an integer, got {fmt(idx.type)}", item.span)
            self._check_index_range(idx.type, dim, item.span)
            ins.append(idx)
            if idx.type.shape:
                kinds.append("gather")
                tensor_shapes.append(idx.type.shape)
            else:
                kinds.append("at")
        if tensor_shapes:
            if any(k in (":", "range") for k in kinds):
                raise FgcError("an index by a tensor cannot be mixed with `:` here", e.span,
                               "index every axis by a tensor, as in a comprehension")
            bshape = tensor_shapes[0]
            for s in tensor_shapes[1:]:
                try:
                    bshape = broadcast_shapes(self.hypers, bshape, s, "index with")
                except ShapeError as err:
                    raise FgcError(err.message, e.span) from None
            out_dims = list(bshape)
        out = TensorType(dtype=t.dtype, shape=tuple(out_dims),
                         lo=t.lo if t.dtype == "int" else None,
                         hi=t.hi if t.dtype == "int" else None)
        return self.emit("index", ins, out, e.span, {"kinds": kinds})

    def _check_index_range(self, t: TensorType, dim, span: Span) -> None:
        if t.lo is None or t.hi is None or isinstance(dim, Ell):
            return
        lo, hi = self.hypers.expand(t.lo), self.hypers.expand(t.hi)
        d = self.hypers.expand(dim)
        if lo.is_const() and lo.const_value() < 1:
            raise FgcError(f"index ranges over {format_poly(t.lo)}..{format_poly(t.hi)} but "
                           "indices are 1-based", span, "shift it, e.g. `x[i] + 1`")
        self._require("not negative", lo - 1)
        self._require("not negative", d - hi)
        if (hi - d).is_const():
            if (hi - d).const_value() > 0:
                raise FgcError(f"index ranges up to {format_poly(t.hi)} but the axis has "
                               f"{format_dim(dim)} entries", span)

    def _check_range(self, lo: Poly, hi: Poly, dim, span: Span) -> None:
        count = self.hypers.expand(hi - lo + 1)
        if count.is_const() and count.const_value() <= 0:
            raise FgcError(f"rows {format_poly(lo)}..{format_poly(hi)} are an empty range", span,
                           "a range lo..hi needs lo <= hi")
        self._require("positive", count)
        if lo.is_const() and hi.is_const() and dim.is_const():
            a, b, d = lo.const_value(), hi.const_value(), dim.const_value()
            if not (1 <= a <= b <= d):
                raise FgcError(f"rows {a}..{b} do not fit an axis of {d}", span)
        else:
            for low, high in ((ONE, lo), (lo, hi), (hi, dim)):
                self._require("not negative", high - low)

    # ------------------------------------------------------------ calls
    def e_Call(self, e: S.Call) -> Ref:
        refs = self.call(e)
        if len(refs) != 1:
            raise FgcError(f"`{e.func}` returns {len(refs)} values; name them: "
                           f"`a, b = {e.func}(...)`", e.span)
        return refs[0]

    def call(self, e: S.Call) -> list[Ref]:
        if e.func in self.top.modules:
            return self.call_module(e, many=True)
        if e.func in CALLABLE:
            return [self.call_primitive(e)]
        if e.func in self.scope.values or e.func in self.scope.params:
            raise FgcError(f"`{e.func}` is a value, not a module", e.func_span,
                           "use @ to multiply by a matrix")
        candidates = list(self.top.modules) + sorted(CALLABLE)
        raise FgcError(f"unknown module `{e.func}`", e.func_span, _suggest(e.func, candidates))

    def call_primitive(self, e: S.Call) -> Ref:
        prim = PRIMITIVES[e.func]
        if e.hyper_args or e.label:
            raise FgcError(f"`{e.func}` is a primitive; it takes no [hyperparameters] or label",
                           e.span)
        args, counts = [], []
        expanded = self._expand_args(e.args, e.span)
        if e.func == "sum" and len(expanded) == 1 and expanded[0].op.whole_family:
            # sum(y_1, ..., y_E): the members added together, not a sum along an axis
            whole = expanded[0]
            return self.emit("sum_members", [whole], whole.type.member(), e.span)
        if e.func == "keeptopk":
            return self._keeptopk(expanded, e.span)
        for a in expanded:
            if isinstance(a, Ref) and a.op.whole_family:
                if e.func != "concat":
                    raise FgcError(f"`{e.func}` cannot take a whole family", e.span)
                args.append(Ref(a.op, a.type.member()))
                counts.append(a.type.family)
            else:
                args.append(a)
                counts.append(None)
        if prim.arity is not None and len(args) != prim.arity:
            raise FgcError(f"`{e.func}` takes {prim.arity} argument{'s' * (prim.arity != 1)}, "
                           f"got {len(args)}", e.span)
        if e.func == "concat":
            return self.apply("concat", args, e.span, {"counts": counts})
        if e.func in ("floor", "ceil") and self.is_const(args[0]):
            # of sizes, exact (a size expression); of a number, a whole number
            c = args[0].op.const
            if isinstance(c, Poly):
                return self.const(Poly.apply(e.func, c))
            if math.isfinite(c):
                return self.const(Poly.const((math.floor if e.func == "floor" else math.ceil)(c)))
        if all(self.is_const(a) for a in args) and e.func in _FOLD:
            try:
                return self.const(_FOLD[e.func](*[_to_float(a.op.const) for a in args]))
            except (ShapeError, ValueError, OverflowError):
                pass
        out = self.apply(e.func, args, e.span)
        if e.func in _FOLD and self._folds_in_presets(args):
            self._constant_in_presets.add(out.op.name)
        return out

    def _keeptopk(self, args: list[Ref], span: Span) -> Ref:
        """keeptopk(X, k): k is a size, a whole number from 1 to the last axis's length
        (checked per configuration where it is a hyperparameter)."""
        if len(args) != 2 or not self.is_const(args[1]) or \
                not isinstance(args[1].op.const, Poly):
            raise FgcError("keeptopk takes a real tensor and how many entries to keep, a size "
                           "such as `K` or `2`: keeptopk(X, K)", span)
        x, k = args
        if x.op.whole_family:
            raise FgcError("`keeptopk` cannot take a whole family", span)
        k_size, axis = k.op.const, x.type.shape[-1] if x.type.shape else None
        if isinstance(axis, Poly):
            left = axis - k_size
            if k_size.is_const() and left.is_const():  # numbers: K > E is this config's error
                if not (k_size.const_value().denominator == 1 and 1 <= k_size.const_value()
                        and left.const_value() >= 0):
                    raise FgcError(f"keeptopk keeps {format_poly(k_size)} of "
                                   f"{format_poly(axis)} entries", span,
                                   f"keep a whole number from 1 to {format_poly(axis)}")
            else:
                self._require("a size", k_size)
                self._require("not negative", left)
        return self.apply("keeptopk", [x], span, {"k": k.op.const})

    def _expand_args(self, args: list[S.Expr], span: Span) -> list[Ref]:
        """Elaborate call arguments; `x_1, ..., x_N` becomes one whole-family argument."""
        out: list[Ref] = []
        k = 0
        while k < len(args):
            if k + 2 < len(args) and isinstance(args[k + 1], S.Ellipsis_):
                first, last = args[k], args[k + 2]
                out.append(self._family_arg(first, last))
                k += 3
                continue
            out.append(self.expr(args[k]))
            k += 1
        return out

    def _family_arg(self, first: S.Expr, last: S.Expr) -> Ref:
        if not (isinstance(first, S.Name) and isinstance(last, S.Name)):
            raise FgcError("`...` stands between two members of one family, as in "
                           "`head_1, ..., head_A`", first.span)
        k1, k2 = member_key(first.name), member_key(last.name)
        if k1 is None or k2 is None or k1[0] != k2[0]:
            raise FgcError(f"`{first.name}, ..., {last.name}` must name the first and last "
                           "members of one family", first.span)
        base = k1[0]
        fam = self.scope.families.get(base)
        param = self.scope.param_families.get(base)
        if fam is POISON:
            raise Poisoned()
        if fam is None and param is None:
            raise FgcError(f"no family `{base}` is defined", first.span)
        size = fam.type.family if fam is not None else param.type.family
        lo = self.statics.eval(S.Name(first.span, k1[1]) if not k1[1].isdigit()
                               else S.Num(first.span, Fraction(int(k1[1])), k1[1]),
                               self.scope.symbols)
        hi = self.statics.eval(S.Name(last.span, k2[1]) if not k2[1].isdigit()
                               else S.Num(last.span, Fraction(int(k2[1])), k2[1]),
                               self.scope.symbols)
        if not (isinstance(lo, Poly) and lo == ONE and isinstance(hi, Poly)
                and self.hypers.same(hi, size)):
            raise FgcError(f"`{first.name}, ..., {last.name}` must cover the whole family "
                           f"1..{format_poly(size)}", first.span)
        if param is not None:
            self.param_uses.setdefault(param.name, set()).add(self.section)
            return Ref(Operand(name=param.name, whole_family=True), param.type)
        return fam

    def call_module(self, e: S.Call, many: bool = False):
        fn = self.top.function(e.func, e.func_span)
        args = self._expand_args(e.args, e.span)
        if len(args) != len(fn.inputs):
            raise FgcError(f"`{e.func}` takes {len(fn.inputs)} argument"
                           f"{'s' * (len(fn.inputs) != 1)}, got {len(args)}", e.span,
                           "signature: " + _signature(fn))
        binds: dict[str, Poly | tuple] = {}
        hyper_binds = self._module_hypers(fn, e)
        binds.update(hyper_binds)
        pending = []
        for arg, inp, syn in zip(args, fn.inputs, e.args if len(e.args) == len(args) else
                                 [e] * len(args)):
            pending.extend(self._unify(inp, arg, binds, e, _span_of(syn) or e.span))
        for sig, actual, span, what in pending:
            expected = self._instantiate_dim(sig, binds)
            if expected is None or not self.hypers.same(expected, actual):
                raise FgcError(f"argument {what} of `{e.func}`: expected dimension "
                               f"{format_poly(sig if expected is None else expected)}"
                               f", got {format_poly(actual)}", span, "signature: " + _signature(fn))
        for arg, inp in zip(args, fn.inputs):
            if inp.name in fn.mask_products:
                if arg.type.neg_inf:
                    self._warn_mask_product(fn.mask_products[inp.name])
                for name in arg.type.taint:
                    self.mask_products.setdefault(name, fn.mask_products[inp.name])
        outs = []
        for o in fn.outputs:
            t = self._instantiate(o.type, binds, e.span, fn)
            flowing = [a for a, inp in zip(args, fn.inputs) if inp.name in o.type.taint]
            outs.append(t.model_copy(update={
                "neg_inf": o.type.neg_inf or any(a.type.neg_inf for a in flowing),
                "taint": frozenset().union(*(a.type.taint for a in flowing))}))
        value_binds = {k: v for k, v in binds.items() if isinstance(v, (Poly, float))}
        attrs = {"module": fn.name, "label": e.label, "bindings": value_binds}
        values = [Value(name=self._fresh(), type=t) for t in outs]
        eqn = Eqn(outs=values, op="call", ins=[a.op for a in args], attrs=attrs,
                  family=(self.family.var, self.family.size) if self.family else None,
                  guards=list(self.guards), span=e.span)
        self.block.append(eqn)
        refs = [Ref(Operand(name=v.name), v.type) for v in values]
        if not many and len(refs) != 1:
            raise FgcError(f"`{e.func}` returns {len(refs)} values", e.span)
        return refs if many else refs[0]

    def _module_hypers(self, fn: ir.Function, e: S.Call) -> dict[str, Poly | float]:
        given: dict[str, Poly | float] = {}
        positional = 0
        for item in e.hyper_args:
            if isinstance(item, S.Kwarg):
                if item.name not in {h.name for h in fn.hypers}:
                    raise FgcError(f"`{fn.name}` has no hyperparameter `{item.name}`", item.span,
                                   _suggest(item.name, [h.name for h in fn.hypers]))
                given[item.name] = self.statics.eval(item.value, self.scope.symbols)
            elif isinstance(item, (S.FullSlice, S.RangeSlice)):
                raise FgcError("expected a hyperparameter value", item.span)
            else:
                if positional >= len(fn.hypers):
                    raise FgcError(f"`{fn.name}` takes {len(fn.hypers)} hyperparameter"
                                   f"{'s' * (len(fn.hypers) != 1)}", item.span)
                given[fn.hypers[positional].name] = self.statics.eval(item, self.scope.symbols)
                positional += 1
        out: dict[str, Poly | float] = {}
        for h in fn.hypers:
            if h.name in given:
                out[h.name] = given[h.name]
            elif h.name in self.scope.symbols:
                out[h.name] = self.scope.symbols[h.name]
            elif h.default is not None:
                out[h.name] = h.default
            else:
                raise FgcError(f"`{fn.name}` needs the hyperparameter `{h.name}`", e.span,
                               f"declare `hyper {h.name}` in the model, or write "
                               f"`{fn.name}[{h.name}=...](...)`")
        return out

    def _unify(self, sig: Value, arg: Ref, binds: dict, e: S.Call, span: Span) -> list:
        """Bind the callee's symbols from one argument; return checks for compound dims."""
        what = f"`{sig.name}`"
        st, at = sig.type, arg.type
        if st.family is not None:
            if not arg.op.whole_family:
                raise FgcError(f"argument {what} of `{e.func}` is a family: pass "
                               f"`x_1, ..., x_N`", span)
            pend = self._bind_dim(st.family, at.family, binds, span, what)
            st, at = st.member(), at.member()
        else:
            pend = []
            if arg.op.whole_family:
                raise FgcError(f"argument {what} of `{e.func}` takes one value, not a family",
                               span)
        if st.dtype == "int" and at.dtype != "int":
            raise FgcError(f"argument {what} of `{e.func}` must be integers, got {fmt(at)}", span)
        if st.perm and not at.perm:
            raise FgcError(f"argument {what} of `{e.func}` must be a permutation, got {fmt(at)}",
                           span)
        if st.dtype == "int" and st.lo is not None:
            if at.lo is None:
                raise FgcError(f"argument {what} of `{e.func}` needs integers with a known range",
                               span)
            pend += self._bind_dim(st.lo, at.lo, binds, span, what + " (lowest value)")
            pend += self._bind_dim(st.hi, at.hi, binds, span, what + " (highest value)")
        sshape, ashape = st.shape, at.shape
        if sshape and isinstance(sshape[0], Ell):
            rest = sshape[1:]
            tail = ashape[len(ashape) - len(rest):]
            if len(ashape) < len(rest) or any(isinstance(d, Ell) for d in tail):
                raise FgcError(f"argument {what} of `{e.func}`: expected {fmt(st)}, got "
                               f"{fmt(at)}", span)
            lead = tuple(ashape[: len(ashape) - len(rest)])
            prev = binds.get(sshape[0].name)
            if prev is not None and not _same_shape(self.hypers, prev, lead):
                raise FgcError(f"argument {what} of `{e.func}`: leading dimensions "
                               f"{fmt_shape(lead)} differ from {fmt_shape(prev)}", span)
            binds[sshape[0].name] = lead
            ashape = ashape[len(ashape) - len(rest):]
            sshape = rest
        if len(sshape) != len(ashape) or any(isinstance(d, Ell) for d in ashape):
            raise FgcError(f"argument {what} of `{e.func}`: expected {fmt(st)}, got {fmt(at)}",
                           span, "signature: " + _signature(self.top.functions[e.func]))
        for sd, ad in zip(sshape, ashape):
            pend += self._bind_dim(sd, ad, binds, span, what)
        return pend

    def _bind_dim(self, sig: Poly, actual: Poly, binds: dict, span: Span, what: str) -> list:
        syms = sig.symbols()
        if len(sig.terms) == 1 and len(syms) == 1:
            (mono, coef), = sig.terms.items()
            if coef == 1 and len(mono) == 1 and mono[0][1] == 1 and isinstance(mono[0][0], str):
                sym = mono[0][0]
                if sym not in binds:
                    binds[sym] = actual
                    return []
        return [(sig, actual, span, what)]

    def _instantiate_dim(self, sig: Poly, binds: dict) -> Poly | None:
        env = {k: v for k, v in binds.items() if isinstance(v, Poly)}
        if not sig.symbols() <= env.keys():
            return None
        return sig.subs(env)

    def _instantiate(self, t: TensorType, binds: dict, span: Span, fn: ir.Function) -> TensorType:
        shape: list = []
        for d in t.shape:
            if isinstance(d, Ell):
                shape.extend(binds.get(d.name, ()))
                continue
            v = self._instantiate_dim(d, binds)
            if v is None:
                raise FgcError(f"`{fn.name}`: the result's size {format_poly(d)} is not "
                               "determined by the arguments", span)
            shape.append(v)
        upd = {"shape": tuple(shape)}
        for k in ("lo", "hi", "family"):
            v = getattr(t, k)
            if v is not None:
                upd[k] = self._instantiate_dim(v, binds)
        out = t.model_copy(update=upd)
        self._check_dims(out, span)
        return out


def _same_shape(hypers: Hypers, a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(
        (x == y) if isinstance(x, Ell) or isinstance(y, Ell) else hypers.same(x, y)
        for x, y in zip(a, b))


def _signature(fn: ir.Function) -> str:
    ins = ", ".join(f"{v.name}: {fmt(v.type)}" for v in fn.inputs)
    outs = ", ".join(fmt(v.type) for v in fn.outputs)
    hyp = f"[{', '.join(h.name for h in fn.hypers)}]" if fn.hypers else ""
    return f"{fn.name}{hyp}({ins}) -> {outs if len(fn.outputs) == 1 else '(' + outs + ')'}"


# ops through which a -inf entry survives (a mask stays a mask)
_KEEPS_NEG_INF = {"add", "sub", "mul", "select", "index", "transpose", "broadcast_to", "concat",
                  "vconcat", "max", "min", "stopgrad"}

_FOLD = {"sqrt": math.sqrt, "exp": math.exp, "log": math.log, "tanh": math.tanh,
         "erf": math.erf, "abs": abs, "sin": math.sin, "cos": math.cos}


class _Undecided(Exception):
    pass


def _names_in(e) -> Iterable[str]:
    if isinstance(e, S.Name):
        yield e.name
    for v in vars(e).values() if hasattr(e, "__dict__") else ():
        if isinstance(v, S.Expr):
            yield from _names_in(v)
        elif isinstance(v, list):
            for x in v:
                if isinstance(x, S.Expr):
                    yield from _names_in(x)


def _eval_condition(e, env: dict, layer_var: str | None):
    """Evaluate a static condition; raise _Undecided when it needs unknown symbols."""
    if isinstance(e, S.BoolOp):
        a = _eval_condition(e.left, env, layer_var)
        b = _eval_condition(e.right, env, layer_var)
        return (a and b) if e.op == "and" else (a or b)
    if isinstance(e, S.Not):
        return not _eval_condition(e.operand, env, layer_var)
    if isinstance(e, S.Parity):
        v = _eval_number(e.operand, env, layer_var)
        return (v % 2 == 0) == e.even
    if isinstance(e, S.Compare):
        a = _eval_number(e.left, env, layer_var)
        b = _eval_number(e.right, env, layer_var)
        return {"==": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b,
                ">=": a >= b}[e.op]
    raise FgcError("expected a condition (a comparison, `l is even`, and/or/not)", e.span)


def _eval_number(e, env: dict, layer_var: str | None):
    # the layer index, alone or computed with (`l % 6 == 0`: every sixth layer), is decided
    # layer by layer
    if layer_var is not None and layer_var in _names_in(e):
        raise _Undecided()
    v = Statics(env, "").eval(e)
    if isinstance(v, float):
        return v
    if not v.is_const():
        raise _Undecided()
    return v.const_value()


_COND_PRECEDENCE = {"or": 1, "and": 2}  # then not (3), then comparisons and parities (4)


def _cond_text(e, parent: int = 0) -> str:
    """Source-like text of a condition, parenthesised where the grouping needs it: the
    backends evaluate guards from this text."""
    if isinstance(e, S.BoolOp):
        prec = _COND_PRECEDENCE[e.op]
        text = f"{_cond_text(e.left, prec)} {e.op} {_cond_text(e.right, prec + 1)}"
    elif isinstance(e, S.Not):
        prec, text = 3, f"not {_cond_text(e.operand, 3)}"
    elif isinstance(e, S.Parity):
        prec, text = 4, f"{_show_expr(e.operand)} is {'even' if e.even else 'odd'}"
    elif isinstance(e, S.Compare):
        prec, text = 4, f"{_show_expr(e.left)} {e.op} {_show_expr(e.right)}"
    else:
        return _show_expr(e)
    return f"({text})" if prec < parent else text


def guard_tree(text: str) -> S.Expr:
    """A guard's condition as a syntax tree (the text was printed from one by _cond_text)."""
    tree = _GUARD_CACHE.get(text)
    if tree is None:
        from ..syntax.parse import parse_text
        f = parse_text(f"model Guard {{ g = 1 if {text} else 0 }}", "<guard>")
        tree = f.models[0].statements[0].rhs.cond
        _GUARD_CACHE[text] = tree
    return tree


def guard_holds(guard: Guard, env: dict) -> bool:
    """Evaluate a guard for concrete values (the layer index among them)."""
    tree = guard_tree(guard.text)
    value = bool(_eval_condition(tree, {k: Poly.const(v) for k, v in env.items()}, None))
    return value if guard.positive else not value


_GUARD_CACHE: dict[str, S.Expr] = {}


# ---------------------------------------------------------------- a module box


class _ModuleElaborator(_Body):
    def __init__(self, top: Elaborator, mod: S.Module):
        super().__init__(top, Hypers(values={}, numeric=False))
        self.mod = mod
        self.loop_results = []

    def run(self) -> ir.Function:
        mod = self.mod
        top = self.top
        # signature symbols: every name in the input and output types that is not a hyper
        hypers: list[ir.Hyper] = []
        symbols: dict[str, Poly | float] = {}
        for h in mod.hypers:
            default = None
            if h.default is not None:
                default = Statics(symbols, top.file).eval(h.default)
                if isinstance(default, float) or (isinstance(default, Poly) and default.is_const()
                                                  and default.const_value().denominator != 1):
                    self.scope.real_symbols.add(h.name)
            hypers.append(ir.Hyper(name=h.name, default=default, span=h.span))
            symbols[h.name] = Poly.sym(h.name)
        for name in _free_names_in_types([a.type for a in mod.inputs] + [mod.out_type]
                                         + [a.family.hi for a in mod.inputs if a.family]):
            symbols.setdefault(name, Poly.sym(name))
        self.scope.symbols = symbols
        self.statics = Statics(symbols, top.file)
        statics = self.statics
        inputs: list[Value] = []
        for a in mod.inputs:
            t = self.type_of(a.type, statics).model_copy(update={"taint": frozenset({a.name})})
            if a.family is not None:
                key = member_key(a.name)
                if key is None or key[1] != a.family.var:
                    raise FgcError(f"a family input is named with its index, like `{a.name}_"
                                   f"{a.family.var}`", a.span)
                t = t.model_copy(update={"family": self._family_size(a.family)})
                self.scope.families[key[0]] = Ref(Operand(name=key[0], whole_family=True), t)
                inputs.append(Value(name=key[0], type=t))
            else:
                self.scope.values[a.name] = Ref(Operand(name=a.name), t)
                inputs.append(Value(name=a.name, type=t))
        out_types = self.type_of(mod.out_type, statics)
        out_types = out_types if isinstance(out_types, list) else [out_types]
        params = []
        for p in mod.params:
            params.append(self.declare_param(p))
        fn = ir.Function(name=mod.name, hypers=hypers, inputs=inputs, params=params, eqns=[],
                         outputs=[], span=mod.span)
        top.functions[mod.name + "\0partial"] = fn
        heads = [eq for eq in mod.equations if self._is_head(eq)]
        if not heads:
            raise FgcError(f"module `{mod.name}` never defines its result", mod.span,
                           f"add `{mod.name}({', '.join(a.name for a in mod.inputs)}) = ...`")
        if len(heads) > 1:
            raise FgcError(f"module `{mod.name}` defines its result twice", heads[1].span)
        results: list[Ref] = []
        for eq in mod.equations:
            if eq is heads[0]:
                results = self.head_equation(eq, out_types)
            else:
                self.statement(eq, self.local_equation)
        if top.diagnostics:
            raise FgcError.many(list(top.diagnostics))
        outs: list[Value] = []
        for ref, declared in zip(results, out_types):
            if ref.type.dtype == "bool" or not _same_shape(self.hypers, ref.type.shape,
                                                           declared.shape):
                raise FgcError(f"module `{mod.name}` computes {fmt(ref.type)} but declares "
                               f"{fmt(declared)}", heads[0].span)
            outs.append(Value(name=ref.op.name or "%const", type=declared.model_copy(
                update={"neg_inf": ref.type.neg_inf, "taint": ref.type.taint})))
        fn.eqns = self.block
        fn.outputs = outs
        fn.mask_products = dict(self.mask_products)
        _name_instances(fn.eqns, top)
        top.functions.pop(mod.name + "\0partial", None)
        fn.builtin = mod.span.file.endswith("stdlib.fgpt")
        fused = intrinsic(fn)
        for p in fn.params:
            p.members_first = fused is not None and p.name in fused.members_first
        return fn

    def declare_param(self, p: S.ParamDecl) -> ir.Param:
        t = self.type_of(p.type, self.statics)
        if t.dtype != "real" or any(isinstance(d, Ell) for d in t.shape):
            raise FgcError("a parameter is a real tensor of known shape, like R[H, D]", p.span)
        if p.family is not None:
            key = member_key(p.name)
            if key is None or key[1] != p.family.var:
                raise FgcError("a parameter family is named with its index as the last "
                               "subscript", p.span,
                               f"write `{_family_spelling(p.name, p.family.var)}`")
            t = t.model_copy(update={"family": self._family_size(p.family)})
            param = ir.Param(name=key[0], type=t, span=p.span, declared=p.name, init=p.init)
            if key[0] in self.scope.param_families:
                raise FgcError(f"parameter family `{p.name}` is declared twice", p.span)
            self.scope.param_families[key[0]] = param
        else:
            param = ir.Param(name=p.name, type=t, span=p.span, declared=p.name, init=p.init)
            if p.name in self.scope.params:
                raise FgcError(f"parameter `{p.name}` is declared twice", p.span)
            self.scope.params[p.name] = param
        return param

    def _is_head(self, eq: S.Equation) -> bool:
        lhs = eq.lhs[0]
        if isinstance(lhs, S.LhsIndex):
            lhs = lhs.head
        return isinstance(lhs, (S.LhsHead, S.LhsName)) and lhs.name == self.mod.name

    def local_equation(self, eq: S.Equation) -> None:
        for w in eq.where:
            self.where_eq(w)
        if len(eq.lhs) != 1:
            if not all(isinstance(x, S.LhsName) for x in eq.lhs):
                raise FgcError("inside a module, the names on the left are plain names",
                               eq.span)
            for x, ref in zip(eq.lhs, self.several(eq)):
                self.bind(x.name, ref, x.span)
            return
        lhs = eq.lhs[0]
        if not isinstance(lhs, S.LhsName):
            raise FgcError("inside a module, the left-hand side is a plain name", lhs.span)
        if eq.family is not None:
            self.family_eq(lhs.name, eq.rhs, eq.family, eq.span)
        else:
            self.bind(lhs.name, self.expr(eq.rhs), eq.span)

    def head_equation(self, eq: S.Equation, out_types: list[TensorType]) -> list[Ref]:
        lhs = eq.lhs[0]
        indices: list[str] = []
        if isinstance(lhs, S.LhsIndex):
            indices = lhs.indices
            lhs = lhs.head
        if isinstance(lhs, S.LhsHead):
            expected = [a.name for a in self.mod.inputs]
            given = lhs.params
            if [member_key(x)[0] if member_key(x) and a.family else x
                    for x, a in zip(expected, self.mod.inputs)] != given:
                raise FgcError(f"the result is written `{self.mod.name}("
                               f"{', '.join(_input_stem(a) for a in self.mod.inputs)})`", lhs.span)
        if eq.family is not None:
            raise FgcError("a module's result cannot be a family", eq.family.span)
        if indices:
            return [self.comprehension(eq, indices, out_types)]
        for w in eq.where:
            self.statement(w, self.where_eq)
        if self.top.diagnostics:
            raise FgcError.many(list(self.top.diagnostics))
        if isinstance(eq.rhs, S.Tuple_):
            refs = [self.expr(x) for x in eq.rhs.items]
        elif isinstance(eq.rhs, S.Call) and len(out_types) > 1:
            refs = self.call(eq.rhs)
        else:
            refs = [self.expr(eq.rhs)]
        if len(refs) != len(out_types):
            raise FgcError(f"module `{self.mod.name}` declares {len(out_types)} results but "
                           f"computes {len(refs)}", eq.span)
        out = []
        for ref, t in zip(refs, out_types):
            if self.is_const(ref) or ref.op.member is not None:
                ref = self.apply("broadcast_to", [ref], eq.span, {"shape": t.shape})
            out.append(ref)
        return out

    def comprehension(self, eq: S.Equation, indices: list[str],
                      out_types: list[TensorType]) -> Ref:
        if len(out_types) != 1:
            raise FgcError("an element-wise definition has one result", eq.span)
        target = out_types[0]
        shape = target.shape
        if any(isinstance(d, Ell) for d in shape) or len(shape) != len(indices):
            raise FgcError(f"`{self.mod.name}[{', '.join(indices)}]` indexes "
                           f"{len(indices)} axes but the result is {fmt(target)}", eq.span)
        for axis, (name, size) in enumerate(zip(indices, shape)):
            self.scope.values[name] = self.emit(
                "iota", [], TensorType(dtype="int",
                                       shape=tuple(size if k == axis else ONE
                                                   for k in range(len(shape))),
                                       lo=ONE, hi=size),
                eq.span, {"size": size, "axis": axis, "rank": len(shape)}, name=name)
        for w in eq.where:
            self.where_eq(w)
        value = self.expr(eq.rhs)
        return self.apply("broadcast_to", [value], eq.span, {"shape": shape})


def _family_spelling(name: str, var: str) -> str:
    """`W^A_i` -> `W_i^A`; `W` -> `W_i`: the subscript goes before the superscript."""
    base, _, sup = name.partition("^")
    if sup.endswith("_" + var):
        sup = sup[: -len(var) - 1]
    return f"{base}_{var}" + (f"^{sup}" if sup else "")


def _input_stem(a: S.ArgDecl) -> str:
    if a.family is not None:
        key = member_key(a.name)
        return key[0] if key else a.name
    return a.name


def _free_names_in_types(types) -> list[str]:
    out: list[str] = []

    def visit(node):
        if isinstance(node, S.Name):
            if node.name not in out and node.name not in _CONSTANTS:
                out.append(node.name)
            return
        if isinstance(node, list):
            for x in node:
                visit(x)
            return
        if hasattr(node, "__dict__"):
            for v in vars(node).values():
                if isinstance(v, (S.Expr, list, S.RealType, S.IntType, S.PermType, S.PadType,
                                  S.TupleType)):
                    visit(v)
    for t in types:
        visit(t)
    return out


# ---------------------------------------------------------------- a model box


class ModelElaborator(_Body):
    """Elaborates one model box under one set of hyperparameter values (or symbols)."""

    def __init__(self, top: Elaborator, model: S.Model, hypers: Hypers):
        super().__init__(top, hypers)
        self.model = model
        self.loop_results: list[tuple[str, Poly]] = []
        self.finished_loops: list[tuple[ir.Loop, str]] = []
        self.share_spans: dict[int, list[tuple[str, Span]]] = {}
        self.output_names: set[str] = set()
        self.def_spans: dict[str, Span] = {}
        self.scope.symbols = dict(hypers.values)
        self.scope.real_symbols = {k for k, v in hypers.values.items() if isinstance(v, float)}
        self.scope.real_symbols |= hypers.reals
        self.statics = Statics(self.scope.symbols, top.file, hypers.conditions)

    def run(self) -> ir.Model:
        m = self.model
        inputs = []
        for a in m.inputs:
            self.statement(a, self._input)
            key = member_key(a.name)[0] if a.family is not None and member_key(a.name) else None
            ref = self.scope.families.get(key) if key else self.scope.values.get(a.name)
            if ref is not None and ref is not POISON:
                inputs.append(Value(name=key or a.name, type=ref.type))
        params = []
        for p in m.params:
            try:
                params.append(_ModuleElaborator.declare_param(self, p))  # type: ignore[arg-type]
            except FgcError as e:
                self.top.diagnostics.extend(e.diagnostics)
                if p.family is None and p.name not in self.scope.params:  # its uses: silent
                    self.scope.values.setdefault(p.name, POISON)  # type: ignore[arg-type]
        body: list = []
        outputs: list[Value] = []
        shared_with: list[S.Share] = []
        self.section = "embedding"
        seen_loop = False
        for stmt in m.statements:
            if isinstance(stmt, S.Loop):
                seen_loop = True
                self.section = "layers"
                loop = self.statement_loop(stmt)
                self.section = "output"
                if loop is not None:
                    body.extend(self.block)
                    self.block = []
                    body.append(loop)
            elif isinstance(stmt, S.Output):
                if not seen_loop:
                    self.section = "output"
                self.statement(stmt, lambda s: outputs.append(self.output(s)))
            elif isinstance(stmt, S.Share) and stmt.spec is not None:
                shared_with.append(stmt)
            elif isinstance(stmt, S.Share):
                self.top._error("`share` belongs inside the layers", stmt.span,
                                "put it in the `layers` block whose modules it shares; "
                                "outside them, `share NAME, ... with \"other.fgpt\"` "
                                "shares with another spec")
            else:
                self.statement(stmt, self.equation)
        body.extend(self.block)
        self.block = []
        if not outputs and not self.top.diagnostics:
            self.top._error(f"model `{m.name}` has no output", m.span,
                            "add `output name = ...`")
        _name_instances(body, self.top)
        for item in body:
            if isinstance(item, ir.Loop):
                item.shared = self._expand_shared(item, self.share_spans.get(id(item), []))
        return ir.Model(
            name=m.name, inputs=inputs, params=params, outputs=outputs,
            param_uses={k: sorted(v) for k, v in self.param_uses.items()},
            span=m.span, body=body,
            shared_with=[self._shared_with(st, body, params) for st in shared_with])

    def _shared_with(self, st: S.Share, body: list, params: list[ir.Param]) -> ir.SharedWith:
        """`share W_e, ln with "other.fgpt"`: each name is a model parameter or a module use
        outside the layers (by label, or by module for a module used once there). Whether
        the other spec has them, with the same shapes, is checked against that spec."""
        calls = [e for e in body if not isinstance(e, ir.Loop) and e.op == "call"]
        instances = {e.attrs["instance"] for e in calls}
        in_layers = {e.attrs["instance"] for item in body if isinstance(item, ir.Loop)
                     for e in item.body if e.op == "call"}
        names: list[str] = []
        seen: set[str] = set()
        for name in st.names:
            if name in seen:
                self.top._error(f"`{name}` is named twice", st.span)
                continue
            seen.add(name)
            by_module = sorted({e.attrs["instance"] for e in calls if e.attrs["module"] == name})
            if any(p.name == name for p in params) or name in instances:
                names.append(name)
            elif len(by_module) == 1:
                names.append(by_module[0])
            elif name in in_layers:
                self.top._error(f"`share {name} with ...`: `{name}` is used inside the layers",
                                st.span, "only parameters and module uses outside the layers "
                                "can be shared with another spec")
            elif self.hypers.numeric:
                continue  # a use under a condition on sizes that does not hold here
            else:
                self.top._error(f"`share {name} with ...`: no parameter or module use named "
                                f"`{name}` outside the layers", st.span,
                                _suggest(name, [p.name for p in params] + sorted(instances)))
        return ir.SharedWith(spec=st.spec, names=names, span=st.span, spec_span=st.spec_span)

    def _expand_shared(self, loop: ir.Loop, shared: list[tuple[str, Span]]) -> list[str]:
        """`share X`: X is an instance (a label, `LN_2`) or a module, meaning all its uses."""
        calls = [e for e in loop.body if e.op == "call"]
        instances = {e.attrs["instance"] for e in calls}
        out: list[str] = []
        for name, span in shared:
            if name in instances:
                found = [name]
            else:
                found = sorted({e.attrs["instance"] for e in calls if e.attrs["module"] == name})
            if not found:
                self.top._error(f"`share {name}`: no module use named `{name}` in these layers",
                                span, _suggest(name, sorted(instances)))
            out.extend(f for f in found if f not in out)
        return out

    def _input(self, a: S.ArgDecl) -> None:
        t = self.type_of(a.type, self.statics)
        if a.family is not None:
            key = member_key(a.name)
            if key is None or key[1] != a.family.var:
                raise FgcError("a family input is named with its index", a.span,
                               f"write `{_family_spelling(a.name, a.family.var)}`")
            t = t.model_copy(update={"family": self._family_size(a.family)})
            if key[0] in self.scope.families or key[0] in self.scope.values:
                raise FgcError(f"input `{a.name}` is declared twice", a.span)
            self.scope.families[key[0]] = Ref(Operand(name=key[0], whole_family=True), t)
            return
        if any(isinstance(d, Ell) for d in t.shape):
            raise FgcError("a model input has a known shape; `...` is for module signatures",
                           a.span)
        if a.name in self.scope.values:
            raise FgcError(f"input `{a.name}` is declared twice", a.span)
        self.scope.values[a.name] = Ref(Operand(name=a.name), t)

    def output(self, o: S.Output) -> Value:
        ref = self.expr(o.value)
        if self._folds_in_presets([ref]):
            self._give_up("an output is a constant in a preset")
        if self.is_const(ref):
            raise FgcError("an output must be computed from the inputs", o.span)
        name = o.name or "output"
        if name in self.output_names:
            raise FgcError(f"output `{name}` is declared twice", o.span)
        self.output_names.add(name)
        if name in {v for v in self.scope.values if not v.startswith("%")} and \
                self.scope.values[name].op.name != ref.op.name:
            raise FgcError(f"output `{name}` reuses the name of a value", o.span)
        ref = self.bind(name, ref, o.span)
        state = self.scope.values.get(name[:-1]) if name.endswith("'") else None
        if state is not None and any(v.name == name[:-1] for v in self.model.inputs):
            self._check_state(name, ref.type, state.type, o.span)
        return Value(name=ref.op.name, type=ref.type)

    def _check_state(self, name: str, out: TensorType, inp: TensorType, span: Span) -> None:
        """`output Mem' = ...` is the next call's `Mem`: it must fit that input (sizes that
        are still symbols are compared when they are numbers, per configuration)."""
        fits = out.dtype == inp.dtype and len(out.shape) == len(inp.shape) and all(
            self.hypers.same(a, b) or not (self.hypers.expand(a - b).is_const())
            for a, b in zip(out.shape, inp.shape))
        if not fits:
            raise FgcError(f"output `{name}` is the next `{name[:-1]}`, but it is {fmt(out)} "
                           f"and `{name[:-1]}` is {fmt(inp)}", span,
                           f"a caller feeds `{name}` back as `{name[:-1]}`: give it the "
                           "input's type, or another name")
        for a, b in zip(out.shape, inp.shape):
            self._require("zero", a - b)  # what a preset compares

    def equation(self, eq: S.Equation) -> None:
        for w in eq.where:
            self.where_eq(w)
        if len(eq.lhs) > 1:
            for lhs, ref in zip(eq.lhs, self.several(eq)):
                self._define(lhs, ref, eq)
            return
        lhs = eq.lhs[0]
        if isinstance(lhs, (S.LhsHead, S.LhsIndex)):
            raise FgcError("an element-wise or parameterised definition belongs in a module",
                           lhs.span, "declare a `module` and call it")
        if eq.family is not None:
            if not isinstance(lhs, S.LhsName):
                raise FgcError("a family is named like `x_i`", lhs.span)
            self.family_eq(lhs.name, eq.rhs, eq.family, eq.span)
            return
        self._define(lhs, self.expr(eq.rhs), eq)

    def _define(self, lhs, ref: Ref, eq: S.Equation) -> None:
        if isinstance(lhs, S.LhsLayer):
            name = self._layer_name(lhs.name, lhs.layer, lhs.span, define=True)
        else:
            name = lhs.name
            if name in self.scope.symbols or name in self.scope.params:
                raise FgcError(f"`{name}` is already a "
                               f"{'hyperparameter' if name in self.scope.symbols else 'parameter'}",
                               lhs.span, "choose another name")
        if name in self.scope.values and not name.startswith("%"):
            raise FgcError(f"`{name}` is defined twice", lhs.span)
        self.def_spans[name] = eq.span
        self.bind(name, ref, lhs.span)

    def statement_loop(self, loop: S.Loop) -> ir.Loop | None:
        defined = {lhs.name for st in loop.body if isinstance(st, S.Equation)
                   for lhs in st.lhs if isinstance(lhs, S.LhsLayer)}
        for base in defined:  # if the block fails, what it defines must not fail again
            self.scope.values.setdefault(f"{base}^({_show_expr(loop.hi)})", POISON)
        try:
            lo = self.statics.eval(loop.lo)
            hi = self._dim(loop.hi, self.statics)
        except FgcError as e:
            self.top.diagnostics.extend(e.diagnostics)
            return None
        if not (isinstance(lo, Poly) and lo == ONE):
            self.top._error("layers are numbered from 1", loop.lo.span,
                            f"write `layers {loop.var} in 1..{_show_expr(loop.hi)}`")
            return None
        self._require("a number of layers", hi)
        if self.hypers.numeric and hi.is_const() and hi.const_value() > MAX_LAYERS:
            self.top._error(f"{format_int(hi.const_value())} layers is absurdly many", loop.hi.span,
                            f"at most {MAX_LAYERS:,} layers are accepted")
            return None
        if self.loop is not None:
            self.top._error("layers cannot be nested", loop.span)
            return None
        for base in defined:
            if self.scope.values.get(f"{base}^({_show_expr(loop.hi)})") is POISON:
                del self.scope.values[f"{base}^({_show_expr(loop.hi)})"]
        self.loop = LoopCtx(loop.var, hi, defined)
        outer = self.block
        self.block = []
        shared: list[tuple[str, Span]] = []
        before = dict(self.scope.values)
        try:
            for st in loop.body:
                if isinstance(st, S.Share) and st.spec is not None:
                    self.top._error("`share ... with` shares with another spec and belongs "
                                    "outside the layers", st.span,
                                    "inside `layers`, `share NAME` shares across the layers")
                elif isinstance(st, S.Share):
                    shared.extend((n, st.span) for n in st.names)
                else:
                    self.statement(st, self.equation)
            for c in self.loop.carried.values():
                inner = self.scope.values.get(c.inner)
                result = self.scope.values.get(c.result)
                if result is None or result is POISON or inner is None:
                    continue
                if not _same_shape(self.hypers, inner.type.shape, result.type.shape) \
                        or inner.type.dtype != result.type.dtype:
                    self.top._error(
                        f"`{c.result}` is {fmt(result.type)} but `{c.inner}` is "
                        f"{fmt(inner.type)}: each layer must keep the shape it carries",
                        self.def_spans.get(c.result, loop.span),
                        f"the layers carry `{c.name}` from one layer to the next")
            body = self.block
            carried = list(self.loop.carried.values())
        finally:
            self.block = outer
            self.loop = None
        hi_text = _show_expr(loop.hi)
        results = []
        for name, ref in list(self.scope.values.items()):
            if name in before or ref is POISON:
                if ref is POISON and name.endswith(f"^({loop.var})"):
                    self.scope.values[name[: -len(loop.var) - 2] + f"({hi_text})"] = POISON
                continue
            if name.endswith(f"^({loop.var})"):
                base = name[: -len(f"^({loop.var})")]
                outer = f"{base}^({hi_text})"
                self.scope.values[outer] = Ref(Operand(name=outer), ref.type)
                results.append((name, outer))
        # values local to one layer are not visible after the layers
        for name in list(self.scope.values):
            if name not in before and not name.endswith(f"^({hi_text})"):
                del self.scope.values[name]
        self.loop_results.append((hi_text, hi))
        ir_loop = ir.Loop(var=loop.var, lo=ONE, hi=hi, body=body, carried=carried,
                          shared=[n for n, _ in shared], span=loop.span, results=results)
        self.finished_loops.append((ir_loop, hi_text))
        self.share_spans[id(ir_loop)] = shared
        return ir_loop


def _other_instance(a: Eqn, b: Eqn) -> str | None:
    """How use b of a label differs from its first use a, where it would make another
    instance (other hyperparameters, or another condition on the layers it exists in), or
    None: the same instance used again."""
    def binds(e: Eqn) -> dict:
        return {k: str(v) for k, v in e.attrs.get("bindings", {}).items()}

    def cond(e: Eqn) -> list:
        return [(g.text, g.positive) for g in e.guards]

    at = f"{a.span.line}:{a.span.column}" if a.span is not None else "its first use"
    if binds(a) != binds(b):
        show = ", ".join(f"{k} = {v}" for k, v in sorted(binds(b).items())
                         if binds(a).get(k) != v) or "its defaults"
        return f"with other hyperparameters ({show}) than its use at {at}"
    if cond(a) != cond(b):
        said = " and ".join(("" if p else "not ") + t for t, p in cond(b)) or "no condition"
        return f"under another condition ({said}) than its use at {at}"
    return None


def _name_instances(body: list, top: Elaborator) -> None:
    """Name each module use: its label, else the module's name, numbered when it recurs
    (the seed's θ_LN,1, θ_LN,2, θ_LN,3)."""
    calls = [e for e in _walk(body) if e.op == "call"]
    counts: dict[str, int] = {}
    for e in calls:
        if not e.attrs.get("label"):
            counts[e.attrs["module"]] = counts.get(e.attrs["module"], 0) + 1
    seen: dict[str, int] = {}
    labels: dict[str, str] = {}
    first: dict[str, Eqn] = {}  # a label's first use: its others must agree with it
    written = {e.attrs["label"] for e in calls if e.attrs.get("label")}
    for e in calls:
        mod = e.attrs["module"]
        label = e.attrs.get("label")
        if label:
            if labels.setdefault(label, mod) != mod:
                top._error(f"label `{label}` names uses of two modules, `{labels[label]}` and "
                           f"`{mod}`", e.span, "one label is one instance of one module")
            elif (why := _other_instance(first.setdefault(label, e), e)) is not None:
                top._error(f"label `{label}` names a use of `{mod}` {why}", e.span,
                           "one label is one instance, of one size, in the layers where it "
                           "is used; give this use a label of its own")
            e.attrs["instance"] = label
        elif counts[mod] == 1 and mod not in written:
            e.attrs["instance"] = mod
        else:
            # numbered, and never the same as a label written in the spec
            seen[mod] = seen.get(mod, 0) + 1
            while f"{mod}_{seen[mod]}" in written:
                seen[mod] += 1
            e.attrs["instance"] = f"{mod}_{seen[mod]}"
