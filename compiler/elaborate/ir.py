"""The IR: flat, typed equations over named values, grouped into functions and models.

A `Function` is one module of the standard library or of a spec; a `Model` is a spec's
model box with its prologue (the embedding), its layer loop and its epilogue (the
output). Every equation is `outs = op(ins; attrs)` with the span it came from. Types
carry symbolic dimensions (`compiler.elaborate.symbolic.Poly`), so the same IR prints with
hyperparameters left symbolic or with a preset's values.

The same classes define the IR's JSON form (`Document`, docs/architecture.md "The IR as
JSON"): each field that holds a size, an `Ell` or a real number says how it is written,
through the `Size`, `Dimension`, `Scalar` and `Member` annotations below.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict
from typing_extensions import TypedDict

from ..errors import Span
from .symbolic import Poly, format_poly, parse_poly


class _Base(BaseModel):
    """IR nodes are built by the compiler from data it has already checked, so building
    one skips validation: generating validators for every node class at import costs
    more than a whole `fgc params` run. `model_validate` and `model_dump` work as usual
    (their schemas are built on first use). An empty `[]` or `{}` default is copied for
    each node; `Field(default_factory=list)` would do the same but makes pydantic ask
    `inspect.signature(list)` on every construction (80 µs; a tenth of a preset's
    elaboration)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    def __init__(self, /, **data: Any) -> None:
        built = type(self).model_construct(**data)
        for slot in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__",
                     "__pydantic_private__"):
            object.__setattr__(self, slot, getattr(built, slot))

    # marks this __init__ as pydantic's own, so that validation (`model_validate_json`)
    # builds nested nodes itself instead of handing the raw input to this __init__
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


class Ell:
    """A run of leading dimensions of unknown rank (`...` in a signature)."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ell) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("Ell", self.name))

    def __repr__(self) -> str:
        return f"Ell({self.name})"


Dim = Poly | Ell


# ---------------------------------------------------------------- the JSON form of values
# A size is its canonical text (`12*H^2*L + V*H`, as format_poly writes it, read back by
# parse_poly); an Ell is {"ell": name}; a real number is a JSON number, or "inf", "-inf" or
# "nan" (`inf` is a keyword of the spec language, never a size's symbol). In Python
# (`model_dump()`), values stay what they are.


class InJSON:
    """`Annotated[T, InJSON(write, read, schema)]`: a T is written in JSON as `write(t)`,
    read back with `read` (else as pydantic reads a T) and described by `schema` (else as
    pydantic describes a T). What pydantic's PlainSerializer, PlainValidator and
    WithJsonSchema do, through the hook they use: importing them costs `fgc params` 1.5 ms."""

    __slots__ = ("write", "read", "schema")

    def __init__(self, write: Any, read: Any = None, schema: dict | None = None):
        self.write, self.read, self.schema = write, read, schema

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema
        written = core_schema.plain_serializer_function_ser_schema(self.write, when_used="json")
        if self.read is None:
            return {**handler(source), "serialization": written}
        return core_schema.no_info_plain_validator_function(self.read, serialization=written)

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> Any:
        return dict(self.schema) if self.schema is not None else handler(schema)

_SIZE_SCHEMA = {"type": "string", "description": "an exact size, as fgc prints it: a "
                "polynomial over hyperparameters such as `12*H^2*L + V*H` or `H/A`"}
_ELL_SCHEMA = {"type": "object", "properties": {"ell": {"type": "string"}},
               "required": ["ell"], "additionalProperties": False,
               "description": "a run of leading dimensions of unknown rank (`...`)"}
_REAL_SCHEMA = {"anyOf": [{"type": "number"}, {"enum": ["inf", "-inf", "nan"]}],
                "description": "a real number"}


def _size_in(v: Any) -> Poly:
    if isinstance(v, Poly):
        return v
    if isinstance(v, str):
        return parse_poly(v)
    raise ValueError(f"a size is written as text such as \"H/A\", not {v!r}")


def _dim_in(v: Any) -> Poly | Ell:
    if isinstance(v, Ell):
        return v
    if isinstance(v, dict):
        if set(v) != {"ell"} or not isinstance(v["ell"], str):
            raise ValueError(f"a dimension is a size or {{\"ell\": name}}, not {v!r}")
        return Ell(v["ell"])
    return _size_in(v)


def _dim_out(d: Poly | Ell) -> str | dict:
    return {"ell": d.name} if isinstance(d, Ell) else format_poly(d)


def _real_in(v: Any) -> float:
    if v in ("inf", "-inf", "nan") or (isinstance(v, (int, float)) and not isinstance(v, bool)):
        return float(v)
    raise ValueError(f"a real number is a JSON number, \"inf\", \"-inf\" or \"nan\", not {v!r}")


def _real_out(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def _scalar_in(v: Any) -> Poly | float:
    if isinstance(v, str) and v not in ("inf", "-inf", "nan"):
        return _size_in(v)
    return v if isinstance(v, Poly) else _real_in(v)


def _scalar_out(v: Poly | float) -> str | float:
    return format_poly(v) if isinstance(v, Poly) else _real_out(v)


def _member_in(v: Any) -> Poly | str:
    if isinstance(v, (str, Poly)):
        return v
    if isinstance(v, dict) and set(v) == {"size"}:
        return _size_in(v["size"])
    raise ValueError(f"a member is an index's name or {{\"size\": size}}, not {v!r}")


def _member_out(m: Poly | str) -> str | dict:
    return m if isinstance(m, str) else {"size": format_poly(m)}


Size = Annotated[Poly, InJSON(format_poly, _size_in, _SIZE_SCHEMA)]
Dimension = Annotated[Dim, InJSON(_dim_out, _dim_in, {"anyOf": [_SIZE_SCHEMA, _ELL_SCHEMA]})]
# a size where the spec has an exact one, else a real number (`eps = 1e-5`, `-inf`)
Scalar = Annotated[Poly | float, InJSON(_scalar_out, _scalar_in,
                                        {"anyOf": [_SIZE_SCHEMA, _REAL_SCHEMA]})]
# the index a `for` maps over (`W_i`: "i"), or a fixed member (`W_1`, `W_l`: {"size": "l"})
Member = Annotated[Poly | str, InJSON(_member_out, _member_in, {"anyOf": [
    {"type": "string"}, {"type": "object", "properties": {"size": _SIZE_SCHEMA},
                         "required": ["size"], "additionalProperties": False}]})]
# a set as a sorted list, and a dict by sorted keys, so that the JSON does not depend on
# the order of a set's members (which varies from run to run)
Names = Annotated[frozenset[str], InJSON(sorted)]
SpansByName = Annotated[dict[str, Span], InJSON(lambda d: dict(sorted(d.items())))]


class TensorType(_Base):
    """A real, integer or boolean tensor; integers may carry their range `lo..hi`."""

    dtype: Literal["real", "int", "bool"] = "real"
    shape: tuple[Dimension, ...] = ()
    lo: Size | None = None
    hi: Size | None = None
    perm: bool = False  # a permutation of lo..hi
    pad: bool = False  # a padding mask (Pad[n]): 1 where a token is, 0 where padding is
    neg_inf: bool = False  # may hold -inf (a mask): multiplying by it is a mistake
    taint: Names = frozenset()  # inputs of the enclosing module this value carries
    family: Size | None = None  # number of members when the value is an indexed family

    def member(self) -> TensorType:
        return self.model_copy(update={"family": None})

    def with_shape(self, shape: tuple) -> TensorType:
        return self.model_copy(update={"shape": tuple(shape)})

    def __str__(self) -> str:
        return format_type(self)


def format_dim(d: Any) -> str:
    if isinstance(d, Ell):
        return "..."
    return format_poly(d)


def format_type(t: TensorType) -> str:
    dims = ", ".join(format_dim(d) for d in t.shape)
    if t.perm:
        base = f"Perm[{format_dim(t.hi)}]"
    elif t.pad:
        base = f"Pad[{dims}]"
    elif t.dtype == "int":
        rng = f"{{{format_dim(t.lo)}..{format_dim(t.hi)}}}" if t.lo is not None else "Z"
        base = rng + (f"^({dims})" if len(t.shape) > 1 else f"^{dims}" if t.shape else "")
    elif t.dtype == "bool":
        base = f"B[{dims}]"
    else:
        base = f"R[{dims}]"
    if t.family is not None:
        base += f" for 1..{format_dim(t.family)}"
    return base


class Layout(_Base):
    """Where a value's axes are in every backend, and how its integers are held: decided
    once by the lowering (lowering/layout.py) and printed by each backend as it is.

    A value's tensor has `lead` axes first (the batch, and the family axes of the module
    uses it is computed in), then its own family axis when `fam` (the heads of multi-head
    attention, computed together), then its `rank` own dimensions (None where `...` stands
    for some). An integer is held as its spec value minus `held` (ids from 1 held 0-based,
    so that indexing and row lookups read them as they are); None: as it is."""

    lead: bool = False
    fam: bool = False
    rank: int | None = 0
    held: Size | None = None


class Value(_Base):
    name: str
    type: TensorType
    layout: Layout | None = None  # after the lowering


class Operand(_Base):
    """A value by name, a constant, or one member (or all members) of a family."""

    name: str | None = None
    const: Scalar | None = None
    member: Member | None = None
    whole_family: bool = False

    def __str__(self) -> str:
        if self.name is None:
            c = self.const
            return format_poly(c) if isinstance(c, Poly) else repr(c)
        if self.whole_family:
            return f"{self.name}[*]"
        if self.member is not None:
            m = self.member if isinstance(self.member, str) else format_poly(self.member)
            return f"{self.name}[{m}]"
        return self.name


class Guard(_Base):
    """A static condition on the layer index under which an equation exists."""

    text: str  # as written, e.g. "l is even"
    positive: bool = True

    def __str__(self) -> str:
        return self.text if self.positive else f"not ({self.text})"


class Attrs(TypedDict, total=False):
    """An equation's attributes; which an op has is up to the op (`call`: module, label,
    bindings, instance). Declared in the order the elaborator writes them, which is the
    order validation gives them back in."""

    # a key not declared below travels as plain JSON (a Poly there fails to serialize),
    # rather than vanish: an op that gains an attribute declares it here
    __pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[misc]

    module: str  # call: the module called
    label: str | None  # call: the instance's name as written (`attn: Attention(...)`)
    bindings: dict[str, Scalar]  # call: the module's hyperparameters
    instance: str  # call: the instance's name, written or made up
    shape: tuple[Dimension, ...]  # broadcast_to
    size: Size  # iota, members
    axis: int  # iota, members
    rank: int  # iota
    counts: list[Size | None]  # concat: members of each whole-family argument
    kinds: list[str]  # index: how each axis is indexed
    guard: str  # cond: the condition on the layer index, as written
    causal: bool  # mask, mask_tensor (lowering/masks.py): keys after the query are -inf
    bias: bool  # mask_tensor: the mask it makes a tensor of has an additive part
    window: Size  # mask: a causal window's width (Mask^ST: i sees i-w+1 .. i)
    banded: bool  # mask_tensor: the mask is a window, its operand the width
    groups: Size  # call of attention (lowering/families.py): the key/value member each
    # member reads, its keys and values given as whole families (grouped-query attention)
    masks: dict[str, str]  # call, after the lowering: the mask each input taken by meaning
    # is given ("causal", "none", "causal+bias", or "=X": what this use's own input X is)
    lo: Size  # lookup (lowering/lookups.py): the id of the table's first row
    index: Size  # gather_members (lowering/families.py): the member read, in the family
    # index (`floor((i - 1) * G / A) + 1` for member i)
    k: Size  # keeptopk: how many entries of the last axis are kept
    keep: bool  # members (lowering/families.py): the axis stays, of size 1 (`g[:, e .. e]`)


class Eqn(_Base):
    outs: list[Value]
    op: str
    ins: list[Operand]
    attrs: Attrs = {}
    family: tuple[str, Size] | None = None  # mapped over (index, size)
    guards: list[Guard] = []
    span: Span | None = None


class Param(_Base):
    name: str  # family members share one name: "W^Q" declared as W_i^Q
    type: TensorType  # .family set for indexed families
    span: Span | None = None
    declared: str = ""  # the name as written
    init: str = "normal"  # normal | zeros | ones: how it starts when no weights are given
    # a family stored with its axis first (names.family_layout): set for the families an
    # intrinsic reads one member at a time (intrinsics.Intrinsic.members_first)
    members_first: bool = False


class Hyper(_Base):
    name: str
    default: Scalar | None = None
    span: Span | None = None
    text: str = ""  # the default as written


class Function(_Base):
    name: str
    hypers: list[Hyper]
    inputs: list[Value]
    params: list[Param]
    eqns: list[Eqn]
    outputs: list[Value]
    span: Span | None = None
    builtin: bool = False  # from the standard library
    mask_products: SpansByName = {}  # input -> span of a `*` it reaches
    # set by the lowering (lowering/masks.py): input -> the kind of mask its calls pass it
    # by meaning ("none", "causal", "causal+bias", or "per_use": each call's `masks`
    # attribute says); absent: the input is a tensor
    mask_inputs: dict[str, str] = {}


class Carried(_Base):
    """A value threaded through the layers: X^(0) before, X^(l-1) -> X^(l) inside."""

    name: str
    init: str  # value name holding X^(0)
    inner: str  # value name of X^(l-1) inside the body
    result: str  # value name of X^(l) at the end of the body


class Loop(_Base):
    var: str
    lo: Size
    hi: Size
    body: list[Eqn]
    carried: list[Carried]
    shared: list[str] = []
    results: list[tuple[str, str]] = []  # (X^(l), X^(L)): the last
    # layer's value of X^(l) is X^(L) after the layers
    stacks: list[tuple[str, str]] = []  # (X^(l), X^(1..L)) or
    # (X^(l-1), X^(0..L-1)): every layer's value, stacked on a new first axis
    span: Span | None = None


class SharedWith(_Base):
    """`share W_e, ln with "other.fgpt"`: parameters this model has in common with another
    spec's model (ELECTRA's generator and discriminator), counted once when both are."""

    spec: str  # as written, relative to the declaring file's folder
    names: list[str]  # model parameters and instances outside the layers
    span: Span | None = None
    spec_span: Span | None = None


class Model(_Base):
    name: str
    hypers: list[Hyper] = []
    inputs: list[Value]
    params: list[Param]
    body: list[Eqn | Loop]  # equations before the layers are the embedding
    outputs: list[Value]
    param_uses: dict[str, list[str]] = {}  # param -> sections
    span: Span | None = None
    shared_with: list[SharedWith] = []


class Document(_Base):
    """The JSON form of an elaborated model: `fgc ir --format json` writes one, and
    `Document.model_validate_json` reads it back into the same IR. `functions` holds the
    modules the model calls, each after those it calls itself (see `used_modules`)."""

    format: Literal["fgc-ir"] = "fgc-ir"
    version: Literal[1] = 1  # raised when a change would misread an older file
    model: Model
    functions: dict[str, Function] = {}

    @classmethod
    def of(cls, model: Model, functions: dict[str, Function]) -> Document:
        return cls(model=model, functions={name: functions[name]
                                           for name in used_modules(model, functions)
                                           if name in functions})


def sequence_symbols(model: Model, functions: dict[str, Function] | None = None) -> set[str]:
    """The sizes that vary from run to run: the length of token ids and permutations, and
    every axis but the last (the features) of a real input. Loop bounds and family sizes
    stay fixed: they decide the structure of the computation; so do the widths of
    parameters (with `functions`: every size of a module's parameters, and the last axis
    of the model's, whose other axes may be positions)."""
    fixed = {s for item in model.body if isinstance(item, Loop)
             for b in (item.lo, item.hi) if isinstance(b, Poly) for s in b.symbols()}
    eqns = [e for item in model.body for e in (item.body if isinstance(item, Loop) else [item])]
    fixed |= {s for e in eqns if e.family is not None and isinstance(e.family[1], Poly)
              for s in e.family[1].symbols()}
    fixed |= {s for p in model.params if isinstance(p.type.family, Poly)
              for s in p.type.family.symbols()}
    if functions is not None:
        fixed |= _parameter_sizes(model, functions)
    out: set[str] = set()
    for v in model.inputs:
        t = v.type
        if t.family is not None and isinstance(t.family, Poly):
            fixed |= t.family.symbols()
        axes = t.shape if t.dtype != "real" else t.shape[:-1]
        for d in axes:
            if isinstance(d, Poly):
                out |= d.symbols()
    return out - fixed


def _parameter_sizes(model: Model, functions: dict[str, Function]) -> set[str]:
    """The model's symbols that size a parameter's features: a module parameter's every
    axis, through the bindings of each use, and a model parameter's last axis."""
    out: set[str] = set()
    for p in model.params:
        if p.type.shape and isinstance(p.type.shape[-1], Poly):
            out |= p.type.shape[-1].symbols()
    seen: set[tuple] = set()

    def visit(eqns: list[Eqn], subst: dict) -> None:
        for e in eqns:
            if e.op != "call" or e.attrs["module"] not in functions:
                continue
            fn = functions[e.attrs["module"]]
            inner = {k: v.subs(subst) if isinstance(v, Poly) else v
                     for k, v in e.attrs.get("bindings", {}).items()}
            for p in fn.params:
                for d in (*p.type.shape, p.type.family):
                    if isinstance(d, Poly):
                        sized = d.subs({k: v for k, v in inner.items() if isinstance(v, Poly)})
                        out.update(sized.symbols())
            key = (fn.name, tuple(sorted((k, str(v)) for k, v in inner.items())))
            if key not in seen:
                seen.add(key)
                visit(fn.eqns, inner)
    for item in model.body:
        visit(item.body if isinstance(item, Loop) else [item], {})
    return out


def state_pairs(model: Model) -> list[tuple[str, str]]:
    """(output, input) for each output that is the next value of an input: `Mem'` of `Mem`.
    A caller feeds such an output back as that input on its next call (a recurrent state,
    Transformer-XL's memory)."""
    inputs = {v.name for v in model.inputs}
    return [(o.name, o.name[:-1]) for o in model.outputs
            if o.name.endswith("'") and o.name[:-1] in inputs]


def used_modules(model: Model, functions: dict[str, Function]) -> list[str]:
    """The modules a model calls, directly or through other modules, each after the
    modules it calls itself (the order a reader meets their definitions)."""
    seen: list[str] = []

    def visit(eqns: list[Eqn]) -> None:
        for e in eqns:
            if e.op == "call":
                name = e.attrs["module"]
                fn = functions.get(name)
                if fn is not None and name not in seen:
                    visit(fn.eqns)
                if name not in seen:
                    seen.append(name)
    for item in model.body:
        visit(item.body if isinstance(item, Loop) else [item])
    return seen
