"""Padded batches (`attention_mask: Pad[n]`, compiler/passes/padding.py) against transformers.

Each released spec takes the padding mask transformers' models take. Small randomly
initialised transformers models (odd sizes: head widths other than 64, G not dividing A
evenly by 2, a window shorter than the run) are saved under their own tensor names and
compiled with `--weights` to PyTorch, ONNX and ONNX `--optimize ort`; a batch of sequences of
different lengths, padded, gives at every token what the sequence run alone gives
(transformers, unpadded) to 1e-5: encoders padded on the right and on the left, every
released decoder on the left (positions count each row's tokens, as transformers' generate derives
position_ids from the mask). Generation from prompts of different lengths gives each row
what its prompt gives alone, greedy and sampling, and transformers' left-padded `generate`
ids. XLNet, whose attention its spec writes out, adds the mask to its own masks. Then the
located errors: a model whose positions mix outside attention, a mask with padding between
tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import fgc, peaked_weights
from hf_parity import module

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")

TOL = 1e-5
TARGETS = {"torch": ["--target", "torch"], "onnx": ["--target", "onnx", "--kv-cache"],
           "ort": ["--target", "onnx", "--kv-cache", "--optimize", "ort"]}
ENCODER_TARGETS = {"torch": ["--target", "torch"], "onnx": ["--target", "onnx"],
                   "ort": ["--target", "onnx", "--optimize", "ort"]}
LENGTHS = (7, 4, 2)  # the rows' tokens: padded to 7


def _save(model, folder: Path) -> Path:
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def _compile(spec: str, weights: Path, folder: Path, targets: dict) -> dict:
    out = {}
    for target, args in targets.items():
        dest = folder / target
        r = fgc("compile", f"specs/{spec}.fgpt", "--weights", str(weights), *args,
                "-o", str(dest))
        assert r.returncode == 0, r.stderr
        out[target] = dest
    return out


def _batch(V: int, lo: int = 0, right: bool = True, seed: int = 0):
    """Token ids (batch, 7) of LENGTHS tokens each, ids lo..V-1, padded on the right or
    left with id `lo`, and the mask."""
    g = torch.Generator().manual_seed(seed)
    T = max(LENGTHS)
    ids = torch.full((len(LENGTHS), T), lo, dtype=torch.long)
    mask = torch.zeros((len(LENGTHS), T), dtype=torch.long)
    for b, n in enumerate(LENGTHS):
        at = slice(0, n) if right else slice(T - n, T)
        ids[b, at] = torch.randint(lo, V, (n,), generator=g)
        mask[b, at] = 1
    return ids, mask


def _outputs(folder: Path, target: str, feeds: dict, name: str) -> np.ndarray:
    """The output `name` (logits where the model has them) of a compiled model."""
    if target == "torch":
        model = module(folder)
        with torch.no_grad():
            args = {k: torch.as_tensor(v) for k, v in feeds.items()}
            run = model.logits if name == "logits" else model
            out = run(**args)
        return out.numpy()
    session = ort.InferenceSession(str(folder / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    full = {k: np.asarray(v) for k, v in feeds.items() if k in names}
    for i in session.get_inputs():  # an incremental graph's empty past
        if i.name not in full:
            dims = [len(LENGTHS) if d == "batch" else 0 if isinstance(d, str) else d
                    for d in i.shape]
            full[i.name] = np.zeros(dims, np.float32)
    return session.run([name], full)[0]


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _assert_rows(got: np.ndarray, mask, alone: list[np.ndarray], what: str,
                 logits: bool = True) -> None:
    """Each row's tokens against the sequence alone: probabilities (the models' outputs)
    where `got` and `alone` are logits."""
    for b, want in enumerate(alone):
        kept = got[b][mask[b].numpy().astype(bool)]
        if logits:
            kept, want = _softmax(kept), _softmax(want)
        assert kept.shape == want.shape, what
        assert float(np.abs(kept - want).max()) <= TOL, f"{what}, row {b + 1}"


# ---------------------------------------------------------------- encoders


def _bert():
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=48, num_attention_heads=3,
                                  intermediate_size=80, vocab_size=100,
                                  max_position_embeddings=40)
    return transformers.BertForMaskedLM(cfg), {"t": True}


def _roberta():
    cfg = transformers.RobertaConfig(num_hidden_layers=2, hidden_size=48,
                                     num_attention_heads=3, intermediate_size=80,
                                     vocab_size=100, max_position_embeddings=42,
                                     type_vocab_size=1, pad_token_id=1)
    return transformers.RobertaForMaskedLM(cfg), {"lo": 2}


def _albert():
    cfg = transformers.AlbertConfig(num_hidden_layers=2, hidden_size=48, embedding_size=24,
                                    num_attention_heads=3, intermediate_size=80,
                                    vocab_size=100, max_position_embeddings=40)
    return transformers.AlbertForMaskedLM(cfg), {"t": True}


def _electra_generator():
    cfg = transformers.ElectraConfig(num_hidden_layers=2, hidden_size=48, embedding_size=32,
                                     num_attention_heads=3, intermediate_size=80,
                                     vocab_size=100, max_position_embeddings=40)
    return transformers.ElectraForMaskedLM(cfg), {"t": True}


def _electra_discriminator():
    cfg = transformers.ElectraConfig(num_hidden_layers=2, hidden_size=48, embedding_size=48,
                                     num_attention_heads=3, intermediate_size=80,
                                     vocab_size=100, max_position_embeddings=40)
    return transformers.ElectraForPreTraining(cfg), {"t": True, "output": "replaced"}


ENCODERS = {"bert": _bert, "roberta": _roberta, "albert": _albert,
            "electra_generator": _electra_generator,
            "electra_discriminator": _electra_discriminator}


@pytest.fixture(scope="module", params=sorted(ENCODERS))
def encoder(request, tmp_path_factory):
    torch.manual_seed(0)
    ref, how = ENCODERS[request.param]()
    peaked_weights(ref.eval())
    folder = tmp_path_factory.mktemp(request.param)
    weights = _save(ref, folder / "hf")
    return request.param, ref, how, _compile(request.param, weights, folder, ENCODER_TARGETS)


@pytest.mark.parametrize("right", [True, False], ids=["right", "left"])
@pytest.mark.parametrize("target", sorted(ENCODER_TARGETS))
def test_padded_encoder_rows_equal_each_sequence_alone(encoder, target, right):
    spec, ref, how, out = encoder
    ids, mask = _batch(100, how.get("lo", 0), right)
    feeds = {"x": ids, "attention_mask": mask}
    if how.get("t"):
        feeds["t"] = torch.zeros_like(ids)
    name = how.get("output", "logits")
    with torch.no_grad():
        alone = []
        for b in range(len(LENGTHS)):
            row = ids[b][mask[b].bool()][None]
            result = ref(row)
            alone.append((torch.sigmoid(result.logits) if name == "replaced" else
                          result.logits)[0].numpy())
    _assert_rows(_outputs(out[target], target, feeds, name), mask, alone,
                 f"{spec} {target}", logits=name == "logits")


def test_right_padding_equals_transformers_with_its_attention_mask(encoder):
    spec, ref, how, out = encoder
    ids, mask = _batch(100, how.get("lo", 0), right=True)
    feeds = {"x": ids, "attention_mask": mask}
    if how.get("t"):
        feeds["t"] = torch.zeros_like(ids)
    name = how.get("output", "logits")
    with torch.no_grad():
        logits = ref(ids, attention_mask=mask).logits
        want = (torch.sigmoid(logits) if name == "replaced" else logits).numpy()
    got = _outputs(out["torch"], "torch", feeds, name)
    _assert_rows(got, mask, [want[b][mask[b].bool().numpy()] for b in range(len(LENGTHS))],
                 spec, logits=name == "logits")


# ---------------------------------------------------------------- decoders


def _gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=48, n_head=3, vocab_size=100,
                                  n_positions=40)
    return transformers.GPT2LMHeadModel(cfg)


def _llama():
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=96, num_attention_heads=6,
                                   num_key_value_heads=2, intermediate_size=80,
                                   vocab_size=100, max_position_embeddings=40)
    return transformers.LlamaForCausalLM(cfg)


def _mistral():
    cfg = transformers.MistralConfig(num_hidden_layers=2, hidden_size=64,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     intermediate_size=80, vocab_size=100,
                                     max_position_embeddings=40, sliding_window=3)
    return transformers.MistralForCausalLM(cfg)


DECODERS = {"gpt2": _gpt2, "llama": _llama, "mistral": _mistral}


@pytest.fixture(scope="module", params=sorted(DECODERS))
def decoder(request, tmp_path_factory):
    torch.manual_seed(1)
    ref = DECODERS[request.param]().eval()
    peaked_weights(ref)
    folder = tmp_path_factory.mktemp(request.param)
    weights = _save(ref, folder / "hf")
    return request.param, ref, _compile(request.param, weights, folder, TARGETS)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_left_padded_decoder_rows_equal_each_sequence_alone(decoder, target):
    spec, ref, out = decoder
    ids, mask = _batch(100, right=False, seed=2)
    with torch.no_grad():
        alone = [ref(ids[b][mask[b].bool()][None]).logits[0].numpy()
                 for b in range(len(LENGTHS))]
    got = _outputs(out[target], target, {"x": ids, "attention_mask": mask}, "logits")
    _assert_rows(got, mask, alone, f"{spec} {target}")


def _others():
    """The other released decoders, tiny: (class, config)."""
    T = transformers
    small = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                 intermediate_size=80, vocab_size=100, max_position_embeddings=40)
    return {
        "gpt1": (T.OpenAIGPTLMHeadModel, T.OpenAIGPTConfig(
            n_layer=2, n_embd=48, n_head=3, vocab_size=100, n_positions=40)),
        "qwen2": (T.Qwen2ForCausalLM, T.Qwen2Config(num_key_value_heads=2, **small)),
        "qwen3": (T.Qwen3ForCausalLM, T.Qwen3Config(num_key_value_heads=2, head_dim=16,
                                                    **small)),
        "gemma": (T.GemmaForCausalLM, T.GemmaConfig(num_key_value_heads=1, head_dim=16,
                                                    **small)),
        "phi3": (T.Phi3ForCausalLM, T.Phi3Config(num_key_value_heads=4, pad_token_id=0,
                                                 **small)),
        "gpt_neox": (T.GPTNeoXForCausalLM, T.GPTNeoXConfig(rotary_pct=0.5, **small)),
        "mixtral": (T.MixtralForCausalLM, T.MixtralConfig(
            num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, **small)),
    }


@pytest.mark.parametrize("spec", ["gpt1", "qwen2", "qwen3", "gemma", "phi3", "gpt_neox",
                                  "mixtral"])
def test_every_released_decoder_padded_on_the_left(spec, tmp_path):
    """The other released decoders (GPT-NeoX's partial rotary, Gemma's scaled embedding,
    Qwen3's per-head norms, Phi-3's fused products, Mixtral's experts) in every target."""
    cls, cfg = _others()[spec]
    torch.manual_seed(4)
    ref = cls(cfg).eval()
    peaked_weights(ref)
    out = _compile(spec, _save(ref, tmp_path / "hf"), tmp_path, TARGETS)
    ids, mask = _batch(100, right=False, seed=11)
    with torch.no_grad():
        alone = [ref(ids[b][mask[b].bool()][None]).logits[0].numpy()
                 for b in range(len(LENGTHS))]
    for target in TARGETS:
        got = _outputs(out[target], target, {"x": ids, "attention_mask": mask}, "logits")
        _assert_rows(got, mask, alone, f"{spec} {target}")


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_ragged_prompts_generate_what_each_prompt_generates_alone(decoder, target):
    from runtime import generate, load
    spec, ref, out = decoder
    model = module(out[target]) if target == "torch" else load(out[target])
    prompts = [[5, 17, 3], [8, 1, 2, 9, 44, 12], [7]]
    for kw in ({}, {"temperature": 0.9, "top_k": 20, "seed": 4}):
        together = generate(model, prompts, 6, **kw)
        assert together == [generate(model, [p], 6, **kw)[0] for p in prompts], kw
    # transformers' generate, left-padded with its attention_mask, picks the same ids
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        want = ref.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False,
                            pad_token_id=0)[:, width:]
    assert generate(model, prompts, 6) == want.tolist()


def test_decoding_in_place_picks_what_copying_the_cache_picks(decoder):
    """Under --optimize ort, a graph whose attentions are GroupQueryAttention reads its past
    from buffers as long as the run and writes the present into them (`share_buffer`;
    Mistral's window keeps the standard attention, which concatenates), and each
    one-token step writes its logits into one buffer: every row picks what the run that
    copies the cache in and out at every step picks, ragged prompts and sampling
    included."""
    from runtime import generate, load
    spec, _, out = decoder
    model = load(out["ort"])
    shares = spec != "mistral"
    assert bool(model.incremental.get("share_buffer")) == shares, spec
    prompts = [[5, 17, 3], [8, 1, 2, 9, 44, 12], [7]]
    for kw in ({}, {"temperature": 0.9, "top_k": 20, "seed": 4}):
        shared = [generate(model, p, 9, **kw) for p in (prompts, [prompts[0]])]
        model.incremental["share_buffer"] = False
        try:
            copied = [generate(model, p, 9, **kw) for p in (prompts, [prompts[0]])]
        finally:
            model.incremental["share_buffer"] = shares
        assert shared == copied, (spec, kw)


def test_a_step_takes_the_mask_of_the_past_and_the_new_positions(decoder, tmp_path):
    spec, ref, out = decoder
    model = module(out["torch"])
    ids, mask = _batch(100, right=False, seed=3)
    with torch.no_grad():
        whole = model.logits(ids, mask)
        first, past = model.step(ids[:, :5], mask[:, :5])
        rest, _ = model.step(ids[:, 5:], mask, past=past)
        with pytest.raises(AssertionError, match="covers 2 positions"):
            model.step(ids[:, 5:], mask[:, 5:], past=past)
    got = torch.cat([first, rest], 1)
    kept = mask.bool()
    assert float((got[kept] - whole[kept]).abs().max()) <= TOL



def test_the_standard_cached_attention_is_causal_from_the_past_on(decoder):
    """The standard graph's cached attention is ONNX's Attention with `is_causal`, which
    aligns the causal mask to the end of its past keys (query i sees the keys up to past
    + i): no causal table is made (Mistral's window keeps its band). Several new positions
    after a padded past give what the whole pass gives at every token."""
    import onnx
    spec, _, out = decoder
    path = str(out["onnx"] / "model.onnx")
    graph = onnx.load(path, load_external_data=False).graph
    attention = [n for n in graph.node if n.op_type == "Attention" and not n.domain]
    causal = [next((a.i for a in n.attribute if a.name == "is_causal"), 0) for n in attention]
    windowed = spec == "mistral"
    assert attention and causal == [0 if windowed else 1] * len(attention), spec
    assert any("Mask^AR" in n.name for n in graph.node) is False
    assert all(len(n.input) == 6 and n.input[4].startswith("past.") for n in attention)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    ids, mask = (x.numpy() for x in _batch(100, right=False, seed=5))
    cache = [(i.name, i.name.replace("past.", "present.", 1))
             for i in session.get_inputs() if i.name.startswith("past.")]
    names = ["logits"] + [present for _, present in cache]

    def run(x, m, past):
        return session.run(names, {"x": x, "attention_mask": m, **past})

    empty = {name: np.zeros([len(LENGTHS) if d == "batch" else 0 if isinstance(d, str)
                             else d for d in i.shape], np.float32)
             for name, i in ((i.name, i) for i in session.get_inputs())
             if name.startswith("past.")}
    whole = run(ids, mask, empty)[0]
    first, *presents = run(ids[:, :3], mask[:, :3], empty)
    rest = run(ids[:, 3:], mask, {past: v for (past, _), v in zip(cache, presents)})[0]
    got = np.concatenate([first, rest], 1)
    kept = mask.astype(bool)
    assert float(np.abs(got[kept] - whole[kept]).max()) <= TOL, spec


# ---------------------------------------------------------------- errors


def _spec(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "padded.fgpt"
    path.write_text("model Padded {\n  hyper H = 8, V = 10, n = 16\n" + body + "\n}\n")
    return path


def test_a_spec_that_reads_its_mask_applies_it_itself(tmp_path):
    """(XLNet's spec does: below.) The mask is all ones where none is given."""
    path = _spec(tmp_path, "  input x: {1..V}^n, m: Pad[n]\n  param W: R[V, H]\n"
                           "  output Y = OneHot(x) @ W * m[1]\n")
    assert fgc("check", str(path)).returncode == 0
    r = fgc("compile", str(path), "--target", "torch", "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    model = module(tmp_path / "out")
    x = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert torch.equal(model(x), model(x, torch.ones_like(x)))
        assert not model(x, torch.tensor([[0, 1, 1]])).any()


@pytest.mark.parametrize("body, message", [
    # a product over the positions: a padded row would see its padding
    ("  param W: R[V, H]\n  output Y = (OneHot(x) @ W)^T @ (OneHot(x) @ W)\n",
     "cannot pad the positions n"),
    # row 1 of the final states is a token's only where nothing pads on the left
    ("  param W: R[V, H]\n  output Y = (OneHot(x) @ W)[1, :]\n",
     "a fixed position of values along padded positions"),
    # a padded batch reads each token's row of a table of positions: they go first
    ("  param W: R[V, H], P: R[H, n]\n  output Y = OneHot(x) @ W + P^T\n",
     "runs along the positions on an axis other than its first"),
], ids=["mixing", "fixed-position", "table-axis"])
def test_what_padding_cannot_honour_is_located(tmp_path, body, message):
    path = _spec(tmp_path, "  input x: {1..V}^n, m: Pad[n]\n" + body)
    r = fgc("check", str(path))
    assert r.returncode == 1
    assert message in r.stderr and "padded.fgpt:" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_padding_mask_needs_tokens_along_its_positions(tmp_path):
    path = _spec(tmp_path, "  input X: R[n, H], m: Pad[n]\n  output Y = X * 2\n")
    r = fgc("check", str(path))
    assert r.returncode == 1
    assert "no integer input runs along n" in r.stderr


def test_the_runtime_names_what_is_wrong_with_a_mask(decoder):
    from runtime import RuntimeError_, generate, load
    spec, ref, out = decoder
    model = load(out["onnx"])
    ids = np.array([[3, 4, 5, 6]])
    for mask, message in (([[1, 0, 1, 1]], "padding between tokens"),
                          ([[0, 0, 0, 0]], "row 1 has no token"),
                          ([[1, 2, 1, 1]], "values other than 1"),
                          ([[1, 1, 1]], "has shape")):
        with pytest.raises(RuntimeError_, match=message):
            model.run({"x": ids, "attention_mask": np.array(mask)})
    unpadded = model.run({"x": ids})["logits"]  # no mask: no padding
    ones = model.run({"x": ids, "attention_mask": np.ones_like(ids)})["logits"]
    assert np.array_equal(unpadded, ones)
    with pytest.raises(RuntimeError_, match="lists of stop ids for 2 prompts"):
        generate(model, [[1, 2], [3]], 3, stop=[[1], [2], [3]])


# ---------------------------------------------------------------- an encoder's source


def _t5_rows(folder: Path, target: str, feeds: dict) -> np.ndarray:
    return _outputs(folder, target, feeds, "logits")


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    torch.manual_seed(2)
    cfg = transformers.T5Config(num_layers=2, num_decoder_layers=2, d_model=48, d_kv=16,
                                num_heads=3, d_ff=80, vocab_size=100,
                                relative_attention_num_buckets=8,
                                relative_attention_max_distance=20, decoder_start_token_id=0)
    ref = transformers.T5ForConditionalGeneration(cfg).eval()
    peaked_weights(ref)
    folder = tmp_path_factory.mktemp("t5")
    return ref, _compile("t5", _save(ref, folder / "hf"), folder, ENCODER_TARGETS)


@pytest.mark.parametrize("right", [True, False], ids=["right", "left"])
@pytest.mark.parametrize("target", sorted(ENCODER_TARGETS))
def test_a_padded_source_gives_what_each_source_gives_alone(t5, target, right):
    ref, out = t5
    x, mask = _batch(100, right=right, seed=5)
    y = torch.randint(0, 100, (len(LENGTHS), 3), generator=torch.Generator().manual_seed(6))
    got = _t5_rows(out[target], target, {"x": x, "attention_mask": mask, "y": y})
    with torch.no_grad():
        for b in range(len(LENGTHS)):
            alone = ref(input_ids=x[b][mask[b].bool()][None], decoder_input_ids=y[b][None])
            want = _softmax(alone.logits[0].numpy())
            assert float(np.abs(_softmax(got[b]) - want).max()) <= TOL, (target, b)


@pytest.mark.parametrize("target", sorted(ENCODER_TARGETS))
def test_the_transformer_source_padded_on_either_side(tmp_path, target):
    """specs/transformer.fgpt (sinusoidal positions, read at each source token's own):
    its own weights, padded against alone."""
    sets = ["--set", "L=2", "--set", "H=32", "--set", "A=2", "--set", "F=40", "--set", "V=50"]
    r = fgc("compile", "specs/transformer.fgpt", *sets, *ENCODER_TARGETS[target],
            "-o", str(tmp_path))
    assert r.returncode == 0, r.stderr
    x = torch.randint(0, 50, (3, 6), generator=torch.Generator().manual_seed(7))
    y = torch.randint(0, 50, (3, 4), generator=torch.Generator().manual_seed(8))
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[1, 4:] = 0  # padded on the right
    mask[2, :3] = 0  # and on the left
    if target == "torch":
        model = module(tmp_path)

        def run(feeds):
            with torch.no_grad():
                return model.logits(**feeds).numpy()
    else:
        session = ort.InferenceSession(str(tmp_path / "model.onnx"),
                                       providers=["CPUExecutionProvider"])

        def run(feeds):
            return session.run(["logits"], {k: v.numpy() for k, v in feeds.items()})[0]
    got = run({"x": x, "y": y, "attention_mask": mask})
    for b in range(3):
        x1 = x[b:b + 1, mask[b].bool()]
        alone = run({"x": x1, "y": y[b:b + 1], "attention_mask": torch.ones_like(x1)})
        assert float(np.abs(_softmax(got[b]) - _softmax(alone[0])).max()) <= TOL, b


def test_prompts_of_different_lengths_need_a_padding_mask():
    """The seed's GPT-2 box (specs/formal/gpt2.fgpt) declares no Pad input."""
    sets = ["--set", "L=1", "--set", "H=8", "--set", "A=2", "--set", "V=20", "--set", "n=16"]
    r = fgc("generate", "specs/formal/gpt2.fgpt", *sets, "--prompt-ids", "1,2;3",
            "--max-new-tokens", "2", "--provider", "cpu")
    assert r.returncode == 1 and "need a model that takes a padding mask" in r.stderr
    assert "Traceback" not in r.stderr


# ---------------------------------------------------------------- XLNet, which pads itself


@pytest.fixture(scope="module")
def xlnet(tmp_path_factory):
    torch.manual_seed(3)
    cfg = transformers.XLNetConfig(vocab_size=100, d_model=48, n_layer=2, n_head=3,
                                   d_inner=80, dropout=0.0)
    ref = transformers.XLNetLMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0.0, 0.3)
    folder = tmp_path_factory.mktemp("xlnet")
    sets = ["--set", "n=7", "--set", "p=2"]
    out = {}
    for target, args in ENCODER_TARGETS.items():
        r = fgc("compile", "specs/xlnet.fgpt", "--weights", str(_save(ref, folder / "hf")),
                *args, *sets, "-o", str(folder / target))
        assert r.returncode == 0, r.stderr
        out[target] = folder / target
    return ref, out


@pytest.mark.parametrize("right", [True, False], ids=["right", "left"])
@pytest.mark.parametrize("target", sorted(ENCODER_TARGETS))
def test_padded_xlnet_rows_equal_each_sequence_alone(xlnet, target, right):
    """The spec adds its mask to both streams' masks (Mask^pad): each row's predictions,
    under its own factorization order of its tokens, are those of the sequence alone."""
    ref, out = xlnet
    x, mask = _batch(100, right=right, seed=9)
    g = torch.Generator().manual_seed(10)
    B, T = x.shape
    z, TM, alone = [], [], []
    for b in range(B):
        kept = torch.nonzero(mask[b]).flatten()
        order = torch.randperm(len(kept), generator=g)  # the row's own order of its tokens
        targets = order[torch.randperm(len(kept), generator=g)][:2]
        if len(kept) < 2:
            targets = torch.cat([targets, targets])
        padding = torch.nonzero(mask[b] == 0).flatten()
        z.append(torch.cat([kept[order], padding]))
        TM.append(torch.nn.functional.one_hot(kept[targets], T).float())
        rank = torch.argsort(order)
        with torch.no_grad():
            probs = ref(input_ids=x[b][kept][None],
                        perm_mask=(rank[None, :] >= rank[:, None]).float()[None],
                        target_mapping=torch.nn.functional.one_hot(targets, len(kept))
                        .float()[None]).logits
        alone.append(torch.softmax(probs, -1)[0].numpy())
    feeds = {"x": x, "t": torch.zeros_like(x), "z": torch.stack(z), "TM": torch.stack(TM),
             "attention_mask": mask}
    got = _outputs(out[target], target, feeds, "XLNet")
    for b in range(B):
        assert float(np.abs(got[b] - alone[b]).max()) <= TOL, (target, b)
