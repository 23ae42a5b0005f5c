"""Refusing work that cannot finish: what a compile would build, estimated from the IR before
any of it is built.

The ONNX lowering inlines every module use and unrolls the layer loop, so its graph grows
with the number of layers times the equations of one layer, whatever the widths: GPT-2 at
`--set L=100000` and a width of 8 is 4 million nodes and initializers, about 15 minutes
and 17 GB of memory before the first byte is written. The estimate here counts equations
through the IR's calls (each module once, by name) and multiplies by the layer count, so it
costs as much as the spec's own text, never as much as the graph. The torch backend writes
one class per module and a `for` loop over the layers, so its model.py grows with the
spec's text only; it is estimated the same way, without the multiplication.

Constant tables (an element-wise definition over a size) are not counted: the ONNX lowering
computes the large ones at run time (`Range`, then arithmetic), and the torch module always
does (`torch.arange`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..elaborate import ir
from ..elaborate.intrinsics import is_kind
from ..elaborate.symbolic import Poly, format_poly
from ..errors import FgcError
from ..lowering.products import groups
from .params import as_int

# Measured on GPT-2 at a width of 8 (2 cores): the ONNX lowering takes about 0.2 ms and
# 4 KB of memory per node or initializer, so 250,000 is under a minute and about 1 GB. The
# estimate is within a factor of two of the graph built (tests/test_budget.py): GPT-2 xl
# is estimated at 3,600 (48 layers), GPT-3 175B at 6,700 (96; 7,200 with --kv-cache).
MAX_ONNX_ENTRIES = 250_000
# model.py: about two lines per equation of each module, written once.
MAX_TORCH_LINES = 200_000
TORCH_LINES_PER_EQN = 2
TORCH_LINES_FIXED = 200  # imports, constants, build(), the model's class
KV_ENTRIES_PER_ATTENTION = 6  # past and present key and value, two Concats
# A sparse MoE is not its equations: in standard operators it is lowered expert by expert
# (its positions, its three matrices, its SwiGLU, its scatter back), 23 nodes and constants
# an expert, measured on specs/qwen3_moe.fgpt at L = 1 (E = 64: 1,572 entries; E = 128:
# 3,044), after the router, TopK and Softmax; under --optimize ort it is onnxruntime's MoE,
# one node whatever E, between the router's product and the reshapes around it.
MOE_ENTRIES_PER_EXPERT = 23
MOE_ENTRIES = 8


@dataclass
class Estimate:
    """What a compile would build, from the IR alone."""

    target: str
    total: int  # ONNX: nodes + initializers; torch: lines of model.py
    limit: int
    per_layer: list[tuple[int, int]]  # (layers, entries in one layer) for each `layers` block
    outside: int  # entries outside the layers

    def message(self) -> str:
        if self.target == "onnx":
            what = f"the ONNX graph would have about {self.total:,} nodes and initializers"
        else:
            what = f"the generated model.py would have about {self.total:,} lines"
        parts = [f"{per:,} per layer × {layers:,} layers" for layers, per in self.per_layer]
        if parts:
            what += f" ({' + '.join(parts)} + {self.outside:,} outside the layers)"
        return f"{what}; fgc's limit is {self.limit:,}"


def estimate(cfg, target: str, kv_cache: bool = False, optimize: str | None = None
             ) -> Estimate:
    """The size of what compiling `cfg` (a configured spec) to `target` builds (`optimize`:
    the ONNX lowering's level); no unrolling: each module's equations are counted once."""
    functions: dict[str, ir.Function] = cfg.functions
    memo: dict[str, tuple[int, int]] = {}

    def inlined(fn_name: str) -> tuple[int, int]:
        """(equations, attention calls) of one use of a module, its calls expanded."""
        if fn_name not in memo:
            memo[fn_name] = (0, 0)  # cycles are impossible; this only ends the recursion
            n, sites = block(functions[fn_name].eqns)
            # a group of k products by one operand: a MatMul and a Split by one initializer
            # (lowering/products.py), not k of each
            found = {id(g): len(g) for g in groups(functions[fn_name]).values()}
            memo[fn_name] = (n - sum(2 * k - 3 for k in found.values()), sites)
            if is_kind(functions[fn_name], "attention"):
                memo[fn_name] = (memo[fn_name][0], memo[fn_name][1] + 1)
        return memo[fn_name]

    def block(eqns: list[ir.Eqn]) -> tuple[int, int]:
        n = sites = 0
        for e in eqns:
            if e.op == "call" and is_kind(functions.get(e.attrs.get("module")), "moe"):
                n += MOE_ENTRIES + (0 if optimize == "ort" else
                                    MOE_ENTRIES_PER_EXPERT * _experts(e))
            elif e.op == "call" and e.attrs.get("module") in functions:
                k, s = inlined(e.attrs["module"])
                n, sites = n + k, sites + s
            else:
                n += 1
        return n, sites

    if target == "torch":
        eqns = sum(len(functions[name].eqns) for name in ir.used_modules(cfg.model, functions))
        eqns += sum(len(item.body) if isinstance(item, ir.Loop) else 1
                    for item in cfg.model.body)
        total = TORCH_LINES_FIXED + TORCH_LINES_PER_EQN * eqns
        return Estimate("torch", total, MAX_TORCH_LINES, [], total)

    params = _initializers(cfg)
    per_layer: list[tuple[int, int]] = []
    outside = params.get(None, 0)
    index = 0
    for item in cfg.model.body:
        if isinstance(item, ir.Loop):
            layers = max(as_int(item.hi) - as_int(item.lo) + 1, 0)
            nodes, sites = block(item.body)
            per = nodes + (KV_ENTRIES_PER_ATTENTION * sites if kv_cache else 0)
            per += -(-params.get(index, 0) // max(layers, 1))
            per_layer.append((layers, per))
            index += 1
        else:
            outside += block([item])[0]
    total = outside + sum(layers * per for layers, per in per_layer)
    return Estimate("onnx", total, MAX_ONNX_ENTRIES, per_layer, outside)


def _experts(e: ir.Eqn) -> int:
    """E at a use of MoE (0 where its binding is not a number here)."""
    experts = e.attrs.get("bindings", {}).get("E")
    return as_int(experts) if isinstance(experts, Poly) and experts.is_const() else 0


def _initializers(cfg) -> dict[int | None, int]:
    """Parameter tensors by `layers` block (None: outside the layers); a family is one."""
    out: dict[int | None, int] = {}
    for entry in cfg.count.entries:
        if entry.in_layers and not entry.shared:
            out[entry.loop] = out.get(entry.loop, 0) + as_int(entry.layers)
        else:
            out[None] = out.get(None, 0) + 1
    return out


def check_budget(spec, cfg, target: str, kv_cache: bool = False,
                 optimize: str | None = None) -> None:
    """Raise FgcError, located at the model, when compiling `cfg` to `target` would build
    more than fgc's limit; cheap (the IR's equations are counted, not unrolled)."""
    est = estimate(cfg, target, kv_cache, optimize)
    if est.total <= est.limit:
        return
    if target == "onnx" and optimize != "ort" and \
            estimate(cfg, target, kv_cache, "ort").total <= est.limit:
        raise FgcError(est.message(), spec.model.span,
                       "its mixture of experts is lowered expert by expert in standard "
                       "operators; --optimize ort makes each one onnxruntime's MoE operator, "
                       "which fits")
    loops = [item for item in spec.symbolic().model.body if isinstance(item, ir.Loop)]
    if target == "onnx" and len(est.per_layer) == 1 and loops:
        fits = max((est.limit - est.outside) // max(est.per_layer[0][1], 1), 0)
        count = format_poly(loops[0].hi)
        given = f" (--set {count}={fits})" if len(loops[0].hi.symbols()) == 1 and \
            count in {h.name for h in spec.model.hypers} else ""
        hint = (f"about {fits:,} layers fit{given}; the torch target's model.py does not "
                "grow with the number of layers")
        raise FgcError(est.message(), loops[0].span, hint)
    raise FgcError(est.message(), loops[0].span if loops else spec.model.span,
                   "use fewer layers, or the torch target, whose model.py does not grow "
                   "with the number of layers" if target == "onnx" else None)


__all__ = ["Estimate", "estimate", "check_budget", "MAX_ONNX_ENTRIES", "MAX_TORCH_LINES"]
