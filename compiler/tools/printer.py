"""Printing the IR: as text (the form the golden tests pin and `fgc ir` shows) or as JSON
(`fgc ir --format json`, `ir.Document`'s form; docs/architecture.md "The IR as JSON")."""

from __future__ import annotations

from pathlib import Path

from ..elaborate import ir
from ..elaborate.ir import format_type
from ..elaborate.symbolic import Poly, format_poly


def _attr(v) -> str:
    if isinstance(v, Poly):
        return format_poly(v)
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(_attr(x) for x in v) + ")"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}={_attr(x)}" for k, x in sorted(v.items())) + "}"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def format_eqn(e: ir.Eqn) -> str:
    outs = ", ".join(f"{v.name}: {format_type(v.type)}" for v in e.outs)
    if e.op == "call":
        head = f"{e.attrs['module']}"
        extra = f" as {e.attrs['instance']}"
        binds = {k: v for k, v in e.attrs.get("bindings", {}).items()}
        if binds:
            extra += " " + _attr(binds)
        if e.attrs.get("masks"):  # after the lowering: the masks this use gives by meaning
            extra += " masks " + _attr(e.attrs["masks"])
        if e.attrs.get("groups") is not None:  # after the lowering: grouped-query attention
            extra += " groups " + format_poly(e.attrs["groups"])
    else:
        head = e.op
        attrs = {k: v for k, v in e.attrs.items() if v is not None}
        extra = (" " + _attr(attrs)) if attrs else ""
    ins = ", ".join(str(o) for o in e.ins)
    line = f"{outs} = {head}({ins}){extra}"
    if e.family is not None:
        line += f"  for {e.family[0]} in 1..{format_poly(e.family[1])}"
    if e.guards:
        line += "  when " + " and ".join(str(g) for g in e.guards)
    if e.outs and e.outs[0].layout is not None:  # after the lowering (lowering/layout.py)
        line += "  " + " ".join(format_layout(v.layout) for v in e.outs)
    if e.span is not None:
        line += f"  # {Path(e.span.file).name}:{e.span.line}"
    return line


def format_layout(x: ir.Layout) -> str:
    """`@[*, fam | 2]`: the leading axes, the family axis, how many own dimensions (and
    how integers are held: `held 1` is 0-based ids)."""
    axes = (["*"] if x.lead else []) + (["fam"] if x.fam else [])
    text = f"@[{', '.join(axes)}{' | ' if axes else ''}{'...' if x.rank is None else x.rank}"
    return text + (f", held {format_poly(x.held)}]" if x.held is not None else "]")


def format_function(fn: ir.Function) -> str:
    hyp = ""
    if fn.hypers:
        hyp = "[" + ", ".join(h.name + (f" = {_attr(h.default)}" if h.default is not None else "")
                              for h in fn.hypers) + "]"
    ins = ", ".join(f"{v.name}: {format_type(v.type)}" for v in fn.inputs)
    outs = ", ".join(format_type(v.type) for v in fn.outputs)
    lines = [f"module {fn.name}{hyp}({ins}) -> {outs}"]
    for name, kind in fn.mask_inputs.items():  # after the lowering (lowering/masks.py)
        lines.append(f"  takes {name} by meaning: {kind}")
    for p in fn.params:
        lines.append(f"  param {p.name}: {format_type(p.type)}")
    for e in fn.eqns:
        lines.append("  " + format_eqn(e))
    lines.append("  return " + ", ".join(v.name for v in fn.outputs))
    return "\n".join(lines)


def format_model(m: ir.Model, functions: dict[str, ir.Function] | None = None) -> str:
    lines = []
    if functions:
        used = _used_functions(m, functions)
        for name in used:
            lines.append(format_function(functions[name]))
            lines.append("")
    lines.append(f"model {m.name}")
    for h in m.hypers:
        lines.append(f"  hyper {h.name}" + (f" = {_attr(h.default)}" if h.default is not None
                                             else ""))
    for v in m.inputs:
        lines.append(f"  input {v.name}: {format_type(v.type)}")
    for p in m.params:
        lines.append(f"  param {p.name}: {format_type(p.type)}")
    for item in m.body:
        if isinstance(item, ir.Loop):
            carried = ", ".join(c.name for c in item.carried)
            head = f"  layers {item.var} in 1..{format_poly(item.hi)}"
            if carried:
                head += f"  carries {carried}"
            if item.shared:
                head += f"  shares {', '.join(item.shared)}"
            lines.append(head)
            for e in item.body:
                lines.append("    " + format_eqn(e))
            if item.results:
                lines.append("  yields " + ", ".join(f"{outer} = {inner}"
                                                     for inner, outer in item.results))
            if item.stacks:
                lines.append("  stacks " + ", ".join(f"{outer} = {inner} for each layer"
                                                     for inner, outer in item.stacks))
        else:
            lines.append("  " + format_eqn(item))
    for v in m.outputs:
        lines.append(f"  output {v.name}: {format_type(v.type)}")
    for d in m.shared_with:
        lines.append(f"  shares {', '.join(d.names)} with {d.spec}")
    return "\n".join(lines) + "\n"


def _used_functions(m: ir.Model, functions: dict[str, ir.Function]) -> list[str]:
    order: list[str] = []

    def visit(eqns):
        for e in eqns:
            if e.op == "call":
                name = e.attrs["module"]
                if name not in order:
                    visit(functions[name].eqns)
                    order.append(name)

    for item in m.body:
        visit(item.body if isinstance(item, ir.Loop) else [item])
    return order


def format_json(m: ir.Model, functions: dict[str, ir.Function], indent: int | None = 1) -> str:
    """The model and the modules it calls as one `ir.Document` in JSON; read it back with
    `ir.Document.model_validate_json`."""
    return ir.Document.of(m, functions).model_dump_json(indent=indent) + "\n"


def json_schema() -> dict:
    """The JSON schema of `format_json`'s output (`fgc ir --format json-schema`)."""
    return ir.Document.model_json_schema()
