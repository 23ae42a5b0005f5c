"""A model folder's config.json read through a spec's `config { ... }` block.

The block (docs/language.md, "config.json") is data: which transformers classes the spec is
for (`architectures`, `model_type`), where each hyperparameter comes from (`H =
hidden_size`; alternatives and a default: `theta = rope_parameters.rope_theta | rope_theta ?
10000.0`), and what the spec assumes of the keys that change the computation but map to no
hyperparameter (`assume hidden_act == "silu"`). Nothing in it runs as Python: keys are looked
up in the parsed JSON, arithmetic on their values is exact, and a default is a size
expression evaluated as any other.

- `read_config(folder)`: the folder's config.json, or an FgcError naming the file.
- `read_hyperparameters(spec, config)`: every mapped hyperparameter's value and the key it
  came from (`Reading`), or an FgcError for each key missing, of the wrong kind, or
  contradicting an assumption, located in config.json with a note at the spec's line.
- `configuration(spec, weights, preset, sets)`: what `compile_spec` uses: the reading of
  `--weights FOLDER`'s config.json with `--set` over it, and a warning for each `--set` or
  preset value that config.json contradicts.
- `pick_spec(config)`: the spec whose block claims the folder's architecture (the user's
  folders in FGC_SPEC_PATH first, then the shipped specs/).
- `block_errors(spec)`: what `fgc check` finds wrong in a block without any folder.
A JSON null counts as absent, as transformers reads it (`head_dim: null` is H / A).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

from .elaborate.elaborator import _CONSTANTS, Statics, _names_in, _show_expr
from .elaborate.symbolic import Poly
from .errors import Diagnostic, FgcError, Span, printable
from .syntax import nodes as S

CONFIG_FILE = "config.json"
MAX_CONFIG_BYTES = 16 * 2**20  # released config.json files are a few KiB
SHIPPED = Path(__file__).resolve().parent.parent / "specs"  # the released specs
SPEC_PATH = "FGC_SPEC_PATH"  # folders of the user's own specs, searched before SHIPPED
MAX_SPEC_BYTES = 512 * 1024  # as pipeline.MAX_FILE_BYTES: a larger file claims nothing

_ABSENT = object()  # a key the file does not hold (or holds as null)


class _Kind(Exception):
    """A key whose value is not what the block needs of it (a string where a number is)."""

    def __init__(self, key: S.ConfigKey, value, why: str = "not a number"):
        super().__init__(key)
        self.key, self.value, self.why = key, value, why


# ---------------------------------------------------------------- the file


@dataclass
class ConfigFile:
    """A config.json as read: its path (for messages), its text (quoted under them) and its
    contents."""

    path: str
    text: str
    data: dict

    @property
    def architectures(self) -> list[str]:  # (read_config checked its kind)
        return self.data.get("architectures") or []

    @property
    def model_type(self) -> str | None:
        return self.data.get("model_type")

    def describe(self) -> str:
        """`LlamaForCausalLM, model_type "llama"`: what the file says it is, its strings
        shown through `printable` (a control character in them is an escape, never sent to
        the terminal)."""
        parts = list(self.architectures)
        if self.model_type is not None:
            parts.append(f'model_type "{self.model_type}"')
        return printable(", ".join(parts)) or "no architectures and no model_type"

    def span(self, path: list[str | int]) -> Span:
        """Where the key `path` is written: found by its quoted name after its parent's, so a
        message can quote the line; the file's start when it is not written there."""
        start, found, name = 0, None, ""
        for part in path:
            if isinstance(part, int):
                continue
            m = re.compile('"' + re.escape(part) + r'"\s*:').search(self.text, start)
            if m is None:
                break
            found, start, name = m, m.end(), part
        if found is None:
            return Span(self.path, 1, 1)
        line = self.text.count("\n", 0, found.start()) + 1
        col = found.start() - (self.text.rfind("\n", 0, found.start()) + 1) + 1
        return Span(self.path, line, col, line, col + len(name) + 2)


def has_config(folder: str | os.PathLike) -> bool:
    """Whether `folder` is a model folder with a config.json."""
    return os.path.isdir(folder) and os.path.lexists(os.path.join(folder, CONFIG_FILE))


def read_small(path: str, limit: int) -> bytes:
    """A model folder's small file (config.json, generation_config.json), read as a
    regular file of at most `limit` bytes; an FgcError naming it otherwise."""
    from runtime.files import FileError, read_regular
    try:
        return read_regular(path, limit)
    except FileError as e:
        raise FgcError(f"{path} {e.strerror}", None) from None
    except OSError as e:
        raise FgcError(f"cannot read {path}: {e.strerror or e}", None) from None


def read_config(folder: str | os.PathLike) -> ConfigFile:
    """`folder`'s config.json: a JSON object, read as a regular file of at most
    MAX_CONFIG_BYTES; an FgcError naming the file (and the line, for JSON that does not
    parse) otherwise."""
    path = os.path.join(str(folder), CONFIG_FILE)
    data = read_small(path, MAX_CONFIG_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FgcError(f"{path} is not UTF-8 text (byte {e.start:,})", None) from None
    try:
        value = json.loads(text, object_pairs_hook=_no_twice)
    except json.JSONDecodeError as e:
        raise _quoting(FgcError(f"{path} is not JSON: {e.msg}", Span(path, e.lineno, e.colno),
                                "a model folder's config.json is what save_pretrained writes"),
                       path, text) from None
    except _Twice as e:
        raise FgcError(f"{path} holds the key `{e.args[0]}` twice", None,
                       "which value is meant is not clear; keep one") from None
    except RecursionError:
        raise FgcError(f"{path} is nested too deeply to read", None) from None
    if not isinstance(value, dict):
        raise FgcError(f"{path} holds a JSON {type(value).__name__}, not an object", None)
    config = ConfigFile(path, text, value)
    # what the file says it is, which chooses the spec: of the kinds transformers writes,
    # or an error (never read past, as a string for `architectures` would be)
    for key, fits, kind, written in (
            ("architectures", lambda v: isinstance(v, list) and all(isinstance(a, str)
                                                                    for a in v),
             "a list of class names", '["LlamaForCausalLM"]'),
            ("model_type", lambda v: isinstance(v, str), "a string", '"llama"')):
        if value.get(key) is not None and not fits(value[key]):
            raise _quoting(FgcError(f"config.json's `{key}` is {show_json(value[key])}, not "
                                    f"{kind}", config.span([key]),
                                    f"save_pretrained writes {written}"), path, text)
    return config


def _quoting(err: FgcError, path: str, text: str) -> FgcError:
    """`err` with the file's text at hand, so that its message quotes the line."""
    from .errors import Sources
    err.sources = Sources()  # type: ignore[attr-defined]
    err.sources.add(path, text)
    return err


class _Twice(Exception):
    pass


def _no_twice(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _Twice(key)
        out[key] = value
    return out


# ---------------------------------------------------------------- keys and values


def _lookup(data, path: list[str | int]):
    """The value at `path`, or _ABSENT where a key is missing or null, or a position is
    past the list's end, or the value is not a list where a position is asked for."""
    value = data
    for part in path:
        if isinstance(part, int):
            if not isinstance(value, list) or not 1 <= part <= len(value):
                return _ABSENT
            value = value[part - 1]
        else:
            if not isinstance(value, dict) or part not in value:
                return _ABSENT
            value = value[part]
        if value is None:
            return _ABSENT
    return value


def _number(key: S.ConfigKey, value) -> Fraction:
    """A JSON number (or true / false, 1 / 0) exactly; _Kind for anything else."""
    if isinstance(value, bool):
        return Fraction(int(value))
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        return Fraction(value)
    raise _Kind(key, value)


def _evaluate(e: S.Expr, data) -> tuple[object, S.Expr | None]:
    """(value, the alternative read) of a key expression, or (_ABSENT, None). A bare key
    gives the JSON value as it is; arithmetic gives a Fraction."""
    if isinstance(e, S.ConfigChoice):
        for alternative in e.alternatives:
            value, _ = _evaluate(alternative, data)
            if value is not _ABSENT:
                return value, alternative
        return _ABSENT, None
    if isinstance(e, S.ConfigKey):
        return _lookup(data, e.path), e
    if isinstance(e, S.Num):
        return e.value, e
    if isinstance(e, S.BinOp):
        left, _ = _evaluate(e.left, data)
        right, _ = _evaluate(e.right, data)
        if left is _ABSENT or right is _ABSENT:
            return _ABSENT, None
        a = left if isinstance(left, Fraction) else _number(_first_key(e.left), left)
        b = right if isinstance(right, Fraction) else _number(_first_key(e.right), right)
        if e.op == "/" and b == 0:
            raise _Kind(_first_key(e.right), right, "zero, which the spec divides by")
        return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else a}[e.op], e
    raise TypeError(f"not a key expression: {type(e).__name__}")


def _first_key(e: S.Expr) -> S.ConfigKey:
    if isinstance(e, S.ConfigKey):
        return e
    if isinstance(e, S.ConfigChoice):
        return _first_key(e.alternatives[0])
    if isinstance(e, S.BinOp):
        return _first_key(e.left) if _has_key(e.left) else _first_key(e.right)
    return S.ConfigKey(e.span, ["?"])


def _has_key(e: S.Expr) -> bool:
    if isinstance(e, S.ConfigKey):
        return True
    if isinstance(e, S.ConfigChoice):
        return any(_has_key(a) for a in e.alternatives)
    if isinstance(e, S.BinOp):
        return _has_key(e.left) or _has_key(e.right)
    return False


def key_text(e: S.Expr, parent: bool = False) -> str:
    """A key expression as the block writes it: `rope_parameters.rope_theta`,
    `num_buckets[1] / 2`, `(a | b) * c`."""
    if isinstance(e, S.ConfigKey):
        out = ""
        for part in e.path:
            out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
        return out
    if isinstance(e, S.ConfigChoice):
        text = " | ".join(key_text(a) for a in e.alternatives)
        return f"({text})" if parent and len(e.alternatives) > 1 else text
    if isinstance(e, S.Num):
        return e.text
    if isinstance(e, S.BinOp):
        return f"{key_text(e.left, True)} {e.op} {key_text(e.right, True)}"
    return "?"


def show_json(value, limit: int = 60) -> str:
    """A config.json value as JSON writes it, shortened past `limit` characters."""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def show_value(value: Fraction | float) -> str:
    """A hyperparameter's value as `--set` would write it: 2048, 1e-05, 500000.0."""
    if isinstance(value, Fraction):
        return str(value.numerator) if value.denominator == 1 else str(value)
    return repr(value)


def _literal_json(v: S.JsonValue):
    """What an assumed value is, as json.loads would give it (`1` an int, `1.0` a float)."""
    if v.kind == "string":
        return v.text
    if v.kind == "number":
        from .syntax.nodes import parse_number
        digits = v.text.lstrip("-")
        value = _parse(digits, parse_number) * (-1 if v.text.startswith("-") else 1)
        whole = value.denominator == 1 and not any(c in digits for c in ".eE")
        return int(value) if whole else float(value)
    if v.kind in ("list", "cycle"):  # a cycle: its first period
        return [_literal_json(x) for x in v.items]
    return {"true": True, "false": False, "null": None}[v.kind]


def _parse(text: str, parse_number) -> Fraction:
    from lark import Token
    tok = Token("INT", text)
    tok.line = tok.column = tok.end_line = tok.end_column = 1
    return parse_number(tok, "")


def _matches(raw, want: S.JsonValue) -> bool:
    """Whether config.json's `raw` is the assumed `want`. A list of the file against one
    value: every entry is it (`layer_types` all "full_attention"). Against a cycle
    (`["sliding_attention", "full_attention", ...]`): a list whose entries are the cycle's
    in turn, whatever its length."""
    if want.kind == "cycle":
        return isinstance(raw, list) and len(raw) > 0 and all(
            _matches(x, want.items[k % len(want.items)]) for k, x in enumerate(raw))
    if isinstance(raw, list) and want.kind != "list":
        return all(_matches(x, want) for x in raw)
    if want.kind == "string":
        return isinstance(raw, str) and raw == want.text
    if want.kind in ("true", "false"):
        return raw is (want.kind == "true")
    if want.kind == "null":
        return raw is None or raw is _ABSENT
    if want.kind == "number":
        if isinstance(raw, bool) or not isinstance(raw, (int, float, Fraction)):
            return False
        return float(raw) == float(_literal_json(want))
    return isinstance(raw, list) and len(raw) == len(want.items) and all(
        _matches(x, w) for x, w in zip(raw, want.items))


def _show_literal(v: S.JsonValue) -> str:
    if v.kind == "string":
        return f'"{v.text}"'
    if v.kind == "list":
        return "[" + ", ".join(_show_literal(x) for x in v.items) + "]"
    if v.kind == "cycle":
        return "[" + ", ".join(_show_literal(x) for x in v.items) + ", ...]"
    return v.text


def _show_wanted(values: list[S.JsonValue]) -> str:
    shown = [_show_literal(v) for v in values]
    return shown[0] if len(shown) == 1 else "one of " + ", ".join(shown)


# ---------------------------------------------------------------- reading


@dataclass
class Origin:
    """One hyperparameter read from config.json: its value and where it came from."""

    name: str
    value: Fraction | float
    key: str | None  # the key expression read (`rope_parameters.rope_theta`)
    default: str | None  # the block's default, used where the file holds none of the keys
    absent: str = ""  # the keys the file does not hold, for a default's line

    def describe(self) -> str:
        if self.key is not None:
            return self.key
        return f"{self.absent} absent: {self.default}"


@dataclass
class Assumed:
    """One `assume`: what the file holds for it (None: nothing) and what the spec assumes."""

    key: str
    held: object  # the JSON value, or None where the file does not hold the key
    assumed: str  # the spec's value(s), as written


@dataclass
class Reading:
    """config.json through a spec's block: the hyperparameters it gives, in the block's
    order, and the assumptions it was checked against."""

    config: ConfigFile
    spec: str
    hypers: list[Origin]
    assumed: list[Assumed]
    sets: dict[str, Fraction | float] = field(default_factory=dict)  # with --set over it
    warnings: list[str] = field(default_factory=list)

    @property
    def values(self) -> dict[str, Fraction | float]:
        return {o.name: o.value for o in self.hypers}

    def origin(self, name: str) -> Origin | None:
        return next((o for o in self.hypers if o.name == name), None)

    def label(self, sets: dict | None = None) -> str:
        """How a message names this configuration: the file, and any --set over it."""
        over = {k: v for k, v in (sets or {}).items()
                if k not in self.values or self.values[k] != v}
        return self.config.path + (" with " + ", ".join(
            f"{k}={show_value(v)}" for k, v in over.items()) if over else "")

    def lines(self) -> list[str]:
        """The configuration read, a line per hyperparameter: `H  = 2048  hidden_size`."""
        out = [f"config   {printable(self.config.path)} ({self.config.describe()}): "
               f"{printable(self.spec)}"]
        width = max((len(o.name) for o in self.hypers), default=1)
        shown = [show_value(o.value) for o in self.hypers]
        vwidth = max((len(s) for s in shown), default=1)
        for o, s in zip(self.hypers, shown):
            out.append(f"  {o.name:<{width}} = {s:<{vwidth}}  {o.describe()}")
        if self.assumed:
            held = [f"{a.key} {show_json(a.held, 30) if a.held is not None else '(absent)'}"
                    for a in self.assumed]
            out.append(f"  assumed: {'; '.join(held)}")
        return out

    def summary(self) -> str:
        """One line: `hyperparameters from FOLDER/config.json: L=2 H=64 ...`."""
        return (f"hyperparameters from {self.config.path}: "
                + " ".join(f"{o.name}={show_value(o.value)}" for o in self.hypers))

    def as_dict(self) -> dict:
        return {
            "file": self.config.path, "spec": self.spec,
            "architectures": self.config.architectures, "model_type": self.config.model_type,
            "hyperparameters": {o.name: {"value": _plain(o.value), "key": o.key,
                                         "default": o.default} for o in self.hypers},
            "assumed": [{"key": a.key, "value": a.held, "assumed": a.assumed}
                        for a in self.assumed],
        }


def _plain(v: Fraction | float) -> int | float:
    if isinstance(v, Fraction):
        return v.numerator if v.denominator == 1 else float(v)
    return v


def read_hyperparameters(spec, config: ConfigFile, preset: str | None = None,
                         sets: dict | None = None) -> Reading:
    """The hyperparameters `spec`'s config block reads from `config`, each with the key it
    came from; raises FgcError (every problem found, located in config.json with a note at
    the spec's line) where the file is for another model, lacks a key the block needs
    without a default (and neither `sets`, --set, nor `preset` gives the hyperparameter),
    holds a value of the wrong kind, or contradicts an assumption. Defaults are evaluated
    with the values read, the preset's and `sets`."""
    block = spec.model.config
    if block is None:
        raise FgcError(f"{spec.path} has no config block, so it reads nothing from "
                       f"{config.path}", spec.model.span,
                       "add `config { H = hidden_size ... }` to the model")
    spec.sources.add(config.path, config.text)
    errors = block_errors(spec) or _claim_errors(spec, block, config)
    if errors:  # a block in error, or another model's file: its keys would only add noise
        raise FgcError.many(errors)
    hypers: dict[str, S.HyperDecl] = {h.name: h for h in spec.model.hypers}
    found: dict[str, Origin] = {}
    pending: list[S.ConfigMap] = []
    failed: set[str] = set()  # maps already reported: defaults that use them are not
    given = set(sets or {}) | _preset_names(spec, preset)  # what --set or the preset gives
    for m in block.maps:
        try:
            raw, alternative = _evaluate(m.source, config.data)
            if raw is _ABSENT:
                if m.default is not None:
                    pending.append(m)
                elif m.name not in given:  # a required key, and nothing else gives it
                    errors += _missing_error(spec, config, m)
                    failed.add(m.name)
                continue
            value = raw if isinstance(raw, Fraction) else _number(alternative, raw)
        except _Kind as e:
            errors += _kind_error(spec, config, m, e)
            failed.add(m.name)
            continue
        found[m.name] = Origin(m.name, _as_hyper(hypers.get(m.name), value),
                               key_text(alternative), None)
    defaults = _defaults(spec, found, pending, preset, sets or {}, errors, failed)
    assumed = []
    for a in block.assumes:
        try:
            raw, alternative = _evaluate(a.source, config.data)
        except _Kind as e:
            errors.append(_kind_diag(spec, config, a.span, e, "the assumption"))
            continue
        held = None if raw is _ABSENT else _plain(raw) if isinstance(raw, Fraction) else raw
        assumed.append(Assumed(key_text(alternative or a.source), held, _show_wanted(a.values)))
        errors += _assume_errors(spec, config, a, raw, alternative)
    if errors:
        raise FgcError.many(errors)
    order = {m.name: k for k, m in enumerate(block.maps)}
    read = sorted([*found.values(), *defaults], key=lambda o: order[o.name])
    return Reading(config, _shown_path(spec.path), read, assumed)


def _preset_names(spec, preset: str | None) -> set[str]:
    p = next((p for p in spec.model.presets if p.name == preset), None)
    return {name for name, _, _ in p.assigns} if p is not None else set()


def _as_hyper(h: S.HyperDecl | None, value: Fraction | float) -> Fraction | float:
    """A value as its hyperparameter holds it: a real (its default is written `1e-5`,
    `10000.0`) as a float, a size exactly."""
    if h is not None and h.default is not None and _is_real_literal(h.default):
        return float(value)
    return value


def _is_literal(e: S.Expr) -> bool:
    return isinstance(e, S.Num) or (isinstance(e, S.Neg) and isinstance(e.operand, S.Num))


def _literal(e: S.Expr) -> Poly | float:
    """A hyperparameter's literal default as pipeline.py reads it: `1e-5` and `10000.0` a
    real, `768` and `1.3B` exact. (pipeline.py imports this module: not imported back.)"""
    if isinstance(e, S.Neg):
        return -_literal(e.operand)
    if "." in e.text or "e" in e.text.lower():
        if not (e.value.denominator == 1 and e.text[-1] in "KMBT"):
            return float(e.value)
    return Poly.const(e.value)


def _is_real_literal(e: S.Expr) -> bool:
    return _is_literal(e) and isinstance(_literal(e), float)


def _static(value: Fraction | float) -> Poly | float:
    return float(value) if isinstance(value, float) else Poly.const(value)


def _defaults(spec, found: dict[str, Origin], pending: list[S.ConfigMap],
              preset: str | None, sets: dict, errors: list[Diagnostic],
              failed: set[str]) -> list[Origin]:
    """The block's defaults where config.json holds none of a map's keys, each evaluated
    once the hyperparameters it names have values: read from the file, set (`--set`, the
    preset), or the spec's own (a literal default, or a definition)."""
    model = spec.model
    env: dict[str, Poly | float] = {}
    for h in model.hypers:
        if h.default is not None and _is_literal(h.default):
            env[h.name] = _literal(h.default)
    if preset is not None:
        p = next((p for p in model.presets if p.name == preset), None)
        for name, expr, _ in (p.assigns if p is not None else []):
            try:
                env[name] = Statics(dict(env), spec.path).eval(expr)
            except FgcError:
                continue  # the preset's own problem, reported where it is configured
    env.update((name, _static(o.value)) for name, o in found.items())
    env.update((name, _static(v)) for name, v in sets.items())
    waiting = {m.name for m in pending}
    derived = {h.name: h.default for h in model.hypers if h.default is not None
               and not _is_literal(h.default) and h.name not in env and h.name not in waiting}
    hypers = {h.name: h for h in model.hypers}
    out: list[Origin] = []
    progress = True
    while progress and (pending or derived):
        progress = False
        for m in list(pending):
            if not set(_names_in(m.default)) <= env.keys() | _CONSTANTS.keys():
                continue
            pending.remove(m)
            progress = True
            try:
                v = Statics(env, spec.path).eval(m.default)
            except FgcError as e:
                errors.extend(e.diagnostics)
                continue
            value = Fraction(v.const_value()) if isinstance(v, Poly) else v
            if m.name in sets:
                env[m.name] = _static(sets[m.name])
            else:
                env[m.name] = v
            out.append(Origin(m.name, _as_hyper(hypers.get(m.name), value), None,
                              _show_expr(m.default), key_text(m.source)))
        for name, definition in list(derived.items()):
            if set(_names_in(definition)) <= env.keys() | _CONSTANTS.keys():
                del derived[name]
                progress = True
                try:
                    env[name] = Statics(env, spec.path).eval(definition)
                except FgcError:
                    continue  # the spec's own problem, reported where it is configured
    for m in pending:
        names = sorted(set(_names_in(m.default)) - env.keys() - _CONSTANTS.keys())
        if failed & set(names):
            continue  # follows from a key already reported
        errors.append(Diagnostic(
            "error", f"`{m.name}` falls back to `{_show_expr(m.default)}` where "
            f"`{key_text(m.source)}` is absent, but "
            + " and ".join(f"`{n}`" for n in names)
            + (" have" if len(names) > 1 else " has") + " no value", m.default.span,
            f"--set {names[0]}=..." if names else None))
    return out


# ---------------------------------------------------------------- errors


def _note(span: Span, text: str) -> Diagnostic:
    return Diagnostic("note", text, span)


def _claim_errors(spec, block: S.ConfigBlock, config: ConfigFile) -> list[Diagnostic]:
    """The file names a model the spec does not claim: its architectures, else its type."""
    names = config.architectures
    if block.architectures and names and not set(names) & set(block.architectures):
        return [Diagnostic(
            "error", f"config.json is for {', '.join(names)}, but {_shown_path(spec.path)} "
            f"is for {', '.join(block.architectures)}", config.span(["architectures"]),
            "`fgc compile FOLDER -o DIR` picks the spec made for a folder"),
            _note(block.span, "the architectures this spec claims")]
    kind = config.model_type
    if block.model_types and kind is not None and kind not in block.model_types and not (
            names and set(names) & set(block.architectures)):
        return [Diagnostic(
            "error", f'config.json is for model_type "{kind}", but '
            f"{_shown_path(spec.path)} is for "
            + ", ".join(f'"{t}"' for t in block.model_types), config.span(["model_type"]),
            "`fgc compile FOLDER -o DIR` picks the spec made for a folder"),
            _note(block.span, "the model types this spec claims")]
    return []


def _missing_error(spec, config: ConfigFile, m: S.ConfigMap) -> list[Diagnostic]:
    keys = [key_text(a) for a in m.source.alternatives]
    what = f"`{keys[0]}`" if len(keys) == 1 else "any of " + ", ".join(f"`{k}`" for k in keys)
    return [Diagnostic("error", f"config.json has no {what}, from which "
                       f"{_shown_path(spec.path)} reads `{m.name}`", Span(config.path, 1, 1),
                       f"add the key to config.json, or give the spec a default (`{m.name} = "
                       f"{keys[0]} ? ...`)"),
            _note(m.span, f"where `{m.name}` is read")]


def _kind_diag(spec, config: ConfigFile, span: Span, e: _Kind, what: str) -> Diagnostic:
    return Diagnostic("error", f"config.json's `{key_text(e.key)}` is {show_json(e.value)}"
                      f", {e.why} ({what} in {_shown_path(spec.path)}:{span.line} "
                      "computes with it)", config.span(e.key.path),
                      "a size or a real hyperparameter is a JSON number")


def _kind_error(spec, config: ConfigFile, m: S.ConfigMap, e: _Kind) -> list[Diagnostic]:
    return [_kind_diag(spec, config, m.span, e, f"`{m.name}`"),
            _note(m.span, f"where `{m.name}` is read")]


def _assume_errors(spec, config: ConfigFile, a: S.ConfigAssume, raw,
                   alternative: S.Expr | None) -> list[Diagnostic]:
    """An assumption the file contradicts: the key, the file's value and the spec's."""
    wanted = _show_wanted(a.values)
    if raw is _ABSENT:
        if a.absent is None or any(_matches(_literal_json(a.absent), v) for v in a.values):
            return []
        keys = key_text(a.source)
        message = (f"config.json has no `{keys}`, which means {_show_literal(a.absent)}, "
                   f"but {_shown_path(spec.path)} assumes {wanted}")
        span = Span(config.path, 1, 1)
    else:
        if any(_matches(raw, v) for v in a.values):
            return []
        key = key_text(alternative)
        message = (f"config.json sets `{key}` to {show_json(raw)}, but "
                   f"{_shown_path(spec.path)} assumes {wanted}")
        span = config.span(alternative.path) if isinstance(alternative, S.ConfigKey) \
            else Span(config.path, 1, 1)
    return [Diagnostic("error", message, span,
                       "the spec computes only what it assumes: this model needs a spec "
                       "written for it (or this key changed back)"),
            _note(a.span, "the assumption")]


def _shown_path(path: str) -> str:
    """A spec's path as messages show it: relative to here when it is below here."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


# ---------------------------------------------------------------- for compile_spec


def configuration(spec, weights: str | None, preset: str | None,
                  sets: dict | None) -> Reading | None:
    """With `--weights FOLDER` holding a config.json and a spec with a config block: the
    reading, with `reading.sets` the values to configure with (config.json's, `--set` over
    them) and `reading.warnings` a line for each `--set` or preset value that config.json
    contradicts. None otherwise: a file, or a folder without config.json, or a spec
    without a block, reads nothing."""
    if weights is None or spec.model.config is None or not has_config(weights):
        return None
    sets = dict(sets or {})
    reading = read_hyperparameters(spec, read_config(weights), preset, sets)
    reading.sets = {**reading.values, **sets}
    for name, value in sets.items():
        o = reading.origin(name)
        if o is not None and float(o.value) != float(value):
            reading.warnings.append(
                f"--set {name}={show_value(value)} contradicts {reading.config.path}, which "
                f"gives {name} = {show_value(o.value)} ({o.describe()}); --set wins")
    if preset is not None:
        p = next((p for p in spec.model.presets if p.name == preset), None)
        env = {k: _static(v) for k, v in reading.sets.items()}
        for name, expr, _ in (p.assigns if p is not None else []):
            o = reading.origin(name)
            if o is None or name in sets:
                continue
            try:
                v = Statics(dict(env), spec.path).eval(expr)
            except FgcError:
                continue
            given = float(v.const_value()) if isinstance(v, Poly) and v.is_const() else v
            if isinstance(given, float) and given != float(o.value):
                reading.warnings.append(
                    f"preset `{preset}` sets {name} = {show_value(_plain_value(v))}, but "
                    f"{reading.config.path} gives {show_value(o.value)} ({o.describe()}); "
                    "config.json's value is used")
    return reading


def _plain_value(v: Poly | float) -> Fraction | float:
    return v.const_value() if isinstance(v, Poly) else v


# ---------------------------------------------------------------- which spec


@dataclass
class Claim:
    """A spec file and what its config block claims."""

    path: str
    architectures: list[str]
    model_types: list[str]


def spec_folders() -> list[Path]:
    """Where `fgc compile FOLDER` looks for specs: FGC_SPEC_PATH's folders (separated as
    PATH is), then the shipped specs/."""
    extra = [Path(p) for p in os.environ.get(SPEC_PATH, "").split(os.pathsep) if p]
    return [*extra, SHIPPED]


def claims(folders: list[Path] | None = None) -> list[list[Claim]]:
    """For each folder, the claims of its `*.fgpt` files (not those below it), sorted by
    name; a file that does not read or parse claims nothing."""
    from runtime.files import read_regular

    from .syntax.parse import parse_text
    out = []
    for folder in folders if folders is not None else spec_folders():
        found = []
        try:
            paths = sorted(folder.glob("*.fgpt"))
        except OSError:
            paths = []
        for path in paths:
            try:
                text = read_regular(path, MAX_SPEC_BYTES).decode("utf-8")
                tree = parse_text(text.replace("\r\n", "\n"), str(path))
            except (FgcError, OSError, UnicodeDecodeError, RecursionError):
                continue
            block = tree.models[0].config if tree.models else None
            if block is not None and (block.architectures or block.model_types):
                found.append(Claim(_shown_path(str(path)), block.architectures,
                                   block.model_types))
        out.append(found)
    return out


def pick_spec(config: ConfigFile, folders: list[Path] | None = None) -> Claim:
    """The spec for a folder whose config.json is `config`: the one claiming one of its
    `architectures`, else (a file that names none) its `model_type`; from the first folder
    (spec_folders) that has one. An FgcError listing the known architectures where no
    spec claims the model, or naming the specs where two do."""
    groups = claims(folders)
    names, kind = config.architectures, config.model_type
    for group in groups:
        if names:
            found = [c for c in group if set(names) & set(c.architectures)]
            how = ", ".join(names)
        else:
            found = [c for c in group if kind is not None and kind in c.model_types]
            how = f'model_type "{kind}"'
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise FgcError(f"{config.path} ({how}) is claimed by "
                           + " and ".join(c.path for c in found), None,
                           "name the spec: fgc compile SPEC --weights FOLDER -o DIR")
    known = sorted({(a, c.path) for group in groups for c in group for a in c.architectures})
    raise FgcError.many([Diagnostic(
        "error", f"no spec is for {config.path} ({config.describe()}); the known "
        f"architectures are {len(known)}:", None,
        "write a spec for it with `config { architectures \"...\" ... }` and compile with "
        f"`fgc compile SPEC --weights FOLDER`, or put the spec in a folder named by {SPEC_PATH}",
        [f"{a}: {p}" for a, p in known] or ["none"])])


# ---------------------------------------------------------------- fgc check


def block_errors(spec) -> list[Diagnostic]:
    """What is wrong with a model's config block whatever the folder: a map to a name that
    is not a hyperparameter, a hyperparameter mapped twice, a default that names what is
    not a hyperparameter."""
    block = spec.model.config
    if block is None:
        return []
    hypers = {h.name for h in spec.model.hypers}
    errors: list[Diagnostic] = []
    seen: dict[str, S.ConfigMap] = {}
    for m in block.maps:
        if m.name not in hypers:
            close = difflib.get_close_matches(m.name, sorted(hypers), n=2)
            errors.append(Diagnostic(
                "error", f"`{m.name}` is not a hyperparameter of {spec.model.name}", m.span,
                "did you mean " + " or ".join(f"`{c}`" for c in close) + "?" if close else
                "the block maps hyperparameters (`hyper ...`) to config.json's keys"))
            continue
        if m.name in seen:
            errors.append(Diagnostic("error", f"`{m.name}` is read from config.json twice",
                                     m.span, "give one map, with alternatives: "
                                     f"`{m.name} = a | b`"))
            continue
        seen[m.name] = m
        if m.default is not None:
            unknown = [n for n in dict.fromkeys(_names_in(m.default))
                       if n not in hypers and n not in _CONSTANTS]
            if unknown:
                errors.append(Diagnostic(
                    "error", f"`{unknown[0]}` in `{m.name}`'s default is not a "
                    "hyperparameter", m.default.span,
                    "a default is a size expression of the hyperparameters; config.json's "
                    "keys come before the `?`"))
    return errors
