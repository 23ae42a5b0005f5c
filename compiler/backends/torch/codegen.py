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

import ast
import functools
import json
import math
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from ...elaborate import ir
from ...elaborate.intrinsics import intrinsic, is_kind
from ...elaborate.ir import Ell, Eqn, Operand, TensorType, sequence_symbols
from ...elaborate.symbolic import Atom, Poly
from ...lowering import guards, prepare
from ...lowering.families import has_params
from ...lowering.layers import invariant
from ...lowering.masks import PER_USE, MaskKind, from_caller, kind_of_input
from ...lowering.signature import Number, Text, at, run_lengths, signature_form
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
from ...passes.families import eqn_has_axis
from ...passes.incremental import NotIncremental, derive

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


def py_poly(p: Poly, sym: dict[str, str]) -> str:
    """A Python integer expression for a size: `4*H`, `H // A`, `T + 2`."""
    if p.is_const():
        c = p.const_value()
        return str(c.numerator) if c.denominator == 1 else repr(float(c))
    terms = []
    for mono, coef in sorted(p.terms.items(), key=lambda kv: str(kv[0])):
        num = [_py_sym(s, sym) + (f" ** {e}" if e > 1 else "") for s, e in mono if e > 0]
        den = [_py_sym(s, sym) + (f" ** {-e}" if e < -1 else "") for s, e in mono if e < 0]
        text = " * ".join(([str(abs(coef.numerator))] if abs(coef.numerator) != 1 or not num
                           else []) + num)
        den_factor = ([str(coef.denominator)] if coef.denominator != 1 else []) + den
        if den_factor:
            text = f"{text} // " + (den_factor[0] if len(den_factor) == 1
                                    else "(" + " * ".join(den_factor) + ")")
        terms.append(("-" if coef < 0 else "+", text))
    out = ""
    for k, (sign, text) in enumerate(terms):
        out += (("-" if sign == "-" else "") + text) if k == 0 else f" {sign} {text}"
    return out


def _py_sym(s, sym: dict[str, str]) -> str:
    if isinstance(s, Atom):
        args = [py_poly(a, sym) for a in s.args]
        if s.op == "div":
            return f"(({args[0]}) // ({args[1]}))"
        if s.op == "mod":
            return f"(({args[0]}) % ({args[1]}))"
        if s.op == "floor":
            return f"math.floor({args[0]})"
        if s.op == "ceil":
            return f"math.ceil({args[0]})"
        return f"{s.op}({', '.join(args)})"
    try:
        return sym[s]
    except KeyError:
        raise Unsupported(f"size `{s}` is not known where it is used") from None


def py_const(c, sym: dict[str, str]) -> str:
    if isinstance(c, float):
        if math.isinf(c):
            return "-math.inf" if c < 0 else "math.inf"
        return repr(c)
    return py_poly(c, sym)


# ---------------------------------------------------------------- layouts


@dataclass(frozen=True)
class Layout:
    lead: bool  # leading axes before the spec's own: the batch, a caller's family axes
    fam: bool  # an own family axis just before the spec's dimensions
    rank: int | None  # rank of the spec's own dimensions; None when `...` is involved


def _rank(t: TensorType) -> int | None:
    return None if any(isinstance(d, Ell) for d in t.shape) else len(t.shape)


def _unsq(expr: str, times: int, at: int) -> str:
    for _ in range(times):
        expr = f"{expr}.unsqueeze({at})"
    return expr


# ---------------------------------------------------------------- python precedence

# Lines are built as text, so where an expression goes in as an operand of another it is
# bracketed exactly when its outermost operator binds more loosely than its place wants.
# The levels, loosest first, are those of the language reference's "Operator precedence"
# (a bare tuple, loosest of all, goes in brackets anywhere).
(TUPLE, LAMBDA, TERNARY, OR, AND, NOT, COMPARE, BIT_OR, BIT_XOR, BIT_AND, SHIFT, SUM,
 PRODUCT, UNARY, POWER, AWAIT, PRIMARY) = range(17)
BINARY = {ast.BitOr: BIT_OR, ast.BitXor: BIT_XOR, ast.BitAnd: BIT_AND, ast.LShift: SHIFT,
          ast.RShift: SHIFT, ast.Add: SUM, ast.Sub: SUM, ast.Mult: PRODUCT,
          ast.MatMult: PRODUCT, ast.Div: PRODUCT, ast.FloorDiv: PRODUCT, ast.Mod: PRODUCT,
          ast.Pow: POWER}
REF = re.compile(r"\{\{(.+?)\}\}")  # a value in an expression not yet inlined: {{name}}


def _level(node: ast.expr) -> int:
    """The precedence of a parsed expression's outermost operator (the parse has lost any
    brackets around the whole)."""
    match node:
        case ast.Lambda():
            return LAMBDA
        case ast.IfExp():
            return TERNARY
        case ast.BoolOp(op=ast.Or()):
            return OR
        case ast.BoolOp():
            return AND
        case ast.UnaryOp(op=ast.Not()):
            return NOT
        case ast.Compare():
            return COMPARE
        case ast.BinOp(op=op):
            return BINARY[type(op)]
        case ast.UnaryOp():
            return UNARY
        case ast.Await():
            return AWAIT
        case ast.Tuple() | ast.NamedExpr() | ast.Starred() | ast.Yield() | ast.YieldFrom():
            return TUPLE
    return PRIMARY


@functools.lru_cache(maxsize=4096)
def precedence(expr: str) -> int:
    """How tightly a Python expression holds together as an operand: the level of its
    outermost operator, PRIMARY for a name, a call, an attribute, a subscript, a literal
    or anything in brackets. Values not yet inlined (`{{name}}`) count as names."""
    text = REF.sub("_", expr).strip()
    if re.fullmatch(r"[A-Za-z_][\w.]*", text) or _bracketed(text):
        return PRIMARY
    return _level(ast.parse(text, mode="eval").body)


def operand(expr: str, wanted: int) -> str:
    """`expr` where an operand of at least precedence `wanted` goes: bracketed when it
    binds more loosely (`(a if c else b) + x`, `(x + y).sum(-1)`, `(-x).argmax(-1)`)."""
    return expr if precedence(expr) >= wanted else f"({expr})"


def _bracketed(expr: str) -> bool:
    """Whether `expr` is one bracketed group, `(...)`, and not `(a) + (b)`."""
    depth = 0
    for k, ch in enumerate(expr):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return ch == ")" and k == len(expr) - 1 and expr[0] == "("
    return False


def _wanted(parent: ast.AST, field_name: str) -> int:
    """The precedence an operand in `field_name` of `parent` needs to go in unbracketed."""
    match parent:
        case ast.BinOp(op=ast.Pow()):  # -x ** 2 is -(x ** 2); 2 ** -x is fine
            return AWAIT if field_name == "left" else UNARY
        case ast.BinOp(op=op):  # left to right: a - (b - c) keeps its brackets
            return BINARY[type(op)] + (field_name == "right")
        case ast.UnaryOp(op=ast.Not()):
            return NOT
        case ast.UnaryOp():
            return UNARY
        case ast.BoolOp(op=ast.Or()):
            return AND
        case ast.BoolOp():
            return NOT
        case ast.Compare():  # comparisons chain: a < (b < c) is not a < b < c
            return BIT_OR
        case ast.IfExp():  # a if c else (b if d else e) needs none
            return LAMBDA if field_name == "orelse" else OR
        case ast.Attribute() | ast.Subscript() if field_name == "value":
            return PRIMARY
        case ast.Call() if field_name == "func":
            return PRIMARY
        case ast.comprehension() if field_name in ("iter", "ifs"):
            return OR
        case ast.Starred():
            return BIT_OR
    return LAMBDA  # an argument, an item, an index, a lambda's body: anything but a tuple


@functools.lru_cache(maxsize=4096)
def slot_precedences(template: str) -> tuple[int, ...]:
    """For each `{{name}}` of an expression, in order, the precedence what replaces it
    needs to go in unbracketed."""
    count = iter(range(len(REF.findall(template))))
    tree = ast.parse(REF.sub(lambda m: f"__ref{next(count)}", template).strip(), mode="eval")
    wanted: dict[int, int] = {}

    def visit(node: ast.AST, level: int) -> None:
        if isinstance(node, ast.Name) and node.id.startswith("__ref"):
            wanted[int(node.id[5:])] = level
        for name, value in ast.iter_fields(node):
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST):
                    visit(child, _wanted(node, name))
    visit(tree.body, LAMBDA)
    return tuple(wanted[k] for k in range(len(wanted)))


def infix(x: str, symbol: str, y: str) -> str:
    """`x symbol y`, each side bracketed where the operator needs it."""
    left, right = slot_precedences(f"{{{{x}}}} {symbol} {{{{y}}}}")
    return f"{operand(x, left)} {symbol} {operand(y, right)}"


# ---------------------------------------------------------------- view-model


@dataclass
class Line:
    code: str
    comment: str = ""

    @property
    def text(self) -> str:
        """The line at method-body indentation, wrapped to WIDTH columns."""
        if "\n" in self.code:
            return "\n".join(" " * 8 + x for x in self.code.split("\n"))
        return "\n".join(wrap(self.code, self.comment, " " * 8))


WIDTH = 99


def _split_top(args: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in args:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def _top_level(code: str, needles: tuple[str, ...]) -> list[int]:
    """Positions of the needles outside any brackets."""
    out, depth, k = [], 0, 0
    while k < len(code):
        ch = code[k]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0:
            for n in needles:
                if code.startswith(n, k):
                    out.append(k)
                    break
        k += 1
    return out


def wrap(code: str, comment: str, indent: str) -> list[str]:
    """One statement as lines of at most WIDTH columns: as is when it fits; else the
    comment goes above, a long sum is split before its operators, and a long call gets
    one argument per line."""
    one = f"{indent}{code}" + (f"  # {comment}" if comment else "")
    if len(one) <= WIDTH:
        return [one]
    head = [f"{indent}# {x}" for x in textwrap.wrap(comment, WIDTH - len(indent) - 2,
                                                       break_long_words=False)]
    if len(indent) + len(code) <= WIDTH:
        return head + [indent + code]
    parts = _split_top(code[7:]) if code.startswith("assert ") else []
    if len(parts) == 2 and parts[1].startswith('f"'):
        # `assert cond, f"...; ..."`: the message below, in pieces cut after its `; `
        pieces = re.split(r"(?<=; )", parts[1][2:-1])
        return head + [f"{indent}assert {parts[0]}, ("] + \
            [f'{indent}    f"{x}"' for x in pieces] + [f"{indent})"]
    eq = _top_level(code, (" = ",))
    if eq and not code.startswith("return ") and not code.startswith("for "):
        lhs, rhs = code[: eq[0]], code[eq[0] + 3:]
        return head + _wrap_expr(rhs, indent, f"{lhs} = ", "")
    if code.startswith("return "):
        return head + _wrap_expr(code[7:], indent, "return ", "")
    return head + _wrap_expr(code, indent, "", "")


def _wrap_expr(expr: str, indent: str, before: str, after: str,
               tuples: bool = True, split: bool = False) -> list[str]:
    """`before + expr + after` in lines of at most WIDTH columns where it can be, at
    `indent`; `split`: a sum or a conditional is split even where it fits (it brings
    back the brackets it was taken out of)."""
    line = f"{indent}{before}{expr}{after}"
    if len(line) <= WIDTH and not split:
        return [line]
    inner = indent + "    "
    if _top_level(expr, (" for ",)):  # a generator expression stays on one line
        return [line]
    if _outermost(expr) == TERNARY:  # `a if c else b`: a line each, bracketed
        branch = _top_level(expr, (" if ",))[0]
        orelse = _top_level(expr, (" else ",))[0]
        return ([f"{indent}{before}("]
                + _wrap_expr(expr[:branch], inner, "", "")
                + _wrap_expr(expr[branch + 4:orelse], inner, "if ", "")
                + _wrap_expr(expr[orelse + 6:], inner, "else ", "")
                + [f"{indent}){after}"])
    ops = _operators(expr)
    if ops:  # a sum or a product: bracketed, a line before each of its outermost operators
        terms, last = [], 0
        for k in ops:
            terms.append(expr[last:k])
            last = k + 1
        terms.append(expr[last:])
        out = [f"{indent}{before}("]
        out.extend(_wrap_expr(terms[0].strip(), inner, "", ""))
        for t in terms[1:]:
            t = t.strip()
            op, rest = t[:1], t[1:].strip()
            out.extend(_wrap_expr(rest, inner, f"{op} ", ""))
        out.append(f"{indent}){after}")
        return out
    items = _split_top(expr)
    if tuples and len(items) > 1 and (before.startswith("return ") or before.endswith(" = ")):
        plain = _wrap_expr(expr, indent, before, after, tuples=False)
        if all(len(x) <= WIDTH for x in plain):
            return plain
        # a tuple (the outputs returned) its last item cannot fit: one item per line
        out = [f"{indent}{before}("]
        for a in items:
            out.extend(_wrap_expr(a, inner, "", ","))
        out.append(f"{indent}){after}")
        return out
    if expr.startswith("[") and expr.endswith("]") and _split_top(expr) == [expr]:
        # a list (torch.cat's operands): one item per line; a comprehension (the attentions
        # of cache_sites()) takes no trailing comma
        comma = "" if _top_level(expr[1:-1], (" for ",)) else ","
        out = [f"{indent}{before}["]
        for a in _split_top(expr[1:-1]):
            out.extend(_wrap_expr(a, inner, "", comma))
        out.append(f"{indent}]{after}")
        return out
    attr = re.search(r"(\.[A-Za-z_]\w*)+$", expr)
    if attr and expr[:attr.start()].endswith(")"):
        # `f(...).mT`: the call is wrapped, the attributes follow its closing bracket
        return _wrap_expr(expr[:attr.start()], indent, before, attr.group() + after)
    index = re.search(r"\[[^\[\]()]*\]$", expr)
    if index and expr[:index.start()].endswith(")"):
        # `f(...)[start:]`: the call is wrapped, the subscript follows its closing bracket
        return _wrap_expr(expr[:index.start()], indent, before, index.group() + after)
    if expr.endswith(")"):
        depth, start = 0, None
        for k in range(len(expr) - 1, -1, -1):
            ch = expr[k]
            if ch in ")]":
                depth += 1
            elif ch in "([":
                depth -= 1
                if depth == 0:
                    start = k
                    break
        if start == 0 and (_outermost(expr[1:-1]) == TERNARY or _operators(expr[1:-1])):
            # a bracketed sum or conditional: split, it brings its brackets back
            return _wrap_expr(expr[1:-1], indent, before, after, split=True)
        links = _chain(expr)
        if start is not None and len(links) > 1 and \
                len(f"{indent}{before}{expr[:start + 1]}") > WIDTH:
            # `f(...).unflatten(...).movedim(...)` too long to open its last call: one link
            # of the chain per line, bracketed
            out = [f"{indent}{before}("]
            for link in links:
                out.extend(_wrap_expr(link, inner, "", ""))
            out.append(f"{indent}){after}")
            return out
        if start is not None:
            is_call = start > 0 and (expr[start - 1].isalnum() or expr[start - 1] in "_])")
            args = _split_top(expr[start + 1:-1]) if is_call else [expr[start + 1:-1]]
            # a generator, the call's only argument, takes no trailing comma
            alone = len(args) == 1 and _top_level(args[0], (" for ",))
            comma = "," if is_call and not alone else ""
            out = [f"{indent}{before}{expr[:start + 1]}"]
            for a in args:
                out.extend(_wrap_expr(a, inner, "", comma))
            out.append(f"{indent}){after}")
            return out
    return [line]


# where a sum or a product too long for a line is split (`//` never is)
SPLIT_AT = {SUM: (" + ", " - "), PRODUCT: (" @ ", " * ", " / ", " % ")}


def _operators(expr: str) -> list[int]:
    """Where a sum or a product is split: the positions of its outermost operators."""
    level = _outermost(expr)
    return _top_level(expr, SPLIT_AT[level]) if level in SPLIT_AT else []


def _outermost(code: str) -> int | None:
    """The precedence of an expression's outermost operator; None for code that is not an
    expression (`def f(x, y)`)."""
    try:
        return precedence(code)
    except SyntaxError:
        return None


def _chain(expr: str) -> list[str]:
    """`f(x).g(y).h` -> [`f(x)`, `.g(y)`, `.h`]: the links of a method chain, split at each
    `.` that follows a closing bracket outside any bracket."""
    links, depth, last = [], 0, 0
    for k, ch in enumerate(expr):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "." and depth == 0 and k > 0 and expr[k - 1] in ")]":
            links.append(expr[last:k])
            last = k
    return links + [expr[last:]]


@dataclass
class ParamView:
    attr: str
    shape: str  # python tuple expression
    comment: str
    init: str  # "normal" | "zeros" | "ones"

    @property
    def text(self) -> str:
        """The declaration inside `__init__`, its comment above it when the line is long."""
        return "\n".join(wrap(f"self.{self.attr} = nn.Parameter(torch.empty{self.shape})",
                               self.comment, " " * 8))


@dataclass
class SubView:
    attr: str
    ctor: str

    @property
    def text(self) -> str:
        """`attr = ctor` inside `__init__`, wrapped at the line width."""
        return "\n".join(wrap(f"{self.attr} = {self.ctor}", "", " " * 8))


@dataclass
class ClassView:
    name: str
    doc: list[str]
    init_args: list[str]
    init_lines: list[str]
    params: list[ParamView]
    subs: list[SubView]
    forward_args: str
    body: list[Line]
    kind: str = "module"  # "module" | "layer" | "model"
    extra_methods: list[str] = field(default_factory=list)

    @property
    def init_def(self) -> str:
        return "\n".join(def_lines("__init__", ", ".join(["self"] + self.init_args), 4))

    @property
    def forward_def(self) -> str:
        method = getattr(self, "method_name", "forward")
        return "\n".join(def_lines(method, self.forward_args, 4))


def def_lines(name: str, args: str, indent: int) -> list[str]:
    """`def name(args):` at `indent` columns; one argument per line when it is too long."""
    return _wrap_expr(f"def {name}({args})", " " * indent, "", ":")


def fit(line: str, indent: int = 4) -> list[str]:
    """One line of a method written out whole (`def ...:`, `return ...`), where it will be
    `indent` columns further in, wrapped to the line width: a def one argument per line."""
    pad = len(line) - len(line.lstrip())
    code = line.strip()
    at = " " * (indent + pad)
    if code.startswith("def ") and code.endswith(":"):
        lines = _wrap_expr(code[:-1], at, "", ":")
    else:
        lines = wrap(code, "", at)
    return [x[indent:] for x in lines]


@dataclass(frozen=True)
class _Code:
    """A Python expression among the values of a literal (`self.config.V`)."""

    text: str


def _flat(v) -> str:
    """A JSON-able value as a Python literal on one line (strings double-quoted), with any
    `_Code` in it as its expression."""
    if isinstance(v, _Code):
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

    def __init__(self, expr, layout, type_, raw_lo=None, producer=None, named=False):
        self.expr = expr
        self.layout = layout
        self.type = type_
        self.raw_lo = raw_lo  # ints held 0-based: the math value is expr + raw_lo
        self.producer = producer
        self.named = named
        self.stored = None


class Body:
    """Lowers a list of equations to Python lines inside one `forward`."""

    def __init__(self, gen: Generator, sym: dict[str, str], device: str, namer: Namer,
                 self_attr: dict[str, str], spec_file: str):
        self.gen = gen
        self.sym = dict(sym)
        self.device = device
        self.namer = namer
        self.vals: dict[str, _Val] = {}  # IR name -> its value where the equations are now
        # every value by its Python name, unique per value: a spec name may be defined again
        # (a family z_i, then z = Concat(z_1, ..., z_A)), and `{{name}}` in exprs is this one
        self.by_py: dict[str, _Val] = {}
        self.self_attr = self_attr  # IR param/instance name -> `self.x`
        self.spec_file = spec_file
        self.pending: list[tuple[str, Eqn]] = []  # (python name, eqn) in order
        self.exprs: dict[str, str] = {}  # python name -> expression text with {{deps}}
        self.deps: dict[str, list[str]] = {}
        self.comments: dict[str, str] = {}
        self.materialized: set[str] = set()
        self.real_dtype = "torch.get_default_dtype()"  # what integers become where reals go
        self.start: str | None = None  # the model's body: the first new position (step())
        # temporaries the spec names otherwise (a module's result is the module's): the
        # name they take here, before ident; other temporaries are numbered (`%7` -> t7)
        self.spec_names: dict[str, str] = {}

    # -- values
    def define_input(self, name: str, t: TensorType, layout: Layout, raw_lo=None) -> str:
        py = self.namer(name)
        self.vals[name] = self.by_py[py] = _Val(py, layout, t, raw_lo=raw_lo, named=True)
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
            expr = self.self_attr[o.name]
            t = p.type
            fam = t.family is not None
            if o.member is not None and not fam:
                raise Unsupported(f"`{o}`: member of a parameter that is not a family")
            if fam and for_eqn.family is None and not o.whole_family:
                axis = -2 if len(t.shape) >= 2 else 0
                expr = f"{expr}.select({axis}, {self._member_index(o.member)})"
                fam = False
            expr = self._slice_dynamic(expr, t)
            raw = None
            if fam and len(t.shape) >= 2:
                raw = expr
                expr = f"{expr}.movedim(-2, 0)"
            v = _Val(expr, Layout(False, fam, len(t.shape)), t.member() if fam else t)
            v.stored = raw  # the family of matrices as stored: (..., A, last)
            return v
        v = self.vals.get(o.name)
        if v is None:
            raise Unsupported(f"value `{o.name}` is not available here")
        if o.member is not None and v.layout.fam and for_eqn.family is None:
            k = self._member_index(o.member)
            return _Val(f"{self.ref(o.name)}.select({-(v.layout.rank or 0) - 1}, {k})",
                        Layout(v.layout.lead, False, v.layout.rank), v.type, raw_lo=v.raw_lo)
        return _Val(self.ref(o.name), v.layout, v.type, raw_lo=v.raw_lo, producer=v.producer,
                    named=v.named)

    def _member_index(self, member) -> str:
        if isinstance(member, str):
            raise Unsupported("a family member indexed by a variable outside its family")
        return f"{py_poly(member, self.sym)} - 1"

    def _slice_dynamic(self, expr: str, t: TensorType) -> str:
        """A parameter sized by the context length is used up to the run's length."""
        cuts = []
        dyn = False
        for d in t.shape:
            if isinstance(d, Poly) and (d.symbols() & self.gen.dynamic):
                end = py_poly(d, self.sym)
                if self.gen.by_position(d):  # rows start..start+T of a table of positions
                    if self.start is None:
                        raise Unsupported("a parameter indexed by position inside the layers")
                    cuts.append(f"{self.start}:{self.start} + {end}")
                else:
                    cuts.append(f":{end}")
                dyn = True
            else:
                cuts.append(":")
        if not dyn:
            return expr
        while cuts and cuts[-1] == ":":
            cuts.pop()
        return f"{expr}[{', '.join(cuts)}]"

    def ref(self, name: str) -> str:
        """The value IR name `name` stands for here, as a placeholder for its expression
        (written in if it is used once, else its Python name): see `emit`."""
        return "{{" + self.vals[name].expr + "}}"

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
        out_type = e.outs[0].type
        member_t = out_type.member() if out_type.family is not None else out_type
        out_rank = _rank(member_t)
        lead = any(v.layout.lead for v in ins)
        raw_lo = None  # the result held 0-based: see _Val
        if e.op == "layers":
            exprs = [f"__layers__{e.attrs['index']}"] * len(e.outs)
            layouts = [Layout(True, False, _rank(o.type)) for o in e.outs]
        elif e.op == "call":
            exprs = self.gen.lower_call(self, e, ins) * len(e.outs)  # one call, its results
            fam = eqn_has_axis(e, [v.layout.fam for v in ins], self.gen.functions)
            layouts = [Layout(lead or any(v.layout.lead for v in ins), fam,
                              _rank(o.type.member() if o.type.family is not None else o.type))
                       for o in e.outs]
        else:
            lowering = LOWER.get(e.op)
            if lowering is None:
                raise Unsupported(f"the torch backend has no lowering for `{e.op}`")
            if e.op not in ("index", "invperm", "lookup"):
                for v in ins:  # ids are held 0-based; arithmetic sees the spec's values
                    if v.raw_lo is not None:
                        v.expr, v.raw_lo = _math(self, v), None
            fam = eqn_has_axis(e, [v.layout.fam for v in ins], self.gen.functions)
            exprs = [lowering(self, e, ins, Layout(lead, fam, out_rank))]
            layouts = [Layout(lead, fam, out_rank)]
            if e.op in POSITIONS:
                raw_lo = Poly.const(1)
            elif e.op == "index":  # entries of ids held 0-based are held 0-based
                raw_lo = ins[0].raw_lo
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
                py, layout, out.type.member() if out.type.family is not None else out.type,
                raw_lo=raw_lo, producer=e, named=not out.name.startswith("%"))
            self.exprs[py] = expr
            self.deps[py] = REF.findall(expr)
            if e.op == "layers":  # the values it takes (model parameters are attributes)
                self.deps[py] = [self.vals[o.name].expr for o in e.ins if o.name in self.vals]
            self.comments[py] = self.comment(out.type, layout, e)
            self.pending.append((py, e))
        if len(e.outs) > 1:
            # several results come from one call: one line, tuple target
            names = [self.vals[o.name].expr for o in e.outs]
            for py in names:
                self.exprs[py] = "__tuple__"
            self.exprs[names[0]] = exprs[0]
            self.tuples = getattr(self, "tuples", {})
            self.tuples[names[0]] = names

    def comment(self, t: TensorType, layout: Layout, e: Eqn) -> str:
        names = self.gen.comment_sym
        if self.gen.in_module and len(self.gen.run_length) > 1:
            names = _Names()  # which length a module's own n is depends on the use
        dims = []
        if layout.lead:
            dims.append("*" if self.gen.in_module else "B")
        if layout.fam:
            fam = t.family if t.family is not None else (e.family[1] if e.family else None)
            dims.append(py_poly(fam, names) if fam is not None else "A")
        for d in (t.member().shape if t.family is not None else t.shape):
            dims.append("..." if isinstance(d, Ell) else py_poly(d, names).replace(" ", ""))
        shape = "(" + ", ".join(dims) + ")" if dims else "()"
        where = f"{safe_name(e.span.file)}:{e.span.line}" if e.span else ""
        if e.op == "mask" and not e.ins:  # no tensor: attention reads what it means
            meaning = "Mask^AR: attention runs is_causal" if e.attrs["causal"] else \
                "Mask^BD: attention runs without a mask"
            return f"{meaning}  {where}".strip()
        return f"{shape}  {where}".strip()

    # -- emission
    def emit(self, outputs: list[str], force: set[str] = frozenset()) -> list[Line]:
        """Lines for the values needed by `outputs` (IR names); single-use temporaries are
        inlined into their one consumer."""
        want = [self.vals[o].expr for o in outputs if o in self.vals]
        forced = {self.vals[f].expr for f in force if f in self.vals}
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
        in_tuple |= {py for py, x in self.exprs.items() if x.startswith("__layers__")}
        materialize = set()
        for py in live:
            if py in in_tuple or uses.get(py, 0) != 1 or self.by_py[py].named or py in forced:
                materialize.add(py)
        for e2 in (e for _, e in self.pending if e.op == "layers"):
            for o in e2.ins:  # what the layers take is computed once, before them
                if o.name in self.vals and self.vals[o.name].expr in live:
                    materialize.add(self.vals[o.name].expr)
        self.materialized = materialize
        lines: list[Line] = []
        done: set[str] = set()
        for py, e in self.pending:
            if py not in live or py not in materialize or py in done:
                continue
            if self.exprs[py] == "__tuple__":
                continue
            if self.exprs[py].startswith("__layers__"):
                lines.extend(self.gen.loop_lines(self, e, materialize))
                done.update(self.vals[o.name].expr for o in e.outs)
                continue
            expr = self._inline(py, materialize)
            if py in tuples:
                targets = ", ".join(tuples[py])
                lines.append(Line(f"{targets} = {expr}", self.comments[py]))
                done.update(tuples[py])
            else:
                lines.append(Line(f"{py} = {expr}", self.comments[py]))
            done.add(py)
        return lines

    def _inline(self, py: str, materialize: set[str]) -> str:
        """The expression of `py` with the single-use temporaries it reads written in,
        each bracketed where its place needs it (see `precedence`)."""
        expr = self.exprs[py]
        wanted = iter(slot_precedences(expr))

        def sub(m):
            name, level = m.group(1), next(wanted)
            if name in materialize or name not in self.exprs:
                return name
            return operand(self._inline(name, materialize), level)
        return REF.sub(sub, expr)

    def result(self, name: str) -> str:
        """The expression for an output after `emit`: its line's name, or inlined."""
        v = self.vals[name]
        if v.expr in self.materialized or v.expr not in self.exprs:
            return v.expr
        return self._inline(v.expr, self.materialized)


def _resolve_refs(code: str) -> str:
    """`code` with each `{{value}}` replaced by that value's Python name."""
    return REF.sub(r"\1", code)


# ---------------------------------------------------------------- the op table


def _align(b: Body, v: _Val, out: Layout) -> str:
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


def _binary(symbol: str):
    def lower(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
        x, y = (_align(b, v, out) for v in ins)
        return infix(x, symbol, y)
    return lower


def _math(b: Body, v: _Val) -> str:
    """An integer operand as its 1-based (math) value."""
    if v.raw_lo is not None and not (v.raw_lo.is_const() and v.raw_lo.const_value() == 0):
        return f"({v.expr} + {py_poly(v.raw_lo, b.sym)})"
    return v.expr


def _shifted(b: Body, expr: str, shift: Poly) -> str:
    """`expr + shift` for an integer expression, folded where `expr` is a literal."""
    if shift.is_const():
        k = shift.const_value()
        if k == 0:
            return expr
        if "{{" not in expr and re.fullmatch(r"-?\d+", expr):
            return str(int(expr) + int(k))
        return f"{operand(expr, SUM)} + {py_poly(shift, b.sym)}" if k > 0 else \
            f"{operand(expr, SUM)} - {py_poly(-shift, b.sym)}"
    return f"{operand(expr, SUM)} + {py_poly(shift, b.sym)}"


def _rows(b: Body, v: _Val, first: Poly) -> str:
    """Integer ids as 0-based positions in a table whose first entry is id `first`: an
    index (first = 1), a row of W in a lookup (OneHot(x) @ W over first..last)."""
    if v.raw_lo is not None:
        return _shifted(b, v.expr, v.raw_lo - first)
    return _shifted(b, v.expr, -first)


def _spec_value(b: Body, v: _Val, expr: str) -> str:
    """A result as the spec's value: integers held 0-based get their offset back where
    they leave the function (a return, a layer's argument)."""
    if v.raw_lo is None:
        return expr
    return _shifted(b, expr, v.raw_lo)


def _int_binary(symbol: str):
    def lower(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
        x, y = (_align(b, _Val(_math(b, v), v.layout, v.type), out) for v in ins)
        return infix(x, symbol, y)
    return lower


def _func(fn: str):
    def lower(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
        (x,) = ins
        if x.layout == Layout(False, False, 0) and x.expr[:1] not in "{":
            return f"math.{fn}({x.expr})"
        return f"torch.{fn}({x.expr})"
    return lower


def _minmax(fn: str, clamp: str):
    def lower(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
        x, y = ins
        if x.layout.rank == 0 and not x.layout.lead and "{{" not in x.expr:
            return f"{y.expr}.clamp({clamp}={x.expr})"
        if y.layout.rank == 0 and not y.layout.lead and "{{" not in y.expr:
            return f"{x.expr}.clamp({clamp}={y.expr})"
        return f"torch.{fn}({_align(b, x, out)}, {_align(b, y, out)})"
    return lower


def _reduce(method: str):
    def lower(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
        x = operand(ins[0].expr, PRIMARY)
        if ins[0].type.dtype != "real":  # a sum, mean or max of integers is real
            x = f"{x}.to({b.real_dtype})"
        return f"{x}.{method}(-1, keepdim=True)"
    return lower


def _matmul(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    x, y = ins
    if x.type.dtype != "real" and y.type.dtype == "real":
        x = _Val(f"{x.expr}.to({y.expr}.dtype)", x.layout, x.type, producer=x.producer)
    elif y.type.dtype != "real" and x.type.dtype == "real":
        y = _Val(f"{y.expr}.to({x.expr}.dtype)", y.layout, y.type, producer=y.producer)
    if y.stored is not None and not x.layout.fam and y.layout.rank == 2 and x.layout.rank:
        # X @ W_i for every member i at once: one product with the (H, A*D) view, then the
        # family axis moved in front of the member's rows
        fam = e.family[1] if e.family else y.type.family
        size = py_poly(fam, b.sym) if fam is not None else "-1"
        prod = f"project({x.expr}, {y.stored}.flatten(-2)).unflatten(-1, ({size}, -1))"
        r = x.layout.rank
        return prod if r == 1 else f"{prod}.movedim(-2, {-r - 1})"
    xs = _align(b, x, out) if x.layout.rank and x.layout.rank >= 2 else x.expr
    weight = _weight(b, e, y)
    if weight is not None and x.layout.rank != 0:
        # activations times a weight matrix (or its transpose): see project in the template
        return f"project({xs}, {weight})"
    ys = _align(b, y, out) if y.layout.rank and y.layout.rank >= 2 else y.expr
    if y.layout.rank == 1 and (y.layout.lead or y.layout.fam):
        # a vector with leading (batch or member) axes: torch would read it as a matrix
        if x.layout.rank == 1:
            return f"({infix(xs, '*', ys)}).sum(-1)"
        return f"({infix(xs, '@', operand(ys, PRIMARY) + '.unsqueeze(-1)')}).squeeze(-1)"
    return infix(xs, "@", ys)


def _weight(b: Body, e: Eqn, y: _Val) -> str | None:
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
            return f"{w.expr}.mT"
    return None


def _lookup(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    """OneHot(ids) @ W as rows of W (lowering/lookups.py): no V-wide one-hot is built;
    the table's first row is id `lo`."""
    ids, table = ins
    return f"embedding({_rows(b, ids, e.attrs['lo'])}, {table.expr})"


def _transpose(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    x = operand(ins[0].expr, PRIMARY)
    if not ins[0].layout.lead and not ins[0].layout.fam and ins[0].layout.rank == 2:
        return f"{x}.T"
    return f"{x}.mT"


def _concat(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    counts = e.attrs.get("counts") or [None] * len(ins)
    if len(ins) == 1 and counts[0] is not None:
        r = ins[0].layout.rank
        if r is None:
            # a family of `...`-shaped members: the family axis is the one before the last
            return f"{ins[0].expr}.movedim(-2, -2).flatten(-2)"
        return f"{ins[0].expr}.movedim({-r - 1}, -2).flatten(-2)"
    if any(c is not None for c in counts):
        raise Unsupported("concat of a family together with other values")
    return f"torch.cat([{', '.join(_joined(b, ins, out))}], dim=-1)"


def _vconcat(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    r = out.rank or 1
    return f"torch.cat([{', '.join(_joined(b, ins, out))}], dim={-r})"


def _joined(b: Body, ins: list[_Val], out: Layout) -> list[str]:
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
        lead = f"{operand(parts[full[0]], PRIMARY)}.shape[:-{r}]"
    else:  # each lacks some leading axis: their union
        lead = "torch.broadcast_shapes(" + ", ".join(
            f"{operand(p, PRIMARY)}.shape[:-{r}]" for p, v in zip(parts, ins)
            if v.layout.lead or v.layout.fam) + ")"
    for k in short:
        parts[k] = f"{operand(parts[k], PRIMARY)}.expand(*{lead}, {', '.join(['-1'] * r)})"
    return parts


def _zero_based(b: Body, v: _Val) -> str:
    return _rows(b, v, Poly.const(1))


def _index(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    base, rest = ins[0], ins[1:]
    kinds = e.attrs["kinds"]
    items: list[str] = []
    k = 0
    tensors = []
    for kind in kinds:
        if kind == ":":
            items.append(":")
        elif kind == "range":
            lo, hi = rest[k], rest[k + 1]
            k += 2
            items.append(f"{_zero_based(b, lo)}:{_math(b, hi)}")
        else:
            idx = rest[k]
            k += 1
            zb = _zero_based(b, idx)
            if kind == "gather":
                tensors.append((idx, zb))
            elif idx.layout.lead:
                tensors.append((idx, zb))
            items.append(zb)
    if any(kind == "gather" for kind in kinds):
        if any(kind != "gather" for kind in kinds):
            raise Unsupported("an index by a tensor mixed with `:` or a single position")
        # every axis indexed by a tensor: the leading axes of the base and of the indices
        # broadcast at run time
        return f"take({base.expr}, {len(kinds)}, {out.rank}, {', '.join(items)})"
    if tensors:
        if b.gen.in_module:
            raise Unsupported("a batched single-position index inside a module")
        # one position per sequence (BERT's j_masked): index each batch row
        nb = max(len(v.type.shape) for v, _ in tensors)
        batch = f"torch.arange({base.expr}.shape[0], device={base.expr}.device)"
        batch = batch + (".view(-1" + ", 1" * nb + ")" if nb else "")
        return f"{base.expr}[{batch}, {', '.join(items)}]"
    prefix = "..., " if (base.layout.lead or base.layout.fam or b.gen.in_module) else ""
    return f"{base.expr}[{prefix}{', '.join(items)}]"


def _iota(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    size = py_poly(e.attrs["size"], b.sym)
    rank, axis = e.attrs["rank"], e.attrs["axis"]
    view = ", ".join("-1" if k == axis else "1" for k in range(rank))
    return f"torch.arange(1, {size} + 1, device={b.device}).view({view})"


def _broadcast_to(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    x = ins[0]
    shape = ", ".join(py_poly(d, b.sym) for d in e.attrs["shape"])
    if x.layout == Layout(False, False, 0) and "{{" not in x.expr:
        return f"torch.full(({shape},), {x.expr}, device={b.device})"
    if x.layout.lead or x.layout.fam:
        r = x.layout.rank or 0
        return f"{x.expr}.expand(*{x.expr}.shape[:{-r}], {shape})" if r else x.expr
    return f"torch.broadcast_to({x.expr}, ({shape},))"


def _select(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    c, x, y = (_align(b, v, out) for v in ins)
    return f"torch.where({c}, {x}, {y})"


def _cond(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    # a guard is static: sizes in it are the configuration's, never this call's lengths
    sym = b.sym if b.gen.in_module else {**b.sym, **b.gen.fwd_sym}
    guard = b.gen.guard_py(e.attrs["guard"], sym)
    return f"{operand(ins[0].expr, OR)} if {operand(guard, OR)} else " \
        f"{operand(ins[1].expr, TERNARY)}"


def _neg(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    return f"-{operand(ins[0].expr, UNARY)}"


def _not(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    x = ins[0]
    if x.layout == Layout(False, False, 0):
        # a condition on sizes alone is a Python bool, whose ~ is an integer (~True == -2)
        return f"not {operand(x.expr, NOT)}"
    return f"~{operand(x.expr, UNARY)}"


def _pow(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    x, y = ins
    if x.layout == Layout(False, False, 0) and "{{" not in x.expr:
        return f"torch.pow({x.expr}, {y.expr})"
    return f"torch.pow({_align(b, x, out)}, {_align(b, y, out)})"


# Positions are computed 0-based and held so (raw_lo = 1): an index or a row lookup uses
# them as they are, arithmetic and returns add the 1 back.
def _invperm(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    return f"torch.argsort({_zero_based(b, ins[0])}, dim=-1)"


def _argmax(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    return f"{operand(ins[0].expr, PRIMARY)}.argmax(-1)"


def _argsort(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    return f"torch.argsort({ins[0].expr}, dim=-1, stable=True)"


def _members(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    """An axis of the operand's own as the family axis, just before the others."""
    x, r = ins[0].expr, ins[0].layout.rank
    k = e.attrs["axis"]
    return x if k == 0 else f"{operand(x, PRIMARY)}.movedim({k - r}, {-r})"


def _mask(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    """A mask by meaning (lowering/masks.py): at run time only its bias, if it has one;
    attention reads what it means from the lowering, not from the value."""
    return ins[0].expr if ins else "None"


def _mask_tensor(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    rows_d, cols_d = e.outs[0].type.shape[-2:]
    rows, cols = py_poly(rows_d, b.sym), py_poly(cols_d, b.sym)
    if b.gen.by_position(cols_d) and b.start is not None:
        cols = f"{b.start} + {cols}"  # step(): the new rows of the table, every column
    if e.attrs["causal"]:
        table = f"causal_mask({rows}, {cols}, {b.device})"
    else:
        table = f"torch.zeros({rows}, {cols}, device={b.device})"
    return infix(ins[0].expr, "+", table) if e.attrs["bias"] else table


def _stopgrad(b: Body, e: Eqn, ins: list[_Val], out: Layout) -> str:
    return f"{ins[0].expr}.detach()"


LOWER = {
    "add": _binary("+"), "sub": _binary("-"), "mul": _binary("*"), "div": _binary("/"),
    "neg": _neg, "max": _minmax("maximum", "min"), "min": _minmax("minimum", "max"),
    "pow": _pow, "mod": _int_binary("%"),
    "exp": _func("exp"), "log": _func("log"), "sqrt": _func("sqrt"), "tanh": _func("tanh"),
    "sigmoid": _func("sigmoid"), "erf": _func("erf"), "sin": _func("sin"), "cos": _func("cos"),
    "abs": _func("abs"),
    "eq": _int_binary("=="), "ne": _int_binary("!="), "lt": _int_binary("<"),
    "le": _int_binary("<="), "gt": _int_binary(">"), "ge": _int_binary(">="),
    "and": _binary("&"), "or": _binary("|"), "not": _not, "select": _select, "cond": _cond,
    "sum": _reduce("sum"), "mean": _reduce("mean"), "amax": _reduce("amax"),
    "matmul": _matmul, "transpose": _transpose, "concat": _concat, "vconcat": _vconcat,
    "index": _index, "iota": _iota, "broadcast_to": _broadcast_to, "invperm": _invperm,
    "argmax": _argmax, "argsort": _argsort, "stopgrad": _stopgrad, "members": _members,
    "lookup": _lookup,
    "mask": _mask, "mask_tensor": _mask_tensor,
}
POSITIONS = {"argmax", "argsort", "invperm"}  # results held 0-based (raw_lo = 1)


# ---------------------------------------------------------------- builtin modules


def _no_value(fn: ir.Function, name: str) -> bool:
    """Whether input `name` of `fn` is a mask taken by meaning alone (lowering/masks.py),
    which has no value at run time: neither forward nor its calls pass it."""
    kind = kind_of_input(fn, name)
    return kind is not None and not kind.bias


def _sdpa(b: Body, fn: ir.Function, inputs: list[str]) -> list[Line]:
    """Scaled dot-product attention, with the mask the lowering decided the calls pass:
    causal runs as is_causal=True, none as no mask, a bias (plus causal) as attn_mask; a
    mask causal at some uses and none at others reads the flag each use was built with."""
    q, k, v, mask = inputs
    kind = kind_of_input(fn, intrinsic(fn).mask_input)
    lines = []
    if b.gen.incremental is not None:
        lines = [Line("if self.cache is not None:", "step(): the earlier positions' keys first"),
                 Line("    if self.cache:"),
                 Line(f"        {k} = torch.cat([self.cache[0], {k}], dim=-2)"),
                 Line(f"        {v} = torch.cat([self.cache[1], {v}], dim=-2)"),
                 Line(f"    self.cache = ({k}, {v})")]
    table = f"causal_mask({q}.shape[-2], {k}.shape[-2], {q}.device).to({q}.dtype)"
    if kind is None:
        return lines + [Line(f"return sdpa({q}, {k}, {v}, attn_mask={mask})",
                             "scale 1/sqrt(d) is sdpa's default")]
    if kind.causal is False:
        return lines + [Line(f"return sdpa({q}, {k}, {v})", "no mask")]
    if kind.bias:
        return lines + [Line(f"{mask} = {mask} + {table}", "the bias plus Mask^AR"),
                        Line(f"return sdpa({q}, {k}, {v}, attn_mask={mask})")]
    causal = [Line(f"return sdpa({q}, {k}, {v}, is_causal=True)", "Mask^AR")]
    if b.gen.incremental is not None:
        causal = [
            Line(f"if {q}.shape[-2] == {k}.shape[-2]:"),
            Line(f"    return sdpa({q}, {k}, {v}, is_causal=True)", "Mask^AR"),
            Line(f"if {q}.shape[-2] == 1:", "the newest position sees every key"),
            Line(f"    return sdpa({q}, {k}, {v})"),
            Line(f"{mask} = {table}", "Mask^AR aligned to the keys' end"),
            Line(f"return sdpa({q}, {k}, {v}, attn_mask={mask})")]
    if kind.causal is None:  # PER_USE
        flag = b.gen.mask_flags(fn)[intrinsic(fn).mask_input]
        return lines + [Line(f"if self.{flag}:", "this use is given Mask^AR")] + \
            [Line("    " + x.code, x.comment) for x in causal] + \
            [Line(f"return sdpa({q}, {k}, {v})", "this use is given Mask^BD: no mask")]
    return lines + causal


def _layer_norm(b: Body, fn: ir.Function, inputs: list[str]) -> list[Line]:
    (x,) = inputs
    return [Line(f"return layer_norm({x}, self.gamma.shape, self.gamma, self.beta, self.eps)")]


def _softmax(b: Body, fn: ir.Function, inputs: list[str]) -> list[Line]:
    return [Line(f"return torch.softmax({inputs[0]}, dim=-1)")]


def _gelu(b: Body, fn: ir.Function, inputs: list[str]) -> list[Line]:
    return [Line(f"return gelu({inputs[0]}, approximate={intrinsic(fn).approximate!r})")]


# Intrinsics (compiler/elaborate/intrinsics.py) whose forward is one fused torch call, by
# kind; None: the module's own equations. Their equations stay the docstring.
FUSED = {
    "attention": _sdpa, "layer_norm": _layer_norm, "softmax": _softmax, "gelu": _gelu,
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
    def __init__(self, spec, cfg, values: dict, sources, preset: str | None):
        self.spec = spec
        self.cfg = cfg  # the symbolic configuration: IR with sizes as symbols
        # the IR with the shared lowering's operations (compiler/lowering)
        self.model, self.functions = prepare(cfg.model, cfg.functions)
        self.values = values  # hyperparameter -> number (the compiled preset)
        self.sources = sources
        self.preset = preset
        self.param_types: dict[str, ir.Param] = {}
        self.in_module = False
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

    # -- helpers for lowering
    def by_position(self, d) -> bool:
        """Whether a size is the generated length of an incremental model: a table or a
        parameter along it is read from the first new position on."""
        return self.incremental is not None and isinstance(d, Poly) and \
            self.incremental.length in d.symbols()

    def is_kind(self, e: Eqn, kind: str) -> bool:
        """Whether `e` calls an intrinsic of this kind."""
        return e.op == "call" and is_kind(self.functions.get(e.attrs["module"]), kind)

    def guard_py(self, text: str, sym: dict[str, str]) -> str:
        """A guard (`l is odd`, `not (E != H)`) as Python, each name as `sym` spells it
        (`self.l`, a hyperparameter's constant): printed from its condition's tree."""
        return guards.python(text, sym)

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

    def _symbol_sources(self, fn: ir.Function, namer: Namer) -> dict[str, str]:
        """Each size symbol of a module, read off its inputs' shapes where possible."""
        sym: dict[str, str] = {}
        for v in fn.inputs:
            t = v.type
            member = t.member() if t.family is not None else t
            if any(isinstance(d, Ell) for d in member.shape):
                dims = [d for d in member.shape if not isinstance(d, Ell)]
                offset = len(dims)
                for k, d in enumerate(dims):
                    if isinstance(d, Poly) and len(d.symbols()) == 1 and d == Poly.sym(
                            next(iter(d.symbols()))):
                        sym.setdefault(next(iter(d.symbols())),
                                       f"{namer(v.name)}.shape[{k - offset}]")
                continue
            r = len(member.shape)
            for k, d in enumerate(member.shape):
                if isinstance(d, Poly) and len(d.terms) == 1 and d == Poly.sym(
                        next(iter(d.symbols()))) if d.symbols() else False:
                    sym.setdefault(next(iter(d.symbols())), f"{namer(v.name)}.shape[{k - r}]")
            if t.family is not None and isinstance(t.family, Poly) and t.family.symbols():
                s = next(iter(t.family.symbols()))
                sym.setdefault(s, f"{namer(v.name)}.shape[{-r - 1}]")
        return sym

    def _module_view(self, fn: ir.Function, cls: str) -> ClassView:
        namer = Namer()
        sym = self._symbol_sources(fn, namer)
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
        device = (f"{namer(fn.inputs[0].name)}.device" if fn.inputs else "device")
        self.in_module = True
        body = Body(self, sym, device, namer, self_attr, fn.span.file if fn.span else "")
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
            results = []
            for o, declared in zip(outs, fn.outputs):
                r = _spec_value(body, body.vals[o], body.result(o)) if o in body.vals \
                    else "None"
                if not fn.inputs and declared.type.dtype == "real":
                    # a table computed from sizes alone, in the caller's precision
                    if not _resolve_refs(r).isidentifier():
                        table = body.namer.alias(f"%table{len(results)}", "table")
                        lines.append(Line(f"{table} = {r}"))
                        r = table
                    r = f"{r}.to(dtype=dtype)"
                elif o in body.vals and declared.type.dtype == "real" and \
                        body.vals[o].type.dtype != "real":
                    r = f"{operand(r, PRIMARY)}.to(torch.get_default_dtype())"
                results.append(r)
            lines.append(Line(f"return {', '.join(results)}"))
            self._resolve_line_refs(body, lines)
        self.in_module = False
        kw_part = []
        if forward_kw:
            kw_part = [f"*, {', '.join(ident(s) for s in forward_kw)}"
                       + ("" if fn.inputs else ", device=None"
                          + ("" if fused_forward(fn) is not None else ", dtype=None"))]
        fwd = ", ".join(["self"] + passed + kw_part)
        init_lines = [f"self.{ident(s)} = {ident(s)}" for s in static]
        init_lines += [f"self.{flag} = {flag}  # this use is given Mask^AR (else Mask^BD)"
                       for flag in flags.values()]
        if is_kind(fn, "attention") and self.incremental is not None:
            init_lines.append("self.cache = None  # step(): keys and values, (B, A, P, D) each")
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

    def _resolve_line_refs(self, body: Body, lines: list[Line]) -> None:
        for line in lines:
            line.code = _resolve_refs(line.code)

    def _param_view(self, p: ir.Param, attr: str, sym: dict[str, str]) -> ParamView:
        dims = list(p.type.shape)
        if p.type.family is not None:
            dims = family_layout(dims, p.type.family)
        shape = "(" + ", ".join(py_poly(d, sym) for d in dims) + ("," if len(dims) == 1 else "") \
            + ")"
        init = p.init
        plain = _Names()
        what = f"{p.declared}: R[{', '.join(py_poly(d, plain) for d in p.type.shape)}]"
        if p.type.family is not None:
            what += f" for each of {py_poly(p.type.family, plain)}"
        return ParamView(attr, shape, what, init)

    def _ctor(self, e: Eqn, caller_sym: dict[str, str],
              caller_flags: dict[str, str] | None = None) -> str:
        fn = self.functions[e.attrs["module"]]
        cls = self.module_class(fn.name)
        static = self.static_symbols(fn)
        args = []
        for s in static:
            value = e.attrs["bindings"].get(s)
            if value is None:
                raise Unsupported(f"`{fn.name}`: size `{s}` is not bound at this use")
            if isinstance(value, float):
                args.append(f"{ident(s)}={value!r}")
            else:
                args.append(f"{ident(s)}={py_poly(value, caller_sym)}")
        for inp, flag in self.mask_flags(fn).items():
            given = e.attrs["masks"][inp]
            own = from_caller(given)  # the caller's own flag, or this use's kind
            value = f"self.{(caller_flags or {})[own]}" if own is not None \
                else str(MaskKind.of(given).causal)
            args.append(f"{flag}={value}")
        return f"{cls}({', '.join(args)})"

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

    def lower_call(self, b: Body, e: Eqn, ins: list[_Val]) -> list[str]:
        fn = self.functions[e.attrs["module"]]
        if is_kind(fn, "concat") and ins and ins[0].layout.rank is not None:
            r = ins[0].layout.rank
            return [f"{ins[0].expr}.movedim({-r - 1}, -2).flatten(-2)"]
        inst = e.attrs["instance"]
        target = b.self_attr.get(inst) or f"self.{ident(inst)}"
        args = []
        for v, inp in zip(ins, fn.inputs):
            expr = v.expr
            if _no_value(fn, inp.name):  # a mask by meaning alone: nothing to pass
                continue
            if v.raw_lo is not None:  # integers cross into modules as the spec's values
                expr = _shifted(b, v.expr, v.raw_lo)
            if e.family is not None and v.layout.lead and not v.layout.fam and \
                    v.layout.rank is not None:
                # a per-batch value into a per-member call: a unit axis where the members'
                # axis is, so the batch does not broadcast against the members
                expr = _unsq(operand(expr, PRIMARY), 1, -v.layout.rank - 1)
            if inp.type.dtype == "real" and v.type.dtype != "real" and "{{" in expr:
                # an integer argument where the module takes reals
                dt = b.real_dtype
                expr = f"{operand(expr, PRIMARY)}.to({dt})"
            args.append(expr)
        forward_kw = self.forward_hypers(fn)
        rows = self._table_axis(b, e, fn)
        if forward_kw:
            kw = []
            for name in forward_kw:
                value = e.attrs["bindings"][name]
                first = f"{b.start} + " if rows is not None and self.by_position(value) else ""
                kw.append(f"{ident(name)}={value!r}" if isinstance(value, float)
                          else f"{ident(name)}={first}{py_poly(value, b.sym)}")
            if not fn.inputs:
                kw.append(f"device={b.device}")
                if fused_forward(fn) is None:
                    kw.append(f"dtype={b.real_dtype}")
            args.extend(kw)
        if e.family is not None and has_params(fn, self.functions):
            raise Unsupported(f"`{fn.name}` has parameters but is used once per family member")
        call = f"{target}({', '.join(args)})"
        return [call if rows is None else f"{call}[{':, ' * rows}{b.start}:]"]

    def _table_axis(self, b: Body, e: Eqn, fn: ir.Function) -> int | None:
        """For a table computed from sizes along the generated length (positions, a banded
        mask) in an incremental model, the axis of its rows: it is made for start + T
        positions and read from row start. None for anything else (attention aligns a mask
        it reads by meaning to the keys itself)."""
        if fn.inputs or self.incremental is None:
            return None
        axis = next((k for k, d in enumerate(e.outs[0].type.shape) if self.by_position(d)),
                    None)
        if axis is not None and b.start is None:
            raise Unsupported(f"`{fn.name}` along the positions inside the layers")
        return axis


    # -- the layers
    def loop_lines(self, b: Body, e: Eqn, materialize: set[str]) -> list[Line]:
        info = self.loops[e.attrs["index"]]
        inputs = {v.name for v in self.model.inputs}
        args = []
        for k, o in enumerate(e.ins):
            if o.name not in b.vals:  # a model parameter the layers use as it is
                args.append(b.operand(o, e).expr)
                continue
            v = b.vals[o.name]
            expr = b._inline(v.expr, materialize) if v.expr in b.exprs and \
                v.expr not in materialize else v.expr
            if k < len(info["carried"]) or o.name not in inputs:
                expr = _spec_value(b, v, expr)  # only the model's inputs go in 0-based
            args.append(expr)
        nc = len(info["carried"])
        py = {o.name: b.vals[o.name].expr for o in e.outs}
        outs = [py[o.name] for o in e.outs[:nc]]
        carried_args = args[:nc]
        rest = args[nc:]
        lines = []
        for out, init in zip(outs, carried_args):
            if out != init:
                lines.append(Line(f"{out} = {init}"))
        # what each layer returns besides the carried values, by the name it gets here
        returned = {inner: b.namer(inner) for inner in info["extra"]}
        returned.update((i, py[o]) for i, o in info["last"])
        inputs_of = {c.inner: out for c, out in zip(info["carried"], outs)}
        results_of = {c.result: out for c, out in zip(info["carried"], outs)}
        for _, outer in info["each"]:
            lines.append(Line(f"{py[outer]} = []", "each layer's value, stacked below"))
        call_args = ", ".join(outs + rest + [f"{t}={t}" for t in info["lengths"]])
        target = ", ".join(outs + [returned[i] for i in info["extra"]])
        lines.append(Line(f"for layer in self.{info['attr']}:",
                          f"{self.layer_count(info)} layers"))
        for inner, outer in info["each"]:
            if inner in inputs_of:  # X^(0..L-1): what each layer starts from
                lines.append(Line(f"    {py[outer]}.append({inputs_of[inner]})"))
        lines.append(Line(f"    {target} = layer({call_args})"))
        for inner, outer in info["each"]:
            if inner not in inputs_of:
                value = results_of.get(inner) or returned[inner]
                lines.append(Line(f"    {py[outer]}.append({value})"))
        for _, outer in info["each"]:
            lines.append(Line(f"{py[outer]} = torch.stack({py[outer]}, dim=1)"))
        return lines

    def layer_count(self, info) -> str:
        return py_poly(info["loop"].hi, self.comment_sym)

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
        body = Body(self, msym, "device", namer, self_attr, self.spec.path)
        body.spec_names = self._use_names(self.cfg.model.body)
        if self.incremental is not None:
            body.start = "start"
        if model.params:
            body.real_dtype = f"self.{ident(model.params[0].name)}.dtype"
        args = []
        for v in model.inputs:
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
                        guard = " and ".join(self.guard_py(str(g), self.init_sym)
                                         for g in guards)
                        ctor = f"{ctor} if {guard} else None"
                    subs.append(SubView(attr, ctor))
        body.lower(eqns)
        outputs = [o.name for o in model.outputs]
        softmax_out = len(outputs) == 1 and body.vals[outputs[0]].producer is not None and \
            self.is_kind(body.vals[outputs[0]].producer, "softmax")
        head = self._prologue(model, {v.name: body.vals[v.name].expr for v in model.inputs})
        if softmax_out:
            producer = body.vals[outputs[0]].producer
            logits_name = producer.ins[0].name
            lines = head + body.emit([logits_name])
            lines.append(Line(f"return {body.result(logits_name)}"))
            self._resolve_line_refs(body, lines)
            extra = [*fit(f"def forward(self, {', '.join(args)}):"),
                     f'    """{model.outputs[0].name}: the probabilities, Softmax(logits)."""',
                     *fit(f"    return torch.softmax(self.logits({', '.join(args)}), dim=-1)")]
            method_name = "logits"
        else:
            lines = head + body.emit(outputs)
            # integer outputs are the spec's values, except an input returned as it came
            inputs = {v.name for v in model.inputs}
            result = ", ".join(body.result(o) if o in inputs else
                               _spec_value(body, body.vals[o], body.result(o))
                               for o in outputs)
            lines.append(Line(f"return {result}"))
            self._resolve_line_refs(body, lines)
            extra = []
            method_name = "forward"
        rest = "\n".join(ln.code for ln in lines if not ln.code.startswith("device = "))
        # nothing made on the inputs' device (`device=x.device` is a keyword and an attribute)
        if not re.search(r"(?<![\w.])device\b(?!=)", rest):
            lines = [ln for ln in lines if not ln.code.startswith("device = ")]
        extra += self._signature_method(model)
        forward_args = ["self"] + args
        if self.incremental is not None:
            extra += self._step_methods(args, method_name)
            forward_args += ["*", "start=0"]
        view = ClassView(model_cls, self._model_doc(), ["config"], ["self.config = config"],
                         params, subs, ", ".join(forward_args), lines, kind="model",
                         extra_methods=extra)
        view.method_name = method_name  # type: ignore[attr-defined]
        view.logits_of = model.outputs[0].name if softmax_out else None  # type: ignore
        return self._render(view, layer_classes)

    def _step_methods(self, args: list[str], method: str) -> list[str]:
        """cache_sites() and step(): the incremental form, with the keys and values of the
        positions before this call's (see compiler/passes/incremental.py)."""
        inc = self.incremental
        parts = []
        for loop in sorted({s.loop for s in inc.sites}, key=lambda k: -1 if k is None else k):
            sites = [s for s in inc.sites if s.loop == loop]
            paths = [".".join(ident(p) for p in s.path) for s in sites]
            if loop is None:
                parts.append("[" + ", ".join(f"self.{p}" for p in paths) + "]")
            elif len(paths) == 1:
                parts.append(f"[layer.{paths[0]} for layer in self.{layers_attr(loop)}]")
            else:
                parts.append(f"[site for layer in self.{layers_attr(loop)} for site in ("
                             + ", ".join(f"layer.{p}" for p in paths) + ")]")
        what = "logits" if method == "logits" else "outputs"
        call = ", ".join(args + ["start=start"])
        q = '"""'
        return ["",
                "def cache_sites(self):",
                f"    {q}The attentions whose keys and values step() keeps, in the order of its",
                f"    `past`: layer by layer.{q}",
                *fit("    return " + " + ".join(parts)),
                "",
                *fit(f"def step(self, {', '.join(args)}, past=None):"),
                f"    {q}The incremental form. The tokens are those at the positions after the P",
                "    that `past` holds the keys and values of: one (key, value) pair per",
                "    attention of cache_sites(), each (B, A, P, D); None when there are none",
                f"    yet (the prefill form). Returns the {what} of the new positions and the",
                "    present: the pairs extended by them (P + T positions), the next call's",
                f"    `past`.{q}",
                "    sites = self.cache_sites()",
                "    if past is not None and len(past) != len(sites):",
                '        raise ValueError(f"past holds {len(past)} key/value pairs; the "',
                '                         f"model keeps {len(sites)}")',
                "    start = past[0][0].shape[-2] if past else 0",
                "    for site, kv in zip(sites, past or [()] * len(sites)):",
                "        site.cache = kv",
                "    try:",
                *fit(f"        return self.{method}({call}), [site.cache for site in sites]"),
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
            return _Code(py_poly(form.size, self.fwd_sym))
        if isinstance(form, Text):
            parts, exact = form.template()
            text = "".join(json.dumps(p)[1:-1].replace("{", "{{").replace("}", "}}")
                           if k % 2 == 0 else "{" + self.fwd_sym[p] + "}"
                           for k, p in enumerate(parts))
            code = f'f"{text}"'
            if not exact:  # a text naming the size elsewhere; at this configuration, the
                hypers = form.hypers()  # ONNX graph's
                now = ", ".join(py_poly(self.values[h], {}) for h in hypers)
                code = (f"({json.dumps(form.at(self.values))} if "
                        f"({', '.join(self.fwd_sym[h] for h in hypers)},) == ({now},) "
                        f"else {code})")
            return _Code(code)
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
        for v in model.inputs:
            for k, d in enumerate(v.type.shape):
                along = v.type.dtype != "real" or k < len(v.type.shape) - 1
                if along and isinstance(d, Poly) and d.symbols() and \
                        not d.symbols() & self.dynamic:
                    # a length a parameter fixes (ir.sequence_symbols): this size only, as
                    # the ONNX graph's input shape says
                    x = names[v.name]
                    axis = k + (2 if v.type.family is not None else 1)
                    size = py_poly(d, self.fwd_sym)
                    lines.append(Line(f"assert {x}.shape[{axis}] == {size}, "
                                      f"f\"{v.name}: {{{x}.shape[{axis}]}} along axis {axis}; "
                                      f"the model takes exactly {{{size}}}\""))
                    continue
                if isinstance(d, Poly) and d.symbols() & self.dynamic and len(d.terms) == 1:
                    s = next(iter(d.symbols()))
                    T = self.run_length[s]
                    if any(ln.code.startswith(f"{T} = ") for ln in lines):
                        continue
                    x = names[v.name]
                    first = first or x
                    axis = k + (2 if v.type.family is not None else 1)  # after a family's axis
                    lines.append(Line(f"{T} = {x}.shape[{axis}]", "this call's sequence length"
                                      if len(self.run_length) == 1 else
                                      f"the length of {v.name} in this call"))
                    if self.by_position(d):
                        lines.append(Line(f"assert start + {T} <= {self.fwd_sym[s]}, "
                                          f"f\"positions up to {{start + {T}}}; the model takes "
                                          f"at most {{{self.fwd_sym[s]}}}\""))
                        continue
                    lines.append(Line(f"assert {T} <= {self.fwd_sym[s]}, "
                                      f"f\"sequence of {{{T}}} tokens; the model takes at most "
                                      f"{{{self.fwd_sym[s]}}}\""))
        if first is not None:
            lines.append(Line(f"device = {first}.device"))
            return lines
        if model.inputs:
            lines.append(Line(f"device = {names[model.inputs[0].name]}.device"))
        return lines

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
                guard = " and ".join(self.guard_py(str(g), {**self.init_sym, loop.var: "l"})
                                     for g in e.guards)
                subs.append(SubView(a, f"{ctor} if {guard} else None"))
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
        lines.append(Line("return " + ", ".join(_spec_value(body, body.vals[r],
                                                             body.result(r))
                                                 for r in results)))
        self._resolve_line_refs(body, lines)
        init_args = ["config", "l"] + shared_args
        # the run's lengths, where the layer's own equations need them
        text = "\n".join(ln.code for ln in lines)
        lengths = [t for t in dict.fromkeys(self.run_length.values())
                   if re.search(rf"(?<![\w.]){re.escape(t)}(?!\w)", text)]  # not `x.T`
        # a module shared by all layers is the model's: each layer holds it without
        # registering it, so the state dict names its tensors once
        init_lines = ["self.l = l"] + [f'object.__setattr__(self, "{a}", {a})  # shared'
                                       for a in shared_args]
        if re.search(r"\bself\.config\.", text):  # sizes its forward reads
            init_lines.insert(0, "self.config = config")
        view = ClassView(cls, [f"One of the {py_poly(loop.hi, self.comment_sym)} layers, "
                               f"{loop.var} = 1..{py_poly(loop.hi, self.comment_sym)}."],
                         init_args, init_lines, [], subs,
                         ", ".join(["self"] + args + (["*"] + lengths if lengths else [])),
                         lines, kind="layer")
        layer_classes.append(view)
        layers = f"for l in range(1, {py_poly(loop.hi, self.init_sym)} + 1))"
        ctor = f"nn.ModuleList({cls}(" + ", ".join(["config", "l"] + [
            f"{a}=self.{a}" for a in shared_args]) + f") {layers}"
        if len(ctor) > 76 and shared_args:  # one shared module per line, under `self.x = `
            pad = " " * 12
            ctor = f"nn.ModuleList(\n{pad}{cls}(\n{pad}    config,\n{pad}    l,\n" + "".join(
                f"{pad}    {a}=self.{a},\n" for a in shared_args) + f"{pad}) {layers}"
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
                used += "\n".join(s.ctor for s in c.subs)
            c.subs = [s for s in c.subs if re.search(re.escape(s.attr) + r"\b", used)
                      or re.search(r"=" + re.escape(s.attr) + r"\b", used)]
        by_name = {c.name: c for c in self.classes}
        keep: list[str] = []

        def visit(c: ClassView) -> None:
            for s in c.subs:
                for name in re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*)\(", s.ctor):
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
                derived.append((name, py_poly(h.default, of_self), what.rstrip(".") + "."))
                continue
            if isinstance(value, Poly) and value.const_value().denominator == 1:
                fields.append((name, "int", str(value.const_value().numerator), comment))
            else:
                number = float(value.const_value()) if isinstance(value, Poly) else value
                fields.append((name, "float", py_const(number, {}), comment))
        return fields, derived

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
        imports = []
        if plain := [n for n in used if FUNCTIONAL[n] == n]:
            imports.append(f"from torch.nn.functional import {', '.join(plain)}")
        imports += [f"from torch.nn.functional import {FUNCTIONAL[n]} as {n}" for n in used
                    if FUNCTIONAL[n] != n]
        view = dict(
            imports="\n".join(imports),
            spec=safe_name(self.spec.path), model=model_view, layers=layer_classes,
            modules=modules, fields=fields, derived=derived, preset=self.preset,
            # the helpers what is left after pruning calls, each emitted only then
            uses_causal=bool(re.search(r"(?<![\w.])causal_mask\(", text)),
            uses_take=bool(re.search(r"(?<![\w.])take\(", text)),
            uses_project=bool(re.search(r"(?<![\w.])project\(", text)))
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
