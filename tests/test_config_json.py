"""Model folders' config.json read through a spec's `config { ... }` block.

Every released spec with a transformers class declares how its hyperparameters come from
that class's config.json. For every preset of those specs, transformers' own config class
is built with the preset's values and saved (`save_pretrained`, as transformers 5 writes
it: `rope_parameters`, `head_dim`, ...); reading it back through the block gives exactly
the preset's hyperparameters, and the folder picks the spec. Hand-written config.json files
as the public checkpoints hold them (older layouts: `rope_theta` and `rope_scaling`,
`rotary_pct`, no `n_inner`) give the public presets too. Then the command line: a folder
compiles to the same files as the spec with the same `--set` values; `--set` over
config.json warns; a config.json that contradicts what the spec assumes, names a model no
spec claims, or lacks a key is refused, located, with exit 1.
"""

from __future__ import annotations

import json
import os
from fractions import Fraction

import pytest
from conftest import ROOT, fgc, set_args

from compiler import config_json as C
from compiler.elaborate.symbolic import Poly
from compiler.errors import FgcError
from compiler.pipeline import load
from compiler.syntax import nodes as S

transformers = pytest.importorskip("transformers")

RELEASED = ["llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma", "gemma2",
            "gemma3", "phi3", "gpt_neox", "granite", "cohere", "olmo2", "t5", "gpt2", "gpt1",
            "bert", "roberta", "albert", "electra_discriminator", "electra_generator", "xlnet",
            "reformer"]


def _plain(v):
    if isinstance(v, Poly):
        c = v.const_value()
        return int(c) if c.denominator == 1 else c
    return v


def preset_values(spec, preset: str | None, sets: dict | None = None) -> dict:
    """A configuration's hyperparameters (all of them, derived ones too), as plain numbers."""
    return {k: _plain(v) for k, v in spec._checked_values(preset, sets)[0].values.items()}


# ---------------------------------------------------------------- the block's inverse
# What transformers' config class is given for a preset: the first key of each map set to
# the preset's value (booleans where the class holds one), the keys the spec assumes set
# to the assumed value where the class's default differs, and the few maps that compute
# (n = max_position_embeddings - 2, ...) inverted by hand.

_COMPUTED = {
    "roberta": lambda v: {"max_position_embeddings": v["n"] + 2},
    "gpt_neox": lambda v: {"rope_parameters": {"rope_type": "default", "rope_theta": v["theta"],
                                               "partial_rotary_factor": v["R"] / v["D"]}},
    "reformer": lambda v: {"axial_pos_shape": [v["n1"], v["n2"]],
                           "axial_pos_embds_dim": [v["d1"], v["d2"]],
                           "num_buckets": 2 * v["k1"] if v["k2"] == 0
                           else [2 * v["k1"], 2 * v["k2"]]},
    "t5": lambda v: {"n_positions": v["n"]},
}


def transformers_config(name: str, spec, values: dict):
    block = spec.model.config
    cls = type(transformers.AutoConfig.for_model(block.model_types[0]))
    defaults = cls().to_dict()
    kwargs: dict = {"architectures": block.architectures}
    for m in block.maps:
        first = m.source.alternatives[0]
        if not (isinstance(first, S.ConfigKey) and all(isinstance(p, str) for p in first.path)):
            continue
        value = values[m.name]
        if isinstance(value, Fraction):
            value = float(value)
        if isinstance(defaults.get(first.path[-1]), bool):
            value = bool(value)
        where = kwargs
        for part in first.path[:-1]:
            where = where.setdefault(part, {})
        where[first.path[-1]] = value
    for a in block.assumes:
        first = a.source.alternatives[0]
        if not isinstance(first, S.ConfigKey) or len(first.path) != 1:
            continue
        held = C._lookup(defaults, first.path)
        if held is C._ABSENT and a.absent is None:
            continue
        if not any(C._matches(held, v) for v in a.values):
            kwargs[first.path[0]] = C._literal_json(a.values[0])
    rope = kwargs.get("rope_parameters")
    if rope is not None:  # Llama 3.1's scaling where the preset has it, else none
        rope["rope_type"] = "llama3" if rope.get("factor", 1.0) != 1.0 else "default"
        if rope["rope_type"] == "default":
            for k in ("factor", "low_freq_factor", "high_freq_factor",
                      "original_max_position_embeddings", "beta_fast", "beta_slow"):
                rope.pop(k, None)
    kwargs.update(_COMPUTED.get(name, lambda v: {})(values))
    return cls(**kwargs)


def _presets():
    for name in RELEASED:
        spec = load(str(ROOT / "specs" / f"{name}.fgpt"))
        for preset in spec.presets():
            yield name, preset


PRESETS = list(_presets())


def test_every_released_spec_with_a_transformers_class_has_a_block():
    for name in RELEASED:
        block = load(str(ROOT / "specs" / f"{name}.fgpt")).model.config
        assert block is not None and block.architectures and block.model_types, name


@pytest.mark.parametrize("name,preset", PRESETS, ids=[f"{n}-{p}" for n, p in PRESETS])
def test_a_presets_transformers_config_reads_back_as_the_preset(name, preset, tmp_path):
    spec = load(str(ROOT / "specs" / f"{name}.fgpt"))
    want = preset_values(spec, preset)
    transformers_config(name, spec, want).save_pretrained(tmp_path)
    config = C.read_config(tmp_path)
    assert C.pick_spec(config).path == f"specs/{name}.fgpt"
    reading = C.read_hyperparameters(spec, config)
    got = preset_values(spec, None, reading.values)
    assert got.keys() == want.keys()
    wrong = {k: (want[k], got[k]) for k in want if float(want[k]) != float(got[k])}
    assert not wrong, f"(preset, config.json): {wrong}"
    for o in reading.hypers:  # a real stays a real, a size a whole number (a preset's
        # decimals are exact: Granite's m_att = 0.0078125 is 1/128, read back as a real)
        assert isinstance(o.value, float) == isinstance(want[o.name], float) or \
            float(o.value).is_integer() or isinstance(want[o.name], Fraction), (o.name, o.value)


# ---------------------------------------------------------------- config.json as released

LLAMA_3_2_1B = {  # meta-llama/Llama-3.2-1B, as transformers 4 wrote it
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256}


def _new_rope_layout(config: dict) -> dict:
    """The same file as transformers 5 writes it: rope_theta inside rope_parameters."""
    out = {k: v for k, v in config.items() if k not in ("rope_scaling", "rope_theta")}
    out["rope_parameters"] = {**config["rope_scaling"], "rope_theta": config["rope_theta"]}
    return out


PUBLIC = {
    "llama3_2_1b": ("llama", "llama3_2_1b", LLAMA_3_2_1B),
    "llama3_2_1b-rope_parameters": ("llama", "llama3_2_1b", _new_rope_layout(LLAMA_3_2_1B)),
    "gpt2": ("gpt2", "small", {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
        "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
        "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2",
        "n_ctx": 1024, "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024,
        "resid_pdrop": 0.1, "summary_activation": None, "summary_first_dropout": 0.1,
        "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
        "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
        "vocab_size": 50257}),
    "mistral-7b-v0.1": ("mistral", "7b", {
        "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": 32000}),
    "pythia-70m": ("gpt_neox", "pythia_70m", {
        "architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0,
        "hidden_act": "gelu", "hidden_size": 512, "initializer_range": 0.02,
        "intermediate_size": 2048, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
        "model_type": "gpt_neox", "num_attention_heads": 8, "num_hidden_layers": 6,
        "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False,
        "torch_dtype": "float16", "use_cache": True, "use_parallel_residual": True,
        "vocab_size": 50304}),
    "qwen2.5-0.5b": ("qwen2", "0.5b", {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
        "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
        "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
        "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
        "tie_word_embeddings": True, "torch_dtype": "bfloat16", "use_cache": True,
        "use_mrope": False, "use_sliding_window": False, "vocab_size": 151936}),
    "bert-base-uncased": ("bert", "base", {
        "architectures": ["BertForMaskedLM"], "attention_probs_dropout_prob": 0.1,
        "gradient_checkpointing": False, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
        "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert",
        "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0,
        "position_embedding_type": "absolute", "type_vocab_size": 2, "use_cache": True,
        "vocab_size": 30522}),
    "roberta-base": ("roberta", "base", {
        "architectures": ["RobertaForMaskedLM"], "attention_probs_dropout_prob": 0.1,
        "bos_token_id": 0, "eos_token_id": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
        "layer_norm_eps": 1e-05, "max_position_embeddings": 514, "model_type": "roberta",
        "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1,
        "type_vocab_size": 1, "vocab_size": 50265}),
}


def _folder(tmp_path, config: dict, name: str = "model"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


@pytest.mark.parametrize("case", sorted(PUBLIC))
def test_public_config_json_gives_the_public_preset(case, tmp_path):
    name, preset, config = PUBLIC[case]
    folder = _folder(tmp_path, config)
    spec = load(str(ROOT / "specs" / f"{name}.fgpt"))
    assert C.pick_spec(C.read_config(folder)).path == f"specs/{name}.fgpt"
    reading = C.read_hyperparameters(spec, C.read_config(folder))
    assert preset_values(spec, None, reading.values) == preset_values(spec, preset)


def test_both_rope_layouts_name_their_keys(tmp_path):
    spec = load(str(ROOT / "specs" / "llama.fgpt"))
    old = C.read_hyperparameters(spec, C.read_config(_folder(tmp_path, LLAMA_3_2_1B, "old")))
    new = C.read_hyperparameters(spec, C.read_config(
        _folder(tmp_path, _new_rope_layout(LLAMA_3_2_1B), "new")))
    assert old.values == new.values
    assert old.origin("theta").key == "rope_theta"
    assert new.origin("theta").key == "rope_parameters.rope_theta"
    assert old.origin("factor").key == "rope_scaling.factor"
    assert new.origin("n0").key == "rope_parameters.original_max_position_embeddings"
    assert old.values["factor"] == 32.0 and old.values["tied"] == 1


def test_absent_keys_take_the_blocks_defaults(tmp_path):
    """head_dim and num_key_value_heads absent (or null): H / A and A, as transformers."""
    config = {k: v for k, v in LLAMA_3_2_1B.items()
              if k not in ("head_dim", "num_key_value_heads", "rope_scaling")}
    config["head_dim"] = None
    reading = C.read_hyperparameters(load(str(ROOT / "specs" / "llama.fgpt")),
                                     C.read_config(_folder(tmp_path, config)))
    assert reading.values["D"] == 2048 // 32 and reading.values["G"] == 32
    assert reading.values["factor"] == 1.0
    assert reading.origin("G").describe() == "num_key_value_heads absent: A"


# ---------------------------------------------------------------- the command line


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A saved LlamaForCausalLM of tiny sizes (tied head, Llama 3.1's rope scaling)."""
    torch = pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("tiny") / "llama"
    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


TINY_SETS = dict(L=2, H=64, A=4, G=2, D=16, F=96, V=100, n=64, theta=500000.0, factor=32.0,
                 low=1.0, high=4.0, n0=32, eps=1e-06, tied=1)


@pytest.mark.parametrize("target", ["torch", "onnx"])
def test_a_folder_compiles_as_the_spec_with_the_same_values(tiny_llama, target, tmp_path):
    r = fgc("compile", str(tiny_llama), "--target", target, "-o", str(tmp_path / "folder"))
    assert r.returncode == 0, r.stderr
    assert (f'{tiny_llama}/config.json names LlamaForCausalLM, model_type "llama"; its spec is '
            "specs/llama.fgpt") in r.stderr
    assert "hyperparameters from" in r.stderr and "theta=500000.0" in r.stderr
    r = fgc("compile", "specs/llama.fgpt", "--target", target, *set_args(TINY_SETS),
            "--weights", str(tiny_llama / "model.safetensors"), "-o", str(tmp_path / "sets"))
    assert r.returncode == 0, r.stderr
    names = sorted(os.listdir(tmp_path / "sets"))
    assert names == sorted(os.listdir(tmp_path / "folder")) and len(names) >= 1
    for f in names:
        assert (tmp_path / "folder" / f).read_bytes() == (tmp_path / "sets" / f).read_bytes(), f


def test_the_compiled_folder_computes_what_transformers_does(tiny_llama, tmp_path):
    torch = pytest.importorskip("torch")
    from hf_parity import module
    r = fgc("compile", "specs/llama.fgpt", "--weights", str(tiny_llama), "-o", str(tmp_path))
    assert r.returncode == 0, r.stderr
    ref = transformers.LlamaForCausalLM.from_pretrained(tiny_llama).eval()
    x = torch.randint(0, 100, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = torch.softmax(ref(x).logits, -1)
        got = module(tmp_path)(x)
    assert float((got - want).abs().max()) <= 1e-5  # positions past n0 = 32: scaled


def test_set_over_config_json_warns_and_wins(tiny_llama, tmp_path):
    r = fgc("compile", "specs/llama.fgpt", "--weights", str(tiny_llama), "--set", "n=32",
            "-o", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert ("warning: --set n=32 contradicts " in r.stderr
            and "which gives n = 64 (max_position_embeddings); --set wins" in r.stderr)
    assert "    n: int = 32  #" in (tmp_path / "model.py").read_text()


def test_params_of_a_folder_reports_each_key(tiny_llama):
    r = fgc("params", str(tiny_llama))
    assert r.returncode == 0, r.stderr
    assert "specs/llama.fgpt" in r.stderr
    lines = r.stdout.splitlines()
    assert any(line.split() == ["theta", "=", "500000.0", "rope_parameters.rope_theta"]
               for line in lines), r.stdout
    assert any(line.split() == ["tied", "=", "1", "tie_word_embeddings"] for line in lines)
    r = fgc("params", str(tiny_llama), "--format", "json")
    data = json.loads(r.stdout)
    assert data["config"]["hyperparameters"]["G"] == {
        "value": 2, "key": "num_key_value_heads", "default": None}
    assert data["hyperparameters"]["H"] == 64 and data["total"] > 0


def test_check_with_a_folder_reports_the_configuration_and_the_tensors(tiny_llama):
    r = fgc("check", "--weights", str(tiny_llama), "specs/llama.fgpt")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "H      = 64" in r.stdout and "hidden_size" in r.stdout
    assert "tensors  20 parameters read" in r.stdout
    assert "specs/llama.fgpt: ok" in r.stdout
    r = fgc("check", "--weights", str(tiny_llama), "specs/llama.fgpt", "--format", "json")
    data = json.loads(r.stdout)
    assert data["ok"] and data["files"][0]["tensors"]["read"] == 20
    assert data["files"][0]["config"]["hyperparameters"]["n0"]["value"] == 32


def test_check_with_a_folder_of_other_tensors_fails(tiny_llama, tmp_path):
    folder = tmp_path / "other"
    folder.mkdir()
    config = json.loads((tiny_llama / "config.json").read_text())
    config["intermediate_size"] = 128  # the file's tensors are 96 wide
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes((tiny_llama / "model.safetensors").read_bytes())
    r = fgc("check", "--weights", str(folder), "specs/llama.fgpt")
    assert r.returncode == 1
    assert "F      = 128" in r.stdout
    assert "mis-shaped" in r.stderr and "Traceback" not in r.stderr


def _gpt2_folder(tmp_path, **changes):
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50,
                                     n_positions=16, architectures=["GPT2LMHeadModel"],
                                     **changes)
    config.save_pretrained(tmp_path / "gpt2")
    return tmp_path / "gpt2"


def test_a_config_that_contradicts_an_assumption_is_refused(tmp_path):
    folder = _gpt2_folder(tmp_path, activation_function="relu",
                          scale_attn_by_inverse_layer_idx=True)
    r = fgc("compile", str(folder), "-o", str(tmp_path / "out"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert (f'{folder}/config.json:' in r.stderr and 'config.json sets `activation_function` '
            'to "relu", but specs/gpt2.fgpt assumes one of "gelu_new"' in r.stderr)
    assert ("config.json sets `scale_attn_by_inverse_layer_idx` to true, but specs/gpt2.fgpt "
            "assumes false") in r.stderr
    assert "specs/gpt2.fgpt:" in r.stderr and "note: the assumption" in r.stderr
    assert '"activation_function": "relu"' in r.stderr  # the file's line, quoted
    assert not (tmp_path / "out").exists()
    r = fgc("params", str(folder))
    assert r.returncode == 1 and "activation_function" in r.stderr


def test_an_absent_key_can_contradict_too(tmp_path):
    """ReformerConfig's is_decoder is false where the file says nothing; the LM head needs
    it true (`assume is_decoder == true ? false`)."""
    folder = _folder(tmp_path, {"architectures": ["ReformerModelWithLMHead"],
                                "model_type": "reformer"})
    spec = load(str(ROOT / "specs" / "reformer.fgpt"))
    with pytest.raises(FgcError) as e:
        C.read_hyperparameters(spec, C.read_config(folder))
    assert any("config.json has no `is_decoder`, which means false, but specs/reformer.fgpt "
               "assumes true" in d.message for d in e.value.diagnostics)


def test_a_list_against_one_value_means_every_entry(tmp_path):
    spec = load(str(ROOT / "specs" / "qwen2.fgpt"))
    config = dict(PUBLIC["qwen2.5-0.5b"][2], layer_types=["full_attention"] * 23
                  + ["sliding_attention"])
    with pytest.raises(FgcError, match="sets `layer_types` to"):
        C.read_hyperparameters(spec, C.read_config(_folder(tmp_path, config)))


def test_a_list_ending_in_dots_repeats_its_entries(tmp_path):
    """`assume layer_types == ["sliding_attention", "full_attention", ...]` (Gemma 2): a
    list of any length whose entries are those in turn; another order, another entry or an
    empty list is refused."""
    spec = load(str(ROOT / "specs" / "gemma2.fgpt"))
    base = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
            "num_hidden_layers": 3, "hidden_size": 16, "num_attention_heads": 2,
            "intermediate_size": 24, "vocab_size": 50, "max_position_embeddings": 8,
            "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}
    s, f = "sliding_attention", "full_attention"
    for k, (types, held) in enumerate((([s, f, s], True), ([s], True), ([s, f] * 4, True),
                                       ([f, s, f], False), ([s, s, f], False), ([], False))):
        config = C.read_config(_folder(tmp_path, {**base, "layer_types": types}, f"m{k}"))
        if held:
            C.read_hyperparameters(spec, config)
            continue
        with pytest.raises(FgcError) as e:
            C.read_hyperparameters(spec, config)
        assert any("specs/gemma2.fgpt assumes "
                   '["sliding_attention", "full_attention", ...]' in d.message
                   for d in e.value.diagnostics), types


def test_a_folder_no_spec_claims_is_refused_with_the_list(tmp_path):
    folder = _folder(tmp_path, {"architectures": ["FooForCausalLM"], "model_type": "foo",
                                "hidden_size": 8})
    r = fgc("compile", str(folder), "-o", str(tmp_path / "out"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "no spec is for" in r.stderr and "FooForCausalLM" in r.stderr
    for name in ("LlamaForCausalLM: specs/llama.fgpt", "GPT2LMHeadModel: specs/gpt2.fgpt",
                 "T5ForConditionalGeneration: specs/t5.fgpt"):
        assert name in r.stderr


def test_what_a_folder_says_it_is_reaches_the_terminal_escaped(tmp_path):
    """config.json's architectures and model_type, said back on stderr and in `fgc params`'
    report, carry no control character to the terminal (a right-to-left override here)."""
    config = json.loads(_gpt2_folder(tmp_path).joinpath("config.json").read_text())
    config["model_type"] = "gpt2\u202e\x1b[31m"
    folder = _folder(tmp_path, config, "odd")
    r = fgc("params", str(folder))
    assert r.returncode == 0, r.stderr
    assert "\u202e" not in r.stdout + r.stderr and "\x1b" not in r.stdout + r.stderr
    assert 'model_type "gpt2\\u202e\\x1b[31m"' in r.stderr
    assert 'model_type "gpt2\\u202e\\x1b[31m"' in r.stdout


@pytest.mark.parametrize("key, value, words", [
    ("architectures", "GPT2LMHeadModel", 'is "GPT2LMHeadModel", not a list of class names'),
    ("architectures", ["GPT2LMHeadModel", 2], "not a list of class names"),
    ("model_type", ["gpt2"], 'is ["gpt2"], not a string'),
])
def test_what_a_folder_says_it_is_has_the_kind_transformers_writes(tmp_path, key, value,
                                                                     words):
    """A malformed `architectures` or `model_type` is an error at its key, not passed over
    for the other one (a string for `architectures` chose the spec by model_type alone)."""
    config = json.loads(_gpt2_folder(tmp_path).joinpath("config.json").read_text())
    config[key] = value
    folder = _folder(tmp_path, config, "odd")
    r = fgc("params", str(folder))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"{folder / 'config.json'}:" in r.stderr and words in r.stderr, r.stderr


def test_another_models_folder_is_refused_by_a_named_spec(tiny_llama, tmp_path):
    r = fgc("compile", "specs/gpt2.fgpt", "--weights", str(tiny_llama), "-o", str(tmp_path))
    assert r.returncode == 1
    assert "config.json is for LlamaForCausalLM, but specs/gpt2.fgpt is for GPT2LMHeadModel" \
        in r.stderr
    assert "num_hidden_layers" not in r.stderr  # one error, not one per key


def test_a_missing_key_and_a_key_of_the_wrong_kind_are_located(tmp_path):
    config = {k: v for k, v in LLAMA_3_2_1B.items() if k != "hidden_size"}
    config["num_hidden_layers"] = "sixteen"
    r = fgc("params", str(_folder(tmp_path, config)))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "config.json has no `hidden_size`, from which specs/llama.fgpt reads `H`" in r.stderr
    assert 'config.json\'s `num_hidden_layers` is "sixteen", not a number' in r.stderr
    assert "specs/llama.fgpt:" in r.stderr and "where `L` is read" in r.stderr


def test_set_gives_what_config_json_lacks(tmp_path):
    """A config.json without the sizes (a stub beside a checkpoint) needs them from --set
    or the preset; its defaults and assumptions still apply."""
    spec = load(str(ROOT / "specs" / "gpt2.fgpt"))
    config = C.read_config(_folder(tmp_path, {"model_type": "gpt2"}))
    with pytest.raises(FgcError, match="config.json has no `n_layer`"):
        C.read_hyperparameters(spec, config)
    reading = C.read_hyperparameters(spec, config,
                                     sets={"L": 2, "H": 16, "A": 2, "V": 50, "n": 8})
    assert reading.values == {"F": 64, "eps": 1e-5}  # F = 4 * H with --set H
    with pytest.raises(FgcError, match="config.json has no `vocab_size`"):
        C.read_hyperparameters(spec, config, preset="medium")  # which sets no V


def test_a_config_json_that_is_not_json(tmp_path):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text('{"hidden_size": 8,\n  "model_type": }\n')
    r = fgc("compile", str(folder), "-o", str(tmp_path / "out"))
    assert r.returncode == 1
    assert f"{folder}/config.json:2:" in r.stderr and "is not JSON" in r.stderr


def test_one_model_type_two_specs_without_architectures(tmp_path):
    folder = _folder(tmp_path, {"model_type": "electra", "hidden_size": 256})
    r = fgc("params", str(folder))
    assert r.returncode == 1
    assert "specs/electra_discriminator.fgpt and specs/electra_generator.fgpt" in r.stderr


def test_a_users_spec_claims_an_architecture(tmp_path):
    """A spec of one's own, in a folder FGC_SPEC_PATH names, is picked before the shipped
    ones for the architecture it claims."""
    mine = tmp_path / "mine"
    mine.mkdir()
    text = (ROOT / "specs" / "gpt2.fgpt").read_text().replace(
        'architectures "GPT2LMHeadModel"', 'architectures "MyGPT2LMHeadModel"')
    (mine / "my_gpt2.fgpt").write_text(text)
    folder = _gpt2_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["MyGPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(config))
    os.environ[C.SPEC_PATH] = str(mine)
    try:
        claim = C.pick_spec(C.read_config(folder))
    finally:
        del os.environ[C.SPEC_PATH]
    assert claim.path.endswith("my_gpt2.fgpt")
    with pytest.raises(FgcError, match="no spec is for"):
        C.pick_spec(C.read_config(folder))


# ---------------------------------------------------------------- the block itself


def _check(tmp_path, block: str):
    path = tmp_path / "m.fgpt"
    path.write_text("model M {\n  hyper L = 2, H = 8\n  " + block + "\n"
                    "  input x: {1..H}^L\n  output y = OneHot(x)\n}\n")
    return fgc("check", str(path))


def test_a_block_maps_hyperparameters_only(tmp_path):
    r = _check(tmp_path, "config { Q = hidden_size }")
    assert r.returncode == 1 and "m.fgpt:3:12: error: `Q` is not a hyperparameter" in r.stderr
    r = _check(tmp_path, "config { H = hidden_size ? K * 2 }")
    assert r.returncode == 1 and "`K` in `H`'s default is not a hyperparameter" in r.stderr
    r = _check(tmp_path, "config { H = hidden_size\n H = d_model }")
    assert r.returncode == 1 and "`H` is read from config.json twice" in r.stderr
    r = _check(tmp_path, 'config { architectures "M" H = hidden_size ? 4 * L '
                         'assume act in {"a", "b"} ? "a" }')
    assert r.returncode == 0, r.stderr


def test_an_assumed_value_is_a_json_value(tmp_path):
    r = _check(tmp_path, "config { assume act == silu }")
    assert r.returncode == 1 and "`silu` is not a value config.json can hold" in r.stderr
    r = _check(tmp_path, "config { H = sizes[0] }")
    assert r.returncode == 1 and "positions in a list count from 1" in r.stderr
    r = _check(tmp_path, "config { }\n  config { }")
    assert r.returncode == 1 and "a model has one config block" in r.stderr
    r = _check(tmp_path, "confg { H = hidden_size }")
    assert r.returncode == 1 and "m.fgpt:3:3: error: `confg {` opens no block" in r.stderr


def test_config_stays_a_name(tmp_path):
    """`config` opens the block only before `{`: a hyperparameter or a value may be named so."""
    path = tmp_path / "m.fgpt"
    path.write_text("model M {\n  hyper L = 2, H = 8, config = 3\n"
                    "  config { H = hidden_size ? config * 2 }\n  input x: {1..H}^L\n"
                    "  config' = OneHot(x)\n  output y = config'\n}\n")
    r = fgc("check", str(path))
    assert r.returncode == 0, r.stderr


def test_key_arithmetic_and_list_positions(tmp_path):
    spec = load(str(ROOT / "specs" / "reformer.fgpt"))
    config = {"architectures": ["ReformerModelWithLMHead"], "is_decoder": True,
              "hidden_size": 256, "num_attention_heads": 2, "attention_head_size": 64,
              "feed_forward_size": 512, "vocab_size": 320, "max_position_embeddings": 524288,
              "axial_pos_shape": [512, 1024], "axial_pos_embds_dim": [64, 192],
              "lsh_attn_chunk_length": 64, "local_attn_chunk_length": 64, "num_hashes": 1,
              "num_buckets": [64, 128]}
    reading = C.read_hyperparameters(spec, C.read_config(_folder(tmp_path, config, "a")))
    assert preset_values(spec, None, reading.values) == preset_values(spec, "crime")
    assert reading.origin("k1").key == "num_buckets[1] / 2"
    config["num_buckets"] = 128  # one number: k1 = 64, no second factor
    reading = C.read_hyperparameters(spec, C.read_config(_folder(tmp_path, config, "b")))
    assert reading.values["k1"] == 64 and reading.values["k2"] == 0
    assert reading.origin("k1").key == "num_buckets / 2"
