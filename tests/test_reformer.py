"""Released Reformer (specs/reformer.fgpt) against transformers' ReformerModelWithLMHead.

A randomly initialised ReformerModelWithLMHead with a fixed `hash_seed` is saved under its own
tensor names, compiled with `--weights` to PyTorch and to ONNX, and run on the same tokens.
Its random rotations are the spec's input: transformers draws them in every LSH layer with
`torch.randn((A, D, N, k))` right after `torch.manual_seed(hash_seed)`, so the test makes the
same draw and feeds it, one row per head. Probabilities agree to 1e-5 (float32) for lengths
that run LSH attention chunk by chunk, that transformers pads to a multiple of the chunk
lengths, and that fit in one chunk. The released model adds one output bias, `lm_head.bias`,
which transformers 4 also saved as its tied copy `lm_head.decoder.bias`. transformers 5.0-5.23
keep `lm_head.bias` but no longer add it; 5.24 adds a decoder bias of its own, untied. The
reference here is the released model's: the decoder's bias set to `lm_head.bias` where there is
one, and that bias added where there is none. The counts of both presets equal the class's
parameters, less that copy.
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

SPEC = str(ROOT / "specs" / "reformer.fgpt")
TOL = 1e-5


@dataclass(frozen=True)
class Case:
    L: int
    H: int
    A: int
    D: int
    F: int
    V: int
    n1: int
    n2: int
    d1: int
    c: int  # LSH chunk
    c_loc: int  # local chunk
    N: int  # hash rounds
    buckets: int | tuple[int, int]
    lengths: tuple[int, ...]  # token counts run through one compiled model
    B: int

    @property
    def id(self) -> str:
        return (f"L{self.L}-A{self.A}-N{self.N}-b{self.buckets}-c{self.c}-{self.c_loc}"
                f"-B{self.B}".replace(" ", ""))

    @property
    def k(self) -> tuple[int, int]:
        b = self.buckets
        return (b // 2, 0) if isinstance(b, int) else (b[0] // 2, b[1] // 2)

    def sets(self) -> list[str]:
        values = {"L": self.L, "H": self.H, "A": self.A, "D": self.D, "F": self.F,
                  "V": self.V, "n": self.n1 * self.n2, "n1": self.n1, "n2": self.n2,
                  "d1": self.d1, "c": self.c, "c^loc": self.c_loc, "N": self.N,
                  "k1": self.k[0], "k2": self.k[1]}
        return [a for k, v in values.items() for a in ("--set", f"{k}={v}")]


CASES = [
    # 4 buckets, two rounds; 16 tokens: four chunks a round; 5: padded to 8; 3: one chunk
    Case(L=2, H=32, A=2, D=8, F=40, V=30, n1=4, n2=4, d1=8, c=4, c_loc=4, N=2, buckets=4,
         lengths=(16, 5, 3), B=2),
    # buckets factorised [2, 4], three rounds, local chunks shorter than LSH chunks (padded to
    # multiples of 4); 13 tokens padded to 16, 2 fit in one chunk
    Case(L=4, H=24, A=3, D=6, F=36, V=40, n1=4, n2=4, d1=6, c=4, c_loc=2, N=3,
         buckets=(2, 4), lengths=(13, 8, 2), B=3),
]
SEED = 5  # hash_seed


def hf_model(case: Case, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.ReformerConfig(
        is_decoder=True, attn_layers=["local" if l % 2 == 0 else "lsh" for l in range(case.L)],
        hidden_size=case.H, num_attention_heads=case.A, attention_head_size=case.D,
        feed_forward_size=case.F, vocab_size=case.V, axial_pos_shape=(case.n1, case.n2),
        axial_pos_embds_dim=(case.d1, case.H - case.d1),
        max_position_embeddings=case.n1 * case.n2, lsh_attn_chunk_length=case.c,
        local_attn_chunk_length=case.c_loc, num_hashes=case.N,
        num_buckets=case.buckets if isinstance(case.buckets, int) else list(case.buckets),
        hash_seed=SEED)
    model = transformers.ReformerModelWithLMHead(config).eval()
    with torch.no_grad():  # std 0.02 would make every output nearly uniform
        for p in model.parameters():
            p.normal_(0.0, 0.3) if p.dim() >= 2 else p.normal_(0.5, 0.3)
        if model.lm_head.decoder.bias is not None:  # the released model's tied copy
            model.lm_head.decoder.bias.copy_(model.lm_head.bias)
    return model


def rotations(case: Case, batch: int, seed: int = SEED) -> torch.Tensor:
    """transformers' draw in _hash_vectors, one row per head, for every sequence."""
    torch.manual_seed(seed)
    rot = torch.randn((case.A, case.D, case.N, sum(case.k)))
    return rot.reshape(case.A, -1).expand(batch, -1, -1).contiguous()


def tokens(case: Case, T: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, case.V, (case.B, T), generator=torch.Generator().manual_seed(seed))


def hf_probs(model, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(x).logits
        if model.lm_head.decoder.bias is None:  # transformers 5.0-5.23 leave the bias out
            logits = logits + model.lm_head.bias
    return torch.softmax(logits, dim=-1)


def save_checkpoint(model, path) -> None:
    state = {k: v.clone().contiguous() for k, v in model.state_dict().items()}
    safetensors_torch.save_file(state, str(path))


def compile_torch(case: Case, tmp_path, model):
    save_checkpoint(model, tmp_path / "hf.safetensors")
    r = fgc("compile", SPEC, "--target", "torch", *case.sets(),
            "--weights", str(tmp_path / "hf.safetensors"), "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    compiled = import_model(tmp_path / "out" / "model.py").build().eval()
    compiled.load_state_dict(safetensors_torch.load_file(tmp_path / "out" / "weights.safetensors"))
    return compiled, r


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_torch_matches_reformer_model_with_lm_head(case, tmp_path):
    model = hf_model(case)
    compiled, _ = compile_torch(case, tmp_path, model)
    rot = rotations(case, case.B)
    for T in case.lengths:
        x = tokens(case, T)
        with torch.no_grad():
            ours = compiled(x, rot)
        ref = hf_probs(model, x)
        assert ours.shape == ref.shape == (case.B, T, case.V)
        assert torch.isfinite(ours).all()
        assert (ours - ref).abs().max().item() <= TOL, f"T={T}"


def test_onnx_matches_reformer_model_with_lm_head(tmp_path):
    case = CASES[1]
    model = hf_model(case, seed=3)
    save_checkpoint(model, tmp_path / "hf.safetensors")
    r = fgc("compile", SPEC, "--target", "onnx", *case.sets(),
            "--weights", str(tmp_path / "hf.safetensors"), "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    session = ort.InferenceSession(str(tmp_path / "out" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["x", "Rot"]
    rot = rotations(case, 2)
    for T in (13, 2):
        x = tokens(case, T, seed=4)[:2]
        probs = session.run(["probs"], {"x": x.numpy(), "Rot": rot.numpy()})[0]
        ref = hf_probs(model, x).numpy()
        assert probs.shape == ref.shape
        assert np.abs(probs - ref).max() <= TOL, f"T={T}"


def test_comparisons_are_not_blind(tmp_path):
    """Peaked probabilities, and rotations that matter: other rotations, or the output
    without its bias, give answers far outside the tolerance."""
    case = CASES[0]
    model = hf_model(case)
    compiled, _ = compile_torch(case, tmp_path, model)
    x = tokens(case, 16)
    with torch.no_grad():
        ours = compiled(x, rotations(case, case.B))
        other = compiled(x, rotations(case, case.B, seed=SEED + 1))
    assert ours.max().item() > 5.0 / case.V
    assert (ours - other).abs().max().item() > 100 * TOL
    with torch.no_grad():
        logits = model(x).logits
        if model.lm_head.decoder.bias is not None:
            logits = logits - model.lm_head.decoder.bias
        plain = torch.softmax(logits, dim=-1)
    assert (ours - plain).abs().max().item() > 100 * TOL


@pytest.mark.parametrize("preset,config", [
    ("default", {}),
    ("crime", {"num_attention_heads": 2, "axial_pos_shape": (512, 1024),
               "max_position_embeddings": 524288, "num_buckets": [64, 128]}),
])
def test_counts_equal_reformer_model_with_lm_head(preset, config):
    """`default` is ReformerConfig()'s sizes; `crime` google/reformer-crime-and-punishment's."""
    with torch.device("meta"):
        model = transformers.ReformerModelWithLMHead(
            transformers.ReformerConfig(is_decoder=True, **config))
    expected = sum(p.numel() for p in model.parameters())
    if model.lm_head.decoder.bias is not None:  # a copy of lm_head.bias in released checkpoints
        expected -= model.lm_head.decoder.bias.numel()
    r = fgc("params", SPEC, "--preset", preset, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total"] == expected


def test_checkpoint_names_every_tensor(tmp_path):
    """Every ReformerModelWithLMHead tensor is used: nothing is reported extra, and the only
    tensor not read is the output bias's tied copy, where the class has one."""
    model = hf_model(CASES[1])
    _, r = compile_torch(CASES[1], tmp_path, model)
    assert "were not used" not in r.stdout + r.stderr
    if model.lm_head.decoder.bias is None:
        assert "ignored" not in r.stdout
    else:
        assert "ignored 1 checkpoint tensors" in r.stdout and "lm_head.decoder.bias" in r.stdout


def test_an_untied_decoder_bias_is_refused(tmp_path):
    """A checkpoint whose `lm_head.decoder.bias` is its own tensor, not the copy of
    `lm_head.bias` the released model holds, is refused with both names, not half-read."""
    state = {k: v.clone().contiguous() for k, v in hf_model(CASES[0]).state_dict().items()}
    state["lm_head.decoder.bias"] = state["lm_head.bias"] + 1.0
    safetensors_torch.save_file(state, str(tmp_path / "hf.safetensors"))
    r = fgc("compile", SPEC, "--target", "torch", *CASES[0].sets(),
            "--weights", str(tmp_path / "hf.safetensors"), "-o", str(tmp_path / "out"))
    assert r.returncode == 1
    assert "`lm_head.decoder.bias`" in r.stderr and "not a copy of `lm_head.bias`" in r.stderr
    assert not (tmp_path / "out").exists()
