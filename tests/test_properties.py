"""Property tests: whatever text fgc is given, the front half answers exit 0 or 1, never crashes,
locates every rejection, and answers quickly.

Two sources of text: (a) the shipped specs mutated token by token and line by line, and
(b) programs generated from the grammar, both random-but-grammatical ones and near-valid models
built from the standard library's blocks with random sizes. The front half runs in-process
(`compiler.cli.main`) so hundreds of examples fit in seconds. Hypothesis uses the profile that
conftest.py loads (HYPOTHESIS_PROFILE=ci in CI: derandomized).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from conftest import ROOT, all_specs
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from compiler.cli import main
from compiler.elaborate.primitives import CALLABLE
from compiler.syntax.parse import parse_text

STDLIB = ROOT / "compiler" / "stdlib" / "stdlib.fgpt"
SOURCES = all_specs() + [STDLIB]
TEXTS = {p: p.read_text(encoding="utf-8") for p in SOURCES}

# Seconds one in-process fgc command may take on one small spec. They take 0.01-0.1 s; the bound
# is loose so that a loaded CI machine does not fail it, and tight enough to catch a loop over
# something huge (counting layer by layer under a per-layer condition is such a loop).
SLOW = 2.0

# main() raises the recursion limit; raising it once here keeps hypothesis from warning that
# it changed during a test.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))

# How a test reads hypothesis's settings: the loaded profile, minus the health check that a
# module-scoped temporary folder would trip.
relaxed = settings(suppress_health_check=[HealthCheck.function_scoped_fixture,
                                          HealthCheck.too_slow, HealthCheck.filter_too_much])


# ---------------------------------------------------------------- running fgc in-process

_DIR = Path(tempfile.mkdtemp(prefix="fgc-props-"))
atexit.register(shutil.rmtree, _DIR, True)


def run(argv: list[str]) -> tuple[int, str, str, float]:
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse; the only exception allowed to escape
            code = e.code
    return code, out.getvalue(), err.getvalue(), time.perf_counter() - t0


def _assert_no_crash(argv, code, out, err, seconds) -> None:
    both = out + err
    assert "Traceback" not in both, both[-2000:]
    assert "internal error" not in both, both[-2000:]
    assert seconds < SLOW, f"{' '.join(argv)} took {seconds:.2f} s"


def run_example(text: str, name: str) -> int:
    note(text)
    return check_properties(text, name)


def check_properties(text: str, name: str = "spec.fgpt", deep: bool = True) -> int:
    """Write `text`, run `fgc check` (text and JSON); assert the robustness contract.

    With `deep`, a spec that checks must also give `fgc ir` exit 0, and `fgc params` exit 0
    or a located error (it needs a value for every hyperparameter).
    Returns the exit code of `fgc check`."""
    path = _DIR / name
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    p = str(path)

    argv = ["check", p]
    code, out, err, secs = run(argv)
    _assert_no_crash(argv, code, out, err, secs)
    assert code in (0, 1), f"exit {code}: {err[-2000:]}"
    unlocated = re.findall(r"^(?:fgc: )?error: .*$", err, re.M)
    assert not unlocated, unlocated
    if code == 1:
        assert re.search(rf"^{re.escape(p)}:\d+:\d+: error: ", err, re.M), err[-2000:]

    argv = ["check", "--format", "json", p]
    jcode, out, err, secs = run(argv)
    _assert_no_crash(argv, jcode, out, err, secs)
    assert jcode == code
    report = json.loads(out)
    for f in report["files"]:
        for d in f["diagnostics"]:
            if d["severity"] == "error":
                assert {"file", "line", "column"} <= set(d), d
                assert d["line"] >= 1 and d["column"] >= 1, d

    if deep and code == 0:
        for argv in (["params", p, "--format", "json"], ["ir", p]):
            c, out, err, secs = run(argv)
            _assert_no_crash(argv, c, out, err, secs)
            if "defines modules but no model" in err:
                continue
            if argv[0] == "params" and c == 1:
                assert re.search(rf"^{re.escape(p)}:\d+:\d+: error: .*without a value", err,
                                 re.M), f"`fgc check` passes but `fgc params` says: {err[-2000:]}"
                continue
            assert c == 0, f"`fgc check` passes but `fgc {argv[0]}` exits {c}: {err[-2000:]}"
            if argv[0] == "params":
                assert isinstance(json.loads(out)["total"], int)
    return code


def test_the_shipped_specs_pass_the_property_checker():
    for path, text in TEXTS.items():
        assert check_properties(text, path.name) == 0, path


# ---------------------------------------------------------------- (a) mutations

TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9_]*'*(?:\^[A-Za-z][A-Za-z0-9_]*)?"
                   r"|[0-9][0-9_]*(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?[KMBT]?"
                   r"|\.\.\.|\.\.|->|==|!=|<=|>=|\S")
NUMBER = re.compile(r"(?<![A-Za-z0-9_.])[0-9][0-9_]*(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?[KMBT]?")

JUNK = ["(", ")", "{", "}", "[", "]", '"', "'", "\x00", "é", "×", "∈", "𝐖", "\u200b", "^", "@",
        ",", "=", "..", "...", ":", "->", "#", "\n", "\t", "-", "l", "L", "H^(l+1)", "H^(0)",
        "for i in 1..A", "where", "inf", "-inf", "if", "else", "layers", "model", "module",
        "param", "hyper", "preset", "expect params ==", "share", "output", "_1", "^T", "% 0",
        "/ 0", "* 0"]
# Numbers that push the checker: zero, negatives, huge, fractions, floats and `inf` where a
# size is expected, a billion layers.
NUMS = ["0", "-1", "1", "2", "3", "7", "-0", "10_000", "12345678901234567890", "9" * 41,
        "9" * 2000, "125M", "1.3B", "0.5", "1e300", "1e-300", "inf", "1000000000",
        "1" + "0" * 30]


@st.composite
def mutated(draw, numbers: list[str], junk: list[str]) -> tuple[str, str]:
    path = draw(st.sampled_from(SOURCES))
    text = TEXTS[path]
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["delete", "duplicate", "swap", "insert", "number",
                                   "rename", "line-delete", "line-duplicate", "line-swap"]))
        toks = [m.span() for m in TOKEN.finditer(text)]
        lines = text.split("\n")
        if op == "delete" and toks:
            a, b = toks[draw(st.integers(0, len(toks) - 1))]
            text = text[:a] + text[b:]
        elif op == "duplicate" and toks:
            a, b = toks[draw(st.integers(0, len(toks) - 1))]
            text = text[:b] + " " + text[a:b] + text[b:]
        elif op == "swap" and len(toks) > 1:
            i = draw(st.integers(0, len(toks) - 2))
            j = draw(st.integers(i + 1, min(len(toks) - 1, i + 40)))
            (a, b), (c, d) = toks[i], toks[j]
            text = text[:a] + text[c:d] + text[b:c] + text[a:b] + text[d:]
        elif op == "insert":
            at = draw(st.integers(0, len(text)))
            piece = draw(st.sampled_from(junk) | st.text(min_size=1, max_size=3))
            text = text[:at] + piece + text[at:]
        elif op == "number":
            nums = [m.span() for m in NUMBER.finditer(text)]
            if nums:
                a, b = nums[draw(st.integers(0, len(nums) - 1))]
                text = text[:a] + draw(st.sampled_from(numbers)) + text[b:]
        elif op == "rename" and toks:
            names = [t for t in toks if text[t[0]].isalpha()]
            if len(names) > 1:
                a, b = names[draw(st.integers(0, len(names) - 1))]
                c, d = names[draw(st.integers(0, len(names) - 1))]
                text = text[:a] + text[c:d] + text[b:]
        elif op == "line-delete" and len(lines) > 1:
            del lines[draw(st.integers(0, len(lines) - 1))]
            text = "\n".join(lines)
        elif op == "line-duplicate":
            i = draw(st.integers(0, len(lines) - 1))
            lines.insert(draw(st.integers(0, len(lines))), lines[i])
            text = "\n".join(lines)
        elif op == "line-swap" and len(lines) > 1:
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
    return path.name, text


@relaxed
@given(mutated(NUMS, JUNK))
def test_mutated_specs(case):
    name, text = case
    run_example(text, name)


# ---------------------------------------------------------------- (b) generated programs

KEYWORDS = {"model", "module", "hyper", "preset", "input", "param", "output", "expect",
            "params", "share", "with", "layers", "in", "for", "where", "if", "else", "and", "or",
            "not", "is", "even", "odd", "inf", "R", "Perm"}
COMMON = ["H", "L", "A", "D", "F", "V", "n", "w", "x", "z", "X", "Y", "E", "W", "W_e", "W_p",
          "b", "Hhat", "G", "Mask", "head", "l", "i", "j", "k", "W_i^Q", "X'", "Mask^AR",
          "Mask^ST", "Mask^BD"]
# every module of the standard library, every callable primitive, and one that does not exist
MODULES = sorted(m.name for m in parse_text(STDLIB.read_text(), "stdlib.fgpt").modules) + \
    sorted(CALLABLE) + ["Nope"]

ident = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,5}('|\^[A-Za-z][A-Za-z0-9]{0,2})?",
                      fullmatch=True).filter(lambda s: s not in KEYWORDS)
names = st.sampled_from(COMMON) | ident
modules = st.sampled_from(MODULES) | ident
ints = st.sampled_from(["0", "1", "2", "3", "4", "8", "16", "-1", "10_000", "125M",
                        "99_999_999_999_999_999_999"]) | st.integers(0, 10**6).map(str)
floats = st.sampled_from(["0.5", "1.702", "1e-5", "2.5e3", "1.3B"])


def _paren(s: str) -> str:
    return f"({s})"


arith = st.recursive(
    ints | names,
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "%"]), inner)
        .map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        inner.map(_paren),
        inner.map(lambda s: f"-{s}"),
    ),
    max_leaves=6,
)
layer_ref = st.tuples(names, st.sampled_from(["l", "l-1", "0", "L", "l+1", "L-1", "1"])) \
    .map(lambda t: f"{t[0]}^({t[1]})")
condition = st.one_of(
    st.sampled_from(["l is even", "l is odd", "l == 1", "l > 2 and l < L", "not l is even"]),
    st.tuples(arith, st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), arith)
    .map(lambda t: " ".join(t)),
)


def _call(t) -> str:
    func, hyp, args, label = t
    head = f"{label}: {func}" if label else func
    return f"{head}{hyp}({', '.join(args)})"


def _expr_extend(inner):
    hyper_list = st.one_of(
        st.just(""),
        st.lists(st.one_of(arith, st.tuples(names, arith).map(lambda t: f"{t[0]}={t[1]}")),
                 min_size=1, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"))
    index_item = st.one_of(arith, st.just(":"), st.tuples(arith, arith)
                           .map(lambda t: f"{t[0]}..{t[1]}"))
    return st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "@", "%"]), inner)
        .map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
        inner.map(_paren),
        inner.map(lambda s: f"-{s}"),
        st.tuples(modules, hyper_list, st.lists(inner | st.just("..."), max_size=4),
                  st.sampled_from(["", "", "", "lab", "mh"])).map(_call),
        st.tuples(inner, st.lists(index_item, min_size=1, max_size=2))
        .map(lambda t: f"{_paren(t[0])}[{', '.join(t[1])}]"),
        inner.map(lambda s: f"{_paren(s)}^T"),
        st.tuples(inner, condition, inner).map(lambda t: f"{t[0]} if {t[1]} else {t[2]}"),
        st.lists(inner, min_size=2, max_size=3).map(lambda xs: "(" + ", ".join(xs) + ")"),
    )


expr = st.recursive(ints | floats | names | layer_ref | st.just("inf"), _expr_extend,
                    max_leaves=8)

dims = st.lists(arith | st.just("..."), min_size=0, max_size=3)
real_type = dims.map(lambda ds: "R[" + ", ".join(ds) + "]")
a_type = st.one_of(
    real_type,
    st.tuples(arith, arith, st.sampled_from(["n", "(n, H)", "2", "A"]))
    .map(lambda t: f"{{{t[0]}..{t[1]}}}^{t[2]}"),
    st.sampled_from(["{0, 1}^n", "{0, 1}", "{1..V}^n"]),
    arith.map(lambda a: f"Perm[{a}]"),
)
family = st.one_of(st.just(""), st.tuples(names, arith)
                   .map(lambda t: f" for {t[0]} in 1..{t[1]}"))


@st.composite
def lhs(draw) -> str:
    kind = draw(st.sampled_from(["name", "layer", "layer", "head", "index"]))
    n = draw(names)
    if kind == "layer":
        return f"{n}^({draw(st.sampled_from(['l', '0', 'l-1', 'L']))})"
    if kind == "head":
        return f"{n}({', '.join(draw(st.lists(names, max_size=2)))})"
    if kind == "index":
        return f"{n}[{', '.join(draw(st.lists(names, min_size=1, max_size=2)))}]"
    return n


@st.composite
def equation(draw) -> str:
    left = ", ".join(draw(st.lists(lhs(), min_size=1, max_size=2)))
    line = f"{left} = {draw(expr)}"
    tail = draw(st.sampled_from(["", "", "", "where", "for"]))
    if tail == "where":
        ws = draw(st.lists(st.tuples(names, expr, family), min_size=1, max_size=2))
        line += " where " + ", ".join(f"{n} = {e}{f}" for n, e, f in ws)
    elif tail == "for":
        line += draw(family)
    return line


def hyper_decl(draw) -> str:
    n = draw(names)
    default = draw(st.one_of(st.none(), arith, floats))
    return n if default is None else f"{n} = {default}"


@st.composite
def model_text(draw) -> str:
    out = [f"model {draw(names)} {{"]
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["hyper", "hyper", "preset", "input", "param", "param",
                                     "eq", "eq", "eq", "layers", "output", "expect", "share"]))
        if kind == "hyper":
            out.append("  hyper " + ", ".join(hyper_decl(draw)
                                              for _ in range(draw(st.integers(1, 4)))))
        elif kind == "preset":
            items = [f"{draw(names)} = {draw(arith)}" for _ in range(draw(st.integers(0, 4)))]
            if draw(st.booleans()):
                items.append(f"expect params {draw(st.sampled_from(['==', '~']))} "
                             f"{draw(ints | floats)}")
            out.append(f"  preset {draw(names)} {{ {', '.join(items)} }}")
        elif kind == "input":
            out.append(f"  input {draw(names)}: {draw(a_type)}")
        elif kind == "param":
            out.append(f"  param {draw(names)}: {draw(a_type)}{draw(family)}")
        elif kind == "eq":
            out.append("  " + draw(equation()))
        elif kind == "layers":
            body = [("    " + draw(equation())) for _ in range(draw(st.integers(0, 3)))]
            if draw(st.booleans()):
                body.append(f"    share {draw(names)}")
            out.append(f"  layers {draw(names)} in {draw(arith)}..{draw(arith)} {{")
            out.extend(body)
            out.append("  }")
        elif kind == "output":
            named = draw(st.booleans())
            out.append(f"  output {draw(names) + ' = ' if named else ''}{draw(expr)}")
        elif kind == "expect":
            out.append(f"  expect params {draw(st.sampled_from(['==', '~']))} {draw(arith)}")
        elif kind == "share":
            out.append(f"  share {', '.join(draw(st.lists(names, min_size=1, max_size=2)))}")
    out.append("}")
    return "\n".join(out) + "\n"


@st.composite
def module_text(draw) -> str:
    name = draw(modules.filter(lambda s: s not in ("...",)))
    hyp = draw(st.lists(st.builds(lambda n, d: n if d is None else f"{n} = {d}", names,
                                  st.none() | ints | floats), max_size=2))
    args = draw(st.lists(st.tuples(names, a_type, family), max_size=3))
    head = f"module {name}"
    if hyp:
        head += "[" + ", ".join(hyp) + "]"
    if args or draw(st.booleans()):
        head += "(" + ", ".join(f"{n}: {t}{f}" for n, t, f in args) + ")"
    result = draw(a_type) if draw(st.integers(0, 4)) else \
        "(" + ", ".join(draw(st.lists(a_type, min_size=2, max_size=2))) + ")"
    lines = [f"{head} -> {result} {{"]
    params = [f"{draw(names)}: {draw(real_type)}{draw(family)}"
              for _ in range(draw(st.integers(0, 2)))]
    if draw(st.integers(0, 3)):
        call = f"{name}({', '.join(n for n, _, _ in args)})"
        lines.append(f"  {call} = {draw(expr)}")
    for _ in range(draw(st.integers(0, 2))):
        lines.append("  " + draw(equation()))
    if params:
        lines.append("  param " + ", ".join(params))
    lines.append("}")
    return "\n".join(lines) + "\n"


programs = st.lists(st.one_of(model_text(), module_text()), min_size=1, max_size=3) \
    .map(lambda parts: "".join(parts))


@relaxed
@given(programs)
def test_generated_programs_are_grammatical(text):
    """The generator writes only what the grammar accepts (a check on both)."""
    from compiler.syntax.parse_tree import parser
    note(text)
    parser().parse(text)


@relaxed
@given(programs)
def test_generated_programs(text):
    run_example(text, "generated.fgpt")


# ---------------------------------------------------------------- near-valid models


def _weighted(common: list[str], rare: list[str], weight: int = 4):
    """Mostly `common`, sometimes `rare` (hypothesis shrinks towards the first entries)."""
    return st.sampled_from(common * weight + rare)


SANE = ["1", "2", "4", "8", "12", "16", "3", "64"]
ODD_SIZES = ["0", "-1", "-8", "7", "10_000", "2 * H", "H / A", "H / 3", "4 * H", "H - 64",
             "A * D", "n + 1"]
HUGE = ["9" * 45, "1_000_000_000", "4_611_686_018_427_387_905"]  # > 40 digits, 10**9, > 2**62
BLOCKS = [
    "Hhat^(l) = MH(LN(H^(l-1)), {mask}) + H^(l-1)\n    H^(l) = {ff}(LN(Hhat^(l))) + Hhat^(l)",
    "Hhat^(l) = LN(MH(H^(l-1), {mask}) + H^(l-1))\n    H^(l) = LN({ff}(Hhat^(l)) + Hhat^(l))",
    "H^(l) = ln: LN(attn: MH(H^(l-1), {mask}) + H^(l-1))",
    "M^(l) = Mask^AR if l is even else {mask}\n    H^(l) = MH(LN(H^(l-1)), M^(l)) + H^(l-1)",
    "H^(l) = {ff}(H^(l-1)) + H^(l-1)",
    "H^(l) = H^(l-1) @ W_x",
    "H^(l) = Softmax(H^(l-1)) + H^(l-1)",
    "Hbar^(l) = mh: MHA(H^(l-1), H^(l-1), H^(l-1), {mask})\n    H^(l) = ln: LN(Hbar^(l) + H^(l-1))",
    "H^(l) = LN(ff: {ff}(H^(l-1)) + H^(l-1))\n    share ff",
    "Hhat^(l) = MH(H^(l-1), {mask})\n    H^(l) = concat(Hhat^(l), H^(l-1)) @ W_y",
]
MASKS = ["Mask^AR", "Mask^BD", "Mask^ST", "Mask^AR_next", "Mask^AR_curr", "Mask"]
FFS = ["FF^GELU", "FF^ReLU", "LN", "GELU", "GELU^tanh"]


@st.composite
def near_valid(draw, rare: list[str]) -> str:
    """A GPT-like model from the standard library's blocks, with random sizes and presets."""
    sizes = _weighted(SANE, ODD_SIZES + rare, weight=16)
    hyper = {k: draw(sizes) for k in ["L", "H", "A", "D", "F", "V", "n", "w"]}
    if draw(st.booleans()):
        hyper["D"] = "H / A"
    if draw(st.booleans()):
        hyper["F"] = "4 * H"
    symbolic = draw(st.sets(st.sampled_from(list(hyper)), max_size=4))
    decls = ", ".join(k if k in symbolic else f"{k} = {v}" for k, v in hyper.items())
    presets = []
    for i in range(draw(st.integers(0, 2))):
        assigns = ", ".join(f"{k} = {draw(_weighted(SANE, ['0', '-2', '7'] + rare))}"
                            for k in sorted(symbolic))
        exp = draw(st.sampled_from(["", "", "expect params ~ 125M", "expect params == 0",
                                    "expect params ~ 1.5K"]))
        presets.append(f"  preset p{i} {{ {assigns} {exp} }}")
    block = draw(st.sampled_from(BLOCKS)).format(mask=draw(st.sampled_from(MASKS)),
                                                 ff=draw(st.sampled_from(FFS)))
    embed = draw(_weighted(["OneHot(x) @ W_e + W_p", "OneHot(x) @ W_e"],
                           ["W_p", "OneHot(x) @ W_e^T", "x", "Stack[n](W_p[1, :])"]))
    out = draw(_weighted(["Softmax(H^(L) @ W_e^T)", "H^(L)"],
                         ["LN(H^(L))[1, :]", "H^(L) @ W_e", "Softmax(H^(L) @ W_e^T)[j, :]"]))
    expect = draw(st.sampled_from(["", "", "expect params == V*H + n*H",
                                   "expect params ~ 1K", "expect params == 0"]))
    lines = [
        "model Random {",
        f"  hyper {decls}",
        *presets,
        "  input x: {1..V}^n" + draw(st.sampled_from(["", "", ", j: {1..n}", ", z: Perm[n]"])),
        f"  param W_e: R[V, H], W_p: R[n, H], W_x: R[{draw(sizes)}, H], W_y: R[2 * H, H]",
        f"  H^(0) = {embed}",
        f"  layers l in 1..{draw(_weighted(['L'], ['2', '0', 'L - 1', 'n'], weight=12))} {{",
        f"    {block}",
        "  }",
        f"  output y = {out}",
        f"  {expect}",
        "}",
    ]
    return "\n".join(lines) + "\n"


@relaxed
@given(near_valid(HUGE))
def test_near_valid_models(text):
    run_example(text, "near_valid.fgpt")


# ---------------------------------------------------------------- near-valid modules

MODULE_BODIES = [
    ("Foo(X) = {act}(X @ W_1 + b_1) @ W_2 + b_2",
     "param W_1: R[{h}, {f}], b_1: R[{f}], W_2: R[{f}, {h}], b_2: R[{h}]"),
    ("Foo(X) = Concat(h_1, ..., h_{a}) @ W^O\n    where h_i = X @ W_i for i in 1..{a}",
     "param W_i: R[{h}, {d}] for i in 1..{a}\n  param W^O: R[{a} * {d}, {h}]"),
    ("Foo(X) = g * (X - mu) / sqrt(s + eps) + c\n"
     "    where mu = mean(X), s = mean((X - mu) * (X - mu))",
     "param g: R[{h}], c: R[{h}]"),
    ("Foo(X)[i, j] = X[i, j] if i >= j else 0", ""),
    ("Foo(X) = Softmax(X @ X^T / sqrt({h})) @ X", ""),
    ("Foo(X) = X @ W_{k}", "param W_i: R[{h}, {h}] for i in 1..{a}"),
    ("Foo(X) = h_1 + h_{k} where h_i = X for i in 1..{a}", ""),
    ("Foo(X) = {act}(X) * X", ""),
    ("Foo(X) = X[1..{k}, :] @ W", "param W: R[{h}, {h}]"),
    ("Foo(X) = {act}(X @ W) where W = W_1", "param W_1: R[{h}, {h}]"),
]
ACTS = ["GELU", "GELU^tanh", "tanh", "sigmoid", "exp", "Softmax", "LN", "relu", "max"]


@st.composite
def custom_module_model(draw) -> str:
    """A model whose layers call a module written here: mostly right, sometimes off by a size,
    a family index or an activation."""
    dim = _weighted(["H"], ["F", "D", "n", "2", "H + 1"], weight=6)
    body, params = draw(st.sampled_from(MODULE_BODIES))
    fill = dict(act=draw(st.sampled_from(ACTS)), h=draw(dim), f=draw(_weighted(["F"], ["H"])),
                d=draw(_weighted(["D"], ["H", "A"])), a=draw(_weighted(["A"], ["2", "0"])),
                k=draw(st.sampled_from(["1", "2", "3", "A", "A + 1", "0"])))
    hypers = draw(st.sampled_from(["[F, A, D, eps = 1e-5]", "[F, A, D]", "[A, D, eps = 1e-5]",
                                   "[F, A, D, eps = 1e-5, F]", ""]))
    arg = draw(_weighted(["X: R[n, H]"], ["X: R[..., H]", "X: R[H]", "X: R[n, n]"]))
    result = draw(_weighted(["R[n, H]"], ["R[..., H]", "R[n, F]", "(R[n, H], R[n, H])"]))
    module = (f"module Foo{hypers}({arg}) -> {result} {{\n  {body.format(**fill)}\n"
              f"  {params.format(**fill)}\n}}\n")
    call = draw(_weighted(["Foo(H^(l-1))"], ["Foo[F=F](H^(l-1))", "foo: Foo(H^(l-1))",
                                             "Foo(H^(l-1), H^(l-1))", "Foo[F, A, D](H^(l-1))"]))
    values = ", ".join(f"{k} = {draw(_weighted([v], ['0', '3', '-1']))}"
                       for k, v in [("L", "2"), ("H", "8"), ("A", "2"), ("F", "32"),
                                    ("n", "4"), ("V", "10")])
    model = f"""model M {{
  hyper {values}, D = H / A, eps = 1e-5
  input x: {{1..V}}^n
  param W_e: R[V, H]
  H^(0) = OneHot(x) @ W_e
  layers l in 1..L {{
    H^(l) = LN({call} + H^(l-1))
  }}
  output y = Softmax(H^(L) @ W_e^T)
}}
"""
    return module + model


@relaxed
@given(custom_module_model())
def test_models_with_their_own_modules(text):
    run_example(text, "custom_module.fgpt")
