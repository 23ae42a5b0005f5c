"""Products of one operand by several parameters: X @ W^Q, X @ W^K, X @ W^V in an
attention, X @ W^gate and X @ W^up in a gated feed-forward net.

Which products form a group is decided here, once, from the module's equations. A group
is one product by the parameters side by side where an operator takes the products
packed: onnxruntime's GroupQueryAttention reads Q | K | V as one product gives them.
Everywhere else the products are computed apart, each by its own weights: decoding one
position at a time a product's cost is reading its weights, which is the same joined or
apart, and a joined product would have to be copied into its parts (a Split) before
anything reads them. (Measured in a decoding step of the llama-small benchmark on CPU,
gate and up apart run 1-4 % faster than one product and a Split.) Quantized weights are
the exception: onnxruntime's MatMulNBits turns its input into int8 blocks at every call,
so a group stays one product, its input quantized once (decoding 2-6 % faster than three
q, k, v products on the same CPU). The ONNX graph makes a group's one MatMul and settles,
once the graph is whole, whether a node reads it whole or it is quantized
(`Lowerer.settle_products`); the torch module keeps one parameter per checkpoint tensor
(its state_dict is the checkpoint's layout) and computes them apart.
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
