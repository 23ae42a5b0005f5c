"""One signature for both backends (compiler/lowering/signature.py).

The torch module's `signature()` is the dict the ONNX graph stores, JSON-encoded, as its
metadata `fgc.signature`; the ONNX graph's inputs and outputs are the ones it names, with
its dims; and the runtime reads the same from either (runtime/signature.py).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import ROOT

from compiler.emit import compile_spec
from runtime import load
from runtime.signature import Signature, SignatureError, expand_cache, from_metadata, of

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

TINY = {"L": 2, "H": 16, "A": 2, "V": 50, "n": 8}
# (spec, --set values or None for the defaults): state outputs, the key/value cache (one
# run length, and a source beside the generated target), several id inputs, a
# permutation, keys and values shared by the heads
CASES = {
    "transformer_xl": ("specs/transformer_xl.fgpt", None),
    "gpt2": ("specs/gpt2.fgpt", TINY),
    "formal_gpt3": ("specs/formal/gpt3.fgpt", {**TINY, "D": 5, "w": 3}),
    "transformer": ("specs/transformer.fgpt", dict(L=2, H=8, A=2, V=13, n=6, m=16)),
    "bert": ("specs/bert.fgpt", TINY),
    "xlnet": ("specs/xlnet.fgpt", None),
    "multi_query": ("tests/differential/multi_query_kv_cache.fgpt", None),
    # two cached attentions in each layer; one outside any layer (block 0), two blocks
    "two_attentions": ("tests/differential/two_attentions_per_layer.fgpt", {"L": 2}),
    "blocks": ("BLOCKS", None),
}
# other sizes for build(**sizes) of each case's model.py: the number of layers, the run
# lengths' most, the heads, the widths and the vocabulary it reports are its own
OTHER = {
    "gpt2": {"L": 3, "H": 24, "A": 3, "V": 37, "n": 12},
    "bert": {"L": 3, "V": 37, "n": 12},
    "formal_gpt3": {"L": 3, "D": 7, "n": 10, "w": 2},
    "transformer_xl": {"L": 3, "V": 29, "n": 5, "m": 8},
    "transformer": {"L": 3, "V": 17, "n": 5, "m": 12},
    "multi_query": {"L": 3, "H": 12, "A": 3, "n": 6},
    "two_attentions": {"L": 3, "H": 6, "A": 2},
    "blocks": {"L": 3, "M": 2, "n": 5},
    "xlnet": {"L": 1, "H": 32, "A": 2, "V": 50, "n": 16, "p": 4},  # below its preset base
}

# a cached attention outside the layers, then two `layers` blocks, with two in each layer
# of the first
BLOCKS = """
model Blocks {
  hyper L = 2, M = 1, V = 11, n = 6, H = 8, A = 2, D = H / A
  input x: {1..V}^n
  param W_e: R[V, H]
  X = OneHot(x) @ W_e
  H^(0) = MH(X, Mask^AR) + X
  layers l in 1..L {
    S^(l) = MH(H^(l-1), Mask^AR) + H^(l-1)
    H^(l) = MH(S^(l), Mask^AR) + S^(l)
  }
  G^(0) = H^(L)
  layers k in 1..M {
    G^(k) = MH(G^(k-1), Mask^AR) + G^(k-1)
  }
  output y = G^(M) @ W_e^T
}
"""

# an input family: its members follow the batch as one axis
FAMILY = """
model Fam {
  hyper N = 3, H = 4, n = 5
  input X_r: R[n, H] for r in 1..N
  param W: R[H, H]
  output Y = X_1 @ W + X_3
}
"""


def _import(path, tag: str):
    spec = importlib.util.spec_from_file_location(f"sig_{tag}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dims(value_info) -> list:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param
            for d in value_info.type.tensor_type.shape.dim]


def _compile_both(spec: str, sets: dict | None, folder, tag: str):
    """The torch module's signature() (with the module) and the ONNX graph, compiled with
    the key/value cache where the torch module has step()."""
    compile_spec(spec, str(folder / "torch"), "torch", sets=sets)
    module = _import(folder / "torch" / "model.py", tag).build()
    sig = module.signature()
    compile_spec(spec, str(folder / "onnx"), "onnx", sets=sets,
                 kv_cache=sig["incremental"] is not None)
    graph = onnx.load(str(folder / "onnx" / "model.onnx"), load_external_data=False)
    return module, sig, graph


def _spec(name: str, folder) -> str:
    """The case's spec file: a shipped one, or BLOCKS written into `folder`."""
    spec = CASES[name][0]
    if spec != "BLOCKS":
        return str(ROOT / spec)
    (folder / "blocks.fgpt").write_text(BLOCKS, encoding="utf-8")
    return str(folder / "blocks.fgpt")


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return (request.param, folder, *_compile_both(_spec(request.param, folder),
                                                  CASES[request.param][1], folder,
                                                  request.param))


def test_torch_signature_is_the_onnx_metadata(case):
    _, _, _, sig, graph = case
    meta = {p.key: p.value for p in graph.metadata_props}
    assert json.loads(meta["fgc.signature"]) == sig
    # the keys it replaces are gone; where the graph came from stays
    assert not {"fgc.inputs", "fgc.outputs", "fgc.state", "fgc.max_length",
                "fgc.incremental"} & set(meta)
    assert {"fgc.model", "fgc.preset", "fgc.spec", "fgc.optimize"} <= set(meta)
    assert json.loads(json.dumps(sig)) == sig  # plain JSON: no tuples, no numbers as keys


def test_the_graph_has_the_signature_inputs_and_outputs(case):
    """Names and dims of the ONNX graph's inputs and outputs are the signature's: the model
    inputs then the past keys and values; the outputs, the logits, then the present (the
    signature's compact cache expanded as the runtime expands it)."""
    _, _, _, sig, graph = case
    inc = sig["incremental"]
    cache = expand_cache(inc["cache"]) if inc else []
    # a padding mask covers the past's positions too in the incremental form
    want_in = [(i["name"], [f"{inc['past']}+{d}" if inc and i.get("pad") and d == inc["length"]
                            else d for d in i["dims"]]) for i in sig["inputs"]] + \
        [(c["past"], c["dims"]) for c in cache]
    assert [(i.name, _dims(i)) for i in graph.graph.input] == want_in
    outs = {o["name"]: o["dims"] for o in sig["outputs"]}
    want_out = list(outs.items())
    if sig["logits"]:
        want_out.append((sig["logits"]["name"], outs[sig["logits"]["of"]]))
    want_out += [(c["present"], [f"{inc['past']}+{inc['length']}" if d == inc["past"] else d
                                 for d in c["dims"]]) for c in cache]
    assert [(o.name, _dims(o)) for o in graph.graph.output] == want_out


def test_what_each_case_shows(case):
    name, _, module, sig, _ = case
    if name == "transformer_xl":
        assert sig["state"] == {"Mem'": "Mem"}
        assert sig["max_length"] == {"T_n": 4, "T_p": 6}
        assert sig["outputs"][1]["dims"] == ["batch", 2, "min(6, T_n + T_p)", 16]
        assert sig["incremental"] is None and sig["logits"] is None
    if name == "gpt2":
        assert sig["inputs"] == [{"name": "x", "dtype": "int", "dims": ["batch", "T"],
                                  "lo": 1, "hi": 50, "zero_based": True, "perm": False},
                                 {"name": "attention_mask", "dtype": "int",
                                  "dims": ["batch", "T"], "lo": 0, "hi": 1,
                                  "zero_based": False, "perm": False, "pad": True}]
        assert sig["logits"] == {"name": "logits", "of": "GPT"}
        inc = sig["incremental"]
        assert (inc["tokens"], inc["length"], inc["past"]) == ("x", "T", "past")
        # one entry per site and kind, whatever the number of layers
        assert inc["cache"] == [
            {"past": f"past.{{l}}.{kind}", "present": f"present.{{l}}.{kind}", "kind": kind,
             "block": 1, "layers": 2, "dims": ["batch", 2, "past", 8]}
            for kind in ("key", "value")]
        # expanded: the torch step()'s (key, value) pairs, one per cache_sites() entry
        cache = of(module).incremental["cache"]
        assert len(cache) == 2 * len(module.cache_sites())
        assert [(c["past"], c["layer"], c["kind"]) for c in cache] == [
            ("past.0.key", 1, "key"), ("past.0.value", 1, "value"),
            ("past.1.key", 2, "key"), ("past.1.value", 2, "value")]
    if name == "transformer":
        assert sig["incremental"]["tokens"] == "y"
        assert sig["incremental"]["length"] == "T_m"
        assert sig["max_length"] == {"T_m": 16, "T_n": 6}
    if name == "xlnet":
        z = next(i for i in sig["inputs"] if i["name"] == "z")
        assert z["perm"] is True
    if name == "blocks":  # block 0 once; then each block's layers, its sites in turn
        cache = sig["incremental"]["cache"]
        assert [(c["past"], c["block"], c["layers"]) for c in cache] == [
            ("past.MH_1.key", 0, 1), ("past.MH_1.value", 0, 1),
            ("past.1.{l}.MH_2.Attention.key", 1, 2), ("past.1.{l}.MH_2.Attention.value", 1, 2),
            ("past.1.{l}.MH_3.Attention.key", 1, 2), ("past.1.{l}.MH_3.Attention.value", 1, 2),
            ("past.2.{l}.key", 2, 1), ("past.2.{l}.value", 2, 1)]
        assert [c["past"] for c in expand_cache(cache)][:6] == [
            "past.MH_1.key", "past.MH_1.value", "past.1.0.MH_2.Attention.key",
            "past.1.0.MH_2.Attention.value", "past.1.0.MH_3.Attention.key",
            "past.1.0.MH_3.Attention.value"]
        assert len(expand_cache(cache)) == 2 * len(module.cache_sites()) == 12


def test_the_runtime_reads_one_form_from_either(case):
    _, folder, module, sig, _ = case
    assert of(module).to_dict() == sig
    model = load(folder / "onnx", provider="cpu", cache=False, quiet=True)
    assert model.signature.to_dict() == sig
    assert of(model) is model.signature
    assert model.inputs == sig["inputs"] and model.state == sig["state"]


def test_a_module_built_at_other_sizes_reports_them(case, tmp_path):
    """build(**sizes).signature() is the signature at those sizes (its dims, ranges, most
    lengths and cache: the ONNX graph compiled at them stores the same), not the compiled
    one's: runtime.generate and run_segments act on the module they are given."""
    name, folder, _, sig, _ = case
    sets = CASES[name][1]
    sizes = OTHER[name]
    model = _import(folder / "torch" / "model.py", f"{name}_other").build(**sizes)
    got = model.signature()
    assert got != sig
    onnx_sets = {**(sets or {}), **sizes}
    compile_spec(_spec(name, tmp_path), str(tmp_path / "onnx"), "onnx", sets=onnx_sets,
                 kv_cache=got["incremental"] is not None)
    graph = onnx.load(str(tmp_path / "onnx" / "model.onnx"), load_external_data=False)
    meta = {p.key: p.value for p in graph.metadata_props}
    assert json.loads(meta["fgc.signature"]) == got
    assert of(model).to_dict() == got
    if got["incremental"] is not None:  # the cache: the step() pairs of its own layers
        assert len(of(model).incremental["cache"]) == 2 * len(model.cache_sites())
    if name == "gpt2":
        assert got["max_length"] == {"T": 12}
        assert got["inputs"][0]["hi"] == 37 and got["outputs"][0]["dims"] == ["batch", "T", 37]
        assert [c["layers"] for c in got["incremental"]["cache"]] == [3, 3]
        assert [c["dims"] for c in got["incremental"]["cache"]] == [["batch", 3, "past", 8]] * 2
    if name == "transformer_xl":  # a text over the run lengths with a hyperparameter in it
        assert got["outputs"][1]["dims"] == ["batch", 3, "min(8, T_n + T_p)", 16]


def test_a_text_of_sizes_is_printed_over_the_config():
    """A dim mixing run lengths and hyperparameters is an f-string over `self.config`: the
    text at every configuration when giving them values merges nothing, else (a text that
    names the size) the compiled configuration's text there."""
    from types import SimpleNamespace

    from compiler.backends.torch.codegen import Generator
    from compiler.elaborate.symbolic import Poly, parse_poly
    from compiler.lowering.signature import Text

    def printed(text: Text, m: int, compiled: int = 6) -> str:
        gen = SimpleNamespace(fwd_sym={"m": "self.config.m"}, values={"m": Poly.const(compiled)})
        code = Generator._config_code(gen, text).text
        return eval(code, {"self": SimpleNamespace(config=SimpleNamespace(m=m))})

    runs = (("n", "T_n"), ("p", "T_p"))
    exact = Text(parse_poly("min(m, n + p)"), runs)
    assert exact.template() == (["min(", "m", ", T_n + T_p)"], True)
    for m in (1, 6, 11):
        assert printed(exact, m) == exact.at({"m": Poly.const(m)}) == f"min({m}, T_n + T_p)"
    merging = Text(parse_poly("2*m*n + m"), runs)  # the coefficient is 2*m
    assert merging.template()[1] is False
    assert printed(merging, 6) == merging.at({"m": Poly.const(6)}) == "12*T_n + 6"
    assert printed(merging, 3) == "2*3*T_n + 3"


def test_the_cache_is_one_entry_per_site_and_kind_whatever_the_layers():
    """100,000 layers: two entries (key, value) the runtime expands to 200,000 tensors."""
    from compiler.lowering import prepare
    from compiler.lowering.signature import signature
    from compiler.passes.incremental import derive
    from compiler.pipeline import load as load_spec

    spec = load_spec(str(ROOT / "specs/gpt2.fgpt"))
    cfg, sym = spec.configure(None, {**TINY, "L": 100_000}), spec.symbolic()
    model, functions = prepare(sym.model, sym.functions)
    sig = signature(model, functions, cfg.values, derive(sym.model, sym.functions))
    cache = sig["incremental"]["cache"]
    assert [(c["past"], c["present"], c["block"], c["layers"]) for c in cache] == [
        ("past.{l}.key", "present.{l}.key", 1, 100_000),
        ("past.{l}.value", "present.{l}.value", 1, 100_000)]
    tensors = expand_cache(cache)
    assert len(tensors) == 200_000
    assert tensors[-1] == {"past": "past.99999.value", "present": "present.99999.value",
                           "layer": 100_000, "kind": "value", "dims": ["batch", 2, "past", 8]}


def test_an_input_family_is_one_axis_after_the_batch(tmp_path):
    spec = tmp_path / "fam.fgpt"
    spec.write_text(FAMILY, encoding="utf-8")
    _, sig, graph = _compile_both(str(spec), None, tmp_path, "fam")
    meta = {p.key: p.value for p in graph.metadata_props}
    assert json.loads(meta["fgc.signature"]) == sig
    assert sig["inputs"] == [{"name": "X", "dtype": "real", "dims": ["batch", 3, "T", 4]}]
    assert [_dims(i) for i in graph.graph.input] == [["batch", 3, "T", 4]]


def test_a_malformed_signature_is_refused():
    with pytest.raises(SignatureError, match="not JSON"):
        from_metadata({"fgc.signature": "{"})
    with pytest.raises(SignatureError, match="dtype"):
        Signature.parse({"inputs": [{"name": "x", "dtype": "float", "dims": []}],
                         "outputs": []})
    with pytest.raises(SignatureError, match="past"):
        Signature.parse({"inputs": [], "outputs": [], "incremental": {
            "tokens": "x", "length": "T", "past": "past",
            "cache": [{"past": "p", "present": "q", "dims": ["batch", 4]}]}})
    entry = {"past": "past.{l}.key", "present": "present.{l}.key", "kind": "key",
             "block": 1, "layers": 2, "dims": ["batch", "past", 4]}
    for bad, message in [({"block": 0}, "outside the layers"), ({"past": "k"}, "without"),
                         ({"layers": -1}, "whole numbers"), ({"kind": "query"}, "kind")]:
        with pytest.raises(SignatureError, match=message):
            Signature.parse({"inputs": [], "outputs": [], "incremental": {
                "tokens": "x", "length": "T", "past": "past", "cache": [{**entry, **bad}]}})
    with pytest.raises(SignatureError, match="out of order"):
        Signature.parse({"inputs": [], "outputs": [], "incremental": {
            "tokens": "x", "length": "T", "past": "past",
            "cache": [{**entry, "block": 2}, entry]}})
    assert from_metadata({}) is None


def test_the_signature_needs_neither_torch_onnx_nor_jinja2():
    code = ("import sys\nimport compiler.lowering.signature, runtime.signature\n"
            "print(sorted({'torch', 'onnx', 'onnxruntime', 'jinja2'} & set(sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
