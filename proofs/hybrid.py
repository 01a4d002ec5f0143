"""Z3 rows for hybrid pools (``kvcheck.spec.hybrid``), evaluated on the spec's own text.

The symbolic hybrid state is ``kvcheck.spec.symbolic.SymState`` whose sequence slots are
(request, group) pairs, slot ``q`` of group ``q % G``, with the hybrid terms defined as in
``spec.hybrid.HybridSnapshot``. Two kinds of rows:

``independent: NAME``
    the hybrid invariant NAME is not implied by the block-manager invariants and the other
    hybrid ones: Z3 finds a state satisfying all of those but not NAME (its witness in the
    detail). Without it, NAME would add nothing to the spec.
``out-of-blocks allowance keeps NAME``
    the one relaxation of exception safety the hybrid spec makes (``out_of_blocks``: a
    failed step may first drop blocks behind a sliding window) only reaches states that
    still satisfy NAME: from any state satisfying every table invariant, a post state
    satisfying the ``out_of_blocks`` clauses (lengths and reservations unchanged, as the
    oracle keeps them) satisfies NAME. Proved by the absence of a counterexample.
"""

from __future__ import annotations

import time

import z3

from kvcheck.spec import hybrid as H
from kvcheck.spec.contracts import OOB, Domain, Op
from kvcheck.spec.invariants import INVARIANTS
from kvcheck.spec.logic import Z3Logic
from kvcheck.spec.state import NULL
from kvcheck.spec.symbolic import SymScope, SymState

from .induction import Proof
from .model import SCOPE_BOUND

ENGINE = "z3 hybrid"
TABLE_INVARIANTS = [inv for inv in INVARIANTS if "free_list" not in inv.needs
                    and inv.name != "free_list_size"]  # the free list is not in these steps


class HybridSymState(SymState):
    """A symbolic hybrid state: ``scope.seqs`` must be a multiple of ``len(windows)``."""

    def __init__(self, L, scope: SymScope, name: str, windows: tuple[int, ...]):
        super().__init__(L, scope, name)
        self.windows = tuple(windows)
        self.G = len(self.windows)
        assert scope.seqs % self.G == 0
        self._served = {}

    def num_groups(self):
        return self.G

    def group_of(self, q):
        return q % self.G

    def window_of(self, q):
        return self.windows[q % self.G]

    def groups_naming(self, b):
        L = self.L
        return L.count(L.any_(L.and_(self.live(q), self._entry(q, i, b))
                              for q in self.seqs() if q % self.G == g
                              for i in self.positions(q))
                       for g in range(self.G))

    def tables_of(self, q):
        L = self.L
        r = q // self.G
        return L.count(self.live(r * self.G + g) for g in range(self.G))

    def served(self, q, i):
        return self._served.setdefault((q, i), z3.Bool(f"served{q}_{i}"))


def _holds(L, invs, s):
    """``invs`` hold in ``s``, within the scope, and ``s`` is well formed: the groups of one
    request share its length and reservation (the oracle keeps one count per request)."""
    same = [L.and_(s.length(q) == s.length(q - q % s.G), s.reserved(q) == s.reserved(q - q % s.G))
            for q in s.seqs() if q % s.G]
    return L.and_(*[inv.formula(L, s) for inv in invs], SCOPE_BOUND.formula(L, s), *same)


def _model_text(m, s: HybridSymState) -> str:
    def val(x):
        v = m.eval(x, model_completion=True)
        n = v.as_signed_long() if hasattr(v, "as_signed_long") else v.as_long()
        return n

    parts = []
    for q in s.seqs():
        if z3.is_true(m.eval(s.live(q), model_completion=True)):
            nb = val(s.nblocks(q))
            t = ["null" if val(s.table(q, i)) == NULL else str(val(s.table(q, i)))
                 for i in range(min(nb, s.scope.table_slots))]
            parts.append(f"request {q // s.G} group {q % s.G}: len {val(s.length(q))}, "
                         f"table [{', '.join(t)}]")
    return "; ".join(parts)


def independence(scope: SymScope, windows: tuple[int, ...], timeout_ms: int = 60_000) -> list[Proof]:
    """One row per hybrid invariant: not implied by all the others (a witness state)."""
    L = Z3Logic(None)
    rows = []
    for inv in H.HYBRID_INVARIANTS:
        t0 = time.perf_counter()
        s = HybridSymState(L, scope, "s", windows)
        others = [i for i in H.HYBRID_INVARIANTS if i is not inv]
        solver = z3.Solver()
        solver.set("timeout", timeout_ms)
        solver.add(_holds(L, [*INVARIANTS, *others], s), L.not_(inv.formula(L, s)))
        r = solver.check()
        result = "proved" if r == z3.sat else "violated" if r == z3.unsat else "unknown"
        detail = (f"a state every other rule accepts: {_model_text(solver.model(), s)}"
                  if r == z3.sat else "implied by the others" if r == z3.unsat else str(r))
        rows.append(Proof(ENGINE, f"independent: {inv.name}", scope.describe(), result,
                          time.perf_counter() - t0, detail))
    return rows


def oob_allowance(scope: SymScope, windows: tuple[int, ...], clauses=None,
                  timeout_ms: int = 60_000) -> list[Proof]:
    """One row per table invariant and hybrid invariant: kept by ``out_of_blocks``
    (``clauses``: the contract to use, default the spec's)."""
    clauses = clauses or H.out_of_blocks
    L = Z3Logic(None)
    rows = []
    goals = [*TABLE_INVARIANTS, *H.HYBRID_INVARIANTS]
    for goal in goals:
        t0 = time.perf_counter()
        pre = HybridSymState(L, scope, "pre", windows)
        post = HybridSymState(L, scope, "post", windows)
        op = Op("append_slot", seq=0, outcome=OOB)
        dom = Domain(range(scope.num_blocks), range(scope.seqs))
        step = [f for _, _, f in clauses(L, pre, post, op, dom)]
        frame = [L.and_(post.length(q) == pre.length(q), post.reserved(q) == pre.reserved(q))
                 for q in pre.seqs()]
        solver = z3.Solver()
        solver.set("timeout", timeout_ms)
        solver.add(_holds(L, goals, pre), *step, *frame, L.not_(goal.formula(L, post)))
        r = solver.check()
        result = "proved" if r == z3.unsat else "violated" if r == z3.sat else "unknown"
        detail = ("no out-of-blocks drop breaks it" if r == z3.unsat else
                  f"after: {_model_text(solver.model(), post)}" if r == z3.sat else str(r))
        rows.append(Proof(ENGINE, f"out-of-blocks allowance keeps {goal.name}", scope.describe(),
                          result, time.perf_counter() - t0, detail))
    return rows
