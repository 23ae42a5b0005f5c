"""Rotary positions: what a use of a rotary intrinsic computes, decided once for both backends.

A use of RoPE, RoPE^partial, RoPE^interleaved, RoPE^linear, RoPE^llama3 or RoPE^yarn
(compiler/elaborate/intrinsics.py) turns the first `width` features of each row of X by
the angle (p - 1) f_k at position p: features k and k + width/2 together ("rotate half"),
or 2k - 1 and 2k (interleaved), the others unchanged, and multiplies them by `magnitude`
(YaRN's; 1 for the others). The frequencies f are `frequencies`,
computed in float32 step for step as transformers computes them (numpy's float32 power may
round the last bit the other way; the torch backend's runtime computes them with torch, as
transformers does); the module's equations in stdlib.fgpt are their meaning. Positions
count from the past's length in the incremental form, exactly where the module's own
tables would be read from (passes.incremental's `along`): torch passes `start`, the ONNX
lowering reads `Lowerer.from_past`.

`widths` refuses, at a use and per configuration, what no convention turns: a width wider
than the rows, or an odd one where features 2k - 1 and 2k turn together (where halves turn,
the equations' own size d / 2 already refuses an odd one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..elaborate import ir
from ..elaborate.intrinsics import SCALINGS, intrinsic
from ..elaborate.symbolic import Poly, real_value
from ..errors import Diagnostic


@dataclass(frozen=True)
class Rotary:
    """One use of a rotary intrinsic, its sizes numbers."""

    width: int  # how many leading features turn (even, at most the row's)
    interleaved: bool
    theta: float
    scaling: str  # a key of SCALINGS
    factors: tuple[float, ...]  # the scaling's hyperparameters, in SCALINGS' order


def rotary(fn: ir.Function, values: dict, features: int) -> Rotary:
    """The rotation a use of `fn` makes: `values` are its hyperparameters at that use
    (numbers: floats, or constant sizes), `features` the width of the rows it turns."""
    i = intrinsic(fn)
    width = features if i.rotated is None else int(_number(values[i.rotated]))
    return Rotary(width, i.interleaved, _number(values["theta"]), i.scaling,
                  tuple(_number(values[k]) for k in SCALINGS[i.scaling]))


def _number(x) -> float:
    return float(x.const_value()) if isinstance(x, Poly) else float(x)


def frequencies(r: Rotary):
    """The r.width / 2 frequencies, float32: theta^(-2k/width) for k = 0 .. width/2 - 1
    (transformers' `_compute_default_rope_parameters`), then scaled: divided by the factor
    (`linear`), Llama 3.1's smooth interpolation (`llama3`, `_compute_llama3_parameters`),
    or YaRN's blend by frequency index (`yarn`, `_compute_yarn_parameters`), step for step."""
    import numpy as np  # here: `fgc check` imports the lowering and needs no numpy

    f32 = np.float32
    inv_freq = f32(1.0) / (f32(r.theta) ** (np.arange(0, r.width, 2).astype(f32) / f32(r.width)))
    if r.scaling == "linear":
        (factor,) = r.factors
        return inv_freq / f32(factor)
    if r.scaling == "llama3":
        factor, low, high, n0 = (f32(x) for x in r.factors)
        wavelen = f32(2 * math.pi) / inv_freq
        scaled = np.where(wavelen > n0 / low, inv_freq / factor, inv_freq)
        smooth = (n0 / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < n0 / high) & ~(wavelen > n0 / low)
        return np.where(medium, smoothed, scaled).astype(f32)
    if r.scaling == "yarn":
        factor, n0, fast, slow = r.factors
        lo, hi = (_yarn_bound(turns, r.width, r.theta, n0) for turns in (fast, slow))
        lo, hi = max(math.floor(lo), 0), min(math.ceil(hi), r.width - 1)
        if lo == hi:
            hi += 0.001
        ramp = np.clip((np.arange(r.width // 2, dtype=f32) - f32(lo)) / f32(hi - lo), 0, 1)
        kept = f32(1) - ramp.astype(f32)  # the share of each frequency kept as it is
        pos = f32(r.theta) ** (np.arange(0, r.width, 2).astype(f32) / f32(r.width))
        with np.errstate(over="ignore"):  # a factor past float32's range divides to 0, as
            scaled = f32(1) / (f32(factor) * pos)  # in transformers' float32 tensors
        return (scaled * (f32(1) - kept) + (f32(1) / pos) * kept).astype(f32)
    return inv_freq


def _yarn_bound(turns: float, width: int, theta: float, n0: float) -> float:
    """The frequency index j whose wave turns `turns` times over n0 positions (float64,
    as transformers' find_correction_dim)."""
    return width * math.log(n0 / (turns * 2 * math.pi)) / (2 * math.log(theta))


def magnitude(r: Rotary) -> float:
    """What the cosines and sines are multiplied by: YaRN's 0.1 ln(factor) + 1 where the
    factor exceeds 1 (transformers' attention_factor), 1 otherwise."""
    if r.scaling != "yarn" or r.factors[0] <= 1:
        return 1.0
    return 0.1 * math.log(r.factors[0]) + 1.0


def widths(e: ir.Eqn, fn: ir.Function, inner: dict, label: str, outer: str | None
           ) -> list[Diagnostic]:
    """At one configuration, a rotary use's width: at most its rows', and even where
    features 2k - 1 and 2k turn together (`inner`:
    the callee's sizes at this use, numbers; `outer`: where the module holding this use is
    used, when it is inside one)."""
    i = intrinsic(fn)
    d = inner.get(fn.inputs[0].type.shape[-1].symbols().pop()) if fn.inputs else None
    r = d if i.rotated is None else inner.get(i.rotated)
    if not all(isinstance(x, Poly) and x.is_const() for x in (r, d)):
        return []
    r, d = r.const_value(), d.const_value()
    name = "d" if i.rotated is None else i.rotated
    what = f"the rotated width {name} = {_show(r)}"
    via = f" ({name} = {_show(r)} from the use at {outer})" if outer else ""
    if i.rotated is not None and r > d:
        return [Diagnostic("error", f"{label}: `{fn.name}`: {what} is wider than the rows it "
                           f"turns, of {_show(d)} features", e.span,
                           f"{name} must lie in 2..{_show(d)}: RoPE turns the first {name} "
                           f"features of each row, in pairs{via}")]
    # (where halves turn, the equations' own d / 2 refuses an odd width: index_maps)
    if i.interleaved and r % 2:
        return [Diagnostic("error", f"{label}: `{fn.name}`: {what} is not an even number",
                           e.span, f"features 2k - 1 and 2k turn together, so {name} must "
                           f"be even{via}")]
    return []


# what each rotary hyperparameter must be for the frequencies to be numbers: the base is
# raised to a power (and YaRN divides by its logarithm), the factor divides, Llama 3.1's
# smooth band divides by high - low, YaRN's bounds take logarithms of n0 over the turns
_POSITIVE = {"theta": "the rotary base", "factor": "the scaling factor",
             "n0": "the context first trained with", "low": "low_freq_factor",
             "beta_fast": "YaRN's beta_fast", "beta_slow": "YaRN's beta_slow"}


def values(e: ir.Eqn, fn: ir.Function, inner: dict, label: str, outer: str | None,
           reals: dict[str, float]) -> list[Diagnostic]:
    """At one configuration, a rotary use's base and scaling numbers: each positive, and
    Llama 3.1's high above low, YaRN's base other than 1 (`inner`: the callee's values at
    this use, sizes as numbers, reals as the model's hyperparameters they come from;
    `reals`: the model's real hyperparameters; `outer`: where the module holding this use
    is used)."""
    i = intrinsic(fn)
    known = {}
    for k in ("theta", *SCALINGS[i.scaling]):
        x = inner.get(k)
        if isinstance(x, Poly) and (number := real_value(x, reals)) is not None:
            known[k] = number
        elif isinstance(x, (int, float)):
            known[k] = float(x)
    via = f" (from the use at {outer})" if outer else ""
    bad = [(k, f"{_POSITIVE[k]} must be positive") for k, v in known.items()
           if k in _POSITIVE and not v > 0]
    if i.scaling == "llama3" and {"low", "high"} <= known.keys() and \
            not known["high"] > known["low"]:
        bad.append(("high", "high_freq_factor must exceed low_freq_factor = "
                            f"{known['low']:g} (the smooth band lies between them)"))
    if i.scaling == "yarn" and known.get("theta") == 1.0:
        bad.append(("theta", "YaRN's bounds divide by the logarithm of the rotary base"))
    return [Diagnostic("error", f"{label}: `{fn.name}`: {k} = {known[k]:g} makes no rotary "
                       "frequencies", e.span, why + via) for k, why in bad[:1]]


def _show(x) -> str:
    return str(int(x)) if x.denominator == 1 else str(x)
