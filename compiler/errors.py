"""Diagnostics: located errors and warnings, rendered rustc-style."""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Span:
    """A region of a source file; lines and columns are 1-based."""

    file: str
    line: int
    column: int
    end_line: int | None = None
    end_column: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass
class Diagnostic:
    """One problem found in a spec."""

    severity: str  # "error" | "warning" | "note"
    message: str
    span: Span | None = None
    hint: str | None = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Messages quote names from files (a checkpoint's tensor names, a spec's strings):
        # made printable once here, so every output (text, json, github) shows escapes.
        if isinstance(self.message, str):
            self.message = printable(self.message)
        if isinstance(self.hint, str):
            self.hint = printable(self.hint)
        self.notes = [printable(n) if isinstance(n, str) else n for n in self.notes]

    def as_dict(self) -> dict:
        out = {"severity": self.severity, "message": printable(elide(self.message)),
               "hint": printable(elide(self.hint)) if self.hint else None}
        if self.span is not None:
            out.update(file=printable(self.span.file), line=self.span.line,
                       column=self.span.column)
        return out


class FgcError(Exception):
    """A problem in the user's input; carries one or more diagnostics."""

    def __init__(self, message: str, span: Span | None = None, hint: str | None = None):
        super().__init__(message)
        self.diagnostics = [Diagnostic("error", message, span, hint)]

    @classmethod
    def many(cls, diagnostics: list[Diagnostic]) -> FgcError:
        err = cls(diagnostics[0].message, diagnostics[0].span, diagnostics[0].hint)
        err.diagnostics = list(diagnostics)
        return err


class Sources:
    """Source texts by file name, for quoting lines under a diagnostic."""

    def __init__(self) -> None:
        self._lines: dict[str, list[str]] = {}

    def add(self, name: str, text: str) -> None:
        self._lines[name] = text.split("\n")

    def line(self, name: str, lineno: int) -> str | None:
        lines = self._lines.get(name)
        if lines is None or not 1 <= lineno <= len(lines):
            return None
        return lines[lineno - 1]


# Characters that must not reach a terminal or a log as they are: C0 and C1 controls (ESC
# starts ANSI sequences, CR overwrites the line, a newline forges one), bidirectional
# overrides (they reorder what is shown), line separators, and lone surrogates (bytes of a
# file name that were not UTF-8).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029"
                          "\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(m: re.Match) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    o = ord(c)
    if 0xDC80 <= o <= 0xDCFF:  # a byte that was not UTF-8, as os.fsdecode keeps it
        return f"\\x{o - 0xDC00:02x}"
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def printable(text: str, keep: str = "") -> str:
    """`text` (from a file or a file name) safe to print: control characters and the like
    shown as escapes, `\\x1b`, `\\n`, `\\u202e`; characters in `keep` (say a tab) stay."""
    if not _UNPRINTABLE.search(text):
        return text
    return _UNPRINTABLE.sub(lambda m: m.group() if m.group() in keep else _escape_char(m),
                            text)


_WINDOW = 100  # characters of a long source line shown around the caret
_LONG_QUOTE = re.compile(r"`([^`\n]{121,})`")


def elide(text: str) -> str:
    """Shorten quoted names longer than 120 characters: `Yyyyyyy…(9,900 characters)`."""
    return _LONG_QUOTE.sub(lambda m: f"`{m.group(1)[:60]}…({len(m.group(1)):,} characters)`",
                           text)


def render(diag: Diagnostic, sources: Sources) -> str:
    """Format a diagnostic as `file:line:col: error: message`, the line, a caret, `help:`.
    Whatever came from a file or a file name is shown through `printable`."""
    head = f"{diag.severity}: {printable(elide(diag.message))}"
    if diag.span is None:
        lines = [head]
    else:
        lines = [f"{printable(str(diag.span))}: {head}"]
        text = sources.line(diag.span.file, diag.span.line)
        if text is not None:
            text = text.replace("\t", " ").rstrip("\r")
            col = max(diag.span.column, 1)
            end = None  # the column after the underlined text
            if diag.span.end_line == diag.span.line and diag.span.end_column:
                end = max(diag.span.end_column, col + 1)
            if _UNPRINTABLE.search(text):  # escapes widen the line: the caret moves with it
                shown = len(printable(text[: col - 1])) + 1
                end = len(printable(text[: (end or col + 1) - 1])) + 1
                col, text = shown, printable(text)
            end = end or col + 1
            start = 0
            if len(text) > _WINDOW:
                start = max(0, min(col - 1 - _WINDOW // 2, len(text) - _WINDOW))
                text = ("…" if start else "") + text[start : start + _WINDOW] + (
                    "…" if start + _WINDOW < len(text) else "")
                shift = start - (1 if start else 0)
                col, end = col - shift, end - shift
            width = max(1, min(end - col, len(text) - col + 1))
            gutter = f"{diag.span.line:>4} | "
            lines.append(gutter + text)
            lines.append(" " * (len(gutter) - 2) + "| " + " " * (col - 1) + "^" * width)
    for note in diag.notes:
        lines.append(f"  = note: {printable(note)}")
    if diag.hint:
        lines.append(f"  = help: {printable(elide(diag.hint))}")
    return "\n".join(lines)
