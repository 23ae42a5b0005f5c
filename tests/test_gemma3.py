"""specs/gemma3.fgpt against transformers' Gemma3ForCausalLM, holding the same tensors.

Gemma 3's text model is Gemma 2's layers with per-head query and key norms, no soft caps,
five sliding layers to one full one, and two rotary bases (the full layers' frequencies
linearly scaled), written in one spec file. The presets' counts equal the class's unique
parameters on the meta device. Tiny randomly initialised models (grouped-query and
multi-query attention, a head width that is not H / A, a query_pre_attn_scalar that is not
the head width, a window shorter than the run, seven layers, so that both kinds of layer
and both rotary bases occur, and bases far enough apart to matter) are saved with
`save_pretrained` and compiled with `fgc compile --weights FOLDER` alone: every size, base,
factor and the window come from the folder's config.json. The PyTorch module and the ONNX
graph (standard and `--optimize ort`) give transformers' probabilities to 1e-5, and greedy
generation with the key/value cache gives transformers' `generate` ids.

Also here, as the construct Gemma 3 brought: a layer condition that computes with the layer
index (`l % 6 == 0`, every sixth layer), decided layer by layer in both backends.
"""

from __future__ import annotations

import json

import pytest
from conftest import fgc
from hf_parity import (
    assert_finds_spec,
    compile_folder,
    count_tests,
    parity_tests,
    refused_config,
    seeded,
    tokens,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

# (spec, preset): (class, config), sizes as in the released config.json files (the 4B, 12B
# and 27B: their text_config, as Gemma3ForCausalLM would hold the language model alone).
# The class's config is Gemma3TextConfig (transformers' Gemma3Config is the multimodal
# model's), named in each row.
TEXT = "Gemma3TextConfig"
RELEASED = {
    ("gemma3", "1b"): ("Gemma3", dict(
        num_hidden_layers=26, hidden_size=1152, num_attention_heads=4, num_key_value_heads=1,
        head_dim=256, intermediate_size=6912, vocab_size=262144,
        query_pre_attn_scalar=256), TEXT),
    ("gemma3", "4b"): ("Gemma3", dict(
        num_hidden_layers=34, hidden_size=2560, num_attention_heads=8, num_key_value_heads=4,
        head_dim=256, intermediate_size=10240, vocab_size=262208,
        query_pre_attn_scalar=256), TEXT),
    ("gemma3", "12b"): ("Gemma3", dict(
        num_hidden_layers=48, hidden_size=3840, num_attention_heads=16, num_key_value_heads=8,
        head_dim=256, intermediate_size=15360, vocab_size=262208,
        query_pre_attn_scalar=256), TEXT),
    ("gemma3", "27b"): ("Gemma3", dict(
        num_hidden_layers=62, hidden_size=5376, num_attention_heads=32,
        num_key_value_heads=16, head_dim=128, intermediate_size=21504, vocab_size=262208,
        query_pre_attn_scalar=168), TEXT),
}


test_preset_count_equals_transformers, test_every_preset_has_a_count_test = \
    count_tests(RELEASED, ("gemma3",))


# ---------------------------------------------------------------- tiny models, weights

# (L, H, A, G, D, F, V, w, D_att, rope): A / G = 2 and multi-query (a head width of 8:
# onnxruntime's GroupQueryAttention takes the full layers under --optimize ort), seven
# layers each (sliding 1-5, full 6, sliding 7). Neither head width is H / A, neither D_att
# is D, and each window is shorter than the N positions. The full layers' base and the
# sliding layers' differ by a hundred times and more; the first case scales the full
# layers' frequencies linearly (rope_type "linear", factor 4), the second leaves them
# (rope_type "default").
N = 16
CASES = [
    (7, 16, 4, 2, 6, 24, 50, 5, 10, {
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10.0}}),
    (7, 24, 4, 1, 8, 40, 37, 3, 12, {
        "full_attention": {"rope_type": "default", "rope_theta": 10.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
]
IDS = [f"L{c[0]}-A{c[2]}-G{c[3]}-D{c[4]}-w{c[7]}-{c[9]['full_attention']['rope_type']}"
       for c in CASES]


def _config(L, H, A, G, D, F, V, w, D_att, rope):
    return transformers.Gemma3TextConfig(
        vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=L,
        num_attention_heads=A, num_key_value_heads=G, head_dim=D,
        max_position_embeddings=N, sliding_window=w, query_pre_attn_scalar=D_att,
        rope_parameters=json.loads(json.dumps(rope)),
        bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _reference(case, state=None):
    config = _config(*case)
    config._attn_implementation = "eager"
    if state is None:
        return seeded(transformers.Gemma3ForCausalLM, config, offset_gains=True)
    model = transformers.Gemma3ForCausalLM(config).eval()
    model.load_state_dict(state)
    return model


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def compiled(request, tmp_path_factory):
    case = request.param
    model = _reference(case)
    # no --set: the sizes, both bases, the factor and the window are the folder's
    # config.json
    return case, model, compile_folder("gemma3", model, tmp_path_factory.mktemp("gemma3"))


def _probabilities(model, V):
    x = torch.randint(0, V, (2, N), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return torch.softmax(model(x).logits, -1)


def test_both_bases_the_factor_and_the_window_matter(compiled):
    """The tiny models are not blind to what the spec chooses layer by layer: with the
    sliding layers turned by the full layers' base (or the other way round), without the
    linear scaling, or with every layer full, transformers' own probabilities move."""
    case, ref, _ = compiled
    rope = case[9]
    full, sliding = rope["full_attention"], rope["sliding_attention"]
    changes = [{**rope, "sliding_attention": {**full, "rope_type": "default"}},
               {**rope, "full_attention": {**sliding, **{k: v for k, v in full.items()
                                                          if k != "rope_theta"}}}]
    if full["rope_type"] == "linear":
        changes.append({**rope, "full_attention": {"rope_type": "default",
                                                   "rope_theta": full["rope_theta"]}})
    want = _probabilities(ref, case[6])
    for other in changes:
        moved = _reference(case[:9] + (other,), ref.state_dict())
        assert float((_probabilities(moved, case[6]) - want).abs().max()) > 1e-3, other
    saved = ref.config.sliding_window
    ref.config.sliding_window = N
    try:
        assert float((_probabilities(ref, case[6]) - want).abs().max()) > 1e-3
    finally:
        ref.config.sliding_window = saved


test_probabilities_equal_transformers, test_greedy_generation_equals_transformers = \
    parity_tests(vocab=lambda case: case[6])


@pytest.mark.parametrize("optimize", [[], ["--optimize", "ort"]], ids=["standard", "ort"])
def test_greedy_generation_of_the_onnx_cache_equals_transformers(compiled, optimize,
                                                                  tmp_path):
    """The ONNX graph's incremental form (`--kv-cache`, standard and `--optimize ort`),
    compiled from the folder alone and run by `fgc generate`, gives transformers'
    `generate` ids: each step past the window and across the full layer."""
    case, ref, out = compiled
    new = 10
    prompt = tokens(case[6], 4)
    with torch.no_grad():
        want = ref.generate(prompt, max_new_tokens=new, do_sample=False, pad_token_id=0,
                            attention_mask=torch.ones_like(prompt))[:, prompt.shape[1]:]
    folder = out["torch"].parent / "hf"
    r = fgc("compile", str(folder), "--target", "onnx", "--kv-cache", *optimize, "-o",
            str(tmp_path / "kv"))
    assert r.returncode == 0, r.stderr
    r = fgc("generate", str(tmp_path / "kv"), "--prompt-ids",
            ";".join(",".join(str(int(i)) for i in row) for row in prompt),
            "--max-new-tokens", str(new), "--provider", "cpu")
    assert r.returncode == 0, r.stderr
    assert "incremental form" in r.stdout
    got = [[int(i) for i in line.split(",")] for line in
           r.stdout.strip().splitlines()[-len(prompt):]]
    assert got == want.tolist()


def test_a_gemma3_folder_finds_its_spec_and_refuses_what_it_does_not_write(compiled,
                                                                           tmp_path):
    """`fgc compile FOLDER` finds specs/gemma3.fgpt by config.json's architectures, and the
    folder's layer_types (five sliding, one full) are the spec's; a file whose layers
    follow Gemma 2's alternation, or whose scores or logits are soft-capped (a number), is
    refused with the key located, and nothing is written."""
    _, _, out = compiled
    folder = out["torch"].parent / "hf"
    config = json.loads((folder / "config.json").read_text())
    assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention",
                                                                 "sliding_attention"]
    assert_finds_spec(folder, "gemma3", tmp_path / "found")
    L = len(config["layer_types"])
    for key, value, message in (
            ("layer_types", (["sliding_attention", "full_attention"] * L)[:L],
             'config.json sets `layer_types` to ["sliding_attention", "full_attention", '),
            ("attn_logit_softcapping", 50.0,
             "config.json sets `attn_logit_softcapping` to 50.0, but specs/gemma3.fgpt "
             "assumes null"),
            ("final_logit_softcapping", 30.0,
             "config.json sets `final_logit_softcapping` to 30.0, but specs/gemma3.fgpt "
             "assumes null")):
        r = refused_config(folder, tmp_path / key, "gemma3", **{key: value})
        assert message in r.stderr, r.stderr
        bare = tmp_path / key / "changed"
        line = 1 + next(k for k, text in enumerate(
            (bare / "config.json").read_text().splitlines()) if f'"{key}"' in text)
        assert f"{bare}/config.json:{line}:3: error:" in r.stderr
        assert "note: the assumption" in r.stderr and "specs/gemma3.fgpt:" in r.stderr


def test_the_first_files_layout_reads_the_same(compiled, tmp_path):
    """The released files (transformers 4.50) say rope_theta, rope_local_base_freq,
    rope_scaling and sliding_window_pattern where transformers 5 writes rope_parameters
    per kind of layer and layer_types: both layouts give transformers the same model and
    the spec the same hyperparameters."""
    case, _, out = compiled
    folder = out["torch"].parent / "hf"
    new = json.loads((folder / "config.json").read_text())
    rope = new["rope_parameters"]
    old = {k: v for k, v in new.items()
           if k not in ("rope_parameters", "layer_types", "_sliding_window_pattern")}
    full = rope["full_attention"]
    old.update(rope_theta=full["rope_theta"],
               rope_local_base_freq=rope["sliding_attention"]["rope_theta"],
               rope_scaling=({"factor": full["factor"], "rope_type": "linear"}
                             if full["rope_type"] == "linear" else None),
               sliding_window_pattern=6)
    read = {}
    for name, config in (("new", new), ("old", old)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config, indent=2))
        hf = transformers.Gemma3TextConfig.from_pretrained(str(tmp_path / name))
        assert hf.layer_types == new["layer_types"]
        assert {k: {x: hf.rope_parameters[k].get(x) for x in ("rope_type", "rope_theta",
                                                                "factor")}
                for k in rope} == {k: {x: v.get(x) for x in ("rope_type", "rope_theta",
                                                              "factor")}
                                   for k, v in rope.items()}
        r = fgc("params", str(tmp_path / name), "--format", "json")
        assert r.returncode == 0, r.stderr
        read[name] = json.loads(r.stdout)["hyperparameters"]
    assert read["new"] == read["old"]
    assert (read["old"]["theta"], read["old"]["theta_local"]) == (
        rope["full_attention"]["rope_theta"], rope["sliding_attention"]["rope_theta"])
    assert read["old"]["factor"] == rope["full_attention"].get("factor", 1.0)


# ---------------------------------------------------------------- the construct

EVERY_THIRD = """\
model EveryThird {
  hyper L = 7, H = 8, A = 2, D = H / A, F = 4 * H, V = 11, n = 8, w = 2
  input x: {1..V}^n
  param W_e: R[V, H]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {
    Mask^(l) = Mask^AR if l % 3 == 0 else Mask^ST
    H^(l) = H^(l-1) + MH(LN(H^(l-1)), Mask^(l))
    G^(l) = H^(l) + (FF^GELU(LN(H^(l))) if (l - 1) % 3 == 0 and l != 1 else H^(l))
  }
  output probs = Softmax(G^(L) @ W_e^T)
}
"""


def test_a_layer_condition_that_computes_with_the_layer_index(tmp_path):
    """`l % 3 == 0` is decided layer by layer: in the count (a module under such a
    condition exists only in the layers where it holds: l = 4 and 7 of 7), in model.py's
    guard, and alike in the PyTorch module and the ONNX graphs."""
    from test_backend_constructs import both_backends
    path = tmp_path / "every_third.fgpt"
    path.write_text(EVERY_THIRD)
    r = fgc("params", str(path), "--format", "json")
    assert r.returncode == 0, r.stderr
    H, F, A, D, L, V = 8, 32, 2, 4, 7, 11
    attention = 4 * A * D * H + 2 * H                # MH and its LN
    ffn = 2 * H * F + F + H + 2 * H                  # FF^GELU and its LN
    assert json.loads(r.stdout)["total"] == V * H + L * attention + 2 * ffn
    assert max(both_backends(tmp_path, EVERY_THIRD, lengths=(8, 3))) <= 1e-5
    code = (tmp_path / "torch" / "model.py").read_text()
    assert "self.l % 3 == 0" in code


def test_the_rotary_tables_are_transformers_to_the_bit(compiled):
    """Both kinds of layer's cosines and sines, as model.py computes them from the tables'
    equations (a float32 power and its reciprocal, as transformers computes inv_freq), equal
    transformers' to the bit at every position up to 32,768, where exp(-2j/d ln theta)
    would have moved them by 1e-3."""
    _, _, out = compiled
    from hf_parity import module
    classes = type(module(out["torch"])).forward.__globals__
    d, theta, n = 256, 1e6, 32768
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    for name, args, freq in (("RoPE_cos", {}, inv), ("RoPE_sin", {}, inv),
                             ("RoPE_cos_linear", {"factor": 8.0}, inv / 8.0),
                             ("RoPE_sin_linear", {"factor": 8.0}, inv / 8.0)):
        got = classes[name]()(n=n, d=d, theta=theta, **args)
        angles = torch.outer(torch.arange(n).float(), freq).repeat(1, 2)
        want = angles.cos() if "cos" in name else angles.sin()
        assert torch.equal(got, want), name
