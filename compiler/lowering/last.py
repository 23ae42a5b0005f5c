"""Outputs at the last position alone (`fgc compile --last-position`), decided here once for
both backends as a rewrite of the IR.

Generation reads one row of the logits per step: the last. A prompt of T tokens computes
the head (the product by the vocabulary's matrix, most of a small model's weights) at all
T positions and returns T x V logits, of which it keeps one row. The rewrite cuts the
positions to the last one just before the head: each output's producing equation (the
head, through a `cond` between a tied and an untied head and through a final Softmax)
reads its inputs at the last position, an `index` marked `last` (X[n..n, :]), and the
outputs become one position long ([batch, 1, V]).

The cut is sound where the model is autoregressive (passes/incremental.py proves every
equation outside attention position-wise) and the head itself holds no attention: then
the last position's outputs are the full model's last row. A padded batch is left-padded
(padding comes first, as `fgc generate` pads), so its last position is a token in every
row.
"""

from __future__ import annotations

from ..elaborate import ir
from ..elaborate.intrinsics import is_kind
from ..elaborate.ir import Eqn, Loop, Operand, TensorType, Value
from ..elaborate.primitives import ELEMENTWISE
from ..elaborate.symbolic import Poly
from ..errors import FgcError
from ..passes.incremental import NotIncremental, derive

# what passes the head's result on position by position: a choice between heads (tied or
# not), element-wise arithmetic (a soft cap, a scale); a Softmax is recognised by its kind
_THROUGH = ELEMENTWISE | {"cond"}


def last_position(model: ir.Model, functions: dict[str, ir.Function]) -> ir.Model:
    """`model` with its outputs computed at the last position alone, or an FgcError saying
    why it has no such form."""
    try:
        inc = derive(model, functions)
    except NotIncremental as e:
        d = e.diagnostics[0]
        raise FgcError(f"--last-position is for autoregressive models: {d.message}", d.span,
                       d.hint) from None
    n = inc.length  # the generated positions (a decoder's, beside its encoder's source)
    body = list(model.body)
    start = max((k for k, item in enumerate(body) if isinstance(item, Loop)), default=-1) + 1
    tail: list[Eqn] = body[start:]  # type: ignore[assignment]
    made = {v.name: e for e in tail for v in e.outs}
    types, computed = _types(model)
    moved: set[int] = set()  # the heads, and what passes their results on to the outputs

    def back(name: str, output: str) -> None:
        e = made[name]
        if id(e) in moved:
            return
        moved.add(id(e))
        if e.op in _THROUGH or _softmax(e, functions):
            for o in e.ins:
                if o.name is not None and o.name in made:
                    back(o.name, output)
            return
        if e.op == "call" and _attends(e, inc):
            raise FgcError(f"--last-position: output `{output}` is computed by an attention "
                           "over the positions", e.span)

    for o in model.outputs:
        if not _positional(o.type, n) or o.name not in made:
            raise FgcError(f"--last-position: output `{o.name}` is not one value per position "
                           "computed after the layers", model.span)
        back(o.name, o.name)
    cut: dict[str, str] = {}  # value -> its last position
    out_tail: list[Eqn] = []
    for e in tail:
        if id(e) not in moved:
            out_tail.append(e)
            continue
        ins = list(e.ins)
        for k, o in enumerate(ins):
            t = types.get(o.name) if o.name is not None else None
            if t is None or not _positional(t, n) or \
                    (o.name in made and id(made[o.name]) in moved):
                continue
            if o.name not in computed or o.member is not None:
                raise FgcError(f"--last-position: the outputs read `{o.name}` along the "
                               "positions, which is not a value computed before them", e.span)
            if o.name not in cut:
                cut[o.name] = f"{o.name}/last"
                producer = made.get(o.name)
                out_tail.append(_last(o.name, cut[o.name], t, n, producer.guards
                                      if producer is not None else [], e.span))
            ins[k] = o.model_copy(update={"name": cut[o.name]})
        attrs = dict(e.attrs)
        if "bindings" in attrs:
            attrs["bindings"] = {k: _one(v, n) for k, v in attrs["bindings"].items()}
        out_tail.append(e.model_copy(update={
            "ins": ins, "attrs": attrs,
            "outs": [v.model_copy(update={"type": _at_one(v.type, n)}) for v in e.outs]}))
    outputs = [o.model_copy(update={"type": _at_one(o.type, n)}) for o in model.outputs]
    return model.model_copy(update={"body": body[:start] + out_tail, "outputs": outputs})


def _types(model: ir.Model) -> tuple[dict[str, TensorType], set[str]]:
    """Every value's type by name, and the names equations compute (the layers' results
    included), not inputs or parameters."""
    types = {v.name: v.type for v in model.inputs}
    types.update((p.name, p.type) for p in model.params)
    computed: set[str] = set()
    for item in model.body:
        for e in item.body if isinstance(item, Loop) else [item]:
            types.update((v.name, v.type) for v in e.outs)
            computed.update(v.name for v in e.outs)
        if isinstance(item, Loop):
            for inner, outer in item.results:
                if inner in types:
                    types[outer] = types[inner]
                    computed.add(outer)
    return types, computed


def _last(name: str, out: str, t: TensorType, n: str, guards: list, span) -> Eqn:
    """out = name[n..n, :]: the last position of a value along the positions, computed
    where its producer is (under its guards)."""
    kinds = ["range" if _along(d, n) else ":" for d in t.shape]
    if kinds.count("range") != 1:
        raise FgcError(f"--last-position: `{name}` runs along the positions on "
                       f"{kinds.count('range')} axes", span)
    bound = Operand(const=Poly.sym(n))
    return Eqn(outs=[Value(name=out, type=_at_one(t, n))], op="index",
               ins=[Operand(name=name), bound, bound],
               attrs={"kinds": kinds, "last": True}, guards=guards, span=span)


def _along(d, n: str) -> bool:
    return isinstance(d, Poly) and d == Poly.sym(n)


def _positional(t: TensorType, n: str) -> bool:
    return t.family is None and any(_along(d, n) for d in t.shape)


def _one(d, n: str):
    return d.subs({n: Poly.const(1)}) if isinstance(d, Poly) else d


def _at_one(t: TensorType, n: str) -> TensorType:
    return t.model_copy(update={"shape": tuple(_one(d, n) for d in t.shape)})


def _softmax(e: Eqn, functions: dict[str, ir.Function]) -> bool:
    return e.op == "call" and is_kind(functions.get(e.attrs["module"]), "softmax")


def _attends(e: Eqn, inc) -> bool:
    """Whether a call of the model's body holds one of the attentions `inc` found."""
    return any(s.loop is None and s.path and s.path[0] == e.attrs.get("instance")
               for s in inc.sites)
