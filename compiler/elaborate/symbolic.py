"""Symbolic arithmetic for dimensions and parameter counts.

A `Poly` is a Laurent polynomial with rational coefficients over named symbols
(`12*L*H^2 + V*H`), closed under + - * and division by a monomial (so `D = H/A`
gives `A*D == H`). Anything else (division by a sum, floor, mod) becomes an opaque
`Atom` that still evaluates exactly. Written here rather than taken from sympy:
importing sympy alone costs more than the whole `fgc params` run is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

Number = int | Fraction


@dataclass(frozen=True, order=True)
class Atom:
    """An opaque subexpression such as `floor(L/2)` or `(H+1)/A`."""

    op: str  # "div" | "floor" | "ceil" | "mod" | "max" | "min"
    args: tuple[Poly, ...]

    def __str__(self) -> str:
        if self.op == "div":
            return f"({self.args[0]})/({self.args[1]})"
        if self.op == "mod":
            return f"({self.args[0]}) % ({self.args[1]})"
        return f"{self.op}({', '.join(str(a) for a in self.args)})"

    def sort_key(self) -> str:
        return "~" + str(self)


Symbol = str | Atom
Monomial = tuple[tuple[Symbol, int], ...]  # sorted (symbol, exponent), exponent != 0


def _sym_key(s: Symbol) -> tuple:
    return (1, s.sort_key()) if isinstance(s, Atom) else (0, s.lower(), s)


def _mono_mul(a: Monomial, b: Monomial) -> Monomial:
    exps: dict[Symbol, int] = dict(a)
    for s, e in b:
        exps[s] = exps.get(s, 0) + e
    return tuple(sorted(((s, e) for s, e in exps.items() if e), key=lambda se: _sym_key(se[0])))


class Poly:
    """An immutable Laurent polynomial; see the module docstring."""

    __slots__ = ("terms", "_hash")

    def __init__(self, terms: Mapping[Monomial, Fraction] | None = None):
        self.terms: dict[Monomial, Fraction] = {m: c for m, c in (terms or {}).items() if c}
        self._hash: int | None = None

    # -- construction
    @staticmethod
    def const(value: Number) -> Poly:
        return Poly({(): Fraction(value)})

    @staticmethod
    def sym(name: Symbol) -> Poly:
        return Poly({((name, 1),): Fraction(1)})

    @staticmethod
    def lift(x: Poly | Number) -> Poly:
        return x if isinstance(x, Poly) else Poly.const(x)

    # -- queries
    def is_const(self) -> bool:
        return all(m == () for m in self.terms)

    def const_value(self) -> Fraction:
        if not self.is_const():
            raise ValueError(f"{self} is not a constant")
        return self.terms.get((), Fraction(0))

    def symbols(self) -> set[str]:
        out: set[str] = set()
        for mono in self.terms:
            for s, _ in mono:
                if isinstance(s, Atom):
                    for a in s.args:
                        out |= a.symbols()
                else:
                    out.add(s)
        return out

    def degree(self) -> int:
        return max((sum(e for _, e in m) for m in self.terms), default=0)

    # -- arithmetic
    def __add__(self, other: Poly | Number) -> Poly:
        other = Poly.lift(other)
        terms = dict(self.terms)
        for m, c in other.terms.items():
            terms[m] = terms.get(m, Fraction(0)) + c
        return Poly(terms)

    __radd__ = __add__

    def __neg__(self) -> Poly:
        return Poly({m: -c for m, c in self.terms.items()})

    def __sub__(self, other: Poly | Number) -> Poly:
        return self + (-Poly.lift(other))

    def __rsub__(self, other: Poly | Number) -> Poly:
        return Poly.lift(other) - self

    def __mul__(self, other: Poly | Number) -> Poly:
        other = Poly.lift(other)
        terms: dict[Monomial, Fraction] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in other.terms.items():
                m = _mono_mul(m1, m2)
                terms[m] = terms.get(m, Fraction(0)) + c1 * c2
        return Poly(terms)

    __rmul__ = __mul__

    def __truediv__(self, other: Poly | Number) -> Poly:
        other = Poly.lift(other)
        if not other.terms:
            raise ZeroDivisionError("division by zero")
        if len(other.terms) == 1:
            (mono, coef), = other.terms.items()
            inverse = Poly({tuple((s, -e) for s, e in mono): 1 / coef})
            return self * inverse
        if self.is_const() and other.is_const():
            return Poly.const(self.const_value() / other.const_value())
        return Poly.sym(Atom("div", (self, other)))

    def __pow__(self, k: int) -> Poly:
        out = Poly.const(1)
        for _ in range(k):
            out = out * self
        return out

    @staticmethod
    def apply(op: str, *args: Poly) -> Poly:
        """floor/ceil/mod/max/min: exact when the arguments are constants, else an Atom."""
        if all(a.is_const() for a in args):
            vals = [a.const_value() for a in args]
            return Poly.const(_ATOM_OPS[op](*vals))
        return Poly.sym(Atom(op, tuple(args)))

    # -- substitution and evaluation
    def subs(self, env: Mapping[str, Poly]) -> Poly:
        """The polynomial with symbols replaced by polynomials. A value that is not one (a
        real hyperparameter such as `eps`, maybe `inf`, in a module's bindings) is not a size
        and leaves its symbol in place: `inf` has no exact value to substitute."""
        out = Poly()
        for mono, coef in self.terms.items():
            term = Poly.const(coef)
            for s, e in mono:
                if isinstance(s, Atom):
                    base = Poly.apply(s.op, *(a.subs(env) for a in s.args))
                else:
                    base = env.get(s)
                    if not isinstance(base, Poly):
                        base = Poly.sym(s)
                term = term * (base ** e if e > 0 else Poly.const(1) / (base ** -e))
            out = out + term
        return out

    def evaluate(self, env: Mapping[str, Number | float]) -> Fraction:
        """Exact value given every symbol; raises KeyError naming a missing one. Whole
        numbers are multiplied as ints, several times faster than as Fractions (`fgc check`
        evaluates a formula per preset)."""
        total: Number = 0
        for mono, coef in self.terms.items():
            term: Number = coef.numerator if coef.denominator == 1 else coef
            for s, e in mono:
                if isinstance(s, Atom):
                    base = _ATOM_OPS[s.op](*(a.evaluate(env) for a in s.args))
                else:
                    base = env[s]
                    if type(base) is not int:
                        base = Fraction(base)
                if e > 0:
                    term *= base ** e
                elif base == 0:
                    raise ZeroDivisionError(f"division by zero ({s} = 0)")
                else:
                    term = Fraction(term) / base ** -e
            total += term
        return Fraction(total)

    # -- comparison and printing
    def __eq__(self, other: object) -> bool:
        if isinstance(other, (int, Fraction)):
            other = Poly.const(other)
        if not isinstance(other, Poly):
            return NotImplemented
        return self.terms == other.terms

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset(self.terms.items()))
        return self._hash

    def __lt__(self, other: Poly) -> bool:  # only for deterministic sorting
        return str(self) < str(other)

    def __repr__(self) -> str:
        return f"Poly({str(self)!r})"

    def __str__(self) -> str:
        return format_poly(self)


def _floor(x: Fraction) -> Fraction:
    return Fraction(x.numerator // x.denominator)


def _ceil(x: Fraction) -> Fraction:
    return Fraction(-((-x.numerator) // x.denominator))


_ATOM_OPS: dict[str, Callable[..., Fraction]] = {
    "floor": _floor,
    "ceil": _ceil,
    "mod": lambda a, b: Fraction(a % b),
    "max": max,
    "min": min,
    "div": lambda a, b: a / b,
}


def _format_number(c: Fraction) -> str:
    if c.denominator == 1:
        return str(c.numerator)
    return f"{c.numerator}/{c.denominator}"


def _format_symbol(s: Symbol) -> str:
    return str(s) if isinstance(s, Atom) else s


def _term_order(item: tuple[Monomial, Fraction]) -> tuple:
    mono, _ = item
    degree = sum(e for _, e in mono)
    return (-degree, [(_sym_key(s), -e) for s, e in mono])


def format_monomial(mono: Monomial, coef: Fraction, mul: str = "*") -> str:
    num = [_format_symbol(s) + (f"^{e}" if e != 1 else "") for s, e in mono if e > 0]
    den = [_format_symbol(s) + (f"^{-e}" if e != -1 else "") for s, e in mono if e < 0]
    parts = []
    if coef.numerator != 1 or not num:
        parts.append(str(coef.numerator))
    parts.extend(num)
    text = mul.join(parts)
    den_parts = ([str(coef.denominator)] if coef.denominator != 1 else []) + den
    if den_parts:
        d = mul.join(den_parts)
        text += "/" + (f"({d})" if len(den_parts) > 1 else d)
    return text


def real_value(p: Poly, numbers: Mapping[str, float]) -> float | None:
    """p as a float, given a number for each name in it (real hyperparameters); None where
    one is missing or where exact arithmetic cannot take a number given (an infinite real
    in an expression). A name alone is its number as given, `inf` included."""
    names = p.symbols()
    if not names <= numbers.keys():
        return None
    if len(names) == 1 and p == Poly.sym(next(iter(names))):
        return float(numbers[next(iter(names))])
    try:
        return float(p.evaluate(numbers))
    except (ArithmeticError, ValueError):
        return None


def format_poly(p: Poly, mul: str = "*") -> str:
    """`12*L*H^2 + 9*L*H - 3`: terms by falling degree, symbols case-insensitively sorted."""
    if not p.terms:
        return "0"
    out = ""
    for i, (mono, coef) in enumerate(sorted(p.terms.items(), key=_term_order)):
        text = format_monomial(mono, abs(coef), mul)
        if i == 0:
            out = ("-" if coef < 0 else "") + text
        else:
            out += (" - " if coef < 0 else " + ") + text
    return out


# A symbol is a spec's name (`d_k`, `c^loc`, `H'`) or a bracketed condition on sizes
# (`[L > 2]`); an exponent is always a number, so `c^loc^2` is `c^loc` squared.
_TOKEN = re.compile(r"\s*(?:(?P<num>\d+)"
                    r"|(?P<name>[A-Za-z][A-Za-z0-9_]*'*(?:\^[A-Za-z][A-Za-z0-9_]*)?)"
                    r"|(?P<punct>[-+*/^%(),\[]))")
_ATOM_NAMES = ("floor", "ceil", "max", "min")


def parse_poly(text: str) -> Poly:
    """The Poly that `format_poly` wrote as `text`: `parse_poly(format_poly(p)) == p` for
    every Poly, opaque parts included (`(H + 1)/(A + 1)`, `floor(L/2)`, `(L) % (2)` come
    back as the same `Atom`s). Raises ValueError on text format_poly never writes."""
    return _PolyReader(text).read()


class _PolyReader:
    """Recursive descent over format_poly's output: sums of products of powers."""

    def __init__(self, text: str):
        self.text = text
        self.tokens = self._tokenize(text.rstrip())
        self.i = 0

    def _tokenize(self, text: str) -> list[tuple[str, str]]:
        """(kind, text) pairs: kind is num, name (a bracketed condition too) or punct."""
        out, pos = [], 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise self._error(f"unexpected {text[pos:].lstrip()[:1]!r}")
            if m["punct"] == "[":  # a condition: everything up to the matching bracket
                depth, end = 0, m.end() - 1
                for end in range(m.end() - 1, len(text)):
                    depth += {"[": 1, "]": -1}.get(text[end], 0)
                    if depth == 0:
                        break
                if depth:
                    raise self._error("unclosed `[`")
                out.append(("name", text[m.end() - 1:end + 1]))
                pos = end + 1
                continue
            kind = m.lastgroup
            out.append((kind, m[kind]))
            pos = m.end()
        return out

    def _error(self, why: str) -> ValueError:
        return ValueError(f"not a size: {self.text!r} ({why})")

    def _peek(self, value: str | None = None, offset: int = 0) -> bool:
        j = self.i + offset
        return j < len(self.tokens) and (value is None or self.tokens[j][1] == value)

    def _take(self, value: str | None = None) -> str:
        if not self._peek(value):
            raise self._error(f"expected {value or 'more'}" + (
                f" before {self.tokens[self.i][1]!r}" if self._peek() else " at the end"))
        self.i += 1
        return self.tokens[self.i - 1][1]

    def read(self) -> Poly:
        p = self._sum()
        if self._peek():
            raise self._error(f"unexpected {self.tokens[self.i][1]!r}")
        return p

    def _sum(self) -> Poly:
        p = self._product()
        while self._peek("+") or self._peek("-"):
            p = p + self._product() if self._take() == "+" else p - self._product()
        return p

    def _product(self) -> Poly:
        p = self._factor()
        while self._peek("*") or self._peek("/"):
            p = p * self._factor() if self._take() == "*" else p / self._factor()
        return p

    def _factor(self) -> Poly:
        if self._peek("-"):
            self._take()
            return -self._factor()
        base = self._primary()
        if self._peek("^"):
            self._take()
            if not self._peek() or self.tokens[self.i][0] != "num":
                raise self._error("an exponent is a whole number")
            base = base ** int(self._take())
        return base

    def _primary(self) -> Poly:
        if not self._peek():
            raise self._error("expected more at the end")
        kind, value = self.tokens[self.i]
        if kind == "num":
            self.i += 1
            return Poly.const(int(value))
        if kind == "name" and value in _ATOM_NAMES and self._peek("(", 1):
            self.i += 2
            args = [self._sum()]
            while self._peek(","):
                self._take()
                args.append(self._sum())
            self._take(")")
            return Poly.sym(Atom(value, tuple(args)))
        if kind == "name":
            self.i += 1
            return Poly.sym(value)
        self._take("(")
        inner = self._sum()
        self._take(")")
        # `(a)/(b)` and `(a) % (b)` are how Atom prints an opaque quotient or remainder;
        # a parenthesised denominator of a plain term (`L/(2*H)`) is never followed by one
        for op, symbol in (("div", "/"), ("mod", "%")):
            if self._peek(symbol) and self._peek("(", 1):
                self.i += 2
                other = self._sum()
                self._take(")")
                return Poly.sym(Atom(op, (inner, other)))
        return inner


def format_int(value: Number) -> str:
    """`116497920` -> `116,497,920`; non-integers as fractions."""
    value = Fraction(value)
    if value.denominator == 1:
        return f"{value.numerator:,}"
    return _format_number(value)


def human(value: Number) -> str:
    """`124439808` -> `124.4M`."""
    v = float(value)
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.1f}{unit}"
    return str(int(v)) if v == int(v) else str(v)
