"""specs/olmo2.fgpt against transformers' Olmo2ForCausalLM, holding the same tensors.

OLMo 2 differs from LLaMA in two places, each written in the spec file with no code of its
own: the sublayers read the residual stream unnormalized and their outputs are RMS-normalized
before the residual add (post_attention_layernorm, post_feedforward_layernorm), and the
queries and keys are RMS-normalized over the whole projection (A * D and G * D features, not
head by head as Qwen3's) before RoPE. Each preset's count equals the class's unique
parameters on the meta device. Tiny randomly initialised models (grouped-query, multi-query
and multi-head attention; a tied and an untied head; a head width D other than H / A) are
saved with `save_pretrained` and compiled with `fgc compile --weights FOLDER` alone: the
PyTorch module and the ONNX graph (standard and `--optimize ort`) give transformers'
probabilities to 1e-5, and greedy generation with the key/value cache gives transformers'
`generate` ids.
"""

from __future__ import annotations

import pytest
from hf_parity import (
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

_OLMO2 = dict(vocab_size=100352, max_position_embeddings=4096, rope_theta=500000.0,
              rms_norm_eps=1e-6, tie_word_embeddings=False)
# (spec, preset): (class, config), sizes as in the released config.json files
RELEASED = {
    ("olmo2", "olmo2_1124_7b"): ("Olmo2", dict(
        num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
        num_key_value_heads=32, intermediate_size=11008, **_OLMO2)),
    ("olmo2", "olmo2_1124_13b"): ("Olmo2", dict(
        num_hidden_layers=40, hidden_size=5120, num_attention_heads=40,
        num_key_value_heads=40, intermediate_size=13824, **_OLMO2)),
    ("olmo2", "olmo2_0325_32b"): ("Olmo2", dict(
        num_hidden_layers=64, hidden_size=5120, num_attention_heads=40,
        num_key_value_heads=8, intermediate_size=27648, **_OLMO2)),
    ("olmo2", "olmo2_0425_1b"): ("Olmo2", dict(
        num_hidden_layers=16, hidden_size=2048, num_attention_heads=16,
        num_key_value_heads=16, intermediate_size=8192, **_OLMO2)),
}


test_preset_count_equals_transformers, test_every_preset_has_a_count_test = \
    count_tests(RELEASED, ("olmo2",))


# ---------------------------------------------------------------- tiny models, weights

# (H, A, G, D, F, V, tied): A / G = 2 with a tied head; multi-query with heads of 8 over
# H = 24 (A * D = 32: config.json's head_dim) and a head of its own; multi-head untied, as
# released. D None: head_dim absent, H / A. N positions.
N = 16
CASES = [(16, 4, 2, None, 24, 50, True), (24, 4, 1, 8, 40, 37, False),
         (16, 2, 2, None, 24, 50, False)]
IDS = [f"H{H}-A{A}-G{G}" + (f"-D{D}" if D else "") + ("-tied" if tied else "")
       for H, A, G, D, _, _, tied in CASES]


def _reference(H, A, G, D, F, V, tied):
    config = transformers.Olmo2Config(
        vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=2,
        num_attention_heads=A, num_key_value_heads=G, max_position_embeddings=N,
        rms_norm_eps=1e-6, rope_theta=500000.0, tie_word_embeddings=tied,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
        **({} if D is None else {"head_dim": D}))
    return seeded(transformers.Olmo2ForCausalLM, config)


# no --set: the sizes (head_dim where the file has one) are the folder's config.json
compiled = folder_fixture("olmo2", CASES, IDS, _reference)


test_probabilities_equal_transformers, test_greedy_generation_equals_transformers = \
    parity_tests(vocab=lambda case: case[5])


# what a config.json may ask for that the spec does not compute: attention biases, scaled
# rotary frequencies
REFUSED = {"attention_bias": True,
           "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The first case as `save_pretrained` writes it."""
    path = tmp_path_factory.mktemp("olmo2_folder") / "hf"
    _reference(*CASES[0]).save_pretrained(str(path))
    return path


def test_an_olmo2_folder_finds_its_spec(folder, tmp_path):
    """`fgc compile FOLDER` finds specs/olmo2.fgpt by config.json's architectures."""
    assert_finds_spec(folder, "olmo2", tmp_path / "found")


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_a_value_the_spec_does_not_write_is_refused(folder, key, tmp_path):
    """A config.json with a value the spec does not write is refused at its key, in the
    file, and nothing is written."""
    r = refused_config(folder, tmp_path, **{key: REFUSED[key]})
    assert key in r.stderr
