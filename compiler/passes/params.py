"""Parameter counting: exact integers per preset and the closed formula, no tensors.

Counting walks the elaborated IR. Each declared parameter counts once (so a weight used
in the embedding and again in the output, like W_e, is tied and counted once); each
module use counts its module's parameters, instantiated with the use's bindings, once
per layer unless shared, and only in the layers whose conditions hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from ..elaborate import ir
from ..elaborate.elaborator import guard_holds
from ..elaborate.ir import Eqn
from ..elaborate.symbolic import Poly, format_poly


@dataclass
class Entry:
    """One parameter tensor (or indexed family) of one module instance."""

    path: tuple[str, ...]  # instance path, e.g. ("MH",) or () for the model's own
    name: str  # "W^Q"
    declared: str  # "W_i^Q"
    shape: tuple[Poly, ...]
    family: Poly | None
    per_use: Poly  # elements in one copy
    copies: Poly  # layers (or 1) times the members of any family the use sits in
    in_layers: bool
    shared: bool
    guards: list[ir.Guard] = field(default_factory=list)
    span: object = None
    layers: Poly | None = None  # the layer copies alone (copies without family members)
    loop: int = 0  # which `layers` block (0 for the first) when in_layers
    module: str = ""  # the module declaring it ("": the model)
    members_first: bool = False  # a family stored with its axis first (ir.Param's)

    def __post_init__(self) -> None:
        if self.layers is None:
            self.layers = self.copies

    @property
    def total(self) -> Poly:
        return self.per_use * self.copies


@dataclass
class Count:
    entries: list[Entry]
    tied: dict[str, list[str]]  # model parameter -> sections using it

    def total(self) -> Poly:
        out = Poly()
        for e in self.entries:
            out = out + e.total
        return out


def _numel(shape: tuple, family) -> Poly:
    out = Poly.const(1) if family is None else family
    for d in shape:
        out = out * d
    return out


def count(model: ir.Model, functions: dict[str, ir.Function], layer_env: dict | None) -> Count:
    """Count the parameters of an elaborated model.

    `layer_env` holds the numeric hyperparameters when counting a preset (guards are then
    evaluated layer by layer); None counts symbolically."""
    entries: list[Entry] = []
    for p in model.params:
        entries.append(Entry((), p.name, p.declared, tuple(p.type.shape), p.type.family,
                             _numel(p.type.shape, p.type.family), Poly.const(1), False, False,
                             span=p.span))
    outside: set[str] = set()  # instances outside the layers, across the whole model
    loops = 0
    for item in model.body:
        if isinstance(item, ir.Loop):
            first = len(entries)
            _count_block(item.body, functions, entries, item, layer_env, set())
            for entry in entries[first:]:
                entry.loop = loops
            loops += 1
        else:
            _count_block([item], functions, entries, None, layer_env, outside)
    tied = {name: sections for name, sections in model.param_uses.items() if len(sections) > 1}
    return Count(entries, tied)


def _count_block(eqns: list[Eqn], functions, entries: list[Entry], loop: ir.Loop | None,
                 layer_env: dict | None, seen: set[str]) -> None:
    for e in eqns:
        if e.op != "call":
            continue
        inst = e.attrs["instance"]
        if inst in seen:  # a label used twice is one instance
            continue
        seen.add(inst)
        shared = loop is not None and inst in loop.shared
        if loop is None and e.guards:  # a condition on sizes alone: `... if E != H else ...`
            layers = guard_factor(e.guards, layer_env)
            if layers == Poly():
                continue
        elif loop is None or shared:
            layers = Poly.const(1)
        else:
            layers = _layers_where(loop, e.guards, layer_env)
            if layers == Poly():  # used only in layers that do not exist (even l, L = 1)
                continue
        members = e.family[1] if e.family is not None else Poly.const(1)
        _instance(functions, e.attrs["module"], e.attrs["bindings"], (inst,), layers, members,
                  loop is not None, shared, e.guards, entries)


def _instance(functions, module: str, bindings: dict, path: tuple[str, ...], layers: Poly,
              members: Poly, in_layers: bool, shared: bool, guards, entries: list[Entry]) -> None:
    fn = functions[module]
    env = {k: v for k, v in bindings.items() if isinstance(v, Poly)}
    for p in fn.params:
        shape = tuple(d.subs(env) for d in p.type.shape)
        family = p.type.family.subs(env) if p.type.family is not None else None
        entries.append(Entry(path, p.name, p.declared, shape, family, _numel(shape, family),
                             layers * members, in_layers, shared, list(guards), p.span,
                             layers=layers, module=module, members_first=p.members_first))
    seen: set[str] = set()
    for e in fn.eqns:
        if e.op != "call" or e.attrs["instance"] in seen:
            continue
        seen.add(e.attrs["instance"])
        inner = {k: (v.subs(env) if isinstance(v, Poly) else v)
                 for k, v in e.attrs["bindings"].items()}
        inner_members = members
        if e.family is not None:
            inner_members = members * e.family[1].subs(env)
        _instance(functions, e.attrs["module"], inner, path + (e.attrs["instance"],),
                  layers, inner_members, in_layers, shared, guards, entries)


def guard_factor(guards: list[ir.Guard], env: dict | None) -> Poly:
    """1 or 0 for an instance outside the layers under conditions on hyperparameters; with
    the sizes symbolic, the condition as a factor that is 1 where it holds: `[E != H]`."""
    if env is not None:
        return Poly.const(int(all(guard_holds(g, env) for g in guards)))
    out = Poly.const(1)
    for g in guards:
        out = out * Poly.sym(f"[{g}]")
    return out


def _layers_where(loop: ir.Loop, guards: list[ir.Guard], layer_env: dict | None) -> Poly:
    hi = loop.hi
    if not guards:
        return hi
    parity = [f"{loop.var} is even", f"{loop.var} is odd"]
    if len(guards) == 1 and guards[0].text in parity and hi.is_const():
        n = int(hi.const_value())
        even = guards[0].text.endswith("even") == guards[0].positive
        return Poly.const(n // 2 if even else (n + 1) // 2)
    if layer_env is not None and hi.is_const():
        n = int(hi.const_value())
        hits = 0
        for layer in range(1, n + 1):
            env = dict(layer_env)
            env[loop.var] = Fraction(layer)
            if all(guard_holds(g, env) for g in guards):
                hits += 1
        return Poly.const(hits)
    if len(guards) == 1 and guards[0].text in (f"{loop.var} is even", f"{loop.var} is odd"):
        even = guards[0].text.endswith("even") == guards[0].positive
        if even:
            return Poly.apply("floor", hi / 2)
        return Poly.apply("ceil", hi / 2)
    text = " and ".join(str(g) for g in guards)
    return Poly.sym(f"#{{{loop.var} in 1..{format_poly(hi)}: {text}}}")


# ---------------------------------------------------------------- the formula


def formula(c: Count) -> str:
    """The count grouped the way a paper writes it: `V*H + n*H + L*(...)`."""
    groups: dict[Poly, Poly] = {}
    order: list[Poly] = []
    for e in c.entries:
        key = e.layers
        if key not in groups:
            groups[key] = Poly()
            order.append(key)
        groups[key] = groups[key] + e.total / key
    parts = []
    one = Poly.const(1)
    for key in sorted(order, key=lambda k: (k != one, str(k))):
        inner = groups[key]
        if key == one:
            parts.append(format_poly(inner))
        elif len(inner.terms) == 1 and next(iter(inner.terms.values())) == 1:
            parts.append(f"{_factor(key)}*{format_poly(inner)}")
        else:
            parts.append(f"{_factor(key)}*({format_poly(inner)})")
    return " + ".join(p for p in parts if p != "0") or "0"


def _factor(p: Poly) -> str:
    text = format_poly(p)
    return text if len(p.terms) == 1 and "+" not in text else f"({text})"


def per_module(c: Count) -> list[tuple[str, Poly, Poly]]:
    """(instance or parameter, elements per copy, copies), in order of first appearance."""
    rows: dict[str, list] = {}
    for e in c.entries:
        key = e.path[0] if e.path else e.name
        if key not in rows:
            rows[key] = [Poly(), e.layers]
        rows[key][0] = rows[key][0] + e.total / e.layers
    return [(k, v[0], v[1]) for k, v in rows.items()]


def as_int(p: Poly) -> int:
    v = p.const_value()
    if v.denominator != 1:
        raise ValueError(f"non-integer count {v}")
    return v.numerator


__all__ = ["Count", "Entry", "count", "formula", "per_module", "as_int"]
