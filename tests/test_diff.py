"""`fgc diff`: a semantic comparison of two specs.

The README's four showcases are pinned here (GPT vs GPT-2, GPT-2 vs GPT-3, BERT vs RoBERTa,
formal vs released GPT-2), along with what must *not* count as a change (renaming local
values, naming a sub-expression, commuting a sum, reordering independent equations) and
the exit codes of diff(1): 0 equivalent, 1 different, 2 trouble.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest
from conftest import ROOT, all_specs, fgc

SPECS = [p.relative_to(ROOT).as_posix() for p in all_specs()]


def diff_json(*args: str) -> tuple[int, dict]:
    r = fgc("diff", *args, "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    assert "Traceback" not in r.stderr
    return r.returncode, json.loads(r.stdout)


def changed(report: dict, section: str) -> list[dict]:
    return [e for e in report["equations"] if e["section"] == section]


def test_gpt_to_gpt2_moves_layer_norms_and_adds_one():
    code, r = diff_json("specs/formal/gpt.fgpt", "specs/formal/gpt2.fgpt")
    assert code == 1 and not r["equivalent"]
    layers = changed(r, "layers")
    assert len(layers) == 2  # one change per sub-block
    for e in layers:
        assert e["change"] == "changed"
        assert "LN moved from the block's output to the block's input" in e["notes"]
    out = changed(r, "output")
    assert len(out) == 1 and out[0]["notes"] == ["adds LN"]
    assert {p["b"] for p in r["parameters"] if p["change"] == "added"} == {
        "LN_3.gamma", "LN_3.beta"}
    assert r["total"]["delta_formula"] == "+2*H"
    assert not r["inputs"] and not r["modules"]


def test_gpt2_to_gpt3_alternates_masks_per_layer():
    code, r = diff_json("specs/formal/gpt2.fgpt", "specs/formal/gpt3.fgpt", "--preset", "small")
    assert code == 1
    [e] = changed(r, "layers")
    groups = {g["layers"]: g for g in e["layers"]}
    assert groups["layers 2, 4, ..., 12 (even)"]["same"]
    odd = groups["layers 1, 3, ..., 11 (odd)"]
    assert not odd["same"] and odd["notes"] == "Mask^AR → Mask^ST"
    assert {m["name"]: m["change"] for m in r["modules"]} == {"Mask^ST": "added"}
    assert r["total"]["delta_formula"] == "0"  # the same parameters; only n differs
    assert {h["name"] for h in r["hyperparameters"]} == {"D", "n", "w"}


def test_gpt2_to_gpt3_symbolic_layers():
    r = fgc("diff", "specs/formal/gpt2.fgpt", "specs/formal/gpt3.fgpt", "--set", "L=3",
            "--set-a", "H=8", "--set-a", "A=2", "--set-b", "H=8", "--set-b", "A=2",
            "--set-b", "D=4")
    assert r.returncode == 1, r.stderr
    assert "layers 1, 3: Mask^AR → Mask^ST" in r.stdout
    assert "layers 2: same" in r.stdout


def test_a_computed_layer_condition_prints_as_written():
    r = fgc("diff", "specs/gemma2.fgpt", "specs/gemma3.fgpt")
    assert r.returncode == 1, r.stderr
    assert "{n=n, w=w} when not (l % 6 == 0)" in r.stdout and "l%6" not in r.stdout


def test_bert_to_roberta_drops_segments():
    code, r = diff_json("specs/formal/bert.fgpt", "specs/formal/roberta.fgpt")
    assert code == 1
    assert r["inputs"] == [{"change": "removed", "name": "t", "a": "{0..1}^n"}]
    assert {p["a"] for p in r["parameters"] if p["change"] == "removed"} == {"w^A", "w^B"}
    [e] = changed(r, "embedding")
    assert "no longer reads t, w^A, w^B" in e["notes"]
    assert not changed(r, "layers")
    assert r["total"]["delta_formula"] == "-2*H"
    assert r["outputs"][0]["change"] == "renamed"


def test_formal_to_released_gpt2():
    code, r = diff_json("specs/formal/gpt2.fgpt", "specs/gpt2.fgpt")
    assert code == 1
    mods = {m["name"]: m for m in r["modules"]}
    assert mods["GELU"]["change"] == "removed" and mods["GELU^tanh"]["change"] == "added"
    assert "+ param b^O: R[H]" in mods["MH"]["details"]
    assert any("GELU^tanh" in line for line in mods["FF^GELU"]["b"])
    assert not r["equations"]  # ln_1/attn/... are instance names: the layers are the same
    assert {p["b"] for p in r["parameters"]} == {"attn.b^Q", "attn.b^K", "attn.b^V",
                                                 "attn.b^O"}
    assert r["total"]["delta_expanded"] == "+4*H*L"
    assert r["total"]["delta"] == 124_439_808 - 124_402_944


@pytest.mark.parametrize("spec", SPECS)
def test_a_spec_equals_itself(spec):
    r = fgc("diff", spec, spec)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("equivalent")


VARIANT = (ROOT / "specs/formal/gpt2.fgpt").read_text()


def _rewrite(text: str, *pairs: tuple[str, str]) -> str:
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    return text


def test_renaming_and_reordering_is_no_change(tmp_path):
    """Local names renamed, a sub-expression named, sums commuted, and two independent
    equations swapped: equivalent, exit 0."""
    variant = _rewrite(
        VARIANT,
        ("H^(0) = OneHot(x) @ W_e + W_p", "Tok = OneHot(x) @ W_e\n  Z^(0) = W_p + Tok"),
        ("Hhat^(l) = MH(LN(H^(l-1)), Mask^AR) + H^(l-1)",
         "G^(l) = Z^(l-1) + MH(LN(Z^(l-1)), Mask^AR)"),
        ("H^(l) = FF^GELU(LN(Hhat^(l))) + Hhat^(l)", "Z^(l) = FF^GELU(LN(G^(l))) + G^(l)"),
        ("Hf = LN(H^(L))", "Wt = W_e^T\n  Hf = LN(Z^(L))"),
        ("Softmax(Hf @ W_e^T)", "Softmax(Hf @ Wt)"))
    path = tmp_path / "variant.fgpt"
    path.write_text(variant)
    assert fgc("check", str(path)).returncode == 0
    r = fgc("diff", "specs/formal/gpt2.fgpt", str(path))
    assert r.returncode == 0, r.stdout
    swapped = _rewrite(variant, ("Wt = W_e^T\n  Hf = LN(Z^(L))", "Hf = LN(Z^(L))\n  Wt = W_e^T"))
    path.write_text(swapped)
    assert fgc("diff", "specs/formal/gpt2.fgpt", str(path)).returncode == 0


def test_a_real_change_is_seen(tmp_path):
    """A residual dropped from one sub-block: one changed equation, nothing else."""
    path = tmp_path / "variant.fgpt"
    path.write_text(_rewrite(VARIANT, ("Hhat^(l) = MH(LN(H^(l-1)), Mask^AR) + H^(l-1)",
                                       "Hhat^(l) = MH(LN(H^(l-1)), Mask^AR)")))
    code, r = diff_json("specs/formal/gpt2.fgpt", str(path))
    assert code == 1
    assert [e["a"]["name"] for e in r["equations"]] == ["Hhat^(l)"]
    assert r["total"]["delta_formula"] == "0"


@pytest.mark.parametrize("args, words", [
    (["specs/formal/gpt2.fgpt", "missing.fgpt"], ["missing.fgpt"]),
    (["specs/formal/gpt2.fgpt", "specs/gpt2.fgpt", "--preset", "nope"], ["no preset `nope`"]),
    (["specs/formal/gpt2.fgpt", "specs/gpt2.fgpt", "--set-b", "Q=3"], ["no hyperparameter"]),
])
def test_trouble_exits_2(args, words):
    r = fgc("diff", *args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    for w in words:
        assert w in r.stderr


def test_a_broken_spec_exits_2(tmp_path):
    bad = tmp_path / "bad.fgpt"
    bad.write_text(VARIANT.replace("H^(0) = OneHot(x) @ W_e + W_p", "H^(0) = OneHot(x) @ W_p"))
    r = fgc("diff", "specs/formal/gpt2.fgpt", str(bad))
    assert r.returncode == 2
    assert f"{bad}:" in r.stderr and "Traceback" not in r.stderr


CONSOLE = re.compile(r"^```console\n\$ (fgc [^\n]*)\n(.*?)^```$", re.S | re.M)


def readme_sessions() -> list[tuple[str, str]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return [(m.group(1), m.group(2)) for m in CONSOLE.finditer(text)
            if m.group(1).startswith("fgc diff ")]


def test_readme_shows_the_four_comparisons():
    pairs = {tuple(cmd.split()[2:4]) for cmd, _ in readme_sessions()}
    assert pairs >= {("specs/formal/gpt.fgpt", "specs/formal/gpt2.fgpt"),
                     ("specs/formal/gpt2.fgpt", "specs/formal/gpt3.fgpt"),
                     ("specs/formal/bert.fgpt", "specs/formal/roberta.fgpt"),
                     ("specs/formal/gpt2.fgpt", "specs/gpt2.fgpt"),
                     ("specs/llama.fgpt", "specs/mistral.fgpt"),
                     ("specs/llama.fgpt", "specs/qwen2.fgpt"),
                     ("specs/gpt2.fgpt", "specs/llama.fgpt"),
                     ("specs/mistral.fgpt", "specs/mixtral.fgpt")}


@pytest.mark.parametrize("command, shown", readme_sessions(), ids=lambda x: x[:60])
def test_readme_diff_output_is_current(command, shown):
    r = fgc(*shlex.split(command)[1:])
    assert r.stdout == shown, f"README's `{command}` is out of date:\n{r.stdout}"


def test_colour_only_on_a_terminal():
    from compiler.cli import main  # noqa: F401 - the CLI is importable without torch
    from compiler.pipeline import load
    from compiler.tools.diff import Side, compare, format_text
    sides = []
    for path in ("specs/formal/gpt.fgpt", "specs/formal/gpt2.fgpt"):
        spec = load(str(ROOT / path))
        sides.append(Side(path, spec, spec.symbolic(), spec.configure(
            spec.default_preset())))
    report = compare(*sides)
    assert "\033[" in format_text(report, color=True)
    assert "\033[" not in format_text(report, color=False)
    piped = fgc("diff", "specs/formal/gpt.fgpt", "specs/formal/gpt2.fgpt")
    assert "\033[" not in piped.stdout + piped.stderr


def test_progress_of_a_long_emit(tmp_path):
    """Writing a model reports its progress on stderr: on a terminal, or when asked."""
    import os
    import subprocess
    import sys
    args = [sys.executable, "-m", "compiler.cli", "compile", "specs/gpt2.fgpt", "--target",
            "onnx", "--set", "L=2", "--set", "H=64", "--set", "A=2", "-o"]
    env = {**os.environ, "FGC_PROGRESS": "1"}
    shown = subprocess.run(args + [str(tmp_path / "a")], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "lowering GPT2" in shown.stderr and "100%" in shown.stderr
    env.pop("FGC_PROGRESS")
    env.pop("CI", None)
    quiet = subprocess.run(args + [str(tmp_path / "b")], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and "100%" not in quiet.stderr
    # in a CI job's log: a line per phase, never redrawn
    env["CI"] = "true"
    logged = subprocess.run(args + [str(tmp_path / "c")], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert logged.returncode == 0 and "lowering GPT2" in logged.stderr, logged.stderr
    assert "100%" in logged.stderr and "\r" not in logged.stderr
