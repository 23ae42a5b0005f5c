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

    def as_dict(self) -> dict:
        out = {"severity": self.severity, "message": elide(self.message),
               "hint": elide(self.hint) if self.hint else None}
        if self.span is not None:
            out.update(file=self.span.file, line=self.span.line, column=self.span.column)
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


_WINDOW = 100  # characters of a long source line shown around the caret
_LONG_QUOTE = re.compile(r"`([^`\n]{121,})`")


def elide(text: str) -> str:
    """Shorten quoted names longer than 120 characters: `Yyyyyyy…(9,900 characters)`."""
    return _LONG_QUOTE.sub(lambda m: f"`{m.group(1)[:60]}…({len(m.group(1)):,} characters)`",
                           text)


def render(diag: Diagnostic, sources: Sources) -> str:
    """Format a diagnostic as `file:line:col: error: message`, the line, a caret, `help:`."""
    head = f"{diag.severity}: {elide(diag.message)}"
    if diag.span is None:
        lines = [head]
    else:
        lines = [f"{diag.span}: {head}"]
        text = sources.line(diag.span.file, diag.span.line)
        if text is not None:
            text = text.replace("\t", " ").rstrip("\r")
            col = max(diag.span.column, 1)
            start = 0
            if len(text) > _WINDOW:
                start = max(0, min(col - 1 - _WINDOW // 2, len(text) - _WINDOW))
                text = ("…" if start else "") + text[start : start + _WINDOW] + (
                    "…" if start + _WINDOW < len(text) else "")
                col = col - start + (1 if start else 0)
            width = 1
            if diag.span.end_line == diag.span.line and diag.span.end_column:
                width = max(1, min(diag.span.end_column - diag.span.column, len(text) - col + 1))
            gutter = f"{diag.span.line:>4} | "
            lines.append(gutter + text)
            lines.append(" " * (len(gutter) - 2) + "| " + " " * (col - 1) + "^" * width)
    for note in diag.notes:
        lines.append(f"  = note: {note}")
    if diag.hint:
        lines.append(f"  = help: {elide(diag.hint)}")
    return "\n".join(lines)
