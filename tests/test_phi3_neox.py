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
reads G = A only; a grouped-query file is refused with an error, not read wrongly.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import fgc, peaked_weights
from test_llama import _module, _tokens

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

TOL = 1e-5

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


@pytest.mark.parametrize("spec,preset", sorted(RELEASED), ids=[f"{s}-{p}" for s, p in
                                                               sorted(RELEASED)])
def test_preset_count_equals_transformers(spec, preset):
    family, config = RELEASED[(spec, preset)]
    cls = getattr(transformers, f"{family}ForCausalLM")
    with torch.device("meta"):
        model = cls(getattr(transformers, f"{family}Config")(**config))
    want = sum(p.numel() for p in model.parameters())
    r = fgc("params", f"specs/{spec}.fgpt", "--preset", preset, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total"] == want


# ---------------------------------------------------------------- tiny models, weights

N = 16
# (spec, H, A, F, V, extra): Phi-3 with a window of 5 over runs of 16 and one as long as
# the run; GPT-NeoX turning half (r = 4 of D = 8) and a quarter (r = 4 of D = 16) of a head
CASES = [
    ("phi3", 16, 4, 24, 50, {"w": 5}),
    ("phi3", 24, 2, 40, 37, {"w": N}),
    ("gpt_neox", 32, 4, 64, 50, {"r": 4}),
    ("gpt_neox", 64, 4, 48, 37, {"r": 4}),
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
        config = transformers.Phi3Config(num_key_value_heads=G or A, rms_norm_eps=1e-5,
                                         rope_theta=10000.0, sliding_window=extra["w"],
                                         **common)
    else:
        cls = transformers.GPTNeoXForCausalLM
        config = transformers.GPTNeoXConfig(rotary_pct=extra["r"] / (H // A),
                                            rotary_emb_base=10000, layer_norm_eps=1e-5,
                                            use_parallel_residual=True, hidden_act="gelu",
                                            **common)
    torch.manual_seed(0)
    model = cls(config).eval()
    peaked_weights(model)
    return model


def _sets(spec, H, A, F, V, extra, G=None, L=2) -> list[str]:
    values = dict(L=L, H=H, A=A, F=F, V=V, n=N, **extra)
    if spec == "phi3":
        values["G"] = G or A
    return [x for k, v in values.items() for x in ("--set", f"{k}={v}")]


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def compiled(request, tmp_path_factory):
    case = request.param
    model = _reference(*case)
    folder = tmp_path_factory.mktemp(case[0])
    # save_pretrained writes the released names (GPT-NeoX's head as embed_out.weight)
    model.save_pretrained(str(folder / "hf"))
    weights = folder / "hf" / "model.safetensors"
    out = {}
    for target, extra in (("torch", []), ("onnx", []), ("ort", ["--optimize", "ort"])):
        dest = folder / target
        r = fgc("compile", f"specs/{case[0]}.fgpt", *_sets(*case), "--weights", str(weights),
                "--target", "torch" if target == "torch" else "onnx", *extra, "-o", str(dest))
        assert r.returncode == 0, r.stderr
        assert "not used" not in r.stdout + r.stderr  # every tensor mapped or ignored
        out[target] = dest
    return case, model, out


def test_probabilities_equal_transformers(compiled):
    case, ref, out = compiled
    V = case[4]
    model = _module(out["torch"])
    sessions = {target: ort.InferenceSession(str(out[target] / "model.onnx"),
                                             providers=["CPUExecutionProvider"])
                for target in ("onnx", "ort")}
    for T in (N, 5):
        x = _tokens(V, T)
        with torch.no_grad():
            want = torch.softmax(ref(x).logits, -1)
            got = model(x)
        assert float((got - want).abs().max()) <= TOL
        for target, session in sessions.items():
            name = session.get_inputs()[0].name
            probs = session.run(None, {name: x.numpy()})[0]
            assert float(np.abs(probs - want.numpy()).max()) <= TOL, target


def test_greedy_generation_equals_transformers(compiled):
    case, ref, out = compiled
    V = case[4]
    model = _module(out["torch"])
    prompt = _tokens(V, 4)
    with torch.no_grad():
        want = ref.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0,
                            attention_mask=torch.ones_like(prompt))
        ids = prompt
        logits, past = model.step(prompt)
        for _ in range(10):  # past the window of 5
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
            logits, past = model.step(nxt, past=past)
    assert torch.equal(ids, want)


def test_phi3_grouped_query_file_is_refused(tmp_path):
    """qkv_proj with G != A is not three equal thirds: the checkpoint block cannot cut it,
    and fgc says so rather than reading the wrong rows."""
    case = ("phi3", 16, 4, 24, 50, {"w": 5})
    model = _reference(*case, G=2)
    model.save_pretrained(str(tmp_path / "hf"))
    r = fgc("compile", "specs/phi3.fgpt", *_sets(*case, G=2), "--weights",
            str(tmp_path / "hf" / "model.safetensors"), "-o", str(tmp_path / "out"))
    assert r.returncode != 0
    assert "qkv_proj" in r.stderr and "Traceback" not in r.stderr
