"""Progress of long operations: on a terminal, one line of standard error redrawn; in a
CI job's log (`CI` set, as GitHub Actions, GitLab CI and most runners set it), a line per
phase.

`FGC_PROGRESS=1` shows it anywhere (a log file, a test), `FGC_PROGRESS=0` never.
"""

from __future__ import annotations

import os
import sys
import threading
import time


def enabled(stream=None) -> bool:
    flag = os.environ.get("FGC_PROGRESS")
    if flag is not None:
        return flag not in ("", "0")
    stream = stream or sys.stderr
    if hasattr(stream, "isatty") and stream.isatty():
        return os.environ.get("TERM") != "dumb"
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


class Progress:
    """`label  1.2 / 6.2 GiB  19%  3.1 s`, redrawn at most ten times a second on a
    terminal; with `items` (tensors, say), `label  40 / 291 tensors  1.2 / 6.2 GiB ...`,
    advanced by `advance(n, items=1)`. Elsewhere (a log, with FGC_PROGRESS=1) one line when
    it closes, with the rate: a line per phase."""

    def __init__(self, label: str, total: int, stream=None, show: bool | None = None,
                 items: int = 0):
        self.label, self.total, self.done = label, max(total, 1), 0
        self.items, self.items_done = items, 0
        self.stream = stream or sys.stderr
        self.show = enabled(self.stream) if show is None else show
        self.started = self.drawn = time.perf_counter()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def advance(self, n: int, items: int = 0) -> None:
        self.done += n
        self.items_done += items
        now = time.perf_counter()
        if self.show and (now - self.drawn > 0.1 or self.done >= self.total):
            self.drawn = now
            self._draw(final=False)

    def close(self) -> None:
        if self.show:
            self._draw(final=True)

    def _draw(self, final: bool) -> None:
        pct = min(100, 100 * self.done // self.total)
        done = human_size(min(self.done, self.total))
        seconds = time.perf_counter() - self.started
        count = f"{min(self.items_done, self.items):,} / {self.items:,} tensors  " \
            if self.items else ""
        line = (f"{self.label}  {count}{done} / {human_size(self.total)}  {pct}%  "
                f"{seconds:.1f} s")
        if final and seconds > 0:
            line += f"  {self.done / seconds / 1e6:,.0f} MB/s"
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if final else ""))
        elif final:
            self.stream.write(line + "\n")
        self.stream.flush()


class ProgressFile:
    """A binary file whose writes advance a Progress; `tensor()` counts one item written."""

    def __init__(self, f, progress: Progress):
        self.f, self.progress = f, progress

    def tensor(self) -> None:
        self.progress.advance(0, items=1)

    def write(self, data) -> int:
        n = self.f.write(data)
        self.progress.advance(len(data) if n is None else n)
        return n


def note(text: str, stream=None) -> None:
    """A one-off line about what is happening, under the same conditions as progress."""
    stream = stream or sys.stderr
    if enabled(stream):
        stream.write(text + "\n")
        stream.flush()


def human_size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class Ticker:
    """`label  12 s` for a call that cannot report its own progress (onnxruntime building a
    session): shown from `after` seconds on, redrawn each second by a background thread, and
    closed with the total time. Use as a context manager around the call."""

    def __init__(self, label: str, after: float = 2.0, stream=None, show: bool | None = None):
        self.label, self.after = label, after
        self.stream = stream or sys.stderr
        self.show = enabled(self.stream) if show is None else show
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._done = threading.Event()
        self._drawn = False

    def __enter__(self) -> Ticker:
        self.started = time.perf_counter()
        if self.show:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        if self._done.wait(self.after):
            return
        while True:
            self._draw(final=False)
            if self._done.wait(1.0):
                return

    def _draw(self, final: bool) -> None:
        line = f"{self.label}  {time.perf_counter() - self.started:.0f} s"
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if final else ""))
        elif final or not self._drawn:
            self.stream.write(line + ("\n" if final else " …\n"))
        self._drawn = True
        self.stream.flush()

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self.show:
            self._thread.join()
            if self._drawn:
                self._draw(final=True)
