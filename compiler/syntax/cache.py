"""The on-disk caches of the front half: parsed specs and Lark's parse tables, as JSON.

Nothing here is unpickled or executed. A syntax tree is stored as nested JSON lists
(`["BinOp", span, "+", left, right]`) and read back against the dataclasses' own type
hints: a class name outside nodes.py, a field of the wrong type or number, a
truncated or oversized file, a link, a FIFO or a folder at an entry's path — any of these
makes the entry a miss, and the spec is parsed again and the entry rewritten.

Entries live in `runtime.files.cache_home()` (`$XDG_CACHE_HOME/fgc`, `~/.cache/fgc`),
created 0700 and used only while it is this user's and closed to others. They are keyed
by the SHA-256 of fgc's parser sources and the input, so a changed grammar or spec never
meets an old entry; deleting the folder is always safe (`fgc cache clear`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import types
import typing
from fractions import Fraction
from pathlib import Path

from runtime.files import atomic_write, cache_home, private_dir, read_entry

from ..errors import Span
from . import nodes as S

FORMAT = 1
ENTRY_LIMIT = 64 * 2**20  # bytes; a spec is at most 512 KiB, its tree a few times that
CACHE_ENTRIES = 512  # parse entries kept; past this the least recently used quarter goes


class Invalid(Exception):
    """An entry that does not decode to what fgc wrote: treated as a miss."""


# ---------------------------------------------------------------- the folder


def folder() -> Path | None:
    """The private cache folder, or None when there is none fgc can trust."""
    if os.environ.get("FGC_NO_CACHE"):
        return None
    return private_dir(cache_home())


def _read(name: str) -> bytes | None:
    where = folder()
    return None if where is None else read_entry(where / name, ENTRY_LIMIT)


def _write(name: str, data: bytes) -> None:
    where = folder()
    if where is None:
        return
    with contextlib.suppress(OSError):
        atomic_write(where / name, data, fsync=False, file_mode=0o600)


def prune(where: Path, pattern: str = "parse-*.json", keep: int = CACHE_ENTRIES) -> None:
    """Past `keep` entries, drop the least recently used quarter."""
    try:
        entries = [(p.lstat().st_atime, p) for p in where.glob(pattern)]
    except OSError:
        return
    if len(entries) <= keep:
        return
    entries.sort(key=lambda e: e[0])
    for _, old in entries[: len(entries) // 4]:
        with contextlib.suppress(OSError):
            old.unlink()


# ---------------------------------------------------------------- parsed specs


@functools.lru_cache(maxsize=1)
def code_version() -> bytes:
    """The parser's own sources: an entry written by another fgc is never read."""
    here = Path(__file__).parent
    h = hashlib.sha256(f"format {FORMAT}".encode())
    for f in ("grammar.lark", "parse.py", "parse_tree.py", "nodes.py", "cache.py"):
        h.update((here / f).read_bytes())
    return h.digest()


def key(text: str, filename: str) -> str:
    h = hashlib.sha256(code_version())
    h.update(filename.encode("utf-8", "surrogatepass") + b"\0")
    h.update(text.encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:32]


def load_tree(text: str, filename: str) -> S.File | None:
    """The cached syntax tree of `text`, or None (a miss, whatever the reason)."""
    data = _read(f"parse-{key(text, filename)}.json")
    if data is None:
        return None
    try:
        tree = _decode_node(json.loads(data), S.File)
    except (Invalid, ValueError, TypeError, RecursionError, MemoryError):
        return None
    return tree if tree.name == filename else None


def store_tree(text: str, filename: str, tree: S.File) -> None:
    try:
        data = json.dumps(_encode(tree), separators=(",", ":")).encode("utf-8", "surrogatepass")
    except (ValueError, RecursionError):
        return
    _write(f"parse-{key(text, filename)}.json", data)
    where = folder()
    if where is not None:
        prune(where)


def _encode(x):
    kind = type(x)
    names = _FIELD_NAMES.get(kind)
    if names is not None:
        return [kind.__name__, *[_encode(getattr(x, n)) for n in names]]
    if kind is Fraction:
        return [x.numerator, x.denominator]
    if kind is list or kind is tuple:
        return [_encode(v) for v in x]
    return x


# Decoding is directed by the type hints of nodes.py: what a field may hold is
# what its annotation says, so an entry cannot smuggle in another class or a wrong type.

_CLASSES = {name: cls for name, cls in vars(S).items()
            if isinstance(cls, type) and dataclasses.is_dataclass(cls)
            and cls.__module__ == S.__name__}
_CLASSES["Span"] = Span
_FIELD_NAMES = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _CLASSES.values()}
_ANY_NODE = object()  # an unannotated `list` of statements: any syntax node


@functools.cache
def _fields(cls) -> tuple:
    return dataclasses.fields(cls)


def _decode_node(v, want):
    if not (type(v) is list and v and type(v[0]) is str):
        raise Invalid("not a node")
    cls = _CLASSES.get(v[0])
    if cls is None or (want is not _ANY_NODE and not issubclass(cls, want)):
        raise Invalid(f"unexpected node {v[0]!r}")
    fields = _field_decoders(cls)
    if len(v) != len(fields) + 1:
        raise Invalid(f"{v[0]} with {len(v) - 1} fields")
    return cls(*[f(x) for f, x in zip(fields, v[1:])])


@functools.cache
def _field_decoders(cls) -> tuple:
    hints = typing.get_type_hints(cls, globalns={**vars(S), "Span": Span, "Fraction": Fraction})
    return tuple(_decoder(hints[f.name]) for f in _fields(cls))


def _decoder(hint):
    """A function that checks one JSON value against `hint` and returns it decoded."""
    if hint in (str, bool, int):
        def exact(v):
            if type(v) is not hint:
                raise Invalid(f"expected {hint.__name__}")
            return v
        return exact
    if hint is Fraction:
        def fraction(v):
            if not (type(v) is list and len(v) == 2 and type(v[0]) is int
                    and type(v[1]) is int and v[1] > 0):
                raise Invalid("expected a fraction")
            return Fraction(v[0], v[1])
        return fraction
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        members = typing.get_args(hint)
        optional = type(None) in members
        choices = [_decoder(m) for m in members if m is not type(None)]

        def union(v):
            if v is None:
                if not optional:
                    raise Invalid("unexpected null")
                return None
            for choice in choices:
                try:
                    return choice(v)
                except Invalid:
                    continue
            raise Invalid("no member of the union fits")
        return union
    if hint is list or origin is list:
        args = typing.get_args(hint)
        item = _decoder(args[0]) if args else (lambda v: _decode_node(v, _ANY_NODE))

        def items(v):
            if type(v) is not list:
                raise Invalid("expected a list")
            return [item(x) for x in v]
        return items
    if origin is tuple:
        parts = [_decoder(h) for h in typing.get_args(hint)]

        def fixed(v):
            if not (type(v) is list and len(v) == len(parts)):
                raise Invalid("expected a tuple")
            return tuple(f(x) for f, x in zip(parts, v))
        return fixed
    if hint is Span:  # half of all nodes: checked inline
        def span(v):
            if not (type(v) is list and len(v) == 6 and v[0] == "Span" and type(v[1]) is str
                    and type(v[2]) is int and type(v[3]) is int
                    and (v[4] is None or type(v[4]) is int)
                    and (v[5] is None or type(v[5]) is int)):
                raise Invalid("expected a span")
            return Span(v[1], v[2], v[3], v[4], v[5])
        return span
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return lambda v: _decode_node(v, hint)
    raise TypeError(f"compiler/syntax/cache.py has no rule for {hint!r}")


# ---------------------------------------------------------------- Lark's tables


def load_grammar(grammar: str, options: dict):
    """A Lark LALR parser for `grammar`, its tables read from the cache when they are there
    (building them costs more than parsing a spec) and written there when not."""
    import lark
    from lark.grammar import Rule
    from lark.lexer import TerminalDef
    name = "grammar-" + hashlib.sha256(
        (grammar + repr(sorted(options.items())) + lark.__version__).encode()).hexdigest()[:32] \
        + ".json"
    data = _read(name)
    if data is not None:
        try:
            stored = json.loads(data, object_hook=_untag)
            return lark.Lark._load_from_dict(stored["data"], stored["memo"])
        except Exception:  # noqa: BLE001 - a damaged entry is rebuilt, whatever broke
            pass
    parser = lark.Lark(grammar, **options)
    tables, memo = parser.memo_serialize([TerminalDef, Rule])
    with contextlib.suppress(TypeError, ValueError):
        _write(name, json.dumps({"data": _tag(tables), "memo": _tag(memo)},
                                separators=(",", ":")).encode())
    return parser


# Lark's tables hold tuples and integer-keyed dicts, which JSON has not: tagged objects.

def _tag(x):
    if isinstance(x, dict):
        if all(isinstance(k, str) and not k.startswith("\0") for k in x):
            return {k: _tag(v) for k, v in x.items()}
        return {"\0d": [[_tag(k), _tag(v)] for k, v in x.items()]}
    if isinstance(x, tuple):
        return {"\0t": [_tag(v) for v in x]}
    if isinstance(x, list):
        return [_tag(v) for v in x]
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    raise TypeError(f"cannot store {type(x).__name__} in the grammar cache")


def _untag(d: dict):
    if len(d) == 1:
        if "\0t" in d:
            return tuple(d["\0t"])
        if "\0d" in d:
            return {(tuple(k) if isinstance(k, list) else k): v for k, v in d["\0d"]}
    return d
