"""Lark's parse tree to fgc's syntax tree, with friendly parse errors (imported only when a
file is not in the parse cache)."""

from __future__ import annotations

import functools
from pathlib import Path

import lark
from lark import Token, Transformer, Tree, v_args

from ..errors import FgcError, Span
from . import nodes as S
from .nodes import parse_number

GRAMMAR = Path(__file__).with_name("grammar.lark")

MAX_DEPTH = 400  # depth of one expression's tree; deeper input is rejected, not recursed into
_MAX_STEP_ARG = 2**31  # a checkpoint step's axis or count (`split(2, 3, 1)`)

# How expected terminals read in a message.
_TERMINAL_TEXT = {
    "NAME": "a name", "INT": "an integer", "FLOAT": "a number", "LPAR": "'('", "RPAR": "')'",
    "LSQB": "'['", "RSQB": "']'", "LBRACE": "'{'", "RBRACE": "'}'", "COMMA": "','",
    "EQUAL": "'='", "COLON": "':'", "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'", "SLASH": "'/'",
    "CIRCUMFLEX": "'^'", "ELLIPSIS": "'...'", "__ANON_0": "'->'", "EQEQ": "'=='", "TILDE": "'~'",
    "CMP": "a comparison", "PARITY": "'even' or 'odd'", "AT": "'@'", "PERCENT": "'%'",
    "QMARK": "'?'", "VBAR": "'|'", "DOT": "'.'",
    "$END": "end of file",
}


@functools.lru_cache(maxsize=1)
def parser() -> lark.Lark:
    # The LALR tables are kept in fgc's own cache as JSON (Lark's own disk cache would unpickle
    # a file from the shared temporary folder): building them costs more than parsing a spec.
    from .cache import load_grammar
    return load_grammar(GRAMMAR.read_text(), dict(parser="lalr", propagate_positions=True,
                                                  maybe_placeholders=True))


def _describe_expected(expected: set[str]) -> str:
    names = []
    for term in sorted(expected):
        if term in _TERMINAL_TEXT:
            names.append(_TERMINAL_TEXT[term])
        elif term.isupper() and term.replace("_", "").isalpha() and not term.startswith("__"):
            names.append(f"'{term.lower()}'")
    names = sorted(set(names))
    if not names:
        return ""
    if len(names) > 8:
        names = names[:8] + ["…"]
    return "expected " + ", ".join(names)


def _token_text(tok: Token) -> str:
    if tok.type == "$END":
        return "end of file"
    text = str(tok)
    if len(text) > 30:
        text = text[:27] + "..."
    return repr(text)


def parse_uncached(text: str, filename: str) -> S.File:
    """Parse one file; raises FgcError with a located diagnostic on any failure."""
    try:
        tree = parser().parse(text)
    except lark.UnexpectedCharacters as e:
        ch = text[e.pos_in_stream] if e.pos_in_stream < len(text) else ""
        raise FgcError(f"unexpected character {ch!r}", Span(filename, e.line, e.column),
                       _describe_expected(set(e.allowed or ())) or None) from None
    except lark.UnexpectedToken as e:
        tok = e.token
        if tok.type == "$END":
            lines = text.split("\n")
            span = Span(filename, len(lines), len(lines[-1]) + 1)
            msg = "unexpected end of file"
        else:
            span = Span(filename, tok.line, tok.column, tok.end_line, tok.end_column)
            msg = f"unexpected {_token_text(tok)}"
        raise FgcError(msg, span, _describe_expected(set(e.expected)) or None) from None
    except lark.UnexpectedEOF as e:
        lines = text.split("\n")
        raise FgcError("unexpected end of file", Span(filename, len(lines), len(lines[-1]) + 1),
                       _describe_expected(set(e.expected)) or None) from None
    _check_depth(tree, filename)
    try:
        return _ToSyntax(filename).transform(tree)
    except lark.exceptions.VisitError as e:
        if isinstance(e.orig_exc, FgcError):
            raise e.orig_exc from None
        raise


def _check_depth(tree: Tree, filename: str) -> None:
    """Reject absurd nesting before any recursive pass sees the tree."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            meta = node.meta
            raise FgcError(f"expression more than {MAX_DEPTH} operations deep (nested "
                           "brackets and calls, or a long chain of operators)",
                           Span(filename, meta.line, meta.column),
                           "split it into named intermediate equations")
        for child in node.children:
            if isinstance(child, Tree):
                stack.append((child, depth + 1))


def _binop(op: str):
    @v_args(meta=True)
    def method(self, meta, children):
        return S.BinOp(self._span(meta), op, children[0], children[1])
    return method


INIT = {"0": "zeros", "1": "ones"}  # `param b: R[H] = 0`


class _ToSyntax(Transformer):
    """Parse tree to syntax tree. Each method receives (meta, children)."""

    def __init__(self, filename: str):
        super().__init__()
        self.filename = filename

    def _span(self, meta) -> Span:
        if getattr(meta, "empty", True):
            return Span(self.filename, 1, 1)
        return Span(self.filename, meta.line, meta.column, meta.end_line, meta.end_column)

    def _tspan(self, tok: Token) -> Span:
        return Span(self.filename, tok.line, tok.column, tok.end_line, tok.end_column)

    # ------------------------------------------------------------ top level
    def start(self, children):
        modules = [c for c in children if isinstance(c, S.Module)]
        models = [c for c in children if isinstance(c, S.Model)]
        return S.File(self.filename, modules, models)

    @v_args(meta=True)
    def module(self, meta, children):
        name = children[0]
        rest = children[1:]
        hypers: list[S.HyperDecl] = []
        inputs: list[S.ArgDecl] = []
        if rest and isinstance(rest[0], tuple) and rest[0][0] == "hypers":
            hypers = rest[0][1]
            rest = rest[1:]
        if rest and isinstance(rest[0], tuple) and rest[0][0] == "inputs":
            inputs = rest[0][1]
            rest = rest[1:]
        out_type, body = rest[0], rest[1:]
        equations = [s for s in body if isinstance(s, S.Equation)]
        params = [p for s in body if isinstance(s, list) for p in s]
        return S.Module(self._span(meta), str(name), hypers, inputs, out_type, equations, params)

    def mod_hypers(self, children):
        return ("hypers", children)

    def mod_inputs(self, children):
        return ("inputs", [c for c in children if c is not None])

    @v_args(meta=True)
    def arg_decl(self, meta, children):
        name, typ = children[0], children[1]
        family = children[2]
        return S.ArgDecl(self._span(meta), str(name), typ, family)

    @v_args(meta=True)
    def model(self, meta, children):
        name = str(children[0])
        m = S.Model(self._span(meta), name, [], [], [], [], [], [])
        for stmt in children[1:]:
            if isinstance(stmt, tuple) and stmt[0] == "hyper":
                m.hypers.extend(stmt[1])
            elif isinstance(stmt, tuple) and stmt[0] == "input":
                m.inputs.extend(stmt[1])
            elif isinstance(stmt, S.Preset):
                m.presets.append(stmt)
            elif isinstance(stmt, list):
                m.params.extend(stmt)
            elif isinstance(stmt, S.Expect):
                m.expects.append(stmt)
            elif isinstance(stmt, S.Condition):
                m.conditions.append(stmt)
            elif isinstance(stmt, S.Checkpoint):
                if m.checkpoint is not None:
                    raise FgcError("a model has one checkpoint block", stmt.span)
                m.checkpoint = stmt
            elif isinstance(stmt, S.ConfigBlock):
                if m.config is not None:
                    raise FgcError("a model has one config block", stmt.span)
                m.config = stmt
            else:
                m.statements.append(stmt)
        return m

    @v_args(meta=True)
    def checkpoint(self, meta, children):
        ck = S.Checkpoint(self._span(meta), [], [], [])
        for item in children:
            kind, value = item
            if kind == "prefix":
                ck.prefixes.extend(value)
            elif kind == "ignore":
                ck.ignore.extend(value)
            elif kind == "tied":
                ck.tied.append(value)
            elif kind == "map":
                ck.maps.append(value)
            else:  # layers
                for k2, v2 in value:
                    if k2 == "map":
                        v2.per_layer = True
                        ck.maps.append(v2)
                    else:
                        ck.ignore.extend(v2)
        return ck

    def ckpt_prefix(self, children):
        return ("prefix", _strings(children))

    @v_args(meta=True)
    def ckpt_tied(self, meta, children):
        name, same = _strings(children)
        return ("tied", S.CkptTied(self._span(meta), name, same))

    def ckpt_ignore(self, children):
        return ("ignore", _strings(children))

    def ckpt_layers(self, children):
        return ("layers", children)

    @v_args(meta=True)
    def ckpt_map(self, meta, children):
        names = [str(c) for c in children if isinstance(c, Token) and c.type == "NAME"]
        source = next(str(c)[1:-1] for c in children if isinstance(c, Token)
                      and c.type == "STRING")
        steps = [c for c in children if isinstance(c, S.CkptStep)]
        return ("map", S.CkptMap(self._span(meta), names, source, steps))

    @v_args(meta=True)
    def ckpt_step(self, meta, children):
        # INT tokens read as everywhere else (`3K`, `1_0`; `1_` is a located error), and an
        # axis or a count past any tensor's rank or size is refused here, where it is written
        args = []
        for c in children[1:]:
            if c is None:
                continue
            if not isinstance(c, S.Num):  # a size expression, or a range of them
                args.append(c)
                continue
            value = c.value
            if value.denominator != 1 or value < 0:
                raise FgcError(f"`{str(children[0])}` takes axes and counts, whole numbers; "
                               f"not {c.text}", c.span)
            if value > _MAX_STEP_ARG:
                raise FgcError(f"`{str(children[0])}` takes axes and counts; {c.text} is too "
                               "large", c.span, f"checkpoint steps take numbers up to "
                               f"{_MAX_STEP_ARG:,}")
            args.append(int(value))
        return S.CkptStep(self._span(meta), str(children[0]), args)

    # ------------------------------------------------------------ config.json
    @v_args(meta=True)
    def config(self, meta, children):
        word, *items = children
        if word != "config":
            raise FgcError(f"`{word} {{` opens no block", self._tspan(word),
                           "a model's blocks are `checkpoint { ... }` and `config { ... }`")
        block = S.ConfigBlock(self._span(meta), [], [], [], [])
        for kind, value in items:
            if kind == "architectures":
                block.architectures.extend(value)
            elif kind == "model_type":
                block.model_types.extend(value)
            elif kind == "map":
                block.maps.append(value)
            else:
                block.assumes.append(value)
        return block

    def config_architectures(self, children):
        return ("architectures", _strings(children))

    def config_model_type(self, children):
        return ("model_type", _strings(children))

    @v_args(meta=True)
    def config_map(self, meta, children):
        name, source, default = children
        return ("map", S.ConfigMap(self._span(meta), str(name), source, default))

    @v_args(meta=True)
    def config_assume(self, meta, children):
        source, *rest = children
        absent = rest.pop()
        if isinstance(rest[0], Token) and rest[0].type == "EQEQ":
            rest = rest[1:]
        return ("assume", S.ConfigAssume(self._span(meta), source, rest, absent))

    @v_args(meta=True)
    def key_choice(self, meta, children):
        return S.ConfigChoice(self._span(meta), children)

    @v_args(meta=True)
    def key_path(self, meta, children):
        path: list[str | int] = []
        for tok in children:
            if tok.type == "NAME":
                path.append(str(tok))
                continue
            value = parse_number(tok, self.filename)
            if value.denominator != 1 or not 1 <= value <= _MAX_STEP_ARG:
                raise FgcError(f"`[{tok}]`: positions in a list count from 1",
                               self._tspan(tok), "write `key[1]` for the first entry")
            path.append(int(value))
        return S.ConfigKey(self._span(meta), path)

    key_add = _binop("+")
    key_sub = _binop("-")
    key_mul = _binop("*")
    key_div = _binop("/")

    @v_args(meta=True)
    def key_number(self, meta, children):
        tok = children[0]
        return S.Num(self._span(meta), parse_number(tok, self.filename), str(tok))

    @v_args(meta=True)
    def json_string(self, meta, children):
        return S.JsonValue(self._span(meta), "string", str(children[0])[1:-1])

    @v_args(meta=True)
    def json_number(self, meta, children):
        parse_number(children[0], self.filename)  # a malformed number is located here
        return S.JsonValue(self._span(meta), "number", str(children[0]))

    @v_args(meta=True)
    def json_negative(self, meta, children):
        parse_number(children[0], self.filename)
        return S.JsonValue(self._span(meta), "number", f"-{children[0]}")

    @v_args(meta=True)
    def json_word(self, meta, children):
        word = str(children[0])
        if word not in ("true", "false", "null"):
            raise FgcError(f"`{word}` is not a value config.json can hold", self._span(meta),
                           'write a string ("silu"), a number, true, false, null or a list')
        return S.JsonValue(self._span(meta), word, word)

    @v_args(meta=True)
    def json_list(self, meta, children):
        return S.JsonValue(self._span(meta), "list", "",
                           [c for c in children if c is not None])

    @v_args(meta=True)
    def json_cycle(self, meta, children):
        return S.JsonValue(self._span(meta), "cycle", "",
                           [c for c in children if isinstance(c, S.JsonValue)])

    def hyper_stmt(self, children):
        return ("hyper", children)

    @v_args(meta=True)
    def hyper_decl(self, meta, children):
        return S.HyperDecl(self._span(meta), str(children[0]), children[1])

    def preset_name(self, children):
        if len(children) == 2:
            num, rest = children
            if (num.end_line, num.end_column) != (rest.line, rest.column):
                raise FgcError("a preset name is one word, like `175b`", self._tspan(num),
                               f"write `{num}{rest}`")
        return "".join(str(c) for c in children)

    @v_args(meta=True)
    def preset(self, meta, children):
        name = str(children[0])
        assigns = [c for c in children[1:] if isinstance(c, tuple)]
        expects = [c for c in children[1:] if isinstance(c, S.Expect)]
        for c in children[1:]:
            if isinstance(c, S.Condition):
                raise FgcError("a condition on sizes holds for every configuration: write it "
                               "in the model, not in a preset", c.span,
                               "a preset expects only `params == ...` or `params ~ ...`")
        return S.Preset(self._span(meta), name, assigns, expects)

    @v_args(meta=True)
    def assign(self, meta, children):
        return (str(children[0]), children[1], self._span(meta))

    def input_stmt(self, children):
        return ("input", children)

    @v_args(meta=True)
    def output(self, meta, children):
        name, value = children
        return S.Output(self._span(meta), str(name) if name is not None else None, value)

    @v_args(meta=True)
    def expect(self, meta, children):
        return S.Expect(self._span(meta), str(children[0]), children[1])

    @v_args(meta=True)
    def expect_that(self, meta, children):
        return S.Condition(self._span(meta), children[0])

    @v_args(meta=True)
    def share(self, meta, children):
        *names, spec = children
        return S.Share(self._span(meta), [str(c) for c in names],
                       str(spec)[1:-1] if spec is not None else None,
                       self._tspan(spec) if spec is not None else None)

    @v_args(meta=True)
    def loop(self, meta, children):
        var, (lo, hi), *body = children
        return S.Loop(self._span(meta), str(var), lo, hi, body)

    # ------------------------------------------------------------ params and types
    def param_stmt(self, children):
        return children

    @v_args(meta=True)
    def param_decl(self, meta, children):
        init = children[3]
        if init is not None and str(init) not in INIT:
            raise FgcError("a parameter starts at 0 or 1 (`= 0`, `= 1`)", self._span(meta),
                           "leave `= ...` out for N(0, 0.02²)")
        return S.ParamDecl(self._span(meta), str(children[0]), children[1], children[2],
                           INIT[str(init)] if init is not None else "normal")

    @v_args(meta=True)
    def family(self, meta, children):
        var, (lo, hi) = children
        return S.Family(self._span(meta), str(var), lo, hi)

    def range(self, children):
        return (children[0], children[1])

    @v_args(meta=True)
    def real_type(self, meta, children):
        return S.RealType(self._span(meta), [c for c in children if c is not None])

    @v_args(meta=True)
    def dim(self, meta, children):
        child = children[0]
        if isinstance(child, Token) and child.type == "ELLIPSIS":
            return S.Ellipsis_(self._span(meta))
        return child

    def _dims(self, rest) -> list:
        dims = []
        for c in rest:
            if isinstance(c, Token) and c.type == "NAME":
                dims.append(S.Name(self._tspan(c), str(c)))
            elif isinstance(c, Token) and c.type == "INT":
                dims.append(S.Num(self._tspan(c), parse_number(c, self.filename), str(c)))
            else:
                dims.append(c)
        return dims

    def dimpow(self, children):
        return ("dims", self._dims(children))

    @v_args(meta=True)
    def int_range_type(self, meta, children):
        lo, hi, *rest = children
        dims = rest[0][1] if rest and rest[0] is not None else []
        return S.IntType(self._span(meta), lo, hi, dims)

    @v_args(meta=True)
    def int_set_type(self, meta, children):
        dims = []
        if isinstance(children[-1], tuple):
            dims = children[-1][1]
            children = children[:-1]
        values = [c for c in children if c is not None]
        return S.IntType(self._span(meta), values[0], values[-1], dims, values=values)

    @v_args(meta=True)
    def perm_type(self, meta, children):
        return S.PermType(self._span(meta), children[0])

    @v_args(meta=True)
    def pad_type(self, meta, children):
        return S.PadType(self._span(meta), children[0])

    @v_args(meta=True)
    def tuple_type(self, meta, children):
        return S.TupleType(self._span(meta), children)

    # ------------------------------------------------------------ equations
    @v_args(meta=True)
    def equation(self, meta, children):
        lhs = [c for c in children if isinstance(c, (S.LhsName, S.LhsLayer, S.LhsHead,
                                                      S.LhsIndex))]
        rest = children[len(lhs):]
        rhs = rest[0]
        where: list[S.WhereEq] = []
        family = None
        for extra in rest[1:]:
            if isinstance(extra, S.Family):
                family = extra
            elif isinstance(extra, list):
                where = extra
        return S.Equation(self._span(meta), lhs, rhs, where, family)

    @v_args(meta=True)
    def lhs_name(self, meta, children):
        return S.LhsName(self._span(meta), str(children[0]))

    @v_args(meta=True)
    def lhs_layer(self, meta, children):
        return S.LhsLayer(self._span(meta), str(children[0]), children[1])

    @v_args(meta=True)
    def lhs_head(self, meta, children):
        return S.LhsHead(self._span(meta), str(children[0]),
                         [str(c) for c in children[1:] if c is not None])

    @v_args(meta=True)
    def lhs_index(self, meta, children):
        head = children[0]
        if isinstance(head, Token):
            head = S.LhsName(self._tspan(head), str(head))
        return S.LhsIndex(self._span(meta), head, [str(c) for c in children[1:]])

    def where(self, children):
        return children

    @v_args(meta=True)
    def where_eq(self, meta, children):
        return S.WhereEq(self._span(meta), str(children[0]), children[1], children[2])

    # ------------------------------------------------------------ expressions
    @v_args(meta=True)
    def name(self, meta, children):
        return S.Name(self._span(meta), str(children[0]))

    @v_args(meta=True)
    def member_at(self, meta, children):
        return S.MemberAt(self._span(meta), str(children[0])[:-2], children[1])

    @v_args(meta=True)
    def int_(self, meta, children):
        return S.Num(self._span(meta), parse_number(children[0], self.filename), str(children[0]))

    float_ = int_

    @v_args(meta=True)
    def inf(self, meta, children):
        return S.Inf(self._span(meta))

    add = _binop("+")
    sub = _binop("-")
    mul = _binop("*")
    div = _binop("/")
    matmul = _binop("@")
    mod = _binop("%")

    @v_args(meta=True)
    def neg(self, meta, children):
        return S.Neg(self._span(meta), children[0])

    @v_args(meta=True)
    def compare(self, meta, children):
        return S.Compare(self._span(meta), str(children[1]), children[0], children[2])

    @v_args(meta=True)
    def parity(self, meta, children):
        return S.Parity(self._span(meta), children[0], str(children[1]) == "even")

    @v_args(meta=True)
    def and_(self, meta, children):
        return S.BoolOp(self._span(meta), "and", children[0], children[1])

    @v_args(meta=True)
    def or_(self, meta, children):
        return S.BoolOp(self._span(meta), "or", children[0], children[1])

    @v_args(meta=True)
    def not_(self, meta, children):
        return S.Not(self._span(meta), children[0])

    @v_args(meta=True)
    def ifexp(self, meta, children):
        then, cond, orelse = children
        return S.IfExp(self._span(meta), cond, then, orelse)

    @v_args(meta=True)
    def index(self, meta, children):
        return S.Index(self._span(meta), children[0], children[1:])

    @v_args(meta=True)
    def full_slice(self, meta, children):
        return S.FullSlice(self._span(meta))

    @v_args(meta=True)
    def range_slice(self, meta, children):
        return S.RangeSlice(self._span(meta), children[0], children[1])

    @v_args(meta=True)
    def kwarg(self, meta, children):
        return S.Kwarg(self._span(meta), str(children[0]), children[1])

    @v_args(meta=True)
    def layer_ref(self, meta, children):
        return S.LayerRef(self._span(meta), children[0], children[1])

    @v_args(meta=True)
    def layer_range(self, meta, children):
        # X^(1..L): every layer's value, one LayerRef whose layer is a range
        span = self._span(meta)
        return S.LayerRef(span, children[0], S.RangeSlice(span, children[1], children[2]))

    @v_args(meta=True)
    def superscript(self, meta, children):
        return S.Superscript(self._span(meta), children[0], str(children[1]))

    @v_args(meta=True)
    def ellipsis(self, meta, children):
        return S.Ellipsis_(self._span(meta))

    @v_args(meta=True)
    def call(self, meta, children):
        func, *args = children
        args = [a for a in args if a is not None]
        span = self._span(meta)
        if isinstance(func, S.Name):
            return S.Call(span, func.name, func.span, args)
        if isinstance(func, S.Index) and isinstance(func.base, S.Name):
            return S.Call(span, func.base.name, func.base.span, args, hyper_args=func.items)
        raise FgcError("only a module or a primitive can be called", func.span,
                       "write `Name(args)` or `Name[hypers](args)`")

    @v_args(meta=True)
    def labeled(self, meta, children):
        label, func, *rest = children
        hyper_args: list = []
        if rest and isinstance(rest[0], tuple) and rest[0][0] == "hyper_list":
            hyper_args = rest[0][1]
            rest = rest[1:]
        args = [a for a in rest if a is not None]
        return S.Call(self._span(meta), str(func), self._tspan(func), args,
                      hyper_args=hyper_args, label=str(label))

    def hyper_list(self, children):
        return ("hyper_list", children)

    @v_args(meta=True)
    def tuple_(self, meta, children):
        return S.Tuple_(self._span(meta), children)


def _strings(tokens) -> list[str]:
    """STRING tokens' texts, without their quotes."""
    return [str(t)[1:-1] for t in tokens]
