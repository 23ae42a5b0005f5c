"""Planning numbers for a model spread over N tensor-parallel ranks times M FSDP ranks
(`fgc params SPEC --tp N --fsdp M --batch B --seq T`), from the same plan parallelize()
applies (lowering/parallel.py), as formulas in the hyperparameters and as numbers.

Per rank, the largest share:
  - parameters, their gradients and AdamW's two moments: a split parameter's 1/N, then
    FSDP's 1/M of that (its first axis in M pieces, the first the largest);
  - activations of one layer: every value the layer's equations compute, modules
    included, at batch B and T positions (a bound on what autograd keeps), a split value's
    1/N;
Per layer and training step, the bytes each rank hands to collectives:
  - tensor parallelism, forward: an all-reduce of every partial value, an all-gather of
    every split value read whole (the gathered size);
  - tensor parallelism, backward: an all-reduce of the gradient of every replicated value
    a split computation reads;
  - with sequence parallelism (the positions split evenly), a reduce-scatter in place of
    each all-reduce of a partial value (its gradient all-gathered), an all-gather of each
    block of positions read whole (a split computation's gradient reduce-scattered), and
    an all-reduce of the gradient of every weight read on blocks of positions (a norm's);
    the values held as blocks of positions take 1/N of the activations;
  - FSDP: the layer's parameters (this rank's tensor-parallel blocks) all-gathered before
    the forward pass and again before the backward pass, their gradients reduce-scattered.
Bytes are float32 entries (4 bytes each).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..elaborate import ir
from ..elaborate.intrinsics import intrinsic, is_kind
from ..elaborate.ir import Ell, Eqn, Loop
from ..elaborate.symbolic import Poly
from ..lowering.parallel import Plan
from .params import Count, guard_factor

ADAM_MOMENTS = 2  # exp_avg, exp_avg_sq (the step count is one number per parameter)


@dataclass
class Traffic:
    """Entries handed to collectives (forward, backward) and entries computed, per rank."""

    forward: Poly = field(default_factory=Poly)
    backward: Poly = field(default_factory=Poly)
    values: Poly = field(default_factory=Poly)

    def add(self, other: Traffic, times: Poly | int = 1) -> None:
        self.forward = self.forward + other.forward * times
        self.backward = self.backward + other.backward * times
        self.values = self.values + other.values * times


@dataclass
class Block:
    """One `layers` block (an encoder's, a decoder's): how many layers, one layer's
    parameter entries per rank (what FSDP gathers for it) and traffic."""

    layers: Poly
    params: Poly
    traffic: Traffic


@dataclass
class Budget:
    params: Poly  # entries per rank
    blocks: list[Block]
    outside: Traffic  # the model's own equations (embedding, head)


def budget(count: Count, model: ir.Model, functions: dict[str, ir.Function],
           plans: dict[str, Plan], tp: int, fsdp: int, batch: Poly, seq: Poly,
           env: dict | None = None, sequence: bool = False) -> Budget:
    """The per-rank figures of `model` (prepared IR) and its `count`: at the sizes `env`
    (hyperparameter -> number), or symbolic with `env` None (a condition on the sizes a
    factor `[tied == 1]`, as in the parameter count's formula); `sequence`: with sequence
    parallelism (the run's positions split evenly)."""
    params = Poly()
    loops = [item for item in model.body if isinstance(item, Loop)]
    per_layer = [Poly() for _ in loops]
    for e in count.entries:
        plan = plans.get(e.module)
        split = plan.splits.get(e.name) if plan is not None else None
        share = _rank0(e, split, tp, fsdp) if env is not None else \
            e.per_use / (tp if split is not None else 1) / fsdp
        params = params + share * e.copies
        if e.in_layers and not e.shared and e.loop < len(loops):
            per_layer[e.loop] = per_layer[e.loop] + share * (e.copies / e.layers)
    seqs = ir.sequence_symbols(model, functions)
    walk = _Sizes(functions, plans, tp, batch, {s: seq for s in seqs}, env, sequence)
    known = {v.name: (v.type, Poly.const(1), True) for v in model.inputs}
    known.update({p.name: (p.type, Poly.const(1), False) for p in model.params
                  if p.type.family is None})
    made = {o.name: o.type for item in model.body
            for e in (item.body if isinstance(item, Loop) else [item]) for o in e.outs}
    for loop in loops:  # X^(l-1) inside the layers, X^(L) after them: as X^(l)
        for c in loop.carried:
            if c.result in made:
                known[c.inner] = (made[c.result], Poly.const(1), True)
        for x, last in loop.results:
            if x in made:
                known[last] = (made[x], Poly.const(1), True)
    outside = walk.body([e for e in model.body if not isinstance(e, Loop)], plans.get(""),
                        {}, (), False, known=known)
    known = walk.seen  # every value of the model's own equations, for the layers to read
    blocks = [Block(loop.hi, per_layer[k], walk.body(loop.body, plans.get(""), {}, (), False,
                                                     known=dict(known)))
              for k, loop in enumerate(loops)]
    return Budget(params, blocks, outside)


def _rank0(e, split, tp: int, fsdp: int) -> Poly:
    """Entries of one copy of parameter `e` on rank 0, the largest share: stored as the
    torch module holds it (names.family_layout), its split axis in tp blocks, then its
    first axis in fsdp pieces of ceil(size / fsdp) (FSDP2's)."""
    from ..names import family_layout
    dims = [int(d.const_value()) for d in e.shape]
    if e.family is not None:
        dims = family_layout(dims, int(e.family.const_value()), e.members_first)
    if split is not None:
        dims[split.axis] //= tp
    if dims and fsdp > 1:
        dims[0] = -(-dims[0] // fsdp)
    n = 1
    for d in dims:
        n *= d
    return Poly.const(n)


class _Sizes:
    def __init__(self, functions, plans, tp, batch, seq_env, env, sequence=False):
        self.sequence = sequence  # sequence parallelism on
        self.env = env  # the sizes as numbers, or None (symbolic)
        self.functions = functions
        self.plans = plans
        self.tp = tp
        self.batch = batch
        self.seq_env = seq_env

    def size(self, t: ir.TensorType, env: dict, ell: tuple, members: Poly,
             batched: bool = True) -> Poly:
        """Entries of a value of type `t` (a module's sizes `env`, its `...` the caller's
        `ell`), times `members`, and the batch where it is one per sequence (`batched`:
        made from the model's inputs, not from parameters and sizes alone)."""
        out = members
        for d in t.shape:
            if isinstance(d, Ell):
                for x in ell:
                    out = out * x
                continue
            out = out * (d.subs(env).subs(self.seq_env) if isinstance(d, Poly) else 1)
        return out * self.batch if batched else out

    def body(self, eqns: list[Eqn], plan: Plan | None, env: dict, ell: tuple,
             split: bool, fn: ir.Function | None = None, known: dict | None = None,
             batched_inputs: list[bool] | None = None) -> Traffic:
        """Traffic of equations whose sizes are `env` (module symbol -> the model's),
        `...` the caller's `ell`; `split`: all of it this rank's block; `fn`: the module
        whose body it is (its inputs' types)."""
        out = Traffic()
        # value -> (type, members, one per sequence)
        entered: set = set()  # the values entering split computations (one all-reduce each)
        types: dict[str, tuple] = dict(known or {})
        for k, v in enumerate(fn.inputs if fn is not None else []):
            if v.name not in fn.mask_inputs:  # a mask by meaning is no tensor
                types[v.name] = (v.type, Poly.const(1), (batched_inputs or [True] * 99)[k])
        for p in fn.params if fn is not None else []:  # (read by collectives: a norm's)
            types.setdefault(p.name, (p.type, Poly.const(1), False))
        for e in eqns:
            factor = guard_factor(e.guards, self.env) if e.guards and fn is None else 1
            if factor == Poly():
                continue  # not computed at these sizes
            one = Traffic()
            members = e.family[1].subs(env) if e.family is not None else Poly.const(1)
            batched = any(types[o.name][2] for o in e.ins if o.name in types)
            for o in e.outs:
                mult = members if e.family is not None else (
                    o.type.family.subs(env) if o.type.family is not None else Poly.const(1))
                types[o.name] = (o.type, mult, batched)
                size = self.size(o.type, env, ell, mult, batched)
                if plan is not None and (o.name in plan.split or self.sequence and
                                         o.name in plan.sequence) or split:
                    size = size / self.tp  # a block of a split axis, or of the positions
                if e.op != "mask" and o.type.dtype == "real":
                    one.values = one.values + size
            if plan is not None:
                self._marks(e, plan, types, env, ell, one, entered)
            if e.op == "call":
                fn2 = self.functions[e.attrs["module"]]
                inner = {k: v.subs(env) for k, v in e.attrs["bindings"].items()
                         if isinstance(v, Poly)}
                inner_ell = self._ell(fn2, e, types, env, ell)
                inner_split = split or (plan is not None and e.outs[0].name in plan.split)
                sub = self.body(fn2.eqns, self.plans.get(fn2.name), inner, inner_ell,
                                inner_split, fn2, batched_inputs=[
                                    o.name in types and types[o.name][2] for o in e.ins])
                if fn2.name in self.plans and is_kind(fn2, "moe"):
                    sub = self._moe(sub, e, inner, inner_ell)
                inner_plan = self.plans.get(fn2.name)
                if self.sequence and plan is not None and inner_plan is not None and \
                        inner_plan.shared and e.attrs["instance"] in plan.seq_instances:
                    for p in fn2.params:  # a norm's weights read on blocks of positions:
                        sub.backward = sub.backward + self.size(  # their gradients summed
                            p.type, inner, (), Poly.const(1), False)
                one.add(sub, members)
            out.add(one, factor)
        if fn is None:
            self.seen = types
        return out

    def _ell(self, fn, e, types, env, ell) -> tuple:
        """What `...` stands for inside a call: the leading axes of its first argument."""
        for inp, o in zip(fn.inputs, e.ins):
            if inp.type.shape and isinstance(inp.type.shape[0], Ell) and o.name in types:
                t = types[o.name][0]
                lead = len(t.shape) - (len(inp.type.shape) - 1)  # its axes `...` stands for
                dims = []
                for d in t.shape[:lead]:
                    if isinstance(d, Ell):
                        dims.extend(ell)
                    else:
                        dims.append(d.subs(env).subs(self.seq_env))
                return tuple(dims)
        return ell

    def _marks(self, e: Eqn, plan: Plan, types, env, ell, out: Traffic,
               entered: set) -> None:
        def full(name):
            if name not in types:
                return Poly()
            t, mult, batched = types[name]
            return self.size(t, env, ell, mult, batched) if t.dtype == "real" else Poly()
        for o in e.outs:
            if o.name in plan.reduce or o.name in plan.gather or o.name in plan.lookups:
                out.forward = out.forward + full(o.name)
            if o.name in plan.blocks:  # the block of a replicated value: its gradient summed
                out.backward = out.backward + full(e.ins[0].name)
        seq = self.sequence
        for o in e.outs:
            how = plan.seq_made.get(o.name, ("",))[0] if seq else ""
            if how in ("reduce", "scatter"):  # backward: the gradient's blocks all-gathered
                out.backward = out.backward + full(o.name)
            elif how == "whole":  # all-gathered
                out.forward = out.forward + full(o.name)
        for k, o in enumerate(e.ins):
            use = plan.uses.get((e.outs[0].name, k))
            how = plan.seq_uses.get((e.outs[0].name, k), ("",))[0] if seq else ""
            if use == "gather":
                out.forward = out.forward + full(o.name)
            elif use == "enter" and (o.name, str(o.member)) not in entered:
                entered.add((o.name, str(o.member)))  # one all-reduce for all its uses
                out.backward = out.backward + full(o.name)  # (or reduce-scatter)
                if how == "enter":  # the blocks of positions all-gathered first
                    out.forward = out.forward + full(o.name)
            elif how and how != "enter" and (how, o.name, str(o.member)) not in entered:
                entered.add((how, o.name, str(o.member)))  # one for all its uses
                if how == "whole":  # all-gathered; backward, the rank's block
                    out.forward = out.forward + full(o.name)
                else:  # scatter: backward, all-gathered; shared: backward, all-reduced
                    out.backward = out.backward + full(o.name)

    def _moe(self, sub: Traffic, e: Eqn, env: dict, ell: tuple) -> Traffic:
        """A mixture of experts split by experts runs fused (model.py's moe()): its
        output summed; backward, the gradients of its input and of the K routing weights
        of each position summed."""
        fn = self.functions[e.attrs["module"]]
        i = intrinsic(fn)
        x = self.size(fn.inputs[0].type, env, ell, Poly.const(1))
        width = fn.inputs[0].type.shape[-1].subs(env)  # the features: x / width positions
        k = env.get(i.chosen, Poly.const(1))
        return Traffic(forward=x, backward=x + x / width * k, values=sub.values)


BYTES = 4  # float32


def report(cfg, sym, tp: int, fsdp: int, batch: int, seq: int | None,
           sequence: bool = True) -> dict:
    """What `fgc params --tp N --fsdp M` adds: per rank, formulas (in the hyperparameters,
    B and T) and numbers at the configuration `cfg` (`sym`: the symbolic one); `sequence`:
    sequence parallelism where it applies (parallelize()'s `sequence`)."""
    from ..elaborate.symbolic import format_poly
    from ..errors import FgcError
    from ..lowering import prepare
    from ..lowering.parallel import divisibility, plan, sequence_only, uneven

    model, functions = prepare(sym.model, sym.functions)
    plans = plan(model, functions)
    values = {k: v.const_value() if isinstance(v, Poly) else v for k, v in cfg.values.items()}
    refused = [d for d in uneven(plans, [(cfg.name, values)], tp) if d.severity == "error"]
    if refused:  # parallelize() would refuse these
        raise FgcError.many(refused)
    whole = sorted(name for module, name, _, _ in divisibility(plans, values, tp)
                   if not module)
    if whole:  # the model's own stay whole, and its body runs as in one process
        plans = {**plans, "": sequence_only(plans[""])}
    seqs = sorted(ir.sequence_symbols(model, functions))
    if seq is None:
        seq = int(values[seqs[0]]) if seqs else 1
    # sequence parallelism, as parallelize() has it: where the ranks split the positions
    asked = sequence
    sequence = asked and bool(plans[""].positions) and tp > 1 and seq % tp == 0
    big_b, big_t = Poly.sym("B"), Poly.sym("T")
    formula = budget(sym.count, model, functions, plans, tp, fsdp, big_b, big_t,
                     sequence=sequence)
    numbers = budget(cfg.count, model, functions, plans, tp, fsdp, big_b, big_t, env=values,
                     sequence=sequence)
    at = {**values, "B": batch, "T": seq}

    def number(p: Poly) -> int:
        v = p.evaluate(at)
        return int(v) if v.denominator == 1 else int(-(-v.numerator // v.denominator))

    def row(what: str, f: Poly, n: Poly, times: int = 1) -> dict:
        entries = number(n) * times
        return {"what": what, "formula": format_poly(f * times), "entries": entries,
                "bytes": entries * BYTES}

    rows = [
        row("parameters", formula.params, numbers.params),
        row("gradients", formula.params, numbers.params),
        row("AdamW moments", formula.params, numbers.params, ADAM_MOMENTS),
    ]
    if sequence:
        fwd = "tensor parallel, forward (reduce-scatter, all-gather)"
        bwd = "tensor parallel, backward (reduce-scatter, all-gather, all-reduce)"
    else:
        fwd = "tensor parallel, forward (all-reduce, all-gather)"
        bwd = "tensor parallel, backward (all-reduce)"
    blocks = []
    for f, n in zip(formula.blocks, numbers.blocks):
        blocks.append({"layers": number(n.layers), "layers_formula": format_poly(f.layers),
                       "activations": row("activations, one layer", f.traffic.values,
                                          n.traffic.values),
                       "per_layer_step": [
            row(fwd, f.traffic.forward, n.traffic.forward),
            row(bwd, f.traffic.backward, n.traffic.backward),
            row("FSDP (all-gather twice, reduce-scatter)",
                f.params * 3 if fsdp > 1 else Poly(), n.params * 3 if fsdp > 1 else Poly()),
        ]})
    outside = [
        row("tensor parallel, forward", formula.outside.forward, numbers.outside.forward),
        row("tensor parallel, backward", formula.outside.backward, numbers.outside.backward),
    ]
    return {"tp": tp, "fsdp": fsdp, "ranks": tp * fsdp, "batch": batch, "seq": seq,
            "whole": whole, "sequence_parallel": sequence, "sequence_asked": asked,
            "dtype": "float32", "per_rank": rows, "blocks": blocks,
            "outside_layers_step": outside}


def format_text(r: dict) -> str:
    """The report as `fgc params` prints it after the count."""
    out = [f"Spread over {r['ranks']} ranks: tensor parallel {r['tp']} x FSDP {r['fsdp']}, "
           f"batch {r['batch']} x {r['seq']} positions, {r['dtype']} (B = {r['batch']}, "
           f"T = {r['seq']}):", "", "per rank, the largest share:"]

    def lines(rows):
        width = max(len(x["what"]) for x in rows)
        for x in rows:
            out.append(f"  {x['what']:<{width}}  {x['entries']:>16,} entries  "
                       f"{_human(x['bytes']):>10}   = {x['formula'] or '0'}")
    if r["whole"]:
        out.insert(1, f"the model's own {', '.join(r['whole'])} stay whole: {r['tp']} ranks "
                      "cannot split them evenly (docs/distributed.md)")
    if r["sequence_parallel"]:
        out.insert(1, f"sequence parallel: between the split computations, each rank holds "
                      f"{r['seq'] // r['tp']} of the {r['seq']} positions")
    elif r["tp"] > 1 and not r["sequence_asked"]:
        out.insert(1, "sequence parallel: off (as asked)")
    elif r["tp"] > 1:
        out.insert(1, f"sequence parallel: off ({r['tp']} ranks cannot split {r['seq']} "
                      "positions evenly, or nothing between the split computations can be)")
    lines(r["per_rank"] + [b["activations"] for b in r["blocks"][:1]])
    for k, b in enumerate(r["blocks"]):
        which = f" of layers block {k + 1}" if len(r["blocks"]) > 1 else ""
        out += ["", f"one layer{which} ({b['layers_formula']} = {b['layers']} layers), per "
                "rank: activations and what it hands to collectives per training step:"]
        lines([b["activations"]] * (k > 0) + b["per_layer_step"])
    out += ["", "outside the layers (embedding, output), per training step:"]
    lines(r["outside_layers_step"])
    return "\n".join(out)


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
