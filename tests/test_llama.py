"""specs/llama.fgpt and specs/mistral.fgpt against transformers' LlamaForCausalLM and
MistralForCausalLM, holding the same tensors.

Each preset's count equals the class's unique parameters on the meta device (Llama 3.2's
tied head counted once). A tiny randomly initialised model (grouped-query attention at
several ratios, rotary positions, RMSNorm, SwiGLU, an untied head and one tied to the
embedding; Mistral's sliding window shorter than the run) is saved with safetensors under
its own names and compiled with `fgc compile --weights`: the PyTorch module and the ONNX
graph (standard and `--optimize ort`) give transformers' probabilities to 1e-5, greedy
generation with the key/value cache (`step()`) gives transformers' `generate` ids, and the
cache holds the G key/value heads.
"""

from __future__ import annotations

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
safetensors_torch = pytest.importorskip("safetensors.torch")
pytest.importorskip("onnxruntime")

# ---------------------------------------------------------------- the released sizes

_LLAMA2 = dict(vocab_size=32000, max_position_embeddings=4096, tie_word_embeddings=False)
_LLAMA3 = dict(vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0,
               tie_word_embeddings=False)
# Llama 3.2: tied heads; rope_scaling (rope_type "llama3") adds no parameter
_LLAMA32 = dict(vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
                tie_word_embeddings=True,
                rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192})


def _sizes(L, H, A, G, F, **rest) -> dict:
    return dict(num_hidden_layers=L, hidden_size=H, num_attention_heads=A,
                num_key_value_heads=G, intermediate_size=F, **rest)


# (spec, preset): (class, config), sizes as in the released config.json files
RELEASED = {
    ("llama", "llama2_7b"): ("Llama", _sizes(32, 4096, 32, 32, 11008, **_LLAMA2)),
    ("llama", "llama2_13b"): ("Llama", _sizes(40, 5120, 40, 40, 13824, **_LLAMA2)),
    ("llama", "llama2_70b"): ("Llama", _sizes(80, 8192, 64, 8, 28672, **_LLAMA2)),
    ("llama", "llama3_8b"): ("Llama", _sizes(32, 4096, 32, 8, 14336, **_LLAMA3)),
    ("llama", "llama3_70b"): ("Llama", _sizes(80, 8192, 64, 8, 28672, **_LLAMA3)),
    ("llama", "llama3_2_1b"): ("Llama", _sizes(16, 2048, 32, 8, 8192, head_dim=64,
                                               **_LLAMA32)),
    ("llama", "llama3_2_3b"): ("Llama", _sizes(28, 3072, 24, 8, 8192, head_dim=128,
                                               **_LLAMA32)),
    ("llama", "tinyllama"): ("Llama", _sizes(22, 2048, 32, 4, 5632, vocab_size=32000,
                                             max_position_embeddings=2048,
                                             tie_word_embeddings=False)),
    ("mistral", "7b"): ("Mistral", _sizes(32, 4096, 32, 8, 14336, vocab_size=32000,
                                          max_position_embeddings=32768, sliding_window=4096,
                                          tie_word_embeddings=False)),
}


test_preset_count_equals_transformers, test_every_preset_has_a_count_test = \
    count_tests(RELEASED, ("llama", "mistral"))


# ---------------------------------------------------------------- tiny models, weights

# (spec, H, A, G, F, V, n, theta, w, tied): A / G = 2 and 4, multi-query, multi-head with a
# head of 6; a head tied to the embedding as in Llama 3.2; Mistral's window of 5 over runs
# of 16
CASES = [
    ("llama", 16, 4, 2, 24, 50, 32, 10000.0, None, False),
    ("llama", 32, 8, 2, 40, 61, 16, 500000.0, None, True),
    ("llama", 16, 4, 1, 24, 50, 16, 10000.0, None, False),
    ("llama", 24, 4, 4, 40, 37, 16, 10000.0, None, False),
    ("mistral", 16, 4, 2, 24, 50, 16, 10000.0, 5, False),
]
IDS = [f"{c[0]}-H{c[1]}-A{c[2]}-G{c[3]}" + (f"-w{c[8]}" if c[8] else "")
       + ("-tied" if c[9] else "") for c in CASES]


def _reference(spec, H, A, G, F, V, n, theta, w, tied, L=2):
    cls, config = ((transformers.MistralForCausalLM, transformers.MistralConfig)
                   if spec == "mistral" else
                   (transformers.LlamaForCausalLM, transformers.LlamaConfig))
    extra = {"sliding_window": w} if spec == "mistral" else {"attention_bias": False,
                                                              "mlp_bias": False}
    config = config(
        vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=L,
        num_attention_heads=A, num_key_value_heads=G, max_position_embeddings=n,
        rope_theta=theta, rms_norm_eps=1e-5, tie_word_embeddings=tied, **extra)
    return seeded(cls, config)


def _sets(spec, H, A, G, F, V, n, theta, w, tied, L=2) -> list[str]:
    values = dict(L=L, H=H, A=A, G=G, F=F, V=V, n=n, theta=theta)
    if w is not None:
        values["w"] = w
    if tied:
        values["tied"] = 1
    return set_args(values)


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def compiled(request, tmp_path_factory):
    case = request.param
    model = _reference(*case)
    folder = tmp_path_factory.mktemp("llama")
    weights = folder / "model.safetensors"
    # a tied lm_head.weight is embed_tokens.weight itself, which safetensors will not save
    # twice: the copy stands for a file that holds it
    safetensors_torch.save_file({k: v.clone().contiguous()
                                 for k, v in model.state_dict().items()}, str(weights))
    return case, model, compile_targets(case[0], _sets(*case), weights, folder)


# 12 new ids: past Mistral's window
test_probabilities_equal_transformers, test_greedy_generation_equals_transformers = \
    parity_tests(vocab=lambda case: case[5], lengths=lambda case: (case[6], 5), new=12)


def test_a_grouped_product_is_one_only_where_the_attention_takes_it_whole(tmp_path):
    """Under --optimize ort, GroupQueryAttention takes the query, key and value
    projections as one product by W_Q | W_K | W_V; every other grouped product (the
    standard graph's projections, SwiGLU's gate and up everywhere) is made apart, each by
    its own weights: no graph copies a product into its parts (lowering/products.py). The
    numbers are the parity tests'."""
    onnx = pytest.importorskip("onnx")
    sets = _sets("llama", 32, 2, 1, 24, 50, 16, 10000.0, None, False)  # heads of 16
    for extra in ([], ["--kv-cache"], ["--optimize", "ort"], ["--optimize", "ort", "--kv-cache"]):
        out = tmp_path / "-".join(["graph", *extra])
        r = fgc("compile", "specs/llama.fgpt", *sets, "--target", "onnx", *extra, "-o",
                str(out))
        assert r.returncode == 0, r.stderr
        graph = onnx.load(str(out / "model.onnx")).graph
        assert not any(n.op_type == "Split" for n in graph.node)
        made = {o: n for n in graph.node for o in n.output}
        weights = {n.input[1] for n in graph.node if n.op_type == "MatMul"}
        assert {"layer1/mlp/W_gate", "layer1/mlp/W_up", "layer2/mlp/W_down"} <= weights
        attention = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
        whole = "ort" in extra  # (multi-query: GroupQueryAttention with or without one)
        assert len(attention) == (2 if whole else 0)
        for n in attention:
            assert made[n.input[0]].input[1].endswith("/attn/W_Q+W_K+W_V")
            assert n.input[1] == n.input[2] == ""
        if not whole:
            assert {"layer1/attn/W_Q", "layer1/attn/W_K", "layer1/attn/W_V"} <= weights


def test_the_cache_of_grouped_query_attention(compiled):
    """step()'s cache holds each layer's keys and values, of the G key/value heads."""
    case, _, out = compiled
    model = module(out["torch"])
    with torch.no_grad():
        _, past = model.step(tokens(case[5], 3))
    assert len(past) == 2  # one attention per layer
    keys, values = past[0]
    G, D = case[3], case[1] // case[2]
    assert tuple(keys.shape) == tuple(values.shape) == (2, G, 3, D)  # G heads, not A

