"""Compiling streams the weights: a checkpoint is read, transformed and written one tensor
at a time, so a compile's memory is about its largest tensor, not the model's size."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from compile_large import llama_tensors, write_folder  # noqa: E402

# 1.2 GB in float32 (a 0.6 GB bfloat16 folder of 3 shards); its largest tensor 125 MiB
SIZES = {"L": 16, "H": 1024, "A": 8, "G": 4, "F": 4096, "V": 32000}
MiB = 2**20


def peak_rss(args: list[str]) -> int:
    """The peak resident bytes of `fgc ARGS` as its own process (os.wait4: that child's
    own maximum), after it exits 0."""
    p = subprocess.Popen([sys.executable, "-m", "compiler.cli", *args], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)  # the pipes hold a few lines at most
    err = p.stderr.read()
    assert os.waitstatus_to_exitcode(status) == 0, err.decode()[-3000:]
    return usage.ru_maxrss * 1024


def sets(sizes: dict) -> list[str]:
    return [a for k, v in sizes.items() for a in ("--set", f"{k}={v}")] + \
        ["--set", "n=8192", "--set", "theta=500000.0"]  # as the folder's config.json says


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama") / "model"
    write_folder(path, SIZES, shard=250 * 10**6)
    return path


@pytest.mark.parametrize("target", ["onnx", "torch"])
def test_peak_memory_is_about_the_largest_tensor(folder, tmp_path, target):
    tensors = llama_tensors(**SIZES)
    model = 4 * sum(math.prod(s) for _, s in tensors)
    largest = 4 * max(math.prod(s) for _, s in tensors)
    tiny = {"L": 1, "H": 64, "A": 4, "G": 2, "F": 128, "V": 256}
    base = peak_rss(["compile", "specs/llama.fgpt", *sets(tiny), "--target", target,
                     "-o", str(tmp_path / "tiny")])
    peak = peak_rss(["compile", "specs/llama.fgpt", *sets(SIZES), "--weights", str(folder),
                     "--target", target, "-o", str(tmp_path / "out")])
    written = sum(f.stat().st_size for f in (tmp_path / "out").iterdir())
    assert written > model  # every weight was written, in float32
    # a whole-model compile would hold the model (1.2 GB) at least once more
    assert peak - base < largest + 256 * MiB, \
        f"peak {peak / MiB:.0f} MiB, tiny {base / MiB:.0f} MiB, largest {largest / MiB:.0f} MiB"
    assert peak - base < model / 3


def test_streamed_weights_are_the_files(folder, tmp_path):
    """Spot check of the values: the float32 output holds the folder's bfloat16 bits."""
    from compiler.weights import Checkpoint
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "compile", "specs/llama.fgpt",
                        *sets({**SIZES, "L": 2}), "--weights", str(folder), "--target",
                        "torch", "-o", str(tmp_path / "out")], cwd=ROOT, capture_output=True,
                       text=True)
    # two layers of a sixteen-layer folder: refused, the others are unused
    assert r.returncode == 1 and "unused" in r.stderr
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "compile", "specs/llama.fgpt",
                        *sets(SIZES), "--weights", str(folder), "--target", "torch",
                        "-o", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    ours = Checkpoint(str(tmp_path / "out" / "weights.safetensors"))
    with ours:
        gate = ours.read("layers.3.mlp.W_gate")
    shard = next(folder.glob("model-00001-*.safetensors"))
    with Checkpoint(str(shard)) as theirs:
        name = "model.layers.3.mlp.gate_proj.weight"
        want = theirs.read(name) if name in theirs.tensors else None
    if want is None:
        pytest.skip("layer 3's gate is in another shard")
    np.testing.assert_array_equal(gate, want.T)
