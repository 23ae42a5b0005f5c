"""The abstract syntax of .fgpt files: what was written, with spans, before any meaning."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from .errors import Span

# ---------------------------------------------------------------- expressions


@dataclass
class Expr:
    span: Span


@dataclass
class Name(Expr):
    name: str  # as written, superscript included: "W_i^Q", "Mask^AR", "W_e^T"


@dataclass
class Num(Expr):
    value: Fraction
    text: str


@dataclass
class Inf(Expr):
    pass


@dataclass
class BinOp(Expr):
    op: str  # + - * / @ %
    left: Expr
    right: Expr


@dataclass
class Neg(Expr):
    operand: Expr


@dataclass
class Compare(Expr):
    op: str  # == != < <= > >=
    left: Expr
    right: Expr


@dataclass
class Parity(Expr):
    operand: Expr
    even: bool


@dataclass
class BoolOp(Expr):
    op: str  # and | or
    left: Expr
    right: Expr


@dataclass
class Not(Expr):
    operand: Expr


@dataclass
class IfExp(Expr):
    cond: Expr
    then: Expr
    orelse: Expr


@dataclass
class FullSlice(Expr):
    pass


@dataclass
class RangeSlice(Expr):
    lo: Expr
    hi: Expr


@dataclass
class Kwarg(Expr):
    name: str
    value: Expr


@dataclass
class Index(Expr):
    base: Expr
    items: list[Expr]


@dataclass
class LayerRef(Expr):
    base: Expr
    layer: Expr


@dataclass
class Superscript(Expr):
    base: Expr
    name: str


@dataclass
class Ellipsis_(Expr):
    pass


@dataclass
class Call(Expr):
    func: str
    func_span: Span
    args: list[Expr]
    hyper_args: list[Expr] = field(default_factory=list)
    label: str | None = None


@dataclass
class Tuple_(Expr):
    items: list[Expr]


# ---------------------------------------------------------------- types


@dataclass
class RealType:
    span: Span
    dims: list[Expr]  # an Ellipsis_ stands for `...`


@dataclass
class IntType:
    span: Span
    lo: Expr
    hi: Expr
    dims: list[Expr]
    values: list[Expr] | None = None  # `{0, 1}` lists its values


@dataclass
class PermType:
    span: Span
    n: Expr


@dataclass
class TupleType:
    span: Span
    items: list


Type = RealType | IntType | PermType | TupleType

# ---------------------------------------------------------------- declarations


@dataclass
class Family:
    span: Span
    var: str
    lo: Expr
    hi: Expr


@dataclass
class HyperDecl:
    span: Span
    name: str
    default: Expr | None


@dataclass
class ArgDecl:
    span: Span
    name: str
    type: Type
    family: Family | None = None


@dataclass
class ParamDecl:
    span: Span
    name: str
    type: Type
    family: Family | None


@dataclass
class Expect:
    span: Span
    op: str  # "==" | "~"
    value: Expr


@dataclass
class Preset:
    span: Span
    name: str
    assigns: list[tuple[str, Expr, Span]]
    expects: list[Expect]


@dataclass
class LhsName:
    span: Span
    name: str


@dataclass
class LhsLayer:
    span: Span
    name: str
    layer: Expr


@dataclass
class LhsHead:
    span: Span
    name: str
    params: list[str]


@dataclass
class LhsIndex:
    span: Span
    head: LhsName | LhsHead
    indices: list[str]


Lhs = LhsName | LhsLayer | LhsHead | LhsIndex


@dataclass
class WhereEq:
    span: Span
    name: str
    value: Expr
    family: Family | None


@dataclass
class Equation:
    span: Span
    lhs: list[Lhs]
    rhs: Expr
    where: list[WhereEq]
    family: Family | None


@dataclass
class Output:
    span: Span
    name: str | None
    value: Expr


@dataclass
class Share:
    span: Span
    names: list[str]
    spec: str | None = None  # `share ... with "other.fgpt"`: shared with another spec
    spec_span: Span | None = None


@dataclass
class Loop:
    span: Span
    var: str
    lo: Expr
    hi: Expr
    body: list  # Equation | Share


@dataclass
class Module:
    span: Span
    name: str
    hypers: list[HyperDecl]
    inputs: list[ArgDecl]
    out_type: Type
    equations: list[Equation]
    params: list[ParamDecl]


@dataclass
class CkptStep:
    span: Span
    name: str  # transpose | split | heads | take | flatten
    args: list[int]


@dataclass
class CkptMap:
    span: Span
    path: list[str]  # ["attn", "W^Q"] or ["W_e"]
    source: str  # "h.{l}.attn.c_attn.weight"
    steps: list[CkptStep]
    per_layer: bool = False


@dataclass
class Checkpoint:
    span: Span
    prefixes: list[str]
    maps: list[CkptMap]
    ignore: list[str]


@dataclass
class Model:
    span: Span
    name: str
    hypers: list[HyperDecl]
    presets: list[Preset]
    inputs: list[ArgDecl]
    params: list[ParamDecl]
    statements: list  # Equation | Loop | Output | Share, in source order
    expects: list[Expect]
    checkpoint: Checkpoint | None = None


@dataclass
class File:
    name: str
    modules: list[Module]
    models: list[Model]
