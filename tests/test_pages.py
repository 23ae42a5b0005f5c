"""runtime/pages.py: the memory an onnxruntime session maps while it is made goes onto
huge pages, nothing else is touched, the contents stay, and it can be turned off."""

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from runtime import pages
from runtime.pages import HUGE, _new

linux = pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/maps and madvise")
ROOT = Path(__file__).resolve().parent.parent


def _in_a_fresh_process(body) -> None:
    """Run `body`, a function of this file, in a new interpreter. These checks read the
    process's own memory map, which depends on all the process ran before: in a test
    worker that had run other files first (pytest -n), the allocator placed a new array
    where no new mapping showed."""
    code = f"import test_pages; test_pages.{body.__name__}()"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "tests",
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def _reference(before, after):
    """`_new` the slow way: every range of `before` cut out of every range of `after`."""
    out = []
    for lo, hi in after:
        pieces = [(lo, hi)]
        for a, b in before:
            pieces = [p for x, y in pieces
                      for p in ((x, min(y, a)), (max(x, b), y)) if p[0] < p[1]]
        for x, y in pieces:
            x, y = -(-x // HUGE) * HUGE, y // HUGE * HUGE
            if y > x:
                out.append((x, y))
    return out


def test_new_ranges_are_what_before_did_not_cover():
    rng = random.Random(0)

    def ranges(n):
        ends = sorted(rng.sample(range(0, 64 * HUGE, HUGE // 4), 2 * n))
        return [(ends[2 * i], ends[2 * i + 1]) for i in range(n)]

    for _ in range(2000):
        before, after = ranges(rng.randint(0, 6)), ranges(rng.randint(0, 6))
        assert _new(before, after) == _reference(before, after)


def test_new_ranges_of_a_grown_mapping_leave_its_old_part():
    # a mapping that grew upward across the session: only the new 4 huge pages
    assert _new([(0, 3 * HUGE)], [(0, 7 * HUGE)]) == [(3 * HUGE, 7 * HUGE)]
    # less than one whole huge page new: nothing asked
    assert _new([(0, 3 * HUGE)], [(0, 4 * HUGE - 1)]) == []
    assert _new([], []) == []


@linux
def test_only_memory_mapped_inside_the_block_is_asked_for():
    _in_a_fresh_process(_only_memory_mapped_inside_the_block_is_asked_for)


def _only_memory_mapped_inside_the_block_is_asked_for():
    old = np.arange(16 * HUGE // 8, dtype=np.float64)  # mapped before: never asked for
    old_lo = old.ctypes.data
    with pages.onto_huge_pages() as placed:
        new = np.arange(32 * HUGE // 8, dtype=np.float64)
    assert placed.asked >= 30 * HUGE  # the new array's whole huge pages
    assert 0 <= placed.moved <= placed.asked
    assert np.array_equal(new, np.arange(new.size, dtype=np.float64))  # contents kept
    assert np.array_equal(old, np.arange(old.size, dtype=np.float64))
    regions = _new([], pages._anonymous())
    assert all(lo % HUGE == 0 and hi % HUGE == 0 for lo, hi in regions)
    assert old_lo > 0


@linux
def test_the_new_ranges_of_this_process_cover_a_new_array_and_not_an_old_one():
    _in_a_fresh_process(_the_new_ranges_of_this_process_cover_a_new_array_and_not_an_old_one)


def _the_new_ranges_of_this_process_cover_a_new_array_and_not_an_old_one():
    old = np.ones(16 * HUGE // 8)
    before = pages._anonymous()
    new = np.ones(32 * HUGE // 8)
    regions = _new(before, pages._anonymous())

    def inside(lo, hi):  # the whole huge pages of [lo, hi)
        return -(-lo // HUGE) * HUGE, hi // HUGE * HUGE

    a, b = inside(new.ctypes.data, new.ctypes.data + new.nbytes)
    assert any(lo <= a and b <= hi for lo, hi in regions)
    a, b = old.ctypes.data, old.ctypes.data + old.nbytes
    assert not any(lo < b and a < hi for lo, hi in regions)


def test_asked_for_only(monkeypatch):
    monkeypatch.delenv("FGC_HUGE_PAGES", raising=False)
    assert not pages.asked(None) and pages.asked(True)
    monkeypatch.setenv("FGC_HUGE_PAGES", "1")
    assert pages.asked(None) and not pages.asked(False)


@linux
def test_a_cpu_session_on_huge_pages_computes_the_same(tmp_path, monkeypatch):
    """A CPU session of a compiled model asked onto huge pages: the outputs those of a
    session left on small pages; `fgc generate --huge-pages` the ids of one without."""
    from conftest import fgc

    from compiler.emit import compile_spec
    from runtime import load
    monkeypatch.delenv("FGC_HUGE_PAGES", raising=False)
    out = tmp_path / "gpt"
    compile_spec("specs/gpt2.fgpt", str(out), "onnx", sets=dict(L=2, H=512, A=8, V=4096, n=64),
                 kv_cache=True)
    off = load(out, provider="cpu", cache=False, quiet=True)
    on = load(out, provider="cpu", cache=False, quiet=True, huge_pages=True)
    assert off.huge_pages == 0 and on.huge_pages >= 0
    feeds = on.feeds("1,2,3,4")
    a, b = on.run(feeds), off.run(feeds)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    args = ["generate", str(out), "--prompt-ids", "1,2,3", "--max-new-tokens", "5",
            "--provider", "cpu"]
    plain, huge = fgc(*args), fgc(*args, "--huge-pages")
    assert plain.returncode == huge.returncode == 0, huge.stderr
    assert plain.stdout.splitlines()[-1] == huge.stdout.splitlines()[-1]
    assert "on 2 MiB pages" not in plain.stdout


def test_huge_pages_with_the_torch_backend_is_refused():
    """--huge-pages moves onnxruntime's session: asked of the PyTorch module (a SPEC with
    --backend torch), a usage error before anything is compiled, not a flag ignored."""
    from conftest import fgc
    done = fgc("generate", "specs/gpt2.fgpt", "--set", "L=1", "--set", "H=64", "--set", "A=2",
               "--set", "V=64", "--set", "n=16", "--backend", "torch", "--prompt-ids", "1,2",
               "--max-new-tokens", "2", "--huge-pages")
    assert done.returncode == 2, done.stderr
    assert "--huge-pages is for an ONNX model" in done.stderr and "Traceback" not in done.stderr
