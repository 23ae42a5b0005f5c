"""examples/train_tiny.py: the compiled formal GPT-2 learns (a short run of the example)."""

from __future__ import annotations

import importlib.util
import math
import time

import pytest
from conftest import ROOT

pytest.importorskip("torch")
pytest.importorskip("safetensors")

EXAMPLE = ROOT / "examples" / "train_tiny.py"


def _example():
    spec = importlib.util.spec_from_file_location("train_tiny", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_loss_falls(tmp_path):
    start = time.perf_counter()
    lines: list[str] = []
    losses = _example().train(steps=40, seed=0, batch=8, out=tmp_path, log=lines.append)
    assert len(losses) == 40 and all(math.isfinite(x) for x in losses)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert losses[0] > 5.0  # about ln(256): the untrained model spreads over all bytes
    assert last < first - 1.0, (first, last, lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["losses.json", "model.py",
                                                          "weights.safetensors"]
    assert any(line.startswith("sample: ") for line in lines)
    assert time.perf_counter() - start < 60  # a short run; about 2 s on a laptop CPU


def test_bundled_arithmetic_text_is_the_generator_output():
    spec = importlib.util.spec_from_file_location(
        "make_arithmetic", ROOT / "examples" / "data" / "make_arithmetic.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    bundled = (ROOT / "examples" / "data" / "arithmetic.txt").read_text(encoding="ascii")
    assert bundled == "\n".join(module.sentences()) + "\n"
