"""specs/gemma2.fgpt against transformers' Gemma2ForCausalLM, holding the same tensors.

Gemma 2 is Gemma's layers with four norms a layer (two of them on the sublayers' outputs),
attention scores scaled by query_pre_attn_scalar and soft-capped, soft-capped logits, and
sliding-window attention on alternate layers, written in one spec file. The presets'
counts equal the class's unique parameters on the meta device. Tiny randomly initialised
models (grouped-query and multi-query attention, a head width that is not H / A, a
query_pre_attn_scalar that is not the head width, caps small enough to bite, a window
shorter than the run and three or four layers, so that both kinds of layer occur) are
saved with `save_pretrained` and compiled with `fgc compile --weights FOLDER` alone: every
size, cap and the window come from the folder's config.json. The PyTorch module and the
ONNX graph (standard and `--optimize ort`) give transformers' probabilities to 1e-5, and
greedy generation with the key/value cache gives transformers' `generate` ids.
"""

from __future__ import annotations

import json

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

# (spec, preset): (class, config), sizes as in the released config.json
RELEASED = {
    ("gemma2", "2b"): ("Gemma2", dict(
        num_hidden_layers=26, hidden_size=2304, num_attention_heads=8, num_key_value_heads=4,
        head_dim=256, intermediate_size=9216, query_pre_attn_scalar=256)),
    ("gemma2", "9b"): ("Gemma2", dict(
        num_hidden_layers=42, hidden_size=3584, num_attention_heads=16, num_key_value_heads=8,
        head_dim=256, intermediate_size=14336, query_pre_attn_scalar=256)),
    ("gemma2", "27b"): ("Gemma2", dict(
        num_hidden_layers=46, hidden_size=4608, num_attention_heads=32,
        num_key_value_heads=16, head_dim=128, intermediate_size=36864,
        query_pre_attn_scalar=144)),
}


test_preset_count_equals_transformers, test_every_preset_has_a_count_test = \
    count_tests(RELEASED, ("gemma2",))


# ---------------------------------------------------------------- tiny models, weights

# (L, H, A, G, D, F, V, w, D_att): A / G = 2 over three layers (sliding, full, sliding);
# multi-query over four, with a head width of 8 (onnxruntime's GroupQueryAttention takes
# the full layers under --optimize ort). Neither head width is H / A, neither D_att is D,
# and each window is shorter than the N positions. Caps of 2 and 1.5 bite on the peaked
# weights.
N = 16
CASES = [(3, 16, 4, 2, 6, 24, 50, 5, 10), (4, 24, 4, 1, 8, 40, 37, 3, 12)]
IDS = [f"L{L}-A{A}-G{G}-D{D}-w{w}" for L, _, A, G, D, _, _, w, _ in CASES]
CAP_ATT, CAP_LOGIT = 2.0, 1.5


def _reference(L, H, A, G, D, F, V, w, D_att):
    config = transformers.Gemma2Config(
        vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=L,
        num_attention_heads=A, num_key_value_heads=G, head_dim=D,
        max_position_embeddings=N, sliding_window=w, query_pre_attn_scalar=D_att,
        attn_logit_softcapping=CAP_ATT, final_logit_softcapping=CAP_LOGIT,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    config._attn_implementation = "eager"
    return seeded(transformers.Gemma2ForCausalLM, config)


# no --set: the sizes, the caps and the window are the folder's config.json
compiled = folder_fixture("gemma2", CASES, IDS, _reference)


def test_the_caps_and_the_window_matter(compiled):
    """The tiny models are not blind to what Gemma 2 adds: without the caps, or with every
    layer full, transformers' own probabilities move."""
    case, ref, _ = compiled
    x = torch.randint(0, case[6], (2, N), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = torch.softmax(ref(x).logits, -1)
        for change in ({"attn_logit_softcapping": None}, {"final_logit_softcapping": None},
                       {"sliding_window": N}):
            saved = {k: getattr(ref.config, k) for k in change}
            for k, v in change.items():
                setattr(ref.config, k, v)
                for layer in ref.model.layers:
                    if k == "attn_logit_softcapping":
                        layer.self_attn.attn_logit_softcapping = v
            try:
                other = torch.softmax(ref(x).logits, -1)
            finally:
                for k, v in saved.items():
                    setattr(ref.config, k, v)
                    for layer in ref.model.layers:
                        if k == "attn_logit_softcapping":
                            layer.self_attn.attn_logit_softcapping = v
            assert float((other - want).abs().max()) > 1e-3, change


test_probabilities_equal_transformers, test_greedy_generation_equals_transformers = \
    parity_tests(vocab=lambda case: case[6])


def test_a_gemma2_folder_finds_its_spec_and_refuses_what_it_does_not_write(compiled,
                                                                           tmp_path):
    """`fgc compile FOLDER` finds specs/gemma2.fgpt by config.json's architectures, and
    the folder's layer_types (sliding first, then alternating) are the spec's; a file whose
    layers alternate the other way round, or whose logits are not capped (null), is refused
    with the key located, and nothing is written."""
    _, _, out = compiled
    folder = out["torch"].parent / "hf"
    config = json.loads((folder / "config.json").read_text())
    assert config["layer_types"][:2] == ["sliding_attention", "full_attention"]
    assert_finds_spec(folder, "gemma2", tmp_path / "found")
    for key, value, message in (
            ("layer_types", ["full_attention", "sliding_attention"] * 2,
             'config.json sets `layer_types` to ["full_attention", "sliding_attention", '),
            ("final_logit_softcapping", None,
             "config.json has no `final_logit_softcapping`, from which specs/gemma2.fgpt "
             "reads `c_logit`")):
        value = value[:len(config["layer_types"])] if isinstance(value, list) else value
        r = refused_config(folder, tmp_path / key, "gemma2", **{key: value})
        assert message in r.stderr
        bare = tmp_path / key / "changed"
        if key == "layer_types":  # at the key's line, with the spec's assumption
            line = 1 + next(k for k, text in enumerate(
                (bare / "config.json").read_text().splitlines()) if '"layer_types"' in text)
            assert f"{bare}/config.json:{line}:3: error:" in r.stderr
            assert "note: the assumption" in r.stderr
        assert f"{bare}/config.json:" in r.stderr and "specs/gemma2.fgpt:" in r.stderr
