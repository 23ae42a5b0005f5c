"""Lookups: `OneHot(ids) @ W`, rows of a table picked by integer ids, decided once for both
backends.

A one-hot of integer ids (a call of the standard library's OneHot over lo..hi) times a
matrix the whole batch shares — a parameter, a fixed member of a parameter family
(`W_2^g`), or a value computed from such alone (`W_e * 2`, a table of positions) — is the
`lookup` operation: row `ids[k] - lo + 1` of the table for each k (the token embedding;
ids of any rank, as `OneHot^mat` of a matrix of ids, give one row per entry).
The ids' offset `lo` (ids are 1-based in the spec) is carried in its attrs, so no backend
reads it off the OneHot call; neither builds the V-wide one-hot. The rewrite sees through
bodies: a OneHot computed before the layers and multiplied inside them is a lookup there.

The OneHot equation goes when nothing else reads its result; where something does (`O`
in `O @ W_e + sum(O)`), it stays as it is, and the product still reads the ids. A product
whose table varies along the batch or by member (`OneHot(x) @ W_i` inside `for i`, a
module's input, a carried value) is left as it is: both backends lower the equations.
"""

from __future__ import annotations

from ..elaborate import ir
from ..elaborate.intrinsics import is_kind
from ..elaborate.ir import Eqn, Loop, Operand

OPS = {
    "lookup": "row k of the result is row ids[k] - lo + 1 of the table (ins: the ids, the "
              "table; attrs.lo: the id of its first row): OneHot(ids) @ table for a OneHot "
              "over lo..hi, without the one-hot",
}


def prepare(model: ir.Model, functions: dict[str, ir.Function]
            ) -> tuple[ir.Model, dict[str, ir.Function]]:
    """The IR with `lookup` in place of each product of a one-hot and a table; the arguments
    are not changed."""
    funcs = {}
    for name, fn in functions.items():
        state = _State({p.name: p for p in fn.params}, functions)
        eqns = state.rewrite(fn.eqns)
        used = _used([eqns]) | {o.name for o in fn.outputs}
        funcs[name] = fn.model_copy(update={"eqns": state.drop(eqns, used)}) \
            if state.rewritten else fn
    state = _State({p.name: p for p in model.params}, functions)
    body: list[Eqn | Loop] = []
    for item in model.body:
        if isinstance(item, Loop):
            inner = state.copy()
            for c in item.carried:  # X^(l-1) changes from layer to layer
                inner.define(c.inner)
            body.append(item.model_copy(update={"body": inner.rewrite(item.body)}))
            state.rewritten.update(inner.rewritten)
            state.consumed.update(inner.consumed)
            for _, outer in item.results + item.stacks:
                state.define(outer)
        else:
            body.extend(state.rewrite([item]))
    if not state.rewritten:
        return model, funcs
    used = _used([item.body if isinstance(item, Loop) else [item] for item in body])
    used |= {o.name for o in model.outputs}
    for item in body:
        if isinstance(item, Loop):
            used |= {c.init for c in item.carried} | {c.result for c in item.carried}
            used |= {i for i, _ in item.results + item.stacks}
    body = [item.model_copy(update={"body": state.drop(item.body, used)})
            if isinstance(item, Loop) else item for item in body]
    body = [item for item in body if isinstance(item, Loop) or state.keep(item, used)]
    return model.model_copy(update={"body": body}), funcs


class _State:
    """What is known where the equations are now: the latest definition of each name (its
    generation), which values are tables the whole batch shares, and which are one-hots."""

    def __init__(self, params: dict[str, ir.Param], functions: dict[str, ir.Function]):
        self.params = params
        self.functions = functions
        self.generation: dict[str, int] = {}
        self.tables: dict[str, ir.TensorType] = {}  # value -> its type
        self.onehot: dict[str, tuple[Eqn, int | None]] = {}  # value -> (OneHot call,
        # generation of its ids)
        self.rewritten: set[int] = set()  # ids of the lookups made
        self.consumed: set[int] = set()  # ids of OneHot calls a lookup reads through

    def copy(self) -> _State:
        out = _State(self.params, self.functions)
        out.generation = dict(self.generation)
        out.tables = dict(self.tables)
        out.onehot = dict(self.onehot)
        return out

    def define(self, name: str) -> None:
        self.generation[name] = self.generation.get(name, 0) + 1
        self.tables.pop(name, None)
        self.onehot.pop(name, None)

    def rewrite(self, eqns: list[Eqn]) -> list[Eqn]:
        out = []
        for e in eqns:
            new = self._lookup(e) or e
            table = self._is_table(new)
            for v in new.outs:
                self.define(v.name)
                if table:
                    self.tables[v.name] = v.type
            if _is_onehot(new, self.functions) and new.ins:
                ids = new.ins[0]
                self.onehot[new.outs[0].name] = (new, self.generation.get(ids.name)
                                                 if ids.name is not None else None)
            out.append(new)
        return out

    def _table(self, o: Operand) -> ir.TensorType | None:
        """The type of an operand that is one matrix for the whole batch, or None."""
        if o.name is None or o.whole_family or isinstance(o.member, str):
            return None
        if o.name in self.params and o.name not in self.generation:
            t = self.params[o.name].type
            if (t.family is None) != (o.member is None):
                return None
            return t.member() if t.family is not None else t
        t = self.tables.get(o.name)
        return t if t is not None and t.family is None and o.member is None else None

    def _is_table(self, e: Eqn) -> bool:
        """Whether what `e` computes is the same for every sequence of the batch and is not
        a family: it reads only tables (or constants)."""
        if e.op in ("layers", "cond") or any(v.type.family is not None for v in e.outs):
            return False
        if e.family is not None:
            return False
        return all(o.name is None or self._table(o) is not None for o in e.ins)

    def _lookup(self, e: Eqn) -> Eqn | None:
        if e.op != "matmul" or len(e.ins) != 2:
            return None
        x, w = e.ins
        if x.name is None or x.member is not None or x.whole_family or x.name not in self.onehot:
            return None
        onehot, generation = self.onehot[x.name]
        ids = onehot.ins[0]
        if ids.name is not None and self.generation.get(ids.name) != generation:
            return None  # the ids' name was defined again since
        if isinstance(ids.member, str) and onehot.family != e.family:
            return None
        lo = onehot.attrs.get("bindings", {}).get("a")
        table = self._table(w)
        out = e.outs[0].type
        if lo is None or table is None or table.dtype != "real" or len(table.shape) != 2 or \
                len(out.shape) < 2 or out.family is not None:
            return None
        self.consumed.add(id(onehot))
        new = Eqn(outs=e.outs, op="lookup", ins=[ids, w], attrs={"lo": lo}, family=e.family,
                  guards=e.guards, span=e.span)
        self.rewritten.add(id(new))
        return new

    def keep(self, e: Eqn, used: set[str]) -> bool:
        """Whether `e` stays: anything but a OneHot a lookup reads through whose result
        nothing else reads."""
        return id(e) not in self.consumed or any(v.name in used for v in e.outs)

    def drop(self, eqns: list[Eqn], used: set[str]) -> list[Eqn]:
        return [e for e in eqns if self.keep(e, used)]


def _is_onehot(e: Eqn, functions: dict[str, ir.Function]) -> bool:
    return e.op == "call" and is_kind(functions.get(e.attrs["module"]), "onehot")


def _used(bodies: list[list[Eqn]]) -> set[str]:
    return {o.name for eqns in bodies for e in eqns for o in e.ins if o.name is not None}
