"""The ONNX backend and runtime/: valid, stable, readable graphs, and safe handling of files.

Every spec compiles to a model that passes `onnx.checker` with full_check, whose shapes
strict ONNX shape inference derives exactly as the compiler does, and which onnxruntime
runs at any batch and length. Output is byte-identical across runs and hash seeds; names
trace to the spec; compiling never imports torch. Corrupt, truncated or escaping files are
refused with a message and exit 1, and nothing is left half-written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import ROOT, TINY, TINY_EXTRA, all_specs, fgc

from compiler.emit import compile_spec
from runtime import RuntimeError_, choose_providers, load

SPECS = [p.relative_to(ROOT).as_posix() for p in all_specs()]
EXTRA = TINY_EXTRA
TINY_ARGS = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]


def sets_for(spec: str) -> dict:
    return {**TINY, **EXTRA.get(spec, {})}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    cache: dict = {}

    def get(spec: str, optimize: str | None = None, opset: int | None = None) -> Path:
        key = (spec, optimize, opset)
        if key not in cache:
            out = tmp_path_factory.mktemp("onnx")
            compile_spec(str(ROOT / spec), str(out), "onnx", None, sets_for(spec),
                         optimize=optimize, opset=opset)
            cache[key] = out
        return cache[key]
    return get


def _dims(value_info) -> list | None:
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return None  # rank unknown
    return [d.dim_value if d.HasField("dim_value") else d.dim_param or None
            for d in t.shape.dim]


# ---------------------------------------------------------------- valid


@pytest.mark.parametrize("optimize", [None, "ort"], ids=["standard", "ort"])
@pytest.mark.parametrize("spec", SPECS)
def test_checker_and_shape_inference_agree(spec, optimize, compiled):
    path = compiled(spec, optimize) / "model.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path))
    ours = {v.name: (v.type.tensor_type.elem_type, _dims(v)) for v in model.graph.value_info}
    assert len(ours) > 10
    # strict inference with our shapes present: any contradiction is an error
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    # and without them: what ONNX derives on its own must be what the compiler said
    del model.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                                 data_prop=True)
    theirs = {v.name: (v.type.tensor_type.elem_type, _dims(v))
              for v in inferred.graph.value_info}
    checked = 0
    for name, (etype, dims) in ours.items():
        if theirs.get(name, (0, None))[1] is None:
            continue
        t_type, t_dims = theirs[name]
        assert t_type == etype, name
        assert len(t_dims) == len(dims), (name, dims, t_dims)
        for a, b in zip(dims, t_dims):
            if isinstance(a, int) and isinstance(b, int):
                assert a == b, (name, dims, t_dims)
            elif isinstance(b, int):
                pytest.fail(f"{name}: ONNX derives {t_dims}, fgc says {dims}")
        checked += 1
    if optimize is None:  # (onnx cannot infer through onnxruntime's own operators)
        assert checked >= 0.9 * len(ours), f"only {checked} of {len(ours)} shapes inferred"


@pytest.mark.parametrize("spec", SPECS)
def test_dynamic_axes_and_any_length(spec, compiled):
    model = load(compiled(spec), provider="cpu", cache=False)
    graph = onnx.load(str(compiled(spec) / "model.onnx"), load_external_data=False).graph
    first = graph.input[0]
    assert _dims(first)[0] == "batch"
    seq = [d for v in graph.input for d in _dims(v)[1:] if isinstance(d, str)]
    # one length: T; inputs with independent lengths (a source and a target): T_n, T_m, ...
    assert seq and (all(d == "T" for d in seq) or all(d.startswith("T_") for d in seq))
    for batch, length in ((1, 3), (3, 8)):
        feeds = model.feeds(";".join(",".join(["1"] * length) for _ in range(batch)))
        out = model.run(feeds)
        first_out = out[graph.output[0].name]
        assert first_out.shape[0] == batch
        assert np.isfinite(first_out).all()


def _compile_bytes(spec: str, out: Path, hashseed: str, *extra: str) -> dict[str, bytes]:
    env = {**os.environ, "PYTHONHASHSEED": hashseed}
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "compile", spec, "--target", "onnx",
                        *TINY_ARGS, *extra, "-o", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.mark.parametrize("extra", [(), ("--optimize", "ort", "--external-data")],
                         ids=["standard", "ort-external"])
def test_byte_identical_across_runs_and_hash_seeds(tmp_path, extra):
    a = _compile_bytes("specs/formal/xlnet.fgpt", tmp_path / "a", "0", *extra)
    b = _compile_bytes("specs/formal/xlnet.fgpt", tmp_path / "b", "12345", *extra)
    assert a == b


def test_names_trace_to_the_spec(compiled):
    model = onnx.load(str(compiled("specs/gpt2.fgpt") / "model.onnx"))
    g = model.graph
    inits = {t.name for t in g.initializer}
    # the query, key and value projections: the attention takes them apart, each a
    # product by its own weights (lowering/products.py), stored as the matrix it takes
    assert {"W_e", "W_p", "layer1/attn/W_Q", "layer1/attn/W_K", "layer2/attn/W_O",
            "layer2/mlp/W_1", "layer1/ln_1/gamma", "ln_f/beta"} <= inits
    w_q = next(t for t in g.initializer if t.name == "layer1/attn/W_Q")
    assert w_q.doc_string.startswith("W_i^Q: R[H, D] for each of ")
    assert w_q.doc_string.endswith(f", stored ({w_q.dims[0]}, {w_q.dims[1]})")
    assert [i.name for i in g.input] == ["x", "attention_mask"]
    assert [o.name for o in g.output] == ["GPT", "logits"]
    docs = [n.doc_string for n in g.node if n.name.startswith("layer1/attn")]
    assert docs and all(d.startswith("gpt2.fgpt:") for d in docs)
    assert any("Attention(X @ W_i^Q" in d for d in docs)
    attention = [n for n in g.node if n.op_type == "Attention"]
    assert [n.name for n in attention] == ["layer1/attn/Attention", "layer2/attn/Attention"]
    assert all(a.i == 1 for n in attention for a in n.attribute if a.name == "is_causal")
    meta = {p.key: p.value for p in model.metadata_props}
    assert json.loads(meta["fgc.signature"])["max_length"] == {"T": 8}


def test_opset_18_has_no_attention_op(compiled):
    model = onnx.load(str(compiled("specs/gpt2.fgpt", opset=18) / "model.onnx"))
    ops = {n.op_type for n in model.graph.node}
    assert "Attention" not in ops and "LayerNormalization" in ops
    assert model.opset_import[0].version == 18


# ---------------------------------------------------------------- external data


def test_external_data_runs_like_inline(tmp_path):
    inline, ext = tmp_path / "inline", tmp_path / "ext"
    compile_spec("specs/gpt2.fgpt", str(inline), "onnx", None, TINY)
    r = fgc("compile", "specs/gpt2.fgpt", "--target", "onnx", *TINY_ARGS, "--external-data",
            "-o", str(ext))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in ext.iterdir()) == ["model.onnx", "model.onnx.data"]
    refs = {e.value for t in onnx.load(str(ext / "model.onnx"), load_external_data=False)
            .graph.initializer for e in t.external_data if e.key == "location"}
    assert refs == {"model.onnx.data"}
    a, b = load(inline, provider="cpu"), load(ext, provider="cpu")
    feeds = a.feeds("1,2,3")
    np.testing.assert_array_equal(a.run(feeds)["GPT"], b.run(feeds)["GPT"])
    # compiling again without external data removes the stale data file
    compile_spec("specs/gpt2.fgpt", str(ext), "onnx", None, TINY)
    assert (ext / "model.onnx").is_file() and not (ext / "model.onnx.data").exists()


def test_external_data_past_the_protobuf_limit(tmp_path, monkeypatch):
    """Weights that would not fit in one protobuf message go to model.onnx.data by
    themselves (the limit lowered here so a tiny model crosses it)."""
    import compiler.backends.onnx.graph as graph
    monkeypatch.setattr(graph, "PROTOBUF_LIMIT", 2**26 + 1000)
    compile_spec("specs/gpt2.fgpt", str(tmp_path), "onnx", None, TINY)
    assert (tmp_path / "model.onnx.data").is_file()


# ---------------------------------------------------------------- bad input and safety


def _assert_clean_error(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def test_truncated_and_corrupt_models_are_refused(tmp_path, compiled):
    good = (compiled("specs/gpt2.fgpt") / "model.onnx").read_bytes()
    for name, data in (("truncated", good[: len(good) // 2]), ("garbage", b"\x07" * 100),
                       ("empty", b"")):
        d = tmp_path / name
        d.mkdir()
        (d / "model.onnx").write_bytes(data)
        _assert_clean_error(fgc("run", str(d), "--tokens", "1,2"), "model.onnx")


def test_external_data_must_stay_inside_the_folder(tmp_path):
    d = tmp_path / "m"
    r = fgc("compile", "specs/gpt2.fgpt", "--target", "onnx", *TINY_ARGS, "--external-data",
            "-o", str(d))
    assert r.returncode == 0
    secret = tmp_path / "secret.bin"
    secret.write_bytes((d / "model.onnx.data").read_bytes())
    model = onnx.load(str(d / "model.onnx"), load_external_data=False)
    for t in model.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../secret.bin"
    (d / "model.onnx").write_bytes(model.SerializeToString())
    _assert_clean_error(fgc("run", str(d), "--tokens", "1,2"), "outside the model's folder")
    with pytest.raises(RuntimeError_, match="outside"):
        load(d, provider="cpu")


def test_truncated_external_data_is_refused(tmp_path):
    d = tmp_path / "m"
    fgc("compile", "specs/gpt2.fgpt", "--target", "onnx", *TINY_ARGS, "--external-data",
        "-o", str(d))
    data = d / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])
    _assert_clean_error(fgc("run", str(d)), "model.onnx.data", "truncated")


def test_wrong_weights_are_named(tmp_path):
    from safetensors.numpy import save_file
    w = tmp_path / "w.safetensors"
    save_file({"wte.weight": np.zeros((50, 16), np.float32),
               "wpe.weight": np.zeros((9, 16), np.float32)}, str(w))
    out = tmp_path / "out"
    r = fgc("compile", "specs/gpt2.fgpt", "--target", "onnx", *TINY_ARGS, "--weights", str(w),
            "-o", str(out))
    _assert_clean_error(r, "wpe.weight", "h.0.ln_1.weight")
    assert not out.exists() or not any(out.iterdir())
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    _assert_clean_error(fgc("compile", "specs/gpt2.fgpt", "--target", "onnx", *TINY_ARGS,
                            "--weights", str(bad), "-o", str(out)), "bad.safetensors")


def test_unwritable_and_symlinked_output_folders(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    _assert_clean_error(fgc("compile", "specs/gpt2.fgpt", "--target", "onnx", *TINY_ARGS,
                            "-o", str(link)), "symbolic link")
    assert not any(real.iterdir())
    afile = tmp_path / "afile"
    afile.write_text("x")
    _assert_clean_error(fgc("compile", "specs/gpt2.fgpt", "--target", "onnx", *TINY_ARGS,
                            "-o", str(afile)), "not a folder")


def test_absurd_sizes_are_refused_before_anything_is_built(tmp_path):
    out = tmp_path / "out"
    r = fgc("compile", "specs/formal/gpt3.fgpt", "--preset", "175b", "--target", "onnx",
            "-o", str(out), timeout=60)
    _assert_clean_error(r, "GiB")
    assert not out.exists()  # created only when a compile succeeds


def test_nothing_is_written_outside_the_output_folder(tmp_path):
    out = tmp_path / "out"
    before = set(tmp_path.iterdir())
    r = fgc("compile", "specs/gpt2.fgpt", "--target", "onnx", *TINY_ARGS, "--external-data",
            "-o", str(out))
    assert r.returncode == 0
    assert set(tmp_path.iterdir()) - before == {out}
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "model.onnx.data"]


def test_inputs_are_checked(compiled):
    model = load(compiled("specs/bert.fgpt"), provider="cpu", cache=False)
    ok = model.feeds("1,2,3")
    model.run(ok)
    cases = [
        ({**ok, "x": ok["x"].astype(np.float32)}, "integers"),
        ({**ok, "x": ok["x"][0]}, "shape"),
        ({k: v for k, v in ok.items() if k != "t"}, "missing input t"),
        ({**ok, "x": np.full((1, 9), 1)}, "at most 8"),
        ({**ok, "x": np.full((1, 3), 50)}, "outside 0..49"),
        ({**ok, "attention_mask": np.array([[1, 0, 1]])}, "padding between tokens"),
        ({**ok, "t": np.zeros((2, 3), np.int64)}, "batch"),
    ]
    for feeds, words in cases:
        with pytest.raises(RuntimeError_, match=words):
            model.run(feeds)


# ---------------------------------------------------------------- runtime and fgc run


def test_provider_fallback_says_which_and_why(monkeypatch):
    import runtime.session as rs
    providers, why = choose_providers("cpu")
    assert providers == ["CPUExecutionProvider"] and why == "requested"
    monkeypatch.setattr(rs, "cuda_device", lambda: (False, "no NVIDIA driver"))
    for request in ("auto", "cuda", "tensorrt"):
        providers, why = choose_providers(request)
        assert providers == ["CPUExecutionProvider"]
        assert "no NVIDIA driver" in why and "falling back to CPU" in why
    monkeypatch.setattr(rs, "cuda_device", lambda: (True, "Test GPU"))
    import onnxruntime
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    providers, why = choose_providers("auto")
    assert providers == ["CPUExecutionProvider"] and "no CUDA execution provider" in why
    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    providers, why = choose_providers("auto")
    assert providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert "Test GPU" in why
    with pytest.raises(RuntimeError_):
        choose_providers("opencl")


def test_fgc_run_prints_one_provider_line(compiled):
    r = fgc("run", str(compiled("specs/gpt2.fgpt")), "--provider", "cuda", "--tokens", "3,1,4")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    provider = [ln for ln in lines if ln.startswith("provider:")]
    assert len(provider) == 1
    if "CPUExecutionProvider" in provider[0]:
        assert "falling back to CPU" in provider[0] or "requested" in provider[0]
    assert "input x: int64[1, 3]" in lines
    assert any(ln.startswith("output GPT: float32[1, 3, 50]") for ln in lines)
    assert any("most likely ids" in ln for ln in lines)


def test_fgc_run_a_spec(tmp_path):
    r = fgc("run", "specs/bert.fgpt", *TINY_ARGS, "--tokens", "5,6,7;8,9,10",
            "--input", "attention_mask=1,1,1;1,1,0")
    assert r.returncode == 0, r.stderr
    assert "output BERT: float32[2, 3, 50]" in r.stdout
    assert "t not given" in r.stdout
    bad = fgc("run", "specs/bert.fgpt", *TINY_ARGS, "--input", "nope=1")
    _assert_clean_error(bad, "no input nope")


def test_second_session_uses_the_cached_graph(tmp_path, monkeypatch):
    """The optimised graph goes to the user's cache folder, never beside the model."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "out"
    compile_spec("specs/gpt2.fgpt", str(out), "onnx", None, TINY, optimize="ort")
    first = load(out, provider="cpu")
    feeds = first.feeds("1,2,3,4")
    a = first.run(feeds)["GPT"]
    assert not first.cached and sorted(p.name for p in out.iterdir()) == ["model.onnx"]
    entries = [p for p in (tmp_path / "cache" / "fgc" / "onnxruntime").iterdir() if p.is_dir()]
    assert len(entries) == 1 and (entries[0] / "model.onnx").is_file()
    assert (tmp_path / "cache" / "fgc").stat().st_mode & 0o777 == 0o700
    second = load(out, provider="cpu")
    assert second.cached
    np.testing.assert_allclose(second.run(feeds)["GPT"], a, atol=1e-6)
    # recompiling invalidates the cache: the key is the model's content
    compile_spec("specs/gpt2.fgpt", str(out), "onnx", None, {**TINY, "L": 1})
    assert not load(out, provider="cpu").cached
    # a copy of the model elsewhere is the same content: the same entry
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "model.onnx").write_bytes((out / "model.onnx").read_bytes())
    assert load(copy, provider="cpu").cached


# ---------------------------------------------------------------- reading a model's structure


def test_protoscan_agrees_with_onnx(tmp_path):
    """The runtime's wire-format reader finds what onnx.load finds: metadata, outputs and
    every external-data reference, without decoding the weights."""
    from runtime.protoscan import scan
    compile_spec("specs/gpt2.fgpt", str(tmp_path), "onnx", None, TINY, external_data=True)
    path = tmp_path / "model.onnx"
    proto = onnx.load(str(path), load_external_data=False)
    summary = scan(path)
    assert summary.metadata == {p.key: p.value for p in proto.metadata_props}
    assert summary.outputs == [o.name for o in proto.graph.output]
    assert summary.nodes == len(proto.graph.node)
    assert summary.ir_version == proto.ir_version
    assert summary.opsets == {o.domain: o.version for o in proto.opset_import}
    want = []
    for t in proto.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = {e.key: e.value for e in t.external_data}
            want.append((t.name, info["location"], int(info.get("offset", 0)),
                         int(info["length"])))
    assert want and [(e.name, e.location, e.offset, e.length) for e in summary.external] == want


@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.5, 0.9, 0.999])
def test_protoscan_refuses_truncations(tmp_path, compiled, fraction):
    from runtime.protoscan import WireError, scan
    good = (compiled("specs/gpt2.fgpt") / "model.onnx").read_bytes()
    path = tmp_path / "model.onnx"
    path.write_bytes(good[: int(len(good) * fraction)])
    with pytest.raises(WireError):
        scan(path)


def test_cached_graph_keeps_weights_beside_it(tmp_path, monkeypatch):
    """The optimised graph is cached with its weights in a side file, which onnxruntime maps
    instead of parsing; the cached graph's references pass the same checks."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    compile_spec("specs/gpt2.fgpt", str(tmp_path / "out"), "onnx", None, TINY)
    load(tmp_path / "out", provider="cpu").run({"x": np.array([[1, 2, 3]])})
    (entry,) = [p for p in (tmp_path / "cache" / "fgc" / "onnxruntime").iterdir() if p.is_dir()]
    assert (entry / "model.onnx.data").is_file()
    cached = onnx.load(str(entry / "model.onnx"), load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in cached.graph.initializer)
    assert load(tmp_path / "out", provider="cpu").cached
