"""Tensor parallelism: which parameters split across ranks, along which axis, and where
the ranks' values meet again, decided once from the equations (docs/distributed.md).

Each value of a module (and of the model's own body) is, on every rank:
  - replicated (R): the whole value, the same on every rank;
  - split (S): a contiguous block of one axis, rank r holding block r of tp. The axis is a
    family axis (`("fam", "A")`: heads r*A/tp .. of a family over A) or the last axis of
    the features (`("feat", "F")`: columns r*F/tp ..); two values split alike have the
    same key;
  - partial (P): this rank's share of a sum over a split axis; the sum of the ranks'
    shares is the value.

A pass over each module's equations splits its parameters as the products let it:
  - a family of parameters (W_i^Q for i in 1..A) along the family: each rank computes its
    members (its heads, its experts); a member it does not hold, read by a fixed number
    (`W_1^Q`) or through a map that leaves the rank's block, keeps the family whole;
  - X @ W with X replicated splits W's columns (column-parallel: the up projections, the
    output head), and what follows elementwise stays split, biases along the split axis
    split with it;
  - a split value times a matrix whose rows are the split axis splits the rows (row-
    parallel: the output and down projections) and is partial; so is the sum over a
    split family (the experts' outputs);
  - the token embedding's rows (the vocabulary) split, each rank looking up the ids it
    holds; the same table read as the output head is split along the vocabulary too.
Where the equations go on with something a split value cannot enter (a norm over the
features, a softmax, another module), the value is gathered (all-gather) or summed
(all-reduce) first. A column split whose values a module would gather again before its
end is undone: the parameter stays whole (the output head, gathered once after the
layers, stays split). Replicated values that a split computation reads
`enter` it: the identity forward, and backward the sum of the ranks' gradients, which each
hold only their block's share. The torch backend prints these decisions
(backends/torch/codegen.py); nothing here knows the number of ranks, which the sizes must
be multiples of (`divisibility`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..elaborate import ir
from ..elaborate.intrinsics import intrinsic, is_kind
from ..elaborate.ir import Ell, Eqn, Loop
from ..elaborate.primitives import ELEMENTWISE, LAST_AXIS
from ..elaborate.symbolic import Poly
from ..errors import Diagnostic
from ..names import family_axis
from .families import has_params

Key = tuple[str, str]  # ("fam" | "feat", the split axis's size as text)
PARTIAL = "P"

# operations that act entry by entry: a split operand stays split, its partner broadcast
POINTWISE = frozenset({"add", "sub", "mul", "div", "neg", "max", "min", "pow", "exp", "log",
                       "sqrt", "tanh", "sigmoid", "erf", "sin", "cos", "abs"})
POINTWISE_KINDS = frozenset({"gelu", "silu"})  # intrinsics that act entry by entry
# what a family's members each compute alone (the member's own axes; the family axis, the
# batch untouched): masks of a split family of biases stay split
PER_MEMBER = frozenset({"mask", "mask_tensor"})


@dataclass
class Split:
    """How one parameter is split: `axis` of the tensor as the torch module stores it (a
    family's axis where names.family_layout puts it), of size `size`."""

    axis: int
    size: Poly
    span: ir.Span | None = None


@dataclass
class Plan:
    """The tensor-parallel plan of one module (or, under "", of the model's own body)."""

    splits: dict[str, Split] = field(default_factory=dict)  # parameter -> its split
    families: set[str] = field(default_factory=set)  # the family sizes split (their text)
    # (equation's first result, operand position) -> "enter" | "gather"
    uses: dict[tuple[str, int], str] = field(default_factory=dict)
    reduce: set[str] = field(default_factory=set)  # partial values, all-reduced when made
    gather: set[str] = field(default_factory=set)  # split values, gathered when made
    lookups: set[str] = field(default_factory=set)  # lookups of a split table (summed there)
    picks: dict[str, bool] = field(default_factory=dict)  # gather_members/grouped attention
    # result -> whether the family it reads is split (its picks then local to the rank)
    blocks: set[str] = field(default_factory=set)  # `members` results: the rank's block
    split: set[str] = field(default_factory=set)  # every value held split (a block per rank)
    # sequence parallelism (`sequence`): a replicated value held as a block of its positions
    # on each rank, the axis counted from the end
    sequence: dict[str, int] = field(default_factory=dict)
    # (equation's first result, operand position) -> (how, axis): "enter" (gathered, its
    # gradient reduce-scattered: read by split computations), "whole" (gathered; backward,
    # this rank's block of the gradient), "scatter" (a whole value cut to the rank's block),
    # "shared" (a value without positions read on blocks of them: backward, its gradient
    # summed over the ranks)
    seq_uses: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    # value -> (how, axis) where it is made: "reduce" (a partial value reduce-scattered, or
    # a lookup of a split table), "scatter" (a whole value cut), "whole" (gathered)
    seq_made: dict[str, tuple[str, int]] = field(default_factory=dict)
    # the model's body: the run lengths whose positions sequence parallelism splits (none:
    # it is not used), and the modules it calls that take part (their uses' names)
    positions: list[str] = field(default_factory=list)
    seq_instances: set[str] = field(default_factory=set)
    # a module: its parameters are read on blocks of positions (a norm's), their gradients
    # summed over the ranks
    shared: bool = False

    @property
    def active(self) -> bool:
        return bool(self.splits)


def plan(model: ir.Model, functions: dict[str, ir.Function]) -> dict[str, Plan]:
    """The plan of every module with parameters, and of the model's body (key "");
    `model` and `functions` as `lowering.prepare` leaves them."""
    out = {name: _fixed_point(fn.eqns, fn.params, fn.inputs, fn.outputs, functions, name)
           for name, fn in functions.items() if fn.params}
    eqns: list[Eqn] = []
    carried: set[str] = set()
    for item in model.body:
        if isinstance(item, Loop):
            eqns.extend(item.body)
            carried.update(c.result for c in item.carried)
            carried.update(x for x, _ in item.results)
        else:
            eqns.append(item)
    ids = {v.name for v in model.inputs if v.type.dtype == "int"}
    outs = [ir.Value(name=n, type=ir.TensorType()) for n in carried] + list(model.outputs)
    out[""] = _fixed_point(eqns, model.params, model.inputs, outs, functions, "", ids)
    sequence(model, functions, out)
    return out


def _fixed_point(eqns, params, inputs, outputs, functions, name, ids=frozenset()) -> Plan:
    """The plan, parameters whose split would be undone kept whole until none is."""
    whole: set[str] = set()  # parameters and family sizes kept whole
    for _ in range(len(params) + 8):
        walk = _Walk(eqns, params, inputs, outputs, functions, whole, ids, bool(name))
        walk.run()
        if not walk.undo:
            return walk.plan
        whole |= walk.undo
    return Plan()


class _Walk:
    def __init__(self, eqns, params, inputs, outputs, functions, whole, ids, in_module):
        self.eqns = eqns
        self.in_module = in_module  # a module's: a split gathered inside it is undone
        self.params = {p.name: p for p in params}
        self.functions = functions
        self.whole = whole
        self.ids = ids  # the model's inputs of token ids
        self.outputs = [o.name for o in outputs]
        self.plan = Plan()
        self.state: dict[str, Key | str | None] = {v.name: None for v in inputs}
        self.made_by: dict[str, Eqn] = {}
        self.origin: dict[Key, set[str]] = {}  # a feature split -> the parameters making it
        self.undo: set[str] = set()
        self.views: dict[str, tuple[str, bool]] = {}  # transpose(W): (W, transposed)
        self.reads: dict[str, int] = {}  # value -> how many operands read it
        for e in eqns:
            for o in e.ins:
                if o.name is not None:
                    self.reads[o.name] = self.reads.get(o.name, 0) + 1
        for p in params:
            fam = p.type.family
            if fam is not None and str(fam) not in whole:
                self.plan.families.add(str(fam))

    # -- states
    def _param_state(self, o: ir.Operand) -> Key | None:
        p = self.params[o.name]
        fam = p.type.family
        if fam is not None and str(fam) in self.plan.families:
            if o.member is not None and not isinstance(o.member, str):
                self.undo.add(str(fam))  # a member by number: the family stays whole
                return None
            self._split(o.name, family_axis(len(p.type.shape), p.members_first), fam)
            return ("fam", str(fam))
        s = self.plan.splits.get(o.name)
        if s is None:
            return None
        return ("feat", str(s.size)) if s.axis == len(p.type.shape) - 1 else None

    def _split(self, name: str, axis: int, size: Poly) -> bool:
        """Split parameter `name` along `axis`; False (and kept whole) on a conflict."""
        if name in self.whole:
            return False
        have = self.plan.splits.get(name)
        if have is not None and have.axis != axis:
            self.undo.add(name)
            return False
        self.plan.splits[name] = Split(axis, Poly.lift(size), self.params[name].span)
        return True

    def st(self, o: ir.Operand):
        if o.name is None:
            return None
        if o.name in self.params:
            return self._param_state(o)
        return self.state.get(o.name)

    # -- marks
    def gather(self, e: Eqn, k: int) -> None:
        s = self.st(e.ins[k])
        if s == PARTIAL:
            self.plan.reduce.add(e.ins[k].name)
            self.state[e.ins[k].name] = None
        elif s is not None:
            name = e.ins[k].name
            if self.reads.get(name) == 1 and not self.in_module:
                # gathered where it is made: the logits a model's softmax reads are its
                # output too (logits())
                self.plan.gather.add(name)
                self.plan.split.discard(name)
                self.state[name] = None
            else:
                self.plan.uses[(e.outs[0].name, k)] = "gather"
            if self.in_module and s[0] == "feat" and s in self.origin:
                self.undo |= self.origin[s]  # a column split gathered again: undone

    def enter(self, e: Eqn, k: int) -> None:
        o = e.ins[k]
        if o.name is not None and self.st(o) is None:
            self.plan.uses[(e.outs[0].name, k)] = "enter"

    def replicated(self, e: Eqn) -> None:
        for k in range(len(e.ins)):
            self.gather(e, k)
        self.set(e, None)

    def set(self, e: Eqn, s) -> None:
        for o in e.outs:
            self.state[o.name] = s
            self.made_by[o.name] = e
            if s is not None and s != PARTIAL:
                self.plan.split.add(o.name)

    # -- the walk
    def run(self) -> None:
        for e in self.eqns:
            self.eqn(e)
        for name in self.outputs:
            s = self.state.get(name)
            if s == PARTIAL:
                self.plan.reduce.add(name)
            elif s is not None:
                self.plan.gather.add(name)
                self.plan.split.discard(name)
        for name in list(self.plan.splits):
            if name in self.undo:
                del self.plan.splits[name]

    def eqn(self, e: Eqn) -> None:
        for o in e.ins:  # a partial value is summed before anything reads it
            if self.st(o) == PARTIAL:
                self.plan.reduce.add(o.name)
                self.state[o.name] = None
        fam = str(e.family[1]) if e.family is not None else None
        if fam is not None and fam in self.plan.families:
            return self.member_eqn(e, ("fam", fam))
        if fam is not None:
            return self.replicated(e)
        if e.op == "matmul":
            return self.matmul(e)
        if e.op == "lookup":
            return self.lookup(e)
        if e.op == "transpose" and e.ins[0].name in self.params:
            self.views[e.outs[0].name] = (e.ins[0].name, True)
            return self.set(e, None)
        if e.op == "sum_members":
            s = self.st(e.ins[0])
            return self.set(e, PARTIAL) if s is not None and s[0] == "fam" else \
                self.replicated(e)
        if e.op in PER_MEMBER and e.ins and (s := self.st(e.ins[0])) is not None and \
                s[0] == "fam":
            return self.set(e, s)
        if e.op in POINTWISE:
            return self.pointwise(e)
        if e.op == "call":
            return self.call(e)
        return self.replicated(e)

    def member_eqn(self, e: Eqn, key: Key) -> None:
        """An equation over a split family: each rank computes its members."""
        if any(isinstance(o.const, Poly) and e.family[0] in o.const.symbols()
               for o in e.ins if o.name is None):
            self.undo.add(key[1])  # the member's number in arithmetic: the family stays whole
            return self.replicated(e)
        if e.op == "call" and has_params(self.functions[e.attrs["module"]], self.functions):
            self.undo.add(key[1])
            return self.replicated(e)
        if e.op == "members":
            self.plan.blocks.add(e.outs[0].name)
            return self.set(e, key)
        if e.op == "gather_members" or "groups" in e.attrs:
            src = e.ins[0] if e.op == "gather_members" else \
                next(o for o in e.ins if o.whole_family)
            s = self.st(src)
            self.plan.picks[e.outs[0].name] = s is not None
            if s is not None and s[0] != "fam":
                self.undo.add(key[1])
        for k, o in enumerate(e.ins):
            s = self.st(o)
            if s is None:
                self.enter(e, k)
            elif s[0] != "fam":
                self.gather(e, k)
        self.set(e, key)

    def matmul(self, e: Eqn) -> None:
        x, w = e.ins
        sx = self.st(x)
        wname, transposed = self.views.get(w.name, (w.name, False))
        p = self.params.get(wname)
        if p is None or p.type.family is not None or len(p.type.shape) != 2:
            return self.replicated(e)
        rows, cols = p.type.shape
        if transposed:  # X @ W^T: W's rows are the product's columns
            rows, cols = cols, rows
        if sx is None:  # column-parallel
            if self._split(wname, 0 if transposed else 1, cols):
                self.origin.setdefault(("feat", str(cols)), set()).add(wname)
                self.enter(e, 0)
                return self.set(e, ("feat", str(cols)))
            return self.set(e, None)
        if sx == ("feat", str(rows)) and self._split(wname, 1 if transposed else 0, rows):
            return self.set(e, PARTIAL)  # row-parallel
        return self.replicated(e)

    def lookup(self, e: Eqn) -> None:
        """Rows of the token embedding: split along the vocabulary (the rows), each rank
        looking up the ids it holds, the others 0, and the ranks' rows summed (the lookup
        is whole where it is made)."""
        ids, table = e.ins
        p = self.params.get(table.name)
        if ids.name in self.ids and p is not None and p.type.family is None and \
                not p.type.shape[0].is_const() and self._split(table.name, 0,
                                                                 p.type.shape[0]):
            self.plan.lookups.add(e.outs[0].name)
        return self.set(e, None)

    def pointwise(self, e: Eqn) -> None:
        keys = {s for o in e.ins if (s := self.st(o)) is not None}
        if len(keys) != 1:
            return self.replicated(e)
        (key,) = keys
        for k, o in enumerate(e.ins):
            if self.st(o) is not None or o.name is None:
                continue
            t = self.params[o.name].type if o.name in self.params else None
            if key[0] == "feat":
                last = t.shape[-1] if t is not None and t.shape else None
                if t is not None and len(t.shape) == 1 and str(last) == key[1] and \
                        t.family is None and self._split(o.name, 0, last):
                    continue  # a bias along the split axis: split with it
                if not self._broadcasts(o):
                    return self.replicated(e)
            self.enter(e, k)
        self.set(e, key)

    def _broadcasts(self, o: ir.Operand) -> bool:
        """Whether a replicated operand broadcasts across the split features: no axes, or
        a last axis of 1."""
        v = self.made_by.get(o.name)
        t = next((x.type for x in v.outs if x.name == o.name), None) if v else None
        if t is None and o.name in self.params:
            t = self.params[o.name].type
        if t is None:
            return False  # an input of the module: its shape is the caller's
        return not t.shape or t.shape[-1] == Poly.const(1)

    def call(self, e: Eqn) -> None:
        fn = self.functions[e.attrs["module"]]
        i = intrinsic(fn)
        if i is not None and i.kind == "concat":
            s = self.st(e.ins[0])
            if s is not None and s[0] == "fam" and len(e.ins) == 1:
                size = str(e.outs[0].type.shape[-1]) if e.outs[0].type.shape else ""
                return self.set(e, ("feat", size))
            return self.replicated(e)
        if not has_params(fn, self.functions) and len(e.ins) == 1 and \
                (s := self.st(e.ins[0])) is not None and s[0] == "feat" and \
                (i is not None and i.kind in POINTWISE_KINDS or
                 i is None and _pointwise(fn, self.functions)):
            return self.set(e, s)
        self.replicated(e)


def _pointwise(fn: ir.Function, functions) -> bool:
    """Whether a module without parameters acts entry by entry on its one input."""
    if len(fn.inputs) != 1:
        return False
    for e in fn.eqns:
        if e.op == "call":
            callee = functions[e.attrs["module"]]
            i = intrinsic(callee)
            if not (i is not None and i.kind in POINTWISE_KINDS or
                    i is None and _pointwise(callee, functions)):
                return False
        elif e.op not in POINTWISE or any(o.name is None and not isinstance(o.const, (int, float))
                                          for o in e.ins):
            return False
    return True


def divisibility(plans: dict[str, Plan], values: dict, tp: int
                 ) -> list[tuple[str, str, Split, int]]:
    """(module, parameter, its split, the size) for each split that `tp` ranks cannot make
    evenly at the sizes `values` (hyperparameter -> number)."""
    out = []
    for module, p in plans.items():
        for name, s in p.splits.items():
            n = s.size.evaluate(values)
            if n.denominator == 1 and n % tp:
                out.append((module, name, s, int(n)))
    return out


def uneven(plans: dict[str, Plan], configurations: list[tuple[str, dict]], tp: int
           ) -> list[Diagnostic]:
    """What `tp` ranks cannot split evenly at each (name, sizes) configuration, one
    diagnostic per module and split size, located at its first parameter: an error in a
    module (parallelize() refuses it), a warning for the model's own parameters (they stay
    whole, as parallelize() leaves them)."""
    found: dict[tuple[str, str], tuple[Split, list[str], dict]] = {}
    for label, values in configurations:
        for module, name, split, n in divisibility(plans, values, tp):
            _, names, sizes = found.setdefault((module, str(split.size)), (split, [], {}))
            if name not in names:
                names.append(name)
            labels = sizes.setdefault(n, [])
            if label not in labels:
                labels.append(label)
    out = []
    for (module, size), (split, names, sizes) in found.items():
        at = "; ".join(f"{size} = {n} at {', '.join(ps)}" for n, ps in sizes.items())
        what = ", ".join(f"`{n}`" for n in names)
        if not module:
            out.append(Diagnostic(
                "warning", f"the model's {what} stay whole with {tp} ranks of tensor "
                f"parallelism, which cannot split {size} evenly ({at})", split.span,
                "the model's own parameters are split only where the ranks divide them; "
                "the layers are split all the same"))
            continue
        out.append(Diagnostic(
            "error", f"`{module}` splits {what} along {size} across the ranks of tensor "
            f"parallelism, and {tp} ranks cannot split {size} evenly ({at})", split.span,
            f"choose a number of ranks that divides {size}; fgc does not replicate what "
            "its plan splits (key/value heads fewer than the ranks)"))
    return out


# --------------------------------------------------------------- sequence parallelism
# what acts on each position alone: entry by entry (a `cond` picks one operand whole;
# summing a family's members is its own), and, where the positions lie in a module's `...`,
# along the last axis or the last two (products, transposes)
ENTRYWISE = (ELEMENTWISE | {"cond"}) - {"sum_members"}
PER_POSITION_OPS = ENTRYWISE | LAST_AXIS | {"matmul", "transpose"}
PER_POSITION_KINDS = POINTWISE_KINDS | frozenset({"layer_norm", "rms_norm", "softmax"})


def sequence_only(plan: Plan) -> Plan:
    """The model's body as parallelize() runs it where the ranks do not divide its own
    parameters (they stay whole): its sequence parallelism alone, a sum of partial values
    a cut to the rank's block and what split computations read gathered whole."""
    return Plan(sequence=dict(plan.sequence), positions=list(plan.positions),
                seq_instances=set(plan.seq_instances),
                seq_uses={k: ("whole", a) if how == "enter" else (how, a)
                          for k, (how, a) in plan.seq_uses.items()},
                seq_made={k: ("scatter", a) if how == "reduce" else (how, a)
                          for k, (how, a) in plan.seq_made.items()})


def sequence(model: ir.Model, functions: dict[str, ir.Function],
             plans: dict[str, Plan]) -> None:
    """Sequence parallelism (Megatron's), marked in `plans`: between the split
    computations, the values the model's body carries from layer to layer (the residual
    stream, its norms) are held as a block of the positions on each rank instead of whole.
    A partial value is then reduce-scattered along the positions instead of all-reduced, and
    a block of positions is all-gathered where a split computation reads it (backward, its
    gradient reduce-scattered), or where something that mixes positions (attention, a table
    of positions) reads it. What acts on each position alone (norms, elementwise arithmetic,
    products with whole parameters, modules of these) computes on the rank's block: the
    activations between the split computations take 1/N of the memory, and the
    communication is the same (an all-reduce is a reduce-scatter and an all-gather).

    Sound where it applies: a module of split computations called from the body gets its
    blocks of positions and gathers them itself; a module with split parameters called
    from another module keeps its inputs whole. The model's body does not use it where it
    cannot say which axis is the positions, or where its layers stack their values."""
    lengths = {str(v.type.shape[0]) for v in model.inputs
               if v.type.dtype == "int" and not v.type.pad and len(v.type.shape) == 1
               and isinstance(v.type.shape[0], Poly)}
    names = {s for s in ir.sequence_symbols(model, functions) if s in lengths}
    loops = [item for item in model.body if isinstance(item, Loop)]
    if not names or any(loop.stacks for loop in loops):
        return
    body = [e for item in model.body for e in (item.body if isinstance(item, Loop) else [item])]
    made = {o.name for e in body for o in e.outs}
    carried = {c.init for loop in loops for c in loop.carried} | \
        {c.result for loop in loops for c in loop.carried}
    returned, skip = _returned(model, functions, body)
    if not carried <= made or not returned <= made:
        return  # the layers' first value is an input, or a result is the layers' own
    top = _Seq(plans[""], functions, plans, names, returned)
    top.held = {x for loop in loops for x in loop.shared}  # modules the layers share
    top.types.update({v.name: v.type for v in model.inputs})
    top.types.update({p.name: p.type for p in model.params})
    for e in body:
        top.types.update({o.name: o.type for o in e.outs})
    for loop in loops:
        for c in loop.carried:
            top.types[c.inner] = top.types[c.init]
        for x, last in loop.results:
            top.types[last] = top.types[x]
    # modules with split computations called from the body, and the axes of their inputs
    # there; a module also called from another module keeps its inputs whole
    nested = {e.attrs["module"] for fn in functions.values() for e in fn.eqns if e.op == "call"}
    signatures: dict[str, tuple | None] = {}
    for e in body:
        m = e.attrs.get("module") if e.op == "call" else None
        p = plans.get(m) if m is not None else None
        if p is None or not p.active or m in nested or e.family is not None or \
                intrinsic(functions[m]) is not None:
            continue
        sig = tuple(top.value_axis(o) for o in e.ins)
        signatures[m] = sig if signatures.get(m, sig) == sig else None
    for m, sig in signatures.items():
        walk = _Seq(plans[m], functions, plans, set(), set())
        if sig is not None and walk.start(functions[m], sig):
            walk.run(functions[m].eqns)
            top.modules[m] = (sig, tuple(walk.state.get(o.name) for o in functions[m].outputs))
    whole: set[int] = set()  # layers whose values would only be cut and gathered again
    while True:
        useless = _walk_body(top, model, skip, whole)
        if not useless:
            break
        whole |= useless
        top.state.clear()
        top.fixed.clear()
        _clear(plans, [top.plan])
    top.plan.sequence.update(top.state)
    if top.plan.sequence:
        top.plan.positions = sorted(names)
    else:  # nothing the body holds as blocks: none anywhere
        _clear(plans, plans.values())


def _walk_body(top: _Seq, model: ir.Model, skip: Eqn | None, whole: set[int]) -> set[int]:
    """The model's body walked, the layers of block k in `whole` carrying whole values;
    the blocks whose layers hold no value as blocks of positions but what they carry (each
    layer would gather it whole and cut it again)."""
    useless = set()
    loops = [item for item in model.body if isinstance(item, Loop)]
    top.carried = {x for k, loop in enumerate(loops) if k not in whole
                   for c in loop.carried for x in (c.init, c.result)}
    top.kept = {c.init for k, loop in enumerate(loops) if k in whole for c in loop.carried}
    k = 0
    for item in model.body:
        if not isinstance(item, Loop):
            if item is not skip:
                top.eqn(item)
            continue
        for c in item.carried if k not in whole else ():  # carried as blocks of positions
            a = top.axis(top.types[c.init])
            if a is not None:
                top.state[c.inner] = a
        for e in item.body:
            top.eqn(e)
        for x, last in item.results:
            if x in top.state:
                top.state[last] = top.state[x]
        if k not in whole and not any(
                o.name in top.state and top.plan.seq_made.get(o.name, ("",))[0] != "scatter"
                for e in item.body for o in e.outs):
            useless.add(k)
        k += 1
    return useless


def _clear(plans: dict[str, Plan], marked) -> None:
    """The sequence-parallel marks of the plans `marked`, and the modules' weights'."""
    for plan in marked:
        plan.sequence.clear()
        plan.seq_uses.clear()
        plan.seq_made.clear()
        plan.seq_instances.clear()
    for p in plans.values():
        p.shared = False


def _returned(model: ir.Model, functions: dict[str, ir.Function], body: list[Eqn]
              ) -> tuple[set[str], Eqn | None]:
    """What the model's body returns, and the equation it leaves to its caller: the logits
    where its one output is their softmax (model.py's logits(), whose softmax forward()
    takes), else its outputs and None."""
    outs = [o.name for o in model.outputs]
    last = next((e for e in reversed(body) if any(o.name in outs for o in e.outs)), None)
    if len(outs) == 1 and last is not None and last.op == "call" and \
            is_kind(functions[last.attrs["module"]], "softmax"):
        return {last.ins[0].name}, last
    return set(outs), None


def _tp_free(fn: ir.Function, functions, plans) -> bool:
    """Whether no computation of `fn`, or of a module it calls, is split."""
    p = plans.get(fn.name)
    return not (p is not None and p.active) and all(
        _tp_free(functions[e.attrs["module"]], functions, plans)
        for e in fn.eqns if e.op == "call")


def _per_position(fn: ir.Function, functions) -> bool:
    """Whether a module acts on each position of its `...` alone."""
    i = intrinsic(fn)
    if i is not None:
        return i.kind in PER_POSITION_KINDS
    return all(_per_position(functions[e.attrs["module"]], functions) if e.op == "call"
               else e.op in PER_POSITION_OPS and e.family is None for e in fn.eqns)


class _Seq:
    """The sequence-parallel walk of one body (the model's, or a module's called from it):
    `state` holds the values held as blocks of positions, with the axis (from the end)."""

    def __init__(self, plan, functions, plans, names, returned):
        self.plan = plan
        self.functions = functions
        self.plans = plans
        self.names = names  # the sizes that are the positions here
        self.ell: int | None = None  # in a module: how deep in its `...` the positions are
        self.carried: set[str] = set()  # the values the layers carry (held as blocks)
        self.returned = returned  # the values the body returns (whole)
        self.kept: set[str] = set()  # the first values of layers that carry them whole
        self.modules: dict[str, tuple] = {}  # module -> (its inputs' axes, its outputs')
        self.state: dict[str, int] = {}
        self.types: dict[str, ir.TensorType] = {}
        self.top = bool(names)  # the model's body (a module's walk starts without names)
        self.held: set[str] = set()  # modules the layers share (the model's, kept whole)
        self.fixed: set[str] = set()  # values of sizes alone

    def axis(self, t: ir.TensorType | None) -> int | None:
        """Where a value of type `t` has its positions, from the end; None where it has
        none, or several."""
        if t is None:
            return None
        shape = t.shape
        if shape and isinstance(shape[0], Ell):
            return -(self.ell + len(shape) - 1) if self.ell else None
        hits = [k for k, d in enumerate(shape) if isinstance(d, Poly)
                and any(d == Poly.sym(n) for n in self.names)]
        return hits[0] - len(shape) if len(hits) == 1 else None

    def value_axis(self, o: ir.Operand) -> int | None:
        if o.name is None or o.name not in self.types:
            return None
        return self.axis(self.types[o.name])

    def start(self, fn: ir.Function, sig: tuple) -> bool:
        """A module's walk, its inputs arriving as `sig` says; False where the axes do not
        say one place of the positions."""
        ells = set()
        for v, a in zip(fn.inputs, sig):
            self.types[v.name] = v.type
            if a is None:
                continue
            shape = v.type.shape
            if shape and isinstance(shape[0], Ell):
                ells.add(-a - (len(shape) - 1))
            elif -a <= len(shape) and isinstance(shape[a], Poly) and \
                    len(shape[a].symbols()) == 1 and shape[a] == Poly.sym(
                        next(iter(shape[a].symbols()))):
                self.names.add(next(iter(shape[a].symbols())))
            else:
                return False
        if len(ells) > 1 or any(k < 1 for k in ells):
            return False
        self.ell = next(iter(ells), None)
        for v, a in zip(fn.inputs, sig):
            if a is not None:
                if self.axis(v.type) != a:
                    return False
                self.state[v.name] = a
        for e in fn.eqns:
            self.types.update({o.name: o.type for o in e.outs})
        for p in fn.params:
            self.types[p.name] = p.type
        return True

    def use(self, e: Eqn, k: int, how: str, axis: int) -> None:
        self.plan.seq_uses[(e.outs[0].name, k)] = (how, axis)

    def run(self, eqns: list[Eqn]) -> None:
        for e in eqns:
            self.eqn(e)
        self.plan.sequence.update(self.state)

    def eqn(self, e: Eqn) -> None:
        plan = self.plan
        out0 = e.outs[0].name
        if all(o.name is None or o.name in self.fixed for o in e.ins) and e.op != "call":
            self.fixed.update(o.name for o in e.outs)  # of sizes alone (a scale, a mask)
        qs = {k: self.state[o.name] for k, o in enumerate(e.ins) if o.name in self.state}
        if self.top and e.op == "call" and e.attrs["module"] in self.modules:
            sig, outs = self.modules[e.attrs["module"]]
            for k, want in enumerate(sig):
                if want is not None and k not in qs:
                    self.use(e, k, "scatter", want)
            for o, a in zip(e.outs, outs):
                if a is not None:
                    self.state[o.name] = a
            self.plan.seq_instances.add(e.attrs["instance"])
            return self.made(e)
        touched = e.family is not None or any(
            (out0, k) in plan.uses for k in range(len(e.ins))) or any(
            o.name in plan.split or o.name in plan.gather or o.name in plan.blocks
            for o in e.outs)
        if qs:
            axes = None if touched else self.per_position(e, qs)
            if axes is not None:
                for k, o in enumerate(e.ins):
                    if k in qs or o.name is None:
                        continue
                    a = self.value_axis(o)
                    if a is not None:
                        self.use(e, k, "scatter", a)
                    elif o.name not in self.fixed:  # read at every position
                        self.use(e, k, "shared", 0)
                for o, a in zip(e.outs, axes):
                    self.state[o.name] = a
                if e.op == "call" and e.attrs["module"] in self.plans:  # a norm's weights
                    self.plans[e.attrs["module"]].shared = True
                    self.plan.seq_instances.add(e.attrs["instance"])
            else:
                for k, a in qs.items():
                    entered = plan.uses.get((out0, k)) == "enter"
                    self.use(e, k, "enter" if entered else "whole", a)
        self.made(e)

    def made(self, e: Eqn) -> None:
        for o in e.outs:
            a = self.axis(o.type)
            if o.name in self.returned or o.name in self.kept:  # (layers that keep it whole)
                if o.name in self.state:
                    self.plan.seq_made[o.name] = ("whole", self.state.pop(o.name))
                continue
            if a is None or o.name in self.state:
                continue
            if o.name in self.plan.reduce or o.name in self.plan.lookups:
                self.plan.seq_made[o.name] = ("reduce", a)
                self.state[o.name] = a
            elif o.name in self.carried:
                self.plan.seq_made[o.name] = ("scatter", a)
                self.state[o.name] = a

    def per_position(self, e: Eqn, qs: dict[int, int]) -> list[int] | None:
        """The axes of `e`'s results where it acts on each position alone, its operands
        with positions at the same place; None where it does not."""
        axes = set(qs.values())
        if len(axes) != 1:
            return None
        (a,) = axes
        if e.op in ENTRYWISE:
            for k, o in enumerate(e.ins):
                if k in qs or o.name is None:
                    continue
                b = self.value_axis(o)
                t = self.types.get(o.name)
                if b is None:  # no positions: it broadcasts across them
                    if t is None or any(isinstance(d, Ell) for d in t.shape) or \
                            (len(t.shape) >= -a and t.shape[a] != Poly.const(1)):
                        return None
                elif b != a:
                    return None
            return self._results(e, a)
        if e.op == "call":
            fn = self.functions[e.attrs["module"]]
            if not _tp_free(fn, self.functions, self.plans) or \
                    not _per_position(fn, self.functions) or fn.mask_inputs or \
                    any(has_params(self.functions[x.attrs["module"]], self.functions)
                        for x in fn.eqns if x.op == "call") or \
                    fn.params and (not self.top or e.attrs.get("instance") in self.held):
                return None  # parameters below its own, a module's, or the layers': whole
            depth = set()
            ells = set()
            for k, (v, o) in enumerate(zip(fn.inputs, e.ins)):
                shape = v.type.shape
                b = qs.get(k, self.value_axis(o))
                is_ell = bool(shape) and isinstance(shape[0], Ell)
                if b is None:
                    if is_ell:
                        return None  # its `...` would stand for other axes
                    continue
                if not is_ell or -b - (len(shape) - 1) < 1:
                    return None
                depth.add(-b - (len(shape) - 1))
                ells.add(shape[0])
            if len(depth) != 1 or len(ells) != 1:
                return None
            (k_ell,), (ell,) = depth, ells
            out = []
            for v in fn.outputs:
                shape = v.type.shape
                if not shape or shape[0] != ell:
                    return None
                out.append(-(k_ell + len(shape) - 1))
            return out
        return None

    def _results(self, e: Eqn, a: int) -> list[int] | None:
        for o in e.outs:
            if self.axis(o.type) not in (None, a) or o.type.family is not None:
                return None
        return [a] * len(e.outs)
