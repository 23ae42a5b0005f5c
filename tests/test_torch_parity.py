"""The released specs, compiled to PyTorch with real checkpoint tensors, against transformers.

For each released spec (gpt1, gpt2, bert, roberta) and a few tiny configurations -- heads that
are not a power of two, head dimensions other than 64, sequences shorter than n, batches -- a
randomly initialised transformers model is saved with safetensors under its own tensor names,
compiled with `fgc compile --target torch --weights`, loaded, and both are run on the same
tokens: the probabilities must agree to 1e-5 (float32). Then the importer's contract: names
without the `transformer.`/`bert.`/`roberta.` prefix work too, a missing or mis-shaped tensor is
exit 1 naming it, and a tensor nobody asked for is reported without failing the compile.
"""

from __future__ import annotations

import importlib.util
import itertools
from dataclasses import dataclass

import pytest
from conftest import fgc, peaked_weights

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TOL = 1e-5


@dataclass(frozen=True)
class Case:
    spec: str  # specs/<spec>.fgpt
    L: int
    H: int
    A: int
    V: int
    n: int
    T: int  # tokens in this run (T <= n)
    B: int  # batch
    F: int | None = None  # None: the spec's default 4H
    eps: float | None = None  # None: the spec's default

    @property
    def id(self) -> str:
        extra = (f"-F{self.F}" if self.F else "") + (f"-eps{self.eps:g}" if self.eps else "")
        return (f"{self.spec}-L{self.L}-H{self.H}-A{self.A}-D{self.H // self.A}-n{self.n}"
                f"-T{self.T}-B{self.B}{extra}")

    def sets(self) -> list[str]:
        values = {"L": self.L, "H": self.H, "A": self.A, "V": self.V, "n": self.n}
        if self.F is not None:
            values["F"] = self.F
        if self.eps is not None:
            values["eps"] = repr(self.eps)
        return list(itertools.chain.from_iterable(("--set", f"{k}={v}") for k, v in values.items()))


CASES = [
    # A = 3 (D = 16), T < n, batch 3
    Case("gpt1", L=2, H=48, A=3, V=97, n=16, T=11, B=3),
    # D = 8, T = n
    Case("gpt1", L=1, H=16, A=2, V=50, n=8, T=8, B=2),
    # A = 5, D = 8, three layers
    Case("gpt1", L=3, H=40, A=5, V=61, n=12, T=5, B=4),
    Case("gpt2", L=2, H=48, A=3, V=97, n=16, T=11, B=3),
    Case("gpt2", L=1, H=16, A=2, V=50, n=8, T=8, B=2),
    # F != 4H (n_inner)
    Case("gpt2", L=3, H=24, A=3, V=61, n=12, T=5, B=4, F=40),
    Case("bert", L=2, H=48, A=3, V=97, n=16, T=11, B=3, F=96, eps=1e-12),
    Case("bert", L=1, H=16, A=2, V=50, n=8, T=8, B=2, eps=1e-5),
    Case("bert", L=3, H=40, A=5, V=61, n=12, T=5, B=4, F=56, eps=1e-12),
    Case("roberta", L=2, H=48, A=3, V=97, n=16, T=11, B=3, F=96, eps=1e-5),
    Case("roberta", L=1, H=16, A=2, V=50, n=8, T=8, B=2, eps=1e-12),
    Case("roberta", L=3, H=40, A=5, V=61, n=12, T=5, B=4, F=56, eps=1e-5),
]

PREFIX = {"gpt1": "transformer.", "gpt2": "transformer.", "bert": "bert.", "roberta": "roberta."}
FIRST = {spec: next(c for c in CASES if c.spec == spec) for spec in PREFIX}


# ---------------------------------------------------------------- the reference models


def _hf_model(case: Case):
    """A randomly initialised transformers model for `case`, dropout off, in eval mode."""
    c, F = case, case.F or 4 * case.H
    off = dict(attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    if c.spec == "gpt1":
        assert c.F is None  # OpenAIGPT's MLP is always 4H
        cfg = transformers.OpenAIGPTConfig(n_layer=c.L, n_embd=c.H, n_head=c.A, vocab_size=c.V,
                                           n_positions=c.n, afn="gelu",
                                           layer_norm_epsilon=c.eps or 1e-5, **off)
        cls = transformers.OpenAIGPTLMHeadModel
    elif c.spec == "gpt2":
        cfg = transformers.GPT2Config(n_layer=c.L, n_embd=c.H, n_head=c.A, vocab_size=c.V,
                                      n_positions=c.n, n_inner=c.F, bos_token_id=c.V - 1,
                                      eos_token_id=c.V - 1, layer_norm_epsilon=c.eps or 1e-5,
                                      **off)
        cls = transformers.GPT2LMHeadModel
    else:
        roberta = c.spec == "roberta"
        cfg = (transformers.RobertaConfig if roberta else transformers.BertConfig)(
            num_hidden_layers=c.L, hidden_size=c.H, num_attention_heads=c.A,
            intermediate_size=F, vocab_size=c.V, hidden_act="gelu",
            max_position_embeddings=c.n + 2 if roberta else c.n,
            type_vocab_size=1 if roberta else 2, pad_token_id=1 if roberta else 0,
            layer_norm_eps=c.eps or (1e-5 if roberta else 1e-12),
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        cls = transformers.RobertaForMaskedLM if roberta else transformers.BertForMaskedLM
    torch.manual_seed(sum(map(ord, c.id)))
    model = cls(cfg).eval()
    peaked_weights(model)
    return model


def _state_dict(model, strip: str | None = None) -> dict:
    """The model's tensors under its own names; tied tensors become separate copies."""
    out = {}
    for k, v in model.state_dict().items():
        if strip and k.startswith(strip):
            k = k[len(strip):]
        out[k] = v.detach().clone().contiguous()
    return out


def _inputs(case: Case) -> dict:
    g = torch.Generator().manual_seed(len(case.id))
    x = torch.randint(0, case.V, (case.B, case.T), generator=g)
    if case.spec in ("gpt1", "gpt2"):
        return {"x": x}
    if case.spec == "roberta":
        x[x == 1] = 0  # no padding ids: position ids are then 2..T+1, the spec's W_p[3..n+2, :]
    if case.spec == "bert":
        t = torch.randint(0, 2, (case.B, case.T), generator=g)
        return {"x": x, "t": t}
    return {"x": x}


def _reference(hf, case: Case, inputs: dict):
    with torch.no_grad():
        if case.spec in ("gpt1", "gpt2"):
            return torch.softmax(hf(input_ids=inputs["x"]).logits, -1)
        kw = {"token_type_ids": inputs["t"]} if case.spec == "bert" else {}
        return torch.softmax(hf(input_ids=inputs["x"], **kw).logits, -1)  # every position


def _load(out_dir, tag: str):
    spec = importlib.util.spec_from_file_location(f"fgc_parity_{tag}", out_dir / "model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.build().eval()
    model.load_state_dict(safetensors_torch.load_file(str(out_dir / "weights.safetensors")))
    return model


def _compile(case: Case, weights, out_dir):
    return fgc("compile", f"specs/{case.spec}.fgpt", "--target", "torch", *case.sets(),
               "--weights", str(weights), "-o", str(out_dir))


def _max_diff(model, hf, case: Case) -> float:
    inputs = _inputs(case)
    with torch.no_grad():
        ours = model(**inputs)
    ref = _reference(hf, case, inputs)
    assert ours.shape == ref.shape
    # the check is only worth something if the probabilities are far from uniform
    assert ref.max().item() > 3.0 / case.V
    return (ours - ref).abs().max().item()


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def hf_models():
    cache: dict[Case, object] = {}

    def get(case: Case):
        if case not in cache:
            cache[case] = _hf_model(case)
        return cache[case]
    return get


@pytest.fixture(scope="module", params=CASES, ids=[c.id for c in CASES])
def compiled(request, hf_models, tmp_path_factory):
    """One case compiled once: (case, transformers model, compiled model, CLI result)."""
    case = request.param
    hf = hf_models(case)
    work = tmp_path_factory.mktemp(case.id)
    weights = work / "hf.safetensors"
    safetensors_torch.save_file(_state_dict(hf), str(weights))
    r = _compile(case, weights, work / "out")
    assert r.returncode == 0, r.stderr
    return case, hf, _load(work / "out", case.id.replace("-", "_").replace(".", "_")), r


# ---------------------------------------------------------------- parity


def test_probabilities_match_transformers(compiled):
    case, hf, model, _ = compiled
    diff = _max_diff(model, hf, case)
    print(f"{case.id}: max |p_fgc - p_hf| = {diff:.3g}")
    assert diff <= TOL


def test_every_checkpoint_tensor_is_used_or_ignored(compiled):
    # the whole state dict of the transformers class is accounted for: no "not used" note
    _, _, _, r = compiled
    assert "not used" not in r.stderr, r.stderr


@pytest.mark.parametrize("spec", list(PREFIX))
def test_names_without_prefix(spec, hf_models, tmp_path):
    case = FIRST[spec]
    hf = hf_models(case)
    sd = _state_dict(hf, strip=PREFIX[spec])
    assert not any(k.startswith(PREFIX[spec]) for k in sd)
    safetensors_torch.save_file(sd, str(tmp_path / "bare.safetensors"))
    r = _compile(case, tmp_path / "bare.safetensors", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert "not used" not in r.stderr, r.stderr
    diff = _max_diff(_load(tmp_path / "out", f"bare_{spec}"), hf, case)
    print(f"{case.id} (no prefix): max |p_fgc - p_hf| = {diff:.3g}")
    assert diff <= TOL


@pytest.mark.parametrize("spec", list(PREFIX))
def test_layer_norm_eps_override(spec, hf_models, tmp_path):
    # a large eps, so that using the spec's default instead (1e-5 / 1e-12) shows
    case = Case(spec, L=2, H=24, A=3, V=61, n=10, T=6, B=2, eps=0.1)
    hf = hf_models(case)
    safetensors_torch.save_file(_state_dict(hf), str(tmp_path / "w.safetensors"))
    r = _compile(case, tmp_path / "w.safetensors", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    diff = _max_diff(_load(tmp_path / "out", f"eps_{spec}"), hf, case)
    print(f"{case.id}: max |p_fgc - p_hf| = {diff:.3g}")
    assert diff <= TOL


# ---------------------------------------------------------------- the importer's errors

# one tensor per spec inside the layers (checkpoint layer 1 = the second layer)
VICTIM = {
    "gpt1": "transformer.h.1.mlp.c_fc.weight",
    "gpt2": "transformer.h.1.attn.c_attn.weight",
    "bert": "bert.encoder.layer.1.attention.self.key.weight",
    "roberta": "roberta.encoder.layer.1.intermediate.dense.weight",
}


def _bare(name: str) -> str:
    return next(name[len(p):] for p in PREFIX.values() if name.startswith(p))


@pytest.mark.parametrize("spec", list(PREFIX))
def test_missing_tensor_is_an_error_naming_it(spec, hf_models, tmp_path):
    case = FIRST[spec]
    sd = _state_dict(hf_models(case))
    del sd[VICTIM[spec]]
    safetensors_torch.save_file(sd, str(tmp_path / "w.safetensors"))
    r = _compile(case, tmp_path / "w.safetensors", tmp_path / "out")
    assert r.returncode == 1, r.stdout + r.stderr
    assert _bare(VICTIM[spec]) in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out" / "weights.safetensors").exists()


@pytest.mark.parametrize("spec", list(PREFIX))
def test_misshaped_tensor_is_an_error_naming_it(spec, hf_models, tmp_path):
    case = FIRST[spec]
    sd = _state_dict(hf_models(case))
    good = sd[VICTIM[spec]]
    sd[VICTIM[spec]] = torch.zeros(good.shape[0] + 1, good.shape[1])
    safetensors_torch.save_file(sd, str(tmp_path / "w.safetensors"))
    r = _compile(case, tmp_path / "w.safetensors", tmp_path / "out")
    assert r.returncode == 1, r.stdout + r.stderr
    assert _bare(VICTIM[spec]) in r.stderr
    assert str(good.shape[0] + 1) in r.stderr  # the size it has
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("spec", list(PREFIX))
def test_unknown_tensor_is_refused(spec, hf_models, tmp_path):
    """A tensor no parameter reads (an adapter, another head) means the file is another
    model's: refused, naming it, with nothing written."""
    case = FIRST[spec]
    hf = hf_models(case)
    sd = _state_dict(hf)
    extra = PREFIX[spec] + "surprise.adapter.weight"
    sd[extra] = torch.ones(3, 2)
    safetensors_torch.save_file(sd, str(tmp_path / "w.safetensors"))
    r = _compile(case, tmp_path / "w.safetensors", tmp_path / "out")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert f"`{extra}` in" in r.stderr and "is read by no parameter" in r.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
