"""specs/phi3.fgpt and specs/gpt_neox.fgpt against transformers' Phi3ForCausalLM and
GPTNeoXForCausalLM, holding the same tensors.

Each preset's count equals the class's parameters on the meta device. A tiny randomly
initialised model (Phi-3's fused qkv_proj and gate_up_proj and its sliding window, shorter
than the run and as long as it; GPT-NeoX's per-head fused query_key_value with biases, its
partial rotary positions over half and a quarter of each head, its parallel residual) is
saved with save_pretrained, under the names a released checkpoint uses, and compiled with
`fgc compile --weights`: the PyTorch module and the ONNX graph (standard and
`--optimize ort`) give transformers' probabilities to 1e-5, and greedy generation with the
key/value cache (`step()`) gives transformers' `generate` ids. Phi-3's checkpoint block
cuts qkv_proj by row ranges of size expressions, so grouped-query files (Phi-3-medium's
G < A) read too; a file whose sizes are not the configuration's is refused, naming the rows
nothing reads, rather than read wrongly.
"""

from __future__ import annotations

import pytest
from conftest import fgc, set_args
from hf_parity import (
    compile_targets,
    count_tests,
    parity_tests,
    seeded,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")


# ---------------------------------------------------------------- the released sizes

_PYTHIA = dict(vocab_size=50304, max_position_embeddings=2048, rotary_pct=0.25,
               rotary_emb_base=10000, tie_word_embeddings=False)
_PHI3 = dict(vocab_size=32064, max_position_embeddings=4096, sliding_window=2047,
             tie_word_embeddings=False)
# (spec, preset): (class, config), sizes as in the released config.json files
RELEASED = {
    ("phi3", "mini"): ("Phi3", dict(num_hidden_layers=32, hidden_size=3072,
                                    num_attention_heads=32, num_key_value_heads=32,
                                    intermediate_size=8192, **_PHI3)),
    ("phi3", "medium"): ("Phi3", dict(num_hidden_layers=40, hidden_size=5120,
                                      num_attention_heads=40, num_key_value_heads=10,
                                      intermediate_size=17920, **_PHI3)),
    ("gpt_neox", "pythia_70m"): ("GPTNeoX", dict(num_hidden_layers=6, hidden_size=512,
                                                 num_attention_heads=8,
                                                 intermediate_size=2048, **_PYTHIA)),
    ("gpt_neox", "pythia_160m"): ("GPTNeoX", dict(num_hidden_layers=12, hidden_size=768,
                                                  num_attention_heads=12,
                                                  intermediate_size=3072, **_PYTHIA)),
    ("gpt_neox", "pythia_410m"): ("GPTNeoX", dict(num_hidden_layers=24, hidden_size=1024,
                                                  num_attention_heads=16,
                                                  intermediate_size=4096, **_PYTHIA)),
    ("gpt_neox", "pythia_1b"): ("GPTNeoX", dict(num_hidden_layers=16, hidden_size=2048,
                                                num_attention_heads=8,
                                                intermediate_size=8192, **_PYTHIA)),
}


test_preset_count_equals_transformers, test_every_preset_has_a_count_test = \
    count_tests(RELEASED, ("phi3", "gpt_neox"))


# ---------------------------------------------------------------- tiny models, weights

N = 16
# (spec, H, A, F, V, extra): Phi-3 with a window of 5 over runs of 16 and one as long as
# the run; GPT-NeoX turning half (R = 4 of D = 8) and a quarter (R = 4 of D = 16) of a head
CASES = [
    ("phi3", 16, 4, 24, 50, {"w": 5}),
    ("phi3", 24, 2, 40, 37, {"w": N}),
    ("phi3", 32, 8, 40, 37, {"w": 7, "G": 2}),  # grouped, as Phi-3-medium (A = 4G)
    ("gpt_neox", 32, 4, 64, 50, {"R": 4}),
    ("gpt_neox", 64, 4, 48, 37, {"R": 4}),
]
IDS = [f"{s}-H{H}-A{A}-" + "-".join(f"{k}{v}" for k, v in extra.items())
       for s, H, A, F, V, extra in CASES]


def _reference(spec, H, A, F, V, extra, G=None, L=2):
    common = dict(vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=L,
                  num_attention_heads=A, max_position_embeddings=N,
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                  pad_token_id=None)
    if spec == "phi3":
        cls = transformers.Phi3ForCausalLM
        config = transformers.Phi3Config(num_key_value_heads=G or extra.get("G", A),
                                         rms_norm_eps=1e-5, rope_theta=10000.0,
                                         sliding_window=extra["w"], **common)
    else:
        cls = transformers.GPTNeoXForCausalLM
        config = transformers.GPTNeoXConfig(rotary_pct=extra["R"] / (H // A),
                                            rotary_emb_base=10000, layer_norm_eps=1e-5,
                                            use_parallel_residual=True, hidden_act="gelu",
                                            **common)
    return seeded(cls, config)


def _sets(spec, H, A, F, V, extra, G=None, L=2) -> list[str]:
    values = dict(L=L, H=H, A=A, F=F, V=V, n=N, **extra)
    if spec == "phi3":
        values["G"] = G or extra.get("G", A)
    return set_args(values)


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def compiled(request, tmp_path_factory):
    case = request.param
    model = _reference(*case)
    folder = tmp_path_factory.mktemp(case[0])
    # save_pretrained writes the released names (GPT-NeoX's head as embed_out.weight)
    model.save_pretrained(str(folder / "hf"))
    weights = folder / "hf" / "model.safetensors"
    return case, model, compile_targets(case[0], _sets(*case), weights, folder)


test_probabilities_equal_transformers, test_greedy_generation_equals_transformers = \
    parity_tests(vocab=lambda case: case[4])


def test_phi3_file_of_other_sizes_is_refused(tmp_path):
    """A multi-head file (qkv_proj of 3A heads' rows) read as grouped (G = 2): the slices
    would read only its first (A + 2G) D rows; fgc names the rows nothing reads instead."""
    case = ("phi3", 16, 4, 24, 50, {"w": 5})
    model = _reference(*case)
    model.save_pretrained(str(tmp_path / "hf"))
    r = fgc("compile", "specs/phi3.fgpt", *_sets(*case, G=2), "--weights",
            str(tmp_path / "hf" / "model.safetensors"), "-o", str(tmp_path / "out"))
    assert r.returncode == 1, r.stderr
    assert "entries 33 .. 48 of axis 1 of `model.layers.0.self_attn.qkv_proj.weight`" \
        in r.stderr and "phi3.fgpt:" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()
