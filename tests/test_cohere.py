"""specs/cohere.fgpt against transformers' CohereForCausalLM, holding the same tensors.

Command R (and Aya 23) differ from LLaMA in four places, each written in the spec file
with no code of its own: one bias-free LayerNorm a layer whose output the attention and
the feed-forward net read side by side, rotary positions in the interleaved convention,
and the logits multiplied by config.json's logit_scale. Each preset's count equals the
class's unique parameters on the meta device. Tiny randomly initialised models
(grouped-query, multi-query and multi-head attention; a tied and an untied head) are
saved with `save_pretrained` and compiled with `fgc compile --weights FOLDER` alone: the
PyTorch module and the ONNX graph (standard and `--optimize ort`) give transformers'
probabilities to 1e-5, and greedy generation with the key/value cache gives transformers'
`generate` ids.
"""

from __future__ import annotations

import pytest
from hf_parity import (
    count_tests,
    folder_fixture,
    parity_tests,
    refused_config,
    seeded,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

_COMMAND_R = dict(vocab_size=256000, logit_scale=0.0625, tie_word_embeddings=True,
                  use_qk_norm=False)
# (spec, preset): (class, config), sizes as in the released config.json files
RELEASED = {
    ("cohere", "command_r_v01"): ("Cohere", dict(
        num_hidden_layers=40, hidden_size=8192, num_attention_heads=64,
        num_key_value_heads=64, intermediate_size=22528, rope_theta=8000000.0, **_COMMAND_R)),
    ("cohere", "command_r_08_2024"): ("Cohere", dict(
        num_hidden_layers=40, hidden_size=8192, num_attention_heads=64,
        num_key_value_heads=8, intermediate_size=24576, rope_theta=4000000.0, **_COMMAND_R)),
    ("cohere", "aya_23_8b"): ("Cohere", dict(
        num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=14336, **_COMMAND_R)),
}


test_preset_count_equals_transformers, test_every_preset_has_a_count_test = \
    count_tests(RELEASED, ("cohere",))


# ---------------------------------------------------------------- tiny models, weights

# (H, A, G, F, V, tied): A / G = 2 tied as released; multi-query with a head of its own;
# multi-head (Command R v01). N positions.
N = 16
CASES = [(16, 4, 2, 24, 50, True), (24, 4, 1, 40, 37, False), (16, 2, 2, 24, 50, True)]
IDS = [f"H{H}-A{A}-G{G}" + ("-tied" if tied else "") for H, A, G, _, _, tied in CASES]


def _reference(H, A, G, F, V, tied):
    config = transformers.CohereConfig(
        vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=2,
        num_attention_heads=A, num_key_value_heads=G, max_position_embeddings=N,
        layer_norm_eps=1e-5, tie_word_embeddings=tied, logit_scale=0.3,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return seeded(transformers.CohereForCausalLM, config)


# no --set: the sizes and logit_scale are the folder's config.json
compiled = folder_fixture("cohere", CASES, IDS, _reference)


test_probabilities_equal_transformers, test_greedy_generation_equals_transformers = \
    parity_tests(vocab=lambda case: case[4])


def test_query_and_key_norms_are_refused(compiled, tmp_path):
    """Command R+'s use_qk_norm adds norms the spec does not write: its config.json is
    refused at the key, never compiled without them."""
    _, _, out = compiled
    r = refused_config(out["torch"].parent / "hf", tmp_path, "cohere", use_qk_norm=True)
    assert "use_qk_norm" in r.stderr
