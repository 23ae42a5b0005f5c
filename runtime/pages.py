"""The memory onnxruntime maps for a CPU session, moved onto 2 MiB pages (Linux).

A decoding step on CPU streams every weight from memory once: onnxruntime packs each
MatMul's constant operand into a buffer of its own when the session is made, and a step
reads all of them. On 4 KiB pages that walk misses the TLB once per page; on 2 MiB
(transparent huge) pages 512 times less. `onto_huge_pages()` notes the process's
anonymous memory before the session is made and, after, asks the kernel to collapse what
appeared meanwhile into huge pages (`madvise(MADV_COLLAPSE)`, Linux 6.1 and later).

It is a trade, so it is asked for (`runtime.load(..., huge_pages=True)`, `fgc generate
--huge-pages`, or `FGC_HUGE_PAGES=1`): the kernel copies the memory into huge pages it
may first have to make room for. On a 2-core AMD EPYC virtual machine, the llama-small
model (330-700 MiB collapsed): loading took 0.2-1.5 s longer and a decoding step 1-4 %
less time (benchmarks/llama_small.py measures both in each run), so it pays back
after some thousands of steps, in a process that serves, not in one that runs once.
glibc's `GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, set before a process starts, gets any
process's large allocations onto huge pages as they are made, at a similar cost.

It is advice: the contents stay where they are, a region the kernel cannot collapse (huge
pages disabled, no contiguous memory free, another kernel or OS) stays on small pages, and
nothing fails. Only regions mapped while the session was made are touched, never the
memory that was there before.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass

HUGE = 2 << 20  # bytes in a huge page on x86-64 and arm64's default
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25


@dataclass
class Placed:
    """What `onto_huge_pages` moved: bytes on huge pages, and bytes it asked for."""

    moved: int = 0
    asked: int = 0


def _anonymous() -> list[tuple[int, int]]:
    """The process's writable anonymous mappings (and its brk heap), as [lo, hi); not a
    thread's stack (the mapping right above an inaccessible guard page)."""
    out = []
    guard = -1  # where the last inaccessible anonymous mapping ends
    with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 5:
                continue
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            named = len(fields) > 5
            if fields[1].startswith("---") and not named:
                guard = hi
            elif fields[1].startswith("rw") and (not named or fields[5] == "[heap]") \
                    and lo != guard:
                out.append((lo, hi))
    return out


def _new(before: list[tuple[int, int]], after: list[tuple[int, int]]
         ) -> list[tuple[int, int]]:
    """The parts of `after` that no range of `before` covers, cut to whole huge pages; both
    lists sorted and without overlaps, as /proc/self/maps lists them."""
    out = []
    j = 0
    for lo, hi in after:
        while j < len(before) and before[j][1] <= lo:
            j += 1
        x, k = lo, j
        while x < hi:
            a, b = before[k] if k < len(before) and before[k][0] < hi else (hi, hi)
            if a > x:
                out.append((x, a))
            x, k = max(x, b), k + 1
    aligned = [(-(-x // HUGE) * HUGE, y // HUGE * HUGE) for x, y in out]
    return [(x, y) for x, y in aligned if y > x]


def asked(given: bool | None) -> bool:
    """Whether to collapse: `given`, else the environment's `FGC_HUGE_PAGES=1`."""
    return os.environ.get("FGC_HUGE_PAGES", "0") == "1" if given is None else given


@contextlib.contextmanager
def onto_huge_pages() -> Iterator[Placed]:
    """Collapse onto huge pages the anonymous memory mapped inside the `with` block."""
    placed = Placed()
    if sys.platform != "linux":
        yield placed
        return
    try:
        before = _anonymous()
        libc = ctypes.CDLL(None)
        madvise = libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madvise.restype = ctypes.c_int
    except (OSError, AttributeError, ValueError):
        yield placed
        return
    yield placed
    try:
        regions = _new(before, _anonymous())
    except (OSError, ValueError):
        return
    for lo, hi in regions:
        placed.asked += hi - lo
        madvise(lo, hi - lo, MADV_HUGEPAGE)  # the region may hold huge pages from now on
        if madvise(lo, hi - lo, MADV_COLLAPSE) == 0:
            placed.moved += hi - lo
