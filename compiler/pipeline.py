"""The front half as one call: read, parse, elaborate (symbolically and per preset), count.

`load(path)` gives a `Spec`; `spec.check()` runs every check `fgc check` runs;
`spec.configure(preset, sets)` gives one concrete configuration with its exact count.
Nothing here imports torch or onnx.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from . import lowering
from .elaborate import ir
from .elaborate.elaborator import (
    Conditions,
    Elaborator,
    Hypers,
    ModelElaborator,
    Statics,
    _cond_text,
    _eval_condition,
    _names_in,
    _show_expr,
    _Undecided,
)
from .elaborate.symbolic import Poly, format_int, format_poly, human
from .errors import Diagnostic, FgcError, Sources, Span
from .lowering.families import index_maps
from .passes import padding
from .passes.params import Count, as_int, count, formula
from .passes.sharing import common_configs, compare, other_path
from .syntax import nodes as S
from .syntax.nodes import parse_number
from .syntax.parse import parse_text

STDLIB = Path(__file__).parent / "stdlib" / "stdlib.fgpt"
MAX_FILE_BYTES = 512 * 1024  # the largest shipped spec is a few KiB
MAX_LINE = 10_000  # characters; longer lines are generated or corrupt, not written


@functools.lru_cache(maxsize=1)
def _stdlib() -> tuple[str, S.File]:
    text = STDLIB.read_text(encoding="utf-8")
    return text, parse_text(text, "stdlib.fgpt")


def read_source(path: str) -> str:
    """Read a spec as UTF-8, or fail with a located diagnostic. Only a regular file is read
    (a FIFO or a device is refused without waiting on it), and never more than
    MAX_FILE_BYTES of it."""
    from runtime.files import FileError, read_regular
    try:
        data = read_regular(path, MAX_FILE_BYTES)
    except FileError as e:
        if e.errno == 21:  # a folder
            raise FgcError(f"{path} is a directory", None) from None
        if e.errno == 27:  # too big
            try:
                size = f"{os.stat(path).st_size:,} bytes"
            except OSError:
                size = f"larger than {MAX_FILE_BYTES:,} bytes"
            raise FgcError(f"{path} is {size}; specs are limited to {MAX_FILE_BYTES:,}",
                           Span(path, 1, 1)) from None
        raise FgcError(f"{path}: {e.strerror}", None) from None
    except OSError as e:
        raise FgcError(f"cannot read {path}: {e.strerror or e}", None) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        before = data[: e.start]
        line = before.count(b"\n") + 1
        col = len(before[before.rfind(b"\n") + 1:].decode("utf-8", errors="replace")) + 1
        err = FgcError(f"invalid UTF-8 byte 0x{data[e.start]:02x}", Span(path, line, col),
                       "specs are UTF-8 text")
        err.text = data.decode("utf-8", errors="replace")  # type: ignore[attr-defined]
        raise err from None


@dataclass
class Config:
    """One concrete configuration of a model: its hyperparameters, IR and count."""

    name: str  # preset name, "defaults" or "symbolic"
    values: dict[str, Poly | float]
    model: ir.Model
    count: Count
    warnings: list[Diagnostic] = field(default_factory=list)

    @property
    def total(self) -> int:
        return as_int(self.count.total())


SUBSTITUTE = True  # presets checked by substitution where they can be (tests compare)


@dataclass
class Spec:
    path: str
    sources: Sources
    file: S.File
    modules: dict[str, S.Module]
    # generic module IR from clean elaborations, shared by the numeric ones
    _functions: dict[str, ir.Function] = field(default_factory=dict, repr=False)
    # configurations already elaborated, by their hyperparameter values (see `configure`)
    _configured: dict[tuple, tuple] = field(default_factory=dict, repr=False)

    @property
    def model(self) -> S.Model:
        return self.file.models[0]

    # ------------------------------------------------------------ hyperparameters
    def _classify(self, m: S.Model):
        """(free, derived): hyperparameters with a number or nothing as their default, and
        those defined from others, each by name."""
        if m is self.model and getattr(self, "_classes", None) is not None:
            return self._classes  # asked once per preset
        free: dict[str, S.HyperDecl] = {}
        derived: dict[str, S.HyperDecl] = {}
        seen: set[str] = set()
        for h in m.hypers:
            if h.name in seen:
                raise FgcError(f"hyperparameter `{h.name}` is declared twice", h.span)
            seen.add(h.name)
            if h.default is None or _is_literal(h.default):
                free[h.name] = h
            else:
                derived[h.name] = h
        if m is self.model:
            self._classes = free, derived
        return free, derived

    def _derived_order(self) -> list[tuple[str, S.HyperDecl, list[str]]]:
        """The derived hyperparameters, each after those it uses, with the derived ones it
        uses: (name, declaration, uses)."""
        if getattr(self, "_derivation", None) is None:
            _, derived = self._classify(self.model)
            deps = {name: [n for n in dict.fromkeys(_names_in(h.default)) if n in derived]
                    for name, h in derived.items()}
            self._derivation = [(name, derived[name], deps[name])
                                for name in _dependency_order(deps)]
        return self._derivation

    def symbolic_hypers(self, m: S.Model) -> Hypers:
        free, derived = self._classify(m)
        values: dict[str, Poly | float] = {}
        reals: set[str] = set()
        for name, h in free.items():
            lit = _literal(h.default) if h.default is not None else None
            values[name] = Poly.sym(name)
            if isinstance(lit, float):
                reals.add(name)  # a real number like eps: a symbol, but never a size
        defs: dict[str, Poly] = {}
        for name in derived:
            values[name] = Poly.sym(name)
        statics = Statics(values, self.path)
        for name, h in derived.items():
            v = statics.eval(h.default)
            if isinstance(v, Poly):
                if name in v.symbols():
                    raise FgcError(f"hyperparameter `{name}` is defined in terms of itself",
                                   h.span)
                defs[name] = v
            else:
                values[name] = v
        _check_acyclic(defs, derived)
        return Hypers(values=values, derived=defs, reals=reals)

    def numeric_hypers(self, m: S.Model, preset: S.Preset | None,
                       sets: dict[str, Fraction | float],
                       label: str) -> tuple[Hypers, list[Diagnostic]]:
        free, derived = self._classify(m)
        warnings: list[Diagnostic] = []
        given: dict[str, Poly | float] = {}
        spans: dict[str, Span] = {}
        for name, h in free.items():
            if h.default is not None:
                given[name] = _literal(h.default)
        if preset is not None:
            statics = Statics(given, self.path)
            for name, expr, span in preset.assigns:
                if name not in free and name not in derived:
                    raise FgcError(f"preset `{preset.name}` sets `{name}`, which is not a "
                                   "hyperparameter", span,
                                   _suggest_names(name, list(free) + list(derived)))
                if name in spans:
                    raise FgcError(f"preset `{preset.name}` sets `{name}` twice", span)
                given[name] = statics.eval(expr)
                spans[name] = span
        for name, value in sets.items():
            if isinstance(value, (int, Fraction)) and not isinstance(value, bool):
                given[name] = Poly.const(value)
            elif isinstance(value, float):
                given[name] = value
            else:
                raise FgcError(f"{name} = {value!r} is not a number", None)
        values: dict[str, Poly | float] = dict(given)
        # derived values, in dependency order, each evaluated once (trying them all until
        # none progresses took cubic time on a long chain); an explicit value wins but is
        # compared
        statics = Statics(values, self.path)
        pending: dict[str, S.HyperDecl] = {}
        for name, h, uses in self._derived_order():
            if any(d in pending and d not in values for d in uses):
                pending[name] = h  # waits on a value that has none
                continue
            try:
                v = statics.eval(h.default)
            except FgcError:
                pending[name] = h
                continue
            if isinstance(v, Poly) and not v.is_const():
                pending[name] = h
                continue
            if name in given:
                if _differs(given[name], v):
                    warnings.append(Diagnostic(
                        "warning",
                        f"{label} sets {name} = {_show(given[name])}, but {name} = "
                        f"{_show_expr(h.default)} gives {_show(v)}",
                        spans.get(name, h.span),
                        "the explicit value is used"))
            else:
                values[name] = v
        for h in pending.values():
            if all(n in values for n in _names(h.default)):
                statics.eval(h.default)  # raises the real reason
        missing = [h for h in m.hypers if h.name not in values]
        if missing:
            where = preset.span if preset is not None else m.span
            names = ", ".join(h.name for h in missing[:10]) + (
                f" and {len(missing) - 10:,} more" if len(missing) > 10 else "")
            raise FgcError(f"{label} leaves {names} without a value", where,
                           "set it in the preset, give it a default, or pass --set "
                           f"{missing[0].name}=...")
        for name, v in values.items():
            if isinstance(v, Poly):
                c = v.const_value()
                if abs(c) > 2**62:
                    raise FgcError(f"{name} = {c} is absurdly large",
                                   spans.get(name) or _decl_span(m, name))
        return Hypers(values=values, numeric=True, preset=label), warnings

    # ------------------------------------------------------------ elaboration
    def elaborate(self, hypers: Hypers) -> tuple[ir.Model, Elaborator]:
        top = Elaborator(self.modules, self.path)
        if hypers.numeric:
            # Module bodies are elaborated generically, whatever the sizes, so one clean
            # elaboration serves every configuration; re-doing it per preset made a file of
            # 9,000 presets take a minute. The symbolic pass always starts afresh: its
            # warnings (lint inside modules) are collected there.
            top.functions.update(self._functions)
        model = ModelElaborator(top, self.model, hypers).run()
        if top.diagnostics:
            raise FgcError.many(_dedupe(top.diagnostics))
        self._functions.update((k, f) for k, f in top.functions.items() if "\0" not in k)
        return model, top

    def check_modules(self) -> list[Diagnostic]:
        """Check every module the file itself defines, used or not."""
        top = Elaborator(self.modules, self.path)
        diags: list[Diagnostic] = []
        for mod in self.file.modules:
            try:
                top.function(mod.name, mod.span)
            except FgcError as e:
                diags.extend(e.diagnostics)
            top.diagnostics = []
        return _dedupe(diags)

    def symbolic(self) -> Config:
        if getattr(self, "_symbolic", None) is None:
            self._symbolic = self._symbolic_config()
        return self._symbolic

    def size_symbols(self) -> set[str]:
        """Hyperparameters that size something: they must be positive whole numbers."""
        if getattr(self, "_sizes", None) is None:
            self._sizes = self._size_symbols()
        return self._sizes

    def _size_symbols(self) -> set[str]:
        """The hyperparameters in a dimension, a family's size or a loop's bound, and those
        bound to a module's hyperparameter (its sizes); of the latter, the real-valued ones
        (a rotary base, an epsilon) are numbers, not sizes, but a real-valued one in a
        dimension is a size that is not a whole number, which _check_sizes reports."""
        cfg = self.symbolic()
        out: set[str] = set()
        bound: set[str] = set()

        def dims(t) -> None:
            for d in list(t.shape) + [t.family, t.lo if not t.perm else None]:
                if isinstance(d, Poly):
                    out.update(d.symbols())

        for v in cfg.model.inputs:
            dims(v.type)
        for p in cfg.model.params:
            dims(p.type)
        for item in cfg.model.body:
            if isinstance(item, ir.Loop):
                out.update(item.hi.symbols())
            for e in (item.body if isinstance(item, ir.Loop) else [item]):
                for v in e.outs:
                    dims(v.type)
                for b in e.attrs.get("bindings", {}).values():
                    if isinstance(b, Poly):
                        bound.update(b.symbols())
                if e.family is not None:
                    out.update(e.family[1].symbols())
        for entry in cfg.count.entries:
            for d in entry.shape:
                out.update(d.symbols())
        reals = cfg.hypers.reals  # type: ignore[attr-defined]
        return (out | (bound - reals)) & {h.name for h in self.model.hypers}

    def _check_sizes(self, hypers: Hypers, preset: S.Preset | None, label: str) -> None:
        """Every hyperparameter that sizes something is a positive whole number."""
        if getattr(self, "_sized", None) is None:  # in the order of declaration
            self._sized = [h for h in self.model.hypers if h.name in self.size_symbols()]
        spans = {name: span for name, _, span in preset.assigns} if preset else {}
        diags = []
        bad: set[str] = set()
        for h in self._sized:
            name = h.name
            v = hypers.values.get(name)
            if bad and h.default is not None and not _is_literal(h.default) \
                    and name not in spans and _names(h.default) & bad:
                continue  # follows from a value already reported
            if isinstance(v, Poly) and v.const_value() > 0 and v.const_value().denominator == 1:
                continue
            bad.add(name)
            span = spans.get(name) or h.span
            if isinstance(v, float):
                diags.append(Diagnostic("error", f"{name} = {v} sizes a tensor but is not a "
                                        f"whole number ({label})", span))
                continue
            c = v.const_value()
            if c.denominator != 1 and (h.default is None or _is_literal(h.default)
                                       or name in spans):
                diags.append(Diagnostic("error", f"{name} = {_decimal(c)} sizes a tensor but "
                                        f"is not a whole number ({label})", span))
            elif c.denominator != 1:
                hint = None
                if h.default is not None and isinstance(h.default, S.BinOp) and h.default.op == "/":
                    hint = (f"{_show_expr(h.default.right)} must divide "
                            f"{_show_expr(h.default.left)}")
                given = ", ".join(f"{k} = {_show(hypers.values[k])}" for k in sorted(
                    Statics({}, "").eval(h.default, {k: Poly.sym(k) for k in hypers.values})
                    .symbols()) if k in hypers.values) if h.default is not None else ""
                diags.append(Diagnostic(
                    "error", f"{name} = {_show_expr(h.default) if h.default else name} = "
                    f"{c.numerator}/{c.denominator} is not a whole number with {given} "
                    f"({label})", span, hint))
            elif c <= 0:
                diags.append(Diagnostic("error", f"{name} = {c} sizes a tensor but is not "
                                        f"positive ({label})", span))
        if not diags:
            diags = self._check_conditions(hypers, label)
        if diags:
            raise FgcError.many(diags)

    def _check_conditions(self, hypers: Hypers, label: str) -> list[Diagnostic]:
        """The model's `expect` conditions on sizes, each at this configuration's values."""
        out = []
        for c in self.model.conditions:
            try:
                holds = _eval_condition(c.cond, hypers.values, None)
            except _Undecided:
                holds = False
            if holds:
                continue
            names = sorted(_names(c.cond) & hypers.values.keys())
            given = ", ".join(f"{k} = {_show(hypers.values[k])}" for k in names)
            out.append(Diagnostic("error", f"`{_cond_text(c.cond)}` does not hold ({label})",
                                  c.span, f"here {given}" if given else None))
        return out

    def _symbolic_config(self) -> Config:
        hypers = self.symbolic_hypers(self.model)
        hypers.conditions = Conditions(frozenset(hypers.values))
        model, top = self.elaborate(hypers)
        c = count(model, top.functions, None)
        lint = list(top.warnings)
        model.hypers = [ir.Hyper(name=h.name, span=h.span,
                                 default=hypers.derived.get(h.name), text=_show_expr(h.default)
                                 if h.default is not None else "") for h in self.model.hypers]
        cfg = Config("symbolic", hypers.values, model, c, lint)
        cfg.hypers = hypers  # type: ignore[attr-defined]
        cfg.functions = top.functions  # type: ignore[attr-defined]
        return cfg

    def presets(self) -> list[str]:
        return [p.name for p in self.model.presets]

    def configure(self, preset: str | None = None,
                  sets: dict[str, Fraction | float] | None = None,
                  label: str | None = None) -> Config:
        """Elaborate and count one configuration; raises FgcError on any problem. `label`
        names the configuration in messages (default: the preset and the --set values)."""
        hypers, warnings = self._checked_values(preset, sets, label)
        model, functions, c = self._elaborate_numeric(hypers)
        errors = index_maps(model, functions, hypers.values, label or _label(preset, sets))
        if errors:
            raise FgcError.many(errors)
        cfg = Config(preset or "defaults", hypers.values, model, c, warnings)
        cfg.functions = functions  # type: ignore[attr-defined]
        return cfg

    def _checked_values(self, preset: str | None, sets: dict[str, Fraction | float] | None,
                        label: str | None = None) -> tuple[Hypers, list[Diagnostic]]:
        """A configuration's hyperparameter values, each size checked, and its warnings."""
        p = None
        if preset is not None:
            p = self._presets_by_name().get(preset)
            if p is None:
                raise LookupError(preset)
        label = label or _label(preset, sets)
        hypers, warnings = self.numeric_hypers(self.model, p, sets or {}, label)
        self._check_sizes(hypers, p, label)
        return hypers, warnings

    def _elaborate_numeric(self, hypers: Hypers) -> tuple[ir.Model, dict, Count]:
        """The IR, the module functions and the count of checked numeric values."""
        # Presets with the same values elaborate to the same IR; only a clean result is
        # kept, as an error's message names the configuration it came from.
        key = _values_key(hypers.values)
        if key is not None and key in self._configured:
            model, functions, c = self._configured[key]
        else:
            model, top = self.elaborate(hypers)
            env = {k: v.const_value() for k, v in hypers.values.items() if isinstance(v, Poly)}
            functions = top.functions
            c = count(model, functions, env)
            if key is not None:
                self._configured[key] = (model, functions, c)
        return model, functions, c

    def _total_by_substitution(self, hypers: Hypers) -> int | None:
        """A configuration's parameter count without elaborating it, or None.

        When the values pass every check the symbolic elaboration recorded (`Conditions`),
        and give each derived hyperparameter the value its definition does, elaborating
        them would give the symbolic model with the values put in and no error; their
        count is then the symbolic count's formula evaluated at them."""
        formula = self._count_formula()
        if formula is None:
            return None
        symbolic: Hypers = self.symbolic().hypers  # type: ignore[attr-defined]
        env: dict[str, int | Fraction] = {}
        for name, value in hypers.values.items():
            was = symbolic.values.get(name)
            if isinstance(was, float) or name in symbolic.reals:
                if not (isinstance(value, float) and (value == was or name in symbolic.reals)):
                    return None  # a real number elaborates as one: only the same one
            elif not isinstance(value, Poly):
                return None
            else:
                c = value.const_value()
                env[name] = c.numerator if c.denominator == 1 else c
        try:
            if any(definition.evaluate(env) != env[name]
                   for name, definition in symbolic.derived.items()):
                return None  # an explicit value that its definition does not give
            if not symbolic.conditions.hold(env):
                return None
            total = formula.evaluate(env)
        except (KeyError, ZeroDivisionError):
            return None
        return total.numerator if total.denominator == 1 else None

    def _count_formula(self) -> Poly | None:
        """The symbolic parameter count, when presets can be checked by substitution into
        it: the symbolic elaboration decided every numeric check, and the count names
        hyperparameters only (a module used under a condition on sizes adds `[E != H]`)."""
        if not hasattr(self, "_formula"):
            sym = self.symbolic()
            symbolic: Hypers = sym.hypers  # type: ignore[attr-defined]
            total = sym.count.total()
            decided = symbolic.conditions.undecided is None
            self._formula = total if decided and total.symbols() <= symbolic.values.keys() \
                else None
        return self._formula if SUBSTITUTE else None

    def _presets_by_name(self) -> dict[str, S.Preset]:
        if getattr(self, "_by_name", None) is None:
            self._by_name = {}
            for p in self.model.presets:
                self._by_name.setdefault(p.name, p)  # the first of a name, as before
        return self._by_name

    def default_preset(self) -> str | None:
        """The configuration `fgc params` uses without --preset: the defaults when every
        hyperparameter has one, else the first preset."""
        free, derived = self._classify(self.model)
        if all(h.default is not None for h in free.values()) or not self.model.presets:
            return None
        return self.model.presets[0].name

    # ------------------------------------------------------------ everything `fgc check` does
    def check_tp(self, tp: int) -> list[Diagnostic]:
        """The splits `tp` ranks cannot make evenly (lowering/parallel.py: the torch
        module's parallelize()), each located at its parameter, at every preset (or the
        defaults when there is none)."""
        from .lowering import prepare
        from .lowering.parallel import plan, uneven
        sym = self.symbolic()
        configurations = []
        for preset in self.presets() or [None]:
            hypers, _ = self._checked_values(preset, {})
            configurations.append((preset or "defaults", {
                k: v.const_value() if isinstance(v, Poly) else v
                for k, v in hypers.values.items()}))
        return uneven(plan(*prepare(sym.model, sym.functions)), configurations, tp)

    def check(self) -> tuple[list[Diagnostic], list[Diagnostic]]:
        """(errors, warnings) over the symbolic pass, every preset and every expectation."""
        errors: list[Diagnostic] = []
        warnings: list[Diagnostic] = []
        errors.extend(self.check_modules())
        if errors:
            return errors, warnings
        if not self.file.models:
            return errors, warnings
        if len(self.file.models) > 1:
            errors.append(Diagnostic("error", "a file holds one model",
                                     self.file.models[1].span,
                                     "put each model in its own file"))
            return errors, warnings
        from .config_json import block_errors
        errors.extend(block_errors(self))
        try:
            sym = self.symbolic()
        except FgcError as e:
            return errors + e.diagnostics, warnings
        # what no backend can lower is refused here, located, rather than at compile time
        errors.extend(lowering.check(sym.model, sym.functions))
        errors.extend(padding.check(sym.model, sym.functions))
        total = sym.count.total()
        warnings.extend(sym.warnings)
        hypers: Hypers = sym.hypers  # type: ignore[attr-defined]
        configs: list[tuple[str | None, S.Preset | None]] = [(p.name, p) for p in
                                                             self.model.presets]
        free, _ = self._classify(self.model)
        if all(h.default is not None for h in free.values()):
            configs.insert(0, (None, None))
        for exp in self.model.expects:
            try:
                value = Statics(hypers.values, self.path).eval(exp.value)
            except FgcError as e:
                errors.extend(e.diagnostics)
                continue
            if isinstance(value, float):
                errors.append(Diagnostic("error", "expected a whole number of parameters",
                                         exp.span))
                continue
            if isinstance(value, Poly) and not value.is_const():
                if exp.op == "~":
                    errors.append(Diagnostic("error", "`~` compares with a number, like 125M",
                                             exp.span))
                elif not hypers.same(value, total):
                    errors.append(Diagnostic(
                        "error", f"parameter count is {formula(sym.count)}, not "
                        f"{_show_expr(exp.value)}", exp.span,
                        f"difference: {format_poly(hypers.expand(total) - hypers.expand(value))}"))
            elif (None, None) not in configs:
                errors.append(Diagnostic("error", "a numeric expectation needs values for every "
                                         "hyperparameter", exp.span,
                                         "move it into a preset"))
        symbolic_warnings = {x.message for x in sym.warnings}
        for name, preset in configs:
            label = f"preset `{name}`" if name else "the defaults"
            try:
                numeric, found = self._checked_values(name, None)
                errors.extend(index_maps(sym.model, sym.functions, numeric.values, label))
                total = self._total_by_substitution(numeric)
                if total is None:
                    counted = self._elaborate_numeric(numeric)[2]
            except FgcError as e:
                errors.extend(e.diagnostics)
                continue
            warnings.extend(w for w in found if w.message not in symbolic_warnings)
            expects = list(preset.expects) if preset else []
            if name is None:
                expects += [x for x in self.model.expects if _is_numeric_expect(x, hypers)]
            for exp in expects:
                if total is None:
                    total = as_int(counted.total())
                d = _check_expectation(exp, total, numeric.values, label)
                if d is not None:
                    (errors if d.severity == "error" else warnings).append(d)
        if sym.model.shared_with:
            errors.extend(_check_shared(self, sym))
        return _dedupe(errors), warnings


def _label(preset: str | None, sets: dict | None) -> str:
    """How a message names a configuration."""
    label = f"preset `{preset}`" if preset else "the defaults"
    if sets:
        label += " with " + ", ".join(f"{k}={_show_value(v)}" for k, v in sets.items())
    return label


def _values_key(values: dict[str, Poly | float]) -> tuple | None:
    """A hashable form of numeric hyperparameter values; None when one is not a number."""
    out = []
    for name in sorted(values):
        v = values[name]
        if isinstance(v, Poly):
            if not v.is_const():
                return None
            out.append((name, v.const_value()))
        elif isinstance(v, float) and v == v:
            out.append((name, "float", v))
        else:
            return None
    return tuple(out)


def _names(e) -> set[str]:
    return set(_names_in(e))


def _is_numeric_expect(x: S.Expect, hypers: Hypers) -> bool:
    try:
        v = Statics(hypers.values, "").eval(x.value)
    except FgcError:
        return False
    return isinstance(v, Poly) and v.is_const()


def _check_expectation(exp: S.Expect, total: int, values: dict[str, Poly | float],
                       label: str) -> Diagnostic | None:
    v = Statics(values, "").eval(exp.value)
    if isinstance(v, float) or not v.is_const():
        return Diagnostic("error", "expected a number of parameters", exp.span)
    expected = v.const_value()
    if exp.op == "==":
        if total != expected:
            return Diagnostic("error", f"{label} has {format_int(total)} parameters, not "
                              f"{format_int(expected)}", exp.span,
                              f"difference: {format_int(total - expected)}")
        return None
    tolerance = _tolerance(exp.value)
    if abs(total - expected) > tolerance:
        return Diagnostic("warning", f"{label} has {format_int(total)} parameters "
                          f"({human(total)}); the spec expects ~{_show_expr(exp.value)}",
                          exp.span, f"{human(total)} does not round to "
                          f"{_show_expr(exp.value)}")
    return None


def _tolerance(e: S.Expr) -> Fraction:
    """Half a unit in the last written digit: `125M` -> 500,000; `1.3B` -> 50,000,000."""
    if not isinstance(e, S.Num):
        return Fraction(0)
    text = e.text.replace("_", "")
    scale = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}.get(text[-1], 1)
    digits = text.rstrip("KMBT")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    return Fraction(scale, 10**decimals) / 2


def _is_literal(e: S.Expr) -> bool:
    return isinstance(e, S.Num) or (isinstance(e, S.Neg) and isinstance(e.operand, S.Num))


def _literal(e: S.Expr) -> Poly | float:
    if isinstance(e, S.Neg):
        v = _literal(e.operand)
        return -v
    if "." in e.text or "e" in e.text.lower():
        if e.value.denominator == 1 and e.text[-1] in "KMBT":
            return Poly.const(e.value)
        return float(e.value)
    return Poly.const(e.value)


def _differs(a, b) -> bool:
    fa = float(a.const_value()) if isinstance(a, Poly) else a
    fb = float(b.const_value()) if isinstance(b, Poly) else b
    return fa != fb


def _decimal(c: Fraction) -> str:
    """17/2 -> 8.5; 1/3 -> 1/3."""
    d = c.denominator
    k = 0
    while d % 10 == 0 or d % 2 == 0 or d % 5 == 0:
        if d % 10 == 0:
            d //= 10
        elif d % 2 == 0:
            d //= 2
        else:
            d //= 5
        k += 1
        if d == 1:
            return f"{float(c):.{k}f}".rstrip("0").rstrip(".")
    return f"{c.numerator}/{c.denominator}"


def _show_value(v) -> str:
    if isinstance(v, Fraction) and v.denominator == 1:
        return str(v.numerator)
    return str(v)


def _show(v) -> str:
    if isinstance(v, Poly):
        return format_int(v.const_value())
    return repr(v)


def _decl_span(m: S.Model, name: str) -> Span | None:
    for h in m.hypers:
        if h.name == name:
            return h.span
    return m.span


def _suggest_names(name: str, names: list[str]) -> str | None:
    import difflib
    close = difflib.get_close_matches(name, names, n=2)
    return ("did you mean " + " or ".join(f"`{c}`" for c in close) + "?") if close else None


def _check_acyclic(defs: dict[str, Poly], decls: dict[str, S.HyperDecl]) -> None:
    import graphlib  # walks with its own stack: a chain may be thousands long
    deps = {n: [s for s in p.symbols() if s in defs] for n, p in defs.items()}
    try:
        graphlib.TopologicalSorter(deps).prepare()
    except graphlib.CycleError as e:
        names = list(reversed(e.args[1]))  # graphlib lists a circle from its end
        if len(names) > 12:  # a long circle: its ends say where it runs
            names[6:-3] = [f"… ({len(names) - 9:,} more)"]
        raise FgcError(f"hyperparameters are defined in a circle: {' -> '.join(names)}",
                       decls[names[-1]].span) from None


def _dependency_order(deps: dict[str, list[str]]) -> list[str]:
    """The names of `deps` ({name: the names it uses}), each after those it uses, else in
    the order given; names in a circle come in some order."""
    order: list[str] = []
    state: dict[str, int] = {}
    for root in deps:
        if root in state:
            continue
        state[root] = 1
        path = [(root, iter(deps[root]))]
        while path:
            node, rest = path[-1]
            for n in rest:
                if n not in state:
                    state[n] = 1
                    path.append((n, iter(deps[n])))
                    break
            else:
                state[node] = 2
                order.append(node)
                path.pop()
    return order


def _dedupe(diags: list[Diagnostic]) -> list[Diagnostic]:
    seen = set()
    out = []
    for d in diags:
        key = (d.severity, d.message, str(d.span))
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def load(path: str, text: str | None = None) -> Spec:
    """Read and parse a spec with the standard library; raises FgcError."""
    sources = Sources()
    std_text, std = _stdlib()
    sources.add("stdlib.fgpt", std_text)
    if text is None:
        try:
            text = read_source(path)
        except FgcError as e:
            if hasattr(e, "text"):
                sources.add(path, e.text)
            e.sources = sources  # type: ignore[attr-defined]
            raise
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # any line ending reads as one
    sources.add(path, text)
    for lineno, line in enumerate(text.split("\n"), 1):
        if len(line) > MAX_LINE:
            err = FgcError(f"line {lineno} is {len(line):,} characters long", Span(
                path, lineno, MAX_LINE + 1), f"fgc reads lines of at most {MAX_LINE:,} "
                "characters")
            err.sources = sources  # type: ignore[attr-defined]
            raise err
    try:
        file = parse_text(text, path)
    except FgcError as e:
        e.sources = sources  # type: ignore[attr-defined]
        raise
    if not file.modules and not file.models:
        err = FgcError(f"{Path(path).name} defines no model and no module", Span(path, 1, 1),
                       "a spec holds `model Name { ... }` and any `module`s it uses")
        err.sources = sources  # type: ignore[attr-defined]
        raise err
    modules = {m.name: m for m in std.modules}
    own: dict[str, S.Module] = {}
    for mod in file.modules:
        if mod.name in own:
            err = FgcError(f"module `{mod.name}` is defined twice", mod.span)
            err.sources = sources  # type: ignore[attr-defined]
            raise err
        own[mod.name] = mod
    modules.update(own)
    return Spec(path, sources, file, modules)


def _check_shared(spec: Spec, sym: Config) -> list[Diagnostic]:
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


_HYPER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*'*(\^[A-Za-z][A-Za-z0-9_]*)?")


def parse_set(item: str) -> tuple[str, Fraction | float]:
    """`H=768` -> ("H", 768); raises ValueError with a message."""
    if "=" not in item:
        raise ValueError(f"--set expects NAME=VALUE, got {item!r}")
    name, _, value = item.partition("=")
    name, value = name.strip(), value.strip()
    if not _HYPER_NAME.fullmatch(name):  # a name as the language writes it: c^loc, n'
        raise ValueError(f"--set: {name!r} is not a hyperparameter name")
    from lark import Token
    try:
        tok = Token("INT", value)
        tok.line = tok.column = tok.end_line = tok.end_column = 1
        v = parse_number(tok, "--set")
    except (FgcError, ValueError, ZeroDivisionError, IndexError):
        raise ValueError(f"--set {name}: {value!r} is not a number") from None
    if "." in value or "e" in value.lower():
        if not (v.denominator == 1 and value[-1:] in "KMBT"):
            return name, float(v)
    return name, v


__all__ = ["load", "Spec", "Config", "parse_set", "format_int", "formula", "read_source"]
