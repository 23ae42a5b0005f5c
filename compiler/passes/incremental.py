"""The incremental (key/value cache) form of an autoregressive model, derived from its IR.

A model is autoregressive along the length `g` of its token input when every attention
over `g` positions is masked so that no position sees a later one (Mask^AR, the banded
Mask^ST, or a layer-dependent choice among them). Then the outputs at positions 1..P do
not change when tokens P+1..P+T arrive, and a call may take only the new tokens, given
the keys and values every such attention computed for the first P positions (the past),
and return them extended to P+T positions (the present).

`derive` finds those attentions (the cache sites) and proves the rest of the model
position-wise: each equation either keeps the positions apart (a product over the
features, a norm, a pointwise function), reads a table or parameter indexed by absolute
position (learned or sinusoidal positions: the backends read rows P+1..P+T of it), or is
an attention whose keys are not the generated positions (cross-attention on an encoder's
output). Anything else that mixes positions is reported with its location, because the
cached form would compute something different from the model.

Both backends build the incremental form from the result, and so does nothing else: no
architecture is named here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..elaborate import ir
from ..elaborate.intrinsics import CAUSAL_KINDS, intrinsic, is_kind, mask_kind
from ..elaborate.ir import Ell, Eqn, Loop, TensorType, sequence_symbols
from ..elaborate.primitives import ELEMENTWISE, LAST_AXIS
from ..elaborate.symbolic import Poly, format_poly
from ..errors import FgcError, Span
from .families import eqn_has_axis, grouped

# what keeps positions apart: element-wise ops and those along the last axis only
POINTWISE = ELEMENTWISE | {"cond"}


class NotIncremental(FgcError):
    """The model has no incremental form; the message says where and why."""


@dataclass(frozen=True)
class CacheSite:
    """One attention whose keys and values the incremental form keeps, per layer."""

    loop: int | None  # which `layers` block (its order among them), None outside any
    path: tuple[str, ...]  # module uses from the layer (or model) down to the Attention
    heads: Poly | None  # members of the family it is mapped over (the heads), or None
    key: tuple  # a member's key dims, model symbols; None is the positions axis
    value: tuple
    span: Span | None = None
    shared: frozenset = frozenset()  # "key", "value": one for every head (multi-query)
    queries: Poly | None = None  # the query heads (A where `heads` is G), or None


@dataclass
class Incremental:
    length: str  # the generated length: the symbol of the token input's positions
    tokens: str  # that input
    sites: list[CacheSite]
    layers: dict[int, Poly] = field(default_factory=dict)  # loop -> number of layers
    # (calling module or "" for the model, module use) -> the callee's symbols that stand for
    # the generated length at that use, where there are some: a table of positions inside a
    # module is made for the past and new positions and read from the first new one
    along: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    mixed: frozenset = frozenset()  # module uses along the positions at one use, not another

    def cache(self) -> list[tuple[str, str, CacheSite, int, str]]:
        """(past name, present name, site, block, key|value) for each cache site and kind,
        in graph order: the sites outside the layers, then each `layers` block's, each
        site's key then value. `block` counts the `layers` blocks from 1 in the spec's
        order (0 outside any); in a block's names `{l}` is the layer's index from 0, and
        the block's tensors are, layer by layer, each of its entries in turn (the
        signature's compact cache, which runtime/signature.py expands)."""
        per_layer = {}
        for s in self.sites:
            per_layer.setdefault(s.loop, []).append(s)
        loops = sorted(k for k in per_layer if k is not None)
        out = []
        for s in per_layer.get(None, []):
            tag = _tag(s, per_layer[None])
            for kind in ("key", "value"):
                out.append((f"past.{tag}.{kind}", f"present.{tag}.{kind}", s, 0, kind))
        for loop in loops:
            sites = per_layer[loop]
            lead = "" if len(loops) == 1 else f"{loop + 1}."
            for s in sites:
                tag = lead + "{l}" + ("" if len(sites) == 1 else f".{_tag(s, sites)}")
                for kind in ("key", "value"):
                    out.append((f"past.{tag}.{kind}", f"present.{tag}.{kind}", s, loop + 1,
                                kind))
        return out

    def layer_count(self, site: CacheSite) -> Poly:
        """How many layers have this site (1 outside the layers), over the hyperparameters."""
        return Poly.const(1) if site.loop is None else self.layers[site.loop]

    def dims(self, site: CacheSite, kind: str, batch: str = "batch",
             past: str = "past") -> list:
        """A cache tensor's dims: the batch, the heads, the positions (named `past`), then
        the key's (or value's) own; sizes over the hyperparameters."""
        out: list = [batch]
        if site.heads is not None and kind not in site.shared:
            out.append(site.heads)
        for d in (site.key if kind == "key" else site.value):
            out.append(past if d is None else d)
        return out


def _tag(site: CacheSite, sites: list[CacheSite]) -> str:
    return ".".join(site.path) if len(sites) > 1 else ".".join(site.path[:1])


# ---------------------------------------------------------------- the analysis


class _Scope:
    def __init__(self, gen: set[str], subst: dict, path: tuple, loop: int | None,
                 types: dict):
        self.gen = gen  # this scope's symbols that stand for the generated length
        self.subst = subst  # this scope's symbols -> model-level sizes
        self.path = path
        self.loop = loop
        self.types = types  # value and parameter name -> type
        self.causal: set[str] = set()  # values holding a causal mask
        self.ells: set[str] = set()  # `...` that stand for dims including the positions
        self.varying: set[str] = set()  # values that differ from family member to member
        self.computed: set[str] = set()  # values its equations compute (not parameters)
        self.last: set[str] = set()  # values at the last position alone (lowering/last.py)
        self.guarded: Span | None = None  # the call, made by some layers only, it is inside
        self.fn = ""  # the module whose body this is ("" for the model's)


class _Walk:
    def __init__(self, model: ir.Model, functions: dict[str, ir.Function], g: str,
                 padded: bool = False):
        self.model = model
        self.functions = functions
        self.g = g
        # passes/padding.py's question: may positions along g be padding? Every attention
        # over them is a site then, whatever its mask, and the outputs need not be one
        # value per position
        self.padded = padded
        self.sites: list[CacheSite] = []
        self.causal_seen = False  # some causal attention over the positions, cached or not
        self.along: dict[tuple[str, str], frozenset[str]] = {}  # see Incremental.along
        self.plain: set[tuple[str, str]] = set()  # module uses along no positions
        self.errors: list[tuple[str, Span | None]] = []

    def fail(self, message: str, span: Span | None) -> None:
        self.errors.append((message, span))

    # -- types
    def axes(self, t: TensorType, s: _Scope, span) -> list[int]:
        """The axes of `t` that run over the generated positions."""
        t = t.member() if t.family is not None else t
        out = []
        for k, d in enumerate(t.shape):
            if isinstance(d, Ell):
                if d.name in s.ells:
                    out.append(k)
                continue
            syms = d.symbols() if isinstance(d, Poly) else set()
            if syms & s.gen:
                # (padding reads a table of n + c rows at the tokens' positions: RoBERTa's)
                if len(syms) != 1 or d != Poly.sym(next(iter(syms))) and not (
                        self.padded and (d - Poly.sym(next(iter(syms)))).is_const()):
                    self.fail(f"a size {format_poly(d)} combines the "
                              f"{'length' if self.padded else 'generated length'} with "
                              "others", span)
                out.append(k)
        return out

    def last_is_positions(self, t: TensorType, s: _Scope, span) -> bool:
        t = t.member() if t.family is not None else t
        if not t.shape:
            return False
        return (len(t.shape) - 1) in self.axes(t, s, span)

    def type_of(self, o: ir.Operand, s: _Scope) -> TensorType | None:
        if o.name is None:
            return None
        t = s.types.get(o.name)
        if t is not None and o.member is not None and t.family is not None:
            t = t.member()
        return t

    # -- scopes
    def run(self) -> None:
        m = self.model
        types = {v.name: v.type for v in m.inputs}
        types.update((p.name, p.type) for p in m.params)
        top = _Scope({self.g}, {}, (), None, types)
        for p in m.params:
            axes = self.axes(p.type, top, p.span or m.span)
            if len(axes) > 1:
                # a step reads the rows of the new positions, not the columns of the past
                self.fail(f"parameter `{p.name}` is sized by the positions along two axes",
                          p.span or m.span)
            elif self.padded and axes and (axes != [0] or p.type.family is not None):
                # (a padded batch reads each token's row of a table of positions)
                self.fail(f"parameter `{p.name}` runs along the positions on an axis other "
                          "than its first", p.span or m.span)
        for v in m.inputs:
            if v.type.dtype != "int" and self.axes(v.type, top, m.span) and not self.padded:
                self.fail(f"input `{v.name}` runs along the generated positions; a step "
                          "is given only new tokens", m.span)
        loops = 0
        for item in m.body:
            if isinstance(item, Loop):
                for c in item.carried:
                    types[c.inner] = types.get(c.init) or types[c.init]
                inner = _Scope({self.g}, {}, (), loops, types)
                inner.causal = top.causal
                shared = set(item.shared)
                for e in item.body:
                    self.eqn(e, inner, shared)
                for i, o in item.results:
                    if i in types:
                        types[o] = types[i]
                    if i in inner.causal:
                        top.causal.add(o)
                for i, _ in item.stacks:
                    if i in types and self.axes(types[i], top, item.span):
                        self.fail("every layer's value stacked, along the generated "
                                  "positions", item.span)
                loops += 1
            else:
                self.eqn(item, top, set())
        for o in [] if self.padded else m.outputs:
            if o.name in top.last:
                continue
            t = types.get(o.name, o.type)
            ax = self.axes(t, top, m.span)
            if not ax or self.last_is_positions(t, top, m.span):
                self.fail(f"output `{o.name}` is not one value per position", m.span)

    def eqn(self, e: Eqn, s: _Scope, shared: set[str]) -> None:
        for v in e.outs:
            s.types[v.name] = v.type
        if e.family is not None and eqn_has_axis(e, [self.varies(o, s) for o in e.ins],
                                                 self.functions):
            s.varying.update(v.name for v in e.outs)
        s.computed.update(v.name for v in e.outs)
        ins = [self.type_of(o, s) for o in e.ins]
        causal_in = [o.name in s.causal for o in e.ins if o.name is not None]
        if e.attrs.get("last") or any(o.name in s.last for o in e.ins):
            # the cut to the last position before the outputs, and what reads its result:
            # one position, which a padded batch keeps a token (padding comes first)
            s.last.update(v.name for v in e.outs)
            return
        if e.op == "call":
            self.call(e, s, ins, shared)
            return
        if e.op == "cond":
            if any(causal_in):
                if all(o.name in s.causal for o in e.ins):
                    s.causal.update(v.name for v in e.outs)
                    return
                self.fail("a causal mask chosen against one that is not", e.span)
            return
        if any(causal_in) and not self.padded:
            if e.op == "add" and len(causal_in) == 2 and causal_in.count(True) == 1:
                # a bias plus the causal mask (T5's relative positions) is causal: the bias is
                # a table of positions, made for the past and new positions and read from the
                # first new row, so it lines up with the cached keys as the mask does
                s.causal.update(v.name for v in e.outs)
                return
            self.fail("the autoregressive mask is used as a tensor here; a step needs it "
                      "only as attention's mask", e.span)
            return
        positional = [t for t in ins if t is not None and self.axes(t, s, e.span)]
        if not positional and not any(self.axes(v.type, s, e.span) for v in e.outs):
            return
        op = e.op
        if op in POINTWISE:
            return
        if op in LAST_AXIS:
            if any(self.last_is_positions(t, s, e.span) for t in positional):
                self.fail(f"`{op}` along the positions mixes them", e.span)
            return
        if op == "matmul":
            a, b = ins
            contracted = a is not None and self.last_is_positions(a, s, e.span)
            if b is not None:
                bt = b.member() if b.family is not None else b
                bx = self.axes(bt, s, e.span)
                if bx:
                    contracted = True
            if contracted:
                self.fail("a product over the positions mixes them; only attention" +
                          (" may" if self.padded else " with a causal mask may"), e.span)
            return
        if op == "index" and ins[0] is not None and \
                not any(t is not None and self.axes(t, s, e.span) for t in ins[1:]) and \
                not any(isinstance(o.const, Poly) and o.const.symbols() & s.gen
                        for o in e.ins[1:]):
            # a slice of other axes (rotary's halves of the features) keeps every position
            # apart: each position axis is taken whole, and no bound is the run's length
            base = ins[0].member() if ins[0].family is not None else ins[0]
            kinds = e.attrs["kinds"]
            pos = self.axes(base, s, e.span)
            if pos and all(kinds[a] == ":" for a in pos):
                return
        if op == "index" and self.padded and ins[0] is not None and \
                not any(t is not None and self.axes(t, s, e.span) for t in ins[1:]):
            if e.ins[0].name in s.computed and any(o.name is None for o in e.ins[1:]):
                # (a table's rows, RoBERTa's W_p[3..n+2, :], are read at the tokens' ranks)
                self.fail("a fixed position of values along padded positions: padding moves "
                          "it", e.span)
            return  # rows picked by the caller's indices: positions as the caller pads them
        if op == "lookup":  # rows of a table, one per id: the ids' positions stay apart
            if ins[1] is not None and self.axes(ins[1], s, e.span):
                self.fail("a lookup in a table along the positions mixes them", e.span)
            return
        if op == "transpose":
            t = positional[0] if positional else None
            if t is not None:
                t = t.member() if t.family is not None else t
                if set(self.axes(t, s, e.span)) & {len(t.shape) - 1, len(t.shape) - 2}:
                    self.fail("a transpose that moves the positions axis", e.span)
            return
        self.fail(f"`{op}` on values along the positions: "
                  f"{'padding' if self.padded else 'the incremental form'} cannot prove it "
                  "keeps them apart", e.span)

    def call(self, e: Eqn, s: _Scope, ins: list, shared: set[str]) -> None:
        fn = self.functions[e.attrs["module"]]
        inst = e.attrs["instance"]
        bindings = e.attrs.get("bindings", {})
        inner_gen = {k for k, v in bindings.items()
                     if isinstance(v, Poly) and v.symbols() and v.symbols() <= s.gen
                     and len(v.terms) == 1 and v == Poly.sym(next(iter(v.symbols())))}
        key = (s.fn, inst)
        if inner_gen:
            self.along[key] = self.along.get(key, frozenset()) | frozenset(inner_gen)
        else:
            self.plain.add(key)
        if not fn.inputs:  # a table: masks and positions are computed, not learned
            # masks under which position i sees no position j > i: a cache of the keys is
            # exact
            if mask_kind(fn) in CAUSAL_KINDS and inner_gen:
                s.causal.update(v.name for v in e.outs)
            elif mask_kind(fn) is not None and inner_gen and not self.padded:
                self.fail(f"{fn.name} lets a position see later ones", e.span)
            return
        if intrinsic(fn) is not None and intrinsic(fn).positionwise:
            return
        if is_kind(fn, "attention"):
            self.attention(e, s, ins, shared)
            return
        subst = {k: v.subs(s.subst) if isinstance(v, Poly) else v for k, v in bindings.items()}
        types = {v.name: v.type for v in fn.inputs}
        types.update((p.name, p.type) for p in fn.params)
        inner = _Scope(set(inner_gen), subst, s.path + (inst,), s.loop, types)
        inner.fn = fn.name
        inner.guarded = s.guarded or (e.span if e.guards else None)
        for decl, o, t in zip(fn.inputs, e.ins, ins):
            if o.name is not None and o.name in s.causal:
                inner.causal.add(decl.name)
            if t is None:
                continue
            dt = decl.type.member() if decl.type.family is not None else decl.type
            at = t.member() if t.family is not None else t
            self._bind(dt, at, s, inner, e.span)
        for p in fn.params:
            if self.axes(p.type, inner, e.span):
                self.fail(f"parameter `{p.name}` of {fn.name} is sized by the positions",
                          p.span or e.span)
        if inst in shared and self._has_site(fn) and not self.padded:
            self.fail(f"`{inst}` is shared by every layer, so its keys would be too", e.span)
        for inner_e in fn.eqns:
            self.eqn(inner_e, inner, set())

    def _has_site(self, fn: ir.Function) -> bool:
        return any(e.op == "call" and (is_kind(self.functions[e.attrs["module"]], "attention")
                                       or self._has_site(self.functions[e.attrs["module"]]))
                   for e in fn.eqns)

    def _bind(self, decl: TensorType, actual: TensorType, s: _Scope, inner: _Scope,
              span) -> None:
        """Which of the callee's symbols (and `...`) are the generated length here."""
        dshape, ashape = list(decl.shape), list(actual.shape)
        pos = set(self.axes(actual, s, span))
        if any(isinstance(d, Ell) for d in dshape):
            k = next(i for i, d in enumerate(dshape) if isinstance(d, Ell))
            tail = len(dshape) - k - 1
            covered = range(k, len(ashape) - tail)
            if pos & set(covered):
                inner.ells.add(dshape[k].name)
            pairs = list(zip(dshape[:k], ashape[:k])) + list(
                zip(dshape[k + 1:], ashape[len(ashape) - tail:]))
            offsets = list(range(k)) + list(range(len(ashape) - tail, len(ashape)))
        else:
            pairs = list(zip(dshape, ashape))
            offsets = list(range(len(pairs)))
        for (d, _), at in zip(pairs, offsets):
            if at in pos and isinstance(d, Poly) and len(d.terms) == 1 and d.symbols():
                inner.gen.add(next(iter(d.symbols())))

    def attention(self, e: Eqn, s: _Scope, ins: list, shared: set[str]) -> None:
        q, k, v, mask = ins
        mask_op = e.ins[3]
        keys = k is not None and bool(self.axes(k, s, e.span))
        queries = q is not None and bool(self.axes(q, s, e.span))
        if self.padded:  # any mask: padding only takes keys away
            if keys:
                self.sites.append(CacheSite(loop=s.loop, path=s.path + (e.attrs["instance"],),
                                            heads=None, key=(), value=(), span=e.span))
            return
        causal = mask_op.name is not None and mask_op.name in s.causal
        if not keys:
            if causal:
                self.fail("a causal mask over keys that are not the generated positions",
                          e.span)
            elif mask is not None and self.last_is_positions(mask, s, e.span):
                self.fail("a mask whose keys are the positions, over other keys", e.span)
            return
        if not causal:
            self.fail("attention over the generated positions without a causal mask: each "
                      "new token would change the earlier outputs", e.span)
            return
        self.causal_seen = True
        if not queries:
            self.fail("attention of fixed queries over the generated positions", e.span)
            return
        if e.guards or s.guarded:
            self.fail("an attention that only some layers have", s.guarded or e.span)
            return
        heads = e.family[1].subs(s.subst) if e.family is not None else None
        if grouped(e, lambda name: s.types[name].family if name in s.types else None):
            # grouped-query attention: the cache holds the G keys and values, not A
            heads = s.types[e.ins[1].name].family.subs(s.subst)
        same = frozenset(kind for kind, o in (("key", e.ins[1]), ("value", e.ins[2]))
                         if not self.varies(o, s))
        self.sites.append(CacheSite(
            loop=s.loop, path=s.path + (e.attrs["instance"],), heads=heads,
            key=self._cache_dims(k, s, e.span), value=self._cache_dims(v, s, e.span),
            span=e.span, shared=same if heads is not None else frozenset(),
            queries=e.family[1].subs(s.subst) if e.family is not None else None))

    @staticmethod
    def varies(o: ir.Operand, s: _Scope) -> bool:
        """Whether an operand differs from member to member of the family being computed:
        a member of a parameter or input family, or a value computed from one."""
        if o.name in s.varying:
            return True
        return isinstance(o.member, str) and o.name not in s.computed

    def _cache_dims(self, t: TensorType, s: _Scope, span) -> tuple:
        t = t.member() if t.family is not None else t
        pos = set(self.axes(t, s, span))
        out = []
        for k, d in enumerate(t.shape):
            if k in pos:
                out.append(None)
            elif isinstance(d, Poly):
                out.append(d.subs(s.subst))
            else:
                self.fail("a key of unknown rank (`...`)", span)
        return tuple(out)


def derive(model: ir.Model, functions: dict[str, ir.Function]) -> Incremental:
    """The incremental form's cache sites, or NotIncremental saying why there is none."""
    candidates = []
    lengths = sequence_symbols(model, functions)
    for v in model.inputs:
        t = v.type
        if t.dtype == "int" and not t.perm and not t.pad and len(t.shape) == 1 and \
                isinstance(t.shape[0], Poly) and t.shape[0].symbols() <= lengths and \
                len(t.shape[0].symbols()) == 1:
            candidates.append((next(iter(t.shape[0].symbols())), v.name))
    found = None
    for g, name in candidates:  # the first token input a causal attention runs over
        walk = _Walk(model, functions, g)
        walk.run()
        if walk.sites or walk.causal_seen:
            found = walk, name
            break
    if found is None:
        raise NotIncremental(
            f"`{model.name}` has no incremental form: no attention over its token positions "
            "is causal (Mask^AR)", model.span,
            "generation with a key/value cache needs an autoregressive model")
    walk, tokens = found
    if walk.errors:
        message, span = walk.errors[0]
        raise NotIncremental(f"`{model.name}` has no incremental form: {message}",
                             span or model.span)
    loops = [item for item in model.body if isinstance(item, Loop)]
    layers = {k: loop.hi - loop.lo + Poly.const(1) for k, loop in enumerate(loops)}
    return Incremental(length=walk.g, tokens=tokens, sites=walk.sites, layers=layers,
                       along=walk.along, mixed=frozenset(set(walk.along) & walk.plain))
