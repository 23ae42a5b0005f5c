"""Lowering the checked IR to PyTorch source: one nn.Module per spec module, a layer class,
and the model, rendered through jinja2 templates.

The view-model built here holds every decision (names, layouts, which equations become
lines, which are inlined, which builtin modules lower to fused torch calls); the
template only lays the text out. Values carry a runtime layout: optional leading axes
(the batch, and any family axes of the caller), then a family axis for values that are
indexed families (the heads), then the spec's own dimensions. Indexed families are one
batched tensor, never a Python loop.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from ...elaborate import ir
from ...elaborate.elaborator import guard_tree
from ...elaborate.intrinsics import SCALINGS, intrinsic, is_kind
from ...elaborate.ir import Ell, Eqn, Operand, TensorType, sequence_symbols
from ...elaborate.symbolic import Atom, Poly
from ...errors import FgcError
from ...lowering import prepare
from ...lowering.families import has_params
from ...lowering.layers import invariant
from ...lowering.layout import JOINS, MOVES, READS_HELD, shifted
from ...lowering.masks import PER_USE, MaskKind, from_caller, kind_of_input
from ...lowering.parallel import Plan
from ...lowering.parallel import plan as parallel_plan
from ...lowering.precision import FLOAT32, Precision
from ...lowering.signature import Number, Text, at, by_position, run_lengths, signature_form
from ...names import (
    FUNCTIONAL,
    NAME,
    Namer,
    class_name,
    family_layout,
    ident,
    layers_attr,
    reserved,
    safe_name,
    value_name,
)
from ...passes import padding
from ...passes.incremental import NotIncremental, derive
from ...syntax import nodes as S
from .pyexpr import (
    WIDTH,
    Assert,
    Assign,
    Attr,
    BinOp,
    BoolOp,
    Call,
    Comp,
    Compare,
    Const,
    Def,
    Do,
    Expr,
    For,
    FString,
    If,
    IfExp,
    List,
    Name,
    Ref,
    Return,
    Slice,
    Starred,
    Subscript,
    Tuple,
    Unary,
    all_of,
    call,
    dotted,
    method,
    statement_lines,
)

TEMPLATES = Path(__file__).parent / "templates"


def safe_doc(line: str) -> str:
    """A spec line quoted in a docstring: no control characters, and no backslash or
    quotes that could end or bend the string."""
    line = "".join(ch if ch.isprintable() else " " for ch in line)
    return line.replace("\\", "\\\\").replace('"' * 3, "'" * 3).rstrip()


def doc_lines(line: str, width: int = 88) -> list[str]:
    """A quoted spec line folded at spaces so the docstring stays within the line length;
    continuation lines are indented under the first."""
    out = []
    indent = len(line) - len(line.lstrip())
    while len(line) > width:
        cut = line.rfind(" ", indent + 8, width)
        if cut <= indent:
            break
        out.append(line[:cut].rstrip())
        line = " " * (indent + 4) + line[cut:].lstrip()
    out.append(line)
    return out


class Unsupported(Exception):
    """A construct the torch backend does not lower; carries a user-facing message and the
    span of the innermost equation it was found in."""

    span = None


# ---------------------------------------------------------------- python for sizes


def py_poly(p: Poly, sym: dict) -> Expr:
    """A Python integer expression for a size: `4 * H`, `H // A`, `T + 2`."""
    if p.is_const():
        c = p.const_value()
        return Const(c.numerator if c.denominator == 1 else float(c))
    out: Expr | None = None
    for mono, coef in sorted(p.terms.items(), key=lambda kv: str(kv[0])):
        num = [_power(_py_sym(s, sym), e) for s, e in mono if e > 0]
        den = [_power(_py_sym(s, sym), -e) for s, e in mono if e < 0]
        factors = ([Const(abs(coef.numerator))] if abs(coef.numerator) != 1 or not num
                   else []) + num
        if coef < 0 and out is None:  # `-4 * H`, `-H * W`: the first factor negated
            first = factors[0]
            factors[0] = Const(-first.value) if isinstance(first, Const) else Unary("-", first)
        term = _product(factors)
        den_factor = ([Const(coef.denominator)] if coef.denominator != 1 else []) + den
        if den_factor:
            term = BinOp(term, "//", _product(den_factor))
        out = term if out is None else BinOp(out, "-" if coef < 0 else "+", term)
    return out  # type: ignore[return-value]


def _over_common(p: Poly) -> tuple[Poly, Poly]:
    """p as N / d with N and d polynomials of whole coefficients and no negative powers
    (`G*i/A - G/A` as `G*i - G` over `A`), so a floor is one integer division."""
    den, powers = 1, {}
    for mono, coef in p.terms.items():
        den = math.lcm(den, coef.denominator)
        for s, e in mono:
            if e < 0:
                powers[s] = max(powers.get(s, 0), -e)
    d = Poly.const(den)
    for s, e in powers.items():
        d = d * Poly.sym(s) ** e
    return p * d, d


def _power(x: Expr, e: int) -> Expr:
    return x if e == 1 else BinOp(x, "**", Const(e))


def _product(factors: list[Expr]) -> Expr:
    out = factors[0]
    for f in factors[1:]:
        out = BinOp(out, "*", f)
    return out


def _py_sym(s, sym: dict) -> Expr:
    if isinstance(s, Atom):
        args = [py_poly(a, sym) for a in s.args]
        if s.op in ("div", "mod"):
            return BinOp(args[0], "//" if s.op == "div" else "%", args[1])
        if s.op in ("floor", "ceil"):  # exactly, in integers: N // d, or -(-N // d)
            num, den = _over_common(s.args[0])
            if den.is_const() and den.const_value() == 1:
                return py_poly(num, sym)
            if s.op == "floor":
                return BinOp(py_poly(num, sym), "//", py_poly(den, sym))
            return Unary("-", BinOp(py_poly(-num, sym), "//", py_poly(den, sym)))
        return call(s.op, *args)
    try:
        value = sym[s]
    except KeyError:
        raise Unsupported(f"size `{s}` is not known where it is used") from None
    return value if isinstance(value, Expr) else dotted(value)


def py_const(c, sym: dict) -> Expr:
    """A constant operand: a real number, or a size expression, exact as the ONNX graph
    computes it at its sizes: one that divides is N / d over whole polynomials, the whole
    number N // d where d divides N (`Nb / 2` as a bucket count), else their real ratio
    (`D / D_att`, 0.6 for 6 / 10), never a floored division."""
    if isinstance(c, float):
        if math.isinf(c):
            return Unary("-", dotted("math.inf")) if c < 0 else dotted("math.inf")
        return Const(c)
    num, den = _over_common(c)
    if den == Poly.const(1):  # a whole number whatever the sizes (`4 * H + 1`)
        return py_poly(c, sym)
    n, d = py_poly(num, sym), py_poly(den, sym)
    return IfExp(BinOp(n, "//", d), Compare(BinOp(n, "%", d), "==", Const(0)),
                 BinOp(n, "/", d))


def guard_expr(text: str, sym: dict) -> Expr:
    """A guard (`l is odd`, `not (E != H)`) as a Python condition, each name as `sym`
    spells it (`self.l`, a hyperparameter's field), any other through `ident`: built from
    the tree of its condition, the elaborator's reading of it."""
    return _guard(guard_tree(text), sym)


_FLIP = {"==": "!=", "!=": "=="}


def _guard(e: S.Expr, sym: dict) -> Expr:
    match e:
        case S.Not(operand=S.Parity() as p):  # `l is even`, not `not`
            return _guard(dataclasses.replace(p, even=not p.even), sym)
        case S.Not(operand=S.Compare(op=op) as c) if op in _FLIP:
            return _guard(dataclasses.replace(c, op=_FLIP[op]), sym)
        case S.Name(name=name):
            value = sym.get(name) or ident(name)
            return value if isinstance(value, Expr) else dotted(value)
        case S.Num(value=v):
            return Const(v.numerator if v.denominator == 1 else float(v))
        case S.BoolOp(op=op, left=left, right=right):
            first = _guard(left, sym)
            values = first.values if isinstance(first, BoolOp) and first.op == op else (first,)
            return BoolOp(op, (*values, _guard(right, sym)))
        case S.Not(operand=x):
            return Unary("not", _guard(x, sym))
        case S.Parity(operand=x, even=even):
            return Compare(BinOp(_guard(x, sym), "%", Const(2)), "==", Const(0 if even else 1))
        case S.Compare(op=op, left=left, right=right):
            return Compare(_guard(left, sym), op, _guard(right, sym))
        case S.BinOp(op=op, left=left, right=right) if op in "+-*/%":
            return BinOp(_guard(left, sym), op, _guard(right, sym))
        case S.Neg(operand=x):
            return Unary("-", _guard(x, sym))
    raise FgcError("a layer condition holds sizes, comparisons, `is even`/`is odd` and "
                   "and/or/not only", e.span)


# ---------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Layout:
    """`ir.Layout` (lowering/layout.py) without how integers are held, which a value
    here keeps as `_Val.raw_lo`."""

    lead: bool  # leading axes before the spec's own: the batch, a caller's family axes
    fam: bool  # an own family axis just before the spec's dimensions
    rank: int | None  # rank of the spec's own dimensions; None when `...` is involved

    @staticmethod
    def of(layout: ir.Layout) -> Layout:
        return Layout(layout.lead, layout.fam, layout.rank)


def _reads_held(e: Eqn) -> bool:
    """Whether `e` takes integers as they are held (lowering/layout.py): it reads ids
    0-based, only moves entries, or adds held integers (their offsets add too)."""
    return e.op in READS_HELD or e.op in MOVES or \
        e.op in JOINS + ("select", "cond") and e.outs[0].layout.held is not None or \
        e.op in ("add", "sub") and e.outs[0].type.dtype == "int"


def _rank(t: TensorType) -> int | None:
    return None if any(isinstance(d, Ell) for d in t.shape) else len(t.shape)


def _unsq(expr: Expr, times: int, at: int) -> Expr:
    for _ in range(times):
        expr = method(expr, "unsqueeze", Const(at))
    return expr


# ---------------------------------------------------------------- view-model


@dataclass
class Line:
    """A statement of a method's body, `depth` blocks in (under an `if`, a `for`)."""

    stmt: object  # a statement of pyexpr: Assign, Return, If, ...
    comment: str = ""
    depth: int = 0

    @property
    def code(self) -> str:
        return "    " * self.depth + self.stmt.code  # type: ignore[attr-defined]

    @property
    def text(self) -> str:
        """The line at method-body indentation, wrapped to WIDTH columns."""
        return "\n".join(statement_lines(self.stmt, self.comment, " " * (8 + 4 * self.depth)))


def _paths(lines: list[Line]) -> set[str]:
    """The names the lines read, and the dotted paths (`self.config.H`, `self.config`)."""
    out = set()
    for ln in lines:
        for f in dataclasses.fields(ln.stmt):  # type: ignore[arg-type]
            value = getattr(ln.stmt, f.name)
            for e in value if isinstance(value, tuple) else [value]:
                if isinstance(e, Expr):
                    out.update(p for node in e.walk() if (p := _path(node)))
    return out


def _path(e: Expr) -> str | None:
    """`self.config.H` for the attributes of attributes of a name; None for others."""
    if isinstance(e, Name):
        return e.id
    if isinstance(e, Attr) and (head := _path(e.value)):
        return f"{head}.{e.name}"
    return None


def _values(exprs: list[Expr]) -> Expr:
    """What a line returns: one value, or several as a bare tuple."""
    return exprs[0] if len(exprs) == 1 else Tuple(tuple(exprs), bare=True)


@dataclass
class ParamView:
    attr: str
    shape: tuple[Expr, ...]
    comment: str
    init: str  # "normal" | "zeros" | "ones"

    @property
    def text(self) -> str:
        """The declaration inside `__init__`, its comment above it when the line is long."""
        empty = Call(dotted("torch.empty"), self.shape, trailing_comma=len(self.shape) == 1)
        stmt = Assign((dotted(f"self.{self.attr}"),), call("nn.Parameter", empty))
        return "\n".join(statement_lines(stmt, self.comment, " " * 8))


@dataclass
class SubView:
    attr: str
    ctor: Expr

    @property
    def text(self) -> str:
        """`attr = ctor` inside `__init__`, wrapped at the line width."""
        return "\n".join(statement_lines(Assign((dotted(self.attr),), self.ctor), "", " " * 8))


@dataclass
class ClassView:
    name: str
    doc: list[str]
    init_args: list[str]
    init_lines: list[str]
    params: list[ParamView]
    subs: list[SubView]
    forward_args: list[str]
    body: list[Line]
    kind: str = "module"  # "module" | "layer" | "model"
    extra_methods: list[str] = field(default_factory=list)

    @property
    def init_def(self) -> str:
        return "\n".join(Def("__init__", ("self", *self.init_args)).lines(" " * 4))

    @property
    def forward_def(self) -> str:
        name = getattr(self, "method_name", "forward")
        return "\n".join(Def(name, tuple(self.forward_args)).lines(" " * 4))


def fit(stmt, depth: int = 0) -> list[str]:
    """A statement of a method written out whole (`def ...:`, `return ...`), `depth` blocks
    into it, wrapped to the line width where the template puts it (4 columns further in)."""
    return [x[4:] for x in statement_lines(stmt, "", " " * (4 + 4 * depth))]


def _flat(v) -> str:
    """A JSON-able value as a Python literal on one line (strings double-quoted), with any
    expression in it as its expression."""
    if isinstance(v, Expr):
        return v.text
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_flat(k)}: {_flat(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_flat(x) for x in v) + "]"
    if isinstance(v, str):
        return json.dumps(v)  # its escapes are Python's too
    return repr(v)  # int, True, False, None


def _literal_lines(v, head: str, indent: int) -> list[str]:
    """`head` then the literal `v`, at `indent` columns, in lines of at most WIDTH: as is
    when it fits; a dict or list whose items fit one per line filled after its bracket;
    otherwise one item a line, each laid out the same way."""
    flat = f"{' ' * indent}{head}{_flat(v)}"
    if len(flat) + 1 <= WIDTH or not isinstance(v, (dict, list)) or not v:
        return [flat]
    opening, closing = "{}" if isinstance(v, dict) else "[]"
    items = ([(f"{_flat(k)}: ", x) for k, x in v.items()] if isinstance(v, dict)
             else [("", x) for x in v])
    texts = [k + _flat(x) for k, x in items]
    col = indent + len(head) + 1
    if all(col + len(t) + 2 <= WIDTH for t in texts):
        lines = [f"{' ' * indent}{head}{opening}"]
        for k, t in enumerate(texts):
            piece = t + ("," if k < len(texts) - 1 else closing)
            gap = "" if lines[-1].endswith(opening) and len(lines) == 1 else " "
            if len(lines[-1]) + len(gap) + len(piece) + 1 <= WIDTH:
                lines[-1] += gap + piece
            else:
                lines.append(" " * col + piece)
        return lines
    lines = [f"{' ' * indent}{head}{opening}"]
    for k, x in items:
        inner = _literal_lines(x, k, indent + 4)
        lines += inner[:-1] + [inner[-1] + ","]
    return lines + [" " * indent + closing]


# ---------------------------------------------------------------- one function body


class _Val:
    __slots__ = ("expr", "layout", "type", "raw_lo", "producer", "named", "stored")

    def __init__(self, expr: Expr, layout, type_, raw_lo=None, producer=None, named=False):
        self.expr = expr
        self.layout = layout
        self.type = type_
        self.raw_lo = raw_lo  # ints held 0-based: the math value is expr + raw_lo
        self.producer = producer
        self.named = named
        self.stored: Expr | None = None

    @property
    def py(self) -> str:
        """The Python name of a value of the body (its expression is a `Ref` to it)."""
        return self.expr.name  # type: ignore[attr-defined]


# what a layers' result and a call's second and later results stand for before `emit`
_LAYERS, _IN_TUPLE = Name("__layers__"), Name("__tuple__")


class Body:
    """Lowers a list of equations to Python lines inside one `forward`."""

    def __init__(self, gen: Generator, sym: dict, device: Expr, namer: Namer,
                 self_attr: dict[str, str], spec_file: str):
        self.gen = gen
        self.sym = dict(sym)
        self.device = device
        self.namer = namer
        self.vals: dict[str, _Val] = {}  # IR name -> its value where the equations are now
        # every value by its Python name, unique per value: a spec name may be defined again
        # (a family z_i, then z = Concat(z_1, ..., z_A)), and a `Ref` in exprs is this one
        self.by_py: dict[str, _Val] = {}
        self.self_attr = self_attr  # IR param/instance name -> `self.x`
        self.spec_file = spec_file
        self.pending: list[tuple[str, Eqn]] = []  # (python name, eqn) in order
        self.exprs: dict[str, Expr] = {}  # python name -> its expression, `Ref`s to deps
        self.deps: dict[str, list[str]] = {}
        self.comments: dict[str, str] = {}
        self.materialized: set[str] = set()
        self.real_dtype: Expr = call("torch.get_default_dtype")  # where integers go as reals
        self.start: Expr | None = None  # the model's body: the first new position (step())
        # the model's body in a padded model: where its tokens are, what modules get as
        # `start` (Generator.start_name)
        self.positions: Expr | None = None
        self.fn_name = ""  # the module whose forward this is ("" for the model and layers)
        self.tp: Plan | None = None  # its tensor-parallel plan (lowering/parallel.py)
        self.entered: dict[tuple, str] = {}  # value -> its Python name as split code reads it
        # temporaries the spec names otherwise (a module's result is the module's): the
        # name they take here, before ident; other temporaries are numbered (`%7` -> t7)
        self.spec_names: dict[str, str] = {}

    # -- values
    def define_input(self, name: str, t: TensorType, layout: Layout, raw_lo=None) -> str:
        py = self.namer(name)
        self.vals[name] = self.by_py[py] = _Val(Ref(py), layout, t, raw_lo=raw_lo, named=True)
        return py

    def is_param(self, name: str | None) -> bool:
        """Whether `name` here is one of the module's parameters (not a local value)."""
        return name in self.self_attr and name not in self.vals

    def operand(self, o: Operand, for_eqn: Eqn) -> _Val:
        if o.name is None:
            return _Val(py_const(o.const, self.sym), Layout(False, False, 0),
                        TensorType(dtype="real" if isinstance(o.const, float) else "int"))
        if self.is_param(o.name):
            p = self.gen.param_types[self.self_attr[o.name]]
            expr = dotted(self.self_attr[o.name])
            if self.tp is not None and o.name in self.tp.splits:
                expr = call("local", expr)  # this rank's block under parallelize()
            if self.tp is not None and self.tp.shared:  # read on blocks of positions
                expr = call("tp_shared", expr, SP)
            t = p.type
            fam = t.family is not None
            if o.member is not None and not fam:
                raise Unsupported(f"`{o}`: member of a parameter that is not a family")
            if fam and o.member is not None and not isinstance(o.member, str):
                axis = -2 if len(t.shape) >= 2 else 0
                expr = method(expr, "select", Const(axis), self._member_index(o.member))
                fam = False
            expr = self._slice_dynamic(expr, t)
            raw = None
            if fam and len(t.shape) >= 2:
                raw = expr
                expr = method(expr, "movedim", Const(-2), Const(0))
            v = _Val(expr, Layout(False, fam, len(t.shape)), t.member() if fam else t)
            v.stored = raw  # the family of matrices as stored: (..., A, last)
            return v
        v = self.vals.get(o.name)
        if v is None:
            raise Unsupported(f"value `{o.name}` is not available here")
        if o.member is not None and not isinstance(o.member, str) and v.layout.fam:
            k = self._member_index(o.member)  # a member picked by a number: layout.of_operand
            return _Val(method(self.ref(o.name), "select", Const(-(v.layout.rank or 0) - 1), k),
                        Layout(v.layout.lead, False, v.layout.rank), v.type, raw_lo=v.raw_lo)
        return _Val(self.ref(o.name), v.layout, v.type, raw_lo=v.raw_lo, producer=v.producer,
                    named=v.named)

    def _member_index(self, member) -> Expr:
        if isinstance(member, str):
            raise Unsupported("a family member indexed by a variable outside its family")
        return BinOp(py_poly(member, self.sym), "-", Const(1))

    def _slice_dynamic(self, expr: Expr, t: TensorType) -> Expr:
        """A parameter sized by the context length is used up to the run's length."""
        cuts = []
        dyn = False
        for k, d in enumerate(t.shape):
            if isinstance(d, Poly) and (d.symbols() & self.gen.dynamic):
                end = py_poly(d, self.sym)
                pad = self.gen.padded(d)
                if pad is not None:  # each token's row (a padded batch), or rows from `at`
                    if k != 0 or self.fn_name:
                        raise Unsupported("a padded table of positions along an axis other "
                                          "than its first")
                    return call("rows_at", expr, Name(self.gen.positions_name(pad)), end)
                if self.gen.by_position(d):  # rows start..start+T of a table of positions
                    if self.start is None:
                        raise Unsupported("a parameter indexed by position inside the layers")
                    cuts.append(Slice(self.start, BinOp(self.start, "+", end)))
                else:
                    cuts.append(Slice(None, end))
                dyn = True
            else:
                cuts.append(Slice())
        if not dyn:
            return expr
        while cuts and cuts[-1] == Slice():
            cuts.pop()
        return Subscript(expr, tuple(cuts))

    def ref(self, name: str) -> Expr:
        """The value IR name `name` stands for here, as a `Ref` to it (its expression written
        in if it is used once, else its Python name): see `emit`."""
        return self.vals[name].expr

    # -- lowering
    def lower(self, eqns: list[Eqn]) -> None:
        for e in eqns:
            try:
                self.lower_eqn(e)
            except Unsupported as err:
                err.span = err.span or e.span
                raise

    def lower_eqn(self, e: Eqn) -> None:
        ins = [self.operand(o, e) for o in e.ins]
        if self.tp is not None:
            for k, v in enumerate(ins):
                use = self.tp.uses.get((e.outs[0].name, k))
                seq = self.tp.seq_uses.get((e.outs[0].name, k))
                if use == "enter" or seq is not None and seq[0] == "enter":
                    # a replicated value read by a split computation
                    ins[k] = self._entered(e.ins[k], v, e, seq)
                elif use == "gather":  # a split value read whole
                    v.expr = call("tp_gather", v.expr, _split_axis(v), TP)
                elif seq is not None:  # blocks of positions read whole, or a whole value
                    ins[k] = self._sequence(e.ins[k], v, e, seq)  # read with blocks
        # where each result's axes are and how its integers are held: the lowering's
        # (lowering/layout.py); the layer loop is this backend's own equation
        raw_lo = None if e.op == "layers" else e.outs[0].layout.held
        if e.op == "layers":
            exprs = [_LAYERS] * len(e.outs)
            layouts = [Layout(True, False, _rank(o.type)) for o in e.outs]
        elif e.op == "call":
            exprs = self.gen.lower_call(self, e, ins) * len(e.outs)  # one call, its results
            layouts = [Layout.of(o.layout) for o in e.outs]
        else:
            lowering = LOWER.get(e.op)
            if lowering is None:
                raise Unsupported(f"the torch backend has no lowering for `{e.op}`")
            if not _reads_held(e):
                for v in ins:  # arithmetic sees the spec's values
                    if v.raw_lo is not None:
                        v.expr, v.raw_lo = _math(self, v), None
            layouts = [Layout.of(e.outs[0].layout)]
            moved = shifted(e)
            exprs = [ins[moved[0]].expr if moved else lowering(self, e, ins, layouts[0])]
        if self.tp is not None:
            exprs = [self._tp_made(o, x, lay) for o, x, lay in zip(e.outs, exprs, layouts)]
        for out, expr, layout in zip(e.outs, exprs, layouts):
            if out.name in self.spec_names:
                py = self.namer.alias(out.name, self.spec_names[out.name])
            elif "instance" in e.attrs and out.name.startswith("%") and len(e.outs) == 1:
                # a module's result the spec leaves unnamed: after the use (`mask_ar`)
                py = self.namer.alias(out.name, value_name(e.attrs["instance"]))
            elif out.name in self.vals:  # a name defined again is a value of its own
                py = self.namer.alias(f"{out.name}#{len(self.by_py)}", out.name)
            else:
                py = self.namer(out.name)
            self.vals[out.name] = self.by_py[py] = _Val(
                Ref(py), layout, out.type.member() if out.type.family is not None else out.type,
                raw_lo=raw_lo, producer=e, named=not out.name.startswith("%"))
            self.exprs[py] = expr
            self.deps[py] = list(expr.refs())
            if e.op == "layers":  # the values it takes (model parameters are attributes)
                self.deps[py] = [self.vals[o.name].py for o in e.ins if o.name in self.vals]
            self.comments[py] = self.comment(out.type, layout, e)
            self.pending.append((py, e))
        if len(e.outs) > 1:
            # several results come from one call: one line, tuple target
            names = [self.vals[o.name].py for o in e.outs]
            for py in names:
                self.exprs[py] = _IN_TUPLE
            self.exprs[names[0]] = exprs[0]
            self.tuples = getattr(self, "tuples", {})
            self.tuples[names[0]] = names

    def _entered(self, o: Operand, v: _Val, e: Eqn, seq: tuple | None = None) -> _Val:
        """A replicated value as split computations read it: through tp_enter (backward,
        the ranks' gradients summed), one for all its uses in this body, so that the sum
        is one all-reduce; held as blocks of positions (`seq`), gathered first."""
        args = (SP, Const(seq[1])) if seq is not None else ()
        return self._once(o, v, e, "entered", call("tp_enter", v.expr, TP, *args),
                          "read by split computations: backward, its gradient summed")

    def _sequence(self, o: Operand, v: _Val, e: Eqn, seq: tuple[str, int]) -> _Val:
        """A value held as blocks of positions read whole (tp_whole), a whole value read
        with such blocks (tp_scatter), or one read at every position of them (tp_shared)."""
        how, axis = seq
        expr = call(f"tp_{how}", v.expr, SP, *((Const(axis),) if how != "shared" else ()))
        return self._once(o, v, e, how, expr, {
            "whole": "gathered from the ranks' blocks of positions",
            "scatter": "this rank's block of positions",
            "shared": "read at every position: backward, its gradient summed"}[how])

    def _once(self, o: Operand, v: _Val, e: Eqn, how: str, expr: Expr, comment: str) -> _Val:
        """Operand `o` (as `v`) read through `expr`, named once for all its reads in this
        body: `x_entered`, `x_whole`, ..."""
        key = (how, o.name, str(o.member))
        if key not in self.entered:
            py = self.namer.alias(f"{o.name}#{o.member}#{how}", f"{o.name}_{how}")
            self.by_py[py] = _Val(Ref(py), v.layout, v.type, raw_lo=v.raw_lo)
            self.exprs[py] = expr
            self.deps[py] = list(expr.refs())
            self.comments[py] = comment
            self.pending.append((py, e))
            self.entered[key] = py
        out = _Val(Ref(self.entered[key]), v.layout, v.type, raw_lo=v.raw_lo,
                   producer=v.producer, named=v.named)
        out.stored = v.stored
        return out

    def _tp_made(self, out: ir.Value, expr: Expr, layout: Layout) -> Expr:
        """A value as the tensor-parallel plan has it made: this rank's block of a family
        it takes from a whole value (`members`), summed over the ranks (partial; with
        sequence parallelism reduce-scattered), or gathered from them (split, read whole
        after); what the layers carry cut to the rank's block of positions, and what the
        model returns gathered whole."""
        plan = self.tp
        assert plan is not None
        if out.name in plan.blocks:
            expr = call("tp_block", expr, Const(-(layout.rank or 0) - 1), TP)
        how, at = plan.seq_made.get(out.name, (None, 0))
        if out.name in plan.reduce:  # summed; with blocks of positions, reduce-scattered
            expr = call("tp_reduce", expr, TP, *((SP, Const(at)) if how == "reduce" else ()))
        if out.name in plan.gather:
            axis = Const(-(layout.rank or 0) - 1) if layout.fam else Const(-1)
            expr = call("tp_gather", expr, axis, TP)
        if how in ("scatter", "whole"):  # what the layers carry; what the model returns
            expr = call(f"tp_{how}", expr, SP, Const(at))
        return expr

    def comment(self, t: TensorType, layout: Layout, e: Eqn) -> str:
        names = self.gen.comment_sym
        if self.gen.in_module and len(self.gen.run_length) > 1:
            names = _Names()  # which length a module's own n is depends on the use
        dims = []
        if layout.lead:
            dims.append("*" if self.gen.in_module else "B")
        if layout.fam:
            fam = t.family if t.family is not None else (e.family[1] if e.family else None)
            dims.append(py_poly(fam, names).text if fam is not None else "A")
        for d in (t.member().shape if t.family is not None else t.shape):
            dims.append("..." if isinstance(d, Ell) else py_poly(d, names).text.replace(" ", ""))
        shape = "(" + ", ".join(dims) + ")" if dims else "()"
        where = f"{safe_name(e.span.file)}:{e.span.line}" if e.span else ""
        if e.op == "mask" and not e.ins:  # no tensor: attention reads what it means
            meaning = "Mask^ST's width: attention runs a band of the keys" \
                if "window" in e.attrs else "Mask^AR: attention runs is_causal" \
                if e.attrs["causal"] else "Mask^BD: attention runs without a mask"
            return f"{meaning}  {where}".strip()
        return f"{shape}  {where}".strip()

    # -- emission
    def emit(self, outputs: list[str], force: set[str] = frozenset()) -> list[Line]:
        """Lines for the values needed by `outputs` (IR names); single-use temporaries are
        inlined into their one consumer."""
        want = [self.vals[o].py for o in outputs if o in self.vals]
        forced = {self.vals[f].py for f in force if f in self.vals}
        live: set[str] = set()
        stack = want + list(forced)
        while stack:
            py = stack.pop()
            if py in live or py not in self.exprs:
                continue
            live.add(py)
            stack.extend(self.deps.get(py, []))
            for group in getattr(self, "tuples", {}).values():
                if py in group:
                    stack.extend(group)
        uses: dict[str, int] = {}
        for py in live:
            for d in self.deps.get(py, []):
                uses[d] = uses.get(d, 0) + 1
        for py in want:
            uses[py] = uses.get(py, 0) + 1
        tuples = getattr(self, "tuples", {})
        in_tuple = {n for g in tuples.values() for n in g}
        in_tuple |= {py for py, x in self.exprs.items() if x is _LAYERS}
        materialize = set()
        for py in live:
            if py in in_tuple or uses.get(py, 0) != 1 or self.by_py[py].named or py in forced:
                materialize.add(py)
        for e2 in (e for _, e in self.pending if e.op == "layers"):
            for o in e2.ins:  # what the layers take is computed once, before them
                if o.name in self.vals and self.vals[o.name].py in live:
                    materialize.add(self.vals[o.name].py)
        self.materialized = materialize
        lines: list[Line] = []
        done: set[str] = set()
        for py, e in self.pending:
            if py not in live or py not in materialize or py in done:
                continue
            if self.exprs[py] is _IN_TUPLE:
                continue
            if self.exprs[py] is _LAYERS:
                lines.extend(self.gen.loop_lines(self, e, materialize))
                done.update(self.vals[o.name].py for o in e.outs)
                continue
            targets = tuples.get(py, [py])
            lines.append(Line(Assign(tuple(Name(t) for t in targets),
                                     self._inline(py, materialize)), self.comments[py]))
            done.update(targets)
        return lines

    def _inline(self, py: str, materialize: set[str]) -> Expr:
        """The expression of `py` with the single-use temporaries it reads written in (the
        brackets each needs come with the rendering)."""
        expr = self.exprs[py]
        return expr.subs({name: self._inline(name, materialize) for name in set(expr.refs())
                          if name not in materialize and name in self.exprs})

    def result(self, name: str) -> Expr:
        """The expression for an output after `emit`: its line's name, or inlined."""
        v = self.vals[name]
        if v.py in self.materialized or v.py not in self.exprs:
            return v.expr
        return self._inline(v.py, self.materialized)


# ---------------------------------------------------------------- the op table


def _align(b: Body, v: _Val, out: Layout) -> Expr:
    """Insert unit axes so `v` broadcasts against the output layout (see module doc)."""
    expr = v.expr
    if out.rank is None or v.layout.rank is None:
        return expr
    if not (v.layout.lead or v.layout.fam):
        return expr  # only its own dimensions: right-aligned broadcasting is enough
    r = v.layout.rank
    if out.fam and not v.layout.fam:
        expr = _unsq(expr, 1, -r - 1)
    if r < out.rank:
        expr = _unsq(expr, out.rank - r, -r - 1)
    return expr


COMPARISONS = {"==", "!=", "<", "<=", ">", ">="}


def infix(x: Expr, symbol: str, y: Expr) -> Expr:
    """`x symbol y`: a comparison or a binary operation."""
    return Compare(x, symbol, y) if symbol in COMPARISONS else BinOp(x, symbol, y)


def _binary(symbol: str):
    def lower(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
        x, y = (_align(b, v, out) for v in ins)
        return infix(x, symbol, y)
    return lower


def _math(b: Body, v: _Val) -> Expr:
    """An integer operand as its 1-based (math) value."""
    if v.raw_lo is not None and not (v.raw_lo.is_const() and v.raw_lo.const_value() == 0):
        return BinOp(v.expr, "+", py_poly(v.raw_lo, b.sym))
    return v.expr


def _is_int(expr: Expr) -> bool:
    return isinstance(expr, Const) and type(expr.value) is int


def _shifted(b: Body, expr: Expr, shift: Poly) -> Expr:
    """`expr + shift` for an integer expression, folded where `expr` is a literal."""
    if shift.is_const():
        k = shift.const_value()
        if k == 0:
            return expr
        if _is_int(expr):
            return Const(expr.value + int(k))  # type: ignore[attr-defined]
        if k < 0:
            return BinOp(expr, "-", py_poly(-shift, b.sym))
    return BinOp(expr, "+", py_poly(shift, b.sym))


def _rows(b: Body, v: _Val, first: Poly) -> Expr:
    """Integer ids as 0-based positions in a table whose first entry is id `first`: an
    index (first = 1), a row of W in a lookup (OneHot(x) @ W over first..last)."""
    if v.raw_lo is not None:
        return _shifted(b, v.expr, v.raw_lo - first)
    return _shifted(b, v.expr, -first)


def _spec_value(b: Body, v: _Val, expr: Expr) -> Expr:
    """A result as the spec's value: integers held 0-based get their offset back where
    they leave the function (a return, a layer's argument)."""
    if v.raw_lo is None:
        return expr
    return _shifted(b, expr, v.raw_lo)


def _int_binary(symbol: str):
    def lower(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
        x, y = (_align(b, _Val(_math(b, v), v.layout, v.type), out) for v in ins)
        return infix(x, symbol, y)
    return lower


def _sizes_only(v: _Val) -> bool:
    """Whether an operand is a Python number: a scalar computed from sizes alone."""
    return v.layout == Layout(False, False, 0) and not any(v.expr.refs())


def _func(fn: str):
    def lower(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
        (x,) = ins
        return call(f"math.{fn}" if _sizes_only(x) else f"torch.{fn}", x.expr)
    return lower


def _to_int(fn: str):
    """floor, ceil: whole numbers from reals, as integer tensors (int64, as ids are)."""
    def lower(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
        (x,) = ins
        if _sizes_only(x):
            return call(f"math.{fn}", x.expr)
        return method(call(f"torch.{fn}", x.expr), "long")
    return lower


def _minmax(fn: str, clamp: str):
    def lower(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
        x, y = ins
        if x.layout.rank == 0 and not x.layout.lead and not any(x.expr.refs()):
            return method(y.expr, "clamp", **{clamp: x.expr})
        if y.layout.rank == 0 and not y.layout.lead and not any(y.expr.refs()):
            return method(x.expr, "clamp", **{clamp: y.expr})
        return call(f"torch.{fn}", _align(b, x, out), _align(b, y, out))
    return lower


def _reduce(name: str):
    def lower(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
        x = ins[0].expr
        if ins[0].type.dtype != "real":  # a sum, mean or max of integers is real
            x = method(x, "to", b.real_dtype)
        return method(x, name, Const(-1), keepdim=Const(True))
    return lower


def _matmul(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    x, y = ins
    if x.type.dtype != "real" and y.type.dtype == "real":
        x = _Val(method(x.expr, "to", Attr(y.expr, "dtype")), x.layout, x.type,
                 producer=x.producer)
    elif y.type.dtype != "real" and x.type.dtype == "real":
        y = _Val(method(y.expr, "to", Attr(x.expr, "dtype")), y.layout, y.type,
                 producer=y.producer)
    if y.stored is not None and not x.layout.fam and y.layout.rank == 2 and x.layout.rank:
        # X @ W_i for every member i at once: one product with the (H, A*D) view, then the
        # family axis moved in front of the member's rows
        fam = e.family[1] if e.family else y.type.family
        size = py_poly(fam, b.sym) if fam is not None else Const(-1)
        last: Expr = Const(-1)
        if b.tp is not None and fam is not None and str(fam) in b.tp.families:
            # this rank's members: as many as its block of the weights holds
            size, last = Const(-1), py_poly(y.type.shape[-1], b.sym)
        prod = method(call("project", x.expr, method(y.stored, "flatten", Const(-2))),
                      "unflatten", Const(-1), Tuple((size, last)))
        r = x.layout.rank
        return prod if r == 1 else method(prod, "movedim", Const(-2), Const(-r - 1))
    xs = _align(b, x, out) if x.layout.rank and x.layout.rank >= 2 else x.expr
    weight = _weight(b, e, y)
    if weight is not None and x.layout.rank != 0:
        # activations times a weight matrix (or its transpose): see project in the template
        return call("project", xs, weight)
    ys = _align(b, y, out) if y.layout.rank and y.layout.rank >= 2 else y.expr
    if y.layout.rank == 1 and (y.layout.lead or y.layout.fam):
        # a vector with leading (batch or member) axes: torch would read it as a matrix
        if x.layout.rank == 1:
            return method(BinOp(xs, "*", ys), "sum", Const(-1))
        column = method(ys, "unsqueeze", Const(-1))
        return method(BinOp(xs, "@", column), "squeeze", Const(-1))
    return BinOp(xs, "@", ys)


TP = dotted("self.tp")  # a module's ranks under parallelize() (None: not split)
TP_INIT = "self.tp = None  # parallelize(): the ranks its split parameters are spread over"
SP = dotted("self.sp")  # the ranks its values' positions are split over (sequence parallel)
SP_INIT = "self.sp = None  # parallelize(): the ranks its positions are split over"


def _split_axis(v: _Val) -> Expr:
    """The axis a split value is split along: its family axis, or the last."""
    return Const(-(v.layout.rank or 0) - 1) if v.layout.fam else Const(-1)


def _weight(b: Body, e: Eqn, y: _Val) -> Expr | None:
    """The expression of a matmul's right operand when it is a parameter matrix, or the
    transpose of one (a tied output projection), shared by the whole batch; else None."""
    if y.layout != Layout(False, False, 2):
        return None
    if b.is_param(e.ins[1].name):
        return y.expr
    tp = y.producer
    if tp is not None and tp.op == "transpose" and b.is_param(tp.ins[0].name):
        w = b.operand(tp.ins[0], e)
        if w.layout == Layout(False, False, 2):
            return Attr(w.expr, "mT")
    return None


def _lookup(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    """OneHot(ids) @ W as rows of W (lowering/lookups.py): no V-wide one-hot is built;
    the table's first row is id `lo`."""
    ids, table = ins
    if b.tp is not None and e.outs[0].name in b.tp.lookups:  # the vocabulary split
        how, at = b.tp.seq_made.get(e.outs[0].name, (None, 0))
        return call("tp_lookup", _rows(b, ids, e.attrs["lo"]), table.expr, TP,
                    *((SP, Const(at)) if how == "reduce" else ()))
    return call("embedding", _rows(b, ids, e.attrs["lo"]), table.expr)


def _transpose(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    if not ins[0].layout.lead and not ins[0].layout.fam and ins[0].layout.rank == 2:
        return Attr(ins[0].expr, "T")
    return Attr(ins[0].expr, "mT")


def _flatten_family(x: Expr, r: int | None) -> Expr:
    """The family axis flattened into the last (of `...`-shaped members: the one before)."""
    moved = method(x, "movedim", Const(-2 if r is None else -r - 1), Const(-2))
    return method(moved, "flatten", Const(-2))


def _concat(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    counts = e.attrs.get("counts") or [None] * len(ins)
    if len(ins) == 1 and counts[0] is not None:
        return _flatten_family(ins[0].expr, ins[0].layout.rank)
    if any(c is not None for c in counts):
        raise Unsupported("concat of a family together with other values")
    return call("torch.cat", List(tuple(_joined(b, ins, out))), dim=Const(-1))


def _vconcat(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    r = out.rank or 1
    return call("torch.cat", List(tuple(_joined(b, ins, out))), dim=Const(-r))


def _lead_shape(x: Expr, r: int) -> Expr:
    """`x.shape[:-r]`: the leading axes of a value of rank r of its own."""
    return Subscript(Attr(x, "shape"), (Slice(None, Const(-r)),))


def _joined(b: Body, ins: list[_Val], out: Layout) -> list[Expr]:
    """The operands of torch.cat, which does not broadcast: one without the batch (a
    parameter) or without the family axis is expanded to the others' leading axes."""
    parts = [_align(b, v, out) for v in ins]
    r = out.rank
    short = [k for k, v in enumerate(ins) if (out.lead and not v.layout.lead)
             or (out.fam and not v.layout.fam)]
    if not short or not r:
        return parts
    full = [k for k, v in enumerate(ins) if k not in short]
    if full:
        lead = _lead_shape(parts[full[0]], r)
    else:  # each lacks some leading axis: their union
        lead = call("torch.broadcast_shapes", *(_lead_shape(p, r) for p, v in zip(parts, ins)
                                                if v.layout.lead or v.layout.fam))
    for k in short:
        parts[k] = method(parts[k], "expand", Starred(lead), *[Const(-1)] * r)
    return parts


def _zero_based(b: Body, v: _Val) -> Expr:
    return _rows(b, v, Poly.const(1))


def _index(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    base, rest = ins[0], ins[1:]
    kinds = e.attrs["kinds"]
    items: list[Expr] = []
    k = 0
    tensors = []
    for kind in kinds:
        if kind == ":":
            items.append(Slice())
        elif kind == "range" and e.attrs.get("last"):  # the last position (lowering/last.py)
            k += 2
            items.append(Slice(Const(-1)))
        elif kind == "range":
            lo, hi = rest[k], rest[k + 1]
            k += 2
            pad = b.gen.padded(e.outs[0].type.shape[len(items)])
            if pad is not None and not b.fn_name and not base.layout.lead and not items and \
                    all(x == ":" for x in kinds[1:]):
                # rows lo.. of a table read at the tokens' positions (RoBERTa's W_p[3..n+2])
                return call("rows_at", Subscript(base.expr, (Slice(_zero_based(b, lo)),)),
                            Name(b.gen.positions_name(pad)),
                            py_poly(e.outs[0].type.shape[0], b.sym))
            items.append(Slice(_zero_based(b, lo), _math(b, hi)))
        else:
            idx = rest[k]
            k += 1
            zb = _zero_based(b, idx)
            if kind == "gather" or idx.layout.lead:
                tensors.append(idx)
            items.append(zb)
    if any(kind == "gather" for kind in kinds):
        if any(kind != "gather" for kind in kinds):
            raise Unsupported("an index by a tensor mixed with `:` or a single position")
        # every axis indexed by a tensor: the leading axes of the base and of the indices
        # broadcast at run time
        return call("take", base.expr, Const(len(kinds)), Const(out.rank), *items)
    if tensors:
        if b.gen.in_module:
            raise Unsupported("a batched single-position index inside a module")
        # one position per sequence (BERT's j_masked): index each batch row
        nb = max(len(v.type.shape) for v in tensors)
        batch: Expr = call("torch.arange", Subscript(Attr(base.expr, "shape"), (Const(0),)),
                           device=Attr(base.expr, "device"))
        if nb:
            batch = method(batch, "view", Const(-1), *[Const(1)] * nb)
        return Subscript(base.expr, (batch, *items))
    prefix = [Name("...")] if (base.layout.lead or base.layout.fam or b.gen.in_module) else []
    return Subscript(base.expr, (*prefix, *items))


def _iota(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    size = py_poly(e.attrs["size"], b.sym)
    rank, axis = e.attrs["rank"], e.attrs["axis"]
    view = [Const(-1 if k == axis else 1) for k in range(rank)]
    numbers = call("torch.arange", size, device=b.device)  # positions are held 0-based
    return method(numbers, "view", *view)


def _broadcast_to(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    x = ins[0]
    shape = [py_poly(d, b.sym) for d in e.attrs["shape"]]
    if _sizes_only(x):
        return call("torch.full", Tuple(tuple(shape)), x.expr, device=b.device)
    if x.layout.lead or x.layout.fam:
        r = x.layout.rank or 0
        return method(x.expr, "expand", Starred(_lead_shape(x.expr, r)), *shape) if r \
            else x.expr
    return call("torch.broadcast_to", x.expr, Tuple(tuple(shape)))


def _select(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    return call("torch.where", *(_align(b, v, out) for v in ins))


def _cond(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    # a guard is static: sizes in it are the configuration's, never this call's lengths
    sym = b.sym if b.gen.in_module else {**b.sym, **b.gen.fwd_sym}
    return IfExp(ins[0].expr, guard_expr(e.attrs["guard"], sym), ins[1].expr)


def _neg(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    return Unary("-", ins[0].expr)


def _not(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    # a condition on sizes alone is a Python bool, whose ~ is an integer (~True == -2)
    return Unary("not" if ins[0].layout == Layout(False, False, 0) else "~", ins[0].expr)


def _pow(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    x, y = ins
    if _sizes_only(x):
        return call("torch.pow", x.expr, y.expr)
    return call("torch.pow", _align(b, x, out), _align(b, y, out))


# Positions are computed 0-based and held so (raw_lo = 1): an index or a row lookup uses
# them as they are, arithmetic and returns add the 1 back.
def _invperm(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    return call("torch.argsort", _zero_based(b, ins[0]), dim=Const(-1))


def _argmax(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    return method(ins[0].expr, "argmax", Const(-1))


def _argsort(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    return call("torch.argsort", ins[0].expr, dim=Const(-1), stable=Const(True))


def _members(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    """An axis of the operand's own as the family axis, just before the others (with
    `keep`, a unit axis left in its place)."""
    x, r = ins[0].expr, ins[0].layout.rank
    if r is None:
        raise Unsupported("a family made of an axis of a `...`-shaped value")
    k = e.attrs["axis"]
    moved = x if k == 0 else method(x, "movedim", Const(k - r), Const(-r))
    return method(moved, "unsqueeze", Const(k - r)) if e.attrs.get("keep") else moved


def _sum_members(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    """sum(y_1, ..., y_E): the family axis summed away."""
    r = ins[0].layout.rank
    return method(ins[0].expr, "sum", Const(-2 if r is None else -r - 1))


def _keeptopk(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    return call("keeptopk", ins[0].expr, py_poly(e.attrs["k"], b.sym))


def _gather_members(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    """Member i of the result is member index(i) of the operand: index_select along the
    family axis with the 0-based members each reads, one per i in 1..size."""
    x, r = ins[0].expr, ins[0].layout.rank
    if r is None:
        raise Unsupported("a member chosen by an expression, of a family of `...` values")
    return method(x, "index_select", Const(-r - 1), _picks(b, e, e.attrs["index"]))


def _picks(b: Body, e: Eqn, index: Poly) -> Expr:
    """The 0-based members `index` reads, one per i of e's family, as a tensor."""
    var, size = e.family
    i = Name(ident(var))
    picks = Comp(py_poly(index - 1, {**b.sym, var: i}),
                 ((i, call("range", Const(1), BinOp(py_poly(size, b.sym), "+", Const(1)))),))
    tensor = call("torch.tensor", picks, device=b.device)
    if b.tp is not None and str(size) in b.tp.families:
        # this rank's members, each reading in the rank's block of a split family
        src = e.ins[0] if e.op == "gather_members" else next(o for o in e.ins if o.whole_family)
        made = b.vals[src.name].producer if src.name in b.vals else None
        fam = made.family[1] if made is not None and made.family else None
        count = py_poly(fam, b.sym) if fam is not None and b.tp.picks.get(e.outs[0].name) \
            else Const(None)
        return call("tp_picks", tensor, count, TP)
    return tensor


def _mask(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    """A mask by meaning (lowering/masks.py): at run time only its bias or its window's
    width, if it has one; attention reads what it means from the lowering, not from the
    value."""
    if "window" in e.attrs:
        return py_poly(e.attrs["window"], b.sym)
    return ins[0].expr if ins else Const(None)


def _mask_tensor(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    rows_d, cols_d = e.outs[0].type.shape[-2:]
    rows, cols = py_poly(rows_d, b.sym), py_poly(cols_d, b.sym)
    if b.gen.by_position(cols_d) and b.start is not None:
        cols = BinOp(b.start, "+", cols)  # step(): the new rows of the table, every column
    if e.attrs.get("banded"):
        return call("window_mask", rows, cols, ins[0].expr, b.device)
    if e.attrs["causal"]:
        table = call("causal_mask", rows, cols, b.device)
    else:
        table = call("torch.zeros", rows, cols, device=b.device)
    return BinOp(ins[0].expr, "+", table) if e.attrs["bias"] else table


def _stopgrad(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> Expr:
    return method(ins[0].expr, "detach")


LOWER = {
    "add": _binary("+"), "sub": _binary("-"), "mul": _binary("*"), "div": _binary("/"),
    "neg": _neg, "max": _minmax("maximum", "min"), "min": _minmax("minimum", "max"),
    "pow": _pow, "mod": _int_binary("%"),
    "exp": _func("exp"), "log": _func("log"), "sqrt": _func("sqrt"), "tanh": _func("tanh"),
    "sigmoid": _func("sigmoid"), "erf": _func("erf"), "sin": _func("sin"), "cos": _func("cos"),
    "abs": _func("abs"), "floor": _to_int("floor"), "ceil": _to_int("ceil"),
    "eq": _int_binary("=="), "ne": _int_binary("!="), "lt": _int_binary("<"),
    "le": _int_binary("<="), "gt": _int_binary(">"), "ge": _int_binary(">="),
    "and": _binary("&"), "or": _binary("|"), "not": _not, "select": _select, "cond": _cond,
    "sum": _reduce("sum"), "mean": _reduce("mean"), "amax": _reduce("amax"),
    "matmul": _matmul, "transpose": _transpose, "concat": _concat, "vconcat": _vconcat,
    "index": _index, "iota": _iota, "broadcast_to": _broadcast_to, "invperm": _invperm,
    "argmax": _argmax, "argsort": _argsort, "stopgrad": _stopgrad, "members": _members,
    "sum_members": _sum_members, "keeptopk": _keeptopk,
    "lookup": _lookup,
    "mask": _mask, "mask_tensor": _mask_tensor, "gather_members": _gather_members,
}


# ---------------------------------------------------------------- builtin modules


def _no_value(fn: ir.Function, name: str) -> bool:
    """Whether input `name` of `fn` is a mask taken by meaning alone (lowering/masks.py),
    which has no value at run time: neither forward nor its calls pass it."""
    kind = kind_of_input(fn, name)
    return kind is not None and not kind.valued


def _width(fn: ir.Function, name: str) -> bool:
    """Whether input `name` of `fn` takes a window by meaning: its value is the width."""
    kind = kind_of_input(fn, name)
    return kind is not None and kind.window


def _sdpa(b: Body, fn: ir.Function, inputs: list[str]) -> list[Line]:
    """Scaled dot-product attention, with the mask the lowering decided the calls pass:
    causal runs as is_causal=True, none as no mask, a bias (plus causal) as attn_mask; a
    mask causal at some uses and none at others reads the flag each use was built with."""
    q, k, v, mask = (Name(x) for x in inputs)
    kind = kind_of_input(fn, intrinsic(fn).mask_input)
    lines = _cached_keys(k, v) if b.gen.incremental is not None else []
    if fn.name in b.gen.grouped:  # the keys and values of each query head, after the cache
        groups = Name("groups")
        pick = [Line(Assign((x,), method(x, "index_select", Const(-3), groups)), depth=1)
                for x in (k, v)]
        lines += [Line(If(Compare(groups, "is not", Const(None))),
                       "grouped-query attention: each query head's keys")] + pick

    scale = intrinsic(fn).scale  # None: sdpa's default, 1/sqrt(d)
    cap = intrinsic(fn).softcap  # the hyperparameter that caps the scores, or None

    def sdpa(comment: str = "", depth: int = 0, **kw: Expr) -> Line:
        if scale is not None:
            kw["scale"] = Const(scale)
        if cap is not None:  # sdpa takes no cap: the same arguments, written out
            return Line(Return(_capped_sdpa(q, k, v, dotted(f"self.{cap}"), **kw)),
                        "scores soft-capped before the mask" if not comment or "sdpa" in
                        comment else comment, depth)
        return Line(Return(call("sdpa", q, k, v, **kw)), comment, depth)
    if b.gen.padding is not None:
        lines += _padded_sdpa(b, fn, kind, q, k, mask, sdpa)
    if kind is None:
        return lines + [sdpa("scale 1/sqrt(d) is sdpa's default" if scale is None else
                             f"scores scaled by {scale:g}", attn_mask=mask)]
    if kind.causal is False:
        return lines + [sdpa("no mask")]
    length = [Subscript(Attr(x, "shape"), (Const(-2),)) for x in (q, k)]
    if kind.window:  # the mask's value is the window's width
        band = method(call("window_mask", *length, mask, Attr(q, "device")), "to",
                      Attr(q, "dtype"))
        return lines + [Line(Assign((mask,), band), "Mask^ST: a band of the keys, aligned "
                             "to their end"), sdpa(attn_mask=mask)]
    table = method(call("causal_mask", *length, Attr(q, "device")), "to", Attr(q, "dtype"))
    if kind.bias:
        return lines + [Line(Assign((mask,), BinOp(mask, "+", table)), "the bias plus Mask^AR"),
                        sdpa(attn_mask=mask)]
    causal = [sdpa("Mask^AR", is_causal=Const(True))]
    if b.gen.incremental is not None:
        causal = [
            Line(If(Compare(length[0], "==", length[1]))),
            sdpa("Mask^AR", 1, is_causal=Const(True)),
            Line(If(Compare(length[0], "==", Const(1))), "the newest position sees every key"),
            sdpa(depth=1),
            Line(Assign((mask,), table), "Mask^AR aligned to the keys' end"),
            sdpa(attn_mask=mask)]
    if kind.causal is None:  # PER_USE
        flag = b.gen.mask_flags(fn)[intrinsic(fn).mask_input]
        return lines + [Line(If(dotted(f"self.{flag}")), "this use is given Mask^AR")] + \
            [dataclasses.replace(x, depth=x.depth + 1) for x in causal] + \
            [sdpa("this use is given Mask^BD: no mask")]
    return lines + causal


def _capped_sdpa(q: Expr, k: Expr, v: Expr, cap: Expr, attn_mask: Expr | None = None,
                 is_causal: Expr | None = None, scale: Expr | None = None) -> Expr:
    """What sdpa(q, k, v, attn_mask, is_causal, scale) computes, with the scaled scores s
    soft-capped to cap * tanh(s / cap) before the mask is added (Attention^capped)."""
    factor = scale if scale is not None else \
        BinOp(Subscript(Attr(q, "shape"), (Const(-1),)), "**", Const(-0.5))
    scores = BinOp(BinOp(q, "@", Attr(k, "mT")), "*", factor)
    scores = BinOp(cap, "*", call("torch.tanh", BinOp(scores, "/", cap)))
    if is_causal is not None:  # sdpa's is_causal (as many keys as queries): Mask^AR's table
        rows, cols = (Subscript(Attr(x, "shape"), (Const(-2),)) for x in (q, k))
        attn_mask = method(call("causal_mask", rows, cols, Attr(q, "device")), "to",
                           Attr(q, "dtype"))
    if attn_mask is not None:
        scores = BinOp(scores, "+", attn_mask)
    # the softmax in float32 whatever the model's dtype, as transformers' eager attention
    weights = call("torch.softmax", scores, dim=Const(-1), dtype=dotted("torch.float32"))
    return BinOp(method(weights, "to", Attr(v, "dtype")), "@", v)


def _padded_sdpa(b: Body, fn: ir.Function, kind: MaskKind | None, q: Expr, k: Expr,
                 mask: Expr, sdpa) -> list[Line]:
    """A padded batch (passes/padding.py): the mask as a tensor plus the keys' padding."""
    pad = dotted("self.pad")
    length = [Subscript(Attr(x, "shape"), (Const(-2),)) for x in (q, k)]
    table = method(call("causal_mask", *length, Attr(q, "device")), "to", Attr(q, "dtype"))
    if kind is None or kind.causal is False and kind.bias:
        full: Expr = mask
    elif kind.causal is False:
        full = Const(None)
    elif kind.window:
        full = method(call("window_mask", *length, mask, Attr(q, "device")), "to",
                      Attr(q, "dtype"))
    elif kind.bias:
        full = BinOp(mask, "+", table)
    elif kind.causal is None:  # PER_USE
        flag = b.gen.mask_flags(fn)[intrinsic(fn).mask_input]
        full = IfExp(table, dotted(f"self.{flag}"), Const(None))
    else:
        full = table
    return [Line(If(Compare(pad, "is not", Const(None))),
                 "a padded batch: no query sees a key at padding"),
            dataclasses.replace(sdpa(attn_mask=call("with_padding", full, pad, q)), depth=1)]


def _cached_keys(k: Expr, v: Expr) -> list[Line]:
    """step(): the keys and values of the earlier positions go first."""
    cache = dotted("self.cache")

    def extended(x: Expr, at: int) -> Line:
        earlier = Subscript(cache, (Const(at),))
        return Line(Assign((x,), call("torch.cat", List((earlier, x)), dim=Const(-2))), depth=2)
    return [Line(If(Compare(cache, "is not", Const(None))),
                 "step(): the earlier positions' keys first"),
            Line(If(cache), depth=1), extended(k, 0), extended(v, 1),
            Line(Assign((cache,), Tuple((k, v))), depth=1)]


def _own(b: Body, attr: str) -> Expr:
    """A parameter of a fused module, as its forward reads it."""
    if b.tp is not None and b.tp.shared:  # read on blocks of positions: gradient summed
        return call("tp_shared", dotted(attr), SP)
    return dotted(attr)


def _layer_norm(b: Body, fn: ir.Function, inputs: list[str]) -> list[Line]:
    gamma, beta = _own(b, "self.gamma"), _own(b, "self.beta")
    return [Line(Return(call("layer_norm", Name(inputs[0]), Attr(dotted("self.gamma"), "shape"),
                             gamma, beta, dotted("self.eps"))))]


def _rms_norm(b: Body, fn: ir.Function, inputs: list[str]) -> list[Line]:
    gamma = _own(b, "self.gamma")
    offset = intrinsic(fn).offset
    scale = BinOp(Const(offset), "+", gamma) if offset else gamma
    comment = f"the scale is {offset:g} + gamma" if offset else ""
    return [Line(Return(call("rms_norm", Name(inputs[0]), Attr(dotted("self.gamma"), "shape"),
                             scale, dotted("self.eps"))), comment)]


def _softmax(b: Body, fn: ir.Function, inputs: list[str]) -> list[Line]:
    return [Line(Return(call("torch.softmax", Name(inputs[0]), dim=Const(-1))))]


def _gelu(b: Body, fn: ir.Function, inputs: list[str]) -> list[Line]:
    approximate = Const(intrinsic(fn).approximate)
    return [Line(Return(call("gelu", Name(inputs[0]), approximate=approximate)))]


def _silu(b: Body, fn: ir.Function, inputs: list[str]) -> list[Line]:
    return [Line(Return(call("silu", Name(inputs[0]))))]


def _rotary(b: Body, fn: ir.Function, inputs: list[str]) -> list[Line]:
    """RoPE and its variants by the runtime's `rotary` (lowering/rotary.py), its tables made
    once per length, device and dtype; in step() the positions go on from `start`."""
    i = intrinsic(fn)
    kw: dict[str, Expr] = {}
    if i.rotated is not None:
        kw["width"] = dotted(f"self.{ident(i.rotated)}")
    if i.interleaved:
        kw["interleaved"] = Const(True)
    if SCALINGS[i.scaling]:
        kw["scaling"] = Tuple((Const(i.scaling), *(dotted(f"self.{ident(h)}")
                                                   for h in SCALINGS[i.scaling])))
    start = b.start if b.start is not None else Const(0)
    return [Line(Return(call("rotary", Name(inputs[0]), start, dotted("self.theta"), **kw)))]


def _moe(b: Body, fn: ir.Function, inputs: list[str]) -> list[Line]:
    i = intrinsic(fn)
    params = [dotted(f"self.{ident(p)}") for p in i.params]
    kw = {}
    if b.tp is not None:  # the experts split across the ranks: each computes its own
        params = [call("local", x) if p in b.tp.splits else x for p, x in zip(i.params, params)]
        kw["tp"] = TP
    return [Line(Return(call("moe", Name(inputs[0]), *params, dotted(f"self.{ident(i.chosen)}"),
                             **kw)), "only each position's K chosen experts are computed")]


# Intrinsics (compiler/elaborate/intrinsics.py) whose forward is one fused torch call, by
# kind; None: the module's own equations. Their equations stay the docstring.
FUSED = {
    "attention": _sdpa, "layer_norm": _layer_norm, "softmax": _softmax, "gelu": _gelu,
    "rms_norm": _rms_norm, "silu": _silu, "moe": _moe, "rotary": _rotary,
    "onehot": None,  # times a table, the lowered `lookup` (lowering/lookups.py)
    "concat": None,  # the family axis flattened into the last (see Generator.lower_call)
    # a mask is its equations where it is a tensor; where attention reads it by meaning,
    # the lowering has made it a `mask` operation (lowering/masks.py)
    "mask": None,
}


def fused_forward(fn: ir.Function):
    """The fused forward of an intrinsic module, or None to lower its equations."""
    i = intrinsic(fn)
    if i is None:
        return None
    return FUSED[i.kind]


# ---------------------------------------------------------------- the generator


def check_distinct(pairs: list[tuple[str, str]], where: str) -> None:
    """Two spec names must not become one Python attribute (`W_m` and `W^m` both read
    W_m): that would silently merge two parameters."""
    seen: dict[str, str] = {}
    for spec_name, attr in pairs:
        if attr in seen and seen[attr] != spec_name:
            raise Unsupported(f"{seen[attr]} and {spec_name} in {where} would both be "
                              f"`{attr}` in PyTorch; rename one of them")
        seen[attr] = spec_name


class _Names(dict):
    """Symbol names for comments: a symbol stands for itself unless mapped (n -> T)."""

    def __missing__(self, key: str) -> str:
        return key



class Generator:
    def __init__(self, spec, cfg, values: dict, sources, preset: str | None,
                 precision: Precision = FLOAT32):
        self.spec = spec
        self.precision = precision  # build()'s dtype (--dtype: lowering/precision.py)
        self.cfg = cfg  # the symbolic configuration: IR with sizes as symbols
        # the IR with the shared lowering's operations (compiler/lowering)
        self.model, self.functions = prepare(cfg.model, cfg.functions)
        # which parameters parallelize() splits, and where the ranks' values meet
        self.tp_plans = {name: p for name, p in parallel_plan(self.model,
                                                              self.functions).items()
                         if p.active or p.shared or p.positions}
        self.values = values  # hyperparameter -> number (the compiled preset)
        self.sources = sources
        self.preset = preset
        self.param_types: dict[str, ir.Param] = {}
        self.in_module = False
        self.takes_start: set[str] = set()  # modules whose forward takes `start`
        self.dynamic: set[str] = set()
        self.hyper_names = Namer()
        self.consts: dict[str, str] = {}  # hyperparameter -> its field of Config
        for h in self.model.hypers:
            self.consts[h.name] = self.hyper_names(h.name)
        # the hyperparameters as the model and its layers read them: from the `config`
        # their __init__ takes, from `self.config` in forward (no module-level constants,
        # so models of several sizes live side by side)
        self.init_sym = {h: f"config.{c}" for h, c in self.consts.items()}
        self.fwd_sym = {h: f"self.config.{c}" for h, c in self.consts.items()}
        self.comment_sym = _Names({h.name: h.name for h in self.model.hypers})
        self.model_class = class_name(self.model.name)
        while self.model_class in set(self.consts.values()):
            self.model_class += "_"
        # only lengths vary from call to call; a width shared by a real input stays fixed
        self.dynamic = sequence_symbols(self.model, self.functions)
        self.run_length = run_lengths(self.model, self.functions)  # as the ONNX graph's
        for s, name in self.run_length.items():
            self.comment_sym[s] = name
        self.classes: list[ClassView] = []
        self._flags: dict[str, dict[str, str]] = {}  # mask_flags, per module
        self.class_of: dict[str, str] = {}
        try:  # the key/value cache form, for a model whose attention is causal
            self.incremental = derive(cfg.model, cfg.functions)  # on the elaborated IR
        except NotIncremental:
            self.incremental = None
        # where a padded batch masks keys and reads positions at the tokens' ranks; None
        # where no Pad input is fgc's to apply (a spec that reads its own applies it)
        self.padding = padding.derive(cfg.model, cfg.functions)
        if self.padding is not None and all(p.explicit for p in self.padding.inputs):
            self.explicit = {p.input for p in self.padding.inputs}
            self.padding = None
        else:
            self.explicit = {p.input for p in self.padding.inputs if p.explicit} \
                if self.padding is not None else set()
        # attention modules some use gives grouped keys and values (lowering/families.py)
        bodies = [fn.eqns for fn in self.functions.values()] + [
            item.body if isinstance(item, ir.Loop) else [item] for item in self.model.body]
        self.grouped = {e.attrs["module"] for body in bodies for e in body
                        if e.op == "call" and e.attrs.get("groups") is not None}

    # -- helpers for lowering
    def by_position(self, d) -> bool:
        """Whether a size is the generated length of an incremental model: a table or a
        parameter along it is read from the first new position on."""
        return by_position(d, self.incremental.length if self.incremental else None)

    def padded(self, d) -> str | None:
        """The Pad input of the positions a size runs along, if any: a table along them
        is read at each token's position (`at`, see `positions_name`)."""
        p = self.padding.of(d) if self.padding is not None else None
        return p.input if p is not None and d == Poly.sym(p.length) else None

    def positions_name(self, pad: str) -> str:
        """The variable holding where the tokens of a Pad input's positions are: the first
        new position (an int) without a mask, each token's rank (B, T) with one."""
        p = next(x for x in self.padding.inputs if x.input == pad)
        T = self.run_length[p.length]
        return "at" if len(self.padding.inputs) == 1 and T == "T" else f"at_{T}"

    def is_kind(self, e: Eqn, kind: str) -> bool:
        """Whether `e` calls an intrinsic of this kind."""
        return e.op == "call" and is_kind(self.functions.get(e.attrs["module"]), kind)

    # -- module classes
    def module_class(self, name: str) -> str:
        if name in self.class_of:
            return self.class_of[name]
        fn = self.functions[name]
        cls = class_name(name)
        taken = set(self.class_of.values()) | {self.model_class} | set(self.consts.values()) \
            | self._init_args()
        layer = re.compile(re.escape(self.model_class) + r"Layer\d*_*")  # the layers' classes
        if layer.fullmatch(cls):  # a suffix `_` would still read as a layers' class
            cls += "Module"
        while cls in taken:
            cls += "_"
        self.class_of[name] = cls
        for e in fn.eqns:
            if e.op == "call":
                self.module_class(e.attrs["module"])
        self.classes.append(self._module_view(fn, cls))
        return cls

    def _init_args(self) -> set[str]:
        """Every name an `__init__` may take, beside which a class is called there: any size
        a module's hyperparameters, parameters or inputs name, and the modules a layer
        shares."""
        if not hasattr(self, "_init_arg_names"):
            sizes = set()
            for f in self.functions.values():
                sizes.update(h.name for h in f.hypers)
                for t in [p.type for p in f.params] + [v.type for v in f.inputs]:
                    for d in [*t.shape, t.lo, t.hi, t.family]:
                        if isinstance(d, Poly):
                            sizes.update(str(x) for x in d.symbols())
            sizes.update(s for item in self.model.body if isinstance(item, ir.Loop)
                         for s in item.shared)
            self._init_arg_names = {ident(s) for s in sizes}
        return self._init_arg_names

    def bound_sizes(self, fn: ir.Function) -> list[str]:
        """The sizes a use of a module binds that its forward cannot read off its inputs'
        shapes: its hyperparameters, then the rest of its signature (an integer input's
        range a..b)."""
        names = [h.name for h in fn.hypers]
        known = set(self._symbol_sources(fn, Namer()))
        for v in fn.inputs:
            for d in list(v.type.shape) + [v.type.lo, v.type.hi, v.type.family]:
                if isinstance(d, Poly):
                    for s in sorted(d.symbols() - known):
                        if s not in names:
                            names.append(s)
        return names

    def dynamic_hypers(self) -> dict[str, set[str]]:
        """Per module, the sizes some use binds to a run-time size (the sequence length,
        OneHot of a Perm[n] n wide): they are forward arguments, not construction
        arguments."""
        if getattr(self, "_dyn", None) is not None:
            return self._dyn
        dyn: dict[str, set[str]] = {name: set() for name in self.functions}
        changed = True
        while changed:
            changed = False
            callers = [(None, [e for item in self.model.body for e in
                               (item.body if isinstance(item, ir.Loop) else [item])])]
            callers += [(fn, fn.eqns) for fn in self.functions.values()]
            for fn, eqns in callers:
                if fn is None:
                    live = set(self.dynamic)
                else:
                    live = set(self._symbol_sources(fn, Namer())) | dyn[fn.name]
                for e in eqns:
                    if e.op != "call":
                        continue
                    callee = self.functions[e.attrs["module"]]
                    for name in self.bound_sizes(callee):
                        b = e.attrs["bindings"].get(name)
                        if isinstance(b, Poly) and b.symbols() & live and \
                                name not in dyn[callee.name]:
                            dyn[callee.name].add(name)
                            changed = True
        self._dyn = dyn
        return dyn

    def forward_hypers(self, fn: ir.Function) -> list[str]:
        if not fn.inputs:
            return [h.name for h in fn.hypers]
        return [s for s in self.bound_sizes(fn) if s in self.dynamic_hypers()[fn.name]]

    def static_symbols(self, fn: ir.Function) -> list[str]:
        """Sizes a module is constructed with: those its parameters need, and those its
        forward cannot read off its inputs' shapes (integer ranges, hyperparameters)."""
        params = {s for p in fn.params for d in list(p.type.shape) +
                  ([p.type.family] if p.type.family is not None else []) for s in d.symbols()}
        if not fn.inputs:
            return sorted(params)
        known = set(self._symbol_sources(fn, Namer()))
        signature: set[str] = {h.name for h in fn.hypers}
        for v in fn.inputs:
            for d in list(v.type.shape) + [v.type.lo, v.type.hi, v.type.family]:
                if isinstance(d, Poly):
                    signature |= d.symbols()
        return sorted(params | (signature - known - set(self.forward_hypers(fn))))

    def _symbol_sources(self, fn: ir.Function, namer: Namer) -> dict[str, Expr]:
        """Each size symbol of a module, read off its inputs' shapes where possible."""
        sym: dict[str, Expr] = {}

        def axis(name: str, k: int) -> Expr:
            return Subscript(Attr(Name(namer(name)), "shape"), (Const(k),))
        for v in fn.inputs:
            t = v.type
            member = t.member() if t.family is not None else t
            if any(isinstance(d, Ell) for d in member.shape):
                dims = [d for d in member.shape if not isinstance(d, Ell)]
                offset = len(dims)
                for k, d in enumerate(dims):
                    if isinstance(d, Poly) and len(d.symbols()) == 1 and d == Poly.sym(
                            next(iter(d.symbols()))):
                        sym.setdefault(next(iter(d.symbols())), axis(v.name, k - offset))
                continue
            r = len(member.shape)
            for k, d in enumerate(member.shape):
                if isinstance(d, Poly) and len(d.terms) == 1 and d == Poly.sym(
                        next(iter(d.symbols()))) if d.symbols() else False:
                    sym.setdefault(next(iter(d.symbols())), axis(v.name, k - r))
            if t.family is not None and isinstance(t.family, Poly) and t.family.symbols():
                s = next(iter(t.family.symbols()))
                sym.setdefault(s, axis(v.name, -r - 1))
        return sym

    def _module_view(self, fn: ir.Function, cls: str) -> ClassView:
        namer = Namer()
        sym = self._symbol_sources(fn, namer)
        plan = self.tp_plans.get(fn.name)
        for v in fn.inputs if plan is not None else []:  # blocks of positions: N of them
            a = plan.sequence.get(v.name)
            d = v.type.shape[a] if a is not None and -a <= len(v.type.shape) else None
            if isinstance(d, Poly) and len(d.symbols()) == 1 and \
                    sym.get(s := next(iter(d.symbols()))) is not None and \
                    sym[s].text == Subscript(Attr(Name(namer(v.name)), "shape"),
                                             (Const(a),)).text:
                sym[s] = call("tp_length", sym[s], SP)
        static = self.static_symbols(fn)
        for s in static:
            sym.setdefault(s, f"self.{ident(s)}")
        forward_kw = self.forward_hypers(fn)
        for s in forward_kw:
            sym.setdefault(s, ident(s))
        params = []
        self_attr: dict[str, str] = {}
        for p in fn.params:
            attr = ident(p.name)
            self_attr[p.name] = f"self.{attr}"
            self.param_types[f"self.{attr}"] = p
            params.append(self._param_view(p, attr, {s: ident(s) for s in static}))
        check_distinct([(f"parameter {p.name}", ident(p.name)) for p in fn.params]
                       + [(f"module use {e.attrs['instance']}", ident(e.attrs["instance"]))
                          for e in fn.eqns if e.op == "call"]
                       + [(f"size {x}", ident(x)) for x in static], f"module `{fn.name}`")
        device = Attr(Name(namer(fn.inputs[0].name)), "device") if fn.inputs else Name("device")
        self.in_module = True
        body = Body(self, sym, device, namer, self_attr, fn.span.file if fn.span else "")
        body.fn_name = fn.name
        body.tp = self.tp_plans.get(fn.name)
        if self.incremental is not None or self.padding is not None:
            body.start = Name("start")  # tables of positions inside: from `start` on
        body.spec_names = {**self._use_names(self.cfg.functions[fn.name].eqns
                                             if fn.name in self.cfg.functions else []),
                           **self._result_names(fn)}
        inputs = []  # every input's name; forward takes those with a value at run time
        for v in fn.inputs:
            t = v.type
            lay = Layout(True, t.family is not None, _rank(t.member() if t.family is not None
                                                          else t))
            inputs.append(body.define_input(v.name, t, lay))
        passed = [name for name, v in zip(inputs, fn.inputs) if not _no_value(fn, v.name)]
        subs = []
        flags = self.mask_flags(fn)
        for e in fn.eqns:
            if e.op == "call":
                inst = e.attrs["instance"]
                attr = ident(inst)
                if f"self.{attr}" not in [s.attr for s in subs]:
                    subs.append(SubView(f"self.{attr}", self._ctor(
                        e, {s: f"self.{ident(s)}" for s in static}, flags)))
        doc = self._docstring(fn)
        lines: list[Line]
        if fused_forward(fn) is not None:
            lines = fused_forward(fn)(body, fn, inputs)
            subs = []
        else:
            body.lower(fn.eqns)
            outs = [o.name for o in fn.outputs]
            lines = body.emit(outs)
            results: list[Expr] = []
            for o, declared in zip(outs, fn.outputs):
                r = _spec_value(body, body.vals[o], body.result(o)) if o in body.vals \
                    else Const(None)
                if not fn.inputs and declared.type.dtype == "real":
                    # a table computed from sizes alone, in the caller's precision
                    if not isinstance(r, (Ref, Name)):
                        table = body.namer.alias(f"%table{len(results)}", "table")
                        lines.append(Line(Assign((Name(table),), r)))
                        r = Name(table)
                    r = method(r, "to", dtype=Name("dtype"))
                elif o in body.vals and declared.type.dtype == "real" and \
                        body.vals[o].type.dtype != "real":
                    r = method(r, "to", call("torch.get_default_dtype"))
                results.append(r)
            lines.append(Line(Return(_values(results))))
        self.in_module = False
        kw_part = []
        takes_start = body.start is not None and "start" in _paths(lines)
        if takes_start:
            self.takes_start.add(fn.name)
        extra_kw = (["start=0"] if takes_start else []) + \
            (["groups=None"] if fn.name in self.grouped else [])
        if forward_kw or extra_kw:
            kw_part = ["*", *(ident(s) for s in forward_kw)] + extra_kw
            if forward_kw and not fn.inputs:
                kw_part += ["device=None"] + ([] if fused_forward(fn) is not None
                                              else ["dtype=None"])
        fwd = ["self"] + passed + kw_part
        init_lines = [f"self.{ident(s)} = {ident(s)}" for s in static]
        init_lines += [f"self.{flag} = {flag}  # this use is given Mask^AR (else Mask^BD)"
                       for flag in flags.values()]
        if is_kind(fn, "attention") and self.incremental is not None:
            init_lines.append("self.cache = None  # step(): keys and values, (B, A, P, D) each")
        if is_kind(fn, "attention") and self.padding is not None:
            init_lines.append("self.pad = None  # a padded batch: its keys' padding, (B, P + T)")
        if "self.tp" in _paths(lines):
            init_lines.append(TP_INIT)
        if "self.sp" in _paths(lines):
            init_lines.append(SP_INIT)
        return ClassView(cls, doc, [ident(s) for s in static] + list(flags.values()),
                         init_lines, params, subs, fwd, lines)

    @staticmethod
    def _use_names(body: list) -> dict[str, str]:
        """Each unnamed result of a module's use, named after the use (`mask_ar` for
        Mask^AR), read off the IR before the lowering, which may replace a call by what it
        stands for."""
        eqns = [e for item in body for e in (item.body if isinstance(item, ir.Loop) else [item])]
        return {e.outs[0].name: value_name(e.attrs["instance"]) for e in eqns
                if e.op == "call" and len(e.outs) == 1 and e.outs[0].name.startswith("%")}

    @staticmethod
    def _result_names(fn: ir.Function) -> dict[str, str]:
        """A module's unnamed results, and what a result broadcasts (a comprehension's
        value), named after the module: `diag(x)[i, j] = ...` is `diag`."""
        producers = {v.name: e for e in fn.eqns for v in e.outs}
        names = {}
        for o in fn.outputs:
            if not o.name.startswith("%"):
                continue
            names[o.name] = value_name(fn.name)
            e = producers.get(o.name)
            if e is not None and e.op == "broadcast_to" and e.ins[0].name is not None and \
                    e.ins[0].name.startswith("%"):
                names[e.ins[0].name] = value_name(fn.name)
        return names

    def _param_view(self, p: ir.Param, attr: str, sym: dict[str, str]) -> ParamView:
        dims = list(p.type.shape)
        if p.type.family is not None:
            dims = family_layout(dims, p.type.family, p.members_first)
        shape = tuple(py_poly(d, sym) for d in dims)
        plain = _Names()
        what = f"{p.declared}: R[{', '.join(py_poly(d, plain).text for d in p.type.shape)}]"
        if p.type.family is not None:
            what += f" for each of {py_poly(p.type.family, plain).text}"
        return ParamView(attr, shape, what, p.init)

    def _ctor(self, e: Eqn, caller_sym: dict,
              caller_flags: dict[str, str] | None = None) -> Call:
        fn = self.functions[e.attrs["module"]]
        cls = self.module_class(fn.name)
        args: dict[str, Expr] = {}
        for s in self.static_symbols(fn):
            value = e.attrs["bindings"].get(s)
            if value is None:
                raise Unsupported(f"`{fn.name}`: size `{s}` is not bound at this use")
            args[ident(s)] = Const(value) if isinstance(value, float) \
                else py_poly(value, caller_sym)
        for inp, flag in self.mask_flags(fn).items():
            given = e.attrs["masks"][inp]
            own = from_caller(given)  # the caller's own flag, or this use's kind
            args[flag] = dotted(f"self.{(caller_flags or {})[own]}") if own is not None \
                else Const(MaskKind.of(given).causal)
        return call(cls, **args)

    def mask_flags(self, fn: ir.Function) -> dict[str, str]:
        """Constructor flags of a module given Mask^AR at some uses and Mask^BD at others
        (lowering/masks.py: PER_USE): input -> the flag saying which this use is."""
        if fn.name in self._flags:
            return self._flags[fn.name]
        per_use = [v.name for v in fn.inputs if kind_of_input(fn, v.name) == PER_USE]
        # besides the sizes, `self.` holds the module's parameters and submodules
        taken = {ident(s) for s in self.static_symbols(fn)} | {ident(p.name) for p in fn.params} \
            | {ident(e.attrs["instance"]) for e in fn.eqns if e.op == "call"}
        flags = self._flags[fn.name] = {}
        for name in per_use:
            flag = "causal" if len(per_use) == 1 else f"{ident(name)}_causal"
            while flag in taken:
                flag += "_"
            taken.add(flag)
            flags[name] = flag
        return flags

    def _docstring(self, fn: ir.Function) -> list[str]:
        out = []
        if fn.span is not None:
            first, last = fn.span.line, fn.span.end_line or fn.span.line
            for k in range(first, last + 1):
                text = self.sources.line(fn.span.file, k)
                if text is not None:
                    out.extend(doc_lines(safe_doc(text)))
        return out

    def lower_call(self, b: Body, e: Eqn, ins: list[_Val]) -> list[Expr]:
        fn = self.functions[e.attrs["module"]]
        if is_kind(fn, "concat") and ins and ins[0].layout.rank is not None:
            return [_flatten_family(ins[0].expr, ins[0].layout.rank)]
        inst = e.attrs["instance"]
        target = dotted(b.self_attr.get(inst) or f"self.{ident(inst)}")
        args = [v.expr if _width(fn, inp.name)  # a window's width: a number, as it is
                else self._argument(b, e, v, inp.type.dtype == "real")
                for v, inp in zip(ins, fn.inputs)
                if not _no_value(fn, inp.name)]  # a mask by meaning alone: nothing to pass
        kw: dict[str, Expr] = {}
        rows = self._table_axis(b, e, fn)
        for name in self.forward_hypers(fn):
            value = e.attrs["bindings"][name]
            if isinstance(value, float):
                kw[ident(name)] = Const(value)
            elif rows is not None and (name in self._along(b, e) if b.fn_name
                                       else self.by_position(value)):
                kw[ident(name)] = BinOp(b.start, "+", py_poly(value, b.sym))  # type: ignore
            else:
                kw[ident(name)] = py_poly(value, b.sym)
        if self.forward_hypers(fn) and not fn.inputs:
            kw["device"] = b.device
            if fused_forward(fn) is None:
                kw["dtype"] = b.real_dtype
        if e.family is not None and has_params(fn, self.functions):
            raise Unsupported(f"`{fn.name}` has parameters but is used once per family member")
        if e.attrs.get("groups") is not None:  # grouped-query attention: keys, values whole
            kw["groups"] = _picks(b, e, e.attrs["groups"])
        if fn.name in self.takes_start and self._along(b, e):
            if (b.fn_name, e.attrs["instance"]) in self.incremental.mixed:
                raise Unsupported(f"`{fn.name}` makes a table of positions and is used along "
                                  "the generated positions at one use and not at another")
            # its tables of positions, from the first new one (or at the tokens' positions)
            kw["start"] = b.positions or b.start
        result = call(target, *args, **kw)
        pad = self._padded_table(b, e, fn)
        if pad is not None:  # a table of positions read at the tokens' positions
            return [call("rows_at", result, Name(self.positions_name(pad)),
                         py_poly(e.outs[0].type.shape[0], b.sym))]
        if rows is None:
            return [result]
        return [Subscript(result, (*[Slice()] * rows, Slice(b.start)))]

    def _padded_table(self, b: Body, e: Eqn, fn: ir.Function) -> str | None:
        """For a table computed from sizes (positions: a sinusoid) whose rows run along
        padded positions, at the model's level, the Pad input: it is read at the tokens'
        positions (rows_at)."""
        if fn.inputs or b.fn_name or self.padding is None:
            return None
        p = self.padding.table(e.outs[0].type.shape)
        return p.input if p is not None else None

    def _argument(self, b: Body, e: Eqn, v: _Val, real: bool) -> Expr:
        """A value passed to a module: integers cross as the spec's values; a per-batch
        value into a per-member call gets a unit axis where the members' axis is, so the
        batch does not broadcast against the members."""
        expr = v.expr
        if v.raw_lo is not None:
            expr = _shifted(b, v.expr, v.raw_lo)
        if e.family is not None and v.layout.lead and not v.layout.fam and \
                v.layout.rank is not None:
            expr = _unsq(expr, 1, -v.layout.rank - 1)
        if real and v.type.dtype != "real" and any(expr.refs()):
            expr = method(expr, "to", b.real_dtype)  # an integer where the module takes reals
        return expr

    def _table_axis(self, b: Body, e: Eqn, fn: ir.Function) -> int | None:
        """For a table computed from sizes along the generated length (positions, a banded
        mask) in an incremental model, the axis of its rows: it is made for start + T
        positions and read from row start. None for anything else (attention aligns a mask
        it reads by meaning to the keys itself)."""
        if fn.inputs or self.incremental is None:
            return None
        if b.fn_name:  # in a module: the table's own sizes along the positions at this use
            along = self._along(b, e)
            axis = next((k for k, d in enumerate(fn.outputs[0].type.shape)
                         if isinstance(d, Poly) and d.symbols() & along), None)
        else:
            axis = next((k for k, d in enumerate(e.outs[0].type.shape)
                         if self.by_position(d)), None)
        if axis is not None and b.start is None:
            raise Unsupported(f"`{fn.name}` along the positions inside the layers")
        return axis


    def _along(self, b: Body, e: Eqn) -> frozenset[str]:
        """The callee's sizes that run along the generated (or padded) positions at this
        module use, as the incremental (and padding) analysis found them."""
        key = (b.fn_name, e.attrs["instance"])
        out = frozenset()
        if self.incremental is not None:
            out |= self.incremental.along.get(key, frozenset())
        if self.padding is not None:
            out |= self.padding.along.get(key, frozenset())
        return out

    def start_name(self) -> str:
        """What the model passes its layers and modules as `start`, where they read
        positions: `start`, the first new position, or in a padded model the tokens'
        positions (`at`: `start` without a mask, their ranks with one)."""
        if self.padding is None:
            return "start"
        inc = self.incremental.length if self.incremental is not None else None
        pads = [p for p in self.padding.inputs if (inc is None or p.length == inc) and
                not p.explicit]
        if len(pads) != 1:
            return "start"
        return self.positions_name(pads[0].input)

    # -- the layers
    def loop_lines(self, b: Body, e: Eqn, materialize: set[str]) -> list[Line]:
        info = self.loops[e.attrs["index"]]
        inputs = {v.name for v in self.model.inputs}
        args: list[Expr] = []
        for k, o in enumerate(e.ins):
            if o.name not in b.vals:  # a model parameter the layers use as it is
                args.append(b.operand(o, e).expr)
                continue
            v = b.vals[o.name]
            expr = b._inline(v.py, materialize) if v.py in b.exprs and \
                v.py not in materialize else v.expr
            if k < len(info["carried"]) or o.name not in inputs:
                expr = _spec_value(b, v, expr)  # only the model's inputs go in 0-based
            args.append(expr)
        nc = len(info["carried"])
        py = {o.name: Name(b.vals[o.name].py) for o in e.outs}
        outs = [py[o.name] for o in e.outs[:nc]]
        lines = [Line(Assign((out,), init)) for out, init in zip(outs, args[:nc])
                 if out.text != init.text]
        # what each layer returns besides the carried values, by the name it gets here
        returned = {inner: Name(b.namer(inner)) for inner in info["extra"]}
        returned.update((i, py[o]) for i, o in info["last"])
        inputs_of = {c.inner: out for c, out in zip(info["carried"], outs)}
        results_of = {c.result: out for c, out in zip(info["carried"], outs)}
        for _, outer in info["each"]:
            lines.append(Line(Assign((py[outer],), List(())), "each layer's value, stacked below"))
        layer = Name("layer")
        call_args = [*outs, *args[nc:]]
        layer_call = call(layer, *call_args, **{t: Name(self.start_name() if t == "start" else t)
                                                for t in info["lengths"]})
        targets = (*outs, *(returned[i] for i in info["extra"]))
        lines.append(Line(For(layer, dotted(f"self.{info['attr']}")),
                          f"{self.layer_count(info)} layers"))
        for inner, outer in info["each"]:
            if inner in inputs_of:  # X^(0..L-1): what each layer starts from
                lines.append(Line(Do(method(py[outer], "append", inputs_of[inner])), depth=1))
        lines.append(Line(Assign(targets, layer_call), depth=1))
        for inner, outer in info["each"]:
            if inner not in inputs_of:
                value = results_of.get(inner) or returned[inner]
                lines.append(Line(Do(method(py[outer], "append", value)), depth=1))
        for _, outer in info["each"]:
            stacked = call("torch.stack", py[outer], dim=Const(1))
            lines.append(Line(Assign((py[outer],), stacked)))
        return lines

    def layer_count(self, info) -> str:
        return py_poly(info["loop"].hi, self.comment_sym).text

    # -- the model
    def generate(self) -> str:
        model = self.model
        msym = dict(self.fwd_sym)
        msym.update(self.run_length)
        self.loops: list[dict] = []
        model_cls = self.model_class
        namer = Namer({"T", "B", "layer"} | set(self.run_length.values()))
        self_attr: dict[str, str] = {}
        params = []
        for p in model.params:
            attr = ident(p.name)
            self_attr[p.name] = f"self.{attr}"
            self.param_types[f"self.{attr}"] = p
            params.append(self._param_view(p, attr, self.init_sym))
        calls = [e for item in model.body for e in
                 (item.body if isinstance(item, ir.Loop) else [item]) if e.op == "call"]
        check_distinct([(f"parameter {p.name}", ident(p.name)) for p in model.params]
                       + [(f"module use {e.attrs['instance']}", ident(e.attrs["instance"]))
                          for e in calls]
                       + [("the layers", "layers")], f"model `{model.name}`")
        body = Body(self, msym, Name("device"), namer, self_attr, self.spec.path)
        body.spec_names = self._use_names(self.cfg.model.body)
        body.tp = self.tp_plans.get("")
        if self.incremental is not None:
            body.start = Name("start")
        if self.padding is not None:
            body.positions = Name(self.start_name())
            if body.start is None:
                body.start = Const(0)
        if model.params:
            body.real_dtype = dotted(f"self.{ident(model.params[0].name)}.dtype")
        args = []
        pads = []  # Pad inputs: after the others, None by default
        for v in model.inputs:
            if v.type.pad:  # (one the equations read is theirs: all ones without one)
                pads.append(body.define_input(v.name, v.type, Layout(True, False, 1))
                            if v.name in self.explicit else body.namer(v.name))
                continue
            lo = v.type.lo if v.type.dtype == "int" else None
            args.append(body.define_input(v.name, v.type, Layout(True, v.type.family is not None,
                                                                 len(v.type.shape)), raw_lo=lo))
        eqns: list[Eqn] = []
        subs: list[SubView] = []
        layer_classes: list[ClassView] = []
        for item in model.body:
            if isinstance(item, ir.Loop):
                eqns.extend(self._layers(item, model_cls, eqns, subs, layer_classes, msym))
            else:
                eqns.append(item)
        loop_vars = {item.var for item in model.body if isinstance(item, ir.Loop)}
        for e in eqns:
            if e.op == "call":
                attr = f"self.{ident(e.attrs['instance'])}"
                if attr not in [x.attr for x in subs]:
                    ctor = self._ctor(e, self.init_sym)
                    # exists only for some sizes: `... if E != H else ...`; a table the layers
                    # use under a layer condition (hoisted out of them) is made for all
                    guards = [g for g in e.guards
                              if not set(re.findall(NAME, g.text)) & loop_vars]
                    if guards:
                        guard = all_of(*(guard_expr(str(g), self.init_sym) for g in guards))
                        ctor = IfExp(ctor, guard, Const(None))
                    subs.append(SubView(attr, ctor))
        body.lower(eqns)
        outputs = [o.name for o in model.outputs]
        softmax_out = len(outputs) == 1 and body.vals[outputs[0]].producer is not None and \
            self.is_kind(body.vals[outputs[0]].producer, "softmax")
        head = self._prologue(model, {v.name: body.vals[v.name].py for v in model.inputs
                                      if not v.type.pad})
        plan = self.tp_plans.get("")
        if plan is not None and plan.positions:  # sequence parallelism: on for this call?
            head.append(Line(Do(call("tp_sequence", SP, *(
                Name(self.run_length[s]) for s in plan.positions)))))
        optional = [f"{p}=None" for p in pads]
        if softmax_out:
            producer = body.vals[outputs[0]].producer
            logits_name = producer.ins[0].name
            emitted = body.emit([logits_name])
            lines = head + self._padding_lines(body, _paths(emitted)) + emitted
            lines.append(Line(Return(body.result(logits_name))))
            logits = call("self.logits", *map(Name, args + pads))
            extra = [*fit(Def("forward", ("self", *args, *optional))),
                     f'    """{model.outputs[0].name}: the probabilities, Softmax(logits)."""',
                     *fit(Return(call("torch.softmax", logits, dim=Const(-1))), 1)]
            method_name = "logits"
        else:
            emitted = body.emit(outputs)
            lines = head + self._padding_lines(body, _paths(emitted)) + emitted
            # integer outputs are the spec's values, except an input returned as it came
            inputs = {v.name for v in model.inputs}
            lines.append(Line(Return(_values([
                body.result(o) if o in inputs else _spec_value(body, body.vals[o], body.result(o))
                for o in outputs]))))
            extra = []
            method_name = "forward"
        rest = [ln for ln in lines if not (isinstance(ln.stmt, Assign)
                                           and ln.stmt.targets == (Name("device"),))]
        if "device" not in _paths(rest):  # nothing made on the inputs' device
            lines = rest
        extra += self._signature_method(model)
        forward_args = ["self"] + args + optional
        if self.incremental is not None:
            extra += self._step_methods(args, pads, method_name)
            forward_args += ["*", "start=0"]
        init = ["self.config = config"]
        if "self.tp" in _paths(lines) or any("self.tp" in x for x in extra):
            init.append(TP_INIT)
        if "self.sp" in _paths(lines):
            init.append(SP_INIT)
        view = ClassView(model_cls, self._model_doc(), ["config"], init,
                         params, subs, forward_args, lines, kind="model",
                         extra_methods=extra)
        view.method_name = method_name  # type: ignore[attr-defined]
        view.logits_of = model.outputs[0].name if softmax_out else None  # type: ignore
        return self._render(view, layer_classes)

    def _cache_sites(self) -> Expr:
        """The attentions step() keeps the keys and values of, layer by layer: a list."""
        return self._sites(self.incremental.sites)

    def _sites(self, sites) -> Expr:
        """Attention modules (passes/incremental.CacheSite), layer by layer: a list."""
        parts: list[Expr] = []
        layer, site = Name("layer"), Name("site")
        for loop in sorted({s.loop for s in sites}, key=lambda k: -1 if k is None else k):
            paths = [".".join(ident(p) for p in s.path) for s in sites if s.loop == loop]
            if loop is None:
                parts.append(List(tuple(dotted(f"self.{p}") for p in paths)))
                continue
            layers = (layer, dotted(f"self.{layers_attr(loop)}"))
            if len(paths) == 1:
                parts.append(Comp(dotted(f"layer.{paths[0]}"), (layers,)))
            else:
                each = Tuple(tuple(dotted(f"layer.{p}") for p in paths))
                parts.append(Comp(site, (layers, (site, each))))
        out = parts[0]
        for part in parts[1:]:
            out = BinOp(out, "+", part)
        return out

    def _step_methods(self, args: list[str], pads: list[str], method: str) -> list[str]:
        """cache_sites() and step(): the incremental form, with the keys and values of the
        positions before this call's (see compiler/passes/incremental.py)."""
        what = "logits" if method == "logits" else "outputs"
        result = call(f"self.{method}", *map(Name, args + pads), start=Name("start"))
        present = Comp(dotted("site.cache"), ((Name("site"), Name("sites")),))
        q = '"""'
        return ["",
                "def cache_sites(self):",
                f"    {q}The attentions whose keys and values step() keeps, in the order of its",
                f"    `past`: layer by layer.{q}",
                *fit(Return(self._cache_sites()), 1),
                "",
                *fit(Def("step", ("self", *args, *(f"{p}=None" for p in pads), "past=None"))),
                f"    {q}The incremental form. The tokens are those at the positions after the P",
                "    that `past` holds the keys and values of: one (key, value) pair per",
                "    attention of cache_sites(), each (B, A, P, D); None when there are none",
                f"    yet (the prefill form). Returns the {what} of the new positions and the",
                "    present: the pairs extended by them (P + T positions), the next call's",
                f"    `past`.{q}" if not pads else
                f"    `past`. A padding mask covers the past's positions and the new ones.{q}",
                "    sites = self.cache_sites()",
                "    if past is not None and len(past) != len(sites):",
                '        raise ValueError(f"past holds {len(past)} key/value pairs; the "',
                '                         f"model keeps {len(sites)}")',
                "    start = past[0][0].shape[-2] if past else 0",
                "    for site, kv in zip(sites, past or [()] * len(sites)):",
                "        site.cache = kv",
                "    try:",
                *fit(Return(Tuple((result, present), bare=True)), 2),
                "    finally:",
                "        for site in sites:",
                "            site.cache = None"]

    def _signature_method(self, model: ir.Model) -> list[str]:
        """`signature()`: the dict compiler/lowering/signature.py decides (inputs, outputs,
        state, run lengths, what step() keeps), printed as a literal whose sizes that depend
        on hyperparameters are expressions over `self.config`: a module built at other
        sizes reports its own. At the compiled configuration it is the dict the ONNX graph
        stores as its metadata `fgc.signature`. runtime.run_segments and runtime.generate
        read it."""
        form = signature_form(model, self.functions, self.incremental)
        at(form, self.values)  # whole numbers at this configuration, or an FgcError now
        sig = self._config_code(form)
        return ["", "def signature(self):",
                '    """Inputs (with their dims: the batch, run lengths) and outputs in order,',
                "    the outputs a caller feeds back as inputs at the next call, and what",
                "    step() keeps (read by runtime.run_segments and runtime.generate), at",
                "    this module's config; at the compiled one, the ONNX graph's metadata",
                "    `fgc.signature` holds the same.\"\"\"",
                *(ln[4:] for ln in _literal_lines(sig, "return ", 8))]

    def _config_code(self, form):
        """The signature form with its `Number`s and `Text`s as Python over `self.config`."""
        if isinstance(form, Number):
            return py_poly(form.size, self.fwd_sym)
        if isinstance(form, Text):
            parts, exact = form.template()
            code: Expr = FString(tuple(p if k % 2 == 0 else dotted(self.fwd_sym[p])
                                       for k, p in enumerate(parts)))
            if not exact:  # a text naming the size elsewhere; at this configuration, the
                hypers = form.hypers()  # ONNX graph's
                sizes = Tuple(tuple(dotted(self.fwd_sym[h]) for h in hypers))
                now = Tuple(tuple(py_poly(self.values[h], {}) for h in hypers))
                code = IfExp(Const(form.at(self.values)), Compare(sizes, "==", now), code)
            return code
        if isinstance(form, dict):
            return {k: self._config_code(v) for k, v in form.items()}
        if isinstance(form, list):
            return [self._config_code(v) for v in form]
        return form

    def _prologue(self, model: ir.Model, names: dict[str, str]) -> list[Line]:
        """The sequence length of this call (each length, when inputs have several), checked
        against the spec's maximum."""
        lines = []
        first = None
        lengths: set[str] = set()
        for v in model.inputs:
            if v.name not in names:  # a padding mask: checked where it is read
                continue
            x = Name(names[v.name])
            for k, d in enumerate(v.type.shape):
                along = v.type.dtype != "real" or k < len(v.type.shape) - 1
                axis = k + (2 if v.type.family is not None else 1)  # after a family's axis
                size = Subscript(Attr(x, "shape"), (Const(axis),))
                if along and isinstance(d, Poly) and d.symbols() and \
                        not d.symbols() & self.dynamic:
                    # a length a parameter fixes (ir.sequence_symbols): this size only, as
                    # the ONNX graph's input shape says
                    exact = py_poly(d, self.fwd_sym)
                    lines.append(Line(Assert(Compare(size, "==", exact), (
                        FString((f"{v.name}: ", size, f" along axis {axis}; ")),
                        FString(("the model takes exactly ", exact))))))
                    continue
                if isinstance(d, Poly) and d.symbols() & self.dynamic and len(d.terms) == 1:
                    s = next(iter(d.symbols()))
                    T = self.run_length[s]
                    if T in lengths:
                        continue
                    lengths.add(T)
                    first = first or x
                    lines.append(Line(Assign((Name(T),), size), "this call's sequence length"
                                      if len(self.run_length) == 1 else
                                      f"the length of {v.name} in this call"))
                    lines.append(self._length_check(Name(T), d, dotted(self.fwd_sym[s])))
        if first is None and model.inputs:
            first = Name(names[model.inputs[0].name])
        if first is not None:
            lines.append(Line(Assign((Name("device"),), Attr(first, "device"))))
        return lines

    def _padding_lines(self, body: Body, read: set[str]) -> list[Line]:
        """For each Pad input (passes/padding.py): the keys' padding, given to every
        attention over its positions, and where the tokens are (`at`), where the lines
        after read it (`read`)."""
        lines: list[Line] = []
        for v in self.model.inputs:
            if v.name in self.explicit:  # the equations apply it: all ones where none is given
                mask = Name(body.namer(v.name))
                tokens = next(x for x in self.model.inputs if not x.type.pad and
                              x.type.dtype == "int" and x.type.shape == v.type.shape)
                lines.append(Line(If(Compare(mask, "is", Const(None))), "no padding"))
                lines.append(Line(Assign((mask,), call("torch.ones_like", Name(
                    body.vals[tokens.name].py))), depth=1))
        for p in self.padding.inputs if self.padding is not None else []:
            if p.explicit:
                continue
            mask = Name(body.namer(p.input))
            T = Name(self.run_length[p.length])
            generated = self.incremental is not None and self.incremental.length == p.length
            first = Name("start") if generated else Const(0)
            width = BinOp(first, "+", T) if generated else T
            given = Compare(mask, "is not", Const(None))
            covers = Subscript(Attr(mask, "shape"), (Const(-1),))
            lines.append(Line(If(given), "a padded batch: each row's tokens alone"))
            lines.append(Line(Assert(Compare(covers, "==", width), (
                FString((f"{p.input} covers ", covers, " positions; ")),
                FString(("this call's are ", width)))), depth=1))
            padding = Name("padding" if len(self.padding.inputs) == 1 else f"padding_{T.text}")
            lines.append(Line(Assign((padding,), IfExp(
                call("key_padding", mask, body.real_dtype), given, Const(None))),
                "0 at a token, the lowest number at padding, (B, P + T)"))
            if p.sites:
                site, sites = Name("site"), Name("sites")
                lines.append(Line(Assign((sites,), self._sites(p.sites))))
                lines.append(Line(For(site, sites),
                                  "each attention over these positions masks padding"))
                lines.append(Line(Assign((Attr(site, "pad"),), padding), depth=1))
            at = Name(self.positions_name(p.input))
            if at.text in read:
                lines.append(Line(Assign((at,), IfExp(call("token_positions", mask, T), given,
                                                      first)),
                                  "each token's position in its row without padding"))
        return lines

    def _length_check(self, T: Name, d: Poly, most: Expr) -> Line:
        """`assert T <= n`; in step(), for the positions after `start`."""
        if self.by_position(d):
            end = BinOp(Name("start"), "+", T)
            return Line(Assert(Compare(end, "<=", most), (
                FString(("positions up to ", end, "; ")),
                FString(("the model takes at most ", most)))))
        return Line(Assert(Compare(T, "<=", most), (
            FString(("sequence of ", T, " tokens; ")),
            FString(("the model takes at most ", most)))))

    def _model_doc(self) -> list[str]:
        out = []
        span = self.model.span
        for k in range(span.line, (span.end_line or span.line) + 1):
            text = self.sources.line(span.file, k)
            if text is not None:
                out.extend(doc_lines(safe_doc(text)))
        return out

    def _layers(self, loop: ir.Loop, model_cls: str, outer: list[Eqn], model_subs,
                layer_classes, msym) -> list[Eqn]:
        index = len(self.loops)
        cls = f"{model_cls}Layer" + (str(index + 1) if index else "")
        while cls in set(self.consts.values()) | set(self.class_of.values()) or reserved(cls):
            cls += "_"
        attr = layers_attr(index)
        hoisted = invariant(loop, self.functions)  # computed once, before the loop
        hoisted_ids = {id(e) for e in hoisted}
        rest = [e for e in loop.body if id(e) not in hoisted_ids]
        produced = {v.name for e in rest for v in e.outs} | {c.inner for c in loop.carried}
        outside_inputs: list[str] = []
        for e in rest:
            for o in e.ins:
                if o.name is not None and o.name not in produced and o.name not in \
                        outside_inputs:
                    outside_inputs.append(o.name)
        namer = Namer({"T", "B"} | set(self.run_length.values()))
        lsym = dict(msym)
        lsym[loop.var] = "self.l"
        self_attr: dict[str, str] = {}
        body = Body(self, lsym, "device", namer, self_attr, self.spec.path)
        body.spec_names = self._use_names(self.cfg.model.body)
        body.tp = self.tp_plans.get("")
        if self.incremental is not None:  # tables of positions inside: from `start` on
            body.start = Name("start")
        args = []
        for c in loop.carried:
            init_t = self._type_of(c.init, outer)
            args.append(body.define_input(c.inner, init_t, Layout(True, False,
                                                                  _rank(init_t))))
        model_params = {p.name: p for p in self.model.params}
        model_inputs = {v.name: v for v in self.model.inputs}
        for name in outside_inputs:
            if name in model_inputs:  # as the model holds it: ids 0-based
                t = model_inputs[name].type
                args.append(body.define_input(name, t, Layout(True, False, len(t.shape)),
                                              raw_lo=t.lo if t.dtype == "int" else None))
            elif name in model_params:
                t = model_params[name].type
                args.append(body.define_input(name, t, Layout(False, t.family is not None,
                                                              len(t.shape))))
            else:
                t = self._type_of(name, outer + hoisted)
                producer = next((e for e in outer + hoisted if any(v.name == name
                                                                   for v in e.outs)), None)
                if name in body.spec_names:
                    namer.alias(name, body.spec_names[name])
                lead = not (producer is not None and producer.op == "call"
                            and not self.functions[producer.attrs["module"]].inputs)
                args.append(body.define_input(name, t, Layout(lead, False, _rank(t))))
        subs: list[SubView] = []
        shared = set(loop.shared)
        shared_args = []
        for e in rest:
            if e.op != "call":
                continue
            inst = e.attrs["instance"]
            a = f"self.{ident(inst)}"
            if a in [x.attr for x in subs] or ident(inst) in shared_args:
                continue
            ctor = self._ctor(e, self.init_sym)
            if inst in shared:
                shared_args.append(ident(inst))
                model_subs.append(SubView(f"self.{ident(inst)}", ctor))
            elif e.guards:
                sym = {**self.init_sym, loop.var: "l"}
                guard = all_of(*(guard_expr(str(g), sym) for g in e.guards))
                subs.append(SubView(a, IfExp(ctor, guard, Const(None))))
            else:
                subs.append(SubView(a, ctor))
        body.lower(rest)
        # besides what it carries, a layer returns what is read after the layers: X^(L) of a
        # value it does not carry, and each layer's X^(l) for a stack X^(1..L)
        carried_results = {c.result for c in loop.carried}
        used_after = self._used_outside(loop)
        last = [(i, o) for i, o in loop.results if i not in carried_results and o in used_after]
        each = [(i, o) for i, o in loop.stacks]
        carried_inputs = {c.inner for c in loop.carried}
        extra = list(dict.fromkeys(i for i, _ in last + each if i in body.vals
                                   and i not in carried_results | carried_inputs))
        results = [c.result for c in loop.carried] + extra
        lines = body.emit(results)
        lines.append(Line(Return(_values([_spec_value(body, body.vals[r], body.result(r))
                                          for r in results]))))
        init_args = ["config", "l"] + shared_args
        # the run's lengths, where the layer's own equations need them
        read = _paths(lines)
        lengths = [t for t in dict.fromkeys(self.run_length.values()) if t in read]
        lengths += ["start"] if "start" in read else []
        # a module shared by all layers is the model's: each layer holds it without
        # registering it, so the state dict names its tensors once
        init_lines = ["self.l = l"] + [f'object.__setattr__(self, "{a}", {a})  # shared'
                                       for a in shared_args]
        if "self.config" in read:  # sizes its forward reads
            init_lines.insert(0, "self.config = config")
        if "self.tp" in read:
            init_lines.append(TP_INIT)
        if "self.sp" in read:
            init_lines.append(SP_INIT)
        count = py_poly(loop.hi, self.comment_sym).text
        view = ClassView(cls, [f"One of the {count} layers, {loop.var} = 1..{count}."],
                         init_args, init_lines, [], subs,
                         ["self"] + args + (["*"] + lengths if lengths else []),
                         lines, kind="layer")
        layer_classes.append(view)
        layer = call(cls, Name("config"), Name("l"),
                     **{a: dotted(f"self.{a}") for a in shared_args})
        numbers = call("range", Const(1), BinOp(py_poly(loop.hi, self.init_sym), "+", Const(1)))
        ctor = call("nn.ModuleList", Comp(layer, ((Name("l"), numbers),), list=False))
        model_subs.append(SubView(f"self.{attr}", ctor))
        # the loop as one equation of the model's forward
        finals = []
        for c in loop.carried:
            outer_name = next(o for i, o in loop.results if i == c.result)
            t = self._type_of(c.init, outer)
            finals.append(ir.Value(name=outer_name, type=t))
        types = {v.name: v.type for e in loop.body for v in e.outs}
        types.update((c.inner, self._type_of(c.init, outer)) for c in loop.carried)
        finals += [ir.Value(name=o, type=types[i]) for i, o in last]
        finals += [ir.Value(name=o, type=types[i].with_shape((loop.hi, *types[i].shape)))
                   for i, o in each]
        ins = [Operand(name=c.init) for c in loop.carried] + [
            Operand(name=n, whole_family=n in model_params) for n in outside_inputs]
        self.loops.append({"attr": attr, "carried": loop.carried, "loop": loop,
                           "extra": extra, "last": last, "each": each, "lengths": lengths})
        return hoisted + [Eqn(outs=finals, op="layers", ins=ins, attrs={"index": index},
                              span=loop.span)]

    def _used_outside(self, loop: ir.Loop) -> set[str]:
        """The values read anywhere but in `loop`'s own body, outputs included."""
        used = {o.name for o in self.model.outputs}
        for item in self.model.body:
            if item is loop:
                continue
            for e in (item.body if isinstance(item, ir.Loop) else [item]):
                used.update(o.name for o in e.ins if o.name is not None)
        return used

    def _type_of(self, name: str, eqns: list[Eqn]) -> TensorType:
        for v in self.model.inputs:
            if v.name == name:
                return v.type
        for e in eqns:
            for v in e.outs:
                if v.name == name:
                    return v.type
        for p in self.model.params:
            if p.name == name:
                return p.type
        raise Unsupported(f"`{name}` has no known type")

    def _prune(self, model_view: ClassView, layer_classes: list[ClassView]) -> list[ClassView]:
        """Drop module uses that the lowering made unnecessary (OneHot inside an embedding
        lookup, Softmax inside forward) and the classes nothing builds any more."""
        def text_of(c: ClassView) -> str:
            return "\n".join([ln.code for ln in c.body] + c.extra_methods)
        for c in [model_view, *layer_classes, *self.classes]:
            used = text_of(c)
            if c is model_view:
                used += "\n".join(s.ctor.text for s in c.subs)
            c.subs = [s for s in c.subs if re.search(re.escape(s.attr) + r"\b", used)
                      or re.search(r"=" + re.escape(s.attr) + r"\b", used)]
        by_name = {c.name: c for c in self.classes}
        keep: list[str] = []

        def visit(c: ClassView) -> None:
            for s in c.subs:
                for name in [x.func.id for x in s.ctor.walk()
                             if isinstance(x, Call) and isinstance(x.func, Name)]:
                    if name in by_name and name not in keep:
                        keep.append(name)
                        visit(by_name[name])
        for c in [model_view, *layer_classes]:
            visit(c)
        return [c for c in self.classes if c.name in keep]

    def _config_view(self) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
        """Config's fields, (name, type, this configuration's value, comment), and its derived
        sizes, (name, expression, docstring): a hyperparameter the spec defines from others
        is a property computed from the fields, unless this configuration gives it another
        value (then it is a field of its own)."""
        fields, derived = [], []
        of_self = {h: f"self.{c}" for h, c in self.consts.items()}
        env = {k: v for k, v in self.values.items() if isinstance(v, Poly)}
        lines = [h.span.line for h in self.model.hypers if h.span is not None]
        for h in self.model.hypers:
            value, name = self.values[h.name], self.consts[h.name]
            comment = ""
            if h.span is not None and lines.count(h.span.line) == 1:  # its own line
                source = self.sources.line(h.span.file, h.span.line) or ""
                # printable characters only: it stays one comment line
                comment = " ".join("".join(ch if ch.isprintable() else " " for ch in
                                           source.split("#", 1)[1]).split()) \
                    if "#" in source else ""
            if isinstance(h.default, Poly) and not h.default.is_const() and \
                    isinstance(value, Poly) and h.default.subs(env) == value:
                what = safe_doc(f"{h.name} = {h.text}" + (f": {comment}" if comment else ""))
                # one line between quotes: it ends in `.`, never in a quote of its own
                derived.append((name, py_poly(h.default, of_self).text, what.rstrip(".") + "."))
                continue
            if isinstance(value, Poly) and value.const_value().denominator == 1:
                fields.append((name, "int", str(value.const_value().numerator), comment))
            else:
                number = float(value.const_value()) if isinstance(value, Poly) else value
                fields.append((name, "float", py_const(number, {}).text, comment))
        return fields, derived

    @staticmethod
    def _tp_helpers(text: str) -> dict[str, bool]:
        """Which tensor-parallel helpers model.py's lines call, with those they call."""
        def uses(name: str) -> bool:
            return bool(re.search(rf"(?<![\w.]){name}\(", text))
        moe = bool(re.search(r"(?<![\w.])moe\([^\n]*tp=", text))
        flags = {f"uses_{n}": uses(n) for n in ("tp_gather", "tp_block", "tp_picks",
                                                   "tp_lookup")}
        flags["uses_sequence"] = uses("tp_sequence")
        flags.update({f"uses_{n}": uses(n) for n in ("tp_length", "tp_whole", "tp_scatter",
                                                     "tp_shared")})
        flags["uses_tp_enter"] = uses("tp_enter") or flags["uses_tp_block"] or moe or \
            flags["uses_tp_shared"]
        flags["uses_tp_reduce"] = uses("tp_reduce") or flags["uses_tp_lookup"] or moe or \
            flags["uses_sequence"]
        flags["uses_tp_gather"] |= flags["uses_sequence"]  # tp_whole's
        flags["moe_tp"] = moe
        return flags

    def _render(self, model_view: ClassView, layer_classes: list[ClassView]) -> str:
        env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES),
                                 keep_trailing_newline=True, trim_blocks=True,
                                 lstrip_blocks=True, autoescape=False)
        template = env.get_template("model.py.j2")
        modules = self._prune(model_view, layer_classes)
        fields, derived = self._config_view()
        text = "\n".join(ln.code for c in [model_view, *layer_classes, *modules]
                          for ln in c.body) + "\n".join(x for c in [model_view] for x in
                                                         c.extra_methods)
        used = [n for n in FUNCTIONAL if re.search(rf"\b{n}\(", text)]
        # one statement of the plain names and one per renamed one, in isort's order (by
        # the first name each imports), as ruff checks the generated file
        statements = []
        if plain := sorted(n for n in used if FUNCTIONAL[n] == n):
            statements.append((plain[0], ", ".join(plain)))
        statements += [(FUNCTIONAL[n], f"{FUNCTIONAL[n]} as {n}") for n in used
                       if FUNCTIONAL[n] != n]
        imports = [f"from torch.nn.functional import {names}"
                   for _, names in sorted(statements)]
        tp_plan = {}  # per class, its split parameters' attributes and axes
        for name, plan in self.tp_plans.items():
            cls = self.model_class if not name else self.module_class(name)
            if cls in {c.name for c in [model_view, *modules]}:
                tp_plan[cls] = {ident(p): s.axis for p, s in plan.splits.items()}
        # per class of the model and its layers, the modules its lines call that sequence
        # parallelism reaches (their `sp`)
        taking = {ident(x) for x in (self.tp_plans[""].seq_instances
                                     if "" in self.tp_plans else ())}
        sp_plan = {c.name: [s.attr[len("self."):] for s in c.subs
                            if s.attr[len("self."):] in taking]
                   for c in [model_view, *layer_classes]}
        uses_moe = bool(re.search(r"(?<![\w.])moe\(", text))
        view = dict(
            imports="\n".join(imports),
            tp_plan=tp_plan, tp_plan_text="\n".join(_literal_lines(tp_plan, "TP_PLAN = ", 0)),
            sp_plan_text="\n".join(_literal_lines(sp_plan, "SP_PLAN = ", 0)),
            **(self._tp_helpers(text) if tp_plan else {"moe_tp": False,
                                                        "uses_sequence": False}),
            spec=safe_name(self.spec.path), model=model_view, layers=layer_classes,
            modules=modules, fields=fields, derived=derived, preset=self.preset,
            precision=self.precision,
            # the helpers what is left after pruning calls, each emitted only then
            uses_causal=bool(re.search(r"(?<![\w.])causal_mask\(", text)),
            uses_window=bool(re.search(r"(?<![\w.])window_mask\(", text)),
            uses_take=bool(re.search(r"(?<![\w.])take\(", text)),
            uses_keeptopk=bool(re.search(r"(?<![\w.])keeptopk\(", text)),
            uses_moe=uses_moe,
            uses_project=uses_moe or bool(re.search(r"(?<![\w.])project\(", text)),
            uses_rotary=bool(re.search(r"(?<![\w.])rotary\(", text)),
            uses_padding=self.padding is not None,
            uses_positions=bool(re.search(r"(?<![\w.])token_positions\(", text)),
            uses_rows_at=bool(re.search(r"(?<![\w.])rows_at\(", text)))
        source = template.render(**view, uses_math=True)
        if re.search(r"\bmath\.", source):
            return source
        return template.render(**view, uses_math=False)  # nothing needs `import math`


def generate(spec, preset: str | None = None, sets: dict | None = None) -> str:
    """PyTorch source for a spec at one configuration (its values are Config's defaults)."""
    cfg = spec.configure(preset, sets or {})
    sym = spec.symbolic()
    gen = Generator(spec, sym, cfg.values, spec.sources, preset)
    return gen.generate()
