"""Symbolic dimensions: integers, or polynomials over named dimensions.

A dimension is an `int` or an `Expr`: a polynomial with integer coefficients over symbols
(`batch`, `seq`, ...), kept in one canonical form so that two expressions are equal exactly when
their canonical forms are (`batch*seq` and `seq*batch` are one value; `(batch*seq)/seq` is
`batch`). What a polynomial cannot say (a division that does not come out exact, a minimum of
two unrelated dimensions) becomes an *atom*: a new symbol whose name spells the operation on the
canonical forms of its operands, so the same computation on the same inputs is the same atom
and nothing else is.

Why not sympy: dimensions of exported graphs are sums and products of a few symbols, and the
questions asked are "equal?", "static?" and "divisible?". A dict of monomials answers them
exactly; `bench/symbolic_algebra.py` measures it against sympy on the operations shape folding
makes (about 40x faster per operation here, and no import cost), and sympy's general
simplification would decide nothing more for these forms.

Equality is structural, hence sound: `equal(a, b)` is True only when `a - b` is the zero
polynomial, False only when `a - b` is a non-zero constant, and None (undecided) otherwise.

**Integer width.** The algebra computes in unbounded integers; onnxruntime computes a tensor's
elements at its width and wraps (int32 `65536 * 40000` is negative). `fits(d, bits)` says
whether `d` lies in the signed range of that width for every value its symbols can take, and
`infercc.ir.symbolic_shapes` keeps an element of integer arithmetic only when it fits (else the
element is unknown, and nothing that depends on it folds). A dimension symbol ranges over
`0..DIM_MAX`: a dimension below 2**31, what a Cast of a shape to int32 (every tf2onnx export)
already assumes. An atom carries the range of its operation on its operands' ranges.

**No hidden state.** An atom carries its own facts (whether it may be negative, its range) in
its name object (`Atom`), so every answer depends on the arguments alone, never on what the
process computed before. The one table, canonical text -> expression for the texts `to_text`
wrote into the IR, belongs to one model's analysis: an `Algebra`, active in a `using(...)`
block (`algebra_for(graph)` gives a graph's); outside one, `from_ir` reads a text that spells
a polynomial (`parse`: `batch*seq`, or `s69 + s70` as torch's dynamo exporter writes a derived
dimension) as that polynomial, in any process, and any other text as a symbol.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

DIM_MAX = 2**31 - 1  # the largest value a dimension symbol is taken to have (module docstring)

Monomial = tuple[str, ...]  # sorted symbol names, repeated for powers; () is the constant term


class Expr:
    """A polynomial over dimension symbols with integer coefficients (immutable, hashable).

    Never build one directly: `sym(name)` and the arithmetic below return an `int` whenever
    the result is a constant, so a static dimension is always an `int`.
    """

    __slots__ = ("terms", "_hash", "_text")

    def __init__(self, terms: tuple[tuple[Monomial, int], ...]):
        self.terms = terms  # sorted by monomial, no zero coefficients, not a bare constant
        self._hash = hash(terms)
        self._text: str | None = None

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Expr) and other.terms == self.terms

    def __repr__(self) -> str:
        return f"Expr({str(self)!r})"

    def __str__(self) -> str:
        if self._text is None:
            self._text = _format(self.terms)
        return self._text

    @property
    def symbols(self) -> frozenset[str]:
        return frozenset(s for mono, _ in self.terms for s in mono)


Dim = int | Expr


def sym(name: str) -> Expr:
    """The dimension named `name`."""
    return Expr((((name,), 1),))


def is_static(d: Dim | None) -> bool:
    return isinstance(d, int)


def _terms(d: Dim) -> dict[Monomial, int]:
    if isinstance(d, int):
        return {(): d} if d else {}
    return dict(d.terms)


def _make(terms: dict[Monomial, int]) -> Dim:
    items = tuple(sorted((m, c) for m, c in terms.items() if c))
    if not items:
        return 0
    if len(items) == 1 and items[0][0] == ():
        return items[0][1]
    return Expr(items)


def add(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    out = _terms(a)
    for m, c in _terms(b).items():
        out[m] = out.get(m, 0) + c
    return _make(out)


def neg(a: Dim) -> Dim:
    if isinstance(a, int):
        return -a
    return _make({m: -c for m, c in a.terms})


def sub(a: Dim, b: Dim) -> Dim:
    return add(a, neg(b))


def mul(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    out: dict[Monomial, int] = {}
    for ma, ca in _terms(a).items():
        for mb, cb in _terms(b).items():
            m = tuple(sorted(ma + mb))
            out[m] = out.get(m, 0) + ca * cb
    return _make(out)


def prod(dims: Iterable[Dim]) -> Dim:
    out: Dim = 1
    for d in dims:
        out = mul(out, d)
    return out


class Atom(str):
    """The name of an atom, carrying what is known of its value: `signed` (it may be
    negative) and its range `low..high` (None: not bounded). Equal to (and hashed as) its
    name, so an atom read back from the IR as a plain name is the same symbol."""

    signed: bool
    low: int | None
    high: int | None

    def __new__(cls, name: str, signed: bool, low: int | None, high: int | None) -> Atom:
        self = super().__new__(cls, name)
        self.signed, self.low, self.high = signed, low, high
        return self

    def __reduce__(self) -> tuple:
        return (Atom, (str(self), self.signed, self.low, self.high))


def atom(op: str, *args: Dim, dim: bool = False) -> Expr:
    """The symbol standing for `op(args)` when no polynomial can (canonical in its args).

    An atom of non-negative arguments (the quotient, remainder, minimum or maximum of sizes)
    is non-negative like every dimension symbol; any other may be negative. Its range is its
    operation's on its arguments' ranges; `dim` says it is a tensor's dimension (0..DIM_MAX)."""
    name = f"{op}({', '.join(str(a) for a in args)})"
    signed = not all(nonneg(a) for a in args)
    low, high = (0, DIM_MAX) if dim else _atom_range(op, [bounds(a) for a in args], signed)
    return Expr((((Atom(name, signed and not dim, low, high),), 1),))


def _atom_range(
    op: str, ranges: list[tuple[int, int] | None], signed: bool
) -> tuple[int | None, int | None]:
    known = [r for r in ranges if r is not None]
    if len(known) != len(ranges):
        return None, None
    if op in ("min", "max"):
        pick = min if op == "min" else max
        return pick(r[0] for r in known), pick(r[1] for r in known)
    if op == "div":  # |a / b| <= |a| for any non-zero integer b
        top = max(abs(known[0][0]), abs(known[0][1]))
        return (-top if signed else 0), top
    if op == "mod":  # |a mod b| < |b|, with the sign of b
        top = max(abs(known[1][0]), abs(known[1][1]))
        return (-top if known[1][0] < 0 else 0), top
    return None, None


def _symbol_signed(name: str) -> bool:
    return isinstance(name, Atom) and name.signed


def _symbol_range(name: str) -> tuple[int, int] | None:
    if not isinstance(name, Atom):
        return 0, DIM_MAX
    if name.low is None or name.high is None:
        return None
    return name.low, name.high


def bounds(d: Dim) -> tuple[int, int] | None:
    """The least and greatest value of d over every value of its symbols (dimensions in
    0..DIM_MAX, atoms in their ranges), or None where an atom is not bounded."""
    if isinstance(d, int):
        return d, d
    low = high = 0
    for mono, c in d.terms:
        got: tuple[int, int] | None = (c, c)
        for name in mono:
            got = _times(got, _symbol_range(name))
            if got is None:
                return None
        if got is None:  # (a monomial has at least one symbol: the loop ran)
            return None
        low, high = low + got[0], high + got[1]
    return low, high


def _times(a: tuple[int, int] | None, b: tuple[int, int] | None) -> tuple[int, int] | None:
    if a is None or b is None:
        return None
    products = [x * y for x in a for y in b]
    return min(products), max(products)


def fits(d: Dim | None, bits: int) -> bool:
    """True when d lies in the range of a signed integer of `bits` bits for every value of its
    symbols: the element onnxruntime computes at that width is d itself, not d wrapped."""
    if d is None:
        return False
    got = bounds(d)
    return got is not None and -(2 ** (bits - 1)) <= got[0] and got[1] < 2 ** (bits - 1)


def nonneg(d: Dim) -> bool:
    """True when d >= 0 for every value of its symbols (which are sizes, >= 0): an int >= 0,
    or a polynomial whose coefficients are all >= 0 over non-negative symbols."""
    if isinstance(d, int):
        return d >= 0
    return all(c >= 0 and not any(_symbol_signed(s) for s in m) for m, c in d.terms)


def positive(d: Dim) -> bool:
    """True when d > 0 for every value of its symbols: non-negative with a positive constant."""
    if isinstance(d, int):
        return d > 0
    return nonneg(d) and dict(d.terms).get((), 0) > 0


def _divide_monomial(m: Monomial, by: Monomial) -> Monomial | None:
    rest = list(m)
    for s in by:
        if s not in rest:
            return None
        rest.remove(s)
    return tuple(rest)


def exact_div(a: Dim, b: Dim) -> Dim | None:
    """a / b when b divides a exactly as polynomials (a single-term or equal divisor), else
    None. For ints: the quotient when the remainder is zero."""
    if isinstance(b, int):
        if b == 0:
            return None
        if isinstance(a, int):
            return a // b if a % b == 0 else None
        if all(c % b == 0 for _, c in a.terms):
            return _make({m: c // b for m, c in a.terms})
        return None
    if a == b:
        return 1
    if len(b.terms) != 1:
        return _long_div(a, b)
    ((bm, bc),) = b.terms
    out: dict[Monomial, int] = {}
    for m, c in _terms(a).items():
        q = _divide_monomial(m, bm)
        if q is None or c % bc:
            return None
        out[q] = c // bc
    return _make(out)


def _leading(terms: dict[Monomial, int]) -> Monomial:
    return max(terms, key=lambda m: (len(m), m))


def _long_div(a: Dim, b: Expr) -> Dim | None:
    """a / b for a divisor of several terms (768 (p + s) b / 64 (p + s) b = 12): long division
    by leading terms, exact or None; the quotient is checked by multiplying back."""
    divisor = _terms(b)
    lead = _leading(divisor)
    rest = _terms(a)
    quotient: Dim = 0
    for _ in range(64):
        rest = {m: c for m, c in rest.items() if c}
        if not rest:
            return quotient if mul(quotient, b) == a else None
        top = _leading(rest)
        m = _divide_monomial(top, lead)
        if m is None or rest[top] % divisor[lead]:
            return None
        step = _make({m: rest[top] // divisor[lead]})
        quotient = add(quotient, step)
        rest = _terms(sub(_make(rest), mul(step, b)))
    return None


def div(a: Dim, b: Dim) -> Dim | None:
    """ONNX integer Div (truncating) of two dimension values; None where b is zero.

    Exact when b divides a; for two non-negative ints the floor; otherwise an atom."""
    q = exact_div(a, b)
    if q is not None:
        return q
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            return None
        return abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1)
    return atom("div", a, b)


def mod(a: Dim, b: Dim) -> Dim | None:
    """ONNX Mod (fmod=0: the sign of the divisor) of two dimension values."""
    if isinstance(a, int) and isinstance(b, int):
        return None if b == 0 else a % b
    if exact_div(a, b) is not None:
        return 0
    return atom("mod", a, b)


def equal(a: Dim | None, b: Dim | None) -> bool | None:
    """True or False when the algebra decides a == b, None when it cannot."""
    if a is None or b is None:
        return None
    diff = sub(a, b)
    if isinstance(diff, int):
        return diff == 0
    if positive(diff) or positive(neg(diff)):
        return False
    return None


def compare(a: Dim, b: Dim) -> int | None:
    """The sign of a - b when the algebra decides it (0 only for equal values), else None."""
    diff = sub(a, b)
    if isinstance(diff, int):
        return (diff > 0) - (diff < 0)
    if positive(diff):
        return 1
    if positive(neg(diff)):
        return -1
    return None


def at_least(a: Dim, b: Dim) -> bool:
    """True when a >= b for every value of the symbols."""
    return nonneg(sub(a, b))


def dmax(a: Dim, b: Dim) -> Dim:
    if at_least(a, b):
        return a
    if at_least(b, a):
        return b
    lo, hi = sorted((a, b), key=str)
    return atom("max", lo, hi)


def dmin(a: Dim, b: Dim) -> Dim:
    if at_least(a, b):
        return b
    if at_least(b, a):
        return a
    lo, hi = sorted((a, b), key=str)
    return atom("min", lo, hi)


class Algebra:
    """The state of one model's analysis: the expressions behind the texts `to_text` wrote
    into its IR, so that a later pass reads `batch*seq` back as the product it is."""

    def __init__(self) -> None:
        self.written: dict[str, Expr] = {}


_CURRENT: ContextVar[Algebra | None] = ContextVar("infercc_algebra", default=None)
_BY_GRAPH: weakref.WeakKeyDictionary[object, Algebra] = weakref.WeakKeyDictionary()


@contextmanager
def using(algebra: Algebra) -> Iterator[Algebra]:
    """Make `algebra` the one `to_text` and `from_ir` use inside the block."""
    token = _CURRENT.set(algebra)
    try:
        yield algebra
    finally:
        _CURRENT.reset(token)


def algebra_for(owner: object) -> Algebra:
    """The algebra of one model's analysis, kept as long as `owner` (its graph) lives."""
    got = _BY_GRAPH.get(owner)
    if got is None:
        got = _BY_GRAPH[owner] = Algebra()
    return got


def current() -> Algebra | None:
    return _CURRENT.get()


def to_text(d: Dim | None) -> int | str | None:
    """The form the IR stores in `Value.shape`: an int, the canonical text, or None.
    Inside `using(algebra)`, `from_ir` reads the text back as the same expression."""
    if d is None or isinstance(d, int):
        return d
    text = str(d)
    algebra = _CURRENT.get()
    if algebra is not None:
        algebra.written.setdefault(text, d)
    return text


def from_ir(d: int | str | None) -> Dim | None:
    """A dimension as the IR stores it (int, symbol name or None) in the algebra: a text
    the active algebra wrote is its expression, a text that spells a polynomial over names
    (`parse`) that polynomial, any other a symbol of that name."""
    if d is None or isinstance(d, int):
        return d
    algebra = _CURRENT.get()
    written = algebra.written.get(d) if algebra is not None else None
    if written is not None:
        return written
    parsed = parse(d)
    return parsed if parsed is not None else sym(d)


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse(text: str) -> Expr | None:
    """The polynomial `text` spells with `+`, `-`, `*` and integer powers (`^` or `**`) over
    names and integers: `s69 + s70`, `2*seq - 1`, `batch*seq` (the texts `to_text` writes,
    and the sympy texts torch's dynamo exporter writes into its value_info for a shape it
    derived: present.0.key's `s69 + s70`, past plus new). None for any other text (a plain
    name, an atom's `max(a, b)`), which stays a symbol of that name. Reading the exporter's
    sum as a sum keeps the fact it states (that dimension is the past's plus the new one's),
    as two values declared with one name are one dimension."""
    if not any(op in text for op in ("+", "-", "*", "^")):
        return None
    # terms joined by " + " and " - " (spaced, as both write them: `seq-len` is a name)
    terms = text.replace("**", "^").replace(" - ", " + -").split(" + ")
    total: Dim = 0
    for signed in terms:
        sign, term = (-1, signed[1:]) if signed.startswith("-") else (1, signed)
        value: Dim = sign
        for factor in term.split("*"):
            name, _, power = factor.partition("^")
            if power and not power.isdigit():
                return None
            if name.isdigit() and not power:
                value = mul(value, int(name))
            elif _NAME.fullmatch(name):
                for _ in range(int(power or 1)):
                    value = mul(value, sym(name))
            else:
                return None
        total = add(total, value)
    return total if isinstance(total, Expr) else None


def _format(terms: tuple[tuple[Monomial, int], ...]) -> str:
    parts = []
    for mono, c in sorted(terms, key=lambda t: (-len(t[0]), t[0])):
        body = _format_monomial(mono)
        if not body:
            parts.append(str(c))
        elif c == 1:
            parts.append(body)
        elif c == -1:
            parts.append("-" + body)
        else:
            parts.append(f"{c}*{body}")
    text = " + ".join(parts)
    return text.replace("+ -", "- ")


def _format_monomial(mono: Monomial) -> str:
    out = []
    i = 0
    while i < len(mono):
        j = i
        while j < len(mono) and mono[j] == mono[i]:
            j += 1
        name = mono[i]
        out.append(name if j - i == 1 else f"{name}^{j - i}")
        i = j
    return "*".join(out)
