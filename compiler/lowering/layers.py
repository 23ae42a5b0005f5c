"""Layers: which equations of a layer body compute the same value in every layer, decided
once for both backends.

A mask, a table of positions, a lookup of the model's ids: anything a layer computes from
values the layers do not change is computed once. The torch module computes these before
its loop over the layers and passes them in; the ONNX graph, which unrolls the layers,
computes each at the first layer that has it and reads it from there in the others.
"""

from __future__ import annotations

from ..elaborate import ir
from ..elaborate.ir import Eqn
from .families import has_params, mentions
from .masks import unread_masks


def invariant(loop: ir.Loop, functions: dict[str, ir.Function]) -> list[Eqn]:
    """The equations of `loop`'s body, in order, that do not change from layer to layer:
    they read neither the values carried from layer to layer, nor the layer index (`W_p *
    l`), nor anything computed from those, and are neither a module with parameters (each
    layer has its own) nor a choice made per layer (`cond`); a mask by meaning without a
    bias (lowering/masks.py) stays with what reads it, having nothing to compute. A layer
    condition on one (`if l is odd`) is no reason to compute it again: it is the same
    value in every layer that has it."""
    varying = {c.inner for c in loop.carried}
    out: list[Eqn] = []
    for e in loop.body:
        per_layer = e.op == "cond" or any(mentions(o, loop.var) for o in e.ins) or (
            e.op == "call" and has_params(functions[e.attrs["module"]], functions))
        if per_layer or any(o.name in varying for o in e.ins):
            varying.update(v.name for v in e.outs)
        else:
            out.append(e)
    # a mask by meaning alone computes nothing: it moves only with what reads it
    return unread_masks(out, {o.name for e in out for o in e.ins})
