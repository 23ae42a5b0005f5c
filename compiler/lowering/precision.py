"""The precision of a compiled model's real values (`--dtype`), decided once for both backends.

    float32   the default: weights, inputs, outputs and every computation in float32
    float16   weights, real inputs and outputs (the logits, the key/value cache), constants
              and computations in float16, except what accumulates in float32 (below)
    bfloat16  the same in bfloat16; the PyTorch backend only (onnxruntime's CPU provider has
              no bfloat16 kernels and its Python API no bfloat16 arrays: see `precision`)

What stays in float32 in a half-precision model, in both backends:
- a normalisation's statistics (mean, variance, mean square): ONNX's LayerNormalization
  and RMSNormalization with `stash_type` 1, onnxruntime's fused norms and torch's
  `layer_norm` / `rms_norm` (which accumulate half inputs in float32);
- a softmax: the ONNX graph casts its input to float32 and its result back (`Softmax` and
  the equations of attention); torch's `softmax` accumulates half inputs in float32.
  ONNX's Attention op states it (`softmax_precision` 1), which onnxruntime's CPU kernel
  computes the same with or without;
- rotary positions: the angles (position × frequency), their cosines and sines in float32,
  then the tables in the model's precision (torch's `rotary_tables` does the same); where
  the ONNX graph lowers a RoPE module's own equations (below opset 23), the whole module
  runs in float32, its operand cast to float32 and its result back (`in_float32`);
- tables computed from sizes alone (sinusoid positions, relative-position buckets, RoPE's
  angles): torch's emitted modules compute them in its default dtype and cast the result
  (`.to(dtype)`), the ONNX graph computes them in float32 and casts (`in_float32`). Masks,
  exact in any precision (0 and -inf), are made in the model's.

A constant of the spec outside the precision's range (XLNet's mask value -1e30 in float16,
whose largest is 65504) would become infinite, and a row it masks wholly NaN where float32
gives a uniform one: `check_range` refuses it at its line. Integers (ids, positions, sizes)
and booleans keep their types. This module imports neither torch, onnx nor numpy: the
backends map the names to their own types.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..elaborate import ir
from ..elaborate.intrinsics import intrinsic
from ..errors import FgcError
from .families import has_params


@dataclass(frozen=True)
class Precision:
    name: str  # float32 | float16 | bfloat16, as numpy, torch and ml_dtypes spell them
    onnx: int  # its onnx.TensorProto element type
    itemsize: int  # bytes per value
    largest: float  # its largest finite value

    @property
    def half(self) -> bool:
        """Whether softmax and norms need float32 made explicit around them."""
        return self.name != "float32"

    @property
    def torch(self) -> str:
        """The torch dtype, as model.py spells it."""
        return f"torch.{self.name}"


FLOAT32 = Precision("float32", 1, 4, 3.4028234663852886e38)
PRECISIONS = {p.name: p for p in (FLOAT32, Precision("float16", 10, 2, 65504.0),
                                  Precision("bfloat16", 16, 2, 3.3895313892515355e38))}


def precision(name: str | None, target: str) -> Precision:
    """The precision `--dtype name` asks of `target` (torch, onnx); FgcError for a name
    fgc does not know or a pair it does not compile."""
    if name is None:
        return FLOAT32
    if name not in PRECISIONS:
        raise FgcError(f"unknown --dtype `{name}` (choose {', '.join(PRECISIONS)})", None)
    if target == "onnx" and name == "bfloat16":
        # measured with onnxruntime 1.31: its CPU provider has no bfloat16 MatMul, Add,
        # Softmax, ..., and its Python API neither takes nor returns bfloat16 arrays, so
        # fgc's runtime could run no such graph
        raise FgcError("--dtype bfloat16 is for --target torch; onnxruntime's CPU provider "
                       "has no bfloat16 kernels (MatMul, Add, Softmax, ...) and its Python "
                       "API takes no bfloat16 arrays", None,
                       "compile the ONNX graph with --dtype float16, or bfloat16 with "
                       "--target torch")
    return PRECISIONS[name]


def in_float32(fn: ir.Function, functions: dict[str, ir.Function]) -> bool:
    """Whether a half-precision model computes a use of module `fn`, lowered from its
    equations, in float32 (its real operands cast to float32, its real results back): a
    table from sizes alone (no inputs, no parameters, a real result; not a mask), or
    RoPE's equations (an angle rounded to float16 is off by radians past a few hundred
    positions)."""
    i = intrinsic(fn)
    if i is not None and i.kind == "rotary":
        return True
    return not fn.inputs and (i is None or i.kind != "mask") and \
        not has_params(fn, functions) and any(o.type.dtype == "real" for o in fn.outputs)


def check_range(p: Precision, model: ir.Model, functions: dict[str, ir.Function]) -> None:
    """FgcError at the first constant of the spec that `p` cannot hold (one in a table
    computed in float32 too: the table is given in `p`)."""
    if not p.half:
        return
    seen: set[str] = set()

    def walk(eqns) -> None:
        for e in eqns:
            for o in e.ins:
                c = o.const
                if o.name is None and isinstance(c, float) and math.isfinite(c) and \
                        abs(c) > p.largest:
                    wider = "float32 or bfloat16" if p.name == "float16" else "float32"
                    raise FgcError(f"the constant {c:g} does not fit {p.name} (largest "
                                   f"{p.largest:g}): it would be {'-' if c < 0 else ''}inf",
                                   e.span, f"compile in {wider}, or write a value within "
                                   f"{p.name}'s range")
            if e.op == "call" and e.attrs["module"] not in seen:
                seen.add(e.attrs["module"])
                walk(functions[e.attrs["module"]].eqns)
    walk(e for item in model.body for e in (item.body if isinstance(item, ir.Loop)
                                            else [item]))
