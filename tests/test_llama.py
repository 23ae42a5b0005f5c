"""specs/llama.fgpt and specs/mistral.fgpt against transformers' LlamaForCausalLM and
MistralForCausalLM, holding the same tensors.

A tiny randomly initialised model (grouped-query attention at several ratios, rotary
positions, RMSNorm, SwiGLU, an untied head; Mistral's sliding window shorter than the run)
is saved with safetensors under its own names and compiled with `fgc compile --weights`:
the PyTorch module and the ONNX graph (standard and `--optimize ort`) give transformers'
probabilities to 1e-5, greedy generation with the key/value cache (`step()`) gives
transformers' `generate` ids, and the cache holds the G key/value heads.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from conftest import fgc, peaked_weights

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
ort = pytest.importorskip("onnxruntime")

TOL = 1e-5
# (spec, H, A, G, F, V, n, theta, w): A / G = 2 and 4, multi-query, multi-head with a head
# of 6; Mistral's window of 5 over runs of 16
CASES = [
    ("llama", 16, 4, 2, 24, 50, 32, 10000.0, None),
    ("llama", 32, 8, 2, 40, 61, 16, 500000.0, None),
    ("llama", 16, 4, 1, 24, 50, 16, 10000.0, None),
    ("llama", 24, 4, 4, 40, 37, 16, 10000.0, None),
    ("mistral", 16, 4, 2, 24, 50, 16, 10000.0, 5),
]
IDS = [f"{c[0]}-H{c[1]}-A{c[2]}-G{c[3]}" + (f"-w{c[8]}" if c[8] else "") for c in CASES]


def _reference(spec, H, A, G, F, V, n, theta, w, L=2):
    cls, config = ((transformers.MistralForCausalLM, transformers.MistralConfig)
                   if spec == "mistral" else
                   (transformers.LlamaForCausalLM, transformers.LlamaConfig))
    extra = {"sliding_window": w} if spec == "mistral" else {"attention_bias": False,
                                                              "mlp_bias": False}
    config = config(
        vocab_size=V, hidden_size=H, intermediate_size=F, num_hidden_layers=L,
        num_attention_heads=A, num_key_value_heads=G, max_position_embeddings=n,
        rope_theta=theta, rms_norm_eps=1e-5, tie_word_embeddings=False, **extra)
    torch.manual_seed(0)
    model = cls(config).eval()
    peaked_weights(model)
    return model


def _sets(spec, H, A, G, F, V, n, theta, w, L=2) -> list[str]:
    values = dict(L=L, H=H, A=A, G=G, F=F, V=V, n=n, theta=theta)
    if w is not None:
        values["w"] = w
    return [x for k, v in values.items() for x in ("--set", f"{k}={v}")]


@pytest.fixture(scope="module", params=CASES, ids=IDS)
def compiled(request, tmp_path_factory):
    case = request.param
    model = _reference(*case)
    folder = tmp_path_factory.mktemp("llama")
    weights = folder / "model.safetensors"
    safetensors_torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                                str(weights))
    out = {}
    for target, extra in (("torch", []), ("onnx", []), ("ort", ["--optimize", "ort"])):
        dest = folder / target
        r = fgc("compile", f"specs/{case[0]}.fgpt", *_sets(*case), "--weights", str(weights),
                "--target", "torch" if target == "torch" else "onnx", *extra, "-o", str(dest))
        assert r.returncode == 0, r.stderr
        out[target] = dest
    return case, model, out


def _module(folder):
    spec = importlib.util.spec_from_file_location(f"fgc_{folder.parent.name}",
                                                  folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build().eval()
    model.load_state_dict(safetensors_torch.load_file(str(folder / "weights.safetensors")))
    return model


def _tokens(V: int, T: int, B: int = 2) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(T))


def test_probabilities_equal_transformers(compiled):
    case, ref, out = compiled
    V, n = case[5], case[6]
    model = _module(out["torch"])
    for T in (n, 5):
        x = _tokens(V, T)
        with torch.no_grad():
            want = torch.softmax(ref(x).logits, -1)
            got = model(x)
        assert float((got - want).abs().max()) <= TOL
        for target in ("onnx", "ort"):
            session = ort.InferenceSession(str(out[target] / "model.onnx"),
                                           providers=["CPUExecutionProvider"])
            name = session.get_inputs()[0].name
            probs = session.run(None, {name: x.numpy()})[0]
            assert float(np.abs(probs - want.numpy()).max()) <= TOL, target


def test_greedy_generation_equals_transformers(compiled):
    case, ref, out = compiled
    V = case[5]
    model = _module(out["torch"])
    prompt = _tokens(V, 4)
    with torch.no_grad():
        want = ref.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0,
                            attention_mask=torch.ones_like(prompt))
        ids = prompt
        logits, past = model.step(prompt)
        for _ in range(12):  # past Mistral's window
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
            logits, past = model.step(nxt, past=past)
    assert torch.equal(ids, want)


def test_the_cache_of_grouped_query_attention(compiled):
    """step()'s cache holds each layer's keys and values, of the G key/value heads."""
    case, _, out = compiled
    model = _module(out["torch"])
    with torch.no_grad():
        _, past = model.step(_tokens(case[5], 3))
    assert len(past) == 2  # one attention per layer
    keys, values = past[0]
    G, D = case[3], case[1] // case[2]
    assert tuple(keys.shape) == tuple(values.shape) == (2, G, 3, D)  # G heads, not A
