"""The lowering: decisions both backends share, made once on the elaborated IR.

`prepare(model, functions)` rewrites constructs into the lowered operations every backend
prints (`members`: a family member selected by the member index is one tensor with a
family axis), and `check(model, functions)` locates what no backend can lower, so that
`fgc check` refuses it with a line and column instead of `fgc compile` failing later.
`guards` reads a layer condition from its syntax tree, for every backend. Backends build on
the prepared IR; `check` runs without torch or onnx.
"""

from .families import LOWERED_OPS, check, prepare

__all__ = ["LOWERED_OPS", "check", "prepare"]
