"""`--weights` takes a checkpoint as users hold it: a safetensors file, a sharded checkpoint's
index, a model folder (save_pretrained's layout), or a PyTorch `pytorch_model.bin`.

A folder with one file, a sharded folder and its index compile to exactly the weights the
single file gives; float16 and bfloat16 files give the float32 of their values exactly. A
shard named with a folder (`../`, an absolute path) or linked outside the folder, a missing
shard, a tensor in two shards or one the index misplaces, and a pickle that is more than
tensors are each refused with exit 1, naming the file and the tensor, and no traceback.
Many import errors start with one line that counts them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import fgc, set_args
from test_weights_lazy import TINY
from test_weights_lazy import gpt2_tensors as lazy_gpt2_tensors

from compiler.errors import FgcError
from compiler.weights import TorchFile, open_checkpoint, read_safetensors, write_safetensors

SPEC = "specs/gpt2.fgpt"


def gpt2_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """A GPT-2 checkpoint of the TINY sizes in the released names, values spread wider
    than float16's and bfloat16's steps."""
    return lazy_gpt2_tensors(seed, scale=1.0)


def write_raw(path: Path, tensors: dict[str, tuple[str, tuple, bytes]]) -> None:
    """A safetensors file of (dtype code, shape, bytes) per name: any dtype the format has."""
    header, offset = {}, 0
    for name, (code, shape, data) in tensors.items():
        header[name] = {"dtype": code, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text +
                     b"".join(data for _, _, data in tensors.values()))


def bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """The bfloat16 bits of float32 values that bfloat16 holds exactly."""
    bits = x.view(np.uint32)
    assert not (bits & 0xFFFF).any()
    return (bits >> 16).astype("<u2")


def sharded(folder: Path, tensors: dict[str, np.ndarray], parts: int = 3,
            write=write_safetensors) -> Path:
    """`tensors` as transformers shards them: model-0000k-of-0000n.safetensors and an
    index; the index's path."""
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    weight_map = {}
    for k in range(parts):
        shard = f"model-{k + 1:05d}-of-{parts:05d}.safetensors"
        chunk = names[k::parts]
        write({name: tensors[name] for name in chunk}, folder / shard)
        weight_map.update({name: shard for name in chunk})
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return index


def compile_with(weights, out: Path, target: str = "torch"):
    return fgc("compile", SPEC, "--target", target, *set_args(TINY), "--weights",
               str(weights), "-o", str(out))


def compiled(weights, out: Path, target: str = "torch") -> bytes:
    r = compile_with(weights, out, target)
    assert r.returncode == 0, r.stderr[-3000:]
    return (out / ("weights.safetensors" if target == "torch" else "model.onnx")).read_bytes()


def refused(r, *words: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stdout + r.stderr and "internal error" not in r.stderr, \
        r.stderr[-3000:]
    for w in words:
        assert w in r.stderr, (w, r.stderr[-3000:])


@pytest.fixture
def single(tmp_path) -> Path:
    path = tmp_path / "gpt2.safetensors"
    write_safetensors(gpt2_tensors(), path)
    return path


# ---------------------------------------------------------------- what --weights takes


def test_a_model_folder_with_one_file(tmp_path, single):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (folder / "model.safetensors").write_bytes(single.read_bytes())
    assert compiled(folder, tmp_path / "a") == compiled(single, tmp_path / "b")


@pytest.mark.parametrize("target", ["torch", "onnx"])
def test_a_sharded_checkpoint_gives_the_single_files_weights(tmp_path, single, target):
    index = sharded(tmp_path / "hf", gpt2_tensors())
    (tmp_path / "hf" / "config.json").write_text("{}")
    want = compiled(single, tmp_path / "single", target)
    assert compiled(index.parent, tmp_path / "folder", target) == want
    assert compiled(index, tmp_path / "index", target) == want


def test_run_takes_a_sharded_folder(tmp_path, single):
    pytest.importorskip("onnxruntime")
    sharded(tmp_path / "hf", gpt2_tensors())
    outs = [fgc("run", SPEC, *set_args(TINY), "--weights", str(w), "--tokens", "1,2,3",
                "--provider", "cpu") for w in (tmp_path / "hf", single)]
    assert [r.returncode for r in outs] == [0, 0], outs[0].stderr[-2000:]
    assert outs[0].stdout == outs[1].stdout and "most likely ids" in outs[0].stdout


def test_a_folder_of_one_safetensors_file_by_another_name(tmp_path, single):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "model.fp32.safetensors").write_bytes(single.read_bytes())
    assert compiled(folder, tmp_path / "a") == compiled(single, tmp_path / "b")


def test_bfloat16_and_float16_give_their_values_in_float32(tmp_path):
    """A bf16 file and an f16 file (both sharded) compile to exactly the weights of a float32
    file holding the same values."""
    tensors = gpt2_tensors()
    bf16 = {k: (v.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
            for k, v in tensors.items()}
    f16 = {k: v.astype(np.float16) for k, v in tensors.items()}
    write_safetensors(bf16, tmp_path / "bf16-as-f32.safetensors")
    write_safetensors({k: v.astype(np.float32) for k, v in f16.items()},
                      tmp_path / "f16-as-f32.safetensors")

    def write_bf16(part, path):
        write_raw(path, {k: ("BF16", v.shape, bfloat16_bits(v).tobytes())
                         for k, v in part.items()})
    sharded(tmp_path / "bf16", bf16, write=write_bf16)
    sharded(tmp_path / "f16", f16)
    assert compiled(tmp_path / "bf16", tmp_path / "a") == \
        compiled(tmp_path / "bf16-as-f32.safetensors", tmp_path / "b")
    assert compiled(tmp_path / "f16", tmp_path / "c") == \
        compiled(tmp_path / "f16-as-f32.safetensors", tmp_path / "d")
    out = read_safetensors(str(tmp_path / "a" / "weights.safetensors"))
    assert {v.dtype for v in out.values()} == {np.dtype(np.float32)}


def test_bfloat16_special_values_are_exact(tmp_path):
    values = np.array([1.0, -2.5, 3.140625, 0.0, -0.0, np.inf, -np.inf, 2.0 ** -130,
                       3.3895313892515355e38], np.float32)
    write_raw(tmp_path / "x.safetensors",
              {"x": ("BF16", values.shape, bfloat16_bits(values).tobytes()),
               "nan": ("BF16", (1,), np.array([0x7FC0], "<u2").tobytes())})
    with open_checkpoint(str(tmp_path)) as ckpt:
        got = ckpt.read("x")
        assert got.dtype == np.float32
        assert got.view(np.uint32).tolist() == values.view(np.uint32).tolist()
        assert np.isnan(ckpt.read("nan")).all()


# ---------------------------------------------------------------- pytorch_model.bin


def test_pytorch_model_bin(tmp_path, single):
    torch = pytest.importorskip("torch")
    tensors = gpt2_tensors()
    state = {k: torch.from_numpy(v) for k, v in tensors.items()}
    state["h.0.ln_1.weight"] = state["h.0.ln_1.weight"].to(torch.bfloat16)
    folder = tmp_path / "hf"
    folder.mkdir()
    torch.save(state, folder / "pytorch_model.bin")
    want = dict(tensors)
    want["h.0.ln_1.weight"] = state["h.0.ln_1.weight"].float().numpy()
    write_safetensors(want, tmp_path / "want.safetensors")
    assert compiled(folder, tmp_path / "a") == compiled(tmp_path / "want.safetensors",
                                                        tmp_path / "b")
    assert compiled(folder / "pytorch_model.bin", tmp_path / "c") == \
        (tmp_path / "a" / "weights.safetensors").read_bytes()


def test_sharded_pytorch_model_bin(tmp_path, single):
    """pytorch_model.bin.index.json and its shards, as older save_pretrained wrote them."""
    torch = pytest.importorskip("torch")

    def save(part, path):
        torch.save({k: torch.from_numpy(v) for k, v in part.items()},
                   path.with_name(path.name.replace(".safetensors", ".bin")))
    index = sharded(tmp_path / "hf", gpt2_tensors(), write=save)
    text = index.read_text().replace(".safetensors", ".bin")
    index.unlink()
    (tmp_path / "hf" / "pytorch_model.bin.index.json").write_text(text)
    assert compiled(tmp_path / "hf", tmp_path / "a") == compiled(single, tmp_path / "b")


class Payload:
    """Unpickling this would run a command: torch's weights_only loader must refuse it."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_is_more_than_tensors_is_refused(tmp_path):
    torch = pytest.importorskip("torch")
    marker = tmp_path / "exploded"
    folder = tmp_path / "hf"
    folder.mkdir()
    torch.save({"wte.weight": torch.zeros(2), "x": Payload(str(marker))},
               folder / "pytorch_model.bin")
    r = compile_with(folder, tmp_path / "out")
    refused(r, "pytorch_model.bin", "posix.system")
    assert not marker.exists()
    assert "weights_only=False" not in r.stderr  # torch's advice is not passed on


def test_pytorch_file_without_torch_says_how_to_convert(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    path = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.zeros(2)}, path)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(FgcError, match="torch is not installed") as e:
        TorchFile(str(path))
    assert "safe_serialization=True" in e.value.diagnostics[0].hint


# ---------------------------------------------------------------- refused


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/w.safetensors",
                                   ".."])
def test_a_shard_named_outside_the_folder_is_refused(tmp_path, shard):
    folder = tmp_path / "hf"
    index = sharded(folder, gpt2_tensors())
    write_safetensors({"wte.weight": gpt2_tensors()["wte.weight"]},
                      tmp_path / "outside.safetensors")
    data = json.loads(index.read_text())
    data["weight_map"]["wte.weight"] = shard
    index.write_text(json.dumps(data))
    refused(compile_with(folder, tmp_path / "out"), str(index), f"`{shard}`", "`wte.weight`",
            "not a file name")


def test_a_shard_linked_outside_the_folder_is_refused(tmp_path):
    folder = tmp_path / "hf"
    index = sharded(folder, gpt2_tensors())
    shard = folder / json.loads(index.read_text())["weight_map"]["wte.weight"]
    shard.rename(tmp_path / "elsewhere.safetensors")
    shard.symlink_to(tmp_path / "elsewhere.safetensors")
    refused(compile_with(folder, tmp_path / "out"), str(shard), "outside")
    refused(compile_with(index, tmp_path / "out"), str(shard), "outside")
    (folder / "real").mkdir()  # a link to a file inside the folder is the folder's own
    (tmp_path / "elsewhere.safetensors").rename(folder / "real" / "shard.safetensors")
    shard.unlink()
    shard.symlink_to(Path("real") / "shard.safetensors")
    assert compile_with(folder, tmp_path / "out").returncode == 0


def test_a_hugging_face_cache_snapshot_reads_its_blobs(tmp_path, single):
    """The hub's cache links snapshots/REV/model.safetensors to ../../blobs/HASH."""
    repo = tmp_path / "models--openai-community--gpt2"
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "blobs" / "0f1e2d").write_bytes(single.read_bytes())
    (repo / "snapshots" / "abc123" / "model.safetensors").symlink_to("../../blobs/0f1e2d")
    assert compiled(repo / "snapshots" / "abc123", tmp_path / "a") == \
        compiled(single, tmp_path / "b")


def test_a_missing_shard_is_named(tmp_path):
    folder = tmp_path / "hf"
    index = sharded(folder, gpt2_tensors())
    shard = json.loads(index.read_text())["weight_map"]["wte.weight"]
    (folder / shard).unlink()
    refused(compile_with(folder, tmp_path / "out"), str(index), str(folder / shard),
            "does not exist")


def test_a_tensor_in_two_shards_is_refused(tmp_path):
    folder = tmp_path / "hf"
    tensors = gpt2_tensors()
    index = sharded(folder, tensors)
    weight_map = json.loads(index.read_text())["weight_map"]
    first = weight_map["wte.weight"]
    other = next(s for s in sorted(set(weight_map.values())) if s != first)
    part = read_safetensors(str(folder / other))
    write_safetensors({**part, "wte.weight": tensors["wte.weight"]}, folder / other)
    refused(compile_with(folder, tmp_path / "out"), "`wte.weight`", "is in both",
            str(folder / first), str(folder / other))


def test_a_tensor_listed_twice_in_the_index_is_refused(tmp_path):
    folder = tmp_path / "hf"
    index = sharded(folder, gpt2_tensors())
    text = index.read_text().replace('"weight_map": {',
                                     '"weight_map": {"wte.weight": "other.safetensors", ', 1)
    index.write_text(text)
    refused(compile_with(index, tmp_path / "out"), str(index), "`wte.weight` twice")


def test_a_tensor_its_shard_lacks_is_named(tmp_path):
    folder = tmp_path / "hf"
    index = sharded(folder, gpt2_tensors())
    weight_map = json.loads(index.read_text())["weight_map"]
    shard = folder / weight_map["wpe.weight"]
    part = read_safetensors(str(shard))
    del part["wpe.weight"]
    write_safetensors(part, shard)
    refused(compile_with(folder, tmp_path / "out"), str(index), "`wpe.weight`", str(shard),
            "does not hold it")


@pytest.mark.parametrize("case", ["empty", "two-files", "not-json", "no-map"])
def test_a_folder_or_index_without_a_checkpoint_is_refused(tmp_path, case):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    weights = folder
    if case == "two-files":
        for name in ("a.safetensors", "b.safetensors"):
            write_safetensors({"x": np.zeros(2, np.float32)}, folder / name)
    elif case in ("not-json", "no-map"):
        weights = folder / "model.safetensors.index.json"
        weights.write_text("{not json" if case == "not-json" else '{"metadata": {}}')
    words = {"empty": ["no model.safetensors"],
             "two-files": ["a.safetensors, b.safetensors", "index"],
             "not-json": [str(weights), "not JSON"],
             "no-map": [str(weights), "weight_map"]}[case]
    refused(compile_with(weights, tmp_path / "out"), *words)


# ---------------------------------------------------------------- many errors


def test_many_errors_start_with_a_summary(tmp_path):
    tensors = gpt2_tensors()
    for name in ("wpe.weight", "h.0.ln_1.weight", "h.1.ln_2.bias"):
        del tensors[name]
    tensors["ln_f.weight"] = np.zeros(TINY["H"] + 1, np.float32)
    tensors["ln_f.bias"] = np.zeros(TINY["H"] + 1, np.float32)
    tensors["score.weight"] = np.zeros(2, np.float32)
    path = tmp_path / "bad.safetensors"
    write_safetensors(tensors, path)
    r = compile_with(path, tmp_path / "out")
    refused(r)
    first = r.stderr.splitlines()[0]
    assert first == f"error: 3 tensors missing, 2 mis-shaped, 1 unused in {path}", r.stderr
    assert "unused: score.weight" in r.stderr
    # the line, then each: three missing, two mis-shaped, and the unused one
    assert r.stderr.count("error:") == 7 and "more errors" not in r.stderr
    assert "`score.weight` in" in r.stderr and "is read by no parameter" in r.stderr


def test_a_checkpoint_of_other_sizes_shows_the_first_errors(tmp_path, single):
    r = fgc("compile", SPEC, "--target", "torch", *set_args({**TINY, "H": 12, "A": 3}),
            "--weights", str(single), "-o", str(tmp_path / "out"))
    refused(r)
    lines = r.stderr.splitlines()
    # every tensor has an H axis; c_attn's three parts are three errors, one tensor
    assert lines[0] == f"error: 28 tensors mis-shaped in {single}", r.stderr
    assert "help: the sizes (--preset, --set) are not the checkpoint's" in r.stderr
    shown = [line for line in lines if line.startswith(f"{SPEC}:")]
    assert len(shown) == 8 and all(": error: " in line for line in shown), r.stderr
    more = [line for line in lines if line.startswith("note: ... and ")]
    assert len(more) == 1 and more[0].endswith(" more errors") and lines[-1] == more[0]
    assert int(more[0].split()[3]) >= 28 - 8


# ---------------------------------------------------------------- tied copies


def test_a_tied_copy_is_checked_and_skipped(tmp_path):
    """GPT-2's file may hold lm_head.weight, a copy of wte.weight: read by nothing."""
    tensors = gpt2_tensors()
    tensors["lm_head.weight"] = tensors["wte.weight"].copy()
    path = tmp_path / "tied.safetensors"
    write_safetensors(tensors, path)
    r = compile_with(path, tmp_path / "out")
    assert r.returncode == 0, r.stderr


def test_an_untied_head_beside_a_tied_spec_is_refused(tmp_path):
    """A head of its own (a checkpoint of an untied model) is not dropped: the logits would
    be another model's."""
    tensors = gpt2_tensors()
    tensors["lm_head.weight"] = tensors["wte.weight"] + np.float32(0.5)
    path = tmp_path / "untied.safetensors"
    write_safetensors(tensors, path)
    r = compile_with(path, tmp_path / "out")
    refused(r)
    assert "`lm_head.weight` in" in r.stderr and "is not a copy of `wte.weight`" in r.stderr
    assert "gpt2.fgpt:" in r.stderr  # at the spec's `tied` line
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_an_unused_tensor_is_refused(tmp_path):
    tensors = gpt2_tensors()
    tensors["score.weight"] = np.zeros(2, np.float32)
    path = tmp_path / "extra.safetensors"
    write_safetensors(tensors, path)
    r = compile_with(path, tmp_path / "out")
    refused(r)
    assert r.stderr.startswith("gpt2.fgpt:") or "`score.weight` in" in r.stderr
    assert "is read by no parameter" in r.stderr and "ignore" in r.stderr


def test_a_transposed_tensor_is_read_a_block_of_rows_at_a_time(tmp_path, monkeypatch):
    """nn.Linear's [out, in] goes into its transpose a few rows at a time: the same values,
    in float32 and bfloat16, and the same NaN and Inf counts as reading it whole."""
    import compiler.weights as weights
    from compiler.weights import Checkpoint, Imported, _transposed
    monkeypatch.setattr(weights, "_CONVERT_CHUNK", 8)  # 2 rows of 4 per block
    x = np.arange(28, dtype=np.float32).reshape(7, 4) - 10
    x[2, 1], x[6, 3], x[0, 0] = np.nan, np.inf, -np.inf
    bits = bfloat16_bits(x)  # these values are exact in bfloat16
    path = tmp_path / "w.safetensors"
    write_raw(path, {"f32": ("F32", x.shape, x.tobytes()),
                     "bf16": ("BF16", x.shape, bits.tobytes())})
    with Checkpoint(str(path)) as ckpt:
        for name in ("f32", "bf16"):
            out = Imported({})
            got = _transposed(ckpt, name, out)
            assert got.shape == (4, 7) and got.flags.c_contiguous
            np.testing.assert_array_equal(got, x.T)
            assert out.nonfinite == [(name, 1, 2)]
