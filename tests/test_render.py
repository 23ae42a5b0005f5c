"""`fgc render`: LaTeX boxes in the seed's style, a Markdown summary, Graphviz DOT and SVG.

The LaTeX of every spec is compiled when a LaTeX engine is installed (skipped cleanly
otherwise), the SVG parsed as XML when Graphviz is; the seed's GPT-2 box is checked line by
line against what the spec renders to.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest
from conftest import ROOT, all_specs, fgc

SPECS = [p.relative_to(ROOT).as_posix() for p in all_specs()] + ["examples/parallel_block.fgpt"]
LATEX = shutil.which("pdflatex") or shutil.which("lualatex") or shutil.which("xelatex")
DOT = shutil.which("dot")


def render(spec: str, to: str, *extra: str) -> str:
    r = fgc("render", spec, "--to", to, *extra)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_gpt2_box_reads_like_the_seed():
    tex = render("specs/formal/gpt2.fgpt", "latex")
    rows = [
        r"\text{Input} & \hspace{10pt} \displaystyle \bm{x} \in \{1, \ldots, V\}^{n}",
        r"\text{Embedding} & \hspace{10pt} \displaystyle \bm{H}^{(0)} = "
        r"\text{OneHot}(\bm{x}) \bm{W}_e + \bm{W}_p & \hspace{10pt} (n \times H)",
        r"\text{Layers} & \hspace{10pt} \displaystyle \hat{\bm{H}}^{(l)} = "
        r"\text{MH}(\text{LN}(\bm{H}^{(l - 1)}), \text{Mask}^{\text{AR}}) + \bm{H}^{(l - 1)},",
        r"\bm{H}^{(l)} = \text{FF}^{\text{GELU}}(\text{LN}(\hat{\bm{H}}^{(l)})) + "
        r"\hat{\bm{H}}^{(l)} \quad \text{for } l = 1, \ldots, L",
        r"\bm{H}_{\text{f}} = \text{LN}(\bm{H}^{(L)}) & \hspace{10pt} (n \times H)",
        r"\text{Output} & \hspace{10pt} \displaystyle \text{GPT}(\bm{x}) = "
        r"\text{Softmax}(\bm{H}_{\text{f}} \bm{W}_e^\top) & \hspace{10pt} (n \times V)",
    ]
    for row in rows:
        assert row in tex, row


def test_module_boxes_have_signature_definition_parameters():
    tex = render("specs/formal/gpt2.fgpt", "latex", "--stdlib")
    assert r"\text{Signature:} & \hspace{10pt} \displaystyle \text{MH} : \mathbb{R}^{n \times H}" \
        r" \times \mathbb{R}^{n \times n} \to \mathbb{R}^{n \times H}." in tex
    assert r"\bm{W}_i^Q \in \mathbb{R}^{H \times D} \quad \text{for } i \in \{1, \ldots, A\}" \
        in tex
    for module in ("OneHot", "LN", "Softmax", "Attention", "Concat", "MH", "FF}^{\\text{GELU"):
        assert f"\\centering $\\text{{{module}}}" in tex, module
    # without --stdlib only the file's own modules (none here) and the model
    assert r"\text{Signature:}" not in render("specs/formal/gpt2.fgpt", "latex")


@pytest.mark.skipif(LATEX is None, reason="no LaTeX engine installed")
@pytest.mark.parametrize("spec", SPECS)
def test_latex_compiles(spec, tmp_path):
    tex = tmp_path / "spec.tex"
    r = fgc("render", spec, "--to", "latex", "--stdlib", "-o", str(tex))
    assert r.returncode == 0, r.stderr
    run = subprocess.run([LATEX, "-interaction=nonstopmode", "-halt-on-error", tex.name],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:]
    assert (tmp_path / "spec.pdf").stat().st_size > 1000


@pytest.mark.parametrize("spec", SPECS)
def test_markdown_summary(spec):
    md = render(spec, "markdown")
    counts = json.loads(fgc("params", spec, "--format", "json").stdout)
    assert f"**{counts['total']:,}**" in md
    assert f"N = `{counts['formula']}`" in md
    for name in counts["hyperparameters"]:
        assert f"| `{name}` |" in md
    assert "## Inputs and outputs" in md and "| output |" in md


@pytest.mark.parametrize("spec", SPECS)
def test_dot_has_layers_and_shapes_on_every_edge(spec):
    text = render(spec, "dot")
    edges = re.findall(r"-> n\d+ \[label=\"([^\"]*)\"", text)
    assert edges and all(edges), "an edge without a shape"
    assert "subgraph cluster_layers" in text
    assert text.count("{") == text.count("}")


def test_dot_with_a_preset_shows_numbers():
    text = render("specs/formal/gpt2.fgpt", "dot", "--preset", "small")
    assert 'label="1,024 × 768"' in text
    assert 'label="n × H"' in render("specs/formal/gpt2.fgpt", "dot")


def test_dot_shows_residual_paths():
    """Each sub-block's sum takes the block's input directly: the residual edge."""
    text = render("specs/formal/gpt2.fgpt", "dot")
    ids = dict(re.findall(r"^\s*(n\d+) \[label=\"([^\"]+)\", shape", text, re.M))
    by_label = {}
    for nid, label in ids.items():
        by_label.setdefault(label, []).append(nid)
    [prev] = by_label["H^(l-1)"]
    sums = by_label["+"]
    assert any(f"{prev} -> {s} " in text for s in sums)


@pytest.mark.skipif(DOT is None, reason="Graphviz is not installed")
@pytest.mark.parametrize("spec", ["specs/formal/gpt3.fgpt", "specs/bert.fgpt"])
def test_svg_is_well_formed(spec, tmp_path):
    out = tmp_path / "model.svg"
    r = fgc("render", spec, "--to", "svg", "-o", str(out))
    assert r.returncode == 0, r.stderr
    root = ET.parse(out).getroot()
    assert root.tag.endswith("svg")
    texts = [t.text for t in root.iter() if t.tag.endswith("text")]
    assert "MH" in texts and "LN" in texts


def test_svg_without_graphviz_says_so(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}
    import sys
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "render", "specs/formal/gpt2.fgpt",
                        "--to", "svg"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1
    assert "Graphviz" in r.stderr and "Traceback" not in r.stderr


def test_render_to_an_unwritable_place(tmp_path):
    r = fgc("render", "specs/formal/gpt2.fgpt", "--to", "dot", "-o",
            str(tmp_path / "missing" / "x.dot"))
    assert r.returncode == 1 and "cannot write" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "missing").exists()


def test_a_module_file_renders_as_latex(tmp_path):
    spec = tmp_path / "mods.fgpt"
    spec.write_text("module Twice(X: R[n, H]) -> R[n, H] {\n  Twice(X) = X + X\n}\n")
    tex = render(str(spec), "latex")
    assert r"\text{Twice}(\bm{X}) = \bm{X} + \bm{X}" in tex
    r = fgc("render", str(spec), "--to", "dot")
    assert r.returncode == 1 and "no model" in r.stderr
