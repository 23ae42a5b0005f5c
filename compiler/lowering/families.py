"""Families inside equations: what a member may read, decided once for both backends.

A family equation `z_i = ... for i in 1..A` is one operation over a family axis in both
backends (the heads computed together). Its operands are whole families (member i of
`W_i`), values shared by every member, or — after `prepare` — a tensor whose axis of size
A is read one slice per member (`Bt[i, :, :]`, the `members` operation). Anything else
that depends on the member index (a slice whose bounds move with `i`, a module with
parameters called once per member) has no batched form and is refused here, located.
"""

from __future__ import annotations

from ..elaborate import ir
from ..elaborate.ir import Eqn, Loop
from ..elaborate.symbolic import Poly
from ..errors import Diagnostic

# operations the lowering introduces; each backend's op table has an entry for each
LOWERED_OPS = {
    "members": "member i of the result is slice i of the operand along `axis` (0-based "
               "among its own axes): the axis becomes the family axis",
}


def prepare(model: ir.Model, functions: dict[str, ir.Function]
            ) -> tuple[ir.Model, dict[str, ir.Function]]:
    """The IR with lowered operations in place of the constructs they stand for; the
    arguments are not changed."""
    funcs = {name: fn.model_copy(update={"eqns": _rewrite(fn.eqns)})
             for name, fn in functions.items()}
    body = [item.model_copy(update={"body": _rewrite(item.body)}) if isinstance(item, Loop)
            else _members(item) or item for item in model.body]
    return model.model_copy(update={"body": body}), funcs


def check(model: ir.Model, functions: dict[str, ir.Function]) -> list[Diagnostic]:
    """What no backend can lower, each with its span and a hint."""
    prepared, funcs = prepare(model, functions)
    errors: list[Diagnostic] = []
    bodies = [fn.eqns for fn in funcs.values()]
    for item in prepared.body:
        bodies.append(item.body if isinstance(item, Loop) else [item])
    for eqns in bodies:
        for e in eqns:
            errors.extend(_check_eqn(e, funcs))
    return errors


# ---------------------------------------------------------------- members


def _rewrite(eqns: list[Eqn]) -> list[Eqn]:
    return [_members(e) or e for e in eqns]


def _members(e: Eqn) -> Eqn | None:
    """`index(X, i; at, :, ...)` inside `for i in 1..A`, over an axis of X of size A: the
    `members` operation on that axis."""
    if e.op != "index" or e.family is None:
        return None
    var, size = e.family
    kinds = e.attrs["kinds"]
    base, *rest = e.ins
    if base.name is None or base.member is not None or "gather" in kinds or \
            "range" in kinds or len(rest) != 1 or kinds.count("at") != 1:
        return None
    if not _is_index(rest[0], var):
        return None
    axis = kinds.index("at")
    t = e.outs[0].type
    return Eqn(outs=e.outs, op="members", ins=[base], attrs={"axis": axis},
               family=e.family, guards=e.guards, span=e.span) if t.family is None else None


def _is_index(o: ir.Operand, var: str) -> bool:
    return o.name is None and isinstance(o.const, Poly) and o.const == Poly.sym(var)


def mentions(o: ir.Operand, var: str) -> bool:
    """Whether a constant operand is an expression in `var` (`i - 1`, `l`)."""
    return o.name is None and isinstance(o.const, Poly) and var in o.const.symbols()


# ---------------------------------------------------------------- what cannot be lowered


def _check_eqn(e: Eqn, functions: dict[str, ir.Function]) -> list[Diagnostic]:
    if e.family is None:
        return []
    var, _ = e.family
    if e.op == "index" and any(mentions(o, var) for o in e.ins[1:]):
        return [Diagnostic(
            "error", f"the slice depends on the member index `{var}`: the members of a family "
            "are computed together, so each must read the same slice or its own member",
            e.span, f"read member `{var}` of a family (`W_{var}`), or select along an axis "
            f"by `{var}` itself (`X[{var}, :, :]`); a slice that moves with `{var}` has no "
            "batched form yet")]
    if e.op == "call":
        fn = functions[e.attrs["module"]]
        if has_params(fn, functions):
            return [Diagnostic(
                "error", f"`{fn.name}` has parameters but is called once per member of "
                f"`{var}`", e.span,
                "give the module the whole family (an input declared with `for`), or make "
                "its parameters a family")]
    return []


def has_params(fn: ir.Function, functions: dict[str, ir.Function]) -> bool:
    """Whether a module has parameters, its own or those of a module it calls."""
    return bool(fn.params) or any(has_params(functions[e.attrs["module"]], functions)
                                  for e in fn.eqns if e.op == "call")
