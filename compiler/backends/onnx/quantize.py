"""Weight-only block quantisation of the ONNX graph (`--quantize int4|int8`).

Every product by a weight matrix becomes onnxruntime's `MatMulNBits` over the weight's
blocks: the lowering decides it where it makes the product (`Lowerer.weight_product`: a
plain weight, a family of heads read as one (H, A·D) matrix, the joined W_Q+W_K+W_V of a
grouped product, a head tied to its embedding, read as W_e^T), never from names. With
`embeddings`, a lookup in a weight table becomes `GatherBlockQuantized` over the same
blocks, so a tied table is stored once. Everything else stays in the model's precision:
biases, norms, positional tables, routers and experts of a mixture. (Under `--optimize
ort`, attention that would take its Q|K|V weights packed takes the quantized products.)

The scheme is onnxruntime's own symmetric one (MLAS's `MlasQuantizeBlockwise`, what its
`MatMulNBitsQuantizer` and the onnxruntime-genai builder write), computed as it computes
it, so the codes are its bytes: blocks of `block` weights along K, one float scale each and
no zero point; the weight of largest magnitude in a block is code 0 exactly (its scale is
it over -2^(bits-1), so signed), the others w · (1 / scale) + 2^(bits-1) rounded half away
from zero and clipped to [0, 2^bits - 1]. Codes are packed low nibble first, (N, blocks,
block·bits/8) uint8, the layout the kernel reads.

Why MatMulNBits rather than a blocked DequantizeLinear before a MatMul: onnxruntime (1.31,
CPU) runs the latter by fusing it into MatMulNBits anyway, so the graph gains nothing in
speed, while it needs opset 21 and 4-bit tensor types, a tied head a second, transposed
copy of the table, and a runtime that does not fuse would dequantize every weight at every
call. `accuracy_level` 4 lets the kernel quantize each block of activations to int8 and
use integer dot products: measured on a 2-core AMD EPYC, a (1024, 4096) product at one
position took 50 µs at level 4, 164 µs at level 0 and 135 µs in float32; with bits 8,
14 ms at level 0 and about 50 µs at level 4.

Memory: the codes and scales of a weight are computed together, in chunks of rows, when the
first of the two is written, from one materialization of the weight (a checkpoint tensor
is read then, `compiler/lazy.py`); the other is kept until it is written, next.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .graph import ORT_DOMAIN, Graph

KINDS = {"int4": 4, "int8": 8}
BLOCK = 32  # onnxruntime's and the genai builder's default
ACCURACY = 4  # int8 activations inside the kernel: the fast CPU path (see above)
CHUNK = 1 << 22  # weights quantized per step (16 MB in float32; its temporaries < 100 MB)


@dataclass(frozen=True)
class Quantization:
    """What `--quantize` asks: `bits` per weight, blocks of `block` along K, and whether
    embedding lookups read the quantized tables too."""

    bits: int
    block: int = BLOCK
    embeddings: bool = False

    @property
    def name(self) -> str:
        return f"int{self.bits}"

    def describe(self) -> str:
        """The metadata `fgc.quantize`: what a reader of the graph needs to know."""
        return (f"{self.name}, blocks of {self.block}, symmetric; embeddings "
                f"{self.name if self.embeddings else 'not quantized'}")


def quantization(kind: str, block: int | None = None, embeddings: bool = False
                 ) -> Quantization:
    """The Quantization for `--quantize KIND [--block-size B] [--quantize-embeddings]`;
    ValueError with a message for a kind or block size MatMulNBits does not take."""
    if kind not in KINDS:
        raise ValueError(f"unknown --quantize `{kind}` (choose {', '.join(KINDS)})")
    block = BLOCK if block is None else block
    if block < 16 or block & (block - 1):
        raise ValueError(f"--block-size {block}: onnxruntime's MatMulNBits takes a power of "
                         "two, 16 or more")
    return Quantization(KINDS[kind], block, embeddings)


def quantize_rows(rows: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """The codes, (N, blocks, block·bits/8) uint8, and scales, (N, blocks) float32, of the
    rows of an (N, K) float32 matrix, blocks of `block` along each row (K padded with zeros
    to whole blocks, their codes 0), a chunk of rows at a time: byte for byte what
    onnxruntime's quantize_matmul_4bits and _8bits write for the (K, N) transpose."""
    n, k = rows.shape
    blocks = -(-k // block)
    codes = np.empty((n, blocks, block * bits // 8), np.uint8)
    scales = np.empty((n, blocks), np.float32)
    step = max(1, CHUNK // (blocks * block))
    for r in range(0, n, step):
        part = np.zeros((min(step, n - r), blocks * block), np.float32)
        part[:, :k] = rows[r: r + step]
        codes[r: r + step], scales[r: r + step] = _blocks(part.reshape(len(part), blocks, block),
                                                          bits, k)
    return codes, scales


def _blocks(w: np.ndarray, bits: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    # float32 steps in MLAS's order (BlockwiseQuantizer: range2scale, then roundf(w ·
    # (1 / scale) + 2^(bits-1)), half away from zero), so that the codes are its bytes
    half = 1 << (bits - 1)
    top, bottom = w.max(-1), w.min(-1)
    largest = np.where(np.abs(top) > np.abs(bottom), top, bottom)
    scale = largest / np.float32(-half)
    inverse = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=scale != 0)
    shifted = w * inverse[..., None] + np.float32(half)
    q = np.clip(np.floor(shifted.astype(np.float64) + 0.5), 0, 2 * half - 1).astype(np.uint8)
    q.reshape(len(q), -1)[:, k:] = 0  # the padding, as onnxruntime writes it
    if bits == 4:
        q = q[..., 0::2] | (q[..., 1::2] << 4)
    return q, scale


def dequantize(codes: np.ndarray, scales: np.ndarray, bits: int, k: int) -> np.ndarray:
    """The (N, K) float32 rows that codes and scales (quantize_rows') stand for."""
    if bits == 4:
        codes = np.stack([codes & 15, codes >> 4], -1).reshape(*codes.shape[:-1], -1)
    w = (codes.astype(np.float32) - np.float32(1 << (bits - 1))) * scales[..., None]
    return w.reshape(len(w), -1)[:, :k]


class Blocks:
    """One weight quantized, as the rows of an (N, K) matrix: `codes` and `scales`, two
    array-likes for two initializers, computed together when the first is materialized
    (the other kept until it is). `weight` is (K, N) read as the rows of its transpose,
    any stored shape of K first (a family's (H, A, D)); with `rows_first`, (N, K) as it is
    (a table, and a head tied to it)."""

    def __init__(self, weight, rows_first: bool, q: Quantization):
        first = int(weight.shape[0])
        rest = math.prod(weight.shape) // first
        self.weight, self.rows_first, self.q = weight, rows_first, q
        self.n, self.k = (first, rest) if rows_first else (rest, first)
        blocks = -(-self.k // q.block)
        self.codes = _Part(self, 0, (self.n, blocks, q.block * q.bits // 8), np.uint8)
        self.scales = _Part(self, 1, (self.n, blocks), np.float32)
        self._kept: dict[int, np.ndarray] = {}

    def take(self, which: int) -> np.ndarray:
        if which in self._kept:
            return self._kept.pop(which)
        w = np.asarray(self.weight)
        rows = w.reshape(self.n, self.k) if self.rows_first else w.reshape(self.k, self.n).T
        made = quantize_rows(rows, self.q.bits, self.q.block)
        del w, rows
        self._kept[1 - which] = made[1 - which]
        return made[which]


class _Part:
    """The codes or the scales of a Blocks, shaped before they are computed."""

    def __init__(self, blocks: Blocks, which: int, shape: tuple[int, ...], dtype):
        self.blocks, self.which = blocks, which
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.ndim, self.size = len(shape), math.prod(shape)
        self.nbytes = self.size * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"{('codes', 'scales')[self.which]}({list(self.shape)}, {self.dtype})"

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self.blocks.take(self.which)
        return out if dtype is None else out.astype(dtype, copy=False)


class Quantizer:
    """The graph's quantized weights, each made once (a weight read by several products,
    or a tied table by its lookups and the head), and the nodes that read them."""

    def __init__(self, g: Graph, q: Quantization):
        self.g, self.q = g, q
        self.made: dict[tuple[str, bool], tuple[str, str, int, int]] = {}

    def blocks(self, w: str, rows_first: bool) -> tuple[str, str, int, int]:
        """(codes, scales, N, K) of the weight initializer `w`."""
        key = (w, rows_first)
        if key not in self.made:
            b = Blocks(self.g.initializers[w], rows_first, self.q)
            what = f"{self.g.init_doc.get(w) or w}; {self.q.name} in blocks of " \
                f"{self.q.block} along K={b.k}"
            codes = self.g.initializer(f"{w}/{self.q.name}", b.codes,
                                       f"{what}: codes, (N, blocks, bytes)")
            scales = self.g.initializer(f"{w}/{self.q.name}/scales", b.scales,
                                        f"{what}: a scale per block")
            self.made[key] = (codes, scales, b.n, b.k)
        return self.made[key]

    def product(self, x: str, w: str, label: str, rows_first: bool = False) -> str:
        """x @ W (x @ W^T with `rows_first`) by W's blocks."""
        codes, scales, n, k = self.blocks(w, rows_first)
        return self.g.op("MatMulNBits", [x, codes, scales], label, domain=ORT_DOMAIN, K=k,
                         N=n, bits=self.q.bits, block_size=self.q.block,
                         accuracy_level=ACCURACY)

    def lookup(self, table: str, rows: str, rank: int, label: str) -> str:
        """The rows of a (V, K) table at the ids `rows` (of rank `rank`), dequantized: the
        table's codes as the head reads them (V, blocks, bytes), each block along the
        last axis, then the blocks joined (and any padding cut)."""
        codes, scales, _, k = self.blocks(table, True)
        scales = self.g.op("Unsqueeze", [scales, self.g.ints([-1])], f"{scales}/blocks")
        out = self.g.op("GatherBlockQuantized", [codes, rows, scales], label,
                        domain=ORT_DOMAIN, gather_axis=0, quantize_axis=2,
                        block_size=self.q.block, bits=self.q.bits)
        out = self.g.op("Reshape", [out, self.g.ints([0] * rank + [-1])], label)
        if k % self.q.block:
            out = self.g.op("Slice", [out, self.g.ints([0]), self.g.ints([k]),
                                      self.g.ints([-1])], label)
        return out
