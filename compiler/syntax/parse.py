"""Text to syntax: the cached entry point; `parse_tree.py` holds the Lark side."""

from __future__ import annotations

from . import nodes as S


def parse_text(text: str, filename: str) -> S.File:
    """Parse one file; raises FgcError with a located diagnostic on any failure.

    Parsed files are cached on disk by name and content (cache.py, JSON read back
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
