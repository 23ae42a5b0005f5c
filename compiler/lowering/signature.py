"""The signature of a compiled model: what a caller feeds it and gets back, decided once.

Both backends print the same plain dict, which the runtime reads (runtime/signature.py):
the torch module returns it from `signature()`, the ONNX graph stores it, JSON-encoded,
under the metadata key `fgc.signature`.

    {"inputs":  [{"name": "x", "dtype": "int", "dims": ["batch", "T"],
                  "lo": 1, "hi": 50257, "zero_based": true, "perm": false}, ...],
     "outputs": [{"name": "GPT", "dtype": "real", "dims": ["batch", "T", 50257]}, ...],
     "logits":  {"name": "logits", "of": "GPT"} or null,
     "state":   {"Mem'": "Mem"},
     "max_length": {"T": 1024},
     "incremental": null or {"tokens": "x", "length": "T", "past": "past",
                             "cache": [{"past": "past.{l}.key", "present": "present.{l}.key",
                                        "kind": "key", "block": 1, "layers": 12,
                                        "dims": ["batch", 12, "past", 64]}, ...]}}

- A dim is `"batch"`, a whole number, or the text of a size in the run lengths: `"T"` when
  one length varies from call to call (`ir.sequence_symbols`), `"T_n"`, `"T_m"`, ... (the
  spec's symbol after `T_`) when several do, and sizes computed from them
  (`"min(6, T_n + T_p)"`). An input family's members follow the batch as one axis.
- An integer input also has its range `lo..hi` at the configuration; `hi_run` when its top
  is a run length (a position: at most this call's length); the compiled models take ids
  0-based (`zero_based`); `perm` when it is a permutation. `pad` marks a padding mask
  (`Pad[n]`, passes/padding.py): 1 at a token, 0 at padding, as given (not 0-based); a
  caller may leave it out (no padding), and in the incremental form it covers the past's
  positions and the new ones (`past + T` wide), as transformers' `attention_mask` does.
- `inputs` are the spec's, in order, but padding masks last (the torch module's
  `forward` takes them as keywords that default to None).
- `outputs` are the spec's, in order (what the torch module's forward returns). `logits`
  names the extra output of the ONNX graph (and the torch module's `logits()`) that is
  the input of the final Softmax of a single output; null when there is none.
  An ONNX graph compiled with `--outputs` lists those it computes (`select_outputs`);
  where its logits are without the output they are of, `logits` has that output's
  `dims` too.
- `state`: outputs a caller feeds back as inputs at the next call (`Mem'` for `Mem`).
- `max_length`: each run length's most, the configuration's value of its symbol.
- `incremental`, for a model with the key/value-cache form (compiler/passes/incremental.py;
  every torch module of an autoregressive spec, an ONNX graph compiled with `--kv-cache`):
  the token input a step extends, its run length, the name of the cache's positions axis,
  and the cache: one entry per cache site and kind (key, value), in graph order (the
  sites outside the layers, then each `layers` block's, each site's key then value).
  `block` is the `layers` block the site is in (1-based, in the spec's order; 0 outside
  any) and `layers` its number of layers (1 outside); `past` and `present` name the ONNX
  graph's input and output (the present's positions axis is `past+T`), with `{l}` for
  the layer's index from 0; `dims` are the past's. Entries of one block are consecutive,
  blocks in increasing order, and stand for their tensors layer by layer: for each layer
  of the block, each of its entries in turn. runtime/signature.py expands them into that
  list of tensors (`past.0.key`, `past.0.value`, `past.1.key`, ...), the order of the
  graph's inputs and outputs and of the torch module's step() (key, value) pairs; a spec
  of 100,000 layers has one entry per site and kind all the same. `chunk_batch`, where
  present (an ONNX graph with onnxruntime's GroupQueryAttention, `--optimize ort`), is the
  largest batch that may give more than one new position after a past.

The torch module's numbers are its `self.config`'s: `signature_form` leaves the sizes that
depend on hyperparameters symbolic (`Number`, `Text`) and the torch backend prints them as
expressions over `self.config`; `at` gives them the configuration's values, which the ONNX
graph stores (its sizes are fixed when it is compiled), and `signature` is the two in turn,
so `build().signature()` is the ONNX graph's `fgc.signature`.

With `--genai` (ONNX only) the names of the token input, the cache and the logits are
onnxruntime-genai's (`GENAI_NAMES`: `input_ids`, `past_key_values.{l}.key`, ...), here,
so the graph, its `fgc.signature` and the runtime agree on them (`genai_names`).

This module imports neither torch, onnx nor jinja2.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from ..elaborate import ir
from ..elaborate.intrinsics import is_kind
from ..elaborate.ir import sequence_symbols, state_pairs
from ..elaborate.symbolic import Atom, Poly, format_poly
from ..errors import FgcError
from ..names import Namer, ident, reserved

BATCH = "batch"  # the leading axis of every input and output
PAST = "past"  # the incremental form's run-time size: positions the cache holds
LOGITS = "logits"  # the extra output holding the final Softmax's input

# onnxruntime-genai's names (the defaults of its genai_config.json's decoder "inputs" and
# "outputs"), which `--genai` gives the incremental form's tensors: the signature's role ->
# the graph's name, `{l}` the layer from 0. Positions come from the padding mask (a spec's
# `Pad[n]`), so the graph takes no `position_ids`.
GENAI_NAMES = {
    "tokens": "input_ids",
    "padding": "attention_mask",
    "past key": "past_key_values.{l}.key",
    "past value": "past_key_values.{l}.value",
    "present key": "present.{l}.key",
    "present value": "present.{l}.value",
    "logits": LOGITS,
}


def by_position(d, length: str | None) -> bool:
    """Whether a size runs along the incremental form's new positions (`length`, named as
    the caller names sizes; None outside that form): a table of positions or a parameter
    along it is read from the first new position (the past's length) on, and a causal
    table has a column for every cached position too."""
    return length is not None and isinstance(d, Poly) and length in d.symbols()


def run_lengths(model: ir.Model, functions: dict[str, ir.Function]) -> dict[str, str]:
    """Each size read off the inputs at run time -> its name in the signature's dims, the
    ONNX graph's axes and the torch module's variables: `T` when there is one, `T_<symbol>`
    when there are several, the symbol as the torch module spells the hyperparameter
    (`n^src` -> `T_n_src`), and a `_` more while that is a hyperparameter's name there or
    a name model.py owns."""
    names = sorted(sequence_symbols(model, functions))
    if len(names) == 1:
        return {names[0]: "T"}
    hypers = Namer()  # the hyperparameters' constants in model.py, in declaration order
    consts = {h.name: hypers(h.name) for h in model.hypers}
    taken = set(consts.values())
    out = {}
    for s in names:
        name = f"T_{consts.get(s) or ident(s)}"
        while name in taken or reserved(name):
            name += "_"
        out[s] = name
    return out


# ---------------------------------------------------------------- sizes left symbolic


@dataclass(frozen=True)
class Number:
    """A whole number of the signature that depends on the hyperparameters (`V`, `H/A`,
    `L`), in the symbolic form: `size` is over the spec's hyperparameters."""

    size: Poly
    what: str  # where it is, for an error message

    def at(self, values: dict) -> int:
        return _number(self.size.subs(_known(values)), self.what)


@dataclass(frozen=True)
class Text:
    """A dim or `hi_run` over the run lengths whose numbers depend on the hyperparameters
    (`min(m, T_n + T_p)`), in the symbolic form: `size` is over the hyperparameters, its
    sequence symbols standing for the run lengths `runs` names."""

    size: Poly
    runs: tuple[tuple[str, str], ...]  # (sequence symbol, run length)

    def hypers(self) -> list[str]:
        runs = dict(self.runs)
        return sorted(s for s in self.size.symbols() if s not in runs)

    def at(self, values: dict) -> str:
        return format_poly(self.size.subs({**_known(values),
                                           **{s: Poly.sym(n) for s, n in self.runs}}))

    def template(self) -> tuple[list[str], bool]:
        """The text with the hyperparameters' numbers left out: literal pieces and the
        hyperparameters between them, alternately (`["min(", "m", ", T_n + T_p)"]`); and
        whether it is the text at every configuration (`at`) or only one that names the
        same size. It is when each hyperparameter is a whole argument of the one opaque part
        of its sum, which keeps a run length (`min(m, T_n + T_p)`): giving it a value then
        merges no terms and reorders nothing."""
        hypers = self.hypers()
        marks = {h: Poly.sym(f"\0{k}\0") for k, h in enumerate(hypers)}
        text = format_poly(self.size.subs({**marks, **{s: Poly.sym(n) for s, n in self.runs}}))
        pieces = text.split("\0")
        parts = [p if k % 2 == 0 else hypers[int(p)] for k, p in enumerate(pieces)]
        return parts, _keeps_form(self.size, set(hypers))


def _keeps_form(p: Poly, hypers: set[str]) -> bool:
    """Whether giving `hypers` values leaves the text of `p` as it is but for their numbers
    (see Text.template)."""
    atoms = [s for mono in p.terms for s, _ in mono if isinstance(s, Atom)]
    for mono in p.terms:
        if any(not isinstance(s, Atom) and s in hypers for s, _ in mono):
            return False  # a factor: its value merges into the coefficient
    for a in atoms:
        args = [x.symbols() for x in a.args]
        if not any(x & hypers for x in args):
            continue
        if len(atoms) > 1 or not any(x - hypers for x in args):
            return False  # its text orders it among the others, or it becomes a number
        if any(x & hypers and not (len(x) == 1 and arg == Poly.sym(next(iter(x))))
               for x, arg in zip(args, a.args)):
            return False  # inside an argument: a sum its value changes
    return True


def _known(values: dict) -> dict:
    return {k: v for k, v in values.items() if isinstance(v, Poly)}


def _number(p: Poly, what: str) -> int:
    c: Fraction = p.const_value()
    if c.denominator != 1:
        raise FgcError(f"{what}: size {format_poly(p)} is not a whole number")
    return int(c)


class _Sizes:
    """Sizes in the symbolic form: whole numbers, `Number`s, texts over the run lengths and
    `Text`s."""

    def __init__(self, runs: dict[str, str]):
        self.runs = tuple(sorted(runs.items()))
        self.run = {s: Poly.sym(name) for s, name in runs.items()}

    def value(self, d: Poly, what: str) -> int | Number:
        return _number(d, what) if d.is_const() else Number(d, what)

    def text(self, d: Poly) -> str | Text | None:
        """A size with run lengths as a text (a `Text` when hyperparameters are in it too);
        None when it has none."""
        if not d.symbols() & set(self.run):
            return None
        if d.symbols() <= set(self.run):
            return format_poly(d.subs(self.run))
        return Text(d, self.runs)

    def dim(self, d, what: str) -> int | str | Number | Text:
        if not isinstance(d, Poly):
            raise FgcError(f"{what}: a dimension of unknown rank (`...`)")
        text = self.text(d)
        return self.value(d, what) if text is None else text

    def dims(self, t: ir.TensorType, what: str) -> list:
        out: list = [BATCH]
        if t.family is not None:  # an input family: one tensor, its members after the batch
            out.append(self.value(t.family, what))
            t = t.member()
        return out + [self.dim(d, what) for d in t.shape]


def logits_of(model: ir.Model, functions: dict[str, ir.Function]) -> str | None:
    """The single output a Softmax computes, whose input the backends also give."""
    if len(model.outputs) != 1:
        return None
    name = model.outputs[0].name
    taken = {v.name for v in model.inputs} | {name}
    if LOGITS in taken:
        return None
    for item in model.body:
        if isinstance(item, ir.Eqn) and any(o.name == name for o in item.outs):
            if item.op == "call" and is_kind(functions.get(item.attrs["module"]), "softmax"):
                return name
    return None


def signature_form(model: ir.Model, functions: dict[str, ir.Function],
                   incremental=None, genai: bool = False) -> dict:
    """The signature (see the module's doc) of the symbolic `model` with the incremental
    form `incremental` (a passes.incremental.Incremental) or None, its sizes that depend on
    hyperparameters left as `Number`s and `Text`s: what the torch module prints over its
    `self.config`. `at` gives them values. With `genai`, the token input, the cache and
    the logits have onnxruntime-genai's names (`genai_names`)."""
    runs = run_lengths(model, functions)
    sizes = _Sizes(runs)
    inputs = []
    # padding masks last: the torch module takes them as keywords that default to None
    for v in sorted(model.inputs, key=lambda v: v.type.pad):
        t = v.type
        what = f"input `{v.name}`"
        entry: dict = {"name": v.name, "dtype": t.dtype, "dims": sizes.dims(t, what)}
        if t.dtype == "int":
            entry["lo"] = sizes.value(t.lo, what)
            entry["hi"] = sizes.value(t.hi, what)
            top = sizes.text(t.hi)
            if top is not None:  # a position: bounded by this run's length
                entry["hi_run"] = top
            entry["zero_based"] = not t.pad
            entry["perm"] = bool(t.perm)
            if t.pad:  # optional: all ones when not given; with a past, past + T wide
                entry["pad"] = True
        inputs.append(entry)
    outputs = [{"name": o.name, "dtype": o.type.dtype,
                "dims": sizes.dims(o.type, f"output `{o.name}`")} for o in model.outputs]
    of = logits_of(model, functions)
    out = {
        "inputs": inputs,
        "outputs": outputs,
        "logits": {"name": LOGITS, "of": of} if of is not None else None,
        "state": dict(state_pairs(model)),
        "max_length": {runs[s]: sizes.value(Poly.sym(s), f"run length {s}")
                       for s in sorted(runs)},
        "incremental": None,
    }
    if incremental is not None:
        cache = []
        for past, present, site, block, kind in incremental.cache():
            what = f"the cache of {'.'.join(site.path)}"
            cache.append({
                "past": past, "present": present, "kind": kind, "block": block,
                "layers": sizes.value(incremental.layer_count(site), what),
                "dims": [d if isinstance(d, str) else sizes.value(d, what)
                         for d in incremental.dims(site, kind, BATCH, PAST)]})
        out["incremental"] = {"tokens": incremental.tokens, "length": runs[incremental.length],
                              "past": PAST, "cache": cache}
    return genai_names(out, model) if genai else out


def genai_names(form: dict, model: ir.Model) -> dict:
    """The signature (form) with onnxruntime-genai's names (GENAI_NAMES) for the token input,
    the cache and the logits, so that its generic decoder (genai_config.json's type
    "decoder") runs the graph; an FgcError where it cannot: a model without the incremental
    form or logits, with inputs besides the tokens (genai feeds nothing else), or with a
    cache other than one key and one value of (batch, heads, past, width) per layer."""
    where = model.span
    inc = form["incremental"]
    if inc is None:
        raise FgcError("--genai needs the incremental form (--kv-cache): onnxruntime-genai "
                       "feeds the past keys and values back", where)
    tokens = inc["tokens"]
    length = next(i["dims"][-1] for i in form["inputs"] if i["name"] == tokens)
    padding = [i["name"] for i in form["inputs"] if i.get("pad") and i["dims"][-1] == length]
    others = [i["name"] for i in form["inputs"] if i["name"] != tokens and
              i["name"] not in padding]
    if others:
        raise FgcError(f"onnxruntime-genai's decoder feeds the token ids alone, and "
                       f"`{model.name}` also takes " + ", ".join(f"`{n}`" for n in others),
                       where, "--genai is for decoder-only models (GPT-2, LLaMA, ...)")
    if form["logits"] is None:
        raise FgcError(f"`{model.name}` has no logits (the input of a final Softmax of its "
                       "one output) for onnxruntime-genai to pick tokens from", where)
    cache = inc["cache"]
    if [(c["kind"], c["block"] > 0) for c in cache] != [("key", True), ("value", True)]:
        blocks = {c["block"] for c in cache}
        raise FgcError("onnxruntime-genai keeps one key and one value per layer of one stack "
                       f"of layers, and `{model.name}` caches {len(cache) // 2} attentions"
                       + (" outside its layers" if 0 in blocks else
                          f" in {len(blocks)} stacks of layers" if len(blocks) > 1 else
                          " per layer"), where)
    key, value = cache
    if len(key["dims"]) != 4 or _sizes(key["dims"]) != _sizes(value["dims"]):
        raise FgcError("onnxruntime-genai's cache is (batch, heads, past, head_size) for "
                       f"keys and values alike; `{model.name}` caches keys "
                       f"{_shown(key['dims'])} and values {_shown(value['dims'])}", where)
    outputs = {o["name"] for o in form["outputs"]}
    if tokens in outputs or outputs & set(GENAI_NAMES.values()):
        clash = sorted(outputs & ({tokens} | set(GENAI_NAMES.values())))
        raise FgcError(f"`{model.name}` has an output named `{clash[0]}`, which "
                       "onnxruntime-genai's names would give to another tensor", where)
    renamed = {tokens: GENAI_NAMES["tokens"], **{p: GENAI_NAMES["padding"] for p in padding}}
    return {
        **form,
        "inputs": [{**i, "name": renamed.get(i["name"], i["name"])} for i in form["inputs"]],
        "logits": {**form["logits"], "name": GENAI_NAMES["logits"]},
        "incremental": {**inc, "tokens": GENAI_NAMES["tokens"], "cache": [
            {**c, "past": GENAI_NAMES[f"past {c['kind']}"],
             "present": GENAI_NAMES[f"present {c['kind']}"]} for c in cache]},
    }


def _sizes(dims: list) -> list:
    return [d.size if isinstance(d, Number) else d for d in dims]


def _shown(dims: list) -> str:
    return "(" + ", ".join(format_poly(d) if isinstance(d, Poly) else str(d)
                           for d in _sizes(dims)) + ")"


def at(form, values: dict):
    """The signature form (or a part of it) at the configuration `values` (hyperparameter ->
    number): the plain dict, every size a number or a text."""
    if isinstance(form, (Number, Text)):
        return form.at(values)
    if isinstance(form, dict):
        return {k: at(v, values) for k, v in form.items()}
    if isinstance(form, list):
        return [at(v, values) for v in form]
    return form


def logits_alone(model: ir.Model, functions: dict[str, ir.Function]) -> list[str] | None:
    """`--outputs logits` where the model has logits (`logits_of`), else None: what a graph
    for generation computes (`fgc generate SPEC`, onnxruntime-genai), with no Softmax."""
    return [LOGITS] if logits_of(model, functions) is not None else None


def select_outputs(form: dict, names: list[str] | None) -> dict:
    """The signature (form) of a graph that computes the outputs `names` alone (`fgc
    compile --outputs`): some of the spec's outputs, and `logits` where the model has them
    (generation reads nothing else, and then no final Softmax is computed). Outputs that
    are the next call's state (`Mem'`) stay, as the cache's presents do; the rest go. An
    FgcError names an output the model does not have."""
    if names is None:
        return form
    logits = form["logits"]
    known = [o["name"] for o in form["outputs"]] + ([logits["name"]] if logits else [])
    for name in names:
        if name not in known:
            raise FgcError(f"--outputs: the model has no output `{name}` (its outputs: "
                           f"{', '.join(f'`{k}`' for k in known)})", None)
    if not names:
        raise FgcError("--outputs names no output", None)
    kept = set(names) | set(form["state"])
    out = {**form, "outputs": [o for o in form["outputs"] if o["name"] in kept]}
    if logits is None or logits["name"] not in kept:
        out["logits"] = None
    elif logits["of"] not in kept:  # the logits along the axes of what they are of
        out["logits"] = {**logits, "dims": next(o["dims"] for o in form["outputs"]
                                                if o["name"] == logits["of"])}
    return out


def signature(model: ir.Model, functions: dict[str, ir.Function], values: dict,
              incremental=None, genai: bool = False) -> dict:
    """The signature (see the module's doc) of `model` at the configuration `values`
    (hyperparameter -> number), with the incremental form `incremental` (a
    passes.incremental.Incremental) or None, and with `genai` onnxruntime-genai's names:
    what the ONNX graph stores."""
    return at(signature_form(model, functions, incremental, genai), values)
