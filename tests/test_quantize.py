"""`--quantize int4|int8`: weight-only block quantization of the ONNX graph
(compiler/backends/onnx/quantize.py).

- The codes and scales are onnxruntime's own, byte for byte, and every dequantized weight
  is within its block's rounding bound of the float weight it stands for.
- Every product by a weight (plain, joined Q|K|V, a family of heads, a head tied to its
  embedding) is a MatMulNBits that reads exactly those numbers; a tied table quantized for
  its lookups is stored once.
- The quantized graphs run in onnxruntime, their logits within a measured distance of
  float32's; flags given where they do not apply are clean errors.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import ROOT, fgc, unpadded
from onnx import helper, numpy_helper

from compiler.backends.onnx import quantize as Q
from compiler.emit import compile_spec
from compiler.errors import FgcError
from compiler.lazy import Lazy

ort = pytest.importorskip("onnxruntime")
pybind = pytest.importorskip("onnxruntime.capi._pybind_state")

GPT2 = ("specs/gpt2.fgpt", {"L": 2, "H": 64, "A": 4, "V": 96, "n": 16})
# H = 48 and F = 80: K of one and a half, and two and a half, blocks of 32 (padded)
LLAMA = ("specs/llama.fgpt", {"L": 2, "H": 48, "A": 4, "G": 2, "F": 80, "V": 96, "n": 16,
                              "theta": 10000.0})
# measured relative RMS distance of the logits from float32's at these sizes, over seeds
# 0-3: int8 0.010-0.013, int4 0.128-0.145 (a block's rounding error is up to half its scale,
# 1/16 of its largest weight at int4, 1/256 at int8)
TOLERANCE = {"int8": 0.02, "int4": 0.2}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    made: dict = {}

    def get(model: tuple, **options) -> onnx.ModelProto:
        key = (model[0], tuple(sorted(options.items())))
        if key not in made:
            out = tmp_path_factory.mktemp("quantize")
            compile_spec(str(ROOT / model[0]), str(out), "onnx", None, model[1], **options)
            made[key] = onnx.load(str(out / "model.onnx"))
        return made[key]
    return get


def logits(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["logits"], unpadded(session, {"x": x}))[0]


def tokens(model: tuple, seed: int = 0) -> np.ndarray:
    sizes = model[1]
    return np.random.default_rng(seed).integers(0, sizes["V"], (2, sizes["n"]))


def assert_within_bound(rows: np.ndarray, codes: np.ndarray, scales: np.ndarray, bits: int):
    """Each dequantized weight is its weight rounded to its block's grid: off by at most
    half a step (the block's |scale|), or by one step where the top code 2^bits - 1 clipped
    it (w / scale >= 2^(bits-1) - 1/2: a weight of the other sign than the block's
    largest, about as large); onnxruntime's rounding adds 2^(bits-1) in float32 first, which
    may move a weight by half an ulp of 2^bits more (2^(bits-24) steps). Returns the errors
    and the steps."""
    k = rows.shape[1]
    scale = np.repeat(scales, codes.shape[2] * 8 // bits, axis=1)[:, :k]  # each weight's
    step = np.abs(scale)
    err = np.abs(Q.dequantize(codes, scales, bits, k) - rows)
    clipped = rows / np.where(scale == 0, 1, scale) >= (1 << (bits - 1)) - 0.5 - 1e-5
    sum_ulp = 2.0 ** (bits - 24)
    assert np.all(err[~clipped] <= (0.5 + sum_ulp) * step[~clipped] * (1 + 1e-6)), err.max()
    assert np.all(err[clipped] <= (1 + sum_ulp) * step[clipped] * (1 + 1e-6))
    return err, step


# ---------------------------------------------------------------- the numbers


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k, n, block", [(80, 24, 32), (64, 10, 16), (256, 7, 128)])
def test_codes_and_scales_are_onnxruntimes(bits, k, n, block):
    w = np.random.default_rng(k + n).standard_normal((k, n), dtype=np.float32)
    blocks = -(-k // block)
    codes = np.zeros((n, blocks, block * bits // 8), np.uint8)
    scales = np.zeros(n * blocks, np.float32)
    zero_points = np.zeros(n * -(-blocks * bits // 8), np.uint8)
    quantizer = pybind.quantize_matmul_4bits if bits == 4 else pybind.quantize_matmul_8bits
    quantizer(codes, w, scales, zero_points, block, n, k, True)  # True: symmetric
    ours = Q.quantize_rows(w.T, bits, block)
    assert np.array_equal(ours[0], codes)
    assert np.array_equal(ours[1], scales.reshape(n, blocks))


@pytest.mark.parametrize("bits", [4, 8])
def test_dequantized_weights_are_within_the_rounding_bound(bits):
    rng = np.random.default_rng(bits)
    w = rng.standard_t(3, (40, 96)).astype(np.float32)  # heavy tails: uneven blocks
    w[3, 5:9] = 0  # and a block with zeros
    w[7, :32] = 0  # a block of zeros: scale 0
    codes, scales = Q.quantize_rows(w, bits, 32)
    err, step = assert_within_bound(w, codes, scales, bits)
    assert np.all(err[7, :32] == 0)
    # the bound is what rounding reaches, not a loose one: some weights are near half a step
    assert (err / np.where(step > 0, step, 1)).max() > 0.45
    largest = np.abs(w.reshape(40, 3, 32)).argmax(-1)
    back = Q.dequantize(codes, scales, bits, 96).reshape(40, 3, 32)
    assert np.array_equal(np.take_along_axis(back, largest[..., None], -1),
                          np.take_along_axis(w.reshape(40, 3, 32), largest[..., None], -1))


def test_chunks_give_the_same_codes(monkeypatch):
    w = np.random.default_rng(0).standard_normal((50, 80), dtype=np.float32)
    whole = Q.quantize_rows(w, 4, 32)
    monkeypatch.setattr(Q, "CHUNK", 7 * 96)  # 7 rows a step, the last one short
    parts = Q.quantize_rows(w, 4, 32)
    assert all(np.array_equal(a, b) for a, b in zip(whole, parts))


def test_a_weight_is_read_once_for_its_codes_and_scales():
    reads = []

    def make():
        reads.append(1)
        return np.random.default_rng(0).standard_normal((64, 48), dtype=np.float32)
    blocks = Q.Blocks(Lazy((64, 48), make), False, Q.Quantization(4))
    assert (blocks.n, blocks.k, blocks.codes.shape, blocks.scales.shape) == \
        (48, 64, (48, 2, 16), (48, 2))
    scales, codes = np.asarray(blocks.scales), np.asarray(blocks.codes)
    assert len(reads) == 1 and codes.nbytes == blocks.codes.nbytes == 48 * 64 // 2
    assert_within_bound(make().T, codes, scales, 4)


# ---------------------------------------------------------------- the graph


def _initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("model", [GPT2, LLAMA], ids=["gpt2", "llama"])
@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_every_weight_product_reads_its_weight_in_blocks(model, kind, compiled):
    bits = Q.KINDS[kind]
    plain = compiled(model)
    quantized = compiled(model, quantize=kind)
    floats, ints = _initializers(plain), _initializers(quantized)
    weight_products = [n for n in plain.graph.node if n.op_type == "MatMul" and (
        n.input[1] in floats or n.input[1] in {m.output[0] for m in plain.graph.node
                                               if m.op_type in ("Transpose", "Reshape")})]
    products = [n for n in quantized.graph.node if n.op_type == "MatMulNBits"]
    # per layer: the float graph's query, key, value and output projections and the
    # feed-forward net's two products (SwiGLU's three), apart; and the head. Quantized,
    # a group of products by one input is one product by its weights side by side (the
    # input is turned into int8 blocks once): q|k|v, SwiGLU's gate|up
    apart, joined = (7, 4) if model is LLAMA else (6, 4)
    assert len(weight_products) == apart * model[1]["L"] + 1
    assert len(products) == joined * model[1]["L"] + 1
    assert not [n for n in quantized.graph.node if n.op_type == "MatMul"]
    for node in products:
        codes, scales = ints[node.input[1]], ints[node.input[2]]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (bits, 32, 4)
        name = node.input[1].removesuffix(f"/{kind}")
        # a joined weight `path/W_Q+W_K+W_V`: the float graph's own weights side by side
        path, _, last = name.rpartition("/")
        parts = [floats[f"{path}/{w}" if path else w] for w in last.split("+")]
        w = np.concatenate([p.reshape(p.shape[0], -1) for p in parts], axis=1)
        # W_e is read as W_e^T: its rows are the blocks' rows; every other weight is (K, N)
        rows = parts[0] if name == "W_e" else w.T
        assert (attrs["N"], attrs["K"]) == rows.shape
        assert codes.shape == (rows.shape[0], -(-rows.shape[1] // 32), 32 * bits // 8)
        assert_within_bound(rows, codes, scales, bits)
    meta = {p.key: p.value for p in quantized.metadata_props}
    assert meta["fgc.quantize"] == f"{kind}, blocks of 32, symmetric; embeddings not quantized"


def test_the_kernel_reads_what_dequantize_says(compiled):
    """At accuracy level 0 (no int8 activations) the quantized graph computes exactly the
    float graph whose weights are the dequantized ones: the layout, the nibble order, the
    scales and the tied table's lookups are the ones dequantize() reads."""
    for kind in ("int4", "int8"):
        quantized = onnx.ModelProto()
        quantized.CopyFrom(compiled(GPT2, quantize=kind, quantize_embeddings=True))
        reference = onnx.ModelProto()
        reference.CopyFrom(quantized)
        inits = _initializers(quantized)
        bits = Q.KINDS[kind]
        for node in quantized.graph.node:
            if node.op_type == "MatMulNBits":
                for a in node.attribute:
                    if a.name == "accuracy_level":
                        a.i = 0
        nodes = []
        for node in reference.graph.node:
            if node.op_type == "MatMulNBits":
                attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
                w = Q.dequantize(inits[node.input[1]], inits[node.input[2]], bits, attrs["K"])
                name = f"{node.input[1]}/dequantized"
                reference.graph.initializer.append(numpy_helper.from_array(w.T.copy(), name))
                node = helper.make_node("MatMul", [node.input[0], name], node.output)
            elif node.op_type == "GatherBlockQuantized":
                codes = inits[node.input[0]]
                scales = inits[node.input[2].removesuffix("/blocks")]
                table = Q.dequantize(codes, scales, bits, codes.shape[1] * 32)
                name = f"{node.input[0]}/table"
                reference.graph.initializer.append(numpy_helper.from_array(
                    table.reshape(codes.shape[0], codes.shape[1], 32), name))
                node = helper.make_node("Gather", [name, node.input[1]], node.output, axis=0)
            nodes.append(node)
        del reference.graph.node[:]
        reference.graph.node.extend(nodes)
        x = tokens(GPT2)
        assert np.abs(logits(quantized, x) - logits(reference, x)).max() < 1e-5


@pytest.mark.parametrize("model", [GPT2, LLAMA], ids=["gpt2", "llama"])
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_logits_stay_close_to_float32(model, kind, compiled):
    x = tokens(model)
    want = logits(compiled(model), x)
    got = logits(compiled(model, quantize=kind), x)
    spread = np.linalg.norm(want - want.mean(-1, keepdims=True))
    distance = np.linalg.norm(got - want) / spread
    assert distance < TOLERANCE[kind], distance
    if kind == "int4":  # 16 times finer steps: int8 is much closer
        int8 = logits(compiled(model, quantize="int8"), x)
        assert np.linalg.norm(int8 - want) / spread < distance / 5


def test_ort_attention_reads_quantized_products(compiled):
    """Under --optimize ort, GPT-2's attention without a cache would take its Q|K|V weights
    packed in float (com.microsoft.Attention): quantized, it takes the MatMulNBits
    products instead (MultiHeadAttention), no float matrix is left, and the logits are
    the standard quantized graph's."""
    model = compiled(GPT2, quantize="int8", optimize="ort")
    ops = {n.op_type for n in model.graph.node}
    assert "MultiHeadAttention" in ops and "Attention" not in ops
    # float matrices of H rows or more: the lookup's table alone (read whole)
    floats = [i.name for i in model.graph.initializer if len(i.dims) == 2 and
              min(i.dims) >= GPT2[1]["H"] and i.data_type == onnx.TensorProto.FLOAT]
    assert floats == ["W_e"], floats
    x = tokens(GPT2)
    got, want = logits(model, x), logits(compiled(GPT2, quantize="int8"), x)
    assert np.abs(got - want).max() <= 1e-4


def test_a_tied_table_is_stored_once(compiled):
    model = compiled(GPT2, quantize="int4", quantize_embeddings=True)
    inits = _initializers(model)
    assert "W_e" not in inits  # no float copy: the lookups read the blocks too
    v, h = GPT2[1]["V"], GPT2[1]["H"]
    assert inits["W_e/int4"].shape == (v, h // 32, 16) and inits["W_e/int4"].nbytes == v * h // 2
    readers = sorted(n.op_type for n in model.graph.node if "W_e/int4" in n.input)
    assert readers == ["GatherBlockQuantized", "MatMulNBits"]
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["fgc.quantize"].endswith("embeddings int4")
    x = tokens(GPT2)
    assert np.linalg.norm(logits(model, x) - logits(compiled(GPT2, quantize="int4"), x)) < \
        TOLERANCE["int4"] * np.linalg.norm(logits(compiled(GPT2), x))


def test_the_incremental_form_quantized(compiled):
    """With --kv-cache the first step (no past) gives the full graph's logits."""
    incremental = compiled(LLAMA, quantize="int4", kv_cache=True)
    x = tokens(LLAMA)
    session = ort.InferenceSession(incremental.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    feeds = {"x": x}
    for i in session.get_inputs():
        if i.name.startswith("past"):
            feeds[i.name] = np.zeros((2, i.shape[1], 0, i.shape[3]), np.float32)
    got = session.run(["logits"], unpadded(session, feeds))[0]
    assert np.abs(got - logits(compiled(LLAMA, quantize="int4"), x)).max() < 1e-4


# ---------------------------------------------------------------- errors


NO_WEIGHT_PRODUCT = """\
model Lookup {
  hyper V = 11, n = 8, H = 4
  input x: {1..V}^n
  param W_e: R[V, H]
  output y = OneHot(x) @ W_e
}
"""


def test_flags_where_they_do_not_apply(tmp_path):
    spec = [GPT2[0]] + [a for k, v in GPT2[1].items() for a in ("--set", f"{k}={v}")]
    out = str(tmp_path / "out")
    for args, message in (
            (["--target", "torch", "--quantize", "int4"], "--quantize is for --target onnx"),
            (["--target", "onnx", "--quantize", "int4", "--block-size", "48"],
             "48: a block is a power of two"),
            (["--target", "onnx", "--quantize", "int4", "--block-size", "8"],
             "from 16 to 65536"),
            (["--target", "onnx", "--block-size", "64"], "go with --quantize int4|int8"),
            (["--target", "onnx", "--quantize-embeddings"], "go with --quantize int4|int8"),
            (["--target", "onnx", "--quantize", "int2"], "invalid choice: 'int2'")):
        done = fgc("compile", *spec, *args, "-o", out)
        assert done.returncode == 2 and message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    (tmp_path / "lookup.fgpt").write_text(NO_WEIGHT_PRODUCT)
    done = fgc("compile", str(tmp_path / "lookup.fgpt"), "--target", "onnx", "--quantize",
               "int8", "-o", out)
    assert done.returncode == 1 and "no product by a weight matrix" in done.stderr
    assert not (tmp_path / "out" / "model.onnx").exists()
    with pytest.raises(FgcError, match="--quantize, --block-size and --quantize-embeddings "
                       "are for --target onnx"):
        compile_spec(str(ROOT / GPT2[0]), out, "torch", None, GPT2[1], quantize="int4")
    with pytest.raises(FgcError, match="unknown --quantize `int3`"):
        compile_spec(str(ROOT / GPT2[0]), out, "onnx", None, GPT2[1], quantize="int3")
    with pytest.raises(FgcError, match="--block-size 24: onnxruntime's MatMulNBits takes a "
                       "power of two"):
        compile_spec(str(ROOT / GPT2[0]), out, "onnx", None, GPT2[1], quantize="int4",
                     block_size=24)
