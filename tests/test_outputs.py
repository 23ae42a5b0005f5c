"""`fgc compile --outputs` (compiler/lowering/signature.py, `select_outputs`): the ONNX graph
computes the outputs named and nothing else. The logits alone, what generation reads, are
the full graph's logits without the final Softmax and pick the same ids; the state and the
cache stay; a name the model does not have is an error before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import ROOT, fgc, tiny_sets, unpadded
from test_onnx_parity import random_inputs, session

from compiler.backends.onnx.lower import Lowerer
from compiler.emit import _lowered, compile_spec
from compiler.pipeline import load
from runtime import generate
from runtime import load as load_graph

T, BATCH = 5, 2


def _graphs(name: str, optimize, kv: bool, outputs: list[str]):
    spec = load(str(ROOT / name))
    cfg = spec.configure(None, tiny_sets(name))
    graphs = [Lowerer(spec, _lowered(spec, False), cfg.values, optimize=optimize, kv_cache=kv,
                      outputs=chosen).lower()[0] for chosen in (None, outputs)]
    feeds = {k: v.numpy() for k, v in random_inputs(cfg, T, BATCH, 0).items()}
    return graphs, feeds


def _run(graph, feeds: dict) -> dict:
    run = session(graph)
    out = dict(feeds)
    for i in run.get_inputs():  # an incremental graph's first call: an empty past
        if i.name not in out and i.name.startswith("past"):
            out[i.name] = np.zeros([BATCH if d == "batch" else 0 if isinstance(d, str) else d
                                    for d in i.shape], np.float32)
    names = [o.name for o in graph.graph.output]
    return dict(zip(names, run.run(None, unpadded(run, out)), strict=True))


def _softmaxes(graph) -> int:
    return sum(n.op_type == "Softmax" for n in graph.graph.node)


def _signature(graph) -> dict:
    return json.loads({p.key: p.value for p in graph.metadata_props}["fgc.signature"])


# a tied head (GPT-2), grouped-query attention with a padding mask (LLaMA), a sparse mixture
# of experts (Mixtral), a decoder beside its encoder (T5)
@pytest.mark.parametrize("optimize", [None, "ort"])
@pytest.mark.parametrize("name", ["specs/gpt2.fgpt", "specs/llama.fgpt", "specs/mixtral.fgpt",
                                  "specs/t5.fgpt"])
def test_the_logits_alone_are_the_full_graphs_logits(name, optimize):
    for kv in (False, True):
        (full, alone), feeds = _graphs(name, optimize, kv, ["logits"])
        names = [o.name for o in alone.graph.output]
        assert names == [n for n in (o.name for o in full.graph.output)
                         if n == "logits" or n.startswith("present")]
        assert _softmaxes(alone) == _softmaxes(full) - 1  # the final one
        sig, whole = _signature(alone), _signature(full)
        assert sig["outputs"] == [] and sig["logits"]["name"] == "logits"
        assert sig["logits"]["dims"] == whole["outputs"][0]["dims"]
        assert sig["incremental"] == whole["incremental"]
        want, got = _run(full, feeds), _run(alone, feeds)
        assert set(got) == set(names)
        for n in names:
            np.testing.assert_allclose(got[n], want[n], rtol=1e-6, atol=1e-6,
                                       err_msg=f"{name} --optimize {optimize} kv={kv}: {n}")


def test_one_of_the_specs_outputs_alone():
    """`--outputs GPT`: the Softmax's result without the logits beside it."""
    (full, alone), feeds = _graphs("specs/gpt2.fgpt", None, True, ["GPT"])
    assert [o.name for o in alone.graph.output][0] == "GPT"
    assert "logits" not in {o.name for o in alone.graph.output}
    assert _signature(alone)["logits"] is None
    np.testing.assert_allclose(_run(alone, feeds)["GPT"], _run(full, feeds)["GPT"],
                               rtol=1e-6, atol=1e-7)


def test_the_state_stays():
    """Transformer-XL's memory `Mem'` is the next call's `Mem`: kept whatever is named."""
    (full, alone), _ = _graphs("specs/transformer_xl.fgpt", None, False, ["probs"])
    assert [o.name for o in alone.graph.output] == [o.name for o in full.graph.output]
    assert _signature(alone)["state"] == {"Mem'": "Mem"}


@pytest.mark.parametrize("optimize", [[], ["--optimize", "ort"]])
def test_generation_picks_the_same_ids(tmp_path, optimize):
    """Left-padded prompts of several lengths, with the cache, at the last position: the same
    ids from the logits alone as from the graph that computes its Softmax too, through
    runtime.generate and `fgc generate`."""
    name = "specs/llama.fgpt"
    sets = [a for k, v in tiny_sets(name).items() for a in ("--set", f"{k}={v}")]
    prompts = [[3, 7, 1, 4, 9], [5, 2], [8]]
    ids = {}
    for chosen in ([], ["--outputs", "logits"]):
        out = tmp_path / ("alone" if chosen else "full")
        done = fgc("compile", name, "--target", "onnx", "--kv-cache", "--last-position",
                   *optimize, *chosen, *sets, "-o", str(out))
        assert done.returncode == 0, done.stderr
        ids[bool(chosen)] = generate(load_graph(out, provider="cpu", cache=False, quiet=True),
                                     prompts, 3)
    assert ids[True] == ids[False]
    done = fgc("generate", str(tmp_path / "alone"), "--prompt-ids", "3,7,1,4,9",
               "--max-new-tokens", "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == ",".join(map(str, ids[True][0]))
    done = fgc("run", str(tmp_path / "alone"), "--tokens", "3,7,1")
    assert done.returncode == 0 and "logits" in done.stdout, done.stderr


def test_onnxruntime_genai_gets_the_logits_alone(tmp_path):
    """`--genai`: onnxruntime-genai reads the logits, so the graph computes no Softmax."""
    out = tmp_path / "genai"
    compile_spec(str(ROOT / "specs/gpt2.fgpt"), str(out), "onnx", sets=tiny_sets(
        "specs/gpt2.fgpt"), kv_cache=True, genai=True)
    import onnx
    graph = onnx.load(str(out / "model.onnx"))
    assert [o.name for o in graph.graph.output][0] == "logits"
    assert "Softmax" not in {n.op_type for n in graph.graph.node}


@pytest.mark.parametrize("args, code, words", [
    (["--target", "onnx", "--outputs", "logits,probs"], 1,
     "the model has no output `probs` (its outputs: `GPT`, `logits`)"),
    (["--outputs", "logits"], 1, "--outputs are for --target onnx"),
    (["--target", "onnx", "--outputs", "GPT,,logits"], 2, "give names separated by commas"),
])
def test_a_name_the_model_lacks_is_refused(tmp_path, args, code, words):
    out = tmp_path / "out"
    done = fgc("compile", "specs/gpt2.fgpt", *args, "-o", str(out))
    assert done.returncode == code, done.stderr
    assert words in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()
