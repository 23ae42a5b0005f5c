"""Lazy float32 tensors: a shape now, the values when written.

A `Lazy` knows its shape without its data and computes the data only when materialized
(`np.asarray(t)`, `np.ascontiguousarray(t)`): a checkpoint tensor read from its file and put
through the checkpoint block's steps (compiler/weights.py), a random initialisation, or an
array derived from other lazy tensors (`reshape`, `transpose`, `Lazy.derived`). Nothing is
kept after a materialization, so a writer that materializes one tensor, writes it and drops
it holds one tensor at a time, whatever the model's size; a tensor used twice is computed
twice. The ONNX graph (`backends/onnx/graph.py`, whose `Joined` is lazy in the same way)
and `weights.write_safetensors` take these wherever they take numpy arrays; `converted`
gives any of them another floating dtype (`--dtype`) the same way, when written.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


class Lazy:
    """A tensor of a known shape and floating dtype (float32 unless said) whose values
    `make()` computes when asked."""

    def __init__(self, shape: tuple[int, ...], make: Callable[[], np.ndarray],
                 dtype=np.float32):
        self.shape = tuple(int(d) for d in shape)
        self._make = make
        self.dtype = np.dtype(dtype)

    @classmethod
    def derived(cls, shape: tuple[int, ...], fn: Callable[..., np.ndarray],
                *parts) -> Lazy:
        """`fn` of the parts' values (each materialized when this one is)."""
        return cls(shape, lambda: fn(*(np.asarray(p) for p in parts)))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"Lazy({list(self.shape)}, {self.dtype})"

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        x = np.ascontiguousarray(self._make(), dtype=self.dtype)
        # a step whose shape rule and data disagree would write bytes the header misdescribes
        assert x.shape == self.shape, f"computed {list(x.shape)} for a {self!r}"
        return x if dtype is None else x.astype(dtype, copy=False)

    def reshape(self, *shape) -> Lazy:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        if -1 in shape:
            known = math.prod(d for d in shape if d != -1)
            shape = tuple(self.size // known if d == -1 else d for d in shape)
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape {self!r} to {list(shape)}")
        return Lazy(shape, lambda: np.asarray(self).reshape(shape), self.dtype)

    def transpose(self, *axes) -> Lazy:
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        axes = axes or tuple(reversed(range(self.ndim)))
        return Lazy(tuple(self.shape[a] for a in axes),
                    lambda: np.asarray(self).transpose(axes), self.dtype)


def stacked(parts: list, axis: int) -> Lazy:
    """np.stack(parts, axis), lazily, filled part by part: one part beside the result."""
    shape = (*parts[0].shape[:axis], len(parts), *parts[0].shape[axis:])

    def make() -> np.ndarray:
        out = np.empty(shape, np.float32)
        for k, part in enumerate(parts):
            out[(slice(None),) * axis + (k,)] = np.asarray(part)
        return out
    return Lazy(shape, make)


def converted(source, dtype) -> Lazy:
    """A tensor (numpy, Lazy or Joined) in another floating dtype, converted when
    materialized: a weight written in float16 is computed, converted and dropped, so no
    converted copy of every weight is held beside the float32 ones."""
    return Lazy(source.shape, lambda: np.asarray(source), dtype)


def float_dtype(name: str) -> np.dtype:
    """numpy's dtype of a precision's name (float32, float16, bfloat16: ml_dtypes', which
    onnx depends on too)."""
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
