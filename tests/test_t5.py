"""specs/t5.fgpt against transformers' T5ForConditionalGeneration, holding the same tensors.

A tiny randomly initialised model with odd sizes (three heads of 5 against a width of 24,
so A*D != H; more decoder layers than encoder layers; 10 buckets up to a distance of 20,
shorter than the runs, so the log-spaced and the last buckets are all reached) is saved
with safetensors under its own names and compiled with `fgc compile --weights`: the PyTorch
module and the ONNX graph (standard and `--optimize ort`) give transformers' probabilities
to 1e-5 for sources and targets of several lengths, and greedy generation with the
decoder's key/value cache (`runtime.generate`, both backends) gives transformers'
`generate` ids. The presets count what T5ForConditionalGeneration holds on the meta device.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import fgc, peaked_weights, set_args, unpadded
from hf_parity import TOL, compile_targets, module

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
ort = pytest.importorskip("onnxruntime")

SIZES = dict(L=2, Ld=3, H=24, A=3, D=5, F=40, V=37, n=30, m=30, Nb=10, Md=20)
SETS = set_args(SIZES)
LENGTHS = [(30, 30), (23, 7), (5, 12), (1, 1)]  # (source, target)


def _config(**sizes) -> transformers.T5Config:
    """The T5Config of fgc's sizes (original T5: ReLU, tied output)."""
    keys = dict(L="num_layers", Ld="num_decoder_layers", H="d_model", A="num_heads",
                D="d_kv", F="d_ff", V="vocab_size", Nb="relative_attention_num_buckets",
                Md="relative_attention_max_distance")
    return transformers.T5Config(**{keys[k]: v for k, v in sizes.items() if k in keys},
                                 feed_forward_proj="relu", tie_word_embeddings=True,
                                 dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0,
                                 eos_token_id=1)


def _reference():
    """The tiny T5ForConditionalGeneration of SIZES, seeded, with peaked weights."""
    torch.manual_seed(0)
    ref = transformers.T5ForConditionalGeneration(_config(**SIZES)).eval()
    peaked_weights(ref)
    with torch.no_grad():  # biases that matter: greedy ids that follow the positions
        for name, p in ref.named_parameters():
            if "relative_attention_bias" in name:
                p.normal_(0.0, 2.0)
    return ref


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    ref = _reference()
    folder = tmp_path_factory.mktemp("t5")
    weights = folder / "model.safetensors"
    # the tied tensors (shared, embed_tokens, lm_head) are one storage: saved apart
    safetensors_torch.save_file({k: v.detach().clone().contiguous()
                                 for k, v in ref.state_dict().items()}, str(weights))
    out = compile_targets("t5", SETS, weights, folder)
    r = fgc("compile", "specs/t5.fgpt", *SETS, "--weights", str(weights), "--target", "onnx",
            "--kv-cache", "-o", str(folder / "kv"))
    assert r.returncode == 0, r.stderr
    out["kv"] = folder / "kv"
    return ref, out


def _ids(V: int, T: int, seed: int):
    return torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(seed))


def test_probabilities_equal_transformers(compiled):
    ref, out = compiled
    model = module(out["torch"])
    sessions = {t: ort.InferenceSession(str(out[t] / "model.onnx"),
                                        providers=["CPUExecutionProvider"])
                for t in ("onnx", "ort")}
    for n, m in LENGTHS:
        x, y = _ids(SIZES["V"], n, n), _ids(SIZES["V"], m, 100 + m)
        with torch.no_grad():
            want = torch.softmax(ref(input_ids=x, decoder_input_ids=y).logits, -1)
            got = model(x, y)
        assert float((got - want).abs().max()) <= TOL
        for target, session in sessions.items():
            probs = session.run(None, unpadded(session, {"x": x.numpy(), "y": y.numpy()}))[0]
            assert float(np.abs(probs - want.numpy()).max()) <= TOL, (target, n, m)


def test_the_bias_is_one_table_per_stack(compiled):
    """The relative position bias lives once per stack (block 0 in the checkpoint) and the
    decoder's self-attention is the only attention the cache keeps, one per layer."""
    _, out = compiled
    model = module(out["torch"])
    tables = {k: tuple(v.shape) for k, v in model.state_dict().items() if "rel" in k}
    assert tables == {"W_enc_rel": (SIZES["Nb"], SIZES["A"]),
                      "W_dec_rel": (SIZES["Nb"], SIZES["A"])}
    meta = ort.InferenceSession(str(out["kv"] / "model.onnx"),
                                providers=["CPUExecutionProvider"]).get_modelmeta()
    cache = json.loads(meta.custom_metadata_map["fgc.signature"])["incremental"]["cache"]
    assert [(c["kind"], c["layers"], c["dims"]) for c in cache] == [
        ("key", SIZES["Ld"], ["batch", SIZES["A"], "past", SIZES["D"]]),
        ("value", SIZES["Ld"], ["batch", SIZES["A"], "past", SIZES["D"]])]


def test_greedy_generation_equals_transformers(compiled):
    """A target prefix from the decoder start id 0, the source passed at every step: the
    ids of transformers' generate, through step() and through the ONNX graph's cache."""
    from runtime import generate
    from runtime import load as load_onnx
    ref, out = compiled
    source = _ids(SIZES["V"], 9, 7)
    start = torch.cat([torch.zeros(2, 1, dtype=torch.long),
                       torch.randint(1, SIZES["V"], (2, 3),
                                     generator=torch.Generator().manual_seed(8))], 1)
    new = 20  # past the buckets' last distance, Md = 20
    with torch.no_grad():
        want = ref.generate(input_ids=source, attention_mask=torch.ones_like(source),
                            decoder_input_ids=start, max_new_tokens=new, do_sample=False,
                            eos_token_id=None,
                            # transformers' cache has L layers, not the decoder's Ld
                            use_cache=False)[:, start.shape[1]:].tolist()
    assert len({t for row in want for t in row}) > 3  # not one id repeated
    start = start.tolist()
    inputs = {"x": source.numpy()}
    for model in (module(out["torch"]), load_onnx(out["kv"], provider="cpu")):
        assert generate(model, start, new, inputs=inputs) == want
        assert generate(model, start, new, inputs=inputs, cache=False) == want


@pytest.mark.parametrize("preset, sizes", [
    ("t5_small", dict(L=6, H=512, A=8, D=64, F=2048)),
    ("t5_base", dict(L=12, H=768, A=12, D=64, F=3072)),
    ("t5_large", dict(L=24, H=1024, A=16, D=64, F=4096)),
])
def test_preset_counts_equal_transformers(preset, sizes):
    with torch.device("meta"):
        ref = transformers.T5ForConditionalGeneration(_config(V=32128, **sizes))
    want = sum(p.numel() for p in ref.parameters())  # the tied embedding once
    r = fgc("params", "specs/t5.fgpt", "--preset", preset, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total"] == want


@pytest.mark.parametrize("sets, shown", [
    (["--set", "Md=16"], "Md = 16, Nb = 32"),   # Md inside the exact distances
    (["--set", "Nb=31"], "Md = 128, Nb = 31"),  # halves of unequal size
])
def test_bucket_sizes_that_make_no_buckets_are_located_errors(sets, shown):
    r = fgc("params", "specs/t5.fgpt", *sets)
    assert r.returncode == 1, r.stdout
    assert "t5.fgpt:" in r.stderr and "does not hold" in r.stderr and shown in r.stderr
    assert "Traceback" not in r.stderr
