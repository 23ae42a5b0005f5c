"""The abstract syntax of .fgpt files: what was written, with spans, before any meaning."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction

from ..errors import FgcError, Span

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
class MemberAt(Expr):
    """`k_{(i - 1) / 2 + 1}`: the member of family `k` an index expression picks."""

    family: str  # the family's name: "k" for `k_{...}`
    index: Expr


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
class PadType:
    """`Pad[n]`: which of n positions hold tokens (1) and which padding (0)."""

    span: Span
    n: Expr


@dataclass
class TupleType:
    span: Span
    items: list


Type = RealType | IntType | PermType | PadType | TupleType

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
    init: str = "normal"  # normal | zeros | ones: how it starts without weights


@dataclass
class Expect:
    span: Span
    op: str  # "==" | "~"
    value: Expr


@dataclass
class Condition:
    span: Span
    cond: Expr  # a comparison of sizes, `l is even`-style parity, and/or/not


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
    name: str  # transpose | split | heads | take | flatten | slice
    # numbers; `slice` takes a range whose ends are size expressions (`1 .. A * D`)
    args: list[int | Expr]


@dataclass
class CkptMap:
    span: Span
    path: list[str]  # ["attn", "W^Q"] or ["W_e"]
    source: str  # "h.{l}.attn.c_attn.weight"
    steps: list[CkptStep]
    per_layer: bool = False


@dataclass
class CkptTied:
    """`tied "lm_head.weight" = "embed_tokens.weight"`: the file may hold `name` as a copy
    of `same` (a head tied to the embedding); nothing reads it, and it must equal `same`."""

    span: Span
    name: str
    same: str


@dataclass
class Checkpoint:
    span: Span
    prefixes: list[str]
    maps: list[CkptMap]
    ignore: list[str]
    tied: list[CkptTied] = field(default_factory=list)


# ---------------------------------------------------------------- config.json


@dataclass
class ConfigKey(Expr):
    """`rope_parameters.rope_theta`, `num_buckets[1]`: a value of config.json by its path."""

    path: list[str | int]  # keys, and 1-based positions in a list


@dataclass
class ConfigChoice(Expr):
    """`rope_parameters.rope_theta | rope_theta`: the first alternative config.json holds."""

    alternatives: list[Expr]  # ConfigKey, Num, BinOp of them, or a ConfigChoice in brackets


@dataclass
class JsonValue:
    """A value as config.json writes it, in an `assume`."""

    span: Span
    kind: str  # string | number | true | false | null | list | cycle (`["a", "b", ...]`:
    # a list of any length whose entries are the items in turn, the first again after the last)
    text: str  # a string's characters, a number as written (`-1`, `1e-5`)
    items: list[JsonValue] = field(default_factory=list)


@dataclass
class ConfigMap:
    """`G = num_key_value_heads ? A`: a hyperparameter from config.json."""

    span: Span
    name: str  # the hyperparameter
    source: ConfigChoice
    default: Expr | None  # a size expression of hyperparameters, where the file holds none


@dataclass
class ConfigAssume:
    """`assume hidden_act == "silu"`: a value of a key the spec does not map."""

    span: Span
    source: ConfigChoice
    values: list[JsonValue]  # `== v`: one; `in {a, b}`: any of them
    absent: JsonValue | None = None  # `? v`: what a file without the key means


@dataclass
class ConfigBlock:
    """`config { ... }`: how a transformers config.json gives the model's hyperparameters."""

    span: Span
    architectures: list[str]  # transformers classes the spec is for (LlamaForCausalLM)
    model_types: list[str]  # config.json's model_type ("llama")
    maps: list[ConfigMap]
    assumes: list[ConfigAssume]


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
    # `expect Md > Nb / 4`: conditions every configuration's sizes meet
    conditions: list[Condition] = field(default_factory=list)
    config: ConfigBlock | None = None  # `config { ... }`: config.json's keys


@dataclass
class File:
    name: str
    modules: list[Module]
    models: list[Model]


# ---------------------------------------------------------------- number literals

MAX_NUMBER_DIGITS = 40

_SUFFIX = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}
MAX_MAGNITUDE = 10**300  # floats end near 1.8e308; no size or constant comes near this
_MISPLACED_UNDERSCORE = re.compile(r"(?<![0-9])_|_(?![0-9])")
_UNDERSCORES = re.compile(r"_+")


def parse_number(tok, filename: str) -> Fraction:
    """The exact value of a number token (`768`, `10_000`, `1e-5`, `1.3B`); FgcError, located
    at the token, for what the grammar's patterns let through but is not a number: an `_`
    that is not between two digits (`1_`, `1__0`), more than MAX_NUMBER_DIGITS digits, or a
    magnitude past MAX_MAGNITUDE (beyond that a float overflows). `--set` passes its text
    here too, so other malformed text raises ValueError (or FgcError)."""
    raw = str(tok)
    span = Span(filename, tok.line, tok.column, tok.end_line, tok.end_column)
    shown = f"{raw[:20]}{'…' if len(raw) > 20 else ''}"
    if _MISPLACED_UNDERSCORE.search(raw):
        raise FgcError(f"malformed number `{shown}`: `_` goes between two digits", span,
                       f"write `{_UNDERSCORES.sub('_', raw).strip('_')}`"
                       if raw.strip("_") else None)
    text = raw.replace("_", "")
    scale = 1
    if text[-1] in _SUFFIX:
        scale = _SUFFIX[text[-1]]
        text = text[:-1]
    digits = len(text.split("e")[0].split("E")[0])
    exponent = 0
    for marker in ("e", "E"):
        if marker in text:
            exponent = int(text.split(marker)[1])
    if digits > MAX_NUMBER_DIGITS or abs(exponent) > 300:
        raise FgcError(f"number too large: {shown}", span,
                       f"fgc accepts at most {MAX_NUMBER_DIGITS} digits")
    value = Fraction(text) * scale
    if abs(value) > MAX_MAGNITUDE:
        raise FgcError(f"number too large: {shown}", span,
                       "fgc accepts numbers up to 1e300")
    return value
