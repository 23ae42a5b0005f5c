"""The lowering: decisions both backends share, made once on the elaborated IR.

`prepare(model, functions)` rewrites constructs into the lowered operations every backend
prints (`members`: a family member selected by the member index is one tensor with a
family axis; `lookup`: OneHot(ids) @ W as rows of W, `lookups`), and `check(model,
functions)` locates what no backend can lower, so that `fgc check` refuses it with a line
and column instead of `fgc compile` failing later. `layers` decides which equations of a
layer body every layer computes alike (hoisted); `signature.run_lengths` names the sizes
read off the inputs at run time.
`layout` puts on every value where its axes are and how its integers are held.
`masks` decides what each attention mask means (none, causal, a bias plus either) and where
a mask becomes a tensor. `rotary` says what a use of RoPE (and its variants) turns, by
which frequencies, and refuses a width no convention turns. A layer condition is read from
its syntax tree (`elaborate.elaborator.guard_tree`) by every backend. `precision` says in
which type a model compiled with `--dtype` holds and computes each real value (what stays
float32). Backends build on the prepared IR; `check` runs without torch or onnx.
"""

from ..elaborate import ir
from . import families, layout, lookups, masks
from .families import check

# every operation the lowering introduces; each backend's op table has an entry for each
LOWERED_OPS = {**families.LOWERED_OPS, **lookups.OPS, **masks.OPS}


def prepare(model: ir.Model, functions: dict[str, ir.Function]
            ) -> tuple[ir.Model, dict[str, ir.Function]]:
    """The IR every backend prints: lowered operations in place of the constructs they
    stand for, and masks by meaning (`masks`); the arguments are not changed."""
    model, functions = families.prepare(model, functions)
    model, functions = lookups.prepare(model, functions)
    model, functions = masks.prepare(model, functions)
    return layout.annotate(model, functions)


__all__ = ["LOWERED_OPS", "check", "prepare"]
