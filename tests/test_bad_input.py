"""Bad input never crashes fgc: every rejection is a located diagnostic, exit 1, in bounded time.

Each case runs `fgc check` as a user would (a subprocess, with a timeout) and asserts the
command-line contract: `file:line:col: error: ...`, the source line, a caret, exit code 1,
and never a Python traceback or an "internal error".
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
from conftest import ROOT, fgc

TIMEOUT = 30  # seconds per fgc process; every case here takes well under one

GPT = ROOT / "specs" / "formal" / "gpt.fgpt"

# A small model that checks: every hyperparameter has a default, one block of layers.
BASE = """\
model M {
  hyper L = 2, H = 8, A = 2, D = H / A, n = 4, V = 10
  input x: {1..V}^n
  param W_e: R[V, H]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {
    H^(l) = MH(LN(H^(l-1)), Mask^AR) + H^(l-1)
  }
  output y = H^(L)
}
"""


# ---------------------------------------------------------------- helpers


def write(tmp_path: Path, text: str | bytes, name: str = "spec.fgpt") -> str:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return str(p)


def check(path: str, *opts: str, timeout: float = TIMEOUT):
    return fgc("check", *opts, path, timeout=timeout)


def no_crash(r) -> None:
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out[-3000:]
    assert "internal error" not in out, out[-3000:]


def errors_of(r, path: str) -> list[tuple[int, int, str]]:
    """The located errors in `fgc check` text output: (line, column, message)."""
    found = re.findall(rf"^{re.escape(path)}:(\d+):(\d+): error: (.*)$", r.stderr, re.M)
    return [(int(a), int(b), m) for a, b, m in found]


def assert_rejected(r, path: str, line: int | None = None, col: int | None = None,
                    caret: bool = True) -> list[tuple[int, int, str]]:
    """Exit 1, at least one located error, no unlocated error, the source line and a caret."""
    no_crash(r)
    out = r.stdout + r.stderr
    assert r.returncode == 1, f"exit {r.returncode}\n{out[-3000:]}"
    errs = errors_of(r, path)
    assert errs, f"no located `{path}:line:col: error:` in\n{out[-3000:]}"
    unlocated = re.findall(r"^(?:fgc: )?error: .*$", r.stderr, re.M)
    assert not unlocated, f"unlocated errors: {unlocated}"
    if line is not None:
        assert errs[0][0] == line, errs
    if col is not None:
        assert errs[0][1] == col, errs
    if caret:
        assert re.search(r"^ *\d+ \| ", r.stderr, re.M), f"no quoted source line in\n{out[:3000]}"
        assert re.search(r"^ *\| *\^+", r.stderr, re.M), f"no caret in\n{out[:3000]}"
    return errs


def accepted_or_rejected(r, path: str) -> None:
    """Either verdict is fine, but a rejection is located and nothing crashes."""
    no_crash(r)
    assert r.returncode in (0, 1), f"exit {r.returncode}\n{(r.stdout + r.stderr)[-3000:]}"
    if r.returncode == 1:
        assert_rejected(r, path, caret=False)


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """Run the CLI in-process (for the exhaustive cases); a crash escapes as an exception."""
    from compiler.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------- empty and truncated files


def test_empty_file(tmp_path):
    p = write(tmp_path, "")
    assert_rejected(check(p), p, line=1, col=1)


@pytest.mark.parametrize("text", ["   \n\t\n  \n", "# only a comment\n",
                                  "\n\n# one\n   # two\n\n", "# no newline at the end"],
                         ids=["whitespace", "comment", "comments", "no-newline"])
def test_whitespace_or_comment_only_file(tmp_path, text):
    p = write(tmp_path, text)
    assert_rejected(check(p), p, line=1)


def _truncation_points() -> list[tuple[str, int]]:
    """Byte offsets into gpt.fgpt: the start, inside tokens, after openers, before the end."""
    src = GPT.read_text(encoding="utf-8")
    points = [("first-byte", 1), ("quarter", len(src) // 4), ("half", len(src) // 2),
              ("before-last-brace", src.rindex("}"))]
    for token, into in [("model", 3), ("116_497_920", 5), ("OneHot", 3), ("Mask^AR", 5),
                        ("1..L", 2), ("H^(l-1)", 3), ("W_e^T", 4), ("preset paper {", 14),
                        ("expect params ==", 9), ("{1..V}^n", 3)]:
        at = src.find(token)
        if at >= 0:
            points.append((f"in-{token}", at + into))
    return points


@pytest.mark.parametrize("name,offset", _truncation_points(),
                         ids=[n for n, _ in _truncation_points()])
def test_truncated_spec(tmp_path, name, offset):
    data = GPT.read_bytes()[:offset]
    p = write(tmp_path, data)
    errs = assert_rejected(check(p), p)
    assert errs[0][0] <= data.count(b"\n") + 1


def test_every_truncation_of_gpt_is_located(tmp_path):
    """Cut gpt.fgpt at every byte (in-process, for speed): exit 1 with a located error."""
    src = GPT.read_bytes()
    last = src.rindex(b"}")
    p = str(tmp_path / "cut.fgpt")
    bad = []
    for k in range(0, last + 1):
        Path(p).write_bytes(src[:k])
        code, out, err = run_main(["check", "--format", "json", p])
        report = json.loads(out)
        diags = report["files"][0]["diagnostics"]
        errors = [d for d in diags if d["severity"] == "error"]
        if code != 1 or not errors or any("line" not in d for d in errors) or \
                any("internal error" in d["message"] for d in errors):
            bad.append((k, code, errors[:1]))
    assert not bad, f"{len(bad)} bad cuts, first: {bad[:3]}"


# ---------------------------------------------------------------- bytes that are not UTF-8


@pytest.mark.parametrize("data,line,col", [
    (b"model M {\n  hyper H = 8\n  x = \xff\xfe\n}\n", 3, 7),
    (b"# caf\xe9 au lait\n" + BASE.encode(), 1, 6),           # Latin-1 in a comment
    (BASE.encode() + b"# cut in a character: \xe2\x82", 11, 23),  # truncated UTF-8 sequence
    (b"\xff\xfem\x00o\x00d\x00", 1, 1),                         # UTF-16 with its BOM
], ids=["mid-line", "latin1-comment", "truncated-sequence", "utf16"])
def test_non_utf8_bytes_are_located(tmp_path, data, line, col):
    p = write(tmp_path, data)
    r = check(p)
    assert_rejected(r, p, line=line, col=col, caret=False)
    assert "UTF-8" in r.stderr


def test_non_utf8_diagnostic_quotes_the_line(tmp_path):
    p = write(tmp_path, b"model M {\n  hyper H = 8\n  x = \xff\xfe\n}\n")
    assert_rejected(check(p), p, line=3, col=7, caret=True)


def test_windows_line_endings(tmp_path):
    p = write(tmp_path, GPT.read_bytes().replace(b"\n", b"\r\n"))
    r = check(p)
    no_crash(r)
    assert r.returncode == 0, r.stderr
    bad = write(tmp_path, BASE.replace("\n", "\r\n").replace("@ W_e", "@ W_ee"), "bad.fgpt")
    r = check(bad)
    assert_rejected(r, bad, line=5, col=23)
    assert "\r" not in r.stderr


def test_old_mac_line_endings(tmp_path):
    p = write(tmp_path, GPT.read_bytes().replace(b"\n", b"\r"))
    r = check(p)
    no_crash(r)
    assert "\r" not in r.stderr
    assert r.returncode == 0 or "line ending" in r.stderr, r.stderr


def test_nul_byte(tmp_path):
    p = write(tmp_path, BASE.replace("W_e", "W\x00e", 1))
    assert_rejected(check(p), p, line=4)


def test_utf8_byte_order_mark(tmp_path):
    # Windows editors write one; skipping it or rejecting it (located) are both fine
    p = write(tmp_path, "\ufeff" + BASE)
    accepted_or_rejected(check(p), p)


# ---------------------------------------------------------------- names


@pytest.mark.parametrize("old,new,line,quoted,suggested", [
    ("OneHot(x) @ W_e", "OneHot(x) @ W_ee", 5, "W_ee", "W_e"),
    ("param W_e: R[V, H]", "param W_e: R[V, Hh]", 4, None, "H"),
    ("output y = H^(L)", "output y = Softmx(H^(L))", 9, "Softmx", "Softmax"),
    ("  input x", "  preset p { Hh = 16 }\n  input x", 3, None, "H"),
], ids=["value", "size", "module", "preset-key"])
def test_unknown_name_suggests_the_close_one(tmp_path, old, new, line, quoted, suggested):
    p = write(tmp_path, BASE.replace(old, new))
    r = check(p)
    errs = assert_rejected(r, p, line=line)
    if quoted:
        assert quoted in errs[0][2]
    assert f"did you mean `{suggested}`" in r.stderr


def test_unknown_name_far_from_everything_is_not_guessed(tmp_path):
    p = write(tmp_path, BASE.replace("output y = H^(L)", "output y = Qqzzxv"))
    r = check(p)
    assert_rejected(r, p, line=9)
    assert "did you mean" not in r.stderr


def test_unknown_module_hyperparameter(tmp_path):
    p = write(tmp_path, BASE.replace("output y = H^(L)", "output y = FF^GELU[G=16](H^(L))"))
    r = check(p)
    errs = assert_rejected(r, p, line=9)
    assert "G" in errs[0][2]


# ---------------------------------------------------------------- one label, one instance

LABELLED = """model T {{
  hyper L = 4, H = 8, F = 4 * H, V = 11, n = 16
  input x: {{1..V}}^n
  param W_e: R[V, H]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {{
    Hhat^(l) = {body} + H^(l-1)
    H^(l) = Hhat^(l)
  }}
  output probs = Softmax(H^(L) @ W_e^T)
}}
"""


@pytest.mark.parametrize("body,words", [
    ("(mlp: FF^GELU(H^(l-1)) if l is even else mlp: FF^GELU[F = 2 * H](H^(l-1)))",
     "with other hyperparameters (F = 2*H) than its use at 7:17"),
    ("(mlp: FF^GELU(H^(l-1)) if l is even else mlp: FF^GELU(2 * H^(l-1)))",
     "under another condition (not l is even) than its use at 7:17"),
], ids=["other-sizes", "other-condition"])
def test_a_label_that_would_be_two_instances(tmp_path, body, words):
    """A label names one instance: used again with other hyperparameters, or under another
    condition on the layers (where the instance would exist in other layers), it is refused
    at the second use, rather than counted and compiled as the first use alone."""
    p = write(tmp_path, LABELLED.format(body=body))
    errs = assert_rejected(check(p), p, line=7, col=57)
    assert "label `mlp` names a use of `FF^GELU` " + words in errs[0][2], errs
    r = fgc("params", p)
    assert r.returncode == 1 and "Traceback" not in r.stderr


def test_a_label_used_twice_alike_is_one_instance(tmp_path):
    """The same label used twice with the same sizes and condition is one instance, its
    parameters counted once per layer (weights shared between its two uses)."""
    body = "mlp: FF^GELU(mlp: FF^GELU(H^(l-1)))"
    p = write(tmp_path, LABELLED.format(body=body))
    r = fgc("params", p, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["total"] == 11 * 8 + 4 * (2 * 32 * 8 + 32 + 8)


# ---------------------------------------------------------------- arity and cycles


@pytest.mark.parametrize("call,words", [
    ("MH(H^(L))", ["2", "1"]),                 # a stdlib module, one argument short
    ("LN(H^(L), H^(L))", ["1", "2"]),          # one too many
    ("Attention(H^(L), H^(L), H^(L))", ["4", "3"]),
    ("exp(H^(L), H^(L))", ["1", "2"]),         # a primitive
    ("MH[1, 2, 3](H^(L), Mask^AR)", ["hyperparameter"]),
], ids=["MH-short", "LN-long", "Attention-short", "primitive", "module-hypers"])
def test_wrong_arity(tmp_path, call, words):
    p = write(tmp_path, BASE.replace("output y = H^(L)", f"output y = {call}"))
    r = check(p)
    errs = assert_rejected(r, p, line=9)
    for w in words:
        assert w in errs[0][2], errs


CYCLE = """\
module A(X: R[n, H]) -> R[n, H] {
  A(X) = B(X)
}
module B(X: R[n, H]) -> R[n, H] {
  B(X) = C(X)
}
module C(X: R[n, H]) -> R[n, H] {
  C(X) = A(X) + X
}
model M {
  hyper H = 8, n = 4, V = 10
  input x: {1..V}^n
  param W_e: R[V, H]
  output y = A(OneHot(x) @ W_e)
}
"""


@pytest.mark.parametrize("text", [
    CYCLE.replace("C(X)", "A(X)", 1),   # A -> B -> A
    CYCLE,                              # A -> B -> C -> A
    "module A(X: R[n, H]) -> R[n, H] {\n  A(X) = A(X) + X\n}\n",  # A -> A, no model
], ids=["two", "three", "self"])
def test_cyclic_module_definitions(tmp_path, text):
    p = write(tmp_path, text)
    r = check(p, timeout=TIMEOUT)
    errs = assert_rejected(r, p)
    assert any("A" in m and ("itself" in m or "recurs" in m or "cycl" in m) for _, _, m in errs)


def test_cyclic_hyperparameters(tmp_path):
    p = write(tmp_path, BASE.replace("D = H / A", "D = F / A, F = 4 * D"))
    r = check(p)
    errs = assert_rejected(r, p, line=2)
    assert "D" in errs[0][2] and "F" in errs[0][2]


# ---------------------------------------------------------------- deep and long input

N_DEEP = 5000


def test_5000_nested_parentheses(tmp_path):
    expr = "(" * N_DEEP + "H^(L)" + ")" * N_DEEP
    p = write(tmp_path, BASE.replace("output y = H^(L)", f"output y = {expr}"))
    accepted_or_rejected(check(p), p)


def test_5000_nested_parentheses_in_a_size(tmp_path):
    dim = "(" * N_DEEP + "H" + ")" * N_DEEP
    p = write(tmp_path, BASE.replace("param W_e: R[V, H]", f"param W_e: R[V, {dim}]"))
    accepted_or_rejected(check(p), p)


def test_5000_unclosed_parentheses(tmp_path):
    p = write(tmp_path, BASE.replace("output y = H^(L)", "output y = " + "(" * N_DEEP + "H^(L)"))
    assert_rejected(check(p), p)


@pytest.mark.parametrize("expr", [
    "LN(" * N_DEEP + "H^(L)" + ")" * N_DEEP,
    "-" * N_DEEP + "H^(L)",
    "-(" * N_DEEP + "H^(L)" + ")" * N_DEEP,
    "H^(L) if n > 1 else " * N_DEEP + "H^(L)",
    "H^(L)" + "^T" * N_DEEP,
    "H^(L)" + "[1]" * N_DEEP,
], ids=["calls", "negations", "negated-parens", "conditionals", "transposes", "indexes"])
def test_5000_deep_expressions(tmp_path, expr):
    p = write(tmp_path, BASE.replace("output y = H^(L)", f"output y = {expr}"))
    accepted_or_rejected(check(p), p)


def _long_output_lines_are_windowed(r) -> None:
    longest = max((len(line) for line in (r.stdout + r.stderr).splitlines()), default=0)
    assert longest < 1000, f"a {longest}-character output line"


def _size_limit() -> int:
    from compiler.pipeline import MAX_FILE_BYTES
    return MAX_FILE_BYTES


def _long() -> int:
    """A line as long as fgc reads: 1 MB, or just under fgc's limits on files and lines."""
    from compiler import pipeline
    return min(1_000_000, _size_limit() - 2_000, getattr(pipeline, "MAX_LINE", 10**9) - 100)


def _one_mb_line_cases() -> dict[str, str]:
    return {
        "comment": "# " + "x" * 1_000_000 + "\n" + BASE,
        "identifier": BASE.replace("output y = H^(L)", "output y = Y" + "y" * 1_000_000),
        "spaces": BASE.replace("output y = H^(L)", "output y = H^(L)" + " " * 1_000_000 + "$"),
        "expression": BASE.replace("output y = H^(L)",
                                   "output y = " + " + ".join(["H^(L)"] * 130_000)),
    }


@pytest.mark.parametrize("kind", sorted(_one_mb_line_cases()))
def test_1mb_line(tmp_path, kind):
    """Accepted, rejected where it goes wrong, or refused for its size: located, windowed, fast."""
    p = write(tmp_path, _one_mb_line_cases()[kind])
    assert Path(p).stat().st_size > 1_000_000
    r = check(p)
    accepted_or_rejected(r, p)
    _long_output_lines_are_windowed(r)


def test_long_comment_line(tmp_path):
    p = write(tmp_path, "# " + "x" * _long() + "\n" + BASE)
    r = check(p)
    no_crash(r)
    assert r.returncode == 0, r.stderr[-2000:]


def test_long_identifier(tmp_path):
    name = "Y" + "y" * _long()
    p = write(tmp_path, BASE.replace("output y = H^(L)", f"output y = {name}"))
    assert_rejected(check(p), p, line=9, col=14)


def test_long_identifier_is_elided_in_the_message(tmp_path):
    name = "Y" + "y" * _long()
    p = write(tmp_path, BASE.replace("output y = H^(L)", f"output y = {name}"))
    _long_output_lines_are_windowed(check(p))


def test_long_run_of_spaces_then_a_bad_character(tmp_path):
    n = _long()
    p = write(tmp_path, BASE.replace("output y = H^(L)", "output y = H^(L)" + " " * n + "$"))
    r = check(p)
    errs = assert_rejected(r, p, line=9)
    assert errs[0][1] > n
    _long_output_lines_are_windowed(r)


def test_long_expression_line(tmp_path):
    # as many terms as fit on one line under the size limit: any verdict, in bounded time
    expr = " + ".join(["H^(L)"] * (_long() // 8))
    p = write(tmp_path, BASE.replace("output y = H^(L)", f"output y = {expr}"))
    r = check(p)
    accepted_or_rejected(r, p)
    _long_output_lines_are_windowed(r)


def test_many_layers_with_a_per_layer_condition(tmp_path):
    # 100,000 layers is the most fgc accepts; a condition on l must not make counting loop
    # over them (R17: it once evaluated the condition per layer, 3-7 s here)
    text = BASE.replace("L = 2", "L = 100_000").replace(
        "H^(l) = MH(LN(H^(l-1)), Mask^AR) + H^(l-1)",
        "M^(l) = Mask^AR if l is even else Mask^BD\n    H^(l) = MH(LN(H^(l-1)), M^(l)) + H^(l-1)")
    p = write(tmp_path, text)
    r = check(p)
    accepted_or_rejected(r, p)


def test_a_long_flat_sum_is_not_called_nesting(tmp_path):
    expr = " + ".join(["H^(L)"] * 300)
    p = write(tmp_path, BASE.replace("output y = H^(L)", f"output y = {expr}"))
    r = check(p)
    no_crash(r)
    assert "nested" not in r.stderr


def test_file_over_the_size_limit(tmp_path):
    p = write(tmp_path, BASE + "#" * (_size_limit() + 10) + "\n")
    r = check(p)
    assert_rejected(r, p, line=1, caret=False)
    _long_output_lines_are_windowed(r)


# ---------------------------------------------------------------- absurd numbers


def test_10000_digit_literal(tmp_path):
    p = write(tmp_path, BASE.replace("H = 8", "H = " + "9" * 10_000))
    r = check(p)
    errs = assert_rejected(r, p, line=2)
    assert "large" in errs[0][2] or "long" in errs[0][2], errs  # too many digits, or too long
    _long_output_lines_are_windowed(r)


@pytest.mark.parametrize("where", ["size", "expect"])
def test_10000_digit_literal_elsewhere(tmp_path, where):
    big = "9" * 10_000
    if where == "size":
        text = BASE.replace("param W_e: R[V, H]", f"param W_e: R[V, H], W: R[H, {big}]")
    else:
        text = BASE.replace("output y = H^(L)", f"output y = H^(L)\n  expect params == {big}")
    p = write(tmp_path, text)
    assert_rejected(check(p), p)


@pytest.mark.parametrize("value", [
    "1" + "0" * 40,                    # 10**40 as a literal
    " * ".join(["10000000000"] * 4),   # 10**40 as a product
    "9" * 38 + "T",                    # 38 digits with a suffix
    "1e999999999",
], ids=["literal", "product", "suffix", "exponent"])
def test_absurd_hyperparameter_via_preset(tmp_path, value):
    text = BASE.replace("hyper L = 2, H = 8,", "hyper L = 2, H,").replace(
        "  input x", f"  preset huge {{ H = {value} }}\n  input x")
    p = write(tmp_path, text)
    r = check(p)
    errs = assert_rejected(r, p, line=3)
    assert "large" in errs[0][2]


@pytest.mark.parametrize("text", [
    BASE.replace("L = 2", "L = 1000000000"),
    BASE.replace("hyper L = 2,", "hyper L,").replace(
        "  input x", "  preset deep { L = 1_000_000_000 }\n  input x"),
    BASE.replace("param W_e: R[V, H]", "param W_e: R[V, H], W: R[H, 100000000000000000000]"),
], ids=["default", "preset", "dimension"])
def test_a_billion_layers_or_a_huge_dimension(tmp_path, text):
    p = write(tmp_path, text)
    r = check(p)
    assert_rejected(r, p)


@pytest.mark.parametrize("value", ["8.5", "1e300"])
def test_float_hyperparameter_used_as_a_size(tmp_path, value):
    p = write(tmp_path, BASE.replace("H = 8", f"H = {value}"))
    r = check(p)
    assert_rejected(r, p)


@pytest.mark.parametrize("old,new", [
    ("param W_e: R[V, H]", "param W_e: R[V, H], w: R[H - inf]"),
    ("+ H^(l-1)\n", "+ H^(l-inf-1)\n"),
], ids=["size", "layer-index"])
def test_inf_in_a_size_expression(tmp_path, old, new):
    p = write(tmp_path, BASE.replace(old, new))
    assert_rejected(check(p), p)


@pytest.mark.parametrize("old,new", [
    ("D = H / A", "D = H / 0"),
    ("D = H / A", "D = H % 0"),
    ("param W_e: R[V, H]", "param W_e: R[V, H], W: R[H % 0]"),
], ids=["divide", "modulo-hyper", "modulo-size"])
def test_zero_divisor_in_a_size(tmp_path, old, new):
    p = write(tmp_path, BASE.replace(old, new))
    assert_rejected(check(p), p)


def test_fractional_hyperparameter_in_a_preset_reads_well(tmp_path):
    text = BASE.replace("hyper L = 2, H = 8,", "hyper L = 2, H,").replace(
        "  input x", "  preset p { H = 8.5 }\n  input x")
    p = write(tmp_path, text)
    r = check(p)
    errs = assert_rejected(r, p, line=3)
    msg = errs[0][2]
    assert "8.5" in msg or "17/2" in msg, msg
    assert "H = H =" not in msg and "with  (" not in msg, msg


def test_absurd_layer_count_is_reported_once(tmp_path):
    p = write(tmp_path, BASE.replace("L = 2", "L = 1000000000"))
    r = check(p)
    errs = assert_rejected(r, p, line=6)
    assert len(errs) == 1, errs


AFTER_THE_LAYERS = BASE.replace("  output y = H^(L)", "  Hf = LN(H^(L))\n  output y = Hf")
PROJECTED = """\
model M {
  hyper L, H, n
  input x: R[n, H]
  param W: R[H, H]
  H^(0) = x @ W
  layers l in 1..L {
    H^(l) = H^(l-1) @ W
  }
  Hf = H^(L) @ W
  output P = Hf @ W
}
"""


TABLE = """\
module T[n, d, theta, f] -> R[n, d] {
  T[p, k] = cos((p - 1) / pow(theta, 2 * ((k - 1) % (d / 2)) / d) / f)
}
model M {
  hyper H = 4, n = 4, theta = 10000.0, f = 2.0
  input x: R[n, H]
  param W: R[H, H]
  Y = x @ W * T[n, H, theta, f] / f
  output P = Y
}
"""


@pytest.mark.parametrize("sets, line, col, words", [
    ({"f": "0"}, 8, 15, "a division by f = 0"),  # in the module, through its use
    ({"theta": "-10000"}, 8, 15, "theta = -10000, negative, raised to real powers"),
    ({"f": "0.0", "H": "8"}, 8, 15, "a division by f = 0"),
], ids=["zero-in-a-module", "negative-base", "zero-real"])
def test_a_value_that_would_be_infinite_or_nan_is_refused(tmp_path, sets, line, col, words):
    """A real hyperparameter that makes every value of an equation infinite or NaN (a
    division by a factor of 0, a negative rotary base raised to real powers) is an error
    at the use, at check time and before compiling, not a model computing NaN."""
    p = write(tmp_path, TABLE)
    assert check(p).returncode == 0
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    for r in (fgc("params", p, *args),
              fgc("compile", p, *args, "--target", "onnx", "-o", str(tmp_path / "out"))):
        errs = assert_rejected(r, p, line=line, col=col)
        assert words in errs[0][2], errs
    assert not (tmp_path / "out").exists()
    # the model's own equation too (line 8's `/ f`), the module's once
    r = fgc("params", p, "--set", "f=0")
    assert len(errors_of(r, p)) == 2, r.stderr


@pytest.mark.parametrize("text, line", [
    (AFTER_THE_LAYERS.replace("L = 2", "L = 1000000000"), 6),  # the layers
    (PROJECTED.replace("R[n, H]", "R[m, H]"), 3),  # an input
    (PROJECTED.replace("W: R[H, H]", "W: R[H, Z]"), 4),  # a parameter
], ids=["layers", "input", "parameter"])
def test_what_a_failed_statement_defines_fails_silently_after_it(tmp_path, text, line):
    """One error for one mistake: the names a failed statement defines, and then those
    computed from them, are not reported again as unknown (`unknown name `Hf``)."""
    p = write(tmp_path, text)
    errs = assert_rejected(check(p), p, line=line)
    assert len(errs) == 1, errs


# ---------------------------------------------------------------- shapes


MATMUL = """\
model M {
  hyper H = 8, D = 4, n = 4, V = 10
  input x: {1..V}^n
  param W_e: R[V, H], W: R[D, H]
  H^(0) = OneHot(x) @ W_e
  Y = H^(0) @ W
  output y = Y
}
"""


@pytest.mark.parametrize("symbolic", [False, True], ids=["numeric", "symbolic"])
def test_mismatched_matmul(tmp_path, symbolic):
    text = MATMUL.replace("hyper H = 8, D = 4, n = 4, V = 10", "hyper H, D, n, V") \
        if symbolic else MATMUL
    p = write(tmp_path, text)
    r = check(p)
    errs = assert_rejected(r, p, line=6)
    assert errs[0][2] == ("cannot multiply R[n×H] by R[D×H]: inner dimensions H and D differ")
    # the caret sits under the expression `H^(0) @ W`
    lines = r.stderr.splitlines()
    head = next(i for i, s in enumerate(lines) if s.startswith(f"{p}:6:"))
    quoted, caret = lines[head + 1], lines[head + 2]
    assert quoted.split("|", 1)[1] == "   Y = H^(0) @ W"
    text_start = quoted.index("|") + 2
    marks = [i for i, ch in enumerate(caret) if ch == "^"]
    assert marks, caret
    underlined = quoted[marks[0]:marks[-1] + 1]
    assert marks[0] - text_start == quoted[text_start:].index("H^(0)")
    assert "@" in underlined


def test_broadcast_mismatch(tmp_path):
    p = write(tmp_path, MATMUL.replace("W: R[D, H]", "b: R[D]").replace(
        "Y = H^(0) @ W", "Y = H^(0) + b"))
    r = check(p)
    errs = assert_rejected(r, p, line=6)
    assert "H" in errs[0][2] and "D" in errs[0][2]


def test_compound_dimensions_are_bracketed_in_messages(tmp_path):
    p = write(tmp_path, BASE.replace("param W_e: R[V, H]", "param W_e: R[V, H], W_x: R[H + 1, H]")
              .replace("output y = H^(L)", "output y = H^(L) @ W_x"))
    r = check(p)
    errs = assert_rejected(r, p, line=9)
    assert "H + 1×" not in errs[0][2], errs


@pytest.mark.parametrize("rows", ["1..0", "3..1"])
def test_empty_or_reversed_row_range(tmp_path, rows):
    p = write(tmp_path, BASE.replace("output y = H^(L)", f"output y = H^(L)[{rows}, :]"))
    assert_rejected(check(p), p, line=9)


def test_ir_never_shows_a_negative_dimension(tmp_path):
    p = write(tmp_path, BASE.replace("output y = H^(L)", "output y = H^(L)[3..1, :]"))
    r = fgc("ir", p, timeout=TIMEOUT)
    no_crash(r)
    assert r.returncode == 1 or "[-" not in r.stdout, r.stdout[-500:]


DIVIDE = """\
model M {
  hyper L, H, A, D = H / A, n = 4, V = 10
  preset fine { L = 2, H = 12, A = 3 }
  preset uneven { L = 2, H = 10, A = 3 }
  input x: {1..V}^n
  param W_e: R[V, H]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {
    H^(l) = MH(LN(H^(l-1)), Mask^AR) + H^(l-1)
  }
  output y = H^(L)
}
"""


def test_heads_not_dividing_the_width_in_a_preset(tmp_path):
    p = write(tmp_path, DIVIDE)
    r = check(p)
    errs = assert_rejected(r, p)
    text = " ".join(m for _, _, m in errs) + r.stderr
    assert "uneven" in text, r.stderr
    assert "fine" not in " ".join(m for _, _, m in errs)
    assert "divide" in text or "whole number" in text, r.stderr


def test_heads_not_dividing_the_width_in_params(tmp_path):
    p = write(tmp_path, DIVIDE)
    r = fgc("params", p, "--preset", "uneven", timeout=TIMEOUT)
    assert_rejected(r, p, caret=False)
    r = fgc("params", p, "--preset", "fine", timeout=TIMEOUT)
    no_crash(r)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("old,new", [
    ("H = 8", "H = 0"),
    ("hyper L = 2, H = 8,", "hyper L = 2, H,"),   # with a preset, below
    ("param W_e: R[V, H]", "param W_e: R[V, H], W: R[H - 8, 2]"),
], ids=["zero-default", "negative-preset", "negative-expression"])
def test_non_positive_size(tmp_path, old, new):
    text = BASE.replace(old, new)
    if "hyper L = 2, H," in text:
        text = text.replace("  input x", "  preset p { H = -3 }\n  input x")
    p = write(tmp_path, text)
    r = check(p)
    errs = assert_rejected(r, p)
    assert any("positive" in m for _, _, m in errs), errs


SHAPE = """\
model M {
  hyper L = 2, H = 8, F = 16, n = 4, V = 10
  input x: {1..V}^n
  param W_e: R[V, H], W: R[H, F]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {
    H^(l) = H^(l-1) @ W
  }
  output y = H^(L)
}
"""


def test_layer_that_changes_the_carried_shape(tmp_path):
    p = write(tmp_path, SHAPE)
    r = check(p)
    errs = assert_rejected(r, p)
    assert "H^(l)" in errs[0][2] and "H^(l-1)" in errs[0][2]


def test_layer_shape_error_points_at_the_equation(tmp_path):
    p = write(tmp_path, SHAPE)
    assert_rejected(check(p), p, line=7)


def test_layer_index_beyond_the_current_layer(tmp_path):
    p = write(tmp_path, BASE.replace("MH(LN(H^(l-1))", "MH(LN(H^(l+1))"))
    assert_rejected(check(p), p, line=7)


# ---------------------------------------------------------------- definitions and types


def test_where_defines_a_name_twice(tmp_path):
    text = ("module Foo(X: R[n, H]) -> R[n, H] {\n  Foo(X) = a where a = X, a = X + X\n}\n"
            + BASE.replace("output y = H^(L)", "output y = Foo(H^(L))"))
    p = write(tmp_path, text)
    assert_rejected(check(p), p, line=2)


def test_two_outputs_with_one_name(tmp_path):
    # `output y = H^(0)` as the second is rejected ("reuses the name of a value"); the very
    # same line twice is not, and the IR then has two outputs of one name
    p = write(tmp_path, BASE.replace("output y = H^(L)", "output y = H^(L)\n  output y = H^(L)"))
    assert_rejected(check(p), p, line=10)


def test_zero_heads(tmp_path):
    p = write(tmp_path, BASE.replace("A = 2", "A = 0"))
    r = check(p)
    errs = assert_rejected(r, p, line=2)
    assert "without a value" not in errs[0][2], errs


@pytest.mark.parametrize("typ", ["{5..1}^n", "{1..0}^n", "{1..V}^0"])
def test_empty_input_type(tmp_path, typ):
    p = write(tmp_path, BASE.replace("input x: {1..V}^n", f"input x: {typ}"))
    r = check(p)
    assert_rejected(r, p, line=3)


# ---------------------------------------------------------------- families


def test_family_member_out_of_range_in_a_module(tmp_path):
    text = ("module Two(X: R[n, H]) -> R[n, H] {\n  Two(X) = X @ W_3\n"
            "  param W_i: R[H, H] for i in 1..2\n}\n") + BASE.replace(
        "output y = H^(L)", "output y = Two(H^(L))")
    p = write(tmp_path, text)
    assert_rejected(check(p), p, line=2)


def test_family_member_out_of_range_in_a_model(tmp_path):
    p = write(tmp_path, BASE.replace("param W_e: R[V, H]",
                                     "param W_e: R[V, H], W_i: R[H, H] for i in 1..2").replace(
        "output y = H^(L)", "output y = H^(L) @ W_3"))
    r = check(p)
    errs = assert_rejected(r, p, line=9)
    assert "3" in errs[0][2]


def test_window_longer_than_the_context(tmp_path):
    """Mask^ST's w > n, in any spec that uses it: located at the use by `fgc check`, and
    refused for a `--set` that makes it so."""
    p = write(tmp_path, BASE.replace("V = 10", "V = 10, w = 6").replace("Mask^AR", "Mask^ST"))
    errs = assert_rejected(check(p), p, line=7, col=29)
    assert "window of w = 6" in errs[0][2] and "context of 4 positions" in errs[0][2]
    ok = write(tmp_path, Path(p).read_text().replace("w = 6", "w = 4"), "ok.fgpt")
    assert check(ok).returncode == 0
    r = fgc("params", ok, "--set", "n=3", timeout=TIMEOUT)
    no_crash(r)
    assert r.returncode == 1 and "context of 3 positions" in r.stderr


def test_family_defined_as_a_copy(tmp_path):
    text = ("module Two(X: R[n, H]) -> R[n, H] {\n  Two(X) = Concat(h_1, ..., h_2) @ W\n"
            "    where h_i = X for i in 1..2\n  param W: R[2 * H, H]\n}\n") + BASE.replace(
        "output y = H^(L)", "output y = Two(H^(L))")
    p = write(tmp_path, text)
    accepted_or_rejected(check(p), p)


# ---------------------------------------------------------------- files that are not specs


@pytest.mark.parametrize("command", ["check", "params", "ir"])
def test_missing_file(tmp_path, command):
    p = str(tmp_path / "nope.fgpt")
    r = fgc(command, p, timeout=TIMEOUT)
    no_crash(r)
    assert r.returncode in (1, 2)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "nope.fgpt" in lines[0]


@pytest.mark.parametrize("command", ["params", "ir"])
def test_directory_as_file(tmp_path, command):
    (tmp_path / "a.fgpt").write_text(BASE)
    r = fgc(command, str(tmp_path), timeout=TIMEOUT)
    no_crash(r)
    assert r.returncode in (1, 2)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "directory" in lines[0]


def test_check_a_directory_checks_the_files_below(tmp_path):
    (tmp_path / "good.fgpt").write_text(BASE)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "bad.fgpt").write_text(BASE.replace("W_e\n", "W_ee\n", 1))
    r = fgc("check", str(tmp_path), timeout=TIMEOUT)
    no_crash(r)
    assert r.returncode == 1
    assert f"{tmp_path / 'good.fgpt'}: ok" in r.stdout
    assert errors_of(r, str(tmp_path / "sub" / "bad.fgpt"))


def test_check_a_directory_named_like_a_spec(tmp_path):
    (tmp_path / "odd.fgpt").mkdir()
    r = fgc("check", str(tmp_path), timeout=TIMEOUT)
    no_crash(r)
    assert r.returncode in (1, 2)
    assert "directory" in r.stderr


def test_check_a_directory_without_specs(tmp_path):
    (tmp_path / "notes.txt").write_text("not a spec")
    r = fgc("check", str(tmp_path), timeout=TIMEOUT)
    no_crash(r)
    assert r.returncode in (1, 2)
    assert r.stderr.strip()


# ---------------------------------------------------------------- expectations


def test_wrong_exact_expectation_names_both_numbers(tmp_path):
    p = write(tmp_path, GPT.read_text().replace("116_497_920", "116_497_921"))
    r = check(p)
    errs = assert_rejected(r, p)
    digits = re.sub(r"[,_]", "", errs[0][2])
    assert "116497920" in digits and "116497921" in digits, errs


def test_wrong_symbolic_expectation_is_an_error(tmp_path):
    p = write(tmp_path, GPT.read_text().replace("V*H + n*H", "V*H + 2*n*H"))
    r = check(p)
    errs = assert_rejected(r, p)
    assert "2*n*H" in errs[0][2].replace(" ", ""), errs


APPROX = GPT.read_text().replace("expect params == 116_497_920", "expect params ~ 100M")


def test_wrong_approximate_expectation_warns_with_both_numbers(tmp_path):
    p = write(tmp_path, APPROX)
    r = check(p)
    no_crash(r)
    assert r.returncode == 0, r.stderr
    warns = re.findall(rf"^{re.escape(p)}:(\d+):(\d+): warning: (.*)$", r.stderr, re.M)
    assert warns, r.stderr
    msg = warns[0][2].replace(",", "")
    assert "116497920" in msg or "116.5M" in msg, msg
    assert "100M" in msg, msg


def test_strict_turns_the_warning_into_a_failure(tmp_path):
    p = write(tmp_path, APPROX)
    r = check(p, "--strict")
    no_crash(r)
    assert r.returncode == 1
    assert "100M" in r.stderr


@pytest.mark.parametrize("value", [
    "inf",
    pytest.param("-inf", id="minus-inf"),
])
@pytest.mark.parametrize("where", [
    "model",
    "preset",
])
def test_an_infinite_expectation_is_an_error(tmp_path, value, where):
    if where == "model":
        text = BASE.replace("output y = H^(L)", f"output y = H^(L)\n  expect params == {value}")
    else:
        text = GPT.read_text().replace("116_497_920", value)
    p = write(tmp_path, text)
    assert_rejected(check(p), p)


def test_right_approximate_expectation_is_quiet(tmp_path):
    p = write(tmp_path, GPT.read_text().replace("expect params == 116_497_920",
                                                "expect params ~ 116M"))
    r = check(p, "--strict")
    no_crash(r)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr


# ---------------------------------------------------------------- machine-readable formats


def _three_files(tmp_path) -> tuple[str, str, str]:
    good = write(tmp_path, BASE, "good.fgpt")
    warn = write(tmp_path, APPROX, "warn.fgpt")
    bad = write(tmp_path, MATMUL, "bad.fgpt")
    return good, warn, bad


def test_json_format(tmp_path):
    good, warn, bad = _three_files(tmp_path)
    r = fgc("check", "--format", "json", good, warn, bad, timeout=TIMEOUT)
    no_crash(r)
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert data["ok"] is False
    files = {f["file"]: f for f in data["files"]}
    assert list(files) == [good, warn, bad]
    assert files[good] == {"file": good, "ok": True, "diagnostics": []}
    assert files[warn]["ok"] is True
    assert [d["severity"] for d in files[warn]["diagnostics"]] == ["warning"]
    assert files[bad]["ok"] is False
    for f in data["files"]:
        for d in f["diagnostics"]:
            assert d["severity"] in ("error", "warning")
            assert isinstance(d["message"], str) and d["message"]
            assert d["hint"] is None or isinstance(d["hint"], str)
            assert d["file"] == f["file"]
            assert isinstance(d["line"], int) and d["line"] >= 1
            assert isinstance(d["column"], int) and d["column"] >= 1
    (d,) = files[bad]["diagnostics"]
    assert (d["line"], d["column"]) == (6, 7)
    assert "inner dimensions H and D differ" in d["message"]


def test_json_format_all_ok(tmp_path):
    good = write(tmp_path, BASE)
    r = fgc("check", "--format", "json", good, timeout=TIMEOUT)
    assert r.returncode == 0
    assert json.loads(r.stdout)["ok"] is True


def test_json_format_with_a_missing_file(tmp_path):
    r = fgc("check", "--format", "json", str(tmp_path / "nope.fgpt"), timeout=TIMEOUT)
    no_crash(r)
    assert r.returncode in (1, 2)
    if r.returncode == 1:
        data = json.loads(r.stdout)
        assert data["ok"] is False


GITHUB = re.compile(r"^::(error|warning) file=([^,:]+),line=(\d+),col=(\d+)::(.+)$")


def test_github_format(tmp_path):
    good, warn, bad = _three_files(tmp_path)
    r = fgc("check", "--format", "github", good, warn, bad, timeout=TIMEOUT)
    no_crash(r)
    assert r.returncode == 1
    lines = [s for s in r.stdout.splitlines() if s.strip()]
    assert len(lines) == 2, r.stdout
    parsed = [GITHUB.match(s) for s in lines]
    assert all(parsed), lines
    kinds = {(m.group(1), m.group(2)) for m in parsed}
    assert kinds == {("warning", warn), ("error", bad)}
    err = next(m for m in parsed if m.group(1) == "error")
    assert (err.group(3), err.group(4)) == ("6", "7")
    assert "\n" not in err.group(5)


def test_github_format_strict(tmp_path):
    warn = write(tmp_path, APPROX, "warn.fgpt")
    r = fgc("check", "--format", "github", "--strict", warn, timeout=TIMEOUT)
    assert r.returncode == 1
    (line,) = [s for s in r.stdout.splitlines() if s.strip()]
    m = GITHUB.match(line)
    assert m and m.group(1) == "error", line


def test_github_format_escapes_the_file_name(tmp_path):
    # workflow commands end a property at `,` and the properties at `::`; a path holding
    # either must be written %2C / %3A
    p = write(tmp_path, MATMUL, "a,b:c.fgpt")
    r = fgc("check", "--format", "github", p, timeout=TIMEOUT)
    (line,) = [s for s in r.stdout.splitlines() if s.strip()]
    m = GITHUB.match(line)
    assert m, line
    assert m.group(2).replace("%2C", ",").replace("%3A", ":") == p, line


def test_github_format_escapes_newlines_and_percent(tmp_path):
    # a message can quote source text; whatever it holds, one annotation stays one line
    p = write(tmp_path, BASE.replace("output y = H^(L)", "output y = H^(L) % 100%"))
    r = fgc("check", "--format", "github", p, timeout=TIMEOUT)
    no_crash(r)
    for line in r.stdout.splitlines():
        if line.strip():
            assert line.startswith("::"), line


# ---------------------------------------------------------------- sizes given as reals


@pytest.mark.parametrize("default", ["1e-5", "8.0", "2.5"])
def test_a_size_given_a_real_default_is_a_located_error(tmp_path, default):
    """A hyperparameter that sizes a tensor, given a real number (H = 1e-5), is refused at
    check time at its declaration, as a fraction is; it is never taken for a number such as
    eps, left out of the sizes, and met again only in the count."""
    path = write(tmp_path, BASE.replace("H = 8,", f"H = {default},"))
    r = check(path)
    errs = assert_rejected(r, path, line=2)
    assert any("H = " in m and "sizes a tensor but is not a whole number" in m
               for _, _, m in errs), errs
    no_crash(fgc("params", path, "--format", "json"))
