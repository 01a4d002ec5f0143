"""Bounded model checking of the spec from the empty pool, with iterative
deepening, and the vacuity/coverage check built on it.

``bmc``: unroll the step relation 1, 2, ... ``depth`` times from the initial
state and ask for a state breaking an invariant; the first satisfiable depth
is a shortest counterexample, decoded into kvcheck operations.

``witnesses``: for every outcome class of every operation
(``kvcheck.spec.outcomes``), the shortest run whose last step is of that
class, and (optionally) for every ordered pair of classes a run whose last
two steps are that pair. A class with no witness within the bound is
reported: a spec in which, say, copy-on-write can never happen proves
nothing about it.

Pruning, none of which loses a behaviour up to renaming:
  * symmetry: block ids are interchangeable, so a step that takes fresh
    blocks takes the lowest-numbered free ones (in table order); sequence
    slots are interchangeable, so allocate and fork use the lowest dead slot;
  * canonical garbage: dead slots and table positions past a table's end
    hold 0 (nothing in the spec reads them);
  * lemmas: when depth d is searched, depths < d had no violation, so every
    earlier state satisfies the invariants; asserting that keeps the shortest
    counterexample and prunes the rest.
Unbounded-integer arithmetic is the default encoding here (measured faster
for these unrollings than bit-vectors; see benchmarks/proofs.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import z3

from kvcheck.spec.contracts import Op
from kvcheck.spec.outcomes import OUTCOMES
from kvcheck.spec.symbolic import SymScope

from .model import SCOPE_BOUND, Model, decode


@dataclass
class Unrolling:
    model: Model
    states: list
    choices: list  # per step: list[Choice]
    solver: z3.Solver


def _lowest_free(model: Model, s, s2, choices) -> list:
    """Symmetry breaking: fresh blocks are the lowest free ids, in table order."""
    L, out = model.L, []
    for c in choices:
        op = c.op
        if op.outcome != "ok" or op.kind not in ("allocate", "append_slot"):
            continue
        q = op.seq
        if op.kind == "allocate":
            news = [(i, s2.table(q, i)) for i in s2.positions(q)]
            for i, x in news:
                for b in s.blocks():
                    # a free block below x must already be used by an earlier entry
                    earlier = L.or_(*[s2.table(q, j) == b for j in range(i)]) if i else False
                    out.append(z3.Implies(z3.And(c.selector, i < s2.nblocks(q), b < x,
                                                 s.free_count(b) >= 1), earlier))
        else:
            x = s2.tail(q)
            taken = L.or_(L.mod(s.length(q), s.block_size) == 0, s.ref(s.tail(q)) > 1)
            for b in s.blocks():
                out.append(z3.Implies(z3.And(c.selector, taken, b < x), s.free_count(b) == 0))
    return out


def _canonical(s) -> list:
    """Dead slots and positions past a table's end hold 0."""
    out = []
    for q in s.seqs():
        for i in s.positions(q):
            out.append(z3.Implies(z3.Not(z3.And(s.live(q), i < s.nblocks(q))), s._tab[q][i] == 0))
        out.append(z3.Implies(z3.Not(s.live(q)), z3.And(s.nblocks(q) == 0, s.length(q) == 0)))
    return out


def _lowest_slot(s, choices) -> list:
    out = []
    for c in choices:
        if c.op.kind in ("allocate", "fork") and c.op.outcome == "ok":
            target = c.op.seq if c.op.kind == "allocate" else c.op.child
            out += [z3.Implies(c.selector, s.live(r)) for r in range(target)]
    return out


def unroll(scope: SymScope, contracts=None, invariants=None, encoding: str = "int") -> Unrolling:
    model = Model(scope, contracts, invariants, encoding=encoding)
    s0 = model.state("s0")
    solver = z3.Solver()
    solver.add(model.init(s0), *_canonical(s0))
    return Unrolling(model, [s0], [], solver)


def extend(u: Unrolling, symmetry: bool = True, lemmas: bool = True) -> None:
    d = len(u.states)
    s, s2 = u.states[-1], u.model.state(f"s{d}")
    if lemmas:
        u.solver.add(u.model.invariant(s))
    step, choices = u.model.step(s, s2, f"k{d}")
    u.solver.add(step, *_canonical(s2))
    if symmetry:
        u.solver.add(*_lowest_free(u.model, s, s2, choices), *_lowest_slot(s, choices))
    u.states.append(s2)
    u.choices.append(choices)


def trace_of(u: Unrolling, m: z3.ModelRef, upto: int | None = None) -> list[Op]:
    return [decode(m, ch) for ch in u.choices[:upto]]


@dataclass
class BmcResult:
    scope: str
    depth: int  # deepest depth checked
    seconds: float
    violated: str | None = None  # name of a broken invariant
    ops: list[Op] = field(default_factory=list)
    complete: bool = True


def bmc(scope: SymScope, depth: int, contracts=None, invariants=None, encoding: str = "int",
        budget: float | None = None, symmetry: bool = True) -> BmcResult:
    """Shortest run from the empty pool to a state breaking an invariant, if any within ``depth``."""
    t0 = time.perf_counter()
    u = unroll(scope, contracts, invariants, encoding)
    invs = [*u.model.invariants, SCOPE_BOUND]
    res = BmcResult(scope.describe(), 0, 0.0)
    for d in range(1, depth + 1):
        if budget is not None and time.perf_counter() - t0 > budget:
            res.complete = False
            break
        extend(u, symmetry)
        s = u.states[-1]
        L = u.model.L
        u.solver.push()
        u.solver.add(z3.Not(L.and_(*[inv.formula(L, s) for inv in invs])))
        if budget is not None:
            u.solver.set("timeout", max(1, int(1000 * (budget - (time.perf_counter() - t0)))))
        r = u.solver.check()
        if r == z3.sat:
            m = u.solver.model()
            res.ops = trace_of(u, m)
            res.violated = next(inv.name for inv in invs
                                if not z3.is_true(m.eval(inv.formula(L, s), model_completion=True)))
            res.depth = d
            u.solver.pop()
            break
        u.solver.pop()
        if r != z3.unsat:
            res.complete = False
            break
        res.depth = d
    res.seconds = time.perf_counter() - t0
    return res


@dataclass
class Witness:
    name: str  # outcome class, or "A -> B" for a pair
    depth: int | None  # None: no witness found
    ops: list[Op] = field(default_factory=list)
    seconds: float = 0.0
    searched: bool = True  # False: the budget ran out before every depth was tried


def _class_at(u: Unrolling, step: int, name: str):
    """The last step ``step`` (1-based) is of outcome class ``name``."""
    kind, outcome, pred = OUTCOMES[name]
    L = u.model.L
    pre, post = u.states[step - 1], u.states[step]
    return z3.Or([z3.And(c.selector, pred(L, pre, post, c.op)) if not isinstance(
        pred(L, pre, post, c.op), bool) else c.selector
        for c in u.choices[step - 1] if c.op.kind == kind and c.op.outcome == outcome] or
        [z3.BoolVal(False)])


def witnesses(scope: SymScope, depth: int, pairs: bool = False, contracts=None,
              encoding: str = "int", budget: float | None = None) -> list[Witness]:
    """Shortest witness of every outcome class (and, with ``pairs``, of every ordered pair)."""
    t0 = time.perf_counter()
    u = unroll(scope, contracts, None, encoding)
    names = list(OUTCOMES)
    goals = [(n, (n,)) for n in names]
    if pairs:
        goals += [(f"{a} -> {b}", (a, b)) for a in names for b in names]
    found: dict[str, Witness] = {}
    unsure: set[str] = set()  # goals with a depth not (fully) tried
    for d in range(1, depth + 1):
        if len(found) == len(goals):
            break
        extend(u, lemmas=False)
        for label, classes in goals:
            if label in found or len(classes) > d:
                continue
            if budget is not None and time.perf_counter() - t0 > budget:
                unsure.add(label)
                continue
            g0 = time.perf_counter()
            u.solver.push()
            for k, name in enumerate(reversed(classes)):
                u.solver.add(_class_at(u, d - k, name))
            if budget is not None:
                u.solver.set("timeout", max(1, int(1000 * (budget - (time.perf_counter() - t0)))))
            r = u.solver.check()
            if r == z3.sat:
                found[label] = Witness(label, d, trace_of(u, u.solver.model()),
                                       time.perf_counter() - g0)
            elif r != z3.unsat:
                unsure.add(label)
            u.solver.pop()
    return [found.get(label, Witness(label, None, searched=label not in unsure))
            for label, _ in goals]
