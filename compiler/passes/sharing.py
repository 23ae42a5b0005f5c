"""Parameters two specs have in common: `share W_e, ln with "other.fgpt"`.

A model may declare that some of its parameters (model parameters, and the parameters of
module uses outside the layers) are the same tensors as another spec's: ELECTRA's generator
uses the discriminator's embeddings. Each spec alone still counts its own copy, as its
released checkpoint holds one; counted together (`fgc params A B`), shared tensors count
once. Here a declaration is compared with the other spec (the same names with the same
shapes, in every configuration the two have in common) and the joint count is made; reading
the other spec is the pipeline's (pipeline.py loads it and calls `compare`), so this pass
never imports the pipeline.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..elaborate import ir
from ..elaborate.symbolic import Poly, format_poly
from ..errors import Diagnostic, FgcError
from .params import as_int


def tensors(cfg, names: list[str]) -> dict[str, dict[str, tuple[tuple[int, ...], Poly]]]:
    """The tensors each shared name stands for in one configuration:
    {name: {path: (shape, elements)}}; a name absent here (a use under a condition on sizes
    that does not hold) has none."""
    out: dict[str, dict] = {}
    for name in names:
        found = {}
        for e in cfg.count.entries:
            if e.in_layers or not ((e.path == () and e.name == name) or e.path[:1] == (name,)):
                continue
            shape = tuple(d.const_value() if d.is_const() else d for d in e.shape)
            if e.family is not None:
                shape = (e.family.const_value() if e.family.is_const() else e.family,) + shape
            found[".".join(e.path + (e.name,))] = (shape, e.total)
        out[name] = found
    return out


def _shape(shape: tuple) -> str:
    return "R[" + ", ".join(format_poly(d) if isinstance(d, Poly) else f"{int(d)}"
                            for d in shape) + "]"


def other_path(spec_path: str, decl: ir.SharedWith) -> Path:
    """The file a declaration names, relative to the declaring file's folder; FgcError,
    located at the name, when that is not a file in the folder or below it (an absolute
    path, `..` out of it, or a link that leads out): a spec names its partners, not any
    file on the machine."""
    named = decl.spec
    where = "the other spec is named relative to this spec's folder, in it or below it"
    if not named or "\0" in named:
        raise FgcError(f"`share ... with \"{named}\"` names no file", decl.spec_span, where)
    if Path(named).is_absolute():
        raise FgcError(f"`share ... with \"{named}\"`: an absolute path is not allowed",
                       decl.spec_span, where)
    folder = Path(spec_path).parent
    path = folder / named
    # realpath, not Path.resolve: a loop of links stays as it is (reading it says why)
    if not Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder)):
        link = Path(os.path.normpath(path)).is_relative_to(os.path.normpath(folder)) and \
            ".." not in Path(os.path.normpath(path)).parts
        raise FgcError(f"`share ... with \"{named}\"` leads out of this spec's folder"
                       + (" through a symbolic link" if link else ""), decl.spec_span, where)
    return path


def compare(decl: ir.SharedWith, cfg_a, cfg_b, label: str, other: str) -> list[Diagnostic]:
    """Errors where the other spec lacks a shared name or holds it with another shape."""
    errors = []
    mismatched: list[tuple] = []
    ta, tb = tensors(cfg_a, decl.names), tensors(cfg_b, decl.names)
    for name in decl.names:
        if not ta[name]:
            continue
        if not tb[name]:
            errors.append(Diagnostic(
                "error", f"`{name}` is shared with {other}, which has no parameter or module "
                f"use named `{name}` outside its layers ({label})", decl.span,
                "shared parameters have the same names in both specs"))
            continue
        for path in sorted(ta[name].keys() | tb[name].keys()):
            a, b = ta[name].get(path), tb[name].get(path)
            if a is None or b is None:
                where = "here" if a is not None else f"in {other}"
                errors.append(Diagnostic(
                    "error", f"`{path}` exists only {where}, but `{name}` is shared with "
                    f"{other} ({label})", decl.span,
                    "shared module uses hold the same parameters in both specs"))
            elif a[0] != b[0]:
                mismatched.append((path, a[0], b[0]))
    if mismatched:  # one message: the first tensor, and which others differ too
        path, a, b = mismatched[0]
        more = [m[0] for m in mismatched[1:]]
        errors.append(Diagnostic(
            "error", f"`{path}` is {_shape(a)} here but {_shape(b)} in {other} ({label})"
            + (f"; {', '.join(more)} differ too" if more else ""), decl.span,
            "a tensor shared by two specs has one shape"))
    return errors


def common_configs(a, b) -> list[str | None]:
    """The configurations both specs have: presets of the same name, and the defaults when
    both give every hyperparameter a value (None)."""
    out: list[str | None] = []
    if a.default_preset() is None and b.default_preset() is None and \
            _complete(a) and _complete(b):
        out.append(None)
    out += [p for p in a.presets() if p in b.presets()]
    return out


def _complete(spec) -> bool:
    free, _ = spec._classify(spec.model)
    return all(h.default is not None for h in free.values())


@dataclass
class Joint:
    """Several specs counted together, shared tensors once."""

    total: int
    groups: list[dict] = field(default_factory=list)  # one per tensor held by several
    formula: str = ""
    errors: list[Diagnostic] = field(default_factory=list)


def joint(items: list[tuple]) -> Joint:
    """`items`: (spec, numeric config, symbolic config) for each file counted together.
    Declarations naming a spec that is not among them are left out."""
    paths = [os.path.realpath(spec.path) for spec, _, _ in items]
    parent: dict[tuple[int, str], tuple[int, str]] = {}

    def find(x):
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    size: dict[tuple[int, str], tuple] = {}  # (file, path) -> (shape, elements, symbolic)
    errors: list[Diagnostic] = []
    for i, (spec, cfg, sym) in enumerate(items):
        for decl in cfg.model.shared_with:
            try:
                target = os.path.realpath(other_path(spec.path, decl))
            except FgcError as e:
                errors += e.diagnostics
                continue
            if target not in paths:
                continue
            j = paths.index(target)
            label = f"preset `{cfg.name}`" if cfg.name != "defaults" else "the defaults"
            found = compare(decl, cfg, items[j][1], label, decl.spec)
            errors += found
            if found:
                continue
            ta, tb = tensors(cfg, decl.names), tensors(items[j][1], decl.names)
            ts = tensors(sym, decl.names)
            for name in decl.names:
                for path, (shape, total) in ta[name].items():
                    symbolic = ts[name].get(path, (None, total))[1]
                    size[(i, path)] = (shape, as_int(total), symbolic)
                    size[(j, path)] = (shape, as_int(tb[name][path][1]), symbolic)
                    parent[find((i, path))] = find((j, path))
    members: dict[tuple[int, str], list[tuple[int, str]]] = {}
    for x in size:
        members.setdefault(find(x), []).append(x)
    total = sum(cfg.total for _, cfg, _ in items)
    groups, saved = [], Poly()
    for group in members.values():
        group.sort()
        shape, elements, symbolic = size[group[0]]
        total -= (len(group) - 1) * elements
        saved = saved + (len(group) - 1) * symbolic
        groups.append({"tensor": group[0][1], "shape": _shape(shape), "elements": elements,
                       "in": [str(items[k][0].path) for k, _ in group]})
    formula = " + ".join(f"N({cfg.model.name})" for _, cfg, _ in items)
    if saved != Poly():
        formula += f" - ({format_poly(saved)})" if len(saved.terms) > 1 else \
            f" - {format_poly(saved)}"
    return Joint(total, groups, formula, errors)


__all__ = ["common_configs", "compare", "joint", "other_path", "tensors", "Joint"]
