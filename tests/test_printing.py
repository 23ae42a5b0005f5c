"""Reading and printing (issue 16, item 9): what fgc reads and what it prints.

`share ... with "PATH"` names a spec in the declaring spec's folder or below it: an absolute
path, `..` out of the folder or a link that leads out is a located error, and another file's
content never appears in a diagnostic (a file that does not parse is named, with where, and
`fgc check` of it suggested). File names and spec text reach LaTeX, DOT, Markdown and the
terminal escaped: a newline in a file name is not a line of LaTeX, an ESC in a spec is shown
as `\\x1b`, never sent to the terminal.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, fgc

from compiler.errors import Diagnostic, FgcError, Sources, Span, printable, render

SECRET = "SECRETTOKEN-4f1c"

SMALL = """
model {name} {{
  hyper L = 1, H = 8, A = 2, D = H / A, V = 11, n = 6
  input x: {{1..V}}^n
  param W_e: R[V, H], W_p: R[n, H]
  {share}
  H^(0) = OneHot(x) @ W_e + W_p
  layers l in 1..L {{
    H^(l) = LN(MH(H^(l-1), Mask^AR) + H^(l-1))
  }}
  output probs = Softmax(H^(L) @ W_e^T)
}}
"""
LATEX = shutil.which("pdflatex") or shutil.which("lualatex") or shutil.which("xelatex")


def _spec(folder, name: str, share: str = "") -> str:
    path = folder / f"{name.lower()}.fgpt"
    path.write_text(SMALL.format(name=name, share=share))
    return str(path)


def _secret_file(path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"root:{SECRET}:19000:0:99999:7:::\nmodel {SECRET} {{ oops\n")


def _refused(r: subprocess.CompletedProcess, *words: str) -> None:
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert SECRET not in r.stdout + r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


# ---------------------------------------------------------------- share ... with "PATH"


def test_share_with_an_absolute_path_is_refused(tmp_path):
    _secret_file(tmp_path / "elsewhere" / "shadow")
    spec = _spec(tmp_path / "elsewhere", "Small", f'share W_e with "{tmp_path}/elsewhere/shadow"')
    _refused(fgc("check", spec), "small.fgpt:6:18: error:", "an absolute path is not allowed",
             "help: the other spec is named relative to this spec's folder")


def test_share_with_a_path_out_of_the_folder_is_refused(tmp_path):
    (tmp_path / "specs").mkdir()
    _secret_file(tmp_path / "private" / "keys.fgpt")
    _spec(tmp_path / "specs", "Big")
    spec = _spec(tmp_path / "specs", "Small", 'share W_e with "../private/keys.fgpt"')
    _refused(fgc("check", spec), "small.fgpt:6:18: error:",
             "leads out of this spec's folder")
    # counted together, the same declaration is refused as well
    _refused(fgc("params", spec, str(tmp_path / "specs" / "big.fgpt")),
             "leads out of this spec's folder")


def test_share_with_a_link_out_of_the_folder_is_refused(tmp_path):
    (tmp_path / "specs").mkdir()
    _secret_file(tmp_path / "private" / "keys.fgpt")
    os.symlink(tmp_path / "private" / "keys.fgpt", tmp_path / "specs" / "big.fgpt")
    spec = _spec(tmp_path / "specs", "Small", 'share W_e with "big.fgpt"')
    _refused(fgc("check", spec), "small.fgpt:6:18: error:",
             "leads out of this spec's folder through a symbolic link")


def test_share_within_the_folder_tree_still_works(tmp_path):
    (tmp_path / "sub").mkdir()
    _spec(tmp_path / "sub", "Big")
    spec = _spec(tmp_path, "Small", 'share W_e with "sub/../sub/big.fgpt"')
    r = fgc("check", spec)
    assert r.returncode == 0, r.stderr
    # a link that stays inside the folder is fine too
    os.symlink("sub/big.fgpt", tmp_path / "linked.fgpt")
    spec = _spec(tmp_path, "Small", 'share W_e with "linked.fgpt"')
    assert fgc("check", spec).returncode == 0


def test_a_shared_spec_that_does_not_parse_is_named_not_quoted(tmp_path):
    _secret_file(tmp_path / "notes.fgpt")
    spec = _spec(tmp_path, "Small", 'share W_e with "notes.fgpt"')
    _refused(fgc("check", spec), "small.fgpt:6:18: error: `notes.fgpt` does not parse (",
             "notes.fgpt:1:", "help: run `fgc check ")
    r = fgc("check", spec, "--format", "json")
    assert SECRET not in r.stdout + r.stderr


def test_a_shared_spec_that_is_not_utf8_is_named_not_quoted(tmp_path):
    (tmp_path / "bin.fgpt").write_bytes(b"model X {\n" + SECRET.encode() + b"\xff\xfe\n")
    spec = _spec(tmp_path, "Small", 'share W_e with "bin.fgpt"')
    _refused(fgc("check", spec), "`bin.fgpt` does not parse (", "bin.fgpt:2:")
    assert "0xff" not in fgc("check", spec).stderr


def test_a_shared_spec_that_does_not_elaborate_is_named_not_quoted(tmp_path):
    other = SMALL.format(name="Big", share="").replace(
        "output probs = Softmax(H^(L) @ W_e^T)", f"output probs = Softmax({SECRET}_x)")
    (tmp_path / "big.fgpt").write_text(other.replace("SECRETTOKEN-4f1c", "SECRETTOKEN"))
    spec = _spec(tmp_path, "Small", 'share W_e with "big.fgpt"')
    r = fgc("check", spec)
    assert r.returncode == 1
    assert "SECRETTOKEN" not in r.stderr, r.stderr
    assert "help: run `fgc check " in r.stderr


# ---------------------------------------------------------------- file names in renderings


@pytest.fixture
def hostile_name(tmp_path):
    """A spec whose file name holds newlines, a LaTeX command, an ANSI escape, a backtick,
    a pipe and a quote; next to it the `secret.tex` that the command would read."""
    name = "x\n\\input{secret}\n\x1b[31m`|\".fgpt"
    (tmp_path / name).write_text(SMALL.format(name="Small", share=""))
    (tmp_path / "secret.tex").write_text(f"\\typeout{{{SECRET}}}\n")
    return tmp_path, name


def _fgc_in(folder, *args: str) -> subprocess.CompletedProcess:
    """fgc run in `folder`, so the hostile name is the whole path it prints."""
    return subprocess.run([sys.executable, "-m", "compiler.cli", *args], cwd=folder,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def _render(folder, name: str, to: str) -> str:
    r = _fgc_in(folder, "render", name, "--to", to)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout + r.stderr
    return r.stdout


def test_latex_escapes_the_file_name(hostile_name):
    folder, name = hostile_name
    tex = _render(folder, name, "latex")
    lines = tex.split("\n")
    assert not any(line.lstrip().startswith("\\input") for line in lines)
    assert "% x\\n\\input{secret}\\n\\x1b[31m`|\".fgpt, typeset by fgc render" in lines
    if LATEX:
        (folder / "out.tex").write_text(tex)
        r = subprocess.run([LATEX, "-interaction=nonstopmode", "-no-shell-escape", "out.tex"],
                           cwd=folder, capture_output=True, text=True, timeout=300)
        log = (folder / "out.log").read_text(errors="replace")
        assert SECRET not in r.stdout + log
        assert "secret.tex" not in log


def test_dot_and_markdown_escape_the_file_name(hostile_name):
    folder, name = hostile_name
    dot = _render(folder, name, "dot")
    title = [line for line in dot.split("\n") if "secret" in line]
    assert len(title) == 1 and title[0].strip().startswith("label=")
    assert 'x\\\\n\\\\input{secret}\\\\n\\\\x1b[31m`|\\".fgpt' in title[0]
    md = _render(folder, name, "markdown")
    [line] = [line for line in md.split("\n") if "secret" in line]
    assert line == "From ``x\\n\\input{secret}\\n\\x1b[31m`|\".fgpt``, with the defaults."


def test_terminal_output_escapes_the_file_name(hostile_name):
    folder, name = hostile_name
    (folder / name).write_text(SMALL.format(name="Small", share="").replace("H = 8", "H = 9"))
    r = _fgc_in(folder, "check", name)
    assert r.returncode == 1
    assert "\x1b" not in r.stderr and "\n\\input" not in r.stderr, r.stderr
    assert 'x\\n\\input{secret}\\n\\x1b[31m`|".fgpt:3:' in r.stderr


# ---------------------------------------------------------------- spec text on the terminal


ESCAPED = """model M {
  hyper L = 1, H = 8 # \x1b]0;pwned\x07 a comment that sets the terminal's title
  input x: {1..\x1bV}^n
}
"""


def test_control_characters_in_a_spec_are_shown_escaped(tmp_path):
    spec = tmp_path / "esc.fgpt"
    spec.write_text(ESCAPED)
    for fmt in ("text", "json", "github"):
        r = fgc("check", str(spec), "--format", fmt)
        assert r.returncode == 1
        out = r.stdout + r.stderr
        assert "\x1b" not in out and "\x07" not in out, out
        assert "\\x1b" in out, out
    r = fgc("check", str(spec))
    lines = r.stderr.split("\n")
    [quoted] = [k for k, line in enumerate(lines) if line.startswith("   3 | ")]
    assert lines[quoted] == "   3 |   input x: {1..\\x1bV}^n"
    caret = lines[quoted + 1].index("^")
    assert lines[quoted][caret:].startswith("\\x1b")  # under the escape, not beside it
    assert lines[quoted + 1].endswith("^^^^")


def test_strings_with_escapes_in_a_spec_are_shown_escaped(tmp_path):
    spec = _spec(tmp_path, "Small", 'share W_e with "a\x1b[2Jb.fgpt"')
    r = fgc("check", spec)
    assert r.returncode == 1
    assert "\x1b" not in r.stderr, r.stderr
    assert 'share W_e with "a\\x1b[2Jb.fgpt"' in r.stderr


# ---------------------------------------------------------------- printable, the helper


@pytest.mark.parametrize("raw, shown", [
    ("plain `W_e` text", "plain `W_e` text"),
    ("a\x1b[31mred", "a\\x1b[31mred"),
    ("line\nforged", "line\\nforged"),
    ("cr\rover", "cr\\rover"),
    ("nul\x00", "nul\\x00"),
    ("del\x7f c1\x9b", "del\\x7f c1\\x9b"),
    ("tab\there", "tab\\there"),
    ("bidi\u202eevil", "bidi\\u202eevil"),
    ("sep\u2028x", "sep\\u2028x"),
    ("byte\udcff", "byte\\xff"),  # a file name byte that is not UTF-8
    ("é ü 中 ≈ …", "é ü 中 ≈ …"),
])
def test_printable(raw, shown):
    assert printable(raw) == shown
    assert printable(shown) == shown  # idempotent: printing twice changes nothing
    assert printable("a\tb", keep="\t") == "a\tb"


def test_every_diagnostic_is_printable_whatever_made_it():
    """Checkpoint tensor names (compiler/weights.py) and other quoted names reach the
    terminal through Diagnostic, whoever builds it."""
    d = Diagnostic("error", "checkpoint has no tensor `h.0.\x1b[2Jattn\n`", None,
                   "did you mean `h.0.attn\r`?", ["from \x1b]0;x\x07"])
    shown = render(d, Sources())
    assert "\x1b" not in shown and "\r" not in shown and "\x07" not in shown
    assert shown.count("\n") == 2  # the message, the note and the hint: three lines
    data = json.dumps(d.as_dict())
    assert "\\u001b" not in data and "\\\\x1b" in data
    err = FgcError("unknown name `\x1b[1m`", Span("a\nb.fgpt", 1, 1))
    assert "\x1b" not in render(err.diagnostics[0], Sources())
    assert render(err.diagnostics[0], Sources()).startswith("a\\nb.fgpt:1:1: error:")
