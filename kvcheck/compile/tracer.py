"""Run spec functions on symbolic arguments and record what they say.

``trace(fn)`` calls ``fn(L, states...)`` with ``L`` a ``TraceLogic`` and
symbolic states (``TState``) whose vocabulary methods return ``Term`` s.
Three things need care, because the spec is ordinary Python:

* Branches. A Python ``if`` on a term (``if op.outcome == OOB``) calls
  ``bool(term)``; the tracer answers, records the decision, and ``trace``
  re-runs ``fn`` until every combination of answers has been taken. The
  result is a decision tree whose leaves hold the clauses of one path.
* Quantifiers. Iterating a domain (``for b in dom.blocks``,
  ``s.positions(q)``) yields one fresh bound variable. A clause yielded while
  the loop is open is quantified over it (``all``); an aggregate
  (``L.all_/any_/count``) over elements whose variable's loop has ended
  binds that variable (the spec's ``released`` list in ``free_seq``).
* Anything the tracer cannot represent faithfully (a branch on a bound
  variable) raises ``Untraceable``; the oracle then keeps evaluating the
  spec directly for that operation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvcheck.compile.terms import Term, free_vars

_ACTIVE: list[Tracer] = []


class Untraceable(Exception):
    """The spec text does something the tracer cannot represent."""


def decide(term: Term) -> bool:
    if not _ACTIVE:
        raise Untraceable(f"bool() of a term outside a trace: {term}")
    return _ACTIVE[-1].decide(term)


class Tracer:
    """One run along one path: answers branches from ``prefix``, then False."""

    def __init__(self, prefix: tuple[bool, ...]):
        self.prefix = prefix
        self.decisions: list[tuple[Term, bool]] = []
        self.known: dict = {}
        self.domains: dict[str, object] = {}  # var name -> its domain
        self.open: list[str] = []  # variables whose loop is running, outermost first
        self._count = 0

    def decide(self, term: Term) -> bool:
        if free_vars(term) & set(self.open):
            raise Untraceable(f"a branch on a bound variable: {term}")
        if term.key in self.known:
            return self.known[term.key]
        i = len(self.decisions)
        value = self.prefix[i] if i < len(self.prefix) else False
        self.decisions.append((term, value))
        self.known[term.key] = value
        return value

    def fresh(self, domain) -> Term:
        self._count += 1
        name = f"v{self._count}"
        self.domains[name] = domain
        return Term("var", name)

    def quantify(self, how: str, x, closed_only: bool):
        """``x`` with its (closed, or all) free bound variables bound by ``how``."""
        names = [v for v in free_vars(x) if not closed_only or v not in self.open]
        for name in sorted(names, key=lambda n: -int(n[1:])):  # innermost first
            x = Term("agg", how, Term("var", name), self.domains[name], x)
        return x


def _active() -> Tracer:
    return _ACTIVE[-1]


class TDomain:
    """A domain to iterate: yields one bound variable, open while the loop runs."""

    def __init__(self, desc):
        self.desc = desc  # a Term: ("sym", "blocks"), ("sym", "live"), or ("call", ..., "nblocks", q)

    def __iter__(self):
        tr = _active()
        v = tr.fresh(self.desc)
        tr.open.append(v.args[0])
        yield v
        tr.open.remove(v.args[0])


class TState:
    """A symbolic state: every vocabulary method returns a ``call`` term."""

    def __init__(self, name: str):
        self.name = name
        self.num_blocks = Term("sym", "N")
        self.block_size = Term("sym", "B")

    def _call(self, method, *args):
        return Term("call", self.name, method, *args)

    def ref(self, b):
        return self._call("ref", b)

    def free_count(self, b):
        return self._call("free_count", b)

    def free_entries(self):
        return self._call("free_entries")

    def num_free(self):
        return self._call("num_free")

    def zero_refs(self):
        return self._call("zero_refs")

    def live(self, q):
        return self._call("live", q)

    def length(self, q):
        return self._call("length", q)

    def impl_length(self, q):
        return self._call("impl_length", q)

    def reserved(self, q):
        return self._call("reserved", q)

    def nblocks(self, q):
        return self._call("nblocks", q)

    def table(self, q, i):
        return self._call("table", q, i)

    def tail(self, q):
        return self._call("tail", q)

    def holders(self, b):
        return self._call("holders", b)

    def occurrences(self, q, b):
        return self._call("occurrences", q, b)

    def sharers(self, q):
        return self._call("sharers", q)

    def same_table(self, q, other, r, upto=None):
        return self._call("same_table", q, Term("sym", other.name), r, upto)

    def positions(self, q):
        return TDomain(self.nblocks(q))

    def blocks(self):
        return TDomain(Term("sym", "all_blocks"))

    def seqs(self):
        return TDomain(Term("sym", "all_seqs"))


def _is_term(x) -> bool:
    return isinstance(x, Term)


class TraceLogic:
    """The logic layer's connectives, building terms (folding Python constants)."""

    symbolic = True

    def and_(self, *xs):
        xs = [x for x in xs if not (not _is_term(x) and x)]
        if any(not _is_term(x) for x in xs):
            return False  # a constant false operand
        return True if not xs else xs[0] if len(xs) == 1 else Term("and", *xs)

    def or_(self, *xs):
        xs = [x for x in xs if _is_term(x) or x]
        if any(not _is_term(x) for x in xs):
            return True
        return False if not xs else xs[0] if len(xs) == 1 else Term("or", *xs)

    def not_(self, x):
        return Term("not", x) if _is_term(x) else not x

    def implies(self, a, b):
        if not _is_term(a):
            return b if a else True
        return Term("implies", a, b)

    def ite(self, c, a, b):
        if not _is_term(c):
            return a if c else b
        return Term("ite", c, a, b)

    def _aggregate(self, how: str, xs):
        tr = _active()
        return [tr.quantify(how, x, closed_only=True) for x in list(xs)]

    def all_(self, xs):
        return self.and_(*self._aggregate("all", xs))

    def any_(self, xs):
        return self.or_(*self._aggregate("any", xs))

    def count(self, xs):
        total = 0
        for x in self._aggregate("count", xs):
            if _is_term(x) and x.kind == "agg":
                part = x
            elif _is_term(x):
                part = Term("ite", x, 1, 0)
            else:
                part = 1 if x else 0
            total = part + total if _is_term(part) else total + part
        return total

    def ceil_div(self, x, k):
        if not _is_term(x) and not _is_term(k):
            return -(-x // k)
        return Term("ceildiv", x, k)

    def mod(self, x, k):
        if not _is_term(x) and not _is_term(k):
            return x % k
        return Term("mod", x, k)


TL = TraceLogic()


@dataclass
class Leaf:
    clauses: list = field(default_factory=list)  # terms that must all hold


@dataclass
class Branch:
    cond: Term
    then: object
    orelse: object


def _run(fn, prefix):
    tr = Tracer(prefix)
    _ACTIVE.append(tr)
    try:
        clauses = []
        for formula in fn():
            if tr.open:  # yielded inside a loop: quantified over the open variables
                formula = tr.quantify("all", formula, closed_only=False)
            elif free_vars(formula):
                formula = tr.quantify("all", formula, closed_only=True)
            if not _is_term(formula):
                if formula:
                    continue
                clauses = [False]
                break
            clauses.append(formula)
    finally:
        _ACTIVE.pop()
    return tr.decisions, clauses


def trace(fn):
    """The decision tree of ``fn()``, a callable returning an iterable of formulas."""
    runs = []
    stack: list[tuple[bool, ...]] = [()]
    while stack:
        prefix = stack.pop()
        decisions, clauses = _run(fn, prefix)
        for k in range(len(prefix), len(decisions)):
            stack.append(tuple(v for _, v in decisions[:k]) + (True,))
        runs.append((decisions, clauses))
    return _tree(runs, 0)


def _tree(runs, depth):
    if len(runs) == 1 and len(runs[0][0]) == depth:
        return Leaf(runs[0][1])
    cond = runs[0][0][depth][0]
    then = [r for r in runs if r[0][depth][1]]
    orelse = [r for r in runs if not r[0][depth][1]]
    assert all(r[0][depth][0].key == cond.key for r in runs), "paths disagree on a branch"
    return Branch(cond, _tree(then, depth + 1), _tree(orelse, depth + 1))
