"""Which values carry a family axis: the members of a family equation computed together
along one axis (the heads of multi-head attention), or one value every member reads alike.

One rule per equation (`eqn_has_axis`), read by the incremental analysis (which keys and
values are per head), the torch backend (a value's layout) and the ONNX backend (its
roles), so that they cannot disagree about which values are per member.
"""

from __future__ import annotations

from ..elaborate import ir
from ..elaborate.ir import Eqn
from ..elaborate.symbolic import Poly


def eqn_has_axis(e: Eqn, has: list[bool], functions: dict[str, ir.Function]) -> bool:
    """Whether the results of `e` carry a family axis, given which operands do: the one
    rule the backends and the incremental analysis apply to each equation."""
    if e.op == "layers":
        return False
    if e.op == "call":
        callee = functions.get(e.attrs["module"])
        singles = callee.inputs if callee is not None else []
        # a family passed where the module takes a family is used up inside the call; one
        # passed where it takes a single value makes one result per member
        per_member = any(h for h, inp in zip(has, singles) if inp.type.family is None)
        return e.family is not None or per_member
    if e.op in ("members", "gather_members"):  # a family axis made or regrouped
        return True
    # a family read whole (`concat(h_1, ..., h_A)`) is joined into one value; inside a
    # family, a value none of whose operands varies by member is one value
    has = [h and not o.whole_family for h, o in zip(has, e.ins)]
    return any(has) if e.ins else e.family is not None


def grouped(e: Eqn, family_size) -> Poly | None:
    """For attention inside `for i in 1..A` whose keys and values are members of two
    families of one size picked by one expression in i (`k_{floor((i - 1) * G / A) + 1}`,
    grouped-query attention): that expression, else None. `family_size(name)` is the
    number of members of a value family (None for anything else). The lowering gives such
    attention its keys and values whole (`groups`), and the incremental form caches the G
    members, not A."""
    if e.family is None or len(e.ins) < 3:
        return None
    var = e.family[0]
    k, v = e.ins[1], e.ins[2]
    if not (maps(k, var) and maps(v, var)):
        return None
    size = family_size(k.name)
    if k.member != v.member or size is None or size != family_size(v.name):
        return None
    return k.member


def maps(o: ir.Operand, var: str) -> bool:
    """Whether `o` is a member of a family chosen by an expression in the member index
    `var` (`k_{floor((i - 1) * G / A) + 1}`), not `var` itself."""
    return o.name is not None and isinstance(o.member, Poly) and \
        var in o.member.symbols() and o.member != Poly.sym(var)
