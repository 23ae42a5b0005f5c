"""specs/granite.fgpt against transformers' GraniteForCausalLM, holding the same tensors.

Granite is the LLaMA layers with four numbers read from config.json (the embedding's, the
attention scores', each sublayer's and the logits' multipliers), written in one spec file
with no code of its own. The preset's count equals the class's unique parameters on the
meta device. A tiny randomly initialised model (multipliers far from 1, grouped-query and
multi-query attention, a tied and an untied head) is saved with `save_pretrained` and
compiled with `fgc compile --weights FOLDER` alone: every size and multiplier comes from
the folder's config.json. The PyTorch module and the ONNX graph (standard and `--optimize
ort`) give transformers' probabilities to 1e-5, and greedy generation with the key/value
cache gives transformers' `generate` ids.
"""

from __future__ import annotations

import pytest
from hf_parity import (
    DELETE,
    assert_finds_spec,
    count_tests,
    folder_fixture,
    parity_tests,
    refused_config,
    seeded,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

# (spec, preset): (class, config), sizes as in the released config.json
RELEASED = {
    ("granite", "granite3_3_8b"): ("Granite", dict(
        num_hidden_layers=40, hidden_size=4096, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=12800, vocab_size=49159,
        max_position_embeddings=131072, rope_theta=10000000.0, tie_word_embeddings=True,
        embedding_multiplier=12.0, attention_multiplier=0.0078125,
        residual_multiplier=0.22, logits_scaling=16.0)),
}


test_preset_count_equals_transformers, test_every_preset_has_a_count_test = \
    count_tests(RELEASED, ("granite",))


# ---------------------------------------------------------------- tiny models, weights

# (H, A, G, F, V, tied): A / G = 2 with the head tied as released; multi-query with a head
# of its own. N positions.
N = 16
CASES = [(16, 4, 2, 24, 50, True), (24, 4, 1, 40, 37, False)]
IDS = [f"H{H}-A{A}-G{G}" + ("-tied" if tied else "") for H, A, G, _, _, tied in CASES]


def _reference(H, A, G, F, V, tied):
    config = transformers.GraniteConfig(
        vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=2,
        num_attention_heads=A, num_key_value_heads=G, max_position_embeddings=N,
        rms_norm_eps=1e-5, tie_word_embeddings=tied, embedding_multiplier=12.0,
        attention_multiplier=0.07, residual_multiplier=0.22, logits_scaling=3.0,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return seeded(transformers.GraniteForCausalLM, config)


# no --set: the sizes and the four multipliers are the folder's config.json
compiled = folder_fixture("granite", CASES, IDS, _reference)


test_probabilities_equal_transformers, test_greedy_generation_equals_transformers = \
    parity_tests(vocab=lambda case: case[4])


def test_a_granite_folder_finds_its_spec_and_needs_every_multiplier(compiled, tmp_path):
    """`fgc compile FOLDER` finds specs/granite.fgpt by config.json's architectures and reads
    each multiplier from its key; a config.json without one is refused with the key named,
    never compiled with a multiplier of 1."""
    _, _, out = compiled
    folder = out["torch"].parent / "hf"
    assert_finds_spec(folder, "granite", tmp_path / "found")
    r = refused_config(folder, tmp_path, "granite", residual_multiplier=DELETE)
    assert "residual_multiplier" in r.stderr
