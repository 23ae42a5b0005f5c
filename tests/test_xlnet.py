"""Released XLNet (specs/xlnet.fgpt) against transformers' XLNetLMHeadModel.

A randomly initialised XLNetLMHeadModel is saved under its own tensor names, compiled with
`--weights` to PyTorch and to ONNX, and run on the same tokens, segments, factorization order
and target mapping: probabilities agree to 1e-5 (float32). The order z becomes the model's
perm_mask (position i may not see j when j comes at or after i in z), which is how the released
code takes it. The counts of both presets equal XLNetLMHeadModel's unique parameters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import ROOT, fgc
from test_torch_backend import import_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")
ort = pytest.importorskip("onnxruntime")

SPEC = str(ROOT / "specs" / "xlnet.fgpt")
TOL = 1e-5


@dataclass(frozen=True)
class Case:
    L: int
    H: int
    A: int
    F: int
    V: int
    n: int  # longest sequence compiled for
    T: int  # tokens in this run
    P: int  # predictions (rows of the target mapping)
    B: int
    first: bool = False  # predict the first position of the order, which sees nothing

    @property
    def id(self) -> str:
        return (f"L{self.L}-H{self.H}-A{self.A}-D{self.H // self.A}-T{self.T}-n{self.n}"
                f"-P{self.P}-B{self.B}" + ("-first" if self.first else ""))

    def sets(self) -> list[str]:
        values = {"L": self.L, "H": self.H, "A": self.A, "F": self.F, "V": self.V,
                  "n": self.n, "p": max(self.P, 1)}
        return [a for k, v in values.items() for a in ("--set", f"{k}={v}")]


CASES = [
    Case(L=2, H=24, A=3, F=40, V=50, n=9, T=7, P=3, B=2),  # A = 3, D = 8, T < n, P < T
    Case(L=1, H=32, A=2, F=64, V=61, n=6, T=6, P=6, B=3, first=True),  # D = 16, every row
    Case(L=3, H=20, A=5, F=36, V=40, n=12, T=10, P=4, B=2, first=True),  # A = 5, D = 4
]


def hf_model(case: Case, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.XLNetConfig(vocab_size=case.V, d_model=case.H, n_layer=case.L,
                                      n_head=case.A, d_inner=case.F, dropout=0.0)
    model = transformers.XLNetLMHeadModel(config).eval()
    with torch.no_grad():  # std 0.02 would make every output nearly uniform
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def inputs(case: Case, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, case.V, (case.B, case.T), generator=g)
    t = torch.randint(0, 3, (case.B, case.T), generator=g)
    z = torch.stack([torch.randperm(case.T, generator=g) for _ in range(case.B)])
    targets = []
    for b in range(case.B):
        order = torch.randperm(case.T, generator=g)
        if case.first:  # the first position of z among the targets
            order = torch.cat([z[b, :1], order[order != z[b, 0]]])
        targets.append(order[: case.P])
    TM = torch.nn.functional.one_hot(torch.stack(targets), case.T).float()
    return {"x": x, "t": t, "z": z, "TM": TM}


def hf_probs(model, feed: dict) -> torch.Tensor:
    rank = torch.argsort(feed["z"], dim=-1)  # rank[b, i]: when position i comes in z
    perm_mask = (rank[:, None, :] >= rank[:, :, None]).float()  # 1: i may not see j
    with torch.no_grad():
        out = model(input_ids=feed["x"], token_type_ids=feed["t"], perm_mask=perm_mask,
                    target_mapping=feed["TM"])
    return torch.softmax(out.logits, dim=-1)


def save_checkpoint(model, path, prefix: bool = True) -> None:
    state = {k: v.clone().contiguous() for k, v in model.state_dict().items()}  # untied copies
    if not prefix:
        state = {k.removeprefix("transformer."): v for k, v in state.items()}
    safetensors_torch.save_file(state, str(path))



@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_torch_matches_xlnet_lm_head_model(case, tmp_path):
    model = hf_model(case)
    save_checkpoint(model, tmp_path / "hf.safetensors")
    r = fgc("compile", SPEC, "--target", "torch", *case.sets(),
            "--weights", str(tmp_path / "hf.safetensors"), "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    compiled = import_model(tmp_path / "out" / "model.py").build().eval()
    compiled.load_state_dict(safetensors_torch.load_file(tmp_path / "out" / "weights.safetensors"))
    feed = inputs(case)
    with torch.no_grad():
        ours = compiled(feed["x"], feed["t"], feed["z"], feed["TM"])
    ref = hf_probs(model, feed)
    assert ours.shape == ref.shape == (case.B, case.P, case.V)
    assert torch.isfinite(ours).all()
    assert (ours - ref).abs().max().item() <= TOL


def test_onnx_matches_xlnet_lm_head_model(tmp_path):
    case = CASES[2]
    model = hf_model(case, seed=3)
    save_checkpoint(model, tmp_path / "hf.safetensors", prefix=False)  # names without prefix
    r = fgc("compile", SPEC, "--target", "onnx", *case.sets(),
            "--weights", str(tmp_path / "hf.safetensors"), "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    session = ort.InferenceSession(str(tmp_path / "out" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    feed = inputs(case, seed=4)
    names = [i.name for i in session.get_inputs()]
    assert names == ["x", "t", "z", "TM", "attention_mask"]
    ones = {"attention_mask": np.ones(feed["x"].shape, np.int64)}  # no padding
    probs = session.run(["XLNet"], {**{k: feed[k].numpy() for k in names[:-1]}, **ones})[0]
    ref = hf_probs(model, feed).numpy()
    assert probs.shape == ref.shape
    assert np.abs(probs - ref).max() <= TOL


@pytest.mark.parametrize("preset,L,H,A", [("base", 12, 768, 12), ("large", 24, 1024, 16)])
def test_counts_equal_xlnet_lm_head_model(preset, L, H, A):
    config = transformers.XLNetConfig(n_layer=L, d_model=H, n_head=A, d_inner=4 * H)
    with torch.device("meta"):
        model = transformers.XLNetLMHeadModel(config)
    # parameters() yields the tied lm_loss.weight / word_embedding.weight once
    expected = sum(p.numel() for p in model.parameters())
    r = fgc("params", SPEC, "--preset", preset, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total"] == expected


def test_checkpoint_names_every_tensor(tmp_path):
    """Every XLNetLMHeadModel tensor is used or declared tied: nothing is reported extra."""
    case = CASES[0]
    save_checkpoint(hf_model(case), tmp_path / "hf.safetensors")
    r = fgc("compile", SPEC, "--target", "torch", *case.sets(),
            "--weights", str(tmp_path / "hf.safetensors"), "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "were not used" not in r.stdout + r.stderr
    assert "ignored 1 checkpoint tensors" in r.stdout  # lm_loss.weight, tied to W_e
