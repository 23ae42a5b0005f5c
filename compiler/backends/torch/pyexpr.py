"""The Python the torch backend writes, as trees: expressions are immutable nodes, and a
statement is a small record of them. Brackets come from the tree (an operand is
bracketed exactly when its operator binds more loosely than its place wants), and so
does the layout of a line too long for WIDTH columns; a value not yet written in is a
`Ref`, and writing it in is substituting a tree for it (`Expr.subs`)."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property

WIDTH = 99

# Binding strengths, loosest first, as in the language reference's "Operator precedence"
# (a bare tuple, loosest of all, goes in brackets anywhere).
(TUPLE, LAMBDA, TERNARY, OR, AND, NOT, COMPARE, BIT_OR, BIT_XOR, BIT_AND, SHIFT, SUM,
 PRODUCT, UNARY, POWER, AWAIT, PRIMARY) = range(17)
BINARY = {"|": BIT_OR, "^": BIT_XOR, "&": BIT_AND, "<<": SHIFT, ">>": SHIFT, "+": SUM,
          "-": SUM, "*": PRODUCT, "@": PRODUCT, "/": PRODUCT, "//": PRODUCT, "%": PRODUCT,
          "**": POWER}
BOOLEAN = {"or": OR, "and": AND}
# where a sum or a product too long for a line is split (`//` never is)
SPLIT_AT = {"+", "-", "@", "*", "/", "%"}


class Expr:
    """A Python expression. `level` is how tightly it holds together as an operand."""

    level = PRIMARY

    @cached_property
    def text(self) -> str:
        """The expression on one line."""
        return self._render()

    def _render(self) -> str:
        raise NotImplementedError

    def children(self) -> Iterator[Expr]:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            for child in value if isinstance(value, tuple) else [value]:
                if isinstance(child, Expr):
                    yield child

    def map(self, fn) -> Expr:
        """This node with `fn` applied to each child expression."""
        changes = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, Expr):
                changes[f.name] = fn(value)
            elif isinstance(value, tuple):
                changes[f.name] = tuple(fn(x) if isinstance(x, Expr) else x for x in value)
        return dataclasses.replace(self, **changes) if changes else self  # type: ignore

    def subs(self, values: Mapping[str, Expr]) -> Expr:
        """This expression with each `Ref` that `values` names replaced by its tree."""
        return self.map(lambda child: child.subs(values))

    def refs(self) -> Iterator[str]:
        """The values referred to, in order of appearance."""
        for child in self.children():
            yield from child.refs()

    def walk(self) -> Iterator[Expr]:
        yield self
        for child in self.children():
            yield from child.walk()


def slot(e: Expr, wanted: int) -> Expr:
    """`e` where an operand of at least `wanted` goes: bracketed when it binds more loosely."""
    return e if e.level >= wanted else Paren(e)


@dataclass(frozen=True)
class Name(Expr):
    """A name, or a dotted path of names (`self.config.H`)."""

    id: str

    def _render(self) -> str:
        return self.id


@dataclass(frozen=True)
class Ref(Expr):
    """Another value of the function body, by its Python name, until it is written in."""

    name: str

    def _render(self) -> str:
        return self.name

    def subs(self, values: Mapping[str, Expr]) -> Expr:
        return values.get(self.name, self)

    def refs(self) -> Iterator[str]:
        yield self.name


@dataclass(frozen=True)
class Const(Expr):
    """A number, a string, True, False or None, as `repr` writes it."""

    value: object

    @property
    def level(self) -> int:  # type: ignore[override]
        negative = isinstance(self.value, (int, float)) and self.value < 0
        return UNARY if negative and not isinstance(self.value, bool) else PRIMARY

    def _render(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class FString(Expr):
    """An f-string: literal text and expressions in braces."""

    parts: tuple  # of str and Expr

    def _render(self) -> str:
        body = "".join("{" + p.text + "}" if isinstance(p, Expr)
                       else json.dumps(p)[1:-1].replace("{", "{{").replace("}", "}}")
                       for p in self.parts)
        return f'f"{body}"'


@dataclass(frozen=True)
class Attr(Expr):
    value: Expr
    name: str

    def _render(self) -> str:
        value = slot(self.value, PRIMARY)
        if isinstance(value, Const) and type(value.value) is int:
            value = Paren(value)  # `(0).real`: `0.` would be a float
        return f"{value.text}.{self.name}"


@dataclass(frozen=True)
class Keyword(Expr):
    """`name=value`, an argument of a call."""

    name: str
    value: Expr

    def _render(self) -> str:
        return f"{self.name}={slot(self.value, LAMBDA).text}"


@dataclass(frozen=True)
class Starred(Expr):
    """`*value`, an argument of a call."""

    value: Expr

    def _render(self) -> str:
        return f"*{slot(self.value, BIT_OR).text}"


@dataclass(frozen=True)
class Call(Expr):
    func: Expr
    args: tuple = ()  # Expr, Keyword and Starred
    trailing_comma: bool = False  # `torch.empty(H,)`

    @property
    def items(self) -> list[Expr]:
        """The arguments as they go between the brackets: a generator, the only argument,
        takes none of its own."""
        if len(self.args) == 1 and isinstance(self.args[0], Comp) and not self.args[0].list:
            return [self.args[0].bare]
        return [slot(a, LAMBDA) for a in self.args]

    def _render(self) -> str:
        args = ", ".join(a.text for a in self.items) + ("," if self.trailing_comma else "")
        return f"{slot(self.func, PRIMARY).text}({args})"


@dataclass(frozen=True)
class Slice(Expr):
    """`lower:upper` in a subscript, each side optional."""

    lower: Expr | None = None
    upper: Expr | None = None

    def _render(self) -> str:
        return ":".join(slot(x, LAMBDA).text if x is not None else ""
                        for x in (self.lower, self.upper))


@dataclass(frozen=True)
class Subscript(Expr):
    value: Expr
    index: tuple  # Expr and Slice; `x[a, b:c]`

    def _render(self) -> str:
        items = ", ".join(x.text if isinstance(x, Slice) else slot(x, LAMBDA).text
                          for x in self.index)
        return f"{slot(self.value, PRIMARY).text}[{items}]"


@dataclass(frozen=True)
class BinOp(Expr):
    left: Expr
    op: str
    right: Expr

    @property
    def level(self) -> int:  # type: ignore[override]
        return BINARY[self.op]

    def sides(self) -> tuple[Expr, Expr]:
        """The operands as they go in: left to right, so `a - (b - c)` keeps its brackets;
        `-x ** 2` is `-(x ** 2)`, so `(-x) ** 2` does too, and `2 ** -x` needs none."""
        if self.op == "**":
            return slot(self.left, AWAIT), slot(self.right, UNARY)
        return slot(self.left, self.level), slot(self.right, self.level + 1)

    def _render(self) -> str:
        left, right = self.sides()
        return f"{left.text} {self.op} {right.text}"


@dataclass(frozen=True)
class BoolOp(Expr):
    op: str  # "and" | "or"
    values: tuple

    @property
    def level(self) -> int:  # type: ignore[override]
        return BOOLEAN[self.op]

    def _render(self) -> str:
        return f" {self.op} ".join(slot(v, self.level + 1).text for v in self.values)


@dataclass(frozen=True)
class Unary(Expr):
    op: str  # "-" | "~" | "not"
    operand: Expr

    @property
    def level(self) -> int:  # type: ignore[override]
        return NOT if self.op == "not" else UNARY

    def _render(self) -> str:
        if self.op == "not":
            return f"not {slot(self.operand, NOT).text}"
        return f"{self.op}{slot(self.operand, UNARY).text}"


@dataclass(frozen=True)
class Compare(Expr):
    """One comparison; `a < (b < c)` keeps its brackets (comparisons chain)."""

    left: Expr
    op: str
    right: Expr
    level = COMPARE

    def _render(self) -> str:
        return f"{slot(self.left, BIT_OR).text} {self.op} {slot(self.right, BIT_OR).text}"


@dataclass(frozen=True)
class IfExp(Expr):
    body: Expr
    test: Expr
    orelse: Expr
    level = TERNARY

    def parts(self) -> tuple[Expr, Expr, Expr]:
        return slot(self.body, OR), slot(self.test, OR), slot(self.orelse, LAMBDA)

    def _render(self) -> str:
        body, test, orelse = self.parts()
        return f"{body.text} if {test.text} else {orelse.text}"


@dataclass(frozen=True)
class Tuple(Expr):
    """`(a, b)`, `(a,)`; bare, `a, b`: the values a line returns or assigns."""

    items: tuple
    bare: bool = False

    @property
    def level(self) -> int:  # type: ignore[override]
        return TUPLE if self.bare else PRIMARY

    def _render(self) -> str:
        text = ", ".join(slot(x, LAMBDA).text for x in self.items)
        if self.bare:
            return text
        return f"({text},)" if len(self.items) == 1 else f"({text})"


@dataclass(frozen=True)
class List(Expr):
    items: tuple

    def _render(self) -> str:
        return "[" + ", ".join(slot(x, LAMBDA).text for x in self.items) + "]"


@dataclass(frozen=True)
class Comp(Expr):
    """A list comprehension, or a generator expression: `elt for target in iter ...`."""

    elt: Expr
    loops: tuple  # (target, iter) pairs
    list: bool = True

    @property
    def tail(self) -> str:
        return "".join(f" for {t.text} in {slot(it, OR).text}" for t, it in self.loops)

    @property
    def bare(self) -> Expr:
        return _Bare(self)

    def _render(self) -> str:
        inside = slot(self.elt, LAMBDA).text + self.tail
        return f"[{inside}]" if self.list else f"({inside})"


@dataclass(frozen=True)
class _Bare(Expr):
    """A comprehension without its brackets: inside those of a list or of a call."""

    comp: Comp
    level = LAMBDA

    def _render(self) -> str:
        return slot(self.comp.elt, LAMBDA).text + self.comp.tail


@dataclass(frozen=True)
class Paren(Expr):
    """An operand in the brackets its place needs (see `slot`)."""

    inner: Expr

    def _render(self) -> str:
        return f"({self.inner.text})"


HOLE = Name("")  # where the previous link of a method chain goes: see `_links`


def all_of(*conds: Expr) -> Expr:
    """`a and b and ...`, flat."""
    values: list[Expr] = []
    for c in conds:
        values.extend(c.values if isinstance(c, BoolOp) and c.op == "and" else [c])
    return values[0] if len(values) == 1 else BoolOp("and", tuple(values))


def dotted(path: str) -> Expr:
    """`a.b.c` as attributes of the name `a`."""
    head, *rest = path.split(".")
    e: Expr = Name(head)
    for name in rest:
        e = Attr(e, name)
    return e


def call(func: str | Expr, *args: Expr, **kwargs: Expr) -> Call:
    """`func(args, name=value, ...)`; `func` a dotted path or a tree."""
    fn = dotted(func) if isinstance(func, str) else func
    return Call(fn, tuple(args) + tuple(Keyword(k, v) for k, v in kwargs.items()))


def method(value: Expr, name: str, *args: Expr, **kwargs: Expr) -> Call:
    """`value.name(args, ...)`."""
    return call(Attr(value, name), *args, **kwargs)


# ---------------------------------------------------------------- lines of a width


def wrap(e: Expr, indent: str, before: str = "", after: str = "", split: bool = False,
         tuples: bool = True) -> list[str]:
    """`before + e + after` in lines of at most WIDTH columns where it can be, at `indent`:
    a conditional a line for each part, a sum or a product a line before each of its
    operators (in brackets); a list, a tuple of results, a call's arguments or a
    subscript's indices one item a line; a method chain too long to open its last call one
    link a line. `split`: a
    bracketed sum or conditional is split even where it fits."""
    line = f"{indent}{before}{e.text}{after}"
    if len(line) <= WIDTH and not split:
        return [line]
    inner = indent + "    "
    if isinstance(e, _Bare):  # a generator: its element is laid out, its loops follow
        return wrap(slot(e.comp.elt, LAMBDA), indent, before, e.comp.tail + after)
    if isinstance(e, IfExp):
        body, test, orelse = e.parts()
        return [f"{indent}{before}(", *wrap(body, inner), *wrap(test, inner, "if "),
                *wrap(orelse, inner, "else "), f"{indent}){after}"]
    terms = _terms(e)
    if terms:
        out = [f"{indent}{before}(", *wrap(terms[0][1], inner)]
        for op, term in terms[1:]:
            out.extend(wrap(term, inner, f"{op} "))
        return out + [f"{indent}){after}"]
    if isinstance(e, Tuple) and e.bare and tuples:
        plain = wrap(e, indent, before, after, tuples=False)
        if all(len(x) <= WIDTH for x in plain):
            return plain
        return _bracketed(f"{indent}{before}(", e.items, ",", inner, f"{indent}){after}")
    if isinstance(e, List):
        return _bracketed(f"{indent}{before}[", e.items, ",", inner, f"{indent}]{after}")
    if isinstance(e, Comp) and e.list:
        return [f"{indent}{before}[", f"{inner}{e.bare.text}", f"{indent}]{after}"]
    if isinstance(e, Attr) and _closes(slot(e.value, PRIMARY)):
        # `f(...).mT`: the call is laid out, the attribute follows its closing bracket
        return wrap(slot(e.value, PRIMARY), indent, before, f".{e.name}{after}")
    if isinstance(e, Subscript) and _closes(slot(e.value, PRIMARY)) and _plain_index(e):
        # `f(...)[start:]`: likewise the subscript
        index = e.text[len(slot(e.value, PRIMARY).text):]
        return wrap(slot(e.value, PRIMARY), indent, before, index + after)
    if isinstance(e, Paren) and (isinstance(e.inner, IfExp) or _terms(e.inner)):
        return wrap(e.inner, indent, before, after, split=True)
    group = _last_group(e)
    if group is None and isinstance(e, Subscript) and len(e.index) > 1:
        # `x[rows, cols, :]` too long: one index a line
        out = [f"{indent}{before}{slot(e.value, PRIMARY).text}["]
        for x in e.index:
            if isinstance(x, Slice):
                out.append(f"{inner}{x.text},")
            else:
                out.extend(wrap(slot(x, LAMBDA), inner, "", ","))
        return out + [f"{indent}]{after}"]
    if group is None:
        return [line]
    head, items, comma, tail = group
    links = _links(e)
    if len(links) > 1 and len(f"{indent}{before}{head}") > WIDTH:
        # a chain too long to open its last call: one link a line, bracketed
        out = [f"{indent}{before}("]
        for link in links:
            out.extend(wrap(link, inner))
        return out + [f"{indent}){after}"]
    return _bracketed(f"{indent}{before}{head}", items, comma, inner,
                      f"{indent}){tail}{after}")


def _bracketed(first: str, items, comma: str, inner: str, last: str) -> list[str]:
    out = [first]
    for x in items:
        out.extend(wrap(slot(x, LAMBDA) if not isinstance(x, _Bare) else x, inner, "", comma))
    return out + [last]


def _terms(e: Expr) -> list[tuple[str, Expr]]:
    """A sum's or a product's operands, each after its operator (the first after none),
    where the line is split; [] for anything else."""
    if not (isinstance(e, BinOp) and e.op in SPLIT_AT):
        return []
    level, terms = e.level, []
    while isinstance(e, BinOp) and e.op in SPLIT_AT and e.level == level:
        left, right = e.sides()
        terms.append((e.op, right))
        e = left
    terms.append(("", e))
    return terms[::-1]


def _closes(e: Expr) -> bool:
    """Whether `e` ends in a closing round bracket: a call or a bracketed expression."""
    return isinstance(e, (Call, Paren)) or isinstance(e, Tuple) and not e.bare


def _plain_index(e: Subscript) -> bool:
    """Whether a subscript holds no brackets of its own (`[start:]`, `[:, -1]`)."""
    return not any(isinstance(x, (Call, Subscript, Paren, List, Tuple, Comp))
                   for item in e.index for x in item.walk())


def _links(e: Expr) -> list[Expr]:
    """`f(x).g(y).h` -> [`f(x)`, `.g(y)`, `.h`]: the links of a method chain, each after
    the previous one's closing bracket (the HOLE in the link stands for it)."""
    match e:
        case Call(func=Attr(value=v, name=n)) if _ends_bracket(slot(v, PRIMARY)):
            return _links(slot(v, PRIMARY)) + [Call(Attr(HOLE, n), e.args, e.trailing_comma)]
        case Attr(value=v, name=n) if _ends_bracket(slot(v, PRIMARY)):
            return _links(slot(v, PRIMARY)) + [Attr(HOLE, n)]
        case Subscript(value=v):
            *rest, last = _links(slot(v, PRIMARY))
            return rest + [Subscript(last, e.index)]
    return [e]


def _ends_bracket(e: Expr) -> bool:
    return _closes(e) or isinstance(e, (Subscript, List, Comp))


def _last_group(e: Expr) -> tuple[str, list[Expr], str, str] | None:
    """For an expression that ends in a bracketed group (a call's arguments, an operand in
    brackets), possibly followed by attributes or a plain subscript: the text up to and
    with its opening bracket, its items, the comma after each, and the text after its
    closing bracket. None for any other expression."""
    match e:
        case Call():
            items = e.items
            comma = "" if len(items) == 1 and isinstance(items[0], _Bare) else ","
            return f"{slot(e.func, PRIMARY).text}(", items, comma, ""
        case Paren(inner=inner):
            return "(", [inner], "", ""
        case Tuple(bare=False):
            return "(", list(e.items), ",", ""
        case Attr(value=v) | Subscript(value=v) if _closes(slot(v, PRIMARY)) and (
                isinstance(e, Attr) or _plain_index(e)):
            group = _last_group(slot(v, PRIMARY))
            head, items, comma, tail = group  # type: ignore[misc]
            return head, items, comma, tail + e.text[len(slot(v, PRIMARY).text):]
        case BinOp() | Compare() | Tuple(bare=True) | BoolOp() | Unary() | Keyword() \
                | Starred():
            last = _last_operand(e)
            group = _last_group(last)
            if group is None:
                return None
            head, items, comma, tail = group
            return e.text[:len(e.text) - len(last.text)] + head, items, comma, tail
    return None


def _last_operand(e: Expr) -> Expr:
    """The operand an expression ends with, as it goes in (bracketed where it needs)."""
    match e:
        case BinOp():
            return e.sides()[1]
        case Compare():
            return slot(e.right, BIT_OR)
        case Tuple() | BoolOp():
            values = e.items if isinstance(e, Tuple) else e.values
            return slot(values[-1], LAMBDA if isinstance(e, Tuple) else e.level + 1)
        case Unary():
            return slot(e.operand, NOT if e.op == "not" else UNARY)
        case Keyword():
            return slot(e.value, LAMBDA)
        case Starred():
            return slot(e.value, BIT_OR)
    raise TypeError(e)


# ---------------------------------------------------------------- statements


@dataclass(frozen=True)
class Assign:
    targets: tuple  # of Expr: `a, b = f(x)` assigns two
    value: Expr

    @property
    def code(self) -> str:
        return f"{self.lhs} = {self.value.text}"

    @property
    def lhs(self) -> str:
        return ", ".join(t.text for t in self.targets)

    def lines(self, indent: str) -> list[str]:
        return wrap(self.value, indent, f"{self.lhs} = ")


@dataclass(frozen=True)
class Return:
    value: Expr

    @property
    def code(self) -> str:
        return f"return {self.value.text}"

    def lines(self, indent: str) -> list[str]:
        return wrap(self.value, indent, "return ")


@dataclass(frozen=True)
class Do:
    """An expression for its effect: `H.append(x)`."""

    value: Expr

    @property
    def code(self) -> str:
        return self.value.text

    def lines(self, indent: str) -> list[str]:
        return wrap(self.value, indent)


@dataclass(frozen=True)
class Assert:
    """`assert test, message`; a long message is split into its pieces, a line each."""

    test: Expr
    pieces: tuple  # of FString

    @property
    def code(self) -> str:
        return f"assert {self.test.text}, {FString(self.parts).text}"

    @property
    def parts(self) -> tuple:
        return tuple(p for piece in self.pieces for p in piece.parts)

    def lines(self, indent: str) -> list[str]:
        return [f"{indent}assert {self.test.text}, ("] + \
            [f"{indent}    {p.text}" for p in self.pieces] + [f"{indent})"]


class _Head:
    """The head of a block, on one line (its body the lines one deeper)."""

    code: str

    def lines(self, indent: str) -> list[str]:
        return [indent + self.code]


@dataclass(frozen=True)
class If(_Head):
    """The head of an `if` block."""

    test: Expr

    @property
    def code(self) -> str:
        return f"if {self.test.text}:"


@dataclass(frozen=True)
class For(_Head):
    """The head of a `for` loop."""

    target: Expr
    iter: Expr

    @property
    def code(self) -> str:
        return f"for {self.target.text} in {slot(self.iter, OR).text}:"


@dataclass(frozen=True)
class Def:
    """The head of a method; a line for each argument when it is too long."""

    name: str
    args: tuple  # of str: `self`, `x`, `*`, `start=0`

    @property
    def code(self) -> str:
        return f"def {self.name}({', '.join(self.args)}):"

    def lines(self, indent: str) -> list[str]:
        if len(indent + self.code) <= WIDTH:
            return [indent + self.code]
        return [f"{indent}def {self.name}("] + [f"{indent}    {a}," for a in self.args] + \
            [f"{indent}):"]


def statement_lines(stmt, comment: str, indent: str) -> list[str]:
    """One statement in lines of at most WIDTH columns: as is when it fits; else its
    comment goes above it, and the statement is laid out (see `wrap`)."""
    one = f"{indent}{stmt.code}" + (f"  # {comment}" if comment else "")
    if len(one) <= WIDTH:
        return [one]
    head = [f"{indent}# {x}" for x in textwrap.wrap(comment, WIDTH - len(indent) - 2,
                                                       break_long_words=False)]
    if len(indent) + len(stmt.code) <= WIDTH:
        return head + [indent + stmt.code]
    return head + stmt.lines(indent)
