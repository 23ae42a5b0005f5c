"""The torch backend's Python expressions as trees (compiler/backends/torch/pyexpr.py):
brackets from the tree, lines of a width from the tree, a value written in by substituting
its tree. Rendering a tree and parsing it back gives the tree again; laying it out in
lines of any width keeps its meaning."""

from __future__ import annotations

import ast
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.backends.torch import pyexpr as P

# ---------------------------------------------------------------- trees from `ast`

OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.MatMult: "@", ast.Div: "/",
       ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**", ast.BitAnd: "&", ast.BitOr: "|",
       ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>", ast.USub: "-", ast.Invert: "~",
       ast.Not: "not", ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=",
       ast.Gt: ">", ast.GtE: ">=", ast.Is: "is", ast.IsNot: "is not", ast.And: "and",
       ast.Or: "or"}


def tree(node: ast.AST) -> P.Expr:
    """The pyexpr tree of a parsed expression (the subset the backend writes)."""
    match node:
        case ast.Expression(body=body):
            return tree(body)
        case ast.Name(id=name):
            return P.Name(name)
        case ast.Constant(value=v) if v is not Ellipsis:
            return P.Const(v)
        case ast.Constant():
            return P.Name("...")
        case ast.UnaryOp(op=ast.USub(), operand=ast.Constant(value=v)) if isinstance(v, int):
            return P.Const(-v)
        case ast.UnaryOp(op=op, operand=x):
            return P.Unary(OPS[type(op)], tree(x))
        case ast.BinOp(left=x, op=op, right=y):
            return P.BinOp(tree(x), OPS[type(op)], tree(y))
        case ast.BoolOp(op=op, values=values):
            return P.BoolOp(OPS[type(op)], tuple(map(tree, values)))
        case ast.Compare(left=x, ops=[op], comparators=[y]):
            return P.Compare(tree(x), OPS[type(op)], tree(y))
        case ast.IfExp(body=x, test=c, orelse=y):
            return P.IfExp(tree(x), tree(c), tree(y))
        case ast.Attribute(value=x, attr=name):
            return P.Attr(tree(x), name)
        case ast.Call(func=f, args=args, keywords=kws):
            return P.Call(tree(f), tuple(map(tree, args))
                          + tuple(P.Keyword(k.arg, tree(k.value)) for k in kws))
        case ast.Starred(value=x):
            return P.Starred(tree(x))
        case ast.Subscript(value=x, slice=ast.Tuple(elts=items)):
            return P.Subscript(tree(x), tuple(map(tree, items)))
        case ast.Subscript(value=x, slice=index):
            return P.Subscript(tree(x), (tree(index),))
        case ast.Slice(lower=lo, upper=hi, step=None):
            return P.Slice(lo and tree(lo), hi and tree(hi))
        case ast.Tuple(elts=items):
            return P.Tuple(tuple(map(tree, items)))
        case ast.List(elts=items):
            return P.List(tuple(map(tree, items)))
        case ast.ListComp(elt=x, generators=gens) | ast.GeneratorExp(elt=x, generators=gens):
            loops = tuple((tree(g.target), tree(g.iter)) for g in gens)
            return P.Comp(tree(x), loops, list=isinstance(node, ast.ListComp))
    raise TypeError(ast.dump(node))


def parse(text: str) -> P.Expr:
    return tree(ast.parse(text, mode="eval"))


def same(a: str, b: str) -> bool:
    """Whether two pieces of Python parse to the same tree (brackets and layout aside)."""
    return ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))


# ---------------------------------------------------------------- brackets

a, b, c, x, y = (P.Name(n) for n in "abcxy")


@pytest.mark.parametrize("expr, text", [
    (P.BinOp(a, "-", P.BinOp(b, "-", c)), "a - (b - c)"),
    (P.BinOp(P.BinOp(a, "-", b), "-", c), "a - b - c"),
    (P.BinOp(P.Unary("-", x), "**", P.Const(2)), "(-x) ** 2"),
    (P.Unary("-", P.BinOp(x, "**", P.Const(2))), "-x ** 2"),
    (P.BinOp(P.Const(2), "**", P.Unary("-", x)), "2 ** -x"),
    (P.BinOp(P.Const(-1), "**", P.Const(2)), "(-1) ** 2"),
    (P.BinOp(P.IfExp(a, c, b), "+", x), "(a if c else b) + x"),
    (P.method(P.BinOp(x, "+", y), "sum", P.Const(-1)), "(x + y).sum(-1)"),
    (P.method(P.Unary("-", x), "argmax", P.Const(-1)), "(-x).argmax(-1)"),
    (P.BinOp(P.Compare(a, "==", b), "&", P.Unary("not", c)), "(a == b) & (not c)"),
    (P.Compare(a, "<", P.Compare(b, "<", c)), "a < (b < c)"),
    (P.IfExp(a, c, P.IfExp(b, x, y)), "a if c else b if x else y"),
    (P.IfExp(P.IfExp(a, c, b), x, y), "(a if c else b) if x else y"),
    (P.BoolOp("and", (P.BoolOp("or", (a, b)), c)), "(a or b) and c"),
    (P.Subscript(x, (P.Name("..."), P.Slice(a, P.BinOp(a, "+", b)))), "x[..., a:a + b]"),
    (P.call("f", P.Starred(P.BoolOp("or", (a, b))), k=P.Tuple((a,))), "f(*(a or b), k=(a,))"),
    (P.call("f", P.Comp(x, ((x, y),), list=False)), "f(x for x in y)"),
    (P.Call(P.dotted("torch.empty"), (a,), trailing_comma=True), "torch.empty(a,)"),
])
def test_brackets_come_from_the_tree(expr, text):
    assert expr.text == text
    assert parse(text) == expr or same(expr.text, text)


def test_inlining_substitutes_a_tree_for_a_ref():
    """A value used once is written in: its brackets are those its place needs."""
    user = P.method(P.BinOp(P.Ref("t1"), "*", P.Ref("t2")), "sum", P.Const(-1))
    assert list(user.refs()) == ["t1", "t2"]
    written = user.subs({"t1": P.BinOp(a, "+", b), "t2": P.call("f", x)})
    assert written.text == "((a + b) * f(x)).sum(-1)"
    assert list(written.refs()) == []
    assert user.subs({}).text == "(t1 * t2).sum(-1)"


# where an operand goes: each side of each kind of operator, and the places it needs none
TEMPLATES = ["__x + h", "h - __x", "__x - h", "h * __x", "__x @ W", "h / __x", "__x ** 2",
             "2 ** __x", "-__x", "~__x", "not __x", "__x & m", "m | __x", "__x == y",
             "y < __x", "__x and y", "y or __x", "__x if c else y", "y if __x else z",
             "y if c else __x", "__x.sum(-1)", "__x[0]", "__x(1)", "f(__x, y)", "[__x]",
             "x[:__x]", "[s for s in __x]"]
OPERANDS = ["a", "a.b(c)", "(a, b)", "-a", "a ** b", "a * b", "a @ b", "a + b", "a - b",
            "a & b", "a | b", "a == b", "not a", "a and b", "a or b", "a if c else b"]


def _ref(e: P.Expr) -> P.Expr:
    return P.Ref("__x") if e == P.Name("__x") else e.map(_ref)


@pytest.mark.parametrize("template", TEMPLATES)
def test_operands_bracketed_by_precedence(template):
    """Every operand in every place: the text means what the template with the operand's
    tree in it means, and has brackets only where leaving them out would change that."""
    for operand in OPERANDS:
        written = _ref(parse(template)).subs({"__x": parse(operand)})
        assert parse(written.text) == written, (template, operand, written.text)
        bare = template.replace("__x", operand)
        try:
            bare_tree = parse(bare)
        except (SyntaxError, TypeError):
            bare_tree = None
        if bare_tree == written:
            assert written.text == bare, f"{written.text!r}: brackets where {bare!r} will do"


# ---------------------------------------------------------------- round trip


names = st.sampled_from([P.Name(n) for n in ("a", "b", "x")])
leaves = names | st.builds(P.Const, st.integers(-3, 3)) | st.builds(P.Const, st.just(0.5))


def _compound(inner):
    binary = st.builds(P.BinOp, inner, st.sampled_from(sorted(P.BINARY)), inner)
    return (binary
            | st.builds(P.Unary, st.sampled_from(["-", "~", "not"]), inner)
            | st.builds(P.Compare, inner, st.sampled_from(["==", "<", "is not"]), inner)
            | st.builds(lambda op, v: P.BoolOp(op, tuple(v)), st.sampled_from(["and", "or"]),
                        st.lists(inner, min_size=2, max_size=3))
            | st.builds(P.IfExp, inner, inner, inner)
            | st.builds(P.Attr, inner, st.just("mT"))
            | st.builds(lambda f, v: P.Call(f, tuple(v)), inner, st.lists(inner, max_size=2))
            | st.builds(lambda v, k: P.call("f", v, k=k), inner, inner)
            | st.builds(lambda v, i: P.Subscript(v, (P.Slice(None, i), i)), inner, inner)
            | st.builds(lambda v: P.Tuple(tuple(v)), st.lists(inner, min_size=1, max_size=2))
            | st.builds(lambda v: P.List(tuple(v)), st.lists(inner, max_size=2)))


exprs = st.recursive(leaves, _compound, max_leaves=8)


def _canonical(e: P.Expr) -> P.Expr:
    """What the tree parses back as: `-1` is a negative number, `-x` of a number written
    as digits too (`--0` is minus the number -0, not 0)."""
    if isinstance(e, P.Unary) and e.op == "-" and isinstance(e.operand, P.Const) and \
            type(e.operand.value) is int and e.operand.value >= 0:
        return P.Const(-e.operand.value)
    return e.map(_canonical)


@settings(max_examples=400, deadline=None)
@given(exprs)
def test_rendering_parses_back_to_the_tree(e):
    """Brackets exactly where the tree needs them: the text parses to the same tree."""
    back = parse(e.text)
    assert back == _canonical(e), e.text


@settings(max_examples=150, deadline=None)
@given(exprs, st.integers(20, 80))
def test_wrapped_lines_keep_their_meaning(e, width):
    """At any width, an assignment of the tree laid out in lines parses as the one line."""
    old = P.WIDTH
    P.WIDTH = width
    try:
        text = "\n".join(P.statement_lines(P.Assign((P.Name("y"),), e), "a comment", ""))
    finally:
        P.WIDTH = old
    assert same(text, f"y = {e.text}"), text


# ---------------------------------------------------------------- lines of a width

# lines the backend writes, each too long for some widths: a conditional operand, a sum of
# products, a call chain, a list of cache sites from a comprehension, a tuple returned, a
# mask of comparisons, a floor division (never split) before a call
LINES = [
    "H_l = (self.attn(self.LN_1(H_prev), M_l) if self.l % 2 == 1 else "
    "self.ff_1(self.LN_2(H_prev))) + H_prev",
    "H_l = H_prev - (self.attn(self.LN_1(H_prev), M_l) - self.ff_1(self.LN_2(H_prev)))",
    "y = (self.GELU_erf(project(X, self.W) + self.b) @ self.w) * self.scale + self.b_P",
    "z = (x if c else y).sum(-1, keepdim=True).movedim(-3, -2).flatten(-2)",
    "mask_st = self.Mask_ST(n=start + T, w=self.config.w, device=device, dtype=self.W_e.dtype)"
    "[start:]",
    "return [site for layer in self.layers for site in (layer.MH_1.Attention, "
    "layer.MH_2.Attention)]",
    "return self.logits_head(H_prev, mask_ar), [site.cache for site in sites]",
    "seen = (ri == rj) & (one | (uj == ui) | (uj == ui - self.c)) | (not one) & back",
    "rows = (positions_of_the_run // self.block_size).sum(-1, keepdim=True) - (-offset)",
]


def _statement(code: str):
    """The statement record of one line of the backend."""
    node = ast.parse(code).body[0]
    if isinstance(node, ast.Return):
        value = node.value
        if isinstance(value, ast.Tuple):
            return P.Return(P.Tuple(tuple(map(tree, value.elts)), bare=True))
        return P.Return(tree(value))
    return P.Assign(tuple(map(tree, node.targets)), tree(node.value))


@pytest.mark.parametrize("code", LINES, ids=range(len(LINES)))
def test_wrapped_line_keeps_its_meaning(code, monkeypatch):
    """At every line width, what the backend writes for a line (with its comment) parses
    as the line: wrapping moves line breaks and adds brackets, never takes one away
    (`(a if c else b) + H_prev` once lost its, and the odd layers their residual)."""
    stmt = _statement(code)
    assert same(stmt.code, code)
    in_def = code.startswith("return ")  # a return parses inside a function only
    wrapped_at = set()
    for width in range(24, 130):
        monkeypatch.setattr(P, "WIDTH", width)
        text = "\n".join(P.statement_lines(stmt, "(B, T, H)  spec.fgpt:12", " " * 8))
        source = "def f():\n" + text if in_def else textwrap.dedent(text)
        reference = "def f():\n    " + code if in_def else code
        assert same(source, reference), f"at width {width}:\n{text}"
        wrapped_at.add(text.count("\n"))
    assert len(wrapped_at) > 2  # the widths did make it wrap, in more than one way


def test_wrapped_conditional_operand_stays_bracketed():
    """The regression of tests/differential/conditional_sublayer_wrapped.fgpt: the line
    just too long for its brackets, short enough without them."""
    code = ("H_l = (self.attn(self.LN_1(H_prev), M_l) if self.l % 2 == 1 else "
            "self.ff_1(self.LN_2(H_prev))) + H_prev")
    text = "\n".join(P.statement_lines(_statement(code), "", " " * 8))
    assert same(textwrap.dedent(text), code), text
    assert "(\n" in text and "\n            + H_prev" in text, text


def test_layouts_of_long_lines():
    """The styles of the backend's lines: a call one argument a line, a sum split before
    its operators in brackets, a chain too long to open its last call one link a line."""
    long = P.Name("x" * 40)
    args = P.call("self.Attention", *(P.BinOp(P.call("project", long, P.Name(w)), "+",
                                              P.Name("b")) for w in ("W_Q", "W_K")))
    assert P.wrap(args, "", "h = ") == [
        "h = self.Attention(",
        f"    project({long.text}, W_Q) + b,",
        f"    project({long.text}, W_K) + b,",
        ")"]
    total = P.BinOp(P.BinOp(long, "*", P.Name("a")), "-", P.BinOp(long, "//", P.Name("b")))
    assert P.wrap(P.BinOp(total, "+", long), "", "y = ") == [
        "y = (", f"    {long.text} * a", f"    - {long.text} // b", f"    + {long.text}", ")"]
    chain = P.method(P.method(P.call("f" * 50, long), "unflatten", P.Const(-1)), "movedim",
                     P.Const(-2), P.Const(0))
    assert P.wrap(chain, "", "z = ") == [
        "z = (", f"    {'f' * 50}({long.text})", "    .unflatten(-1)", "    .movedim(-2, 0)", ")"]
    assert P.Def("forward", ("self", "x" * 50, "y" * 50)).lines("    ") == [
        "    def forward(", "        self,", f"        {'x' * 50},", f"        {'y' * 50},",
        "    ):"]
