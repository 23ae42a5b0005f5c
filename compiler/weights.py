"""Importing a checkpoint: the spec's `checkpoint { ... }` block, applied to a safetensors file.

The block is data: for each spec parameter, the checkpoint tensor it comes from and the
steps that reshape it: `transpose`; `split(axis, parts, index)`; `heads(axis)`, which cuts
an axis of size A·D into the family's A members; `take(axis, index)`, one slice with the axis
dropped; `flatten(axis)`, which joins an axis and the next. Axes and indices are 1-based; `{l}` in a
name is the checkpoint's own 0-based layer number. Without a block, the file holds the
compiled module's own names. Works on numpy arrays: importing weights for the ONNX backend
must not import torch.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import ir
from . import syntax as S
from .backends.torch.codegen import family_layout, layers_attr
from .backends.torch.names import ident
from .errors import Diagnostic, FgcError, Span
from .params import Entry, as_int


@dataclass
class Imported:
    tensors: dict[str, np.ndarray]  # the compiled module's state-dict names
    ignored: list[str] = field(default_factory=list)  # buffers the spec says to skip
    extras: list[str] = field(default_factory=list)  # tensors nothing asked for
    notes: list[Diagnostic] = field(default_factory=list)


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """All tensors of a safetensors file as numpy arrays, or a clear FgcError."""
    p = Path(path)
    if p.is_dir():
        raise FgcError(f"weights file {path} is a folder", None)
    if not p.is_file():
        raise FgcError(f"weights file {path} does not exist", None)
    try:
        from safetensors.numpy import load_file
        return load_file(str(p))
    except Exception as e:  # noqa: BLE001 - any decoding failure is the file's problem
        raise FgcError(f"{path} is not a readable safetensors file ({type(e).__name__}: "
                       f"{str(e)[:200]})", None) from None


def state_key(entry: Entry, layer: int | None) -> str:
    """The compiled PyTorch module's name for one parameter tensor."""
    parts = [ident(p) for p in entry.path] + [ident(entry.name)]
    if layer is not None and not entry.shared:
        parts = [layers_attr(entry.loop), str(layer - 1)] + parts
    return ".".join(parts)


def onnx_key(entry: Entry, layer: int | None) -> str:
    """The ONNX graph's initializer name for one parameter tensor: its path, `layer3/attn/W_Q`
    (layers counted from 1, as in the spec)."""
    parts = [ident(p) for p in entry.path] + [ident(entry.name)]
    if layer is not None and not entry.shared:
        parts = [f"layer{layer}"] + parts
    return "/".join(parts)


def parameter_keys(cfg) -> list[tuple[str, str]]:
    """Every parameter tensor of a configuration as (torch state-dict name, ONNX name)."""
    return [(state_key(entry, layer), onnx_key(entry, layer))
            for entry in cfg.count.entries for layer in _layers_of(entry, cfg)]


def _layers_of(entry: Entry, cfg) -> list[int | None]:
    if not entry.in_layers or entry.shared:
        return [None]
    copies = as_int(entry.layers)
    loop = [item for item in cfg.model.body if isinstance(item, ir.Loop)][entry.loop]
    hi = as_int(loop.hi)
    if copies == hi:
        return list(range(1, hi + 1))
    from .shapes import guard_holds
    env = {k: v.const_value() for k, v in cfg.values.items() if hasattr(v, "const_value")}
    return [layer for layer in range(1, hi + 1)
            if all(guard_holds(g, {**env, loop.var: layer}) for g in entry.guards)]


def _expected(entry: Entry) -> tuple[int, ...]:
    dims = [as_int(d) for d in entry.shape]
    if entry.family is not None:
        dims = family_layout(dims, as_int(entry.family))
    return tuple(dims)


def _apply(step: S.CkptStep, x: np.ndarray, family: int | None, source: str) -> np.ndarray:
    args = step.args
    if step.name in ("transpose", "T"):
        if x.ndim < 2:
            raise FgcError(f"`{step.name}` needs a matrix; {source} has shape {list(x.shape)}",
                           step.span)
        return np.swapaxes(x, -1, -2)
    if step.name == "split":
        if len(args) != 3:
            raise FgcError("split takes (axis, parts, index), 1-based", step.span)
        axis, parts, index = args[0] - 1, args[1], args[2]
        if not (0 <= axis < x.ndim) or not (1 <= index <= parts) or x.shape[axis] % parts:
            raise FgcError(f"cannot split axis {args[0]} of {source} {list(x.shape)} into "
                           f"{parts} parts and take part {index}", step.span)
        size = x.shape[axis] // parts
        return np.take(x, range((index - 1) * size, index * size), axis=axis)
    if step.name == "heads":
        if len(args) != 1 or family is None:
            raise FgcError("heads(axis) splits one axis into the family's members and moves "
                           "them first; the target must be a family", step.span)
        axis = args[0] - 1
        if not (0 <= axis < x.ndim) or x.shape[axis] % family:
            raise FgcError(f"cannot split axis {args[0]} of {source} {list(x.shape)} into "
                           f"{family} heads", step.span)
        shape = list(x.shape)
        shape[axis: axis + 1] = [family, shape[axis] // family]
        x = x.reshape(shape)
        # stored with the family axis just before the member's last axis (family_layout)
        return np.moveaxis(x, axis, max(x.ndim - 2, 0))
    if step.name == "take":
        if len(args) != 2:
            raise FgcError("take takes (axis, index), 1-based", step.span)
        axis, index = args[0] - 1, args[1]
        if not (0 <= axis < x.ndim) or not (1 <= index <= x.shape[axis]):
            raise FgcError(f"cannot take entry {index} of axis {args[0]} of {source} "
                           f"{list(x.shape)}", step.span)
        return np.take(x, index - 1, axis=axis)
    if step.name == "flatten":
        if len(args) != 1:
            raise FgcError("flatten takes (axis), 1-based: it joins that axis and the next",
                           step.span)
        axis = args[0] - 1
        if not (0 <= axis < x.ndim - 1):
            raise FgcError(f"cannot join axes {args[0]} and {args[0] + 1} of {source} "
                           f"{list(x.shape)}", step.span)
        shape = list(x.shape)
        shape[axis: axis + 2] = [shape[axis] * shape[axis + 1]]
        return x.reshape(shape)
    raise FgcError(f"unknown step `{step.name}`", step.span,
                   "steps are transpose, split(axis, parts, index), heads(axis), "
                   "take(axis, index) and flatten(axis)")


def import_checkpoint(cfg, checkpoint: S.Checkpoint | None, path: str,
                      key=state_key) -> Imported:
    """Map a checkpoint file onto one configuration's parameters, named by `key` (the torch
    module's names, or `onnx_key`); raises FgcError naming every missing or mis-shaped
    tensor. Without a checkpoint block the file holds the torch module's own names."""
    raw = read_safetensors(path)
    out = Imported({})
    errors: list[Diagnostic] = []
    used: set[str] = set()

    prefixes = checkpoint.prefixes if checkpoint else []

    def lookup(name: str) -> str | None:
        if name in raw:
            return name
        for p in prefixes:
            if p + name in raw:
                return p + name
        return None

    rules: dict[tuple[str, bool], S.CkptMap] = {}
    if checkpoint is not None:
        for m in checkpoint.maps:
            rules[(".".join(m.path), m.per_layer)] = m

    for entry in cfg.count.entries:
        expected = _expected(entry)
        family = as_int(entry.family) if entry.family is not None else None
        spec_name = ".".join(entry.path + (entry.name,))
        for layer in _layers_of(entry, cfg):
            target = key(entry, layer)
            if checkpoint is None:
                source = state_key(entry, layer)
                steps: list[S.CkptStep] = []
                span = None
            else:
                rule = rules.get((spec_name, entry.in_layers and not entry.shared))
                if rule is None:
                    errors.append(Diagnostic(
                        "error", f"the checkpoint block says nowhere where `{spec_name}` comes "
                        "from", checkpoint.span,
                        f"add `{spec_name} = \"...\"`" + (" inside `layers { }`"
                                                           if entry.in_layers else "")))
                    break
                source = rule.source.replace("{l}", str((layer or 1) - 1))
                steps = rule.steps
                span = rule.span
            found = lookup(source)
            if found is None:
                errors.append(Diagnostic("error", f"{path} has no tensor `{source}` (for "
                                         f"`{spec_name}`{_at(layer)})", span))
                continue
            used.add(found)
            x = raw[found]
            try:
                for step in steps:
                    x = _apply(step, x, family, source)
            except FgcError as e:
                errors.extend(e.diagnostics)
                continue
            if tuple(x.shape) != expected:
                errors.append(Diagnostic(
                    "error", f"`{source}` has shape {list(raw[found].shape)}"
                    f"{' (after ' + ', '.join(s.name for s in steps) + ')' if steps else ''}"
                    f" = {list(x.shape)}, but `{spec_name}`{_at(layer)} is {list(expected)}",
                    span))
                continue
            if x.dtype.kind != "f":
                errors.append(Diagnostic("error", f"`{source}` holds {x.dtype}, not floats",
                                         span))
                continue
            out.tensors[target] = np.ascontiguousarray(x, dtype=np.float32)
    if errors:
        raise FgcError.many(errors)
    ignore = _ignore_patterns(checkpoint, cfg)
    for name in sorted(raw):
        if name in used:
            continue
        bare = next((name[len(p):] for p in prefixes if name.startswith(p)), name)
        if bare in ignore or name in ignore:
            out.ignored.append(name)
        else:
            out.extras.append(name)
    return out


def _at(layer: int | None) -> str:
    return f" in layer {layer}" if layer is not None else ""


def _ignore_patterns(checkpoint: S.Checkpoint | None, cfg) -> set[str]:
    if checkpoint is None:
        return set()
    # `{l}` runs over the longest `layers` block
    layers = max((as_int(item.hi) for item in cfg.model.body if isinstance(item, ir.Loop)),
                 default=0)
    out: set[str] = set()
    for pattern in checkpoint.ignore:
        if "{l}" in pattern:
            out.update(pattern.replace("{l}", str(k)) for k in range(layers))
        else:
            out.add(pattern)
    return out


def write_safetensors(tensors: dict[str, np.ndarray], path: Path) -> None:
    """Write atomically: a temporary file in the same folder, then a rename."""
    from safetensors.numpy import save_file
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".weights-", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp)
        from .emit import readable
        readable(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


__all__ = ["Imported", "import_checkpoint", "read_safetensors", "write_safetensors", "Span"]
