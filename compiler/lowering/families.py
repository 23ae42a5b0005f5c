"""Families inside equations: what a member may read, decided once for both backends.

A family equation `z_i = ... for i in 1..A` is one operation over a family axis in both
backends (the heads computed together). Its operands are whole families (member i of
`W_i`), values shared by every member, or — after `prepare` — a tensor whose axis of size
A is read one slice per member (`Bt[i, :, :]`, the `members` operation). Anything else
that depends on the member index (a slice whose bounds move with `i`, a module with
parameters called once per member) has no batched form and is refused here, located.
"""

from __future__ import annotations

from ..elaborate import ir
from ..elaborate.intrinsics import intrinsic, is_kind
from ..elaborate.ir import Eqn, Loop
from ..elaborate.symbolic import Poly, real_value
from ..errors import Diagnostic
from ..passes.families import grouped, maps
from . import rotary

# operations the lowering introduces; each backend's op table has an entry for each
LOWERED_OPS = {
    "members": "member i of the result is slice i of the operand along `axis` (0-based "
               "among its own axes): the axis becomes the family axis (attrs.keep: a "
               "unit axis stays in its place, `g[:, i .. i]`)",
    "gather_members": "member i of the result (i in the equation's family) is member "
                      "`index`(i) of the operand family: a gather along the family axis "
                      "(a member picked by an expression, `k_{(i - 1) / 2 + 1}`)",
}
# and on a call of attention inside a family, `groups` (lowering/families._grouped): its
# keys and values are whole families of G, member i reading member groups(i)


def prepare(model: ir.Model, functions: dict[str, ir.Function]
            ) -> tuple[ir.Model, dict[str, ir.Function]]:
    """The IR with lowered operations in place of the constructs they stand for; the
    arguments are not changed."""
    funcs = {}
    for name, fn in functions.items():
        types = {v.name: v.type for v in fn.inputs}
        funcs[name] = fn.model_copy(update={"eqns": _rewrite(fn.eqns, types, functions)})
    types = {v.name: v.type for v in model.inputs}
    body = [item.model_copy(update={"body": _rewrite(item.body, types, functions)})
            if isinstance(item, Loop) else _rewrite([item], types, functions)
            for item in model.body]
    body = [x for item in body for x in (item if isinstance(item, list) else [item])]
    return model.model_copy(update={"body": body}), funcs


def check(model: ir.Model, functions: dict[str, ir.Function]) -> list[Diagnostic]:
    """What no backend can lower, each with its span and a hint."""
    prepared, funcs = prepare(model, functions)
    errors: list[Diagnostic] = []
    bodies = [fn.eqns for fn in funcs.values()]
    for item in prepared.body:
        bodies.append(item.body if isinstance(item, Loop) else [item])
    for eqns in bodies:
        for e in eqns:
            errors.extend(_check_eqn(e, funcs))
    return errors


# ---------------------------------------------------------------- members


def _rewrite(eqns: list[Eqn], types: dict[str, ir.TensorType],
             functions: dict[str, ir.Function]) -> list[Eqn]:
    out: list[Eqn] = []
    for e in eqns:
        e = _members(e) or e
        e = _grouped(e, types, functions) or e
        out.extend(_gathered(e, types))
        types.update((v.name, v.type) for v in e.outs)
    return out


def _gathered(e: Eqn, types: dict[str, ir.TensorType]) -> list[Eqn]:
    """Inside `for i in 1..A`, an operand `k_{f(i)}` (a member of another family chosen
    by an expression in i) becomes member i of `gather_members(k)`, a family of A members
    made before `e`; then `e` reads its own member like any family operand."""
    if e.family is None:
        return [e]
    var, size = e.family
    made: list[Eqn] = []
    ins = []
    for o in e.ins:
        t = types.get(o.name) if maps(o, var) else None
        if t is None:
            ins.append(o)
            continue
        name = f"%{o.name}@{len(made) + 1}{e.outs[0].name}"
        out = ir.Value(name=name, type=t.model_copy(update={"family": size}))
        made.append(Eqn(outs=[out], op="gather_members",
                        ins=[ir.Operand(name=o.name, whole_family=True)],
                        attrs={"index": o.member}, family=e.family, guards=e.guards,
                        span=e.span))
        ins.append(o.model_copy(update={"name": name, "member": var}))
    if not made:
        return [e]
    return made + [e.model_copy(update={"ins": ins})]


def _grouped(e: Eqn, types: dict[str, ir.TensorType], functions: dict[str, ir.Function]
             ) -> Eqn | None:
    """Attention whose keys and values are members of two families of G picked by one
    index map (`passes.families.grouped`, grouped-query attention) takes the G keys and
    values whole and the map as `groups`: the incremental form caches G heads, and
    attention reads member groups(i) after the cache."""
    if e.op != "call" or not is_kind(functions.get(e.attrs["module"]), "attention"):
        return None
    index = grouped(e, lambda name: types[name].family if name in types else None)
    if index is None:
        return None
    ins = list(e.ins)
    ins[1] = ir.Operand(name=e.ins[1].name, whole_family=True)
    ins[2] = ir.Operand(name=e.ins[2].name, whole_family=True)
    return e.model_copy(update={"ins": ins, "attrs": {**e.attrs, "groups": index}})


def _members(e: Eqn) -> Eqn | None:
    """`index(X, i; at, :, ...)` inside `for i in 1..A`, over an axis of X of size A: the
    `members` operation on that axis."""
    if e.op != "index" or e.family is None:
        return None
    var, size = e.family
    kinds = e.attrs["kinds"]
    base, *rest = e.ins
    if base.name is None or base.member is not None or "gather" in kinds:
        return None
    picked = [k for k in kinds if k != ":"]
    if picked == ["at"] and len(rest) == 1 and _is_index(rest[0], var):
        attrs = {"axis": kinds.index("at")}
    elif picked == ["range"] and len(rest) == 2 and all(_is_index(o, var) for o in rest):
        attrs = {"axis": kinds.index("range"), "keep": True}  # `g[:, i .. i]`
    else:
        return None
    t = e.outs[0].type
    return Eqn(outs=e.outs, op="members", ins=[base], attrs=attrs,
               family=e.family, guards=e.guards, span=e.span) if t.family is None else None


def _is_index(o: ir.Operand, var: str) -> bool:
    return o.name is None and isinstance(o.const, Poly) and o.const == Poly.sym(var)


def mentions(o: ir.Operand, var: str) -> bool:
    """Whether a constant operand is an expression in `var` (`i - 1`, `l`)."""
    return o.name is None and isinstance(o.const, Poly) and var in o.const.symbols()


def picks(index: Poly, var: str, count: int, env: dict) -> list[Poly]:
    """index(i) for i = 1 .. count at one configuration (`env`: sizes as numbers): the
    member each member of a family reads through an index map."""
    return [index.subs({**env, var: Poly.const(i)}) for i in range(1, count + 1)]


def in_order(read: list[int], kv: int) -> bool:
    """Whether members 1 .. A (`read`, the 1-based members of a family of `kv` each reads)
    share the kv members in order, A / kv consecutive ones each (query head i reading key
    head (i - 1) div (A / kv) + 1): the sharing attention operators do themselves, given
    the kv heads as they are (ONNX's Attention, PyTorch's enable_gqa)."""
    heads = len(read)
    return kv > 0 and heads % kv == 0 and read == [i // (heads // kv) + 1 for i in range(heads)]


def index_maps(model: ir.Model, functions: dict[str, ir.Function], values: dict,
               label: str) -> list[Diagnostic]:
    """At one configuration (`values`: the model's sizes as numbers), through each module
    use's bindings: every member an index map reads exists (1 <= index(i) <= the family's
    size for every i of the family), grouped-query attention's A query heads split evenly
    into its G groups, every size a module's equations compute is a whole number (RoPE's
    d / 2 of an odd head), and a window mask's width lies in 1..n (Mask^ST's w: a window
    longer than the context is a setting that never reaches the model). A module's body is
    checked once over its own symbols, so this is where `k_{(i - 1) / 2 + 1}` and `d / 2`
    meet the sizes."""
    errors: list[Diagnostic] = []
    seen: set = set()

    def whole(e: Eqn, env: dict, use) -> bool:
        for v in e.outs:
            for d in (*v.type.shape, v.type.family):
                n = d.subs(env) if isinstance(d, Poly) else None
                if n is not None and n.is_const() and n.const_value().denominator != 1:
                    sizes = ", ".join(f"{k} = {x}" for k, x in sorted(env.items())
                                      if isinstance(x, Poly) and k in d.symbols())
                    errors.append(Diagnostic(
                        "error", f"{label}: the size {d} is {n.const_value()} here, not a "
                        "whole number", e.span, f"{sizes}, from the use at {_at(use)}"))
                    return True
        return False

    def window(e: Eqn, fn: ir.Function, width: str, inner: dict, env: dict) -> None:
        w, keys = inner.get(width), e.outs[0].type.shape[-1]
        keys = keys.subs(env) if isinstance(keys, Poly) else None
        if not (isinstance(w, Poly) and w.is_const() and keys is not None
                and keys.is_const()):
            return
        w, keys = w.const_value(), keys.const_value()
        if 1 <= w <= keys:
            return
        given = e.attrs["bindings"][width]
        source = "" if str(given) in (width, str(w)) else f" (from {given})"
        why = (f"longer than the context of {_number(keys)} positions" if w > keys else
               "so no position sees any key")
        errors.append(Diagnostic(
            "error", f"{label}: `{fn.name}` has a window of {width} = {_number(w)}"
            f"{source} positions, {why}", e.span,
            f"position i sees the {width} positions i-{width}+1 .. i, so {width} must lie "
            f"in 1..{_number(keys)}; a window as long as the context is causal attention"))

    def kept(e: Eqn, types: dict, env: dict, use) -> None:
        """keeptopk keeps 1 to all of the entries of its last axis (K of E experts); the
        error stands at the module's use, the spec's line."""
        k, axis = e.attrs["k"].subs(env), types[e.ins[0].name].shape[-1]
        axis = axis.subs(env) if isinstance(axis, Poly) else None
        if not (k.is_const() and axis is not None and axis.is_const()):
            return
        if k.const_value().denominator == 1 and 1 <= k.const_value() <= axis.const_value():
            return
        sizes = ", ".join(f"{s} = {env[s]}" for s in sorted(e.attrs["k"].symbols() & env.keys()))
        errors.append(Diagnostic(
            "error", f"{label}: keeptopk keeps {_number(k.const_value())} of "
            f"{_number(axis.const_value())} entries", use or e.span,
            (f"{sizes}; " if sizes else "") + "it keeps a whole number from 1 to the length "
            f"of its last axis (K of the E experts), at {_at(e.span)}"))

    def constant(o: ir.Operand, env: dict) -> float | None:
        """A constant operand's number at this configuration, or None (not a constant, or
        not known here). `env`: the names in scope, each a Poly in the model's sizes and
        reals, or a number."""
        c = o.const if o.name is None else None
        if isinstance(c, Poly):
            numbers = {**reals, **{k: float(v) for k, v in env.items()
                                   if isinstance(v, (int, float))}}
            return real_value(c.subs({k: v for k, v in env.items() if isinstance(v, Poly)}),
                              numbers)
        return float(c) if isinstance(c, (int, float)) else None

    def undefined(e: Eqn, types: dict, env: dict, use) -> None:
        """A division by a constant that is 0 at this configuration (a real hyperparameter
        such as a rotary factor, or sizes), or a constant negative base raised to real
        powers (a rotary base below 0): every value it makes would be infinite or NaN, in
        both backends."""
        if e.op == "div" and len(e.ins) == 2 and constant(e.ins[1], env) == 0:
            what, o = f"a division by {e.ins[1]} = 0", e.ins[1]
        elif e.op == "pow" and len(e.ins) == 2 and (base := constant(e.ins[0], env)) is not None \
                and base < 0 and e.ins[1].name is not None \
                and types.get(e.ins[1].name, e.outs[0].type).dtype == "real":
            what, o = f"{e.ins[0]} = {base:g}, negative, raised to real powers", e.ins[0]
        else:
            return
        named = sorted(o.const.symbols()) if isinstance(o.const, Poly) else []
        where = f"the use at {_at(use)}" if use is not None else "the model"
        errors.append(Diagnostic(
            "error", f"{label}: {what}", use or e.span,
            f"every value it makes would be infinite or not a number; at {_at(e.span)}, "
            f"from {where}" + (f" ({', '.join(f'`{n}`' for n in named)})" if named else "")))

    def visit(eqns: list[Eqn], types: dict, env: dict, use) -> None:
        broken = False
        for e in eqns:
            types.update((v.name, v.type) for v in e.outs)
            if use is not None and not broken:
                broken = whole(e, env, use)
            if e.op == "keeptopk":
                kept(e, types, env, use)
            if e.op in ("div", "pow"):
                undefined(e, types, env, use)
            if e.op == "call" and e.attrs["module"] in functions:
                fn = functions[e.attrs["module"]]
                inner = {k: _at_use(v, env) for k, v in e.attrs.get("bindings", {}).items()}
                width = intrinsic(fn).width if intrinsic(fn) is not None else None
                if width is not None:
                    window(e, fn, width, inner, env)
                key = (fn.name, tuple(sorted((k, str(v)) for k, v in inner.items())))
                if is_kind(fn, "rotary") and (bad := rotary.widths(
                        e, fn, inner, label, _at(use) if use is not None else None)
                        + rotary.values(e, fn, inner, label,
                                        _at(use) if use is not None else None, reals)):
                    errors.extend(bad)  # what its equations would say, less plainly
                    seen.add(key)
                if key not in seen:
                    seen.add(key)
                    # (the hyperparameters the use leaves at their defaults, so that none
                    # is taken for a model's hyperparameter of the same name)
                    scope = {**{h.name: h.default for h in fn.hypers
                                if h.default is not None}, **inner}
                    visit(fn.eqns, {v.name: v.type for v in fn.inputs}, scope,
                          use if use is not None else e.span)
            if e.family is None:
                continue
            var, count = e.family
            count = count.subs(env)
            group = grouped(e, lambda name: types[name].family if name in types else None)
            size = types[e.ins[1].name].family.subs(env) if group is not None else None
            if size is not None and size.is_const() and count.is_const() and \
                    count.const_value() % size.const_value():
                errors.append(Diagnostic(
                    "error", f"{label}: {count} query heads do not split evenly into "
                    f"{size} key/value groups", e.span,
                    "the number of key/value heads must divide the number of query heads"))
            for o in e.ins:
                t = types.get(o.name) if maps(o, var) else None
                if t is None or not count.is_const() or not t.family.subs(env).is_const():
                    continue
                size = t.family.subs(env).const_value()
                for i, k in enumerate(picks(o.member, var, int(count.const_value()), env), 1):
                    if not k.is_const() or not 1 <= k.const_value() <= size:
                        errors.append(Diagnostic(
                            "error", f"{label}: `{o.name}_{{...}}`: member {i} reads member "
                            f"{k} of a family of {size}", e.span,
                            f"the index must lie in 1..{size} for every {var} in "
                            f"1..{count}"))
                        break

    env = {k: v for k, v in values.items() if isinstance(v, Poly)}
    reals = {k: v for k, v in values.items() if isinstance(v, float)}
    types = {v.name: v.type for v in model.inputs}
    for item in model.body:
        visit(item.body if isinstance(item, Loop) else [item], types, env, None)
    return errors


def _at_use(v, env: dict):
    """A binding in the scope of its use: a Poly with `env`'s Polys put in, a number where
    every name left in it is a number there (a module's real hyperparameter passed on)."""
    if not isinstance(v, Poly):
        return v
    v = v.subs(env)
    if not v.symbols():
        return v  # a size
    number = real_value(v, {k: x for k, x in env.items() if isinstance(x, (int, float))})
    return v if number is None else number


def _number(x) -> str:
    return f"{int(x):,}" if getattr(x, "denominator", 1) == 1 else str(x)


def _at(span) -> str:
    return f"{span.file}:{span.line}:{span.column}" if span is not None else "the model"


# ---------------------------------------------------------------- what cannot be lowered


def _check_eqn(e: Eqn, functions: dict[str, ir.Function]) -> list[Diagnostic]:
    if e.family is None:
        return []
    var, _ = e.family
    if e.op == "index" and any(mentions(o, var) for o in e.ins[1:]):
        return [Diagnostic(
            "error", f"the slice depends on the member index `{var}`: the members of a family "
            "are computed together, so each must read the same slice or its own member",
            e.span, f"read member `{var}` of a family (`W_{var}`), or select along an axis "
            f"by `{var}` itself (`X[{var}, :, :]`); a slice that moves with `{var}` has no "
            "batched form yet")]
    if e.op == "call":
        fn = functions[e.attrs["module"]]
        if has_params(fn, functions):
            return [Diagnostic(
                "error", f"`{fn.name}` has parameters but is called once per member of "
                f"`{var}`", e.span,
                "give the module the whole family (an input declared with `for`), or make "
                "its parameters a family")]
    return []


def has_params(fn: ir.Function, functions: dict[str, ir.Function]) -> bool:
    """Whether a module has parameters, its own or those of a module it calls."""
    return bool(fn.params) or any(has_params(functions[e.attrs["module"]], functions)
                                  for e in fn.eqns if e.op == "call")
