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
from ..elaborate.intrinsics import intrinsic
from ..elaborate.ir import Eqn, Loop
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
            self._split(o.name, family_axis(len(p.type.shape)), fam)
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
