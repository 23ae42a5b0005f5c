"""What the tests of released decoder specs against transformers share (test_llama.py,
test_qwen_gemma.py, test_phi3_neox.py, test_granite.py, ...): the presets' counts against
the classes on the meta device; a tiny transformers model's weights compiled to every
target through `--weights`, then its probabilities and its greedy generation; a saved
folder whose config.json asks for what the spec does not write, refused.

A test file takes the tests every such file has from count_tests(), folder_fixture() and
parity_tests(), bound to its own module names (pytest collects them there):

    test_preset_count_equals_transformers, test_every_preset_has_a_count_test = \
        count_tests(RELEASED, ("granite",))
    compiled = folder_fixture("granite", CASES, IDS, _reference)
    test_probabilities_equal_transformers, test_greedy_generation_equals_transformers = \
        parity_tests(vocab=lambda case: case[4])
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import fgc, peaked_weights, unpadded

TOL = 1e-5
TARGETS = (("torch", ["--target", "torch"]), ("onnx", ["--target", "onnx"]),
           ("ort", ["--target", "onnx", "--optimize", "ort"]))


def seeded(cls, config, offset_gains: bool = False):
    """A tiny reference: `cls(config)` made at seed 0, in eval mode, its weights re-drawn by
    peaked_weights; `offset_gains` for norms stored as their offset from 1 (Gemma's 1 + γ):
    moved near 0, so that the gains are near 1 as the other models' are."""
    import torch
    torch.manual_seed(0)
    model = cls(config).eval()
    peaked_weights(model)
    if offset_gains:
        with torch.no_grad():
            for name, w in model.named_parameters():
                if name.endswith("norm.weight"):
                    w.sub_(1.0)
    return model


def assert_finds_spec(folder: Path, spec: str, out: Path):
    """`fgc compile FOLDER` alone picks specs/<spec>.fgpt by config.json's architectures and
    writes model.py into `out`; the compile's result."""
    r = fgc("compile", str(folder), "--target", "torch", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert f"{spec}.fgpt" in r.stdout + r.stderr
    assert (out / "model.py").is_file()
    return r


def compile_targets(spec: str, sets: list[str], weights: Path, folder: Path) -> dict:
    """`fgc compile` of specs/<spec>.fgpt with the file's weights, to each target; every
    tensor of the file is used or ignored by the spec's checkpoint block."""
    out = {}
    for target, args in TARGETS:
        dest = folder / target
        r = fgc("compile", f"specs/{spec}.fgpt", *sets, "--weights", str(weights), *args,
                "-o", str(dest))
        assert r.returncode == 0, r.stderr
        assert "not used" not in r.stdout + r.stderr
        out[target] = dest
    return out


def compile_folder(spec: str, model, folder: Path) -> dict:
    """`model` as `save_pretrained` writes it (folder/hf), compiled to each target from the
    folder alone: its config.json gives every size (no --set)."""
    model.save_pretrained(str(folder / "hf"))
    return compile_targets(spec, [], folder / "hf", folder)


def module(folder: Path):
    """build() of a compiled model.py, with its weights.safetensors where it has one."""
    from safetensors.torch import load_file
    spec = importlib.util.spec_from_file_location(f"fgc_{folder.parent.name}_{folder.name}",
                                                  folder / "model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.build().eval()
    if (folder / "weights.safetensors").exists():
        model.load_state_dict(load_file(str(folder / "weights.safetensors")))
    return model


def tokens(V: int, T: int, B: int = 2):
    import torch
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(T))


def assert_probabilities(ref, out: dict, V: int, lengths) -> None:
    """The torch module and both ONNX graphs give transformers' probabilities."""
    import onnxruntime as ort
    import torch
    model = module(out["torch"])
    sessions = {t: ort.InferenceSession(str(out[t] / "model.onnx"),
                                        providers=["CPUExecutionProvider"])
                for t in ("onnx", "ort")}
    for T in lengths:
        x = tokens(V, T)
        with torch.no_grad():
            want = torch.softmax(ref(x).logits, -1)
            got = model(x)
        assert float((got - want).abs().max()) <= TOL
        for target, session in sessions.items():
            probs = session.run(None, unpadded(session, {session.get_inputs()[0].name:
                                                         x.numpy()}))[0]
            assert float(np.abs(probs - want.numpy()).max()) <= TOL, target


def assert_greedy(ref, out: dict, V: int, new: int) -> None:
    """Greedy generation through step() and its cache gives transformers' generate ids."""
    import torch
    model = module(out["torch"])
    prompt = tokens(V, 4)
    with torch.no_grad():
        want = ref.generate(prompt, max_new_tokens=new, do_sample=False, pad_token_id=0,
                            attention_mask=torch.ones_like(prompt))
        ids = prompt
        logits, past = model.step(prompt)
        for _ in range(new):
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], 1)
            logits, past = model.step(nxt, past=past)
    assert torch.equal(ids, want)


def assert_preset_count(spec: str, preset: str, family: str, config: dict,
                        config_class: str | None = None) -> None:
    """`fgc params --preset` equals transformers' <family>ForCausalLM on the meta device
    (parameters(): tied ones once), its config <family>Config or `config_class` (Gemma 3's
    text model: Gemma3TextConfig)."""
    import torch
    import transformers
    cls = getattr(transformers, f"{family}ForCausalLM")
    with torch.device("meta"):
        model = cls(getattr(transformers, config_class or f"{family}Config")(**config))
    want = sum(p.numel() for p in model.parameters())
    r = fgc("params", f"specs/{spec}.fgpt", "--preset", preset, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total"] == want


def assert_presets_covered(released: dict, specs: tuple[str, ...]) -> None:
    """Every preset of specs/<spec>.fgpt has a (spec, preset) row in `released`, the table
    whose configs the count test builds, and every row names a preset that exists."""
    from conftest import ROOT

    from compiler.pipeline import load
    want = {(spec, p) for spec in specs for p in load(str(ROOT / "specs" / f"{spec}.fgpt"))
            .presets()}
    have = {key for key in released if key[0] in specs}
    assert want == have, f"presets without a count test: {sorted(want - have)}; " \
                         f"rows without a preset: {sorted(have - want)}"


def count_tests(released: dict, specs: tuple[str, ...]):
    """The count tests of specs/<spec>.fgpt for each of `specs`: every (spec, preset) row
    of `released`, (family, config[, config class]) as assert_preset_count() takes them,
    counts as transformers does, and every preset has a row."""
    keys = sorted(released)

    @pytest.mark.parametrize("spec,preset", keys, ids=[f"{s}-{p}" for s, p in keys])
    def test_preset_count_equals_transformers(spec, preset):
        assert_preset_count(spec, preset, *released[(spec, preset)])

    def test_every_preset_has_a_count_test():
        assert_presets_covered(released, specs)

    return test_preset_count_equals_transformers, test_every_preset_has_a_count_test


def folder_fixture(spec: str, cases: list, ids: list[str], reference):
    """The module's `compiled` fixture, one per case: (case, the transformers model
    `reference(*case)`, the targets compile_folder() made from its saved folder alone)."""
    @pytest.fixture(scope="module", params=cases, ids=ids)
    def compiled(request, tmp_path_factory):
        case = request.param
        model = reference(*case)
        return case, model, compile_folder(spec, model, tmp_path_factory.mktemp(spec))

    return compiled


def parity_tests(vocab, lengths=(16, 5), new: int = 10):
    """The two parity tests of a module whose `compiled` fixture gives (case, transformers
    model, targets): probabilities at each of `lengths` positions (or `lengths(case)`),
    and `new` greedy ids; `vocab(case)` is the case's vocabulary size."""
    def test_probabilities_equal_transformers(compiled):
        case, ref, out = compiled
        assert_probabilities(ref, out, V=vocab(case),
                             lengths=lengths(case) if callable(lengths) else lengths)

    def test_greedy_generation_equals_transformers(compiled):
        case, ref, out = compiled
        assert_greedy(ref, out, V=vocab(case), new=new)

    return test_probabilities_equal_transformers, test_greedy_generation_equals_transformers


DELETE = object()  # refused_config(): the key taken out of config.json


def refused_config(folder: Path, tmp_path: Path, spec: str | None = None, **change):
    """`fgc compile` of a copy of the saved `folder` whose config.json has the keys of
    `change` set (or, given DELETE, taken out), through specs/<spec>.fgpt or, without one,
    the spec its architectures name: refused (exit 1, no traceback, nothing written), at
    config.json. The compile's result, for what its message must say."""
    bad = tmp_path / "changed"
    shutil.copytree(folder, bad)
    config = json.loads((bad / "config.json").read_text())
    for key, value in change.items():
        if value is DELETE:
            del config[key]
        else:
            config[key] = value
    (bad / "config.json").write_text(json.dumps(config, indent=2))
    source = [f"specs/{spec}.fgpt", "--weights", str(bad)] if spec else [str(bad)]
    r = fgc("compile", *source, "--target", "torch", "-o", str(tmp_path / "refused"))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{bad / 'config.json'}:" in r.stderr
    assert not (tmp_path / "refused").exists()
    return r
