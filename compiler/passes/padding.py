"""Padding: what a `Pad[n]` input means, derived once for both backends.

A model input `attention_mask: Pad[n]` says that the rows of a batch may be padded along
the positions n: position j of a row holds a token where the mask is 1 and padding where it
is 0, the padding at either end of the row. At each token the model computes what it
computes for that row's tokens alone (docs/language.md, "Padding"). The backends make it so
in two places, which `derive` finds:

- every attention whose keys run along n (a site) masks the keys at padded positions,
  whatever else its mask says (causal, a window, a bias, none);
- whatever is read by position along n — a parameter or a module's table sized by n, the
  angles of a rotary use — is read at each token's rank among its row's tokens, the
  positions transformers derives from `attention_mask` (cumsum - 1).

Differences of positions are the same with padding at the ends, so a relative bias, a
window or a causal mask needs nothing more. Anything else that mixes positions (a product
over them, a cumulative sum) would see the padding: the analysis is the incremental form's
walk (passes/incremental.py), which proves each equation keeps positions apart or is one
of the above, and reports the first that is not, located.

A spec whose equations read the mask (XLNet's, whose attention is written out: it adds the
padding to its masks) applies it itself: the mask is then `explicit`, fgc applies nothing
more, and it stays optional (all ones).

Imports neither torch nor onnx.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..elaborate import ir
from ..elaborate.ir import Loop
from ..elaborate.symbolic import Poly
from ..errors import FgcError
from .incremental import CacheSite, _Walk


@dataclass(frozen=True)
class Padded:
    """One `Pad` input: the positions it pads and the attentions over them."""

    input: str  # the Pad input's name
    length: str  # the symbol of the positions it pads
    sites: tuple[CacheSite, ...]  # attentions whose keys run along them (path, loop)
    explicit: bool = False  # equations read it: the spec applies it itself


@dataclass
class Padding:
    inputs: list[Padded] = field(default_factory=list)
    # (calling module or "" for the model, module use) -> the callee's symbols along padded
    # positions at that use (a table inside a module is read at the tokens' ranks)
    along: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)

    def table(self, shape) -> Padded | None:
        """The Pad input at whose tokens' positions a table computed from sizes (a
        sinusoid) is read, row by row: where its first axis runs along padded positions and
        no other axis along any. A table of queries by keys (a relative bias) depends on
        their distance, which padding at the ends keeps: it stays as it is (None)."""
        if not shape or any(self.of(d) is not None for d in shape[1:]):
            return None
        p = self.of(shape[0])
        return p if p is not None and shape[0] == Poly.sym(p.length) else None

    def of(self, d) -> Padded | None:
        """The Pad input fgc applies whose positions a size runs along, if any."""
        if not isinstance(d, Poly):
            return None
        return next((p for p in self.inputs if p.length in d.symbols() and not p.explicit),
                    None)


def pad_inputs(model: ir.Model) -> list[ir.Value]:
    return [v for v in model.inputs if v.type.pad]


def derive(model: ir.Model, functions: dict[str, ir.Function]) -> Padding | None:
    """The padding of `model`'s Pad inputs (None without any), or an FgcError saying where
    a padded batch would compute something else than each row's tokens alone."""
    pads = pad_inputs(model)
    if not pads:
        return None
    out = Padding()
    tokens = [v for v in model.inputs if v.type.dtype == "int" and not v.type.pad]
    seen: dict[str, str] = {}
    for v in pads:
        t = v.type
        n = t.shape[0] if len(t.shape) == 1 else None
        if t.family is not None or not isinstance(n, Poly) or len(n.symbols()) != 1 or \
                n != Poly.sym(next(iter(n.symbols()))):
            raise FgcError(f"padding mask `{v.name}` runs along a size that is not a sequence "
                           "length", model.span, "write Pad[n] with the tokens' length n")
        g = next(iter(n.symbols()))
        if g in seen:
            raise FgcError(f"`{seen[g]}` and `{v.name}` both pad the positions {g}",
                           model.span)
        seen[g] = v.name
        if not any(len(x.type.shape) == 1 and x.type.shape[0] == n for x in tokens):
            raise FgcError(f"padding mask `{v.name}` pads positions {g}, and no integer "
                           f"input runs along {g}", model.span,
                           "a Pad[n] input pads the tokens of an input like x: {1..V}^n")
        if _read(model, v.name):
            out.inputs.append(Padded(v.name, g, (), explicit=True))
            continue
        walk = _Walk(model, functions, g, padded=True)
        walk.run()
        if walk.errors:
            message, span = walk.errors[0]
            raise FgcError(f"`{v.name}` cannot pad the positions {g}: {message}",
                           span or model.span,
                           "padding needs every mixing of positions to be attention")
        out.inputs.append(Padded(v.name, g, tuple(walk.sites)))
        for key, syms in walk.along.items():
            out.along[key] = out.along.get(key, frozenset()) | syms
    return out


def _read(model: ir.Model, name: str) -> bool:
    """Whether an equation of the model reads input `name`."""
    return any(o.name == name for item in model.body
               for e in (item.body if isinstance(item, Loop) else [item]) for o in e.ins)


def check(model: ir.Model, functions: dict[str, ir.Function]) -> list:
    """`derive`'s error as diagnostics, for `fgc check`."""
    try:
        derive(model, functions)
    except FgcError as e:
        return e.diagnostics
    return []

