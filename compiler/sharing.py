"""Parameters two specs have in common: `share W_e, ln with "other.fgpt"`.

A model may declare that some of its parameters (model parameters, and the parameters of
module uses outside the layers) are the same tensors as another spec's: ELECTRA's generator
uses the discriminator's embeddings. Each spec alone still counts its own copy, as its
released checkpoint holds one; counted together (`fgc params A B`), shared tensors count
once. Here the declarations are checked against the other spec (the same names with the
same shapes, in every configuration the two have in common) and the joint count is made.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from . import ir
from .errors import Diagnostic, FgcError
from .params import as_int
from .symbolic import Poly, format_poly


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


def check(spec, sym) -> list[Diagnostic]:
    """Every `share ... with` of a spec against the spec it names: that spec reads and
    elaborates, and in each configuration both have it holds the shared tensors with the
    same shapes. What the other file holds is never quoted: where it does not read, parse
    or elaborate, the error says where and asks for `fgc check` of it."""
    errors: list[Diagnostic] = []
    for decl in sym.model.shared_with:
        try:
            path = other_path(spec.path, decl)
        except FgcError as e:
            errors += e.diagnostics
            continue
        if os.path.realpath(path) == os.path.realpath(spec.path):
            errors.append(Diagnostic("error", f"`share ... with \"{decl.spec}\"` names this "
                                     "spec itself", decl.spec_span,
                                     "name the other spec whose tensors these are"))
            continue
        other = _load_other(path, decl, errors)
        if other is None:
            continue
        if not other.file.models:
            errors.append(Diagnostic("error", f"{decl.spec} defines no model to share with",
                                     decl.spec_span))
            continue
        configs = common_configs(spec, other)
        if not configs:
            errors.append(Diagnostic(
                "error", f"{spec.path} and {decl.spec} have no configuration in common, so "
                "the shapes of what they share cannot be compared", decl.span,
                "give both a preset of the same name"))
            continue
        for name in configs:
            label = f"preset `{name}`" if name else "the defaults"
            try:
                mine = spec.configure(name)
            except FgcError:
                continue  # reported by this spec's own checks
            try:
                theirs = other.configure(name)
            except FgcError as e:
                errors.append(Diagnostic(
                    "error", f"`{decl.spec}` does not elaborate with {label}"
                    f"{_where(e)}", decl.spec_span, f"run `fgc check {path}`"))
                continue
            found = compare(decl, mine, theirs, label, decl.spec)
            errors += found
            if found:
                break  # one configuration's mismatches say it; the others would repeat it
    return errors


def _load_other(path: Path, decl: ir.SharedWith, errors: list[Diagnostic]):
    """The other spec, or None with an error that says why without quoting it."""
    from .pipeline import load, read_source
    try:
        text = read_source(str(path))
    except FgcError as e:
        if not hasattr(e, "text"):  # it cannot be read (the reason quotes nothing of it)
            errors.append(Diagnostic(
                "error", f"`share ... with \"{decl.spec}\"`: {e.diagnostics[0].message}",
                decl.spec_span,
                "the path is relative to this spec's folder" if not path.exists() else
                f"run `fgc check {path}`"))
            return None
        text = None  # read, but not text: fall through to the parse error below
        error = e
    if text is not None:
        try:
            return load(str(path), text)
        except FgcError as e:
            error = e
    errors.append(Diagnostic("error", f"`{decl.spec}` does not parse{_where(error)}",
                             decl.spec_span, f"run `fgc check {path}`"))
    return None


def _where(e: FgcError) -> str:
    """` (other.fgpt:3:9)`: where another file's first problem is, without its text."""
    span = e.diagnostics[0].span if e.diagnostics else None
    return f" ({span})" if span is not None else ""


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


__all__ = ["check", "common_configs", "compare", "joint", "other_path", "tensors", "Joint"]
