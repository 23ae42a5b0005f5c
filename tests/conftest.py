"""Shared test helpers: run the CLI in-process or as a subprocess, and locate files."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent

# the parse cache of this run lives with the run, not in the user's ~/.cache
# the commands tests run print no progress, whether or not the suite runs in a CI job (a
# test asks for it where it is the subject)
os.environ.setdefault("FGC_PROGRESS", "0")
if "XDG_CACHE_HOME" not in os.environ:
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="fgc-test-cache-")
    atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)
SPECS = ROOT / "specs"

settings.register_profile("ci", derandomize=True, max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=30, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def fgc(*args: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `fgc` as a user would: a separate process, text out."""
    return subprocess.run([sys.executable, "-m", "compiler.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, input=input)


@pytest.fixture
def run_fgc():
    return fgc


def all_specs() -> list[Path]:
    return sorted(SPECS.rglob("*.fgpt"))


# the size every shipped spec is tried at, and what each needs besides (its hyperparameters
# without defaults, or defaults too large for a quick run)
TINY = {"L": 2, "H": 16, "A": 2, "V": 50, "n": 8}
_LLAMA = {"G": 1, "F": 24, "theta": 10000.0}
TINY_EXTRA = {
    "specs/formal/gpt3.fgpt": {"D": 5, "w": 3},
    # LSH: chunks of 2 (local: 4), two hash rounds, buckets [2, 2]; runs of 5 are padded
    "specs/reformer.fgpt": {"D": 8, "F": 24, "n1": 2, "n2": 4, "d1": 4, "c": 2,
                            "c^loc": 4, "N": 2, "k1": 1, "k2": 1},
    "specs/llama.fgpt": _LLAMA,
    "specs/mistral.fgpt": {**_LLAMA, "w": 3},
    "specs/qwen2.fgpt": _LLAMA,
    # Qwen3: YaRN over a context of 4 (factor 4), which the runs of 8 pass
    "specs/qwen3.fgpt": {**_LLAMA, "D": 6, "factor": 4.0, "n0": 4},
    # Qwen3-MoE: 3 experts, 2 chosen at each position
    "specs/qwen3_moe.fgpt": {**_LLAMA, "D": 6, "E": 3, "K": 2},
    "specs/granite.fgpt": _LLAMA,
    "specs/cohere.fgpt": _LLAMA,
    # OLMo 2: query and key norms over A * D = 12 features, not H
    "specs/olmo2.fgpt": {**_LLAMA, "D": 6},
    "specs/gemma.fgpt": {**_LLAMA, "D": 6},
    # Gemma 2: sliding and full layers, a window shorter than the run, scores over D_att != D
    "specs/gemma2.fgpt": {**_LLAMA, "D": 6, "w": 3, "D_att": 8},
    # Gemma 3: five sliding layers and a full one, a window shorter than the run
    "specs/gemma3.fgpt": {**_LLAMA, "L": 6, "D": 6, "w": 3, "D_att": 8},
    # Phi-3: multi-head, a window shorter than the run
    "specs/phi3.fgpt": {**_LLAMA, "G": 2, "w": 3},
    # Mixtral: 3 experts, 2 chosen at each position
    "specs/mixtral.fgpt": {**_LLAMA, "E": 3, "K": 2},
    # GPT-NeoX: half of each head of 8 turns (R = D/4 would be 2)
    "specs/gpt_neox.fgpt": {"F": 24, "R": 4},
}


def own_names(spec: str, folder: Path) -> Path:
    """specs/<spec>.fgpt without its checkpoint block, written into `folder`: --weights
    then reads the compiled module's own names (weights drawn by a test, not a released
    file's)."""
    import re
    text = (ROOT / "specs" / f"{spec}.fgpt").read_text()
    start = re.search(r"^  checkpoint \{", text, re.M).start()
    depth, end = 0, start
    for end in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0 and text[end] == "}":
            break
    path = folder / f"{spec}.fgpt"
    path.write_text(text[:start] + text[end + 1:])
    return path


def set_args(values: dict) -> list[str]:
    """`--set K=V` for each size, as a command line gives them."""
    return [x for k, v in values.items() for x in ("--set", f"{k}={v}")]


def tiny_sets(spec: str) -> dict:
    """The tiny configuration of a shipped spec (`specs/...`)."""
    return {**TINY, **TINY_EXTRA.get(spec, {})}


# ---------------------------------------------------------------- golden files

GOLDEN = ROOT / "tests" / "golden"


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite the files under tests/golden/ from fgc's current output "
                          "instead of comparing with them")


@pytest.fixture
def update_golden(request) -> bool:
    return bool(request.config.getoption("--update-golden"))


def peaked_weights(model, norm_gain: str = "weight") -> None:
    """Re-draw a reference model's weights larger than the libraries' std 0.02, which makes
    every output nearly uniform and a comparison blind: matrices N(0, 0.3), the LayerNorm
    gains (vectors whose name ends in `norm_gain`) near 1, other vectors N(0, 0.2)."""
    import torch
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
            elif name.endswith(norm_gain):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)


def unpadded(session, feeds: dict) -> dict:
    """`feeds` with the padding masks a graph takes (a spec's `Pad[n]`) and they lack: all
    ones (no padding), as runtime.Model feeds them: past + T wide where the feeds hold a
    past."""
    import json

    import numpy as np
    meta = session.get_modelmeta().custom_metadata_map.get("fgc.signature")
    if meta is None:
        return feeds
    sig = json.loads(meta)
    out = dict(feeds)
    for spec in sig["inputs"]:
        if not spec.get("pad") or spec["name"] in out:
            continue
        length = spec["dims"][-1]
        along = next(i["name"] for i in sig["inputs"] if i["name"] in feeds and
                     not i.get("pad") and i["dims"][-1] == length)
        batch, width = np.asarray(feeds[along]).shape[:2]
        inc = sig.get("incremental")
        if inc and inc["length"] == length:
            past = next((np.asarray(v) for k, v in feeds.items()
                         if k.startswith(("past", "past_key_values"))), None)
            if past is not None:
                dims = inc["cache"][0]["dims"]
                width += past.shape[dims.index(inc["past"])]
        out[spec["name"]] = np.ones((batch, width), np.int64)
    return out
