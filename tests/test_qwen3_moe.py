"""specs/qwen3_moe.fgpt against transformers' Qwen3MoeForCausalLM, holding the same tensors.

Qwen3-MoE is Qwen3's attention (query and key heads RMS-normalized before RoPE, a head
width of its own) with Mixtral's sparse mixture of SwiGLU experts in every layer, written
in one spec file. The presets' counts equal the class's parameters on the meta device.
Tiny randomly initialised models (grouped-query and multi-query attention, a head width
that is not H / A, 5 experts choosing 2 and 4 choosing 3, a tied and an untied head) are
saved with `save_pretrained`, one tensor per expert as the released files hold them, and
compiled with `fgc compile --weights FOLDER` alone: every size comes from the folder's
config.json (the experts' count from num_local_experts, as transformers 5 writes it). The
PyTorch module and the ONNX graph (standard and `--optimize ort`) give transformers'
probabilities to 1e-5, and greedy generation with the key/value cache gives transformers'
`generate` ids through step() and through `fgc generate` in both backends. The tensors
read with or without the `model.` prefix; a folder that asks for unrenormalized routing or
a dense layer is refused.
"""

from __future__ import annotations

import json

import pytest
from conftest import fgc
from hf_parity import (
    DELETE,
    count_tests,
    folder_fixture,
    parity_tests,
    refused_config,
    seeded,
    tokens,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

# (spec, preset): (class, config), sizes as in the released config.json
RELEASED = {
    ("qwen3_moe", "30b_a3b"): ("Qwen3Moe", dict(
        num_hidden_layers=48, hidden_size=2048, num_attention_heads=32, num_key_value_heads=4,
        head_dim=128, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
        vocab_size=151936, tie_word_embeddings=False)),
    ("qwen3_moe", "235b_a22b"): ("Qwen3Moe", dict(
        num_hidden_layers=94, hidden_size=4096, num_attention_heads=64, num_key_value_heads=4,
        head_dim=128, moe_intermediate_size=1536, num_experts=128, num_experts_per_tok=8,
        vocab_size=151936, tie_word_embeddings=False)),
}


test_preset_count_equals_transformers, test_every_preset_has_a_count_test = \
    count_tests(RELEASED, ("qwen3_moe",))


# ---------------------------------------------------------------- tiny models, weights

# (L, H, A, G, D, F, E, K, V, tied): A / G = 2 with 5 experts choosing 2, untied; multi-query
# over three layers with 4 experts choosing 3, the head tied to the embedding. Neither head
# width is H / A.
N = 16
CASES = [(2, 16, 4, 2, 6, 12, 5, 2, 50, False), (3, 24, 4, 1, 8, 20, 4, 3, 37, True)]
IDS = [f"L{c[0]}-A{c[2]}-G{c[3]}-D{c[4]}-E{c[6]}-K{c[7]}" + ("-tied" if c[9] else "")
       for c in CASES]


def _reference(L, H, A, G, D, F, E, K, V, tied):
    config = transformers.Qwen3MoeConfig(
        vocab_size=V, hidden_size=H, intermediate_size=2 * F, moe_intermediate_size=F,
        num_hidden_layers=L, num_attention_heads=A, num_key_value_heads=G, head_dim=D,
        num_experts=E, num_experts_per_tok=K, norm_topk_prob=True,
        max_position_embeddings=N, tie_word_embeddings=tied,
        bos_token_id=None, eos_token_id=None,  # generate() runs its full length, as step()
        pad_token_id=None)
    config._attn_implementation = "eager"
    return seeded(transformers.Qwen3MoeForCausalLM, config)


# no --set: the sizes are the folder's config.json; the experts one tensor each
compiled = folder_fixture("qwen3_moe", CASES, IDS, _reference)

test_probabilities_equal_transformers, test_greedy_generation_equals_transformers = \
    parity_tests(vocab=lambda case: case[8], lengths=(N, 5), new=10)


def test_the_folder_holds_one_tensor_per_expert(compiled):
    """save_pretrained splits transformers 5's fused experts (gate_up_proj, down_proj) into
    the released files' experts.{e}.gate_proj / up_proj / down_proj, the names the spec
    reads; config.json names the experts' count num_local_experts."""
    from safetensors import safe_open
    case, _, out = compiled
    folder = out["torch"].parent / "hf"
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    E = case[6]
    for e in range(E):
        for part in ("gate_proj", "up_proj", "down_proj"):
            assert f"model.layers.0.mlp.experts.{e}.{part}.weight" in names
    assert not any("gate_up_proj" in name for name in names)
    config = json.loads((folder / "config.json").read_text())
    assert config["num_local_experts"] == E and "num_experts" not in config


def test_renormalized_routing_matters(compiled):
    """The tiny models are not blind to norm_topk_prob: without it, transformers' own
    probabilities move (the K chosen weights no longer sum to 1)."""
    case, ref, _ = compiled
    x = tokens(case[8], N)
    routers = [layer.mlp.gate for layer in ref.model.layers]
    with torch.no_grad():
        want = torch.softmax(ref(x).logits, -1)
        for r in routers:
            r.norm_topk_prob = False
        try:
            other = torch.softmax(ref(x).logits, -1)
        finally:
            for r in routers:
                r.norm_topk_prob = True
    assert float((other - want).abs().max()) > 1e-3


def test_fgc_generate_equals_transformers_in_both_backends(compiled):
    """`fgc generate` of the folder through the ONNX --kv-cache graph and through torch's
    step()."""
    case, ref, out = compiled
    prompt = tokens(case[8], 4)
    with torch.no_grad():
        want = ref.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0,
                            attention_mask=torch.ones_like(prompt))[:, 4:]
    ids = ";".join(",".join(str(int(t)) for t in row) for row in prompt)
    for backend in ("onnx", "torch"):
        r = fgc("generate", "specs/qwen3_moe.fgpt", "--weights",
                str(out["torch"].parent / "hf"), "--prompt-ids", ids,
                "--max-new-tokens", "8", "--backend", backend)
        assert r.returncode == 0, r.stderr
        rows = [[int(t) for t in line.split(",")] for line in r.stdout.split()[-2:]]
        assert rows == want.tolist(), backend


def test_the_names_read_with_or_without_the_model_prefix(compiled, tmp_path):
    """The folder's tensors with `model.` taken off every name that has it (a bare
    Qwen3MoeModel's names, or a re-saved file's) compile to the same module and weights."""
    import shutil

    from safetensors.torch import load_file, save_file
    _, _, out = compiled
    folder = out["torch"].parent / "hf"
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    state = load_file(str(folder / "model.safetensors"))
    assert any(k.startswith("model.") for k in state)
    save_file({k.removeprefix("model."): v for k, v in state.items()},
              str(bare / "model.safetensors"))
    r = fgc("compile", "specs/qwen3_moe.fgpt", "--weights", str(bare), "--target", "torch",
            "-o", str(tmp_path / "torch"))
    assert r.returncode == 0, r.stderr
    assert "not used" not in r.stdout + r.stderr
    for name in ("model.py", "weights.safetensors"):
        assert (tmp_path / "torch" / name).read_bytes() == (out["torch"] / name).read_bytes()


def test_a_qwen3_moe_folder_finds_its_spec_and_counts_as_transformers(compiled):
    """`fgc params FOLDER` picks specs/qwen3_moe.fgpt by config.json's architectures and
    counts the tiny model's parameters (its tied head once)."""
    _, ref, out = compiled
    r = fgc("params", str(out["torch"].parent / "hf"), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert "qwen3_moe.fgpt" in r.stdout + r.stderr
    assert json.loads(r.stdout)["total"] == sum(p.numel() for p in ref.parameters())


def test_a_folder_asking_for_what_the_spec_does_not_write_is_refused(tmp_path):
    """Routing weights left unrenormalized (norm_topk_prob false, or absent: the class's
    default), a dense MLP layer (mlp_only_layers) or the mixture on every other layer only
    (decoder_sparse_step) are refused at config.json, with the spec's assumption."""
    folder = tmp_path / "hf"
    _reference(*CASES[0]).save_pretrained(str(folder))
    for key, value, message in (
            ("norm_topk_prob", False, "config.json sets `norm_topk_prob` to false, but "
                                      "specs/qwen3_moe.fgpt assumes true"),
            ("norm_topk_prob", DELETE, "config.json has no `norm_topk_prob`, which means "
                                       "false, but specs/qwen3_moe.fgpt assumes true"),
            ("mlp_only_layers", [1], "config.json sets `mlp_only_layers` to [1], but "
                                     "specs/qwen3_moe.fgpt assumes []"),
            ("decoder_sparse_step", 2, "config.json sets `decoder_sparse_step` to 2, but "
                                       "specs/qwen3_moe.fgpt assumes 1")):
        r = refused_config(folder, tmp_path / f"{key}-{value is DELETE}", "qwen3_moe",
                           **{key: value})
        assert message in r.stderr, r.stderr
        assert "note: the assumption" in r.stderr
