"""`--weights` reads only what the spec uses, and refuses what is not a safetensors file.

A checkpoint holding a huge tensor the spec does not use (a sparse file: a few KB on disk)
compiles under an address-space limit far below that tensor's size; a FIFO, a device or a
folder given as the weights file is refused at once, naming the path and what it is; a
truncated or garbage file is a clear error; NaN and Inf in used tensors are counted and
named (`Imported.nonfinite`, `nonfinite_message`). Files written by fgc are read back by
the safetensors package itself.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from compiler.errors import FgcError
from compiler.pipeline import load
from compiler.weights import (
    Checkpoint,
    count_nonfinite,
    import_checkpoint,
    nonfinite_message,
    read_safetensors,
    write_safetensors,
)

ROOT = Path(__file__).resolve().parent.parent
SPEC = "specs/gpt2.fgpt"
TINY = {"L": 2, "H": 8, "A": 2, "V": 16, "n": 8}
TINY_ARGS = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]


def gpt2_tensors(seed: int = 0, scale: float = 0.02) -> dict[str, np.ndarray]:
    """A GPT-2 checkpoint of the TINY sizes, in the released files' names."""
    rng = np.random.default_rng(seed)
    L, H, V, n = TINY["L"], TINY["H"], TINY["V"], TINY["n"]

    def r(*shape):
        return rng.standard_normal(shape).astype(np.float32) * np.float32(scale)

    out = {"wte.weight": r(V, H), "wpe.weight": r(n, H), "ln_f.weight": r(H),
           "ln_f.bias": r(H)}
    for layer in range(L):
        p = f"h.{layer}."
        out.update({p + "ln_1.weight": r(H), p + "ln_1.bias": r(H),
                    p + "attn.c_attn.weight": r(H, 3 * H), p + "attn.c_attn.bias": r(3 * H),
                    p + "attn.c_proj.weight": r(H, H), p + "attn.c_proj.bias": r(H),
                    p + "ln_2.weight": r(H), p + "ln_2.bias": r(H),
                    p + "mlp.c_fc.weight": r(H, 4 * H), p + "mlp.c_fc.bias": r(4 * H),
                    p + "mlp.c_proj.weight": r(4 * H, H), p + "mlp.c_proj.bias": r(H)})
    return out


def write_with_extra(path: Path, tensors: dict[str, np.ndarray], extra_bytes: int) -> None:
    """`tensors`, then an unused float32 tensor of `extra_bytes` that is a hole in a sparse
    file: the file is that large, the disk holds a few KB."""
    header, offset = {}, 0
    for name, arr in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    header["extra.unused"] = {"dtype": "F32", "shape": [extra_bytes // 4],
                              "data_offsets": [offset, offset + extra_bytes]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        for arr in tensors.values():
            f.write(arr.tobytes())
        f.truncate(8 + len(text) + offset + extra_bytes)


def fgc_limited(*args: str, limit: int, timeout: int = 60) -> subprocess.CompletedProcess:
    """`fgc ARGS` in a process whose address space is capped at `limit` bytes."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return subprocess.run([sys.executable, "-m", "compiler.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=cap,
                          stdin=subprocess.DEVNULL)


def assert_refused(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


# ---------------------------------------------------------------- unused tensors


@pytest.mark.parametrize("target", ["torch", "onnx"])
def test_huge_unused_tensor_is_never_read(tmp_path, target):
    """6 GiB unused, 2 GB of address space: only the header and the used tensors are read
    (loading the whole file, or mapping it, fails under this limit)."""
    weights = tmp_path / "w.safetensors"
    write_with_extra(weights, gpt2_tensors(), 6 * 2**30)
    assert weights.stat().st_blocks * 512 < 2**20  # sparse: the hole takes no disk
    r = fgc_limited("compile", SPEC, "--target", target, *TINY_ARGS, "--weights",
                    str(weights), "-o", str(tmp_path / "out"), limit=2 * 10**9)
    # refused, naming it, without reading it: a tensor no parameter reads is an error
    assert r.returncode == 1, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert "`extra.unused` in" in r.stderr and "is read by no parameter" in r.stderr


def test_only_used_tensors_are_read(tmp_path, monkeypatch):
    weights = tmp_path / "w.safetensors"
    write_with_extra(weights, gpt2_tensors(), 2**20)
    read: list[str] = []
    original = Checkpoint.read
    monkeypatch.setattr(Checkpoint, "read", lambda self, name: read.append(name) or
                        original(self, name))
    spec = load(str(ROOT / SPEC))
    spec.model.checkpoint.ignore.append("extra.unused")  # a buffer the spec lists
    cfg = spec.configure(None, TINY)
    imported = import_checkpoint(cfg, spec.model.checkpoint, str(weights))
    assert "extra.unused" not in read and imported.ignored == ["extra.unused"]
    assert read == []  # streaming: the headers only, until a tensor is materialized
    with imported:
        imported.materialize()
    assert set(read) == set(gpt2_tensors())
    assert imported.nonfinite == []


def test_imported_values_match_the_file(tmp_path):
    """The lazy reader gives the same tensors as the safetensors package."""
    from safetensors.numpy import load_file, save_file
    tensors = gpt2_tensors()
    tensors["half"] = np.arange(12, dtype=np.float16).reshape(3, 4)
    tensors["ids"] = np.arange(5, dtype=np.int64)
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    ours, theirs = read_safetensors(str(path)), load_file(str(path))
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert ours[name].dtype == theirs[name].dtype
        np.testing.assert_array_equal(ours[name], theirs[name])


def test_bfloat16_is_read_as_float32(tmp_path):
    path = tmp_path / "bf16.safetensors"
    values = np.array([1.0, -2.5, 3.140625, 0.0], np.float32)
    bits = (values.view(np.uint32) >> 16).astype("<u2")
    header = json.dumps({"x": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}})
    text = header.encode() + b" " * (-len(header) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + bits.tobytes())
    np.testing.assert_array_equal(read_safetensors(str(path))["x"], values)


def test_written_file_is_read_by_safetensors(tmp_path):
    from safetensors import safe_open
    from safetensors.numpy import load_file
    tensors = {"b": np.arange(6, dtype=np.float32).reshape(2, 3),
               "a": np.ones((3,), np.float32), "empty": np.zeros((0, 4), np.float32)}
    path = tmp_path / "out.safetensors"
    write_safetensors(tensors, path)
    back = load_file(str(path))
    assert back.keys() == tensors.keys()
    for name, arr in tensors.items():
        np.testing.assert_array_equal(back[name], arr)
    with safe_open(str(path), framework="numpy") as f:
        assert sorted(f.keys()) == ["a", "b", "empty"]
    assert [p.name for p in tmp_path.iterdir()] == ["out.safetensors"]  # no temporary left
    os.chmod(tmp_path, 0o500)
    try:
        if not os.access(tmp_path, os.W_OK):
            with pytest.raises(FgcError, match="cannot write"):
                write_safetensors(tensors, tmp_path / "other.safetensors")
    finally:
        os.chmod(tmp_path, 0o700)


# ---------------------------------------------------------------- not a regular file


def test_fifo_is_refused_without_waiting(tmp_path):
    fifo = tmp_path / "w.safetensors"
    os.mkfifo(fifo)
    r = fgc_limited("compile", SPEC, "--target", "onnx", *TINY_ARGS, "--weights", str(fifo),
                    "-o", str(tmp_path / "out"), limit=4 * 10**9, timeout=30)
    assert_refused(r, str(fifo), "is a FIFO (named pipe), not a regular file")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_device_is_refused(tmp_path, device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    r = fgc_limited("compile", SPEC, "--target", "torch", *TINY_ARGS, "--weights", device,
                    "-o", str(tmp_path / "out"), limit=4 * 10**9, timeout=30)
    assert_refused(r, device, "character device, not a regular file")


def test_stdin_is_refused(tmp_path):
    """/dev/stdin from a pipe is a FIFO."""
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "compile", SPEC, "--target",
                        "torch", *TINY_ARGS, "--weights", "/dev/stdin", "-o",
                        str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
                       input="", timeout=30)
    assert_refused(r, "/dev/stdin", "not a regular file")


def test_folder_is_refused(tmp_path):
    with pytest.raises(FgcError, match="is a folder"):
        Checkpoint(str(tmp_path))


# ---------------------------------------------------------------- damaged files


def _damaged(tmp_path: Path, case: str) -> Path:
    good = tmp_path / "good.safetensors"
    from safetensors.numpy import save_file
    save_file(gpt2_tensors(), str(good))
    data = good.read_bytes()
    n = int.from_bytes(data[:8], "little")
    bad = tmp_path / f"{case}.safetensors"
    bad.write_bytes({
        "truncated-data": data[: len(data) - 100],
        "truncated-header": data[: 8 + n // 2],
        "garbage": bytes(range(256)) * 16,
        "short": b"\x01\x02\x03",
        "huge-header-length": (2**62).to_bytes(8, "little") + b"{}",
        "not-json": (8).to_bytes(8, "little") + b"not json",
        "bad-offsets": data[:8] + data[8: 8 + n].replace(b'"data_offsets":[0,',
                                                         b'"data_offsets":[4,', 1) + data[8 + n:],
        "bad-dtype": data.replace(b'"F32"', b'"Q99"', 1),
    }[case])
    return bad


DAMAGED = ["truncated-data", "truncated-header", "garbage", "short", "huge-header-length",
           "not-json", "bad-offsets", "bad-dtype"]


@pytest.mark.parametrize("case", DAMAGED)
def test_damaged_file_is_a_clear_error(tmp_path, case):
    bad = _damaged(tmp_path, case)
    with pytest.raises(FgcError, match="safetensors") as e:
        read_safetensors(str(bad))
    assert str(bad) in str(e.value)


@pytest.mark.parametrize("case", ["truncated-data", "garbage"])
def test_damaged_file_exits_1(tmp_path, case):
    bad = _damaged(tmp_path, case)
    r = fgc_limited("compile", SPEC, "--target", "onnx", *TINY_ARGS, "--weights", str(bad),
                    "-o", str(tmp_path / "out"), limit=4 * 10**9)
    assert_refused(r, str(bad), "not a readable safetensors file")


# ---------------------------------------------------------------- NaN and Inf


def test_nonfinite_tensors_are_named(tmp_path):
    from safetensors.numpy import save_file
    tensors = gpt2_tensors()
    tensors["h.0.attn.c_attn.weight"][0, :3] = np.nan
    tensors["wte.weight"][1, 1] = np.inf
    tensors["wte.weight"][2, 2] = -np.inf
    tensors["wte.weight"][3, 3] = np.nan
    path = tmp_path / "nan.safetensors"
    save_file(tensors, str(path))
    spec = load(str(ROOT / SPEC))
    cfg = spec.configure(None, TINY)
    with import_checkpoint(cfg, spec.model.checkpoint, str(path)) as imported:
        imported.materialize()  # each tensor is scanned as it is read
    # c_attn feeds three parameters (q, k, v); it is counted once, under its own name
    assert sorted(imported.nonfinite) == [("h.0.attn.c_attn.weight", 3, 0),
                                          ("wte.weight", 1, 2)]
    text = nonfinite_message(imported.nonfinite)
    assert text.startswith("2 checkpoint tensors hold NaN or Inf: ")
    assert "h.0.attn.c_attn.weight (3 NaN)" in text and "wte.weight (1 NaN, 2 Inf)" in text
    assert nonfinite_message([("a", 0, 1)], "w.safetensors") == \
        "1 checkpoint tensor in w.safetensors holds NaN or Inf: a (1 Inf)"
    many = nonfinite_message([(f"t{k}", 1, 0) for k in range(12)], limit=3)
    assert many.endswith("t2 (1 NaN), and 9 more")


def test_nonfinite_scan_is_chunked(monkeypatch):
    import compiler.weights as weights
    monkeypatch.setattr(weights, "_SCAN_CHUNK", 7)
    x = np.zeros((10, 10), np.float32)
    x[0, 0] = x[9, 9] = np.nan
    x[5, 5] = np.inf
    assert count_nonfinite(x) == (2, 1)
    assert count_nonfinite(np.zeros((0, 3), np.float32)) == (0, 0)

