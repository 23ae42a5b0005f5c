"""Masks as data: what each attention mask means, decided once for both backends.

`Mask^AR`, `Mask^BD` and `Mask^ST` (the masks `intrinsics.BY_MEANING` lists) become `mask`
operations that say what they mean — causal or not, a window of w positions — instead of
tables of zeros and -inf, and a bias added to a causal mask (`B_i + Mask^AR`) is one mask:
a causal mask plus an additive tensor. Such a value has no run-time tensor of its own: its
value is its bias (causal plus a bias), its window's width (a window), or nothing at all.
Attention runs a causal mask as `is_causal`, none at all without one, a window as a band
of the keys' positions, and the incremental form aligns each to the cached keys. Wherever
a mask value reaches anything else (arithmetic, a module whose calls pass different kinds
of mask, an output), a `mask_tensor` operation makes the tensor it stands for, there and
only there.

A module input takes a mask by meaning when its calls pass masks by meaning: one kind at
every call, or `Mask^AR` at some and `Mask^BD` at others (PER_USE: each call's `masks`
attribute says which, and that use is built for it). The decision is recorded in
`ir.Function.mask_inputs` (input -> kind), which the backends read where they print
attention. When any call passes a tensor, every call does. Kinds are strings: "none",
"causal", "causal+bias", "window", "per_use".
"""

from __future__ import annotations

from dataclasses import dataclass

from ..elaborate import intrinsics, ir
from ..elaborate.intrinsics import CAUSAL, NO_MASK, intrinsic, mask_kind
from ..elaborate.ir import Eqn, Loop, Operand, Value

OPS = {
    "mask": "an attention mask by what it means: causal (attrs.causal) or not, a window of "
            "attrs.window positions, plus the additive tensor it is given as operand, if "
            "any; attention reads it as it is",
    "mask_tensor": "the additive tensor a `mask` value stands for (0 where a query sees a "
                   "key, -inf where it does not, plus its bias), for anything but attention",
}


@dataclass(frozen=True)
class MaskKind:
    causal: bool | None  # None: causal at some uses, none at others (PER_USE)
    bias: bool  # an additive tensor besides the causal part: the value at run time
    window: bool = False  # causal within a window: the value at run time is its width

    @property
    def text(self) -> str:
        if self.causal is None:
            return "per_use"
        if self.window:
            return "window"
        return ("causal" if self.causal else "none") + ("+bias" if self.bias else "")

    @property
    def valued(self) -> bool:
        """Whether a value stands for it at run time (its bias, its window's width)."""
        return self.bias or self.window

    @staticmethod
    def of(text: str | None) -> MaskKind | None:
        if text is None:
            return None
        if text == "per_use":
            return PER_USE
        if text == "window":
            return WINDOW
        head, _, bias = text.partition("+")
        return MaskKind(head == "causal", bias == "bias")


# a module input some calls give a causal mask and others none (an attention module an
# encoder and a decoder share): each use of the module says which, as data — the call's
# `masks` attribute, a constructor flag of the torch module, the inlined ONNX call's own
PER_USE = MaskKind(None, False)
WINDOW = MaskKind(True, False, True)  # Mask^ST: position i sees i-w+1 .. i


def from_caller(given: str) -> str | None:
    """For what a call's `masks` attribute gives an input: the caller's own input it
    passes on (`=Mask`), or None for a kind."""
    return given[1:] if given.startswith("=") else None


def site_kinds(e: Eqn, resolve) -> dict[str, MaskKind]:
    """What the call `e` passes each input its module takes by meaning; `resolve(name)` is
    the kind of the caller's own input `name` at this use (for `=name`)."""
    out = {}
    for inp, given in e.attrs.get("masks", {}).items():
        name = from_caller(given)
        out[inp] = resolve(name) if name is not None else MaskKind.of(given)
    return out


def kind_of_input(fn: ir.Function, name: str) -> MaskKind | None:
    """What the lowering decided input `name` of `fn` takes: a mask by meaning, or None for
    a tensor."""
    return MaskKind.of(fn.mask_inputs.get(name))


# ---------------------------------------------------------------- the analysis


def _eqns(body):
    for item in body:
        if isinstance(item, Loop):
            yield from item.body
        else:
            yield item


def _escaping(body, outputs: list[Value]) -> set[str]:
    """Names read where a mask cannot go by meaning: outputs and values crossing the layers'
    boundary (carried in or out, stacked, the last layer's)."""
    out = {v.name for v in outputs}
    for item in body:
        if isinstance(item, Loop):
            for c in item.carried:
                out |= {c.init, c.result, c.inner}
            for a, b in item.results + item.stacks:
                out |= {a, b}
    return out


def _fold_add(e: Eqn, kinds: dict[str, MaskKind]) -> tuple[MaskKind, Operand] | None:
    """`B + M` (either order) for a mask M with no bias and a real tensor B: one mask."""
    if e.op != "add" or len(e.ins) != 2 or len(e.outs) != 1:
        return None
    a, b = e.ins
    for m, other in ((a, b), (b, a)):
        k = kinds.get(m.name) if m.name is not None else None
        if k is None or k.bias or k.window or k.causal is None or other.name is None or \
                other.name in kinds:
            continue
        if e.outs[0].type.dtype != "real" or len(e.outs[0].type.shape) < 2:
            continue
        return k, other
    return None


def mask_of_call(e: Eqn, functions: dict[str, ir.Function]) -> MaskKind | None:
    if e.op != "call" or e.ins:
        return None
    fn = functions.get(e.attrs["module"])
    meaning = NO_MASK if _zeros(fn) else mask_kind(fn)
    if meaning == CAUSAL:
        return MaskKind(True, False)
    if meaning == NO_MASK:
        return MaskKind(False, False)
    if meaning == intrinsics.WINDOW and "bindings" in e.attrs:
        return WINDOW
    return None


def _zeros(fn: ir.Function | None) -> bool:
    """A module of sizes alone that is zero everywhere (a spec's own `Mask^X[i, j] = 0`
    over m queries and n keys): no mask, whatever its name."""
    if fn is None or fn.inputs or fn.params or len(fn.outputs) != 1:
        return False
    out = next((e for e in fn.eqns if any(v.name == fn.outputs[0].name for v in e.outs)),
               None)
    return out is not None and out.op == "broadcast_to" and len(out.ins) == 1 and \
        out.ins[0].name is None and out.ins[0].const == 0 and \
        len(out.outs[0].type.shape) == 2


def analyse(model: ir.Model, functions: dict[str, ir.Function]
            ) -> tuple[dict[str, dict[str, MaskKind]], dict[str, dict[str, MaskKind]]]:
    """(value kinds per body, input kinds per function); the model's body is key "".

    A module input whose uses would need a tensor of a mask that differs from use to use
    (`PER_USE` read by arithmetic, returned, or passed where a tensor is taken) takes
    tensors instead, and the analysis runs again without it, until nothing changes."""
    demoted: set[tuple[str, str]] = set()
    while True:
        values, inputs = _analyse(model, functions, demoted)
        more = _per_use_misread(values, inputs, functions) - demoted
        if not more:
            return values, inputs
        demoted |= more


def _decide(seen: set) -> MaskKind | None:
    """What a module input takes, from what its calls pass."""
    if not seen or None in seen:
        return None
    if len(seen) == 1:
        return next(iter(seen))
    if all(not k.valued for k in seen):  # causal here, none there
        return PER_USE
    return None


def _analyse(model, functions, demoted):
    # each module after every module that calls it
    order = [n for n in reversed(ir.used_modules(model, functions)) if n in functions]
    sites: dict[str, list[dict[str, MaskKind | None]]] = {}
    values: dict[str, dict[str, MaskKind]] = {}
    inputs: dict[str, dict[str, MaskKind]] = {}

    def scan(key: str, body, outputs, given: dict[str, MaskKind]) -> None:
        kinds = dict(given)
        escaping = _escaping(body, outputs)
        for e in _eqns(body):
            k = mask_of_call(e, functions)
            if k is None:
                folded = _fold_add(e, kinds)
                if folded is not None and folded[0].causal:
                    k = MaskKind(True, True)
            if k is not None and e.outs[0].name not in escaping:
                kinds[e.outs[0].name] = k
            if e.op == "call" and e.attrs["module"] in functions:
                callee = functions[e.attrs["module"]]
                site = {inp.name: (kinds.get(o.name) if o.name is not None else None)
                        for o, inp in zip(e.ins, callee.inputs)}
                sites.setdefault(callee.name, []).append(site)
        values[key] = kinds

    scan("", model.body, model.outputs, {})
    for name in order:
        fn = functions[name]
        calls = sites.get(name, [])
        decided = {}
        for inp in fn.inputs:
            k = _decide({site[inp.name] for site in calls})
            if k is not None and (name, inp.name) not in demoted:
                decided[inp.name] = k
        if intrinsic(fn) is not None:
            # of the modules backends fuse, attention reads its mask input by meaning;
            # every other input of theirs is a tensor
            decided = {k: v for k, v in decided.items() if k == intrinsic(fn).mask_input}
        elif any(inp.name in decided for inp in fn.inputs):
            escaping = {v.name for v in fn.outputs}
            decided = {k: v for k, v in decided.items() if k not in escaping}
        inputs[name] = decided
        if intrinsic(fn) is None or intrinsic(fn).kind != "attention":
            scan(name, fn.eqns, fn.outputs, decided)  # (fused or not, the same rewrite)
    return values, inputs


def _per_use_misread(values, inputs, functions) -> set[tuple[str, str]]:
    """Module inputs taken PER_USE that something other than a call taking them by meaning
    reads: no one tensor stands for them."""
    out = set()
    for name, fn in functions.items():
        per_use = {k for k, v in inputs.get(name, {}).items() if v == PER_USE}
        if not per_use or name not in values:
            continue
        for e in fn.eqns:
            for k, o in enumerate(e.ins):
                if o.name not in per_use:
                    continue
                callee = functions.get(e.attrs.get("module", "")) if e.op == "call" else None
                taken = inputs.get(callee.name, {}) if callee is not None else {}
                if callee is None or callee.inputs[k].name not in taken:
                    out.add((name, o.name))
        out |= {(name, v.name) for v in fn.outputs if v.name in per_use}
    return out


# ---------------------------------------------------------------- the rewrite


class _Rewriter:
    def __init__(self, functions: dict[str, ir.Function], kinds: dict[str, MaskKind],
                 inputs: dict[str, dict[str, MaskKind]]):
        self.functions = functions
        self.kinds = kinds
        self.inputs = inputs
        self.count = 0
        self.types: dict[str, ir.TensorType] = {}
        self.guards: dict[str, list[ir.Guard]] = {}  # the layers a value exists on

    def tensor(self, o: Operand, at: Eqn, out: list[Eqn]) -> Operand:
        """`o` as a tensor: a mask value goes through `mask_tensor` first."""
        k = self.kinds.get(o.name) if o.name is not None else None
        if k is None:
            return o
        self.count += 1
        name = f"%mask{self.count}"
        t = self.types[o.name]
        per_member = t.family is not None or o.member is not None
        # it exists where the mask does (a mask made on some layers only, then chosen by a
        # `cond`, is made into a tensor on those layers)
        out.append(Eqn(outs=[Value(name=name, type=t)], op="mask_tensor",
                       ins=[o.model_copy()],
                       attrs={"causal": k.causal, "bias": k.bias,
                              **({"banded": True} if k.window else {})},
                       family=at.family if per_member else None,
                       guards=self.guards.get(o.name, []), span=at.span))
        return o.model_copy(update={"name": name})

    def _passed(self, o: Operand) -> str:
        """What a call passes a module input taking a mask by meaning: a kind, or `=name`
        for the caller's own input taken PER_USE (whatever this use of the caller was
        given)."""
        k = self.kinds[o.name]
        return f"={o.name}" if k == PER_USE else k.text

    def eqns(self, eqns: list[Eqn]) -> list[Eqn]:
        out: list[Eqn] = []
        for e in eqns:
            for v in e.outs:
                self.types[v.name] = v.type
                self.guards[v.name] = e.guards
            name = e.outs[0].name if e.outs else None
            k = self.kinds.get(name) if name is not None else None
            if k is not None and e.op == "call":
                attrs = {"causal": k.causal}
                if k.window:  # the width as the call binds it, in this body's sizes
                    fn = self.functions[e.attrs["module"]]
                    attrs["window"] = e.attrs["bindings"][intrinsic(fn).width]
                out.append(Eqn(outs=e.outs, op="mask", ins=[], attrs=attrs,
                               family=e.family, guards=e.guards, span=e.span))
                continue
            folded = _fold_add(e, self.kinds)
            # B + Mask^AR is one mask where it is one (k: not an output, say); B + Mask^BD is B
            if folded is not None and (k is not None or not folded[0].causal):
                out.append(Eqn(outs=e.outs, op="mask", ins=[folded[1]],
                               attrs={"causal": folded[0].causal}, family=e.family,
                               guards=e.guards, span=e.span))
                continue
            ins = e.ins
            if e.op == "call" and e.attrs["module"] in self.functions:
                callee = self.functions[e.attrs["module"]]
                taken = self.inputs.get(callee.name, {})
                ins = [o if taken.get(inp.name) is not None else self.tensor(o, e, out)
                       for o, inp in zip(e.ins, callee.inputs)]
                passed = {inp.name: self._passed(o) for o, inp in zip(e.ins, callee.inputs)
                          if inp.name in taken}
                if passed:
                    e = e.model_copy(update={"attrs": {**e.attrs, "masks": passed}})
            elif any(o.name in self.kinds for o in e.ins if o.name is not None):
                ins = [self.tensor(o, e, out) for o in e.ins]
            out.append(e if ins is e.ins else e.model_copy(update={"ins": ins}))
        return out


def _read(body, outputs: list[Value]) -> set[str]:
    names = {o.name for e in _eqns(body) for o in e.ins if o.name is not None}
    return names | _escaping(body, outputs)


def unread_masks(eqns: list[Eqn], read: set[str]) -> list[Eqn]:
    """Without the masks that were folded into another (`B + Mask^AR`) and are read no
    more."""
    return [e for e in eqns if not (e.op == "mask" and not e.ins and
                                    e.outs[0].name not in read)]


def prepare(model: ir.Model, functions: dict[str, ir.Function]
            ) -> tuple[ir.Model, dict[str, ir.Function]]:
    """The IR with `mask` / `mask_tensor` operations and `Function.mask_inputs` set."""
    values, inputs = analyse(model, functions)
    funcs = {}
    for name, fn in functions.items():
        taken = inputs.get(name, {})
        update = {"mask_inputs": {k: v.text for k, v in taken.items()}}
        if name in values and values[name]:
            r = _Rewriter(functions, values[name], inputs)
            for inp in fn.inputs:
                r.types[inp.name] = inp.type
            eqns = r.eqns(fn.eqns)
            update["eqns"] = unread_masks(eqns, _read(eqns, fn.outputs))
        funcs[name] = fn.model_copy(update=update)
    kinds = values.get("", {})
    if not kinds:
        return model, funcs
    r = _Rewriter(functions, kinds, inputs)
    for v in model.inputs:
        r.types[v.name] = v.type
    body = []
    for item in model.body:
        if isinstance(item, Loop):
            body.append(item.model_copy(update={"body": r.eqns(item.body)}))
        else:
            body.extend(r.eqns([item]))
    read = _read(body, model.outputs)
    body = [item.model_copy(update={"body": unread_masks(item.body, read)})
            if isinstance(item, Loop) else item for item in body
            if isinstance(item, Loop) or unread_masks([item], read)]
    return model.model_copy(update={"body": body}), funcs
