"""specs/mixtral.fgpt against transformers' MixtralForCausalLM, and the standard library's
sparse mixture of experts (MoE) behind it.

The preset's count equals the class's parameters on the meta device. A tiny randomly
initialised model (experts that do not divide evenly into the choices, grouped-query
attention) is written by `save_pretrained`, one tensor per expert as released checkpoints
hold them, and compiled with `fgc compile --weights`: the PyTorch module and the ONNX graph
(standard and `--optimize ort`) give transformers' probabilities to 1e-5, and greedy
generation with the cache gives its `generate` ids. Sparsity is measured, not assumed: the
torch module's multiply-adds grow with K at a fixed E, and stay put as E grows at a fixed K.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import fgc, set_args
from hf_parity import (
    compile_targets,
    count_tests,
    module,
    parity_tests,
    seeded,
    tokens,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

RELEASED = {
    ("mixtral", "8x7b"): ("Mixtral", dict(
        num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2,
        vocab_size=32000, max_position_embeddings=32768, rope_theta=1e6,
        tie_word_embeddings=False)),
}


test_preset_count_equals_transformers, test_every_preset_has_a_count_test = \
    count_tests(RELEASED, ("mixtral",))


# (H, A, G, F, E, K, V, n): 5 experts choosing 2, 3 choosing 3 (every expert: dense)
CASES = [(16, 4, 2, 24, 5, 2, 50, 32), (24, 4, 1, 20, 3, 3, 37, 16)]
IDS = [f"E{c[4]}-K{c[5]}" for c in CASES]


def _reference(H, A, G, F, E, K, V, n, L=2):
    config = transformers.MixtralConfig(
        vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=L,
        num_attention_heads=A, num_key_value_heads=G, num_local_experts=E,
        num_experts_per_tok=K, max_position_embeddings=n, rope_theta=10000.0,
        rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False,
        eos_token_id=None)  # generate() runs its full length, as step() does
    return seeded(transformers.MixtralForCausalLM, config)


def _sets(H, A, G, F, E, K, V, n, L=2) -> list[str]:
    values = dict(L=L, H=H, A=A, G=G, F=F, E=E, K=K, V=V, n=n, theta=10000.0)
    return set_args(values)


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def compiled(request, tmp_path_factory):
    case = request.param
    model = _reference(*case)
    folder = tmp_path_factory.mktemp("mixtral")
    model.save_pretrained(folder)  # experts.{e}.w1/w2/w3, as the released files
    return case, model, compile_targets("mixtral", _sets(*case), folder / "model.safetensors",
                                        folder)


test_probabilities_equal_transformers, test_greedy_generation_equals_transformers = \
    parity_tests(vocab=lambda case: case[6], lengths=lambda case: (case[7], 5), new=8)


def test_fgc_generate_equals_transformers_in_both_backends(compiled):
    """`fgc generate` through the ONNX --kv-cache graph and through torch's step()."""
    case, ref, out = compiled
    prompt = tokens(case[6], 4)
    with torch.no_grad():
        want = ref.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0,
                            attention_mask=torch.ones_like(prompt))[:, 4:]
    ids = ";".join(",".join(str(int(t)) for t in row) for row in prompt)
    for backend in ("onnx", "torch"):
        r = fgc("generate", "specs/mixtral.fgpt", *_sets(*case), "--weights",
                str(out["torch"].parent / "model.safetensors"), "--prompt-ids", ids,
                "--max-new-tokens", "8", "--backend", backend)
        assert r.returncode == 0, r.stderr
        rows = [[int(t) for t in line.split(",")] for line in r.stdout.split()[-2:]]
        assert rows == want.tolist(), backend


# ---------------------------------------------------------------- sparse computation

MOE = """
model M {{
  hyper V = 50, H = 32, F = 64, E = {E}, K = {K}, n = 16
  input x: {{1..V}}^n
  param W_e: R[V, H]
  output Y = moe: MoE(OneHot(x) @ W_e)
}}
"""


def _flops(tmp_path: Path, E: int, K: int) -> int:
    """Multiply-adds of one forward of a MoE layer over 64 positions, as torch counts them."""
    from torch.utils.flop_counter import FlopCounterMode
    spec = tmp_path / f"moe_{E}_{K}.fgpt"
    spec.write_text(MOE.format(E=E, K=K))
    out = tmp_path / f"out_{E}_{K}"
    r = fgc("compile", str(spec), "--target", "torch", "-o", str(out))
    assert r.returncode == 0, r.stderr
    model = module(out)
    # recording gradients: project() takes the plain product, which the counter counts (in
    # inference it may pick oneDNN's inner product, which it does not)
    with torch.enable_grad(), FlopCounterMode(display=False) as counter:
        model(tokens(50, 16, B=4))
    return counter.get_total_flops()


def test_compute_grows_with_k_not_e(tmp_path):
    base = _flops(tmp_path, 8, 2)
    assert _flops(tmp_path, 32, 2) < 1.2 * base  # 4x the experts: about the same work
    assert _flops(tmp_path, 8, 4) > 1.8 * base  # twice the choices: about twice the work


def test_the_onnx_graphs_run_each_expert_on_its_positions_only(tmp_path):
    """The standard graph gathers each expert's positions (NonZero, Gather) and adds its
    results back (ScatterND), with no product over every position per expert."""
    import onnx
    spec = tmp_path / "moe.fgpt"
    spec.write_text(MOE.format(E=4, K=2))
    r = fgc("compile", str(spec), "--target", "onnx", "-o", str(tmp_path / "onnx"))
    assert r.returncode == 0, r.stderr
    ops = [n.op_type for n in onnx.load(str(tmp_path / "onnx" / "model.onnx")).graph.node]
    assert ops.count("NonZero") == ops.count("ScatterND") == 4
    assert ops.count("TopK") == 1
    # under --optimize ort: onnxruntime's own MoE node, the experts' matrices packed for it
    r = fgc("compile", str(spec), "--target", "onnx", "--optimize", "ort", "-o",
            str(tmp_path / "ort"))
    assert r.returncode == 0, r.stderr
    graph = onnx.load(str(tmp_path / "ort" / "model.onnx")).graph
    moe = [n for n in graph.node if n.op_type == "MoE"]
    assert len(moe) == 1 and moe[0].domain == "com.microsoft"
    assert "NonZero" not in {n.op_type for n in graph.node}


def test_the_experts_are_stored_one_contiguous_matrix_each(tmp_path):
    """The standard library's MoE reads its experts one at a time: both backends store the
    families with the expert axis first and each expert (out, in) as nn.Linear does, gate
    and up (E, F, H), down (E, H, F); a spec's own mixture keeps the family layout every
    other family has, (H, E, F)."""
    import onnx
    spec = tmp_path / "moe.fgpt"
    spec.write_text(MOE.format(E=4, K=2))
    for target in ("torch", "onnx"):
        r = fgc("compile", str(spec), "--target", target, "-o", str(tmp_path / target))
        assert r.returncode == 0, r.stderr
    params = dict(module(tmp_path / "torch").named_parameters())
    graph = onnx.load(str(tmp_path / "onnx" / "model.onnx")).graph
    stored = {i.name: tuple(i.dims) for i in graph.initializer}
    for name, shape in (("W_gate", (4, 64, 32)), ("W_up", (4, 64, 32)),
                        ("W_down", (4, 32, 64))):
        assert tuple(params[f"moe_.{name}"].shape) == shape
        assert stored[f"moe_/{name}"] == shape
    own = tmp_path / "own.fgpt"
    stdlib = (Path(__file__).parents[1] / "compiler" / "stdlib" / "stdlib.fgpt").read_text()
    start = stdlib.index("module MoE[")
    own.write_text(stdlib[start:stdlib.index("\n}\n", start) + 3]
                   + MOE.format(E=4, K=2))
    r = fgc("compile", str(own), "--target", "torch", "-o", str(tmp_path / "own"))
    assert r.returncode == 0, r.stderr
    assert tuple(dict(module(tmp_path / "own").named_parameters())["moe_.W_gate"].shape) \
        == (32, 4, 64)


def test_one_position_takes_its_experts_in_turn_with_the_same_sums(tmp_path):
    """A decoding step's single position runs its K experts one after the other in the
    order of their ids, with no sort or scatter, and gives what the general path gives that
    position among others (up to the products' rounding for one row against several), in
    inference and under grad."""
    spec = tmp_path / "moe.fgpt"
    spec.write_text(MOE.format(E=5, K=3))
    r = fgc("compile", str(spec), "--target", "torch", "-o", str(tmp_path / "torch"))
    assert r.returncode == 0, r.stderr
    model = module(tmp_path / "torch")
    x = tokens(50, 16, B=3)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            many = model(x)
            for b in range(x.shape[0]):
                for t in (0, 7, 15):
                    one = model(x[b:b + 1, t:t + 1])  # (1, 1): the one-position path
                    scale = many[b, t].abs().max().item()
                    assert (one[0, 0] - many[b, t]).abs().max().item() <= 1e-5 * scale, \
                        (grad, b, t)


def test_every_product_kernel_of_the_experts_agrees(tmp_path):
    """In CPU float32 inference the experts' products go through project(), which times its
    kernels on the first products of each shape; the GEMM of the stored (out, in) rows
    (`transposed`) is a candidate for those weights only. Each kernel, forced for every
    product, gives the plain product's outputs."""
    spec = tmp_path / "moe.fgpt"
    spec.write_text(MOE.format(E=4, K=2))
    r = fgc("compile", str(spec), "--target", "torch", "-o", str(tmp_path / "torch"))
    assert r.returncode == 0, r.stderr
    import importlib.util
    found = importlib.util.spec_from_file_location("fgc_moe_kernels",
                                                   tmp_path / "torch" / "model.py")
    code = importlib.util.module_from_spec(found)
    found.loader.exec_module(code)
    model = code.build().eval()
    x = tokens(50, 16, B=3)
    with torch.no_grad():
        for _ in range(4 * code.SAMPLES):  # the first products choose
            model(x)
        assert not code.TRIALS
        stored = {key: key[2] for key in code.KERNELS}  # each shape class's weight strides
        assert any(stride == (1, 32) for stride in stored.values())  # an expert's (out, in)
        for key, stride in stored.items():
            if stride[0] != 1:  # a weight stored (in, out): never the rows' GEMM
                assert code.KERNELS[key] is not code.transposed
        code.ONEDNN = False
        try:
            plain = model(x)
        finally:
            code.ONEDNN = True
        for kernel in (code.onednn, torch.matmul, code.transposed):
            for key, stride in stored.items():
                code.KERNELS[key] = kernel if stride[0] == 1 or kernel is not \
                    code.transposed else torch.matmul
            assert (model(x) - plain).abs().max().item() <= 1e-5 * plain.abs().max().item()


CHECKPOINT = """
  checkpoint {{
    W_e = "embed"
    moe.W^router = "router"
    moe.W^gate = "experts.{{e}}.gate"{steps}
    moe.W^up = "experts.{{e}}.up"{steps}
    moe.W^down = "experts.{{e}}.down"{steps}
  }}
}}
"""


@pytest.mark.parametrize("linear", [True, False], ids=["out-in", "in-out"])
def test_experts_read_one_file_tensor_each_in_either_layout(tmp_path, linear):
    """Experts read one tensor each, as nn.Linear holds them ([out, in], `| transpose`) or
    as the equations write them ([in, out], no steps), are stored (out, in) and give the
    mixture the equations define, computed here in numpy."""
    import numpy as np
    from safetensors.numpy import save_file
    E, K, H, F, V, n = 4, 2, 32, 64, 50, 16
    rng = np.random.default_rng(7)
    embed = rng.standard_normal((V, H), np.float32)
    router = rng.standard_normal((H, E), np.float32)
    gate, up = (rng.standard_normal((E, H, F), np.float32) * 0.2 for _ in range(2))
    down = rng.standard_normal((E, F, H), np.float32) * 0.2
    tensors = {"embed": embed, "router": router}
    for e in range(E):
        for name, w in (("gate", gate[e]), ("up", up[e]), ("down", down[e])):
            tensors[f"experts.{e}.{name}"] = np.ascontiguousarray(w.T if linear else w)
    save_file(tensors, str(tmp_path / "w.safetensors"))
    spec = tmp_path / "moe.fgpt"
    text = MOE.format(E=E, K=K).rstrip()
    spec.write_text(text[:-1] + CHECKPOINT.format(steps=" | transpose" if linear else ""))
    r = fgc("compile", str(spec), "--target", "torch", "--weights",
            str(tmp_path / "w.safetensors"), "-o", str(tmp_path / "torch"))
    assert r.returncode == 0, r.stderr
    model = module(tmp_path / "torch")
    assert tuple(model.moe_.W_gate.shape) == (E, F, H)
    x = tokens(V, n, B=1)
    with torch.no_grad():
        got = model(x)[0].numpy()
    rows = embed[x[0].numpy()]
    logits = rows @ router
    want = np.zeros_like(rows)
    for i, row in enumerate(rows):
        chosen = np.argsort(-logits[i])[:K]
        weight = np.exp(logits[i, chosen] - logits[i, chosen].max())
        for e, share in zip(chosen, weight / weight.sum()):
            a = row @ gate[e]
            want[i] += share * ((a / (1 + np.exp(-a)) * (row @ up[e])) @ down[e])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_choices_beyond_the_experts_are_a_located_error(tmp_path):
    text = (Path(__file__).parents[1] / "specs" / "mixtral.fgpt").read_text()
    bad = text.replace("preset 8x7b {\n    L = 32,", "preset 8x7b {\n    K = 9, L = 32,")
    assert bad != text
    spec = tmp_path / "mixtral.fgpt"
    spec.write_text(bad)
    r = fgc("check", str(spec))
    assert r.returncode == 1
    assert "keeptopk keeps 9 of 8 entries" in r.stderr, r.stderr
    assert "mixtral.fgpt:" in r.stderr and "Traceback" not in r.stderr
    r = fgc("params", "specs/mixtral.fgpt", "--preset", "8x7b", "--set", "K=0")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
