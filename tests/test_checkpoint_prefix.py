"""A released spec reads a checkpoint whose names carry the base model's prefix and one whose
names do not.

transformers' *ForCausalLM state dicts name the base model's tensors `model.layers.0...`
(GPT-NeoX: `gpt_neox.layers.0...`) and the head outside it `lm_head.weight` (`embed_out`);
a bare LlamaModel's file, or one re-saved without the prefix, has `layers.0...`. For each
released decoder spec, a tiny random transformers model is saved with save_pretrained (the
released names) and again with the prefix taken off every name that has it; both compile
to the same weights, and the compiled module gives transformers' probabilities from either.
For the tied specs (Qwen2 with tied = 1, Gemma) the file without the prefix is exactly a
bare base model's: no head at all. A file that holds a tensor both ways, or neither way,
is refused with an error naming the tensor.
"""

from __future__ import annotations

import pytest
from conftest import fgc, peaked_weights, set_args
from hf_parity import module, tokens

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

N = 16
_COMMON = dict(vocab_size=50, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=N, bos_token_id=None,
               eos_token_id=None, pad_token_id=None)
_SETS = dict(L=2, H=16, A=4, F=24, V=50, n=N, eps=1e-5, theta=10000.0)
_EPS_THETA = dict(rms_norm_eps=1e-5, rope_theta=10000.0)  # the classes' defaults differ

# spec: (transformers family, its prefix, config beyond _COMMON, --set beyond _SETS)
FAMILIES = {
    "llama": ("Llama", "model.", dict(num_key_value_heads=2, tie_word_embeddings=False,
                                      **_EPS_THETA), dict(G=2)),
    "mistral": ("Mistral", "model.", dict(num_key_value_heads=2, sliding_window=5,
                                          tie_word_embeddings=False, **_EPS_THETA),
                dict(G=2, w=5)),
    "qwen2": ("Qwen2", "model.", dict(num_key_value_heads=2, tie_word_embeddings=True,
                                      **_EPS_THETA), dict(G=2, tied=1)),
    "qwen3": ("Qwen3", "model.", dict(num_key_value_heads=2, head_dim=6,
                                      tie_word_embeddings=False, **_EPS_THETA), dict(G=2, D=6)),
    "gemma": ("Gemma", "model.", dict(num_key_value_heads=1, head_dim=6, **_EPS_THETA),
              dict(G=1, D=6)),
    "gemma2": ("Gemma2", "model.", dict(num_key_value_heads=2, head_dim=6, sliding_window=5,
                                        query_pre_attn_scalar=8, **_EPS_THETA),
               dict(G=2, D=6, w=5, D_att=8)),
    "phi3": ("Phi3", "model.", dict(num_key_value_heads=4, sliding_window=5,
                                    tie_word_embeddings=False, **_EPS_THETA), dict(G=4, w=5)),
    "granite": ("Granite", "model.", dict(num_key_value_heads=2, tie_word_embeddings=False,
                                          embedding_multiplier=12.0, attention_multiplier=0.07,
                                          residual_multiplier=0.22, logits_scaling=3.0,
                                          **_EPS_THETA),
                dict(G=2, tied=0, m_emb=12.0, m_att=0.07, m_res=0.22, m_logit=3.0)),
    "cohere": ("Cohere", "model.", dict(num_key_value_heads=2, tie_word_embeddings=False,
                                        logit_scale=0.3, layer_norm_eps=1e-5,
                                        rope_theta=10000.0),
               dict(G=2, tied=0, s_logit=0.3)),
    "olmo2": ("Olmo2", "model.", dict(num_key_value_heads=2, head_dim=6,
                                      tie_word_embeddings=False, **_EPS_THETA),
              dict(G=2, D=6, tied=0)),
    "gpt_neox": ("GPTNeoX", "gpt_neox.", dict(rotary_pct=0.5, rotary_emb_base=10000,
                                              layer_norm_eps=1e-5, hidden_act="gelu",
                                              tie_word_embeddings=False), dict(R=2)),
}


def _sets(spec: str) -> list[str]:
    values = {**_SETS, **FAMILIES[spec][3]}
    return set_args(values)


def _released(spec: str, folder):
    """A tiny transformers model and its save_pretrained tensors, by name."""
    family, _, extra, _ = FAMILIES[spec]
    config = getattr(transformers, f"{family}Config")(**_COMMON, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForCausalLM")(config).eval()
    peaked_weights(model)
    model.save_pretrained(str(folder / "hf"))
    return model, safetensors_torch.load_file(str(folder / "hf" / "model.safetensors"))


def _compile(spec: str, weights, out):
    return fgc("compile", f"specs/{spec}.fgpt", *_sets(spec), "--weights", str(weights),
               "--target", "torch", "-o", str(out))


@pytest.mark.parametrize("spec", sorted(FAMILIES))
def test_with_and_without_the_prefix(spec, tmp_path):
    prefix = FAMILIES[spec][1]
    ref, state = _released(spec, tmp_path)
    assert any(k.startswith(prefix) for k in state)
    bare = {k.removeprefix(prefix): v for k, v in state.items()}
    assert not any(k.startswith(prefix) for k in bare)
    files = {"prefixed": tmp_path / "prefixed.safetensors",
             "bare": tmp_path / "bare.safetensors"}
    safetensors_torch.save_file(state, str(files["prefixed"]))
    safetensors_torch.save_file(bare, str(files["bare"]))

    outs = {}
    for how, path in files.items():
        r = _compile(spec, path, tmp_path / how / "torch")
        assert r.returncode == 0, r.stderr
        assert "not used" not in r.stdout + r.stderr
        outs[how] = tmp_path / how / "torch"
    for name in ("model.py", "weights.safetensors"):  # the same module, the same tensors
        assert (outs["prefixed"] / name).read_bytes() == (outs["bare"] / name).read_bytes()

    x = tokens(50, N)
    with torch.no_grad():
        want = torch.softmax(ref(x).logits, -1)
        for how, folder in outs.items():
            got = module(folder)(x)
            assert float((got - want).abs().max()) <= 1e-5, how


def test_a_tensor_held_both_ways_is_refused(tmp_path):
    _, state = _released("llama", tmp_path)
    state["norm.weight"] = state["model.norm.weight"] + 1.0
    path = tmp_path / "both.safetensors"
    safetensors_torch.save_file(state, str(path))
    r = _compile("llama", path, tmp_path / "out")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert "`norm.weight` and `model.norm.weight`" in r.stderr
    assert "ln_f.gamma" in r.stderr


def test_a_tensor_found_neither_way_is_named(tmp_path):
    _, state = _released("llama", tmp_path)
    state["model.final_norm.weight"] = state.pop("model.norm.weight")
    path = tmp_path / "renamed.safetensors"
    safetensors_torch.save_file(state, str(path))
    r = _compile("llama", path, tmp_path / "out")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert "neither `norm.weight` nor `model.norm.weight`" in r.stderr
    assert "model.final_norm.weight" in r.stderr  # the nearest name, as a hint


def test_an_untied_head_is_not_looked_for_in_the_base_model(tmp_path):
    """A bare LlamaModel's file has no lm_head: an untied spec says which tensor is missing."""
    _, state = _released("llama", tmp_path)
    base = {k.removeprefix("model."): v for k, v in state.items() if k != "lm_head.weight"}
    path = tmp_path / "base.safetensors"
    safetensors_torch.save_file(base, str(path))
    r = _compile("llama", path, tmp_path / "out")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "`lm_head.weight`" in r.stderr and "lm_head.W" in r.stderr
