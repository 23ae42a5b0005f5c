"""Text to syntax: the cached entry point; `parse_tree.py` holds the Lark side."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

from . import syntax as S
from .errors import FgcError, Span

GRAMMAR = Path(__file__).with_name("grammar.lark")

MAX_DEPTH = 400  # depth of one expression's tree; deeper input is rejected, not recursed into
MAX_NUMBER_DIGITS = 40

_SUFFIX = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}
MAX_MAGNITUDE = 10**300  # floats end near 1.8e308; no size or constant comes near this
_MISPLACED_UNDERSCORE = re.compile(r"(?<![0-9])_|_(?![0-9])")
_UNDERSCORES = re.compile(r"_+")

# How expected terminals read in a message.
_TERMINAL_TEXT = {
    "NAME": "a name", "INT": "an integer", "FLOAT": "a number", "LPAR": "'('", "RPAR": "')'",
    "LSQB": "'['", "RSQB": "']'", "LBRACE": "'{'", "RBRACE": "'}'", "COMMA": "','",
    "EQUAL": "'='", "COLON": "':'", "PLUS": "'+'", "MINUS": "'-'", "STAR": "'*'", "SLASH": "'/'",
    "CIRCUMFLEX": "'^'", "ELLIPSIS": "'...'", "__ANON_0": "'->'", "EQEQ": "'=='", "TILDE": "'~'",
    "CMP": "a comparison", "PARITY": "'even' or 'odd'", "AT": "'@'", "PERCENT": "'%'",
    "$END": "end of file",
}


def parse_text(text: str, filename: str) -> S.File:
    """Parse one file; raises FgcError with a located diagnostic on any failure.

    Parsed files are cached on disk by name and content (compiler/cache.py, JSON read back
    against the syntax tree's types), as Python caches bytecode: a spec already seen parses
    without importing Lark at all."""
    from . import cache
    tree = cache.load_tree(text, filename)
    if tree is not None:
        return tree
    from .parse_tree import parse_uncached
    tree = parse_uncached(text, filename)
    cache.store_tree(text, filename, tree)
    return tree


def parse_number(tok, filename: str) -> Fraction:
    """The exact value of a number token (`768`, `10_000`, `1e-5`, `1.3B`); FgcError, located
    at the token, for what the grammar's patterns let through but is not a number: an `_`
    that is not between two digits (`1_`, `1__0`), more than MAX_NUMBER_DIGITS digits, or a
    magnitude past MAX_MAGNITUDE (beyond that a float overflows). `--set` passes its text
    here too, so other malformed text raises ValueError (or FgcError)."""
    raw = str(tok)
    span = Span(filename, tok.line, tok.column, tok.end_line, tok.end_column)
    shown = f"{raw[:20]}{'…' if len(raw) > 20 else ''}"
    if _MISPLACED_UNDERSCORE.search(raw):
        raise FgcError(f"malformed number `{shown}`: `_` goes between two digits", span,
                       f"write `{_UNDERSCORES.sub('_', raw).strip('_')}`"
                       if raw.strip("_") else None)
    text = raw.replace("_", "")
    scale = 1
    if text[-1] in _SUFFIX:
        scale = _SUFFIX[text[-1]]
        text = text[:-1]
    digits = len(text.split("e")[0].split("E")[0])
    exponent = 0
    for marker in ("e", "E"):
        if marker in text:
            exponent = int(text.split(marker)[1])
    if digits > MAX_NUMBER_DIGITS or abs(exponent) > 300:
        raise FgcError(f"number too large: {shown}", span,
                       f"fgc accepts at most {MAX_NUMBER_DIGITS} digits")
    value = Fraction(text) * scale
    if abs(value) > MAX_MAGNITUDE:
        raise FgcError(f"number too large: {shown}", span,
                       "fgc accepts numbers up to 1e300")
    return value


