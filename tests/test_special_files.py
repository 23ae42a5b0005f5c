"""Special files and limits (issue 16, item 5): fgc reads regular files only, never more
than the spec limit of them, and checks in time linear in a spec's size.

A FIFO as the spec, or as the file a `share ... with` names, is refused without waiting on
it; `/dev/zero` and `/dev/stdin` (a pipe) are refused without being read; a folder holding a
FIFO or a loop of links named `x.fgpt` is checked without hanging. A spec of 9,000 presets
checks well within a minute: each command runs under a subprocess timeout, so a return of
the hang or of the old minute-long check fails the test (a bound, not a timing).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT, all_specs, fgc

from compiler.errors import FgcError
from compiler.pipeline import MAX_FILE_BYTES, load, read_source

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs (POSIX)")

SMALL = """
model Small {
  hyper L = 1, H = 8, A = 2, D = H / A, V = 11, n = 6
  input x: {1..V}^n
  param W_e: R[V, H], W_p: R[n, H]
  H^(0) = OneHot(x) @ W_e + W_p
  layers l in 1..L {
    H^(l) = LN(MH(H^(l-1), Mask^AR) + H^(l-1))
  }
  output probs = Softmax(H^(L) @ W_e^T)
}
"""


def _no_traceback(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr


def _fifo(path) -> str:
    os.mkfifo(path)
    return str(path)


# ---------------------------------------------------------------- FIFOs and devices


@pytest.mark.parametrize("command", [["check"], ["params"], ["ir"],
                                     ["render", "--to", "markdown"]])
def test_a_fifo_as_the_spec_is_refused_without_waiting(tmp_path, command):
    fifo = _fifo(tmp_path / "f.fgpt")
    r = fgc(command[0], fifo, *command[1:], timeout=60)
    assert r.returncode != 0
    assert "is a FIFO (named pipe), not a regular file" in r.stderr, r.stderr
    _no_traceback(r)


def test_check_of_a_fifo_is_a_spec_error(tmp_path):
    fifo = _fifo(tmp_path / "f.fgpt")
    r = fgc("check", fifo, timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"{fifo}: is a FIFO (named pipe), not a regular file" in r.stderr


def test_compile_of_a_fifo_is_refused(tmp_path):
    fifo = _fifo(tmp_path / "f.fgpt")
    r = fgc("compile", fifo, "--target", "onnx", "-o", str(tmp_path / "out"), timeout=60)
    assert r.returncode != 0
    assert "is a FIFO" in r.stderr, r.stderr
    _no_traceback(r)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_devices_are_not_read(device):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    r = fgc("check", device, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "is a character device, not a regular file" in r.stderr, r.stderr
    _no_traceback(r)


def test_dev_stdin_is_a_pipe_here_and_refused():
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "check", "/dev/stdin"], cwd=ROOT,
                       input="model M {\n" * 100_000, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1, r.stderr
    assert "not a regular file" in r.stderr, r.stderr


def test_dev_stdin_redirected_from_a_regular_file_is_read(tmp_path):
    spec = tmp_path / "small.fgpt"
    spec.write_text(SMALL)
    with open(spec) as f:
        r = subprocess.run([sys.executable, "-m", "compiler.cli", "check", "/dev/stdin"],
                           cwd=ROOT, stdin=f, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_a_folder_is_not_a_spec(tmp_path):
    with pytest.raises(FgcError, match="is a directory"):
        read_source(str(tmp_path))


def test_a_huge_sparse_file_is_refused_after_reading_at_most_the_limit(tmp_path):
    big = tmp_path / "big.fgpt"
    with open(big, "wb") as f:
        f.truncate(1 << 34)  # 16 GiB of holes: reading it whole would take minutes
    r = fgc("check", str(big), timeout=60)
    assert r.returncode == 1, r.stderr
    assert f"is 17,179,869,184 bytes; specs are limited to {MAX_FILE_BYTES:,}" in r.stderr


def test_a_file_at_the_limit_is_read(tmp_path):
    spec = tmp_path / "padded.fgpt"
    text = SMALL + "#" * 80 + "\n"
    text += ("#" * 99 + "\n") * ((MAX_FILE_BYTES - len(text)) // 100)
    spec.write_text(text)
    assert len(read_source(str(spec))) <= MAX_FILE_BYTES
    assert load(str(spec)).model.name == "Small"


# ---------------------------------------------------------------- folders


def test_a_folder_with_a_fifo_and_link_loops_is_checked_without_hanging(tmp_path):
    (tmp_path / "good.fgpt").write_text(SMALL)
    _fifo(tmp_path / "x.fgpt")
    os.symlink("loop.fgpt", tmp_path / "loop.fgpt")  # a link to itself
    (tmp_path / "sub").mkdir()
    os.symlink("..", tmp_path / "sub" / "up")  # a loop of folders
    os.symlink("..", tmp_path / "sub" / "up.fgpt")  # a folder named like a spec
    r = fgc("check", str(tmp_path), timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{tmp_path / 'good.fgpt'}: ok" in r.stdout
    assert "x.fgpt: is a FIFO (named pipe), not a regular file" in r.stderr
    assert "loop.fgpt" in r.stderr
    _no_traceback(r)


# ---------------------------------------------------------------- share ... with a FIFO


def test_share_with_a_fifo_is_refused_without_waiting(tmp_path):
    _fifo(tmp_path / "other.fgpt")
    spec = tmp_path / "small.fgpt"
    spec.write_text(SMALL.replace("  H^(0)", '  share W_e with "other.fgpt"\n  H^(0)'))
    r = fgc("check", str(spec), timeout=60)
    assert r.returncode == 1, r.stderr
    assert "small.fgpt:6:18: error:" in r.stderr, r.stderr
    assert "is a FIFO (named pipe), not a regular file" in r.stderr
    _no_traceback(r)


# ---------------------------------------------------------------- many presets


def _many_presets(count: int, bad: int | None = None) -> str:
    """A small model with `count` presets over a few sets of values (sizes repeat, as in
    a sweep); preset `bad` states a wrong exact count."""
    blocks = []
    for i in range(count):
        L, H = 1 + i % 4, 16 * (1 + i % 3)
        expect = "\n    expect params == 1" if i == bad else ""
        blocks.append(f"  preset p{i} {{  # sweep\n    L = {L}, H = {H}, A = 2{expect}\n  }}")
    head, tail = SMALL.split("  input", 1)
    return head.replace("L = 1, H = 8", "L, H") + "\n".join(blocks) + "\n  input" + tail


def test_nine_thousand_presets_check_well_within_a_minute(tmp_path):
    spec = tmp_path / "sweep.fgpt"
    spec.write_text(_many_presets(9000, bad=8996))
    assert 480_000 < spec.stat().st_size < MAX_FILE_BYTES  # as large as a spec may be
    r = fgc("check", str(spec), timeout=60)  # took over a minute before the fix
    assert r.returncode == 1, r.stdout + r.stderr
    # the one bad preset, though another with the same sizes came before it
    assert "error: preset `p8996` has" in r.stderr and "parameters, not 1" in r.stderr
    assert r.stderr.count("error:") == 1, r.stderr


def test_presets_with_the_same_sizes_each_get_their_own_configuration(tmp_path):
    spec = tmp_path / "sweep.fgpt"
    spec.write_text(_many_presets(13))
    s = load(str(spec))
    first, twin, other = s.configure("p0"), s.configure("p12"), s.configure("p1")
    assert (first.name, twin.name) == ("p0", "p12")
    assert twin.values == first.values and twin.total == first.total
    assert other.total != first.total
    assert s.configure(None, {"L": 1, "H": 16}).total == first.total  # p0's sizes, by --set
    with pytest.raises(LookupError):
        s.configure("p99")


def _chain(count: int, circle: bool = False) -> str:
    """SMALL with `count` derived hyperparameters, each defined by the next one (the order
    that made resolving them cubic), the last a number or, with `circle`, the first."""
    chain = ",\n        ".join([f"h{i} = h{i + 1} + 1" for i in range(count)]
                               + [f"h{count} = {'h0 * 2' if circle else 2}"])
    return SMALL.replace("n = 6\n", f"n = 6,\n        {chain}\n")


def test_a_long_chain_of_derived_hyperparameters_checks_well_within_a_minute(tmp_path):
    spec = tmp_path / "chain.fgpt"
    spec.write_text(_chain(9000).replace("A = 2, D = H / A", "A = 2, D = H / A + h0 - h0"))
    r = fgc("check", str(spec), timeout=60)  # 400 of them took two minutes before the fix
    assert r.returncode == 0, r.stderr
    assert load(str(spec)).configure().values["h0"] == 9002


def test_a_long_circle_is_reported_briefly(tmp_path):
    spec = tmp_path / "circle.fgpt"
    spec.write_text(_chain(9000, circle=True))
    r = fgc("check", str(spec), timeout=60)
    assert r.returncode == 1, r.stderr
    assert "defined in a circle: h0 -> h1 -> h2 -> h3 -> h4 -> h5 -> … (8,993 more) -> " \
           "h8999 -> h9000 -> h0" in r.stderr, r.stderr[:500]
    assert len(r.stderr) < 2000


def test_share_with_a_loop_of_links_says_so(tmp_path):
    os.symlink("other.fgpt", tmp_path / "other.fgpt")
    spec = tmp_path / "small.fgpt"
    spec.write_text(SMALL.replace("  H^(0)", '  share W_e with "other.fgpt"\n  H^(0)'))
    r = fgc("check", str(spec), timeout=60)
    assert r.returncode == 1, r.stderr
    assert "small.fgpt:6:18: error:" in r.stderr and "symbolic links" in r.stderr, r.stderr
    _no_traceback(r)
    r = fgc("params", str(spec), str(spec), timeout=60)  # counted together: no crash either
    _no_traceback(r)


# ---------------------------------------------------------------- presets of distinct sizes


def _distinct_presets(count: int) -> str:
    """SMALL with `count` presets whose sizes all differ (V runs through `count` values),
    every tenth stating its exact count; p8997 states a wrong one and p8998 has an H that
    A does not divide."""
    blocks = []
    for i in range(count):
        L, A, V, n = 1 + i % 5, 1 + i % 4, 1000 + i, 4 + i % 3
        H = A * (2 + i % 7) + (i == 8998)
        total = 4 * H * H * L + 2 * H * L + H * n + H * V + (i == 8997)
        expect = f" expect params == {total}" if i % 10 == 7 else ""
        blocks.append(f"  preset p{i} {{L={L}, H={H}, A={A}, V={V}, n={n}{expect}}}")
    head, tail = SMALL.split("  input", 1)
    head = head.replace("L = 1, H = 8, A = 2, D = H / A, V = 11, n = 6", "L, H, A, D = H / A, V, n")
    return head + "\n".join(blocks) + "\n  input" + tail


def test_nine_thousand_presets_of_distinct_sizes_check_well_within_a_minute(tmp_path):
    spec = tmp_path / "distinct.fgpt"
    spec.write_text(_distinct_presets(9000))
    assert 400_000 < spec.stat().st_size < MAX_FILE_BYTES
    r = fgc("check", str(spec), timeout=90)  # elaborating each took a minute
    assert r.returncode == 1, r.stdout + r.stderr
    assert "error: preset `p8997` has" in r.stderr, r.stderr
    assert "is not a whole number with A = 3, H = 16 (preset `p8998`)" in r.stderr, r.stderr
    assert r.stderr.count("error:") == 2, r.stderr


PROBE = """
model Probe {
  hyper L, H, A, D = H / A, V, n, K
  preset ok { L = 2, H = 8, A = 2, V = 11, n = 6, K = 3 }
  preset divides { L = 2, H = 9, A = 2, V = 11, n = 6, K = 3 }
  preset zero { L = 2, H = 0, A = 2, V = 11, n = 6, K = 3 }
  preset fraction { L = 2, H = 8, A = 2, V = 11, n = 6.5, K = 3 }
  preset off { L = 3, H = 12, A = 3, V = 20, n = 5, K = 4
    expect params == 1 }
  preset about { L = 3, H = 12, A = 3, V = 20, n = 5, K = 4
    expect params ~ 1M }
  preset explicit { L = 2, H = 8, A = 2, D = 3, V = 11, n = 6, K = 3 }
  preset rows { L = 2, H = 8, A = 2, V = 11, n = 6, K = 12 }
  preset deep { L = 200000, H = 8, A = 2, V = 11, n = 6, K = 3 }
  preset stranger { L = 2, H = 8, A = 2, V = 11, n = 6, K = 3, Q = 1 }
  preset exact { L = 4, H = 6, A = 3, V = 13, n = 2, K = 13
    expect params == 714 }
  input x: {1..V}^n
  param W_e: R[V, H], W_p: R[n, H]
  H^(0) = OneHot(x) @ W_e * sqrt(H) + W_p
  layers l in 1..L {
    H^(l) = LN(MH(H^(l-1), Mask^AR) + H^(l-1))
  }
  output probs = Softmax(H^(L) @ W_e[1..K, :]^T)
}
"""

# the same with a layer norm that exists only where two sizes differ: decided per preset
PROBE_GUARDED = PROBE.replace("hyper L, H, A,", "hyper L, H, A, E = 8,").replace(
    "  }\n  output probs = Softmax(H^(L)",
    "    G^(l) = LN(H^(l)) if E != H else H^(l)\n  }\n  output probs = Softmax(G^(L)")


def _check(path, text: str | None = None) -> tuple[list, list, int]:
    """(errors, warnings) of `fgc check` as data, and how many presets were elaborated."""
    if text is not None:
        path.write_text(text)
    spec = load(str(path))
    elaborated = []
    numeric = spec._elaborate_numeric
    spec._elaborate_numeric = lambda hypers: elaborated.append(hypers) or numeric(hypers)
    errors, warnings = spec.check()
    return ([(d.severity, d.message, str(d.span), d.hint) for d in errors],
            [(d.severity, d.message, str(d.span), d.hint) for d in warnings], len(elaborated))


@pytest.mark.parametrize("text", [PROBE, PROBE_GUARDED], ids=["sizes", "guarded"])
def test_presets_checked_by_substitution_say_what_elaborating_each_says(text, tmp_path,
                                                                         monkeypatch):
    from compiler import pipeline
    errors, warnings, elaborated = _check(tmp_path / "probe.fgpt", text)
    monkeypatch.setattr(pipeline, "SUBSTITUTE", False)
    slow_errors, slow_warnings, every = _check(tmp_path / "probe.fgpt")
    assert (errors, warnings) == (slow_errors, slow_warnings)
    messages = "\n".join(m for _, m, _, _ in errors + warnings)
    for expected in ["D = H/A = 9/2 is not a whole number", "H = 0 sizes a tensor but is not "
                     "positive (preset `zero`)", "n = 6.5 sizes a tensor but is not a whole "
                     "number (preset `fraction`)", "preset `off` has 2,",
                     "parameters, not 1\n", "preset `about` has 2,", "rows 1..12 do not fit an "
                     "axis of 11", "200,000 layers is absurdly many", "preset `stranger` sets "
                     "`Q`", "preset `explicit` sets D = 3, but D = H/A gives 4"]:
        assert expected in messages, messages
    assert ("preset `exact`" in messages) == (text is PROBE_GUARDED)  # it counts the guard
    assert every == 7  # the presets whose values are given and sizes whole and positive
    # By substitution: only the presets that fail a condition of the symbolic model (a
    # number of layers, the rows of W_e, D given apart from H / A) are elaborated; a
    # condition on sizes (E != H) is decided by elaborating each.
    assert elaborated == (3 if text is PROBE else every)


def test_shipped_specs_check_the_same_by_substitution(monkeypatch):
    from compiler import pipeline
    fast = [_check(path)[:2] for path in all_specs()]
    monkeypatch.setattr(pipeline, "SUBSTITUTE", False)
    assert fast == [_check(path)[:2] for path in all_specs()]
