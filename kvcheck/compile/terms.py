"""Terms: what a spec formula looks like when traced symbolically.

A ``Term`` is an immutable expression tree. Python operators on terms build
terms (so the spec's ``post.ref(b) == pre.ref(b) + got`` traces as written);
``bool(term)`` asks the active tracer to decide a branch (the spec's Python
``if``), see ``kvcheck.compile.tracer``.

Kinds and their ``args``:
    sym      (name,)                      an input: an operation field, a size
    var      (name,)                      a bound variable of a quantifier
    call     (state, method, *args)       a vocabulary term, e.g. post.ref(b)
    arith    (op, a, b)                   + - *
    neg      (a,)
    cmp      (op, a, b)                   < <= > >= == !=
    and/or   (*xs)
    not      (a,)
    implies  (a, b)
    ite      (c, a, b)
    ceildiv/mod (a, k)
    agg      (how, var, domain, body)     all/any/count of body over var in domain
Plain Python values (ints, strings, None, bools) appear directly as args.
"""

from __future__ import annotations


class Term:
    __slots__ = ("kind", "args", "key", "fv")

    def __init__(self, kind: str, *args):
        self.kind = kind
        self.args = args
        self.key = (kind, *(a.key if isinstance(a, Term) else ("=", a) for a in args))
        self.fv = None  # ``free_vars``, once asked (a term never changes)

    def __repr__(self) -> str:
        return f"Term{self.key!r}"

    def __hash__(self) -> int:
        return hash(self.key)

    def __bool__(self) -> bool:
        from kvcheck.compile.tracer import decide

        return decide(self)

    # arithmetic
    def __add__(self, o):
        return arith("+", self, o)

    def __radd__(self, o):
        return arith("+", o, self)

    def __sub__(self, o):
        return arith("-", self, o)

    def __rsub__(self, o):
        return arith("-", o, self)

    def __mul__(self, o):
        return arith("*", self, o)

    def __rmul__(self, o):
        return arith("*", o, self)

    def __neg__(self):
        return Term("neg", self)

    # comparisons (reflected ones arrive with the operands swapped)
    def __lt__(self, o):
        return Term("cmp", "<", self, o)

    def __le__(self, o):
        return Term("cmp", "<=", self, o)

    def __gt__(self, o):
        return Term("cmp", ">", self, o)

    def __ge__(self, o):
        return Term("cmp", ">=", self, o)

    def __eq__(self, o):  # noqa: D105 - builds a term, like the others
        return Term("cmp", "==", self, o)

    def __ne__(self, o):
        return Term("cmp", "!=", self, o)


def arith(op: str, a, b):
    if not isinstance(a, Term) and not isinstance(b, Term):
        return {"+": a + b, "-": a - b, "*": a * b}[op]
    if op in "+-" and not isinstance(b, Term) and b == 0:
        return a
    return Term("arith", op, a, b)


def subterms(x):
    """Every term in ``x`` (itself included), parents before children."""
    if isinstance(x, Term):
        yield x
        for a in x.args:
            yield from subterms(a)


_NONE: frozenset[str] = frozenset()


def free_vars(x) -> frozenset[str]:
    """Names of the bound variables ``x`` uses without binding them (worked out once per
    term: the compiler asks of every subterm in every scope)."""
    if not isinstance(x, Term):
        return _NONE
    out = x.fv
    if out is None:
        if x.kind == "var":
            out = frozenset((x.args[0],))
        elif x.kind == "agg":
            _, var, domain, body = x.args
            out = free_vars(domain) | (free_vars(body) - {var.args[0]})
        else:
            out = _NONE
            for a in x.args:
                if isinstance(a, Term):
                    out = out | free_vars(a)
        x.fv = out
    return out
