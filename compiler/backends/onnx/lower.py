"""Lowering the checked IR straight to an ONNX graph (no tracing through torch).

Every module use is inlined and the layer loop unrolled, so each layer's parameters are
initializers named by their path (`layer3/attn/W_Q`) and each node carries the spec line
it computes. Values carry *roles*: the leading axes a value has beyond the spec's own
dimensions — the batch, and one axis per indexed family it belongs to (the heads). Two
values meet by aligning roles (an Unsqueeze where one lacks an axis), then by numpy
broadcasting on their own dimensions, as the spec's shapes say.

Sizes are exact: every hyperparameter is a number except the sequence length, which is
read from the input's shape at run time (`T`), so batch and sequence axes stay dynamic.

Standard ONNX first: LayerNormalization, Gelu (opset 20), RMSNormalization (opset 23),
Swish (opset 24 only), the Attention op (opset 23, with `is_causal` for Mask^AR),
RotaryEmbedding (opset 23) and one GEMM for all heads of a projection. With
`optimize="ort"` the same decisions emit onnxruntime's fused operators instead
(GroupQueryAttention, Attention/MultiHeadAttention, SkipLayerNormalization,
SkipSimplifiedLayerNormalization, FastGelu for the tanh GELU and BiasGelu only for the erf
one, QuickGelu for SiLU, its own RotaryEmbedding), chosen here from the IR, never by
matching patterns in a finished graph.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

from runtime.signature import cache_tensors, expand_cache

from ...elaborate import ir
from ...elaborate.elaborator import guard_holds
from ...elaborate.intrinsics import intrinsic
from ...elaborate.ir import Ell, Eqn, Operand, sequence_symbols
from ...elaborate.symbolic import Atom, Poly, format_poly, real_value
from ...lazy import Lazy
from ...lowering import prepare
from ...lowering.families import has_params, in_order, picks
from ...lowering.layers import invariant
from ...lowering.layout import shifted
from ...lowering.masks import site_kinds
from ...lowering.precision import FLOAT32, Precision, in_float32
from ...lowering.products import groups
from ...lowering.rotary import Rotary, frequencies, magnitude, rotary
from ...lowering.signature import LOGITS, PAST, by_position, run_lengths, select_outputs, signature
from ...names import family_layout, ident
from ...passes import padding
from ...passes.incremental import Incremental, derive
from .graph import ORT_DOMAIN, Graph, Joined, Node
from .quantize import Quantization, Quantizer

DEFAULT_OPSET = 23
MIN_OPSET = 18
MAX_OPSET = 25
SPEC_VALUE = ir.Layout()  # integers as the spec's values
CONST_LIMIT = 64 * 1024  # bytes: a larger table of indices is a Range, made at run time
# bytes (float32): rotary tables of every position the incremental form reaches are stored
# up to this size (131,072 positions of a 128-wide head: 64 MiB), else computed each step
TABLES_MAX = 256 * 1024 * 1024


class Unsupported(Exception):
    """A construct the ONNX backend does not lower; carries a user-facing message and the
    span of the innermost equation it was found in."""

    span = None


@dataclass(eq=False)
class Role:
    """A leading axis: the batch, or the members of one indexed family."""

    order: int  # roles sort by nesting: the batch first, outer families before inner
    size: Poly
    label: str


@dataclass(eq=False)
class V:
    """A lowered value. `name` is the tensor in canonical layout (roles, then own dims);
    a family value may instead (or also) exist `packed`: its family axis merged into the
    last own axis, as Concat(head_1, ..., head_A) lays it out."""

    dtype: str  # real | int | bool
    roles: tuple[Role, ...]
    own: tuple[Poly, ...]
    name: str | None = None
    offset: int = 0  # integers: the spec's value is stored + offset (ids are 0-based)
    fam: Role | None = None  # the value's own family axis (one of roles)
    packed: str | None = None
    kind: str | None = None  # proj, cache: lowered lazily
    lazy: object = None  # kind-specific data
    stored: str | None = None  # a family of matrices as stored: family_layout order


def _int(p: Poly) -> int:
    c = p.const_value()
    if c.denominator != 1:
        raise Unsupported(f"size {format_poly(p)} is not a whole number")
    return int(c)


def dim_text(p: Poly) -> int | str:
    return _int(p) if p.is_const() else format_poly(p)


@dataclass(eq=False)
class Join:
    """A grouped product as `_join` made it: one MatMul by the weights side by side, then a
    Split; `settle_products` keeps it or makes the products apart."""
    product: Node
    split: Node
    x: str  # the operand
    weights: str  # the joined initializer
    label: str
    parts: list[tuple[str, object, str]]  # per product: its initializer, as a matrix, label


class Scope:
    def __init__(self, fn: ir.Function | None, env: dict, penv: dict, path: str,
                 layer: int | None, numeric: dict):
        self.fn = fn
        self.env = env  # symbol -> Poly over run-time sizes (or float for reals)
        self.penv = penv  # symbol -> Poly, every size a number: parameters' stored shapes
        self.path = path
        self.layer = layer
        self.numeric = numeric  # numbers for guards
        self.vals: dict[str, V] = {}
        self.roles: dict[str, Role] = {}
        self.params: dict[str, ir.Param] = {p.name: p for p in (fn.params if fn else [])}
        self.shared: set[str] = set()  # module uses shared by every layer
        self.caller: Scope | None = None  # the scope of the call that inlines this one
        self.ells: dict[str, tuple] = {}  # `...` in the signature -> the dims it stands for
        self.masks: dict = {}  # input -> the MaskKind this use gives it (lowering/masks.py)
        self.joined: dict[str, dict[str, V] | None] = {}  # grouped products (Lowerer.
        # grouped_product), by the group's first


class Lowerer:
    def __init__(self, spec, cfg, values: dict, opset: int = DEFAULT_OPSET,
                 optimize: str | None = None, weights: dict | None = None, seed: int = 0,
                 preset: str | None = None, kv_cache: bool = False,
                 precision: Precision = FLOAT32, quantize: Quantization | None = None,
                 genai: bool = False, outputs: list[str] | None = None):
        if not MIN_OPSET <= opset <= MAX_OPSET:
            raise Unsupported(f"opset {opset} is not supported; choose {MIN_OPSET} to "
                              f"{MAX_OPSET}")
        self.spec = spec
        # the IR with the shared lowering's operations (compiler/lowering)
        self.model, self.functions = prepare(cfg.model, cfg.functions)
        self.values = values
        self.opset = opset
        self.optimize = optimize
        self.weights = weights
        self.seed = seed
        self.preset = preset
        # the real values' type (--dtype); what stays float32 is lowering/precision.py's
        self.precision = precision
        self.g = Graph(precision.onnx)
        # --quantize: products by weights read their blocks (quantize.py)
        self.quantizer = Quantizer(self.g, quantize) if quantize is not None else None
        self.weight_inits: set[str] = set()  # the parameters' initializers
        self.family_docs: dict[str, str] = {}  # a family parameter's doc, its layout aside
        self.sources = spec.sources
        self.roles = 0
        self.batch = self._role(Poly.sym("batch"), "batch")
        self.params: dict[str, str] = {}  # full parameter path -> initializer
        self.memo: dict[tuple, list[V]] = {}
        self.dynamic: dict[str, tuple[str, int]] = {}  # size symbol -> (input, axis)
        self.runtime: dict[str, str] = {}  # run-time size symbol -> int64[1] tensor
        self.logits_of: dict[int, V] = {}  # id(Softmax result) -> its input
        # the incremental form (kv_cache): past keys and values in, present ones out
        self.inc: Incremental | None = derive(cfg.model, cfg.functions) if kv_cache else None
        self.genai = genai  # onnxruntime-genai's names (lowering/signature.py, GENAI_NAMES)
        self.selected = outputs  # the outputs computed (--outputs; None: all of them)
        if self.inc is not None and PAST in {h.name for h in self.model.hypers}:
            raise Unsupported(f"a hyperparameter named `{PAST}`: the incremental form's axis "
                              "of earlier positions has that name; rename the hyperparameter")
        self.sites: dict[str, tuple[str, str, str, str]] = {}  # attention path -> past k, v,
        # present k, v
        self.presents: dict[str, str] = {}  # present name -> tensor
        self.generated: str | None = None  # run-time name of the generated length
        # tensors every layer reads alike (causal tables, rotary position ids), made once
        self.shared_tables: dict[tuple, object] = {}
        # under --optimize ort, a rotary operator's packed output -> (its packed input, the
        # rotation): a GroupQueryAttention reading both q and k so turns them itself
        self.turned: dict[str, tuple[str, Rotary]] = {}
        self.groups: dict[str, dict] = {}  # module -> its grouped products (lowering.products)
        self.joins: list[Join] = []  # as `_join` made them, settled at the end
        # Pad inputs (passes/padding.py): the attentions over their positions mask padded
        # keys, and tables along them are read at the tokens' positions
        self.padding = padding.derive(cfg.model, cfg.functions)
        self.pad_sites: dict[str, str] = {}  # attention path (without its layer) -> input
        self.explicit = {p.input for p in self.padding.inputs if p.explicit} \
            if self.padding is not None else set()
        for p in self.padding.inputs if self.padding is not None else []:
            for site in p.sites:
                self.pad_sites["/".join(ident(x) for x in site.path)] = p.input
        self.pad_masks: dict[str, str] = {}  # Pad input -> its graph tensor
        # cached attentions that may read the past from a buffer of the longest length and
        # write the present into it (GroupQueryAttention counting keys by the padding mask)
        self.shareable: set[str] = set()
        self.pad_runs: dict[str, str] = {}  # run length (`T`) -> the Pad input along it

    # ---------------------------------------------------------------- helpers
    def _role(self, size: Poly, label: str) -> Role:
        self.roles += 1
        return Role(self.roles, size, label)

    def where(self, e: Eqn | None) -> None:
        if e is None or e.span is None:
            return
        text = self.sources.line(e.span.file, e.span.line) or ""
        file = e.span.file.rsplit("/", 1)[-1]
        self.g.doc = f"{file}:{e.span.line}: {text.strip()}"

    def dims(self, v: V) -> list:
        if v.name is None and v.packed is not None:
            return self.packed_dims(v)
        return [dim_text(r.size) for r in v.roles] + [dim_text(d) for d in v.own]

    def packed_dims(self, v: V) -> list:
        roles = [r for r in v.roles if r is not v.fam]
        last = v.fam.size * v.own[-1]
        return [dim_text(r.size) for r in roles] + [dim_text(d) for d in v.own[:-1]] + \
            [dim_text(last)]

    def info(self, name: str, v: V, packed: bool = False) -> None:
        self.g.info(name, v.dtype, self.packed_dims(v) if packed else self.dims(v))

    def batch_dim(self):
        return dim_text(self.batch.size)

    # ---------------------------------------------------------------- padding
    def pad_of(self, rows: Poly) -> str | None:
        """The Pad input of the positions a run-time size runs along, if any."""
        return self.pad_runs.get(format_poly(rows)) if self.pad_runs else None

    def positions(self, pad: str, rows: Poly) -> str:
        """Each of this call's tokens' position in its row without padding, (batch, T)
        int64: cumsum of the mask - 1 (0 at padding before the first token), its last T
        columns (after the past's, in the incremental form). Made once."""
        key = ("positions", pad)
        if key not in self.shared_tables:
            label = f"{pad}/positions"
            mask = self.pad_masks[pad]
            ranks = self.g.op("Sub", [self.g.op("CumSum", [mask, self.g.const(1, "int")],
                                                f"{label}/count"),
                                      self.g.const(1, "int")], f"{label}/ranks")
            ranks = self.g.op("Max", [ranks, self.g.const(0, "int")], f"{label}/ranks")
            last = self.g.op("Neg", [self.size(rows)], f"{label}/from")
            self.shared_tables[key] = self.g.op(
                "Slice", [ranks, last, self.g.ints([2**62]), self.g.ints([1])], label)
            self.g.info(self.shared_tables[key], "int", [self.batch_dim(), dim_text(rows)])
        return self.shared_tables[key]

    def key_padding(self, pad: str, rows: Poly, cols: Poly) -> V:
        """The keys' padding as an additive mask, (batch, rows, cols): 0 at a token, the
        lowest number of the model's type at padding (finite: a padded query, which sees
        no token, stays a number; at a token's query padding weighs exactly 0). Made
        once per shape."""
        key = ("key padding", pad, str(rows), str(cols))
        if key not in self.shared_tables:
            label = f"{pad}/keys"
            low = float(np.finfo(np.float16 if self.precision.half else np.float32).min)
            hidden = self.g.op("Equal", [self.pad_masks[pad], self.g.const(0, "int")],
                               f"{label}/hidden")
            bias = self.g.op("Where", [hidden, self.g.const(low, "real"),
                                       self.g.const(0.0, "real")], label)
            bias = self.g.op("Unsqueeze", [bias, self.g.ints([1])], label)  # (B, 1, cols)
            # (the mask's width: with a shared past buffer, the keys are not the past's)
            shape = self.g.op("Concat", [self.g.ints([1]), self.size(rows), self.g.ints([1])],
                              f"{label}/shape", axis=0)
            bias = self.g.op("Expand", [bias, shape], label)
            v = V("real", (self.batch,), (rows, cols), name=bias)
            self.info(bias, v)
            self.shared_tables[key] = v
        return self.shared_tables[key]

    def size(self, p: Poly) -> str:
        """An int64[1] tensor holding a size (a constant, or computed from T)."""
        if p.is_const():
            return self.g.ints([_int(p)])
        if p.degree() > 1:
            raise Unsupported(f"a size {format_poly(p)} of degree > 1 in the sequence length")
        out = None
        for mono, coef in sorted(p.terms.items(), key=lambda kv: str(kv[0])):
            if coef.denominator != 1:
                raise Unsupported(f"size {format_poly(p)} is not a whole number")
            if not mono:
                term = self.g.ints([int(coef)])
            else:
                ((s, _),) = mono
                term = self.atom_size(s) if isinstance(s, Atom) else self.runtime_size(s)
                if coef != 1:
                    term = self.g.op("Mul", [term, self.g.ints([int(coef)])], "size/mul")
            out = term if out is None else self.g.op("Add", [out, term], "size/add")
        return out

    def scalar_size(self, p: Poly) -> str:
        if p.is_const():
            return self.g.const(_int(p), "int")
        return self.g.op("Squeeze", [self.size(p), self.g.ints([0])], "size/scalar")

    def atom_size(self, a: Atom) -> str:
        """max(...) / min(...) of sizes that depend on the run's lengths (the last m rows of
        a memory that may be shorter than m), and their remainders and whole quotients (a
        length padded to a multiple of a chunk: `T + (c - T % c) % c`)."""
        op = {"max": "Max", "min": "Min", "mod": "Mod", "div": "Div"}.get(a.op)
        if op is None:
            raise Unsupported(f"a size `{a}` that depends on the sequence length")
        # sizes are not negative, so Div's truncation is the floor and Mod (fmod=0) is %
        return self.g.op(op, [self.size(x) for x in a.args], f"size/{a.op}")

    def runtime_size(self, s: str) -> str:
        """The int64[1] tensor of a run-time length, read once off the input that has it."""
        if s not in self.runtime:
            inp, axis = self.dynamic[s]
            saved = self.g.doc
            self.g.doc = "the run's sequence length"
            self.runtime[s] = self.g.op("Shape", [inp], s, start=axis, end=axis + 1)
            self.g.doc = saved
        return self.runtime[s]

    def shape_of(self, sizes: list[Poly]) -> str:
        if all(p.is_const() for p in sizes):
            return self.g.ints([_int(p) for p in sizes])
        return self.g.op("Concat", [self.size(p) for p in sizes], "shape", axis=0)

    def own(self, t, scope: Scope) -> tuple[Poly, ...]:
        """A type's dimensions in a scope, `...` expanded to what it stands for."""
        t = t.member() if t.family is not None else t
        out: list = []
        for d in t.shape:
            if isinstance(d, Ell):
                if d.name not in scope.ells:
                    raise Unsupported("a `...` whose dimensions are not known here")
                out.extend(scope.ells[d.name])
            else:
                out.append(self.ev(d, scope.env))
        return tuple(out)

    def ev(self, x, env: dict):
        """A size or constant in a scope: Poly over run-time sizes, or a float."""
        if isinstance(x, float):
            return x
        if isinstance(x, (int, Fraction)):
            return Poly.const(x)
        out = x.subs({k: v for k, v in env.items() if isinstance(v, Poly)})
        reals = {k: v for k, v in env.items() if isinstance(v, float)}
        if out.symbols() & reals.keys():
            number = real_value(out, reals)
            if number is None:  # exact arithmetic on an infinite real, say
                raise Unsupported(f"{format_poly(x)} has no number from the real "
                                  "hyperparameters here")
            return number
        return out

    # ---------------------------------------------------------------- parameters
    def param_array(self, key: str, p: ir.Param, shape: tuple[int, ...]) -> np.ndarray:
        if self.weights is not None:
            if key not in self.weights:
                raise Unsupported(f"the weights give no tensor for `{key}`")
            arr = self.weights[key]
            if tuple(arr.shape) != shape:
                raise Unsupported(f"`{key}` has shape {list(arr.shape)}, expected {list(shape)}")
            # a checkpoint's tensor stays Lazy: read when written, one at a time
            return arr if isinstance(arr, Lazy) else np.ascontiguousarray(arr, np.float32)
        if p.init == "ones":
            return np.ones(shape, np.float32)
        if p.init == "zeros":
            return np.zeros(shape, np.float32)
        digest = hashlib.sha256(f"{self.seed}/{key}".encode()).digest()
        seed = int.from_bytes(digest[:8], "little")

        def normal() -> np.ndarray:  # the same values at each materialization
            rng = np.random.default_rng(seed)
            return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
        return Lazy(shape, normal)

    def param(self, scope: Scope, name: str, role: Role | None) -> V:
        p = scope.params[name]
        key = f"{scope.path}/{ident(p.name)}" if scope.fn is not None else ident(p.name)
        t = p.type
        dims = [self.ev(d, scope.penv) for d in t.shape]
        fam = self.ev(t.family, scope.penv) if t.family is not None else None
        if key not in self.params:
            stored = [_int(d) for d in dims]
            if fam is not None:
                stored = family_layout(stored, _int(fam), p.members_first)
            arr = self.param_array(key, p, tuple(stored))
            what = f"{p.declared or p.name}: R[{', '.join(format_poly(d) for d in t.shape)}]"
            if fam is not None:
                self.family_docs[key] = what = f"{what} for each of {_int(fam)}"
                what += f", stored {tuple(stored)}"
            self.params[key] = self.g.initializer(key, arr, what)
            self.weight_inits.add(self.params[key])
        init = self.params[key]
        run_dims = [self.ev(d, scope.env) for d in t.shape]
        if fam is None:
            v = V("real", (), tuple(run_dims), name=init)
            return self._slice_dynamic(v, dims, run_dims)
        if any(not d.is_const() for d in run_dims):
            raise Unsupported(f"family parameter `{name}` sized by the sequence length")
        role = role or self._role(fam, name)
        if len(dims) < 2 or p.members_first:  # (A, D), (E, F, H): the family axis is first
            return V("real", (role,), tuple(run_dims), fam=role, name=init)
        return V("real", (role,), tuple(run_dims), fam=role, stored=init)

    def _slice_dynamic(self, v: V, stored: list, run: list) -> V:
        """A parameter sized by the context length n is used up to the run's length T;
        along padded positions, each token's row (batch, T, ...)."""
        cut = [k for k, (a, b) in enumerate(zip(stored, run)) if a != b]
        if not cut:
            return v
        pads = [self.pad_of(run[k]) for k in cut]
        if any(pads):
            if cut != [0] or v.roles:
                raise Unsupported("a padded table of positions along an axis other than "
                                  "its first")
            out = self.g.op("Gather", [v.name, self.positions(pads[0], run[0])],
                            f"{v.name}[positions]", axis=0)
            nv = replace(v, roles=(self.batch,), name=out)
            self.info(out, nv)
            return nv
        ends = [self.size(self.from_past(run[k]) + run[k]) for k in cut]
        ends_t = ends[0] if len(ends) == 1 else self.g.op("Concat", ends, "ends", axis=0)
        firsts = [self.from_past(run[k]) for k in cut]
        starts = self.g.ints([0] * len(cut)) if all(f.is_const() for f in firsts) else \
            self.g.op("Concat", [self.size(f) for f in firsts], "starts", axis=0)
        out = self.g.op("Slice", [v.name, starts, ends_t, self.g.ints(cut)],
                        f"{v.name}[:T]")
        nv = replace(v, name=out)
        self.info(out, nv)
        return nv

    def from_past(self, d: Poly) -> Poly:
        """Where a size's positions begin: after the past for the generated length of
        the incremental form (a table of positions is read from row P on), else at 0."""
        if by_position(d, self.generated):
            return Poly.sym(PAST)
        return Poly.const(0)

    def canonical(self, v: V) -> V:
        """The value with a tensor in canonical layout (lowering any lazy form)."""
        if v.name is not None:
            return v
        if v.kind == "proj" and v.packed is None:
            self.project(v)
        if v.kind == "cache":  # the past's keys or values, then this call's
            past, new, present = v.lazy
            new = self.canonical(new)
            v.name = self.g.op("Concat", [past, new.name], present, axis=len(new.roles))
            self.presents[present] = v.name
            self.info(v.name, v)
            return v
        if v.packed is not None:
            roles = [r for r in v.roles if r is not v.fam]
            k = v.roles.index(v.fam)
            n_own = len(v.own)
            split = [0] * (len(roles) + n_own - 1) + [_int(v.fam.size), -1]
            x = self.g.op("Reshape", [v.packed, self.g.ints(split)], f"{v.packed}/heads")
            # (roles.., own[:-1].., fam, last) -> fam moved to its role position
            rank = len(roles) + n_own + 1
            src = len(roles) + n_own - 1
            perm = list(range(rank))
            perm.pop(src)
            perm.insert(k, src)
            v.name = self.g.op("Transpose", [x], f"{v.packed}/split", perm=perm)
            self.info(v.name, v)
            return v
        if v.stored is not None:  # a family of matrices stored (.., A, last)
            rank = len(v.own) + 1
            perm = list(range(rank))
            src = rank - 2
            perm.pop(src)
            perm.insert(0, src)
            v.name = self.g.op("Transpose", [v.stored], f"{v.stored}/members", perm=perm)
            self.info(v.name, v)
            return v
        raise Unsupported("a value has no tensor")

    def packed_form(self, v: V) -> str:
        """A family value as Concat(members): the family axis merged into the last axis."""
        if v.packed is not None:
            return v.packed
        if v.kind == "proj":
            return self.project(v)
        v = self.canonical(v)
        roles = [r for r in v.roles if r is not v.fam]
        k = v.roles.index(v.fam)
        rank = len(v.roles) + len(v.own)
        perm = [a for a in range(rank) if a != k]
        perm.insert(rank - 2, k)
        x = self.g.op("Transpose", [v.name], f"{v.name}/to_concat", perm=perm)
        shape = [0] * (len(roles) + len(v.own) - 1) + [-1]
        v.packed = self.g.op("Reshape", [x, self.g.ints(shape)], f"{v.name}/concat")
        self.info(v.packed, v, packed=True)
        return v.packed

    def project(self, v: V) -> str:
        """X @ W_i (+ b_i) for every member i: one GEMM with the (H, A·D) view of W."""
        x, w, b = v.lazy
        h = _int(v.fam.size) * _int(v.own[-1])
        out = self.weight_product(self.canonical(x).name, w, f"{w}/proj")
        if out is None:
            w2 = self.g.op("Reshape", [w, self.g.ints([-1, h])], f"{w}/flat")
            out = self.g.op("MatMul", [self.canonical(x).name, w2], f"{w}/proj")
        if b is not None:
            b2 = self.g.op("Reshape", [b, self.g.ints([h])], f"{b}/flat")
            out = self.g.op("Add", [out, b2], f"{b}/proj")
        v.packed = out
        self.info(out, v, packed=True)
        return out

    def weight_product(self, x: str, w: str, label: str) -> str | None:
        """With --quantize, x @ W where `w` is a weight: a parameter's initializer, (K, N) or
        any stored shape of K first (a family's (H, A, D) read as (H, A·D)), a grouped
        product's joined one, or the Transpose of a parameter (N, K) (a head tied to its
        embedding, W_e^T); onnxruntime's MatMulNBits over its blocks (quantize.py). None
        otherwise: the caller's MatMul."""
        if self.quantizer is None:
            return None
        if w in self.weight_inits:
            return self.quantizer.product(x, w, label)
        made = self.g.producer_of(w)
        if made is not None and made.op == "Transpose" and made.inputs[0] in \
                self.weight_inits and self.g.initializers[made.inputs[0]].ndim == 2:
            return self.quantizer.product(x, made.inputs[0], label, rows_first=True)
        return None

    def grouped_product(self, e: Eqn, x: V, scope: Scope) -> V | None:
        """`e`'s product where it is one of a group by one operand (lowering.products): the
        group's one MatMul by its weights side by side, split; None where the weights are
        not plain matrices."""
        if scope.fn is None:
            return None
        if scope.fn.name not in self.groups:
            self.groups[scope.fn.name] = groups(scope.fn)
        group = self.groups[scope.fn.name].get(e.outs[0].name)
        if group is None:
            return None
        first = group[0].outs[0].name
        if first not in scope.joined:
            scope.joined[first] = self._join(group, x, scope)
        made = scope.joined[first]
        return None if made is None else made[e.outs[0].name]

    def _join(self, group: tuple[Eqn, ...], x: V, scope: Scope) -> dict[str, V] | None:
        if x.dtype != "real" or x.fam is not None or not x.own:
            return None
        ws = [self.operand(m.ins[1], m, scope) for m in group]
        tensors = [w.stored if w.fam is not None else w.name for w in ws]
        if any(len(w.own) != 2 or t not in self.g.initializers for w, t in zip(ws, tensors)):
            return None
        rows = _int(ws[0].own[0])
        parts = [self.g.initializers[t] for t in tensors]
        parts = [p.reshape(rows, -1) for p in parts]
        if any(p.shape[0] != rows for p in parts):
            return None
        names = [ident(m.ins[1].name) for m in group]
        w = self.g.initializer(f"{scope.path}/{'+'.join(names)}", Joined(parts),
                               f"{', '.join(names)} side by side: one product")
        self.weight_inits.add(w)
        label = f"{scope.path}/{'+'.join(names)}"
        operand = self.canonical(x).name
        prod = self.g.op("MatMul", [operand, w], label)  # (quantized when settled)
        outs = self.g.node("Split", [prod, self.g.ints([p.shape[1] for p in parts])],
                           f"{prod}/split", len(group), axis=-1)
        self.joins.append(Join(self.g.producer_of(prod), self.g.producer_of(outs[0]), operand,
                               w, label, [(t, part, f"{scope.path}/{name}/proj")
                                          for t, part, name in zip(tensors, parts, names)]))
        made = {}
        for m, wv, t, out in zip(group, ws, tensors, outs):
            own = self.own(m.outs[0].type, scope)
            if wv.fam is None:
                v = V("real", x.roles, own, name=out)
                self.info(out, v)
            else:
                v = V("real", self.merge_roles(x, wv), own, fam=wv.fam, kind="proj",
                      packed=out, lazy=(x, t, None))
                self.info(out, v, packed=True)
            made[m.outs[0].name] = v
        return made

    def settle_products(self, outputs: set[str]) -> None:
        """Each grouped product as the graph reads it: one MatMul by the weights side by
        side where a node takes the whole (GroupQueryAttention's packed Q | K | V); where
        only its Split does, the products apart, each by its own weights, in the Split's
        place. Either way each weight is read once; apart, nothing copies the product into
        its parts (lowering/products.py). Quantized, a group stays one product and its
        Split: MatMulNBits turns its input into int8 blocks at every call, once for the
        group rather than once per part."""
        read: dict[str, int] = {}
        for n in self.g.nodes:
            for t in n.inputs if n is not None else ():
                read[t] = read.get(t, 0) + 1
        for t in outputs:
            read[t] = read.get(t, 0) + 1
        index = {id(n): k for k, n in enumerate(self.g.nodes) if n is not None}
        at: dict[int, list[Node]] = {}
        renamed: dict[str, str] = {}
        doc = self.g.doc
        for j in self.joins:
            kp, ks = index.get(id(j.product)), index.get(id(j.split))
            if kp is None:
                continue
            self.g.doc = j.product.doc  # the products' spec line
            whole = j.product.outputs[0]
            if ks is not None and read.get(whole) == 1 and self.quantizer is None:
                at[kp], at[ks] = [], []
                for out, (t, part, label) in zip(j.split.outputs, j.parts):
                    if not read.get(out):
                        continue
                    w = self._matrix(t, part, read)
                    tensor, made = self.g.take(self.g.op, "MatMul", [j.x, w], label)
                    if out in outputs:  # a graph output keeps its name
                        made[-1].outputs = [out]
                    else:
                        renamed[out] = tensor
                    at[ks] += made
            elif self.quantizer is not None:  # the joined weight: a parameter's, quantized
                tensor, made = self.g.take(self.weight_product, j.x, j.weights, j.label)
                made[-1].outputs = [whole]
                at[kp] = made
        self.g.doc = doc
        self.g.splice(at, renamed)

    def _matrix(self, t: str, part, read: dict[str, int]) -> str:
        """A grouped product's weight as the (K, N) matrix a product apart takes: the
        parameter's initializer, itself stored so where no node reads its other layout."""
        if self.g.initializers[t].ndim == 2:
            return t
        if not read.get(t):
            self.g.initializers[t] = part
            if t in self.family_docs:
                self.g.init_doc[t] = f"{self.family_docs[t]}, stored {part.shape}"
            return t
        return self.g.initializer(f"{t}/matrix", part, f"{t} as one {part.shape} matrix")

    # ---------------------------------------------------------------- alignment
    def merge_roles(self, *vals: V) -> tuple[Role, ...]:
        seen: dict[int, Role] = {}
        for v in vals:
            for r in v.roles:
                seen[r.order] = r
        return tuple(seen[k] for k in sorted(seen))

    def align(self, v: V, roles: tuple[Role, ...], rank: int, full: bool = False) -> str:
        """`v` with unit axes for the roles it lacks and for missing own dimensions, so it
        broadcasts against a value with these roles and this own rank (`full`: always to
        that whole rank, where an op does not broadcast by itself)."""
        v = self.canonical(v)
        if not v.roles and len(v.own) <= rank and not full:
            return v.name
        axes = [k for k, r in enumerate(roles) if r not in v.roles]
        axes += [len(roles) + k for k in range(rank - len(v.own))]
        if not axes:
            return v.name
        key = ("align", v.name, tuple(axes))  # a mask every layer reads: made once
        if key not in self.shared_tables:
            self.shared_tables[key] = self.g.op("Unsqueeze", [v.name, self.g.ints(axes)],
                                                f"{v.name}/align")
        return self.shared_tables[key]

    def math(self, v: V) -> str:
        """An integer's spec value (stored + offset)."""
        v = self.canonical(v)
        if v.offset == 0:
            return v.name
        return self.g.op("Add", [v.name, self.g.const(v.offset, "int")], f"{v.name}/+{v.offset}")

    def as_real(self, v: V) -> V:
        v = self.canonical(v)
        if v.dtype == "real":
            return v
        x = self.math(v) if v.dtype == "int" else v.name
        out = self.g.op("Cast", [x], f"{v.name}/real", to=self.g.types["real"])
        return V("real", v.roles, v.own, name=out, fam=v.fam)

    def cast(self, v: V, to: str) -> V:
        """A real value cast to `to` ("real": the model's precision, or "float32"); others
        as they are."""
        if v.dtype != "real":
            return v
        v = self.canonical(v)
        out = self.g.op("Cast", [v.name], f"{v.name}/{to}", to=self.g.types[to])
        nv = V("real", v.roles, v.own, name=out, fam=v.fam)
        self.g.info(out, to, self.dims(nv))
        return nv

    def held(self, layout: ir.Layout, scope: Scope) -> int:
        """How far below the spec's values a layout holds integers, as a number."""
        return 0 if layout.held is None else _int(self.ev(layout.held, scope.penv))

    def hold(self, v: V, layout: ir.Layout, scope: Scope) -> V:
        """`v` held as `layout` says (its entries shifted where `v` holds them otherwise)."""
        want = self.held(layout, scope)
        if v.dtype != "int" or v.offset == want:
            return v
        v = self.canonical(v)
        name = self.g.op("Add", [v.name, self.g.const(v.offset - want, "int")],
                         f"{v.name}/held")
        return replace(v, name=name, offset=want, packed=None, kind=None, lazy=None,
                       stored=None)

    def zero_based(self, v: V) -> str:
        v = self.canonical(v)
        shift = v.offset - 1
        if shift == 0:
            return v.name
        return self.g.op("Add", [v.name, self.g.const(shift, "int")], f"{v.name}/index")

    # ---------------------------------------------------------------- the model
    def lower(self, external: str | None = None, stream: bool = False):
        """The ModelProto (and, with `external` or `stream`, the initializers kept out of
        it: see Graph.model)."""
        m = self.model
        env: dict = {}
        penv: dict = {}
        numeric: dict = {}
        dyn_syms = sequence_symbols(m, self.functions)
        # inputs, outputs, state, names of the run lengths and of the cache tensors: decided
        # in compiler/lowering/signature.py, stored whole as the metadata `fgc.signature`
        self.signature = select_outputs(
            signature(m, self.functions, self.values, self.inc, self.genai), self.selected)
        computed = {o["name"] for o in self.signature["outputs"]}
        runtime_name = run_lengths(m, self.functions)
        if self.inc is not None:
            self.generated = self.signature["incremental"]["length"]
        # each input's tensor: the spec's name, or onnxruntime-genai's with --genai
        ordered = sorted(m.inputs, key=lambda v: v.type.pad)  # the signature's order
        graph_name = {v.name: i["name"] for v, i in zip(ordered, self.signature["inputs"],
                                                          strict=True)}
        self.g.taken.update(v.name for v in m.inputs)
        self.g.taken.update(graph_name.values())
        self.g.taken.update(o.name for o in m.outputs)
        self.g.taken.add(LOGITS)
        for h in m.hypers:
            value = self.values[h.name]
            if isinstance(value, float):
                env[h.name] = penv[h.name] = value
                continue
            penv[h.name] = value
            numeric[h.name] = value.const_value()
            env[h.name] = Poly.sym(runtime_name[h.name]) if h.name in dyn_syms else value
        scope = Scope(None, env, penv, "", None, numeric)
        self.run_env = env
        inputs = []
        for v in ordered:
            t = v.type
            if t.pad:  # 1 at a token, 0 at padding; with a past, over past + T positions
                run = self.ev(t.shape[0], env)
                width = dim_text(run)
                if self.inc is not None and by_position(run, self.generated):
                    width = f"{PAST}+{width}"  # as the present's positions are named
                inputs.append((graph_name[v.name], "int", [self.batch_dim(), width]))
                if v.name in self.explicit:  # the spec's equations read it
                    scope.vals[v.name] = V("int", (self.batch,), (run,), name=graph_name[v.name])
                    continue
                self.pad_masks[v.name] = graph_name[v.name]
                self.pad_runs[format_poly(run)] = v.name
                continue
            fam = self.ev(t.family, penv) if t.family is not None else None
            member = t.member() if fam is not None else t
            own = tuple(self.ev(d, env) for d in member.shape)
            first = 2 if fam is not None else 1  # own axes follow the batch (and a family's)
            for k, d in enumerate(member.shape):
                if isinstance(d, Poly) and len(d.symbols()) == 1 and d == Poly.sym(
                        next(iter(d.symbols()))) and d.symbols() <= dyn_syms:
                    self.dynamic.setdefault(runtime_name[next(iter(d.symbols()))],
                                            (graph_name[v.name], first + k))
            offset = _int(self.ev(t.lo, penv)) if t.dtype == "int" else 0
            val = V(t.dtype, (self.batch,), own, name=graph_name[v.name], offset=offset)
            if fam is not None:  # an input family `X_r: ... for r in 1..N`: one tensor, the
                role = self._role(fam, v.name)  # family's axis right after the batch
                val = replace(val, roles=(self.batch, role), fam=role)
            scope.vals[v.name] = val
            inputs.append((graph_name[v.name], val.dtype, self.dims(val)))
        if self.inc is not None:
            inputs += self._cache_inputs()
        for p in m.params:
            scope.params[p.name] = p
        for item in m.body:
            if isinstance(item, ir.Loop):
                self.loop(item, scope)
            else:
                self.eqn(item, scope)
        graph_outputs: list[tuple[str, str, list]] = []
        inputs_named = {v.name for v in m.inputs}
        renamed: dict[str, str] = {}  # tensor -> the graph output it became

        def output(tensor: str, name: str) -> None:
            """The graph output `name` is `tensor`: its producer's output renamed when a
            node computes it, otherwise (an input, a weight, a second output) a copy."""
            if tensor in renamed or tensor in self.g.initializers or not self.g.rename(
                    tensor, name):
                self.g.node("Identity", [renamed.get(tensor, tensor)], name, exact=True)
            else:
                renamed[tensor] = name

        extra = self.signature["logits"]
        for o in m.outputs:
            v = self.canonical(scope.vals[o.name])
            logits = self.logits_of.get(id(scope.vals[o.name]))
            # users train on the logits: the input of the final Softmax, as an output after
            # it (or alone, where --outputs leaves the Softmax out)
            has_logits = extra is not None and extra["of"] == o.name
            if has_logits and logits is None:
                raise Unsupported(f"no Softmax computed `{o.name}`")
            if o.name in inputs_named and o.name in computed:
                # an output that is an input has the input's name: it is the input tensor,
                # as it came (ids 0-based), and needs no node
                graph_outputs.append((o.name, v.dtype, self.dims(v)))
            elif o.name in computed:
                if v.dtype == "int":
                    v = V("int", v.roles, v.own, name=self.math(v))
                output(v.name, o.name)
                graph_outputs.append((o.name, v.dtype, self.dims(v)))
            if has_logits:
                output(logits.name, extra["name"])
                graph_outputs.append((extra["name"], "real", self.dims(logits)))
        if self.inc is not None:
            graph_outputs += self._cache_outputs(output)
            if self.sites and set(self.sites) <= self.shareable:
                # every cached attention takes a past of the longest length, its present
                # the same buffer: the runtime may bind one buffer per tensor (IO binding)
                self.signature["incremental"]["share_buffer"] = True
        self.settle_products({n for n, _, _ in graph_outputs})
        meta = self.metadata(m)
        if self.quantizer is not None:
            if not self.quantizer.made:
                raise Unsupported(f"--quantize: `{m.name}` has no product by a weight matrix "
                                  "to quantize")
            meta["fgc.quantize"] = self.quantizer.q.describe()
        doc = f"{m.name}, compiled by fgc from {self.spec.path.rsplit('/', 1)[-1]}" + \
            (f" (preset {self.preset})" if self.preset else "")
        self.g.nodes = self._live(self.g.nodes, {n for n, _, _ in graph_outputs})
        return self.g.model(inputs, graph_outputs, self.opset, m.name, doc, meta, external,
                            stream)

    def metadata(self, m: ir.Model) -> dict[str, str]:
        """The graph's metadata: the signature (compiler/lowering/signature.py, the dict the
        torch module's signature() returns) and where the graph came from."""
        return {
            "fgc.signature": json.dumps(self.signature, separators=(",", ":")),
            "fgc.model": m.name,
            "fgc.preset": self.preset or "",
            "fgc.spec": self.spec.path.rsplit("/", 1)[-1],
            "fgc.optimize": self.optimize or "none",
            "fgc.dtype": self.precision.name,
        }

    # ---------------------------------------------------------------- the cache
    def _cache_tensors(self) -> list[tuple[str, str, list]]:
        """(past name, present name, past dims) in graph order: the signature's compact cache
        expanded as the runtime expands it (runtime/signature.py)."""
        return [(c["past"], c["present"], c["dims"])
                for c in expand_cache(self.signature["incremental"]["cache"])]

    def _cache_inputs(self) -> list[tuple[str, str, list]]:
        """The past keys and values, one pair per cached attention and layer; the first
        one's positions axis is the run-time size `past`."""
        out = []
        pending: dict[str, list[str]] = {}
        sites = [site for _, _, site, _, _ in self.inc.cache()]  # beside the signature's
        at = cache_tensors(self.signature["incremental"]["cache"])
        for (past, present, dims), (k, layer) in zip(self._cache_tensors(), at, strict=True):
            self.g.taken.update((past, present))
            out.append((past, "real", dims))
            self.dynamic.setdefault(PAST, (past, dims.index(PAST)))
            path = "/".join(ident(p) for p in sites[k].path)
            path = f"layer{layer}/{path}" if layer else path
            pending.setdefault(path, []).extend((past, present))
        for path, (pk, rk, pv, rv) in pending.items():
            self.sites[path] = (pk, pv, rk, rv)
        return out

    def _cache_outputs(self, output) -> list[tuple[str, str, list]]:
        out = []
        for _, present, dims in self._cache_tensors():
            if present not in self.presents:
                raise Unsupported(f"no attention computed `{present}`")
            output(self.presents[present], present)
            out.append((present, "real", [f"{PAST}+{self.generated}" if d == PAST else d
                                          for d in dims]))
        return out

    def extend_cache(self, path: str, k: V, v: V) -> tuple[V, V]:
        """An attention of the incremental form: the past keys and values before this
        call's, and the result is the present. Lazy: a Concat where something reads the
        whole (`canonical`), or the past and the new given to ONNX's Attention apart."""
        pk, pv, rk, rv = self.sites[path]
        total = Poly.sym(PAST) + k.own[0]
        return tuple(V("real", new.roles, (total, *new.own[1:]), fam=new.fam, kind="cache",
                       lazy=(past, new, present))
                     for new, past, present in ((k, pk, rk), (v, pv, rv)))

    def gather_members(self, x: V, e: Eqn, index: Poly, scope: Scope, label: str) -> V:
        """Family `x` regrouped for e's family (`scope` is e's): member i is x's member
        index(i), one Gather along x's family axis (the sizes are numbers here), e's
        family role in place of x's."""
        x = self.canonical(x)
        if x.fam is None:
            raise Unsupported(f"`{e.ins[0].name}` is not a family here")
        role = self.family_role(e, scope)
        out = self.g.op("Gather", [x.name, self.g.ints([k - 1 for k in self.picks(
            e, index, scope)])], label, axis=x.roles.index(x.fam))
        roles = tuple(role if r is x.fam else r for r in x.roles)
        ordered = tuple(sorted(roles, key=lambda r: r.order))
        if ordered != roles:
            perm = [roles.index(r) for r in ordered] + list(range(len(roles),
                                                                  len(roles) + len(x.own)))
            out = self.g.op("Transpose", [out], f"{label}/order", perm=perm)
        v = V(x.dtype, ordered, x.own, name=out, offset=x.offset, fam=role)
        self.info(out, v)
        return v

    def picks(self, e: Eqn, index: Poly, scope: Scope) -> list[int]:
        """The member of a family each member i of e's reads through `index` (1-based)."""
        var, size = e.family
        env = {k: v for k, v in scope.penv.items() if isinstance(v, Poly)}
        return [_int(k) for k in picks(index, var, _int(self.ev(size, scope.penv)), env)]

    def causal_table(self, rows: Poly, cols: Poly, label: str, window: Poly | None = None
                     ) -> V:
        """Mask^AR as a rows x cols tensor aligned to the last column: row i sees the
        columns up to cols - rows + i (in the incremental form, the new positions after
        the past ones); with a window of w (Mask^ST), only the last w of those."""
        key = ("causal", str(rows), str(cols), str(window))
        if key in self.shared_tables:  # the same for every layer: made once
            return self.shared_tables[key]
        zero, one = self.g.const(0, "int"), self.g.const(1, "int")
        first = self.scalar_size(cols - rows)
        r = self.g.op("Range", [first, self.scalar_size(cols), one], f"{label}/rows")
        c = self.g.op("Range", [zero, self.scalar_size(cols), one], f"{label}/cols")
        c = self.g.op("Unsqueeze", [c, self.g.ints([0])], f"{label}/row")
        r = self.g.op("Unsqueeze", [r, self.g.ints([1])], f"{label}/col")
        hidden = self.g.op("Greater", [c, r], f"{label}/later")
        if window is not None:
            gone = self.g.op("GreaterOrEqual", [
                self.g.op("Sub", [r, c], f"{label}/distance"), self.scalar_size(window)],
                f"{label}/outside")
            hidden = self.g.op("Or", [hidden, gone], f"{label}/hidden")
        out = self.g.op("Where", [hidden, self.g.const(float("-inf"), "real"),
                                  self.g.const(0.0, "real")], label)
        v = V("real", (), (rows, cols), name=out)
        self.info(out, v)
        self.shared_tables[key] = v
        return v

    def rotary_tables(self, r: Rotary, rows: Poly, whole: bool = False) -> tuple[str, str]:
        """The cosines and sines by which a rotation turns `rows` positions, (rows, width / 2)
        each, from the past's length on in the incremental form (where the module's own
        tables would be read from): made once for every layer that turns alike. `whole`:
        from position 0 on, `rows` of them (GroupQueryAttention reads its row by
        position). The angles, cosines and sines are computed in float32, whatever the
        model's precision (a position times a frequency in float16 is off by radians), and
        the tables given in it."""
        key = ("rotary", r, str(rows), whole)
        if key not in self.shared_tables:
            longest = self.longest(rows) if whole else None
            if longest is not None and longest * r.width * 4 <= TABLES_MAX:
                self.shared_tables[key] = self._constant_tables(r, longest)
                return self.shared_tables[key]
            first = Poly.const(0) if whole else self.from_past(rows)
            self.shared_tables[key] = self._angle_tables(
                r, self.scalar_size(first), self.scalar_size(first + rows), dim_text(rows))
        return self.shared_tables[key]

    def longest(self, rows: Poly) -> int | None:
        """The most positions `rows` reaches where it is the past's length plus the new
        positions' in the incremental form: the run length's configured value, within
        which the runtime keeps past + T (None elsewhere)."""
        if self.generated is None or rows != Poly.sym(PAST) + Poly.sym(self.generated):
            return None
        return self.signature["max_length"].get(self.generated)

    def _constant_tables(self, r: Rotary, rows: int) -> tuple[str, str]:
        """Cosines and sines of positions 0 .. rows - 1 as initializers: what `_angle_tables`
        computes, angles in float32 alike, the cosines rounded from float64 once. A decoding
        step then turns its positions by reading rows, not by recomputing every position
        up to its own."""
        f32 = np.float32
        angles = np.arange(rows, dtype=f32)[:, None] * frequencies(r)[None, :]
        tables = tuple(self.g.initializer(
            f"rotary/{name}", fn(angles.astype(np.float64)).astype(f32) * f32(magnitude(r)),
            f"RoPE's {what} of positions 0..{rows - 1}: {_rotation_text(r)}")
            for name, what, fn in (("cos", "cosines", np.cos), ("sin", "sines", np.sin)))
        for t in tables:
            self.g.info(t, "real", [rows, r.width // 2])
        return tables

    def _angle_tables(self, r: Rotary, first: str, end: str, rows) -> tuple[str, str]:
        """Cosines and sines of positions first .. end - 1 (int64 scalars), float32 angles."""
        label = "rotary"
        positions = self.g.op("Range", [first, end, self.g.const(1, "int")],
                              f"{label}/positions")
        positions = self.g.op("Unsqueeze", [self.g.op(
            "Cast", [positions], f"{label}/positions", to=self.g.types["float32"]),
            self.g.ints([1])], f"{label}/positions")
        if ("frequencies", r) not in self.shared_tables:
            what = f"RoPE's frequencies: {_rotation_text(r)}"
            self.shared_tables[("frequencies", r)] = self.g.initializer(
                f"{label}/frequencies", frequencies(r), what, convert=False)
        angles = self.g.op("Mul", [positions, self.shared_tables[("frequencies", r)]],
                           f"{label}/angles")
        tables = (self.g.op("Cos", [angles], f"{label}/cos"),
                  self.g.op("Sin", [angles], f"{label}/sin"))
        if magnitude(r) != 1.0:  # YaRN's: the turned rows grow by it
            scale = self.g.const(magnitude(r), "float32")
            tables = tuple(self.g.op("Mul", [t, scale], t) for t in tables)
        if self.precision.half:
            tables = tuple(self.g.op("Cast", [t], t, to=self.g.types["real"])
                           for t in tables)
        for t in tables:
            self.g.info(t, "real", [rows, r.width // 2])
        return tables

    def softmax(self, x: str, label: str, axis: int = -1) -> str:
        """Softmax along `axis`, accumulated in float32 whatever the model's precision: a
        half-precision operand is cast to float32 and the result back."""
        if not self.precision.half:
            return self.g.op("Softmax", [x], label, axis=axis)
        wide = self.g.op("Cast", [x], f"{label}/float32", to=self.g.types["float32"])
        out = self.g.op("Softmax", [wide], label, axis=axis)
        return self.g.op("Cast", [out], label, to=self.g.types["real"])

    def plus_bias(self, bias: V, table: V, label: str) -> V:
        """A mask's bias plus its table: one additive mask."""
        bias = self.as_real(self.canonical(bias))
        out = self.g.op("Add", [bias.name, table.name], label)
        v = V("real", bias.roles, bias.own, name=out, fam=bias.fam)
        self.info(out, v)
        return v

    @staticmethod
    def _live(nodes, outputs: set[str]):
        """Drop nodes nothing needs (lazy forms that were lowered twice, fused Adds)."""
        need = set(outputs)
        keep = []
        for n in reversed(nodes):
            if n is None:
                continue
            if any(o in need for o in n.outputs):
                keep.append(n)
                need.update(i for i in n.inputs if i)
        return list(reversed(keep))

    def loop(self, loop: ir.Loop, outer: Scope) -> None:
        hi = _int(self.ev(loop.hi, outer.penv))
        lo = _int(self.ev(loop.lo, outer.penv))
        # X^(0) is a value, or a parameter (`X^(0) = W`)
        carried = {c.inner: outer.vals[c.init] if c.init in outer.vals else
                   self.param(outer, c.init, None) for c in loop.carried}
        last: dict[str, V] = {}
        each: dict[str, list[V]] = {inner: [] for inner, _ in loop.stacks}
        # the same in every layer (lowering/layers.py): computed at the first layer that
        # has it, read from there in the others
        hoisted = {id(e) for e in invariant(loop, self.functions)}
        once: dict[int, list[V]] = {}  # id of such an equation -> its results
        for layer in range(lo, hi + 1):
            env = dict(outer.env)
            env[loop.var] = Poly.const(layer)
            penv = dict(outer.penv)
            penv[loop.var] = Poly.const(layer)
            scope = Scope(None, env, penv, f"layer{layer}", layer,
                          {**outer.numeric, loop.var: layer})
            scope.vals = dict(outer.vals)
            scope.vals.update(carried)
            scope.params = outer.params
            scope.shared = set(loop.shared)
            scope.ells = outer.ells
            for e in loop.body:
                if id(e) not in hoisted:
                    self.eqn(e, scope)
                elif id(e) in once:
                    scope.vals.update((v.name, x) for v, x in zip(e.outs, once[id(e)]))
                elif all(guard_holds(g, scope.numeric) for g in e.guards):
                    self.eqn(e, scope)
                    once[id(e)] = [scope.vals[v.name] for v in e.outs]
            carried = {c.inner: scope.vals[c.result] for c in loop.carried}
            for inner in each:
                each[inner].append(scope.vals[inner])
            last = scope.vals
        for inner, outer_name in loop.results:
            if inner in last:
                outer.vals[outer_name] = last[inner]
        for inner, outer_name in loop.stacks:
            outer.vals[outer_name] = self.stack_layers(each[inner], loop)

    def stack_layers(self, values: list[V], loop: ir.Loop) -> V:
        """X^(1..L): each layer's value on a new axis after the roles (the batch)."""
        values = [self.canonical(v) for v in values]
        first = values[0]
        if any(v.roles != first.roles or v.fam is not None for v in values):
            raise Unsupported("stacking layer values that are families or differ in layout")
        axis = len(first.roles)
        saved = self.g.doc
        if loop.span is not None:
            file = loop.span.file.rsplit("/", 1)[-1]
            self.g.doc = f"{file}:{loop.span.line}: every layer's value, stacked"
        parts = [self.g.op("Unsqueeze", [self.math(v) if v.dtype == "int" else v.name,
                                         self.g.ints([axis])], f"{v.name}/layer")
                 for v in values]
        out = self.g.op("Concat", parts, "layers/stack", axis=axis)
        self.g.doc = saved
        v = V(first.dtype, first.roles, (Poly.const(len(values)), *first.own), name=out)
        self.info(out, v)
        return v

    # ---------------------------------------------------------------- equations
    def eqn(self, e: Eqn, scope: Scope) -> None:
        if e.guards and not all(guard_holds(g, scope.numeric) for g in e.guards):
            return
        self.where(e)
        try:
            if e.op == "call":
                outs = self.call(e, scope)
            elif e.op == "cond":
                holds = guard_holds(ir.Guard(text=e.attrs["guard"]), scope.numeric)
                outs = [self.operand(e.ins[0 if holds else 1], e, scope)]
            else:
                lowering = LOWER.get(e.op)
                if lowering is None:
                    raise Unsupported(f"the ONNX backend has no lowering for `{e.op}`")
                ins = [self.operand(o, e, scope) for o in e.ins]
                outs = [lowering(self, e, ins, scope)]
        except Unsupported as err:
            err.span = err.span or e.span
            raise
        for out, v in zip(e.outs, outs):
            v = scope.vals[out.name] = self.hold(v, out.layout, scope)
            _as_laid_out(v, out.layout)

    def family_role(self, e: Eqn, scope: Scope) -> Role | None:
        if e.family is None:
            return None
        var, size = e.family
        if var not in scope.roles:
            scope.roles[var] = self._role(self.ev(size, scope.env), var)
        return scope.roles[var]

    def operand(self, o: Operand, e: Eqn, scope: Scope) -> V:
        if o.name is None:
            c = self.ev(o.const, scope.env)
            if isinstance(c, float):
                return V("real", (), (), name=self.g.const(c, "real"))
            if c.is_const():
                value = c.const_value()
                if value.denominator != 1:
                    return V("real", (), (), name=self.g.const(float(value), "real"))
                return V("int", (), (), name=self.g.const(int(value), "int"))
            return V("int", (), (), name=self.scalar_size(c))
        role = self.family_role(e, scope) if o.member is not None and isinstance(
            o.member, str) else None
        if o.name not in scope.vals and o.name in scope.params:
            v = self.param(scope, o.name, role)
        elif o.name in scope.vals:
            v = scope.vals[o.name]
        else:
            raise Unsupported(f"value `{o.name}` is not available here")
        if o.member is not None and not isinstance(o.member, str):
            if v.fam is None:
                raise Unsupported(f"`{o}`: member of a value that is not a family")
            k = _int(self.ev(o.member, scope.env)) - 1
            v = self.canonical(v)
            axis = v.roles.index(v.fam)
            out = self.g.op("Gather", [v.name, self.g.const(k, "int")], f"{v.name}[{k + 1}]",
                            axis=axis)
            return V(v.dtype, tuple(r for r in v.roles if r is not v.fam), v.own, name=out,
                     offset=v.offset)
        if role is not None and v.fam is not None and v.fam is not role:
            # a family made under another index of the same size: the same axis
            v = replace(v, roles=tuple(role if r is v.fam else r for r in v.roles), fam=role)
        return v

    def call(self, e: Eqn, scope: Scope) -> list[V]:
        fn = self.functions[e.attrs["module"]]
        ins = [self.operand(o, e, scope) for o in e.ins]
        env, penv = {}, {}
        bindings = dict(e.attrs["bindings"])
        for h in fn.hypers:
            if h.name not in bindings and h.default is not None:
                bindings[h.name] = h.default
        for name, b in bindings.items():
            env[name] = self.ev(b, scope.env)
            penv[name] = self.ev(b, scope.penv)
        ells: dict[str, tuple] = {}
        for decl, v in zip(fn.inputs, ins):
            t = decl.type.member() if decl.type.family is not None else decl.type
            if any(isinstance(d, Ell) for d in t.shape):
                shape = [d for d in t.shape if not isinstance(d, Ell)]
                own = v.own[len(v.own) - len(shape):] if shape else ()
                ell = next(d for d in t.shape if isinstance(d, Ell))
                ells.setdefault(ell.name, tuple(v.own[:len(v.own) - len(shape)]))
            else:
                shape, own = list(t.shape), v.own
            for d, actual in zip(shape, own):
                if isinstance(d, Poly) and len(d.terms) == 1 and d.symbols() and \
                        d == Poly.sym(next(iter(d.symbols()))):
                    s = next(iter(d.symbols()))
                    env.setdefault(s, actual)
                    penv.setdefault(s, actual)
        table = self.inc is not None and not fn.inputs and any(
            isinstance(x, Poly) and not self.from_past(x).is_const() for x in env.values())
        if table:  # positions or a banded mask: made for past + T rows, read from row past
            for name in bindings:
                if isinstance(env[name], Poly) and not self.from_past(env[name]).is_const():
                    env[name] = env[name] + Poly.sym(PAST)
        inst = e.attrs["instance"]
        if inst in scope.shared:
            path = ident(inst)
        else:
            path = f"{scope.path}/{ident(inst)}" if scope.path else ident(inst)
        role = self.family_role(e, scope)
        callee = Scope(fn, env, penv, path, scope.layer, scope.numeric)
        callee.ells = ells
        callee.caller = scope
        # the mask each input taken by meaning is given at this use (lowering/masks.py)
        callee.masks = site_kinds(e, lambda name: scope.masks[name])
        lower = fused(fn, self.optimize)
        if lower is not None and not (e.family and fn.params):
            out = lower(self, callee, ins, e)
            if out is not None:
                return out
        key = None
        if scope.fn is not None and not has_params(fn, self.functions) and \
                all(v.name or v.packed for v in ins):
            # inside a module, a module without parameters on the same values: computed
            # once (the mask xlnet's attention builds in every layer); what a layer body
            # computes once is lowering.layers.invariant's
            key = (fn.name, tuple(id(v) for v in ins),
                   tuple(sorted((k, str(x)) for k, x in env.items())),
                   tuple(sorted(e.attrs.get("masks", {}).items())), self.g.types["real"])
            if key in self.memo:
                return self.memo[key][1]
        # a half-precision model computes tables and RoPE's equations in float32
        # (lowering/precision.py), inside which everything is float32 already
        wide = self.precision.half and self.g.types["real"] == self.precision.onnx and \
            in_float32(fn, self.functions)
        for decl, v in zip(fn.inputs, ins):
            v = self.hold(v, SPEC_VALUE, scope)  # a module takes those
            callee.vals[decl.name] = self.cast(v, "float32") if wide else v
        with self.g.wide() if wide else contextlib.nullcontext():
            if role is not None and fn.params:
                raise Unsupported(f"`{fn.name}` has parameters but is used once per family "
                                  "member")
            for inner in fn.eqns:
                self.eqn(inner, callee)
            outs = [callee.vals[o.name] for o in fn.outputs]
            for o, declared in zip(outs, fn.outputs):
                if declared.type.dtype == "real" and o.dtype != "real":
                    outs[outs.index(o)] = self.as_real(o)
            if wide:  # laid out while float32 (a lazy form's tensor made now)
                outs = [self.canonical(o) for o in outs]
        if wide:
            outs = [self.cast(o, "real") for o in outs]
        if role is not None:
            outs = [replace(o, fam=role) if role in o.roles else o for o in outs]
        if table:
            outs = [self._last_rows(o) for o in outs]
        elif not fn.inputs and scope.fn is None and self.padding is not None:
            table = self.padding.table(e.outs[0].type.shape)  # (passes/padding.py)
            if table is not None:
                outs = [self._padded_rows(o, table.input) for o in outs]
        if key is not None:
            self.memo[key] = (ins, outs)  # the inputs are kept alive: their ids are the key
        return outs

    def _padded_rows(self, v: V, pad: str) -> V:
        """A table of positions (a sinusoid) read at the tokens' positions of the padding
        mask `pad`: each token's row, (batch, T, ...)."""
        v = self.canonical(v)
        out = self.g.op("Gather", [v.name, self.positions(pad, v.own[0])],
                        f"{v.name}[positions]", axis=0)
        nv = replace(v, roles=(self.batch,), name=out)
        self.info(out, nv)
        return nv

    def _last_rows(self, v: V) -> V:
        """A table made for past + T positions: its rows from past on (the first axis that
        runs over them)."""
        v = self.canonical(v)
        total = next((k for k, d in enumerate(v.own) if not self.from_past(d).is_const()),
                     None)
        if total is None:
            return v
        d = v.own[total]
        axis = len(v.roles) + total
        out = self.g.op("Slice", [v.name, self.size(Poly.sym(PAST)), self.size(d),
                                  self.g.ints([axis])], f"{v.name}[past:]")
        own = list(v.own)
        own[total] = d - Poly.sym(PAST)
        nv = V(v.dtype, v.roles, tuple(own), name=out, offset=v.offset, fam=v.fam)
        self.info(out, nv)
        return nv



def _as_laid_out(v: V, layout: ir.Layout) -> None:
    """The graph holds a value with the own axes the lowering laid out (lowering/layout.py;
    its integers are held as it says by `Lowerer.hold`). Family axes are roles here: a
    value a module computes once per member carries the caller's, and one that reads
    nothing per member is held once and broadcasts."""
    if layout.rank is not None and len(v.own) != layout.rank:
        raise AssertionError(f"a value laid out with {layout.rank} own axes is held with "
                             f"{len(v.own)}")


# ---------------------------------------------------------------- primitives


def _out(lw: Lowerer, e: Eqn, scope: Scope, roles, dtype: str, name: str, offset: int = 0,
         fam: Role | None = None) -> V:
    """The result of `e` as its layout says (lowering/layout.py): `name` holds integers
    `offset` below the spec's values, moved to where the layout holds them; the family
    axis is `fam` where the layout has one."""
    layout = e.outs[0].layout
    v = V(dtype, roles, lw.own(e.outs[0].type, scope), name=name, offset=offset,
          fam=fam if layout.fam else None)
    if dtype == "int":
        v = lw.hold(v, layout, scope)
    lw.info(v.name, v)
    return v


def _label(e: Eqn, scope: Scope, what: str) -> str:
    name = e.outs[0].name
    base = what if name.startswith("%") else name
    return f"{scope.path}/{base}" if scope.path else base


def _rank(lw: Lowerer, e: Eqn, scope: Scope) -> int:
    return len(lw.own(e.outs[0].type, scope))


def _roles_for(lw: Lowerer, e: Eqn, scope: Scope, ins: list[V]) -> tuple[tuple, Role | None]:
    role = lw.family_role(e, scope)
    roles = lw.merge_roles(*ins)
    return roles, role if e.outs[0].layout.fam and role in roles else None


ONNX_BINARY = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow",
               "max": "Max", "min": "Min", "mod": "Mod", "eq": "Equal", "ne": "Equal",
               "lt": "Less", "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual",
               "and": "And", "or": "Or"}
COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}


def _binary(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    a, b = ins
    if e.op == "add" and a.kind == "proj" and a.lazy[2] is None and b.fam is a.fam and \
            b.name in lw.g.initializers and len(b.own) == 1:
        # X @ W_i + b_i: the bias joins the one GEMM of the projection
        if a.packed is not None:  # made already, by a group's product
            h = _int(a.fam.size) * _int(a.own[-1])
            flat = lw.g.op("Reshape", [b.name, lw.g.ints([h])], f"{b.name}/flat")
            out = lw.g.op("Add", [a.packed, flat], f"{b.name}/proj")
            v = V("real", a.roles, a.own, fam=a.fam, kind="proj", packed=out,
                  lazy=(a.lazy[0], a.lazy[1], b.name))
            lw.info(out, v, packed=True)
            return v
        return V("real", a.roles, a.own, fam=a.fam, kind="proj",
                 lazy=(a.lazy[0], a.lazy[1], b.name))
    roles, fam = _roles_for(lw, e, scope, ins)
    rank = _rank(lw, e, scope)
    label = _label(e, scope, ONNX_BINARY[e.op])
    moved = shifted(e)
    if moved is not None:  # x + c: x's entries, held c further (lowering/layout.py)
        x = lw.canonical(ins[moved[0]])
        return V("int", x.roles, x.own, name=x.name, fam=x.fam,
                 offset=lw.held(e.outs[0].layout, scope))
    if a.dtype == "int" and b.dtype == "int" and e.op in ("add", "sub"):
        sign = 1 if e.op == "add" else -1
        xa, yb = lw.align(a, roles, rank), lw.align(b, roles, rank)
        out = lw.g.op(ONNX_BINARY[e.op], [xa, yb], label)
        return _out(lw, e, scope, roles, "int", out, lw.canonical(a).offset + sign *
                    lw.canonical(b).offset, fam)
    if e.op in COMPARE and a.dtype == "int" and b.dtype == "int":
        a, b = lw.canonical(a), lw.canonical(b)
        xa = lw.align(a, roles, rank)
        yb = lw.align(b, roles, rank)
        if a.offset != b.offset:
            xa = lw.g.op("Add", [xa, lw.g.const(a.offset - b.offset, "int")], f"{xa}/shift")
        out = lw.g.op(ONNX_BINARY[e.op], [xa, yb], label)
        if e.op == "ne":
            out = lw.g.op("Not", [out], label)
        return _out(lw, e, scope, roles, "bool", out, fam=fam)
    if e.op in ("and", "or"):
        out = lw.g.op(ONNX_BINARY[e.op], [lw.align(a, roles, rank), lw.align(b, roles, rank)],
                      label)
        return _out(lw, e, scope, roles, "bool", out, fam=fam)
    dtype = "real" if "real" in (a.dtype, b.dtype) or e.op in ("div", "pow") else "int"
    vals = []
    for v in (a, b):
        v = lw.canonical(v)
        if dtype == "real":
            v = lw.as_real(v)
        elif v.offset:
            v = V("int", v.roles, v.own, name=lw.math(v))
        vals.append(lw.align(v, roles, rank))
    attrs = {"fmod": 0} if e.op == "mod" else {}
    out = lw.g.op(ONNX_BINARY[e.op], vals, label, **attrs)
    if e.op == "ne":
        out = lw.g.op("Not", [out], label)
    return _out(lw, e, scope, roles, "bool" if e.op in COMPARE else dtype, out, fam=fam)


ONNX_UNARY = {"exp": "Exp", "log": "Log", "sqrt": "Sqrt", "tanh": "Tanh", "sigmoid": "Sigmoid",
              "erf": "Erf", "sin": "Sin", "cos": "Cos", "abs": "Abs", "neg": "Neg",
              "not": "Not", "stopgrad": "Identity"}


def _unary(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    (x,) = ins
    x = lw.canonical(x)
    if e.op == "stopgrad":
        return x
    if e.op == "not":
        dtype = "bool"
    elif x.dtype == "int" and e.op in ("abs", "neg"):
        x = V("int", x.roles, x.own, name=lw.math(x), fam=x.fam)
        dtype = "int"
    else:
        x = lw.as_real(x)
        dtype = "real"
    if not x.roles and not x.own and e.op in ("sqrt", "exp", "log") and \
            x.name in lw.g.consts.values():
        value = float(lw.g.initializers[x.name])
        return V("real", (), (), name=lw.g.const(float(getattr(np, e.op)(np.float64(value))),
                                                 "real"))
    out = lw.g.op(ONNX_UNARY[e.op], [x.name], _label(e, scope, ONNX_UNARY[e.op]))
    return _out(lw, e, scope, x.roles, dtype, out, fam=x.fam)


def _to_int(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    """floor, ceil: Floor or Ceil of the reals, cast to int64 (how integers are held)."""
    x = lw.as_real(lw.canonical(ins[0]))
    op = {"floor": "Floor", "ceil": "Ceil"}[e.op]
    whole = lw.g.op(op, [x.name], _label(e, scope, op))
    out = lw.g.op("Cast", [whole], f"{whole}/int", to=7)
    return _out(lw, e, scope, x.roles, "int", out, fam=x.fam)


def _reduce(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    x = lw.as_real(lw.canonical(ins[0]))  # a sum, mean or max of integers is real
    op = {"sum": "ReduceSum", "mean": "ReduceMean", "amax": "ReduceMax"}[e.op]
    out = lw.g.op(op, [x.name, lw.g.ints([-1])], _label(e, scope, op), keepdims=1)
    return _out(lw, e, scope, x.roles, x.dtype, out, fam=x.fam)


def _matmul(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    x, y = ins
    grouped = lw.grouped_product(e, x, scope)
    if grouped is not None:
        return grouped
    role = lw.family_role(e, scope)
    if y.stored is not None and y.fam is not None and x.fam is None and len(y.own) == 2 \
            and x.dtype == "real" and len(x.own) >= 1 and role is y.fam:
        # X @ W_i for every member i: kept as one GEMM until something needs the heads
        own = lw.own(e.outs[0].type, scope)
        roles = lw.merge_roles(x, y)
        return V("real", roles, own, fam=y.fam, kind="proj", lazy=(x, y.stored, None))
    roles, fam = _roles_for(lw, e, scope, ins)
    x, y = lw.as_real(x), lw.as_real(lw.canonical(y))
    label = _label(e, scope, "MatMul")
    by_matrix = not y.roles and len(y.own) == 2  # maybe a weight (--quantize)
    if len(x.own) >= 2 and len(y.own) >= 2:
        rank = max(len(x.own), len(y.own))
        a = lw.align(x, roles, rank)
        out = by_matrix and lw.weight_product(a, y.name, label) or \
            lw.g.op("MatMul", [a, lw.align(y, roles, rank)], label)
    elif len(x.own) == 1 and by_matrix:
        out = x.roles and lw.weight_product(x.name, y.name, label) or \
            lw.g.op("MatMul", [x.name, y.name], label)
    elif len(y.own) == 1 and len(x.own) >= 1 and not y.roles:
        out = lw.g.op("MatMul", [x.name, y.name], label)
    elif len(x.own) == 1:
        xx = lw.g.op("Unsqueeze", [x.name, lw.g.ints([-2])], f"{x.name}/row")
        xv = V("real", x.roles, (Poly.const(1),) + x.own, name=xx)
        prod = lw.g.op("MatMul", [lw.align(xv, roles, len(y.own)), lw.align(y, roles,
                                                                            len(y.own))], label)
        out = lw.g.op("Squeeze", [prod, lw.g.ints([-2])], label)
    else:
        yy = lw.g.op("Unsqueeze", [y.name, lw.g.ints([-1])], f"{y.name}/col")
        yv = V("real", y.roles, y.own + (Poly.const(1),), name=yy)
        prod = lw.g.op("MatMul", [lw.align(x, roles, len(x.own)), lw.align(yv, roles,
                                                                            len(x.own))], label)
        out = lw.g.op("Squeeze", [prod, lw.g.ints([-1])], label)
    return _out(lw, e, scope, roles, "real", out, fam=fam)


def _lookup(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    """OneHot(ids) @ W as rows of W (lowering/lookups.py): no V-wide one-hot is built;
    the table's first row is id `lo`."""
    ids, table = (lw.canonical(v) for v in ins)
    if table.roles:
        raise Unsupported("a lookup in a table that varies along the batch or by member")
    shift = ids.offset - _int(lw.ev(e.attrs["lo"], scope.env))  # row = id - lo
    rows = ids.name if shift == 0 else lw.g.op(
        "Add", [ids.name, lw.g.const(shift, "int")], f"{ids.name}/row")
    label = _label(e, scope, "embedding")
    if lw.quantizer is not None and lw.quantizer.q.embeddings and \
            table.name in lw.weight_inits and len(table.own) == 2:
        # --quantize-embeddings: the rows of the table's blocks (a tied head reads the same)
        out = lw.quantizer.lookup(table.name, rows, len(ids.roles) + len(ids.own), label)
    else:
        out = lw.g.op("Gather", [table.name, rows], label, axis=0)
    roles, fam = _roles_for(lw, e, scope, [ids])
    return _out(lw, e, scope, roles, "real", out, fam=fam)


def _transpose(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    x = lw.canonical(ins[0])
    rank = len(x.roles) + len(x.own)
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    out = lw.g.op("Transpose", [x.name], _label(e, scope, "Transpose"), perm=perm)
    return _out(lw, e, scope, x.roles, x.dtype, out, offset=x.offset, fam=x.fam)


def _concat(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    counts = e.attrs.get("counts") or [None] * len(ins)
    if len(ins) == 1 and counts[0] is not None:
        v = ins[0]
        if v.fam is None:
            raise Unsupported("concat of a family whose members do not differ")
        packed = lw.packed_form(v)
        return _out(lw, e, scope, tuple(r for r in v.roles if r is not v.fam), v.dtype,
                    packed, offset=v.offset)
    if any(c is not None for c in counts):
        raise Unsupported("concat of a family together with other values")
    roles = lw.merge_roles(*ins)
    rank = _rank(lw, e, scope)
    ins = [lw.canonical(v) for v in ins]
    dtype = "real" if any(v.dtype == "real" for v in ins) else ins[0].dtype
    offset = ins[0].offset if len({v.offset for v in ins}) == 1 else 0
    if dtype == "real":
        ins = [lw.as_real(v) for v in ins]
    elif dtype == "int" and offset == 0:  # different offsets: join the spec's values
        ins = [V("int", v.roles, v.own, name=lw.math(v)) for v in ins]
    vals = [lw.align(v, roles, rank) for v in ins]
    short = [k for k, v in enumerate(ins) if len(v.roles) < len(roles)]
    if short:
        # Concat does not broadcast: a value without the batch (a parameter) or without a
        # family axis is expanded to the leading axes of the others
        full = [k for k, v in enumerate(ins) if k not in short]
        label = _label(e, scope, "Concat")
        leads = [lw.g.op("Shape", [lw.align(ins[k], roles, rank, full=True)], f"{label}/lead",
                         start=0, end=len(roles))
                 for k in (full[:1] or [k for k, v in enumerate(ins) if v.roles])]
        lead = leads[0] if len(leads) == 1 else lw.g.op("Max", leads, f"{label}/lead")
        shape = lw.g.op("Concat", [lead, lw.g.ints([1] * rank)], f"{label}/shape", axis=0)
        for k in short:
            vals[k] = lw.g.op("Expand", [vals[k], shape], f"{label}/expand")
    axis = -1 if e.op == "concat" else -rank
    out = lw.g.op("Concat", vals, _label(e, scope, "Concat"), axis=axis)
    return _out(lw, e, scope, roles, dtype, out, offset=offset if dtype == "int" else 0)


def _iota(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    size = lw.ev(e.attrs["size"], scope.env)
    rank, axis = e.attrs["rank"], e.attrs["axis"]
    label = _label(e, scope, "iota")
    if size.is_const() and _int(size) * 8 <= CONST_LIMIT:
        n = _int(size)
        shape = [n if k == axis else 1 for k in range(rank)]
        out = lw.g.const(np.arange(n, dtype=np.int64), "int", tuple(shape)) if n > 0 else None
    else:  # past CONST_LIMIT, computed when the model runs: the graph stays small
        r = lw.g.op("Range", [lw.g.const(0, "int"), lw.scalar_size(size), lw.g.const(1, "int")],
                    label)
        shape = [-1 if k == axis else 1 for k in range(rank)]
        out = lw.g.op("Reshape", [r, lw.g.ints(shape)], label)
    return _out(lw, e, scope, (), "int", out, offset=1)


def _broadcast_to(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    x = lw.canonical(ins[0])
    target = [lw.ev(d, scope.env) for d in e.attrs["shape"]]
    if tuple(x.own) == tuple(target) and x.name:
        return x
    shape = [Poly.const(1)] * len(x.roles) + target
    out = lw.g.op("Expand", [lw.align(x, x.roles, len(target)), lw.shape_of(shape)],
                  _label(e, scope, "Expand"))
    return _out(lw, e, scope, x.roles, x.dtype, out, offset=x.offset, fam=x.fam)


def _select(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    c, x, y = ins
    roles, fam = _roles_for(lw, e, scope, ins)
    rank = _rank(lw, e, scope)
    x, y = lw.canonical(x), lw.canonical(y)
    if "real" in (x.dtype, y.dtype):
        x, y, dtype = lw.as_real(x), lw.as_real(y), "real"
    else:
        dtype = "int"
        if x.offset != y.offset:
            x = V("int", x.roles, x.own, name=lw.math(x))
            y = V("int", y.roles, y.own, name=lw.math(y))
    out = lw.g.op("Where", [lw.align(c, roles, rank), lw.align(x, roles, rank),
                            lw.align(y, roles, rank)], _label(e, scope, "Where"))
    return _out(lw, e, scope, roles, dtype, out, offset=x.offset if dtype == "int" else 0,
                fam=fam)


def _index(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    base, rest = lw.canonical(ins[0]), ins[1:]
    kinds = e.attrs["kinds"]
    label = _label(e, scope, "index")
    nb = len(base.roles)
    if any(k == "gather" for k in kinds):
        return _gather(lw, e, base, rest, scope, label)
    x = base.name
    k = 0
    removed = 0
    batched = []
    for axis, kind in enumerate(kinds):
        pos = nb + axis - removed
        if kind == ":":
            continue
        if kind == "range" and e.attrs.get("last"):  # the last position (lowering/last.py)
            k += 2
            x = lw.g.op("Slice", [x, lw.g.ints([-1]), lw.g.ints([2**62]), lw.g.ints([pos])],
                        label)
            continue
        if kind == "range":
            lo, hi = rest[k], rest[k + 1]
            k += 2
            start = lw.zero_based(lo)
            rows = lw.ev(e.outs[0].type.shape[axis], scope.env)
            pad = lw.pad_of(rows)
            if pad is not None and axis == 0 and not base.roles and \
                    all(x == ":" for x in kinds[1:]):
                # rows lo.. of a table read at the tokens' positions (RoBERTa's W_p[3..n+2])
                start = lw.g.op("Reshape", [start, lw.g.ints([1])], f"{label}/start")
                x = lw.g.op("Slice", [x, start, lw.g.ints([2**62]), lw.g.ints([0])], label)
                x = lw.g.op("Gather", [x, lw.positions(pad, rows)], f"{label}/positions",
                            axis=0)
                return _out(lw, e, scope, (lw.batch,), base.dtype, x, offset=base.offset)
            end = lw.math(hi)
            start = lw.g.op("Reshape", [start, lw.g.ints([1])], f"{label}/start")
            end = lw.g.op("Reshape", [end, lw.g.ints([1])], f"{label}/end")
            x = lw.g.op("Slice", [x, start, end, lw.g.ints([pos])], label)
            continue
        idx = lw.canonical(rest[k])
        k += 1
        if idx.roles:
            batched.append((axis, idx))
            continue
        x = lw.g.op("Gather", [x, lw.zero_based(idx)], label, axis=pos)
        removed += 1
    if batched:
        # one position per batch row (BERT's j_masked): a gather with the batch as batch_dims
        if len(batched) != 1 or any(r is not lw.batch for r in batched[0][1].roles) or \
                base.roles != (lw.batch,):
            raise Unsupported("a per-row index other than one position per sequence")
        axis, idx = batched[0]
        if axis - removed != 0:
            raise Unsupported("a per-row index past the first axis")
        ids = lw.g.op("Unsqueeze", [lw.zero_based(idx), lw.g.ints([-1])], f"{label}/ids")
        x = lw.g.op("GatherND", [x, ids], label, batch_dims=1)
    return _out(lw, e, scope, base.roles, base.dtype, x, offset=base.offset)


def _gather(lw: Lowerer, e: Eqn, base: V, idx: list[V], scope: Scope, label: str) -> V:
    """base[i_1, ..., i_r] with index tensors on every axis (a comprehension): the axes are
    flattened into one, the indices combined into one linear index, then one gather."""
    r = len(base.own)
    sizes = list(base.own)
    roles = lw.merge_roles(base, *idx)
    member = _rank(lw, e, scope)
    lin = None
    lin_v = None
    for axis in range(r):
        z = lw.canonical(idx[axis])
        zv = V("int", z.roles, z.own, name=lw.zero_based(z))
        if lin is None:
            lin, lin_v = zv.name, zv
            continue
        lin = lw.g.op("Mul", [lw.align(lin_v, lw.merge_roles(lin_v, zv), member),
                              lw.scalar_size(sizes[axis])], f"{label}/linear")
        lin_v = V("int", lw.merge_roles(lin_v, zv), lw.own(e.outs[0].type, scope), name=lin)
        lin = lw.g.op("Add", [lin, lw.align(zv, lin_v.roles, member)], f"{label}/linear")
        lin_v = replace(lin_v, name=lin)
    flat = base.name
    if r > 1:
        flat = lw.g.op("Reshape", [base.name, lw.g.ints([0] * len(base.roles) + [-1])],
                       f"{label}/flat")
    if not base.roles:
        out = lw.g.op("Gather", [flat, lin], label, axis=0)
        if lin_v.roles != roles:
            raise Unsupported("gather indices with mixed leading axes")
        return _out(lw, e, scope, lin_v.roles, base.dtype, out, offset=base.offset)
    # leading axes on the base: both sides broadcast to the union, then GatherElements
    nr = len(roles)
    b_al = lw.align(V(base.dtype, base.roles, (Poly.const(1),), name=flat), roles, 1)
    i_al = lw.align(lin_v, roles, member, full=True)
    i_flat = lw.g.op("Reshape", [i_al, lw.g.ints([0] * nr + [-1])], f"{label}/ids")
    b_shape = lw.g.op("Shape", [b_al], f"{label}/bshape", start=0, end=nr)
    i_shape = lw.g.op("Shape", [i_flat], f"{label}/ishape", start=0, end=nr)
    b_exp = lw.g.op("Expand", [b_al, lw.g.op("Concat", [i_shape, lw.g.ints([1])],
                                             f"{label}/s1", axis=0)], f"{label}/bexp")
    i_exp = lw.g.op("Expand", [i_flat, lw.g.op("Concat", [b_shape, lw.g.ints([1])],
                                               f"{label}/s2", axis=0)], f"{label}/iexp")
    picked = lw.g.op("GatherElements", [b_exp, i_exp], label, axis=-1)
    full = lw.g.op("Shape", [i_al], f"{label}/oshape")
    both = lw.g.op("Max", [full, lw.g.op("Concat", [b_shape, lw.g.ints([1] * member)],
                                         f"{label}/s3", axis=0)], f"{label}/oshape")
    out = lw.g.op("Reshape", [picked, both], label)
    return _out(lw, e, scope, roles, base.dtype, out, offset=base.offset)


def _argsort_like(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    x = lw.canonical(ins[0])
    k = lw.size(x.own[-1])
    _, idx = lw.g.node("TopK", [x.name, k], _label(e, scope, e.op), 2, axis=-1, largest=0,
                       sorted=1)
    return _out(lw, e, scope, x.roles, "int", idx, offset=1)


def _argmax(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    x = lw.canonical(ins[0])
    out = lw.g.op("ArgMax", [x.name], _label(e, scope, "ArgMax"), axis=-1, keepdims=0)
    return _out(lw, e, scope, x.roles, "int", out, offset=1)


def _members(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    """An axis of the operand's own as the family axis (the role of the family index)."""
    x = lw.canonical(ins[0])
    role = lw.family_role(e, scope)
    roles = tuple(sorted((*x.roles, role), key=lambda r: r.order))
    src = len(x.roles) + e.attrs["axis"]
    perm = list(range(len(x.roles) + len(x.own)))
    perm.insert(roles.index(role), perm.pop(src))
    out = lw.g.op("Transpose", [x.name], _label(e, scope, "members"), perm=perm)
    if e.attrs.get("keep"):  # `g[:, i .. i]`: a unit axis where the member's axis was
        at = len(roles) + e.attrs["axis"]
        out = lw.g.op("Unsqueeze", [out, lw.g.ints([at])], _label(e, scope, "members"))
    return _out(lw, e, scope, roles, x.dtype, out, offset=x.offset, fam=role)


def _sum_members(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    """sum(y_1, ..., y_E): the family axis summed away."""
    x = lw.canonical(ins[0])
    axis = x.roles.index(x.fam)
    out = lw.g.op("ReduceSum", [x.name, lw.g.ints([axis])], _label(e, scope, "ReduceSum"),
                  keepdims=0)
    roles = tuple(r for r in x.roles if r is not x.fam)
    return _out(lw, e, scope, roles, x.dtype, out)


def _keeptopk(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    """The k largest entries of the last axis kept, the others -inf: TopK's k-th value
    as the threshold."""
    x = lw.as_real(lw.canonical(ins[0]))
    label = _label(e, scope, "keeptopk")
    top, _ = lw.g.node("TopK", [x.name, lw.size(lw.ev(e.attrs["k"], scope.env))], label, 2,
                       axis=-1, largest=1, sorted=1)
    kth = lw.g.op("Slice", [top, lw.g.ints([-1]), lw.g.ints([np.iinfo(np.int64).max]),
                            lw.g.ints([-1])], label)
    below = lw.g.op("Less", [x.name, kth], label)
    out = lw.g.op("Where", [below, lw.g.const(-np.inf, "real"), x.name], label)
    return _out(lw, e, scope, x.roles, "real", out, fam=x.fam)


def _gather_members(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    """Member i of the result is member index(i) of the operand family: one Gather along
    its family axis with the members each i reads (the sizes are numbers here)."""
    v = lw.gather_members(ins[0], e, e.attrs["index"], scope, _label(e, scope, "members"))
    return _out(lw, e, scope, v.roles, v.dtype, v.name, offset=v.offset, fam=v.fam)


def _mask(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    """A mask by meaning (lowering/masks.py): its bias, if it has one, is its value, and a
    window carries its width (`lazy`); attention reads what it means from the lowering."""
    if ins:
        return ins[0]
    own = tuple(lw.ev(d, scope.env) for d in e.outs[0].type.shape[-2:])
    if "window" in e.attrs:
        return V("real", (), own, kind="window", lazy=lw.ev(e.attrs["window"], scope.env))
    return V("real", (), own)


def _mask_tensor(lw: Lowerer, e: Eqn, ins: list[V], scope: Scope) -> V:
    rows, cols = (lw.ev(d, scope.env) for d in e.outs[0].type.shape[-2:])
    cols = cols + lw.from_past(cols)  # the incremental form: the new rows, every column
    label = _label(e, scope, "mask")
    if e.attrs.get("banded"):
        return lw.causal_table(rows, cols, label, window=ins[0].lazy)
    if e.attrs["causal"]:
        table = lw.causal_table(rows, cols, label)
    else:
        table = _out(lw, e, scope, (), "real", lw.g.op(
            "Expand", [lw.g.const(0.0, "real"), lw.shape_of([rows, cols])], label))
    return lw.plus_bias(ins[0], table, f"{label}/bias") if e.attrs["bias"] else table


LOWER = {
    **{op: _binary for op in ONNX_BINARY}, **{op: _unary for op in ONNX_UNARY},
    "sum": _reduce, "mean": _reduce, "amax": _reduce, "matmul": _matmul,
    "floor": _to_int, "ceil": _to_int,
    "transpose": _transpose, "concat": _concat, "vconcat": _concat, "index": _index,
    "iota": _iota, "broadcast_to": _broadcast_to, "select": _select,
    "invperm": _argsort_like, "argsort": _argsort_like, "argmax": _argmax,
    "members": _members, "mask": _mask, "mask_tensor": _mask_tensor, "lookup": _lookup,
    "gather_members": _gather_members, "sum_members": _sum_members, "keeptopk": _keeptopk,
}


# ---------------------------------------------------------------- builtin modules
# Each takes the callee's scope (its sizes bound) and the argument values; it returns the
# results, or None to lower the module's own equations instead.


def _softmax(lw: Lowerer, callee: Scope, ins: list[V], e: Eqn):
    x = lw.as_real(lw.canonical(ins[0]))
    out = lw.softmax(x.name, callee.path)
    v = V("real", x.roles, x.own, name=out, fam=x.fam)
    lw.info(out, v)
    lw.logits_of[id(v)] = x
    return [v]


def _epsilon(callee: Scope) -> float:
    eps = callee.env.get("eps")
    return eps if isinstance(eps, float) else float(eps.const_value())


def _skip_norm(lw: Lowerer, x: V, op: str, params: list[str], eps: float, path: str):
    """Under --optimize ort, a norm of `a + b` with the sum kept for the residual path:
    one fused node (onnxruntime's Skip`op`) where the sum was computed; else None."""
    node = lw.g.producer_of(x.name)
    if lw.optimize != "ort" or node is None or node.op != "Add" or node.domain \
            or len(x.roles) + len(x.own) != 3:
        return None
    a, b = node.inputs
    info = lw.g.value_info
    if not (a in info and info.get(a) == info.get(b) == info.get(x.name)):
        return None
    out = lw.g.fresh(path)
    lw.g.replace(x.name, Node(f"Skip{op}", [a, b, *params], [out, "", "", x.name], out,
                              lw.g.doc, ORT_DOMAIN, {"epsilon": eps}))
    return _like(lw, x, out)


def _layer_norm(lw: Lowerer, callee: Scope, ins: list[V], e: Eqn):
    if not ins[0].own:
        return None
    x = lw.as_real(lw.canonical(ins[0]))
    gamma, beta = (lw.param(callee, name, None).name for name in intrinsic(callee.fn).params)
    eps, path = _epsilon(callee), callee.path
    if (v := _skip_norm(lw, x, "LayerNormalization", [gamma, beta], eps, path)) is not None:
        return [v]
    out = lw.g.op("LayerNormalization", [x.name, gamma, beta], path, axis=-1, epsilon=eps,
                  stash_type=1)  # its mean and variance in float32 (lowering/precision.py)
    return [_like(lw, x, out)]


def _rms_norm(lw: Lowerer, callee: Scope, ins: list[V], e: Eqn):
    """RMSNormalization (opset 23), and under --optimize ort onnxruntime's
    SkipSimplifiedLayerNormalization after a residual sum; else the module's equations.
    (Its SimplifiedLayerNormalization is registered in the ONNX domain, where onnx.checker
    refuses it, so it is never emitted.) Gemma's scale, 1 + gamma, is an Add on the
    parameter (onnxruntime folds it), so its checkpoint tensor keeps its name."""
    i = intrinsic(callee.fn)
    skip = lw.optimize == "ort" and not i.offset
    # below opset 23 a float32 graph lowers the module's equations; a half-precision one
    # spells out the operator's definition, its mean square in float32 (_rms_float32)
    own = lw.opset >= 23 or lw.precision.half
    if not ins[0].own or not (own or skip):
        return None
    x = lw.as_real(lw.canonical(ins[0]))
    (scale,) = (lw.param(callee, name, None).name for name in i.params)
    eps, path = _epsilon(callee), callee.path
    if skip:  # (Gemma's Add would come after the sum, where the fused node goes)
        v = _skip_norm(lw, x, "SimplifiedLayerNormalization", [scale], eps, path)
        if v is not None:
            return [v]
        if not own:
            return None
    if i.offset:
        scale = lw.g.op("Add", [lw.g.const(i.offset, "real"), scale], f"{path}/scale")
    if lw.opset < 23:
        return [_like(lw, x, _rms_float32(lw, x.name, scale, eps, path))]
    out = lw.g.op("RMSNormalization", [x.name, scale], path, axis=-1, epsilon=eps,
                  stash_type=1)
    return [_like(lw, x, out)]


def _rms_float32(lw: Lowerer, x: str, scale: str, eps: float, path: str) -> str:
    """RMSNormalization's own definition (opset 23, stash_type 1) for an older opset: x
    over the root of its mean square plus eps, in float32, then cast back and scaled (the
    equations in float16 would overflow at |x| > 256)."""
    wide = lw.g.op("Cast", [x], f"{path}/float32", to=lw.g.types["float32"])
    square = lw.g.op("ReduceMean", [lw.g.op("Mul", [wide, wide], f"{path}/square"),
                                    lw.g.ints([-1])], f"{path}/mean_square", keepdims=1)
    root = lw.g.op("Sqrt", [lw.g.op("Add", [square, lw.g.const(eps, "float32")],
                                    f"{path}/plus_eps")], f"{path}/root")
    normed = lw.g.op("Div", [wide, root], f"{path}/normed")
    return lw.g.op("Mul", [lw.g.op("Cast", [normed], f"{path}/normed",
                                   to=lw.g.types["real"]), scale], path)


def _like(lw: Lowerer, x: V, out: str) -> V:
    """A real tensor laid out as `x` (a fused op that keeps its operand's shape)."""
    v = V("real", x.roles, x.own, name=out, fam=x.fam)
    lw.info(out, v)
    return v


def _silu(lw: Lowerer, callee: Scope, ins: list[V], e: Eqn):
    """Swish (opset 24); otherwise the equations' Mul(x, Sigmoid(x))."""
    # onnxruntime has no Swish kernel and inlines its function body, which uses Constant,
    # changed in opset 25: a graph of opset 25 with Swish does not load
    if lw.opset != 24:
        return None
    x = lw.as_real(lw.canonical(ins[0]))
    out = lw.g.op("Swish", [x.name], callee.path)
    return [_like(lw, x, out)]


def _moe(lw: Lowerer, callee: Scope, ins: list[V], e: Eqn):
    """A sparse mixture of experts with standard operators: TopK picks each position's K
    experts and Softmax weighs them; then, expert by expert, the positions that chose it
    are gathered (NonZero), run through its SwiGLU and added back in place (ScatterND's
    add). Each expert's matrices are a Gather of the family's tensor (stored members
    first, each member (out, in)) at a constant member, transposed: onnxruntime folds both
    into a tensor of its own when the session loads."""
    x, (router, gate, up, down), rows, logits, k = _moe_router(lw, callee, ins)
    path = callee.path
    top, chosen = lw.g.node("TopK", [logits, lw.g.ints([k])], f"{path}/top", 2, axis=-1,
                            largest=1, sorted=1)
    weight = lw.softmax(top, f"{path}/weight")
    # the experts' outputs are summed in float32 in a half-precision model (onnxruntime's
    # CPU ScatterND has no float16 add either)
    total = "float32" if lw.precision.half else "real"
    out = lw.g.op("Mul", [lw.g.op("Cast", [rows], f"{path}/rows", to=lw.g.types[total]),
                          lw.g.const(0.0, total)], f"{path}/zeros")
    for expert in range(_int(router.own[-1])):
        at = f"{path}/expert{expert + 1}"
        member = lw.g.const(expert, "int")
        pairs = lw.g.op("NonZero", [lw.g.op("Equal", [chosen, member], at)], at)  # (2, M)
        picked = lw.g.op("Gather", [pairs, lw.g.const(0, "int")], at, axis=0)  # positions
        w = lw.g.op("GatherND", [weight, lw.g.op("Transpose", [pairs], at, perm=[1, 0])], at)
        h = lw.g.op("Gather", [rows, picked], at, axis=0)
        mats = [lw.g.op("Transpose", [lw.g.op("Gather", [p.name, member], where, axis=0)],
                        where, perm=[1, 0])
                for p, where in ((gate, f"{at}/W^gate"), (up, f"{at}/W^up"),
                                 (down, f"{at}/W^down"))]
        a = lw.g.op("MatMul", [h, mats[0]], at)
        a = lw.g.op("Mul", [a, lw.g.op("Sigmoid", [a], at)], at)
        y = lw.g.op("MatMul", [lw.g.op("Mul", [a, lw.g.op("MatMul", [h, mats[1]], at)], at),
                               mats[2]], at)
        y = lw.g.op("Mul", [y, lw.g.op("Unsqueeze", [w, lw.g.ints([1])], at)], at)
        if lw.precision.half:
            y = lw.g.op("Cast", [y], at, to=lw.g.types[total])
        where = lw.g.op("Unsqueeze", [picked, lw.g.ints([1])], at)
        out = lw.g.op("ScatterND", [out, where, y], at, reduction="add")
    if lw.precision.half:
        out = lw.g.op("Cast", [out], path, to=lw.g.types["real"])
    return [_like(lw, x, lw.g.op("Reshape", [out, lw.g.op("Shape", [x.name], path)], path))]


def _moe_router(lw: Lowerer, callee: Scope, ins: list[V]):
    """What both forms of MoE start from: X, the four parameters, X's positions as rows
    (N, H), the router's logits (N, E) and K."""
    x = lw.as_real(lw.canonical(ins[0]))
    params = [lw.param(callee, name, None) for name in intrinsic(callee.fn).params]
    rows = lw.g.op("Reshape", [x.name, lw.g.ints([-1, _int(params[0].own[0])])],
                   f"{callee.path}/rows")
    logits = lw.g.op("MatMul", [rows, params[0].name], f"{callee.path}/router")
    chosen = intrinsic(callee.fn).chosen
    return x, params, rows, logits, _int(lw.ev(Poly.sym(chosen), callee.penv))


def _ort_moe(lw: Lowerer, callee: Scope, ins: list[V], e: Eqn):
    """onnxruntime's MoE: the router's logits in, each position's K experts by TopK with a
    softmax over them (normalize_routing_weights), each a SwiGLU whose gate and up
    matrices are one [E, 2F, H] tensor, their rows interleaved (swiglu_fusion 1, what its
    CPU kernel takes; activation_alpha 1, activation_beta 0 and no limit make it SiLU(gate)
    times up)."""
    x, (router, gate, up, down), rows, logits, k = _moe_router(lw, callee, ins)
    path = callee.path
    experts = _int(router.own[-1])
    # the families are stored members first, each (out, in): gate and up (E, F, H), down
    # (E, H, F), which is fc2 as it is
    arrays = [lw.g.initializers[p.name] for p in (gate, up)]
    f, h = arrays[0].shape[1], arrays[0].shape[2]

    def interleaved(gate_w: np.ndarray, up_w: np.ndarray) -> np.ndarray:
        return np.stack([gate_w, up_w], axis=2).reshape(experts, 2 * f, h)
    # computed from the expert weights when written (Lazy), as the weights themselves are
    fc1 = lw.g.initializer(f"{path}/fc1", Lazy.derived((experts, 2 * f, h), interleaved,
                                                       arrays[0], arrays[1]),
                           f"{gate.name}, {up.name}: their rows interleaved, per expert")
    out = lw.g.op("MoE", [rows, logits, fc1, "", down.name], path, domain=ORT_DOMAIN, k=k,
                  normalize_routing_weights=1, activation_type="swiglu", swiglu_fusion=1,
                  activation_alpha=1.0, activation_beta=0.0, swiglu_limit=float("inf"))
    return [_like(lw, x, lw.g.op("Reshape", [out, lw.g.op("Shape", [x.name], path)], path))]


def _ort_silu(lw: Lowerer, callee: Scope, ins: list[V], e: Eqn):
    """onnxruntime's QuickGelu, x sigmoid(alpha x), at alpha 1 (what its own fusion of
    x * Sigmoid(x) makes)."""
    x = lw.as_real(lw.canonical(ins[0]))
    out = lw.g.op("QuickGelu", [x.name], callee.path, domain=ORT_DOMAIN, alpha=1.0)
    return [_like(lw, x, out)]


def _gelu(lw: Lowerer, callee: Scope, ins: list[V], e: Eqn):
    if lw.opset < 20:
        return None
    x = lw.as_real(lw.canonical(ins[0]))
    out = lw.g.op("Gelu", [x.name], callee.path, approximate=intrinsic(callee.fn).approximate)
    return [_like(lw, x, out)]


def _ort_gelu(lw: Lowerer, callee: Scope, ins: list[V], e: Eqn):
    """FastGelu is the tanh form; BiasGelu and Gelu (com.microsoft) the erf form, a bias
    added just before joining the op."""
    x = lw.as_real(lw.canonical(ins[0]))
    op = "FastGelu" if intrinsic(callee.fn).approximate == "tanh" else "BiasGelu"
    args = [x.name]
    node = lw.g.producer_of(x.name)
    if node is not None and node.op == "Add" and not node.domain:
        a, b = node.inputs
        bias = lw.g.initializers.get(b)
        if bias is not None and bias.ndim == 1 and a in lw.g.value_info:
            args = [a, b]
    if op == "BiasGelu" and len(args) == 1:
        op = "Gelu"
    out = lw.g.op(op, args, callee.path, domain=ORT_DOMAIN)
    return [_like(lw, x, out)]


def _concat_heads(lw: Lowerer, callee: Scope, ins: list[V], e: Eqn):
    (v,) = ins
    if v.fam is None:
        return None
    packed = lw.packed_form(v)
    return [V(v.dtype, tuple(r for r in v.roles if r is not v.fam),
              v.own[:-1] + (v.fam.size * v.own[-1],), name=packed)]


def _attention(lw: Lowerer, callee: Scope, ins: list[V], e: Eqn):
    """Softmax(Q K^T / sqrt(d) + Mask) V over all heads at once: ONNX's Attention op (opset
    23) or onnxruntime's, else its equations with a safe softmax. A query whose mask is
    -inf at every key attends to nothing and gets 0, as PyTorch's and ONNX's Attention do
    (the literal formula would give 0/0)."""
    q, k, v, mask = ins
    # what the mask means at this use, as the lowering decided (lowering/masks.py); None:
    # a tensor
    kind = callee.masks.get(intrinsic(callee.fn).mask_input)
    cap = _softcap(callee)  # the scores' soft cap (Attention^capped), or None
    cached = callee.path in lw.sites
    if cached:  # the incremental form: keys of the earlier positions too
        k, v = lw.extend_cache(callee.path, k, v)
    # a padded batch (passes/padding.py): the keys' padding joins the mask
    pad = lw.pad_sites.get(callee.path.split("/", 1)[1] if callee.layer is not None and
                           callee.path.startswith("layer") else callee.path)
    padding = lw.key_padding(pad, q.own[0], k.own[0]) if pad is not None else None
    # grouped-query: keys and values of G heads, which ONNX's Attention shares out itself
    # where query head i reads head (i - 1) div (A / G) + 1; else each query head's picked
    grouped = e.attrs.get("groups") is not None
    # (not a window: onnxruntime's `local_window_size` counts w keys from 1.31 and w + 1
    # in 1.23, which the graph cannot tell apart)
    if lw.optimize == "ort" and (grouped or cached) and kind is not None and kind.causal \
            and not kind.bias and not kind.window:
        out = _ort_group_attention(lw, q, k, v, intrinsic(callee.fn).scale, callee.path,
                                   padding, cap)
        if out is not None:
            return [out]

    def picked() -> tuple[V, V]:
        return tuple(lw.gather_members(x, e, e.attrs["groups"], callee.caller,
                                       f"{callee.path}/{what}")
                     for x, what in ((k, "K"), (v, "V")))
    if grouped and not (lw.opset >= 23 and q.fam is not None and
                        all(x.fam is not None and x.roles == (lw.batch, x.fam)
                            for x in (q, k, v)) and
                        in_order(lw.picks(e, e.attrs["groups"], callee.caller),
                                 _int(k.fam.size))):
        (k, v), grouped = picked(), False
    if kind is not None and kind.window:  # a band of the keys, aligned to their end
        mask = lw.causal_table(q.own[0], k.own[0], f"{callee.path}/Mask^ST", window=mask.lazy)
        kind = None
    # ONNX's Attention (opset 23) given the past keys as inputs aligns `is_causal` to the
    # keys' end (query i sees the keys up to past + i), padding or not: no table is made
    # where the cached attention will be that node (_heads_attention below)
    aligned = cached and lw.opset >= 23 and kind is not None and kind.causal and \
        not kind.bias and (grouped or _one_family(lw, q, k, v)) and \
        k.kind == "cache" and v.kind == "cache"
    if kind is not None and kind.causal and not aligned and \
            (kind.bias or cached or padding is not None):
        # the causal part as a tensor aligned to the keys' end, plus the bias: one mask
        table = lw.causal_table(q.own[0], k.own[0], f"{callee.path}/Mask^AR")
        mask = lw.plus_bias(mask, table, f"{callee.path}/mask") if kind.bias else table
        kind = None
    causal = kind is not None and kind.causal
    if kind is not None:
        mask = None  # attention runs it as is_causal, or without a mask
    if padding is not None:  # the keys' padding joins what is left as a tensor, if any
        mask = padding if mask is None else _plus_padding(lw, q, k, mask, padding,
                                                          callee.path)
    fused = grouped or _one_family(lw, q, k, v)
    bias = None
    if fused and mask is not None:
        m = lw.as_real(lw.canonical(mask))
        if all(r in q.roles for r in m.roles):
            bias = lw.align(m, q.roles, 2, full=lw.optimize == "ort")
        else:
            fused = False
    if grouped and not fused:  # the equations read each query head's own keys
        (k, v), grouped = picked(), False
    out_own = (q.own[0], v.own[-1])
    path = callee.path
    scale = intrinsic(callee.fn).scale  # None: 1/sqrt(d), every attention op's default
    if fused and (grouped or cached and lw.opset >= 23):
        # the cached keys and values as they are held, G of them where grouped; under
        # --optimize ort too, where MultiHeadAttention would take A heads copied out of the
        # G cached ones at every step
        return [_heads_attention(lw, q, k, v, bias, causal, scale, path, cap)]
    if fused and lw.optimize == "ort" and cap is None:  # (their ops take no cap)
        out = _ort_attention(lw, q, k, v, causal, bias, _int(q.fam.size), path, scale)
        if bias is not None:  # onnxruntime's kernels give NaN for a fully masked query
            out = lw.g.op("Where", [lw.g.op("IsNaN", [out], f"{path}/masked"),
                                    lw.g.const(0.0, "real"), out], f"{path}/safe")
    elif fused and lw.opset >= 23:
        heads = _int(q.fam.size)
        inputs = [lw.packed_form(q), lw.packed_form(k), lw.packed_form(v)]
        if bias is not None:
            inputs.append(bias)
        out = lw.g.op("Attention", inputs, path, is_causal=1 if causal else None,
                      q_num_heads=heads, kv_num_heads=heads, scale=scale, softcap=cap,
                      softmax_precision=_softmax_precision(lw))
    else:
        return [_attention_equations(lw, callee, q, k, v, mask, causal, scale, cap)]
    res = V("real", q.roles, out_own, packed=out, fam=q.fam)
    lw.info(out, res, packed=True)
    return [res]


def _softcap(callee: Scope) -> float | None:
    """The soft cap c of an Attention^capped use (its scores c tanh(s / c)), else None."""
    name = intrinsic(callee.fn).softcap
    if name is None:
        return None
    c = callee.env.get(name)
    return c if isinstance(c, float) else float(c.const_value())


def _one_family(lw: Lowerer, q: V, k: V, v: V) -> bool:
    """Whether the queries, keys and values are the members of one family, (batch,
    heads), as ONNX's attention ops take them."""
    return q.fam is not None and q.fam is k.fam is v.fam and \
        q.roles == (lw.batch, q.fam) and k.roles == q.roles and v.roles == q.roles


def _plus_padding(lw: Lowerer, q: V, k: V, mask: V, padding: V, path: str) -> V:
    """A mask as a tensor plus the keys' padding: one additive mask (batch, ..., rows,
    cols)."""
    table = lw.as_real(lw.canonical(mask))
    roles = lw.merge_roles(table, padding)
    out = lw.g.op("Add", [lw.align(table, roles, 2), lw.align(padding, roles, 2)],
                  f"{path}/padded")
    v = V("real", roles, (q.own[0], k.own[0]), name=out)
    lw.info(out, v)
    return v


def _heads_attention(lw: Lowerer, q: V, k: V, v: V, bias: str | None, causal: bool,
                     scale: float | None, path: str, cap: float | None = None) -> V:
    """ONNX's Attention (opset 23) over q's heads and k's and v's, which may be fewer
    (query head i reads key/value head i // (A / G)). Projections still in one product's
    layout, (batch, T, heads · d), are taken and given back so: no Reshape or Transpose
    around it. In the incremental form the past keys and values are its inputs and the
    present ones its outputs, not a Concat before it."""
    past = k.kind == "cache" and v.kind == "cache"
    if past:
        (pk, k, rk), (pv, v, rv) = k.lazy, v.lazy
    flat = all(x.packed is not None or x.kind == "proj" for x in (q, k, v))
    inputs = [lw.packed_form(x) if flat else lw.as_real(lw.canonical(x)).name
              for x in (q, k, v)]
    if bias is not None or past:
        inputs.append(bias or "")
    if past:
        inputs += [pk, pv]
    heads = {"q_num_heads": _int(q.fam.size), "kv_num_heads": _int(k.fam.size)} if flat \
        else {}
    outs = lw.g.node("Attention", inputs, path, 3 if past else 1,
                     is_causal=1 if causal else None, scale=scale, softcap=cap,
                     softmax_precision=_softmax_precision(lw), **heads)
    if past:
        total = Poly.sym(PAST) + k.own[0]
        for present, new, tensor in ((rk, k, outs[1]), (rv, v, outs[2])):
            lw.presents[present] = tensor
            lw.info(tensor, V("real", new.roles, (total, *new.own[1:]), fam=new.fam))
    res = V("real", q.roles, (q.own[0], v.own[-1]), fam=q.fam,
            **({"packed": outs[0]} if flat else {"name": outs[0]}))
    lw.info(outs[0], res, packed=flat)
    return res


def _rotation_text(r: Rotary) -> str:
    """A rotation as its tables' descriptions name it."""
    return f"width {r.width}, theta {r.theta:g}" + (
        f", {r.scaling} scaling {list(r.factors)}" if r.factors else "")


def _ort_group_attention(lw: Lowerer, q: V, k: V, v: V, scale: float | None,
                         path: str, padding: V | None = None,
                         cap: float | None = None) -> V | None:
    """onnxruntime's GroupQueryAttention: causal attention of A query heads over G key and
    value heads (G = A too), in one product's layout, with the past keys and values in
    and the present ones out in the incremental form. Where q and k are turned by one
    rotation (its rotary
    operators made them), it turns them itself (`do_rotary`, the tables from position 0:
    it reads each row's by position, the past's length on). A padded batch's keys are
    its `attention_bias`. Turning them itself, it counts positions in the padded row, not
    among the row's tokens, where the rotary operators would: RoPE's scores depend on the
    distance between a query and a key alone, which padding at the ends keeps, so the
    attention is each row's alone all the same (to float32 rounding); the keys it caches
    are turned so, and only this graph reads them. None where its kernel does not apply
    (a head width not a multiple of 8; queries and keys of different lengths)."""
    past = k.kind == "cache" and v.kind == "cache"
    if past:
        (pk, kn, rk), (pv, vn, rv) = k.lazy, v.lazy
    else:
        kn, vn = k, v
    if not all(x.fam is not None for x in (q, kn, vn)) or q.own[0] != kn.own[0]:
        return None
    d = _int(q.own[-1])
    if d % 8:
        return None
    xq, xk = lw.packed_form(q), lw.packed_form(kn)
    rq, rk_ = lw.turned.get(xq), lw.turned.get(xk)
    rot = rq[1] if rq and rk_ and rq[1] == rk_[1] else None
    if rot is not None and (d % 16 or rot.width // 2 % 8 or rot.width > d):
        rot = None  # its rotation's tables: a multiple of 8 wide, half the head at most
    if rot is not None:
        xq, xk = rq[0], rk_[0]
    xv = lw.packed_form(vn)
    made = [lw.g.producer_of(x) for x in (xq, xk, xv)]
    if made[0] is not None and made[0].op == "Split" and all(m is made[0] for m in made) \
            and made[0].outputs == [xq, xk, xv]:
        xq, xk, xv = made[0].inputs[0], "", ""  # one product's Q | K | V: packed
    total = Poly.sym(PAST) + kn.own[0] if past else kn.own[0]
    key = ("gqa lengths", str(total), padding is not None)
    if key not in lw.shared_tables:  # made once, for every layer
        # the keys' number: the padding mask's width where there is one, which stays right
        # where the runtime gives the past in a buffer of the longest length (GQA's
        # past_present_share_buffer: runtime/generate.py)
        size = lw.g.op("Shape", [padding.name], "attention/total", start=-1) \
            if padding is not None else lw.size(total)
        n = lw.g.op("Cast", [lw.g.op("Squeeze", [size, lw.g.ints([0])], "attention/total")],
                    "attention/total", to=6)  # int32
        batch = lw.g.op("Shape", [xq], "attention/batch", start=0, end=1)
        last = lw.g.op("Sub", [n, lw.g.op("Cast", [lw.g.const(1, "int")], "attention/one",
                                          to=6)], "attention/last")
        lw.shared_tables[key] = (lw.g.op("Expand", [last, batch], "attention/lengths"), n)
    lengths, n = lw.shared_tables[key]
    inputs = [xq, xk, xv, pk if past else "", pv if past else "", lengths, n]
    attrs = {"num_heads": _int(q.fam.size), "kv_num_heads": _int(kn.fam.size),
             "scale": scale, "softcap": cap}
    if rot is not None:
        inputs += list(lw.rotary_tables(rot, total, whole=True)) + [""]
    else:
        inputs += ["", "", ""]
    if rot is not None:
        attrs.update(do_rotary=1, rotary_interleaved=1 if rot.interleaved else 0)
    if padding is not None:  # (batch, 1, T, P + T), made once for every layer
        bias = ("gqa bias", padding.name)
        if bias not in lw.shared_tables:
            lw.shared_tables[bias] = lw.align(padding, (lw.batch, q.fam), 2)
        inputs.append(lw.shared_tables[bias])
    while inputs[-1] == "":
        inputs.pop()
    outs = lw.g.node("GroupQueryAttention", inputs, path, 3, domain=ORT_DOMAIN, **attrs)
    if past:
        # its kernel takes several new positions after a past at batch 1 only: the runtime
        # says so before onnxruntime would (runtime/session.py)
        lw.signature["incremental"]["chunk_batch"] = 1
        if padding is not None:
            lw.shareable.add(path)
        for present, new, tensor in ((rk, kn, outs[1]), (rv, vn, outs[2])):
            lw.presents[present] = tensor
            lw.info(tensor, V("real", new.roles, (total, *new.own[1:]), fam=new.fam))
    res = V("real", q.roles, (q.own[0], vn.own[-1]), fam=q.fam, packed=outs[0])
    lw.info(outs[0], res, packed=True)
    return res


def _softmax_precision(lw: Lowerer) -> int | None:
    """ONNX Attention's softmax in float32 (TensorProto.FLOAT) in a half-precision model,
    as every other softmax of it (lowering/precision.py); by default the op would run it
    in its inputs' type."""
    return 1 if lw.precision.half else None


def _attention_equations(lw: Lowerer, callee: Scope, q: V, k: V, v: V, mask: V | None,
                         causal: bool, factor: float | None = None,
                         cap: float | None = None) -> V:
    path = callee.path
    if causal:
        mask = lw.causal_table(q.own[0], k.own[0], f"{path}/Mask^AR")
    roles = lw.merge_roles(q, k, v, *([] if mask is None else [mask]))
    q, k, v = (lw.as_real(lw.canonical(x)) for x in (q, k, v))
    kt = lw.g.op("Transpose", [lw.align(k, roles, 2, full=True)], f"{path}/K^T",
                 perm=list(range(len(roles))) + [len(roles) + 1, len(roles)])
    scores = lw.g.op("MatMul", [lw.align(q, roles, 2), kt], f"{path}/QK^T")
    d = q.own[-1]
    scale = lw.g.const(factor, "real") if factor is not None else \
        lw.g.const(1.0 / float(d.const_value()) ** 0.5, "real") if d.is_const() else \
        lw.g.op("Reciprocal", [lw.g.op("Sqrt", [lw.g.op("Cast", [lw.scalar_size(d)], f"{path}/d",
                                                         to=lw.g.types["real"])],
                                       f"{path}/sqrt_d")],
                f"{path}/scale")
    scores = lw.g.op("Mul", [scores, scale], f"{path}/scaled")
    if cap is not None:  # Attention^capped: cap * tanh(scores / cap)
        c = lw.g.const(cap, "real")
        scores = lw.g.op("Mul", [lw.g.op("Tanh", [lw.g.op("Div", [scores, c], f"{path}/over_c")],
                                         f"{path}/tanh"), c], f"{path}/capped")
    safe = False
    if mask is not None:
        safe = not causal
        m = lw.as_real(lw.canonical(mask))
        scores = lw.g.op("Add", [scores, lw.align(m, roles, 2)], f"{path}/masked")
    p = lw.softmax(scores, f"{path}/Softmax")
    if safe:
        p = lw.g.op("Where", [lw.g.op("IsNaN", [p], f"{path}/none"), lw.g.const(0.0, "real"),
                              p], f"{path}/weights")
    out = lw.g.op("MatMul", [p, lw.align(v, roles, 2)], path)
    fam = q.fam if q.fam is not None and q.fam in roles else None
    res = V("real", roles, (q.own[0], v.own[-1]), name=out, fam=fam)
    lw.info(out, res)
    return res


def _ort_attention(lw: Lowerer, q: V, k: V, v: V, causal: bool, bias: str | None,
                   heads: int, path: str, scale: float | None = None) -> str:
    """com.microsoft Attention when one input feeds the query, key and value projections
    (their weights packed side by side: one GEMM), MultiHeadAttention otherwise; `scale`
    is the scores' factor (None: 1/sqrt(d))."""
    attrs = {"num_heads": heads, "unidirectional": 1 if causal else None, "scale": scale}
    # (quantized weights: the products stay their own, MatMulNBits each)
    same_x = q.kind == k.kind == v.kind == "proj" and q.lazy[0] is k.lazy[0] is v.lazy[0] \
        and lw.quantizer is None
    if not same_x:  # (unidirectional: causal over queries and keys of one length)
        inputs = [lw.packed_form(q), lw.packed_form(k), lw.packed_form(v)]
        if bias is not None:
            inputs += ["", "", bias]
        return lw.g.op("MultiHeadAttention", inputs, path, domain=ORT_DOMAIN, **attrs)
    x = lw.canonical(q.lazy[0])
    ws = [lw.g.initializers[p.lazy[1]] for p in (q, k, v)]
    h = ws[0].shape[0]
    packed = Joined([w.reshape(h, -1) for w in ws])  # joined when written
    names = ", ".join(p.lazy[1] for p in (q, k, v))
    w = lw.g.initializer(f"{path}/W_QKV", packed, f"{names} side by side")
    bs = [lw.g.initializers[p.lazy[2]].reshape(-1) if p.lazy[2] else
          np.zeros(packed.shape[1] // 3, np.float32) for p in (q, k, v)]
    b = lw.g.initializer(f"{path}/b_QKV", Joined(bs))
    inputs = [x.name, w, b]
    if bias is not None:
        inputs += ["", "", bias]
    sizes = [a.size // h for a in ws]
    if len(set(sizes)) > 1:
        attrs["qkv_hidden_sizes"] = sizes
    return lw.g.op("Attention", inputs, path, domain=ORT_DOMAIN, **attrs)


def _rotation(lw: Lowerer, callee: Scope, ins: list[V]):
    """RoPE's operand as the rotary operators take it, (batch, heads, T, d) or (batch, T,
    d), with what this use turns and its heads; None for another layout."""
    x = ins[0]
    if x.dtype != "real" or x.name is None and x.packed is None and x.kind != "proj":
        x = lw.as_real(lw.canonical(x))
    if x.roles[:1] != (lw.batch,) or len(x.roles) > 2 or len(x.own) != 2 or \
            not x.own[1].is_const():
        return None
    heads = _int(x.roles[1].size) if len(x.roles) == 2 else 1
    return x, rotary(callee.fn, callee.env, _int(x.own[1])), heads


def _turned(lw: Lowerer, x: V, op: str, inputs: list[str], path: str, domain: str = "",
            **attrs) -> V:
    """A rotary operator on `x`: heads in one product's layout, (batch, T, heads · d), stay
    so (the operator splits them by `num_heads`); otherwise (batch, heads, T, d)."""
    if x.fam is not None and (x.packed is not None or x.kind == "proj"):
        # (batch, T, heads · d)
        attrs["num_heads"] = _int(x.fam.size)
        out = lw.g.op(op, [lw.packed_form(x), *inputs], path, domain, **attrs)
        res = V("real", x.roles, x.own, packed=out, fam=x.fam)
        lw.info(out, res, packed=True)
        return res
    out = lw.g.op(op, [x.name, *inputs], path, domain, **attrs)
    return _like(lw, x, out)


def _rotary(lw: Lowerer, callee: Scope, ins: list[V], e: Eqn):
    """RotaryEmbedding (opset 23), every head at once, its cosines and sines given by
    position ids 0..T-1 into tables of this run's positions (`Lowerer.rotary_tables`);
    below opset 23, the module's equations."""
    found = _rotation(lw, callee, ins) if lw.opset >= 23 else None
    if found is None:
        return None
    x, r, heads = found
    path = callee.path
    key = ("rotary ids", str(x.own[0]))
    pad = lw.pad_of(x.own[0])
    if pad is not None:  # a padded batch: each token's position, into tables from 0
        cos, sin = lw.rotary_tables(r, lw.from_past(x.own[0]) + x.own[0], whole=True)
        lw.shared_tables[key] = lw.positions(pad, x.own[0])
    else:
        cos, sin = lw.rotary_tables(r, x.own[0])
    if key not in lw.shared_tables:  # made once, for every layer
        # (onnxruntime wants ids for every row of the batch: the same ones)
        rows = lw.g.op("Range", [lw.g.const(0, "int"), lw.scalar_size(x.own[0]),
                                 lw.g.const(1, "int")], "rotary/ids")
        batch = lw.g.op("Shape", [x.name or lw.packed_form(x)], "rotary/batch", start=0,
                        end=1)
        lw.shared_tables[key] = lw.g.op(
            "Expand", [lw.g.op("Unsqueeze", [rows, lw.g.ints([0])], "rotary/ids"),
                       lw.g.op("Concat", [batch, lw.g.ints([1])], "rotary/ids", axis=0)],
            "rotary/ids")
    ids = lw.shared_tables[key]
    return [_turned(lw, x, "RotaryEmbedding", [cos, sin, ids], path,
                    interleaved=1 if r.interleaved else None,
                    rotary_embedding_dim=r.width if r.width != _int(x.own[1]) else None,
                    num_heads=heads if len(x.roles) == 1 else None)]


def _ort_rotary(lw: Lowerer, callee: Scope, ins: list[V], e: Eqn):
    """onnxruntime's RotaryEmbedding (com.microsoft), its position ids an offset of 0 into
    tables of this run's positions (`Lowerer.rotary_tables`)."""
    found = _rotation(lw, callee, ins)
    if found is None:
        return None
    x, r, heads = found
    pad = lw.pad_of(x.own[0])
    if pad is not None:  # a padded batch: each token's position, into tables from 0
        cos, sin = lw.rotary_tables(r, lw.from_past(x.own[0]) + x.own[0], whole=True)
        ids = lw.positions(pad, x.own[0])
    else:
        cos, sin = lw.rotary_tables(r, x.own[0])
        ids = lw.g.ints([0])
    res = _turned(lw, x, "RotaryEmbedding", [ids, cos, sin], callee.path,
                  ORT_DOMAIN, interleaved=1 if r.interleaved else 0,
                  rotary_embedding_dim=r.width, num_heads=heads)
    if res.packed is not None:  # GroupQueryAttention may turn the projection itself
        lw.turned[res.packed] = (lw.packed_form(x), r)
    return [res]


# Intrinsics (compiler/elaborate/intrinsics.py) lowered to fused operators, by kind; masks
# by what they mean. An entry may return None (or be None) to lower the module's equations.
FUSED = {
    "attention": _attention, "layer_norm": _layer_norm, "softmax": _softmax, "gelu": _gelu,
    "rms_norm": _rms_norm, "silu": _silu, "moe": _moe, "rotary": _rotary,
    "onehot": None,  # times a table, the lowered `lookup` (lowering/lookups.py)
    "concat": _concat_heads,
    # a mask is its equations where it is a tensor; where attention reads it by meaning,
    # the lowering has made it a `mask` operation (lowering/masks.py)
    "mask": None,
}
# --optimize ort: onnxruntime's contrib operators where they differ (attention and the
# norms fuse with the Add before them inside their entries)
FUSED_ORT = {**FUSED, "gelu": _ort_gelu, "silu": _ort_silu, "moe": _ort_moe,
             "rotary": _ort_rotary}


def fused(fn: ir.Function, optimize: str | None):
    """How an intrinsic module lowers under this optimisation level, or None."""
    i = intrinsic(fn)
    if i is None:
        return None
    return (FUSED_ORT if optimize == "ort" else FUSED)[i.kind]

