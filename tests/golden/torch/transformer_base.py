"""Transformer, compiled by fgc from transformer.fgpt (preset base).

Generated code: edit the spec, not this file. Shapes in comments: B is the batch, T the
sequence length of this call; `spec:LINE` is where the equation is written.
"""

import math
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn.functional import layer_norm
from torch.nn.functional import scaled_dot_product_attention as sdpa


@dataclass(frozen=True)
class Config:
    """The hyperparameters of Transformer (preset base).

    build(Config(...)) or build(**sizes) makes another size; the sizes the spec defines
    from others are properties that follow the fields. `fgc params SPEC --set K=V ...`
    checks a configuration against the spec and counts its parameters.
    """

    L: int = 6  # layers in each stack (num_encoder_layers = num_decoder_layers)
    H: int = 512  # dimension of the residual stream (d_model)
    A: int = 8  # attention heads (nhead)
    V: int = 37000  # shared source-target vocabulary
    n: int = 512  # longest source
    m: int = 512  # longest target
    eps: float = 1e-05  # LayerNorm epsilon, picked up by LN (layer_norm_eps)

    @property
    def D(self):
        """D = H/A: dimension of queries, keys and values."""
        return self.H // self.A

    @property
    def F(self):
        """F = 4*H: hidden dimension of the feed-forward nets (dim_feedforward)."""
        return 4 * self.H


def causal_mask(rows, cols, device=None):
    """Mask^AR as a tensor: 0 where column <= row, -inf above the diagonal (aligned to the
    last column when there are more columns than rows: cached keys come first)."""
    full = torch.full((rows, cols), -math.inf, device=device)
    return torch.triu(full, diagonal=cols - rows + 1)


def key_padding(mask, dtype):
    """A padded batch's keys as an additive mask, (B, P + T): 0 at a token, the dtype's
    lowest number at padding (finite, so that a padded query, which sees no token, stays
    a number; at a token's query the padding's weight is exactly 0)."""
    low = torch.finfo(dtype).min
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask == 0, low)


def with_padding(mask, padding, q):
    """An attention's mask (None: none) plus a padded batch's keys (None: none), the
    padding shaped to broadcast against q's scores: (B, 1, ..., 1, P + T)."""
    if padding is None:
        return mask
    padding = padding.view(padding.shape[0], *[1] * (q.dim() - 2), padding.shape[-1])
    return padding if mask is None else mask + padding


def token_positions(mask, length):
    """Each of the last `length` positions' rank among its row's tokens, (B, length): the
    position it has in the row without its padding (0 at padding before the first token)."""
    return (mask.long().cumsum(-1) - 1).clamp_(min=0)[:, mask.shape[-1] - length:]


def rows_at(table, at, length):
    """A table of positions read for this call: rows at .. at + length - 1 where `at` is
    the first position (an int), or each token's own row where it is a padded batch's
    positions (B, T), giving (B, T, ...)."""
    if isinstance(at, torch.Tensor):
        return table[at]
    return table[at:at + length]


# project() runs CPU float32 inference through whichever kernel multiplies by the weight
# fastest on this CPU: oneDNN's inner product or the default GEMM behind x @ w, and for a
# weight stored (out, in) (a transposed view, as MoE's experts are) the GEMM of its rows by
# x's as well. The winner depends on the processor (mostly oneDNN on an AMD EPYC, the GEMM
# on an Intel Xeon), on the shape and on the layout, and on whether the weight is in the
# cache: a product timed again and again on one weight finds it there, where a forward
# pass streams each weight from memory. So the kernels are timed in use: the first
# products of each shape class (rows to a power of two, the weight's shape and layout, the
# threads) take turns among the candidates, each product computed once by one of them,
# and after SAMPLES timed products each KERNELS keeps the one of the shortest median time
# for the rest of the process: the median, because a product's time in use moves with what
# the cache and the threads were doing before it, and the shortest of a few such times
# picked a kernel by its luckiest run (a Mixtral layer's experts of 2-7 rows went to a GEMM
# that ran 3-4 times slower in the pass than in its best trial). ONEDNN = False takes the
# plain product everywhere.
#
# oneDNN reorders a plain weight into its own blocked layout at every product: a product
# of a few rows reads the weight twice and writes it once. PREPACK = True (set before the
# first product, as fgc generate --prepack sets it) adds a candidate
# that reorders each parameter's weight once and keeps the copy in PACKED while the
# parameter lives and is not written to, for twice the weights' memory: on a 2-core AMD
# EPYC a Llama-style decoding step (125 M parameters) took 1.3 (batch 1) to 1.5 (batch
# 4) times less time, and the products of one row read their weights about twice as fast.
ONEDNN = True
PREPACK = False
KERNELS = {}
TRIALS = {}  # a shape class still timed: its candidates, their times, the (candidate, x shape)s run
SAMPLES = 5  # products each candidate times before the choice
PACKED = None  # {parameter: {view: (version, packed copy)}}, weakly keyed, made when needed


def onednn(x, w):
    """x @ w through oneDNN's inner product, which takes the weight as (out, in)."""
    return torch.ops.mkldnn._linear_pointwise(x, w.mT, None, "none", [], "")


def transposed(x, w):
    """x @ w as (w^T x^T)^T: the GEMM reads a weight stored (out, in) row by row, which
    for a few rows of x reads it faster than x @ w does."""
    return (w.mT @ x.mT).mT


def packable(w):
    """Whether PREPACK may keep a copy of w: a view of a parameter (not a weight the forward
    pass computes, whose copy would serve once) made outside torch.inference_mode() (which
    keeps no version, so a write to the parameter would go unseen)."""
    base = w if w._base is None else w._base
    return isinstance(base, nn.Parameter) and not base.is_inference()


def packed_copy(w, make=True):
    """The copy of w (packable) in oneDNN's layout that PREPACK keeps: the one made before,
    or (when `make`) one made now, at w's first product and once its parameter has been
    written to (its version moved); None where there is none and `make` is not asked."""
    global PACKED
    base = w if w._base is None else w._base
    if PACKED is None:
        if not make:
            return None
        PACKED = torch.utils.weak.WeakIdKeyDictionary()  # a copy goes with its parameter
    views = PACKED.setdefault(base, {})
    view = w.storage_offset(), w.shape, w.stride()
    version, packed = views.get(view, (None, None))
    if version != base._version:
        if not make:
            return None
        packed = torch.ops.mkldnn._reorder_linear_weight(w.mT)
        views[view] = base._version, packed
    return packed


def prepacked(x, w):
    """x @ w through oneDNN's inner product on w's kept copy in oneDNN's layout (PREPACK);
    onednn() for a weight that is not packable."""
    if not (PREPACK and packable(w)):
        return onednn(x, w)
    return torch.ops.mkldnn._linear_pointwise(x, packed_copy(w), None, "none", [], "")


def trial(key, x, w):
    """x @ w by the candidate of the shape class `key` that has timed the fewest of its
    products; the class's choice once each has timed SAMPLES. A candidate's first product
    at each shape of x is not timed: it pays the kernel's one-time set-up (oneDNN makes a
    primitive per shape, 4-5 times a product's time), nor is prepacked()'s first product
    of each weight (it makes the weight's copy). transposed()
    is a candidate for a weight stored (out, in) only: for one stored (in, out) it reads
    the weight across its rows."""
    from time import perf_counter  # here: model.py imports torch and math only

    if key not in TRIALS:  # the candidates, as the class's first product finds them
        kernels = (onednn, torch.matmul) + ((transposed,) if w.mT.is_contiguous() else ()) \
            + ((prepacked,) if PREPACK and packable(w) else ())
        TRIALS[key] = kernels, [[] for _ in kernels], set()
    kernels, times, seen = TRIALS[key]
    k = min(range(len(kernels)), key=lambda i: len(times[i]))
    fresh = kernels[k] is prepacked and packable(w) and packed_copy(w, False) is None
    if (k, x.shape) not in seen or fresh:
        seen.add((k, x.shape))
        return kernels[k](x, w)
    start = perf_counter()
    out = kernels[k](x, w)
    times[k].append(perf_counter() - start)
    if min(len(t) for t in times) >= SAMPLES:
        best = [sorted(t)[len(t) // 2] for t in times]
        KERNELS[key] = kernels[best.index(min(best))]
        del TRIALS[key]
    return out


def project(x, w):
    """x @ w for a weight w of shape (in, out): CPU float32 inference through the fastest
    kernel (see ONEDNN); training, other devices and dtypes, and torch.compile (which
    picks its own kernels) take the plain product."""
    if not (ONEDNN and not torch.is_grad_enabled() and not torch.compiler.is_compiling()
            and x.device.type == "cpu" and x.dtype == w.dtype == torch.float32 and w.shape[0]
            and torch.backends.mkldnn.is_available()):
        return x @ w
    rows = x.numel() // w.shape[0]
    key = rows.bit_length(), w.shape, w.stride(), torch.get_num_threads()
    kernel = KERNELS.get(key)
    return kernel(x, w) if kernel is not None else trial(key, x, w)


# Tensor parallelism (parallelize(), docs/distributed.md). fgc derived from the equations
# which parameters split across the ranks, along which axis, and where the ranks' values
# meet again; the forward passes below read split parameters through local() and meet
# through these helpers, which do nothing while a module's `tp` is None (one process).


class TensorParallel:
    """The ranks of a 1-D device mesh a module's split parameters are spread over: rank r
    of `size` holds block r of each split axis."""

    def __init__(self, mesh):
        self.mesh = mesh
        self.group = mesh.get_group()
        self.rank = mesh.get_local_rank()
        self.size = mesh.size()
        self.sequence = False  # this call's positions split across the ranks: tp_sequence()


def local(p):
    """A parameter as this rank holds it: its block once parallelize() split it, a DTensor
    (to_local() keeps the gradient flowing to it), else the parameter itself."""
    return p.to_local() if hasattr(p, "to_local") else p


class _Enter(torch.autograd.Function):
    """A replicated value read by a split computation: the identity; backward, the sum of
    the ranks' gradients (each holds its block's share)."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


class _Reduce(torch.autograd.Function):
    """Partial sums made whole: all-reduce; backward, the identity (the sum's gradient is
    every rank's)."""

    @staticmethod
    def forward(ctx, tensor, group):
        tensor = tensor.contiguous().clone()
        torch.distributed.all_reduce(tensor, group=group)
        return tensor

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _Gather(torch.autograd.Function):
    """The ranks' blocks of a split axis joined in rank order; backward, this rank's
    block of the gradient."""

    @staticmethod
    def forward(ctx, tensor, axis, tp):
        ctx.axis, ctx.tp = axis, tp
        return all_gather(tensor, axis, tp)

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(ctx.tp.size, dim=ctx.axis)[ctx.tp.rank].contiguous(), None, None


def all_gather(x, axis, tp):
    parts = [torch.empty_like(x) for _ in range(tp.size)]
    torch.distributed.all_gather(parts, x.contiguous(), group=tp.group)
    return torch.cat(parts, dim=axis)


class _Scatter(torch.autograd.Function):
    """A whole value cut to this rank's block of `axis` (the positions); backward, the
    ranks' blocks of the gradient gathered."""

    @staticmethod
    def forward(ctx, tensor, axis, tp):
        ctx.axis, ctx.tp = axis, tp
        return tensor.chunk(tp.size, dim=axis)[tp.rank].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, ctx.axis, ctx.tp), None, None


class _ReduceScatter(torch.autograd.Function):
    """Partial sums made whole, each rank keeping its block of `axis` (the positions):
    reduce-scatter; backward, the ranks' blocks of the gradient gathered."""

    @staticmethod
    def forward(ctx, tensor, axis, tp):
        ctx.axis, ctx.tp = axis, tp
        return reduce_scatter(tensor, axis, tp)

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, ctx.axis, ctx.tp), None, None


class _GatherEnter(torch.autograd.Function):
    """Blocks of positions gathered for split computations; backward, the ranks' shares
    of the gradient summed, each rank keeping its block: reduce-scatter."""

    @staticmethod
    def forward(ctx, tensor, axis, tp):
        ctx.axis, ctx.tp = axis, tp
        return all_gather(tensor, axis, tp)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter(grad, ctx.axis, ctx.tp), None, None


def reduce_scatter(x, axis, tp):
    parts = [part.contiguous() for part in x.chunk(tp.size, dim=axis)]
    out = torch.empty_like(parts[tp.rank])
    torch.distributed.reduce_scatter(out, parts, group=tp.group)
    return out


def tp_sequence(sp, *lengths):
    """Sequence parallelism for this call: the values between the split computations held
    as blocks of positions, where the ranks split every run length evenly (else whole)."""
    if sp is not None:
        sp.sequence = all(n % sp.size == 0 for n in lengths)


def tp_scatter(x, sp, axis):
    return _Scatter.apply(x, axis, sp) if sp is not None and sp.sequence else x


def tp_shared(x, sp):
    """A value read at every position of blocks of positions (a norm's weights): the
    identity; backward, the sum of the ranks' gradients."""
    if sp is None or not sp.sequence or not x.requires_grad:
        return x
    return _Enter.apply(x, sp.group)


def tp_enter(x, tp, sp=None, axis=-2):
    if sp is not None and sp.sequence:  # blocks of positions: gathered first
        return _Gather.apply(x, axis, sp) if tp is None else _GatherEnter.apply(x, axis, sp)
    if tp is None or not isinstance(x, torch.Tensor) or not x.requires_grad:
        return x
    return _Enter.apply(x, tp.group)


def tp_reduce(x, tp, sp=None, axis=-2):
    if sp is not None and sp.sequence:  # each rank keeps its block of positions
        return _Scatter.apply(x, axis, sp) if tp is None else _ReduceScatter.apply(x, axis, sp)
    return x if tp is None else _Reduce.apply(x, tp.group)


def tp_gather(x, axis, tp):
    return x if tp is None else _Gather.apply(x, axis, tp)


def tp_lookup(ids, table, tp, sp=None, axis=-2):
    """Rows of a table split along its rows (the vocabulary): each rank looks up the ids
    it holds, 0 for the others, and the ranks' rows are summed."""
    if tp is None:
        return tp_reduce(nn.functional.embedding(ids, table), tp, sp, axis)
    rows = table.shape[0]
    first = tp.rank * rows
    held = (ids >= first) & (ids < first + rows)
    found = nn.functional.embedding((ids - first).clamp(0, rows - 1), table)
    found = found * held.unsqueeze(-1)
    return tp_reduce(found.to(table.dtype), tp, sp, axis)


# per class, the parameters split and the axis of each (lowering/parallel.py)
TP_PLAN = {"LN": {}, "MH": {"W_Q": 1, "b_Q": 0, "W_K": 1, "b_K": 0, "W_V": 1, "b_V": 0, "W_O": 0},
           "FF_ReLU": {"W_1": 1, "b_1": 0, "W_2": 0},
           "MHA": {"W_Q": 1, "b_Q": 0, "W_K": 1, "b_K": 0, "W_V": 1, "b_V": 0, "W_O": 0},
           "Transformer": {"W_e": 0}}
# per class of the model and its layers, the modules its lines call that hold blocks of
# positions under sequence parallelism
SP_PLAN = {
    "Transformer": ["encoder_norm", "decoder_norm"],
    "TransformerLayer": ["enc_self_attn", "enc_norm1", "enc_ff", "enc_norm2"],
    "TransformerLayer2": ["dec_self_attn", "dec_norm1", "dec_cross_attn", "dec_norm2", "dec_ff",
                          "dec_norm3"],
}


def parallelize(model, tp_mesh=None, dp_mesh=None, sequence=True):
    """Spread `model` over devices: tensor parallelism over the 1-D mesh `tp_mesh` (its
    parameters split as TP_PLAN says, each rank keeping its block as a DTensor shard), then
    FSDP2 over `dp_mesh` (fully_shard on each layer, then on the whole model). Either mesh
    may be None; both are the two dimensions of one 2-D mesh for FSDP over TP. Every rank
    must hold the same whole parameters before (one seed, or the same weights loaded);
    with `sequence`, the values between the split computations are held as blocks of the
    positions (sequence parallelism) where the ranks split the run's length evenly;
    returns `model`."""
    if tp_mesh is not None:
        from torch.distributed.tensor import Shard, distribute_tensor
        from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

        ranks = TensorParallel(tp_mesh)

        class Split(ParallelStyle):
            """fgc's plan for one module: its split parameters, each Shard(axis) over the
            mesh, and its forward told which ranks it runs on."""

            def __init__(self, axes):
                super().__init__()
                self.axes = axes

            def _apply(self, module, mesh):
                for name, axis in self.axes.items():
                    p = module.get_parameter(name)
                    if p.shape[axis] % mesh.size():
                        raise ValueError(
                            f"{type(module).__name__}.{name}: its axis {axis} has "
                            f"{p.shape[axis]} entries, which {mesh.size()} ranks cannot "
                            "split evenly")
                    shard = distribute_tensor(p.detach(), mesh, [Shard(axis)])
                    module.register_parameter(name, nn.Parameter(shard, p.requires_grad))
                module.tp = ranks
                return module

        plan = {fqn: Split(TP_PLAN[type(m).__name__]) for fqn, m in model.named_modules()
                if fqn and type(m).__name__ in TP_PLAN}
        if plan:
            parallelize_module(model, tp_mesh, plan)
        # the model's own parameters (the vocabulary) split where the ranks divide them;
        # else they stay whole, and the model and its layers compute as one process
        own = TP_PLAN.get(type(model).__name__, {})
        if own and all(model.get_parameter(name).shape[axis] % tp_mesh.size() == 0
                       for name, axis in own.items()):
            parallelize_module(model, tp_mesh, Split(own))
            for m in model.modules():  # the layers: their lines meet the model's splits
                if hasattr(m, "tp") and m.tp is None and type(m).__name__ not in TP_PLAN:
                    m.tp = model.tp
        if sequence:  # the model, its layers and the modules their lines call
            for m in model.modules():
                uses = SP_PLAN.get(type(m).__name__)
                if uses is None:
                    continue
                if hasattr(m, "sp"):
                    m.sp = ranks
                children = dict(m.named_children())
                for name in uses:
                    if children.get(name) is not None:
                        children[name].sp = ranks
    if dp_mesh is not None:
        from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

        for layers in (c for c in model.children() if isinstance(c, nn.ModuleList)):
            for layer in layers:
                fully_shard(layer, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
        for method in ("logits", "step"):  # entry points besides forward
            if hasattr(model, method):
                register_fsdp_forward_method(model, method)
    return model


class Attention(nn.Module):
    """
    module Attention(Q: R[m, d], K: R[n, d], V: R[n, v], Mask: R[m, n]) -> R[m, v] {
      Attention(Q, K, V, Mask) = Softmax((Q @ K^T) / sqrt(d) + Mask) @ V
    }
    """

    def __init__(self, causal):
        super().__init__()
        self.causal = causal  # this use is given Mask^AR (else Mask^BD)
        self.cache = None  # step(): keys and values, (B, A, P, D) each
        self.pad = None  # a padded batch: its keys' padding, (B, P + T)

    def forward(self, Q, K, V):
        if self.cache is not None:  # step(): the earlier positions' keys first
            if self.cache:
                K = torch.cat([self.cache[0], K], dim=-2)
                V = torch.cat([self.cache[1], V], dim=-2)
            self.cache = (K, V)
        if self.pad is not None:  # a padded batch: no query sees a key at padding
            return sdpa(
                Q,
                K,
                V,
                attn_mask=with_padding(
                    (
                        causal_mask(Q.shape[-2], K.shape[-2], Q.device).to(Q.dtype)
                        if self.causal
                        else None
                    ),
                    self.pad,
                    Q,
                ),
            )
        if self.causal:  # this use is given Mask^AR
            if Q.shape[-2] == K.shape[-2]:
                return sdpa(Q, K, V, is_causal=True)  # Mask^AR
            if Q.shape[-2] == 1:  # the newest position sees every key
                return sdpa(Q, K, V)
            # Mask^AR aligned to the keys' end
            Mask = causal_mask(Q.shape[-2], K.shape[-2], Q.device).to(Q.dtype)
            return sdpa(Q, K, V, attn_mask=Mask)
        return sdpa(Q, K, V)  # this use is given Mask^BD: no mask


class MH(nn.Module):
    """
    module MH[A, D](X: R[n, H], Mask: R[n, n]) -> R[n, H] {
      MH(X, Mask) = Concat(head_1, ..., head_A) @ W^O + b^O
        where head_i = Attention(X @ W_i^Q + b_i^Q, X @ W_i^K + b_i^K, X @ W_i^V + b_i^V,
            Mask) for i in 1..A
      param W_i^Q: R[H, D] for i in 1..A
      param b_i^Q: R[D] for i in 1..A = 0
      param W_i^K: R[H, D] for i in 1..A
      param b_i^K: R[D] for i in 1..A = 0
      param W_i^V: R[H, D] for i in 1..A
      param b_i^V: R[D] for i in 1..A = 0
      param W^O: R[A * D, H]
      param b^O: R[H] = 0
    }
    """

    def __init__(self, A, D, H, causal):
        super().__init__()
        self.A = A
        self.D = D
        self.H = H
        self.causal = causal  # this use is given Mask^AR (else Mask^BD)
        self.tp = None  # parallelize(): the ranks its split parameters are spread over
        self.sp = None  # parallelize(): the ranks its positions are split over
        self.W_Q = nn.Parameter(torch.empty(H, A, D))  # W_i^Q: R[H, D] for each of A
        self.b_Q = nn.Parameter(torch.empty(A, D))  # b_i^Q: R[D] for each of A
        self.W_K = nn.Parameter(torch.empty(H, A, D))  # W_i^K: R[H, D] for each of A
        self.b_K = nn.Parameter(torch.empty(A, D))  # b_i^K: R[D] for each of A
        self.W_V = nn.Parameter(torch.empty(H, A, D))  # W_i^V: R[H, D] for each of A
        self.b_V = nn.Parameter(torch.empty(A, D))  # b_i^V: R[D] for each of A
        self.W_O = nn.Parameter(torch.empty(A * D, H))  # W^O: R[A * D, H]
        self.b_O = nn.Parameter(torch.empty(H,))  # b^O: R[H]
        self.Attention = Attention(causal=self.causal)
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.W_Q, std=0.02)
        nn.init.zeros_(self.b_Q)
        nn.init.normal_(self.W_K, std=0.02)
        nn.init.zeros_(self.b_K)
        nn.init.normal_(self.W_V, std=0.02)
        nn.init.zeros_(self.b_V)
        nn.init.normal_(self.W_O, std=0.02)
        nn.init.zeros_(self.b_O)

    def forward(self, X):
        # read by split computations: backward, its gradient summed
        X_entered_________2 = tp_enter(X, self.tp, self.sp, -2)
        # (*, A, n, D)  transformer.fgpt:46
        head = self.Attention(
            (
                (
                    project(X_entered_________2, local(self.W_Q).flatten(-2))
                    .unflatten(-1, (-1, self.D))
                    .movedim(-2, -3)
                )
                + local(self.b_Q).unsqueeze(-2)
            ),
            (
                (
                    project(X_entered_________2, local(self.W_K).flatten(-2))
                    .unflatten(-1, (-1, self.D))
                    .movedim(-2, -3)
                )
                + local(self.b_K).unsqueeze(-2)
            ),
            (
                (
                    project(X_entered_________2, local(self.W_V).flatten(-2))
                    .unflatten(-1, (-1, self.D))
                    .movedim(-2, -3)
                )
                + local(self.b_V).unsqueeze(-2)
            ),
        )
        return (
            tp_reduce(
                project(head.movedim(-3, -2).flatten(-2), local(self.W_O)),
                self.tp,
                self.sp,
                -2,
            )
            + tp_shared(self.b_O, self.sp)
        )


class LN(nn.Module):
    """
    module LN[eps = 1e-5](X: R[..., H]) -> R[..., H] {
      LN(X) = gamma * (X - mu) / sqrt(sigma2 + eps) + beta
        where mu = mean(X), sigma2 = mean((X - mu) * (X - mu))
      param gamma: R[H] = 1, beta: R[H] = 0
    }
    """

    def __init__(self, H, eps):
        super().__init__()
        self.H = H
        self.eps = eps
        self.sp = None  # parallelize(): the ranks its positions are split over
        self.gamma = nn.Parameter(torch.empty(H,))  # gamma: R[H]
        self.beta = nn.Parameter(torch.empty(H,))  # beta: R[H]
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.ones_(self.gamma)
        nn.init.zeros_(self.beta)

    def forward(self, X):
        return layer_norm(
            X,
            self.gamma.shape,
            tp_shared(self.gamma, self.sp),
            tp_shared(self.beta, self.sp),
            self.eps,
        )


class FF_ReLU(nn.Module):
    """
    module FF^ReLU[F](X: R[..., H]) -> R[..., H] {
      FF^ReLU(X) = max(0, X @ W_1 + b_1) @ W_2 + b_2
      param W_1: R[H, F], b_1: R[F] = 0, W_2: R[F, H], b_2: R[H] = 0
    }
    """

    def __init__(self, F, H):
        super().__init__()
        self.F = F
        self.H = H
        self.tp = None  # parallelize(): the ranks its split parameters are spread over
        self.sp = None  # parallelize(): the ranks its positions are split over
        self.W_1 = nn.Parameter(torch.empty(H, F))  # W_1: R[H, F]
        self.b_1 = nn.Parameter(torch.empty(F,))  # b_1: R[F]
        self.W_2 = nn.Parameter(torch.empty(F, H))  # W_2: R[F, H]
        self.b_2 = nn.Parameter(torch.empty(H,))  # b_2: R[H]
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.W_1, std=0.02)
        nn.init.zeros_(self.b_1)
        nn.init.normal_(self.W_2, std=0.02)
        nn.init.zeros_(self.b_2)

    def forward(self, X):
        return (
            tp_reduce(
                project(
                    (
                        (
                            project(tp_enter(X, self.tp, self.sp, -2), local(self.W_1))
                            + local(self.b_1)
                        )
                        .clamp(min=0)
                    ),
                    local(self.W_2),
                ),
                self.tp,
                self.sp,
                -2,
            )
            + tp_shared(self.b_2, self.sp)
        )


class MHA(nn.Module):
    """
    module MHA[A, D](X^Q: R[m, H], X^K: R[n, H], X^V: R[n, H], Mask: R[m, n]) -> R[m, H] {
      MHA(X^Q, X^K, X^V, Mask) = Concat(head_1, ..., head_A) @ W^O + b^O
        where head_i = Attention(X^Q @ W_i^Q + b_i^Q, X^K @ W_i^K + b_i^K, X^V @ W_i^V +
            b_i^V, Mask) for i in 1..A
      param W_i^Q: R[H, D] for i in 1..A
      param b_i^Q: R[D] for i in 1..A = 0
      param W_i^K: R[H, D] for i in 1..A
      param b_i^K: R[D] for i in 1..A = 0
      param W_i^V: R[H, D] for i in 1..A
      param b_i^V: R[D] for i in 1..A = 0
      param W^O: R[A * D, H]
      param b^O: R[H] = 0
    }
    """

    def __init__(self, A, D, H):
        super().__init__()
        self.A = A
        self.D = D
        self.H = H
        self.tp = None  # parallelize(): the ranks its split parameters are spread over
        self.sp = None  # parallelize(): the ranks its positions are split over
        self.W_Q = nn.Parameter(torch.empty(H, A, D))  # W_i^Q: R[H, D] for each of A
        self.b_Q = nn.Parameter(torch.empty(A, D))  # b_i^Q: R[D] for each of A
        self.W_K = nn.Parameter(torch.empty(H, A, D))  # W_i^K: R[H, D] for each of A
        self.b_K = nn.Parameter(torch.empty(A, D))  # b_i^K: R[D] for each of A
        self.W_V = nn.Parameter(torch.empty(H, A, D))  # W_i^V: R[H, D] for each of A
        self.b_V = nn.Parameter(torch.empty(A, D))  # b_i^V: R[D] for each of A
        self.W_O = nn.Parameter(torch.empty(A * D, H))  # W^O: R[A * D, H]
        self.b_O = nn.Parameter(torch.empty(H,))  # b^O: R[H]
        self.Attention = Attention(causal=False)
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.W_Q, std=0.02)
        nn.init.zeros_(self.b_Q)
        nn.init.normal_(self.W_K, std=0.02)
        nn.init.zeros_(self.b_K)
        nn.init.normal_(self.W_V, std=0.02)
        nn.init.zeros_(self.b_V)
        nn.init.normal_(self.W_O, std=0.02)
        nn.init.zeros_(self.b_O)

    def forward(self, X_Q, X_K, X_V):
        # (*, A, m, D)  transformer.fgpt:60
        head = self.Attention(
            (
                (
                    project(tp_enter(X_Q, self.tp, self.sp, -2), local(self.W_Q).flatten(-2))
                    .unflatten(-1, (-1, self.D))
                    .movedim(-2, -3)
                )
                + local(self.b_Q).unsqueeze(-2)
            ),
            (
                (
                    project(tp_enter(X_K, self.tp, self.sp, -2), local(self.W_K).flatten(-2))
                    .unflatten(-1, (-1, self.D))
                    .movedim(-2, -3)
                )
                + local(self.b_K).unsqueeze(-2)
            ),
            (
                (
                    project(tp_enter(X_V, self.tp, self.sp, -2), local(self.W_V).flatten(-2))
                    .unflatten(-1, (-1, self.D))
                    .movedim(-2, -3)
                )
                + local(self.b_V).unsqueeze(-2)
            ),
        )
        return (
            tp_reduce(
                project(head.movedim(-3, -2).flatten(-2), local(self.W_O)),
                self.tp,
                self.sp,
                -2,
            )
            + tp_shared(self.b_O, self.sp)
        )


class Sinusoid(nn.Module):
    """
    module Sinusoid[K, H] -> R[K, H] {
      Sinusoid[k, c] = sin(t) if c % 2 == 1 else cos(t)
        where t = (k - 1) / pow(10000, ((c - 1) - (c - 1) % 2) / H)
    }
    """

    def __init__(self):
        super().__init__()

    def forward(self, *, K, H, device=None, dtype=None):
        k = torch.arange(K, device=device).view(-1, 1)  # (K, 1)  transformer.fgpt:79
        c = torch.arange(H, device=device).view(1, -1)  # (1, H)  transformer.fgpt:79
        t2 = c  # (1, H)  transformer.fgpt:80
        t = k / torch.pow(10000, (t2 - t2 % 2) / H)  # (K, H)  transformer.fgpt:80
        table = torch.broadcast_to(
            torch.where((c + 1) % 2 == 1, torch.sin(t), torch.cos(t)),
            (K, H),
        )
        return table.to(dtype=dtype)


class TransformerLayer(nn.Module):
    """
    One of the L layers, l = 1..L.
    """

    def __init__(self, config, l):
        super().__init__()
        self.l = l
        self.enc_self_attn = MH(A=config.A, D=config.D, H=config.H, causal=False)
        self.enc_norm1 = LN(H=config.H, eps=config.eps)
        self.enc_ff = FF_ReLU(F=config.F, H=config.H)
        self.enc_norm2 = LN(H=config.H, eps=config.eps)

    def forward(self, X_prev):
        # (B, T_n, H)  transformer.fgpt:117
        Xa_l = self.enc_norm1(self.enc_self_attn(X_prev) + X_prev)
        X_l = self.enc_norm2(self.enc_ff(Xa_l) + Xa_l)  # (B, T_n, H)  transformer.fgpt:118
        return X_l


class TransformerLayer2(nn.Module):
    """
    One of the L layers, l = 1..L.
    """

    def __init__(self, config, l):
        super().__init__()
        self.l = l
        self.dec_self_attn = MH(A=config.A, D=config.D, H=config.H, causal=True)
        self.dec_norm1 = LN(H=config.H, eps=config.eps)
        self.dec_cross_attn = MHA(A=config.A, D=config.D, H=config.H)
        self.dec_norm2 = LN(H=config.H, eps=config.eps)
        self.dec_ff = FF_ReLU(F=config.F, H=config.H)
        self.dec_norm3 = LN(H=config.H, eps=config.eps)

    def forward(self, Y_prev, Z):
        # (B, T_m, H)  transformer.fgpt:124
        Ya_l = self.dec_norm1(self.dec_self_attn(Y_prev) + Y_prev)
        # (B, T_m, H)  transformer.fgpt:125
        Yb_l = self.dec_norm2(self.dec_cross_attn(Ya_l, Z, Z) + Ya_l)
        Y_l = self.dec_norm3(self.dec_ff(Yb_l) + Yb_l)  # (B, T_m, H)  transformer.fgpt:126
        return Y_l


class Transformer(nn.Module):
    """
    model Transformer {
      hyper L = 2,        # layers in each stack           (num_encoder_layers =
          num_decoder_layers)
            H = 8,        # dimension of the residual stream (d_model)
            A = 2,        # attention heads                  (nhead)
            D = H / A,    # dimension of queries, keys and values
            F = 4 * H,    # hidden dimension of the feed-forward nets (dim_feedforward)
            V = 11,       # shared source-target vocabulary
            n = 10,       # longest source
            m = 8,        # longest target
            eps = 1e-5    # LayerNorm epsilon, picked up by LN (layer_norm_eps)

      preset base {
        L = 6, H = 512, A = 8, F = 2048, V = 37000, n = 512, m = 512
        expect params == 63_084_544      # stacks 44,140,544 (torch.nn.Transformer) + V*H
        expect params ~ 65M              # the paper's Table 3; see the header
      }
      preset big {
        L = 6, H = 1024, A = 16, F = 4096, V = 37000, n = 512, m = 512
        expect params == 214_249_472     # stacks 176,361,472 + V*H
        expect params ~ 213M             # the paper's Table 3; see the header
      }

      # N = VH + [L(4ADH + 4H + 2HF + F + H + 4H) + 2H] + [L(8ADH + 8H + 2HF + F + H + 6H)
          + 2H]
      expect params == V*H + L*(4*A*D*H + 4*H + 2*H*F + F + H + 4*H) + 2*H
                           + L*(8*A*D*H + 8*H + 2*H*F + F + H + 6*H) + 2*H

      input x: {1..V}^n,     # source tokens
            attention_mask: Pad[n]   # 1 at a source token, 0 at padding
      input y: {1..V}^m      # target tokens, shifted right

      param W_e: R[V, H]     # shared by both embeddings and the output (embedding.weight)

      X^(0) = OneHot(x) @ W_e * sqrt(H) + Sinusoid[n, H]
      layers l in 1..L {
        Xa^(l) = enc_norm1: LN(enc_self_attn: MH(X^(l-1), Mask^BD) + X^(l-1))
        X^(l) = enc_norm2: LN(enc_ff: FF^ReLU(Xa^(l)) + Xa^(l))
      }
      Z = encoder_norm: LN(X^(L))      # the encoder's output: keys and values for every
          decoder layer

      Y^(0) = OneHot(y) @ W_e * sqrt(H) + Sinusoid[m, H]
      layers l in 1..L {
        Ya^(l) = dec_norm1: LN(dec_self_attn: MH(Y^(l-1), Mask^AR[m]) + Y^(l-1))
        Yb^(l) = dec_norm2: LN(dec_cross_attn: MHA(Ya^(l), Z, Z, Mask^X) + Ya^(l))
        Y^(l) = dec_norm3: LN(dec_ff: FF^ReLU(Yb^(l)) + Yb^(l))
      }
      Yf = decoder_norm: LN(Y^(L))

      output probs = Softmax(Yf @ W_e^T)

      # torch.nn.Transformer's state_dict and the embedding beside it. in_proj_weight holds
      # W^Q | W^K | W^V stacked by rows [out, in]: take one third, transpose, cut into A
          heads.
      checkpoint {
        prefix "transformer."
        W_e = "embedding.weight"
        encoder_norm.gamma = "encoder.norm.weight"
        encoder_norm.beta = "encoder.norm.bias"
        decoder_norm.gamma = "decoder.norm.weight"
        decoder_norm.beta = "decoder.norm.bias"
        layers {
          enc_self_attn.W^Q = "encoder.layers.{l}.self_attn.in_proj_weight" | split(1, 3,
              1) | transpose | heads(2)
          enc_self_attn.W^K = "encoder.layers.{l}.self_attn.in_proj_weight" | split(1, 3,
              2) | transpose | heads(2)
          enc_self_attn.W^V = "encoder.layers.{l}.self_attn.in_proj_weight" | split(1, 3,
              3) | transpose | heads(2)
          enc_self_attn.b^Q = "encoder.layers.{l}.self_attn.in_proj_bias" | split(1, 3, 1)
              | heads(1)
          enc_self_attn.b^K = "encoder.layers.{l}.self_attn.in_proj_bias" | split(1, 3, 2)
              | heads(1)
          enc_self_attn.b^V = "encoder.layers.{l}.self_attn.in_proj_bias" | split(1, 3, 3)
              | heads(1)
          enc_self_attn.W^O = "encoder.layers.{l}.self_attn.out_proj.weight" | transpose
          enc_self_attn.b^O = "encoder.layers.{l}.self_attn.out_proj.bias"
          enc_norm1.gamma = "encoder.layers.{l}.norm1.weight"
          enc_norm1.beta = "encoder.layers.{l}.norm1.bias"
          enc_ff.W_1 = "encoder.layers.{l}.linear1.weight" | transpose
          enc_ff.b_1 = "encoder.layers.{l}.linear1.bias"
          enc_ff.W_2 = "encoder.layers.{l}.linear2.weight" | transpose
          enc_ff.b_2 = "encoder.layers.{l}.linear2.bias"
          enc_norm2.gamma = "encoder.layers.{l}.norm2.weight"
          enc_norm2.beta = "encoder.layers.{l}.norm2.bias"

          dec_self_attn.W^Q = "decoder.layers.{l}.self_attn.in_proj_weight" | split(1, 3,
              1) | transpose | heads(2)
          dec_self_attn.W^K = "decoder.layers.{l}.self_attn.in_proj_weight" | split(1, 3,
              2) | transpose | heads(2)
          dec_self_attn.W^V = "decoder.layers.{l}.self_attn.in_proj_weight" | split(1, 3,
              3) | transpose | heads(2)
          dec_self_attn.b^Q = "decoder.layers.{l}.self_attn.in_proj_bias" | split(1, 3, 1)
              | heads(1)
          dec_self_attn.b^K = "decoder.layers.{l}.self_attn.in_proj_bias" | split(1, 3, 2)
              | heads(1)
          dec_self_attn.b^V = "decoder.layers.{l}.self_attn.in_proj_bias" | split(1, 3, 3)
              | heads(1)
          dec_self_attn.W^O = "decoder.layers.{l}.self_attn.out_proj.weight" | transpose
          dec_self_attn.b^O = "decoder.layers.{l}.self_attn.out_proj.bias"
          dec_norm1.gamma = "decoder.layers.{l}.norm1.weight"
          dec_norm1.beta = "decoder.layers.{l}.norm1.bias"
          dec_cross_attn.W^Q = "decoder.layers.{l}.multihead_attn.in_proj_weight" |
              split(1, 3, 1) | transpose | heads(2)
          dec_cross_attn.W^K = "decoder.layers.{l}.multihead_attn.in_proj_weight" |
              split(1, 3, 2) | transpose | heads(2)
          dec_cross_attn.W^V = "decoder.layers.{l}.multihead_attn.in_proj_weight" |
              split(1, 3, 3) | transpose | heads(2)
          dec_cross_attn.b^Q = "decoder.layers.{l}.multihead_attn.in_proj_bias" | split(1,
              3, 1) | heads(1)
          dec_cross_attn.b^K = "decoder.layers.{l}.multihead_attn.in_proj_bias" | split(1,
              3, 2) | heads(1)
          dec_cross_attn.b^V = "decoder.layers.{l}.multihead_attn.in_proj_bias" | split(1,
              3, 3) | heads(1)
          dec_cross_attn.W^O = "decoder.layers.{l}.multihead_attn.out_proj.weight" |
              transpose
          dec_cross_attn.b^O = "decoder.layers.{l}.multihead_attn.out_proj.bias"
          dec_norm2.gamma = "decoder.layers.{l}.norm2.weight"
          dec_norm2.beta = "decoder.layers.{l}.norm2.bias"
          dec_ff.W_1 = "decoder.layers.{l}.linear1.weight" | transpose
          dec_ff.b_1 = "decoder.layers.{l}.linear1.bias"
          dec_ff.W_2 = "decoder.layers.{l}.linear2.weight" | transpose
          dec_ff.b_2 = "decoder.layers.{l}.linear2.bias"
          dec_norm3.gamma = "decoder.layers.{l}.norm3.weight"
          dec_norm3.beta = "decoder.layers.{l}.norm3.bias"
        }
      }
    }
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.tp = None  # parallelize(): the ranks its split parameters are spread over
        self.sp = None  # parallelize(): the ranks its positions are split over
        self.W_e = nn.Parameter(torch.empty(config.V, config.H))  # W_e: R[V, H]
        self.layers = nn.ModuleList(TransformerLayer(config, l) for l in range(1, config.L + 1))
        self.layers2 = nn.ModuleList(TransformerLayer2(config, l) for l in range(1, config.L + 1))
        self.Sinusoid_1 = Sinusoid()
        self.encoder_norm = LN(H=config.H, eps=config.eps)
        self.Sinusoid_2 = Sinusoid()
        self.decoder_norm = LN(H=config.H, eps=config.eps)
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.W_e, std=0.02)

    def logits(self, x, y, attention_mask=None, *, start=0):
        T_n = x.shape[1]  # the length of x in this call
        assert T_n <= self.config.n, (
            f"sequence of {T_n} tokens; "
            f"the model takes at most {self.config.n}"
        )
        T_m = y.shape[1]  # the length of y in this call
        assert start + T_m <= self.config.m, (
            f"positions up to {start + T_m}; "
            f"the model takes at most {self.config.m}"
        )
        device = x.device
        tp_sequence(self.sp, T_m, T_n)
        if attention_mask is not None:  # a padded batch: each row's tokens alone
            assert attention_mask.shape[-1] == T_n, (
                f"attention_mask covers {attention_mask.shape[-1]} positions; "
                f"this call's are {T_n}"
            )
        # 0 at a token, the lowest number at padding, (B, P + T)
        padding = (
            key_padding(attention_mask, self.W_e.dtype)
            if attention_mask is not None
            else None
        )
        sites = (
            [layer.enc_self_attn.Attention for layer in self.layers]
            + [layer.dec_cross_attn.Attention for layer in self.layers2]
        )
        for site in sites:  # each attention over these positions masks padding
            site.pad = padding
        # each token's position in its row without padding
        at_T_n = token_positions(attention_mask, T_n) if attention_mask is not None else 0
        # (B, T_n, H)  transformer.fgpt:115
        X_0 = (
            tp_lookup(x, local(self.W_e), self.tp, self.sp, -2) * math.sqrt(self.config.H)
            + tp_scatter(
                rows_at(
                    self.Sinusoid_1(K=T_n, H=self.config.H, device=device, dtype=self.W_e.dtype),
                    at_T_n,
                    T_n,
                ),
                self.sp,
                -2,
            )
        )
        X_L = X_0
        for layer in self.layers:  # L layers
            X_L = layer(X_L)
        Z = self.encoder_norm(X_L)  # (B, T_n, H)  transformer.fgpt:120
        # (B, T_m, H)  transformer.fgpt:122
        Y_0 = (
            tp_lookup(y, local(self.W_e), self.tp, self.sp, -2) * math.sqrt(self.config.H)
            + tp_scatter(
                self.Sinusoid_2(
                    K=start + T_m,
                    H=self.config.H,
                    device=device,
                    dtype=self.W_e.dtype,
                )[start:],
                self.sp,
                -2,
            )
        )
        Y_L = Y_0
        for layer in self.layers2:  # L layers
            Y_L = layer(Y_L, Z)
        Yf = self.decoder_norm(Y_L)  # (B, T_m, H)  transformer.fgpt:128
        return tp_gather(
            project(tp_enter(Yf, self.tp, self.sp, -2), local(self.W_e).mT),
            -1,
            self.tp,
        )

    def forward(self, x, y, attention_mask=None):
        """probs: the probabilities, Softmax(logits)."""
        return torch.softmax(self.logits(x, y, attention_mask), dim=-1)

    def signature(self):
        """Inputs (with their dims: the batch, run lengths) and outputs in order,
        the outputs a caller feeds back as inputs at the next call, and what
        step() keeps (read by runtime.run_segments and runtime.generate), at
        this module's config; at the compiled one, the ONNX graph's metadata
        `fgc.signature` holds the same."""
        return {
            "inputs": [
                {"name": "x", "dtype": "int", "dims": ["batch", "T_n"], "lo": 1,
                 "hi": self.config.V, "zero_based": True, "perm": False},
                {"name": "y", "dtype": "int", "dims": ["batch", "T_m"], "lo": 1,
                 "hi": self.config.V, "zero_based": True, "perm": False},
                {"name": "attention_mask", "dtype": "int", "dims": ["batch", "T_n"], "lo": 0,
                 "hi": 1, "zero_based": False, "perm": False, "pad": True},
            ],
            "outputs": [
                {"name": "probs", "dtype": "real", "dims": ["batch", "T_m", self.config.V]},
            ],
            "logits": {"name": "logits", "of": "probs"},
            "state": {},
            "max_length": {"T_m": self.config.m, "T_n": self.config.n},
            "incremental": {
                "tokens": "y",
                "length": "T_m",
                "past": "past",
                "cache": [
                    {"past": "past.{l}.key", "present": "present.{l}.key", "kind": "key",
                     "block": 2, "layers": self.config.L,
                     "dims": ["batch", self.config.A, "past", self.config.D]},
                    {"past": "past.{l}.value", "present": "present.{l}.value", "kind": "value",
                     "block": 2, "layers": self.config.L,
                     "dims": ["batch", self.config.A, "past", self.config.D]},
                ],
            },
        }

    def cache_sites(self):
        """The attentions whose keys and values step() keeps, in the order of its
        `past`: layer by layer."""
        return [layer.dec_self_attn.Attention for layer in self.layers2]

    def step(self, x, y, attention_mask=None, past=None):
        """The incremental form. The tokens are those at the positions after the P
        that `past` holds the keys and values of: one (key, value) pair per
        attention of cache_sites(), each (B, A, P, D); None when there are none
        yet (the prefill form). Returns the logits of the new positions and the
        present: the pairs extended by them (P + T positions), the next call's
        `past`. A padding mask covers the past's positions and the new ones."""
        sites = self.cache_sites()
        if past is not None and len(past) != len(sites):
            raise ValueError(f"past holds {len(past)} key/value pairs; the "
                             f"model keeps {len(sites)}")
        start = past[0][0].shape[-2] if past else 0
        for site, kv in zip(sites, past or [()] * len(sites)):
            site.cache = kv
        try:
            return self.logits(x, y, attention_mask, start=start), [site.cache for site in sites]
        finally:
            for site in sites:
                site.cache = None


def build(config: Config | None = None, *, device=None, dtype=None, **sizes):
    """The model at `config` (Config() when None) with any `sizes` replaced, build(L=2),
    and freshly initialised parameters."""
    config = replace(config or Config(), **sizes)
    return Transformer(config).to(device=device, dtype=dtype)
