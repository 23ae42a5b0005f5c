"""Where every value's axes are, and how its integers are held: decided once here and
printed by each backend as it is (`ir.Layout` on every value the equations make).

A tensor has leading axes (the batch, and the family axes of the module uses it is
computed in), its own family axis if it is computed for every member at once, then the
spec's dimensions. Which results carry a family axis is `passes.families.eqn_has_axis`,
the rule the incremental analysis reads too. Integers that are positions (from `argmax`,
`argsort`, `invperm`, `iota`, or ids the model takes from 1) are held 0-based, so an
index or a row lookup reads them as they are; operations that only move entries keep
them so, adding a whole constant moves the offset instead of the entries, and anything
that computes with their values sees the spec's values (a sum or difference of held
integers is held by the sum or difference of the offsets). A module takes and returns the
spec's values.
"""

from __future__ import annotations

from ..elaborate import ir
from ..elaborate.ir import Ell, Eqn, Layout, Loop, Operand, TensorType
from ..elaborate.symbolic import Poly
from ..passes.families import eqn_has_axis

# results held as their first operand is held: they only move or pick entries
MOVES = {"transpose", "broadcast_to", "index", "members"}
# results held as all their (integer) operands are, where those agree
JOINS = ("concat", "vconcat")
# results held 0-based: positions
POSITIONS = {"argmax", "argsort", "invperm", "iota"}
# operations whose integer operands (beyond MOVES' first) may be held: they read ids
# 0-based (an index's positions, the permutation invperm inverts, a lookup's ids)
READS_HELD = {"index", "invperm", "lookup"}
ONE = Poly.const(1)


def rank(t: TensorType) -> int | None:
    """The number of the spec's own dimensions (a family's members'), None with `...`."""
    return None if any(isinstance(d, Ell) for d in t.shape) else len(t.shape)


def of_input(t: TensorType, model: bool) -> Layout:
    """A module's input has the caller's axes in front; a model's has the batch. Ids the
    model takes from `lo` come held from 0 (as tokenizers give them)."""
    held = t.lo if model and t.dtype == "int" and t.lo is not None and not _zero(t.lo) \
        else None
    return Layout(lead=True, fam=t.family is not None, rank=rank(t.member()), held=held)


def of_param(t: TensorType) -> Layout:
    return Layout(lead=False, fam=t.family is not None, rank=rank(t.member()))


CONST = Layout(lead=False, fam=False, rank=0)


def of_operand(o: Operand, e: Eqn, base: Layout) -> Layout:
    """How equation `e` reads operand `o` of a value laid out as `base`: a member picked
    by a number (`h_1`) loses the family axis; `W_i` inside `for i` and a whole family
    (`h[*]`) keep it."""
    if o.member is not None and not isinstance(o.member, str) and base.fam:
        return base.model_copy(update={"fam": False})
    return base


def stacked(inner: Layout) -> Layout:
    """Every layer's value of X^(l) as X^(1..L): the layers on a new first own axis."""
    return inner.model_copy(update={"rank": None if inner.rank is None else inner.rank + 1})


def of_eqn(e: Eqn, ins: list[Layout], functions: dict[str, ir.Function]) -> list[Layout]:
    """The layouts of `e`'s results, given those of its operands (as `of_operand` reads
    them)."""
    lead = any(x.lead for x in ins)
    fam = eqn_has_axis(e, [x.fam for x in ins], functions)
    held = None if e.op == "call" else _held(e, ins)
    return [Layout(lead=lead, fam=fam, rank=rank(v.type.member()), held=held) for v in e.outs]


def _held(e: Eqn, ins: list[Layout]) -> Poly | None:
    if e.outs[0].type.dtype != "int":
        return None
    if e.op in POSITIONS:
        return ONE
    if e.op in MOVES:
        return ins[0].held
    if e.op in ("select", "cond"):  # either operand's entries, as both are held
        x, y = ins[-2:]
        return x.held if _same(x.held, y.held) else None
    if e.op in JOINS:
        return ins[0].held if all(_same(ins[0].held, x.held) for x in ins) else None
    moved = shifted(e)
    if moved is not None:  # the same entries, held the shift further from the spec's
        k, shift = moved
        held = (ins[k].held or Poly.const(0)) + shift
        return None if _zero(held) else held
    if e.op in ("add", "sub"):  # the stored entries added: the offsets add too
        a, b = (x.held or Poly.const(0) for x in ins)
        held = a + b if e.op == "add" else a - b
        return None if _zero(held) else held
    return None


def shifted(e: Eqn) -> tuple[int, Poly] | None:
    """For `x + c`, `c + x` or `x - c` of integers with a whole number c: x's position
    among the operands and the signed shift. The result holds x's entries as they are."""
    if e.op not in ("add", "sub") or e.outs[0].type.dtype != "int":
        return None
    for k in (0, 1) if e.op == "add" else (0,):
        c = _whole(e.ins[1 - k])
        if e.ins[k].name is not None and c is not None:
            return k, c if e.op == "add" else -c
    return None


def _whole(o: Operand) -> Poly | None:
    """A constant operand that is a whole number (not a size: sizes may be run lengths)."""
    if o.name is None and isinstance(o.const, Poly) and o.const.is_const() and \
            o.const.const_value().denominator == 1:
        return o.const
    return None


def _zero(p: Poly | None) -> bool:
    return p is None or (p.is_const() and p.const_value() == 0)


def _same(a: Poly | None, b: Poly | None) -> bool:
    return (a if not _zero(a) else None) == (b if not _zero(b) else None)


def spec_value(x: Layout) -> Layout:
    """`x` with its integers as the spec's values (what a module takes and returns)."""
    return x if x.held is None else x.model_copy(update={"held": None})


# ---------------------------------------------------------------- the whole program


def annotate(model: ir.Model, functions: dict[str, ir.Function]
             ) -> tuple[ir.Model, dict[str, ir.Function]]:
    """The program with a layout on every value the equations make; the arguments are not
    changed."""
    funcs = {}
    for name, fn in functions.items():
        env = {v.name: of_input(v.type, model=False) for v in fn.inputs}
        env.update({p.name: of_param(p.type) for p in fn.params})
        funcs[name] = fn.model_copy(update={"eqns": _body(fn.eqns, env, functions)})
    env = {v.name: of_input(v.type, model=True) for v in model.inputs}
    env.update({p.name: of_param(p.type) for p in model.params})
    body: list[Eqn | Loop] = []
    for item in model.body:
        if isinstance(item, Loop):
            body.append(_loop(item, env, funcs))
        else:
            body.extend(_body([item], env, funcs))
    return model.model_copy(update={"body": body}), funcs


def _body(eqns: list[Eqn], env: dict[str, Layout], functions) -> list[Eqn]:
    out = []
    for e in eqns:
        ins = [of_operand(o, e, env[o.name]) if o.name is not None else CONST for o in e.ins]
        if e.op == "call":  # a module takes the spec's values
            ins = [spec_value(x) for x in ins]
        layouts = of_eqn(e, ins, functions)
        outs = [v.model_copy(update={"layout": x}) for v, x in zip(e.outs, layouts)]
        env.update((v.name, x) for v, x in zip(outs, layouts))
        out.append(e.model_copy(update={"outs": outs}))
    return out


def _loop(loop: Loop, outer: dict[str, Layout], functions) -> Loop:
    """A layer body's layouts: a carried value is laid out as it enters the first layer
    or as a layer leaves it, whichever has more axes (a parameter X^(0) gains the batch)."""
    carried = {c.inner: outer[c.init] for c in loop.carried}
    while True:
        env = {**outer, **carried}
        body = _body(loop.body, env, functions)
        grown = {c.inner: _wider(carried[c.inner], env[c.result]) for c in loop.carried}
        if grown == carried:
            break
        carried = grown
    for inner, name in loop.results:
        if inner in env:
            outer[name] = env[inner]
    for inner, name in loop.stacks:
        outer[name] = stacked(env[inner])
    return loop.model_copy(update={"body": body})


def _wider(a: Layout, b: Layout) -> Layout:
    return Layout(lead=a.lead or b.lead, fam=a.fam or b.fam, rank=a.rank,
                  held=a.held if _same(a.held, b.held) else None)
