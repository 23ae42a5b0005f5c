"""The IR: flat, typed equations over named values, grouped into functions and models.

A `Function` is one module of the standard library or of a spec; a `Model` is a spec's
model box with its prologue (the embedding), its layer loop and its epilogue (the
output). Every equation is `outs = op(ins; attrs)` with the span it came from. Types
carry symbolic dimensions (`compiler.symbolic.Poly`), so the same IR prints with
hyperparameters left symbolic or with a preset's values.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from .errors import Span
from .symbolic import Poly, format_poly


class _Base(BaseModel):
    """IR nodes are built by the compiler from data it has already checked, so building
    one skips validation: generating validators for every node class at import costs
    more than a whole `fgc params` run. `model_validate` and `model_dump` work as usual
    (their schemas are built on first use). An empty `[]` or `{}` default is copied for
    each node; `Field(default_factory=list)` would do the same but makes pydantic ask
    `inspect.signature(list)` on every construction (80 µs; a tenth of a preset's
    elaboration)."""

    model_config = ConfigDict(arbitrary_types_allowed=True, defer_build=True)

    def __init__(self, /, **data: Any) -> None:
        built = type(self).model_construct(**data)
        for slot in ("__dict__", "__pydantic_fields_set__", "__pydantic_extra__",
                     "__pydantic_private__"):
            object.__setattr__(self, slot, getattr(built, slot))


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


class TensorType(_Base):
    """A real, integer or boolean tensor; integers may carry their range `lo..hi`."""

    dtype: Literal["real", "int", "bool"] = "real"
    shape: tuple[Any, ...] = ()  # Dim
    lo: Any = None  # Poly | None
    hi: Any = None
    perm: bool = False  # a permutation of lo..hi
    neg_inf: bool = False  # may hold -inf (a mask): multiplying by it is a mistake
    taint: frozenset = frozenset()  # inputs of the enclosing module this value carries
    family: Any = None  # Poly: number of members when the value is an indexed family

    def member(self) -> TensorType:
        return self.model_copy(update={"family": None})

    def with_shape(self, shape: tuple) -> TensorType:
        return self.model_copy(update={"shape": tuple(shape)})

    def __str__(self) -> str:
        return format_type(self)


def format_dim(d: Any) -> str:
    if isinstance(d, Ell):
        return "..."
    text = format_poly(d)
    return text


def format_type(t: TensorType) -> str:
    dims = ", ".join(format_dim(d) for d in t.shape)
    if t.perm:
        base = f"Perm[{format_dim(t.hi)}]"
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


class Value(_Base):
    name: str
    type: TensorType


class Operand(_Base):
    """A value by name, a constant, or one member (or all members) of a family."""

    name: str | None = None
    const: Any = None  # Poly (exact) or float
    member: Any = None  # Poly index of a family member, or the name of a family index
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


class Eqn(_Base):
    outs: list[Value]
    op: str
    ins: list[Operand]
    attrs: dict[str, Any] = {}
    family: tuple[str, Any] | None = None  # mapped over (index, size)
    guards: list[Guard] = []
    span: Span | None = None


class Param(_Base):
    name: str  # family members share one name: "W^Q" declared as W_i^Q
    type: TensorType  # .family set for indexed families
    span: Span | None = None
    declared: str = ""  # the name as written


class Hyper(_Base):
    name: str
    default: Any = None  # Poly | float | None
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
    mask_products: dict[str, Any] = {}  # input -> span of a `*` it reaches


class Carried(_Base):
    """A value threaded through the layers: X^(0) before, X^(l-1) -> X^(l) inside."""

    name: str
    init: str  # value name holding X^(0)
    inner: str  # value name of X^(l-1) inside the body
    result: str  # value name of X^(l) at the end of the body


class Loop(_Base):
    var: str
    lo: Any
    hi: Any
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


def sequence_symbols(model: Model, functions: dict[str, Function] | None = None) -> set[str]:
    """The sizes that vary from run to run: the length of token ids and permutations, and
    every axis but the last (the features) of a real input. Loop bounds and family sizes
    stay fixed: they decide the structure of the computation; so do the widths of
    parameters (with `functions`: every size of a module's parameters, and the last axis
    of the model's, whose other axes may be positions)."""
    fixed = {s for item in model.body if isinstance(item, Loop)
             for b in (item.lo, item.hi) if isinstance(b, Poly) for s in b.symbols()}
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
