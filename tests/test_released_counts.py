"""The released specs (specs/*.fgpt) against the released models themselves.

For every released spec and preset, transformers' own class (OpenAIGPTLMHeadModel,
GPT2LMHeadModel, BertForMaskedLM, RobertaForMaskedLM) is built with the matching config on
the meta device -- no weights are allocated or downloaded -- and its unique parameters are
summed. fgc must report exactly that total. For one preset of each spec the count is also
split: the tensors of one layer against fgc's per-copy count of the instances repeated L
times, and the tensors outside the layers (embeddings, final LN, MLM head) against fgc's
rows counted once.
"""

from __future__ import annotations

import functools
import json
import re

import pytest
from conftest import fgc

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


# ---------------------------------------------------------------- the released models


def _openai_gpt(preset: str):
    assert preset == "paper"
    # OpenAIGPTConfig's defaults are the paper's: 12 layers, 768, 12 heads, V 40478, n 512
    return transformers.OpenAIGPTLMHeadModel, transformers.OpenAIGPTConfig(
        layer_norm_epsilon=1e-5, afn="gelu")


_GPT2 = {"small": (12, 768, 12), "medium": (24, 1024, 16), "large": (36, 1280, 20),
         "xl": (48, 1600, 25)}


def _gpt2(preset: str):
    L, H, A = _GPT2[preset]
    return transformers.GPT2LMHeadModel, transformers.GPT2Config(
        n_layer=L, n_embd=H, n_head=A, vocab_size=50257, n_positions=1024,
        layer_norm_epsilon=1e-5, activation_function="gelu_new")


_BERT = {"base": (12, 768, 12, 3072), "large": (24, 1024, 16, 4096)}


def _bert(preset: str):
    L, H, A, F = _BERT[preset]
    return transformers.BertForMaskedLM, transformers.BertConfig(
        num_hidden_layers=L, hidden_size=H, num_attention_heads=A, intermediate_size=F,
        vocab_size=30522, max_position_embeddings=512, type_vocab_size=2,
        layer_norm_eps=1e-12, hidden_act="gelu")


def _roberta(preset: str):
    L, H, A, F = _BERT[preset]
    # as in the released config.json files: 514 position rows, one token type, pad id 1,
    # layer_norm_eps 1e-5 (RobertaConfig's own default is 1e-12; counts do not depend on it)
    return transformers.RobertaForMaskedLM, transformers.RobertaConfig(
        num_hidden_layers=L, hidden_size=H, num_attention_heads=A, intermediate_size=F,
        vocab_size=50265, max_position_embeddings=514, type_vocab_size=1, pad_token_id=1,
        layer_norm_eps=1e-5, hidden_act="gelu")


# spec -> (builder, presets, pattern naming a tensor of layer k, the preset split by groups)
RELEASED = {
    "specs/gpt1.fgpt": (_openai_gpt, ["paper"], r"\.h\.(\d+)\.", "paper"),
    "specs/gpt2.fgpt": (_gpt2, ["small", "medium", "large", "xl"], r"\.h\.(\d+)\.", "small"),
    "specs/bert.fgpt": (_bert, ["base", "large"], r"\.layer\.(\d+)\.", "base"),
    "specs/roberta.fgpt": (_roberta, ["base", "large"], r"\.layer\.(\d+)\.", "base"),
}

CASES = [(spec, preset) for spec, (_, presets, _, _) in RELEASED.items() for preset in presets]


@functools.cache
def hf_params(spec: str, preset: str) -> tuple[tuple[str, int], ...]:
    """(name, numel) of the released model's unique parameters, built on the meta device."""
    cls, config = RELEASED[spec][0](preset)
    with torch.device("meta"):
        model = cls(config)
    seen: set[int] = set()
    out = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:  # tied: the output weight (and the MLM output bias) is counted once
            continue
        seen.add(id(p))
        assert p.device.type == "meta"
        out.append((name, p.numel()))
    return tuple(out)


@functools.cache
def fgc_params(spec: str, preset: str) -> dict:
    r = fgc("params", spec, "--preset", preset, "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


# ---------------------------------------------------------------- totals


@pytest.mark.parametrize("spec,preset", CASES, ids=[f"{s.split('/')[-1]}-{p}" for s, p in CASES])
def test_total_equals_transformers(spec, preset):
    hf_total = sum(n for _, n in hf_params(spec, preset))
    data = fgc_params(spec, preset)
    assert isinstance(data["total"], int)
    assert data["total"] == hf_total, (
        f"{spec} --preset {preset}: fgc {data['total']:,} vs transformers {hf_total:,} "
        f"(difference {data['total'] - hf_total:+,})")


@pytest.mark.parametrize("spec", sorted(RELEASED))
def test_output_is_tied_to_the_token_embedding(spec):
    """Every released model reuses its token embedding for the output, counted once."""
    data = fgc_params(spec, RELEASED[spec][3])
    tied = {t["param"] for t in data["tied"]}
    assert "W_e" in tied


# ---------------------------------------------------------------- per group


def _split(spec: str, preset: str) -> tuple[dict[int, int], int]:
    """Per-layer sums (by layer index) and the sum outside the layers, from transformers."""
    pattern = re.compile(RELEASED[spec][2])
    layers: dict[int, int] = {}
    outside = 0
    for name, n in hf_params(spec, preset):
        m = pattern.search(name)
        if m:
            k = int(m.group(1))
            layers[k] = layers.get(k, 0) + n
        else:
            outside += n
    return layers, outside


@pytest.mark.parametrize("spec", sorted(RELEASED))
def test_one_layer_and_the_rest(spec):
    preset = RELEASED[spec][3]
    data = fgc_params(spec, preset)
    L = data["hyperparameters"]["L"]
    rows = data["modules"]
    assert all(r["copies"] in (1, L) for r in rows), rows

    layers, outside = _split(spec, preset)
    assert sorted(layers) == list(range(L))
    assert len(set(layers.values())) == 1, "transformers' layers differ in size"

    fgc_layer = sum(r["per_copy"] for r in rows if r["copies"] == L)
    assert layers[0] == fgc_layer, (
        f"one layer: transformers {layers[0]:,}, fgc {fgc_layer:,} "
        f"({', '.join(r['name'] for r in rows if r['copies'] == L)})")

    fgc_outside = sum(r["total"] for r in rows if r["copies"] == 1)
    assert outside == fgc_outside, (
        f"outside the layers: transformers {outside:,}, fgc {fgc_outside:,} "
        f"({', '.join(r['name'] for r in rows if r['copies'] == 1)})")

    assert L * fgc_layer + fgc_outside == data["total"]
