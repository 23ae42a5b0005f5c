"""`fgc render`: a spec as LaTeX boxes, a Markdown summary, or a Graphviz diagram.

LaTeX follows the seed's boxed definitions: a module is Signature / Definition /
Parameters, a model is Input / Embedding / Layers / Output with each value's shape in a
right-hand column. Equations are typeset from the syntax tree (so they read as written),
shapes come from the checked IR. Markdown summarises hyperparameters, inputs and outputs
with their shapes, and the parameter table. DOT draws the model's data flow: module calls
and operations as nodes, the layer block as a cluster holding one sub-cluster per
equation (sub-block), residual paths as the edges they are, and the shape on every edge.
"""

from __future__ import annotations

import re
from fractions import Fraction

from ..elaborate import ir
from ..elaborate.symbolic import Poly, format_poly
from ..errors import printable
from ..syntax import nodes as S

GREEK = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota",
         "kappa", "lambda", "mu", "nu", "xi", "pi", "rho", "sigma", "tau", "phi", "chi",
         "psi", "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi", "Sigma", "Phi",
         "Psi", "Omega"}
ALIASES = {"eps": r"\epsilon"}
PREC = {"or": 1, "and": 2, "cmp": 3, "+": 4, "-": 4, "*": 5, "@": 5, "/": 5, "%": 5,
        "neg": 6, "atom": 9}

# ---------------------------------------------------------------- LaTeX


class TeX:
    """Typesets expressions of one module or model. `values` are the names that denote
    tensors (bold); hyperparameters and indices stay upright italics."""

    def __init__(self, values: set[str], modules: set[str]):
        self.values = values
        self.modules = modules

    # -- names
    def name(self, raw: str, value: bool | None = None) -> str:
        prime = ""
        while raw.endswith("'"):
            raw, prime = raw[:-1], prime + "'"
        base, sub, sup = _split_name(raw)
        if value is None:
            value = raw in self.values or raw.split("^")[0] in self.values or \
                base in self.values
        hat = base.endswith("hat") and len(base) > 3
        if hat:
            base = base[:-3]
        core = self.symbol(base, bold=value and not self.is_module(raw))
        if hat:
            core = r"\hat{" + core + "}"
        if sub:
            if "_" in core:  # Vv_i: a labelled symbol takes the index as a group
                core = "{" + core + "}"
            core += "_" + _group(self.script(sub))
        if sup == "T":
            core += r"^\top"
        elif sup:
            core += "^" + _group(self.script(sup))
        return core + prime

    def is_module(self, raw: str) -> bool:
        return raw in self.modules or raw.split("^")[0] in self.modules

    def symbol(self, base: str, bold: bool) -> str:
        if base in ALIASES:
            return ALIASES[base]
        if base in GREEK:
            tex = "\\" + base
            return r"\bm{" + tex + "}" if bold else tex
        if len(base) == 1:
            return r"\bm{" + base + "}" if bold else base
        greek = re.fullmatch(r"([a-zA-Z]+?)(\d+)", base)
        if greek and greek.group(1) in GREEK:  # sigma2
            return self.symbol(greek.group(1), bold) + "_" + _group(greek.group(2))
        if bold and re.fullmatch(r"[A-Z][a-z]", base):  # Hf: H with a one-letter label
            return r"\bm{" + base[0] + r"}_{\text{" + base[1:] + "}}"
        return r"\text{" + _escape(base) + "}"

    def script(self, text: str) -> str:
        if re.fullmatch(r"[A-Za-z]", text) or re.fullmatch(r"\d+", text):
            return text
        if text in GREEK:
            return "\\" + text
        if re.fullmatch(r"[A-Za-z]+\d*|[A-Za-z_]+", text):
            return r"\text{" + _escape(text) + "}"
        return text

    # -- expressions
    def expr(self, e: S.Expr, parent: int = 0) -> str:
        text, prec = self._expr(e)
        return f"\\left({text}\\right)" if prec < parent else text

    def _expr(self, e: S.Expr) -> tuple[str, int]:
        atom = PREC["atom"]
        if isinstance(e, S.Name):
            return self.name(e.name), atom
        if isinstance(e, S.Num):
            return e.text, atom
        if isinstance(e, S.Inf):
            return r"\infty", atom
        if isinstance(e, S.Neg):
            return "-" + self.expr(e.operand, PREC["neg"]), PREC["neg"]
        if isinstance(e, S.BinOp):
            p = PREC[e.op]
            if e.op == "/":
                return rf"\frac{{{self.expr(e.left)}}}{{{self.expr(e.right)}}}", atom
            left = self.expr(e.left, p)
            right = self.expr(e.right, p + 1)
            op = {"@": " ", "*": r" \odot ", "%": r" \bmod ", "+": " + ", "-": " - "}[e.op]
            if e.op == "*" and not (self.tensor(e.left) and self.tensor(e.right)):
                op = r" \cdot " if left[-1:].isdigit() and right[:1].isdigit() else " "
            return f"{left}{op}{right}", p
        if isinstance(e, S.Compare):
            op = {"==": "=", "!=": r"\neq", "<": "<", "<=": r"\leq", ">": ">",
                  ">=": r"\geq"}[e.op]
            return f"{self.expr(e.left, 4)} {op} {self.expr(e.right, 4)}", PREC["cmp"]
        if isinstance(e, S.Parity):
            return rf"{self.expr(e.operand, 4)} \text{{ is {'even' if e.even else 'odd'}}}", \
                PREC["cmp"]
        if isinstance(e, S.BoolOp):
            p = PREC[e.op]
            return rf"{self.expr(e.left, p)} \text{{ {e.op} }} {self.expr(e.right, p)}", p
        if isinstance(e, S.Not):
            return rf"\text{{not }} {self.expr(e.operand, PREC['neg'])}", PREC["neg"]
        if isinstance(e, S.IfExp):
            return (rf"\begin{{cases}} {self.expr(e.then)} & \text{{if }} "
                    rf"{self.expr(e.cond)}, \\ {self.expr(e.orelse)} & "
                    r"\text{otherwise} \end{cases}"), atom
        if isinstance(e, S.FullSlice):
            return ":", atom
        if isinstance(e, S.RangeSlice):
            return rf"{self.expr(e.lo, 4)}\mathord{{:}}{self.expr(e.hi, 4)}", atom
        if isinstance(e, S.Kwarg):
            return f"{self.name(e.name, False)} = {self.expr(e.value)}", atom
        if isinstance(e, S.Index):
            items = ", ".join(self.expr(i) for i in e.items)
            return f"{self.expr(e.base, atom)}[{items}]", atom
        if isinstance(e, S.LayerRef):
            return self.layer(self.expr(e.base, atom), e.layer), atom
        if isinstance(e, S.MemberAt):
            return f"{{{self.name(e.family, False)}}}_{{{self.expr(e.index)}}}", atom
        if isinstance(e, S.Superscript):
            sup = r"\top" if e.name == "T" else _group(self.script(e.name))
            return f"{{{self.expr(e.base, atom)}}}^{sup}", atom
        if isinstance(e, S.Ellipsis_):
            return r"\ldots", atom
        if isinstance(e, S.Call):
            args = ", ".join(self.expr(a) for a in e.args)
            if e.func == "sqrt" and len(e.args) == 1:
                return rf"\sqrt{{{args}}}", atom
            if e.func in ("exp", "log", "tanh", "sin", "cos", "max", "min"):
                return rf"\{e.func}({args})", atom
            head = self.name(e.func, False)
            if e.hyper_args:
                head += "_" + _group(", ".join(self.expr(a) for a in e.hyper_args))
            return f"{head}({args})", atom
        if isinstance(e, S.Tuple_):
            return "(" + ", ".join(self.expr(i) for i in e.items) + ")", atom
        raise TypeError(f"cannot typeset {type(e).__name__}")

    def tensor(self, e: S.Expr) -> bool:
        """Whether an expression involves a tensor (a value), not only sizes and numbers."""
        if isinstance(e, S.Name):
            return e.name in self.values or e.name.split("^")[0] in self.values or \
                _split_name(e.name)[0] in self.values
        if isinstance(e, (S.Num, S.Inf)):
            return False
        if isinstance(e, S.Call):
            return True
        return any(self.tensor(x) for x in vars(e).values() if isinstance(x, S.Expr)) or \
            any(self.tensor(x) for v in vars(e).values() if isinstance(v, list)
                for x in v if isinstance(x, S.Expr))

    def layer(self, base: str, layer: S.Expr) -> str:
        # a base that already has a superscript gets the layer on a group of its own
        if isinstance(layer, S.RangeSlice):  # X^(1..L): every layer's value
            sup = "{(" + self.expr(layer.lo) + r", \ldots, " + self.expr(layer.hi) + ")}"
        else:
            sup = "{(" + self.expr(layer) + ")}"
        return f"{{{base}}}^{sup}" if "^" in base else f"{base}^{sup}"

    # -- types
    def type(self, t) -> str:
        if isinstance(t, S.RealType):
            return r"\mathbb{R}" + self.dims(t.dims)
        if isinstance(t, S.IntType):
            if t.values is not None:
                base = r"\{" + ", ".join(self.expr(v) for v in t.values) + r"\}"
            else:
                base = rf"\{{{self.expr(t.lo)}, \ldots, {self.expr(t.hi)}\}}"
            return base + self.dims(t.dims)
        if isinstance(t, S.PermType):
            return r"\mathcal{Z}_" + _group(self.expr(t.n))
        if isinstance(t, S.PadType):
            return r"\{0, 1\}^{" + self.expr(t.n) + "}"
        if isinstance(t, S.TupleType):
            return r" \times ".join(self.type(x) for x in t.items)
        raise TypeError(type(t).__name__)

    def dims(self, dims: list) -> str:
        if not dims:
            return ""
        parts = [r"\ldots" if isinstance(d, S.Ellipsis_) else self.expr(d, 5) for d in dims]
        return "^{" + r" \times ".join(parts) + "}"

    def family(self, f: S.Family | None) -> str:
        if f is None:
            return ""
        return (rf" \quad \text{{for }} {f.var} \in \{{{self.expr(f.lo)}, \ldots, "
                rf"{self.expr(f.hi)}\}}")

    def lhs(self, lhs) -> str:
        if isinstance(lhs, S.LhsName):
            return self.name(lhs.name)
        if isinstance(lhs, S.LhsLayer):
            return self.layer(self.name(lhs.name, True), lhs.layer)
        if isinstance(lhs, S.LhsHead):
            args = ", ".join(self.name(p, True) for p in lhs.params)
            return f"{self.name(lhs.name, False)}({args})"
        if isinstance(lhs, S.LhsIndex):
            head = self.lhs(lhs.head)
            if isinstance(lhs.head, S.LhsHead) or "(" in head:
                head = f"({head})" if isinstance(lhs.head, S.LhsName) else head
            return f"{head}_{{{', '.join(lhs.indices)}}}"
        raise TypeError(type(lhs).__name__)

    def equation(self, eq: S.Equation) -> str:
        left = ", ".join(self.lhs(x) for x in eq.lhs)
        text = f"{left} = {self.expr(eq.rhs)}"
        for w in eq.where:
            text += (rf", \quad \text{{where }} {self.name(w.name, True)} = "
                     rf"{self.expr(w.value)}{self.family(w.family)}")
        return text + self.family(eq.family)


def _split_name(raw: str) -> tuple[str, str, str]:
    """`W_i^Q` -> (W, i, Q); `Mask^AR` -> (Mask, "", AR); `j_masked` -> (j, masked, "")."""
    sup = ""
    if "^" in raw:
        raw, sup = raw.split("^", 1)
    base, _, sub = raw.partition("_")
    return base, sub, sup


def _group(text: str) -> str:
    return text if len(text) == 1 else "{" + text + "}"


def _escape(text: str) -> str:
    return re.sub(r"([_#%&$])", r"\\\1", text)


def _tex_comment(text: str) -> str:
    """Text (a file name) as the rest of a `%` comment line: a line break in it would end
    the comment and make what follows live TeX (`\\input{...}`), so it and every other
    control character is written as an escape."""
    return printable(text)


def latex(spec, cfg, stdlib: bool = False) -> str:
    """A standalone LaTeX document: the file's modules (and, with `stdlib`, the standard
    library modules its model uses), then the model's box."""
    model = spec.model if spec.file.models else None
    names = {m.name for m in spec.modules.values()}
    own = list(spec.file.modules)
    if stdlib and model is not None:
        used = ir.used_modules(cfg.model, cfg.functions) if cfg is not None else []
        own = [spec.modules[n] for n in used if n in spec.modules and
               spec.modules[n] not in own] + own
    boxes = [module_box(m, names) for m in own]
    if model is not None:
        boxes.append(model_box(spec, cfg, names))
    body = "\n\n".join(boxes)
    return "\n".join([
        r"\documentclass{article}",
        r"\usepackage[margin=1.5cm,landscape]{geometry}",
        r"\usepackage{amsmath,amssymb,bm}",
        r"\pagestyle{empty}",
        r"\begin{document}",
        f"% {_tex_comment(spec.path)}, typeset by fgc render",
        body,
        r"\end{document}",
        "",
    ])


def module_box(m: S.Module, modules: set[str]) -> str:
    values = {a.name for a in m.inputs} | {p.name for p in m.params}
    for eq in m.equations:
        values |= {w.name for w in eq.where}
    tex = TeX(values, modules)
    ins = r" \times ".join(_arg_type(tex, a) for a in m.inputs)
    head = tex.name(m.name, False)
    hypers = [h.name for h in m.hypers]
    if hypers and m.name.startswith("Stack"):
        head += "_" + _group(", ".join(hypers))
    signature = f"{head} : {ins} \\to {tex.type(m.out_type)}" if m.inputs else \
        f"{head} \\in {tex.type(m.out_type)}"
    rows = [(r"\text{Signature:}", signature + ".")]
    for k, eq in enumerate(m.equations):
        rows.append((r"\text{Definition:}" if k == 0 else "", tex.equation(eq) + "."))
    if m.params:
        params = []
        for p in m.params:
            params.append(f"{tex.name(p.name, True)} \\in {tex.type(p.type)}"
                          f"{tex.family(p.family)}")
        rows.append((r"\text{Parameters:}", r", \\ & \hspace{10pt} \displaystyle ".join(
            params) + "."))
    return _box(f"$ {tex.name(m.name, False)} $", rows, "ll")


def _arg_type(tex: TeX, a: S.ArgDecl) -> str:
    """An argument's type; a family of A arguments is the type to the power A."""
    t = tex.type(a.type)
    if a.family is None:
        return t
    return rf"\left({t}\right)^{_group(tex.expr(a.family.hi))}"


def model_box(spec, cfg, modules: set[str]) -> str:
    m = spec.model
    values = {a.name for a in m.inputs} | {p.name for p in m.params}
    for st in _walk(m.statements):
        if isinstance(st, S.Equation):
            for lhs in st.lhs:
                values.add(lhs.name if not isinstance(lhs, S.LhsIndex) else lhs.head.name)
    tex = TeX(values, modules)
    types = _value_types(cfg.model) if cfg is not None else {}
    rows = []
    for k, a in enumerate(m.inputs):
        shape = types.get(a.name)
        rows.append((r"\text{Input}" if k == 0 else "",
                     f"{tex.name(a.name, True)} \\in {tex.type(a.type)}", shape))
    section = "Embedding"
    for st in m.statements:
        if isinstance(st, S.Equation):
            rows.append((rf"\text{{{section}}}" if section else "", tex.equation(st),
                         types.get(_lhs_key(st))))
            section = ""
        elif isinstance(st, S.Loop):
            eqs = [x for x in st.body if isinstance(x, S.Equation)]
            for k, eq in enumerate(eqs):
                text = tex.equation(eq) + ("," if k < len(eqs) - 1 else
                                           rf" \quad \text{{for }} {st.var} = "
                                           rf"{tex.expr(st.lo)}, \ldots, {tex.expr(st.hi)}")
                rows.append((r"\text{Layers}" if k == 0 else "", text,
                             types.get(_lhs_key(eq, layer=True))))
            section = ""
        elif isinstance(st, S.Output):
            args = ", ".join(tex.name(a.name, True) for a in m.inputs)
            name = st.name or m.name
            rows.append((r"\text{Output}", f"{tex.name(name, False)}({args}) = "
                         f"{tex.expr(st.value)}", types.get(name)))
    shaped = [(label, eq, f"({_shape_tex(s)})" if s is not None else "")
              for label, eq, s in rows]
    return _box(f"$ \\textbf{{{_escape(m.name)}}} $", shaped, "@{}lll")


def _box(title: str, rows: list[tuple], cols: str) -> str:
    lines = [f"% {title}", r"\begin{center}\fbox{\begin{minipage}{0.96\linewidth}",
             r"\centering " + title.replace("$ ", "$").replace(" $", "$") + r"\\[4pt]",
             r"$\begin{array}{" + cols + "}"]
    for row in rows:
        cells = [row[0], r"\hspace{10pt} \displaystyle " + row[1]] + (
            [r"\hspace{10pt} " + row[2]] if len(row) > 2 else [])
        lines.append("  " + " & ".join(cells) + r" \\")
    lines += [r"\end{array}$", r"\end{minipage}}\end{center}"]
    return "\n".join(lines)


def _walk(statements):
    for st in statements:
        if isinstance(st, S.Loop):
            yield from st.body
        else:
            yield st


def _lhs_key(eq: S.Equation, layer: bool = False) -> str | None:
    lhs = eq.lhs[0]
    if isinstance(lhs, S.LhsLayer):
        return f"{lhs.name}^(l)" if layer else f"{lhs.name}^({_expr_text(lhs.layer)})"
    if isinstance(lhs, S.LhsName):
        return lhs.name
    return None


def _expr_text(e: S.Expr) -> str:
    if isinstance(e, S.Num):
        return e.text
    if isinstance(e, S.Name):
        return e.name
    return ""


def _value_types(model: ir.Model) -> dict[str, ir.TensorType]:
    """The type of every value a model names: inputs, parameters, equation results, and
    each carried X^(l-1) (typed as its X^(0))."""
    out = {v.name: v.type for v in model.inputs}
    out.update((p.name, p.type) for p in model.params)
    for item in model.body:
        if isinstance(item, ir.Loop):
            for c in item.carried:
                if c.init in out:
                    out[c.inner] = out[c.init]
        for e in (item.body if isinstance(item, ir.Loop) else [item]):
            for v in e.outs:
                out[v.name] = v.type
        if isinstance(item, ir.Loop):
            out.update((outer, out[inner]) for inner, outer in item.results if inner in out)
            out.update((outer, out[inner].with_shape((item.hi, *out[inner].shape)))
                       for inner, outer in item.stacks if inner in out)
    for v in model.outputs:
        out[v.name] = v.type
    return out


def _shape_tex(t: ir.TensorType) -> str:
    if not t.shape:
        return "1"
    return r" \times ".join(_poly_tex(d) for d in t.shape)


def _poly_tex(p) -> str:
    if not isinstance(p, Poly):
        return r"\ldots"
    return format_poly(p, mul=" ").replace("*", " ")


# ---------------------------------------------------------------- Markdown


def markdown(spec, cfg, report: dict) -> str:
    """A summary: hyperparameters, inputs and outputs with shapes, the parameter table."""
    m = spec.model
    where = f"preset `{cfg.name}`" if cfg.name not in ("defaults", "symbolic") else \
        "the defaults"
    out = [f"# {m.name}", "", f"From {_md_code(spec.path)}, with {where}.", "",
           "## Hyperparameters", "", "| name | value | declared |", "|---|---:|---|"]
    declared = {h.name: h for h in m.hypers}
    for name, value in report["hyperparameters"].items():
        h = declared.get(name)
        text = report["derived"].get(name) or ("" if h is None or h.default is None else
                                               _source_text(spec, h.default.span))
        declared_as = _md_code(text, cell=True) if text else "free"
        out.append(f"| `{name}` | {_num(value)} | {declared_as} |")
    types = _value_types(cfg.model)
    sym = _value_types(spec.symbolic().model)
    out += ["", "## Inputs and outputs", "", "| | name | type | shape |", "|---|---|---|---|"]
    for v in cfg.model.inputs:
        out.append(f"| input | `{v.name}` | `{ir.format_type(sym[v.name])}` | "
                   f"{_shape_md(types[v.name])} |")
    for v in cfg.model.outputs:
        out.append(f"| output | `{v.name}` | `{ir.format_type(sym[v.name])}` | "
                   f"{_shape_md(types[v.name])} |")
    out += ["", "Every value carries a leading batch axis at run time; a run may use any "
            "length up to the spec's maximum.", "",
            "## Parameters", "", "| instance | module | per copy | copies | total | formula |",
            "|---|---|---:|---:|---:|---|"]
    for row in report["modules"]:
        out.append(f"| `{row['name']}` | {row['module']} | {row['per_copy']:,} | "
                   f"{row['copies']:,} | {row['total']:,} | "
                   f"{'`' + row['formula'] + '`' if row['formula'] else ''} |")
    out.append(f"| **total** | | | | **{report['total']:,}** | |")
    out += ["", f"N = `{report['formula']}`"]
    if report["formula_expanded"]:
        out.append(f"= `{report['formula_expanded']}`")
    for t in report["tied"]:
        out.append("")
        out.append(f"`{t['param']}` is used in {' and '.join(t['used_in'])} and counted once.")
    return "\n".join(out) + "\n"


def _md_code(text: str, cell: bool = False) -> str:
    """Text from a file or a file name as one Markdown code span: control characters
    escaped, a fence longer than any run of backticks inside, and `|` escaped in a table
    cell (GitHub splits rows on it before reading code spans)."""
    text = printable(text)
    if cell:
        text = text.replace("|", "\\|")
    fence = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _source_text(spec, span) -> str:
    line = spec.sources.line(span.file, span.line) or ""
    if span.end_line == span.line:
        return line[span.column - 1:span.end_column - 1]
    return line[span.column - 1:]


def _num(v) -> str:
    if isinstance(v, int):
        return f"{v:,}"
    return repr(v)


def _shape_md(t: ir.TensorType) -> str:
    if not t.shape:
        return "scalar"
    return " × ".join(_dim_text(d) for d in t.shape)


def _dim_text(d) -> str:
    if isinstance(d, Poly):
        if d.is_const():
            v = d.const_value()
            return f"{v.numerator:,}" if v.denominator == 1 else str(Fraction(v))
        return format_poly(d)
    return "…"


# ---------------------------------------------------------------- Graphviz DOT


def dot(spec, cfg) -> str:
    """The model's data flow as a Graphviz digraph. Named values are ellipses, module
    calls boxes, operations small circles; the layer body is a cluster (one sub-cluster
    per equation), and every edge is labelled with the shape of the value it carries."""
    model = cfg.model
    g = _Dot()
    types = _value_types(model)
    produced: dict[str, str] = {}  # value name -> node id that makes it
    params = {p.name for p in model.params}
    inputs = {v.name for v in model.inputs}

    def value_node(name: str) -> str:
        if name in produced:
            return produced[name]
        if name in inputs:
            produced[name] = g.node(name, f"input {name}", "invhouse", "#dbeafe")
        elif name in params:
            produced[name] = g.node(name, name, "note", "#f3f4f6", small=True)
        return produced.get(name, "")

    for v in model.inputs:
        value_node(v.name)
    def emit(e: ir.Eqn, prefix: str) -> None:
        if e.op == "call":
            label, shape, fill = e.attrs["module"], "box", "#fef3c7"
        else:
            label, shape, fill = _OP_LABELS.get(e.op, e.op), "circle", "#ffffff"
        guard = (" if " + " and ".join(str(x) for x in e.guards)) if e.guards else ""
        if e.op == "cond":
            label = f"{e.attrs['guard']} ?"
        nid = g.node(prefix + (e.outs[0].name if e.outs else e.op), label + guard, shape, fill,
                     small=shape == "circle")
        for o in e.ins:
            if o.name is None:
                continue
            src = value_node(o.name)
            if src:
                g.edge(src, nid, _shape_label(types.get(o.name)))
        for v in e.outs:
            if not v.name.startswith("%"):
                out = g.node(prefix + v.name + "#value", v.name, "ellipse", "#dcfce7")
                g.edge(nid, out, _shape_label(v.type))
                produced[v.name] = out
            else:
                produced[v.name] = nid

    for item in model.body:
        if isinstance(item, ir.Loop):
            with g.cluster("layers", f"layers {item.var} = 1..{format_poly(item.hi)}",
                           "#fafafa"):
                for c in item.carried:
                    inner = g.node(c.inner, c.inner, "ellipse", "#dcfce7")
                    if c.init in produced:
                        g.edge(produced[c.init], inner, _shape_label(types.get(c.init)))
                    produced[c.inner] = inner
                groups: dict[int, list[ir.Eqn]] = {}
                for e in item.body:
                    groups.setdefault(e.span.line if e.span else -1, []).append(e)
                for line, eqns in groups.items():
                    named = [v.name for e in eqns for v in e.outs if not v.name.startswith("%")]
                    title = named[-1] if named else f"line {line}"
                    with g.cluster(f"block{line}", f"{title}  (line {line})", "#ffffff"):
                        for e in eqns:
                            emit(e, "l/")
                for c in item.carried:
                    g.edge(produced[c.result], produced[c.inner], "next layer", dashed=True)
                for inner, outer in item.results:
                    produced[outer] = produced.get(inner, "")
                for inner, outer in item.stacks:  # every layer's value, stacked
                    if inner in produced:
                        stacked = g.node(outer, f"{inner} for each layer", "box3d", "#dcfce7")
                        g.edge(produced[inner], stacked, _shape_label(types.get(inner)))
                        produced[outer] = stacked
        else:
            emit(item, "")
    for v in model.outputs:
        src = produced.get(v.name)
        if src:
            out = g.node(v.name + "#output", f"output {v.name}", "house", "#fee2e2")
            g.edge(src, out, _shape_label(v.type))
    return g.text(f"{model.name} ({spec.path})")


_OP_LABELS = {"add": "+", "sub": "−", "mul": "⊙", "div": "÷", "matmul": "@",
              "transpose": "ᵀ", "neg": "−", "concat": "concat", "index": "[ ]"}


def _shape_label(t) -> str:
    if t is None:
        return ""
    if not t.shape:
        return "scalar"
    return " × ".join(_dim_text(d) for d in t.shape)


class _Dot:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.ids: dict[str, str] = {}
        self.depth = 1

    def node(self, key: str, label: str, shape: str, fill: str, small: bool = False) -> str:
        if key in self.ids:
            return self.ids[key]
        nid = f"n{len(self.ids)}"
        self.ids[key] = nid
        extra = ', fontsize=10, width=0.3, height=0.3' if small else ""
        self.lines.append("  " * self.depth + f'{nid} [label={_q(label)}, shape={shape}, '
                          f'style=filled, fillcolor="{fill}"{extra}];')
        return nid

    def edge(self, a: str, b: str, label: str, dashed: bool = False) -> None:
        style = ", style=dashed, constraint=false" if dashed else ""
        self.lines.append("  " * self.depth + f"{a} -> {b} [label={_q(label)}{style}];")

    def cluster(self, key: str, label: str, fill: str):
        g = self

        class _Ctx:
            def __enter__(self):
                name = re.sub(r"\W", "_", key)
                g.lines.append("  " * g.depth + f"subgraph cluster_{name} {{")
                g.depth += 1
                g.lines.append("  " * g.depth + f'label={_q(label)}; style="rounded,filled"; '
                               f'fillcolor="{fill}"; color="#9ca3af";')

            def __exit__(self, *exc):
                g.depth -= 1
                g.lines.append("  " * g.depth + "}")
        return _Ctx()

    def text(self, title: str) -> str:
        head = ["digraph fgc {", f"  label={_q(title)}; labelloc=t; fontname=Helvetica;",
                "  node [fontname=Helvetica]; edge [fontname=Helvetica, fontsize=9];",
                "  rankdir=TB;"]
        return "\n".join(head + self.lines + ["}", ""])


def _q(text: str) -> str:
    """A DOT quoted string; control characters (from a file name) shown as escapes."""
    text = printable(text)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
