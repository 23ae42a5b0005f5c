"""Syntax: `.fgpt` text in, a syntax tree (`nodes.py`) out, with a span on every node.

`grammar.lark` is the language; `parse.py` is the entry point (`parse_text`), which reads a
file seen before from the on-disk cache (`cache.py`, JSON checked against the node classes)
and otherwise hands it to `parse_tree.py`, the only module that imports Lark, to parse and
turn Lark's tree into `nodes.py`'s dataclasses with friendly errors. Nothing here knows
what a name means or what shape a value has: that is elaboration's.
"""
