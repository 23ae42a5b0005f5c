"""specs/llama.fgpt and specs/mistral.fgpt against transformers' LlamaForCausalLM and
MistralForCausalLM, holding the same tensors.

A tiny randomly initialised model (grouped-query attention at several ratios, rotary
positions, RMSNorm, SwiGLU, an untied head; Mistral's sliding window shorter than the run)
is saved with safetensors under its own names and compiled with `fgc compile --weights`:
the PyTorch module and the ONNX graph (standard and `--optimize ort`) give transformers'
probabilities to 1e-5, greedy generation with the key/value cache (`step()`) gives
transformers' `generate` ids, and the cache holds the G key/value heads.
"""

from __future__ import annotations

import pytest
from conftest import peaked_weights
from hf_parity import assert_greedy, assert_probabilities, compile_targets, module, tokens

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
pytest.importorskip("onnxruntime")

# (spec, H, A, G, F, V, n, theta, w): A / G = 2 and 4, multi-query, multi-head with a head
# of 6; Mistral's window of 5 over runs of 16
CASES = [
    ("llama", 16, 4, 2, 24, 50, 32, 10000.0, None),
    ("llama", 32, 8, 2, 40, 61, 16, 500000.0, None),
    ("llama", 16, 4, 1, 24, 50, 16, 10000.0, None),
    ("llama", 24, 4, 4, 40, 37, 16, 10000.0, None),
    ("mistral", 16, 4, 2, 24, 50, 16, 10000.0, 5),
]
IDS = [f"{c[0]}-H{c[1]}-A{c[2]}-G{c[3]}" + (f"-w{c[8]}" if c[8] else "") for c in CASES]


def _reference(spec, H, A, G, F, V, n, theta, w, L=2):
    cls, config = ((transformers.MistralForCausalLM, transformers.MistralConfig)
                   if spec == "mistral" else
                   (transformers.LlamaForCausalLM, transformers.LlamaConfig))
    extra = {"sliding_window": w} if spec == "mistral" else {"attention_bias": False,
                                                              "mlp_bias": False}
    config = config(
        vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=L,
        num_attention_heads=A, num_key_value_heads=G, max_position_embeddings=n,
        rope_theta=theta, rms_norm_eps=1e-5, tie_word_embeddings=False, **extra)
    torch.manual_seed(0)
    model = cls(config).eval()
    peaked_weights(model)
    return model


def _sets(spec, H, A, G, F, V, n, theta, w, L=2) -> list[str]:
    values = dict(L=L, H=H, A=A, G=G, F=F, V=V, n=n, theta=theta)
    if w is not None:
        values["w"] = w
    return [x for k, v in values.items() for x in ("--set", f"{k}={v}")]


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def compiled(request, tmp_path_factory):
    case = request.param
    model = _reference(*case)
    folder = tmp_path_factory.mktemp("llama")
    weights = folder / "model.safetensors"
    safetensors_torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                                str(weights))
    return case, model, compile_targets(case[0], _sets(*case), weights, folder)


def test_probabilities_equal_transformers(compiled):
    case, ref, out = compiled
    assert_probabilities(ref, out, V=case[5], lengths=(case[6], 5))


def test_greedy_generation_equals_transformers(compiled):
    case, ref, out = compiled
    assert_greedy(ref, out, V=case[5], new=12)  # past Mistral's window


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
