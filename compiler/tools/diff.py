"""`fgc diff`: how two architectures differ, compared as math rather than as text.

Both specs are elaborated to IR. Each side's model body is cut into *statements*, one per
named value (`Hhat^(l) = ...`), and every statement is reduced to a canonical term: the
operations it applies to its inputs, with temporaries expanded, the operands of `+`, `*`,
`max`, ... sorted, sums flattened, module instances by module (not by instance name), and
other statements referred to by identity rather than by name. A named value used once in
its section is expanded where it is used, so naming a sub-expression is no change either.

Statements are then matched section by section (embedding, layers, output): equal terms
first, then by name or role (the value a layer carries, the k-th output) for the ones that
changed, repeating until nothing more matches, so a change upstream does not make every
later statement look changed; what is left pairs up in order when both sides have as
many. Renaming a local value or reordering independent equations therefore changes
nothing; moving a LayerNorm from a sub-block's output to its input changes one statement,
and the note under it says so.

Around the equations: hyperparameters, inputs, outputs, parameters with their shapes, the
modules used (a module of the same name whose definition differs is shown with its lines),
per-layer differences when layers are conditional (GPT-3's alternating masks), instances
that become one for all layers (ALBERT's sharing) or stop being, and the parameter count per
module and in total, as a formula and for the configurations chosen. A statement that
gains a projection of its result (`... @ W + b`) says so, and says which parameters it
factorizes when their last axis shrank to the projection's input (ALBERT's V x E embedding
times E x H).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from ..elaborate import ir
from ..elaborate.elaborator import guard_holds
from ..elaborate.ir import format_type
from ..elaborate.primitives import PRIMITIVES
from ..elaborate.symbolic import Poly, format_poly
from ..passes.params import as_int
from .printer import _attr

COMMUTATIVE = {name for name, p in PRIMITIVES.items() if p.commutative}
FLATTEN = {"add", "mul"}  # associative too: a + b + c is one sum of three


# ---------------------------------------------------------------- one side


@dataclass
class Side:
    path: str
    spec: object  # pipeline.Spec
    sym: object  # the symbolic Config
    cfg: object | None  # the numeric Config for the chosen preset / sets, if any

    @property
    def model(self) -> ir.Model:
        return self.sym.model

    def line(self, span) -> str:
        """The source line of `span`, without its comment."""
        if span is None:
            return ""
        text = self.spec.sources.line(span.file, span.line) or ""
        return text.split("#", 1)[0].strip()


@dataclass
class Statement:
    name: str  # the value it defines
    section: str  # "embedding", "layers", "output"
    eqn: ir.Eqn
    role: tuple | None = None  # ("init", k), ("carried", k) or ("output", k)


@dataclass
class Term:
    text: str  # canonical form: equal texts, equal math
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (module, instance,
    # module with its bindings), in order
    inlined: list[str] = field(default_factory=list)  # named values expanded into it
    leaves: set[str] = field(default_factory=set)  # inputs and parameters it reads
    op: str | None = None  # the operation at the root (None for a leaf)
    module: str | None = None  # the module, when the root is a module call
    args: list[Term] = field(default_factory=list)
    head: str = ""  # the root with its attributes, as in `text`

    def nodes(self):
        yield self
        for t in self.args:
            yield from t.nodes()


def _real_defaults(side: Side) -> dict[str, Poly]:
    """Real-valued hyperparameters with a literal default (`eps = 1e-5`): compared by value,
    so a LayerNorm given `eps` and one given the same number are the same."""
    out = {}
    for h in side.spec.model.hypers:
        if h.name in side.sym.hypers.reals and h.default is not None:
            if side.cfg is not None:
                v = side.cfg.values.get(h.name)
            else:
                from ..pipeline import _literal
                v = _literal(h.default)
            if isinstance(v, float):
                out[h.name] = Poly.const(Fraction(repr(v)))  # 1e-5 as exactly 1/100000
            elif isinstance(v, Poly) and v.is_const():  # a preset's whole 500000.0
                out[h.name] = v
    return out


def _number(v, reals: dict[str, Poly]):
    """A binding's value with real hyperparameters replaced by their values; exact
    fractions and floats of the same decimal print alike."""
    if isinstance(v, Poly) and reals and v.symbols() & reals.keys():
        v = v.subs(reals)
    if isinstance(v, Poly) and v.is_const() and v.const_value().denominator != 1:
        return float(v.const_value())
    return v


class Body:
    """One side's model cut into statements, and the terms of those statements."""

    def __init__(self, side: Side):
        m = side.model
        self.inputs = {v.name for v in m.inputs}
        self.params = {p.name for p in m.params}
        self.reals = _real_defaults(side)
        self.defs: dict[str, tuple[ir.Eqn, int]] = {}
        self.loop: ir.Loop | None = None
        self.section_of: dict[str, str] = {}
        section = "embedding"
        order: list[tuple[str, ir.Eqn]] = []
        for item in m.body:
            eqns = item.body if isinstance(item, ir.Loop) else [item]
            if isinstance(item, ir.Loop):
                self.loop = item
                section = "layers"
            for e in eqns:
                for k, v in enumerate(e.outs):
                    self.defs[v.name] = (e, k)
                    self.section_of[v.name] = section
                    if not v.name.startswith("%"):
                        order.append((v.name, e))
            if isinstance(item, ir.Loop):
                section = "output"
        for v in m.outputs:  # an output may be named by the equation that computes it
            self.section_of.setdefault(v.name, "output")
        # how often a value is read; of a condition's two branches only one runs, so
        # `Hf @ W_e^T if tied == 1 else LMHead(Hf)` reads Hf once
        uses: Counter = Counter()
        below: dict[str, Counter] = {}  # a temporary: the reads in the expression it ends
        for item in m.body:
            for e in (item.body if isinstance(item, ir.Loop) else [item]):
                parts = [below.pop(o.name, Counter()) if o.name is not None and
                         o.name.startswith("%") else Counter({o.name: 1})
                         if o.name is not None else Counter() for o in e.ins]
                reads = parts[0] | parts[1] if e.op == "cond" and len(parts) == 2 else \
                    sum(parts, Counter())
                temps = [v.name for v in e.outs if v.name.startswith("%")]
                if temps and len(temps) == len(e.outs):
                    for t in temps:
                        below[t] = reads
                else:
                    uses.update(reads)
        for reads in below.values():  # temporaries read by no equation
            uses.update(reads)
        self.prev: dict[str, str] = {}  # X^(l-1) inside the body -> X^(0)
        self.last: dict[str, str] = {}  # X^(L) after the layers -> X^(l)
        self.stack: dict[str, str] = {}  # X^(1..L) after the layers -> X^(l) (or X^(l-1))
        keep: set[str] = {v.name for v in m.outputs}
        carried_index: dict[str, int] = {}
        init_index: dict[str, int] = {}
        # every `layers` block (an encoder's, then a decoder's); carried values are numbered
        # through all of them
        for loop in (item for item in m.body if isinstance(item, ir.Loop)):
            for c in loop.carried:
                self.prev[c.inner] = c.init
                keep |= {c.init, c.result}
                carried_index[c.result] = init_index[c.init] = len(carried_index)
            for inner, outer in loop.results:
                self.last[outer] = inner
                if uses[outer]:
                    keep.add(inner)
            for inner, outer in loop.stacks:
                self.stack[outer] = inner
                keep.add(next((c.result for c in loop.carried if c.inner == inner), inner))
        out_index = {v.name: k for k, v in enumerate(m.outputs)}
        self.statements: list[Statement] = []
        self.inline: set[str] = set()
        for name, e in order:
            if name not in keep and uses[name] == 1:
                self.inline.add(name)
                continue
            role = None
            if name in carried_index:
                role = ("carried", carried_index[name])
            elif name in init_index:
                role = ("init", init_index[name])
            elif name in out_index:
                role = ("output", out_index[name])
            self.statements.append(Statement(name, self.section_of[name], e, role))

    def term(self, name: str, ident, layer: dict | None = None) -> Term:
        """The canonical term of statement `name`; `ident(name)` names another statement
        (by its match, once it has one); `layer`, the values of the layer index and the
        hyperparameters, resolves per-layer conditions."""
        memo: dict[str, Term] = {}
        return self._value(name, ident, layer, memo, top=True)

    def _value(self, name: str, ident, layer, memo, top: bool = False) -> Term:
        if not top:
            if name in self.inputs:
                return Term(f"input {name}", leaves={name})
            if name in self.params:
                return Term(f"param {name}", leaves={name})
            if name in self.prev:
                init = self.prev[name]
                base = self._value(init, ident, None, memo) if init in self.inputs | \
                    self.params else Term(ident(init))
                return Term(f"prev({base.text})", leaves=base.leaves)
            if name in self.last:
                return Term(f"last({ident(self.last[name])})")
            if name in self.stack:
                inner = self.stack[name]
                entering = next((c.result for c in self.loop.carried if c.inner == inner), None)
                return Term(f"each_layer_in({ident(entering)})" if entering else
                            f"each_layer({ident(inner)})")
            if not name.startswith("%") and name not in self.inline:
                return Term(ident(name))
        if name in memo:
            return memo[name]
        e, k = self.defs[name]
        t = self._eqn(e, ident, layer, memo)
        if len(e.outs) > 1:
            t = Term(f"{t.text}#{k}", t.calls, t.inlined, t.leaves, t.op, t.module, t.args)
        if not top and not name.startswith("%"):
            t = Term(t.text, t.calls, [name] + t.inlined, t.leaves, t.op, t.module, t.args)
        memo[name] = t
        return t

    def _eqn(self, e: ir.Eqn, ident, layer, memo) -> Term:
        if e.op == "cond" and layer is not None:
            holds = guard_holds(ir.Guard(text=e.attrs["guard"]), layer)
            return self._operand(e.ins[0 if holds else 1], ident, layer, memo)
        args = [self._operand(o, ident, layer, memo) for o in e.ins]
        if e.op in FLATTEN:
            flat = []
            for o, t in zip(e.ins, args):
                temporary = o.name is not None and o.name.startswith("%") and \
                    o.member is None and not o.whole_family
                flat.extend(t.args if temporary and t.op == e.op and t.head == e.op else [t])
            args = flat
        if e.op in COMMUTATIVE:
            args = sorted(args, key=lambda t: t.text)
        if e.op == "call":
            binds = {k: _number(v, self.reals) for k, v in (e.attrs.get("bindings") or {}).items()}
            head = e.attrs["module"] + _attr(binds)
        else:
            head = e.op + (_attr({k: v for k, v in e.attrs.items() if v is not None})
                           if e.attrs else "")
        if e.family is not None:
            head += f" for {e.family[0]} in 1..{format_poly(e.family[1])}"
        if e.guards and layer is None:
            head += " when " + " and ".join(str(g) for g in e.guards)
        calls: list[tuple[str, str, str]] = []
        inlined: list[str] = []
        leaves: set[str] = set()
        for t in args:
            calls += t.calls
            inlined += t.inlined
            leaves |= t.leaves
        if e.op == "call":
            calls.append((e.attrs["module"], e.attrs.get("instance", ""), head))
        return Term(f"{head}({', '.join(t.text for t in args)})", calls, inlined, leaves, e.op,
                    e.attrs["module"] if e.op == "call" else None, args, head)

    def _operand(self, o: ir.Operand, ident, layer, memo) -> Term:
        if o.name is None:
            c = o.const
            return Term(f"const {format_poly(c) if isinstance(c, Poly) else repr(c)}")
        t = self._value(o.name, ident, layer, memo)
        if o.whole_family:
            return Term(f"{t.text}[*]", t.calls, t.inlined, t.leaves, "member", None, [t])
        if o.member is not None:
            m = o.member if isinstance(o.member, str) else format_poly(o.member)
            return Term(f"{t.text}[{m}]", t.calls, t.inlined, t.leaves, "member", None, [t])
        return t


# ---------------------------------------------------------------- matching statements


@dataclass
class Pair:
    a: Statement | None
    b: Statement | None
    same: bool
    term_a: Term | None = None
    term_b: Term | None = None


class Matcher:
    def __init__(self, a: Body, b: Body):
        self.bodies = {"a": a, "b": b}
        self.cls: dict[tuple[str, str], str] = {}
        self.pairs: list[Pair] = []
        self._next = 0

    def ident(self, side: str):
        def name_of(name: str) -> str:
            c = self.cls.get((side, name))
            return f"#{c}" if c is not None else f"{side}:{name}"
        return name_of

    def term(self, side: str, s: Statement, layer: dict | None = None) -> Term:
        body = self.bodies[side]
        if layer is not None:
            layer = {**layer, body.loop.var: layer["_layer"]} if body.loop else layer
        return body.term(s.name, self.ident(side), layer)

    def _pair(self, a: Statement, b: Statement, same: bool) -> None:
        self.cls[("a", a.name)] = self.cls[("b", b.name)] = str(self._next)
        self._next += 1
        self.pairs.append(Pair(a, b, same))

    def run(self) -> list[Pair]:
        for section in ("embedding", "layers", "output"):
            pa = [s for s in self.bodies["a"].statements if s.section == section]
            pb = [s for s in self.bodies["b"].statements if s.section == section]
            self._exact(pa, pb)
            for key in (lambda s: ("name", s.name), lambda s: ("role", s.role)):
                progress = True
                while progress:
                    progress = False
                    for b in pb:
                        a = next((a for a in pa if key(a) == key(b) and key(b)[1] is not None),
                                 None)
                        if a is not None:
                            pa.remove(a)
                            pb.remove(b)
                            self._pair(a, b, same=False)
                            self._exact(pa, pb)
                            progress = True
                            break
            if len(pa) == len(pb):  # what is left, in order: the same place, rewritten
                for a, b in zip(list(pa), list(pb)):
                    pa.remove(a)
                    pb.remove(b)
                    self._pair(a, b, same=False)
            self.pairs += [Pair(a, None, False) for a in pa]
            self.pairs += [Pair(None, b, False) for b in pb]
        order = {id(s): k for side in "ab" for k, s in enumerate(self.bodies[side].statements)}
        sections = ["embedding", "layers", "output"]
        self.pairs.sort(key=lambda p: (sections.index((p.b or p.a).section),
                                       order[id(p.b or p.a)]))
        for p in self.pairs:
            p.term_a = self.term("a", p.a) if p.a else None
            p.term_b = self.term("b", p.b) if p.b else None
            if p.a and p.b and not p.same and p.term_a.text == p.term_b.text:
                p.same = True  # equal once everything upstream was matched
        return self.pairs

    def _exact(self, pa: list[Statement], pb: list[Statement]) -> None:
        progress = True
        while progress:
            progress = False
            index: dict[str, list[Statement]] = {}
            for a in pa:
                index.setdefault(self.term("a", a).text, []).append(a)
            for b in list(pb):
                found = index.get(self.term("b", b).text)
                if found:
                    a = found.pop(0)
                    pa.remove(a)
                    pb.remove(b)
                    self._pair(a, b, same=True)
                    progress = True


# ---------------------------------------------------------------- describing a change


def describe(ta: Term, tb: Term, shapes: tuple[dict, dict] | None = None) -> list[str]:
    """Short notes on what changed between two terms of one statement; `shapes`, the two
    sides' model parameters with their dimensions, lets a new projection that factorizes a
    parameter say so."""
    notes = []
    projected = set()
    for outer, inner, verb in ((tb, ta, "adds"), (ta, tb, "drops")):
        proj = _projection(outer, inner)
        if proj is not None:
            w, b = proj
            notes.append(f"{verb} a projection of its result: @ {w}" + (f" + {b}" if b else ""))
            projected |= {w, b}
            if verb == "adds" and shapes is not None:
                notes += _factorized(w, ta.leaves & tb.leaves, *shapes)
    # a named instance read in both branches of a condition is one call
    ca = Counter(m for m, i, _ in _unique(ta.calls))
    cb = Counter(m for m, i, _ in _unique(tb.calls))
    for m in sorted(ca.keys() & cb.keys()):
        ha = sorted(h for x, _, h in ta.calls if x == m)
        hb = sorted(h for x, _, h in tb.calls if x == m)
        # one binding each side, and another one (a second call with the same binding is
        # an added call, said below, not a changed binding)
        if set(ha) != set(hb) and len(set(ha)) == len(set(hb)) == 1:
            for one, other, now in ((ha[0], hb[0], "now"), (hb[0], ha[0], "no longer")):
                if other.startswith(one + " when "):  # the same binding, under a condition
                    notes.append(f"{m} {now} only{other[len(one):]}")
                    break
            else:
                notes.append(f"{m} is given {ha[0][len(m):] or 'defaults'} → "
                             f"{hb[0][len(m):] or 'defaults'}")
    added, removed = cb - ca, ca - cb
    for m in sorted(ca.keys() & cb.keys()):
        if ca[m] != cb[m]:
            continue
        wa, wb = _positions(ta, m), _positions(tb, m)
        ends = {"the block's input", "the block's output"}
        if len(wa) == len(wb) == 1 and wa != wb and {wa[0], wb[0]} == ends:
            notes.append(f"{m} moved from {wa[0]} to {wb[0]}")
    # the same instance, another module: `ln_1: LN → RMSNorm`
    ia = {inst: m for m, inst, _ in ta.calls if inst}
    for m, inst, _ in _unique(tb.calls):
        was = ia.get(inst)
        if was is not None and was != m and removed[was] and added[m]:
            notes.append(f"{inst}: {was} → {m}")
            removed[was] -= 1
            added[m] -= 1
    added, removed = +added, +removed
    if len(added) == len(removed) == 1 and sum(added.values()) == sum(removed.values()) == 1:
        notes.append(f"{next(iter(removed))} → {next(iter(added))}")
        added = removed = Counter()
    if added:
        notes.append("adds " + ", ".join(_times(m, k) for m, k in sorted(added.items())))
    if removed:
        notes.append("drops " + ", ".join(_times(m, k) for m, k in sorted(removed.items())))
    gone = sorted(ta.leaves - tb.leaves - projected)
    new = sorted(tb.leaves - ta.leaves - projected)
    if gone:
        notes.append("no longer reads " + ", ".join(gone))
    if new:
        notes.append("now reads " + ", ".join(new))
    if not notes:
        notes.append("same modules, arranged differently")
    return notes


def _unique(calls: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """Calls with each named instance once."""
    seen: set = set()
    out = []
    for c in calls:
        if c[1] and c in seen:
            continue
        seen.add(c)
        out.append(c)
    return out


def _bare(t: Term) -> str:
    """A term's text with module calls by name only: the same structure whatever sizes the
    modules are given (an LN over E rather than H)."""
    if not t.args:
        return t.text
    if t.op == "member":
        return t.text
    head = t.module if t.op == "call" else t.head
    return f"{head}({', '.join(_bare(a) for a in t.args)})"


def _param(t: Term) -> str | None:
    return t.text[len("param "):] if t.op is None and t.text.startswith("param ") else None


def _projection(outer: Term, inner: Term) -> tuple[str, str | None] | None:
    """(W, b) when `outer` is `inner` followed by `@ W` or `@ W + b`, with parameters W and
    b (up to the sizes inner's modules are given); None otherwise."""
    node, bias = outer, None
    if node.op == "add" and len(node.args) == 2:
        names = [_param(a) for a in node.args]
        if sum(x is not None for x in names) == 1:
            bias = next(x for x in names if x is not None)
            node = next(a for a, x in zip(node.args, names) if x is None)
    if node.op != "matmul" or len(node.args) != 2 or _param(node.args[1]) is None:
        return None
    if _bare(node.args[0]) != _bare(inner):
        return None
    return _param(node.args[1]), bias


def _factorized(w: str, both: set[str], shapes_a: dict, shapes_b: dict) -> list[str]:
    """A parameter read on both sides whose last axis shrank to the projection's input: the
    one matrix became a product of two (ALBERT's V x H embedding as V x E times E x H)."""
    sw = shapes_b.get(w)
    if sw is None or len(sw) != 2:
        return []
    shrunk = []
    for p in sorted(both):
        sa, sb = shapes_a.get(p), shapes_b.get(p)
        if sa and sb and sa != sb and sa[:-1] == sb[:-1] and sb[-1] == sw[0] \
                and sa[-1] == sw[1]:
            shrunk.append(f"{p} [{', '.join(sa)}] → [{', '.join(sb)}]")
    if not shrunk:
        return []
    return [f"factorized through {w} [{', '.join(sw)}]: " + ", ".join(shrunk)]


def _model_param_shapes(side: Side) -> dict[str, list[str]]:
    return {p.name: [format_poly(d) for d in p.type.shape] for p in side.model.params}


def _times(m: str, k: int) -> str:
    return m if k == 1 else f"{k}× {m}"


def _positions(t: Term, module: str) -> list[str]:
    """Where each call of `module` sits in a statement: wrapping its result (the block's
    output), applied straight to what the block reads (its input), or inside."""
    out = []
    for node in t.nodes():
        if node.module != module:
            continue
        if node is t:
            out.append("the block's output")
        elif all(a.op is None for a in node.args):
            out.append("the block's input")
        else:
            out.append("inside the block")
    return out


# ---------------------------------------------------------------- modules


def _function_form(fn: ir.Function) -> dict:
    """A module's definition, canonically: signature, parameters, and output terms."""
    defs = {}
    for e in fn.eqns:
        for k, v in enumerate(e.outs):
            defs[v.name] = (e, k)
    args = {v.name: f"arg{k}" for k, v in enumerate(fn.inputs)}
    params = {p.name for p in fn.params}

    class FnBody(Body):
        def __init__(self):
            self.inputs, self.params, self.defs = set(), params, defs
            self.prev, self.last, self.inline, self.reals = {}, {}, set(), {}
            self.stack = {}

        def _value(self, name, ident, layer, memo, top=False):  # noqa: ARG002 - Body's signature
            if name in args:
                return Term(args[name])
            if name in params:
                return Term(f"param {name}", leaves={name})
            if name in memo:
                return memo[name]
            e, k = defs[name]
            t = self._eqn(e, ident, layer, memo)
            if len(e.outs) > 1:
                t = Term(f"{t.text}#{k}", t.calls, t.inlined, t.leaves)
            memo[name] = t
            return t

    body = FnBody()
    memo: dict = {}
    return {
        "hypers": [h.name for h in fn.hypers],
        "inputs": [format_type(v.type) for v in fn.inputs],
        "outputs": [format_type(v.type) for v in fn.outputs],
        "params": {p.name: format_type(p.type) for p in fn.params},
        "terms": [body._value(v.name, str, None, memo).text for v in fn.outputs],
    }


def _function_lines(side: Side, fn: ir.Function) -> list[str]:
    seen, out = set(), []
    for e in fn.eqns:
        if e.span is not None and (e.span.file, e.span.line) not in seen:
            seen.add((e.span.file, e.span.line))
            out.append((e.span.line, side.line(e.span)))
    return [text for _, text in sorted(out) if text]


# ---------------------------------------------------------------- the whole comparison


def _callers(model: ir.Model, functions: dict, used, name: str) -> list[str]:
    """The used modules that call `name`, when the model's own body does not."""
    direct = any(e.op == "call" and e.attrs["module"] == name
                 for item in model.body
                 for e in (item.body if isinstance(item, ir.Loop) else [item]))
    if direct:
        return []
    return [m for m in used if m in functions and any(
        e.op == "call" and e.attrs["module"] == name for e in functions[m].eqns)]


def _hyper_values(side: Side) -> dict[str, str]:
    if side.cfg is None:
        return {}
    out = {}
    reals = side.sym.hypers.reals
    for k, v in side.cfg.values.items():
        if isinstance(v, Poly) and k in reals:  # 500000.0 as a default 10000.0 prints
            out[k] = repr(float(v.const_value()))
        elif isinstance(v, Poly):
            c = v.const_value()
            out[k] = f"{c.numerator:,}" if c.denominator == 1 else str(c)
        else:
            out[k] = repr(v)
    return out


def _rows(side: Side, counts) -> dict[str, dict]:
    """Parameter-count rows by instance (or model parameter): module, symbolic total and
    the number for the chosen configuration."""
    from ..passes.params import per_module
    instances = {}
    for item in side.model.body:
        for e in (item.body if isinstance(item, ir.Loop) else [item]):
            if e.op == "call":
                instances[e.attrs.get("instance")] = e.attrs["module"]
    rows: dict[str, dict] = {}
    for name, per, copies in per_module(side.sym.count):
        rows[name] = {"module": instances.get(name, "parameter"), "formula": per * copies,
                      "per": per, "copies": copies, "value": None}
    if counts is not None:
        for name, per, copies in per_module(counts):
            if name in rows:
                rows[name]["value"] = as_int(per * copies)
    return rows


def compare(a: Side, b: Side) -> dict:
    """Everything `fgc diff` reports, as plain data (the JSON output)."""
    ba, bb = Body(a), Body(b)
    matcher = Matcher(ba, bb)
    pairs = matcher.run()
    equations = []
    instance_map: dict[str, str] = {}  # a's instance -> b's
    shapes = (_model_param_shapes(a), _model_param_shapes(b))
    for p in pairs:
        if p.a and p.b:
            by_mod_a: dict[str, list[str]] = {}
            for m, inst, _ in p.term_a.calls:
                by_mod_a.setdefault(m, []).append(inst)
            for m, inst, _ in p.term_b.calls:
                if by_mod_a.get(m):
                    instance_map[by_mod_a[m].pop(0)] = inst
        layers = _per_layer(p, matcher, a, b) if p.a and p.b and \
            p.a.section == "layers" else []
        if p.same and not layers:
            continue
        entry = {
            "section": (p.a or p.b).section,
            "change": "changed" if p.a and p.b else "removed" if p.a else "added",
            "a": _statement_text(a, ba, p.a, p.term_a) if p.a else None,
            "b": _statement_text(b, bb, p.b, p.term_b) if p.b else None,
            "notes": describe(p.term_a, p.term_b, shapes)
            if p.a and p.b and not p.same else [],
        }
        if layers:
            entry["layers"] = layers
            if p.same:
                entry["change"] = "per layer"
        equations.append(entry)

    # interface
    def typed(values) -> dict[str, str]:
        return {v.name: format_type(v.type) for v in values}

    inputs = _dict_diff(typed(a.model.inputs), typed(b.model.inputs))
    outputs = _dict_diff(typed(a.model.outputs), typed(b.model.outputs))
    gone = [d for d in outputs if d["change"] == "removed"]
    new = [d for d in outputs if d["change"] == "added"]
    if len(gone) == len(new) == 1 and gone[0]["a"] == new[0]["b"]:  # the same output, renamed
        outputs = [d for d in outputs if d not in (gone[0], new[0])] + [{
            "change": "renamed", "name": new[0]["name"], "old": gone[0]["name"],
            "a": gone[0]["a"], "b": new[0]["b"]}]
    hyper_text = {h.name: (h.text or "") for h in a.model.hypers}
    hyper_text_b = {h.name: (h.text or "") for h in b.model.hypers}
    hypers = _dict_diff(hyper_text, hyper_text_b)
    va, vb = _hyper_values(a), _hyper_values(b)
    values = [{"name": k, "a": va.get(k), "b": vb.get(k)}
              for k in list(dict.fromkeys([*va, *vb])) if va.get(k) != vb.get(k)]

    # parameters, paired through the instances that matched
    def param_table(side: Side) -> dict[str, str]:
        out = {}
        for e in side.sym.count.entries:
            shape = "[" + ", ".join(format_poly(d) for d in e.shape) + "]"
            if e.family is not None:
                shape += f" for 1..{format_poly(e.family)}"
            out[".".join(e.path + (e.name,))] = shape
        return out

    pa, pb = param_table(a), param_table(b)
    renamed = {}
    for path in pa:
        head, _, rest = path.partition(".")
        if rest and head in instance_map:
            renamed[path] = f"{instance_map[head]}.{rest}"
    params = []
    b_seen = set()
    for path, shape in pa.items():
        other = renamed.get(path, path)
        if other in pb:
            b_seen.add(other)
            if pb[other] != shape:
                params.append({"change": "changed", "a": path, "b": other,
                               "shape_a": shape, "shape_b": pb[other]})
        else:
            params.append({"change": "removed", "a": path, "shape_a": shape})
    for path, shape in pb.items():
        if path not in b_seen:
            params.append({"change": "added", "b": path, "shape_b": shape})

    # modules
    fa, fb = a.sym.functions, b.sym.functions
    ua, ub = ir.used_modules(a.model, fa), ir.used_modules(b.model, fb)
    modules = []
    for m in ua:
        if m not in ub:
            modules.append({"change": "removed", "name": m})
        elif m in fa and m in fb:
            forma, formb = _function_form(fa[m]), _function_form(fb[m])
            if forma != formb:
                detail = []
                for k in ("hypers", "inputs", "outputs"):
                    if forma[k] != formb[k]:
                        detail.append(f"{k}: {', '.join(forma[k])} → {', '.join(formb[k])}")
                pd = _dict_diff(forma["params"], formb["params"])
                for d in pd:
                    if d["change"] == "added":
                        detail.append(f"+ param {d['name']}: {d['b']}")
                    elif d["change"] == "removed":
                        detail.append(f"- param {d['name']}: {d['a']}")
                    else:
                        detail.append(f"~ param {d['name']}: {d['a']} → {d['b']}")
                entry = {"change": "changed", "name": m, "details": detail}
                if forma["terms"] != formb["terms"]:
                    entry["a"] = _function_lines(a, fa[m])
                    entry["b"] = _function_lines(b, fb[m])
                modules.append(entry)
    modules += [{"change": "added", "name": m} for m in ub if m not in ua]
    for entry in modules:  # a module the model does not call itself: which modules do
        if entry["change"] in ("added", "removed"):
            side, fns, used = (b, fb, ub) if entry["change"] == "added" else (a, fa, ua)
            inside = _callers(side.model, fns, used, entry["name"])
            if inside:
                entry["inside"] = inside

    sharing = _sharing(a, b, instance_map)

    # parameter counts
    ra = _rows(a, a.cfg.count if a.cfg else None)
    rb = _rows(b, b.cfg.count if b.cfg else None)
    counts = []
    b_done = set()
    copies_changed: list[tuple[dict, dict]] = []
    for name, row in ra.items():
        other = instance_map.get(name, name)
        rowb = rb.get(other)
        if rowb is not None:
            b_done.add(other)
            if row["per"] == rowb["per"] and row["copies"] != rowb["copies"]:
                copies_changed.append((row, rowb))
        counts.append(_count_row(name, row, other if rowb else None, rowb))
    for name, row in rb.items():
        if name not in b_done:
            counts.append(_count_row(None, None, name, row))
    total_a, total_b = a.sym.count.total(), b.sym.count.total()
    delta = total_b - total_a
    expanded = None
    ha, hb = a.sym.hypers, b.sym.hypers
    shared = {k: v for k, v in ha.derived.items() if hb.derived.get(k) == v}
    if shared:
        from ..elaborate.elaborator import Hypers
        e = Hypers(values={}, derived=shared).expand(delta)
        if e != delta:
            expanded = format_poly(e)
    total = {
        "formula_a": format_poly(total_a), "formula_b": format_poly(total_b),
        "delta_formula": _signed(delta), "delta_expanded": expanded and _signed_text(expanded),
        "delta_grouped": _grouped(copies_changed, delta),
        "a": a.cfg.total if a.cfg else None, "b": b.cfg.total if b.cfg else None,
    }
    if a.cfg and b.cfg:
        total["delta"] = b.cfg.total - a.cfg.total
    counts = [c for c in counts if c["delta_formula"] != "0" or c.get("delta")]

    report = {
        "a": {"file": a.path, "model": a.model.name,
              "config": a.cfg.name if a.cfg else None},
        "b": {"file": b.path, "model": b.model.name,
              "config": b.cfg.name if b.cfg else None},
        "hyperparameters": hypers, "values": values,
        "inputs": inputs, "outputs": outputs,
        "modules": modules, "equations": equations, "sharing": sharing,
        "parameters": params, "counts": counts, "total": total,
    }
    report["equivalent"] = not any(report[k] for k in (
        "hyperparameters", "inputs", "outputs", "modules", "equations", "sharing",
        "parameters")) and delta == Poly()
    return report


def _grouped(changed: list[tuple[dict, dict]], delta: Poly) -> str | None:
    """The total change with the instances whose number of copies changed gathered under
    their common factor: `-(L - 1)*(...) + rest` for layers that became shared."""
    groups: dict[Poly, Poly] = {}
    for ra, rb in changed:
        more = rb["copies"] - ra["copies"]
        groups[more] = groups.get(more, Poly()) + ra["per"]
    if not groups:
        return None
    parts, rest = [], delta
    for more, per in groups.items():
        rest = rest - more * per
        text = format_poly(more)
        sign = "-" if text.startswith("-") else "+"
        more = -more if sign == "-" else more
        parts.append(f"{sign} {_factor(format_poly(more), more)}*{_factor(format_poly(per), per)}")
    if rest != Poly():
        rest_text = _signed(rest)
        parts.append(f"{rest_text[0]} {rest_text[1:]}")
    text = " ".join(parts)
    return text[0] + text[2:]  # `+ x - y` as `+x - y`, like the other formulas


def _layer_instances(side: Side) -> dict[str, tuple[str, bool, str]]:
    """Each instance used inside a `layers` block: (module, shared across the layers, the
    number of layers)."""
    out = {}
    for item in side.model.body:
        if isinstance(item, ir.Loop):
            for e in item.body:
                if e.op == "call":
                    inst = e.attrs["instance"]
                    out[inst] = (e.attrs["module"], inst in item.shared, format_poly(item.hi))
    return out


def _sharing(a: Side, b: Side, instance_map: dict[str, str]) -> list[dict]:
    """Instances of the layers that became one for all layers (ALBERT), or one per layer."""
    ia, ib = _layer_instances(a), _layer_instances(b)
    out = []
    for name, (module, shared, _) in ia.items():
        other = instance_map.get(name, name)
        if other in ib and ib[other][1] != shared:
            out.append({"change": "shared" if ib[other][1] else "unshared", "a": name,
                        "b": other, "module": module, "layers": ib[other][2]})
    return out


def _count_row(na, ra, nb, rb) -> dict:
    fa = ra["formula"] if ra else Poly()
    fb = rb["formula"] if rb else Poly()
    delta = _signed(fb - fa)
    if ra and rb and ra["per"] == rb["per"] and ra["copies"] != rb["copies"]:
        # the same instance, a different number of copies (shared across layers, or not):
        # say it as (change in copies) * (one copy)
        more = rb["copies"] - ra["copies"]
        text = format_poly(more)
        sign = "-" if text.startswith("-") else "+"
        more = -more if sign == "-" else more
        delta = (f"{sign}{_factor(format_poly(more), more)}*"
                 f"{_factor(format_poly(rb['per']), rb['per'])}")
    row = {"a": na, "b": nb, "module": (rb or ra)["module"],
           "formula_a": format_poly(fa) if ra else None,
           "formula_b": format_poly(fb) if rb else None,
           "delta_formula": delta,
           "value_a": ra["value"] if ra else None, "value_b": rb["value"] if rb else None}
    if (ra is None or ra["value"] is not None) and (rb is None or rb["value"] is not None):
        row["delta"] = (rb["value"] if rb else 0) - (ra["value"] if ra else 0)
    return row


def _factor(text: str, p: Poly) -> str:
    return text if len(p.terms) == 1 and "-" not in text.lstrip("-") else f"({text})"


def _signed(p: Poly) -> str:
    return _signed_text(format_poly(p))


def _signed_text(text: str) -> str:
    return text if text == "0" or text.startswith("-") else "+" + text


def _dict_diff(a: dict[str, str], b: dict[str, str]) -> list[dict]:
    out = []
    for k, v in a.items():
        if k not in b:
            out.append({"change": "removed", "name": k, "a": v})
        elif b[k] != v:
            out.append({"change": "changed", "name": k, "a": v, "b": b[k]})
    out += [{"change": "added", "name": k, "b": v} for k, v in b.items() if k not in a]
    return out


def _statement_text(side: Side, body: Body, s: Statement, t: Term) -> dict:
    where = []
    for name in dict.fromkeys(t.inlined):
        e, _ = body.defs[name]
        where.append(side.line(e.span))
    return {"name": s.name, "line": side.line(s.eqn.span),
            "at": f"{Path(s.eqn.span.file).name}:{s.eqn.span.line}" if s.eqn.span else None,
            "where": [w for w in where if w]}


def _per_layer(p: Pair, matcher: Matcher, a: Side, b: Side) -> list[dict]:
    """For statements under per-layer conditions: which layers differ, grouped."""
    ba, bb = matcher.bodies["a"], matcher.bodies["b"]
    if not (_guarded(ba, p.a) or _guarded(bb, p.b)):
        return []
    layers, symbolic, env_a, env_b = _layer_numbers(a, b)
    groups: dict[tuple, list[int]] = {}
    for layer in layers:
        try:
            ta = matcher.term("a", p.a, {**env_a, "_layer": layer})
            tb = matcher.term("b", p.b, {**env_b, "_layer": layer})
        except Exception:  # noqa: BLE001 - a condition we cannot decide: no per-layer view
            return []
        same = ta.text == tb.text
        key = (same, "" if same else "; ".join(describe(ta, tb)))
        groups.setdefault(key, []).append(layer)
    if len(groups) == 1 and next(iter(groups))[0]:
        return []
    return [{"layers": _layer_text(ls, len(layers), symbolic), "same": same, "notes": note}
            for (same, note), ls in groups.items()]


def _guarded(body: Body, s: Statement) -> bool:
    return any(e.guards or e.op == "cond" for e in _eqns_of(body, s))


def _eqns_of(body: Body, s: Statement) -> list[ir.Eqn]:
    """The equations a statement is made of: its own, its temporaries', and those of the
    named values expanded into it."""
    out, stack, seen = [], [s.eqn], set()
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        for o in e.ins:
            if o.name in body.defs and (o.name.startswith("%") or o.name in body.inline):
                stack.append(body.defs[o.name][0])
    return out


def _layer_numbers(a: Side, b: Side) -> tuple[list[int], bool, dict, dict]:
    """The layers to look at: 1..L of the chosen configurations, or 1 and 2 (an odd and an
    even layer) when the layer count is symbolic."""
    def env(side: Side) -> dict:
        if side.cfg is None:
            return {}
        return {k: v.const_value() for k, v in side.cfg.values.items() if isinstance(v, Poly)}
    ea, eb = env(a), env(b)
    la, lb = ea.get("L"), eb.get("L")
    if la is not None and la == lb:
        return list(range(1, int(la) + 1)), False, ea, eb
    return [1, 2], True, ea, eb


def _layer_text(layers: list[int], total: int, symbolic: bool) -> str:
    if symbolic:
        return "odd layers" if layers == [1] else "even layers" if layers == [2] else "all layers"
    if len(layers) == total:
        return "every layer"
    if len(layers) > 2 and all(y - x == 2 for x, y in zip(layers, layers[1:])):
        return f"layers {layers[0]}, {layers[1]}, ..., {layers[-1]} " + \
            ("(odd)" if layers[0] % 2 else "(even)")
    return "layers " + ", ".join(map(str, layers))


# ---------------------------------------------------------------- text


SIGN = {"added": "+", "removed": "-", "changed": "~", "per layer": "~"}
TINT = {"+": "green", "-": "red", "~": "yellow"}


def format_text(r: dict, color: bool = False) -> str:
    from ..elaborate.symbolic import human
    from ..table import paint, table

    def mark(change: str) -> str:
        s = SIGN[change]
        return paint(s, TINT[s], color)

    def side(k: str) -> str:
        x = r[k]
        if x["config"] is None:
            return x["model"]
        conf = "defaults" if x["config"] == "defaults" else f"preset {x['config']}"
        return f"{x['model']} ({conf})"

    out = [paint(f"--- {r['a']['file']}  {side('a')}", "red", color),
           paint(f"+++ {r['b']['file']}  {side('b')}", "green", color)]
    la, lb = r["a"]["model"], r["b"]["model"]
    if la == lb:
        la, lb = "A", "B"

    def section(title: str) -> None:
        out.append("")
        out.append(paint(title, "bold", color))

    if r["hyperparameters"] or r["values"]:
        section("hyperparameters")
        for d in r["hyperparameters"]:
            a = d.get("a", "")
            b = d.get("b", "")
            if d["change"] == "changed":
                out.append(f"  {mark('changed')} {d['name']}: {a or '(free)'} → {b or '(free)'}")
            elif d["change"] == "added":
                out.append(f"  {mark('added')} {d['name']}" + (f" = {b}" if b else ""))
            else:
                out.append(f"  {mark('removed')} {d['name']}" + (f" = {a}" if a else ""))
        if r["values"]:
            rows = [("value", la, lb)] + [(v["name"], v["a"] or "-", v["b"] or "-")
                                          for v in r["values"]]
            out += table(rows, {1, 2}, "    ", color=color)
    for key, title in (("inputs", "inputs"), ("outputs", "outputs")):
        if r[key]:
            section(title)
            for d in r[key]:
                if d["change"] == "changed":
                    out.append(f"  {mark('changed')} {d['name']}: {d['a']} → {d['b']}")
                elif d["change"] == "renamed":
                    out.append(f"  {mark('changed')} {d['old']} → {d['name']}: {d['b']} "
                               "(renamed)")
                else:
                    out.append(f"  {mark(d['change'])} {d['name']}: {d.get('a') or d.get('b')}")
    if r["modules"]:
        section("modules")
        for m in r["modules"]:
            inside = f", inside {', '.join(m['inside'])}" if m.get("inside") else ""
            out.append(f"  {mark(m['change'])} {m['name']}" + (
                {"added": f" (now used{inside})",
                 "removed": f" (no longer used{inside})"}.get(m["change"], "")))
            for line in m.get("a", []):
                if line not in m.get("b", []):
                    out.append(paint(f"      - {line}", "red", color))
            for line in m.get("b", []):
                if line not in m.get("a", []):
                    out.append(paint(f"      + {line}", "green", color))
            for d in m.get("details", []):
                out.append(f"      {d}")
    if r["equations"]:
        section("equations")
        current = None
        for e in r["equations"]:
            if e["section"] != current:
                current = e["section"]
                out.append(f"  {current}")
            sa, sb = e["a"], e["b"]
            first = sa or sb
            out.append(f"    {mark(e['change'])} {first['line']}" + (
                paint(f"    ({first['at']})", "dim", color) if first["at"] else ""))
            for w in first["where"]:
                out.append(f"        where {w}")
            if sa and sb and (sa["line"] != sb["line"] or sa["where"] != sb["where"]):
                out.append(f"      → {sb['line']}" + (
                    paint(f"    ({sb['at']})", "dim", color) if sb["at"] else ""))
                for w in sb["where"]:
                    out.append(f"        where {w}")
            for n in e["notes"]:
                out.append(paint(f"      {n}", "cyan", color))
            for g in e.get("layers", []):
                what = "same" if g["same"] else g["notes"]
                out.append(paint(f"      {g['layers']}: {what}", "cyan", color))
    if r.get("sharing"):
        section("layer sharing")
        for d in r["sharing"]:
            name = d["a"] if d["a"] == d["b"] else f"{d['a']} → {d['b']}"
            one, all_ = "one per layer", f"one for all {d['layers']} layers"
            was, now = (one, all_) if d["change"] == "shared" else (all_, one)
            out.append(f"  {mark('changed')} {name} ({d['module']}): {was} → {now}")
    if r["parameters"]:
        section("parameters")
        rows = []
        for p in r["parameters"]:
            if p["change"] == "changed":
                name = p["a"] if p["a"] == p["b"] else f"{p['a']} → {p['b']}"
                rows.append((mark("changed"), name, f"{p['shape_a']} → {p['shape_b']}"))
            elif p["change"] == "added":
                rows.append((mark("added"), p["b"], p["shape_b"]))
            else:
                rows.append((mark("removed"), p["a"], p["shape_a"]))
        out += table(rows, indent="  ", header=False)
    t = r["total"]
    if r["counts"] or t["delta_formula"] != "0" or t.get("delta"):
        section("parameter count")
        numbers = t["a"] is not None and t["b"] is not None
        # the numbers before the formula: a long formula then only runs on to the right
        head = ("", "module") + ((la, lb, "delta") if numbers else ()) + ("formula",)
        rows = [head]
        for c in r["counts"]:
            name = c["a"] if c["b"] in (None, c["a"]) else c["b"] if c["a"] is None else \
                f"{c['a']} → {c['b']}"
            row = (name, c["module"])
            if numbers:
                row += (_n(c["value_a"]), _n(c["value_b"]), _d(c.get("delta")))
            rows.append(row + (c["delta_formula"],))
        grouped = t.get("delta_grouped")
        total = ("total", "")
        if numbers:
            total += (f"{t['a']:,}", f"{t['b']:,}", _d(t.get("delta")))
        rows.append(total + (grouped or t["delta_formula"],))
        out += table(rows, {2, 3, 4} if numbers else set(), "  ", color=color)
        out.append("")
        formula = f"N({lb}) - N({la}) = {grouped or t['delta_formula']}"
        if t["delta_expanded"]:
            formula += f" = {t['delta_expanded']}"
        if numbers and t.get("delta"):
            formula += f"; {t['delta']:+,} ({human(t['a'])} → {human(t['b'])})"
        out.append(formula)
    out.append("")
    out.append(paint("equivalent" if r["equivalent"] else "different", "bold", color))
    return "\n".join(out)


def _n(v) -> str:
    return "-" if v is None else f"{v:,}"


def _d(v) -> str:
    return "" if v is None else f"{v:+,}"
