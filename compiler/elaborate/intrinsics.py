"""Standard-library modules the backends fuse, declared once.

A module of `compiler/stdlib/stdlib.fgpt` is an intrinsic when a backend may replace its
equations by one fused operation (scaled dot-product attention, LayerNormalization, a
mask passed as `is_causal`). Its equations stay its meaning: they are what `fgc check`
elaborates, what `fgc params` counts, and what a backend lowers when it has no fused form.
A spec that defines a module of the same name replaces it, and the replacement is never an
intrinsic (`ir.Function.builtin` is false).

Every backend keys its fused forms by `Intrinsic.kind` (masks by `Intrinsic.mask`), and
`tests/test_intrinsics.py` checks that each kind has an entry in every backend's table: adding
an intrinsic is one row here plus one entry per table.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ir

# what a mask module means; its equations say the same at full length
NO_MASK = "none"  # every position sees every position (all zeros)
CAUSAL = "causal"  # position i sees j <= i
STRICT_CAUSAL = "strict_causal"  # position i sees j < i
WINDOW = "window"  # position i sees the w positions i-w+1 .. i
CAUSAL_KINDS = frozenset({CAUSAL, STRICT_CAUSAL, WINDOW})  # no position sees a later one
# masks the lowering passes by what they mean, not as a tensor (lowering/masks.py):
# attention runs them as `is_causal`, without a mask, or as a band of the keys' positions,
# and the incremental form aligns them to the cached keys
BY_MEANING = frozenset({NO_MASK, CAUSAL, WINDOW})


@dataclass(frozen=True)
class Intrinsic:
    name: str  # the standard-library module
    # attention | mask | layer_norm | rms_norm | softmax | gelu | silu | onehot | concat |
    # moe | rotary
    kind: str
    mask: str | None = None  # masks: one of NO_MASK, CAUSAL, STRICT_CAUSAL, WINDOW
    approximate: str | None = None  # gelu: tanh | none (erf)
    offset: float = 0.0  # rms_norm: the scale is offset + gamma (Gemma stores it from 1)
    params: tuple[str, ...] = ()  # the parameters the fused form reads, by name
    mask_input: str | None = None  # the input that takes a mask (attention)
    scale: float | None = None  # attention: the factor of the scores (None: 1/sqrt(d))
    softcap: str | None = None  # attention: the hyperparameter c that caps the scaled
    # scores, c tanh(s / c), before the mask is added (None: no cap)
    width: str | None = None  # window masks: the hyperparameter that is the window's width
    positionwise: bool = False  # acts on each position alone (the incremental analysis)
    chosen: str | None = None  # moe: the hyperparameter that is how many experts each
    # position goes to
    # rotary positions: the hyperparameter that is how many leading features turn (None: all
    # of them), whether features 2k-1 and 2k turn together (else k and k + d/2, "rotate
    # half"), and how the frequencies are scaled (a key of SCALINGS)
    rotated: str | None = None
    interleaved: bool = False
    scaling: str = "none"
    # parameter families the fused form reads one member at a time, each member a
    # contiguous matrix: stored with the family axis first (names.family_layout)
    members_first: tuple[str, ...] = ()


INTRINSICS: dict[str, Intrinsic] = {i.name: i for i in (
    Intrinsic("Attention", "attention", mask_input="Mask"),
    Intrinsic("Attention^unscaled", "attention", mask_input="Mask", scale=1.0),
    Intrinsic("Attention^capped", "attention", mask_input="Mask", softcap="c"),
    Intrinsic("Mask^BD", "mask", mask=NO_MASK),
    Intrinsic("Mask^AR", "mask", mask=CAUSAL),
    Intrinsic("Mask^AR_next", "mask", mask=CAUSAL),
    Intrinsic("Mask^AR_curr", "mask", mask=STRICT_CAUSAL),
    Intrinsic("Mask^ST", "mask", mask=WINDOW, width="w"),
    Intrinsic("LN", "layer_norm", params=("gamma", "beta")),
    Intrinsic("RMSNorm", "rms_norm", params=("gamma",)),
    Intrinsic("RMSNorm^gemma", "rms_norm", params=("gamma",), offset=1.0),
    Intrinsic("Softmax", "softmax"),
    Intrinsic("GELU^tanh", "gelu", approximate="tanh"),
    Intrinsic("GELU^erf", "gelu", approximate="none"),
    Intrinsic("SiLU", "silu"),
    Intrinsic("OneHot", "onehot", positionwise=True),
    Intrinsic("OneHot^mat", "onehot", positionwise=True),
    Intrinsic("Concat", "concat"),
    Intrinsic("MoE", "moe", params=("W^router", "W^gate", "W^up", "W^down"),
              positionwise=True, chosen="K", members_first=("W^gate", "W^up", "W^down")),
    Intrinsic("RoPE", "rotary"),
    Intrinsic("RoPE^partial", "rotary", rotated="r"),
    Intrinsic("RoPE^interleaved", "rotary", interleaved=True),
    Intrinsic("RoPE^linear", "rotary", scaling="linear"),
    Intrinsic("RoPE^llama3", "rotary", scaling="llama3"),
    Intrinsic("RoPE^yarn", "rotary", scaling="yarn"),
)}

# the rotary frequencies' scalings, each with the hyperparameters it reads, in the order the
# fused forms take them (compiler/lowering/rotary.py says what they compute)
SCALINGS: dict[str, tuple[str, ...]] = {
    "none": (),
    "linear": ("factor",),
    "llama3": ("factor", "low", "high", "n0"),
    "yarn": ("factor", "n0", "beta_fast", "beta_slow"),
}

KINDS = frozenset(i.kind for i in INTRINSICS.values())
MASKS = frozenset(i.mask for i in INTRINSICS.values() if i.mask is not None)


def intrinsic(fn: ir.Function | None) -> Intrinsic | None:
    """The intrinsic a module is, or None (a spec's own module, or a plain stdlib one)."""
    if fn is None or not fn.builtin:
        return None
    return INTRINSICS.get(fn.name)


def mask_kind(fn: ir.Function | None) -> str | None:
    """What a mask module means (NO_MASK, CAUSAL, ...), or None for anything else."""
    i = intrinsic(fn)
    return i.mask if i is not None else None


def is_kind(fn: ir.Function | None, kind: str) -> bool:
    i = intrinsic(fn)
    return i is not None and i.kind == kind
