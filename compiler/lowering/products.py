"""Products of one operand by several parameters: X @ W^Q, X @ W^K, X @ W^V in an
attention, X @ W^gate and X @ W^up in a gated feed-forward net.

Each is one product by the parameters side by side, split after it: the same numbers,
one pass over X and one larger product instead of several small ones (decoding one
position at a time, a product's cost is reading its weights, and several small products
read them less efficiently than one). Which products form a group is decided here, once,
from the module's equations. The ONNX graph computes a group as one MatMul by the joined
weights and a Split; the torch module keeps one parameter per checkpoint tensor (its
state_dict is the checkpoint's layout) and computes them apart.
"""

from __future__ import annotations

from ..elaborate import ir
from ..elaborate.ir import Eqn


def groups(fn: ir.Function) -> dict[str, tuple[Eqn, ...]]:
    """Per output of a grouped product, the products of its group in the order the module
    declares their parameters (W^Q, W^K, W^V: the packed layout attention operators take):
    `matmul(X, W)` of the same operand X (a whole value, not a member) by two or more of
    the module's parameters W (whole, or the member the equation is mapped over), under
    the same layer conditions."""
    params = {p.name: k for k, p in enumerate(fn.params)}
    found: dict[tuple, list[Eqn]] = {}
    for e in fn.eqns:
        if e.op != "matmul" or len(e.ins) != 2:
            continue
        x, w = e.ins
        if x.name is None or x.member is not None or x.whole_family or \
                w.name not in params or w.whole_family:
            continue
        if w.member is not None and (e.family is None or w.member != e.family[0]):
            continue
        key = (x.name, tuple((g.text, g.positive) for g in e.guards))
        found.setdefault(key, []).append(e)
    out: dict[str, tuple[Eqn, ...]] = {}
    for members in found.values():
        if len(members) > 1 and len({e.ins[1].name for e in members}) == len(members):
            members.sort(key=lambda e: params[e.ins[1].name])
            for e in members:
                out[e.outs[0].name] = tuple(members)
    return out
