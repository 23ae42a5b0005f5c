"""Text to syntax: the cached entry point; `parse_tree.py` holds the Lark side."""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import tempfile
from fractions import Fraction
from pathlib import Path

from . import syntax as S
from .errors import FgcError, Span

GRAMMAR = Path(__file__).with_name("grammar.lark")

MAX_DEPTH = 400  # depth of one expression's tree; deeper input is rejected, not recursed into
MAX_NUMBER_DIGITS = 40

_SUFFIX = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}

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

    Parsed files are cached on disk by name and content, as Python caches bytecode: a spec
    already seen parses without importing Lark at all."""
    key = _cache_key(text, filename)
    path = _cache_dir() / f"parse-{key}.pickle"
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception:  # noqa: BLE001 - a missing or unreadable entry is rebuilt
        pass
    from .parse_tree import parse_uncached
    tree = parse_uncached(text, filename)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(tree, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
        _prune(path.parent)
    except OSError:
        pass
    return tree


CACHE_ENTRIES = 512


def _prune(folder: Path) -> None:
    """Keep the cache small: past CACHE_ENTRIES files, drop the least recently used quarter."""
    entries = list(folder.glob("parse-*.pickle"))
    if len(entries) <= CACHE_ENTRIES:
        return
    entries.sort(key=lambda p: p.stat().st_atime)
    for old in entries[: len(entries) // 4]:
        old.unlink(missing_ok=True)


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fgc"


@functools.lru_cache(maxsize=1)
def _code_version() -> bytes:
    here = Path(__file__).parent
    return b"".join((here / f).read_bytes() for f in ("grammar.lark", "parse.py",
                                                      "parse_tree.py", "syntax.py"))


def _cache_key(text: str, filename: str) -> str:
    h = hashlib.sha256(_code_version())
    h.update(filename.encode("utf-8", "surrogatepass") + b"\0")
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:24]


def parse_number(tok, filename: str) -> Fraction:
    text = str(tok).replace("_", "")
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
        raise FgcError(f"number too large: {str(tok)[:20]}{'…' if len(tok) > 20 else ''}",
                       Span(filename, tok.line, tok.column, tok.end_line, tok.end_column),
                       f"fgc accepts at most {MAX_NUMBER_DIGITS} digits")
    return Fraction(text) * scale


