"""specs/qwen2.fgpt, specs/qwen3.fgpt and specs/gemma.fgpt against transformers'
Qwen2ForCausalLM, Qwen3ForCausalLM and GemmaForCausalLM, holding the same tensors.

Each preset's count equals the class's unique parameters on the meta device. A tiny randomly
initialised model (query/key/value biases for Qwen2, per-head query and key norms for Qwen3,
Gemma's offset RMSNorm, GeGLU and scaled embedding; grouped-query ratios other than one, a
head dimension other than H / A, tied and untied heads) is saved with safetensors under its
own names and compiled with `fgc compile --weights`: the PyTorch module and the ONNX graph
(standard and `--optimize ort`) give transformers' probabilities to 1e-5, and greedy
generation with the key/value cache (`step()`) gives transformers' `generate` ids. Qwen2
and Qwen3 saved with YaRN's rope_parameters (as their model cards ask for long contexts)
compile from the folder alone to transformers' probabilities and ids too.
"""

from __future__ import annotations

import pytest
from conftest import set_args
from hf_parity import (
    assert_greedy,
    assert_probabilities,
    compile_folder,
    compile_targets,
    count_tests,
    parity_tests,
    refused_config,
    seeded,
    tokens,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
ort = pytest.importorskip("onnxruntime")


# ---------------------------------------------------------------- the released sizes

# (spec, preset): (class, config), sizes as in the released config.json files
RELEASED = {
    ("qwen2", "7b"): ("Qwen2", dict(num_hidden_layers=28, hidden_size=3584,
                                    num_attention_heads=28, num_key_value_heads=4,
                                    intermediate_size=18944, vocab_size=152064,
                                    tie_word_embeddings=False)),
    ("qwen2", "0.5b"): ("Qwen2", dict(num_hidden_layers=24, hidden_size=896,
                                      num_attention_heads=14, num_key_value_heads=2,
                                      intermediate_size=4864, vocab_size=151936,
                                      tie_word_embeddings=True)),
    ("qwen3", "8b"): ("Qwen3", dict(num_hidden_layers=36, hidden_size=4096,
                                    num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                    intermediate_size=12288, vocab_size=151936,
                                    tie_word_embeddings=False)),
    ("qwen3", "4b"): ("Qwen3", dict(num_hidden_layers=36, hidden_size=2560,
                                    num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                    intermediate_size=9728, vocab_size=151936,
                                    tie_word_embeddings=True)),
    ("qwen3", "0.6b"): ("Qwen3", dict(num_hidden_layers=28, hidden_size=1024,
                                      num_attention_heads=16, num_key_value_heads=8,
                                      head_dim=128, intermediate_size=3072,
                                      vocab_size=151936, tie_word_embeddings=True)),
    ("gemma", "2b"): ("Gemma", dict(num_hidden_layers=18, hidden_size=2048,
                                    num_attention_heads=8, num_key_value_heads=1, head_dim=256,
                                    intermediate_size=16384, vocab_size=256000)),
    ("gemma", "7b"): ("Gemma", dict(num_hidden_layers=28, hidden_size=3072,
                                    num_attention_heads=16, num_key_value_heads=16,
                                    head_dim=256, intermediate_size=24576, vocab_size=256000)),
}


test_preset_count_equals_transformers, test_every_preset_has_a_count_test = \
    count_tests(RELEASED, ("qwen2", "qwen3", "gemma"))


# ---------------------------------------------------------------- tiny models, weights

# (spec, H, A, G, D, F, V, tied, file_has_head): A / G = 2, 3 and 4 and multi-query; for
# Qwen3 and Gemma a head of D != H / A; tied heads saved with and without lm_head.weight
CASES = [
    ("qwen2", 16, 4, 2, None, 24, 50, False, True),
    ("qwen2", 24, 6, 2, None, 40, 37, True, True),
    ("qwen3", 16, 4, 1, 6, 24, 50, False, True),
    ("qwen3", 16, 4, 2, 10, 40, 37, True, False),
    ("gemma", 16, 4, 1, 6, 24, 50, True, False),
    ("gemma", 16, 8, 2, 4, 40, 37, True, True),
]
IDS = [f"{c[0]}-H{c[1]}-A{c[2]}-G{c[3]}" + (f"-D{c[4]}" if c[4] else "")
       + ("-tied" if c[7] else "") for c in CASES]
N = 16


def _reference(spec, H, A, G, D, F, V, tied, file_has_head, L=2):
    family = {"qwen2": "Qwen2", "qwen3": "Qwen3", "gemma": "Gemma"}[spec]
    extra = {"head_dim": D} if D else {}
    config = getattr(transformers, f"{family}Config")(
        vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=L,
        num_attention_heads=A, num_key_value_heads=G, max_position_embeddings=N,
        rope_theta=1e6 if spec != "gemma" else 10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=tied, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        **extra)
    return seeded(getattr(transformers, f"{family}ForCausalLM"), config,
                  offset_gains=spec == "gemma")


def _sets(spec, H, A, G, D, F, V, tied, file_has_head, L=2) -> list[str]:
    values = dict(L=L, H=H, A=A, G=G, F=F, V=V, n=N)
    if D:
        values["D"] = D
    if spec != "gemma":
        values["tied"] = int(tied)
    return set_args(values)


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def compiled(request, tmp_path_factory):
    case = request.param
    model = _reference(*case)
    folder = tmp_path_factory.mktemp(case[0])
    weights = folder / "model.safetensors"
    # a tied lm_head.weight is embed_tokens.weight itself, which safetensors will not save
    # twice: a copy stands for a file that holds it, its absence for save_pretrained's
    state = {k: v.clone().contiguous() for k, v in model.state_dict().items()}
    if not case[8]:
        del state["lm_head.weight"]
    safetensors_torch.save_file(state, str(weights))
    return case, model, compile_targets(case[0], _sets(*case), weights, folder)


test_probabilities_equal_transformers, test_greedy_generation_equals_transformers = \
    parity_tests(vocab=lambda case: case[6])


# ---------------------------------------------------------------- YaRN from config.json

# rope_parameters as Qwen's model cards ask for long contexts ("yarn", factor, the context
# first trained with), at a scale the tiny models reach: n0 = 8 of the 24 positions run,
# beta_fast and beta_slow chosen so that heads of 8 keep, blend and divide frequencies
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
        "beta_fast": 4.0, "beta_slow": 0.5, "rope_theta": 10000.0}
YARN_CASES = [("qwen2", 16, 2, 1, None), ("qwen3", 24, 4, 2, 8)]


def _yarn_reference(spec, H, A, G, D, rope=YARN):
    family = {"qwen2": "Qwen2", "qwen3": "Qwen3"}[spec]
    config = getattr(transformers, f"{family}Config")(
        vocab_size=37, hidden_size=H, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=A, num_key_value_heads=G, max_position_embeddings=32,
        rms_norm_eps=1e-6, tie_word_embeddings=False, rope_parameters=dict(rope),
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
        **({"head_dim": D} if D else {}))
    return seeded(getattr(transformers, f"{family}ForCausalLM"), config)


@pytest.fixture(scope="module", params=YARN_CASES, ids=[c[0] for c in YARN_CASES])
def yarn(request, tmp_path_factory):
    case = request.param
    model = _yarn_reference(*case)
    # no --set: factor, n0, beta_fast and beta_slow are the folder's rope_parameters
    return case, model, compile_folder(case[0], model, tmp_path_factory.mktemp("yarn"))


def test_yarn_from_the_folder_equals_transformers(yarn):
    """RoPE^yarn, its four numbers read from config.json: transformers' probabilities in
    every target (where YaRN moves them: the same weights without it give others) and its
    greedy ids through the cache."""
    case, ref, out = yarn
    x = tokens(37, 24)
    plain = _yarn_reference(*case, rope={"rope_type": "default", "rope_theta": 10000.0})
    plain.load_state_dict(ref.state_dict())
    with torch.no_grad():
        moved = torch.softmax(ref(x).logits, -1) - torch.softmax(plain(x).logits, -1)
    assert float(moved.abs().max()) > 1e-3
    assert_probabilities(ref, out, V=37, lengths=(24, 5))
    assert_greedy(ref, out, V=37, new=12)


def test_a_yarn_setting_the_spec_does_not_compute_is_refused(yarn, tmp_path):
    """An attention_factor of its own (not 0.1 ln(factor) + 1), or an unrounded ramp
    (truncate false), is refused at its line; a rope_type the spec does not know too."""
    case, _, out = yarn
    folder = out["torch"].parent / "hf"
    for key, value in (("attention_factor", 1.5), ("truncate", False),
                       ("rope_type", "longrope")):
        rope = {**YARN, key: value}
        r = refused_config(folder, tmp_path / key, case[0], rope_parameters=rope)
        assert f"`rope_parameters.{key}`" in r.stderr, r.stderr
