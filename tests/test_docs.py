"""Every complete ```fgpt example in docs/language.md passes `fgc check`.

A block whose info string is `fgpt fragment` is a piece of a file and is skipped; every
other `fgpt` block must be a whole file that checks, without warnings. All files go to
one `fgc check` run, in one folder; `fgpt file=NAME.fgpt` names a block's file, so that
another block can refer to it (`share ... with "NAME.fgpt"`).
"""

from __future__ import annotations

import re
import textwrap

from conftest import ROOT, fgc

DOC = ROOT / "docs" / "language.md"
# a fence may be indented (inside a list item); its closing fence has the same indent
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                   re.S | re.M)


def fgpt_blocks() -> list[tuple[int, str, bool, str | None]]:
    """(line of the opening fence, code, is_fragment, file name or None) for each ```fgpt
    block."""
    text = DOC.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        info = m.group("info").split()
        if not info or info[0] != "fgpt":
            continue
        line = text.count("\n", 0, m.start()) + 1
        name = next((w.removeprefix("file=") for w in info[1:] if w.startswith("file=")), None)
        out.append((line, textwrap.dedent(m.group("body")), "fragment" in info[1:], name))
    return out


def test_doc_has_complete_examples():
    complete = [b for b in fgpt_blocks() if not b[2]]
    assert len(complete) >= 10, f"only {len(complete)} complete examples in {DOC}"


def test_every_complete_example_checks(tmp_path):
    files = []
    for line, code, fragment, name in fgpt_blocks():
        if fragment:
            continue
        # named after the block's line, so a failure points at the doc
        path = tmp_path / (name or f"language.md-line{line}.fgpt")
        path.write_text(code, encoding="utf-8")
        files.append(str(path))
    r = fgc("check", *files)
    report = r.stdout + r.stderr
    assert r.returncode == 0, report
    for f in files:
        assert f"{f}: ok\n" in r.stdout, f"{f} did not check cleanly:\n{report}"
    assert "warning:" not in report, report


def test_reformer_sketch_compiles_to_pytorch_and_runs(tmp_path):
    """The LSH attention sketch: its rotations `Rot_r: R[D, k]` are an input whose D is a
    parameter's width, so D stays a constant, not a run length; the module builds, runs
    on a batch and has the parameters `fgc params` counts."""
    import importlib.util

    import torch

    from compiler.emit import compile_spec
    from compiler.pipeline import load
    (line, code, _, _), = [b for b in fgpt_blocks() if "model Reformer" in b[1]]
    path = tmp_path / "reformer_sketch.fgpt"
    path.write_text(code, encoding="utf-8")
    compile_spec(str(path), str(tmp_path / "t"), "torch")
    spec = importlib.util.spec_from_file_location("sketch", tmp_path / "t" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.build().eval()
    assert "T_D" not in (tmp_path / "t" / "model.py").read_text()
    config = model.config  # the sizes it was built with (model.py's Config)
    x = torch.randint(0, config.V, (2, 6))
    rot = torch.randn(2, config.N, config.D, config.k)
    with torch.no_grad():
        probs = model(x, rot)
    assert probs.shape == (2, 6, config.V)
    assert torch.allclose(probs.sum(-1), torch.ones(2, 6))
    total = load(str(path)).configure(None, {}).total
    assert sum(p.numel() for p in model.parameters()) == total


def test_the_quickstart_snippet_runs_on_a_small_compile(tmp_path):
    """scripts/quickstart.sh imports the compiled GPT-2 and runs it; the same Python, on a
    small compile of the same spec, keeps working as the emitted module changes."""
    import subprocess
    import sys
    script = (ROOT / "scripts" / "quickstart.sh").read_text(encoding="utf-8")
    snippet = re.search(r'python -c "\n(.*?)\n"', script, re.S).group(1)
    out = tmp_path / "gpt2"
    r = fgc("compile", "specs/gpt2.fgpt", "--target", "torch", "--set", "L=1", "--set", "H=8",
            "--set", "A=2", "--set", "V=11", "--set", "n=16", "-o", str(out))
    assert r.returncode == 0, r.stderr
    run = subprocess.run([sys.executable, "-c", snippet.replace("out/gpt2/", f"{out}/")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "probabilities (1, 8, 11)" in run.stdout
