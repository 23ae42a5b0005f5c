"""Long sequences through a model with recurrent state, one segment at a time.

A spec whose output `Mem'` is the next value of its input `Mem` (Transformer-XL's memory)
compiles to a model that takes the state and returns the next one. `run_segments` cuts the
sequence inputs into segments of at most the model's length, starts from an empty state
(no rows on its run-length axes: nothing seen yet), and feeds each call's returned state
to the next call:

    from runtime import load, run_segments
    model = load("out/txl-onnx", provider="cpu")
    outputs, state = run_segments(model, {"x": ids})      # ids: int64 [batch, any length]
    outputs["probs"]                                      # [batch, length, V]

It drives an ONNX session (`runtime.Model`) with numpy arrays, or the PyTorch module fgc
emitted (its `signature()` describes it) with torch tensors; torch is imported only then.
"""

from __future__ import annotations

from .session import Model, RuntimeError_
from .signature import Signature, SignatureError, of


def read_signature(model) -> Signature | None:
    """The signature of a runtime.Model or of a PyTorch module fgc emitted (runtime/
    signature.py reads both), None for anything else; RuntimeError_ if it is malformed."""
    try:
        return of(model)
    except SignatureError as e:
        raise RuntimeError_(f"the model's signature: {e}") from None


def run_segments(model, inputs: dict, segment: int | None = None,
                 state: dict | None = None, signature=None) -> tuple[dict, dict]:
    """Run `inputs` (every input that is not state, full length on axis 1) `segment` tokens
    at a time (default: the most the model takes), starting from `state` (default: empty).
    Returns the outputs, each segment's concatenated along axis 1 where that axis is the
    segment's (the last segment's value otherwise), and the state after the last segment.
    `signature`: the model's, when the caller has read it already (one call per token)."""
    sig = signature if signature is not None else read_signature(model)
    if sig is None:
        raise RuntimeError_("run_segments takes a runtime.Model (ONNX) or a PyTorch module "
                            "fgc compiled from a spec with a state output (`Mem'`)")
    if isinstance(model, Model):
        call, lib = model.run, _Numpy()
    else:
        lib = _Torch(model)

        def call(feeds: dict) -> dict:
            values = model(*(feeds[i["name"]] for i in sig.inputs))
            values = values if isinstance(values, tuple) else (values,)
            return dict(zip((o["name"] for o in sig.outputs), values))
    targets = set(sig.state.values())
    if not targets:
        raise RuntimeError_("the model has no state output: no output is named after an "
                            "input with a prime (`Mem'` for `Mem`)")
    specs = {i["name"]: i for i in sig.inputs}
    sequence = [name for name in specs if name not in targets]
    missing = [name for name in sequence if name not in inputs]
    if missing:
        raise RuntimeError_(f"missing input {', '.join(missing)}")
    axes = {specs[name]["dims"][1] if len(specs[name]["dims"]) > 1 else None
            for name in sequence}
    if len(axes) != 1 or not isinstance(next(iter(axes)), str):
        raise RuntimeError_("run_segments cuts inputs that share one sequence axis (axis 1); "
                            f"this model's are {sorted(map(str, axes))}")
    axis = next(iter(axes))
    segment = segment or sig.max_length.get(axis)
    total = int(inputs[sequence[0]].shape[1])
    batch = int(inputs[sequence[0]].shape[0])
    if not segment or segment < 1:
        raise RuntimeError_(f"segment length {segment!r}: give a positive number")
    if state is None:  # nothing seen yet: no rows on the run-length axes
        state = {name: lib.zeros([batch if d == "batch" else 0 if isinstance(d, str) else d
                                  for d in specs[name]["dims"]]) for name in targets}
    pieces: dict[str, list] = {}
    last: dict = {}
    for start in range(0, total, segment):
        feeds = {name: inputs[name][:, start:start + segment] for name in sequence}
        feeds.update(state)
        out = call(feeds)
        state = {target: out[name] for name, target in sig.state.items()}
        for name, value in out.items():
            if name not in sig.state:
                pieces.setdefault(name, []).append(value)
                last[name] = value
    outputs = {}
    dims = {o["name"]: o["dims"] for o in sig.outputs}
    if sig.logits is not None:  # the logits are along the positions of what they give
        dims[sig.logits["name"]] = sig.logits.get("dims") or dims.get(sig.logits["of"], [])
    for name, values in pieces.items():
        along = dims.get(name, [])
        outputs[name] = lib.cat(values) if len(along) > 1 and along[1] == axis else last[name]
    return outputs, state


class _Numpy:
    def zeros(self, dims):
        import numpy as np
        return np.zeros(dims, np.float32)

    def cat(self, values):
        import numpy as np
        return np.concatenate(values, axis=1)


class _Torch:
    def __init__(self, model):
        first = next(model.parameters(), None)
        self.like = {"dtype": first.dtype, "device": first.device} if first is not None else {}

    def zeros(self, dims):
        import torch
        return torch.zeros(dims, **self.like)

    def cat(self, values):
        import torch
        return torch.cat(values, dim=1)
