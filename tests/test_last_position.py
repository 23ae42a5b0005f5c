"""`--last-position` (compiler/lowering/last.py): the outputs at the last position alone.
In both backends, in the full and the incremental form, they equal the last row of the
outputs at every position, and generation picks the same ids."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import ROOT, TINY, TINY_EXTRA, fgc, unpadded
from test_onnx_parity import random_inputs, session
from test_torch_backend import import_model

from compiler.backends.onnx.lower import Lowerer
from compiler.emit import _lowered, compile_spec
from compiler.pipeline import load
from runtime import generate
from runtime import load as load_graph

# a tied head after a final norm (GPT-2) and on the layers' result itself (GPT-1), untied
# with grouped-query attention and a padding mask (LLaMA), a sparse mixture of experts
# (Mixtral), a decoder beside its encoder (T5)
SPECS = ["specs/gpt2.fgpt", "specs/gpt1.fgpt", "specs/llama.fgpt", "specs/mixtral.fgpt",
         "specs/t5.fgpt"]
# and every other shipped spec with an autoregressive output: windows (Mistral, Phi-3,
# GPT-3's banded layers), q/k norms (Qwen3), a scaled embedding (Gemma), partial rotary
# (GPT-NeoX), the encoder-decoder Transformer, T-D
OTHERS = ["specs/mistral.fgpt", "specs/qwen2.fgpt", "specs/qwen3.fgpt", "specs/gemma.fgpt",
          "specs/phi3.fgpt", "specs/gpt_neox.fgpt", "specs/transformer.fgpt", "specs/t_d.fgpt",
          "specs/formal/gpt.fgpt", "specs/formal/gpt2.fgpt", "specs/formal/gpt3.fgpt"]
T, BATCH = 5, 2


def _sets(name: str) -> dict:
    return {**TINY, **TINY_EXTRA.get(name, {})}


def _module(name: str, out, last: bool):
    compile_spec(str(ROOT / name), str(out), "torch", sets=_sets(name), last_position=last)
    return import_model(out / "model.py").build().eval()


def _close(got: np.ndarray, full: np.ndarray, what: str) -> None:
    want = full[:, -1:]
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=what)


@pytest.mark.parametrize("name", SPECS + OTHERS)
def test_the_torch_module_gives_the_last_row(name, tmp_path):
    full, last = _module(name, tmp_path / "full", False), _module(name, tmp_path / "last", True)
    last.load_state_dict(full.state_dict())
    spec = load(str(ROOT / name))
    inputs = list(random_inputs(spec.configure(None, _sets(name)), T, BATCH, 0).values())
    with torch.no_grad():
        ref, got = full(*inputs), last(*inputs)
    ref, got = (r if isinstance(r, (tuple, list)) else (r,) for r in (ref, got))
    for r, g in zip(ref, got, strict=True):
        _close(g.numpy(), r.numpy(), f"{name}: torch")


@pytest.mark.parametrize("optimize", [None, "ort"])
@pytest.mark.parametrize("name", SPECS + OTHERS)
def test_the_onnx_graphs_give_the_last_row(name, optimize):
    spec = load(str(ROOT / name))
    cfg = spec.configure(None, _sets(name))
    feeds = {k: v.numpy() for k, v in random_inputs(cfg, T, BATCH, 0).items()}
    for kv in (False, True):
        graphs = [Lowerer(spec, _lowered(spec, last), cfg.values, optimize=optimize,
                          kv_cache=kv).lower()[0] for last in (False, True)]
        runs = [session(g) for g in graphs]
        names = [o.name for o in graphs[0].graph.output]
        full, got = (dict(zip(names, r.run(None, unpadded(r, _empty_past(r, feeds)))))
                     for r in runs)
        sig = json.loads({p.key: p.value for p in graphs[1].metadata_props}["fgc.signature"])
        for o in sig["outputs"]:
            assert o["dims"][1] == 1, o
        for n in names:
            if n.startswith("present"):  # the cache holds every position either way
                np.testing.assert_array_equal(got[n], full[n])
            else:
                _close(got[n], full[n], f"{name} --optimize {optimize} kv={kv}: {n}")


def _empty_past(run, feeds: dict) -> dict:
    """The feeds, with an empty past for an incremental graph's cache inputs."""
    out = dict(feeds)
    for i in run.get_inputs():
        if i.name not in out and i.name.startswith("past"):
            out[i.name] = np.zeros([BATCH if d == "batch" else 0 if isinstance(d, str) else d
                                    for d in i.shape], np.float32)
    return out


def test_the_head_runs_on_one_position():
    """The cut sits after the final norm, on the head's input: one Slice, then the head."""
    name = "specs/llama.fgpt"
    spec = load(str(ROOT / name))
    cfg = spec.configure(None, _sets(name))
    graph = Lowerer(spec, _lowered(spec, True), cfg.values, optimize="ort",
                    kv_cache=True).lower()[0]
    nodes = list(graph.graph.node)
    (cut,) = [k for k, n in enumerate(nodes) if n.op_type == "Slice" and "last" in n.name]
    assert nodes[cut - 1].op_type == "SkipSimplifiedLayerNormalization"  # the final norm
    assert [n.op_type for n in nodes[cut + 1:]] == ["MatMul", "Softmax"]


@pytest.mark.parametrize("optimize", [[], ["--optimize", "ort"]])
def test_generation_picks_the_same_ids(tmp_path, optimize):
    """Left-padded prompts of several lengths, with the cache: the same ids as the graph
    that computes every position, in ONNX and in torch."""
    name = "specs/llama.fgpt"
    sets = [a for k, v in _sets(name).items() for a in ("--set", f"{k}={v}")]
    prompts = [[3, 7, 1, 4, 9], [5, 2], [8]]
    ids = {}
    for last in (False, True):
        out = tmp_path / f"onnx{last}"
        flags = ["--last-position"] if last else []
        done = fgc("compile", name, "--target", "onnx", "--kv-cache", *optimize, *flags, *sets,
                   "-o", str(out))
        assert done.returncode == 0, done.stderr
        ids[last] = generate(load_graph(out, provider="cpu", cache=False, quiet=True),
                             prompts, 3)
    assert ids[True] == ids[False]
    full, last = _module(name, tmp_path / "full", False), _module(name, tmp_path / "last", True)
    last.load_state_dict(full.state_dict())
    assert generate(last, prompts, 3) == generate(full, prompts, 3)


def test_a_model_that_is_not_autoregressive_is_refused(tmp_path):
    out = tmp_path / "out"
    done = fgc("compile", "specs/bert.fgpt", "--target", "onnx", "--last-position", "-o",
               str(out))
    assert done.returncode == 1, done.stderr
    assert "specs/bert.fgpt:" in done.stderr and "--last-position is for autoregressive" \
        in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()
