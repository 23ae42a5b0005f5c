"""Exit codes, one table: every input gets a located error (1) or a usage error (2), never an
internal error (3) or a traceback.

0 success; 1 a problem in a spec (`file:line:col: error: ...`) or in a file fgc reads or
writes; 2 the command line is wrong (a bad option value, a missing file, an unknown preset or
`--set` name); 3 a bug in fgc. `fgc diff`: 0 equivalent, 1 different, 2 trouble.
fgc runs in-process (`compiler.cli.main`), which is much faster than a subprocess.
"""

from __future__ import annotations

import os
import re

import pytest
from conftest import ROOT

from compiler.cli import main

GPT2 = (ROOT / "specs" / "gpt2.fgpt").read_text(encoding="utf-8")
QKV = '"h.{l}.attn.c_attn.weight" | split(2, 3, 1) | heads(2)'
# a tiny configuration of the formal GPT-2, for the commands that go as far as compiling
TINY = ["--set", "L=1", "--set", "H=8", "--set", "A=2", "--set", "V=11", "--set", "n=8"]
NON_UTF8 = os.fsdecode(b"name\xff.fgpt")  # as Python hands over an undecodable file name

FILES = {
    "ck_trailing_underscore": GPT2.replace(QKV, '"h.{l}.attn.c_attn.weight" | split(1_, 3, 1)'),
    "ck_double_underscore": GPT2.replace(QKV, '"h.{l}.attn.c_attn.weight" | split(1__0, 3, 1)'),
    "ck_tera": GPT2.replace(QKV, '"h.{l}.attn.c_attn.weight" | heads(2T)'),
    "ck_kilo": GPT2.replace(QKV, '"h.{l}.attn.c_attn.weight" | heads(3K)'),
    "huge_default": GPT2.replace("F = 4 * H,", "F = 1e300 * 1e300,"),
    "huge_preset": GPT2.replace("L = 12, H = 768, A = 12\n",
                                "L = 12, H = 768, A = 12, D = 1e300 * 1e300\n", 1),
    "huge_real": GPT2.replace("eps = 1e-5 ", "eps = 1e300 * 1e300 * 0.5 "),
    "huge_literal": GPT2.replace("V = 50257,", "V = 9999999999999999999999999999999e300,"),
    "modules": "module Twice(X: R[n, H]) -> R[n, H] {\n  Twice(X) = X + X\n}\n",
    "bad_name": GPT2.replace("Hf = ln_f: LN(H^(L))", "Hf = ln_f: LN(Hh^(L))"),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("exit-codes")
    out = {}
    for name, text in FILES.items():
        assert text != GPT2 or name == "modules", f"{name}: the replacement did not apply"
        (folder / f"{name}.fgpt").write_text(text, encoding="utf-8")
        out[name] = str(folder / f"{name}.fgpt")
    (folder / NON_UTF8).write_text((ROOT / "specs" / "formal" / "gpt2.fgpt").read_text())
    out["non_utf8"] = str(folder / NON_UTF8)
    out["missing"] = str(folder / "nope.fgpt")
    out["folder"] = str(folder)
    out["out"] = str(folder / "out")
    return out


def run(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    got = capsys.readouterr()
    return code, got.out + got.err


S = "specs/gpt2.fgpt"
F = "specs/formal/gpt2.fgpt"
LOCATED = r"\.fgpt:\d+:\d+: error: "

CASES = [
    # ---- spec problems: 1, located
    (["check", "{ck_trailing_underscore}"], 1, LOCATED + "malformed number `1_`"),
    (["check", "{ck_double_underscore}"], 1, LOCATED + "malformed number `1__0`"),
    (["params", "{ck_tera}"], 1, LOCATED + "`heads` takes axes and counts; 2T is too large"),
    (["check", "{ck_kilo}"], 0, "ok"),  # 3K reads as 3000, as everywhere else
    (["check", "{huge_default}"], 1, LOCATED + r"`1e300\*1e300` is about 1e600"),
    (["params", "{huge_preset}", "--preset", "small"], 1, LOCATED + ".*is about 1e600"),
    (["params", "{huge_real}", "--preset", "small"], 1, LOCATED + ".*is about 1e600"),
    (["check", "{huge_literal}"], 1, LOCATED + "number too large"),
    (["check", "{bad_name}"], 1, LOCATED + ".*`Hh"),
    (["compile", "{modules}", "-o", "{out}"], 1, LOCATED + ".*defines modules but no model"),
    (["compile", "{modules}", "--target", "onnx", "-o", "{out}"], 1, "modules but no model"),
    (["run", "{modules}"], 1, LOCATED + ".*defines modules but no model"),
    (["params", "{modules}"], 1, LOCATED + ".*defines modules but no model"),
    (["ir", "{modules}"], 1, LOCATED + ".*defines modules but no model"),
    (["render", "{modules}", "--to", "dot"], 1, LOCATED + ".*no model; --to dot draws a model"),
    (["check", "{modules}"], 0, "ok"),
    # ---- usage problems: 2
    (["params", S, "--set", "eps=" + "9" * 37 + "e300"], 2, "eps: number too large"),
    (["params", S, "--preset", "small", "--set", "D=1e300T"], 2, "D: number too large"),
    (["params", S, "--set", "H=1_"], 2, "H: malformed number `1_`"),
    (["params", S, "--set", "H=abc"], 2, "'abc' is not a number"),
    (["params", S, "--set", "H"], 2, "NAME=VALUE"),
    (["render", S, "--to", "dot", "-o", ""], 2, "the output file is an empty name"),
    (["render", S, "--to", "dot", "-o", "."], 2, ". is a folder; give a file name"),
    (["render", S, "--to", "dot", "-o", "/"], 2, "/ is a folder; give a file name"),
    (["render", S, "--to", "dot", "-o", "{folder}"], 2, "is a folder; give a file name"),
    (["render", "{modules}", "--to", "latex", "--preset", "x"], 2, "has no model"),
    (["generate", F, "--prompt-ids", "1,2", "--max-new-tokens", "2", "--seed", "-1"], 2,
     "--seed: -1: a seed is a whole number from 0"),
    (["generate", F, "--prompt-ids", "1," + "9" * 23, "--max-new-tokens", "2", *TINY], 2,
     "--prompt-ids: " + "9" * 23 + " is not an id"),
    (["generate", F, "--prompt-ids", "-1", "--max-new-tokens", "2"], 2, "is not an id"),
    (["generate", F, "--prompt-ids", "1", "--max-new-tokens", "-1"], 2, "give a number >= 0"),
    (["generate", F, "--prompt-ids", "1", "--max-new-tokens", "1", "--temperature", "nan"], 2,
     "give a finite number"),
    (["generate", F, "--prompt-ids", "1", "--max-new-tokens", "1", "--temperature", "0"], 2,
     "give a number > 0"),
    (["generate", F, "--prompt-ids", "1", "--max-new-tokens", "1", "--top-p", "2"], 2,
     "give a number in (0, 1]"),
    (["generate", F, "--prompt-ids", "1", "--max-new-tokens", "1", "--top-k", "0"], 2,
     "give a number >= 1"),
    (["run", F, "--tokens", "1," + "9" * 23, *TINY], 2, "does not fit a 64-bit integer"),
    (["run", F, "--top", "-3"], 2, "give a number >= 0"),
    (["compile", "{non_utf8}", "--target", "onnx", "-o", "{out}", *TINY], 2,
     "the file name is not UTF-8"),
    (["run", "{non_utf8}", *TINY], 2, "the file name is not UTF-8"),
    # a missing file, or a folder where a spec is wanted
    (["check", "{missing}"], 2, "nope.fgpt: no such file"),
    (["check", S, "{missing}"], 2, "nope.fgpt: no such file"),
    (["check", "--format", "json", "{missing}"], 2, "nope.fgpt: no such file"),
    (["params", "{missing}"], 2, "nope.fgpt: no such file"),
    (["params", S, "{missing}"], 2, "nope.fgpt: no such file"),
    (["compile", "{missing}", "-o", "{out}"], 2, "nope.fgpt: no such file"),
    (["render", "{missing}", "--to", "dot"], 2, "nope.fgpt: no such file"),
    (["ir", "{missing}"], 2, "nope.fgpt: no such file"),
    (["diff", "{missing}", S], 2, "nope.fgpt: no such file"),
    (["run", "{missing}"], 2, "nope.fgpt: no such file or folder"),
    (["generate", "{missing}", "--prompt-ids", "1", "--max-new-tokens", "1"], 2,
     "nope.fgpt: no such file or folder"),
    (["params", "{folder}"], 2, "is a directory; give a .fgpt file"),
    (["ir", "{folder}"], 2, "is a directory; give a .fgpt file"),
    # an unknown preset or --set name
    (["params", S, "--preset", "nope"], 2, "`GPT2` has no preset `nope`"),
    (["compile", S, "--preset", "nope", "-o", "{out}"], 2, "`GPT2` has no preset `nope`"),
    (["ir", S, "--preset", "nope"], 2, "`GPT2` has no preset `nope`"),
    (["render", S, "--to", "markdown", "--preset", "nope"], 2, "has no preset `nope`"),
    (["params", S, "--set", "Q=3"], 2, "--set Q: `GPT2` has no hyperparameter `Q`"),
    (["compile", S, "--set", "Q=3", "-o", "{out}"], 2, "`GPT2` has no hyperparameter `Q`"),
    (["compile", S, "--preset", "small", "--set", "Q=3", "-o", "{out}"], 2,
     "`GPT2` has no hyperparameter `Q`"),
    (["params", S, F, "--set", "Q=3"], 2, "no spec given has a hyperparameter `Q`"),
    # options out of range, or for another target
    (["compile", S, "--target", "onnx", "--opset", "0", "-o", "{out}"], 2,
     "--opset: 0: the ONNX backend writes opsets 18 to 25"),
    (["compile", S, "--target", "onnx", "--opset", "17", "-o", "{out}"], 2, "opsets 18 to 25"),
    (["compile", S, "--target", "onnx", "--opset", "26", "-o", "{out}"], 2, "opsets 18 to 25"),
    (["compile", S, "--target", "onnx", "--opset", "x", "-o", "{out}"], 2, "not a whole number"),
    (["compile", S, "--opset", "18", "-o", "{out}"], 2, "--opset is for --target onnx"),
    (["compile", S, "--kv-cache", "--external-data", "-o", "{out}"], 2,
     "--external-data, --kv-cache are for --target onnx"),
    (["compile", S, "--target", "onnx", "--seed", "-1", "-o", "{out}"], 2, "--seed: -1"),
    (["compile", S, "-o", ""], 2, "the output folder is an empty name"),
    (["frobnicate"], 2, "invalid choice"),
    (["params"], 2, "the following arguments are required"),
    # ---- fine: 0; and diff's own codes
    (["check", S], 0, "specs/gpt2.fgpt: ok"),
    (["params", S, "--preset", "small", "--set", "eps=1e300"], 0, "total"),
    (["diff", F, F], 0, "equivalent"),
    (["diff", F, "specs/formal/gpt.fgpt"], 1, "different"),
    (["diff", "{bad_name}", F], 2, LOCATED + ".*`Hh"),
    (["diff", F, F, "--preset", "nope"], 2, "no preset `nope`"),
]


@pytest.mark.parametrize("argv, code, message", CASES,
                         ids=[" ".join(c[0])[:70] for c in CASES])
def test_exit_code(argv, code, message, files, capsys):
    argv = [a.format(**files) for a in argv]
    got, text = run(argv, capsys)
    assert "Traceback" not in text and "internal error" not in text, text[-3000:]
    assert got == code, f"exit {got}, not {code}: {text[-3000:]}"
    assert re.search(message if message.startswith(LOCATED) else re.escape(message), text), \
        text[-3000:]


def test_internal_error_is_exit_3_with_one_short_line(monkeypatch, capsys):
    """A bug (here an exception planted in the parameter count) is exit 3 with a summary
    and where to report it, never a traceback."""
    import compiler.cli as cli

    def broken(*_args, **_kwargs):
        raise ValueError("planted\nsecond line " + "x" * 500)

    monkeypatch.setattr(cli, "params_report", broken)
    monkeypatch.delenv("FGC_DEBUG", raising=False)
    code, text = run(["params", S, "--preset", "small"], capsys)
    assert code == 3
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if line.startswith("fgc: ")]
    assert lines[0] == "fgc: internal error: ValueError: planted"
    assert "please report it" in lines[1] and "FGC_DEBUG=1" in lines[1]


def test_render_writes_through_no_planted_link(tmp_path, capsys):
    """`render -o FILE` replaces FILE through a fresh temporary: a link planted at FILE or at
    the temporary name fgc once used (`.FILE.fgc-tmp`) is replaced or ignored, and what it
    points to is never written."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "graph.dot"
    (tmp_path / ".graph.dot.fgc-tmp").symlink_to(victim)
    out.symlink_to(victim)
    code, text = run(["render", S, "--to", "dot", "-o", str(out)], capsys)
    assert code == 0, text
    assert victim.read_text() == "keep me"
    assert not out.is_symlink() and out.read_text().startswith("digraph")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".graph.dot.fgc-tmp", "graph.dot",
                                                          "victim.txt"]


def test_non_utf8_file_names_print_as_their_bytes(files, capsys, tmp_path):
    """Under a locale whose standard output is strict (en_US.UTF-8), an undecodable file name
    is printed as the bytes it is, and `render -o` writes them."""
    import io
    import sys
    strict = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    old = sys.stdout
    sys.stdout = strict
    try:
        code = main(["params", files["non_utf8"], *TINY])
        strict.flush()
        data = strict.buffer.getvalue()
    finally:
        sys.stdout = old
    assert code == 0
    assert b"name\xff.fgpt" in data
    out = tmp_path / "x.dot"
    code, text = run(["render", files["non_utf8"], "--to", "dot", "-o", str(out)], capsys)
    assert code == 0, text
    assert out.is_file()


def test_nul_in_an_external_data_location(tmp_path, capsys):
    """A model.onnx whose external data names a file with a NUL in it is refused (exit 1)."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper
    weight = helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "model.onn\0.data"), ("offset", "0"), ("length", "4")):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    weight.ClearField("float_data")
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                              [weight])
    onnx.save(helper.make_model(graph), str(tmp_path / "model.onnx"))
    code, text = run(["run", str(tmp_path)], capsys)
    assert "internal error" not in text and code == 1, text
    assert "points outside the model's folder" in text


def test_the_readme_documents_the_exit_codes():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Command line"):readme.index("## Comparing")]
    for row in ("| 0 |", "| 1 |", "| 2 |", "| 3 |"):
        assert row in section, row
