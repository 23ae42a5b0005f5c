"""GPT2, compiled by fgc from gpt2.fgpt.

Generated code: edit the spec, not this file. Shapes in comments: B is the batch, T the
sequence length of this call; `spec:LINE` is where the equation is written.
"""

import math

import torch
from torch import nn
from torch.nn.functional import embedding, layer_norm
from torch.nn.functional import scaled_dot_product_attention as sdpa

# hyperparameters
L = 2
H = 16
A = 2
D = 8  # D = H/A
F = 64  # F = 4*H
V = 50
n = 8

# Mask^AR stands symbolic so attention can run with is_causal=True; None is "no mask".
CAUSAL = object()


def causal_mask(rows, cols, device=None):
    """Mask^AR as a tensor: 0 where column <= row, -inf above the diagonal."""
    full = torch.full((rows, cols), -math.inf, device=device)
    return torch.triu(full, diagonal=cols - rows + 1)


def mask_tensor(mask, rows, cols, device=None):
    """A mask as an additive tensor, whether it is a tensor, CAUSAL or None."""
    if mask is CAUSAL:
        return causal_mask(rows, cols, device)
    if mask is None:
        return torch.zeros(rows, cols, device=device)
    return mask


def per_member(x, rank):
    """A value every member of a family shares (a mask per sequence): a unit axis where the
    members' axis is, so the batch does not broadcast against the members."""
    return x.unsqueeze(-rank - 1) if isinstance(x, torch.Tensor) else x


# project() runs CPU float32 inference through whichever of two kernels multiplies by the
# weight faster on this CPU: oneDNN's inner product or the default GEMM behind x @ w. The
# winner depends on the processor (mostly oneDNN on an AMD EPYC, the GEMM on an Intel Xeon)
# and on the shape, so the first product of each shape class (rows to a power of two, the
# weight's shape and layout, the threads) times both, and KERNELS keeps the faster for the
# rest of the process. ONEDNN = False takes the plain product everywhere.
ONEDNN = True
KERNELS = {}


def onednn(x, w):
    """x @ w through oneDNN's inner product, which takes the weight as (out, in)."""
    return torch.ops.mkldnn._linear_pointwise(x, w.mT, None, "none", [], "")


def fastest(x, w):
    """The faster kernel for x @ w, and the product: the two alternate, each keeping its
    best time, for up to 5 rounds while they take under 0.1 s in all; at least 2 (a
    kernel's first call at a shape pays one-time set-up) unless the first took over 0.5 s."""
    from time import perf_counter  # here: model.py imports torch and math only

    kernels, best = (onednn, torch.matmul), [math.inf, math.inf]
    start = perf_counter()
    for rounds in range(1, 6):
        for k, kernel in enumerate(kernels):
            t0 = perf_counter()
            out = kernel(x, w)
            best[k] = min(best[k], perf_counter() - t0)
        if perf_counter() - start > (0.1 if rounds > 1 else 0.5):
            break
    return kernels[best.index(min(best))], out


def project(x, w):
    """x @ w for a weight w of shape (in, out): CPU float32 inference through the faster
    kernel (see ONEDNN); training, other devices and dtypes, and torch.compile (which
    picks its own kernels) take the plain product."""
    if not (ONEDNN and not torch.is_grad_enabled() and not torch.compiler.is_compiling()
            and x.device.type == "cpu" and x.dtype == w.dtype == torch.float32 and w.shape[0]
            and torch.backends.mkldnn.is_available()):
        return x @ w
    rows = x.numel() // w.shape[0]
    key = rows.bit_length(), w.shape, w.stride(), torch.get_num_threads()
    if key in KERNELS:
        return KERNELS[key](x, w)
    KERNELS[key], out = fastest(x, w)
    return out


def take(base, rank, member, *index):
    """base[..., i_1, ..., i_rank] with 0-based index tensors, one per trailing axis of base,
    shaped like a result with `member` own dimensions; the leading axes of base and of the
    indices broadcast (a gather, as comprehensions need)."""
    sizes = base.shape[base.dim() - rank:]
    flat = base.flatten(base.dim() - rank) if rank > 1 else base
    linear = index[0]
    for axis in range(1, rank):
        linear = linear * sizes[axis] + index[axis]
    lead = torch.broadcast_shapes(flat.shape[:-1], linear.shape[: linear.dim() - member])
    linear = linear.expand(*lead, *linear.shape[linear.dim() - member:])
    picked = torch.gather(flat.expand(*lead, flat.shape[-1]), -1, linear.flatten(len(lead)))
    return picked.view(linear.shape)


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
        self.gamma = nn.Parameter(torch.empty(H,))  # gamma: R[H]
        self.beta = nn.Parameter(torch.empty(H,))  # beta: R[H]
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.ones_(self.gamma)
        nn.init.zeros_(self.beta)

    def forward(self, X):
        return layer_norm(X, self.gamma.shape, self.gamma, self.beta, self.eps)


class Attention(nn.Module):
    """
    module Attention(Q: R[m, d], K: R[n, d], V: R[n, v], Mask: R[m, n]) -> R[m, v] {
      Attention(Q, K, V, Mask) = Softmax((Q @ K^T) / sqrt(d) + Mask) @ V
    }
    """

    def __init__(self):
        super().__init__()
        self.cache = None  # step(): keys and values, (B, A, P, D) each

    def forward(self, Q, K, V, Mask):
        if self.cache is not None:  # step(): the earlier positions' keys first
            if self.cache:
                K = torch.cat([self.cache[0], K], dim=-2)
                V = torch.cat([self.cache[1], V], dim=-2)
            self.cache = (K, V)
        if Mask is CAUSAL:
            if Q.shape[-2] == K.shape[-2]:
                return sdpa(Q, K, V, is_causal=True)
            if Q.shape[-2] == 1:  # the newest position sees every key
                return sdpa(Q, K, V)
            Mask = causal_mask(Q.shape[-2], K.shape[-2], Q.device).to(Q.dtype)
        return sdpa(Q, K, V, attn_mask=Mask)  # scale 1/sqrt(d) is sdpa's default


class MH(nn.Module):
    """
    module MH[A, D](X: R[n, H], Mask: R[n, n]) -> R[n, H] {
      MH(X, Mask) = Concat(head_1, ..., head_A) @ W^O
        where head_i = Attention(X @ W_i^Q, X @ W_i^K, X @ W_i^V, Mask) for i in 1..A
      param W_i^Q: R[H, D] for i in 1..A
      param W_i^K: R[H, D] for i in 1..A
      param W_i^V: R[H, D] for i in 1..A
      param W^O: R[A * D, H]
    }
    """

    def __init__(self, A, D, H):
        super().__init__()
        self.A = A
        self.D = D
        self.H = H
        self.W_Q = nn.Parameter(torch.empty(H, A, D))  # W_i^Q: R[H, D] for each of A
        self.W_K = nn.Parameter(torch.empty(H, A, D))  # W_i^K: R[H, D] for each of A
        self.W_V = nn.Parameter(torch.empty(H, A, D))  # W_i^V: R[H, D] for each of A
        self.W_O = nn.Parameter(torch.empty(A * D, H))  # W^O: R[A * D, H]
        self.Attention = Attention()
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.W_Q, std=0.02)
        nn.init.normal_(self.W_K, std=0.02)
        nn.init.normal_(self.W_V, std=0.02)
        nn.init.normal_(self.W_O, std=0.02)

    def forward(self, X, Mask):
        # (*, A, T, D)  stdlib.fgpt:101
        head = self.Attention(
            project(X, self.W_Q.flatten(-2)).unflatten(-1, (self.A, -1)).movedim(-2, -3),
            project(X, self.W_K.flatten(-2)).unflatten(-1, (self.A, -1)).movedim(-2, -3),
            project(X, self.W_V.flatten(-2)).unflatten(-1, (self.A, -1)).movedim(-2, -3),
            per_member(Mask, 2),
        )
        return project(head.movedim(-3, -2).flatten(-2), self.W_O)


class GELU(nn.Module):
    """
    module GELU(X: R[...]) -> R[...] {
      GELU(X) = X * sigmoid(1.702 * X)
    }
    """

    def __init__(self):
        super().__init__()

    def forward(self, X):
        return X * torch.sigmoid(1.702 * X)


class FF_GELU(nn.Module):
    """
    module FF^GELU[F](X: R[..., H]) -> R[..., H] {
      FF^GELU(X) = GELU(X @ W_1 + b_1) @ W_2 + b_2
      param W_1: R[H, F], b_1: R[F] = 0, W_2: R[F, H], b_2: R[H] = 0
    }
    """

    def __init__(self, F, H):
        super().__init__()
        self.F = F
        self.H = H
        self.W_1 = nn.Parameter(torch.empty(H, F))  # W_1: R[H, F]
        self.b_1 = nn.Parameter(torch.empty(F,))  # b_1: R[F]
        self.W_2 = nn.Parameter(torch.empty(F, H))  # W_2: R[F, H]
        self.b_2 = nn.Parameter(torch.empty(H,))  # b_2: R[H]
        self.GELU = GELU()
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.W_1, std=0.02)
        nn.init.zeros_(self.b_1)
        nn.init.normal_(self.W_2, std=0.02)
        nn.init.zeros_(self.b_2)

    def forward(self, X):
        return project(self.GELU(project(X, self.W_1) + self.b_1), self.W_2) + self.b_2


class Mask_AR(nn.Module):
    """
    module Mask^AR[n] -> R[n, n] {
      Mask^AR[i, j] = -inf if j > i else 0
    }
    """

    def __init__(self):
        super().__init__()

    def forward(self, *, n, device=None):
        return CAUSAL  # attention runs it as is_causal=True; causal_mask(n) is the tensor


class GPT2Layer(nn.Module):
    """
    One of the L layers, l = 1..L.
    """

    def __init__(self, l):
        super().__init__()
        self.l = l
        self.LN_1 = LN(H=H, eps=1e-05)
        self.MH = MH(A=A, D=D, H=H)
        self.LN_2 = LN(H=H, eps=1e-05)
        self.FF_GELU = FF_GELU(F=F, H=H)

    def forward(self, H_prev, mask_ar):
        Hhat_l = self.MH(self.LN_1(H_prev), mask_ar) + H_prev  # (B, T, H)  gpt2.fgpt:55
        H_l = self.FF_GELU(self.LN_2(Hhat_l)) + Hhat_l  # (B, T, H)  gpt2.fgpt:56
        return H_l


class GPT2(nn.Module):
    """
    model GPT2 {
      hyper L,           # number of layers
            H,           # dimension of the residual stream
            A,           # number of attention heads
            D = H / A,   # dimension of queries, keys and values
            F = 4 * H,   # hidden dimension of the feed-forward nets
            V = 50257,   # number of types in the vocabulary (byte-level BPE)
            n = 1024     # context size

      # Sizes from the GPT-2 paper. The `~` figures are the sizes the seeds state for
      # these models (seed 001: 117M, 345M, 774M "sometimes listed as 762M", 1.5B); they
      # count a different model than this box, so `fgc check` warns where they disagree.
      preset small {
        L = 12, H = 768, A = 12
        expect params ~ 117M
      }
      preset medium {
        L = 24, H = 1024, A = 16
        expect params ~ 345M
      }
      preset large {
        L = 36, H = 1280, A = 20
        expect params ~ 774M
        expect params ~ 762M
      }
      preset xl {
        L = 48, H = 1600, A = 25
        expect params ~ 1.5B
      }

      # GPT's N plus the final LN (theta_LN,3): N = VH + nH + L(4ADH + 2HF + 5H + F) + 2H
      expect params == V*H + n*H + L*(4*A*D*H + 2*H*F + 5*H + F) + 2*H

      input x: {1..V}^n

      param W_e: R[V, H]    # token embedding, reused for the output
      param W_p: R[n, H]    # learned positions

      H^(0) = OneHot(x) @ W_e + W_p

      layers l in 1..L {
        Hhat^(l) = MH(LN(H^(l-1)), Mask^AR) + H^(l-1)
        H^(l) = FF^GELU(LN(Hhat^(l))) + Hhat^(l)
      }

      Hf = LN(H^(L))        # the seed's F^(L)

      output GPT = Softmax(Hf @ W_e^T)
    }
    """

    def __init__(self):
        super().__init__()
        self.W_e = nn.Parameter(torch.empty(V, H))  # W_e: R[V, H]
        self.W_p = nn.Parameter(torch.empty(n, H))  # W_p: R[n, H]
        self.layers = nn.ModuleList(GPT2Layer(l) for l in range(1, L + 1))
        self.Mask_AR = Mask_AR()
        self.LN_3 = LN(H=H, eps=1e-05)
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.normal_(self.W_e, std=0.02)
        nn.init.normal_(self.W_p, std=0.02)

    def logits(self, x, *, start=0):
        T = x.shape[1]  # this call's sequence length
        assert start + T <= n, f"positions up to {start + T}; the model takes at most {n}"
        device = x.device
        H_0 = embedding(x, self.W_e) + self.W_p[start:start + T]  # (B, T, H)  gpt2.fgpt:52
        mask_ar = self.Mask_AR(n=T, device=device)  # (T, T)  gpt2.fgpt:55
        H_L = H_0
        for layer in self.layers:  # L layers
            H_L = layer(H_L, mask_ar)
        Hf = self.LN_3(H_L)  # (B, T, H)  gpt2.fgpt:59
        return project(Hf, self.W_e.mT)

    def forward(self, x):
        """GPT: the probabilities, Softmax(logits)."""
        return torch.softmax(self.logits(x), dim=-1)

    def signature(self):
        """Inputs (with their dims: the batch, run lengths) and outputs in order,
        the outputs a caller feeds back as inputs at the next call, and what
        step() keeps (read by runtime.run_segments and runtime.generate)."""
        return {
            "inputs": [
                {"name": "x", "dims": ["batch", "T"]},
            ],
            "outputs": [
                {"name": "GPT", "dims": ["batch", "T", 50]},
            ],
            "state": {},
            "max_length": {"T": 8},
            "incremental": {
                "tokens": "x",
                "length": "T",
                "cache": [
                    {
                        "layers": 2,
                        "key": ["batch", 2, "past", 8],
                        "value": ["batch", 2, "past", 8],
                    },
                ],
            },
        }

    def cache_sites(self):
        """The attentions whose keys and values step() keeps, in the order of its
        `past`: layer by layer."""
        return [layer.MH.Attention for layer in self.layers]

    def step(self, x, past=None):
        """The incremental form. The tokens are those at the positions after the P
        that `past` holds the keys and values of: one (key, value) pair per
        attention of cache_sites(), each (B, A, P, D); None when there are none
        yet (the prefill form). Returns the logits of the new positions and the
        present: the pairs extended by them (P + T positions), the next call's
        `past`."""
        sites = self.cache_sites()
        if past is not None and len(past) != len(sites):
            raise ValueError(f"past holds {len(past)} key/value pairs; the "
                             f"model keeps {len(sites)}")
        start = past[0][0].shape[-2] if past else 0
        for site, kv in zip(sites, past or [()] * len(sites)):
            site.cache = kv
        try:
            return self.logits(x, start=start), [site.cache for site in sites]
        finally:
            for site in sites:
                site.cache = None



def build(device=None, dtype=None):
    """The model, with freshly initialised parameters."""
    return GPT2().to(device=device, dtype=dtype)
