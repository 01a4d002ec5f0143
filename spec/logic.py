"""The logic layer: one vocabulary of connectives, two meanings.

Every invariant and contract in ``kvcheck.spec`` is an ordinary Python
function that receives a ``Logic`` as its first argument and builds its
formula only from these connectives and the state vocabulary
(``kvcheck.spec.state``). Handed ``PY`` (concrete states), the same text
returns a Python ``bool``; handed a ``Z3Logic`` (symbolic states), it returns
a Z3 formula. Arithmetic and comparisons use Python operators, which both
ints and Z3 bit-vectors overload; boolean structure must go through the
connectives because ``and``/``or``/``not`` cannot be overloaded.

Quantifiers are bounded: ``all_``/``any_``/``count`` take a finite iterable,
so under Z3 they unroll over the scope.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class PyLogic:
    """Concrete meaning: Python values and eager evaluation."""

    symbolic = False

    @staticmethod
    def and_(*xs: Any) -> bool:
        return all(xs)

    @staticmethod
    def or_(*xs: Any) -> bool:
        return any(xs)

    @staticmethod
    def not_(x: Any) -> bool:
        return not x

    @staticmethod
    def implies(a: Any, b: Any) -> bool:
        return (not a) or bool(b)

    @staticmethod
    def ite(c: Any, a: Any, b: Any) -> Any:
        return a if c else b

    @staticmethod
    def all_(xs: Iterable[Any]) -> bool:
        return all(xs)

    @staticmethod
    def any_(xs: Iterable[Any]) -> bool:
        return any(xs)

    @staticmethod
    def count(xs: Iterable[Any]) -> int:
        return sum(1 for x in xs if x)

    @staticmethod
    def ceil_div(x: int, k: int) -> int:
        return -(-x // k)

    @staticmethod
    def mod(x: int, k: int) -> int:
        return x % k

    @staticmethod
    def select(values: Any, index: int) -> Any:
        return values[index]

    @staticmethod
    def is_true(x: Any) -> bool:
        return bool(x)


PY = PyLogic()


class Z3Logic:
    """Symbolic meaning: Z3 bit-vectors of a fixed width, booleans.

    Values stay far below ``2 ** (width - 1)`` by construction of the scope,
    so the signed bit-vector operators Python's ``<``/``/`` map to are exact.
    """

    symbolic = True

    def __init__(self, width: int | None, max_quotient: int | None = None):
        """``width`` bits per number; ``None`` for unbounded integers.

        ``max_quotient``: when ``ceil_div``'s result is known to be at most
        this, it is encoded as a chain of comparisons instead of a division
        (much cheaper for bit-vector solvers).
        """
        import z3

        self.z3 = z3
        self.width = width
        self.max_quotient = max_quotient

    def val(self, v: int):
        return self.z3.IntVal(v) if self.width is None else self.z3.BitVecVal(v, self.width)

    def var(self, name: str):
        return self.z3.Int(name) if self.width is None else self.z3.BitVec(name, self.width)

    def bool_var(self, name: str):
        return self.z3.Bool(name)

    def _b(self, x: Any):
        return self.z3.BoolVal(x) if isinstance(x, bool) else x

    def and_(self, *xs: Any):
        return self.z3.And(*[self._b(x) for x in xs]) if xs else self.z3.BoolVal(True)

    def or_(self, *xs: Any):
        return self.z3.Or(*[self._b(x) for x in xs]) if xs else self.z3.BoolVal(False)

    def not_(self, x: Any):
        return self.z3.Not(self._b(x))

    def implies(self, a: Any, b: Any):
        return self.z3.Implies(self._b(a), self._b(b))

    def ite(self, c: Any, a: Any, b: Any):
        if isinstance(a, bool) or isinstance(b, bool):
            a, b = self._b(a), self._b(b)
        elif isinstance(a, int) and isinstance(b, int):
            a, b = self.val(a), self.val(b)
        return self.z3.If(self._b(c), a, b)

    def all_(self, xs: Iterable[Any]):
        return self.and_(*list(xs))

    def any_(self, xs: Iterable[Any]):
        return self.or_(*list(xs))

    def count(self, xs: Iterable[Any]):
        one, zero = self.val(1), self.val(0)
        terms = [self.z3.If(self._b(x), one, zero) for x in xs]
        return self.z3.Sum(terms) if terms else zero

    def ceil_div(self, x: Any, k: int):
        if isinstance(x, int):
            return -(-x // k)
        if self.max_quotient is not None:
            out = self.val(self.max_quotient)
            for m in range(self.max_quotient - 1, -1, -1):
                out = self.z3.If(x <= m * k, self.val(m), out)
            return out
        if self.width is None:
            return (x + (k - 1)) / k
        return self.z3.UDiv(x + (k - 1), self.val(k))

    def mod(self, x: Any, k: int):
        if isinstance(x, int):
            return x % k
        if self.width is None:
            return x % k
        return self.z3.URem(x, self.val(k))

    def select(self, values: Any, index: Any):
        """``values[index]`` for a symbolic index: an if-then-else chain."""
        if isinstance(index, int):
            return values[index] if 0 <= index < len(values) else self._default(values)
        out = self._default(values)
        for i in range(len(values) - 1, -1, -1):
            out = self.z3.If(index == i, values[i], out)
        return out

    def _default(self, values: Any):
        first = values[0] if len(values) else None
        if first is not None and self.z3.is_bool(first):
            return self.z3.BoolVal(False)
        return self.val(0)

    def is_true(self, x: Any) -> bool:
        """Whether ``x`` is valid (true in every model)."""
        solver = self.z3.Solver()
        solver.add(self.z3.Not(self._b(x)))
        return solver.check() == self.z3.unsat


def frame(L, pre, post, a, terms: tuple[str, ...], read, changed: tuple[str, ...]):
    """The frame condition of a step that changes block ``a`` alone: every other block's
    ``terms`` are unchanged, and so are ``a``'s terms not in ``changed``. ``read(state,
    term, b)`` reads a term of a block; a generator of the step rules' ``(kind, name,
    formula)`` clauses (``prefix_steps``, ``tier_steps``)."""
    def same(b, ts):
        return L.and_(*[read(post, t, b) == read(pre, t, b) for t in ts])

    for b in pre.blocks():
        yield "ensures", "other blocks unchanged", L.implies(L.not_(a == b), same(b, terms))
    keep = [t for t in terms if t not in changed]
    yield "ensures", "the block's other terms unchanged", same(a, keep)

